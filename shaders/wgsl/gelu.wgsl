// Op::Gelu: y = gelu_tanh(x), one invocation per element; workgroups over x and y past the
// 65535 limit.
struct Params {
    x: u32,
    dst: u32,
    n: u32,
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
    act[p.dst + i] = gelu_tanh(act[p.x + i]);
}
