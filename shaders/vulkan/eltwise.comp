// Op::Add, Op::GeGlu and Op::Softcap, one invocation per element; workgroups run along x then y
// (dispatches wider than the 65535-group limit).
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

void main() {
    uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64 + gl_LocalInvocationID.x;
    if (i >= p.n) {
        return;
    }
    float x = F32s(p.a).v[i];
    float y;
    if (p.op == 0u) {
        y = x + F32s(p.b).v[i];
    } else if (p.op == 1u) {
        y = gelu_tanh(x) * F32s(p.b).v[i];
    } else {
        y = p.cap * tanh_safe(x / p.cap);
    }
    F32s(p.dst).v[i] = y;
}
