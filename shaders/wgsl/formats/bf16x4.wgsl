// bf16 weights, four values per unit (k % 4 == 0).
const UNIT: u32 = 4u;
var<private> wu: array<f32, 4>;
fn load_unit(row: u32, u: u32) {
    let i = (row >> 2u) + 2u * u;
    let a = wts[i];
    let b = wts[i + 1u];
    wu[0] = bitcast<f32>(a << 16u);
    wu[1] = bitcast<f32>(a & 0xFFFF0000u);
    wu[2] = bitcast<f32>(b << 16u);
    wu[3] = bitcast<f32>(b & 0xFFFF0000u);
}
