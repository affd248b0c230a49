// bf16 weights, one value per group (any k).
const GROUP: u32 = 1u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<f32>(ld16(row + 2u * g) << 16u), 0.0, 0.0, 0.0);
}
