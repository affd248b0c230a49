// q4_1: 20-byte blocks of 32: d, m (f16), 16 bytes as q4_0; q d + m.
const GROUP: u32 = 4u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let b = (row >> 2u) + (g >> 3u) * 5u;
    let i = g & 7u;
    let dm = unpack2x16float(wts[b]);
    let v = wts[b + 1u + (i & 3u)] >> (4u * (i >> 2u));
    let q = vec4<f32>(vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(15u));
    return q * dm.x + dm.y;
}
