// q8_0: 34-byte blocks of 32: d (f16), 32 signed bytes; q d.
const UNIT: u32 = 32u;
var<private> wu: array<f32, 32>;
fn load_unit(row: u32, u: u32) {
    let b = row + u * 34u;
    let d = f16_at(b);
    for (var i = 0u; i < 8u; i++) {
        let v = ld32(b + 2u + 4u * i);
        wu[4u * i] = sext8(v) * d;
        wu[4u * i + 1u] = sext8(v >> 8u) * d;
        wu[4u * i + 2u] = sext8(v >> 16u) * d;
        wu[4u * i + 3u] = sext8(v >> 24u) * d;
    }
}
