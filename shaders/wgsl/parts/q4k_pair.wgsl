// Shared by the q4_k decode matvecs (matvec_q4k.wgsl, matvec_q4k_rows.wgsl, dot/q4_k.wgsl),
// which read through parts/views16.wgsl: the decoding of one 64-value chunk of a super-block (formats/q4_k.wgsl's layout), whose 32 nibble bytes hold sub-block 2j in their low
// nibbles and sub-block 2j + 1 in their high ones.

// Chunk j's two sub-blocks: value = a f - off, with f = 1 + q / 16 the nibble as a float
// (`nib_lo`, `nib_hi`), a = 16 d scale and off = a + dmin min, so that q . x = 16 (f . x - sum x).
struct Q4kPair {
    a: vec2<f32>,
    off: vec2<f32>,
}

// Chunk j's scales and mins from the super-block's 16-byte header h, as 16-bit pairs (the low
// byte sub-block 2j's, the high 2j + 1's): (scales, mins). Sub-blocks 2j and 2j + 1 take bytes
// 2j % 4 and the next of each 4-byte word of the 12 scale bytes (a: bytes 0-3, z: 4-7, u: 8-11),
// as one 16-bit pair; for j < 2 scale = a & 63 and min = z & 63, else scale = (u & 15) |
// (a >> 6) << 4 and min = (u >> 4) | (z >> 6) << 4 (bytewise on the pairs).
fn q4k_scale_min(h: vec4<u32>, j: u32) -> vec2<u32> {
    let sh = 16u * (j & 1u);
    let a = h.y >> sh;
    let z = h.z >> sh;
    let u = h.w >> sh;
    let upper = j >= 2u;
    let sc = select(a & 0x3F3Fu, (u & 0x0F0Fu) | ((a >> 2u) & 0x3030u), upper);
    let mn = select(z & 0x3F3Fu, ((u >> 4u) & 0x0F0Fu) | ((z >> 2u) & 0x3030u), upper);
    return vec2<u32>(sc, mn);
}

// Chunk j's factors from the super-block's 16-byte header h.
fn q4k_pair(h: vec4<u32>, j: u32) -> Q4kPair {
    let sm = q4k_scale_min(h, j);
    let sc = sm.x;
    let mn = sm.y;
    let dm = unpack2x16float(h.x);
    var f: Q4kPair;
    f.a = 16.0 * dm.x * vec2<f32>(f32(sc & 0xFFu), f32(sc >> 8u));
    f.off = f.a + dm.y * vec2<f32>(f32(mn & 0xFFu), f32(mn >> 8u));
    return f;
}

// 1 + q / 16 for the low nibbles of v's 4 bytes, then for the high: nibble q moved to the top of
// the mantissa of 1.0, with no int-to-float conversion.
fn nib_lo(v: u32) -> vec4<f32> {
    let m = vec4<u32>(v << 19u, v << 11u, v << 3u, v >> 5u) & vec4<u32>(0x00780000u);
    return bitcast<vec4<f32>>(m | vec4<u32>(0x3F800000u));
}
fn nib_hi(v: u32) -> vec4<f32> {
    let m = vec4<u32>(v << 15u, v << 7u, v >> 1u, v >> 9u) & vec4<u32>(0x00780000u);
    return bitcast<vec4<f32>>(m | vec4<u32>(0x3F800000u));
}
