// q4_0: 18-byte blocks of 32: d (f16), 16 bytes (value j the low nibble of byte j, value j + 16
// the high nibble); (q - 8) d. Group g: values 4i .. 4i + 3 (i = g % 8) of block g / 8.
const GROUP: u32 = 4u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let b = row + (g >> 3u) * 18u;
    let i = g & 7u;
    let v = ld32(b + 2u + 4u * (i & 3u)) >> (4u * (i >> 2u));
    let q = vec4<f32>(vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(15u));
    return (q - 8.0) * f16_at(b);
}
