// Workgroup reductions, portable variant (no optional feature): a tree in workgroup memory.
// A kernel that reduces declares `const WG` (its workgroup size, a power of two) and
// `fn kernel(lid, wid, nwg)`; this part gives it its entry point, `wg_sum` and `wg_max`. Both must
// be called by every invocation of the workgroup (they hold barriers).
var<workgroup> red: array<f32, WG>;

fn wg_sum(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            red[tid] += red[tid + stride];
        }
        workgroupBarrier();
    }
    let s = red[0];
    workgroupBarrier();
    return s;
}

fn wg_max(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            red[tid] = max(red[tid], red[tid + stride]);
        }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    return m;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    kernel(lid, wid, nwg);
}
