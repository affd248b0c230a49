// matvec_dot's unit of q4_0 (18-byte blocks of 32: d, 16 nibble bytes; (q - 8) d).
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q4_0_BYTES: u32 = 18u;
const Q4_0_QS: u32 = 2u;
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * Q4_0_BYTES;
    var r: DotUnit;
    r.q = q4_codes(b + Q4_0_QS);
    let d = f16_at(b);
    r.c = vec4<f32>(d, d, -8.0 * d, -8.0 * d);
    return r;
}
