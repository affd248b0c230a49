// q4_k: 144-byte super-blocks of 256: d, dmin (f16), 12 bytes packing 6-bit scales and mins,
// 128 bytes of nibbles (32 bytes per 64 values, low nibbles first). Group g: values 4i .. 4i + 3
// (i = g % 8) of sub-block s = (g / 8) % 8 of super-block g / 64; value d * scale * q - dmin * min.
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q4_K_BYTES: u32 = 144u;
const Q4_K_SCALES: u32 = 4u;
const Q4_K_QS: u32 = 16u;
const GROUP: u32 = 4u;
fn q4k_byte(sc: vec3<u32>, i: u32) -> u32 {
    var word = sc.z;
    if (i < 4u) {
        word = sc.x;
    } else if (i < 8u) {
        word = sc.y;
    }
    return (word >> (8u * (i & 3u))) & 0xFFu;
}
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let b = (row >> 2u) + (g >> 6u) * (Q4_K_BYTES / 4u);
    let s = (g >> 3u) & 7u;
    let i = g & 7u;
    let dm = unpack2x16float(wts[b]); // d, then dmin
    let sc_at = b + Q4_K_SCALES / 4u;
    let sc = vec3<u32>(wts[sc_at], wts[sc_at + 1u], wts[sc_at + 2u]);
    var scale: u32;
    var mn: u32;
    if (s < 4u) {
        scale = q4k_byte(sc, s) & 63u;
        mn = q4k_byte(sc, s + 4u) & 63u;
    } else {
        scale = (q4k_byte(sc, s + 4u) & 15u) | ((q4k_byte(sc, s - 4u) >> 6u) << 4u);
        mn = (q4k_byte(sc, s + 4u) >> 4u) | ((q4k_byte(sc, s) >> 6u) << 4u);
    }
    let v = wts[b + Q4_K_QS / 4u + 8u * (s >> 1u) + i] >> ((s & 1u) * 4u);
    let q = vec4<f32>(vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(15u));
    return q * (dm.x * f32(scale)) - dm.y * f32(mn);
}
