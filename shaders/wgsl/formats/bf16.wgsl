// bf16 weights, one value per unit (any k).
const UNIT: u32 = 1u;
var<private> wu: array<f32, 1>;
fn load_unit(row: u32, u: u32) {
    wu[0] = bitcast<f32>(ld16(row + 2u * u) << 16u);
}
