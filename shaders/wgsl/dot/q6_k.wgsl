// matvec_dot's unit of q6_k (formats/q6_k.wgsl's layout): unit u holds values 32 s .. 32 s + 31
// (s = u % 4) of half h = (u / 4) % 2 of super-block u / 8, codes 0 .. 63 with one signed scale
// per 16 values; d scale (q - 32).
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + (u >> 3u) * 210u;
    let h = (u >> 2u) & 1u;
    let s = u & 3u;
    let qlo = b + 64u * h + 32u * (s & 1u);
    let lshift = (s >> 1u) * 4u;
    let qhi = b + 128u + 32u * h;
    let hshift = 2u * s;
    var r: DotUnit;
    for (var i = 0u; i < 8u; i++) {
        let lo = (ld32(qlo + 4u * i) >> lshift) & 0x0F0F0F0Fu;
        let hi = (ld32(qhi + 4u * i) >> hshift) & 0x03030303u;
        r.q[i] = lo | (hi << 4u);
    }
    let d = f16_at(b + 208u);
    let scs = ld16(b + 192u + 8u * h + 2u * s);
    let d0 = d * sext8(scs);
    let d1 = d * sext8(scs >> 8u);
    r.c = vec4<f32>(d0, d1, -32.0 * d0, -32.0 * d1);
    return r;
}
