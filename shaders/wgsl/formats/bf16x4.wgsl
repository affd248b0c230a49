// bf16 weights, four values per group (k % 4 == 0).
const GROUP: u32 = 4u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let i = (row >> 2u) + 2u * g;
    let a = wts[i];
    let b = wts[i + 1u];
    return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xFFFF0000u, b << 16u, b & 0xFFFF0000u));
}
