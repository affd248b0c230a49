// Shared by every tandem Vulkan kernel: extensions, buffer-reference views of memory (every
// buffer is reached by its device address, passed in push constants), and the weight formats'
// dequantisation (ggml's block layouts, as backend-api/src/quant.rs spells them out).

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

#if defined(WFMT_Q4_0)
// d: f16, 16 bytes: element j low nibble of byte j, j + 16 high nibble; (q - 8) * d.
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
    uint64_t b = row + uint64_t(u) * 18;
    float d = f16_at(b, 0);
    for (uint j = 0; j < 16; j++) {
        uint q = u8_at(b, 2 + j);
        w[j] = float(int(q & 15u) - 8) * d;
        w[j + 16] = float(int(q >> 4) - 8) * d;
    }
}
#elif defined(WFMT_Q4_1)
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
    uint64_t b = row + uint64_t(u) * 20;
    float d = f16_at(b, 0);
    float m = f16_at(b, 2);
    for (uint j = 0; j < 16; j++) {
        uint q = u8_at(b, 4 + j);
        w[j] = float(q & 15u) * d + m;
        w[j + 16] = float(q >> 4) * d + m;
    }
}
#elif defined(WFMT_Q5_0)
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
    uint64_t b = row + uint64_t(u) * 22;
    float d = f16_at(b, 0);
    uint qh = uint(U16s(b).v[1]) | (uint(U16s(b).v[2]) << 16);
    for (uint j = 0; j < 16; j++) {
        uint q = u8_at(b, 6 + j);
        uint h0 = ((qh >> j) << 4) & 0x10u;
        uint h1 = (qh >> (j + 12)) & 0x10u;
        w[j] = float(int((q & 15u) | h0) - 16) * d;
        w[j + 16] = float(int((q >> 4) | h1) - 16) * d;
    }
}
#elif defined(WFMT_Q5_1)
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
    uint64_t b = row + uint64_t(u) * 24;
    float d = f16_at(b, 0);
    float m = f16_at(b, 2);
    uint qh = uint(U16s(b).v[2]) | (uint(U16s(b).v[3]) << 16);
    for (uint j = 0; j < 16; j++) {
        uint q = u8_at(b, 8 + j);
        uint h0 = ((qh >> j) << 4) & 0x10u;
        uint h1 = (qh >> (j + 12)) & 0x10u;
        w[j] = float((q & 15u) | h0) * d + m;
        w[j + 16] = float((q >> 4) | h1) * d + m;
    }
}
#elif defined(WFMT_Q8_0)
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
    uint64_t b = row + uint64_t(u) * 34;
    float d = f16_at(b, 0);
    for (uint j = 0; j < 32; j++) {
        w[j] = float(i8_at(b, 2 + j)) * d;
    }
}
#elif defined(WFMT_Q4_K)
// Unit u: sub-block s = u % 8 of super-block u / 8 (144 bytes: d, dmin, 12 scale bytes, 128 qs).
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
    uint64_t b = row + uint64_t(u >> 3) * 144;
    uint s = u & 7u;
    float d = f16_at(b, 0);
    float dmin = f16_at(b, 2);
    uint sc, mn;
    if (s < 4) {
        sc = u8_at(b, 4 + s) & 63u;
        mn = u8_at(b, 8 + s) & 63u;
    } else {
        sc = (u8_at(b, 8 + s) & 15u) | ((u8_at(b, s) >> 6) << 4);
        mn = (u8_at(b, 8 + s) >> 4) | ((u8_at(b, 4 + s) >> 6) << 4);
    }
    float d1 = d * float(sc);
    float m1 = dmin * float(mn);
    uint qoff = 16 + 32 * (s >> 1);
    uint shift = (s & 1u) * 4;
    for (uint l = 0; l < 32; l++) {
        w[l] = d1 * float((u8_at(b, qoff + l) >> shift) & 15u) - m1;
    }
}
#elif defined(WFMT_Q6_K)
// Unit u: 32 elements s = u % 4 of half h = (u / 4) % 2 of super-block u / 8 (210 bytes).
void load_unit(uint64_t row, uint u, out float w[UNIT]) {
    uint64_t b = row + uint64_t(u >> 3) * 210;
    uint h = (u >> 2) & 1u;
    uint s = u & 3u;
    float d = f16_at(b, 208);
    uint qloff = 64 * h + 32 * (s & 1u);
    uint lshift = (s >> 1) * 4;
    uint qhoff = 128 + 32 * h;
    uint hshift = 2 * s;
    uint scoff = 192 + 8 * h + 2 * s;
    for (uint l = 0; l < 32; l++) {
        uint low = (u8_at(b, qloff + l) >> lshift) & 15u;
        uint high = (u8_at(b, qhoff + l) >> hshift) & 3u;
        int q = int(low | (high << 4)) - 32;
        float scale = float(i8_at(b, scoff + (l >> 4)));
        w[l] = d * scale * float(q);
    }
}
#endif
