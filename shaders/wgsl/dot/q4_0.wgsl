// matvec_dot's unit of q4_0 (18-byte blocks of 32: d, 16 nibble bytes; (q - 8) d).
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * 18u;
    var r: DotUnit;
    r.q = q4_codes(b + 2u);
    let d = f16_at(b);
    r.c = vec4<f32>(d, d, -8.0 * d, -8.0 * d);
    return r;
}
