// Op::LayerNorm: one workgroup of 256 per row, y = (x - mean) / sqrt(var + eps) * w + b with the
// biased variance, both in f32: the mean first, then the squares of the deviations from it (a
// second pass over the row, not sum(x^2) - mean^2, which cancels).
layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform Params {
    uint64_t x;
    uint64_t w;
    uint64_t b;
    uint64_t dst;
    uint cols;
    float eps;
    uint wfmt; // the weight: 0 f32, 1 f16, 2 bf16
    uint bfmt; // the bias, likewise
} p;

shared float partial[256];

float param(uint64_t at, uint fmt, uint i) {
    if (fmt == 0u) {
        return F32s(at).v[i];
    } else if (fmt == 1u) {
        return unpackHalf2x16(uint(U16s(at).v[i])).x;
    }
    return uintBitsToFloat(uint(U16s(at).v[i]) << 16);
}

// The sum of v over the workgroup (every invocation gets it).
float wg_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) {
        partial[gl_SubgroupID] = v;
    }
    barrier();
    float total = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        total += partial[i];
    }
    barrier();
    return total;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint64_t base = uint64_t(gl_WorkGroupID.y) * p.cols;
    F32s xs = F32s(p.x + base * 4);
    F32s ys = F32s(p.dst + base * 4);
    float s = 0.0;
    for (uint i = tid; i < p.cols; i += 256) {
        s += xs.v[i];
    }
    float mean = wg_sum(s) / float(p.cols);
    float d2 = 0.0;
    for (uint i = tid; i < p.cols; i += 256) {
        float d = xs.v[i] - mean;
        d2 += d * d;
    }
    float inv = 1.0 / sqrt(wg_sum(d2) / float(p.cols) + p.eps);
    for (uint i = tid; i < p.cols; i += 256) {
        ys.v[i] = (xs.v[i] - mean) * inv * param(p.w, p.wfmt, i) + param(p.b, p.bfmt, i);
    }
}
