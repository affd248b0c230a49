//! Products over `bf16` and `f16` weights (a Hugging Face checkpoint's): each weight row widened
//! to `f32` eight values at a time as it is read (`bf16` by a shift, `f16` by F16C) and
//! multiplied into four independent eight-lane `f32` sums (FMA), instead of the reference's
//! whole-row decode followed by a one-sum dot. The arithmetic is `f32` throughout (no rounding
//! of activations): the sums differ from the reference's only in their order. Each activation
//! row's sum is the same whatever else shares the step.

use rayon::prelude::*;
use tandem_backend_api::DType;

use super::Simd;
use crate::layout::Layout;
use crate::weight::WeightView;

/// Weight rows (output columns) per parallel task.
const CHUNK: usize = 16;

/// The product of `rows` activation rows of `x` with `w` (`bf16` or `f16`) into `scratch`
/// ([`Layout::Columns`]); `None` for another format or a short buffer (the caller then takes
/// the reference path).
pub(super) fn matmul(
    pool: &rayon::ThreadPool,
    simd: Simd,
    x: &[f32],
    rows: usize,
    w: &WeightView,
    scratch: &mut [f32],
) -> Option<Layout> {
    let bf16 = match w.dtype {
        DType::Bf16 => true,
        DType::F16 => false,
        _ => return None,
    };
    let k = w.k;
    if rows == 0 || k == 0 || w.bytes.len() < w.n * k * 2 || x.len() < rows * k || scratch.len() < w.n * rows
    {
        return None;
    }
    pool.install(|| {
        scratch[..w.n * rows]
            .par_chunks_mut(CHUNK * rows)
            .enumerate()
            .for_each(|(chunk, dst)| {
                for (c, col) in dst.chunks_exact_mut(rows).enumerate() {
                    let j = chunk * CHUNK + c;
                    let wr = &w.bytes[j * k * 2..(j + 1) * k * 2];
                    for (r, o) in col.iter_mut().enumerate() {
                        *o = dot(simd, bf16, wr, &x[r * k..(r + 1) * k]);
                    }
                }
            })
    });
    Some(Layout::Columns)
}

/// The dot of weight row `w` (`k` values of `bf16` or `f16`, little-endian) with `x`.
fn dot(simd: Simd, bf16: bool, w: &[u8], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: a `Simd` exists only where the CPU has AVX2, FMA and F16C; `w` holds
        // `x.len()` values of two bytes.
        unsafe { avx2::dot(simd, bf16, w, x) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = simd;
        scalar_dot(bf16, w, x)
    }
}

/// One value of `w` at `i`, widened.
fn widen(bf16: bool, w: &[u8], i: usize) -> f32 {
    let bits = u16::from_le_bytes([w[2 * i], w[2 * i + 1]]);
    if bf16 {
        f32::from_bits(u32::from(bits) << 16)
    } else {
        half::f16::from_bits(bits).to_f32()
    }
}

/// The plain-Rust dot (the tail of the vector one, and the oracle of the tests).
fn scalar_dot(bf16: bool, w: &[u8], x: &[f32]) -> f32 {
    x.iter().enumerate().map(|(i, v)| widen(bf16, w, i) * v).sum()
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::Simd;

    /// # Safety
    /// The CPU has AVX2, FMA and F16C (`_s`); `w` holds at least `2 x.len()` bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot(_s: Simd, bf16: bool, w: &[u8], x: &[f32]) -> f32 {
        let k = x.len();
        debug_assert!(w.len() >= 2 * k);
        let widen = |p: *const u8| -> __m256 {
            // SAFETY: the callers read 8 values (16 bytes) at `p`, inside `w`.
            unsafe {
                let h = _mm_loadu_si128(p as *const __m128i);
                if bf16 {
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                } else {
                    _mm256_cvtph_ps(h)
                }
            }
        };
        let mut acc = [_mm256_setzero_ps(); 4];
        let main = k / 32 * 32;
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        for i in (0..main).step_by(32) {
            for (a, s) in acc.iter_mut().enumerate() {
                let at = i + 8 * a;
                // SAFETY: `at + 8 <= main <= k`: within `x` and, two bytes a value, `w`.
                *s = unsafe { _mm256_fmadd_ps(widen(wp.add(2 * at)), _mm256_loadu_ps(xp.add(at)), *s) };
            }
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut lanes = [0f32; 8];
        // SAFETY: 8 `f32` stored into 8.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
        let head =
            ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        head + super::scalar_dot(bf16, &w[2 * main..], &x[main..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::tests::random_acts;

    /// Both formats, on row lengths with and without a tail, several rows: every product is
    /// the widened weights' dot within `f32` summation error, and a row's value is the same
    /// alone as beside others.
    #[test]
    fn products_match_the_widened_dot_and_rows_are_independent() {
        let Some(simd) = Simd::detect() else {
            eprintln!("no AVX2/FMA/F16C here: the vector dot was not run");
            return;
        };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut seed = 9u64;
        for dtype in [DType::Bf16, DType::F16] {
            for (n, k, rows) in [(37usize, 1152usize, 3usize), (20, 70, 9), (5, 7, 1)] {
                let bytes: Vec<u8> = random_acts(n * k, &mut seed)
                    .into_iter()
                    .flat_map(|v| match dtype {
                        DType::Bf16 => half::bf16::from_f32(v).to_le_bytes(),
                        _ => half::f16::from_f32(v).to_le_bytes(),
                    })
                    .collect();
                let w = WeightView {
                    bytes: &bytes,
                    dtype,
                    n,
                    k,
                };
                let x = random_acts(rows * k, &mut seed);
                let mut scratch = vec![0f32; n * rows];
                let layout = matmul(&pool, simd, &x, rows, &w, &mut scratch).expect("covered");
                let mut wf = vec![0f32; k];
                for j in 0..n {
                    w.decode(j, &mut wf);
                    for r in 0..rows {
                        let xr = &x[r * k..(r + 1) * k];
                        let want: f64 = wf
                            .iter()
                            .zip(xr)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum();
                        let mag: f64 = wf
                            .iter()
                            .zip(xr)
                            .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                            .sum();
                        let mut got = [0f32];
                        layout.copy_row(&scratch, rows, r, j, &mut got);
                        assert!(
                            (f64::from(got[0]) - want).abs() <= 1e-5 * mag + 1e-7,
                            "{dtype:?} {n}x{k}: row {r} column {j}: {} against {want}",
                            got[0]
                        );
                        let mut one = vec![0f32; n];
                        matmul(&pool, simd, xr, 1, &w, &mut one).expect("covered");
                        assert_eq!(one[j].to_bits(), got[0].to_bits(), "{dtype:?}: row {r} alone");
                    }
                }
            }
        }
        let w = WeightView {
            bytes: &[0u8; 64],
            dtype: DType::F32,
            n: 4,
            k: 4,
        };
        assert!(matmul(&pool, simd, &[0.0; 4], 1, &w, &mut [0f32; 4]).is_none());
    }
}
