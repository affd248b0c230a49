// matvec_dot's unit of q4_0 (18-byte blocks of 32: d, 16 bytes; value j the low nibble of byte
// j, value j + 16 its high nibble; (q - 8) d).
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * 18u;
    var r: DotUnit;
    for (var i = 0u; i < 4u; i++) {
        let v = ld32(b + 2u + 4u * i);
        r.q[i] = v & 0x0F0F0F0Fu;
        r.q[i + 4u] = (v >> 4u) & 0x0F0F0F0Fu;
    }
    let d = f16_at(b);
    r.c = vec4<f32>(d, d, -8.0 * d, -8.0 * d);
    return r;
}
