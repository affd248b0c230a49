// Op::MatMul on q4_k weights for one input row (decode): y = x @ W^T.
//
// A workgroup of 32 W invocations (W = gl_WorkGroupSize.x / 32, specialisation constant 1 is the
// workgroup size) covers 4 NR consecutive weight rows (NR: specialisation constant 0, 1 to 4).
// Invocation tid = 32 bg + 8 rs + piece:
// - piece (0..7) owns 16 bytes of a block's 128 bytes of nibbles, read as one uvec4: bytes
//   16 piece .. + 16 are chunk c = piece / 2, half h = piece % 2, whose low nibbles are values
//   64 c + 16 h + 0..15 (sub-block 2c) and high nibbles the 16 values 32 further (sub-block
//   2c + 1). It decodes only those two sub-blocks' scales and mins from the block's 16-byte
//   header (one uvec4, the same for the 8 pieces).
// - rs (0..3): the lane group's row set, rows j0 + NR rs + 0 .. NR - 1, all decoded against the
//   same 32 values of x (held in registers, loaded once per block as 8 vec4s).
// - bg (0..W-1): blocks bg, bg + W, ... of the rows. The 4 groups of one bg (a subgroup of 32
//   on NVIDIA) read the same x and the same block index of 4 NR rows.
// Sums meet through shared memory (no assumption on the subgroup size): over the W block
// groups, then over the 8 pieces.
layout(local_size_x_id = 1) in;
layout(constant_id = 0) const uint NR = 1;

layout(buffer_reference, scalar, buffer_reference_align = 16) buffer U4s { uvec4 v[]; };

#if Q4_K_D != 0 || Q4_K_DMIN != 2 || Q4_K_SCALES != 4 || Q4_K_QS != 16
#error the q4_k header (d, dmin, 12 bytes of scales) is read as the first uvec4 of the block
#endif

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

// At most 256 invocations and NR = 4.
shared float part[4 * 256];
shared float part2[4 * 32];

// Nibble fields as floats without int-to-float conversions: field q moved to the top mantissa
// bits of 1.0 gives 1 + q / 16 exactly. Low nibbles of the 4 bytes of v, then high nibbles.
vec4 nib_lo(uint v) {
    return uintBitsToFloat(uvec4((v << 19) & 0x00780000u, (v << 11) & 0x00780000u,
                                 (v << 3) & 0x00780000u, (v >> 5) & 0x00780000u) | 0x3F800000u);
}
vec4 nib_hi(uint v) {
    return uintBitsToFloat(uvec4((v << 15) & 0x00780000u, (v << 7) & 0x00780000u,
                                 (v >> 1) & 0x00780000u, (v >> 9) & 0x00780000u) | 0x3F800000u);
}

void store(uint j, float v) {
    uint64_t dst;
    uint col;
    if (j < p.end0) {
        dst = p.dst0; col = j;
    } else if (j < p.end1) {
        dst = p.dst1; col = j - p.end0;
    } else if (j < p.end2) {
        dst = p.dst2; col = j - p.end1;
    } else {
        dst = p.dst3; col = j - p.end2;
    }
    st_f32(dst, col, v);
}

void main() {
    const uint WGS = gl_WorkGroupSize.x;
    const uint W = WGS / 32u;
    uint j0 = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * (4u * NR);
    if (j0 >= p.n) {
        return;
    }
    uint tid = gl_LocalInvocationID.x;
    uint piece = tid & 7u;
    uint rs = (tid >> 3) & 3u;
    uint bg = tid >> 5;
    uint c = piece >> 1;
    // Scales of sub-blocks 2c, 2c + 1: bytes 2c, 2c + 1 of the 12 (c < 2), else split over
    // bytes 2c + 4, 2c + 5 (low 4 bits) and 2c - 4, 2c - 3 (top 2 bits); likewise the mins.
    uint sh = 16u * (c & 1u);
    bool upper = c >= 2u;
    // This invocation's first vec4 of x within a block (low nibbles; high: 8 vec4s further).
    uint xoff = 16u * c + 4u * (piece & 1u);
    uint qoff = Q4_K_QS + 16u * piece;

    uint64_t wrow[NR];
    float acc[NR];
    for (uint jj = 0; jj < NR; jj++) {
        wrow[jj] = p.w + uint64_t(min(j0 + NR * rs + jj, p.n - 1u)) * p.row_bytes;
        acc[jj] = 0.0;
    }
    uint blocks = p.k / Q4_K_ELEMS;
    V4s xs = V4s(p.x);
    for (uint b = bg; b < blocks; b += W) {
        uvec4 hd[NR];
        uvec4 qs[NR];
        for (uint jj = 0; jj < NR; jj++) {
            uint64_t blk = wrow[jj] + uint64_t(b) * Q4_K_BYTES;
            hd[jj] = U4s(blk).v[0];
            qs[jj] = U4s(blk + qoff).v[0];
        }
        vec4 xl[4];
        vec4 xh[4];
        uint xi = (Q4_K_ELEMS / 4u) * b + xoff;
        for (uint i = 0; i < 4; i++) {
            xl[i] = xs.v[xi + i];
            xh[i] = xs.v[xi + 8u + i];
        }
        float sxl = dot(xl[0] + xl[1] + xl[2] + xl[3], vec4(1.0));
        float sxh = dot(xh[0] + xh[1] + xh[2] + xh[3], vec4(1.0));
        for (uint jj = 0; jj < NR; jj++) {
            uvec4 h = hd[jj];
            vec2 dm = unpackHalf2x16(h.x);
            uint a = h.y >> sh;
            uint z = h.z >> sh;
            uint u = h.w >> sh;
            uint sc = upper ? ((u & 0x0F0Fu) | ((a >> 2) & 0x3030u)) : (a & 0x3F3Fu);
            uint mn = upper ? (((u >> 4) & 0x0F0Fu) | ((z >> 2) & 0x3030u)) : (z & 0x3F3Fu);
            // Value d sc q - dmin m with q = 16 (f - 1), f the nibble float.
            vec2 a16 = 16.0 * dm.x * vec2(float(sc & 0xFFu), float(sc >> 8));
            vec2 off = a16 + dm.y * vec2(float(mn & 0xFFu), float(mn >> 8));
            float dl = 0.0;
            float dh = 0.0;
            for (uint i = 0; i < 4; i++) {
                dl += dot(nib_lo(qs[jj][i]), xl[i]);
                dh += dot(nib_hi(qs[jj][i]), xh[i]);
            }
            acc[jj] += a16.x * dl + a16.y * dh - off.x * sxl - off.y * sxh;
        }
    }

    // Over the block groups: part2[32 jj + 8 rs + piece].
    for (uint jj = 0; jj < NR; jj++) {
        part[jj * WGS + tid] = acc[jj];
    }
    barrier();
    for (uint o = tid; o < 32u * NR; o += WGS) {
        uint jj = o >> 5;
        float s = 0.0;
        for (uint g = 0; g < W; g++) {
            s += part[jj * WGS + 32u * g + (o & 31u)];
        }
        part2[o] = s;
    }
    barrier();
    // Over the pieces: output o = NR rs + jj.
    if (tid < 4u * NR) {
        uint r = tid / NR;
        uint jj = tid % NR;
        uint j = j0 + tid;
        if (j < p.n) {
            float s = 0.0;
            for (uint q = 0; q < 8u; q++) {
                s += part2[32u * jj + 8u * r + q];
            }
            store(j, s);
        }
    }
}
