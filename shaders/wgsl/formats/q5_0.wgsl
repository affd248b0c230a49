// q5_0: 22-byte blocks of 32: d (f16), qh (32 bits: bit e is bit 4 of value e), 16 bytes as
// q4_0; (q - 16) d.
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q5_0_BYTES: u32 = 22u;
const Q5_0_QH: u32 = 2u;
const Q5_0_QS: u32 = 6u;
const GROUP: u32 = 4u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let b = row + (g >> 3u) * Q5_0_BYTES;
    let i = g & 7u;
    let e0 = 4u * (i & 3u) + 16u * (i >> 2u);
    let h = ld32(b + Q5_0_QH) >> e0;
    let v = ld32(b + Q5_0_QS + 4u * (i & 3u)) >> (4u * (i >> 2u));
    let lo = vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(15u);
    let hi = (vec4<u32>(h, h >> 1u, h >> 2u, h >> 3u) & vec4<u32>(1u)) << vec4<u32>(4u);
    return (vec4<f32>(lo | hi) - 16.0) * f16_at(b);
}
