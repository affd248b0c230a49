// The output stores of the KHR prefill kernels (`matmul_khr`, `matmul_khr64`), included by
// them after their shared tiles: BX x BW tiles of WARPS subgroups, 2 along the input rows.
// Accumulator (i, j) of this subgroup into the outputs (or the split-k partial `slice`),
// through the subgroup's 16x16 slot of shared memory: 256 f32 values at the start of the
// input tile `xs` (free once the loop's last barrier has passed), one f16vec2 per value's bits.
void store(coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc, uint i, uint j, uint64_t slice) {
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint m0 = gl_WorkGroupID.x * BX;
    uint n0 = gl_WorkGroupID.y * BW;
    uint wx = (sg & 1u) * (BX / 2);
    uint ww = (sg >> 1) * (BW / (WARPS / 2));
    coopMatStore(acc, xs, sg * 256, 16, gl_CooperativeMatrixLayoutRowMajor);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    [[unroll]] for (uint t = 0; t < 8; t++) {
        uint e = lane + 32 * t;
        uint row = m0 + wx + i * 16 + e / 16;
        uint col = n0 + ww + j * 16 + e % 16;
        if (row >= p.rows || col >= p.n) {
            continue;
        }
        float v = uintBitsToFloat(packFloat2x16(xs[sg * 256 + e]));
        if (p.kslice != 0u) {
            st_f32(slice, uint64_t(row) * p.n + col, v);
            continue;
        }
        uint64_t dst;
        uint c;
        uint width;
        if (col < p.end0) {
            dst = p.dst0; c = col; width = p.end0;
        } else if (col < p.end1) {
            dst = p.dst1; c = col - p.end0; width = p.end1 - p.end0;
        } else if (col < p.end2) {
            dst = p.dst2; c = col - p.end1; width = p.end2 - p.end1;
        } else {
            dst = p.dst3; c = col - p.end2; width = p.n - p.end2;
        }
        st_f32(dst, uint64_t(row) * width + c, v);
    }
    subgroupBarrier();
}
