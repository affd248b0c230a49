// EXPERIMENT (TANDEM_VULKAN_ATTN_COOPMAT=1; not yet run on a GPU): `attention_tiled` on KHR
// cooperative matrices. Same push constants, grid, blocks and split partials as
// `attention_tiled`: workgroup (h, b, s) attends query head h of the block of 32 rows b*32 ..
// over split s of the key tiles of the rows' visible ranges, when every row of the block belongs
// to one slot. Heads of up to 256 dimensions, a multiple of 32 (the host checks it).
//
// Four subgroups of 32: subgroup (rr = sg & 1, cc = sg >> 1) computes the scores of rows
// 16rr .. 16rr+15 against keys 16cc .. 16cc+15 of each 32-key tile (QK^T in 16x16x16 f16
// products, f32 sums) and the outputs of the same rows at dimensions cc * hd / 2 .. (PV, P in
// f16). The softmax runs in f32 in two passes over the split's tiles: the first finds each
// row's maximum score, the second adds exp(score - maximum) and its products with V, so the
// output accumulators never need rescaling. Q, the K or V tile, the scores and the
// probabilities pass through shared memory as f16 (scores f32); a row that sees no key of the
// split keeps maximum -inf, sum 0 and zero outputs.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;
#define BR 32
#define BC 32
#define MAX_HEAD_DIM 256
// Row strides in f16vec2s: Q and K/V tiles (head_dim + 8 halves, at most), probabilities.
#define QS2_MAX ((MAX_HEAD_DIM + 8) / 2)
#define PS2 ((BC + 8) / 2)
// Scores: f32, rows of BC + 4.
#define SS (BC + 4)

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
shared f16vec2 kvs[BC * QS2_MAX];
shared float ss[BR * SS];
shared f16vec2 ps[BR * PS2];
shared float red[BR * 4];
shared float s_m[BR];
shared float s_l[BR];
shared uint s_lo[BR];
shared uint s_pos[BR];
shared uint s_range[2];
shared float cs[4 * 256];

// Four consecutive cached values of row `crow` at column `col` (a multiple of 4), as f16.
f16vec4 cache4(uint64_t base, uint64_t at) {
    if (p.f16 != 0u) {
        uvec2 h = U2s(base + at * 2).v[0];
        return f16vec4(unpackFloat2x16(h.x), unpackFloat2x16(h.y));
    }
    return f16vec4(clamp(V4s(base + at * 4).v[0], -F16_MAX, F16_MAX));
}

// The K or V tile at key t0 (keys past kmax: zeros) into kvs.
void load_tile(uint64_t base, uint t0, uint kmax, uint slot, uint g, uint hd, uint kv_cols, uint qs2) {
    uint quads = hd / 4;
    for (uint e = gl_LocalInvocationID.x; e < BC * quads; e += 128) {
        uint j = e / quads;
        uint d = (e % quads) * 4;
        f16vec4 v = f16vec4(0.0);
        uint key = t0 + j;
        if (key <= kmax) {
            uint64_t crow = uint64_t(slot) * p.capacity + key % p.capacity;
            v = cache4(base, crow * kv_cols + g * hd + d);
        }
        kvs[j * qs2 + d / 2] = v.xy;
        kvs[j * qs2 + d / 2 + 1] = v.zw;
    }
}

// This subgroup's 16 x 16 scores (rows 16rr.., keys 16cc.. of the tile in kvs) into ss.
void scores(uint rr, uint cc, uint hd, uint qs2) {
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> s =
        coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
    for (uint d = 0; d < hd; d += 16) {
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
        coopMatLoad(a, qs, rr * 16 * qs2 + d / 2, qs2, gl_CooperativeMatrixLayoutRowMajor);
        // B[d][key] = K[key][d]: the K tile is B in column-major order.
        coopMatLoad(b, kvs, cc * 16 * qs2 + d / 2, qs2, gl_CooperativeMatrixLayoutColumnMajor);
        s = coopMatMulAdd(a, b, s);
    }
    coopMatStore(s, ss, rr * 16 * SS + cc * 16, SS, gl_CooperativeMatrixLayoutRowMajor);
}

// Score of row i, key j of the tile at t0 as the softmax takes it: scaled, soft-capped, -inf
// where the row does not see the key.
float score(uint i, uint j, uint t0, uint kmax, uint nrows) {
    uint kp = t0 + j;
    if (i >= nrows || kp > kmax || kp < s_lo[i] || kp > s_pos[i]) {
        return NEG_INF;
    }
    float s = ss[i * SS + j] * p.scale;
    if (p.softcap != 0.0) {
        s = p.softcap * tanh_safe(s / p.softcap);
    }
    return s;
}

// Output fragment f of this subgroup (rows 16rr.., dimensions cc * hd / 2 + 16f ..): divided by
// the row's sum into the output with one split, else unnormalised into the partials.
void put_out(coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> o, uint f, uint rr, uint cc,
             uint hd, uint nrows, uint r0, uint h, uint q_cols, uint split) {
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    coopMatStore(o, cs, sg * 256, 16, gl_CooperativeMatrixLayoutRowMajor);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    [[unroll]] for (uint t = 0; t < 8; t++) {
        uint e = lane + 32 * t;
        uint i = rr * 16 + e / 16;
        uint dd = cc * (hd / 2) + 16u * f + e % 16;
        if (i < nrows) {
            float v = cs[sg * 256 + e];
            if (p.splits == 1u) {
                float l = s_l[i];
                st_f32(p.dst, uint64_t(r0 + i) * q_cols + h * hd + dd, l > 0.0 ? v / l : 0.0);
            } else {
                uint64_t at = (uint64_t(r0 + i) * p.heads + h) * p.splits + split;
                st_f32(p.part_o, at * hd + dd, v);
            }
        }
    }
    subgroupBarrier();
}

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
        s_m[tid] = NEG_INF;
        s_l[tid] = 0.0;
    }
    // Q of the block's rows (zero past them) as f16.
    uint quads = hd / 4;
    for (uint e = tid; e < BR * quads; e += 128) {
        uint i = e / quads;
        uint d = (e % quads) * 4;
        vec4 v = vec4(0.0);
        if (i < nrows) {
            v = V4s(p.q + (uint64_t(r0 + i) * q_cols + h * hd + d) * 4).v[0];
        }
        f16vec4 hv = f16vec4(clamp(v, -F16_MAX, F16_MAX));
        qs[i * qs2 + d / 2] = hv.xy;
        qs[i * qs2 + d / 2 + 1] = hv.zw;
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
    // This split's tiles of the block's range (as attention_tiled splits them).
    uint tiles = (s_range[1] - s_range[0]) / BC + 1u;
    uint per = (tiles + p.splits - 1u) / p.splits;
    uint first = min(split * per, tiles);
    uint kmin = s_range[0] + first * BC;
    uint kend = s_range[0] + min(first + per, tiles) * BC;
    uint kmax = s_range[1];

    uint rr = sg & 1u;
    uint cc = sg >> 1;
    // Softmax: invocation (si = tid / 4, sq = tid % 4) takes keys 8sq .. 8sq+7 of row si.
    uint si = tid / 4u;
    uint sq = tid % 4u;

    // Pass 1: each row's maximum score.
    for (uint t0 = kmin; t0 < kend; t0 += BC) {
        load_tile(p.kc, t0, kmax, slot, g, hd, kv_cols, qs2);
        barrier();
        scores(rr, cc, hd, qs2);
        barrier();
        float mt = NEG_INF;
        [[unroll]] for (uint j = 0; j < 8; j++) {
            mt = max(mt, score(si, 8u * sq + j, t0, kmax, nrows));
        }
        red[si * 4u + sq] = mt;
        barrier();
        if (sq == 0u) {
            s_m[si] = max(s_m[si], max(max(red[si * 4u], red[si * 4u + 1u]), max(red[si * 4u + 2u], red[si * 4u + 3u])));
        }
        barrier();
    }

    // Pass 2: the sums and P V.
    uint nf = hd / 32u; // 16x16 output fragments per subgroup, up to 8
    // The output fragments as separate variables (arrays of them indexed in loops may be kept
    // out of registers).
#define ACC_T coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
    ACC_T o0 = ACC_T(0.0);
    ACC_T o1 = ACC_T(0.0);
    ACC_T o2 = ACC_T(0.0);
    ACC_T o3 = ACC_T(0.0);
    ACC_T o4 = ACC_T(0.0);
    ACC_T o5 = ACC_T(0.0);
    ACC_T o6 = ACC_T(0.0);
    ACC_T o7 = ACC_T(0.0);
    float m = s_m[si];
    for (uint t0 = kmin; t0 < kend; t0 += BC) {
        load_tile(p.kc, t0, kmax, slot, g, hd, kv_cols, qs2);
        barrier();
        scores(rr, cc, hd, qs2);
        barrier();
        float sum = 0.0;
        [[unroll]] for (uint j = 0; j < 8; j += 2) {
            float s0 = score(si, 8u * sq + j, t0, kmax, nrows);
            float s1 = score(si, 8u * sq + j + 1u, t0, kmax, nrows);
            float e0 = s0 == NEG_INF ? 0.0 : exp(s0 - m);
            float e1 = s1 == NEG_INF ? 0.0 : exp(s1 - m);
            sum += e0 + e1;
            ps[si * PS2 + (8u * sq + j) / 2u] = f16vec2(e0, e1);
        }
        red[si * 4u + sq] = sum;
        // Every subgroup is done with the K tile: V takes its place.
        barrier();
        if (sq == 0u) {
            s_l[si] += red[si * 4u] + red[si * 4u + 1u] + red[si * 4u + 2u] + red[si * 4u + 3u];
        }
        load_tile(p.vc, t0, kmax, slot, g, hd, kv_cols, qs2);
        barrier();
        [[unroll]] for (uint kk = 0; kk < BC; kk += 16) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
            coopMatLoad(a, ps, rr * 16 * PS2 + kk / 2, PS2, gl_CooperativeMatrixLayoutRowMajor);
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
            // B[key][dim] = V[key][dim]: row-major.
#define PV(f) \
            if (f < nf) { \
                coopMatLoad(b, kvs, kk * qs2 + (cc * (hd / 2) + 16u * f) / 2, qs2, gl_CooperativeMatrixLayoutRowMajor); \
                o##f = coopMatMulAdd(a, b, o##f); \
            }
            PV(0)
            PV(1)
            PV(2)
            PV(3)
            PV(4)
            PV(5)
            PV(6)
            PV(7)
        }
        barrier();
    }

    // Outputs through each subgroup's 16x16 slot: normalised (one split) or partial.
#define OUT(f) \
    if (f < nf) { \
        put_out(o##f, f, rr, cc, hd, nrows, r0, h, q_cols, split); \
    }
    OUT(0)
    OUT(1)
    OUT(2)
    OUT(3)
    OUT(4)
    OUT(5)
    OUT(6)
    OUT(7)
    if (p.splits != 1u && tid < nrows) {
        uint64_t at = (uint64_t(r0 + tid) * p.heads + h) * p.splits + split;
        st_f32(p.part_ml, at * 2u, s_m[tid]);
        st_f32(p.part_ml, at * 2u + 1u, s_l[tid]);
    }
}
