// The KHR cooperative-matrix prefill kernel for every weight format but q4_k (which keeps
// `matmul_khr`, double-buffered at 32 k a step): `matmul_khr` with k taken 64 at a time. The
// same 128 x 128 tile and eight subgroups of 32 (2 along the input rows by 4 along the weight
// rows, each 64 x 32 of the tile), but one shared buffer of 64 k (two would pass the 48 KB of
// shared memory NVIDIA's Vulkan driver offers), so f16 rows are read 128 contiguous bytes at a
// time (`matmul_khr` reads 64 bytes of a row a step, and its f16 products were bound by those
// loads: bench/results/2026-11-29-khr-f16-probe) and the 32-value block formats load on every
// invocation (half of `matmul_khr`'s sit idle in their loads). Its q4_k build reads the 32
// bytes of nibbles of a step's two sub-blocks once (TANDEM_VULKAN_COOPMAT_KERNEL=khr64).
//
// Pipeline: each invocation fetches a later step's input and weight into registers while the
// current step multiplies; a step is written into shared memory between two barriers (write,
// barrier, products, barrier). Measured and dropped (bench/results/2026-11-29-khr64): two
// register sets taken in turn, loads two steps ahead, on every format (4B f16 13,073 tok/s
// against 13,382 with one set, before the float loop below), four subgroups of 64 x 64 (8,251).
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require

#define WARPS 8
#define THREADS (32 * WARPS)
layout(local_size_x = THREADS) in;

#define BW 128
#define BX 128

#include "khr_params.glsl"

#define BK 64
// Row stride of the shared tiles in f16vec2s: 72 halves, 144 bytes (9 x 16: the eight rows of a
// fragment's load fall in distinct banks).
#define SK2 36
#define TILE (BX * SK2)
// uvec4s (8 halves) of the input tile per invocation, and of a float weight tile.
#define XV (BX * (BK / 8) / THREADS)
#define WV (BW * (BK / 8) / THREADS)

layout(buffer_reference, scalar, buffer_reference_align = 16) buffer U4s { uvec4 v[]; };

// After the loop the input tile holds each subgroup's 16x16 slot of results on their way out.
shared f16vec2 xs[TILE];
shared f16vec2 ws[TILE];

#define F16_MAX 65504.0

#if defined(WFMT_Q4_K)
// q4_k: PER_ROW invocations per weight row, each QN x 16 of the 32 bytes of nibbles that hold
// the step's two sub-blocks (low nibbles the first, high the second), and the block's head.
#define PER_ROW (THREADS / BW)
#define QN (2 / PER_ROW)
#elif UNIT != 1
// The 32-value block formats: NU units of a weight row per invocation.
#define NU (BW * (BK / 32) / THREADS)
#endif
struct Regs {
    uvec4 xh[XV];
#if defined(WFMT_Q4_K)
    uvec4 qhead;
    uvec4 qnib[QN];
#elif UNIT == 1
    uvec4 wh[WV];
#else
    float wu[NU][UNIT];
#endif
};

// Fetches step k0's input and weight into this invocation's registers.
Regs fetch(uint k0, uint ke, bool vec_x, bool vec_w) {
    Regs g;
    uint tid = gl_LocalInvocationID.x;
    uint m0 = gl_WorkGroupID.x * BX;
    uint n0 = gl_WorkGroupID.y * BW;
    // Input: 8 halves per invocation and trip, row e / 8, columns (e % 8) * 8 ...
    [[unroll]] for (uint i = 0; i < XV; i++) {
        uint e = tid + THREADS * i;
        uint c = k0 + (e % 8) * 8;
        uint r = m0 + e / 8;
        g.xh[i] = uvec4(0);
        if (r < p.rows) {
            uint64_t at = uint64_t(r) * p.k + c;
            if (vec_x) {
                if (c < ke) {
                    g.xh[i] = U4s(p.x + at * 2).v[0];
                }
            } else {
                [[unroll]] for (uint j = 0; j < 8; j++) {
                    if (c + j < ke) {
                        g.xh[i][j / 2] |= ld_u16(p.x, at + j) << (16 * (j % 2));
                    }
                }
            }
        }
    }
#if defined(WFMT_Q4_K)
    {
        uint r = tid / PER_ROW;
        uint half_ = tid % PER_ROW;
        uint pair = (k0 / 64) & 3u;
        g.qhead = uvec4(0);
        [[unroll]] for (uint i = 0; i < QN; i++) {
            g.qnib[i] = uvec4(0);
        }
        if (n0 + r < p.n) {
            uint64_t blk = p.w + uint64_t(n0 + r) * p.row_bytes + uint64_t(k0 / 256) * Q4_K_BYTES;
            g.qhead = U4s(blk).v[0];
            [[unroll]] for (uint i = 0; i < QN; i++) {
                g.qnib[i] = U4s(blk + Q4_K_QS + 32 * pair + 16 * (half_ * QN + i)).v[0];
            }
        }
    }
#elif UNIT == 1
    // Float weights: groups of 8 values, 8 invocations per weight row, packed as halves.
    [[unroll]] for (uint i = 0; i < WV; i++) {
        uint e = tid + THREADS * i;
        uint r = e / 8;
        uint c = k0 + (e % 8) * 8;
        g.wh[i] = uvec4(0);
        if (n0 + r < p.n) {
            uint64_t row = p.w + uint64_t(n0 + r) * p.row_bytes;
#if defined(WFMT_F16)
            if (vec_w) {
                if (c < ke) {
                    g.wh[i] = U4s(row + uint64_t(c) * 2).v[0];
                }
                continue;
            }
#endif
            vec4 lo = vec4(0.0);
            vec4 hi = vec4(0.0);
            [[unroll]] for (uint j = 0; j < 4; j++) {
                if (c + j < ke) {
                    lo[j] = wload(row, c + j);
                }
                if (c + 4 + j < ke) {
                    hi[j] = wload(row, c + 4 + j);
                }
            }
            f16vec4 l16 = f16vec4(clamp(lo, -F16_MAX, F16_MAX));
            f16vec4 h16 = f16vec4(clamp(hi, -F16_MAX, F16_MAX));
            g.wh[i] = uvec4(packFloat2x16(l16.xy), packFloat2x16(l16.zw), packFloat2x16(h16.xy),
                            packFloat2x16(h16.zw));
        }
    }
#else
    // Other block formats: NU 32-value units of one weight row per invocation (row tid % BW,
    // the step's units NU * (tid / BW) ..).
    [[unroll]] for (uint a = 0; a < NU; a++) {
        [[unroll]] for (uint i = 0; i < UNIT; i++) {
            g.wu[a][i] = 0.0;
        }
        uint r = tid % BW;
        uint u = NU * (tid / BW) + a;
        if (n0 + r < p.n && k0 + 32 * u < ke) {
            load_unit(p.w + uint64_t(n0 + r) * p.row_bytes, k0 / UNIT + u, g.wu[a]);
        }
    }
#endif
    return g;
}

// One step's tiles as this invocation writes them into shared memory: the input's 8-half groups
// and the weight's values decoded to halves (float formats: as fetched).
#if defined(WFMT_Q4_K)
// q4_k: per 16 bytes of nibbles, four uvec4s: (low nibbles' 4 halves, high nibbles' 4 halves).
#define SW (4 * QN)
#elif UNIT == 1
#define SW WV
#else
// 32 halves per unit, 4 uvec4s.
#define SW (4 * NU)
#endif
struct Staged {
    uvec4 xh[XV];
    uvec4 wh[SW];
};

// Decodes `g` (step k0) into halves.
Staged decode(Regs g, uint k0) {
    Staged st;
    st.xh = g.xh;
#if defined(WFMT_Q4_K)
    {
        uint s = (k0 / 32) & 7u;
        vec2 dm = unpackHalf2x16(g.qhead[Q4_K_D / 4]);
        uvec3 sc = uvec3(g.qhead.y, g.qhead.z, g.qhead.w);
        uint sc0, mn0, sc1, mn1;
        q4k_scale_min(sc, s, sc0, mn0);
        q4k_scale_min(sc, s + 1u, sc1, mn1);
        float d0 = dm.x * float(sc0);
        float m0 = dm.y * float(mn0);
        float d1 = dm.x * float(sc1);
        float m1 = dm.y * float(mn1);
        [[unroll]] for (uint jj = 0; jj < 4 * QN; jj++) {
            uint v = g.qnib[jj / 4][jj % 4];
            vec4 lo = vec4(float(v & 15u), float((v >> 8) & 15u), float((v >> 16) & 15u),
                           float((v >> 24) & 15u));
            vec4 hi = vec4(float((v >> 4) & 15u), float((v >> 12) & 15u), float((v >> 20) & 15u),
                           float(v >> 28));
            f16vec4 l16 = f16vec4(clamp(d0 * lo - m0, -F16_MAX, F16_MAX));
            f16vec4 h16 = f16vec4(clamp(d1 * hi - m1, -F16_MAX, F16_MAX));
            st.wh[jj] = uvec4(packFloat2x16(l16.xy), packFloat2x16(l16.zw), packFloat2x16(h16.xy),
                              packFloat2x16(h16.zw));
        }
    }
#elif UNIT == 1
    st.wh = g.wh;
#else
    [[unroll]] for (uint a = 0; a < NU; a++) {
        [[unroll]] for (uint i = 0; i < 4; i++) {
            vec4 f0 = vec4(g.wu[a][8 * i], g.wu[a][8 * i + 1], g.wu[a][8 * i + 2], g.wu[a][8 * i + 3]);
            vec4 f1 = vec4(g.wu[a][8 * i + 4], g.wu[a][8 * i + 5], g.wu[a][8 * i + 6], g.wu[a][8 * i + 7]);
            f16vec4 h0 = f16vec4(clamp(f0, -F16_MAX, F16_MAX));
            f16vec4 h1 = f16vec4(clamp(f1, -F16_MAX, F16_MAX));
            st.wh[4 * a + i] = uvec4(packFloat2x16(h0.xy), packFloat2x16(h0.zw), packFloat2x16(h1.xy),
                                     packFloat2x16(h1.zw));
        }
    }
#endif
    return st;
}

// Writes a decoded step into the shared tiles.
void put(Staged st) {
    uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint i = 0; i < XV; i++) {
        uint e = tid + THREADS * i;
        uint at = (e / 8) * SK2 + (e % 8) * 4;
        xs[at] = unpackFloat2x16(st.xh[i].x);
        xs[at + 1] = unpackFloat2x16(st.xh[i].y);
        xs[at + 2] = unpackFloat2x16(st.xh[i].z);
        xs[at + 3] = unpackFloat2x16(st.xh[i].w);
    }
#if defined(WFMT_Q4_K)
    {
        uint r = tid / PER_ROW;
        uint half_ = tid % PER_ROW;
        // Byte b of this invocation's bytes 16 h ..: value 16 h + b of sub-block s (low nibble)
        // and of sub-block s + 1 (high nibble), columns 16 h + b and 32 + 16 h + b.
        [[unroll]] for (uint jj = 0; jj < 4 * QN; jj++) {
            uint h = half_ * QN + jj / 4;
            uint at = r * SK2 + 8 * h + 2 * (jj % 4);
            ws[at] = unpackFloat2x16(st.wh[jj].x);
            ws[at + 1] = unpackFloat2x16(st.wh[jj].y);
            ws[at + 16] = unpackFloat2x16(st.wh[jj].z);
            ws[at + 17] = unpackFloat2x16(st.wh[jj].w);
        }
    }
#elif UNIT == 1
    [[unroll]] for (uint i = 0; i < WV; i++) {
        uint e = tid + THREADS * i;
        uint at = (e / 8) * SK2 + (e % 8) * 4;
        ws[at] = unpackFloat2x16(st.wh[i].x);
        ws[at + 1] = unpackFloat2x16(st.wh[i].y);
        ws[at + 2] = unpackFloat2x16(st.wh[i].z);
        ws[at + 3] = unpackFloat2x16(st.wh[i].w);
    }
#else
    [[unroll]] for (uint a = 0; a < NU; a++) {
        uint r = tid % BW;
        uint u = NU * (tid / BW) + a;
        [[unroll]] for (uint i = 0; i < 4; i++) {
            uint at = r * SK2 + 16 * u + 4 * i;
            ws[at] = unpackFloat2x16(st.wh[4 * a + i].x);
            ws[at + 1] = unpackFloat2x16(st.wh[4 * a + i].y);
            ws[at + 2] = unpackFloat2x16(st.wh[4 * a + i].z);
            ws[at + 3] = unpackFloat2x16(st.wh[4 * a + i].w);
        }
    }
#endif
}

#include "khr_store.glsl"

void main() {
    uint sg = gl_SubgroupID;
    uint wx = (sg & 1u) * (BX / 2);
    uint ww = (sg >> 1) * (BW / (WARPS / 2));
    uint kb = p.kslice * gl_WorkGroupID.z;
    uint ke = p.kslice == 0u ? p.k : min(p.k, kb + p.kslice);
    bool vec_x = (p.k & 7u) == 0u && (p.x & 15ul) == 0ul;
    bool vec_w = (p.k & 7u) == 0u && (p.row_bytes & 15u) == 0u && (p.w & 15ul) == 0ul;

    // Accumulator (i, j): input rows wx + 16i.., weight rows ww + 16j.. (i < 4, j < 2).
#define ACC_T coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define DECL_ROW(i) ACC_T acc##i##0 = ACC_T(0.0); ACC_T acc##i##1 = ACC_T(0.0);
    DECL_ROW(0)
    DECL_ROW(1)
    DECL_ROW(2)
    DECL_ROW(3)

#define A_T coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define B_T coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MMA_COL(j) \
        coopMatLoad(b, ws, (ww + j * 16) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutColumnMajor); \
        acc0##j = coopMatMulAdd(a0, b, acc0##j); \
        acc1##j = coopMatMulAdd(a1, b, acc1##j); \
        acc2##j = coopMatMulAdd(a2, b, acc2##j); \
        acc3##j = coopMatMulAdd(a3, b, acc3##j);
    // (B[k][n] = W[n][k]: the weight tile is B in column-major order.)
#define PRODUCTS() { \
        [[unroll]] for (uint kk = 0; kk < BK / 2; kk += 8) { \
            A_T a0; \
            A_T a1; \
            A_T a2; \
            A_T a3; \
            B_T b; \
            coopMatLoad(a0, xs, (wx + 0) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutRowMajor); \
            coopMatLoad(a1, xs, (wx + 16) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutRowMajor); \
            coopMatLoad(a2, xs, (wx + 32) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutRowMajor); \
            coopMatLoad(a3, xs, (wx + 48) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutRowMajor); \
            MMA_COL(0) \
            MMA_COL(1) \
        } }

#if UNIT == 1
    // Float weights: loads two steps ahead, the next step taken into its registers for shared
    // memory as soon as a subgroup's products end, written between the barriers (H200, 4B f16,
    // prefill 512: 30.2 ms of products a step against 31.3 with the block formats' loop).
    Regs g = fetch(kb, ke, vec_x, vec_w);
    Staged st = decode(g, kb);
    if (kb + BK < ke) {
        g = fetch(kb + BK, ke, vec_x, vec_w);
    }
    for (uint k0 = kb; k0 < ke; k0 += BK) {
        put(st);
        barrier();
        PRODUCTS()
        if (k0 + BK < ke) {
            st = decode(g, k0 + BK);
            if (k0 + 2 * BK < ke) {
                g = fetch(k0 + 2 * BK, ke, vec_x, vec_w);
            }
        }
        barrier();
    }
#else
    // Block formats: loads one step ahead, decoded between the barriers (1B's q5_0 products
    // 7.0 ms a step against 7.5 with the float formats' loop; 4B q4_k 32.9 against 33.3).
    Regs g = fetch(kb, ke, vec_x, vec_w);
    for (uint k0 = kb; k0 < ke; k0 += BK) {
        put(decode(g, k0));
        if (k0 + BK < ke) {
            g = fetch(k0 + BK, ke, vec_x, vec_w);
        }
        barrier();
        PRODUCTS()
        barrier();
    }
#endif

    uint64_t slice = p.part + uint64_t(gl_WorkGroupID.z) * p.rows * p.n * 4u;
#define STORE_ROW(i) store(acc##i##0, i, 0, slice); store(acc##i##1, i, 1, slice);
    STORE_ROW(0)
    STORE_ROW(1)
    STORE_ROW(2)
    STORE_ROW(3)
}
