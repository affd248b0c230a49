// matvec_dot's unit of q8_0 (34-byte blocks of 32: d, 32 signed bytes): the block itself.
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q8_0_BYTES: u32 = 34u;
const Q8_0_QS: u32 = 2u;
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * Q8_0_BYTES;
    var r: DotUnit;
    for (var i = 0u; i < 8u; i++) {
        r.q[i] = ld32(b + Q8_0_QS + 4u * i);
    }
    let d = f16_at(b);
    r.c = vec4<f32>(d, d, 0.0, 0.0);
    return r;
}
