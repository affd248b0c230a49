// Fused per-head RmsNorm -> Rope (fuse.rs, NormRope): workgroup (head, row) normalises the head
// (y = x inv (off + w), written), rotates it (rotate-half, the angle reduced as in rope.wgsl) into
// dst, and with the kv_store part also stores the rotated head as K and the row's V head in the
// cache (the attention's kv_store dispatch is then left out). Weights f32 (0), f16 (1), bf16 (2).
struct Params {
    x: u32,
    y: u32,
    dst: u32,
    positions: u32,
    inv_freq: u32,
    cols: u32,
    head_dim: u32,
    eps: f32,
    offset: f32,
    wfmt: u32,
    factor: f32,
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
    let head = wid.x;
    let r = wid.y;
    let hd = p.head_dim;
    let half_dim = hd / 2u;
    let at = r * p.cols + head * hd;
    var sq = 0.0;
    for (var d = tid; d < hd; d += WG) {
        let v = act[p.x + at + d];
        sq += v * v;
    }
    let inv = 1.0 / sqrt(wg_sum(tid, sq) / f32(hd) + p.eps);
    let pos = args[p.positions + r];
    for (var d = tid; d < half_dim; d += WG) {
        let x1 = act[p.x + at + d] * inv * (p.offset + norm_weight(p.wfmt, d));
        let x2 = act[p.x + at + d + half_dim] * inv * (p.offset + norm_weight(p.wfmt, d + half_dim));
        act[p.y + at + d] = x1;
        act[p.y + at + d + half_dim] = x2;
        let a = (f32(pos) / p.factor) * bitcast<f32>(args[p.inv_freq + d]);
        let k = round(a * 0.15915494);
        let red_a = (a - k * 6.28125) - k * 0.0019353072;
        let s = sin(red_a);
        let c = cos(red_a);
        let o1 = x1 * c - x2 * s;
        let o2 = x2 * c + x1 * s;
        act[p.dst + at + d] = o1;
        act[p.dst + at + d + half_dim] = o2;
        rot[d] = o1;
        rot[d + half_dim] = o2;
    }
    store_kv(tid, r, head, at, pos);
}
