// Op::BlockAttention on KHR cooperative matrices (flash attention, one pass, online softmax in
// f32): the vision tower's bidirectional attention, where every row of a block of `block` rows
// (one image's patches) sees every row of that block. attention_coopmat's scheme without the
// KV cache: workgroup (h, b) attends query head h of the QR = 128 rows b*QR .. over the keys of
// the union of their blocks, in tiles of BC = 32 keys. The host takes it where the device has
// cooperative matrices (subgroups of 32), the head has a multiple of 4 dimensions up to 128
// and q is 16-byte aligned; block_attention_tiled elsewhere. k and v come as f16, [rows,
// heads * head_dim] (the host's `to_f16` of the op's f32 keys and values, once per op): the
// tiles every workgroup reads take half the bytes of f32 ones (on the H200, with f32 keys and
// values, skipping every load after the first tile saved 13 of the tower's 35 ms).
//
// The head is padded with zeros to ND fragments of 16 dimensions (specialisation constant 1,
// so the driver keeps only the fragments and registers the head needs; SigLIP's 72 -> 5), in
// the Q, K and V tiles: the padded dimensions add nothing to the scores, and the outputs at
// them are not stored. Eight subgroups of 32, subgroup sg owning query rows 16sg .. 16sg+15:
// - setup: the rows' Q as f16 through shared memory (64 rows at a time) into ND A fragments;
// - per tile (K and V as f16 in shared memory; each tile's loads go out a whole tile before
//   its staging, into registers of their own for K and for V):
//   1. scores: each subgroup its 16 rows x the 32 keys (two accumulators), stored as f32 into
//      the score area (row stride SPS slots of 32 bits);
//   2. softmax (f32): invocation tid owns row tid / 2 and its keys 16 * (tid % 2) ..: the scaled
//      masked scores, the row's new maximum and sum (one shuffle each), its probabilities as f16
//      (slots 0..15) and its rescale factor alpha (slots 16..31, 16 copies: row r of a 16 x 16
//      accumulator-shaped matrix);
//   3. P V: each subgroup scales its ND output accumulators (16 x 16 f32) by the alpha matrix
//      and adds P V.
// - end: outputs times 1 / sum per row, through each subgroup's 256 slots of the score area.
// Eight subgroups of 16 rows each (rather than attention_coopmat's four row groups by two key
// or dimension halves) read each K and V tile for 128 rows, and do twice the products between
// two barriers; two barriers a tile.
//
// Q, K, V and the probabilities are rounded to f16 (as the products' inputs on this path are),
// sums and the softmax are f32. Keys past the rows' last block end are zero in the tiles.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x = 256) in;
// Probe bits for tuning runs (TANDEM_VULKAN_ATTN_MODE; 0 otherwise, and results are wrong with
// any set): 1 skips the score products, 2 the P V products, 4 the global loads of every tile
// after the first, 8 the softmax's exponentials.
layout(constant_id = 0) const uint MODE = 0;
// 16-dimension fragments of the padded head, 1 to 8.
layout(constant_id = 1) const uint ND = 8;
#define QR 128
#define BC 32
// Row stride of the Q, K and V tiles in f16vec2s (the padded head + 8 halves).
const uint KS2 = ND * 8u + 4u;
// The V tile's offset in `kvs`.
const uint VOFF = BC * KS2;
// Quads (4 values) of the padded head.
const uint NQ = ND * 4u;
// Row stride of the score area in 32-bit slots (32 scores + 4: 144 bytes).
#define SPS 36
// One tile's K or V loads per invocation (vec4s).
const uint TL = (BC * NQ + 255u) / 256u;
// One pass of the Q setup (64 rows) per invocation.
const uint QL = (64u * NQ + 255u) / 256u;

layout(push_constant, scalar) uniform Params {
    uint64_t q;
    uint64_t k;
    uint64_t v;
    uint64_t dst;
    uint heads;
    uint head_dim;
    uint rows;
    uint block;
    float scale;
} p;

const float NEG_INF = -1.0 / 0.0;
#define F16_MAX 65504.0

// The K tile then the V tile (BC rows of KS2 each); during setup, 64 Q rows at a time.
shared f16vec2 kvs[2 * BC * KS2];
// Scores (f32 bits), then probabilities (f16 pairs, slots 0..15) and alphas (slots 16..31) per
// query row; at the end each subgroup's 16 x 16 outputs on their way out.
shared f16vec2 sp[QR * SPS];
shared uint s_lo[QR];
shared uint s_hi[QR];

layout(buffer_reference, scalar, buffer_reference_align = 8) buffer U2s { uvec2 v[]; };

// A K tile's and a V tile's loads of this invocation (4 halves each), a tile ahead of their
// staging.
uvec2 raw_k[8];
uvec2 raw_v[8];

// Fetches keys t0 .. t0 + BC - 1 of `base` for head h into raw: zeros past kmax and past the
// head (up to the padded head).
void fetch(inout uvec2 raw[8], uint64_t base, uint t0, uint kmax, uint h, uint hd, uint cols) {
    uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint it = 0; it < TL; it++) {
        uint e = tid + 256u * it;
        uint j = e / NQ;
        uint dq = e % NQ;
        uint key = t0 + j;
        uvec2 r = uvec2(0);
        if (j < BC && key <= kmax && dq * 4u < hd) {
            r = U2s(base + (uint64_t(key) * cols + h * hd + dq * 4u) * 2).v[0];
        }
        raw[it] = r;
    }
}

// The fetched tile into `kvs` at `off`.
void stage(uvec2 raw[8], uint off) {
    uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint it = 0; it < TL; it++) {
        uint e = tid + 256u * it;
        uint j = e / NQ;
        uint dq = e % NQ;
        if (j < BC) {
            kvs[off + j * KS2 + dq * 2u] = unpackFloat2x16(raw[it].x);
            kvs[off + j * KS2 + dq * 2u + 1u] = unpackFloat2x16(raw[it].y);
        }
    }
}

f16vec2 bits_of(float v) {
    return unpackFloat2x16(floatBitsToUint(v));
}

float float_of(f16vec2 v) {
    return uintBitsToFloat(packFloat2x16(v));
}

#define A_T coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define B_T coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define ACC_T coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint h = gl_WorkGroupID.x;
    uint r0 = gl_WorkGroupID.y * QR;
    uint nrows = min(uint(QR), p.rows - r0);
    uint hd = p.head_dim;
    uint cols = p.heads * hd;
    if (tid < QR) {
        uint r = r0 + min(tid, nrows - 1u);
        uint first = r - r % p.block;
        s_lo[tid] = first;
        s_hi[tid] = min(first + p.block, p.rows) - 1u;
    }
    // The Q rows as f16 (zero past the rows and the head), 64 at a time: subgroups 0-3 take
    // their fragments from the first pass, 4-7 from the second.
    A_T qf[8];
    [[unroll]] for (uint pass = 0; pass < 2; pass++) {
        [[unroll]] for (uint it = 0; it < QL; it++) {
            uint e = tid + 256u * it;
            uint i = e / NQ;
            uint dq = e % NQ;
            uint row = 64u * pass + i;
            vec4 v = vec4(0.0);
            if (i < 64u && row < nrows && dq * 4u < hd) {
                v = V4s(p.q + (uint64_t(r0 + row) * cols + h * hd + dq * 4u) * 4).v[0];
            }
            if (i < 64u) {
                f16vec4 hv = f16vec4(clamp(v, -F16_MAX, F16_MAX));
                kvs[i * KS2 + dq * 2u] = hv.xy;
                kvs[i * KS2 + dq * 2u + 1u] = hv.zw;
            }
        }
        barrier();
        if ((sg >> 2) == pass) {
            [[unroll]] for (uint d = 0; d < ND; d++) {
                coopMatLoad(qf[d], kvs, (sg & 3u) * 16u * KS2 + 8u * d, KS2, gl_CooperativeMatrixLayoutRowMajor);
            }
        }
        barrier();
    }
    // The key range of the rows' blocks (lane i reads rows i, i + 32, i + 64 and i + 96).
    uint rlo = subgroupMin(min(min(s_lo[lane], s_lo[lane + 32u]), min(s_lo[lane + 64u], s_lo[lane + 96u])));
    uint rhi = subgroupMax(max(max(s_hi[lane], s_hi[lane + 32u]), max(s_hi[lane + 64u], s_hi[lane + 96u])));
    uint kend = rlo + ((rhi - rlo) / BC + 1u) * BC;

    // The softmax's row and keys.
    uint srow = tid >> 1;
    uint part = tid & 1u;
    bool live = srow < nrows;
    uint lo_i = s_lo[srow];
    uint hi_i = s_hi[srow];
    float m = NEG_INF;
    float l = 0.0;

    ACC_T o[8];
    [[unroll]] for (uint f = 0; f < ND; f++) {
        o[f] = ACC_T(0.0);
    }

    // Tile 0 staged, tile 1's loads in flight.
    fetch(raw_k, p.k, rlo, rhi, h, hd, cols);
    fetch(raw_v, p.v, rlo, rhi, h, hd, cols);
    stage(raw_k, 0u);
    stage(raw_v, VOFF);
    if (rlo + BC < kend) {
        fetch(raw_k, p.k, rlo + BC, rhi, h, hd, cols);
        fetch(raw_v, p.v, rlo + BC, rhi, h, hd, cols);
    }
    barrier();
    for (uint t0 = rlo; t0 < kend; t0 += BC) {
        bool more = t0 + BC < kend && (MODE & 4u) == 0u;
        bool after = t0 + 2u * BC < kend && (MODE & 4u) == 0u;
        // 1. Scores of rows 16sg .. against keys 0..15 and 16..31 of the tile.
        ACC_T s0 = ACC_T(0.0);
        ACC_T s1 = ACC_T(0.0);
        if ((MODE & 1u) == 0u) {
            [[unroll]] for (uint d = 0; d < ND; d++) {
                B_T b;
                coopMatLoad(b, kvs, 8u * d, KS2, gl_CooperativeMatrixLayoutColumnMajor);
                s0 = coopMatMulAdd(qf[d], b, s0);
                coopMatLoad(b, kvs, 16u * KS2 + 8u * d, KS2, gl_CooperativeMatrixLayoutColumnMajor);
                s1 = coopMatMulAdd(qf[d], b, s1);
            }
        }
        coopMatStore(s0, sp, sg * 16u * SPS, SPS, gl_CooperativeMatrixLayoutRowMajor);
        coopMatStore(s1, sp, sg * 16u * SPS + 16u, SPS, gl_CooperativeMatrixLayoutRowMajor);
        barrier(); // (1) the scores are written; the K tile is free
        // The next K tile into shared memory, and the loads of the one after it.
        if (more) {
            stage(raw_k, 0u);
        }
        if (after) {
            fetch(raw_k, p.k, t0 + 2u * BC, rhi, h, hd, cols);
        }
        // 2. Online softmax of row srow over its 16 keys here and 16 in its partner lane.
        float sc[16];
        float tmax = NEG_INF;
        [[unroll]] for (uint j = 0; j < 16; j++) {
            uint kp = t0 + 16u * part + j;
            float x = NEG_INF;
            if (live && kp >= lo_i && kp <= hi_i) {
                x = float_of(sp[srow * SPS + 16u * part + j]) * p.scale;
            }
            sc[j] = x;
            tmax = max(tmax, x);
        }
        tmax = max(tmax, subgroupShuffleXor(tmax, 1u));
        float mn = max(m, tmax);
        float alpha = mn == NEG_INF ? 1.0 : exp(m - mn);
        float sum = 0.0;
        [[unroll]] for (uint j = 0; j < 16; j++) {
            if ((MODE & 8u) == 0u) {
                sc[j] = sc[j] == NEG_INF ? 0.0 : exp(sc[j] - mn);
            } else {
                sc[j] = sc[j] == NEG_INF ? 0.0 : sc[j] - mn;
            }
            sum += sc[j];
        }
        sum += subgroupShuffleXor(sum, 1u);
        l = l * alpha + sum;
        m = mn;
        // Both lanes of the row have read its scores before the probabilities replace them.
        subgroupBarrier();
        [[unroll]] for (uint j = 0; j < 8; j++) {
            sp[srow * SPS + 8u * part + j] = f16vec2(sc[2 * j], sc[2 * j + 1]);
            sp[srow * SPS + 16u + 8u * part + j] = bits_of(alpha);
        }
        // The row's 32 slots are this subgroup's (rows 16sg .. belong to lanes of subgroup sg).
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        // 3. O = alpha O + P V for rows 16sg ...
        {
            ACC_T f;
            coopMatLoad(f, sp, sg * 16u * SPS + 16u, SPS, gl_CooperativeMatrixLayoutRowMajor);
            A_T pa0;
            A_T pa1;
            coopMatLoad(pa0, sp, sg * 16u * SPS, SPS, gl_CooperativeMatrixLayoutRowMajor);
            coopMatLoad(pa1, sp, sg * 16u * SPS + 8u, SPS, gl_CooperativeMatrixLayoutRowMajor);
            if ((MODE & 2u) == 0u) {
                [[unroll]] for (uint fi = 0; fi < ND; fi++) {
                    B_T vb;
                    o[fi] = o[fi] * f;
                    coopMatLoad(vb, kvs, VOFF + 8u * fi, KS2, gl_CooperativeMatrixLayoutRowMajor);
                    o[fi] = coopMatMulAdd(pa0, vb, o[fi]);
                    coopMatLoad(vb, kvs, VOFF + 16u * KS2 + 8u * fi, KS2, gl_CooperativeMatrixLayoutRowMajor);
                    o[fi] = coopMatMulAdd(pa1, vb, o[fi]);
                }
            }
        }
        barrier(); // (2) the V tile is free; the next K tile is staged
        if (more) {
            stage(raw_v, VOFF); // seen by P V after the next tile's barrier (1)
        }
        if (after) {
            fetch(raw_v, p.v, t0 + 2u * BC, rhi, h, hd, cols);
        }
    }

    float norm = l > 0.0 ? 1.0 / l : 0.0;
    [[unroll]] for (uint j = 0; j < 8; j++) {
        sp[srow * SPS + 16u + 8u * part + j] = bits_of(norm);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    ACC_T rs;
    coopMatLoad(rs, sp, sg * 16u * SPS + 16u, SPS, gl_CooperativeMatrixLayoutRowMajor);
    barrier(); // every subgroup has its factors before the outputs pass through the area
    [[unroll]] for (uint fi = 0; fi < ND; fi++) {
        o[fi] = o[fi] * rs;
        coopMatStore(o[fi], sp, sg * 256u, 16, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        [[unroll]] for (uint t = 0; t < 8; t++) {
            uint e = lane + 32u * t;
            uint i = sg * 16u + e / 16u;
            uint dd = 16u * fi + e % 16u;
            if (i < nrows && dd < hd) {
                st_f32(p.dst, uint64_t(r0 + i) * cols + h * hd + dd, float_of(sp[sg * 256u + e]));
            }
        }
        subgroupBarrier();
    }
}
