// Second half of Op::Attention for prefill, flash-attention style: workgroup (h, b, s) attends
// query head h of the block of BR rows b*BR .. b*BR+BR-1 over split s of its key tiles, when
// every row of the block belongs to one slot (a prefill chunk): the keys of the union of the
// rows' visible ranges, in tiles of BC positions split evenly (at run time) over the `splits`
// workgroups, are loaded once per tile into shared memory and used by all BR rows, each row
// masking what it does not see (causality, its window). Scores and outputs accumulate in f32
// with an online softmax per row. With one split the result is written directly; otherwise
// each split's unnormalised output goes to `part_o` ([rows][heads][splits][head_dim]) and its
// maximum and sum to `part_ml` ([rows][heads][splits][2]) for attention_combine. Blocks of
// several slots (batched decode) are left to `attention`, which the backend runs after this
// kernel with `skip_block` set and which takes exactly those blocks.
//
// Thread layout (256 invocations):
// - scores: invocation (ri = tid / 16, kj = tid % 16) computes rows 2ri, 2ri+1 x keys 2kj, 2kj+1
//   over head-dimension chunks of DC, from Q^T and K^T chunks in shared memory (vec2 reads);
// - softmax: invocation i < BR owns row i's running maximum and sum;
// - outputs: invocation (rg = tid / 64, dim = tid % 64) owns rows 8rg .. 8rg+7 at dimensions
//   dim, dim + 64, ... (at most MAX_HEAD_DIM / 64 of them).
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256) in;
#define BR 32
#define BC 32
#define DC 64
#define MAX_HEAD_DIM 256
#define NCH (MAX_HEAD_DIM / DC)
// Images' blocks (Op::Attention's bidirectional_from; a specialisation constant, so that text
// programs run the kernel without them): each row sees lo ..= ends[r], its block's last
// position, not lo ..= pos; the block's key range ends at the largest end of its rows.
layout(constant_id = 1) const uint IMAGE_ROWS = 0;

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
    uint64_t ends;   // IMAGE_ROWS only: each row's last visible position
} p;

const float NEG_INF = -1.0 / 0.0;

// Rows padded by one vector against bank conflicts in the transposing stores.
shared vec2 qs[DC][BR / 2 + 1]; // Q^T chunk: qs[d][i] = (Q[2i][d], Q[2i+1][d])
shared vec2 ks[DC][BC / 2 + 1]; // K^T chunk
shared vec4 ps[BC][BR / 4 + 1]; // scores, then probabilities, transposed: ps[j][i / 4][i % 4]
shared float vs[BC][DC];        // V chunk
shared float red[BR][8];        // the softmax's partial maxima and sums
shared uint s_lo[BR];
shared uint s_pos[BR]; // each row's last visible position: its own, or its image block's end
shared float s_alpha[BR];
shared float s_l[BR];
shared uint s_range[2];

float cache_at(uint64_t base, uint64_t i) {
    if (p.f16 != 0u) {
        return unpackHalf2x16(ld_u16(base, i)).x;
    }
    return ld_f32(base, i);
}

// Element e of invocation tid in a chunk of Q, K or V (as the transposing stores take them):
// row (or key) tid / DC + 4e of the block (tile), dimension tid % DC of the chunk. `qoff` and
// `koff` hold those elements' offsets in chunk 0 (koff: ~0 past the tile's last key).

// Chunk c of the Q rows and of the K tile (zero past the rows, keys or head).
void load_qk(inout float qn[8], inout float kn[8], uint qoff[8], uint64_t koff[8], uint c,
             uint nrows, uint hd) {
    uint tid = gl_LocalInvocationID.x;
    uint dd = c * DC + tid % DC;
    [[unroll]] for (uint e = 0; e < 8; e++) {
        uint row = tid / DC + 4u * e;
        qn[e] = (row < nrows && dd < hd) ? ld_f32(p.q, uint64_t(qoff[e] + c * DC)) : 0.0;
        kn[e] = (koff[e] != ~uint64_t(0) && dd < hd) ? cache_at(p.kc, koff[e] + c * DC) : 0.0;
    }
}

// Chunk c of the V tile.
void load_v(inout float vn[8], uint64_t koff[8], uint c, uint hd) {
    uint dd = c * DC + gl_LocalInvocationID.x % DC;
    [[unroll]] for (uint e = 0; e < 8; e++) {
        vn[e] = (koff[e] != ~uint64_t(0) && dd < hd) ? cache_at(p.vc, koff[e] + c * DC) : 0.0;
    }
}

// koff for the tile at t0.
void tile_offsets(inout uint64_t koff[8], uint t0, uint kmax, uint slot, uint g, uint hd,
                  uint kv_cols) {
    uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint e = 0; e < 8; e++) {
        uint key = t0 + tid / DC + 4u * e;
        koff[e] = ~uint64_t(0);
        if (key <= kmax) {
            uint64_t crow = uint64_t(slot) * p.capacity + key % p.capacity;
            koff[e] = crow * kv_cols + g * hd + tid % DC;
        }
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint r0 = gl_WorkGroupID.y * BR;
    uint split = gl_WorkGroupID.z;
    uint nrows = min(uint(BR), p.rows - r0);
    if (!one_slot_block(p.slots, r0, p.rows, BR)) {
        return; // several slots: `attention` takes this block
    }
    uint slot = U32s(p.slots).v[r0];
    uint hd = p.head_dim;
    uint g = h / (p.heads / p.kv_heads);
    uint kv_cols = p.kv_heads * hd;
    uint q_cols = p.heads * hd;
    if (tid < BR) {
        uint pos = tid < nrows ? U32s(p.positions).v[r0 + tid] : 0u;
        uint end = pos;
        if (IMAGE_ROWS != 0u && tid < nrows) {
            end = max(U32s(p.ends).v[r0 + tid], pos);
        }
        s_pos[tid] = end;
        s_lo[tid] = (p.window != 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
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
    uint kend = s_range[0] + min(first + per, tiles) * BC; // exclusive, may pass kmax
    uint kmax = s_range[1];

    uint ri = tid / 16u;
    uint kj = tid % 16u;
    uint rg = tid / 64u;
    uint dim = tid % 64u;
    // Softmax: invocation (sr = tid / 8, sp = tid % 8) takes keys 4sp .. 4sp+3 of row sr; the
    // eight of a row keep its running maximum and sum alike.
    uint sr = tid / 8u;
    uint sp = tid % 8u;
    float m = NEG_INF;
    float l = 0.0;
    float o[NCH][8];
    [[unroll]] for (uint c = 0; c < NCH; c++) {
        [[unroll]] for (uint r = 0; r < 8; r++) {
            o[c][r] = 0.0;
        }
    }
    uint nch = (hd + DC - 1u) / DC;
    // Global loads run one chunk ahead of the arithmetic, in registers.
    float qn[8];
    float kn[8];
    float vn[8];
    uint qoff[8];
    uint64_t koff[8];
    [[unroll]] for (uint e = 0; e < 8; e++) {
        qoff[e] = (r0 + tid / DC + 4u * e) * q_cols + h * hd + tid % DC;
    }
    tile_offsets(koff, kmin, kmax, slot, g, hd, kv_cols);
    load_qk(qn, kn, qoff, koff, 0u, nrows, hd);
    for (uint t0 = kmin; t0 < kend; t0 += BC) {
        uint nk = min(uint(BC), kmax - t0 + 1u);
        // Scores of the tile.
        float s00 = 0.0, s01 = 0.0, s10 = 0.0, s11 = 0.0;
        for (uint c = 0; c < nch; c++) {
            [[unroll]] for (uint e = 0; e < 8; e++) {
                uint idx = tid + 256u * e;
                uint row = idx / DC;
                uint d = idx % DC;
                qs[d][row >> 1][row & 1u] = qn[e];
                ks[d][row >> 1][row & 1u] = kn[e];
            }
            barrier();
            if (c + 1u < nch) {
                load_qk(qn, kn, qoff, koff, c + 1u, nrows, hd);
            } else {
                load_v(vn, koff, 0u, hd);
            }
            [[unroll]] for (uint d = 0; d < DC; d++) {
                vec2 a = qs[d][ri];
                vec2 b = ks[d][kj];
                s00 += a.x * b.x;
                s01 += a.x * b.y;
                s10 += a.y * b.x;
                s11 += a.y * b.y;
            }
            barrier();
        }
        float sc[4] = float[4](s00, s01, s10, s11);
        [[unroll]] for (uint e = 0; e < 4; e++) {
            uint i = 2u * ri + e / 2u;
            uint j = 2u * kj + e % 2u;
            uint kp = t0 + j;
            float s = NEG_INF;
            if (i < nrows && j < nk && kp >= s_lo[i] && kp <= s_pos[i]) {
                s = sc[e] * p.scale;
                if (p.softcap != 0.0) {
                    s = p.softcap * tanh_safe(s / p.softcap);
                }
            }
            ps[j][i >> 2][i & 3u] = s;
        }
        barrier();
        // Online softmax.
        float sv[4];
        float mt = NEG_INF;
        [[unroll]] for (uint k = 0; k < 4; k++) {
            sv[k] = ps[4u * sp + k][sr >> 2][sr & 3u];
            mt = max(mt, sv[k]);
        }
        red[sr][sp] = mt;
        barrier();
        [[unroll]] for (uint k = 0; k < 8; k++) {
            mt = max(mt, red[sr][k]);
        }
        float mn = max(m, mt);
        float alpha = (m == NEG_INF || mn == NEG_INF) ? (mn == NEG_INF ? 1.0 : 0.0) : exp(m - mn);
        float sum = 0.0;
        [[unroll]] for (uint k = 0; k < 4; k++) {
            float e = sv[k] == NEG_INF ? 0.0 : exp(sv[k] - mn);
            ps[4u * sp + k][sr >> 2][sr & 3u] = e;
            sum += e;
        }
        barrier();
        red[sr][sp] = sum;
        if (sp == 0u) {
            s_alpha[sr] = alpha;
        }
        barrier();
        sum = 0.0;
        [[unroll]] for (uint k = 0; k < 8; k++) {
            sum += red[sr][k];
        }
        l = l * alpha + sum;
        m = mn;
        [[unroll]] for (uint r = 0; r < 8; r++) {
            float a = s_alpha[rg * 8u + r];
            [[unroll]] for (uint c = 0; c < NCH; c++) {
                o[c][r] *= a;
            }
        }
        // Outputs: o += P V, chunk by chunk of the head dimension.
        [[unroll]] for (uint c = 0; c < NCH; c++) {
            if (c < nch) {
                [[unroll]] for (uint e = 0; e < 8; e++) {
                    uint idx = tid + 256u * e;
                    vs[idx / DC][idx % DC] = vn[e];
                }
                barrier();
                if (c + 1u < nch) {
                    load_v(vn, koff, c + 1u, hd);
                } else if (t0 + BC < kend) {
                    tile_offsets(koff, t0 + BC, kmax, slot, g, hd, kv_cols);
                    load_qk(qn, kn, qoff, koff, 0u, nrows, hd);
                }
                for (uint j = 0; j < BC; j++) {
                    vec4 p0 = ps[j][rg * 2u];
                    vec4 p1 = ps[j][rg * 2u + 1u];
                    float v = vs[j][dim];
                    o[c][0] += p0.x * v;
                    o[c][1] += p0.y * v;
                    o[c][2] += p0.z * v;
                    o[c][3] += p0.w * v;
                    o[c][4] += p1.x * v;
                    o[c][5] += p1.y * v;
                    o[c][6] += p1.z * v;
                    o[c][7] += p1.w * v;
                }
                barrier();
            }
        }
    }
    if (sp == 0u) {
        s_l[sr] = l;
        s_alpha[sr] = m; // the running maximum, for the partials
    }
    barrier();
    if (p.splits == 1u) {
        [[unroll]] for (uint r = 0; r < 8; r++) {
            uint i = rg * 8u + r;
            if (i < nrows) {
                float inv = 1.0 / s_l[i];
                [[unroll]] for (uint c = 0; c < NCH; c++) {
                    uint dd = c * DC + dim;
                    if (dd < hd) {
                        st_f32(p.dst, uint64_t(r0 + i) * q_cols + h * hd + dd, o[c][r] * inv);
                    }
                }
            }
        }
        return;
    }
    // Partials (an empty split: maximum -inf, sum and outputs 0).
    [[unroll]] for (uint r = 0; r < 8; r++) {
        uint i = rg * 8u + r;
        if (i < nrows) {
            uint64_t at = (uint64_t(r0 + i) * p.heads + h) * p.splits + split;
            if (dim == 0u) {
                st_f32(p.part_ml, at * 2u, s_alpha[i]);
                st_f32(p.part_ml, at * 2u + 1u, s_l[i]);
            }
            [[unroll]] for (uint c = 0; c < NCH; c++) {
                uint dd = c * DC + dim;
                if (dd < hd) {
                    st_f32(p.part_o, at * hd + dd, o[c][r]);
                }
            }
        }
    }
}
