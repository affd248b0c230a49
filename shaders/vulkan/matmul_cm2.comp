// Op::MatMul for many rows (prefill, batched decode) on NV cooperative-matrix-2 workgroup-scope
// matrices: the driver stages the tiles through shared memory and pipelines the loads, the
// kernel only says what to multiply. One workgroup of 256 computes a BM (weight rows = output
// columns) x BN (input rows) tile of the transposed output: A = a BM x BK slice of the weight,
// dequantised element by element by `decode_w` as the driver loads it; B = a BK x BN slice of
// the transposed input, which the host converted to f16 beforehand (`to_f16`); f32
// accumulation. The tile is stored
// transposed into the one split output it lies in (the host takes this kernel only where every
// split boundary is a multiple of BM and every address is 16-byte aligned); out-of-range rows and
// columns are clamped to zero on load and dropped on store.
//
// Split k (`kslice` nonzero, where the grid of tiles is small: batched decode): workgroup
// (x, y, z) multiplies only k z * kslice .. (z + 1) * kslice (kslice a multiple of 64, so of
// BK) and stores its f32 partial tile into `part` at [z][rows][n]; matmul_reduce adds the
// slices and writes the split outputs.
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256) in;

// Weight rows of the workgroup's tile (a multiple of 32); input rows (a multiple of 32) in the
// low 16 bits of SPEC1, and in its high bits MODE: bit 0 clamps every load (else only the
// tiles not wholly inside the matrices, or all where k is not a multiple of BK), bit 1 takes k
// 64 at a time (else 32, one sub-block of the 32-wide and 256-wide block formats), bit 2
// unrolls 8 slices (else 4), bit 3 gives the interior tiles' loads alignment hints (their
// row strides set to k masked to a multiple of BK, which k is there, and their k offsets masked
// to the multiple of 256 or 64 they are: rows 16-byte aligned, as llama.cpp's mul_mm_cm2 tells
// NVIDIA's compiler) and walks them in a loop of their own. Tuning bits, not yet measured
// (TANDEM_VULKAN_CM2_MODE): 16 leaves the decoded weights unclamped (a weight past f16's range
// becomes infinite rather than 65504), 32 pads q4_k's rows of scales in shared memory to BM + 2
// (llama.cpp's stride) rather than BM.
// (Builds with the tile and MODE as compile-time constants rather than specialisation
// constants ran no faster: bench/results/2026-11-29-cm2-fixed.)
layout(constant_id = 0) const uint BM = 128;
layout(constant_id = 1) const uint SPEC1 = 128;
const uint BN = SPEC1 & 0xFFFFu;
const uint MODE = SPEC1 >> 16;
const uint BK = (MODE & 2u) != 0u ? 64u : 32u;
// Slices per unrolled trip: bit 2 of MODE 8 (a 256-wide block at BK 32), else 4.
const uint UNROLL = (MODE & 4u) != 0u ? 8u : 4u;

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
    uint64_t part;
    uint kslice; // 0: the whole k, stored into the outputs
} p;

// The accumulator: f32, or f16 in the build that defines ACC_F16 (`matmul_cm2h`: option
// `precision = "fast"`, llama.cpp's default for these products), converted to f32 to be stored.
#if defined(ACC_F16)
#define ACC coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>
#define F32ACC(a) f32_acc(a)
#else
#define ACC coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>
#define F32ACC(a) (a)
#endif
#if defined(ACC_F16)
// The f16 accumulator as f32, its infinities (a sum past f16's range) clamped to f16's largest
// finite value first, as llama.cpp's f16-accumulating kernels do.
coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> f32_acc(ACC a) {
    [[unroll]] for (int i = 0; i < a.length(); i++) {
        a[i] = clamp(a[i], float16_t(-65504.0), float16_t(65504.0));
    }
    return coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(a);
}
#endif

// f16's largest finite value: inputs and weights beyond it are clamped, not made infinite.
#define F16_MAX 65504.0

layout(buffer_reference, scalar, buffer_reference_align = 16) buffer H16s { float16_t v[]; };

// The weight format's block as `decode_w` sees it (BS elements in HALVES 16-bit or WORDS 32-bit
// words) and one
// element of it: `at[1]` is the element's index in its block.
#if defined(WFMT_F16)
#define BS 1
#elif defined(WFMT_F32)
#define BS 1
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer WBlock { float v; };
float welem(const in WBlock b, uint i) { return b.v; }
#else
#if defined(WFMT_BF16)
#define BS 1
#define HALVES 1
#elif defined(WFMT_Q4_0)
#define BS Q4_0_ELEMS
#define HALVES (Q4_0_BYTES / 2)
#elif defined(WFMT_Q4_1)
#define BS Q4_1_ELEMS
#define HALVES (Q4_1_BYTES / 2)
#elif defined(WFMT_Q5_0)
#define BS Q5_0_ELEMS
#define HALVES (Q5_0_BYTES / 2)
#elif defined(WFMT_Q5_1)
#define BS Q5_1_ELEMS
#define HALVES (Q5_1_BYTES / 2)
#elif defined(WFMT_Q8_0)
#define BS Q8_0_ELEMS
#define HALVES (Q8_0_BYTES / 2)
#elif defined(WFMT_Q4_K)
#define BS Q4_K_ELEMS
#define WORDS (Q4_K_BYTES / 4)
#elif defined(WFMT_Q6_K)
#define BS Q6_K_ELEMS
#define HALVES (Q6_K_BYTES / 2)
#endif
#if defined(WORDS)
// 144-byte blocks from a 16-byte aligned base: read 32 bits at a time.
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer WBlock { uint v[WORDS]; };
#else
layout(buffer_reference, scalar, buffer_reference_align = 2) buffer WBlock { uint16_t v[HALVES]; };
uint byte_at(const in WBlock b, uint j) { return (uint(b.v[j >> 1]) >> (8u * (j & 1u))) & 0xFFu; }
float half_at(const in WBlock b, uint j) { return unpackHalf2x16(uint(b.v[j >> 1])).x; }
#endif
// (q4_k's decode is its own, below: its scales come from shared memory.)
#if !defined(WFMT_Q4_K)
float welem(const in WBlock b, uint i) {
#if defined(WFMT_BF16)
    return uintBitsToFloat(uint(b.v[0]) << 16);
#elif defined(WFMT_Q4_0)
    // d, 16 bytes: element j low nibble of byte j, j + 16 high nibble; (q - 8) d.
    uint q = (byte_at(b, Q4_0_QS + (i & 15u)) >> (4u * (i >> 4))) & 15u;
    return float(int(q) - 8) * half_at(b, Q4_0_D);
#elif defined(WFMT_Q4_1)
    // d, m, 16 bytes as q4_0; q d + m.
    uint q = (byte_at(b, Q4_1_QS + (i & 15u)) >> (4u * (i >> 4))) & 15u;
    return float(q) * half_at(b, Q4_1_D) + half_at(b, Q4_1_M);
#elif defined(WFMT_Q5_0)
    // d, qh (bit j: bit 4 of element j), 16 bytes as q4_0; (q - 16) d.
    uint qh = uint(b.v[Q5_0_QH / 2]) | (uint(b.v[Q5_0_QH / 2 + 1]) << 16);
    uint q = ((byte_at(b, Q5_0_QS + (i & 15u)) >> (4u * (i >> 4))) & 15u) | (((qh >> i) & 1u) << 4);
    return float(int(q) - 16) * half_at(b, Q5_0_D);
#elif defined(WFMT_Q5_1)
    // d, m, qh, 16 bytes; q d + m.
    uint qh = uint(b.v[Q5_1_QH / 2]) | (uint(b.v[Q5_1_QH / 2 + 1]) << 16);
    uint q = ((byte_at(b, Q5_1_QS + (i & 15u)) >> (4u * (i >> 4))) & 15u) | (((qh >> i) & 1u) << 4);
    return float(q) * half_at(b, Q5_1_D) + half_at(b, Q5_1_M);
#elif defined(WFMT_Q8_0)
    // d, 32 int8; q d.
    return sext8(byte_at(b, Q8_0_QS + i)) * half_at(b, Q8_0_D);
#elif defined(WFMT_Q6_K)
    // 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d: unit u = i / 32 is
    // quarter s = u % 4 of half h = u / 4; element l of it as in common.glsl's load_unit.
    uint u = i >> 5;
    uint h = (u >> 2) & 1u;
    uint s = u & 3u;
    uint l = i & 31u;
    // Low bits at byte 64h + 32(s % 2) + l + Q6_K_QL, which is 0 (common.glsl checks it).
    uint lo = (byte_at(b, 64 * h + 32 * (s & 1u) + l) >> (4u * (s >> 1))) & 15u;
    uint hi = (byte_at(b, Q6_K_QH + 32 * h + l) >> (2u * s)) & 3u;
    float scale = sext8(byte_at(b, Q6_K_SCALES + 8 * h + 2 * s + (l >> 4)));
    return half_at(b, Q6_K_D) * scale * float(int(lo | (hi << 4)) - 32);
#endif
}
#endif
#endif

#if defined(WFMT_Q4_K)
// q4_k's scales for the tile's BM weight rows and one 256-wide block of k, decoded once per
// block rather than once per element: (d scale, dmin min) of sub-block s (32 elements) of local
// row r at [s * BM + r]. Each thread fetches its share of the next block's headers into
// `sc_next` while the current block multiplies (`fetch_scales`), and stores them between two
// barriers when the block begins (`store_scales`). The tile loop therefore walks k one block at
// a time, which the host guarantees (k, and every split-k slice, a multiple of 256).
// Row stride of `sh_scales`: BM, or BM + 2 with MODE bit 5.
const uint SC_STRIDE = (MODE & 32u) != 0u ? BM + 2u : BM;
shared vec2 sh_scales[8 * (BM + 2u)];
uvec4 sc_next;

// The 16-byte head of a q4_k block: d and dmin, then 12 bytes of packed 6-bit scales and mins.
layout(buffer_reference, scalar, buffer_reference_align = 16) buffer Q4KHead { uvec4 v; };

// Threads per weight row of the tile, and sub-blocks per thread.
const uint SC_THREADS = 256u / BM;
const uint SC_PER = 8u / SC_THREADS;

void fetch_scales(uint n0, uint kb) {
    uint row = n0 + gl_LocalInvocationIndex / SC_THREADS;
    sc_next = uvec4(0u);
    if (row < p.n) {
        sc_next = Q4KHead(p.w + uint64_t(row) * p.row_bytes + uint64_t(kb) * Q4_K_BYTES).v;
    }
}

void store_scales() {
    barrier();
    uint r = gl_LocalInvocationIndex / SC_THREADS;
    uint s0 = SC_PER * (gl_LocalInvocationIndex % SC_THREADS);
    vec2 dm = unpackHalf2x16(sc_next.x);
    [[unroll]] for (uint j = 0; j < SC_PER; j++) {
        uint s = s0 + j;
        uint sc;
        uint mn;
        q4k_scale_min(sc_next.yzw, s, sc, mn);
        sh_scales[s * SC_STRIDE + r] = vec2(dm.x * float(sc), dm.y * float(mn));
    }
    barrier();
}

float16_t decode_w(const in WBlock b, const in uint block[2], const in uint at[2]) {
    uint i = at[1];
    uint s = i >> 5;
    vec2 dm = sh_scales[s * SC_STRIDE + block[0] % BM];
    uint l = i & 31u;
    uint q = (b.v[Q4_K_QS / 4 + 8 * (s >> 1) + (l >> 2)] >> (8u * (l & 3u) + 4u * (s & 1u))) & 15u;
    float v = dm.x * float(q) - dm.y;
    return float16_t((MODE & 16u) != 0u ? v : clamp(v, -F16_MAX, F16_MAX));
}
#define DECODE_W , decode_w
#elif !defined(WFMT_F16)
float16_t decode_w(const in WBlock b, const in uint block[2], const in uint at[2]) {
    float v = welem(b, at[1]);
    return float16_t((MODE & 16u) != 0u ? v : clamp(v, -F16_MAX, F16_MAX));
}
#define DECODE_W , decode_w
#else
#define DECODE_W
#endif

// One slice: A from the weight through layout LW, B from the f16 input through LX (transposed),
// multiplied into acc.
#if defined(WFMT_F16)
#define LOAD_W(LW, K) coopMatLoadTensorNV(a, H16s(p.w).v, 0, sliceTensorLayoutNV(LW, n0, BM, K, BK))
#else
#define LOAD_W(LW, K) coopMatLoadTensorNV(a, U16s(p.w).v, 0, sliceTensorLayoutNV(LW, n0, BM, K, BK) DECODE_W)
#endif
#define STEP(LW, LX, K) \
    LOAD_W(LW, K); \
    coopMatLoadTensorNV(b, H16s(p.x).v, 0, sliceTensorLayoutNV(LX, m0, BN, K, BK), tr); \
    acc = coopMatMulAdd(a, b, acc)

#if defined(WFMT_Q4_K)
// One q4_k block of k (256 elements) in 256 / BK steps, its scales already in `sh_scales`.
#define BLOCK_STEPS(LW, LX, K) \
    [[unroll]] for (uint j = 0; j < 256u / BK; j++) { \
        STEP(LW, LX, (K) + j * BK); \
    }
#endif

void main() {
    uint n0 = gl_WorkGroupID.x * BM;
    uint m0 = gl_WorkGroupID.y * BN;
    // The split output holding this tile's columns.
    uint64_t dst;
    uint c0;
    uint width;
    if (n0 < p.end0) {
        dst = p.dst0; c0 = 0; width = p.end0;
    } else if (n0 < p.end1) {
        dst = p.dst1; c0 = p.end0; width = p.end1 - p.end0;
    } else if (n0 < p.end2) {
        dst = p.dst2; c0 = p.end1; width = p.end2 - p.end1;
    } else {
        dst = p.dst3; c0 = p.end2; width = p.n - p.end2;
    }

    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> tw =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    tensorLayoutNV<2> uw = createTensorLayoutNV(2);
#if BS > 1
    tw = setTensorLayoutBlockSizeNV(tw, 1, BS);
    uw = setTensorLayoutBlockSizeNV(uw, 1, BS);
#endif
    tw = setTensorLayoutDimensionNV(tw, p.n, p.k);
    uw = setTensorLayoutDimensionNV(uw, p.n, p.k);
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> tx =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    tx = setTensorLayoutDimensionNV(tx, p.rows, p.k);
    tensorLayoutNV<2> ux = createTensorLayoutNV(2);
    ux = setTensorLayoutDimensionNV(ux, p.rows, p.k);
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> td =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    td = setTensorLayoutDimensionNV(td, p.rows, width);
    // Rows <-> columns: the input and the output are read and written transposed.
    tensorViewNV<2, false, 1, 0> tr = createTensorViewNV(2, false, 1, 0);
    bool interior = (MODE & 1u) == 0u && n0 + BM <= p.n && m0 + BN <= p.rows && p.k % BK == 0u;
    uint k_lo = p.kslice * gl_WorkGroupID.z;
    uint k_hi = p.kslice == 0u ? p.k : min(p.k, k_lo + p.kslice);

    ACC acc = ACC(0.0);
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a;
    coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b;
    uint k0 = k_lo;
    if ((MODE & 8u) != 0u && interior) {
        // Here k is a multiple of BK (so of 8: rows 16-byte aligned, as the host's addresses
        // are) and k_lo of 256 (q4_k) or 64 (split-k slices): say so to the compiler.
        uint stride = p.k & ~(BK - 1u);
        uw = setTensorLayoutStrideNV(uw, stride / BS, 1);
        ux = setTensorLayoutStrideNV(ux, stride, 1);
#if defined(WFMT_Q4_K)
        k0 = k_lo & ~255u;
        fetch_scales(n0, k0 / 256u);
        for (; k0 < k_hi; k0 += 256u) {
            store_scales();
            if (k0 + 256u < k_hi) {
                fetch_scales(n0, k0 / 256u + 1u);
            }
            BLOCK_STEPS(uw, ux, k0);
        }
#else
        k0 = k_lo & ~63u;
        for (; k0 + UNROLL * BK <= k_hi; k0 += UNROLL * BK) {
            [[unroll]] for (uint j = 0; j < UNROLL; j++) {
                STEP(uw, ux, k0 + j * BK);
            }
        }
        for (; k0 < k_hi; k0 += BK) {
            STEP(uw, ux, k0);
        }
#endif
        k0 = k_hi;
    }
#if defined(WFMT_Q4_K)
    // A block of k at a time: its scales stored into shared memory, the next block's fetched,
    // then its 256 / BK slices (k_lo and k_hi are multiples of 256).
    if (k0 < k_hi) {
        fetch_scales(n0, k_lo / 256u);
    }
    for (; k0 < k_hi; k0 += 256u) {
        store_scales();
        if (k0 + 256u < k_hi) {
            fetch_scales(n0, k0 / 256u + 1u);
        }
        if (interior) {
            BLOCK_STEPS(uw, ux, k0);
        } else {
            BLOCK_STEPS(tw, tx, k0);
        }
    }
#else
    // UNROLL slices per trip, so that the driver can overlap one slice's loads with the
    // previous one's multiply; then the rest one at a time.
    if (k0 >= k_hi) {
        // (done above)
    } else if (interior) {
        for (; k0 + UNROLL * BK <= k_hi; k0 += UNROLL * BK) {
            [[unroll]] for (uint j = 0; j < UNROLL; j++) {
                STEP(uw, ux, k0 + j * BK);
            }
        }
        for (; k0 < k_hi; k0 += BK) {
            STEP(uw, ux, k0);
        }
    } else {
        for (; k0 + UNROLL * BK <= k_hi; k0 += UNROLL * BK) {
            [[unroll]] for (uint j = 0; j < UNROLL; j++) {
                STEP(tw, tx, k0 + j * BK);
            }
        }
        for (; k0 < k_hi; k0 += BK) {
            STEP(tw, tx, k0);
        }
    }
#endif
    if (p.kslice != 0u) {
        tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> tp =
            createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
        tp = setTensorLayoutDimensionNV(tp, p.rows, p.n);
        uint64_t slice = p.part + uint64_t(gl_WorkGroupID.z) * p.rows * p.n * 4u;
        coopMatStoreTensorNV(F32ACC(acc), F32s(slice).v, 0, sliceTensorLayoutNV(tp, m0, BN, n0, BM), tr);
        return;
    }
    coopMatStoreTensorNV(F32ACC(acc), F32s(dst).v, 0, sliceTensorLayoutNV(td, m0, BN, n0 - c0, BM), tr);
}
