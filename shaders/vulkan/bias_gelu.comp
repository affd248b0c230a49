// The vision tower's element-wise ops, one invocation per element (workgroups along x then y,
// as eltwise's): op 0 Op::Bias (y = x + b[i % cols], b in f32, f16 or bf16), op 1 Op::Gelu
// (y = gelu_tanh(x)).
layout(local_size_x = 64) in;

layout(push_constant, scalar) uniform Params {
    uint64_t x;
    uint64_t b;
    uint64_t dst;
    uint n;
    uint cols;
    uint op;   // 0: bias, 1: gelu
    uint bfmt; // the bias: 0 f32, 1 f16, 2 bf16
} p;

float bias(uint i) {
    if (p.bfmt == 0u) {
        return F32s(p.b).v[i];
    } else if (p.bfmt == 1u) {
        return unpackHalf2x16(uint(U16s(p.b).v[i])).x;
    }
    return uintBitsToFloat(uint(U16s(p.b).v[i]) << 16);
}

void main() {
    uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64 + gl_LocalInvocationID.x;
    if (i >= p.n) {
        return;
    }
    float x = F32s(p.x).v[i];
    float y;
    if (p.op == 0u) {
        y = x + bias(i % p.cols);
    } else {
        y = 0.5 * x * (1.0 + tanh_safe(0.7978846 * (x + 0.044715 * x * x * x)));
    }
    F32s(p.dst).v[i] = y;
}
