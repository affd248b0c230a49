// Op::MatMul for many rows (prefill) on cooperative matrices, from f16 rows staged once per step
// (stage_half.wgsl for the input; dequant_half.wgsl for the weights, or the f16 weights
// themselves where their rows need no padding): no workgroup staging, so the loop is nothing
// but cooperative loads and multiply-adds. A workgroup of SGM x SGN subgroups of 32 invocations
// (WGS = 32 * SGM * SGN) computes a 16 FM SGM (input rows) x 64 SGN (weight rows) output tile,
// each subgroup 16 FM x 64 of it as FM x 4 16x16 f32 accumulators (FM = 2 or 4), over k in
// steps of 16. Workgroups along x take the input rows' tiles, so those sharing a slab of weight
// rows run together. WSRC is the weights' array: `hs` (staged) or `wh` (the f16 weights,
// binding 3); the module assembler names it. The results go through a 16x16 f32 slot per
// subgroup in workgroup memory to the split outputs and row bounds (parts/coop_out.wgsl).
override SGM: u32 = 2u;
override SGN: u32 = 2u;
override WGS: u32 = 128u;
override FM: u32 = 2u;

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32,
        @builtin(subgroup_size) sg_size: u32) {
    let m0 = wid.x * 16u * FM * SGM;
    let n0 = wid.y * 64u * SGN;
    // This subgroup's 16 FM x 64 block of the tile: input rows wm.., weight rows wn...
    let wm = (sg % SGM) * 16u * FM;
    let wn = (sg / SGM) * 64u;
    let kp = p.kp;
    let a_at = p.h_a + (m0 + wm) * kp;
    let b_at = p.h_b + (n0 + wn) * kp;
    let s16 = 16u * kp;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
    var c20 = coop_mat16x16<f32, C>();
    var c21 = coop_mat16x16<f32, C>();
    var c22 = coop_mat16x16<f32, C>();
    var c23 = coop_mat16x16<f32, C>();
    var c30 = coop_mat16x16<f32, C>();
    var c31 = coop_mat16x16<f32, C>();
    var c32 = coop_mat16x16<f32, C>();
    var c33 = coop_mat16x16<f32, C>();
    for (var kk = 0u; kk < kp; kk += 16u) {
        // A: input rows x k, row-major. B[k][n] = W[n][k]: weight rows are B's columns.
        let a0 = coopLoadT<coop_mat16x16<f16, A>>(&hs[a_at + kk], kp);
        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&hs[a_at + s16 + kk], kp);
        let b0 = coopLoad<coop_mat16x16<f16, B>>(&WSRC[b_at + kk], kp);
        let b1 = coopLoad<coop_mat16x16<f16, B>>(&WSRC[b_at + 1u * s16 + kk], kp);
        let b2 = coopLoad<coop_mat16x16<f16, B>>(&WSRC[b_at + 2u * s16 + kk], kp);
        let b3 = coopLoad<coop_mat16x16<f16, B>>(&WSRC[b_at + 3u * s16 + kk], kp);
        c00 = coopMultiplyAdd(a0, b0, c00);
        c01 = coopMultiplyAdd(a0, b1, c01);
        c02 = coopMultiplyAdd(a0, b2, c02);
        c03 = coopMultiplyAdd(a0, b3, c03);
        c10 = coopMultiplyAdd(a1, b0, c10);
        c11 = coopMultiplyAdd(a1, b1, c11);
        c12 = coopMultiplyAdd(a1, b2, c12);
        c13 = coopMultiplyAdd(a1, b3, c13);
        if (FM == 4u) {
            let a2 = coopLoadT<coop_mat16x16<f16, A>>(&hs[a_at + 2u * s16 + kk], kp);
            let a3 = coopLoadT<coop_mat16x16<f16, A>>(&hs[a_at + 3u * s16 + kk], kp);
            c20 = coopMultiplyAdd(a2, b0, c20);
            c21 = coopMultiplyAdd(a2, b1, c21);
            c22 = coopMultiplyAdd(a2, b2, c22);
            c23 = coopMultiplyAdd(a2, b3, c23);
            c30 = coopMultiplyAdd(a3, b0, c30);
            c31 = coopMultiplyAdd(a3, b1, c31);
            c32 = coopMultiplyAdd(a3, b2, c32);
            c33 = coopMultiplyAdd(a3, b3, c33);
        }
    }
    // Each accumulator through this subgroup's slot (all subgroups in step: the barriers are
    // the workgroup's).
    let slot = sg * 256u;
    for (var t = 0u; t < FM * 4u; t++) {
        switch t {
            case 0u: {
                coopStoreT(c00, &cs[slot], 16u);
            }
            case 1u: {
                coopStoreT(c01, &cs[slot], 16u);
            }
            case 2u: {
                coopStoreT(c02, &cs[slot], 16u);
            }
            case 3u: {
                coopStoreT(c03, &cs[slot], 16u);
            }
            case 4u: {
                coopStoreT(c10, &cs[slot], 16u);
            }
            case 5u: {
                coopStoreT(c11, &cs[slot], 16u);
            }
            case 6u: {
                coopStoreT(c12, &cs[slot], 16u);
            }
            case 7u: {
                coopStoreT(c13, &cs[slot], 16u);
            }
            case 8u: {
                coopStoreT(c20, &cs[slot], 16u);
            }
            case 9u: {
                coopStoreT(c21, &cs[slot], 16u);
            }
            case 10u: {
                coopStoreT(c22, &cs[slot], 16u);
            }
            case 11u: {
                coopStoreT(c23, &cs[slot], 16u);
            }
            case 12u: {
                coopStoreT(c30, &cs[slot], 16u);
            }
            case 13u: {
                coopStoreT(c31, &cs[slot], 16u);
            }
            case 14u: {
                coopStoreT(c32, &cs[slot], 16u);
            }
            default: {
                coopStoreT(c33, &cs[slot], 16u);
            }
        }
        workgroupBarrier();
        let i = t >> 2u;
        let j = t & 3u;
        write_slot(slot, m0 + wm + i * 16u, n0 + wn + j * 16u, lane, sg_size);
        workgroupBarrier();
    }
}
