// q4_1: 20-byte blocks of 32: d, m (f16), 16 bytes as q4_0; q d + m.
const UNIT: u32 = 32u;
var<private> wu: array<f32, 32>;
fn load_unit(row: u32, u: u32) {
    let b = row + u * 20u;
    let dm = unpack2x16float(wts[b >> 2u]);
    for (var i = 0u; i < 4u; i++) {
        let v = wts[(b >> 2u) + 1u + i];
        for (var j = 0u; j < 4u; j++) {
            let byte = (v >> (8u * j)) & 0xFFu;
            wu[4u * i + j] = f32(byte & 15u) * dm.x + dm.y;
            wu[4u * i + j + 16u] = f32(byte >> 4u) * dm.x + dm.y;
        }
    }
}
