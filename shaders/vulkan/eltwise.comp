// Op::Add, Op::GeGlu and Op::Softcap, four consecutive elements per invocation (one 16-byte load
// of each input and one store where the three addresses are 16-byte aligned, else one element
// at a time); workgroups run along x then y (dispatches wider than the 65535-group limit).
// H200, 4B q4_k prefill 512: one element per invocation took 2.15 ms of geglu a step, some
// 1 TB/s; the vectors read and write at the copy rate.
layout(local_size_x = 64) in;

layout(push_constant, scalar) uniform Params {
    uint64_t a;
    uint64_t b;
    uint64_t dst;
    uint n;
    uint op; // 0: add, 1: geglu, 2: softcap
    float cap;
} p;

float gelu_tanh(float x) {
    return 0.5 * x * (1.0 + tanh_safe(0.7978846 * (x + 0.044715 * x * x * x)));
}

float apply(float x, float y) {
    if (p.op == 0u) {
        return x + y;
    } else if (p.op == 1u) {
        return gelu_tanh(x) * y;
    }
    return p.cap * tanh_safe(x / p.cap);
}

void main() {
    uint i = ((gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64 + gl_LocalInvocationID.x) * 4;
    if (i >= p.n) {
        return;
    }
    bool aligned = ((p.a | p.b | p.dst) & 15ul) == 0ul;
    if (aligned && i + 4u <= p.n) {
        vec4 x = V4s(p.a).v[i / 4u];
        vec4 y = p.op == 2u ? x : V4s(p.b).v[i / 4u];
        V4s(p.dst).v[i / 4u] = vec4(apply(x.x, y.x), apply(x.y, y.y), apply(x.z, y.z), apply(x.w, y.w));
        return;
    }
    for (uint j = i; j < min(i + 4u, p.n); j++) {
        float x = F32s(p.a).v[j];
        float y = p.op == 2u ? x : F32s(p.b).v[j];
        F32s(p.dst).v[j] = apply(x, y);
    }
}
