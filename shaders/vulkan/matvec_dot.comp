// Op::MatMul on block-format weights for a few rows (decode, batched decode) through integer
// dot products: the input was quantised beforehand to blocks of 32 integers with a scale
// (`quantize_q8`: int8, or 16 bits as two byte planes where WIDE), and each 32-element unit of a weight row is unpacked to 32 int8 values (the
// format's codes, 0 .. 63 or -128 .. 127) with two scales and two offsets, one per 16 elements:
//   sum_i w_i x_i = d8 (dw0 sum_{i<16} q_i x8_i + dw1 sum_{i>=16} q_i x8_i) + mw0 sa + mw1 sb,
// where sa and sb are d8 times the sums of the input's codes over each half (so an offset
// like q4_0's -8, or q4_k's min, costs no per-element work). The 4-element dot products are
// SPIR-V's OpSDot on packed 8-bit vectors (SPV_KHR_integer_dot_product), named through
// GL_EXT_spirv_intrinsics.
//
// One workgroup of 64 covers NC (a specialisation constant) weight rows (output columns) j0 ..
// j0 + NC and R input rows; its invocations take every 64th unit of k, decode it for each of
// the NC rows once, and dot it with each of the R input rows' blocks.
#extension GL_EXT_spirv_intrinsics : require

spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4(uint a, uint b, spirv_literal uint packed_format);
// OpSUDot: a signed, b unsigned.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot4(uint a, uint b, spirv_literal uint packed_format);

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint R = 1;
// NC in the low 16 bits; bit 16: WIDE, the input's 16-bit form (`quantize_q8`: q = 256 hi +
// lo, two planes, each dotted: sum q x = 256 sum q hi + sum q lo).
layout(constant_id = 1) const uint SPEC1 = 4;
const uint NC = SPEC1 & 0xFFFFu;
const bool WIDE = (SPEC1 >> 16) != 0u;

layout(push_constant, scalar) uniform Params {
    uint64_t w;
    uint64_t x; // the quantised input: rows x k / 32 blocks
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

layout(buffer_reference, scalar, buffer_reference_align = 16) buffer U4s { uvec4 v[]; };

// 32 bits from a 2-byte aligned address.
uint w32(uint64_t b, uint off) { return ld16(b, off) | (ld16(b, off + 2u) << 16); }

// Bits 0..3 of t to bit 4 of bytes 0..3.
uint spread4(uint t) {
    return ((t & 1u) << 4) | ((t & 2u) << 11) | ((t & 4u) << 18) | ((t & 8u) << 25);
}

// Unit u (elements 32u .. 32u + 31) of the weight row at `row`: codes (elements 4i .. 4i + 3 in
// word i) and c = (dw0, dw1, mw0, mw1).
void unpack_unit(uint64_t row, uint u, out uint q[8], out vec4 c) {
#if defined(WFMT_Q4_0) || defined(WFMT_Q4_1)
    // d [, m], 16 bytes: element j low nibble of byte j, j + 16 its high nibble.
#if defined(WFMT_Q4_0)
    uint64_t b = row + uint64_t(u) * Q4_0_BYTES;
    const uint qs = Q4_0_QS;
    float d = f16_at(b, Q4_0_D);
    float m = -8.0 * d;
#else
    uint64_t b = row + uint64_t(u) * Q4_1_BYTES;
    const uint qs = Q4_1_QS;
    float d = f16_at(b, Q4_1_D);
    float m = f16_at(b, Q4_1_M);
#endif
    for (uint i = 0; i < 4; i++) {
        uint v = w32(b, qs + 4u * i);
        q[i] = v & 0x0F0F0F0Fu;
        q[i + 4] = (v >> 4) & 0x0F0F0F0Fu;
    }
    c = vec4(d, d, m, m);
#elif defined(WFMT_Q5_0) || defined(WFMT_Q5_1)
    // d [, m], qh (bit j: bit 4 of element j), 16 bytes as q4_0.
#if defined(WFMT_Q5_0)
    uint64_t b = row + uint64_t(u) * Q5_0_BYTES;
    const uint qh_at = Q5_0_QH;
    const uint qs = Q5_0_QS;
    float d = f16_at(b, Q5_0_D);
    float m = -16.0 * d;
#else
    uint64_t b = row + uint64_t(u) * Q5_1_BYTES;
    const uint qh_at = Q5_1_QH;
    const uint qs = Q5_1_QS;
    float d = f16_at(b, Q5_1_D);
    float m = f16_at(b, Q5_1_M);
#endif
    uint qh = w32(b, qh_at);
    for (uint i = 0; i < 4; i++) {
        uint v = w32(b, qs + 4u * i);
        q[i] = (v & 0x0F0F0F0Fu) | spread4(qh >> (4u * i));
        q[i + 4] = ((v >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16u + 4u * i));
    }
    c = vec4(d, d, m, m);
#elif defined(WFMT_Q8_0)
    // d, 32 int8.
    uint64_t b = row + uint64_t(u) * Q8_0_BYTES;
    float d = f16_at(b, Q8_0_D);
    for (uint i = 0; i < 8; i++) {
        q[i] = w32(b, Q8_0_QS + 4u * i);
    }
    c = vec4(d, d, 0.0, 0.0);
#elif defined(WFMT_Q4_K)
    // Sub-block s = u % 8 of super-block u / 8: d scale q - dmin min.
    uint64_t b = row + uint64_t(u >> 3) * Q4_K_BYTES;
    uint s = u & 7u;
    // d and dmin in one word (dmin follows d).
    vec2 dm = unpackHalf2x16(ld32(b, Q4_K_D));
    uvec3 sc = uvec3(ld32(b, Q4_K_SCALES), ld32(b, Q4_K_SCALES + 4), ld32(b, Q4_K_SCALES + 8));
    uint scale, mn;
    q4k_scale_min(sc, s, scale, mn);
    uint qoff = Q4_K_QS + 32u * (s >> 1);
    uint shift = (s & 1u) * 4u;
    for (uint i = 0; i < 8; i++) {
        q[i] = (ld32(b, qoff + 4u * i) >> shift) & 0x0F0F0F0Fu;
    }
    float d1 = dm.x * float(scale);
    float m1 = -dm.y * float(mn);
    c = vec4(d1, d1, m1, m1);
#elif defined(WFMT_Q6_K)
    // 32 elements s = u % 4 of half h = (u / 4) % 2 of super-block u / 8; codes 0 .. 63, value
    // d scale (q - 32), one int8 scale per 16 elements.
    uint64_t b = row + uint64_t(u >> 3) * Q6_K_BYTES;
    uint h = (u >> 2) & 1u;
    uint s = u & 3u;
    float d = f16_at(b, Q6_K_D);
    uint qloff = 64u * h + 32u * (s & 1u); // + Q6_K_QL, which is 0 (common.glsl checks it)
    uint lshift = (s >> 1) * 4u;
    uint qhoff = Q6_K_QH + 32u * h;
    uint hshift = 2u * s;
    uint scs = ld16(b, Q6_K_SCALES + 8u * h + 2u * s);
    for (uint i = 0; i < 8; i++) {
        uint lo = (w32(b, qloff + 4u * i) >> lshift) & 0x0F0F0F0Fu;
        uint hi = (w32(b, qhoff + 4u * i) >> hshift) & 0x03030303u;
        q[i] = lo | (hi << 4);
    }
    float ds0 = d * sext8(scs);
    float ds1 = d * sext8(scs >> 8);
    c = vec4(ds0, ds1, -32.0 * ds0, -32.0 * ds1);
#endif
}

shared float partial[NC * R][64];

void main() {
    uint j0 = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * NC;
    if (j0 >= p.n) {
        return;
    }
    uint tid = gl_LocalInvocationID.x;
    uint r0 = gl_WorkGroupID.z * R;
    uint units = p.k / 32u;
    float acc[NC * R];
    for (uint i = 0; i < NC * R; i++) {
        acc[i] = 0.0;
    }
    for (uint u = tid; u < units; u += 64u) {
        uint q[NC * 8];
        vec4 c[NC];
        for (uint jj = 0; jj < NC; jj++) {
            uint j = min(j0 + jj, p.n - 1u);
            uint qj[8];
            unpack_unit(p.w + uint64_t(j) * p.row_bytes, u, qj, c[jj]);
            for (uint i = 0; i < 8; i++) {
                q[jj * 8 + i] = qj[i];
            }
        }
        for (uint r = 0; r < R; r++) {
            uint row = min(r0 + r, p.rows - 1u);
            uint64_t at = p.x + (uint64_t(row) * units + u) * (WIDE ? 80u : 48u);
            uvec4 h0 = U4s(at).v[0];
            uvec4 h1 = U4s(at).v[1];
            vec4 m = V4s(at + (WIDE ? 64u : 32u)).v[0];
            uvec4 l0 = uvec4(0);
            uvec4 l1 = uvec4(0);
            if (WIDE) {
                l0 = U4s(at).v[2];
                l1 = U4s(at).v[3];
            }
            for (uint jj = 0; jj < NC; jj++) {
                uint o = jj * 8;
                int ia = sdot4(q[o], h0.x, 0) + sdot4(q[o + 1], h0.y, 0) + sdot4(q[o + 2], h0.z, 0)
                    + sdot4(q[o + 3], h0.w, 0);
                int ib = sdot4(q[o + 4], h1.x, 0) + sdot4(q[o + 5], h1.y, 0) + sdot4(q[o + 6], h1.z, 0)
                    + sdot4(q[o + 7], h1.w, 0);
                if (WIDE) {
                    ia = 256 * ia + sudot4(q[o], l0.x, 0) + sudot4(q[o + 1], l0.y, 0)
                        + sudot4(q[o + 2], l0.z, 0) + sudot4(q[o + 3], l0.w, 0);
                    ib = 256 * ib + sudot4(q[o + 4], l1.x, 0) + sudot4(q[o + 5], l1.y, 0)
                        + sudot4(q[o + 6], l1.z, 0) + sudot4(q[o + 7], l1.w, 0);
                }
                vec4 cj = c[jj];
                acc[jj * R + r] += m.x * (cj.x * float(ia) + cj.y * float(ib)) + cj.z * m.y + cj.w * m.z;
            }
        }
    }
    for (uint i = 0; i < NC * R; i++) {
        float s = subgroupAdd(acc[i]);
        if (subgroupElect()) {
            partial[i][gl_SubgroupID] = s;
        }
    }
    barrier();
    if (tid < NC * R) {
        uint jj = tid / R;
        uint row = r0 + tid % R;
        uint j = j0 + jj;
        if (row < p.rows && j < p.n) {
            float t = 0.0;
            for (uint i = 0; i < gl_NumSubgroups; i++) {
                t += partial[tid][i];
            }
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
            st_f32(dst, uint64_t(row) * width + col, t);
        }
    }
}
