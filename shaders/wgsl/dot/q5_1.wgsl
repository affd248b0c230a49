// matvec_dot's unit of q5_1 (24-byte blocks of 32: d, m, qh, 16 bytes as q5_0's; q d + m).
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * 24u;
    var r: DotUnit;
    r.q = q5_codes(b + 4u);
    let d = f16_at(b);
    let m = f16_at(b + 2u);
    r.c = vec4<f32>(d, d, m, m);
    return r;
}
