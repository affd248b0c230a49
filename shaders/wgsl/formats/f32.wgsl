// f32 weights, one value per group (any k).
const GROUP: u32 = 1u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<f32>(wts[(row >> 2u) + g]), 0.0, 0.0, 0.0);
}
