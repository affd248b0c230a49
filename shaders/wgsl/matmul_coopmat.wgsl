// Op::MatMul for many rows (prefill) on cooperative matrices (wgpu's experimental
// EXPERIMENTAL_COOPERATIVE_MATRIX, VK_KHR_cooperative_matrix underneath: tensor cores on NVIDIA).
// A workgroup of 8 subgroups of 32 invocations computes a 64 (input rows) x 128 (weight rows)
// output tile, each subgroup 32 x 32 of it as 2 x 2 16x16 f32 accumulators. Per 64-wide slice of
// k the input tile (f32 -> f16) and the weight tile (dequantised by the format's load_group, then
// rounded to f16) are staged in workgroup memory, then multiplied as
// coop_mat16x16<f16> x coop_mat16x16<f16> -> coop_mat16x16<f32>. The results go through a
// 16x16 f32 slot per subgroup in workgroup memory to the split outputs and row bounds
// (parts/coop_out.wgsl).
// The host takes this kernel only where the adapter lists the 16x16x16 f16 x f16 -> f32
// configuration and its subgroups are exactly 32 wide (8 subgroups fill the workgroup).
const BM: u32 = 64u;
const BN: u32 = 128u;
const BK: u32 = 64u;
// Row stride of the staged tiles in halves: BK + 8 (144 bytes, a multiple of 16, off the banks).
const SK: u32 = 72u;
const WG: u32 = 256u;
// f16's largest finite value: values beyond it are clamped rather than made infinite.
const F16_MAX: f32 = 65504.0;

var<workgroup> xs: array<f16, 4608>; // [BM][SK]: input row r, k column c at r * SK + c
var<workgroup> ws: array<f16, 9216>; // [BN][SK]: weight row r, k column c at r * SK + c

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32,
        @builtin(subgroup_size) sg_size: u32) {
    let tid = lid.x;
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    // This subgroup's 32 x 32 block of the tile: input rows wm.., weight rows wn...
    let wm = (sg & 1u) * 32u;
    let wn = (sg >> 1u) * 32u;
    var acc00 = coop_mat16x16<f32, C>();
    var acc01 = coop_mat16x16<f32, C>();
    var acc10 = coop_mat16x16<f32, C>();
    var acc11 = coop_mat16x16<f32, C>();
    let per_row = BK / GROUP;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // The input tile, BM x BK, zero past the rows and k (neighbouring invocations read
        // neighbouring values of a row).
        for (var e = tid; e < BM * BK; e += WG) {
            let r = e / BK;
            let c = e % BK;
            var v = 0.0;
            if (m0 + r < p.rows && k0 + c < p.k) {
                v = act[p.x + (m0 + r) * p.k + k0 + c];
            }
            xs[r * SK + c] = f16(clamp(v, -F16_MAX, F16_MAX));
        }
        // The weight tile, BN rows x BK values, a group (1 or 4 values) at a time.
        for (var e = tid; e < BN * per_row; e += WG) {
            let r = e / per_row;
            let c = (e % per_row) * GROUP;
            var w = vec4<f32>(0.0);
            if (n0 + r < p.n_count && k0 + c < p.k) {
                w = load_group((n0 + r) * p.row_bytes, (k0 + c) / GROUP);
            }
            let h = vec4<f16>(clamp(w, vec4<f32>(-F16_MAX), vec4<f32>(F16_MAX)));
            let at = r * SK + c;
            ws[at] = h.x;
            if (GROUP == 4u) {
                ws[at + 1u] = h.y;
                ws[at + 2u] = h.z;
                ws[at + 3u] = h.w;
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            // A: input rows x k, row-major. B[k][n] = W[n][k]: the weight tile is B in
            // column-major order.
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xs[wm * SK + kk], SK);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xs[(wm + 16u) * SK + kk], SK);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&ws[wn * SK + kk], SK);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&ws[(wn + 16u) * SK + kk], SK);
            acc00 = coopMultiplyAdd(a0, b0, acc00);
            acc01 = coopMultiplyAdd(a0, b1, acc01);
            acc10 = coopMultiplyAdd(a1, b0, acc10);
            acc11 = coopMultiplyAdd(a1, b1, acc11);
        }
        workgroupBarrier();
    }
    // Each accumulator through this subgroup's slot (all subgroups in step: the barriers are
    // the workgroup's).
    let slot = sg * 256u;
    for (var t = 0u; t < 4u; t++) {
        let i = t >> 1u;
        let j = t & 1u;
        switch t {
            case 0u: {
                coopStoreT(acc00, &cs[slot], 16u);
            }
            case 1u: {
                coopStoreT(acc01, &cs[slot], 16u);
            }
            case 2u: {
                coopStoreT(acc10, &cs[slot], 16u);
            }
            default: {
                coopStoreT(acc11, &cs[slot], 16u);
            }
        }
        workgroupBarrier();
        write_slot(slot, m0 + wm + i * 16u, n0 + wn + j * 16u, lane, sg_size);
        workgroupBarrier();
    }
}
