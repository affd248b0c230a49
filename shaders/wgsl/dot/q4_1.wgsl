// matvec_dot's unit of q4_1 (20-byte blocks of 32: d, m, 16 nibble bytes; q d + m).
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q4_1_BYTES: u32 = 20u;
const Q4_1_M: u32 = 2u;
const Q4_1_QS: u32 = 4u;
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * Q4_1_BYTES;
    var r: DotUnit;
    r.q = q4_codes(b + Q4_1_QS);
    let d = f16_at(b);
    let m = f16_at(b + Q4_1_M);
    r.c = vec4<f32>(d, d, m, m);
    return r;
}
