// The entry point, the pass over a row and the reduction of the subgroup matvecs
// (wgpu::Features::SUBGROUP). The kernel file (matvec_subgroup.wgsl, matvec_q4k.wgsl) says what
// a work item is: `ItemX`, the input values an item multiplies; `ItemW`, its weights decoded;
// `row_items()`, the items of a row; `row_at(col)`, where weight row `col` starts in the
// kernel's units; `item_x(xb, t)`, item t's input values from input row xb; `item_w(w, t)`, item
// t of the row at w decoded; `item_dot(w, x)`, decoded weights against input values. The row's
// invocations take items tid, tid + WG, ..., each item decoded once for all R input rows. Each
// output's partial sums are added by subgroupAdd within each subgroup, whose first lane leaves
// the subgroup's sum in workgroup memory (`publish`); after one barrier, invocation r < R adds
// the subgroups' sums of input row r (`finish`, instead of a tree of log2(64) barriers).
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
    let items = row_items();
    let w = row_at(col);
    // Partial sums by input row (R <= 8), and the up half's with GEGLU.
    var s: array<f32, 8>;
    var su: array<f32, 8>;
    if (col < p.n_count) {
        let wu = row_at(col + p.n_count);
        // Two items at a time, so both sets of loads are in flight together.
        var t = tid;
        for (; t + WG < items; t += 2u * WG) {
            let w0 = item_w(w, t);
            let w1 = item_w(w, t + WG);
            var u0 = w0;
            var u1 = w1;
            if (GEGLU) {
                u0 = item_w(wu, t);
                u1 = item_w(wu, t + WG);
            }
            for (var r = 0u; r < R; r++) {
                if (r0 + r < p.rows) {
                    let xb = p.x + (r0 + r) * p.k;
                    let x0 = item_x(xb, t);
                    let x1 = item_x(xb, t + WG);
                    s[r] += item_dot(w0, x0) + item_dot(w1, x1);
                    if (GEGLU) {
                        su[r] += item_dot(u0, x0) + item_dot(u1, x1);
                    }
                }
            }
        }
        if (t < items) {
            let w0 = item_w(w, t);
            var u0 = w0;
            if (GEGLU) {
                u0 = item_w(wu, t);
            }
            for (var r = 0u; r < R; r++) {
                if (r0 + r < p.rows) {
                    let x0 = item_x(p.x + (r0 + r) * p.k, t);
                    s[r] += item_dot(w0, x0);
                    if (GEGLU) {
                        su[r] += item_dot(u0, x0);
                    }
                }
            }
        }
    }
    for (var r = 0u; r < R; r++) {
        publish(r, s[r], su[r], sg_id, sg_lane);
    }
    finish(col, r0, tid, sg_num);
}

// This invocation's partial sums of input row r (s; su, the up half's, with GEGLU) into the
// subgroup's entry of workgroup memory. Every invocation calls it, for every r < R in turn.
fn publish(r: u32, s: f32, su: f32, sg_id: u32, sg_lane: u32) {
    let t = subgroupAdd(s);
    let tu = subgroupAdd(su);
    if (sg_lane == 0u) {
        red[r * 64u + sg_id] = t;
        red_up[r * 64u + sg_id] = tu;
    }
}

// After every row's `publish`: output column `col` of input rows r0 .. r0 + R.
fn finish(col: u32, r0: u32, tid: u32, sg_num: u32) {
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
