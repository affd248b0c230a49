// matvec_dot's unit of q5_0 (22-byte blocks of 32: d, qh (bit j: bit 4 of value j), 16 bytes
// as q4_0's; (q - 16) d).
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * 22u;
    var r: DotUnit;
    r.q = q5_codes(b + 2u);
    let d = f16_at(b);
    r.c = vec4<f32>(d, d, -16.0 * d, -16.0 * d);
    return r;
}
