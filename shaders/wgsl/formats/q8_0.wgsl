// q8_0: 34-byte blocks of 32: d (f16), 32 signed bytes; q d.
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q8_0_BYTES: u32 = 34u;
const Q8_0_QS: u32 = 2u;
const GROUP: u32 = 4u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let b = row + (g >> 3u) * Q8_0_BYTES;
    let v = i32(ld32(b + Q8_0_QS + 4u * (g & 7u)));
    let q = vec4<i32>(v << 24u, v << 16u, v << 8u, v) >> vec4<u32>(24u);
    return vec4<f32>(q) * f16_at(b);
}
