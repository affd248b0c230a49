// Op::MatMul for few input rows (decode): y = x @ W^T, built once per weight format.
//
// One workgroup of 128 invocations per NC consecutive weight rows (output columns) and R
// (specialisation constant 0) input rows. Specialisation constant 1 is NC, plus 256 for the
// subgroup mode, plus 512 U where the host sets U (slots per invocation and loop trip):
// - split mode (block formats, one input row): the 128 invocations split the NC rows' k
//   between them, invocation i decoding "slots" i, i + 128, ... of each row; the sums meet in
//   a subgroupAdd, then across subgroups through shared memory.
// - subgroup mode (float formats, several rows): each subgroup takes NC / 4 rows at a time and
//   splits their k across its lanes; the sums meet in one subgroupAdd.
// A slot is 32 values of a block format or 16 of a float format, read with wide loads (16-byte
// for q4_k and the float formats; 32-bit words for the 2-byte aligned q8_0 / q5_0 blocks,
// shifted into place). A slot's weights are dequantised in registers as w = a * q + b per
// half-slot and applied to all R input rows; each input row's slot of x (vec4 loads,
// L1-resident) is loaded once and applied to all the weight rows in hand, together with its sum
// (for the b terms).
//
// Workgroups enumerate (weight-row block, input-row slice) with the slice fastest, so the
// slices of one weight-row block run side by side and share its weights through the L2.
layout(local_size_x = 128) in;
layout(constant_id = 0) const uint R = 1;
layout(constant_id = 1) const uint MODE = 4;
// Weight rows per workgroup.
const uint NC = MODE & 255u;
const bool SG_ROWS = ((MODE >> 8) & 1u) != 0u;
// Weight rows in hand at a time: NC (split mode), NC / 4 (subgroup mode), at least 1.
const uint NR = SG_ROWS ? (NC >= 8u ? NC / 4u : 1u) : NC;
// Slots per invocation and loop trip: bits 9-11 of MODE where set (1 to 4), else two for one
// input row and at most two weight rows (more loads in flight), else one (the registers go to
// the other rows).
const uint U_SET = (MODE >> 9) & 7u;
const uint U = U_SET != 0u ? U_SET : ((R == 1u && NR <= 2u) ? 2u : 1u);
#define WGS 128u
// Partial sums of each subgroup (at least 4 invocations each).
shared float partial[NR * R][32];

layout(buffer_reference, scalar, buffer_reference_align = 16) buffer U4s { uvec4 v[]; };

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

#if defined(WFMT_F16) || defined(WFMT_BF16) || defined(WFMT_F32)
// 16 values per slot (k % 16 == 0: rows are 32-byte aligned); w = q.
#define SE 16
#define SV 4
#define HAS_B 0
#else
// 32 values per slot: q[0..3] with a.x, b.x, q[4..7] with a.y, b.y.
#define SE 32
#define SV 8
#define HAS_B 1
#endif

// Row index of x for q[i].x of slot t.
uint xpos(uint t, uint i) {
#if defined(WFMT_Q4_K)
    // Slot s = t % 8 of super-block t / 8: 16 bytes of nibbles at 16 + 16 s, low nibbles are
    // values 64 (s / 2) + 16 (s % 2) + 0..15 (sub-block s & ~1), high nibbles 32 further.
    uint s = t & 7u;
    return (t >> 3) * Q4_K_ELEMS + 64u * (s >> 1) + 16u * (s & 1u) + (i < 4u ? 4u * i : 16u + 4u * i);
#else
    return t * SE + 4u * i;
#endif
}

// Funnel of 32-bit words for blocks that are only 2-byte aligned: the word starting 2 bytes
// after word i of a 4-aligned run (mis = 0) or word i + 1 itself (mis = 2).
uint shifted(uint lo, uint hi, uint mis) {
    return mis != 0u ? hi : ((lo >> 16) | (hi << 16));
}

// Integer fields as floats without int-to-float conversions (a quarter-rate instruction on
// NVIDIA, the q4_k kernel's bottleneck): a field f of B bits is moved into the top mantissa
// bits of 1.0, giving 1 + f / 2^B exactly; the kernels fold the scale 2^B and the offset 1
// into a and b. Fields at bits 8i .. of v, i = 0..3.
vec4 nib4(uint v) {
    return uintBitsToFloat(uvec4((v << 19) & 0x00780000u, (v << 11) & 0x00780000u,
                                 (v << 3) & 0x00780000u, (v >> 5) & 0x00780000u) | 0x3F800000u);
}
vec4 five4(uint v) {
    return uintBitsToFloat(uvec4((v << 18) & 0x007C0000u, (v << 10) & 0x007C0000u,
                                 (v << 2) & 0x007C0000u, (v >> 6) & 0x007C0000u) | 0x3F800000u);
}
vec4 byte4(uint v) {
    return uintBitsToFloat(uvec4((v << 15) & 0x007F8000u, (v << 7) & 0x007F8000u,
                                 (v >> 1) & 0x007F8000u, (v >> 9) & 0x007F8000u) | 0x3F800000u);
}

void wslot(uint64_t row, uint t, out vec4 q[SV], out vec2 a, out vec2 b) {
#if defined(WFMT_Q4_K)
#if Q4_K_D != 0 || Q4_K_DMIN != 2 || Q4_K_SCALES != 4 || Q4_K_QS != 16
#error the q4_k header (d, dmin, 12 bytes of scales) is read as the first uvec4 of the block
#endif
    uint64_t blk = row + uint64_t(t >> 3) * Q4_K_BYTES;
    uint s = t & 7u;
    uint c = s >> 1;
    uvec4 h = U4s(blk).v[0];
    uvec4 qs = U4s(blk + Q4_K_QS + 16u * s).v[0];
    vec2 dm = unpackHalf2x16(h.x);
    uint s1, m1, s2, m2;
    q4k_scale_min(h.yzw, 2u * c, s1, m1);
    q4k_scale_min(h.yzw, 2u * c + 1u, s2, m2);
    // d sc q - dmin m with q = 16 (q' - 1).
    a = 16.0 * dm.x * vec2(float(s1), float(s2));
    b = -a - dm.y * vec2(float(m1), float(m2));
    for (uint i = 0; i < 4; i++) {
        q[i] = nib4(qs[i]);
        q[i + 4] = nib4(qs[i] >> 4);
    }
#elif defined(WFMT_Q8_0)
    // 34-byte block: the 9 aligned words covering it (the last may reach 2 bytes past the
    // block, inside the buffer: sizes are rounded up to 4). d is the low or high half of word
    // 0, the int8s start 2 bytes in.
#if Q8_0_D != 0 || Q8_0_QS != 2
#error the q8_0 d and int8s are read at bytes 0 and 2 of the block
#endif
    const uint NW = (2u + Q8_0_BYTES + 3u) / 4u;
    uint64_t a0 = row + uint64_t(t) * Q8_0_BYTES;
    uint mis = uint(a0) & 2u;
    U32s wp = U32s(a0 - mis);
    uint W[NW];
    for (uint i = 0; i < NW; i++) {
        W[i] = wp.v[i];
    }
    float d = unpackHalf2x16(W[0] >> (mis * 8u)).x;
    // d q with q = u - 128, u = q ^ 0x80 = 256 (q' - 1).
    for (uint i = 0; i < 8; i++) {
        q[i] = byte4(shifted(W[i], W[i + 1], mis) ^ 0x80808080u);
    }
    a = vec2(256.0 * d);
    b = vec2(-384.0 * d);
#elif defined(WFMT_Q5_0)
    // 22-byte block: d, qh (bit e: bit 4 of value e), 16 bytes (value j low nibble of byte j,
    // value j + 16 high nibble); value (q - 16) d.
#if Q5_0_D != 0 || Q5_0_QH != 2 || Q5_0_QS != 6
#error the q5_0 d, qh and nibbles are read at bytes 0, 2 and 6 of the block
#endif
    const uint NW = (2u + Q5_0_BYTES + 3u) / 4u;
    uint64_t a0 = row + uint64_t(t) * Q5_0_BYTES;
    uint mis = uint(a0) & 2u;
    U32s wp = U32s(a0 - mis);
    uint W[NW];
    for (uint i = 0; i < NW; i++) {
        W[i] = wp.v[i];
    }
    float d = unpackHalf2x16(W[0] >> (mis * 8u)).x;
    uint qh = shifted(W[0], W[1], mis);
    for (uint m = 0; m < 4; m++) {
        uint v = shifted(W[m + 1], W[m + 2], mis);
        // Four bits of qh spread to bit 4 of four bytes.
        uint hl = ((((qh >> (4u * m)) & 15u) * 0x00204081u) & 0x01010101u) << 4;
        uint hh = ((((qh >> (16u + 4u * m)) & 15u) * 0x00204081u) & 0x01010101u) << 4;
        q[m] = five4((v & 0x0F0F0F0Fu) | hl);
        q[m + 4] = five4(((v >> 4) & 0x0F0F0F0Fu) | hh);
    }
    // d (q - 16) with q = 32 (q' - 1).
    a = vec2(32.0 * d);
    b = vec2(-48.0 * d);
#elif defined(WFMT_F16)
    for (uint h = 0; h < 2; h++) {
        uvec4 v = U4s(row + 32u * t + 16u * h).v[0];
        q[2 * h] = vec4(unpackHalf2x16(v.x), unpackHalf2x16(v.y));
        q[2 * h + 1] = vec4(unpackHalf2x16(v.z), unpackHalf2x16(v.w));
    }
    a = vec2(1.0);
    b = vec2(0.0);
#elif defined(WFMT_BF16)
    for (uint h = 0; h < 2; h++) {
        uvec4 v = U4s(row + 32u * t + 16u * h).v[0];
        q[2 * h] = uintBitsToFloat(uvec4(v.x << 16, v.x & 0xFFFF0000u, v.y << 16, v.y & 0xFFFF0000u));
        q[2 * h + 1] = uintBitsToFloat(uvec4(v.z << 16, v.z & 0xFFFF0000u, v.w << 16, v.w & 0xFFFF0000u));
    }
    a = vec2(1.0);
    b = vec2(0.0);
#elif defined(WFMT_F32)
    for (uint i = 0; i < 4; i++) {
        q[i] = V4s(row + 64u * t + 16u * i).v[0];
    }
    a = vec2(1.0);
    b = vec2(0.0);
#else
    // The other block formats (q4_0, q4_1, q5_1, q6_k): the shared 32-value decoder.
    float w[UNIT];
    load_unit(row, t, w);
    for (uint i = 0; i < 8; i++) {
        q[i] = vec4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    }
    a = vec2(1.0);
    b = vec2(0.0);
#endif
}

void store(uint j, uint row, float v) {
    uint64_t dst;
    uint col;
    uint width;
    if (j < p.end0) {
        dst = p.dst0; col = j; width = p.end0;
    } else if (j < p.end1) {
        dst = p.dst1; col = j - p.end0; width = p.end1 - p.end0;
    } else if (j < p.end2) {
        dst = p.dst2; col = j - p.end1; width = p.end2 - p.end1;
    } else {
        dst = p.dst3; col = j - p.end2; width = p.n - p.end2;
    }
    st_f32(dst, uint64_t(row) * width + col, v);
}

// Input row `row`'s values for slot t, and the sums of its two halves (for the b terms).
void load_x(uint row, uint t, out vec4 xv[SV], out vec2 sx) {
    uint64_t xa = p.x + uint64_t(min(row, p.rows - 1u)) * p.k * 4u;
    for (uint i = 0; i < SV; i++) {
        xv[i] = V4s(xa + xpos(t, i) * 4u).v[0];
    }
#if HAS_B
    vec4 sx0 = vec4(0.0);
    vec4 sx1 = vec4(0.0);
    for (uint i = 0; i < SV / 2; i++) {
        sx0 += xv[i];
        sx1 += xv[i + SV / 2];
    }
    sx = vec2(dot(sx0, vec4(1.0)), dot(sx1, vec4(1.0)));
#else
    sx = vec2(0.0);
#endif
}

// One weight row's slot against one input row's: sum of (a q + b) x over the two halves.
float slot_dot(vec4 q[SV], vec2 a, vec2 b, vec4 xv[SV], vec2 sx) {
    float d0 = 0.0;
    float d1 = 0.0;
    for (uint i = 0; i < SV / 2; i++) {
        d0 += dot(q[i], xv[i]);
        d1 += dot(q[i + SV / 2], xv[i + SV / 2]);
    }
#if HAS_B
    return a.x * d0 + a.y * d1 + dot(b, sx);
#else
    return a.x * d0 + a.y * d1;
#endif
}

void main() {
    uint slices = (p.rows + R - 1u) / R;
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint j0 = (wg / slices) * NC;
    uint r0 = (wg % slices) * R;
    if (j0 >= p.n) {
        return;
    }
    uint tid = gl_LocalInvocationID.x;
    uint T = p.k / SE;
    uint lane = SG_ROWS ? gl_SubgroupInvocationID : tid;
    uint stride = SG_ROWS ? gl_SubgroupSize : WGS;
    uint jb0 = SG_ROWS ? gl_SubgroupID * NR : 0u;
    uint jstep = SG_ROWS ? gl_NumSubgroups * NR : NC;
    // Split mode: one trip, by the whole workgroup (the barrier below is reached uniformly).
    for (uint jb = jb0; jb < NC; jb += jstep) {
        uint64_t wrow[NR];
        for (uint jj = 0; jj < NR; jj++) {
            wrow[jj] = p.w + uint64_t(min(j0 + jb + jj, p.n - 1u)) * p.row_bytes;
        }
        float acc[NR * R];
        for (uint i = 0; i < NR * R; i++) {
            acc[i] = 0.0;
        }
        for (uint t0 = lane; t0 < T; t0 += U * stride) {
            for (uint u = 0; u < U; u++) {
                // A slot past the row's end repeats slot t0 with weight 0 (no divergent loads).
                uint t = t0 + u * stride;
                float live = t < T ? 1.0 : 0.0;
                t = t < T ? t : t0;
                if (R == 1u && !SG_ROWS) {
                    // One input row: its slot of x first, then each weight row's slot decoded and
                    // consumed in turn (fewer registers live than all NR rows' values at once).
                    vec4 xv[SV];
                    vec2 sx;
                    load_x(r0, t, xv, sx);
                    for (uint jj = 0; jj < NR; jj++) {
                        vec4 q[SV];
                        vec2 a;
                        vec2 b;
                        wslot(wrow[jj], t, q, a, b);
                        acc[jj] += live * slot_dot(q, a, b, xv, sx);
                    }
                } else {
                    vec4 q[NR][SV];
                    vec2 a[NR];
                    vec2 b[NR];
                    for (uint jj = 0; jj < NR; jj++) {
                        wslot(wrow[jj], t, q[jj], a[jj], b[jj]);
                        a[jj] *= live;
                        b[jj] *= live;
                    }
                    for (uint r = 0; r < R; r++) {
                        vec4 xv[SV];
                        vec2 sx;
                        load_x(r0 + r, t, xv, sx);
                        for (uint jj = 0; jj < NR; jj++) {
                            acc[jj * R + r] += slot_dot(q[jj], a[jj], b[jj], xv, sx);
                        }
                    }
                }
            }
        }
        if (SG_ROWS) {
            for (uint i = 0; i < NR * R; i++) {
                float s = subgroupAdd(acc[i]);
                uint j = j0 + jb + i / R;
                uint row = r0 + i % R;
                if (lane == i % gl_SubgroupSize && j < p.n && jb + i / R < NC && row < p.rows) {
                    store(j, row, s);
                }
            }
        } else {
            for (uint i = 0; i < NR * R; i++) {
                float s = subgroupAdd(acc[i]);
                if (subgroupElect()) {
                    partial[i][gl_SubgroupID] = s;
                }
            }
            barrier();
            if (tid < NR * R) {
                uint j = j0 + tid / R;
                uint row = r0 + tid % R;
                if (j < p.n && row < p.rows) {
                    float t = 0.0;
                    for (uint i = 0; i < gl_NumSubgroups; i++) {
                        t += partial[tid][i];
                    }
                    store(j, row, t);
                }
            }
        }
    }
}
