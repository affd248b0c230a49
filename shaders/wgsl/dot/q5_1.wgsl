// matvec_dot's unit of q5_1 (24-byte blocks of 32: d, m, qh, 16 bytes as q5_0's; q d + m).
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q5_1_BYTES: u32 = 24u;
const Q5_1_M: u32 = 2u;
const Q5_1_QH: u32 = 4u;
const Q5_1_QS: u32 = 8u;
fn dot_unit(row: u32, u: u32) -> DotUnit {
    let b = row + u * Q5_1_BYTES;
    var r: DotUnit;
    r.q = q5_codes(b + Q5_1_QH, b + Q5_1_QS);
    let d = f16_at(b);
    let m = f16_at(b + Q5_1_M);
    r.c = vec4<f32>(d, d, m, m);
    return r;
}
