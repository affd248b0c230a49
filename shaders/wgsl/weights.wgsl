// Reading stored weight bytes as 32-bit words: WGSL has no 8- or 16-bit storage types, and the
// block formats are only 2-byte aligned.
@group(0) @binding(3) var<storage, read> wts: array<u32>;

// The 16 bits at byte offset b (b even).
fn ld16(b: u32) -> u32 {
    return (wts[b >> 2u] >> ((b & 2u) * 8u)) & 0xFFFFu;
}

// The 32 bits at byte offset b (b even): one word, or two words funnelled.
fn ld32(b: u32) -> u32 {
    let i = b >> 2u;
    if ((b & 2u) == 0u) {
        return wts[i];
    }
    return (wts[i] >> 16u) | (wts[i + 1u] << 16u);
}

fn f16_at(b: u32) -> f32 {
    return unpack2x16float(ld16(b)).x;
}

// A signed byte (bits 0..7 of v) as f32.
fn sext8(v: u32) -> f32 {
    return f32(extractBits(i32(v), 0u, 8u));
}

// Value i of a norm weight stored as f32 (fmt 0), f16 (1) or bf16 (2).
fn norm_weight(fmt: u32, i: u32) -> f32 {
    if (fmt == 0u) {
        return bitcast<f32>(wts[i]);
    } else if (fmt == 1u) {
        return f16_at(2u * i);
    }
    return bitcast<f32>(ld16(2u * i) << 16u);
}

// A second norm weight (a fused kernel's second norm) at binding 6.
@group(0) @binding(6) var<storage, read> wts2: array<u32>;

// Value i of the second norm weight, stored as f32 (fmt 0), f16 (1) or bf16 (2).
fn norm_weight2(fmt: u32, i: u32) -> f32 {
    if (fmt == 0u) {
        return bitcast<f32>(wts2[i]);
    }
    let h = (wts2[i >> 1u] >> ((i & 1u) * 16u)) & 0xFFFFu;
    if (fmt == 1u) {
        return unpack2x16float(h).x;
    }
    return bitcast<f32>(h << 16u);
}
