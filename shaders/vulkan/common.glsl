// Shared by every tandem Vulkan kernel: extensions, buffer-reference views of memory (every
// buffer is reached by its device address, passed in push constants), and the weight formats'
// dequantisation (ggml's block layouts: the offsets and sizes are the Q*_BYTES, Q*_QS ... defines
// that backend-vulkan/build.rs writes ahead of this file from backend-api/src/block.rs).

#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference2 : require
#extension GL_EXT_scalar_block_layout : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(buffer_reference, scalar, buffer_reference_align = 4) buffer F32s { float v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer U32s { uint v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 16) buffer V4s { vec4 v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 2) buffer U16s { uint16_t v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 1) buffer U8s { uint8_t v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 1) buffer I8s { int8_t v[]; };

float f16_at(uint64_t addr, uint byte_off) {
    return unpackHalf2x16(uint(U16s(addr).v[byte_off >> 1])).x;
}

uint u8_at(uint64_t addr, uint byte_off) {
    return uint(U8s(addr).v[byte_off]);
}

int i8_at(uint64_t addr, uint byte_off) {
    return int(I8s(addr).v[byte_off]);
}

// Element i of an f32 / 16-bit array at addr, for 64-bit indices (array subscripts are 32-bit).
float ld_f32(uint64_t addr, uint64_t i) { return F32s(addr + i * 4).v[0]; }
void st_f32(uint64_t addr, uint64_t i, float v) { F32s(addr + i * 4).v[0] = v; }
uint ld_u16(uint64_t addr, uint64_t i) { return uint(U16s(addr + i * 2).v[0]); }
void st_u16(uint64_t addr, uint64_t i, uint v) { U16s(addr + i * 2).v[0] = uint16_t(v); }

// Whether every row of the block of `br` rows holding row r (of `rows`) belongs to one slot:
// the blocks attention_tiled takes, which `attention` and `attention_combine` then skip. The
// subgroup reads the block's slots together (one load each per lane, then one vote): read one
// after another, each waited on, they cost every workgroup of the attention kernels some 30
// dependent loads. Call it where the whole subgroup runs (every caller does, at its start).
bool one_slot_block(uint64_t slots, uint r, uint rows, uint br) {
    uint r0 = r - r % br;
    uint end = min(r0 + br, rows);
    uint first = U32s(slots).v[r0];
    uint same = 1u;
    for (uint i = r0 + gl_SubgroupInvocationID; i < end; i += gl_SubgroupSize) {
        if (U32s(slots).v[i] != first) {
            same = 0u;
        }
    }
    return subgroupMin(same) == 1u;
}

// tanh that saturates instead of overflowing.
float tanh_safe(float x) {
    float e = exp(-2.0 * abs(x));
    float t = (1.0 - e) / (1.0 + e);
    return x < 0.0 ? -t : t;
}

// Weight formats. UNIT: elements one call of load_unit decodes (a whole number of blocks or
// one sub-block of 32); BLOCK_BYTES / BLOCK_ELEMS: the storage block.
#if defined(WFMT_F32)
#define UNIT 1
float wload(uint64_t row, uint i) { return F32s(row).v[i]; }
#elif defined(WFMT_F16)
#define UNIT 1
float wload(uint64_t row, uint i) { return unpackHalf2x16(uint(U16s(row).v[i])).x; }
#elif defined(WFMT_BF16)
#define UNIT 1
float wload(uint64_t row, uint i) { return uintBitsToFloat(uint(U16s(row).v[i]) << 16); }
#else
#define UNIT 32
#endif

#if UNIT == 1
void load_unit(uint64_t row, uint u, out float w[UNIT]) { w[0] = wload(row, u); }
#endif

// The block formats are read 16 bits at a time (their blocks are 2-byte aligned), q4_k 32 bits
// at a time (144-byte blocks).
uint ld16(uint64_t b, uint byte_off) { return uint(U16s(b).v[byte_off >> 1]); }
uint ld32(uint64_t b, uint byte_off) { return U32s(b).v[byte_off >> 2]; }
float sext8(uint v) { return float(bitfieldExtract(int(v), 0, 8)); }

#if defined(WFMT_Q4_0) || defined(WFMT_Q4_1)
// q4_0: d, 16 bytes (element j low nibble of byte j, j + 16 high nibble); (q - 8) * d.
// q4_1: d, m, 16 bytes as q4_0; q * d + m.
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
#if defined(WFMT_Q4_0)
    uint64_t b = row + uint64_t(u) * Q4_0_BYTES;
    const uint d_at = Q4_0_D;
    const uint qs = Q4_0_QS;
#else
    uint64_t b = row + uint64_t(u) * Q4_1_BYTES;
    const uint d_at = Q4_1_D;
    const uint qs = Q4_1_QS;
#endif
    float d = f16_at(b, d_at);
    for (uint i = 0; i < 8; i++) {
        uint v = ld16(b, qs + 2 * i);
#if defined(WFMT_Q4_0)
        w[2 * i] = float(int(v & 15u) - 8) * d;
        w[2 * i + 1] = float(int((v >> 8) & 15u) - 8) * d;
        w[2 * i + 16] = float(int((v >> 4) & 15u) - 8) * d;
        w[2 * i + 17] = float(int(v >> 12) - 8) * d;
#else
        float m = f16_at(b, Q4_1_M);
        w[2 * i] = float(v & 15u) * d + m;
        w[2 * i + 1] = float((v >> 8) & 15u) * d + m;
        w[2 * i + 16] = float((v >> 4) & 15u) * d + m;
        w[2 * i + 17] = float(v >> 12) * d + m;
#endif
    }
}
#elif defined(WFMT_Q5_0) || defined(WFMT_Q5_1)
// q5_0: d, qh (u32: bit j is bit 4 of element j), 16 bytes as q4_0; (q - 16) * d.
// q5_1: d, m, qh, 16 bytes; q * d + m.
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
#if defined(WFMT_Q5_0)
    uint64_t b = row + uint64_t(u) * Q5_0_BYTES;
    const uint d_at = Q5_0_D;
    const uint qh_at = Q5_0_QH;
    const uint qs = Q5_0_QS;
#else
    uint64_t b = row + uint64_t(u) * Q5_1_BYTES;
    const uint d_at = Q5_1_D;
    const uint qh_at = Q5_1_QH;
    const uint qs = Q5_1_QS;
#endif
    float d = f16_at(b, d_at);
    uint qh = ld16(b, qh_at) | (ld16(b, qh_at + 2) << 16);
    for (uint i = 0; i < 8; i++) {
        uint v = ld16(b, qs + 2 * i);
        uint j = 2 * i;
        uint q0 = (v & 15u) | (((qh >> j) << 4) & 0x10u);
        uint q1 = ((v >> 8) & 15u) | (((qh >> (j + 1)) << 4) & 0x10u);
        uint q16 = ((v >> 4) & 15u) | ((qh >> (j + 12)) & 0x10u);
        uint q17 = (v >> 12) | ((qh >> (j + 13)) & 0x10u);
#if defined(WFMT_Q5_0)
        w[j] = float(int(q0) - 16) * d;
        w[j + 1] = float(int(q1) - 16) * d;
        w[j + 16] = float(int(q16) - 16) * d;
        w[j + 17] = float(int(q17) - 16) * d;
#else
        float m = f16_at(b, Q5_1_M);
        w[j] = float(q0) * d + m;
        w[j + 1] = float(q1) * d + m;
        w[j + 16] = float(q16) * d + m;
        w[j + 17] = float(q17) * d + m;
#endif
    }
}
#elif defined(WFMT_Q8_0)
// d, 32 x int8; q * d.
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
    uint64_t b = row + uint64_t(u) * Q8_0_BYTES;
    float d = f16_at(b, Q8_0_D);
    for (uint i = 0; i < 16; i++) {
        uint v = ld16(b, Q8_0_QS + 2 * i);
        w[2 * i] = sext8(v) * d;
        w[2 * i + 1] = sext8(v >> 8) * d;
    }
}
#elif defined(WFMT_Q4_K)
// Unit u: sub-block s = u % 8 of super-block u / 8 (144 bytes: d, dmin, 12 bytes packing 6-bit
// scales and mins, 128 bytes of nibbles: 32 bytes per 64 elements, low nibbles first).
uint byte_of(uvec3 sc, uint i) {
    uint word = i < 4u ? sc.x : (i < 8u ? sc.y : sc.z);
    return (word >> (8u * (i & 3u))) & 0xFFu;
}
// The 6-bit scale and min of sub-block s from the 12 packed bytes.
void q4k_scale_min(uvec3 sc, uint s, out uint scale, out uint mn) {
    if (s < 4) {
        scale = byte_of(sc, s) & 63u;
        mn = byte_of(sc, s + 4) & 63u;
    } else {
        scale = (byte_of(sc, s + 4) & 15u) | ((byte_of(sc, s - 4) >> 6) << 4);
        mn = (byte_of(sc, s + 4) >> 4) | ((byte_of(sc, s) >> 6) << 4);
    }
}
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
    uint64_t b = row + uint64_t(u >> 3) * Q4_K_BYTES;
    uint s = u & 7u;
    // d and dmin in one word (dmin follows d).
    vec2 dm = unpackHalf2x16(ld32(b, Q4_K_D));
    uvec3 sc = uvec3(ld32(b, Q4_K_SCALES), ld32(b, Q4_K_SCALES + 4), ld32(b, Q4_K_SCALES + 8));
    uint scale, mn;
    q4k_scale_min(sc, s, scale, mn);
    float d1 = dm.x * float(scale);
    float m1 = dm.y * float(mn);
    uint qoff = Q4_K_QS + 32 * (s >> 1);
    uint shift = (s & 1u) * 4;
    for (uint i = 0; i < 8; i++) {
        uint v = ld32(b, qoff + 4 * i) >> shift;
        w[4 * i] = d1 * float(v & 15u) - m1;
        w[4 * i + 1] = d1 * float((v >> 8) & 15u) - m1;
        w[4 * i + 2] = d1 * float((v >> 16) & 15u) - m1;
        w[4 * i + 3] = d1 * float((v >> 24) & 15u) - m1;
    }
}
#elif defined(WFMT_Q6_K)
// Unit u: 32 elements s = u % 4 of half h = (u / 4) % 2 of super-block u / 8 (210 bytes: 128 of
// low nibbles, 64 of high bit pairs, 16 int8 scales, d). Element l of the unit: low bits from
// byte 64h + 32(s % 2) + l (nibble s / 2), high bits from byte 128 + 32h + l at shift 2s, scale
// 192 + 8h + 2s + l / 16; value d * scale * (q - 32).
#if Q6_K_QL != 0
#error q6_k's low bits are read from the start of the block
#endif
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
    uint64_t b = row + uint64_t(u >> 3) * Q6_K_BYTES;
    uint h = (u >> 2) & 1u;
    uint s = u & 3u;
    float d = f16_at(b, Q6_K_D);
    uint qloff = 64 * h + 32 * (s & 1u); // + Q6_K_QL, which is 0 (checked above)
    uint lshift = (s >> 1) * 4;
    uint qhoff = Q6_K_QH + 32 * h;
    uint hshift = 2 * s;
    uint scs = ld16(b, Q6_K_SCALES + 8 * h + 2 * s);
    float ds0 = d * sext8(scs);
    float ds1 = d * sext8(scs >> 8);
    for (uint i = 0; i < 16; i++) {
        uint lo = ld16(b, qloff + 2 * i) >> lshift;
        uint hi = ld16(b, qhoff + 2 * i) >> hshift;
        int q0 = int((lo & 15u) | ((hi & 3u) << 4)) - 32;
        int q1 = int(((lo >> 8) & 15u) | (((hi >> 8) & 3u) << 4)) - 32;
        float ds = i < 8u ? ds0 : ds1;
        w[2 * i] = ds * float(q0);
        w[2 * i + 1] = ds * float(q1);
    }
}
#endif
