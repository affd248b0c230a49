// The subgroup matvec for f16 weights whose rows are a multiple of 8 values (entry point, pass
// and reduction in parts/matvec_subgroup_main.wgsl, whose items this file defines): item t of a
// row is its values 8 t .. 8 t + 7, one 16-byte load of weights (parts/views16.wgsl) and two of
// each input row's values, where matvec_subgroup.wgsl's items of 4 take two 4-byte weight loads
// and four of each input row's values.

struct F16x8 {
    a: vec4<f32>,
    b: vec4<f32>,
}
alias ItemX = F16x8;
alias ItemW = F16x8;

fn row_items() -> u32 {
    return p.k / 8u;
}

// Weight rows start at 16-byte offsets (rows of a multiple of 8 values, bound 16-byte aligned).
fn row_at(col: u32) -> u32 {
    return col * (p.row_bytes / 16u);
}

// xb is a multiple of 4 (arena values are 256-byte aligned, k a multiple of 8).
fn item_x(xb: u32, t: u32) -> ItemX {
    let at = (xb >> 2u) + 2u * t;
    return F16x8(act4[at], act4[at + 1u]);
}

fn item_w(w: u32, t: u32) -> ItemW {
    let q = wts4[w + t];
    return F16x8(vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y)),
        vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w)));
}

fn item_dot(w: ItemW, x: ItemX) -> f32 {
    return dot(w.a, x.a) + dot(w.b, x.b);
}
