// The input of `matvec_dot_<fmt>`: `rows` x `k` f32 values (k a multiple of 32) to blocks of 32
// integers, one invocation per block, blocks row after row.
// - WIDE = 0: q = round(x / d) with d = max |x| / 127, stored as 8 words of int8 (elements
//   4i .. 4i + 3 in word i, the lowest byte first), then (d, d * sum of q over elements 0..15,
//   d * sum of q over 16..31, 0): 48 bytes per block.
// - WIDE = 1: q = round(x / d) with d = max |x| / 32767, stored as two byte planes, q = 256 hi +
//   lo (hi signed, lo unsigned): 8 words of hi, 8 words of lo, then the same vec4: 80 bytes.
//   As exact as 16-bit activations (the CPU backend's), at twice the dot products.
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint WIDE = 1;

layout(push_constant, scalar) uniform Params {
    uint64_t src;
    uint64_t dst;
    uint blocks; // rows * k / 32
} p;

layout(buffer_reference, scalar, buffer_reference_align = 16) buffer U4s { uvec4 v[]; };

void main() {
    uint b = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256 + gl_LocalInvocationID.x;
    if (b >= p.blocks) {
        return;
    }
    vec4 x[8];
    float amax = 0.0;
    for (uint i = 0; i < 8; i++) {
        x[i] = V4s(p.src + uint64_t(b) * 128u).v[i];
        amax = max(amax, max(max(abs(x[i].x), abs(x[i].y)), max(abs(x[i].z), abs(x[i].w))));
    }
    const float top = WIDE != 0u ? 32767.0 : 127.0;
    float d = amax / top;
    float inv = d > 0.0 ? 1.0 / d : 0.0;
    uint hi[8];
    uint lo[8];
    int sa = 0;
    int sb = 0;
    for (uint i = 0; i < 8; i++) {
        ivec4 v = ivec4(clamp(round(x[i] * inv), vec4(-top), vec4(top)));
        // WIDE: the high bytes (v >> 8, arithmetic) and the low bytes; else the bytes of v.
        ivec4 h = WIDE != 0u ? (v >> 8) : v;
        hi[i] = (uint(h.x) & 0xFFu) | ((uint(h.y) & 0xFFu) << 8) | ((uint(h.z) & 0xFFu) << 16) | (uint(h.w) << 24);
        lo[i] = (uint(v.x) & 0xFFu) | ((uint(v.y) & 0xFFu) << 8) | ((uint(v.z) & 0xFFu) << 16) | (uint(v.w) << 24);
        int s = v.x + v.y + v.z + v.w;
        if (i < 4u) {
            sa += s;
        } else {
            sb += s;
        }
    }
    uint64_t at = p.dst + uint64_t(b) * (WIDE != 0u ? 80u : 48u);
    U4s(at).v[0] = uvec4(hi[0], hi[1], hi[2], hi[3]);
    U4s(at).v[1] = uvec4(hi[4], hi[5], hi[6], hi[7]);
    if (WIDE != 0u) {
        U4s(at).v[2] = uvec4(lo[0], lo[1], lo[2], lo[3]);
        U4s(at).v[3] = uvec4(lo[4], lo[5], lo[6], lo[7]);
    }
    V4s(at + (WIDE != 0u ? 64u : 32u)).v[0] = vec4(d, d * float(sa), d * float(sb), 0.0);
}
