//! `precision = "fast"`: decode products on 8-bit activations, as ggml's CPU backend computes
//! every product. Each activation row is quantized once per product to blocks of 32 `i8` values
//! with an `f32` scale (`d = max |x| / 127`, `q = round(x / d)`), and a `q8_0` weight block's dot
//! with it is an exact integer sum scaled by both blocks' scales. With AVX-512 VNNI, `vpdpbusd`
//! takes 64 byte products per instruction (two blocks), where the 16-bit path (`exact`) takes 32
//! per `vpmaddwd` after widening the weights: the decode step of the default model spends two
//! thirds of its time in its 262,144-row `q8_0` output head.
//!
//! `vpdpbusd` multiplies unsigned bytes by signed ones: the weight's magnitude (`|w|`, 128 for
//! -128 as an unsigned byte) goes in as the unsigned operand and its sign moves onto the
//! activation (`-q` where `w < 0`; activations stay within -127..=127, so negating is exact).
//!
//! The error this adds is judged on the real model by `engine perplexity --kl-divergence`
//! (docs/precision.md), not by the random-weight fixtures' logit bounds, which stay on `exact`.

use std::cell::RefCell;

use half::f16;
use tandem_backend_api::block;

use super::{column_chunk, grow, in_columns, KernelSet, Vnni, QK};
use crate::layout::Layout;
use crate::weight::WeightView;

/// 8-bit activation rows: per block of [`QK`] values an `f32` scale and the values.
#[derive(Default)]
struct Acts8 {
    d: Vec<f32>,
    qs: Vec<i8>,
}

thread_local! {
    /// The calling thread's quantized activations, kept between products.
    static ACTS8: RefCell<Acts8> = RefCell::default();
}

/// Quantizes `x` (whole blocks of [`QK`]) to per-block scales `d` and values `qs`; `false` where
/// a value is not finite.
pub fn quantize(x: &[f32], d: &mut [f32], qs: &mut [i8]) -> bool {
    for ((x, d), q) in x.chunks_exact(QK).zip(d.iter_mut()).zip(qs.chunks_exact_mut(QK)) {
        let mut amax = 0.0f32;
        let mut finite = true;
        for v in x {
            finite &= v.is_finite();
            amax = amax.max(v.abs());
        }
        if !finite {
            return false;
        }
        let s = amax / 127.0;
        *d = s;
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        for (q, v) in q.iter_mut().zip(x) {
            *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
        }
    }
    true
}

/// The oracle: one `q8_0` weight row's dot with one 8-bit activation row, block by block (an
/// exact integer sum per block, scaled, summed in block order).
pub fn dot_q8_0(w: &[u8], d: &[f32], qs: &[i8]) -> f32 {
    use block::q8_0::{BYTES, D, QS};
    let mut acc = 0.0f32;
    for (b, blk) in w.chunks_exact(BYTES).enumerate() {
        let wd = f16::from_le_bytes([blk[D.at], blk[D.at + 1]]).to_f32();
        let s: i32 = blk[QS.range()]
            .iter()
            .zip(&qs[QK * b..QK * b + QK])
            .map(|(&w, &q)| i32::from(w as i8) * i32::from(q))
            .sum();
        acc += wd * d[b] * s as f32;
    }
    acc
}

/// Whether the fast path covers a product: `q8_0` weights of whole blocks, with AVX-512 VNNI
/// in the kernel set.
fn covers(set: KernelSet, w: &WeightView) -> Option<Vnni> {
    (w.dtype == tandem_backend_api::DType::Q8_0 && w.k.is_multiple_of(QK))
        .then(|| set.vnni())
        .flatten()
}

/// The product of `rows` activation rows of `x` with `w` on 8-bit activations, into `scratch`
/// ([`Layout::Columns`]); `None` where the fast path does not cover it (the caller takes the
/// 16-bit path).
pub fn matmul(
    pool: &rayon::ThreadPool,
    spin: Option<&crate::spin::SpinPool>,
    set: KernelSet,
    x: &[f32],
    rows: usize,
    w: &WeightView,
    scratch: &mut [f32],
) -> Option<Layout> {
    let vnni = covers(set, w)?;
    let k = w.k;
    let rb = k / QK * block::q8_0::BYTES;
    if rows == 0 || w.bytes.len() < w.n * rb || x.len() < rows * k || scratch.len() < w.n * rows {
        return None;
    }
    ACTS8.with(|cell| {
        let mut acts = cell.borrow_mut();
        let nb = rows * k / QK;
        grow(&mut acts.d, nb);
        grow(&mut acts.qs, rows * k);
        let Acts8 { d, qs } = &mut *acts;
        if !quantize(&x[..rows * k], &mut d[..nb], &mut qs[..rows * k]) {
            return None;
        }
        let (d, qs) = (&d[..nb], &qs[..rows * k]);
        let chunk_rows = column_chunk(pool, spin, w.n);
        // One weight row at a time: the weights then stream through memory in order. Four
        // rows side by side (the 16-bit path's matrix-vector shape) took the head's product
        // from 13.0 to 21.0 ms on one thread of the 2-core VM (two rows: 20.6). Several
        // activation rows share each weight row's loads, signs and magnitudes
        // ([`vnni::q8_0_rows`]), each row's sum the same operations in the same order as alone:
        // a row's result never depends on how many rows share the step.
        let task = |chunk: usize, dst: &mut [f32]| {
            let j0 = chunk * chunk_rows;
            let cols = dst.len() / rows;
            vnni::q8_0_columns(vnni, &w.bytes[j0 * rb..(j0 + cols) * rb], rb, d, qs, rows, dst);
        };
        in_columns(pool, spin, &mut scratch[..w.n * rows], chunk_rows * rows, task);
        Some(Layout::Columns)
    })
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use tandem_backend_api::block::q8_0::{BYTES, D, QS};

    use super::super::{Vnni, QK};

    /// The dots of the weight rows `ws` (`rb` bytes each, whole `q8_0` blocks) with the
    /// `rows` activation rows (`d`, `qs`), into `dst` column by column (`dst[c * rows + r]`):
    /// [`super::dot_q8_0`]'s integer block sums, in another order of `f32` additions, the same
    /// for a row whatever `rows` is. The rows go in groups of up to 8, each group's rows
    /// sharing every weight row's loads.
    pub fn q8_0_columns(
        _proof: Vnni,
        ws: &[u8],
        rb: usize,
        d: &[f32],
        qs: &[i8],
        rows: usize,
        dst: &mut [f32],
    ) {
        // SAFETY: a `Vnni` exists only where AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C were
        // detected at run time; every read below goes through a checked slice.
        unsafe { columns(ws, rb, d, qs, rows, dst) }
    }

    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI besides AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn columns(ws: &[u8], rb: usize, d: &[f32], qs: &[i8], rows: usize, dst: &mut [f32]) {
        let k = rb / BYTES * QK;
        let mut r0 = 0;
        while r0 < rows {
            let n = (rows - r0).min(8);
            // SAFETY: the features are those of this function.
            unsafe {
                match n {
                    8 => group::<8>(ws, rb, d, qs, k, rows, r0, dst),
                    7 => group::<7>(ws, rb, d, qs, k, rows, r0, dst),
                    6 => group::<6>(ws, rb, d, qs, k, rows, r0, dst),
                    5 => group::<5>(ws, rb, d, qs, k, rows, r0, dst),
                    4 => group::<4>(ws, rb, d, qs, k, rows, r0, dst),
                    3 => group::<3>(ws, rb, d, qs, k, rows, r0, dst),
                    2 => group::<2>(ws, rb, d, qs, k, rows, r0, dst),
                    _ => group::<1>(ws, rb, d, qs, k, rows, r0, dst),
                }
            }
            r0 += n;
        }
    }

    /// Rows `r0..r0 + R` against every weight row of `ws`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI besides AVX2, FMA and F16C.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn group<const R: usize>(
        ws: &[u8],
        rb: usize,
        d: &[f32],
        qs: &[i8],
        k: usize,
        rows: usize,
        r0: usize,
        dst: &mut [f32],
    ) {
        let a: [(&[f32], &[i8]); R] = std::array::from_fn(|i| {
            let r = r0 + i;
            (&d[r * k / QK..(r + 1) * k / QK], &qs[r * k..(r + 1) * k])
        });
        for (w, col) in ws.chunks_exact(rb).zip(dst.chunks_exact_mut(rows)) {
            // SAFETY: the features are those of this function.
            let out = unsafe { rows_of::<R>(w, a) };
            col[r0..r0 + R].copy_from_slice(&out);
        }
    }

    /// The scale of `blk` (its f16 `d`), by F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn scale(blk: &[u8]) -> f32 {
        let bits = u16::from_le_bytes([blk[D.at], blk[D.at + 1]]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// 32 bytes of `s` (checked) as a vector.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load32(s: &[u8]) -> __m256i {
        let s = &s[..32];
        // SAFETY: `s` holds 32 bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
    }

    /// Two `q8_0` blocks' (`two`, whole) 64 weight bytes as `vpdpbusd` takes them: which are
    /// negative, and their magnitudes (128 for -128, as an unsigned byte).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn weights(two: &[u8]) -> (__mmask64, __m512i) {
        let lo = load32(&two[QS.range()]);
        let hi = load32(&two[BYTES + QS.at..]);
        let wv = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        (_mm512_movepi8_mask(wv), _mm512_abs_epi8(wv))
    }

    /// The integer dots of two blocks' weights (`weights`) with their 64 activation bytes `y`,
    /// as `f32` lanes: 0-7 sum the first block, 8-15 the second. The weight's magnitude is
    /// `vpdpbusd`'s unsigned operand and its sign moves onto the activations.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn pair((negative, magnitude): (__mmask64, __m512i), y: __m512i) -> __m512 {
        let zero = _mm512_setzero_si512();
        let sy = _mm512_mask_sub_epi8(y, negative, zero, y);
        _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, magnitude, sy))
    }

    /// 64 bytes of `s` (checked) as a vector.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn load64(s: &[i8]) -> __m512i {
        let s = &s[..64];
        // SAFETY: `s` holds 64 bytes; the load is unaligned.
        unsafe { _mm512_loadu_si512(s.as_ptr() as *const __m512i) }
    }

    /// The dots of one weight row with `R` activation rows (`a[r]`: scales, values). The weight
    /// side (loads, signs, magnitudes, scales) is done once for all rows; each row's sum is
    /// the same sequence of operations as with `R = 1`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI besides AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn rows_of<const R: usize>(w: &[u8], a: [(&[f32], &[i8]); R]) -> [f32; R] {
        let nb = w.len() / BYTES;
        let mut acc = [_mm512_setzero_ps(); R];
        let mut acc2 = [_mm512_setzero_ps(); R];
        let mut b = 0;
        // Four blocks per trip, two per vector (lanes 0-7 block b, 8-15 block b + 1): their four
        // f16 scales converted together and spread over the lanes by two permutes.
        let lanes01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let lanes23 = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
        while b + 4 <= nb {
            let four = &w[BYTES * b..BYTES * (b + 4)];
            _mm_prefetch::<_MM_HINT_T0>(four.as_ptr().wrapping_add(4096) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(four.as_ptr().wrapping_add(4096 + 64) as *const i8);
            let (w01, w23) = (weights(four), weights(&four[2 * BYTES..]));
            let half = |i: usize| {
                u64::from(u16::from_le_bytes([
                    four[BYTES * i + D.at],
                    four[BYTES * i + D.at + 1],
                ]))
            };
            let bits = half(0) | half(1) << 16 | half(2) << 32 | half(3) << 48;
            let wd = _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64));
            for r in 0..R {
                let (d, qs) = a[r];
                let y = &qs[QK * b..QK * b + 4 * QK];
                let (y0, y1) = (load64(y), load64(&y[64..]));
                let ad = &d[b..b + 4];
                // SAFETY: `ad` holds 4 `f32`; the load is unaligned.
                let sc = _mm512_castps128_ps512(_mm_mul_ps(wd, unsafe { _mm_loadu_ps(ad.as_ptr()) }));
                acc[r] = _mm512_fmadd_ps(pair(w01, y0), _mm512_permutexvar_ps(lanes01, sc), acc[r]);
                acc2[r] = _mm512_fmadd_ps(pair(w23, y1), _mm512_permutexvar_ps(lanes23, sc), acc2[r]);
            }
            b += 4;
        }
        for r in 0..R {
            acc[r] = _mm512_add_ps(acc[r], acc2[r]);
        }
        // Two blocks per vector: lanes 0-7 sum block b, lanes 8-15 block b + 1.
        while b + 2 <= nb {
            let two = &w[BYTES * b..BYTES * (b + 2)];
            _mm_prefetch::<_MM_HINT_T0>(two.as_ptr().wrapping_add(4096) as *const i8);
            let w01 = weights(two);
            let (s0, s1) = (scale(two), scale(&two[BYTES..]));
            for r in 0..R {
                let (d, qs) = a[r];
                let y = load64(&qs[QK * b..QK * b + 2 * QK]);
                let s =
                    _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s0 * d[b]), _mm512_set1_ps(s1 * d[b + 1]));
                acc[r] = _mm512_fmadd_ps(pair(w01, y), s, acc[r]);
            }
            b += 2;
        }
        std::array::from_fn(|r| {
            let (d, qs) = a[r];
            let mut total = _mm512_reduce_add_ps(acc[r]);
            if b < nb {
                // An odd last block.
                total += super::dot_q8_0(&w[BYTES * b..BYTES * nb], &d[b..nb], &qs[QK * b..QK * nb]);
            }
            total
        })
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod vnni {
    use super::super::{Vnni, QK};

    /// No VNNI off x86-64 ([`Vnni`] is never made there).
    pub fn q8_0_columns(
        _proof: Vnni,
        ws: &[u8],
        rb: usize,
        d: &[f32],
        qs: &[i8],
        rows: usize,
        dst: &mut [f32],
    ) {
        let k = rb / tandem_backend_api::block::q8_0::BYTES * QK;
        for (w, col) in ws.chunks_exact(rb).zip(dst.chunks_exact_mut(rows)) {
            for (r, o) in col.iter_mut().enumerate() {
                *o = super::dot_q8_0(w, &d[r * k / QK..(r + 1) * k / QK], &qs[r * k..(r + 1) * k]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `q8_0` rows of random blocks (scales within f16's normal range), every byte value
    /// including -128.
    fn q8_0_rows(n: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u32
        };
        let mut out = Vec::with_capacity(n * k / QK * 34);
        for _ in 0..n * k / QK {
            let d = f16::from_f32(0.001 + (next() % 1000) as f32 * 1e-5);
            out.extend_from_slice(&d.to_le_bytes());
            for _ in 0..QK {
                out.push(next() as u8);
            }
        }
        out
    }

    fn acts(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            })
            .collect()
    }

    #[test]
    fn quantization_is_round_to_nearest_of_the_block_scale_and_refuses_non_finite_values() {
        let mut x = acts(64, 3);
        x[5] = 10.0;
        let (mut d, mut q) = (vec![0.0; 2], vec![0i8; 64]);
        assert!(quantize(&x, &mut d, &mut q));
        assert_eq!(d[0], 10.0 / 127.0);
        assert_eq!(q[5], 127);
        for (i, (v, q)) in x.iter().zip(&q).enumerate() {
            let back = f32::from(*q) * d[i / QK];
            assert!((back - v).abs() <= d[i / QK] * 0.5 + 1e-6, "{i}: {v} -> {q}");
        }
        // A zero block quantizes to zeros with a zero scale.
        let (mut d, mut q) = (vec![1.0; 1], vec![1i8; 32]);
        assert!(quantize(&[0.0; 32], &mut d, &mut q));
        assert_eq!((d[0], q.iter().all(|&v| v == 0)), (0.0, true));
        x[40] = f32::NAN;
        assert!(!quantize(&x, &mut [0.0; 2], &mut [0i8; 64]));
    }

    /// The oracle's integer block sums against the dequantized values' `f64` dot (the only
    /// difference is the `f32` scaling and summing).
    #[test]
    fn the_oracle_is_the_dot_of_the_dequantized_values() {
        let (k, rows) = (96, 3);
        let w = q8_0_rows(rows, k, 9);
        let x = acts(k, 4);
        let (mut d, mut q) = (vec![0.0; k / QK], vec![0i8; k]);
        assert!(quantize(&x, &mut d, &mut q));
        for r in 0..rows {
            let row = &w[r * 102..(r + 1) * 102];
            let mut want = 0.0f64;
            for (b, blk) in row.chunks_exact(34).enumerate() {
                let wd = f64::from(f16::from_le_bytes([blk[0], blk[1]]).to_f32());
                for i in 0..QK {
                    want += wd * f64::from(blk[2 + i] as i8) * f64::from(d[b]) * f64::from(q[QK * b + i]);
                }
            }
            let got = f64::from(dot_q8_0(row, &d, &q));
            assert!(
                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{got} vs {want}"
            );
        }
    }

    /// The VNNI product (even and odd block counts, several activation rows) against the oracle, through `matmul`'s tasks on a pool.
    #[test]
    fn the_vnni_product_matches_the_oracle() {
        let Some(_) = KernelSet::Avx512Vnni.vnni() else {
            eprintln!("skipping: this CPU has no AVX-512 VNNI");
            return;
        };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for (n, k, rows) in [
            (37usize, 64usize, 1usize),
            (9, 96, 1),
            (6, 32, 3),
            (41, 160, 2),
            (5, 256, 1),
            (3, 224, 2),
            (7, 128, 5),
            (11, 96, 13),
        ] {
            let w = q8_0_rows(n, k, n as u64);
            let x = acts(rows * k, k as u64);
            let view = WeightView {
                dtype: tandem_backend_api::DType::Q8_0,
                n,
                k,
                bytes: &w,
            };
            let mut scratch = vec![0.0f32; n * rows];
            let layout = matmul(&pool, None, KernelSet::Avx512Vnni, &x, rows, &view, &mut scratch);
            assert!(matches!(layout, Some(Layout::Columns)));
            let rb = k / QK * 34;
            for r in 0..rows {
                let (mut d, mut q) = (vec![0.0; k / QK], vec![0i8; k]);
                assert!(quantize(&x[r * k..(r + 1) * k], &mut d, &mut q));
                for j in 0..n {
                    let want = dot_q8_0(&w[j * rb..(j + 1) * rb], &d, &q);
                    let got = scratch[j * rows + r];
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "n {n} k {k} row {r} col {j}: {got} vs {want}"
                    );
                }
            }
        }
        // Formats it does not cover are left to the 16-bit path.
        let view = WeightView {
            dtype: tandem_backend_api::DType::Q5_0,
            n: 1,
            k: 32,
            bytes: &[0; 22],
        };
        assert!(matmul(
            &pool,
            None,
            KernelSet::Avx512Vnni,
            &[0.0; 32],
            1,
            &view,
            &mut [0.0]
        )
        .is_none());
    }

    /// A row's result is the same bits whatever else shares the product: each row of 1-15 rows
    /// against that row alone (the rows go through the kernel in groups of up to 8).
    #[test]
    fn a_rows_result_does_not_depend_on_the_rows_beside_it() {
        let Some(_) = KernelSet::Avx512Vnni.vnni() else {
            eprintln!("skipping: this CPU has no AVX-512 VNNI");
            return;
        };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let (n, k) = (19usize, 288usize);
        let w = q8_0_rows(n, k, 77);
        let view = WeightView {
            dtype: tandem_backend_api::DType::Q8_0,
            n,
            k,
            bytes: &w,
        };
        let x = acts(15 * k, 5);
        let alone: Vec<Vec<f32>> = (0..15)
            .map(|r| {
                let mut out = vec![0.0f32; n];
                matmul(
                    &pool,
                    None,
                    KernelSet::Avx512Vnni,
                    &x[r * k..(r + 1) * k],
                    1,
                    &view,
                    &mut out,
                )
                .unwrap();
                out
            })
            .collect();
        for rows in 2..=15 {
            let mut scratch = vec![0.0f32; n * rows];
            matmul(
                &pool,
                None,
                KernelSet::Avx512Vnni,
                &x[..rows * k],
                rows,
                &view,
                &mut scratch,
            )
            .unwrap();
            for r in 0..rows {
                for j in 0..n {
                    assert_eq!(
                        scratch[j * rows + r].to_bits(),
                        alone[r][j].to_bits(),
                        "rows {rows}, row {r}, column {j}"
                    );
                }
            }
        }
    }
}
