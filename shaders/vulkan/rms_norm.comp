// Op::RmsNorm over groups of `group` columns: one workgroup of 256 per (group, row).
layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform Params {
    uint64_t x;
    uint64_t w;
    uint64_t dst;
    uint cols;
    uint group;
    float eps;
    float offset;
    uint wfmt; // 0: f32, 1: f16, 2: bf16
} p;

shared float partial[256];

float weight(uint i) {
    if (p.wfmt == 0u) {
        return F32s(p.w).v[i];
    } else if (p.wfmt == 1u) {
        return unpackHalf2x16(uint(U16s(p.w).v[i])).x;
    }
    return uintBitsToFloat(uint(U16s(p.w).v[i]) << 16);
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint64_t base = uint64_t(gl_WorkGroupID.y) * p.cols + uint64_t(gl_WorkGroupID.x) * p.group;
    F32s xs = F32s(p.x + base * 4);
    F32s ys = F32s(p.dst + base * 4);
    float s = 0.0;
    for (uint i = tid; i < p.group; i += 256) {
        float v = xs.v[i];
        s += v * v;
    }
    s = subgroupAdd(s);
    if (subgroupElect()) {
        partial[gl_SubgroupID] = s;
    }
    barrier();
    float total = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        total += partial[i];
    }
    float inv = 1.0 / sqrt(total / float(p.group) + p.eps);
    for (uint i = tid; i < p.group; i += 256) {
        ys.v[i] = xs.v[i] * inv * (p.offset + weight(i));
    }
}
