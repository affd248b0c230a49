// Op::RmsNorm over groups of `group` columns: one workgroup of 256 per (group, row), the sum of
// squares reduced by the reduce part (a tree in workgroup memory, or subgroup operations).
// Weights f32 (fmt 0), f16 (1) or bf16 (2). 256 invocations: few loads each (a loop of loads
// runs one after another).
struct Params {
    x: u32,
    dst: u32,
    cols: u32,
    group: u32,
    eps: f32,
    offset: f32,
    wfmt: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
const WG: u32 = 256u;

fn kernel(lid: vec3<u32>, wid: vec3<u32>, nwg: vec3<u32>) {
    let tid = lid.x;
    let base = wid.y * p.cols + wid.x * p.group;
    var s = 0.0;
    for (var i = tid; i < p.group; i += WG) {
        let v = act[p.x + base + i];
        s += v * v;
    }
    let inv = 1.0 / sqrt(wg_sum(tid, s) / f32(p.group) + p.eps);
    for (var i = tid; i < p.group; i += WG) {
        act[p.dst + base + i] = act[p.x + base + i] * inv * (p.offset + norm_weight(p.wfmt, i));
    }
}
