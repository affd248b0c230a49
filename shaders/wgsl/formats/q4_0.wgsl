// q4_0: 18-byte blocks of 32: d (f16), 16 bytes (value j the low nibble of byte j, value j + 16
// the high nibble); (q - 8) d. Group g: values 4i .. 4i + 3 (i = g % 8) of block g / 8.
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q4_0_BYTES: u32 = 18u;
const Q4_0_QS: u32 = 2u;
const GROUP: u32 = 4u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let b = row + (g >> 3u) * Q4_0_BYTES;
    let i = g & 7u;
    let v = ld32(b + Q4_0_QS + 4u * (i & 3u)) >> (4u * (i >> 2u));
    let q = vec4<f32>(vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(15u));
    return (q - 8.0) * f16_at(b);
}
