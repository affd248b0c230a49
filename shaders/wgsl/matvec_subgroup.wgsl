// matvec.wgsl's subgroup variant (wgpu::Features::SUBGROUP): the same work per invocation, but each
// output's 64 partial sums are added by subgroupAdd within each subgroup, whose first lane leaves
// the subgroup's sum in workgroup memory; after one barrier, invocation r < R adds the
// subgroups' sums of input row r (instead of a tree of log2(64) barriers).
override R: u32 = 1u;
// With GEGLU (a MatMul whose two equal halves only a GeGlu reads, fuse.rs): output column j is
// gelu_tanh(row j . x) * (row j + n_count . x), both rows decoded against one load of x.
override GEGLU: bool = false;
// Output columns per workgroup, one after another (a long matrix, such as the logits', is
// otherwise hundreds of thousands of small workgroups).
override NC: u32 = 1u;
// Invocations per workgroup (64, or more for long rows; at most 64 subgroups).
override WG: u32 = 64u;
var<workgroup> red: array<f32, 512>;
var<workgroup> red_up: array<f32, 512>; // GEGLU: the up half's sums // [R <= 8][subgroups <= WG]

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg_id: u32,
        @builtin(num_subgroups) sg_num: u32,
        @builtin(subgroup_invocation_id) sg_lane: u32) {
    for (var cc = 0u; cc < NC; cc++) {
        column((wid.x + wid.y * nwg.x) * NC + cc, lid.x, wid.z, sg_id, sg_num, sg_lane);
        workgroupBarrier();
    }
}

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
        let t = subgroupAdd(s);
        let tu = subgroupAdd(su);
        if (sg_lane == 0u) {
            red[r * 64u + sg_id] = t;
            red_up[r * 64u + sg_id] = tu;
        }
    }
    workgroupBarrier();
    if (tid < R) {
        let row = r0 + tid;
        if (col < p.n_count && row < p.rows) {
            var t = 0.0;
            var tu = 0.0;
            for (var i = 0u; i < sg_num; i++) {
                t += red[tid * 64u + i];
                tu += red_up[tid * 64u + i];
            }
            if (GEGLU) {
                t = gelu_tanh(t) * tu;
            }
            store(p.n_base + col, row, t);
        }
    }
}
