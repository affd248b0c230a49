// Workgroup reductions, subgroup variant (wgpu::Features::SUBGROUP): each
// subgroup reduces in registers (subgroupAdd / subgroupMax), its first lane leaves the result in
// workgroup memory, and every invocation adds up the subgroups' results after one barrier
// (instead of log2(WG) barriers). Same interface as reduce.wgsl.
var<private> sg_id: u32;
var<private> sg_num: u32;
var<private> sg_lane: u32;
var<workgroup> red: array<f32, WG>; // one entry per subgroup (any subgroup size)

fn wg_sum(tid: u32, v: f32) -> f32 {
    let s = subgroupAdd(v);
    if (sg_lane == 0u) {
        red[sg_id] = s;
    }
    workgroupBarrier();
    var t = 0.0;
    for (var i = 0u; i < sg_num; i++) {
        t += red[i];
    }
    workgroupBarrier();
    return t;
}

fn wg_max(tid: u32, v: f32) -> f32 {
    let s = subgroupMax(v);
    if (sg_lane == 0u) {
        red[sg_id] = s;
    }
    workgroupBarrier();
    var t = NEG_INF;
    for (var i = 0u; i < sg_num; i++) {
        t = max(t, red[i]);
    }
    workgroupBarrier();
    return t;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sid: u32,
        @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    sg_id = sid;
    sg_num = nsg;
    sg_lane = lane;
    kernel(lid, wid, nwg);
}
