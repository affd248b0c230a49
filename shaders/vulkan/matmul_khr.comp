// The KHR cooperative-matrix prefill kernel (products of at least 128 rows on the KHR path; see
// `matmul_coopmat` for the tuning kernel it came from and the smaller products): a compile-time
// 128 x 128 tile, no specialisation-constant branches (a module that merely held two more of
// them prefilled at half the rate: bench/results/2026-11-28-prefill-khr), and the accumulators
// and fragments as separate variables rather than arrays indexed in loops (which drivers may
// keep in memory rather than registers).
//
// Pipeline: k is taken 32 at a time. Each invocation first fetches its share of the step after
// next's f16 input (the host's `to_f16`) and weight (q4_k: raw blocks, two invocations per weight
// row; the host takes this kernel only where the weight is 16-byte aligned; float formats: 8
// values at a time; other block formats: one 32-value unit) into one of two sets of registers,
// multiplies the current step from shared memory while those loads are in flight, then decodes
// the next step, fetched one step earlier into the other set, into the other of two shared
// buffers: one barrier per step. H200, 4B q4_k prefill 512: 8,952 tok/s single-buffered (loads
// waited on before each step), 11,430 with loads one step ahead, and, one step ahead against
// two in one call (bench/results/2026-11-28-khr-ahead): 12,221 -> 13,381 (4B q4_k), 9,150 ->
// 9,528 (4B f16), 1,829 -> 2,164 (27B q4_k), 1B q4_k unchanged. Split k and
// the partials as `matmul_coopmat`'s. Eight subgroups of 32 per workgroup, 2 along the input
// rows by 4 along the weight rows, each 64 x 32 of the tile (eight 16x16 f32 accumulators; 4
// subgroups of 64 x 64 were slower: 9,171). The specialisation constants are ignored (the host
// passes 128 x 128).
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

#define BK 32
// Row stride of the shared tiles in f16vec2s: 40 halves, 80 bytes.
#define SK2 20
// One buffer of a shared tile, in f16vec2s.
#define TILE (BX * SK2)
// uvec4s (8 halves) of the input tile per invocation.
const uint XV = (BX * (BK / 8) + THREADS - 1) / THREADS;

layout(buffer_reference, scalar, buffer_reference_align = 16) buffer U4s { uvec4 v[]; };

// Two buffers each: the step being multiplied and the next. After the loop the first input
// buffer holds each subgroup's 16x16 slot of results on their way out.
shared f16vec2 xs[2 * TILE];
shared f16vec2 ws[2 * TILE];

#define F16_MAX 65504.0

// One step's loads, per invocation, on their way from global to shared memory.
#if defined(WFMT_Q4_K)
// q4_k: THREADS / BW invocations per weight row, each 32 / (THREADS / BW) values of it: the
// row's 16 bytes of d, dmin and scales and its 16 or 32 bytes of nibbles.
#define PER_ROW (THREADS / BW)
#define QV (2 / PER_ROW)
#elif UNIT == 1
const uint WG8 = BW * (BK / 8) / THREADS;
#endif
struct Regs {
    uvec4 xh[XV];
#if defined(WFMT_Q4_K)
    uvec4 qhead;
    uvec4 qnib[QV];
#elif UNIT == 1
    f16vec4 wv[2 * WG8];
#else
    float wu[UNIT];
#endif
};

// Fetches step k0's input and weight into this invocation's registers.
Regs fetch(uint k0, uint ke, bool vec_x, bool vec_w) {
    Regs g;
    uint tid = gl_LocalInvocationID.x;
    uint m0 = gl_WorkGroupID.x * BX;
    uint n0 = gl_WorkGroupID.y * BW;
    // Input: 8 halves per invocation and trip, row e / 4, columns (e % 4) * 8 ...
    [[unroll]] for (uint i = 0; i < XV; i++) {
        uint e = tid + THREADS * i;
        uint c = k0 + (e % 4) * 8;
        uint r = m0 + e / 4;
        g.xh[i] = uvec4(0);
        if (e < BX * (BK / 8) && r < p.rows) {
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
        uint s = (k0 / 32) & 7u;
        g.qhead = uvec4(0);
        [[unroll]] for (uint i = 0; i < QV; i++) {
            g.qnib[i] = uvec4(0);
        }
        if (n0 + r < p.n) {
            uint64_t blk = p.w + uint64_t(n0 + r) * p.row_bytes + uint64_t(k0 / 256) * Q4_K_BYTES;
            g.qhead = U4s(blk).v[0];
            [[unroll]] for (uint i = 0; i < QV; i++) {
                g.qnib[i] = U4s(blk + Q4_K_QS + 32 * (s >> 1) + 16 * (half_ * QV + i)).v[0];
            }
        }
    }
#elif UNIT == 1
    // Float weights: groups of 8 values, 4 invocations per weight row.
    [[unroll]] for (uint i = 0; i < WG8; i++) {
        uint e = tid + THREADS * i;
        uint r = e / 4;
        uint c = k0 + (e % 4) * 8;
        vec4 lo = vec4(0.0);
        vec4 hi = vec4(0.0);
        g.wv[2 * i] = f16vec4(0.0);
        g.wv[2 * i + 1] = f16vec4(0.0);
        if (n0 + r < p.n) {
            uint64_t row = p.w + uint64_t(n0 + r) * p.row_bytes;
#if defined(WFMT_F16)
            if (vec_w && c < ke) {
#if defined(PROBE_NO_WLOAD)
                // The probe build (matmul_khrp_f16): no weight loads, constant weights.
                uvec4 h = uvec4(0x3C003C00u + (c & 1u));
#else
                uvec4 h = U4s(row + uint64_t(c) * 2).v[0];
#endif
                g.wv[2 * i] = f16vec4(unpackFloat2x16(h.x), unpackFloat2x16(h.y));
                g.wv[2 * i + 1] = f16vec4(unpackFloat2x16(h.z), unpackFloat2x16(h.w));
                continue;
            }
#endif
            [[unroll]] for (uint j = 0; j < 4; j++) {
                if (c + j < ke) {
                    lo[j] = wload(row, c + j);
                }
                if (c + 4 + j < ke) {
                    hi[j] = wload(row, c + 4 + j);
                }
            }
            g.wv[2 * i] = f16vec4(clamp(lo, -F16_MAX, F16_MAX));
            g.wv[2 * i + 1] = f16vec4(clamp(hi, -F16_MAX, F16_MAX));
        }
    }
#else
    // Other block formats: one 32-value unit of one weight row per invocation.
    [[unroll]] for (uint i = 0; i < UNIT; i++) {
        g.wu[i] = 0.0;
    }
    if (tid < BW && n0 + tid < p.n) {
        load_unit(p.w + uint64_t(n0 + tid) * p.row_bytes, k0 / UNIT, g.wu);
    }
#endif
    return g;
}

// Decodes step k0, fetched into `g`, into shared buffer `buf`.
void stage(Regs g, uint k0, uint buf) {
    uint tid = gl_LocalInvocationID.x;
    uint xb = buf * TILE;
    [[unroll]] for (uint i = 0; i < XV; i++) {
        uint e = tid + THREADS * i;
        if (e >= BX * (BK / 8)) {
            break;
        }
        uint at = xb + (e / 4) * SK2 + (e % 4) * 4;
        xs[at] = unpackFloat2x16(g.xh[i].x);
        xs[at + 1] = unpackFloat2x16(g.xh[i].y);
        xs[at + 2] = unpackFloat2x16(g.xh[i].z);
        xs[at + 3] = unpackFloat2x16(g.xh[i].w);
    }
#if defined(WFMT_Q4_K)
    {
        uint r = tid / PER_ROW;
        uint half_ = tid % PER_ROW;
        uint s = (k0 / 32) & 7u;
        vec2 dm = unpackHalf2x16(g.qhead[Q4_K_D / 4]);
        uint scale;
        uint mn;
        q4k_scale_min(uvec3(g.qhead.y, g.qhead.z, g.qhead.w), s, scale, mn);
        float d1 = dm.x * float(scale);
        float m1 = dm.y * float(mn);
        uint shift = (s & 1u) * 4;
        // In f16 pairs: a nibble q below the mantissa of 1024.0 (0x6400) makes the half 1024 + q
        // exactly; less 1024 it is q, then q * d - m in one f16 fused multiply-add per pair
        // (d and m rounded to f16 first): about four operations a pair where the f32 decode it
        // replaced took about six a value. H200, KHR path, 4B q4_k prefill 512: 29.35 ms of
        // products a step against 30.84 (bench/results/2026-11-29-khr-half-decode).
        f16vec2 dd = f16vec2(float16_t(clamp(d1, -F16_MAX, F16_MAX)));
        f16vec2 mm = f16vec2(float16_t(clamp(m1, -F16_MAX, F16_MAX)));
        const f16vec2 k1024 = f16vec2(1024.0hf);
        // Values 16 * (half_ * QV + i) + 4 * j .. of the step.
        [[unroll]] for (uint i = 0; i < QV; i++) {
            [[unroll]] for (uint j = 0; j < 4; j++) {
                uint v = g.qnib[i][j] >> shift;
                uint at = xb + r * SK2 + 8 * (half_ * QV + i) + 2 * j;
                // Bytes 0 and 1's nibbles as one pair, bytes 2 and 3's as the other.
                uint p01 = (v & 0x0Fu) | ((v << 8) & 0x000F0000u) | 0x64006400u;
                uint p23 = ((v >> 16) & 0x0Fu) | ((v >> 8) & 0x000F0000u) | 0x64006400u;
                ws[at] = (unpackFloat2x16(p01) - k1024) * dd - mm;
                ws[at + 1] = (unpackFloat2x16(p23) - k1024) * dd - mm;
            }
        }
    }
#elif UNIT == 1
    [[unroll]] for (uint i = 0; i < WG8; i++) {
        uint e = tid + THREADS * i;
        uint at = xb + (e / 4) * SK2 + (e % 4) * 4;
        ws[at] = g.wv[2 * i].xy;
        ws[at + 1] = g.wv[2 * i].zw;
        ws[at + 2] = g.wv[2 * i + 1].xy;
        ws[at + 3] = g.wv[2 * i + 1].zw;
    }
#else
    if (tid < BW) {
        [[unroll]] for (uint i = 0; i < 8; i++) {
            vec4 f = vec4(g.wu[4 * i], g.wu[4 * i + 1], g.wu[4 * i + 2], g.wu[4 * i + 3]);
            f16vec4 hv = f16vec4(clamp(f, -F16_MAX, F16_MAX));
            ws[xb + tid * SK2 + 2 * i] = hv.xy;
            ws[xb + tid * SK2 + 2 * i + 1] = hv.zw;
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
        coopMatLoad(b, ws, xb + (ww + j * 16) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutColumnMajor); \
        acc0##j = coopMatMulAdd(a0, b, acc0##j); \
        acc1##j = coopMatMulAdd(a1, b, acc1##j); \
        acc2##j = coopMatMulAdd(a2, b, acc2##j); \
        acc3##j = coopMatMulAdd(a3, b, acc3##j);
// The products of the step in shared buffer `bufv`.
#define PRODUCTS(bufv) { \
        uint xb = (bufv) * TILE; \
        [[unroll]] for (uint kk = 0; kk < BK / 2; kk += 8) { \
            A_T a0; \
            A_T a1; \
            A_T a2; \
            A_T a3; \
            B_T b; \
            coopMatLoad(a0, xs, xb + (wx + 0) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutRowMajor); \
            coopMatLoad(a1, xs, xb + (wx + 16) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutRowMajor); \
            coopMatLoad(a2, xs, xb + (wx + 32) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutRowMajor); \
            coopMatLoad(a3, xs, xb + (wx + 48) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutRowMajor); \
            MMA_COL(0) \
            MMA_COL(1) \
        } }
    // (B[k][n] = W[n][k]: the weight tile is B in column-major order.)

    // Global loads two steps ahead, into two sets of registers taken in turn: a step's loads
    // have two steps' products to arrive in.
    Regs ra = fetch(kb, ke, vec_x, vec_w);
    stage(ra, kb, 0u);
    Regs rb = ra;
    if (kb + BK < ke) {
        rb = fetch(kb + BK, ke, vec_x, vec_w);
    }
    barrier();
    uint buf = 0u;
    for (uint k0 = kb; k0 < ke; k0 += 2 * BK) {
        // Step k0 is in shared buffer `buf`, step k0 + BK in `rb`; `ra` is free.
        if (k0 + 2 * BK < ke) {
            ra = fetch(k0 + 2 * BK, ke, vec_x, vec_w);
        }
        PRODUCTS(buf)
        if (k0 + BK < ke) {
            stage(rb, k0 + BK, buf ^ 1u);
        }
        barrier();
        buf ^= 1u;
        if (k0 + BK >= ke) {
            break;
        }
        // Step k0 + BK is in `buf`, step k0 + 2 BK in `ra`; `rb` is free.
        if (k0 + 3 * BK < ke) {
            rb = fetch(k0 + 3 * BK, ke, vec_x, vec_w);
        }
        PRODUCTS(buf)
        if (k0 + 2 * BK < ke) {
            stage(ra, k0 + 2 * BK, buf ^ 1u);
        }
        barrier();
        buf ^= 1u;
    }

    uint64_t slice = p.part + uint64_t(gl_WorkGroupID.z) * p.rows * p.n * 4u;
#define STORE_ROW(i) store(acc##i##0, i, 0, slice); store(acc##i##1, i, 1, slice);
    STORE_ROW(0)
    STORE_ROW(1)
    STORE_ROW(2)
    STORE_ROW(3)
}
