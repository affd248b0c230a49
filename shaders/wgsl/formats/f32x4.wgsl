// f32 weights, four values per unit (k % 4 == 0).
const UNIT: u32 = 4u;
var<private> wu: array<f32, 4>;
fn load_unit(row: u32, u: u32) {
    let i = (row >> 2u) + 4u * u;
    wu[0] = bitcast<f32>(wts[i]);
    wu[1] = bitcast<f32>(wts[i + 1u]);
    wu[2] = bitcast<f32>(wts[i + 2u]);
    wu[3] = bitcast<f32>(wts[i + 3u]);
}
