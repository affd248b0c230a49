// Second half of Op::Attention for head_dim <= 256, by KV head: workgroup (g, r, s) attends every
// query head of KV head g's group (heads / kv_heads of them, GM at a time) for row r, over split
// s of the cached positions lo..=p of the row's slot (the splits divide that range evenly at run
// time), so each K and V row is read once per group rather than once per query head.
//
// Per chunk of up to CHUNK positions:
// - scores: each subgroup takes P positions at a time, its lanes splitting the head's dimensions
//   (vec4 loads of the cache, f16 as two uint words, where head_dim % 4 == 0; element loads
//   otherwise), the P x heads dot products reduced with subgroupAdd; the scores go to shared
//   memory;
// - values: invocation (c, rr) owns dimensions 4c..4c+3 of every head of the group and the
//   positions rr, rr + R, ... (R = 128 / ceil(head_dim / 4)), with its own online softmax (a
//   running maximum and sum per head), loading four positions' values at once.
// At the end the R partial states of each dimension are merged through shared memory; with one
// split the result is written directly, otherwise the split's unnormalised output goes to
// `part_o` ([rows][heads][splits][head_dim]) and its maximum and sum to `part_ml`
// ([rows][heads][splits][2]) for attention_combine.
#extension GL_EXT_control_flow_attributes : require

#define NT 128
layout(local_size_x = NT) in;
#define MAX_HD4 64 // head_dim <= 256
// Query heads kept in registers per pass over the positions: the group's size up to 8 (a
// specialisation constant, so that a group of 2 holds 2 heads' registers, not 8).
layout(constant_id = 0) const uint GM = 8;
// Images' blocks (Op::Attention's bidirectional_from; a specialisation constant, so that text
// programs run the kernel without them): each row sees lo ..= ends[r], its block's last
// position (kit::step::visible_ends, uploaded beside the positions each step), not lo ..= pos.
layout(constant_id = 1) const uint IMAGE_ROWS = 0;
#define P 4        // positions a subgroup scores at once
#define KPL 2      // vec4s of one position a lane loads per step
#define CHUNK 64   // positions per online-softmax step

layout(buffer_reference, scalar, buffer_reference_align = 8) buffer U2s { uvec2 v[]; };

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
    uint skip_block; // nonzero: leave the one-slot blocks of this many rows (attention_tiled's)
    uint64_t ends;   // IMAGE_ROWS only: each row's last visible position
} p;

// The group's queries (scaled, zero past head_dim) at [head * MAX_HD4 + c] while the positions
// are walked; then, for the merge, the unnormalised outputs at [head * NT + rr * hd4 + c].
shared vec4 qs[GM * NT];
shared float sc[GM * CHUNK];   // scores of the chunk
shared float ms[GM * NT];      // merge: maxima [head][rr]
shared float ls[GM * NT];      // merge: sums [head][rr]

const float NEG_INF = -1.0 / 0.0;

// Elements 4c..4c+3 of the head row starting at element `at` of cache `base`, zero past
// head_dim.
vec4 ld4(uint64_t base, uint64_t at, uint c) {
    uint d = 4u * c;
    if ((p.head_dim & 3u) == 0u) {
        if (p.f16 != 0u) {
            uvec2 u = U2s(base + (at + d) * 2u).v[0];
            return vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y));
        }
        return V4s(base + (at + d) * 4u).v[0];
    }
    vec4 v = vec4(0.0);
    [[unroll]] for (uint i = 0; i < 4; i++) {
        if (d + i < p.head_dim) {
            v[i] = p.f16 != 0u ? unpackHalf2x16(ld_u16(base, at + d + i)).x : ld_f32(base, at + d + i);
        }
    }
    return v;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint g = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint split = gl_WorkGroupID.z;
    if (p.skip_block != 0u && one_slot_block(p.slots, r, p.rows, p.skip_block)) {
        return;
    }
    uint hd = p.head_dim;
    uint hd4 = (hd + 3u) / 4u;
    uint group = p.heads / p.kv_heads;
    uint kv_cols = p.kv_heads * hd;
    uint pos = U32s(p.positions).v[r];
    uint slot = U32s(p.slots).v[r];
    uint lo = (p.window != 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
    uint end = IMAGE_ROWS != 0u ? max(U32s(p.ends).v[r], pos) : pos;
    uint total = end - lo + 1u;
    uint per = (total + p.splits - 1u) / p.splits;
    uint first = min(split * per, total);
    uint n = min(first + per, total) - first;
    uint start = lo + first; // position of index 0 of this split
    uint64_t slot_row = uint64_t(slot) * p.capacity;
    uint64_t head_off = uint64_t(g) * hd;

    uint lane = gl_SubgroupInvocationID;
    uint sgs = gl_SubgroupSize;
    // Value roles: R invocations per 4 dimensions, each taking every R-th position.
    uint R = NT / hd4;
    uint c = tid % hd4;
    uint rr = tid / hd4;
    bool vact = rr < R;

    for (uint h0 = 0; h0 < group; h0 += GM) {
        uint gc = min(uint(GM), group - h0);
        uint hq = g * group + h0; // first query head of this pass
        for (uint i = tid; i < gc * hd4; i += NT) {
            uint gi = i / hd4;
            uint cc = i % hd4;
            uint64_t at = (uint64_t(r) * p.heads + hq + gi) * hd + 4u * cc;
            vec4 v = vec4(0.0);
            [[unroll]] for (uint e = 0; e < 4; e++) {
                if (4u * cc + e < hd) {
                    v[e] = ld_f32(p.q, at + e) * p.scale;
                }
            }
            qs[gi * MAX_HD4 + cc] = v;
        }
        barrier();
        float m[GM];
        float l[GM];
        vec4 acc[GM];
        [[unroll]] for (uint gi = 0; gi < GM; gi++) {
            m[gi] = NEG_INF;
            l[gi] = 0.0;
            acc[gi] = vec4(0.0);
        }
        for (uint base = 0; base < n; base += CHUNK) {
            uint count = min(uint(CHUNK), n - base);
            // Scores: subgroup sg takes positions sg * P .. sg * P + P - 1, then on.
            for (uint j0 = gl_SubgroupID * P; j0 < count; j0 += gl_NumSubgroups * P) {
                float dt[P * GM];
                [[unroll]] for (uint i = 0; i < P * GM; i++) {
                    dt[i] = 0.0;
                }
                uint64_t rows_at[P];
                [[unroll]] for (uint pp = 0; pp < P; pp++) {
                    uint64_t row = slot_row + (start + base + j0 + pp) % p.capacity;
                    rows_at[pp] = row * kv_cols + head_off;
                }
                for (uint c0 = 0; c0 < hd4; c0 += sgs * KPL) {
                    vec4 k[P * KPL];
                    [[unroll]] for (uint pp = 0; pp < P; pp++) {
                        [[unroll]] for (uint i = 0; i < KPL; i++) {
                            uint cc = c0 + lane + sgs * i;
                            k[pp * KPL + i] = vec4(0.0);
                            if (j0 + pp < count && cc < hd4) {
                                k[pp * KPL + i] = ld4(p.kc, rows_at[pp], cc);
                            }
                        }
                    }
                    [[unroll]] for (uint i = 0; i < KPL; i++) {
                        uint cc = c0 + lane + sgs * i;
                        if (cc < hd4) {
                            [[unroll]] for (uint gi = 0; gi < GM; gi++) {
                                if (gi < gc) {
                                    vec4 qv = qs[gi * MAX_HD4 + cc];
                                    [[unroll]] for (uint pp = 0; pp < P; pp++) {
                                        dt[pp * GM + gi] += dot(k[pp * KPL + i], qv);
                                    }
                                }
                            }
                        }
                    }
                }
                [[unroll]] for (uint pp = 0; pp < P; pp++) {
                    [[unroll]] for (uint gi = 0; gi < GM; gi++) {
                        if (gi < gc) {
                            float s = subgroupAdd(dt[pp * GM + gi]);
                            if (lane == 0u && j0 + pp < count) {
                                if (p.softcap != 0.0) {
                                    s = p.softcap * tanh_safe(s / p.softcap);
                                }
                                sc[gi * CHUNK + j0 + pp] = s;
                            }
                        }
                    }
                }
            }
            barrier();
            // Values: this invocation's positions rr, rr + R, ... of the chunk.
            if (vact) {
                float cm[GM];
                [[unroll]] for (uint gi = 0; gi < GM; gi++) {
                    cm[gi] = NEG_INF;
                }
                for (uint j = rr; j < count; j += R) {
                    [[unroll]] for (uint gi = 0; gi < GM; gi++) {
                        if (gi < gc) {
                            cm[gi] = max(cm[gi], sc[gi * CHUNK + j]);
                        }
                    }
                }
                [[unroll]] for (uint gi = 0; gi < GM; gi++) {
                    if (gi < gc) {
                        float nm = max(m[gi], cm[gi]);
                        float a = nm == NEG_INF ? 1.0 : exp(m[gi] - nm);
                        acc[gi] *= a;
                        l[gi] *= a;
                        m[gi] = nm;
                    }
                }
                for (uint j = rr; j < count; j += 4u * R) {
                    vec4 vv[4];
                    [[unroll]] for (uint u = 0; u < 4; u++) {
                        uint jj = j + u * R;
                        vv[u] = vec4(0.0);
                        if (jj < count) {
                            uint64_t row = slot_row + (start + base + jj) % p.capacity;
                            vv[u] = ld4(p.vc, row * kv_cols + head_off, c);
                        }
                    }
                    [[unroll]] for (uint u = 0; u < 4; u++) {
                        uint jj = j + u * R;
                        if (jj < count) {
                            [[unroll]] for (uint gi = 0; gi < GM; gi++) {
                                if (gi < gc) {
                                    float e = exp(sc[gi * CHUNK + jj] - m[gi]);
                                    l[gi] += e;
                                    acc[gi] += e * vv[u];
                                }
                            }
                        }
                    }
                }
            }
            barrier();
        }
        // Merge the R partial states of each dimension.
        if (vact) {
            [[unroll]] for (uint gi = 0; gi < GM; gi++) {
                if (gi < gc) {
                    qs[gi * NT + rr * hd4 + c] = acc[gi];
                    if (c == 0u) {
                        ms[gi * NT + rr] = m[gi];
                        ls[gi * NT + rr] = l[gi];
                    }
                }
            }
        }
        barrier();
        for (uint i = tid; i < gc * hd4; i += NT) {
            uint gi = i / hd4;
            uint cc = i % hd4;
            float mx = NEG_INF;
            for (uint t = 0; t < R; t++) {
                mx = max(mx, ms[gi * NT + t]);
            }
            float sum = 0.0;
            vec4 o = vec4(0.0);
            for (uint t = 0; t < R; t++) {
                float mt = ms[gi * NT + t];
                if (mt != NEG_INF) {
                    float w = exp(mt - mx);
                    sum += w * ls[gi * NT + t];
                    o += w * qs[gi * NT + t * hd4 + cc];
                }
            }
            uint h = hq + gi;
            if (p.splits == 1u) {
                uint64_t at = (uint64_t(r) * p.heads + h) * hd + 4u * cc;
                [[unroll]] for (uint e = 0; e < 4; e++) {
                    if (4u * cc + e < hd) {
                        st_f32(p.dst, at + e, o[e] / sum);
                    }
                }
            } else {
                uint64_t at = (uint64_t(r) * p.heads + h) * p.splits + split;
                [[unroll]] for (uint e = 0; e < 4; e++) {
                    if (4u * cc + e < hd) {
                        st_f32(p.part_o, at * hd + 4u * cc + e, o[e]);
                    }
                }
                if (cc == 0u) {
                    st_f32(p.part_ml, at * 2u, mx);
                    st_f32(p.part_ml, at * 2u + 1u, sum);
                }
            }
        }
        barrier();
    }
}
