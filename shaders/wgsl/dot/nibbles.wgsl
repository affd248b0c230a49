// Shared by the 32-value block formats' unit decoders (q4_0, q4_1, q5_0, q5_1): their 16 nibble
// bytes hold value j in the low nibble of byte j and value j + 16 in its high nibble.

// The 32 codes of the 16 nibble bytes at byte qs.
fn q4_codes(qs: u32) -> array<u32, 8> {
    var q: array<u32, 8>;
    for (var i = 0u; i < 4u; i++) {
        let v = ld32(qs + 4u * i);
        q[i] = v & 0x0F0F0F0Fu;
        q[i + 4u] = (v >> 4u) & 0x0F0F0F0Fu;
    }
    return q;
}

// Bits 0..3 of t to bit 4 of bytes 0..3 (q5_0 and q5_1's fifth bits).
fn spread4(t: u32) -> u32 {
    return ((t & 1u) << 4u) | ((t & 2u) << 11u) | ((t & 4u) << 18u) | ((t & 8u) << 25u);
}

// The 32 codes of a q5 block whose 32 high bits are at byte qh_at and 16 nibble bytes at qs_at.
fn q5_codes(qh_at: u32, qs_at: u32) -> array<u32, 8> {
    var q = q4_codes(qs_at);
    let qh = ld32(qh_at);
    for (var i = 0u; i < 4u; i++) {
        q[i] |= spread4(qh >> (4u * i));
        q[i + 4u] |= spread4(qh >> (16u + 4u * i));
    }
    return q;
}
