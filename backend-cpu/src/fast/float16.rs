//! Products over `bf16` and `f16` weights (a Hugging Face checkpoint's, and the vision tower's
//! `f16` matrices), in `f32` arithmetic throughout (no rounding of activations):
//! - few activation rows: each weight row widened to `f32` eight values at a time as it is read
//!   (`bf16` by a shift, `f16` by F16C) and multiplied into four independent eight-lane `f32`
//!   sums (FMA), instead of the reference's whole-row decode followed by a one-sum dot; each
//!   activation row's sum is the same whatever else shares the step;
//! - prefill ([`super::GEMM_MIN_ROWS`] rows and more): register tiles of [`MR`] activation rows
//!   by a panel of 32 (AVX-512) or 16 (AVX2) weight rows, outer products over `k` (one broadcast
//!   activation against a vector of widened weights, no horizontal sums), the panel widened once
//!   per [`KC`] values of `k` into a buffer on the stack and used by every row of the task. Each
//!   output is one FMA chain over `k` in order, so its value does not depend on the tiling,
//!   the threads or the other rows of the step.
//!
//! Both differ from the reference only in the order of the `f32` additions.

use rayon::prelude::*;
use tandem_backend_api::DType;

use super::Simd;
use crate::layout::Layout;
use crate::weight::WeightView;

/// Weight rows (output columns) per parallel task of the dot products.
const CHUNK: usize = 16;
/// Activation rows per register tile of the prefill product.
const MR: usize = 6;
/// Values of `k` per widened panel chunk: 32 (AVX-512) panel columns of `f32`, 32 KiB.
const KC: usize = 256;

/// The product of `rows` activation rows of `x` with `w` (`bf16` or `f16`) into `scratch`:
/// register tiles where `tiles` (the caller's prefill products), in the layout they return,
/// else dot products ([`Layout::Columns`]). `wide` picks the AVX-512 tiles. `None` for another
/// format or a short buffer (the caller then takes the reference path).
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
    pool: &rayon::ThreadPool,
    simd: Simd,
    wide: Option<super::Wide>,
    x: &[f32],
    rows: usize,
    w: &WeightView,
    scratch: &mut [f32],
    tiles: bool,
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
    if tiles {
        let task = |r0: usize, j0: usize, width: usize, dst: &mut [f32]| {
            let t = Task {
                bf16,
                x,
                k,
                w: w.bytes,
                n: w.n,
                r0,
                j0,
                width,
            };
            tile_task(simd, wide, &t, dst)
        };
        return Some(super::prefill_tasks(
            pool,
            w.n,
            rows,
            &mut scratch[..w.n * rows],
            task,
        ));
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

/// One prefill task ([`Task`]) into `dst`, in the widest tiles the CPU has.
fn tile_task(simd: Simd, wide: Option<super::Wide>, t: &Task, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(wide) = wide {
            // SAFETY: a `Wide` exists only where AVX-512 F, AVX2, FMA and F16C were detected
            // at run time; the function is safe Rust compiled with those features.
            return unsafe { tiles_avx512(wide, simd, t, dst) };
        }
        // SAFETY: a `Simd` exists only where AVX2, FMA and F16C were detected at run time.
        unsafe { tiles_avx2(simd, t, dst) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = wide;
        tiles::<8, 2, _>(simd, t, dst, products::<8, 2>)
    }
}

/// What a prefill task multiplies: activation rows `r0..` of `x` (as many as its `dst` holds)
/// by weight rows `j0..j0 + width` of `w` (those below `n`), written row-major.
struct Task<'a> {
    bf16: bool,
    x: &'a [f32],
    k: usize,
    w: &'a [u8],
    n: usize,
    r0: usize,
    j0: usize,
    width: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn tiles_avx512(wide: super::Wide, simd: Simd, t: &Task, dst: &mut [f32]) {
    tiles::<16, 2, _>(simd, t, dst, |w, x, acc| products_avx512(wide, w, x, acc))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn tiles_avx2(simd: Simd, t: &Task, dst: &mut [f32]) {
    tiles::<8, 2, _>(simd, t, dst, products::<8, 2>)
}

/// A tile's products over one chunk: `acc[m] += xs[m][kk] * w[kk]` for every `kk`, in order
/// (each of `xs` holds at least `w.len()` values).
#[inline(always)]
fn products<const L: usize, const V: usize>(
    w: &[[[f32; L]; V]],
    xs: &[&[f32]; MR],
    acc: &mut [[[f32; L]; V]; MR],
) {
    for (kk, w) in w.iter().enumerate() {
        for (a, x) in acc.iter_mut().zip(xs) {
            let xv = x[kk];
            for (av, wv) in a.iter_mut().zip(w) {
                for (al, &wl) in av.iter_mut().zip(wv) {
                    *al = xv.mul_add(wl, *al);
                }
            }
        }
    }
}

/// [`products`] for 32-column panels in AVX-512 registers: the tile's twelve sums stay in
/// registers over the chunk, each activation broadcast from memory (the same FMAs in the same
/// order).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn products_avx512(_w: super::Wide, w: &[[[f32; 16]; 2]], xs: &[&[f32]; MR], acc: &mut [[[f32; 16]; 2]; MR]) {
    use std::arch::x86_64::*;
    assert!(
        xs.iter().all(|x| x.len() >= w.len()),
        "activations shorter than the chunk"
    );
    let xp: [*const f32; MR] = std::array::from_fn(|m| xs[m].as_ptr());
    // SAFETY: a `Wide` proves AVX-512 F; every vector load and store is of 16 `f32` inside one
    // `[f32; 16]` of `acc` or `w` (unaligned accesses), and `xs[m][kk]` is read for `kk <
    // w.len() <= xs[m].len()` (asserted above).
    unsafe {
        let mut a: [[__m512; 2]; MR] = std::array::from_fn(|m| {
            [
                _mm512_loadu_ps(acc[m][0].as_ptr()),
                _mm512_loadu_ps(acc[m][1].as_ptr()),
            ]
        });
        for (kk, w) in w.iter().enumerate() {
            let (w0, w1) = (_mm512_loadu_ps(w[0].as_ptr()), _mm512_loadu_ps(w[1].as_ptr()));
            for (a, p) in a.iter_mut().zip(xp) {
                let b = _mm512_set1_ps(*p.add(kk));
                a[0] = _mm512_fmadd_ps(b, w0, a[0]);
                a[1] = _mm512_fmadd_ps(b, w1, a[1]);
            }
        }
        for (m, a) in a.iter().enumerate() {
            _mm512_storeu_ps(acc[m][0].as_mut_ptr(), a[0]);
            _mm512_storeu_ps(acc[m][1].as_mut_ptr(), a[1]);
        }
    }
}

/// `out.len()` values of `src` (little-endian `bf16` or `f16`) widened to `f32`, eight at a
/// time with AVX2 and F16C.
#[inline(always)]
fn widen_run(simd: Simd, bf16: bool, src: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert!(src.len() >= 2 * n, "a run of {n} values in {} bytes", src.len());
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        let _ = simd;
        while done + 8 <= n {
            // SAFETY: a `Simd` proves AVX2 and F16C; 16 bytes at `2 done` lie within `src`
            // (`2 (done + 8) <= 2 n <= src.len()`) and 8 values at `done` within `out`; both
            // are unaligned accesses.
            unsafe {
                let v = avx2::widen8(bf16, src.as_ptr().add(2 * done));
                std::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr().add(done), v);
            }
            done += 8;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    for (i, o) in out.iter_mut().enumerate().skip(done) {
        *o = widen(bf16, src, i);
    }
}

/// The task in panels of `L * V` weight rows: each [`KC`] values of `k`, the panel widened into
/// `wp` (`wp[kk][c / L][c % L]`: value `kk` of the panel's row `c`, zero past `n`), then every
/// [`MR`] activation rows' tile continues its sums from `dst` (zero at the first chunk) and
/// stores them back: each output one FMA chain over `k` in order.
#[inline(always)]
fn tiles<const L: usize, const V: usize, K>(simd: Simd, t: &Task, dst: &mut [f32], kernel: K)
where
    K: Fn(&[[[f32; L]; V]], &[&[f32]; MR], &mut [[[f32; L]; V]; MR]),
{
    let np = L * V;
    let rows = dst.len() / t.width;
    let cols = t.width.min(t.n - t.j0);
    // The panel chunk by `k` (fixed-size rows: no bounds checks in the products' loop).
    let mut wp = [[[0f32; L]; V]; KC];
    let mut run = [0f32; KC];
    for c0 in (0..cols).step_by(np) {
        let pc = np.min(cols - c0);
        for k0 in (0..t.k).step_by(KC) {
            let kc = KC.min(t.k - k0);
            for c in 0..np {
                if c < pc {
                    let row = &t.w[((t.j0 + c0 + c) * t.k + k0) * 2..][..kc * 2];
                    widen_run(simd, t.bf16, row, &mut run[..kc]);
                    for (w, &v) in wp[..kc].iter_mut().zip(&run[..kc]) {
                        w[c / L][c % L] = v;
                    }
                } else {
                    for w in &mut wp[..kc] {
                        w[c / L][c % L] = 0.0;
                    }
                }
            }
            for m0 in (0..rows).step_by(MR) {
                let xs: [&[f32]; MR] = std::array::from_fn(|m| {
                    let r = t.r0 + (m0 + m).min(rows - 1);
                    &t.x[r * t.k + k0..][..kc]
                });
                let mut acc = [[[0f32; L]; V]; MR];
                let live = MR.min(rows - m0);
                if k0 > 0 {
                    for (m, a) in acc.iter_mut().enumerate().take(live) {
                        let o = &dst[(m0 + m) * t.width + c0..][..pc];
                        for (c, &v) in o.iter().enumerate() {
                            a[c / L][c % L] = v;
                        }
                    }
                }
                kernel(&wp[..kc], &xs, &mut acc);
                for (m, a) in acc.iter().enumerate().take(live) {
                    let o = &mut dst[(m0 + m) * t.width + c0..][..pc];
                    for (c, v) in o.iter_mut().enumerate() {
                        *v = a[c / L][c % L];
                    }
                }
            }
        }
    }
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

    /// Eight `bf16` or `f16` values at `p` (little-endian) widened to `f32`.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; the 16 bytes at `p` are readable.
    #[inline(always)]
    pub(super) unsafe fn widen8(bf16: bool, p: *const u8) -> __m256 {
        // SAFETY: the caller's promises above; an unaligned 16-byte load.
        unsafe {
            let h = _mm_loadu_si128(p as *const __m128i);
            if bf16 {
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            } else {
                _mm256_cvtph_ps(h)
            }
        }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C (`_s`); `w` holds at least `2 x.len()` bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot(_s: Simd, bf16: bool, w: &[u8], x: &[f32]) -> f32 {
        let k = x.len();
        debug_assert!(w.len() >= 2 * k);
        // SAFETY: this function runs with AVX2 and F16C; the callers read 8 values (16 bytes)
        // at `p`, inside `w`.
        let widen = |p: *const u8| -> __m256 { unsafe { widen8(bf16, p) } };
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

    /// The dot of widened weights `wf` with `x` in f64, and the sum of its terms' magnitudes.
    fn widened_dot(wf: &[f32], x: &[f32]) -> (f64, f64) {
        wf.iter().zip(x).fold((0.0, 0.0), |(s, m), (a, b)| {
            let t = f64::from(*a) * f64::from(*b);
            (s + t, m + t.abs())
        })
    }

    /// `len` random values in `dtype` (`bf16` or `f16`), little-endian.
    fn weights(dtype: DType, len: usize, seed: &mut u64) -> Vec<u8> {
        random_acts(len, seed)
            .into_iter()
            .flat_map(|v| match dtype {
                DType::Bf16 => half::bf16::from_f32(v).to_le_bytes(),
                _ => half::f16::from_f32(v).to_le_bytes(),
            })
            .collect()
    }

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
                let bytes = weights(dtype, n * k, &mut seed);
                let w = WeightView {
                    bytes: &bytes,
                    dtype,
                    n,
                    k,
                };
                let x = random_acts(rows * k, &mut seed);
                let mut scratch = vec![0f32; n * rows];
                let layout = matmul(&pool, simd, None, &x, rows, &w, &mut scratch, false).expect("covered");
                let mut wf = vec![0f32; k];
                for j in 0..n {
                    w.decode(j, &mut wf);
                    for r in 0..rows {
                        let xr = &x[r * k..(r + 1) * k];
                        let (want, mag) = widened_dot(&wf, xr);
                        let mut got = [0f32];
                        layout.copy_row(&scratch, rows, r, j, &mut got);
                        assert!(
                            (f64::from(got[0]) - want).abs() <= 1e-5 * mag + 1e-7,
                            "{dtype:?} {n}x{k}: row {r} column {j}: {} against {want}",
                            got[0]
                        );
                        let mut one = vec![0f32; n];
                        matmul(&pool, simd, None, xr, 1, &w, &mut one, false).expect("covered");
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
        assert!(matmul(&pool, simd, None, &[0.0; 4], 1, &w, &mut [0f32; 4], false).is_none());
    }

    /// The prefill tiles, both formats, AVX2 and (where the CPU has it) AVX-512: panels cut
    /// short by `n`, `k` past one widened chunk with a tail, row counts that fill no tile.
    /// Every output is the widened weights' dot within `f32` summation error, the same bits
    /// from both vector widths, and the same bits for a row in a smaller step.
    #[test]
    fn prefill_tiles_match_the_widened_dot_whatever_the_tiling() {
        let Some(simd) = Simd::detect() else {
            eprintln!("no AVX2/FMA/F16C here: the tiles were not run");
            return;
        };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut seed = 21u64;
        for dtype in [DType::Bf16, DType::F16] {
            for (n, k, rows) in [(37usize, 1152usize, 13usize), (70, 300, 9), (33, 7, 20)] {
                let bytes = weights(dtype, n * k, &mut seed);
                let w = WeightView {
                    bytes: &bytes,
                    dtype,
                    n,
                    k,
                };
                let x = random_acts(rows * k, &mut seed);
                let run = |wide: Option<super::super::Wide>, x: &[f32], rows: usize| {
                    let mut scratch = vec![f32::NAN; n * rows];
                    let layout = matmul(&pool, simd, wide, x, rows, &w, &mut scratch, true).expect("covered");
                    let mut out = vec![0f32; n * rows];
                    for r in 0..rows {
                        layout.copy_row(&scratch, rows, r, 0, &mut out[r * n..(r + 1) * n]);
                    }
                    out
                };
                let narrow = run(None, &x, rows);
                let mut wf = vec![0f32; k];
                for j in 0..n {
                    w.decode(j, &mut wf);
                    for r in 0..rows {
                        let xr = &x[r * k..(r + 1) * k];
                        let (want, mag) = widened_dot(&wf, xr);
                        let got = narrow[r * n + j];
                        assert!(
                            (f64::from(got) - want).abs() <= 1e-5 * mag + 1e-7,
                            "{dtype:?} {n}x{k}: row {r} column {j}: {got} against {want}"
                        );
                    }
                }
                if let Some(wide) = super::super::Wide::detect() {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&run(Some(wide), &x, rows)),
                        bits(&narrow),
                        "{dtype:?} {n}x{k}: AVX-512"
                    );
                }
                let pr = (rows - 3).min(8);
                let part = run(None, &x[3 * k..(3 + pr) * k], pr);
                for (i, v) in part.iter().enumerate() {
                    assert_eq!(
                        v.to_bits(),
                        narrow[3 * n + i].to_bits(),
                        "{dtype:?} {n}x{k}: value {i} of rows 3.."
                    );
                }
            }
        }
    }
}
