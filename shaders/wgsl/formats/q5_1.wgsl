// q5_1: 24-byte blocks of 32: d, m (f16), qh, 16 bytes as q5_0; q d + m.
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q5_1_BYTES: u32 = 24u;
const Q5_1_QH: u32 = 4u;
const Q5_1_QS: u32 = 8u;
const GROUP: u32 = 4u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let b = (row >> 2u) + (g >> 3u) * (Q5_1_BYTES / 4u);
    let i = g & 7u;
    let dm = unpack2x16float(wts[b]); // d, then m
    let e0 = 4u * (i & 3u) + 16u * (i >> 2u);
    let h = wts[b + Q5_1_QH / 4u] >> e0;
    let v = wts[b + Q5_1_QS / 4u + (i & 3u)] >> (4u * (i >> 2u));
    let lo = vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(15u);
    let hi = (vec4<u32>(h, h >> 1u, h >> 2u, h >> 3u) & vec4<u32>(1u)) << vec4<u32>(4u);
    return vec4<f32>(lo | hi) * dm.x + dm.y;
}
