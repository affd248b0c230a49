// Op::MatMul: y = x @ W^T with W [n, k] in the variant's weight format, dequantised in registers,
// f32 accumulation. One workgroup per weight row j (output column), covering R input rows
// (workgroup z picks which R); the output column lands in one of up to four split outputs.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint R = 1;

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

shared float partial[R][64];

void main() {
    uint j = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (j >= p.n) {
        return;
    }
    uint tid = gl_LocalInvocationID.x;
    uint r0 = gl_WorkGroupID.z * R;
    uint64_t wrow = p.w + uint64_t(j) * p.row_bytes;
    float acc[R];
    for (uint r = 0; r < R; r++) {
        acc[r] = 0.0;
    }
    uint units = p.k / UNIT;
    for (uint u = tid; u < units; u += 64) {
        float wv[UNIT];
        load_unit(wrow, u, wv);
        for (uint r = 0; r < R; r++) {
            if (r0 + r < p.rows) {
                uint64_t xa = p.x + (uint64_t(r0 + r) * p.k + u * UNIT) * 4;
                float s = 0.0;
#if UNIT == 1
                s = wv[0] * F32s(xa).v[0];
#else
                // A unit's 32 inputs start 128-byte aligned (k is a multiple of 32).
                V4s xr = V4s(xa);
                for (uint i = 0; i < UNIT / 4; i++) {
                    vec4 xv = xr.v[i];
                    s += wv[4 * i] * xv.x + wv[4 * i + 1] * xv.y + wv[4 * i + 2] * xv.z + wv[4 * i + 3] * xv.w;
                }
#endif
                acc[r] += s;
            }
        }
    }
    for (uint r = 0; r < R; r++) {
        float s = subgroupAdd(acc[r]);
        if (subgroupElect()) {
            partial[r][gl_SubgroupID] = s;
        }
    }
    barrier();
    if (tid < R && r0 + tid < p.rows) {
        float t = 0.0;
        for (uint i = 0; i < gl_NumSubgroups; i++) {
            t += partial[tid][i];
        }
        uint row = r0 + tid;
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
