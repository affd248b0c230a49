// Fused RmsNorm -> Add [-> RmsNorm] (fuse.rs, NormAdd): per row, y1 = a inv1 (off1 + w1),
// s = h + y1, and with has_next y2 = s inv2 (off2 + w2), each rms over the whole row. Every value
// is written (later nodes may read any of them); the group's values never share bytes, and each
// invocation reads back only what it wrote itself. One workgroup of 256 per row; rows up to
// 6144 wide are held in registers, every load issued before the first store (all activations
// share one buffer, so a load after a store waits for it: interleaved, each of a row's 256-wide
// pieces cost a memory round trip), wider ones re-read. w1 is binding 3,
// w2 binding 6 (w1 again without a next norm). Weights f32 (0), f16 (1), bf16 (2).
struct Params {
    a: u32,
    h: u32,
    y1: u32,
    sum: u32,
    y2: u32,
    cols: u32,
    eps1: f32,
    off1: f32,
    fmt1: u32,
    eps2: f32,
    off2: f32,
    fmt2: u32,
    has_next: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
const WG: u32 = 256u;

const PER: u32 = 24u;

fn kernel(lid: vec3<u32>, wid: vec3<u32>, nwg: vec3<u32>) {
    let tid = lid.x;
    let base = wid.y * p.cols;
    let next = p.has_next != 0u;
    if (p.cols <= WG * PER) {
        var v: array<f32, PER>;
        var hv: array<f32, PER>;
        var w1v: array<f32, PER>;
        var w2v: array<f32, PER>;
        var sq = 0.0;
        for (var j = 0u; j < PER; j++) {
            let i = tid + j * WG;
            if (i < p.cols) {
                v[j] = act[p.a + base + i];
                hv[j] = act[p.h + base + i];
                w1v[j] = norm_weight(p.fmt1, i);
                if (next) {
                    w2v[j] = norm_weight2(p.fmt2, i);
                }
                sq += v[j] * v[j];
            }
        }
        let inv1 = 1.0 / sqrt(wg_sum(tid, sq) / f32(p.cols) + p.eps1);
        var sq2 = 0.0;
        for (var j = 0u; j < PER; j++) {
            if (tid + j * WG < p.cols) {
                v[j] = v[j] * inv1 * (p.off1 + w1v[j]);
                hv[j] += v[j];
                sq2 += hv[j] * hv[j];
            }
        }
        for (var j = 0u; j < PER; j++) {
            let i = tid + j * WG;
            if (i < p.cols) {
                act[p.y1 + base + i] = v[j];
                act[p.sum + base + i] = hv[j];
            }
        }
        if (!next) {
            return;
        }
        let inv2 = 1.0 / sqrt(wg_sum(tid, sq2) / f32(p.cols) + p.eps2);
        for (var j = 0u; j < PER; j++) {
            let i = tid + j * WG;
            if (i < p.cols) {
                act[p.y2 + base + i] = hv[j] * inv2 * (p.off2 + w2v[j]);
            }
        }
        return;
    }
    // Wider rows: each pass re-reads what it needs.
    var sq = 0.0;
    for (var i = tid; i < p.cols; i += WG) {
        let v = act[p.a + base + i];
        sq += v * v;
    }
    let inv1 = 1.0 / sqrt(wg_sum(tid, sq) / f32(p.cols) + p.eps1);
    var sq2 = 0.0;
    for (var i = tid; i < p.cols; i += WG) {
        let y = act[p.a + base + i] * inv1 * (p.off1 + norm_weight(p.fmt1, i));
        act[p.y1 + base + i] = y;
        let s = act[p.h + base + i] + y;
        act[p.sum + base + i] = s;
        sq2 += s * s;
    }
    if (!next) {
        return;
    }
    let inv2 = 1.0 / sqrt(wg_sum(tid, sq2) / f32(p.cols) + p.eps2);
    for (var i = tid; i < p.cols; i += WG) {
        act[p.y2 + base + i] = act[p.sum + base + i] * inv2 * (p.off2 + norm_weight2(p.fmt2, i));
    }
}
