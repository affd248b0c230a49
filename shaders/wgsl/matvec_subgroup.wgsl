// matvec.wgsl's subgroup variant (wgpu::Features::SUBGROUP; entry point, pass and reduction in
// parts/matvec_subgroup_main.wgsl): the same work per invocation, an item being a group of
// GROUP values through the format's `load_group`, each output's partial sums added by subgroup
// operations.
alias ItemX = vec4<f32>;
alias ItemW = vec4<f32>;

fn row_items() -> u32 {
    return p.k / GROUP;
}

// Weight rows start at byte offsets (`load_group`'s unit).
fn row_at(col: u32) -> u32 {
    return col * p.row_bytes;
}

fn item_x(xb: u32, g: u32) -> ItemX {
    return x_group(xb + g * GROUP);
}

fn item_w(w: u32, g: u32) -> ItemW {
    return load_group(w, g);
}

fn item_dot(w: ItemW, x: ItemX) -> f32 {
    return dot(w, x);
}
