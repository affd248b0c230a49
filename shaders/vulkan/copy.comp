// A plain copy of n vec4s, for measuring the memory bandwidth kernels can reach.
layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform Params {
    uint64_t src;
    uint64_t dst;
    uint n;
} p;

void main() {
    uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256 + gl_LocalInvocationID.x;
    if (i < p.n) {
        V4s(p.dst).v[i] = V4s(p.src).v[i];
    }
}
