// Op::MatMul for many rows (prefill) on cooperative matrices (tensor cores): a 64 (input rows) x
// 128 (weight rows) output tile per workgroup of 8 subgroups of 32 invocations, each subgroup
// computing 32 x 32 outputs as 2 x 2 16x16 f32 accumulators. Per 64-wide slice of k the input
// tile is converted f32 -> f16 and the weight tile dequantised to f16 into shared memory (block
// formats: each of the 256 invocations decodes one 32-value unit of one weight row), then
// multiplied with
// coopmat<float16_t, 16x16x16> -> f32. Results go through a per-subgroup 16x16 f32 slot in shared
// memory to the split outputs. Needs a subgroup size of 32 (the host checks it).
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform Params {
    uint64_t w;
    uint64_t x;
    uint64_t dst0;
    uint64_t dst1;
    uint64_t dst2;
    uint64_t dst3;
    uint k;
    uint n;
    uint rows;
    uint row_bytes;
    uint end0;
    uint end1;
    uint end2;
} p;

#define BM 64
#define BN 128
#define BK 64
// Row stride of the shared tiles in halves: BK + 8 (144 bytes, a multiple of 16, off the banks).
#define SK 72

layout(buffer_reference, scalar, buffer_reference_align = 8) buffer U2s { uvec2 v[]; };

shared float16_t xs[BM * SK];
shared float16_t ws[BN * SK];
shared float cs[8 * 256];

// f16's largest finite value: inputs beyond it are clamped rather than turned into infinities.
#define F16_MAX 65504.0

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint n0 = gl_WorkGroupID.x * BN;
    uint m0 = gl_WorkGroupID.y * BM;
    uint wm = (sg & 1u) * 32u;
    uint wn = (sg >> 1) * 32u;
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc[2][2];
    for (uint i = 0; i < 2; i++) {
        for (uint j = 0; j < 2; j++) {
            acc[i][j] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
        }
    }
    bool vec_x = (p.k & 3u) == 0u && (p.x & 15ul) == 0ul;
    bool vec_w = (p.k & 3u) == 0u && (p.row_bytes & 7u) == 0u && (p.w & 7ul) == 0ul;
    for (uint k0 = 0; k0 < p.k; k0 += BK) {
        // Input tile: BM x BK floats, zero past the edges; 16-byte loads (2 per invocation)
        // where k is a multiple of 4 and x 16-byte aligned, else 8 scalar loads.
        if (vec_x) {
            for (uint e = tid; e < BM * BK / 4; e += 256) {
                uint r = e / (BK / 4);
                uint c = (e % (BK / 4)) * 4;
                vec4 v = vec4(0.0);
                if (m0 + r < p.rows && k0 + c < p.k) {
                    v = clamp(V4s(p.x + (uint64_t(m0 + r) * p.k + k0 + c) * 4).v[0], -F16_MAX, F16_MAX);
                }
                for (uint i = 0; i < 4; i++) {
                    xs[r * SK + c + i] = float16_t(v[i]);
                }
            }
        } else {
            for (uint e = tid; e < BM * BK; e += 256) {
                uint r = e / BK;
                uint c = e % BK;
                float v = 0.0;
                if (m0 + r < p.rows && k0 + c < p.k) {
                    v = clamp(ld_f32(p.x, uint64_t(m0 + r) * p.k + k0 + c), -F16_MAX, F16_MAX);
                }
                xs[r * SK + c] = float16_t(v);
            }
        }
#if defined(WFMT_F16)
        if (vec_w) {
            // 4 halves (8 bytes) per load, 4 per invocation, copied without conversion.
            for (uint e = tid; e < BN * BK / 4; e += 256) {
                uint r = e / (BK / 4);
                uint c = (e % (BK / 4)) * 4;
                uvec2 v = uvec2(0);
                if (n0 + r < p.n && k0 + c < p.k) {
                    v = U2s(p.w + uint64_t(n0 + r) * p.row_bytes + uint64_t(k0 + c) * 2).v[0];
                }
                f16vec2 lo = unpackFloat2x16(v.x);
                f16vec2 hi = unpackFloat2x16(v.y);
                ws[r * SK + c] = lo.x;
                ws[r * SK + c + 1] = lo.y;
                ws[r * SK + c + 2] = hi.x;
                ws[r * SK + c + 3] = hi.y;
            }
        } else
#endif
#if UNIT == 1
        for (uint e = tid; e < BN * BK; e += 256) {
            uint r = e / BK;
            uint c = e % BK;
            float v = 0.0;
            if (n0 + r < p.n && k0 + c < p.k) {
                v = wload(p.w + uint64_t(n0 + r) * p.row_bytes, k0 + c);
            }
            ws[r * SK + c] = float16_t(clamp(v, -F16_MAX, F16_MAX));
        }
#else
        {
            // BN rows x BK / UNIT units: every invocation decodes one unit (BK = 2 UNIT).
            uint r = tid % BN;
            uint u = tid / BN;
            float wv[UNIT];
            if (n0 + r < p.n && k0 + u * UNIT < p.k) {
                load_unit(p.w + uint64_t(n0 + r) * p.row_bytes, k0 / UNIT + u, wv);
            } else {
                for (uint i = 0; i < UNIT; i++) {
                    wv[i] = 0.0;
                }
            }
            for (uint i = 0; i < UNIT; i++) {
                ws[r * SK + u * UNIT + i] = float16_t(clamp(wv[i], -F16_MAX, F16_MAX));
            }
        }
#endif
        barrier();
        for (uint kk = 0; kk < BK; kk += 16) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[2];
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b[2];
            for (uint i = 0; i < 2; i++) {
                coopMatLoad(a[i], xs, (wm + i * 16) * SK + kk, SK, gl_CooperativeMatrixLayoutRowMajor);
            }
            // B[k][n] = W[n][k]: the weight tile is B in column-major order.
            for (uint j = 0; j < 2; j++) {
                coopMatLoad(b[j], ws, (wn + j * 16) * SK + kk, SK, gl_CooperativeMatrixLayoutColumnMajor);
            }
            for (uint i = 0; i < 2; i++) {
                for (uint j = 0; j < 2; j++) {
                    acc[i][j] = coopMatMulAdd(a[i], b[j], acc[i][j]);
                }
            }
        }
        barrier();
    }
    for (uint i = 0; i < 2; i++) {
        for (uint j = 0; j < 2; j++) {
            coopMatStore(acc[i][j], cs, sg * 256, 16, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (uint t = 0; t < 8; t++) {
                uint e = lane + 32 * t;
                uint row = m0 + wm + i * 16 + e / 16;
                uint col = n0 + wn + j * 16 + e % 16;
                if (row >= p.rows || col >= p.n) {
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
                st_f32(dst, uint64_t(row) * width + c, cs[sg * 256 + e]);
            }
            subgroupBarrier();
        }
    }
}
