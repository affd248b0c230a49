// Fused per-head RmsNorm -> Rope (fuse.rs, NormRope, or two of them as one NormRopePair: Gemma's
// q and k): workgroup (head, row) normalises the head (y = x inv (off + w), written), rotates it
// (rotate-half, the angle reduced as in rope.wgsl) into dst, and with the kv_store part also
// stores the rotated head as K and the row's V head in the cache (the attention's kv_store
// dispatch is then left out). Workgroups x < heads_a take parameter set a (weight at binding 3),
// the others set b (weight at binding 6); a single group passes its set twice. The set that
// stores: b with store_b, else a. Weights f32 (0), f16 (1), bf16 (2).
struct Params {
    x: u32,
    y: u32,
    dst: u32,
    inv_freq: u32,
    cols: u32,
    eps: f32,
    offset: f32,
    wfmt: u32,
    factor: f32,
    x_b: u32,
    y_b: u32,
    dst_b: u32,
    inv_freq_b: u32,
    cols_b: u32,
    eps_b: f32,
    offset_b: f32,
    wfmt_b: u32,
    factor_b: f32,
    heads_a: u32,
    store_b: u32,
    positions: u32,
    head_dim: u32,
    v: u32,
    slots: u32,
    capacity: u32,
    f16: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> args: array<u32>;
const WG: u32 = 64u;
var<workgroup> rot: array<f32, 512>; // the rotated head (MAX_HEAD_DIM in fuse.rs)

fn kernel(lid: vec3<u32>, wid: vec3<u32>, nwg: vec3<u32>) {
    let tid = lid.x;
    let in_b = wid.x >= p.heads_a;
    let head = select(wid.x, wid.x - p.heads_a, in_b);
    let x = select(p.x, p.x_b, in_b);
    let y = select(p.y, p.y_b, in_b);
    let dst = select(p.dst, p.dst_b, in_b);
    let inv_freq = select(p.inv_freq, p.inv_freq_b, in_b);
    let cols = select(p.cols, p.cols_b, in_b);
    let eps = select(p.eps, p.eps_b, in_b);
    let offset = select(p.offset, p.offset_b, in_b);
    let wfmt = select(p.wfmt, p.wfmt_b, in_b);
    let factor = select(p.factor, p.factor_b, in_b);
    let r = wid.y;
    let hd = p.head_dim;
    let half_dim = hd / 2u;
    let at = r * cols + head * hd;
    // Each invocation's rotation pairs d, d + half_dim (d = tid + j WG, at most 4 of them: heads
    // up to 512 wide) loaded before the first store: all activations share one buffer, so a
    // load after a store waits for it.
    var xa: array<f32, 4>;
    var xb: array<f32, 4>;
    var wa: array<f32, 4>;
    var wb: array<f32, 4>;
    var fr: array<f32, 4>;
    var sq = 0.0;
    for (var j = 0u; j < 4u; j++) {
        let d = tid + j * WG;
        if (d < half_dim) {
            xa[j] = act[x + at + d];
            xb[j] = act[x + at + d + half_dim];
            if (in_b) {
                wa[j] = norm_weight2(wfmt, d);
                wb[j] = norm_weight2(wfmt, d + half_dim);
            } else {
                wa[j] = norm_weight(wfmt, d);
                wb[j] = norm_weight(wfmt, d + half_dim);
            }
            fr[j] = bitcast<f32>(args[inv_freq + d]);
            sq += xa[j] * xa[j] + xb[j] * xb[j];
        }
    }
    let inv = 1.0 / sqrt(wg_sum(tid, sq) / f32(hd) + eps);
    let pos = args[p.positions + r];
    for (var j = 0u; j < 4u; j++) {
        let d = tid + j * WG;
        if (d < half_dim) {
            let x1 = xa[j] * inv * (offset + wa[j]);
            let x2 = xb[j] * inv * (offset + wb[j]);
            act[y + at + d] = x1;
            act[y + at + d + half_dim] = x2;
            let a = (f32(pos) / factor) * fr[j];
            let k = round(a * 0.15915494);
            let red_a = (a - k * 6.28125) - k * 0.0019353072;
            let s = sin(red_a);
            let c = cos(red_a);
            let o1 = x1 * c - x2 * s;
            let o2 = x2 * c + x1 * s;
            act[dst + at + d] = o1;
            act[dst + at + d + half_dim] = o2;
            rot[d] = o1;
            rot[d + half_dim] = o2;
        }
    }
    store_kv(tid, r, head, at, pos, in_b == (p.store_b != 0u), cols);
}
