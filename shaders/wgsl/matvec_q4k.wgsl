// The subgroup matvec for q4_k weights against 2 to 15 input rows (batched decode; one row takes
// matvec_q4k_rows.wgsl) (formats/q4_k.wgsl's layout; entry point, pass and reduction in
// parts/matvec_subgroup_main.wgsl, whose items this file defines). Work item t of a row is
// nibble word w = t % 32 of super-block
// t / 32: the row's invocations take items tid, tid + WG, ..., so 32 neighbouring invocations read
// the 32 consecutive nibble words of one super-block (128 bytes). Word w holds 4 values of
// sub-block 2j (low nibbles) and the 4 values 32 further on of sub-block 2j + 1 (high nibbles),
// j = w / 8; each invocation reads its super-block's 4 header words (the same address across the
// 32: a broadcast) and extracts the scales and mins of those two sub-blocks together, instead of
// a whole header decode per 4 values (`load_group`). Views, chunk factors and nibble floats:
// parts/q4k_pair.wgsl.

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

// Item t decoded: its 8 nibbles as floats (lo the 4 low, hi the 4 high) and its chunk's factors.
struct Q4kW {
    lo: vec4<f32>,
    hi: vec4<f32>,
    f: Q4kPair,
}
alias ItemW = Q4kW;

// Item t of the row at word w0: chunk (t % 32) / 8 of super-block t / 32.
fn item_w(w0: u32, t: u32) -> ItemW {
    // Super-blocks are 36 words, rows a multiple of them: b is a multiple of 4.
    let b = w0 + (t >> 5u) * 36u;
    let v = wts[b + 4u + (t & 31u)];
    return Q4kW(nib_lo(v), nib_hi(v), q4k_pair(wts4[b >> 2u], (t & 31u) >> 3u));
}

// Decoded item w against its input values x.
fn item_dot(w: ItemW, x: ItemX) -> f32 {
    let one = vec4<f32>(1.0);
    return w.f.a.x * dot(w.lo, x.lo) + w.f.a.y * dot(w.hi, x.hi) - w.f.off.x * dot(x.lo, one)
        - w.f.off.y * dot(x.hi, one);
}
