//! The fast kernels' `Op::Attention` (second half, after `kernels::kv_append`): scores and
//! weighted values read straight from an `f32` KV cache, with no copy of the cached rows; one
//! parallel task per (row, head), so a decode step's heads run on every thread; the score
//! buffer is per thread, sized to the cache's capacity when a program is compiled
//! ([`reserve`]) and kept between calls, so nothing is allocated per step. The arithmetic is `kernels::attend`'s, with the dot products
//! and the value sums in eight lanes (AVX2 where detected, the same lanes in plain Rust
//! elsewhere) instead of one running sum.

use std::cell::RefCell;

use rayon::prelude::*;
use tandem_backend_api::DType;

use crate::kernels::AttentionShape;

thread_local! {
    /// The scores of the calling thread's current (row, head).
    static SCORES: RefCell<Vec<f32>> = RefCell::default();
}

/// Grows the calling thread's score buffer to `positions`, so that attention over at most that
/// many cached positions allocates nothing (`CpuBackend::compile` runs it on every pool thread).
pub fn reserve(positions: usize) {
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        if scores.len() < positions {
            scores.resize(positions, 0.0);
        }
    });
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

/// Attends every row over its slot's cached positions as `kernels::attend` does. Returns
/// `false`, having written nothing, where the cache is not `f32` (or not aligned as `f32`); the
/// caller then uses the reference kernel.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    pool: &rayon::ThreadPool,
    s: &AttentionShape,
    q: &[f32],
    positions: &[u32],
    slots: &[u32],
    kc: &[u8],
    vc: &[u8],
    out: &mut [f32],
) -> bool {
    if s.cache_dtype != DType::F32 || s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) {
        return false;
    }
    let (Ok(kc), Ok(vc)) = (
        bytemuck::try_cast_slice::<u8, f32>(kc),
        bytemuck::try_cast_slice::<u8, f32>(vc),
    ) else {
        return false;
    };
    let (hd, qcols) = (s.head_dim, s.heads * s.head_dim);
    let kv_cols = s.kv_heads * hd;
    let group = s.heads / s.kv_heads;
    let simd = Simd::detect();
    pool.install(|| {
        out[..positions.len() * qcols]
            .par_chunks_mut(hd)
            .enumerate()
            .for_each(|(i, oh)| {
                let (r, h) = (i / s.heads, i % s.heads);
                let g = h / group;
                let p = positions[r];
                let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w as u32));
                let n = (p - lo + 1) as usize;
                let qh = &q[r * qcols + h * hd..r * qcols + (h + 1) * hd];
                let at = |pos: u32| {
                    let row = slots[r] as usize * s.capacity + pos as usize % s.capacity;
                    row * kv_cols + g * hd
                };
                SCORES.with(|cell| {
                    let mut scores = cell.borrow_mut();
                    if scores.len() < n {
                        scores.resize(n, 0.0);
                    }
                    let scores = &mut scores[..n];
                    let mut max = f32::NEG_INFINITY;
                    for (sc, pos) in scores.iter_mut().zip(lo..=p) {
                        let k = &kc[at(pos)..at(pos) + hd];
                        let mut v = dot(simd, qh, k) * s.scale;
                        if let Some(cap) = s.softcap {
                            v = cap * (v / cap).tanh();
                        }
                        *sc = v;
                        max = max.max(v);
                    }
                    let mut sum = 0f32;
                    for sc in scores.iter_mut() {
                        *sc = (*sc - max).exp();
                        sum += *sc;
                    }
                    oh.fill(0.0);
                    for (sc, pos) in scores.iter().zip(lo..=p) {
                        axpy(simd, sc / sum, &vc[at(pos)..at(pos) + hd], oh);
                    }
                })
            })
    });
    true
}

/// `sum(a[i] * b[i])` in eight lanes, summed pairwise at the end.
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let s4 = [acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]];
    (s4[0] + s4[2]) + (s4[1] + s4[3]) + tail
}

/// `out[i] += w * v[i]`.
#[inline(always)]
fn axpy_lanes(w: f32, v: &[f32], out: &mut [f32]) {
    for (o, x) in out.iter_mut().zip(v) {
        *o += w * x;
    }
}

fn dot(simd: Option<Simd>, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = simd {
        return avx2::dot(s, a, b);
    }
    let _ = simd;
    dot_lanes(a, b)
}

fn axpy(simd: Option<Simd>, w: f32, v: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = simd {
        return avx2::axpy(s, w, v, out);
    }
    let _ = simd;
    axpy_lanes(w, v, out)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    pub(super) fn dot(_proof: Simd, a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: a `Simd` exists only where AVX2 and FMA were detected at run time; the
        // function is safe Rust compiled with those features enabled.
        unsafe { dot_avx2(a, b) }
    }

    pub(super) fn axpy(_proof: Simd, w: f32, v: &[f32], out: &mut [f32]) {
        // SAFETY: as in `dot`.
        unsafe { axpy_avx2(w, v, out) }
    }

    #[target_feature(enable = "avx2,fma")]
    fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        dot_lanes(a, b)
    }

    #[target_feature(enable = "avx2,fma")]
    fn axpy_avx2(w: f32, v: &[f32], out: &mut [f32]) {
        axpy_lanes(w, v, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels;

    /// Against the reference kernel on a windowed, soft-capped, grouped case with two rows of
    /// two slots: within 1e-5 of the largest output (only the order of f32 sums differs).
    #[test]
    fn matches_the_reference_kernel() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for (window, softcap) in [(None, None), (Some(5), Some(3.0))] {
            let s = AttentionShape {
                heads: 4,
                kv_heads: 2,
                head_dim: 20,
                capacity: 16,
                scale: 0.3,
                window,
                softcap,
                cache_dtype: DType::F32,
            };
            let kv_cols = s.kv_heads * s.head_dim;
            let vals = |n: usize, seed: u32| -> Vec<f32> {
                (0..n as u32)
                    .map(|i| {
                        ((i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 16) % 200) as f32 / 100.0 - 1.0
                    })
                    .collect()
            };
            let to_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
            // Aligned copies of the caches for the zero-copy view.
            let kw = vals(2 * s.capacity * kv_cols, 1);
            let vw = vals(2 * s.capacity * kv_cols, 2);
            let (kb, vb) = (to_bytes(&kw), to_bytes(&vw));
            let q = vals(2 * s.heads * s.head_dim, 3);
            let (positions, slots) = ([9u32, 13], [0u32, 1]);
            let mut want = vec![0f32; q.len()];
            kernels::attend(&pool, &s, &q, &positions, &slots, &kb, &vb, &mut want);
            let mut got = vec![0f32; q.len()];
            assert!(attend(
                &pool,
                &s,
                &q,
                &positions,
                &slots,
                bytemuck::cast_slice(&kw),
                bytemuck::cast_slice(&vw),
                &mut got
            ));
            let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 1e-5 * max.max(1.0), "{window:?} {i}: {g} vs {w}");
            }
        }
    }
}
