//! Quantized-activation matmul for block-quantized weights, in the manner of ggml's CPU backend.
//!
//! Each activation row is quantized once per matmul to 8-bit blocks: 32 values with an `f32`
//! scale for the 32-element formats (`q8_0`, `q5_0`), or 256 values with an `f32` scale and 16
//! sums of 16 values for the K formats (`q4_k`, `q6_k`). A dot product is then an exact integer
//! dot per weight block, scaled in `f32` block by block in a fixed order. The AVX2 functions
//! compute the same integer sums as the scalar ones, and the `f32` arithmetic around them is
//! identical, so both paths give bit-identical results; they differ from the reference `f32` path
//! by the rounding of the activations to 8 bits (relative error about 1e-3 of the dot's scale).

use std::cell::RefCell;

use half::f16;
use rayon::prelude::*;
use tandem_backend_api::DType;

use crate::kernels::WeightView;

/// Weight rows per parallel task.
const CHUNK: usize = 16;

/// The weight formats this module covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Q8_0,
    Q5_0,
    Q4K,
    Q6K,
}

impl Kind {
    fn of(dtype: DType) -> Option<Kind> {
        match dtype {
            DType::Q8_0 => Some(Kind::Q8_0),
            DType::Q5_0 => Some(Kind::Q5_0),
            DType::Q4K => Some(Kind::Q4K),
            DType::Q6K => Some(Kind::Q6K),
            _ => None,
        }
    }

    /// Elements per activation block (and per weight block).
    fn block(self) -> usize {
        match self {
            Kind::Q8_0 | Kind::Q5_0 => 32,
            Kind::Q4K | Kind::Q6K => 256,
        }
    }

    fn block_bytes(self) -> usize {
        match self {
            Kind::Q8_0 => 34,
            Kind::Q5_0 => 22,
            Kind::Q4K => 144,
            Kind::Q6K => 210,
        }
    }
}

/// Proof that AVX2 and FMA were detected at run time; only [`Simd::detect`] makes one.
#[derive(Clone, Copy)]
struct Simd(());

impl Simd {
    fn detect() -> Option<Simd> {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Some(Simd(()));
            }
        }
        None
    }
}

/// Quantized activation rows: per block an `f32` scale, the `i8` values, and (K formats) sums
/// of each 16 values.
#[derive(Default)]
struct Acts {
    d: Vec<f32>,
    qs: Vec<i8>,
    bsums: Vec<i16>,
}

/// One quantized activation row.
#[derive(Clone, Copy)]
struct ActRow<'a> {
    d: &'a [f32],
    qs: &'a [i8],
    bsums: &'a [i16],
}

impl Acts {
    /// Quantizes `rows` rows of `k` values (`k` a whole number of `kind` blocks), reusing storage.
    fn quantize(&mut self, x: &[f32], rows: usize, k: usize, kind: Kind) {
        let bs = kind.block();
        let with_sums = bs == 256;
        let total = rows * k;
        grow(&mut self.d, total / bs);
        grow(&mut self.qs, total);
        if with_sums {
            grow(&mut self.bsums, total / 16);
        }
        for (b, (xs, qs)) in x[..total]
            .chunks_exact(bs)
            .zip(self.qs[..total].chunks_exact_mut(bs))
            .enumerate()
        {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            if amax == 0.0 || !amax.is_finite() {
                // A zero block, or one with infinities or NaNs, which no 8-bit scale represents:
                // leave the rest to the caller's reference path by flagging it with NaN.
                self.d[b] = if amax == 0.0 { 0.0 } else { f32::NAN };
                qs.fill(0);
            } else {
                let id = 127.0 / amax;
                self.d[b] = amax / 127.0;
                for (q, v) in qs.iter_mut().zip(xs) {
                    *q = (v * id).round().clamp(-127.0, 127.0) as i8;
                }
            }
            if with_sums {
                for (s, q) in self.bsums[b * 16..b * 16 + 16]
                    .iter_mut()
                    .zip(qs.chunks_exact(16))
                {
                    *s = q.iter().map(|&v| i16::from(v)).sum();
                }
            }
        }
    }

    fn row(&self, r: usize, k: usize, kind: Kind) -> ActRow<'_> {
        let nb = k / kind.block();
        let bsums = if kind.block() == 256 {
            &self.bsums[r * k / 16..(r + 1) * k / 16]
        } else {
            &[][..]
        };
        ActRow {
            d: &self.d[r * nb..(r + 1) * nb],
            qs: &self.qs[r * k..(r + 1) * k],
            bsums,
        }
    }
}

fn grow<T: Default + Clone>(v: &mut Vec<T>, len: usize) {
    if v.len() < len {
        v.resize(len, T::default());
    }
}

thread_local! {
    /// Quantized activations of the calling thread's current matmul, kept between calls.
    static ACTS: RefCell<Acts> = RefCell::default();
}

/// `Op::MatMul` through quantized activations, writing the column-major product to `scratch` as
/// `kernels::matmul` does. Returns `false`, having written nothing, where the weight format is
/// not covered or the activations are not all finite; the caller then uses the reference path.
pub fn matmul(pool: &rayon::ThreadPool, x: &[f32], rows: usize, w: &WeightView, scratch: &mut [f32]) -> bool {
    let Some(kind) = Kind::of(w.dtype) else {
        return false;
    };
    let k = w.k;
    if rows == 0 || k == 0 || !k.is_multiple_of(kind.block()) {
        return false;
    }
    let rb = k / kind.block() * kind.block_bytes();
    if w.bytes.len() < w.n * rb || x.len() < rows * k {
        return false;
    }
    let simd = Simd::detect();
    ACTS.with(|cell| {
        let mut acts = cell.borrow_mut();
        acts.quantize(x, rows, k, kind);
        let nb = rows * k / kind.block();
        if acts.d[..nb].iter().any(|d| d.is_nan()) {
            return false;
        }
        let acts = &*acts;
        pool.install(|| {
            scratch[..w.n * rows]
                .par_chunks_mut(CHUNK * rows)
                .enumerate()
                .for_each(|(chunk, dst)| {
                    for (c, col) in dst.chunks_exact_mut(rows).enumerate() {
                        let j = chunk * CHUNK + c;
                        let wr = &w.bytes[j * rb..(j + 1) * rb];
                        for (r, o) in col.iter_mut().enumerate() {
                            *o = dot(kind, simd, wr, acts.row(r, k, kind));
                        }
                    }
                })
        });
        true
    })
}

/// The dot product of one weight row (whole blocks of `kind`) with one quantized activation row.
fn dot(kind: Kind, simd: Option<Simd>, w: &[u8], a: ActRow) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = simd {
        return avx2::dot(s, kind, w, a);
    }
    let _ = simd;
    scalar::dot(kind, w, a)
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a `q4_k` block from its 12 packed bytes.
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

/// `q4_k` block: the integer sum of `min * (sum of its 32 activations)` over the 8 sub-blocks.
fn q4k_min_sum(packed: &[u8], bsums: &[i16]) -> i32 {
    (0..8)
        .map(|j| {
            let (_, m) = k_scale_min(packed, j);
            i32::from(m) * (i32::from(bsums[2 * j]) + i32::from(bsums[2 * j + 1]))
        })
        .sum()
}

/// `q6_k` block: `32 * sum(scale * bsum)`, the offset of its unsigned 6-bit values.
fn q6k_offset(scales: &[u8], bsums: &[i16]) -> i32 {
    32 * scales
        .iter()
        .zip(bsums)
        .map(|(&s, &b)| i32::from(s as i8) * i32::from(b))
        .sum::<i32>()
}

/// The `f32` step shared by both paths: block `acc += (wd * ad) * isum - (wm * ad) * msum`.
#[inline(always)]
fn k_step(acc: f32, wd: f32, wm: f32, ad: f32, isum: i32, msum: i32) -> f32 {
    acc + (wd * ad) * isum as f32 - (wm * ad) * msum as f32
}

mod scalar {
    use super::*;

    pub(super) fn dot(kind: Kind, w: &[u8], a: ActRow) -> f32 {
        match kind {
            Kind::Q8_0 => q8_0(w, a),
            Kind::Q5_0 => q5_0(w, a),
            Kind::Q4K => q4_k(w, a),
            Kind::Q6K => q6_k(w, a),
        }
    }

    fn q8_0(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(34).enumerate() {
            let y = &a.qs[32 * b..32 * b + 32];
            let isum: i32 = blk[2..34]
                .iter()
                .zip(y)
                .map(|(&q, &y)| i32::from(q as i8) * i32::from(y))
                .sum();
            acc += (f16_at(blk, 0) * a.d[b]) * isum as f32;
        }
        acc
    }

    fn q5_0(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(22).enumerate() {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            let y = &a.qs[32 * b..32 * b + 32];
            let mut isum = 0i32;
            for (j, &q) in blk[6..22].iter().enumerate() {
                let h0 = ((qh >> j) & 1) as u8;
                let h1 = ((qh >> (j + 16)) & 1) as u8;
                let v0 = i32::from((q & 0x0F) | (h0 << 4)) - 16;
                let v1 = i32::from((q >> 4) | (h1 << 4)) - 16;
                isum += v0 * i32::from(y[j]) + v1 * i32::from(y[j + 16]);
            }
            acc += (f16_at(blk, 0) * a.d[b]) * isum as f32;
        }
        acc
    }

    fn q4_k(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(144).enumerate() {
            let packed = &blk[4..16];
            let qs = &blk[16..144];
            let y = &a.qs[256 * b..256 * b + 256];
            let mut isum = 0i32;
            for c in 0..4 {
                let (s1, _) = k_scale_min(packed, 2 * c);
                let (s2, _) = k_scale_min(packed, 2 * c + 1);
                let (mut p1, mut p2) = (0i32, 0i32);
                for (l, &q) in qs[32 * c..32 * c + 32].iter().enumerate() {
                    p1 += i32::from(q & 0x0F) * i32::from(y[64 * c + l]);
                    p2 += i32::from(q >> 4) * i32::from(y[64 * c + 32 + l]);
                }
                isum += i32::from(s1) * p1 + i32::from(s2) * p2;
            }
            let msum = q4k_min_sum(packed, &a.bsums[16 * b..16 * b + 16]);
            acc = k_step(acc, f16_at(blk, 0), f16_at(blk, 2), a.d[b], isum, msum);
        }
        acc
    }

    fn q6_k(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(210).enumerate() {
            let y = &a.qs[256 * b..256 * b + 256];
            let scales = &blk[192..208];
            let mut isum = 0i32;
            for half in 0..2 {
                let ql = &blk[64 * half..64 * half + 64];
                let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
                for s in 0..4 {
                    for sub in 0..2 {
                        let mut p = 0i32;
                        for l in 16 * sub..16 * sub + 16 {
                            let low = if s < 2 {
                                ql[l + 32 * s] & 0x0F
                            } else {
                                ql[l + 32 * (s - 2)] >> 4
                            };
                            let q = low | (((qh[l] >> (2 * s)) & 3) << 4);
                            p += i32::from(q) * i32::from(y[128 * half + 32 * s + l]);
                        }
                        isum += i32::from(scales[8 * half + 2 * s + sub] as i8) * p;
                    }
                }
            }
            isum -= q6k_offset(scales, &a.bsums[16 * b..16 * b + 16]);
            acc = k_step(acc, f16_at(blk, 208), 0.0, a.d[b], isum, 0);
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::*;

    pub(super) fn dot(_proof: Simd, kind: Kind, w: &[u8], a: ActRow) -> f32 {
        let nb = w.len() / kind.block_bytes();
        assert!(
            w.len() == nb * kind.block_bytes()
                && a.d.len() >= nb
                && a.qs.len() >= nb * kind.block()
                && (kind.block() != 256 || a.bsums.len() >= nb * 16)
        );
        // SAFETY: a `Simd` exists only where AVX2 and FMA were detected at run time; the slice
        // lengths the functions read within are checked just above.
        unsafe {
            match kind {
                Kind::Q8_0 => q8_0(w, a),
                Kind::Q5_0 => q5_0(w, a),
                Kind::Q4K => q4_k(w, a),
                Kind::Q6K => q6_k(w, a),
            }
        }
    }

    /// The sum of the eight `i32` lanes.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// Pairwise-summed products of signed bytes as eight `i32`s (exact: `|x| <= 128`,
    /// `|y| <= 127`).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256i {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
    }

    /// 32 bytes from `p` (the caller keeps `p..p + 32` in bounds).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 32 readable bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn q8_0(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(34).enumerate() {
            let y = &a.qs[32 * b..32 * b + 32];
            // SAFETY: `blk[2..34]` and `y` each hold 32 bytes.
            let isum = unsafe {
                hsum(mul_sum_i8(
                    load(blk[2..34].as_ptr()),
                    load(y.as_ptr() as *const u8),
                ))
            };
            acc += (f16_at(blk, 0) * a.d[b]) * isum as f32;
        }
        acc
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn q5_0(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        let m4 = _mm256_set1_epi8(0x0F);
        let hi_off = _mm256_set1_epi8(0xF0u8 as i8);
        let spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        let ones = _mm256_set1_epi64x(-1);
        for (b, blk) in w.chunks_exact(22).enumerate() {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            let y = &a.qs[32 * b..32 * b + 32];
            // SAFETY: `blk[6..22]` holds 16 bytes and `y` 32.
            let isum = unsafe {
                let lo = _mm_loadu_si128(blk[6..22].as_ptr() as *const __m128i);
                let nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(lo), lo), m4);
                // Byte j all ones where bit j of `qh` is set.
                let bits = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
                let set = _mm256_cmpeq_epi8(_mm256_or_si256(bits, bit_mask), ones);
                // Clear fifth bit: value q - 16, i.e. q | 0xF0 as a signed byte.
                let q = _mm256_or_si256(nib, _mm256_andnot_si256(set, hi_off));
                hsum(mul_sum_i8(q, load(y.as_ptr() as *const u8)))
            };
            acc += (f16_at(blk, 0) * a.d[b]) * isum as f32;
        }
        acc
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn q4_k(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        let m4 = _mm256_set1_epi8(0x0F);
        for (b, blk) in w.chunks_exact(144).enumerate() {
            let packed = &blk[4..16];
            let qs = &blk[16..144];
            let y = &a.qs[256 * b..256 * b + 256];
            let mut sums = _mm256_setzero_si256();
            for c in 0..4 {
                let (s1, _) = k_scale_min(packed, 2 * c);
                let (s2, _) = k_scale_min(packed, 2 * c + 1);
                // SAFETY: `qs[32c..32c + 32]` and `y[64c..64c + 64]` are in bounds.
                unsafe {
                    let q = load(qs[32 * c..32 * c + 32].as_ptr());
                    let lo = _mm256_and_si256(q, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                    let y0 = load(y[64 * c..64 * c + 32].as_ptr() as *const u8);
                    let y1 = load(y[64 * c + 32..64 * c + 64].as_ptr() as *const u8);
                    let p1 =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(i16::from(s1)));
                    let p2 =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), _mm256_set1_epi16(i16::from(s2)));
                    sums = _mm256_add_epi32(sums, _mm256_add_epi32(p1, p2));
                }
            }
            // SAFETY: plain register arithmetic.
            let isum = unsafe { hsum(sums) };
            let msum = q4k_min_sum(packed, &a.bsums[16 * b..16 * b + 16]);
            acc = k_step(acc, f16_at(blk, 0), f16_at(blk, 2), a.d[b], isum, msum);
        }
        acc
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn q6_k(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        for (b, blk) in w.chunks_exact(210).enumerate() {
            let y = &a.qs[256 * b..256 * b + 256];
            let scales = &blk[192..208];
            let mut sums = _mm256_setzero_si256();
            for half in 0..2 {
                // SAFETY: `blk[64 half..64 half + 64]`, `blk[128 + 32 half..][..32]` and
                // `y[128 half..128 half + 128]` are in bounds.
                unsafe {
                    let qa = load(blk[64 * half..64 * half + 32].as_ptr());
                    let qb = load(blk[64 * half + 32..64 * half + 64].as_ptr());
                    let qh = load(blk[128 + 32 * half..160 + 32 * half].as_ptr());
                    let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m2));
                    let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_slli_epi16::<2>(m2)));
                    let h2 = _mm256_and_si256(qh, _mm256_slli_epi16::<4>(m2));
                    let h3 = _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_slli_epi16::<6>(m2)));
                    let q = [
                        _mm256_or_si256(_mm256_and_si256(qa, m4), h0),
                        _mm256_or_si256(_mm256_and_si256(qb, m4), h1),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(qa), m4), h2),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(qb), m4), h3),
                    ];
                    for (s, &qs) in q.iter().enumerate() {
                        let ys = load(y[128 * half + 32 * s..128 * half + 32 * s + 32].as_ptr() as *const u8);
                        let scv = _mm256_set_m128i(
                            _mm_set1_epi16(i16::from(scales[8 * half + 2 * s + 1] as i8)),
                            _mm_set1_epi16(i16::from(scales[8 * half + 2 * s] as i8)),
                        );
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(qs, ys), scv);
                        sums = _mm256_add_epi32(sums, p);
                    }
                }
            }
            // SAFETY: plain register arithmetic.
            let isum = unsafe { hsum(sums) } - q6k_offset(scales, &a.bsums[16 * b..16 * b + 16]);
            acc = k_step(acc, f16_at(blk, 208), 0.0, a.d[b], isum, 0);
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::decode_row;

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn byte(&mut self) -> u8 {
            (self.next() >> 32) as u8
        }

        /// Uniform in [-1, 1).
        fn unit(&mut self) -> f32 {
            ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// Random weight blocks with small, finite `f16` scales at the format's scale offsets.
    fn random_row(kind: Kind, k: usize, rng: &mut Rng) -> Vec<u8> {
        let mut bytes: Vec<u8> = (0..k / kind.block() * kind.block_bytes())
            .map(|_| rng.byte())
            .collect();
        let scale_at: &[usize] = match kind {
            Kind::Q8_0 | Kind::Q5_0 => &[0],
            Kind::Q4K => &[0, 2],
            Kind::Q6K => &[208],
        };
        for blk in bytes.chunks_exact_mut(kind.block_bytes()) {
            for &at in scale_at {
                let v = f16::from_f32(rng.unit() * 0.05).to_bits().to_le_bytes();
                blk[at..at + 2].copy_from_slice(&v);
            }
        }
        bytes
    }

    fn dtype(kind: Kind) -> DType {
        match kind {
            Kind::Q8_0 => DType::Q8_0,
            Kind::Q5_0 => DType::Q5_0,
            Kind::Q4K => DType::Q4K,
            Kind::Q6K => DType::Q6K,
        }
    }

    /// Fast (scalar and AVX2) against the f32 reference: `|fast - ref| <= 1e-2 * sum |x_i w_i|`.
    /// 8-bit activations carry a relative rounding error of at most 1/254 per value, so the dot's
    /// error is bounded by about 4e-3 of `sum |x_i w_i|`; 1e-2 leaves room for f32 summation.
    #[test]
    fn fast_dots_match_the_reference() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for kind in [Kind::Q8_0, Kind::Q5_0, Kind::Q4K, Kind::Q6K] {
            for &k in &[256usize, 1024, 2560] {
                for _ in 0..20 {
                    let w = random_row(kind, k, &mut rng);
                    let x: Vec<f32> = (0..k).map(|_| rng.unit() * 3.0).collect();
                    let mut wf = vec![0f32; k];
                    decode_row(dtype(kind), &w, &mut wf);
                    let reference: f32 = x.iter().zip(&wf).map(|(a, b)| a * b).sum();
                    let scale: f32 = x.iter().zip(&wf).map(|(a, b)| (a * b).abs()).sum();
                    let mut acts = Acts::default();
                    acts.quantize(&x, 1, k, kind);
                    let row = acts.row(0, k, kind);
                    let s = scalar::dot(kind, &w, row);
                    assert!(
                        (s - reference).abs() <= 1e-2 * scale,
                        "{kind:?} k={k}: fast {s}, reference {reference}, scale {scale}"
                    );
                    if let Some(simd) = Simd::detect() {
                        #[cfg(target_arch = "x86_64")]
                        {
                            let v = avx2::dot(simd, kind, &w, row);
                            assert_eq!(v.to_bits(), s.to_bits(), "{kind:?} k={k}: avx2 {v}, scalar {s}");
                        }
                        let _ = simd;
                    }
                }
            }
        }
    }

    /// The integer block arithmetic is exact: fast equals the f64 dot of the decoded weights
    /// with the dequantized activations (`d * q`), up to f32 rounding of the block sums.
    #[test]
    fn fast_dots_are_exact_on_quantized_activations() {
        let mut rng = Rng(77);
        for kind in [Kind::Q8_0, Kind::Q5_0, Kind::Q4K, Kind::Q6K] {
            for _ in 0..50 {
                let k = 512;
                let w = random_row(kind, k, &mut rng);
                let x: Vec<f32> = (0..k).map(|_| rng.unit()).collect();
                let mut wf = vec![0f32; k];
                decode_row(dtype(kind), &w, &mut wf);
                let mut acts = Acts::default();
                acts.quantize(&x, 1, k, kind);
                let row = acts.row(0, k, kind);
                let bs = kind.block();
                let (mut exact, mut scale) = (0f64, 0f64);
                for (i, &wv) in wf.iter().enumerate() {
                    let xq = f64::from(row.d[i / bs]) * f64::from(row.qs[i]);
                    exact += xq * f64::from(wv);
                    scale += (xq * f64::from(wv)).abs();
                }
                let got = f64::from(scalar::dot(kind, &w, row));
                assert!(
                    (got - exact).abs() <= 1e-5 * scale,
                    "{kind:?}: fast {got}, exact {exact}, scale {scale}"
                );
            }
        }
    }

    #[test]
    fn matmul_matches_the_reference_for_several_rows() {
        let mut rng = Rng(12345);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for kind in [Kind::Q8_0, Kind::Q5_0, Kind::Q4K, Kind::Q6K] {
            let (n, k, rows) = (37, 512, 3);
            let bytes: Vec<u8> = (0..n).flat_map(|_| random_row(kind, k, &mut rng)).collect();
            let w = WeightView {
                bytes: &bytes,
                dtype: dtype(kind),
                n,
                k,
            };
            let x: Vec<f32> = (0..rows * k).map(|_| rng.unit()).collect();
            let mut scratch = vec![0f32; n * rows];
            assert!(matmul(&pool, &x, rows, &w, &mut scratch));
            let mut wf = vec![0f32; k];
            for j in 0..n {
                w.decode(j, &mut wf);
                for r in 0..rows {
                    let xr = &x[r * k..(r + 1) * k];
                    let reference: f32 = xr.iter().zip(&wf).map(|(a, b)| a * b).sum();
                    let scale: f32 = xr.iter().zip(&wf).map(|(a, b)| (a * b).abs()).sum();
                    let got = scratch[j * rows + r];
                    assert!((got - reference).abs() <= 1e-2 * scale, "{kind:?} ({j}, {r})");
                }
            }
        }
    }

    #[test]
    fn non_finite_activations_fall_back() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let bytes = vec![0u8; 34 * 2];
        let w = WeightView {
            bytes: &bytes,
            dtype: DType::Q8_0,
            n: 2,
            k: 32,
        };
        let mut x = vec![1f32; 32];
        x[3] = f32::INFINITY;
        let mut scratch = vec![0f32; 2];
        assert!(!matmul(&pool, &x, 1, &w, &mut scratch));
    }
}
