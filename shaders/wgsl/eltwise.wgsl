// Op::Add (op 0), Op::GeGlu (op 1: gelu_tanh(a) * b) and Op::Softcap (op 2: cap tanh(a / cap)),
// one invocation per element; workgroups over x and y past the 65535 limit.
struct Params {
    a: u32,
    b: u32,
    dst: u32,
    n: u32,
    op: u32,
    cap: f32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wid.x + wid.y * nwg.x) * 64u + lid.x;
    if (i >= p.n) {
        return;
    }
    let a = act[p.a + i];
    var y = 0.0;
    if (p.op == 0u) {
        y = a + act[p.b + i];
    } else if (p.op == 1u) {
        y = gelu_tanh(a) * act[p.b + i];
    } else {
        y = p.cap * tanh_safe(a / p.cap);
    }
    act[p.dst + i] = y;
}
