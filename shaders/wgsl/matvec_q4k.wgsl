// The subgroup matvec for q4_k weights against 2 to 15 input rows (batched decode; one row takes
// matvec_q4k_rows.wgsl) (formats/q4_k.wgsl's layout; entry point, pass and reduction in
// parts/matvec_subgroup_main.wgsl, whose items this file defines). Work item t of a row is
// nibble word w = t % 32 of super-block
// t / 32: the row's invocations take items tid, tid + WG, ..., so 32 neighbouring invocations read
// the 32 consecutive nibble words of one super-block (128 bytes). Word w holds 4 values of
// sub-block 2j (low nibbles) and the 4 values 32 further on of sub-block 2j + 1 (high nibbles),
// j = w / 8; each invocation reads its super-block's 4 header words (the same address across the
// 32: a broadcast) and extracts the scales and mins of those two sub-blocks together, instead of
// a whole header decode per 4 values (`load_group`).

// Wider views of the two buffers this kernel reads, bound to the same ranges as `act` (binding
// 1, the arena) and `wts` (binding 3): the input runs and a super-block's header are each one
// 16-byte load. `act4` is only read here, at the input row, never where the outputs go.
@group(0) @binding(8) var<storage, read_write> act4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read> wts4: array<vec4<u32>>;

// The 8 input values that item t multiplies: 4 at the low nibbles, 4 at the high (32 further).
struct Q4kX {
    lo: vec4<f32>,
    hi: vec4<f32>,
}
alias ItemX = Q4kX;

// q4_k rows are whole super-blocks of 256 values, 32 nibble words each.
fn row_items() -> u32 {
    return (p.k / 256u) * 32u;
}

// Weight rows start at word offsets (super-blocks are 36 words).
fn row_at(col: u32) -> u32 {
    return (col * p.row_bytes) >> 2u;
}

// xb is a multiple of 4 (arena values are 256-byte aligned, k a multiple of 256).
fn item_x(xb: u32, t: u32) -> ItemX {
    // Super-block t / 32, chunk j = (t % 32) / 8 of 64 values, values 4 * (t % 8) .. of it.
    let at = (xb + (t >> 5u) * 256u + (t & 24u) * 8u + (t & 7u) * 4u) >> 2u;
    return Q4kX(act4[at], act4[at + 8u]);
}

// Item t decoded: its 8 nibbles as f = 1 + q / 16 (no int-to-float conversion: nibble q moved
// to the top of the mantissa of 1.0), lo the 4 low, hi the 4 high; value = a f - off per
// sub-block, a = 16 d scale, off = a + dmin min (so that q . x = 16 (f . x - sum x)).
struct Q4kW {
    lo: vec4<f32>,
    hi: vec4<f32>,
    a: vec2<f32>,
    off: vec2<f32>,
}
alias ItemW = Q4kW;

// Item t of the row at word w0.
fn item_w(w0: u32, t: u32) -> ItemW {
    // Super-blocks are 36 words, rows a multiple of them: b is a multiple of 4.
    let b = w0 + (t >> 5u) * 36u;
    let hd = wts4[b >> 2u];
    let dm = unpack2x16float(hd.x);
    // Sub-blocks s = 2j and 2j + 1 take bytes s % 4 and s % 4 + 1 of each 4-byte word of the
    // 12 scale bytes (a: bytes 0-3, c: 4-7, e: 8-11), both bytes as one 16-bit pair.
    let shift = (t & 8u) * 2u;
    let a = (hd.y >> shift) & 0xFFFFu;
    let c = (hd.z >> shift) & 0xFFFFu;
    let e = (hd.w >> shift) & 0xFFFFu;
    // s < 4: scale = a & 63, min = c & 63. s >= 4: scale = (e & 15) | (a >> 6) << 4,
    // min = (e >> 4) | (c >> 6) << 4 (bytewise on the pairs).
    let high = (t & 16u) != 0u;
    let sc = select(a & 0x3F3Fu, (e & 0x0F0Fu) | ((a >> 2u) & 0x3030u), high);
    let mn = select(c & 0x3F3Fu, ((e >> 4u) & 0x0F0Fu) | ((c >> 2u) & 0x3030u), high);
    let v = wts[b + 4u + (t & 31u)];
    var w: Q4kW;
    let m = vec4<u32>(0x00780000u);
    let one = vec4<u32>(0x3F800000u);
    w.lo = bitcast<vec4<f32>>((vec4<u32>(v << 19u, v << 11u, v << 3u, v >> 5u) & m) | one);
    w.hi = bitcast<vec4<f32>>((vec4<u32>(v << 15u, v << 7u, v >> 1u, v >> 9u) & m) | one);
    w.a = 16.0 * dm.x * vec2<f32>(f32(sc & 0xFFu), f32(sc >> 8u));
    w.off = w.a + dm.y * vec2<f32>(f32(mn & 0xFFu), f32(mn >> 8u));
    return w;
}

// Decoded item w against its input values x.
fn item_dot(w: ItemW, x: ItemX) -> f32 {
    let one = vec4<f32>(1.0);
    return w.a.x * dot(w.lo, x.lo) + w.a.y * dot(w.hi, x.hi) - w.off.x * dot(x.lo, one)
        - w.off.y * dot(x.hi, one);
}
