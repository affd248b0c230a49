// Op::LayerNorm: one workgroup of 256 per row, y = (x - mean) / sqrt(var + eps) * w + b with the
// biased variance, in f32: the mean first, then the squares of the deviations from it (a second
// pass over the row, not sum(x^2) - mean^2, which cancels), each reduced by the reduce part. The
// weight at binding 3, the bias at binding 6, each f32 (fmt 0), f16 (1) or bf16 (2).
struct Params {
    x: u32,
    dst: u32,
    cols: u32,
    eps: f32,
    wfmt: u32,
    bfmt: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
const WG: u32 = 256u;

fn kernel(lid: vec3<u32>, wid: vec3<u32>, nwg: vec3<u32>) {
    let tid = lid.x;
    let base = wid.y * p.cols;
    var s = 0.0;
    for (var i = tid; i < p.cols; i += WG) {
        s += act[p.x + base + i];
    }
    let mean = wg_sum(tid, s) / f32(p.cols);
    var d2 = 0.0;
    for (var i = tid; i < p.cols; i += WG) {
        let d = act[p.x + base + i] - mean;
        d2 += d * d;
    }
    let inv = 1.0 / sqrt(wg_sum(tid, d2) / f32(p.cols) + p.eps);
    for (var i = tid; i < p.cols; i += WG) {
        let y = (act[p.x + base + i] - mean) * inv;
        act[p.dst + base + i] = y * norm_weight(p.wfmt, i) + norm_weight2(p.bfmt, i);
    }
}
