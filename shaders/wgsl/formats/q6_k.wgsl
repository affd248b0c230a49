// q6_k: 210-byte super-blocks of 256 (128 bytes of low nibbles, 64 of high bit pairs, 16 signed
// scales, d). Unit u = g / 8 holds 32 values: s = u % 4 of half h = (u / 4) % 2 of super-block
// u / 8. Value l of a unit: low bits from byte 64h + 32(s % 2) + l (nibble s / 2), high bits
// from byte 128 + 32h + l at shift 2s, scale byte 192 + 8h + 2s + l / 16; d * scale * (q - 32).
// Layout constants: backend-api/src/block.rs's (tests/tests/block_formats.rs checks them).
const Q6_K_BYTES: u32 = 210u;
const Q6_K_QH: u32 = 128u;
const Q6_K_SCALES: u32 = 192u;
const Q6_K_D: u32 = 208u;
const GROUP: u32 = 4u;
fn load_group(row: u32, g: u32) -> vec4<f32> {
    let u = g >> 3u;
    let i = g & 7u;
    let b = row + (u >> 3u) * Q6_K_BYTES;
    let h = (u >> 2u) & 1u;
    let s = u & 3u;
    let lo = ld32(b + 64u * h + 32u * (s & 1u) + 4u * i) >> ((s >> 1u) * 4u);
    let hi = ld32(b + Q6_K_QH + 32u * h + 4u * i) >> (2u * s);
    let q = (vec4<u32>(lo, lo >> 8u, lo >> 16u, lo >> 24u) & vec4<u32>(15u))
        | ((vec4<u32>(hi, hi >> 8u, hi >> 16u, hi >> 24u) & vec4<u32>(3u)) << vec4<u32>(4u));
    let sc = ld16(b + Q6_K_SCALES + 8u * h + 2u * s) >> (8u * (i >> 2u));
    return (vec4<f32>(q) - 32.0) * (f16_at(b + Q6_K_D) * sext8(sc));
}
