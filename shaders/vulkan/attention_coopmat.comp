// EXPERIMENT (TANDEM_VULKAN_ATTN_COOPMAT=1): `attention_tiled` on KHR cooperative matrices, one
// pass with an online softmax. Same push constants, grid, blocks and split partials as
// `attention_tiled`: workgroup (h, b, s) attends query head h of the block of 32 rows b*32 ..
// over split s of the key tiles of the rows' visible ranges, when every row of the block belongs
// to one slot. Heads of up to 256 dimensions, a multiple of 32 (the host checks it).
//
// Four subgroups of 32: subgroup (rr = sg & 1, dh = sg >> 1) owns rows 16rr .. 16rr+15 and the
// output dimensions dh * hd / 2 .. of the half it computes. Per tile of 16 keys (K and V
// fetched into registers while the tile before multiplies, then into shared memory as f16), each subgroup computes its rows' 16 x 16 scores over the
// whole head (QK^T in 16x16x16 f16 products with f32 sums; the two subgroups of a row half
// compute the same scores, so neither waits on the other), then, within the subgroup, each
// row's softmax in f32 (two lanes per row): the new running maximum, the factor that rescales
// the row's earlier outputs, and the probabilities as f16. The output accumulators (f32, up to
// 8 of 16 x 16) are rescaled in registers, multiplied component-wise by a matrix whose row r
// holds row r's factor (no indexing of an accumulator's elements, whose layout is the
// driver's). Then O += P V.
//
// Measured (H200, prefill 512, bench/results/2026-11-28-prefill-khr2/experiments-*.txt and the
// note of issue 54): 4B q4_k 5.2-6.0 ms of attention a step against 5.8 for `attention_tiled`,
// 1B 2.4-3.3 against 3.75, depending on the splits; about 5 us a 16-key tile per workgroup,
// whichever the splits, so each workgroup waits more than it computes. Not the default: not
// clearly faster, and its f16 rounding needs the precision issue's rule.
//
// Q and the probabilities are rounded to f16 (as K and V are), so this kernel is held to a
// tensor-core tolerance, not to the f32 kernels' (the precision issue's rule decides where it
// may be the default). A row that sees no key of the split keeps maximum -inf, sum 0 and zero
// outputs.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require

layout(local_size_x = 128) in;
#define BR 32
#define BC 16
#define MAX_HEAD_DIM 256
// Row stride of the Q, K and V tiles in f16vec2s at most (head_dim + 8 halves).
#define QS2_MAX ((MAX_HEAD_DIM + 8) / 2)
// Row stride of a subgroup's probabilities in f16vec2s (16 + 8 halves, 48 bytes).
#define PS2 12

layout(push_constant, scalar) uniform Params {
    uint64_t q;
    uint64_t kc;
    uint64_t vc;
    uint64_t dst;
    uint64_t positions;
    uint64_t slots;
    uint64_t part_o;
    uint64_t part_ml;
    uint heads;
    uint kv_heads;
    uint head_dim;
    uint capacity;
    float scale;
    uint window;   // 0: none
    float softcap; // 0: none
    uint f16;
    uint splits;
    uint rows;
    uint skip_block; // unused here
} p;

const float NEG_INF = -1.0 / 0.0;
#define F16_MAX 65504.0

layout(buffer_reference, scalar, buffer_reference_align = 8) buffer U2s { uvec2 v[]; };

shared f16vec2 qs[BR * QS2_MAX];
shared f16vec2 ks[BC * QS2_MAX];
shared f16vec2 vs[BC * QS2_MAX];
// Per subgroup: a 16 x 16 f32 slot (scores, then the rows' factors, then outputs on their way
// out) and its rows' probabilities.
shared float ss[4 * 256];
shared f16vec2 ps[4 * 16 * PS2];
shared uint s_lo[BR];
shared uint s_pos[BR];
shared uint s_range[2];

// Quads (4 dimensions) of the largest head.
#define MQ (MAX_HEAD_DIM / 4)
// Loads per invocation of a K (or V) tile: 16 keys x MQ quads over 128 invocations.
#define TL (BC * MQ / 128)

// The next tile's K and V, as loaded (f32 bits, or f16 pairs in .xy), in registers: every load
// of a tile is issued before any is waited on (a loop over the head's quads at run time
// waited on each load in turn: H200, 4B, 6.7 us a tile), and a tile's loads go out while the
// tile before it multiplies.
uvec4 kraw[TL];
uvec4 vraw[TL];

// Fetches the K and V tiles at key t0 (keys past kmax: zeros) into kraw and vraw.
void fetch_tiles(uint t0, uint kmax, uint slot, uint g, uint hd, uint kv_cols) {
    uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint it = 0; it < TL; it++) {
        uint e = tid + 128u * it;
        uint j = e / MQ;
        uint dq = e % MQ;
        uint key = t0 + j;
        kraw[it] = uvec4(0);
        vraw[it] = uvec4(0);
        if (dq * 4u < hd && key <= kmax) {
            uint64_t crow = uint64_t(slot) * p.capacity + key % p.capacity;
            uint64_t at = crow * kv_cols + g * hd + dq * 4u;
            if (p.f16 != 0u) {
                kraw[it].xy = U2s(p.kc + at * 2).v[0];
                vraw[it].xy = U2s(p.vc + at * 2).v[0];
            } else {
                kraw[it] = floatBitsToUint(V4s(p.kc + at * 4).v[0]);
                vraw[it] = floatBitsToUint(V4s(p.vc + at * 4).v[0]);
            }
        }
    }
}

// Four fetched values as f16.
f16vec4 as_f16(uvec4 raw) {
    if (p.f16 != 0u) {
        return f16vec4(unpackFloat2x16(raw.x), unpackFloat2x16(raw.y));
    }
    return f16vec4(clamp(uintBitsToFloat(raw), -F16_MAX, F16_MAX));
}

// The fetched tiles into ks and vs.
void stage_tiles(uint hd, uint qs2) {
    uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint it = 0; it < TL; it++) {
        uint e = tid + 128u * it;
        uint j = e / MQ;
        uint dq = e % MQ;
        if (dq * 4u < hd) {
            f16vec4 kv = as_f16(kraw[it]);
            f16vec4 vv = as_f16(vraw[it]);
            ks[j * qs2 + dq * 2u] = kv.xy;
            ks[j * qs2 + dq * 2u + 1u] = kv.zw;
            vs[j * qs2 + dq * 2u] = vv.xy;
            vs[j * qs2 + dq * 2u + 1u] = vv.zw;
        }
    }
}

#define ACC_T coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint h = gl_WorkGroupID.x;
    uint r0 = gl_WorkGroupID.y * BR;
    uint split = gl_WorkGroupID.z;
    uint nrows = min(uint(BR), p.rows - r0);
    if (!one_slot_block(p.slots, r0, p.rows, BR)) {
        return; // several slots: `attention` takes this block
    }
    uint slot = U32s(p.slots).v[r0];
    uint hd = p.head_dim;
    uint qs2 = (hd + 8) / 2;
    uint g = h / (p.heads / p.kv_heads);
    uint kv_cols = p.kv_heads * hd;
    uint q_cols = p.heads * hd;
    if (tid < BR) {
        uint pos = tid < nrows ? U32s(p.positions).v[r0 + tid] : 0u;
        s_pos[tid] = pos;
        s_lo[tid] = (p.window != 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
    }
    // Q of the block's rows (zero past them) as f16, every load issued before any is used.
    {
        vec4 qv[BR * MQ / 128];
        [[unroll]] for (uint it = 0; it < BR * MQ / 128; it++) {
            uint e = tid + 128u * it;
            uint i = e / MQ;
            uint dq = e % MQ;
            qv[it] = vec4(0.0);
            if (i < nrows && dq * 4u < hd) {
                qv[it] = V4s(p.q + (uint64_t(r0 + i) * q_cols + h * hd + dq * 4u) * 4).v[0];
            }
        }
        [[unroll]] for (uint it = 0; it < BR * MQ / 128; it++) {
            uint e = tid + 128u * it;
            uint i = e / MQ;
            uint dq = e % MQ;
            if (dq * 4u < hd) {
                f16vec4 hv = f16vec4(clamp(qv[it], -F16_MAX, F16_MAX));
                qs[i * qs2 + dq * 2u] = hv.xy;
                qs[i * qs2 + dq * 2u + 1u] = hv.zw;
            }
        }
    }
    barrier();
    if (tid == 0u) {
        uint lo = s_lo[0];
        uint hi = s_pos[0];
        for (uint i = 1; i < nrows; i++) {
            lo = min(lo, s_lo[i]);
            hi = max(hi, s_pos[i]);
        }
        s_range[0] = lo;
        s_range[1] = hi;
    }
    barrier();
    // This split's tiles of the block's range.
    uint tiles = (s_range[1] - s_range[0]) / BC + 1u;
    uint per = (tiles + p.splits - 1u) / p.splits;
    uint first = min(split * per, tiles);
    uint kmin = s_range[0] + first * BC;
    uint kend = s_range[0] + min(first + per, tiles) * BC;
    uint kmax = s_range[1];

    uint rr = sg & 1u;
    uint dh = sg >> 1;
    // Softmax: lane (row lane / 2 of the subgroup's 16, keys 8 * (lane & 1) ..) of block row i.
    uint srow = lane >> 1;
    uint part = lane & 1u;
    uint i = rr * 16u + srow;
    bool live = i < nrows;
    uint lo_i = s_lo[i];
    uint pos_i = s_pos[i];
    float m = NEG_INF;
    float l = 0.0;

    uint nf = hd / 32u; // 16x16 output fragments per subgroup, up to 8
    ACC_T o0 = ACC_T(0.0);
    ACC_T o1 = ACC_T(0.0);
    ACC_T o2 = ACC_T(0.0);
    ACC_T o3 = ACC_T(0.0);
    ACC_T o4 = ACC_T(0.0);
    ACC_T o5 = ACC_T(0.0);
    ACC_T o6 = ACC_T(0.0);
    ACC_T o7 = ACC_T(0.0);
    uint obase = dh * (hd / 2u);

    if (kmin < kend) {
        fetch_tiles(kmin, kmax, slot, g, hd, kv_cols);
    }
    for (uint t0 = kmin; t0 < kend; t0 += BC) {
        stage_tiles(hd, qs2);
        barrier();
        // The next tile's loads go out before this one's products.
        if (t0 + BC < kend) {
            fetch_tiles(t0 + BC, kmax, slot, g, hd, kv_cols);
        }
        // Scores of rows 16rr.. against the tile's 16 keys.
        ACC_T s = ACC_T(0.0);
        for (uint d = 0; d < hd; d += 16) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
            coopMatLoad(a, qs, rr * 16u * qs2 + d / 2u, qs2, gl_CooperativeMatrixLayoutRowMajor);
            // B[d][key] = K[key][d]: the K tile is B in column-major order.
            coopMatLoad(b, ks, d / 2u, qs2, gl_CooperativeMatrixLayoutColumnMajor);
            s = coopMatMulAdd(a, b, s);
        }
        coopMatStore(s, ss, sg * 256u, 16, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        // Online softmax of the row's 8 keys here and 8 in the partner lane.
        float sc[8];
        float tmax = NEG_INF;
        [[unroll]] for (uint j = 0; j < 8; j++) {
            uint kp = t0 + 8u * part + j;
            float x = NEG_INF;
            if (live && kp <= kmax && kp >= lo_i && kp <= pos_i) {
                x = ss[sg * 256u + srow * 16u + 8u * part + j] * p.scale;
                if (p.softcap != 0.0) {
                    x = p.softcap * tanh_safe(x / p.softcap);
                }
            }
            sc[j] = x;
            tmax = max(tmax, x);
        }
        tmax = max(tmax, subgroupShuffleXor(tmax, 1u));
        float mn = max(m, tmax);
        float alpha = mn == NEG_INF ? 1.0 : exp(m - mn);
        float sum = 0.0;
        [[unroll]] for (uint j = 0; j < 8; j += 2) {
            float e0 = sc[j] == NEG_INF ? 0.0 : exp(sc[j] - mn);
            float e1 = sc[j + 1] == NEG_INF ? 0.0 : exp(sc[j + 1] - mn);
            sum += e0 + e1;
            ps[sg * 16u * PS2 + srow * PS2 + (8u * part + j) / 2u] = f16vec2(e0, e1);
        }
        sum += subgroupShuffleXor(sum, 1u);
        l = l * alpha + sum;
        m = mn;
        // Where a row's maximum grew, its outputs so far shrink by alpha: component-wise by a
        // matrix whose row r is alpha of row r, written over the scores (read by now).
        bool same = subgroupAll(alpha == 1.0);
        if (!same) {
            [[unroll]] for (uint j = 0; j < 8; j++) {
                ss[sg * 256u + srow * 16u + 8u * part + j] = alpha;
            }
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        if (!same) {
            ACC_T f;
            coopMatLoad(f, ss, sg * 256u, 16, gl_CooperativeMatrixLayoutRowMajor);
            o0 = o0 * f; o1 = o1 * f; o2 = o2 * f; o3 = o3 * f;
            o4 = o4 * f; o5 = o5 * f; o6 = o6 * f; o7 = o7 * f;
        }
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> pa;
        coopMatLoad(pa, ps, sg * 16u * PS2, PS2, gl_CooperativeMatrixLayoutRowMajor);
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> vb;
        // B[key][dim] = V[key][dim]: row-major.
#define PV(f) \
        if (f < nf) { \
            coopMatLoad(vb, vs, (obase + 16u * f) / 2u, qs2, gl_CooperativeMatrixLayoutRowMajor); \
            o##f = coopMatMulAdd(pa, vb, o##f); \
        }
        PV(0)
        PV(1)
        PV(2)
        PV(3)
        PV(4)
        PV(5)
        PV(6)
        PV(7)
        // Every subgroup is done with the tiles before the next ones replace them.
        barrier();
    }

    // One split: outputs divided by the row's sum; several: unnormalised, with (max, sum).
    [[unroll]] for (uint j = 0; j < 8; j++) {
        ss[sg * 256u + srow * 16u + 8u * part + j] = p.splits == 1u ? (l > 0.0 ? 1.0 / l : 0.0) : 1.0;
    }
    if (p.splits != 1u && dh == 0u && part == 0u && live) {
        uint64_t at = (uint64_t(r0 + i) * p.heads + h) * p.splits + split;
        st_f32(p.part_ml, at * 2u, m);
        st_f32(p.part_ml, at * 2u + 1u, l);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    ACC_T rs;
    coopMatLoad(rs, ss, sg * 256u, 16, gl_CooperativeMatrixLayoutRowMajor);
    subgroupBarrier();
#define OUT(f) \
    if (f < nf) { \
        o##f = o##f * rs; \
        coopMatStore(o##f, ss, sg * 256u, 16, gl_CooperativeMatrixLayoutRowMajor); \
        subgroupMemoryBarrierShared(); \
        subgroupBarrier(); \
        [[unroll]] for (uint t = 0; t < 8; t++) { \
            uint e = lane + 32u * t; \
            uint row = rr * 16u + e / 16u; \
            uint dd = obase + 16u * f + e % 16u; \
            if (row < nrows) { \
                float v = ss[sg * 256u + e]; \
                if (p.splits == 1u) { \
                    st_f32(p.dst, uint64_t(r0 + row) * q_cols + h * hd + dd, v); \
                } else { \
                    uint64_t at = (uint64_t(r0 + row) * p.heads + h) * p.splits + split; \
                    st_f32(p.part_o, at * hd + dd, v); \
                } \
            } \
        } \
        subgroupBarrier(); \
    }
    OUT(0)
    OUT(1)
    OUT(2)
    OUT(3)
    OUT(4)
    OUT(5)
    OUT(6)
    OUT(7)
}
