// q4_k, unit u: sub-block s = u % 8 of super-block u / 8 (144 bytes: d, dmin (f16), 12 bytes
// packing 6-bit scales and mins, 128 bytes of nibbles: 32 bytes per 64 values, low nibbles
// first); value d * scale * q - dmin * min.
const UNIT: u32 = 32u;
var<private> wu: array<f32, 32>;
fn q4k_byte(sc: vec3<u32>, i: u32) -> u32 {
    var word = sc.z;
    if (i < 4u) {
        word = sc.x;
    } else if (i < 8u) {
        word = sc.y;
    }
    return (word >> (8u * (i & 3u))) & 0xFFu;
}
fn load_unit(row: u32, u: u32) {
    let b = (row >> 2u) + (u >> 3u) * 36u;
    let s = u & 7u;
    let dm = unpack2x16float(wts[b]);
    let sc = vec3<u32>(wts[b + 1u], wts[b + 2u], wts[b + 3u]);
    var scale: u32;
    var mn: u32;
    if (s < 4u) {
        scale = q4k_byte(sc, s) & 63u;
        mn = q4k_byte(sc, s + 4u) & 63u;
    } else {
        scale = (q4k_byte(sc, s + 4u) & 15u) | ((q4k_byte(sc, s - 4u) >> 6u) << 4u);
        mn = (q4k_byte(sc, s + 4u) >> 4u) | ((q4k_byte(sc, s) >> 6u) << 4u);
    }
    let d1 = dm.x * f32(scale);
    let m1 = dm.y * f32(mn);
    let q = b + 4u + 8u * (s >> 1u);
    let shift = (s & 1u) * 4u;
    for (var i = 0u; i < 8u; i++) {
        let v = wts[q + i] >> shift;
        wu[4u * i] = d1 * f32(v & 15u) - m1;
        wu[4u * i + 1u] = d1 * f32((v >> 8u) & 15u) - m1;
        wu[4u * i + 2u] = d1 * f32((v >> 16u) & 15u) - m1;
        wu[4u * i + 3u] = d1 * f32((v >> 24u) & 15u) - m1;
    }
}
