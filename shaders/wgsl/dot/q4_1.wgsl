// matvec_dot's unit of q4_1 (20-byte blocks of 32: d, m, 16 bytes as q4_0's; q d + m).
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * 20u;
    var r: DotUnit;
    for (var i = 0u; i < 4u; i++) {
        let v = ld32(b + 4u + 4u * i);
        r.q[i] = v & 0x0F0F0F0Fu;
        r.q[i + 4u] = (v >> 4u) & 0x0F0F0F0Fu;
    }
    let d = f16_at(b);
    let m = f16_at(b + 2u);
    r.c = vec4<f32>(d, d, m, m);
    return r;
}
