//! Reference decoders for ggml's storage formats: `f32`, `f16`, `bf16` and the block-quantized
//! types of [`DType`].
//!
//! [`dequantize_row`] reproduces ggml's reference `dequantize_row_*` functions (llama.cpp's
//! `ggml/src/ggml-quants.c`) bit for bit. Each value is an `f16` scale times small integers (at most
//! 11 + 7 + 5 significant bits), which `f32` holds exactly, plus at most one addition of an `f16`
//! min times a small integer (again exact); so each value is rounded once at most, and the result
//! does not depend on the order of the products or on fused multiply-adds.
//!
//! The block layouts (which field lies where, and the sizes) are [`crate::block`]'s, the one
//! definition the decoders below read their offsets from; all fields are little-endian, with
//! `f16` scales (`d`, `dmin`, `m`) in IEEE binary16.
//!
//! The functions below spell out, per format, which bits hold which element.

use half::f16;

use crate::block::{q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0};
use crate::dtype::DType;

/// Why a row could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The element count is not a whole number of blocks.
    #[error("cannot decode {elems} values of {dtype}: it stores whole blocks of {block} values")]
    PartialBlock {
        /// The storage type.
        dtype: DType,
        /// Values asked for.
        elems: usize,
        /// Values per block of `dtype`.
        block: usize,
    },
    /// The byte slice does not hold exactly the blocks of the element count.
    #[error("{elems} values of {dtype} take {expected} bytes, but {found} bytes were given")]
    ByteLength {
        /// The storage type.
        dtype: DType,
        /// Values asked for.
        elems: usize,
        /// Bytes those values occupy.
        expected: usize,
        /// Bytes given.
        found: usize,
    },
}

/// Decodes `out.len()` elements stored as `dtype` in `bytes` (whole blocks, little-endian, ggml
/// layout).
///
/// `bytes` must hold exactly the blocks of `out.len()` elements (`dtype.row_bytes(out.len())`
/// bytes), and `out.len()` must be a whole number of blocks. Since blocks never straddle rows, a
/// slice of several whole rows decodes as one. Every bit pattern decodes to some value; `f16` and
/// `bf16` infinities and NaNs pass through as `f32` infinities and NaNs.
pub fn dequantize_row(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let elems = out.len();
    let block = dtype.block_elems();
    let expected = dtype
        .row_bytes(elems)
        .ok_or(QuantError::PartialBlock { dtype, elems, block })?;
    if bytes.len() != expected {
        return Err(QuantError::ByteLength {
            dtype,
            elems,
            expected,
            found: bytes.len(),
        });
    }
    let decode: fn(&[u8], &mut [f32]) = match dtype {
        DType::F32 | DType::F16 | DType::Bf16 => {
            elementwise(dtype, bytes, out);
            return Ok(());
        }
        DType::Q4_0 => q4_0,
        DType::Q4_1 => q4_1,
        DType::Q5_0 => q5_0,
        DType::Q5_1 => q5_1,
        DType::Q8_0 => q8_0,
        DType::Q2K => q2_k,
        DType::Q3K => q3_k,
        DType::Q4K => q4_k,
        DType::Q5K => q5_k,
        DType::Q6K => q6_k,
    };
    for (b, o) in bytes
        .chunks_exact(dtype.block_bytes())
        .zip(out.chunks_exact_mut(block))
    {
        decode(b, o);
    }
    Ok(())
}

/// The one-value formats (`f32`, `f16`, `bf16`; `bytes` holds `out.len()` values) in plain loops
/// the compiler vectorizes, not one call per value: a bf16 weight row decoded at about 2 ns a
/// value that way, which held the CPU backend's bf16 decode to 0.7 tok/s on 1B. Other dtypes
/// are left alone.
fn elementwise(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::Bf16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        DType::F16 => {
            // `half`'s slice conversion (F16C where the CPU has it), 64 values at a time.
            use half::slice::HalfFloatSliceExt;
            let mut halves = [f16::ZERO; 64];
            for (o, b) in out.chunks_mut(64).zip(bytes.chunks(128)) {
                for (h, v) in halves.iter_mut().zip(b.chunks_exact(2)) {
                    *h = f16::from_bits(u16::from_le_bytes([v[0], v[1]]));
                }
                halves[..o.len()].convert_to_f32_slice(o);
            }
        }
        _ => {}
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16_at(b, at)).to_f32()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `d: f16, qs: [u8; 16]`; element `j < 16` is the low nibble of `qs[j]`, element `j + 16` the
/// high nibble, each offset by 8.
fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, q4_0::D.at);
    let qs = &b[q4_0::QS.range()];
    for (j, &q) in qs.iter().enumerate() {
        out[j] = (i32::from(q & 0x0F) - 8) as f32 * d;
        out[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

/// `d: f16, m: f16, qs: [u8; 16]`, nibbles as `q4_0`, unsigned, plus `m`.
fn q4_1(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, q4_1::D.at);
    let m = f16_at(b, q4_1::M.at);
    let qs = &b[q4_1::QS.range()];
    for (j, &q) in qs.iter().enumerate() {
        out[j] = f32::from(q & 0x0F) * d + m;
        out[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// The fifth bits of elements `j` and `j + 16` from a `q5_*` bit mask, already shifted to 0x10.
fn fifth_bits(qh: u32, j: usize) -> (u8, u8) {
    let low = ((qh >> j) << 4) & 0x10;
    let high = (qh >> (j + 12)) & 0x10;
    (low as u8, high as u8)
}

/// `d: f16, qh: u32, qs: [u8; 16]`; nibbles as `q4_0`, bit `j` of `qh` is bit 4 of element `j`;
/// offset by 16.
fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, q5_0::D.at);
    let qh = u32_at(b, q5_0::QH.at);
    let qs = &b[q5_0::QS.range()];
    for (j, &q) in qs.iter().enumerate() {
        let (h0, h1) = fifth_bits(qh, j);
        out[j] = (i32::from((q & 0x0F) | h0) - 16) as f32 * d;
        out[j + 16] = (i32::from((q >> 4) | h1) - 16) as f32 * d;
    }
}

/// `d: f16, m: f16, qh: u32, qs: [u8; 16]`; as `q5_0`, unsigned, plus `m`.
fn q5_1(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, q5_1::D.at);
    let m = f16_at(b, q5_1::M.at);
    let qh = u32_at(b, q5_1::QH.at);
    let qs = &b[q5_1::QS.range()];
    for (j, &q) in qs.iter().enumerate() {
        let (h0, h1) = fifth_bits(qh, j);
        out[j] = f32::from((q & 0x0F) | h0) * d + m;
        out[j + 16] = f32::from((q >> 4) | h1) * d + m;
    }
}

/// `d: f16, qs: [i8; 32]`.
fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, q8_0::D.at);
    for (o, &q) in out.iter_mut().zip(&b[q8_0::QS.range()]) {
        *o = f32::from(q as i8) * d;
    }
}

/// `scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16`.
///
/// Each half of 128 elements uses 32 bytes of `qs`; within a half, the 2-bit field at shift `2s`
/// of byte `l` is element `32 s + l`. Sub-block `i` of 16 elements has scale `d * (scales[i] &
/// 0xF)` and min `dmin * (scales[i] >> 4)`; value `scale * q - min`.
fn q2_k(b: &[u8], out: &mut [f32]) {
    let scales = &b[q2_k::SCALES.range()];
    let qs = &b[q2_k::QS.range()];
    let d = f16_at(b, q2_k::D.at);
    let dmin = f16_at(b, q2_k::DMIN.at);
    for (i, &sc) in scales.iter().enumerate() {
        let dl = d * f32::from(sc & 0x0F);
        let ml = dmin * f32::from(sc >> 4);
        let (half, shift, first) = (i / 8, 2 * ((i % 8) / 2), 16 * (i % 2));
        let q = &qs[32 * half + first..32 * half + first + 16];
        for (o, &byte) in out[16 * i..16 * i + 16].iter_mut().zip(q) {
            *o = dl * f32::from((byte >> shift) & 3) - ml;
        }
    }
}

/// The signed 6-bit scale of sub-block `i` (0..16) of a `q3_k` block, from its 12 packed bytes:
/// the low 4 bits are nibble `i % 8` of bytes 0..8 (low nibbles first), the high 2 bits sit in
/// byte `8 + i % 4` at shift `2 (i / 4)`; the stored value is offset by 32.
fn q3_k_scale(packed: &[u8], i: usize) -> i32 {
    let low = if i < 8 {
        packed[i] & 0x0F
    } else {
        packed[i - 8] >> 4
    };
    let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    i32::from(low | (high << 4)) - 32
}

/// `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16`.
///
/// The 2-bit fields are laid out as in `q2_k`; bit `b` of `hmask[l]` belongs to element
/// `32 b + l`, and a clear bit subtracts 4. Sub-block `i` of 16 elements has scale
/// `d * q3_k_scale(i)`; value `scale * q`.
fn q3_k(b: &[u8], out: &mut [f32]) {
    let hmask = &b[q3_k::HMASK.range()];
    let qs = &b[q3_k::QS.range()];
    let packed = &b[q3_k::SCALES.range()];
    let d = f16_at(b, q3_k::D.at);
    for i in 0..16 {
        let dl = d * q3_k_scale(packed, i) as f32;
        let (half, shift, first) = (i / 8, 2 * ((i % 8) / 2), 16 * (i % 2));
        let mask = 1u8 << (4 * half + (i % 8) / 2);
        for l in first..first + 16 {
            let low = i32::from((qs[32 * half + l] >> shift) & 3);
            let q = if hmask[l] & mask != 0 { low } else { low - 4 };
            out[16 * i + l - first] = dl * q as f32;
        }
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a `q4_k` or `q5_k` block, from its 12
/// packed bytes: for `j < 4`, the low 6 bits of bytes `j` and `j + 4`; otherwise the nibbles of
/// byte `j + 4` with the top 2 bits of bytes `j - 4` and `j` above them.
fn k_scale_min(packed: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4),
            (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
        )
    }
}

/// `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]`.
///
/// Each 64 elements use 32 bytes of `qs`: low nibbles are the first 32 (sub-block `2c`), high
/// nibbles the next 32 (sub-block `2c + 1`). Value `d * scale * q - dmin * min`.
fn q4_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, q4_k::D.at);
    let dmin = f16_at(b, q4_k::DMIN.at);
    let packed = &b[q4_k::SCALES.range()];
    let qs = &b[q4_k::QS.range()];
    for c in 0..4 {
        let (sc1, m1) = k_scale_min(packed, 2 * c);
        let (sc2, m2) = k_scale_min(packed, 2 * c + 1);
        let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
        for (l, &q) in qs[32 * c..32 * c + 32].iter().enumerate() {
            out[64 * c + l] = d1 * f32::from(q & 0x0F) - m1;
            out[64 * c + 32 + l] = d2 * f32::from(q >> 4) - m2;
        }
    }
}

/// `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]`.
///
/// As `q4_k`, with bit 4 of element `32 s + l` in bit `s` of `qh[l]`.
fn q5_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, q5_k::D.at);
    let dmin = f16_at(b, q5_k::DMIN.at);
    let packed = &b[q5_k::SCALES.range()];
    let qh = &b[q5_k::QH.range()];
    let qs = &b[q5_k::QS.range()];
    for c in 0..4 {
        let (sc1, m1) = k_scale_min(packed, 2 * c);
        let (sc2, m2) = k_scale_min(packed, 2 * c + 1);
        let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for (l, (&q, &h)) in qs[32 * c..32 * c + 32].iter().zip(qh).enumerate() {
            let h1 = if h & u1 != 0 { 16 } else { 0 };
            let h2 = if h & u2 != 0 { 16 } else { 0 };
            out[64 * c + l] = d1 * f32::from((q & 0x0F) + h1) - m1;
            out[64 * c + 32 + l] = d2 * f32::from((q >> 4) + h2) - m2;
        }
    }
}

/// `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`.
///
/// Each half of 128 elements uses 64 bytes of `ql` and 32 of `qh`. Within a half, element
/// `32 s + l` takes its low 4 bits from `ql[l + 32 (s % 2)]` (low nibble for `s < 2`, high
/// nibble otherwise) and its high 2 bits from `qh[l]` at shift `2 s`; offset by 32. Sub-block `i`
/// of 16 elements has scale `scales[i]`; value `d * scale * q`, left to right.
fn q6_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, q6_k::D.at);
    for half in 0..2 {
        let ql = &b[q6_k::QL.range()][64 * half..64 * half + 64];
        let qh = &b[q6_k::QH.range()][32 * half..32 * half + 32];
        let scales = &b[q6_k::SCALES.range()][8 * half..8 * half + 8];
        let out = &mut out[128 * half..128 * half + 128];
        for l in 0..32 {
            for s in 0..4 {
                let low = if s < 2 {
                    ql[l + 32 * s] & 0x0F
                } else {
                    ql[l + 32 * (s - 2)] >> 4
                };
                let q = i32::from(low | (((qh[l] >> (2 * s)) & 3) << 4)) - 32;
                let scale = f32::from(scales[l / 16 + 2 * s] as i8);
                out[32 * s + l] = d * scale * q as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw blocks and their ggml decoding, made by `backend-api/tests/data/gen_quant_vectors.py`.
    macro_rules! vectors {
        ($name:literal) => {
            (
                &include_bytes!(concat!("../../tests/data/quant/", $name, ".blocks"))[..],
                &include_bytes!(concat!("../../tests/data/quant/", $name, ".f32"))[..],
            )
        };
    }

    fn vectors_for(dtype: DType) -> (&'static [u8], &'static [u8]) {
        match dtype {
            DType::F32 => vectors!("f32"),
            DType::F16 => vectors!("f16"),
            DType::Bf16 => vectors!("bf16"),
            DType::Q4_0 => vectors!("q4_0"),
            DType::Q4_1 => vectors!("q4_1"),
            DType::Q5_0 => vectors!("q5_0"),
            DType::Q5_1 => vectors!("q5_1"),
            DType::Q8_0 => vectors!("q8_0"),
            DType::Q2K => vectors!("q2_k"),
            DType::Q3K => vectors!("q3_k"),
            DType::Q4K => vectors!("q4_k"),
            DType::Q5K => vectors!("q5_k"),
            DType::Q6K => vectors!("q6_k"),
        }
    }

    fn decode(dtype: DType, bytes: &[u8]) -> Vec<f32> {
        let elems = bytes.len() / dtype.block_bytes() * dtype.block_elems();
        let mut out = vec![f32::NAN; elems];
        dequantize_row(dtype, bytes, &mut out).unwrap();
        out
    }

    fn f16_bytes(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_bits().to_le_bytes()
    }

    #[test]
    fn every_type_matches_the_ggml_reference_bit_for_bit() {
        for dtype in DType::ALL {
            let (blocks, expected) = vectors_for(dtype);
            assert_eq!(blocks.len() % dtype.block_bytes(), 0, "{dtype}");
            let expected: Vec<u32> = expected
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let got: Vec<u32> = decode(dtype, blocks).iter().map(|v| v.to_bits()).collect();
            assert_eq!(got.len(), expected.len(), "{dtype}");
            assert!(
                got.len() >= 2 * dtype.block_elems(),
                "{dtype}: fewer than two blocks"
            );
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(
                    g,
                    e,
                    "{dtype} element {i}: got {} ({g:#010x}), ggml gives {} ({e:#010x})",
                    f32::from_bits(*g),
                    f32::from_bits(*e)
                );
            }
        }
    }

    #[test]
    fn rows_of_several_blocks_decode_block_by_block() {
        for dtype in DType::ALL {
            let (blocks, _) = vectors_for(dtype);
            let whole = decode(dtype, blocks);
            let per_block: Vec<f32> = blocks
                .chunks_exact(dtype.block_bytes())
                .flat_map(|b| decode(dtype, b))
                .collect();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&whole), bits(&per_block), "{dtype}");
        }
    }

    #[test]
    fn q8_0_by_hand() {
        let mut block = [0u8; 34];
        block[..2].copy_from_slice(&f16_bytes(0.5));
        block[2] = (-3i8) as u8;
        block[3] = 127;
        block[4] = (-128i8) as u8;
        let out = decode(DType::Q8_0, &block);
        assert_eq!(out[0], -1.5);
        assert_eq!(out[1], 63.5);
        assert_eq!(out[2], -64.0);
        assert!(out[3..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn q4_0_and_q4_1_by_hand() {
        let mut block = [0u8; 18];
        block[..2].copy_from_slice(&f16_bytes(2.0));
        block[2] = 0xF0; // element 0: 0 - 8, element 16: 15 - 8
        block[17] = 0x9A; // element 15: 10 - 8, element 31: 9 - 8
        let out = decode(DType::Q4_0, &block);
        assert_eq!((out[0], out[16], out[15], out[31]), (-16.0, 14.0, 4.0, 2.0));
        assert_eq!(out[1], -16.0);

        let mut block = [0u8; 20];
        block[..2].copy_from_slice(&f16_bytes(0.25));
        block[2..4].copy_from_slice(&f16_bytes(-1.0));
        block[4] = 0x35; // element 0: 5, element 16: 3
        let out = decode(DType::Q4_1, &block);
        assert_eq!(
            (out[0], out[16], out[1]),
            (5.0 * 0.25 - 1.0, 3.0 * 0.25 - 1.0, -1.0)
        );
    }

    #[test]
    fn q5_0_and_q5_1_by_hand() {
        let mut block = [0u8; 22];
        block[..2].copy_from_slice(&f16_bytes(0.5));
        // Fifth bits for elements 0 and 31; element 0: 0x1F - 16, element 31: 0x13 - 16.
        block[2..6].copy_from_slice(&(1u32 | (1 << 31)).to_le_bytes());
        block[6] = 0x0F;
        block[21] = 0x30;
        let out = decode(DType::Q5_0, &block);
        assert_eq!((out[0], out[31], out[1], out[16]), (7.5, 1.5, -8.0, -8.0));

        let mut block = [0u8; 24];
        block[..2].copy_from_slice(&f16_bytes(0.125));
        block[2..4].copy_from_slice(&f16_bytes(2.0));
        block[4..8].copy_from_slice(&(1u32 << 16).to_le_bytes()); // element 16
        block[8] = 0x21; // element 0: 1, element 16: 2 | 16
        let out = decode(DType::Q5_1, &block);
        assert_eq!((out[0], out[16], out[1]), (2.125, 18.0 * 0.125 + 2.0, 2.0));
    }

    #[test]
    fn q2_k_by_hand() {
        let mut block = [0u8; 84];
        block[80..82].copy_from_slice(&f16_bytes(0.5));
        block[82..84].copy_from_slice(&f16_bytes(0.25));
        block[0] = 0x23; // sub-block 0 (elements 0..16): scale 3, min 2
        block[7] = 0x51; // sub-block 7 (elements 112..128): scale 1, min 5
        block[9] = 0x04; // sub-block 9 (elements 144..160): scale 4, min 0
        block[16] = 0b10; // element 0: q 2 (byte 0 of the first half, shift 0)
        block[16 + 31] = 0b11 << 6; // element 96 + 31 = 127, shift 6 of byte 31
        block[16 + 32 + 16] = 0b01; // second half, byte 16: element 128 + 16 = 144
        let out = decode(DType::Q2K, &block);
        assert_eq!(out[0], 0.5 * 3.0 * 2.0 - 0.25 * 2.0);
        assert_eq!(out[1], -0.5);
        assert_eq!(out[127], 0.5 * 3.0 - 0.25 * 5.0);
        assert_eq!(out[112], -1.25);
        assert_eq!(out[144], 2.0);
        assert_eq!(out[145], 0.0);
    }

    #[test]
    fn q3_k_by_hand() {
        let mut block = [0u8; 110];
        block[108..110].copy_from_slice(&f16_bytes(0.5));
        // Scales: sub-block 0 stores 32 + 3 (low nibble 3 of byte 0, high bits 2 in byte 8
        // at shift 0); sub-block 15 stores 32 - 5 = 27 = 0b01_1011 (high nibble of byte 7,
        // high bits in byte 11 at shift 6).
        block[96] = 0x03;
        block[96 + 8] = 0b10;
        block[96 + 7] = 0xB0;
        block[96 + 11] = 0b01 << 6;
        // Element 0: low bits 1, high bit set -> q = 1. Element 1: low bits 2, high bit clear
        // -> q = 2 - 4. Element 255 (second half, shift 6, byte 31; hmask[31] bit 7): low 3,
        // high bit set -> 3.
        block[32] = 0b01;
        block[33] = 0b10;
        block[32 + 32 + 31] = 0b11 << 6;
        block[0] = 1;
        block[31] = 1 << 7;
        let out = decode(DType::Q3K, &block);
        assert_eq!(out[0], 0.5 * 3.0);
        assert_eq!(out[1], 0.5 * 3.0 * -2.0);
        assert_eq!(out[2], 0.5 * 3.0 * -4.0);
        assert_eq!(out[255], 0.5 * -5.0 * 3.0);
        assert_eq!(out[254], 0.5 * -5.0 * -4.0);
        // Sub-blocks with stored scale 0 decode with scale -32.
        assert_eq!(out[16], 0.5 * -32.0 * -4.0);
    }

    #[test]
    fn q4_k_and_q5_k_by_hand() {
        // Scales and mins: sub-block 1: scale 10, min 3 (bytes 1 and 5); sub-block 6: scale
        // 0b11_0101 = 53 (nibble of byte 10, top bits of byte 2), min 0b10_0111 = 39 (high
        // nibble of byte 10, top bits of byte 6).
        let mut packed = [0u8; 12];
        packed[1] = 10;
        packed[5] = 3;
        packed[10] = 0x75;
        packed[2] = 0b11 << 6;
        packed[6] = 0b10 << 6;
        assert_eq!(k_scale_min(&packed, 1), (10, 3));
        assert_eq!(k_scale_min(&packed, 6), (53, 39));

        let mut block = [0u8; 144];
        block[..2].copy_from_slice(&f16_bytes(0.5));
        block[2..4].copy_from_slice(&f16_bytes(0.25));
        block[4..16].copy_from_slice(&packed);
        block[16 + 5] = 0x70; // element 32 + 5 (sub-block 1, high nibble of chunk 0): 7
        block[16 + 96 + 2] = 0x0C; // element 192 + 2 (sub-block 6, low nibble of chunk 3): 12
        let out = decode(DType::Q4K, &block);
        assert_eq!(out[37], 0.5 * 10.0 * 7.0 - 0.25 * 3.0);
        assert_eq!(out[194], 0.5 * 53.0 * 12.0 - 0.25 * 39.0);
        assert_eq!(out[32], -0.75);
        assert_eq!(out[0], 0.0);

        let mut block = [0u8; 176];
        block[..2].copy_from_slice(&f16_bytes(0.5));
        block[2..4].copy_from_slice(&f16_bytes(0.25));
        block[4..16].copy_from_slice(&packed);
        block[48 + 5] = 0x70;
        block[16 + 5] = 0b10; // element 32 + 5 gets its fifth bit (bit 1 of qh[5])
        block[48 + 96 + 2] = 0x0C;
        block[16 + 2] = 1 << 6; // element 192 + 2 (bit 6 of qh[2])
        let out = decode(DType::Q5K, &block);
        assert_eq!(out[37], 0.5 * 10.0 * 23.0 - 0.25 * 3.0);
        assert_eq!(out[194], 0.5 * 53.0 * 28.0 - 0.25 * 39.0);
        assert_eq!(out[5], 0.0);
    }

    #[test]
    fn q6_k_by_hand() {
        let mut block = [0u8; 210];
        block[208..210].copy_from_slice(&f16_bytes(0.5));
        block[192] = 2; // sub-block 0
        block[192 + 5] = (-3i8) as u8; // sub-block 5: elements 80..96
        block[192 + 15] = 7; // sub-block 15: elements 240..256

        // Element 0: low nibble of ql[0] = 5, high bits qh[0] & 3 = 2 -> 5 | 32 = 37 -> 5.
        block[0] = 0x05;
        block[128] = 0b10;
        // Element 80 = 64 + 16: high nibble of ql[16], qh[16] shift 4.
        block[16] = 0xF0;
        block[128 + 16] = 0b11 << 4;
        // Element 255 = 128 + 96 + 31: high nibble of ql[64 + 32 + 31], qh[32 + 31] shift 6.
        block[127] = 0x10;
        let out = decode(DType::Q6K, &block);
        assert_eq!(out[0], 0.5 * 2.0 * 5.0);
        assert_eq!(out[80], 0.5 * -3.0 * 31.0);
        assert_eq!(out[255], 0.5 * 7.0 * (1.0 - 32.0));
        assert_eq!(out[1], 0.5 * 2.0 * -32.0);
    }

    #[test]
    fn float_types_by_hand() {
        let bytes: Vec<u8> = [1.5f32, -0.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(decode(DType::F32, &bytes), [1.5, -0.0]);
        assert_eq!(
            decode(DType::F16, &[0x00, 0x3E, 0x00, 0xFC]),
            [1.5, f32::NEG_INFINITY]
        );
        assert_eq!(decode(DType::Bf16, &[0xC0, 0x3F, 0x20, 0xC1]), [1.5, -10.0]);
        let nan = decode(DType::Bf16, &[0xC1, 0x7F]);
        assert_eq!(nan[0].to_bits(), 0x7FC1_0000);
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let mut out = vec![0.0; 48];
        let err = dequantize_row(DType::Q8_0, &[0; 51], &mut out).unwrap_err();
        assert_eq!(
            err,
            QuantError::PartialBlock {
                dtype: DType::Q8_0,
                elems: 48,
                block: 32
            }
        );
        assert!(err.to_string().contains("q8_0"), "{err}");
        let mut out = vec![0.0; 256];
        let err = dequantize_row(DType::Q4K, &[0; 143], &mut out).unwrap_err();
        assert_eq!(
            err.to_string(),
            "256 values of q4_k take 144 bytes, but 143 bytes were given"
        );
        let err = dequantize_row(DType::F16, &[0; 6], &mut out[..2]).unwrap_err();
        assert!(matches!(
            err,
            QuantError::ByteLength {
                expected: 4,
                found: 6,
                ..
            }
        ));
        dequantize_row(DType::Q6K, &[], &mut []).unwrap();
    }
}
