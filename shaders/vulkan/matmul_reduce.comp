// Second half of a split-k matmul_cm2: out[r][j] = sum over the slices s of part[s][r][j], into
// the split output column j lies in (as matmul_cm2 routes its tiles). One invocation per
// element of the rows x n product.
layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform Params {
    uint64_t part;
    uint64_t dst0;
    uint64_t dst1;
    uint64_t dst2;
    uint64_t dst3;
    uint n;
    uint rows;
    uint slices;
    uint end0;
    uint end1;
    uint end2;
} p;

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    uint count = p.rows * p.n;
    if (i >= count) {
        return;
    }
    float t = 0.0;
    for (uint s = 0; s < p.slices; s++) {
        t += ld_f32(p.part, uint64_t(s) * count + i);
    }
    uint r = i / p.n;
    uint j = i % p.n;
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
    st_f32(dst, uint64_t(r) * width + col, t);
}
