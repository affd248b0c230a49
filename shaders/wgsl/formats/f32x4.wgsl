// f32 weights, four values per group (k % 4 == 0).
const GROUP: u32 = 4u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let i = (row >> 2u) + 4u * g;
    return bitcast<vec4<f32>>(vec4<u32>(wts[i], wts[i + 1u], wts[i + 2u], wts[i + 3u]));
}
