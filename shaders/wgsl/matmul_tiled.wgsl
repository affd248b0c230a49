// Op::MatMul for many input rows (prefill): a 64 (input rows) x 64 (weight rows) output tile per
// workgroup of 256 invocations, each computing 4 x 4 outputs held in four vec4 registers; per
// 32-wide slice of k the input tile and the dequantised weight tile (groups of 4 neighbouring
// values, two per invocation) are staged in workgroup memory, so each weight is decoded once
// per 64 input rows.
const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 32u;
var<workgroup> xs: array<f32, 2080>; // [BK][BM + 1]
var<workgroup> ws: array<f32, 2080>; // [BK][BN + 1]

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>) {
    let tid = lid.x;
    let tx = tid % 16u;
    let ty = tid / 16u;
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    let per_row = BK / GROUP;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        for (var e = tid; e < BM * BK; e += 256u) {
            let r = e / BK;
            let c = e % BK;
            var v = 0.0;
            if (m0 + r < p.rows && k0 + c < p.k) {
                v = act[p.x + (m0 + r) * p.k + k0 + c];
            }
            xs[c * (BM + 1u) + r] = v;
        }
        // The weight tile: BN rows x BK values, a group (1 or 4 values, never crossing a
        // 32-aligned slice of k) at a time.
        for (var e = tid; e < BN * per_row; e += 256u) {
            let r = e / per_row;
            let c = (e % per_row) * GROUP;
            var w = vec4<f32>(0.0);
            if (n0 + r < p.n_count && k0 + c < p.k) {
                w = load_group((n0 + r) * p.row_bytes, (k0 + c) / GROUP);
            }
            ws[c * (BN + 1u) + r] = w.x;
            if (GROUP == 4u) {
                ws[(c + 1u) * (BN + 1u) + r] = w.y;
                ws[(c + 2u) * (BN + 1u) + r] = w.z;
                ws[(c + 3u) * (BN + 1u) + r] = w.w;
            }
        }
        workgroupBarrier();
        for (var c = 0u; c < BK; c++) {
            let xo = c * (BM + 1u) + ty;
            let wo = c * (BN + 1u) + tx;
            let a = vec4<f32>(xs[xo], xs[xo + 16u], xs[xo + 32u], xs[xo + 48u]);
            let b = vec4<f32>(ws[wo], ws[wo + 16u], ws[wo + 32u], ws[wo + 48u]);
            acc0 += a.x * b;
            acc1 += a.y * b;
            acc2 += a.z * b;
            acc3 += a.w * b;
        }
        workgroupBarrier();
    }
    let rows = vec4<u32>(m0 + ty, m0 + ty + 16u, m0 + ty + 32u, m0 + ty + 48u);
    let accs = array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
    for (var i = 0u; i < 4u; i++) {
        let acc = accs[i];
        let row = rows[i];
        for (var j = 0u; j < 4u; j++) {
            let col = n0 + tx + 16u * j;
            if (row < p.rows && col < p.n_count) {
                store(p.n_base + col, row, acc[j]);
            }
        }
    }
}
