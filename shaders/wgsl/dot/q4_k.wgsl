// matvec_dot's unit of q4_k (formats/q4_k.wgsl's layout, read through parts/q4k_pair.wgsl's
// 16-byte view): unit u is sub-block s = u % 8 of super-block u / 8, the low nibbles (s even) or
// high (s odd) of chunk s / 2's 32 bytes; d scale q - dmin min.
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q4_K_BYTES: u32 = 144u;
const Q4_K_QS: u32 = 16u;
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let blk = row / 16u + (u >> 3u) * (Q4_K_BYTES / 16u);
    let s = u & 7u;
    let c = s >> 1u;
    let shift = (s & 1u) * 4u;
    let h = wts4[blk]; // d, dmin and the scales
    let qs = blk + Q4_K_QS / 16u + 2u * c;
    let a = (wts4[qs] >> vec4<u32>(shift)) & vec4<u32>(0x0F0F0F0Fu);
    let e = (wts4[qs + 1u] >> vec4<u32>(shift)) & vec4<u32>(0x0F0F0F0Fu);
    var r: DotUnit;
    r.q = array<u32, 8>(a.x, a.y, a.z, a.w, e.x, e.y, e.z, e.w);
    let sm = q4k_scale_min(h, c);
    let dm = unpack2x16float(h.x);
    let d = dm.x * f32(select(sm.x & 0xFFu, sm.x >> 8u, (s & 1u) == 1u));
    let m = -dm.y * f32(select(sm.y & 0xFFu, sm.y >> 8u, (s & 1u) == 1u));
    r.c = vec4<f32>(d, d, m, m);
    return r;
}
