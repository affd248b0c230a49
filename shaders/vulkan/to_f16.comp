// n f32 values to f16 (clamped to f16's finite range), 4 per invocation: `matmul_cm2`'s input,
// converted once per matmul rather than element by element in every workgroup's loads.
layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform Params {
    uint64_t src;
    uint64_t dst;
    uint n;
} p;

void main() {
    uint i = ((gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256 + gl_LocalInvocationID.x) * 4;
    for (uint j = i; j < min(i + 4, p.n); j++) {
        float v = clamp(ld_f32(p.src, j), -65504.0, 65504.0);
        st_u16(p.dst, j, packHalf2x16(vec2(v, 0.0)) & 0xFFFFu);
    }
}
