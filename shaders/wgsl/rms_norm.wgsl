// Op::RmsNorm over groups of `group` columns: one workgroup of 256 per (group, row), the sum of
// squares reduced in a tree in workgroup memory. Weights f32 (fmt 0), f16 (1) or bf16 (2).
// 256 invocations: few loads each (a loop of loads runs one after another).
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
var<workgroup> partial: array<f32, 256>;

fn weight(i: u32) -> f32 {
    if (p.wfmt == 0u) {
        return bitcast<f32>(wts[i]);
    } else if (p.wfmt == 1u) {
        return f16_at(2u * i);
    }
    return bitcast<f32>(ld16(2u * i) << 16u);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tid = lid.x;
    let base = wid.y * p.cols + wid.x * p.group;
    var s = 0.0;
    for (var i = tid; i < p.group; i += WG) {
        let v = act[p.x + base + i];
        s += v * v;
    }
    partial[tid] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            partial[tid] += partial[tid + stride];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(partial[0] / f32(p.group) + p.eps);
    for (var i = tid; i < p.group; i += WG) {
        act[p.dst + base + i] = act[p.x + base + i] * inv * (p.offset + weight(i));
    }
}
