//! Encoders from `f32` values to ggml's storage formats: `f32`, `f16`, `bf16` and the block
//! formats `q8_0`, `q5_0` and `q4_k`.
//!
//! The block quantizers reproduce ggml's reference quantizers (`quantize_row_q8_0_ref`,
//! `quantize_row_q5_0_ref` and `quantize_row_q4_K_ref` in llama.cpp's `ggml/src/ggml-quants.c`)
//! bit for bit: the same arithmetic in the same order, in `f32`, with no fused multiply-adds. These
//! are what `llama-quantize` runs when no importance matrix is given. ggml built for a CPU with FMA
//! (`-march=native`) may let the C compiler contract some of the `q4_k` search's sums into fused
//! multiply-adds; such builds can then differ from these bytes in rare near-tie blocks, as they do
//! from a portable ggml build.
//!
//! Every encoder takes a slice holding a whole number of blocks (a row, or many rows of a width that
//! is itself a whole number of blocks, since blocks never straddle rows) and writes exactly
//! [`encoded_len`] bytes.

use half::f16;
use tandem_backend_api::block::{q4_k, q5_0, q8_0};
use tandem_backend_api::DType;

/// The data types [`encode`] can produce, in [`DType`] declaration order.
pub const ENCODABLE: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::Bf16,
    DType::Q5_0,
    DType::Q8_0,
    DType::Q4K,
];

/// Why a row could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantizeError {
    /// The target type has no encoder here.
    #[error("cannot encode to {dtype}: encoders exist for f32, f16, bf16, q5_0, q8_0 and q4_k only")]
    Unsupported {
        /// The type asked for.
        dtype: DType,
    },
    /// The input is not a whole number of blocks.
    #[error("{elems} values are not a whole number of {dtype} blocks of {block} values")]
    PartialBlock {
        /// The type asked for.
        dtype: DType,
        /// Values given.
        elems: usize,
        /// Values per block of `dtype`.
        block: usize,
    },
    /// The output slice has the wrong length.
    #[error("{elems} values encode to {expected} bytes of {dtype}; the output buffer has {found}")]
    OutputLength {
        /// The type asked for.
        dtype: DType,
        /// Values given.
        elems: usize,
        /// Bytes the encoding takes.
        expected: usize,
        /// Bytes the output buffer has.
        found: usize,
    },
}

/// Bytes that `elems` values take as `dtype`, checking that `dtype` has an encoder and that
/// `elems` is a whole number of its blocks.
pub fn encoded_len(dtype: DType, elems: usize) -> Result<usize, QuantizeError> {
    if !ENCODABLE.contains(&dtype) {
        return Err(QuantizeError::Unsupported { dtype });
    }
    dtype.row_bytes(elems).ok_or(QuantizeError::PartialBlock {
        dtype,
        elems,
        block: dtype.block_elems(),
    })
}

/// Encodes `src` as `dtype` into `dst`, which must be exactly [`encoded_len`] bytes long.
///
/// Multi-byte fields are little-endian, as in GGUF files.
pub fn encode(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantizeError> {
    let expected = encoded_len(dtype, src.len())?;
    if dst.len() != expected {
        return Err(QuantizeError::OutputLength {
            dtype,
            elems: src.len(),
            expected,
            found: dst.len(),
        });
    }
    let block_elems = dtype.block_elems();
    let block_bytes = dtype.block_bytes();
    let blocks = src
        .chunks_exact(block_elems)
        .zip(dst.chunks_exact_mut(block_bytes));
    match dtype {
        DType::F32 => blocks.for_each(|(x, y)| y.copy_from_slice(&x[0].to_le_bytes())),
        DType::F16 => blocks.for_each(|(x, y)| y.copy_from_slice(&f32_to_f16_bits(x[0]).to_le_bytes())),
        DType::Bf16 => blocks.for_each(|(x, y)| y.copy_from_slice(&f32_to_bf16_bits(x[0]).to_le_bytes())),
        DType::Q8_0 => blocks.for_each(|(x, y)| quantize_block_q8_0(x, y)),
        DType::Q5_0 => blocks.for_each(|(x, y)| quantize_block_q5_0(x, y)),
        DType::Q4K => blocks.for_each(|(x, y)| quantize_block_q4_k(x, y)),
        other => return Err(QuantizeError::Unsupported { dtype: other }),
    }
    Ok(())
}

/// `x` as IEEE binary16 bits, rounded to nearest even; NaN becomes the quiet NaN `0x7e00` with
/// `x`'s sign, as ggml's `GGML_FP32_TO_FP16` does.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    if x.is_nan() {
        let sign = ((x.to_bits() >> 16) & 0x8000) as u16;
        return sign | 0x7e00;
    }
    f16::from_f32(x).to_bits()
}

/// `x` as bfloat16 bits, rounded to nearest even; NaN is kept and made quiet, as ggml's
/// `GGML_FP32_TO_BF16` does (no flushing of subnormals).
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    // Cannot overflow: the largest finite value plus the rounding bias stays below 2^32.
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// ggml's `nearest_int`: rounds to nearest, ties to even, by adding 1.5 * 2^23. Exact for
/// |`x`| <= 2^22; larger or non-finite inputs give an arbitrary value (as in ggml), never a panic.
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

fn f16_round_trip(x: f32) -> (u16, f32) {
    let bits = f32_to_f16_bits(x);
    (bits, f16::from_bits(bits).to_f32())
}

/// One `q8_0` block: f16 scale `amax / 127`, then 32 x int8 `round(x / scale)`.
fn quantize_block_q8_0(x: &[f32], y: &mut [u8]) {
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y[q8_0::D.range()].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
    for (q, &v) in y[q8_0::QS.range()].iter_mut().zip(x) {
        *q = ((v * id).round() as i8) as u8;
    }
}

/// One `q5_0` block: f16 scale `max / -16` (`max` the value of largest magnitude), 4 bytes of
/// fifth bits, then 16 bytes of low nibbles (value `j` low, value `j + 16` high).
fn quantize_block_q5_0(x: &[f32], y: &mut [u8]) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y[q5_0::D.range()].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
    let level = |v: f32| -> u8 { ((v * id + 16.5) as i8).min(31) as u8 };
    let mut qh = 0u32;
    let qs = &mut y[q5_0::QS.range()];
    for j in 0..16 {
        let lo = level(x[j]);
        let hi = level(x[j + 16]);
        qs[j] = (lo & 0x0f) | ((hi & 0x0f) << 4);
        qh |= u32::from((lo & 0x10) >> 4) << j;
        qh |= u32::from((hi & 0x10) >> 4) << (j + 16);
    }
    y[q5_0::QH.range()].copy_from_slice(&qh.to_le_bytes());
}

/// ggml's `make_qkx2_quants` for 32 values, squared error: searches a scale and a non-positive
/// offset `min` so that `x ~= scale * l + min` with `l` in `0..=nmax`, weighting each value's
/// error by `weights`. Writes the levels to `levels` and returns `(scale, -min)`.
///
/// A line-by-line transcription, kept as the oracle for [`make_qkx2_quants_x8`], which computes
/// the same for eight sub-blocks at once.
#[cfg(test)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32; 32],
    weights: &[f32; 32],
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..32 {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let level = |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..32 {
        levels[i] = level(iscale, x[i], min);
        let diff = scale * f32::from(levels[i]) + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut aux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..32 {
            aux[i] = level(iscale, x[i], min);
            let l = f32::from(aux[i]);
            let w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..32 {
                let diff = this_scale * f32::from(aux[i]) + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                levels.copy_from_slice(&aux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Lanes of [`make_qkx2_quants_x8`]: one per 32-value sub-block of a `q4_k` block.
type Lanes<T> = [T; 8];

/// ggml's `make_qkx2_quants(32, 15, x, weights, L, &the_min, Laux, -1.0, 0.1, 20, false)` (the
/// `q4_k` parameters) for the eight sub-blocks of a `q4_k` block at once: `xt[i][j]` and
/// `wt[i][j]` are value `i` of sub-block `j` and its weight. Each lane runs exactly the scalar
/// function's `f32` operations in its order, so results are bit-identical; running eight
/// independent searches side by side only lets the compiler use SIMD and the CPU overlap the
/// sequential sums. Writes the levels to `levels[i][j]` and returns each sub-block's scale and
/// `-min`.
fn make_qkx2_quants_x8(
    xt: &[Lanes<f32>; 32],
    wt: &[Lanes<f32>; 32],
    levels: &mut [Lanes<u8>; 32],
) -> (Lanes<f32>, Lanes<f32>) {
    const NMAX: i32 = 15;
    const RMIN: f32 = -1.0;
    const RDELTA: f32 = 0.1;
    const NSTEP: i32 = 20;
    // Levels are small integers, kept as f32 while searching.
    let level = |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, NMAX) as f32;

    let mut min = xt[0];
    let mut max = xt[0];
    let mut sum_w = wt[0];
    let mut sum_x: Lanes<f32> = std::array::from_fn(|j| sum_w[j] * xt[0][j]);
    for i in 1..32 {
        for j in 0..8 {
            let x = xt[i][j];
            if x < min[j] {
                min[j] = x;
            }
            if x > max[j] {
                max[j] = x;
            }
            let w = wt[i][j];
            sum_w[j] += w;
            sum_x[j] += w * x;
        }
    }
    for m in &mut min {
        if *m > 0.0 {
            *m = 0.0;
        }
    }
    // Lanes with max == min return early in ggml: all levels 0, scale 0. Here they run along on
    // meaningless (possibly infinite) numbers and are overwritten at the end.
    let flat: Lanes<bool> = std::array::from_fn(|j| max[j] == min[j]);
    let flat_min = min;

    let iscale: Lanes<f32> = std::array::from_fn(|j| NMAX as f32 / (max[j] - min[j]));
    let mut scale: Lanes<f32> = std::array::from_fn(|j| 1.0 / iscale[j]);
    let mut best_error = [0.0f32; 8];
    for i in 0..32 {
        for j in 0..8 {
            let diff = scale[j] * level(iscale[j], xt[i][j], min[j]) + min[j] - xt[i][j];
            best_error[j] += wt[i][j] * (diff * diff);
        }
    }
    // The best levels so far are level(best_iscale, x, best_from): recomputed once at the end
    // instead of copied at every improvement.
    let mut best_iscale = iscale;
    let mut best_from = min;
    let mut aux = [[0.0f32; 8]; 32];
    for is in 0..=NSTEP {
        // `min` moves with the best fit so far, and the range with it.
        let iscale: Lanes<f32> =
            std::array::from_fn(|j| (RMIN + RDELTA * is as f32 + NMAX as f32) / (max[j] - min[j]));
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
        for i in 0..32 {
            for j in 0..8 {
                let l = level(iscale[j], xt[i][j], min[j]);
                aux[i][j] = l;
                let w = wt[i][j];
                sum_l[j] += w * l;
                sum_l2[j] += w * l * l;
                sum_xl[j] += w * l * xt[i][j];
            }
        }
        let mut this_scale = [0.0f32; 8];
        let mut this_min = [0.0f32; 8];
        let mut det = [0.0f32; 8];
        for j in 0..8 {
            det[j] = sum_w[j] * sum_l2[j] - sum_l[j] * sum_l[j];
            this_scale[j] = (sum_w[j] * sum_xl[j] - sum_x[j] * sum_l[j]) / det[j];
            this_min[j] = (sum_l2[j] * sum_x[j] - sum_l[j] * sum_xl[j]) / det[j];
            if this_min[j] > 0.0 {
                this_min[j] = 0.0;
                this_scale[j] = sum_xl[j] / sum_l2[j];
            }
        }
        let mut cur_error = [0.0f32; 8];
        for i in 0..32 {
            for j in 0..8 {
                let diff = this_scale[j] * aux[i][j] + this_min[j] - xt[i][j];
                cur_error[j] += wt[i][j] * (diff * diff);
            }
        }
        for j in 0..8 {
            if det[j] > 0.0 && cur_error[j] < best_error[j] {
                best_error[j] = cur_error[j];
                best_iscale[j] = iscale[j];
                best_from[j] = min[j];
                scale[j] = this_scale[j];
                min[j] = this_min[j];
            }
        }
    }
    for (row, x) in levels.iter_mut().zip(xt) {
        for j in 0..8 {
            row[j] = if flat[j] {
                0
            } else {
                level(best_iscale[j], x[j], best_from[j]) as u8
            };
        }
    }
    for j in 0..8 {
        if flat[j] {
            scale[j] = 0.0;
            min[j] = flat_min[j];
        }
    }
    (scale, min.map(|m| -m))
}

/// The 6-bit scale and min of sub-block `j` from a `q4_k` block's 12 packed scale bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// One `q4_k` super-block of 256 values: f16 `d`, f16 `dmin`, 12 bytes of eight 6-bit scales and
/// mins, then 128 bytes of 4-bit levels (each 64 values as 32 bytes, the first 32 values in the low
/// nibbles). Value `i` of sub-block `j` decodes as `d * scale_j * l - dmin * min_j`.
fn quantize_block_q4_k(x: &[f32], y: &mut [u8]) {
    // Sub-block j in lane j.
    let mut xt = [[0.0f32; 8]; 32];
    let mut wt = [[0.0f32; 8]; 32];
    for j in 0..8 {
        let sub = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in sub {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (i, &v) in sub.iter().enumerate() {
            xt[i][j] = v;
            wt[i][j] = av_x + v.abs();
        }
    }
    let mut lt = [[0u8; 8]; 32];
    let (scales, mins) = make_qkx2_quants_x8(&xt, &wt, &mut lt);
    let mut levels = [0u8; 256];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        for (i, row) in lt.iter().enumerate() {
            levels[32 * j + i] = row[j];
        }
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }

    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d_bits, d) = f16_round_trip(max_scale / 63.0);
    let (dmin_bits, dmin) = f16_round_trip(max_min / 63.0);

    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d * f32::from(sc);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * f32::from(m);
        for i in 32 * j..32 * j + 32 {
            levels[i] = nearest_int((x[i] + dm) / dj).clamp(0, 15) as u8;
        }
    }

    y[q4_k::D.range()].copy_from_slice(&d_bits.to_le_bytes());
    y[q4_k::DMIN.range()].copy_from_slice(&dmin_bits.to_le_bytes());
    y[q4_k::SCALES.range()].copy_from_slice(&packed);
    for (chunk, qs) in levels
        .chunks_exact(64)
        .zip(y[q4_k::QS.range()].chunks_exact_mut(32))
    {
        for l in 0..32 {
            qs[l] = chunk[l] | (chunk[l + 32] << 4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test input: `n` values from a 64-bit LCG, each an exact `f32` (a 24-bit integer times a
    /// power of two), so the same numbers are easy to produce outside Rust. Case `c` shapes block
    /// `b` (of `block` values): see [`case_value`].
    fn test_values(n: usize, block: usize) -> Vec<f32> {
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        (0..n)
            .map(|i| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let r = ((state >> 40) as i32) - (1 << 23);
                case_value(i / block % 6, i % block, r)
            })
            .collect()
    }

    /// Block kinds, cycling: 0 uniform +-0.031, 1 like 0 with every 37th value 64x larger,
    /// 2 non-negative, 3 all zero, 4 constant 0.5, 5 non-positive and tiny (+-1.9e-6).
    fn case_value(case: usize, i: usize, r: i32) -> f32 {
        let u = r as f32 * (1.0 / (1u64 << 28) as f32);
        match case {
            0 => u,
            1 if i % 37 == 5 => u * 64.0,
            1 => u,
            2 => u.abs(),
            3 => 0.0,
            4 => 0.5,
            _ => -(u.abs()) * (1.0 / (1u64 << 14) as f32),
        }
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    fn encode_vec(dtype: DType, src: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; encoded_len(dtype, src.len()).unwrap()];
        encode(dtype, src, &mut out).unwrap();
        out
    }

    #[test]
    fn test_values_match_the_python_generator() {
        // The first values as printed by the generator in the report's Python cross-check.
        let v = test_values(4, 256);
        let expected = [-0.001_742_731_8_f32, -0.017_725_319, 0.023_811_754, 0.006_891_519];
        for (a, b) in v.iter().zip(expected) {
            assert!((a - b).abs() < 1e-8, "{v:?}");
        }
    }

    #[test]
    fn f16_and_bf16_round_like_ggml() {
        // Expected values from numpy's `astype(float16)` and gguf-py's BF16 encoder, except the
        // NaN's f16, which is ggml's fixed 0x7e00 (numpy keeps payload bits: 0x7d00).
        let cases: [(u32, u16, u16); 15] = [
            (0x0000_0000, 0x0000, 0x0000),
            (0x8000_0000, 0x8000, 0x8000),
            (0x3f80_0000, 0x3c00, 0x3f80),
            (0x3f80_2000, 0x3c01, 0x3f80),
            (0x477f_f000, 0x7c00, 0x4780), // 65520 overflows f16
            (0x3380_d959, 0x0001, 0x3381), // 6e-8: f16 subnormal
            (0x7f80_0000, 0x7c00, 0x7f80),
            (0x3f80_8000, 0x3c04, 0x3f80), // bf16 tie, to even (down)
            (0x3f81_8000, 0x3c0c, 0x3f82), // bf16 tie, to even (up)
            (0x7fa0_0001, 0x7e00, 0x7fe0), // signalling NaN made quiet
            (0x3f80_0fff, 0x3c00, 0x3f80),
            (0x3f80_1000, 0x3c00, 0x3f80), // f16 tie, to even (down)
            (0x3f80_3000, 0x3c02, 0x3f80), // f16 tie, to even (up)
            (0x0001_16c2, 0x0000, 0x0001), // 1e-40: bf16 keeps subnormals
            (0xff61_b1e6, 0xfc00, 0xff62),
        ];
        for (bits, f16_bits, bf16_bits) in cases {
            let x = f32::from_bits(bits);
            assert_eq!(f32_to_f16_bits(x), f16_bits, "f16 of {x:e} ({:#x})", x.to_bits());
            assert_eq!(
                f32_to_bf16_bits(x),
                bf16_bits,
                "bf16 of {x:e} ({:#x})",
                x.to_bits()
            );
        }
        assert_eq!(f32_to_f16_bits(-f32::NAN), 0xfe00);
    }

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(14.49), 14);
    }

    // Expected bytes come from ggml's reference quantizers (ggml-quants.c built with plain
    // `gcc -O2`, no FMA) and, for q8_0 and q5_0, agree with gguf-py's `gguf.quants.quantize`.

    #[test]
    fn q8_0_matches_ggml_reference() {
        let out = encode_vec(DType::Q8_0, &test_values(1536, 256));
        assert_eq!(out.len(), 48 * 34);
        assert_eq!(hex(&out[..34]), Q8_0_FIRST_BLOCK);
        assert_eq!(fnv1a(&out), Q8_0_FNV);
    }

    #[test]
    fn q5_0_matches_ggml_reference() {
        let out = encode_vec(DType::Q5_0, &test_values(1536, 256));
        assert_eq!(out.len(), 48 * 22);
        assert_eq!(hex(&out[..22]), Q5_0_FIRST_BLOCK);
        assert_eq!(fnv1a(&out), Q5_0_FNV);
    }

    #[test]
    fn q4_k_matches_ggml_reference() {
        let out = encode_vec(DType::Q4K, &test_values(1536, 256));
        assert_eq!(out.len(), 6 * 144);
        for (b, block) in out.chunks_exact(144).enumerate() {
            assert_eq!(hex(block), Q4_K_BLOCKS[b], "block {b}");
        }
    }

    #[test]
    fn q4_k_eight_lane_search_matches_the_scalar_transcription() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            state
        };
        for round in 0..3000 {
            let mut xt = [[0.0f32; 8]; 32];
            let mut wt = [[0.0f32; 8]; 32];
            for j in 0..8 {
                let scale = f32::powi(10.0, (next() % 9) as i32 - 6);
                let kind = (next() >> 20) % 6;
                for (i, row) in xt.iter_mut().enumerate() {
                    let u = ((next() >> 40) as i32 - (1 << 23)) as f32 / (1 << 23) as f32;
                    row[j] = match kind {
                        0 => u * scale,
                        1 => u.abs() * scale,
                        2 => -(u.abs()) * scale,
                        3 => 0.25,
                        4 if i % 7 == 0 => u * scale * 40.0,
                        _ => (u * 4.0).round() * scale,
                    };
                }
                let sum_x2: f32 = (0..32).fold(0.0, |s, i| s + xt[i][j] * xt[i][j]);
                let av_x = (sum_x2 / 32.0).sqrt();
                (0..32).for_each(|i| wt[i][j] = av_x + xt[i][j].abs());
            }
            let mut lt = [[0u8; 8]; 32];
            let (scales, mins) = make_qkx2_quants_x8(&xt, &wt, &mut lt);
            for j in 0..8 {
                let x: [f32; 32] = std::array::from_fn(|i| xt[i][j]);
                let w: [f32; 32] = std::array::from_fn(|i| wt[i][j]);
                let mut levels = [0u8; 32];
                let (scale, min) = make_qkx2_quants(15, &x, &w, &mut levels, -1.0, 0.1, 20);
                assert_eq!(scale.to_bits(), scales[j].to_bits(), "round {round} lane {j}");
                assert_eq!(min.to_bits(), mins[j].to_bits(), "round {round} lane {j}");
                assert_eq!(
                    levels,
                    std::array::from_fn(|i| lt[i][j]),
                    "round {round} lane {j}"
                );
            }
        }
    }

    #[test]
    fn q4_k_round_trips_within_its_step() {
        let src = test_values(256, 256);
        let out = encode_vec(DType::Q4K, &src);
        let d = f16::from_bits(u16::from_le_bytes([out[0], out[1]])).to_f32();
        let dmin = f16::from_bits(u16::from_le_bytes([out[2], out[3]])).to_f32();
        for (i, &x) in src.iter().enumerate() {
            let (j, l) = (i / 32, i % 32);
            let (sc, m) = scale_min_k4(j, &out[4..16]);
            let byte = out[16 + (j / 2) * 32 + l];
            let q = if j % 2 == 0 { byte & 0x0f } else { byte >> 4 };
            let y = d * f32::from(sc) * f32::from(q) - dmin * f32::from(m);
            assert!(
                (x - y).abs() <= d * f32::from(sc) * 0.75 + 1e-6,
                "value {i}: {x} vs {y}"
            );
        }
    }

    /// Every encoder, then `kit::quant`'s decoder: each value comes back within its format's
    /// error. The float types round once (to the nearest f16 or bf16). The block formats are
    /// checked per block against the scales it stores (read at `block`'s offsets):
    ///
    /// - `q8_0`: half a step `d`, plus the f16 rounding of `d` (2^-11 of it, or 2^-25 among the
    ///   subnormals of the tiny blocks) over up to 127 steps, since the codes are chosen against
    ///   the unrounded scale.
    /// - `q5_0`: a whole step (the code opposite the value of largest magnitude saturates at 15
    ///   where 16 was due) plus that rounding over 16 steps.
    /// - `q4_k`: the nearest point of the sub-block's grid `d * scale * q - dmin * min`, `q` in
    ///   0..=15, since its codes are chosen against the decoded step and min: within half a step
    ///   inside the grid's range, its end outside it (the scale search fits the range by weighted
    ///   least squares and may leave outliers outside).
    #[test]
    fn every_encoder_round_trips_through_kit_quant_within_its_error() {
        use tandem_backend_api::kit::quant::dequantize_row;
        let f16_at = |b: &[u8], at: usize| f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32();
        // 24 blocks of 256 values: each of test_values' six kinds four times.
        let src = test_values(6 * 256 * 4, 256);
        for dtype in ENCODABLE {
            let bytes = encode_vec(dtype, &src);
            let mut back = vec![f32::NAN; src.len()];
            dequantize_row(dtype, &bytes, &mut back).unwrap();
            let per_block = dtype.block_elems();
            for (b, (blk, (xs, ys))) in bytes
                .chunks_exact(dtype.block_bytes())
                .zip(src.chunks_exact(per_block).zip(back.chunks_exact(per_block)))
                .enumerate()
            {
                for (i, (&x, &y)) in xs.iter().zip(ys).enumerate() {
                    let at = format!("{dtype} block {b} value {i}: {x} came back as {y}");
                    let sub = 2f32.powi(-25);
                    let bound = match dtype {
                        DType::F32 => 0.0,
                        DType::F16 => (x - f16::from_f32(x).to_f32()).abs(),
                        DType::Bf16 => (x - half::bf16::from_f32(x).to_f32()).abs(),
                        DType::Q8_0 => {
                            let d = f16_at(blk, q8_0::D.at).abs();
                            0.5 * d + 127.0 * (d / 2048.0).max(sub)
                        }
                        DType::Q5_0 => {
                            let d = f16_at(blk, q5_0::D.at).abs();
                            d + 16.0 * (d / 2048.0).max(sub)
                        }
                        DType::Q4K => {
                            let (sc, m) = scale_min_k4(i / 32, &blk[q4_k::SCALES.range()]);
                            let step = f16_at(blk, q4_k::D.at) * f32::from(sc);
                            let lo = -(f16_at(blk, q4_k::DMIN.at) * f32::from(m));
                            let hi = step * 15.0 + lo;
                            if x < lo || x > hi {
                                let end = if x < lo { lo } else { hi };
                                assert_eq!(y, end, "{at}: outside the grid [{lo}, {hi}], not its end");
                                continue;
                            }
                            0.5 * step * (1.0 + 1.0 / 1024.0) + 1e-9
                        }
                        other => unreachable!("{other} has no encoder"),
                    };
                    assert!((x - y).abs() <= bound, "{at} (bound {bound})");
                }
            }
        }
    }

    #[test]
    fn lengths_are_checked() {
        assert_eq!(
            encoded_len(DType::Q4K, 640),
            Err(QuantizeError::PartialBlock {
                dtype: DType::Q4K,
                elems: 640,
                block: 256
            })
        );
        assert_eq!(
            encoded_len(DType::Q6K, 256),
            Err(QuantizeError::Unsupported { dtype: DType::Q6K })
        );
        assert_eq!(encoded_len(DType::F32, 3), Ok(12));
        let mut short = [0u8; 33];
        assert!(matches!(
            encode(DType::Q8_0, &[0.0; 32], &mut short),
            Err(QuantizeError::OutputLength {
                expected: 34,
                found: 33,
                ..
            })
        ));
        let mut out = [0u8; 8];
        encode(DType::F16, &[1.0, -2.0, 0.5, 65_504.0], &mut out).unwrap();
        assert_eq!(out, [0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38, 0xff, 0x7b]);
    }

    const Q8_0_FIRST_BLOCK: &str = "070cf9b8611c60dad981638ed4dedac7f561432651207132eab9f75718ece0d3a9f6";
    const Q8_0_FNV: u64 = 0x34bf17cc67cfa2fe;
    const Q5_0_FIRST_BLOCK: &str = "fd171c813f068f57ac44ec6bdb70fcb23adccba95ffc";
    const Q5_0_FNV: u64 = 0x66297e0dda80e88a;
    const Q4_K_BLOCKS: [&str; 6] = [
        concat!(
        "a7040310f6fcf7fffbfeffffe966e7b697c3ae19ee559580be20b52585c487ce4c7abd5a1f8bd613874d49763605d277",
        "c3ce07aa2944499bc05b46e03ac12f119da253424fb7aaca9394b59c41483f7f119b65c6379dd356916233d0b101bf74",
        "fe6abf39f3e5cafaa17cca87b9c68ac4bda82f11c73bef50d4c3f502c6b442bfd6b9ab0618f65e5a0863de4e65b8ee10",
    ),
        concat!(
        "a2172627a7ec3f3002293f01140312abe1e1e1e1e1efe1e1e1e001e1e1e1e1e0e1e1e1e0e1e1e1e1e1e1e1e0e1e1e1e1",
        "0f0f1f0f0f0f0f0f0f1f0f1f1f1f1f100f0f0f0fff0f1f1f1f0f0f0f0f1f1f0f00010101000001000001000101000101",
        "0000000100000000000f01010001f000d1f6e00bc9dde2ccc3ddedc8d7d7fcf3eacec7ecedd1ffcbecf6d5f5edebe2ea",
    ),
        concat!(
        "3202a800fdf9fafad92c1640fc050ccf1c54e5ddf99fc987fc3071367f5cbd636d4479a23884eb35cda027c1285758a4",
        "2853855ea255bf28fd952f1ffb95a4a4c55a8f98e572bab11f04366145d4a58549c722f30f898a312894df2957d273b1",
        "15ac54684bef48591707681f86985c9aa5be86ea1ecf567a7727d24e49bb5411e5a4ed65c7985529dafd2424b7ee9583",
    ),
        concat!(
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    ),
        concat!(
        "56100000ffffffff000000000f0f0f0fffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
        "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
        "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
    ),
        concat!(
        "00000100fefdf4fffcfbf8fdceabdafe1258b896a199238191832569a23cf302503342bc7cd3d426073f5491986025dc",
        "ed62e111dcfaefd0bd2f842d7b9444a3570fc6556f50ff8d9f891d2f5874b5d03edc2ccb31cc99cf1e314dc21cc6d07a",
        "97642b1e11d61b594643b3c042fd1a0c40cfff17469b9bfab31aaea1ef43afea48f6cf5c2f018a4cf9d61ef20bc0d2e6",
    ),
    ];
}
