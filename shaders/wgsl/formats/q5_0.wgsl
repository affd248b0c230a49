// q5_0: 22-byte blocks of 32: d (f16), qh (32 bits: bit j is bit 4 of value j), 16 bytes as
// q4_0; (q - 16) d.
const UNIT: u32 = 32u;
var<private> wu: array<f32, 32>;
fn load_unit(row: u32, u: u32) {
    let b = row + u * 22u;
    let d = f16_at(b);
    let qh = ld32(b + 2u);
    for (var i = 0u; i < 4u; i++) {
        let v = ld32(b + 6u + 4u * i);
        for (var j = 0u; j < 4u; j++) {
            let e = 4u * i + j;
            let byte = (v >> (8u * j)) & 0xFFu;
            let lo = (byte & 15u) | (((qh >> e) & 1u) << 4u);
            let hi = (byte >> 4u) | (((qh >> (e + 16u)) & 1u) << 4u);
            wu[e] = (f32(lo) - 16.0) * d;
            wu[e + 16u] = (f32(hi) - 16.0) * d;
        }
    }
}
