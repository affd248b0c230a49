// f16 weights, four values per unit (k % 4 == 0: rows are 8-byte aligned).
const UNIT: u32 = 4u;
var<private> wu: array<f32, 4>;
fn load_unit(row: u32, u: u32) {
    let i = (row >> 2u) + 2u * u;
    let a = unpack2x16float(wts[i]);
    let b = unpack2x16float(wts[i + 1u]);
    wu[0] = a.x;
    wu[1] = a.y;
    wu[2] = b.x;
    wu[3] = b.y;
}
