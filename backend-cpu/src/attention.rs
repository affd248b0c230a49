//! The fast kernels' `Op::Attention` (second half, after `kernels::kv_append`): scores and
//! weighted values read straight from an `f32` KV cache, with no copy of the cached rows; one
//! parallel task per (row, KV head), whose query heads (grouped-query attention) read each
//! cached K and V row once between them; the score buffer is per thread, sized to the group's
//! heads times the cache's capacity when a program is compiled ([`reserve`]) and kept between
//! calls, so nothing is allocated per step. The arithmetic is `kernels::attend`'s, with the dot
//! products and the value sums in eight lanes (AVX2 where detected, the same lanes in plain
//! Rust elsewhere) instead of one running sum.

use std::cell::RefCell;

use rayon::prelude::*;
use tandem_backend_api::DType;

use crate::kernels::AttentionShape;

thread_local! {
    /// The scores of the calling thread's current (row, head).
    static SCORES: RefCell<Vec<f32>> = RefCell::default();
}

/// Grows the calling thread's score buffer to `positions` (a group's heads times the cached
/// positions), so that attention over at most that many allocates nothing (`CpuBackend::compile` runs it on every pool thread).
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
    if group > MAX_GROUP {
        return false;
    }
    let simd = Simd::detect();
    // One task per (row, KV head): the group's query heads read each cached K and V row once,
    // while it is in cache, instead of once per head.
    pool.install(|| {
        out[..positions.len() * qcols]
            .par_chunks_mut(group * hd)
            .enumerate()
            .for_each(|(i, og)| {
                let (r, g) = (i / s.kv_heads, i % s.kv_heads);
                let p = positions[r];
                let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w as u32));
                let n = (p - lo + 1) as usize;
                let qg = &q[r * qcols + g * group * hd..r * qcols + (g + 1) * group * hd];
                let at = |pos: u32| {
                    let row = slots[r] as usize * s.capacity + pos as usize % s.capacity;
                    row * kv_cols + g * hd
                };
                SCORES.with(|cell| {
                    let mut scores = cell.borrow_mut();
                    if scores.len() < group * n {
                        scores.resize(group * n, 0.0);
                    }
                    // Head `h`'s scores at `scores[h * n..(h + 1) * n]`.
                    let scores = &mut scores[..group * n];
                    let mut dots = [0f32; MAX_GROUP];
                    for (j, pos) in (lo..=p).enumerate() {
                        group_dots(simd, qg, &kc[at(pos)..at(pos) + hd], &mut dots[..group]);
                        for (h, &d) in dots[..group].iter().enumerate() {
                            let mut v = d * s.scale;
                            if let Some(cap) = s.softcap {
                                v = cap * (v / cap).tanh();
                            }
                            scores[h * n + j] = v;
                        }
                    }
                    for sh in scores.chunks_exact_mut(n) {
                        let max = sh.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                        let mut sum = 0f32;
                        for sc in sh.iter_mut() {
                            *sc = (*sc - max).exp();
                            sum += *sc;
                        }
                        for sc in sh.iter_mut() {
                            *sc /= sum;
                        }
                    }
                    og.fill(0.0);
                    let mut w = [0f32; MAX_GROUP];
                    for (j, pos) in (lo..=p).enumerate() {
                        for (h, w) in w[..group].iter_mut().enumerate() {
                            *w = scores[h * n + j];
                        }
                        group_axpy(simd, &w[..group], &vc[at(pos)..at(pos) + hd], og);
                    }
                })
            })
    });
    true
}

/// The most query heads per KV head the grouped kernel takes (Gemma 3 has 2 to 4; a larger
/// group goes to the reference kernel).
const MAX_GROUP: usize = 16;

/// `out[h] = dot(q[h * hd..(h + 1) * hd], k)` for each head `h` of `q` (`out.len()` heads of
/// `k.len()` values), reading `k` once for all of them.
fn group_dots(simd: Option<Simd>, q: &[f32], k: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = simd {
        return avx2::group_dots(s, q, k, out);
    }
    let _ = simd;
    group_dots_lanes(q, k, out)
}

/// `o[h * hd..(h + 1) * hd] += w[h] * v` for each head `h`, reading `v` once for all of them.
fn group_axpy(simd: Option<Simd>, w: &[f32], v: &[f32], o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = simd {
        return avx2::group_axpy(s, w, v, o);
    }
    let _ = simd;
    group_axpy_lanes(w, v, o)
}

#[inline(always)]
fn group_dots_lanes(q: &[f32], k: &[f32], out: &mut [f32]) {
    let hd = k.len();
    let mut h = 0;
    while h < out.len() {
        let m = (out.len() - h).min(4);
        // Up to four heads side by side, eight lanes each, over the same `k` chunk.
        let mut acc = [[0f32; 8]; 4];
        for c in (0..hd - hd % 8).step_by(8) {
            let kc = &k[c..c + 8];
            for (i, acc) in acc[..m].iter_mut().enumerate() {
                let qc = &q[(h + i) * hd + c..(h + i) * hd + c + 8];
                for l in 0..8 {
                    acc[l] += qc[l] * kc[l];
                }
            }
        }
        for (i, acc) in acc[..m].iter().enumerate() {
            let tail: f32 = (hd - hd % 8..hd).map(|c| q[(h + i) * hd + c] * k[c]).sum();
            let s4 = [acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]];
            out[h + i] = (s4[0] + s4[2]) + (s4[1] + s4[3]) + tail;
        }
        h += m;
    }
}

#[inline(always)]
fn group_axpy_lanes(w: &[f32], v: &[f32], o: &mut [f32]) {
    for (w, o) in w.iter().zip(o.chunks_exact_mut(v.len())) {
        axpy_lanes(*w, v, o);
    }
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

/// The eight-lane dot product: with AVX2 where `simd` and the CPU has it, else in plain Rust.
pub(crate) fn lane_dot(simd: bool) -> fn(&[f32], &[f32]) -> f32 {
    match (simd, Simd::detect()) {
        (true, Some(_)) => |a, b| dot(Simd::detect(), a, b),
        _ => dot_lanes,
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    pub(super) fn dot(_proof: Simd, a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: a `Simd` exists only where AVX2 and FMA were detected at run time; the
        // function is safe Rust compiled with those features enabled.
        unsafe { dot_avx2(a, b) }
    }

    pub(super) fn group_dots(_proof: Simd, q: &[f32], k: &[f32], out: &mut [f32]) {
        // SAFETY: as in `dot`.
        unsafe { group_dots_avx2(q, k, out) }
    }

    pub(super) fn group_axpy(_proof: Simd, w: &[f32], v: &[f32], o: &mut [f32]) {
        // SAFETY: as in `dot`.
        unsafe { group_axpy_avx2(w, v, o) }
    }

    #[target_feature(enable = "avx2,fma")]
    fn group_dots_avx2(q: &[f32], k: &[f32], out: &mut [f32]) {
        group_dots_lanes(q, k, out)
    }

    #[target_feature(enable = "avx2,fma")]
    fn group_axpy_avx2(w: &[f32], v: &[f32], o: &mut [f32]) {
        group_axpy_lanes(w, v, o)
    }

    #[target_feature(enable = "avx2,fma")]
    fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        dot_lanes(a, b)
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
        // Groups of 2 and 6 query heads per KV head (6: a chunk of four and a chunk of two).
        for (heads, kv_heads, window, softcap) in [
            (4, 2, None, None),
            (4, 2, Some(5), Some(3.0)),
            (6, 1, Some(7), None),
        ] {
            let s = AttentionShape {
                heads,
                kv_heads,
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
