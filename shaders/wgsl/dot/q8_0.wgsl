// matvec_dot's unit of q8_0 (34-byte blocks of 32: d, 32 signed bytes): the block itself.
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * 34u;
    var r: DotUnit;
    for (var i = 0u; i < 8u; i++) {
        r.q[i] = ld32(b + 2u + 4u * i);
    }
    let d = f16_at(b);
    r.c = vec4<f32>(d, d, 0.0, 0.0);
    return r;
}
