// The vision tower's element-wise ops (workgroups along x then y, as eltwise's): op 0 Op::Bias
// (y = x + b[i % cols], b in f32, f16 or bf16), op 1 Op::Gelu (y = gelu_tanh(x)). With VEC
// (specialisation constant 0; the host sets it where n and cols are multiples of 4 and x and
// dst are 16-byte aligned) one invocation takes 4 consecutive elements with vec4 loads and
// stores; else one element.
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint VEC = 0;

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

float apply(float x, uint i) {
    if (p.op == 0u) {
        return x + bias(i % p.cols);
    }
    return 0.5 * x * (1.0 + tanh_safe(0.7978846 * (x + 0.044715 * x * x * x)));
}

void main() {
    uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64 + gl_LocalInvocationID.x;
    if (VEC != 0u) {
        if (4u * i >= p.n) {
            return;
        }
        vec4 x = V4s(p.x).v[i];
        vec4 y;
        [[unroll]] for (uint j = 0; j < 4; j++) {
            y[j] = apply(x[j], 4u * i + j);
        }
        V4s(p.dst).v[i] = y;
        return;
    }
    if (i >= p.n) {
        return;
    }
    F32s(p.dst).v[i] = apply(F32s(p.x).v[i], i);
}
