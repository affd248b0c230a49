// q4_0: 18-byte blocks of 32: d (f16), 16 bytes (value j the low nibble of byte j, value j + 16
// the high nibble); (q - 8) d.
const UNIT: u32 = 32u;
var<private> wu: array<f32, 32>;
fn load_unit(row: u32, u: u32) {
    let b = row + u * 18u;
    let d = f16_at(b);
    for (var i = 0u; i < 4u; i++) {
        let v = ld32(b + 2u + 4u * i);
        for (var j = 0u; j < 4u; j++) {
            let byte = (v >> (8u * j)) & 0xFFu;
            wu[4u * i + j] = (f32(byte & 15u) - 8.0) * d;
            wu[4u * i + j + 16u] = (f32(byte >> 4u) - 8.0) * d;
        }
    }
}
