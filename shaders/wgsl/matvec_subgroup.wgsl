// matvec.wgsl's subgroup variant (wgpu::Features::SUBGROUP; entry point and reduction in
// parts/matvec_subgroup_main.wgsl): the same work per invocation, groups of 4 values through the
// format's `load_group`, each output's partial sums added by subgroup operations.

// Output column `col` of the input rows of workgroup layer z.
fn column(col: u32, tid: u32, z: u32, sg_id: u32, sg_num: u32, sg_lane: u32) {
    let r0 = z * R;
    let groups = p.k / GROUP;
    let wrow = col * p.row_bytes;
    for (var r = 0u; r < R; r++) {
        var s = 0.0;
        var su = 0.0;
        let row = r0 + r;
        if (col < p.n_count && row < p.rows) {
            let xb = p.x + row * p.k;
            let wrow_u = (col + p.n_count) * p.row_bytes;
            var s1 = 0.0;
            var su1 = 0.0;
            var g = tid;
            for (; g + WG < groups; g += 2u * WG) {
                let x0 = x_group(xb + g * GROUP);
                let x1 = x_group(xb + (g + WG) * GROUP);
                s += dot(load_group(wrow, g), x0);
                s1 += dot(load_group(wrow, g + WG), x1);
                if (GEGLU) {
                    su += dot(load_group(wrow_u, g), x0);
                    su1 += dot(load_group(wrow_u, g + WG), x1);
                }
            }
            if (g < groups) {
                let x0 = x_group(xb + g * GROUP);
                s += dot(load_group(wrow, g), x0);
                if (GEGLU) {
                    su += dot(load_group(wrow_u, g), x0);
                }
            }
            s += s1;
            su += su1;
        }
        publish(r, s, su, sg_id, sg_lane);
    }
    finish(col, r0, tid, sg_num);
}
