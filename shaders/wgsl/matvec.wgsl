// Op::MatMul for few input rows (decode): y = x @ W^T. One workgroup of 64 invocations per NC
// consecutive weight rows and R input rows: invocation i decodes units i, i + 64, ... of each of
// its weight rows once and applies them to all R input rows; the 64 partial sums of each output
// meet in a tree in workgroup memory (no subgroup operations: this runs on every adapter).
// Workgroups are numbered over x and y (past the 65535 limit), input-row slices along z.
override R: u32 = 1u;
override NC: u32 = 2u;
const WG: u32 = 64u;
const MAX_OUT: u32 = 32u;
var<workgroup> red: array<f32, 2048>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let tid = lid.x;
    let c0 = (wid.x + wid.y * nwg.x) * NC;
    let r0 = wid.z * R;
    var acc: array<f32, 32>;
    for (var o = 0u; o < MAX_OUT; o++) {
        acc[o] = 0.0;
    }
    let units = p.k / UNIT;
    for (var u = tid; u < units; u += WG) {
        for (var c = 0u; c < NC; c++) {
            let col = c0 + c;
            if (col < p.n_count) {
                load_unit(col * p.row_bytes, u);
                for (var r = 0u; r < R; r++) {
                    let row = r0 + r;
                    if (row < p.rows) {
                        let xb = p.x + row * p.k + u * UNIT;
                        var s = 0.0;
                        for (var e = 0u; e < UNIT; e++) {
                            s += wu[e] * act[xb + e];
                        }
                        acc[c * R + r] += s;
                    }
                }
            }
        }
    }
    let outs = NC * R;
    for (var o = 0u; o < outs; o++) {
        red[o * WG + tid] = acc[o];
    }
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            for (var o = 0u; o < outs; o++) {
                red[o * WG + tid] += red[o * WG + tid + stride];
            }
        }
        workgroupBarrier();
    }
    if (tid < outs) {
        let c = tid / R;
        let r = tid % R;
        let col = c0 + c;
        let row = r0 + r;
        if (col < p.n_count && row < p.rows) {
            store(p.n_base + col, row, red[tid * WG]);
        }
    }
}
