//! Prefill attention in tiles: a block of consecutive rows of one slot attends for each KV
//! head as two small matrix products, every cached K and V row read once per block instead
//! of once per row.
//!
//! The block's queries of one KV head (its rows times the group's heads, `m` of them) are
//! transposed once into `qt` (`head_dim x m`), so that every product runs along the query
//! dimension in vector lanes: the scores `st = K qt` (`keys x m`) broadcast one cached value
//! against a vector of queries, the softmax's maximum and sum are lane-wise over keys, and
//! the weighted values `ot = V^T st` (`head_dim x m`) broadcast one cached value against a
//! vector of weights. No horizontal sums; the results are transposed back once per block.
//!
//! The arithmetic is `kernels::attend`'s (scaled dot, soft-cap, a softmax over the row's
//! window), with the division by the softmax's sum moved after the weighted sum and the
//! `f32` sums in another order.

use std::cell::RefCell;

use crate::shape::AttentionShape;

/// Queries per block and KV head at the most (rows times the group's heads).
pub(super) const MAX_QUERIES: usize = 64;

/// The most `f32` scores a block holds (keys times padded queries): 1 MiB, 4096 keys. A
/// block over more keys goes to the per-row kernel.
const MAX_SCORES: usize = 1 << 18;

/// Keys (and value dimensions) per register tile.
const KT: usize = 4;

/// A block's buffers, per thread.
#[derive(Default)]
struct Tiles {
    qt: Vec<f32>,
    st: Vec<f32>,
    ot: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
    /// Per query: the first and last cached position it attends to.
    lo: Vec<u32>,
    hi: Vec<u32>,
    /// Per key: its row's offset in the cache.
    offs: Vec<usize>,
    /// An f16 cache's rows of the block's keys and values, widened (grown on first use).
    kw: Vec<f32>,
    vw: Vec<f32>,
    /// Their offsets in `kw` and `vw` (`j * head_dim`).
    woffs: Vec<usize>,
}

thread_local! {
    static TILES: RefCell<Tiles> = RefCell::default();
}

impl Tiles {
    /// Grows the buffers to a block of `mp` (padded) queries of `hd` values over `nk` keys.
    fn grow(&mut self, hd: usize, mp: usize, nk: usize) {
        grow(&mut self.qt, hd * mp);
        grow(&mut self.st, nk * mp);
        grow(&mut self.ot, hd * mp);
        grow(&mut self.max, mp);
        grow(&mut self.sum, mp);
        grow_u32(&mut self.lo, mp);
        grow_u32(&mut self.hi, mp);
        if self.offs.len() < nk {
            self.offs.resize(nk, 0);
        }
    }
}

fn grow(v: &mut Vec<f32>, len: usize) {
    if v.len() < len {
        v.resize(len, 0.0);
    }
}

fn grow_u32(v: &mut Vec<u32>, len: usize) {
    if v.len() < len {
        v.resize(len, 0);
    }
}

/// Grows the calling thread's block buffers for heads of `head_dim` values, so that prefill
/// attention allocates nothing (`CpuBackend::compile` runs it on every pool thread).
pub fn reserve(head_dim: usize) {
    TILES.with(|cell| {
        let mut t = cell.borrow_mut();
        grow(&mut t.qt, head_dim * MAX_QUERIES);
        grow(&mut t.st, MAX_SCORES);
        grow(&mut t.ot, head_dim * MAX_QUERIES);
        grow(&mut t.max, MAX_QUERIES);
        grow(&mut t.sum, MAX_QUERIES);
        grow_u32(&mut t.lo, MAX_QUERIES);
        grow_u32(&mut t.hi, MAX_QUERIES);
        if t.offs.len() < MAX_SCORES / 16 {
            t.offs.resize(MAX_SCORES / 16, 0);
        }
    });
}

/// Which vector width the tiles are compiled for.
#[derive(Clone, Copy)]
pub(super) enum Width {
    /// Plain Rust.
    Plain,
    /// AVX2 and FMA (detected at run time).
    #[cfg(target_arch = "x86_64")]
    Avx2(super::Simd),
    /// AVX-512 F (detected at run time).
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
}

/// Proof that AVX-512 F was detected at run time besides AVX2 and FMA; only
/// [`Avx512::detect`] makes one.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx512(());

#[cfg(target_arch = "x86_64")]
impl Avx512 {
    fn detect() -> Option<Avx512> {
        (super::Simd::detect().is_some() && is_x86_feature_detected!("avx512f")).then_some(Avx512(()))
    }
}

impl Width {
    /// Queries per register tile: a block's queries are padded to a multiple of it.
    fn queries(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Width::Avx512(_) => 64,
            _ => 16,
        }
    }

    /// The widest this CPU runs, where `simd` (the caller's AVX2 proof) allows vectors at all.
    pub(super) fn detect(simd: Option<super::Simd>) -> Width {
        #[cfg(target_arch = "x86_64")]
        if let Some(s) = simd {
            return match Avx512::detect() {
                Some(w) => Width::Avx512(w),
                None => Width::Avx2(s),
            };
        }
        let _ = simd;
        Width::Plain
    }
}

/// Attends the rows whose queries are `q` and positions `positions` (consecutive rows of the
/// step, all of slot `slot`, at most [`MAX_QUERIES`] queries per KV head) for every KV head,
/// writing their outputs to `out` (rows of `heads * head_dim`). Returns `false`, having
/// written nothing, where the rows' windows span more keys than a block holds.
#[allow(clippy::too_many_arguments)]
pub(super) fn block(
    width: Width,
    s: &AttentionShape,
    q: &[f32],
    positions: &[u32],
    slot: u32,
    kc: super::KvRows,
    vc: super::KvRows,
    out: &mut [f32],
) -> bool {
    let (hd, qcols) = (s.head_dim, s.heads * s.head_dim);
    let kv_cols = s.kv_heads * hd;
    let group = s.heads / s.kv_heads;
    let n_rows = positions.len();
    let m = n_rows * group;
    let mp = m.next_multiple_of(width.queries());
    let lo_of = |p: u32| s.window.map_or(0, |w| (p + 1).saturating_sub(w as u32));
    let klo = positions.iter().map(|&p| lo_of(p)).min().unwrap_or(0);
    let khi = positions.iter().copied().max().unwrap_or(0);
    let nk = (khi - klo + 1) as usize;
    if nk * mp > MAX_SCORES || m > MAX_QUERIES {
        return false;
    }
    TILES.with(|cell| {
        let mut t = cell.borrow_mut();
        let t = &mut *t;
        t.grow(hd, mp, nk);
        // Query `r * group + h` attends positions `lo..=hi`; padding queries attend none.
        for i in 0..mp {
            let (lo, hi) = match positions.get(i / group) {
                Some(&p) if i < m => (lo_of(p), p),
                _ => (1, 0),
            };
            t.lo[i] = lo;
            t.hi[i] = hi;
        }
        let key_row = |pos: u32| (slot as usize * s.capacity + pos as usize % s.capacity) * kv_cols;
        for g in 0..s.kv_heads {
            let (qt, st, ot) = (&mut t.qt[..hd * mp], &mut t.st[..nk * mp], &mut t.ot[..hd * mp]);
            qt.fill(0.0);
            for r in 0..n_rows {
                for h in 0..group {
                    let qi = r * group + h;
                    let qh = &q[r * qcols + (g * group + h) * hd..][..hd];
                    for (d, &v) in qh.iter().enumerate() {
                        qt[d * mp + qi] = v;
                    }
                }
            }
            for (j, o) in t.offs[..nk].iter_mut().enumerate() {
                *o = key_row(klo + j as u32) + g * hd;
            }
            // The rows as f32: the cache's own, or an f16 cache's widened into `kw`, `vw`.
            let (keys, values) = match (kc, vc) {
                (super::KvRows::F32(kc), super::KvRows::F32(vc)) => {
                    let offs = &t.offs[..nk];
                    (Rows { cache: kc, offs, hd }, Rows { cache: vc, offs, hd })
                }
                (kc, vc) => {
                    grow(&mut t.kw, nk * hd);
                    grow(&mut t.vw, nk * hd);
                    if t.woffs.len() < nk {
                        t.woffs.resize(nk, 0);
                    }
                    for j in 0..nk {
                        let at = t.offs[j];
                        kc.widen_into(at, &mut t.kw[j * hd..(j + 1) * hd]);
                        vc.widen_into(at, &mut t.vw[j * hd..(j + 1) * hd]);
                        t.woffs[j] = j * hd;
                    }
                    let offs = &t.woffs[..nk];
                    (
                        Rows {
                            cache: &t.kw[..nk * hd],
                            offs,
                            hd,
                        },
                        Rows {
                            cache: &t.vw[..nk * hd],
                            offs,
                            hd,
                        },
                    )
                }
            };
            let h = Head {
                s,
                klo,
                keys,
                values,
                mp,
                lo: &t.lo[..mp],
                hi: &t.hi[..mp],
            };
            head(width, &h, qt, st, ot, &mut t.max[..mp], &mut t.sum[..mp]);
            for r in 0..n_rows {
                for h in 0..group {
                    let qi = r * group + h;
                    let inv = 1.0 / t.sum[qi];
                    let o = &mut out[r * qcols + (g * group + h) * hd..][..hd];
                    for (d, o) in o.iter_mut().enumerate() {
                        *o = ot[d * mp + qi] * inv;
                    }
                }
            }
        }
    });
    true
}

/// Whether [`bidirectional`] takes blocks of `keys` keys (with a full tile of queries).
pub(super) fn fits(width: Width, keys: usize) -> bool {
    keys * MAX_QUERIES.next_multiple_of(width.queries()) <= MAX_SCORES
}

/// `Op::BlockAttention`'s rows of one block, whose queries are `q` (`n` rows of `heads *
/// head_dim`, at most [`MAX_QUERIES`]): every head of each row attends to all `nk` rows of its
/// block, whose keys and values start at row `first` of `k` and `v` (rows of the same width), as
/// `kernels::block_attention` does (scaled dot, softmax over the block) with the `f32` sums in
/// another order. Returns `false`, having written nothing, where the block holds more keys
/// than the score buffer does.
#[allow(clippy::too_many_arguments)]
pub(super) fn bidirectional(
    width: Width,
    s: &AttentionShape,
    q: &[f32],
    first: usize,
    nk: usize,
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) -> bool {
    let (hd, cols) = (s.head_dim, s.heads * s.head_dim);
    let n_rows = q.len() / cols.max(1);
    let mp = n_rows.next_multiple_of(width.queries());
    if nk == 0 || nk * mp > MAX_SCORES || n_rows > MAX_QUERIES || s.kv_heads != s.heads {
        return false;
    }
    let (klo, khi) = (first as u32, (first + nk - 1) as u32);
    TILES.with(|cell| {
        let mut t = cell.borrow_mut();
        let t = &mut *t;
        t.grow(hd, mp, nk);
        // Every row sees the whole block; padding queries see nothing.
        for i in 0..mp {
            (t.lo[i], t.hi[i]) = if i < n_rows { (klo, khi) } else { (1, 0) };
        }
        for h in 0..s.heads {
            let (qt, st, ot) = (&mut t.qt[..hd * mp], &mut t.st[..nk * mp], &mut t.ot[..hd * mp]);
            qt.fill(0.0);
            for r in 0..n_rows {
                for (d, &x) in q[r * cols + h * hd..][..hd].iter().enumerate() {
                    qt[d * mp + r] = x;
                }
            }
            for (j, o) in t.offs[..nk].iter_mut().enumerate() {
                *o = (first + j) * cols + h * hd;
            }
            let offs = &t.offs[..nk];
            let head_ = Head {
                s,
                klo,
                keys: Rows { cache: k, offs, hd },
                values: Rows { cache: v, offs, hd },
                mp,
                lo: &t.lo[..mp],
                hi: &t.hi[..mp],
            };
            head(width, &head_, qt, st, ot, &mut t.max[..mp], &mut t.sum[..mp]);
            for r in 0..n_rows {
                let inv = 1.0 / t.sum[r];
                for (d, o) in out[r * cols + h * hd..][..hd].iter_mut().enumerate() {
                    *o = ot[d * mp + r] * inv;
                }
            }
        }
    });
    true
}

/// Which product [`products`] runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// `st[j][i] = dot(K[j], q[i])` (unscaled), from `qt`.
    Scores,
    /// `ot[d][i] = sum_j V[j][d] * st[j][i]`.
    Values,
}

/// The cached rows a product reads: row `j` at `cache[offs[j]..offs[j] + hd]`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    cache: &'a [f32],
    offs: &'a [usize],
    hd: usize,
}

impl Rows<'_> {
    #[inline(always)]
    fn row(&self, j: usize) -> &[f32] {
        &self.cache[self.offs[j]..self.offs[j] + self.hd]
    }
}

/// One KV head of a block: the scores, their softmax, the weighted values.
struct Head<'a> {
    s: &'a AttentionShape,
    /// The first key's position.
    klo: u32,
    keys: Rows<'a>,
    values: Rows<'a>,
    /// Queries, padded (a multiple of the register tile's).
    mp: usize,
    /// Per query: the first and last position it attends to.
    lo: &'a [u32],
    hi: &'a [u32],
}

/// Runs [`Head`] in the widest vectors the CPU has: `ot` receives the unnormalised weighted
/// values, `sum` each query's softmax sum.
fn head(
    width: Width,
    h: &Head,
    qt: &[f32],
    st: &mut [f32],
    ot: &mut [f32],
    max: &mut [f32],
    sum: &mut [f32],
) {
    match width {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: an `Avx512` exists only where AVX-512 F, AVX2 and FMA were detected at run
        // time; the function is safe Rust compiled with those features.
        Width::Avx512(_) => unsafe { head_avx512(h, qt, st, ot, max, sum) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Simd` exists only where AVX2 and FMA were detected at run time.
        Width::Avx2(_) => unsafe { head_avx2(h, qt, st, ot, max, sum) },
        Width::Plain => head_lanes::<8, 2, false>(h, qt, st, ot, max, sum),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn head_avx512(h: &Head, qt: &[f32], st: &mut [f32], ot: &mut [f32], max: &mut [f32], sum: &mut [f32]) {
    // SAFETY: this function is compiled with AVX-512 F and runs only where it was detected
    // (see `head`).
    unsafe { avx512::scores(qt, st, h.keys, h.mp) };
    let nk = h.keys.offs.len();
    if h.s.softcap.is_none() {
        // SAFETY: as above.
        unsafe { avx512::softmax(h.s.scale, h.klo, &mut st[..nk * h.mp], h.mp, h.lo, h.hi, max, sum) };
    } else {
        softmax(h.s, h.klo, st, nk, h.mp, h.lo, h.hi, max, sum);
    }
    // SAFETY: as above.
    unsafe { avx512::values(st, ot, h.values, h.mp) };
}

/// [`products_lanes`]`::<16, 4, true>` with its sixteen sums held in AVX-512 registers by hand,
/// and [`super::softmax`] without a soft-cap: the same operations in the same order, so the same
/// results (criterion `"block attention 16x72"`, 1,024 rows, on the 2-core VM: the generic tiles
/// 78-83 ms, these products 68.0, with this softmax 33.4).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Rows, KT};

    /// Queries per register tile: four vectors of 16.
    const Q: usize = 64;

    /// Keys per chunk of the weighted values' product: 128 keys of 64 queries' weights, 32 KiB,
    /// in L1 while every value dimension passes over them.
    const KEY_CHUNK: usize = 128;

    /// `st[j][i] = dot(K[j], q[i])` for every key `j` and query `i` (`mp` a multiple of 64).
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores(qt: &[f32], st: &mut [f32], rows: Rows, mp: usize) {
        let (nk, hd) = (rows.offs.len(), rows.hd);
        assert!(
            mp.is_multiple_of(Q) && qt.len() >= hd * mp && st.len() >= nk * mp,
            "score tiles out of bounds"
        );
        let (qp, sp) = (qt.as_ptr(), st.as_mut_ptr());
        let mut j = 0;
        while j < nk {
            let kt = (nk - j).min(KT);
            let ks: [&[f32]; KT] = std::array::from_fn(|t| rows.row(j + t.min(kt - 1)));
            for i0 in (0..mp).step_by(Q) {
                // SAFETY: loads of 16 values at `d * mp + i0 + 16 v < hd * mp <= qt.len()`,
                // stores at `(j + t) * mp + i0 + 16 v`, `j + t < nk`, inside `st` (asserted
                // above); `ks[t][d]` with `d < hd`, the rows' length.
                unsafe {
                    let mut acc = [[_mm512_setzero_ps(); 4]; KT];
                    for d in 0..hd {
                        let q: [__m512; 4] =
                            std::array::from_fn(|v| _mm512_loadu_ps(qp.add(d * mp + i0 + 16 * v)));
                        for (a, k) in acc.iter_mut().zip(&ks) {
                            let b = _mm512_set1_ps(*k.get_unchecked(d));
                            for (a, q) in a.iter_mut().zip(q) {
                                *a = _mm512_fmadd_ps(b, q, *a);
                            }
                        }
                    }
                    for (t, a) in acc.iter().enumerate().take(kt) {
                        for (v, a) in a.iter().enumerate() {
                            _mm512_storeu_ps(sp.add((j + t) * mp + i0 + 16 * v), *a);
                        }
                    }
                }
            }
            j += kt;
        }
    }

    /// [`super::softmax`] without a soft-cap, sixteen queries per vector: the scores of `st`
    /// (`mp` queries per key, from position `klo`) scaled and masked to each query's `lo..=hi`,
    /// then `exp(score - max)` (masked scores 0) with each query's sum in `sum`. The same
    /// arithmetic as the generic one (its `exp` step by step, unfused), so the same results.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn softmax(
        scale: f32,
        klo: u32,
        st: &mut [f32],
        mp: usize,
        lo: &[u32],
        hi: &[u32],
        max: &mut [f32],
        sum: &mut [f32],
    ) {
        assert!(
            mp.is_multiple_of(16) && lo.len() >= mp && hi.len() >= mp && max.len() >= mp && sum.len() >= mp,
            "softmax rows out of bounds"
        );
        let sp = st.as_mut_ptr();
        let rows = st.len() / mp;
        // SAFETY: every access is of 16 values at `i0 < mp` (a multiple of 16) of `lo`, `hi`,
        // `max`, `sum` (each at least `mp` long, asserted above) or at `j * mp + i0`, `j <
        // rows`, of `st`.
        unsafe {
            let (neg, sc) = (_mm512_set1_ps(f32::NEG_INFINITY), _mm512_set1_ps(scale));
            for i0 in (0..mp).step_by(16) {
                _mm512_storeu_ps(max.as_mut_ptr().add(i0), neg);
                _mm512_storeu_ps(sum.as_mut_ptr().add(i0), _mm512_setzero_ps());
            }
            for j in 0..rows {
                let pos = _mm512_set1_epi32((klo + j as u32) as i32);
                for i0 in (0..mp).step_by(16) {
                    let at = sp.add(j * mp + i0);
                    let l = _mm512_loadu_si512(lo.as_ptr().add(i0) as *const _);
                    let h = _mm512_loadu_si512(hi.as_ptr().add(i0) as *const _);
                    let seen = _mm512_cmple_epu32_mask(l, pos) & _mm512_cmple_epu32_mask(pos, h);
                    let v = _mm512_mask_blend_ps(seen, neg, _mm512_mul_ps(_mm512_loadu_ps(at), sc));
                    _mm512_storeu_ps(at, v);
                    let m = max.as_mut_ptr().add(i0);
                    _mm512_storeu_ps(m, _mm512_max_ps(_mm512_loadu_ps(m), v));
                }
            }
            for j in 0..rows {
                for i0 in (0..mp).step_by(16) {
                    let at = sp.add(j * mp + i0);
                    let v = _mm512_loadu_ps(at);
                    let live = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(v, neg);
                    let e = _mm512_maskz_mov_ps(
                        live,
                        exp(_mm512_sub_ps(v, _mm512_loadu_ps(max.as_ptr().add(i0)))),
                    );
                    _mm512_storeu_ps(at, e);
                    let s = sum.as_mut_ptr().add(i0);
                    _mm512_storeu_ps(s, _mm512_add_ps(_mm512_loadu_ps(s), e));
                }
            }
        }
        for s in &mut sum[..mp] {
            if *s == 0.0 {
                *s = 1.0;
            }
        }
    }

    /// `crate::vmath::exp` on sixteen lanes, operation for operation (no fused steps).
    ///
    /// # Safety
    /// The CPU has AVX-512 F (it is inlined into [`softmax`], compiled with it).
    #[inline(always)]
    unsafe fn exp(x: __m512) -> __m512 {
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        // SAFETY: register arithmetic only; the callers run with AVX-512 F.
        unsafe {
            let c = |v: f32| _mm512_set1_ps(v);
            let x = _mm512_min_ps(_mm512_max_ps(x, c(-87.0)), c(88.0));
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_add_ps(
                _mm512_mul_ps(x, c(LOG2E)),
                c(0.5),
            ));
            let r = _mm512_sub_ps(
                _mm512_sub_ps(x, _mm512_mul_ps(n, c(LN2_HI))),
                _mm512_mul_ps(n, c(LN2_LO)),
            );
            let mut p = c(1.987_569_1e-4);
            for k in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
                p = _mm512_add_ps(_mm512_mul_ps(p, r), c(k));
            }
            p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), c(1.0));
            let two_n = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
                _mm512_cvttps_epi32(n),
                _mm512_set1_epi32(127),
            )));
            _mm512_mul_ps(p, two_n)
        }
    }

    /// `ot[d][i] = sum_j V[j][d] * st[j][i]`, keys in chunks of [`KEY_CHUNK`].
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn values(st: &[f32], ot: &mut [f32], rows: Rows, mp: usize) {
        let (nk, hd) = (rows.offs.len(), rows.hd);
        assert!(
            mp.is_multiple_of(Q) && st.len() >= nk * mp && ot.len() >= hd * mp,
            "value tiles out of bounds"
        );
        let (sp, op) = (st.as_ptr(), ot.as_mut_ptr());
        for j0 in (0..nk).step_by(KEY_CHUNK) {
            let je = (j0 + KEY_CHUNK).min(nk);
            let mut d = 0;
            while d < hd {
                let dt = (hd - d).min(KT);
                for i0 in (0..mp).step_by(Q) {
                    // SAFETY: loads of 16 weights at `j * mp + i0 + 16 v`, `j < nk`, inside
                    // `st`; loads and stores of 16 sums at `(d + t) * mp + i0 + 16 v`, `d + t <
                    // hd`, inside `ot` (asserted above); value `d + min(t, dt - 1) < hd` of a row.
                    unsafe {
                        let mut acc = [[_mm512_setzero_ps(); 4]; KT];
                        if j0 > 0 {
                            for (t, a) in acc.iter_mut().enumerate().take(dt) {
                                for (v, a) in a.iter_mut().enumerate() {
                                    *a = _mm512_loadu_ps(op.add((d + t) * mp + i0 + 16 * v));
                                }
                            }
                        }
                        for j in j0..je {
                            let vr = rows.row(j);
                            let p: [__m512; 4] =
                                std::array::from_fn(|v| _mm512_loadu_ps(sp.add(j * mp + i0 + 16 * v)));
                            for (t, a) in acc.iter_mut().enumerate() {
                                let b = _mm512_set1_ps(*vr.get_unchecked(d + t.min(dt - 1)));
                                for (a, p) in a.iter_mut().zip(p) {
                                    *a = _mm512_fmadd_ps(b, p, *a);
                                }
                            }
                        }
                        for (t, a) in acc.iter().enumerate().take(dt) {
                            for (v, a) in a.iter().enumerate() {
                                _mm512_storeu_ps(op.add((d + t) * mp + i0 + 16 * v), *a);
                            }
                        }
                    }
                }
                d += dt;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn head_avx2(h: &Head, qt: &[f32], st: &mut [f32], ot: &mut [f32], max: &mut [f32], sum: &mut [f32]) {
    head_lanes::<8, 2, true>(h, qt, st, ot, max, sum)
}

#[inline(always)]
fn head_lanes<const L: usize, const V: usize, const FMA: bool>(
    h: &Head,
    qt: &[f32],
    st: &mut [f32],
    ot: &mut [f32],
    max: &mut [f32],
    sum: &mut [f32],
) {
    products_lanes::<L, V, FMA>(Pass::Scores, qt, st, ot, h.keys, h.mp);
    softmax(h.s, h.klo, st, h.keys.offs.len(), h.mp, h.lo, h.hi, max, sum);
    products_lanes::<L, V, FMA>(Pass::Values, qt, st, ot, h.values, h.mp);
}

/// `a * b + c`, fused where `FMA` (the caller's target has the instruction).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Both products in register tiles of [`KT`] cached rows (or value dimensions) by `V`
/// vectors of `L` queries (`L` lanes of `f32` fill one of the target's vector registers;
/// `mp` is a multiple of `L * V`).
#[inline(always)]
fn products_lanes<const L: usize, const V: usize, const FMA: bool>(
    pass: Pass,
    qt: &[f32],
    st: &mut [f32],
    ot: &mut [f32],
    rows: Rows,
    mp: usize,
) {
    let (nk, hd) = (rows.offs.len(), rows.hd);
    match pass {
        Pass::Scores => {
            let mut j = 0;
            while j < nk {
                let kt = (nk - j).min(KT);
                let ks: [&[f32]; KT] = std::array::from_fn(|t| rows.row(j + t.min(kt - 1)));
                for i0 in (0..mp).step_by(L * V) {
                    let mut acc = [[[0f32; L]; V]; KT];
                    for d in 0..hd {
                        let qv: &[f32] = &qt[d * mp + i0..][..L * V];
                        for t in 0..KT {
                            let kv = ks[t][d];
                            for v in 0..V {
                                for l in 0..L {
                                    acc[t][v][l] = madd::<FMA>(kv, qv[v * L + l], acc[t][v][l]);
                                }
                            }
                        }
                    }
                    for (t, a) in acc.iter().enumerate().take(kt) {
                        for (v, a) in a.iter().enumerate() {
                            st[(j + t) * mp + i0 + v * L..][..L].copy_from_slice(a);
                        }
                    }
                }
                j += kt;
            }
        }
        Pass::Values => {
            let mut d = 0;
            while d < hd {
                let dt = (hd - d).min(KT);
                for i0 in (0..mp).step_by(L * V) {
                    let mut acc = [[[0f32; L]; V]; KT];
                    for j in 0..nk {
                        let vr = &rows.row(j)[d..d + dt];
                        let pv: &[f32] = &st[j * mp + i0..][..L * V];
                        for t in 0..KT {
                            let vv = vr[t.min(dt - 1)];
                            for v in 0..V {
                                for l in 0..L {
                                    acc[t][v][l] = madd::<FMA>(vv, pv[v * L + l], acc[t][v][l]);
                                }
                            }
                        }
                    }
                    for (t, a) in acc.iter().enumerate().take(dt) {
                        for (v, a) in a.iter().enumerate() {
                            ot[(d + t) * mp + i0 + v * L..][..L].copy_from_slice(a);
                        }
                    }
                }
                d += dt;
            }
        }
    }
}

/// Scales, soft-caps and masks the scores in `st` (`nk` keys from position `klo`, by `mp`
/// queries), then replaces them by `exp(score - max)`, with each query's sum in `sum`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn softmax(
    s: &AttentionShape,
    klo: u32,
    st: &mut [f32],
    nk: usize,
    mp: usize,
    lo: &[u32],
    hi: &[u32],
    max: &mut [f32],
    sum: &mut [f32],
) {
    max.fill(f32::NEG_INFINITY);
    sum.fill(0.0);
    for (j, sr) in st.chunks_exact_mut(mp).take(nk).enumerate() {
        let pos = klo + j as u32;
        if let Some(cap) = s.softcap {
            for v in sr.iter_mut() {
                *v = cap * (*v * s.scale / cap).tanh();
            }
        } else {
            for v in sr.iter_mut() {
                *v *= s.scale;
            }
        }
        for (((v, m), &lo), &hi) in sr.iter_mut().zip(max.iter_mut()).zip(lo).zip(hi) {
            let x = if pos >= lo && pos <= hi {
                *v
            } else {
                f32::NEG_INFINITY
            };
            *v = x;
            *m = m.max(x);
        }
    }
    for sr in st.chunks_exact_mut(mp).take(nk) {
        for ((v, m), sm) in sr.iter_mut().zip(&*max).zip(sum.iter_mut()) {
            let e = if *v == f32::NEG_INFINITY {
                0.0
            } else {
                crate::vmath::exp(*v - m)
            };
            *v = e;
            *sm += e;
        }
    }
    // Padding queries attend nothing: a sum of one keeps their (unused) outputs finite.
    for sm in sum.iter_mut() {
        if *sm == 0.0 {
            *sm = 1.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 softmax against the generic one, bit for bit: queries masked in part and
    /// in whole (padding), scores across `exp`'s range.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_softmax_is_the_generic_one() {
        if Avx512::detect().is_none() {
            eprintln!("no AVX-512 here: nothing to compare");
            return;
        }
        let (nk, mp, klo) = (37usize, 32usize, 5u32);
        let s = AttentionShape {
            heads: 1,
            kv_heads: 1,
            head_dim: 8,
            capacity: 64,
            scale: 0.7,
            window: None,
            softcap: None,
            cache_dtype: tandem_backend_api::DType::F32,
        };
        let st0: Vec<f32> = (0..nk * mp)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.21)
            .collect();
        let lo: Vec<u32> = (0..mp as u32)
            .map(|i| if i >= 30 { 1 } else { klo + i % 9 })
            .collect();
        let hi: Vec<u32> = (0..mp as u32)
            .map(|i| if i >= 30 { 0 } else { klo + 10 + i })
            .collect();
        let (mut a, mut b) = (st0.clone(), st0);
        let (mut ma, mut sa, mut mb, mut sb) =
            (vec![0f32; mp], vec![0f32; mp], vec![0f32; mp], vec![0f32; mp]);
        softmax(&s, klo, &mut a, nk, mp, &lo, &hi, &mut ma, &mut sa);
        // SAFETY: AVX-512 F was detected above.
        unsafe { avx512::softmax(s.scale, klo, &mut b, mp, &lo, &hi, &mut mb, &mut sb) };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "weights");
        assert_eq!(bits(&sa), bits(&sb), "sums");
        assert!(sa.iter().all(|&x| x > 0.0));
    }
}
