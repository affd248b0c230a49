// Op::MatMul on q4_k weights for several rows (batched decode; matvec.comp takes one row): one
// workgroup per NC (a specialisation constant) weight rows (output columns) j0 .. j0 + NC,
// covering R input rows. Each half of the workgroup takes every other
// 256-element block; within a block, 32 invocations read the 128 bytes of nibbles as 32
// consecutive words (coalesced), invocation `lane` decoding bytes 4 (lane % 8) .. + 4 of the
// 64-element chunk lane / 8: four elements of sub-block 2c (low nibbles) and four of sub-block
// 2c + 1 (high nibbles). The two vec4s of x each invocation needs are loaded once per block and
// used for all NC weight rows.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint R = 1;
layout(constant_id = 1) const uint NC = 4;

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

shared float partial[NC * R][64];

void main() {
    uint j0 = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * NC;
    if (j0 >= p.n) {
        return;
    }
    uint tid = gl_LocalInvocationID.x;
    uint lane = tid & 31u;
    uint half_wg = tid >> 5;
    uint c = lane >> 3;
    uint l = (lane & 7u) * 4u;
    uint r0 = gl_WorkGroupID.z * R;
    float acc[NC * R];
    for (uint i = 0; i < NC * R; i++) {
        acc[i] = 0.0;
    }
    uint blocks = p.k / Q4_K_ELEMS;
    for (uint b = half_wg; b < blocks; b += 2u) {
        vec4 x0[R];
        vec4 x1[R];
        for (uint r = 0; r < R; r++) {
            uint row = min(r0 + r, p.rows - 1u);
            uint64_t xa = p.x + (uint64_t(row) * p.k + b * Q4_K_ELEMS + 64u * c + l) * 4u;
            x0[r] = V4s(xa).v[0];
            x1[r] = V4s(xa + 128u).v[0];
        }
        for (uint jj = 0; jj < NC; jj++) {
            uint j = min(j0 + jj, p.n - 1u);
            uint64_t blk = p.w + uint64_t(j) * p.row_bytes + uint64_t(b) * Q4_K_BYTES;
            // d and dmin in one word (dmin follows d).
            vec2 dm = unpackHalf2x16(ld32(blk, Q4_K_D));
            uvec3 sc = uvec3(ld32(blk, Q4_K_SCALES), ld32(blk, Q4_K_SCALES + 4), ld32(blk, Q4_K_SCALES + 8));
            uint s1, m1, s2, m2;
            q4k_scale_min(sc, 2u * c, s1, m1);
            q4k_scale_min(sc, 2u * c + 1u, s2, m2);
            uint q = ld32(blk, Q4_K_QS + 32u * c + l);
            vec4 lo = vec4(float(q & 15u), float((q >> 8) & 15u), float((q >> 16) & 15u), float((q >> 24) & 15u));
            vec4 hi = vec4(float((q >> 4) & 15u), float((q >> 12) & 15u), float((q >> 20) & 15u), float(q >> 28));
            vec4 wlo = (dm.x * float(s1)) * lo - dm.y * float(m1);
            vec4 whi = (dm.x * float(s2)) * hi - dm.y * float(m2);
            for (uint r = 0; r < R; r++) {
                acc[jj * R + r] += dot(wlo, x0[r]) + dot(whi, x1[r]);
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
