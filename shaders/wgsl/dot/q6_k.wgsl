// matvec_dot's unit of q6_k (formats/q6_k.wgsl's layout): unit u holds values 32 s .. 32 s + 31
// (s = u % 4) of half h = (u / 4) % 2 of super-block u / 8, codes 0 .. 63 with one signed scale
// per 16 values; d scale (q - 32).
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q6_K_BYTES: u32 = 210u;
const Q6_K_QH: u32 = 128u;
const Q6_K_SCALES: u32 = 192u;
const Q6_K_D: u32 = 208u;
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + (u >> 3u) * Q6_K_BYTES;
    let h = (u >> 2u) & 1u;
    let s = u & 3u;
    let qlo = b + 64u * h + 32u * (s & 1u);
    let lshift = (s >> 1u) * 4u;
    let qhi = b + Q6_K_QH + 32u * h;
    let hshift = 2u * s;
    var r: DotUnit;
    for (var i = 0u; i < 8u; i++) {
        let lo = (ld32(qlo + 4u * i) >> lshift) & 0x0F0F0F0Fu;
        let hi = (ld32(qhi + 4u * i) >> hshift) & 0x03030303u;
        r.q[i] = lo | (hi << 4u);
    }
    let d = f16_at(b + Q6_K_D);
    let scs = ld16(b + Q6_K_SCALES + 8u * h + 2u * s);
    let d0 = d * sext8(scs);
    let d1 = d * sext8(scs >> 8u);
    r.c = vec4<f32>(d0, d1, -32.0 * d0, -32.0 * d1);
    return r;
}
