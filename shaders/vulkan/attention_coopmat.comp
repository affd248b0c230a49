// Prefill attention on KHR cooperative matrices (flash attention, one pass, online softmax in
// f32), for the blocks `attention_tiled` would take: the same blocks of BR rows of one slot, the
// same split partials and `attention_combine`, but one workgroup attends TWO query heads that
// share a KV head (grouped-query attention; every Gemma 3 has an even group), so each K and V
// tile is read from memory once for 64 query rows. Workgroup (hp, b, s): query heads 2hp and
// 2hp + 1, block rows b*BR .., split s of the block's key tiles. The host takes this kernel
// where the device has cooperative matrices, the head has a multiple of 32 dimensions up to
// 256, the group is even and q and the caches are 16-byte aligned; image attentions
// (bidirectional blocks) keep `attention_tiled`.
//
// Eight subgroups of 32 (the device's subgroup size on this path). Query row q = hh*BR + i
// (head 2hp + hh, block row i), 64 in all, in four groups of 16 (rg = sg & 3):
// - setup: the 64 Q rows as f16 go through shared memory into registers: subgroup sg keeps its
//   group's 16 rows over the whole head as up to 16 A fragments (16 x 16).
// - per tile of BC = 32 keys (K and V as f16 in shared memory, the next tile's K loaded into
//   registers while this tile's scores are computed, its V while the softmax and P V run):
//   1. scores: subgroup (rg, kg = sg >> 2) computes S for its 16 rows x keys 16kg .. 16kg+15
//      (two accumulators, even and odd 16-dimension steps, so the products do not wait on each
//      other), stored as f32 into the score area (row stride SPS slots of 32 bits);
//   2. softmax (f32): invocation tid owns row tid / 4 and its keys 8 * (tid % 4) ..: the scaled
//      (soft-capped) masked scores, the row's new maximum and sum (two shuffles each), and over
//      the row's scores its probabilities as f16 (slots 0..15) and its rescale factor alpha
//      (slots 16..31, 16 copies: row r of a 16 x 16 accumulator-shaped matrix);
//   3. P V: subgroup (rg, dg = sg >> 2) owns its rows' outputs at dimensions dg * hd / 2 ..
//      (up to 8 accumulators of 16 x 16 f32), scales them component-wise by the alpha matrix
//      (no element of an accumulator is indexed: their layout is the driver's) and adds P V.
//   Three barriers a tile. Shared memory: 43 KB (K and V tiles 33 KB, scores 9 KB), under the
//   48 KB that NVIDIA's Vulkan driver offers.
// - end: outputs times 1 / sum per row (one split) or unnormalised with (max, sum) (several),
//   through each subgroup's 256 slots of the score area.
//
// Q, K, V and the probabilities are rounded to f16 (as the products' inputs on this path are),
// sums and the softmax are f32. Keys past the block's last position are zero in the tiles (so
// a zero probability never meets a NaN of an unwritten cache row); a row that sees no key of
// the split keeps maximum -inf, sum 0 and zero outputs.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x = 256) in;
// Probe bits for tuning runs (TANDEM_VULKAN_ATTN_MODE; 0 otherwise, and results are wrong with
// any set): 1 skips the score products, 2 the P V products, 4 the global loads of every tile
// after the first, 8 the output stores. (A variant that issued each tile's V loads with its K
// loads, a tile ahead in a second set of registers, measured the same: H200, 4B q4_k, 4.26 ms
// of attention a step against 4.30, bench/results/2026-11-28-attention-khr/call4.)
// (A build with MODE a compile-time 0, the probe branches absent from the module rather than
// specialised off, ran no faster: bench/results/2026-11-29-cm2-fixed.)
layout(constant_id = 0) const uint MODE = 0;
#define BR 32
#define QR 64
#define BC 32
#define MAX_HEAD_DIM 256
// Row stride of the Q, K and V tiles in f16vec2s (the largest head + 8 halves: 528 bytes, so
// the 16-byte rows a fragment load reads fall in different banks).
#define KS2 (MAX_HEAD_DIM / 2 + 4)
// The V tile's offset in `kvs`.
#define VOFF (BC * KS2)
// Row stride of the score area in 32-bit slots (32 scores + 4: 144 bytes).
#define SPS 36

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

// The K tile then the V tile (BC rows of KS2 each); during setup, the 64 Q rows.
shared f16vec2 kvs[2 * BC * KS2];
// Scores (f32 bits), then probabilities (f16 pairs, slots 0..15) and alphas (slots 16..31) per
// query row; at the end each subgroup's 16 x 16 outputs on their way out.
shared f16vec2 sp[QR * SPS];
shared uint s_lo[BR];
shared uint s_pos[BR];

// One tile's K or V loads of this invocation: 4 values each (f32 bits, or f16 pairs in .xy).
#define TL (BC * (MAX_HEAD_DIM / 4) / 256)
uvec4 raw[TL];

// Fetches the tile of keys t0 .. t0 + BC - 1 of `base` (keys past kmax: zeros) into raw.
void fetch(uint64_t base, uint t0, uint kmax, uint slot, uint g, uint hd, uint kv_cols) {
    uint tid = gl_LocalInvocationID.x;
    uint nq = hd / 4u;
    [[unroll]] for (uint it = 0; it < TL; it++) {
        uint e = tid + 256u * it;
        uint j = e / nq;
        uint dq = e % nq;
        uint key = t0 + j;
        uvec4 r = uvec4(0);
        if (j < BC && key <= kmax) {
            uint64_t at = (uint64_t(slot) * p.capacity + key % p.capacity) * kv_cols + g * hd + dq * 4u;
            if (p.f16 != 0u) {
                r.xy = U2s(base + at * 2).v[0];
            } else {
                r = floatBitsToUint(V4s(base + at * 4).v[0]);
            }
        }
        raw[it] = r;
    }
}

// The fetched tile into `kvs` at `off`.
void stage(uint off, uint hd) {
    uint tid = gl_LocalInvocationID.x;
    uint nq = hd / 4u;
    [[unroll]] for (uint it = 0; it < TL; it++) {
        uint e = tid + 256u * it;
        uint j = e / nq;
        uint dq = e % nq;
        if (j < BC) {
            uvec4 r = raw[it];
            f16vec4 v;
            if (p.f16 != 0u) {
                v = f16vec4(unpackFloat2x16(r.x), unpackFloat2x16(r.y));
            } else {
                v = f16vec4(clamp(uintBitsToFloat(r), -F16_MAX, F16_MAX));
            }
            kvs[off + j * KS2 + dq * 2u] = v.xy;
            kvs[off + j * KS2 + dq * 2u + 1u] = v.zw;
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
    uint h0 = gl_WorkGroupID.x * 2u;
    uint r0 = gl_WorkGroupID.y * BR;
    uint split = gl_WorkGroupID.z;
    uint nrows = min(uint(BR), p.rows - r0);
    if (!one_slot_block(p.slots, r0, p.rows, BR)) {
        return; // several slots: `attention` takes this block
    }
    uint slot = U32s(p.slots).v[r0];
    uint hd = p.head_dim;
    uint nd = hd / 16u;
    uint nf = hd / 32u;
    uint g = h0 / (p.heads / p.kv_heads);
    uint kv_cols = p.kv_heads * hd;
    uint q_cols = p.heads * hd;
    if (tid < BR) {
        uint pos = tid < nrows ? U32s(p.positions).v[r0 + tid] : 0u;
        s_pos[tid] = pos;
        s_lo[tid] = (p.window != 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
    }
    // The Q rows as f16 (zero past the block's rows and the head).
    [[unroll]] for (uint it = 0; it < QR * (MAX_HEAD_DIM / 4) / 256; it++) {
        uint e = tid + 256u * it;
        uint qrow = e / (MAX_HEAD_DIM / 4);
        uint dq = e % (MAX_HEAD_DIM / 4);
        uint i = qrow % BR;
        vec4 v = vec4(0.0);
        if (i < nrows && dq * 4u < hd) {
            v = V4s(p.q + (uint64_t(r0 + i) * q_cols + (h0 + qrow / BR) * hd + dq * 4u) * 4).v[0];
        }
        f16vec4 hv = f16vec4(clamp(v, -F16_MAX, F16_MAX));
        kvs[qrow * KS2 + dq * 2u] = hv.xy;
        kvs[qrow * KS2 + dq * 2u + 1u] = hv.zw;
    }
    barrier();
    uint rg = sg & 3u;
    uint kg = sg >> 2;
#define QDECL(d) A_T qf##d = A_T(0.0); if (d < nd) { coopMatLoad(qf##d, kvs, rg * 16u * KS2 + 8u * d, KS2, gl_CooperativeMatrixLayoutRowMajor); }
    QDECL(0) QDECL(1) QDECL(2) QDECL(3) QDECL(4) QDECL(5) QDECL(6) QDECL(7)
    QDECL(8) QDECL(9) QDECL(10) QDECL(11) QDECL(12) QDECL(13) QDECL(14) QDECL(15)
    // The block's key range (every subgroup computes it; lane i reads row i).
    uint rlo = subgroupMin(lane < nrows ? s_lo[lane] : 0xFFFFFFFFu);
    uint rhi = subgroupMax(lane < nrows ? s_pos[lane] : 0u);
    barrier(); // Q is in registers before the tiles replace it
    uint tiles = (rhi - rlo) / BC + 1u;
    uint per = (tiles + p.splits - 1u) / p.splits;
    uint first = min(split * per, tiles);
    uint kmin = rlo + first * BC;
    uint kend = rlo + min(first + per, tiles) * BC;

    // The softmax's row and keys.
    uint srow = tid >> 2;
    uint part = tid & 3u;
    uint qi = srow % BR;
    bool live = qi < nrows;
    uint lo_i = s_lo[qi];
    uint pos_i = s_pos[qi];
    float m = NEG_INF;
    float l = 0.0;

    uint obase = kg * (hd / 2u);
    ACC_T o0 = ACC_T(0.0);
    ACC_T o1 = ACC_T(0.0);
    ACC_T o2 = ACC_T(0.0);
    ACC_T o3 = ACC_T(0.0);
    ACC_T o4 = ACC_T(0.0);
    ACC_T o5 = ACC_T(0.0);
    ACC_T o6 = ACC_T(0.0);
    ACC_T o7 = ACC_T(0.0);

    if (kmin < kend) {
        fetch(p.kc, kmin, rhi, slot, g, hd, kv_cols);
        stage(0u, hd);
        fetch(p.vc, kmin, rhi, slot, g, hd, kv_cols);
        stage(VOFF, hd);
    }
    barrier();
    for (uint t0 = kmin; t0 < kend; t0 += BC) {
        bool more = t0 + BC < kend;
        // The next K tile's loads go out before this tile's scores.
        if (more && (MODE & 4u) == 0u) {
            fetch(p.kc, t0 + BC, rhi, slot, g, hd, kv_cols);
        }
        // 1. Scores of rows 16rg .. against keys 16kg ...
        ACC_T s0 = ACC_T(0.0);
        ACC_T s1 = ACC_T(0.0);
#define SDOT(d, acc) if (d < nd && (MODE & 1u) == 0u) { B_T b; coopMatLoad(b, kvs, 16u * kg * KS2 + 8u * d, KS2, gl_CooperativeMatrixLayoutColumnMajor); acc = coopMatMulAdd(qf##d, b, acc); }
        SDOT(0, s0) SDOT(1, s1) SDOT(2, s0) SDOT(3, s1) SDOT(4, s0) SDOT(5, s1) SDOT(6, s0) SDOT(7, s1)
        SDOT(8, s0) SDOT(9, s1) SDOT(10, s0) SDOT(11, s1) SDOT(12, s0) SDOT(13, s1) SDOT(14, s0) SDOT(15, s1)
        s0 = s0 + s1;
        coopMatStore(s0, sp, rg * 16u * SPS + 16u * kg, SPS, gl_CooperativeMatrixLayoutRowMajor);
        barrier(); // (1) the scores are written; the K tile is free
        if (more && (MODE & 4u) == 0u) {
            stage(0u, hd);
            fetch(p.vc, t0 + BC, rhi, slot, g, hd, kv_cols);
        }
        // 2. Online softmax of row srow over its 8 keys here and 24 in its three partner lanes.
        float sc[8];
        float tmax = NEG_INF;
        [[unroll]] for (uint j = 0; j < 8; j++) {
            uint kp = t0 + 8u * part + j;
            float x = NEG_INF;
            if (live && kp >= lo_i && kp <= pos_i) {
                x = float_of(sp[srow * SPS + 8u * part + j]) * p.scale;
                if (p.softcap != 0.0) {
                    x = p.softcap * tanh_safe(x / p.softcap);
                }
            }
            sc[j] = x;
            tmax = max(tmax, x);
        }
        tmax = max(tmax, subgroupShuffleXor(tmax, 1u));
        tmax = max(tmax, subgroupShuffleXor(tmax, 2u));
        float mn = max(m, tmax);
        float alpha = mn == NEG_INF ? 1.0 : exp(m - mn);
        float sum = 0.0;
        [[unroll]] for (uint j = 0; j < 8; j++) {
            sc[j] = sc[j] == NEG_INF ? 0.0 : exp(sc[j] - mn);
            sum += sc[j];
        }
        sum += subgroupShuffleXor(sum, 1u);
        sum += subgroupShuffleXor(sum, 2u);
        l = l * alpha + sum;
        m = mn;
        // Every lane of the row has read its scores before the probabilities replace them.
        subgroupBarrier();
        [[unroll]] for (uint j = 0; j < 4; j++) {
            sp[srow * SPS + 4u * part + j] = f16vec2(sc[2 * j], sc[2 * j + 1]);
            sp[srow * SPS + 16u + 4u * part + j] = bits_of(alpha);
        }
        barrier(); // (2) probabilities and alphas are written
        // 3. O = alpha O + P V for rows 16rg .., dimensions obase ...
        {
            ACC_T f;
            coopMatLoad(f, sp, rg * 16u * SPS + 16u, SPS, gl_CooperativeMatrixLayoutRowMajor);
            A_T pa0;
            A_T pa1;
            coopMatLoad(pa0, sp, rg * 16u * SPS, SPS, gl_CooperativeMatrixLayoutRowMajor);
            coopMatLoad(pa1, sp, rg * 16u * SPS + 8u, SPS, gl_CooperativeMatrixLayoutRowMajor);
#define PV(fi) \
            if (fi < nf && (MODE & 2u) == 0u) { \
                B_T vb; \
                o##fi = o##fi * f; \
                coopMatLoad(vb, kvs, VOFF + (obase + 16u * fi) / 2u, KS2, gl_CooperativeMatrixLayoutRowMajor); \
                o##fi = coopMatMulAdd(pa0, vb, o##fi); \
                coopMatLoad(vb, kvs, VOFF + 16u * KS2 + (obase + 16u * fi) / 2u, KS2, gl_CooperativeMatrixLayoutRowMajor); \
                o##fi = coopMatMulAdd(pa1, vb, o##fi); \
            }
            PV(0) PV(1) PV(2) PV(3) PV(4) PV(5) PV(6) PV(7)
        }
        barrier(); // (3) the V tile, probabilities and alphas are free
        if (more && (MODE & 4u) == 0u) {
            stage(VOFF, hd);
        }
    }

    // One split: outputs divided by the row's sum; several: unnormalised, with (max, sum).
    float norm = p.splits == 1u ? (l > 0.0 ? 1.0 / l : 0.0) : 1.0;
    [[unroll]] for (uint j = 0; j < 4; j++) {
        sp[srow * SPS + 16u + 4u * part + j] = bits_of(norm);
    }
    if (p.splits != 1u && part == 0u && live) {
        uint64_t at = (uint64_t(r0 + qi) * p.heads + h0 + srow / BR) * p.splits + split;
        st_f32(p.part_ml, at * 2u, m);
        st_f32(p.part_ml, at * 2u + 1u, l);
    }
    barrier();
    ACC_T rs;
    coopMatLoad(rs, sp, rg * 16u * SPS + 16u, SPS, gl_CooperativeMatrixLayoutRowMajor);
    barrier(); // every subgroup has its factors before the outputs pass through the area
#define OUT(fi) \
    if (fi < nf) { \
        o##fi = o##fi * rs; \
        coopMatStore(o##fi, sp, sg * 256u, 16, gl_CooperativeMatrixLayoutRowMajor); \
        subgroupMemoryBarrierShared(); \
        subgroupBarrier(); \
        [[unroll]] for (uint t = 0; t < 8; t++) { \
            uint e = lane + 32u * t; \
            uint row = rg * 16u + e / 16u; \
            uint i = row % BR; \
            uint h = h0 + row / BR; \
            uint dd = obase + 16u * fi + e % 16u; \
            if (i < nrows && (MODE & 8u) == 0u) { \
                float v = float_of(sp[sg * 256u + e]); \
                if (p.splits == 1u) { \
                    st_f32(p.dst, uint64_t(r0 + i) * q_cols + h * hd + dd, v); \
                } else { \
                    uint64_t at = (uint64_t(r0 + i) * p.heads + h) * p.splits + split; \
                    st_f32(p.part_o, at * hd + dd, v); \
                } \
            } \
        } \
        subgroupBarrier(); \
    }
    OUT(0) OUT(1) OUT(2) OUT(3) OUT(4) OUT(5) OUT(6) OUT(7)
}
