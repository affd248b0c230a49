// f16 weights, one value per group (any k).
const GROUP: u32 = 1u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    return vec4<f32>(f16_at(row + 2u * g), 0.0, 0.0, 0.0);
}
