// matvec.wgsl's subgroup variant (wgpu::Features::SUBGROUP): the same work per invocation, but each
// output's 64 partial sums are added by subgroupAdd within each subgroup, whose first lane leaves
// the subgroup's sum in workgroup memory; after one barrier, invocation r < R adds the
// subgroups' sums of input row r (instead of a tree of log2(64) barriers).
override R: u32 = 1u;
const WG: u32 = 64u;
var<workgroup> red: array<f32, 512>; // [R <= 8][subgroups <= WG]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg_id: u32,
        @builtin(num_subgroups) sg_num: u32,
        @builtin(subgroup_invocation_id) sg_lane: u32) {
    let tid = lid.x;
    let col = wid.x + wid.y * nwg.x;
    let r0 = wid.z * R;
    let groups = p.k / GROUP;
    let wrow = col * p.row_bytes;
    for (var r = 0u; r < R; r++) {
        var s = 0.0;
        let row = r0 + r;
        if (col < p.n_count && row < p.rows) {
            let xb = p.x + row * p.k;
            var s1 = 0.0;
            var g = tid;
            for (; g + WG < groups; g += 2u * WG) {
                s += dot(load_group(wrow, g), x_group(xb + g * GROUP));
                s1 += dot(load_group(wrow, g + WG), x_group(xb + (g + WG) * GROUP));
            }
            if (g < groups) {
                s += dot(load_group(wrow, g), x_group(xb + g * GROUP));
            }
            s += s1;
        }
        let t = subgroupAdd(s);
        if (sg_lane == 0u) {
            red[r * WG + sg_id] = t;
        }
    }
    workgroupBarrier();
    if (tid < R) {
        let row = r0 + tid;
        if (col < p.n_count && row < p.rows) {
            var t = 0.0;
            for (var i = 0u; i < sg_num; i++) {
                t += red[tid * WG + i];
            }
            store(p.n_base + col, row, t);
        }
    }
}
