// f16 weights, four values per group (k % 4 == 0: rows are 8-byte aligned).
const GROUP: u32 = 4u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let i = (row >> 2u) + 2u * g;
    return vec4<f32>(unpack2x16float(wts[i]), unpack2x16float(wts[i + 1u]));
}
