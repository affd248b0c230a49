// q4_1: 20-byte blocks of 32: d, m (f16), 16 bytes as q4_0; q d + m.
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q4_1_BYTES: u32 = 20u;
const Q4_1_QS: u32 = 4u;
const GROUP: u32 = 4u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let b = (row >> 2u) + (g >> 3u) * (Q4_1_BYTES / 4u);
    let i = g & 7u;
    let dm = unpack2x16float(wts[b]); // d, then m
    let v = wts[b + Q4_1_QS / 4u + (i & 3u)] >> (4u * (i >> 2u));
    let q = vec4<f32>(vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(15u));
    return q * dm.x + dm.y;
}
