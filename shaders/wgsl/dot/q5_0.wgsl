// matvec_dot's unit of q5_0 (22-byte blocks of 32: d, qh (bit j: bit 4 of value j), 16 bytes
// as q4_0's; (q - 16) d).
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q5_0_BYTES: u32 = 22u;
const Q5_0_QH: u32 = 2u;
const Q5_0_QS: u32 = 6u;
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * Q5_0_BYTES;
    var r: DotUnit;
    r.q = q5_codes(b + Q5_0_QH, b + Q5_0_QS);
    let d = f16_at(b);
    r.c = vec4<f32>(d, d, -16.0 * d, -16.0 * d);
    return r;
}
