// Op::Bias: y = x + b[i % cols], one invocation per element; workgroups over x and y past the
// 65535 limit. The bias at binding 3, f32 (fmt 0), f16 (1) or bf16 (2).
struct Params {
    x: u32,
    dst: u32,
    n: u32,
    cols: u32,
    bfmt: u32,
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
    act[p.dst + i] = act[p.x + i] + norm_weight(p.bfmt, i % p.cols);
}
