// An n x k weight of the build's format to f16 (clamped to f16's finite range), row-major, one
// unit (32 values of the block formats, 1 of the float ones) per invocation: `matmul_cm2`'s
// weights, dequantised once per matmul so that its tiles load plain f16.
layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform Params {
    uint64_t w;
    uint64_t dst;
    uint k;
    uint n;
    uint row_bytes;
} p;

layout(buffer_reference, scalar, buffer_reference_align = 16) buffer U4x { uvec4 v[]; };

void main() {
    uint units = p.k / UNIT;
    uint idx = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256 + gl_LocalInvocationID.x;
    if (idx >= units * p.n) {
        return;
    }
    uint r = idx / units;
    uint u = idx - r * units;
    float w[UNIT];
    load_unit(p.w + uint64_t(r) * p.row_bytes, u, w);
    uint64_t at = uint64_t(r) * p.k + u * UNIT;
#if UNIT == 1
    st_u16(p.dst, at, packHalf2x16(vec2(clamp(w[0], -65504.0, 65504.0), 0.0)) & 0xFFFFu);
#else
    // Eight values per 16-byte store (at is a multiple of 32, so 64-byte aligned; the scratch is
    // 256-byte aligned): 4 stores an invocation rather than 16 of 4 bytes.
    for (uint i = 0; i < UNIT / 8; i++) {
        uvec4 h;
        for (uint j = 0; j < 4; j++) {
            vec2 v = clamp(vec2(w[8 * i + 2 * j], w[8 * i + 2 * j + 1]), -65504.0, 65504.0);
            h[j] = packHalf2x16(v);
        }
        U4x(p.dst + at * 2).v[i] = h;
    }
#endif
}
