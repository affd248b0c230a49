// Op::MatMul for few input rows (decode): y = x @ W^T. One workgroup of 64 invocations per
// weight row and R input rows: invocation i takes groups i, i + 64, ... of the row (4
// neighbouring values of a block, decoded in registers: neighbouring invocations read
// neighbouring words), for each input row in turn (the row's weights stay in the cache); the
// 64 partial sums of each output meet in a tree in workgroup memory (no subgroup operations:
// this runs on every adapter). Workgroups are numbered over x and y (past the 65535 limit),
// input-row slices along z. No arrays in registers: a loop over one would put it in memory.
override R: u32 = 1u;
// With GEGLU (a MatMul whose two equal halves only a GeGlu reads, fuse.rs): output column j is
// gelu_tanh(row j . x) * (row j + n_count . x), both rows decoded against one load of x.
override GEGLU: bool = false;
const WG: u32 = 64u;
var<workgroup> red: array<f32, 512>;
var<workgroup> red_up: array<f32, 512>; // GEGLU: the up half's sums // [R <= 8][WG]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let tid = lid.x;
    let col = wid.x + wid.y * nwg.x;
    let r0 = wid.z * R;
    let groups = p.k / GROUP;
    let wrow = col * p.row_bytes;
    for (var r = 0u; r < R; r++) {
        var s = 0.0;
        var su = 0.0;
        let row = r0 + r;
        if (col < p.n_count && row < p.rows) {
            let xb = p.x + row * p.k;
            let wrow_u = (col + p.n_count) * p.row_bytes;
            // Two groups per trip, into two sums: more loads in flight.
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
        red[r * WG + tid] = s;
        if (GEGLU) {
            red_up[r * WG + tid] = su;
        }
    }
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            for (var r = 0u; r < R; r++) {
                red[r * WG + tid] += red[r * WG + tid + stride];
                if (GEGLU) {
                    red_up[r * WG + tid] += red_up[r * WG + tid + stride];
                }
            }
        }
        workgroupBarrier();
    }
    if (tid < R) {
        let row = r0 + tid;
        if (col < p.n_count && row < p.rows) {
            var v = red[tid * WG];
            if (GEGLU) {
                v = gelu_tanh(v) * red_up[tid * WG];
            }
            store(p.n_base + col, row, v);
        }
    }
}
