// q5_1: 24-byte blocks of 32: d, m (f16), qh, 16 bytes as q5_0; q d + m.
const UNIT: u32 = 32u;
var<private> wu: array<f32, 32>;
fn load_unit(row: u32, u: u32) {
    let b = row + u * 24u;
    let dm = unpack2x16float(wts[b >> 2u]);
    let qh = wts[(b >> 2u) + 1u];
    for (var i = 0u; i < 4u; i++) {
        let v = wts[(b >> 2u) + 2u + i];
        for (var j = 0u; j < 4u; j++) {
            let e = 4u * i + j;
            let byte = (v >> (8u * j)) & 0xFFu;
            let lo = (byte & 15u) | (((qh >> e) & 1u) << 4u);
            let hi = (byte >> 4u) | (((qh >> (e + 16u)) & 1u) << 4u);
            wu[e] = f32(lo) * dm.x + dm.y;
            wu[e + 16u] = f32(hi) * dm.x + dm.y;
        }
    }
}
