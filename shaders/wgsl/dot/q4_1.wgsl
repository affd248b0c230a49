// matvec_dot's unit of q4_1 (20-byte blocks of 32: d, m, 16 nibble bytes; q d + m).
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * 20u;
    var r: DotUnit;
    r.q = q4_codes(b + 4u);
    let d = f16_at(b);
    let m = f16_at(b + 2u);
    r.c = vec4<f32>(d, d, m, m);
    return r;
}
