// Op::MatMul for many rows: a 64 (input rows) x 64 (weight rows) output tile per workgroup of
// 256 invocations, each computing 4 x 4 outputs; the weight tile is dequantised once per 32-wide
// slice of k into shared memory (one decoding unit per weight row for block formats), so each
// weight is decoded rows / 64 times instead of rows / 8.
layout(local_size_x = 256) in;

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

#define BM 64
#define BN 64
#define BK 32

shared float xs[BK][BM + 1];
shared float ws[BK][BN + 1];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u; // column group
    uint ty = tid / 16u; // row group
    uint n0 = gl_WorkGroupID.x * BN;
    uint m0 = gl_WorkGroupID.y * BM;
    float acc[4][4];
    for (uint i = 0; i < 4; i++) {
        for (uint j = 0; j < 4; j++) {
            acc[i][j] = 0.0;
        }
    }
    for (uint k0 = 0; k0 < p.k; k0 += BK) {
        // Input tile: BM x BK floats, 8 per invocation, zero past the edges.
        for (uint e = tid; e < BM * BK; e += 256) {
            uint r = e / BK;
            uint c = e % BK;
            float v = 0.0;
            if (m0 + r < p.rows && k0 + c < p.k) {
                v = ld_f32(p.x, uint64_t(m0 + r) * p.k + k0 + c);
            }
            xs[c][r] = v;
        }
#if UNIT == 1
        for (uint e = tid; e < BN * BK; e += 256) {
            uint r = e / BK;
            uint c = e % BK;
            float v = 0.0;
            if (n0 + r < p.n && k0 + c < p.k) {
                v = wload(p.w + uint64_t(n0 + r) * p.row_bytes, k0 + c);
            }
            ws[c][r] = v;
        }
#else
        if (tid < BN) {
            float wv[UNIT];
            if (n0 + tid < p.n) {
                load_unit(p.w + uint64_t(n0 + tid) * p.row_bytes, k0 / UNIT, wv);
            } else {
                for (uint i = 0; i < UNIT; i++) {
                    wv[i] = 0.0;
                }
            }
            for (uint i = 0; i < UNIT; i++) {
                ws[i][tid] = wv[i];
            }
        }
#endif
        barrier();
        for (uint kk = 0; kk < BK; kk++) {
            float a[4];
            float b[4];
            for (uint i = 0; i < 4; i++) {
                a[i] = xs[kk][ty * 4 + i];
                b[i] = ws[kk][tx * 4 + i];
            }
            for (uint i = 0; i < 4; i++) {
                for (uint j = 0; j < 4; j++) {
                    acc[i][j] += a[i] * b[j];
                }
            }
        }
        barrier();
    }
    for (uint i = 0; i < 4; i++) {
        uint row = m0 + ty * 4 + i;
        if (row >= p.rows) {
            continue;
        }
        for (uint jj = 0; jj < 4; jj++) {
            uint j = n0 + tx * 4 + jj;
            if (j >= p.n) {
                continue;
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
            st_f32(dst, uint64_t(row) * width + col, acc[i][jj]);
        }
    }
}
