//! The fast kernels' `Op::Attention` (second half, after `kernels::kv_append`): scores and
//! weighted values read straight from an `f32` KV cache, with no copy of the cached rows (from
//! an `f16` cache each row is widened to `f32` as it is read: half the bytes; a prompt chunk's
//! tile widens its block's rows once into a per-thread buffer); one
//! parallel task per (row, KV head), whose query heads (grouped-query attention) read each
//! cached K and V row once between them; the score buffer is per thread, sized to the group's
//! heads times the cache's capacity when a program is compiled ([`reserve`]) and kept between
//! calls, so nothing is allocated per step. The arithmetic is `kernels::attend`'s, with the dot
//! products and the value sums in eight lanes (AVX2 where detected, the same lanes in plain
//! Rust elsewhere) instead of one running sum.

use std::cell::RefCell;

use rayon::prelude::*;
use tandem_backend_api::DType;

use crate::shape::AttentionShape;

mod tiled;

pub use tiled::reserve as reserve_tiles;

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

/// Grows the calling thread's lists of a step's rows to `rows`, so that steps of at most that
/// many allocate nothing: a step runs on whichever pool thread takes it (`CpuBackend::compile`
/// runs this on every one).
pub fn reserve_rows(rows: usize) {
    ROWS.with(|cell| {
        let s = &mut *cell.borrow_mut();
        s.runs.reserve(rows.saturating_sub(s.runs.len()));
        for v in [&mut s.single, &mut s.chunks, &mut s.first] {
            v.reserve(rows.saturating_sub(v.len()));
        }
    });
}

/// Grows the calling thread's split-attention partials to `values`, so that decode steps of
/// at most that many allocate nothing (`CpuBackend::compile` runs it on every pool thread, with
/// [`partials_for`]).
pub fn reserve_partials(values: usize) {
    PARTIALS.with(|cell| {
        let mut parts = cell.borrow_mut();
        if parts.len() < values {
            parts.resize(values, 0.0);
        }
    });
}

/// The most partial values a decode-sized step (fewer than [`TILED_MIN_ROWS`] rows) of `rows`
/// rows on `threads` threads holds for attention of shape `s`; zero for larger steps, whose
/// single rows (decode rows sharing a step with a prompt chunk) grow the partials on first use.
pub fn partials_for(s: &AttentionShape, rows: usize, threads: usize) -> usize {
    if rows >= TILED_MIN_ROWS || s.kv_heads == 0 {
        return 0;
    }
    // Each row's keys split into at most `2 threads` chunks (`Cache::chunks`).
    rows * s.kv_heads * 2 * threads * (s.heads / s.kv_heads) * (s.head_dim + 2)
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

/// `Op::BlockAttention` (the vision tower's: every row attends to every row of its block of
/// `block` rows, per head) in [`tiled`] blocks of up to `tiled::MAX_QUERIES` rows, each head's
/// keys and values read once per block of queries instead of once per row; the blocks and
/// heads in parallel. Returns `false`, having written nothing, where the image blocks are
/// longer than the tiles' score buffer holds; the caller then uses the reference kernel.
#[allow(clippy::too_many_arguments)]
pub fn block_attention(
    pool: &rayon::ThreadPool,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    head_dim: usize,
    scale: f32,
    block: usize,
    out: &mut [f32],
) -> bool {
    let cols = heads * head_dim;
    let rows = q.len() / cols.max(1);
    let width = tiled::Width::detect(Simd::detect());
    if cols == 0 || block == 0 || !tiled::fits(width, block.min(rows)) {
        return false;
    }
    let s = AttentionShape {
        heads,
        kv_heads: heads,
        head_dim,
        capacity: rows,
        scale,
        window: None,
        softcap: None,
        cache_dtype: DType::F32,
    };
    // Tiles of at most MAX_QUERIES rows that never straddle a block's end.
    let mut tiles: Vec<(usize, &mut [f32])> = Vec::new();
    let mut rest = out;
    let mut r = 0;
    while r < rows {
        let end = (r / block * block + block).min(rows);
        let n = tiled::MAX_QUERIES.min(end - r);
        let (tile, tail) = std::mem::take(&mut rest).split_at_mut(n * cols);
        tiles.push((r, tile));
        rest = tail;
        r += n;
    }
    pool.install(|| {
        tiles.into_par_iter().all(|(r0, o)| {
            let n = o.len() / cols;
            let first = r0 / block * block;
            let nk = (first + block).min(rows) - first;
            tiled::bidirectional(width, &s, &q[r0 * cols..(r0 + n) * cols], first, nk, k, v, o)
        })
    })
}

/// Attends every row over its slot's cached positions as `kernels::attend` does. Returns
/// `false`, having written nothing, where the cache is not `f32` (or not aligned as `f32`); the
/// caller then uses the reference kernel.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    pool: &rayon::ThreadPool,
    spin: Option<&crate::spin::SpinPool>,
    s: &AttentionShape,
    q: &[f32],
    positions: &[u32],
    slots: &[u32],
    kc: &[u8],
    vc: &[u8],
    out: &mut [f32],
) -> bool {
    if s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) {
        return false;
    }
    let (kc, vc) = match s.cache_dtype {
        DType::F32 => match (
            bytemuck::try_cast_slice::<u8, f32>(kc),
            bytemuck::try_cast_slice::<u8, f32>(vc),
        ) {
            (Ok(k), Ok(v)) => (KvRows::F32(k), KvRows::F32(v)),
            _ => return false,
        },
        // Heads that fit the widening buffer (a prompt chunk's rows attend one by one: the
        // tiles read f32 rows).
        DType::F16 if s.head_dim <= MAX_F16_HEAD => match (
            bytemuck::try_cast_slice::<u8, u16>(kc),
            bytemuck::try_cast_slice::<u8, u16>(vc),
        ) {
            (Ok(k), Ok(v)) => {
                let f16c = F16c::detect();
                (KvRows::F16(k, f16c), KvRows::F16(v, f16c))
            }
            _ => return false,
        },
        _ => return false,
    };
    let qcols = s.heads * s.head_dim;
    let group = s.heads / s.kv_heads;
    if group > MAX_GROUP {
        return false;
    }
    let simd = Simd::detect();
    let rows = positions.len();
    let threads = spin.map_or(pool.current_num_threads(), |p| p.threads());
    // Runs of consecutive rows of one slot: a run of at least TILED_MIN_ROWS (a prompt chunk)
    // attends in tiled blocks counted from its first row, the other rows (decode rows, short
    // chunks) one by one with their keys split by their own count. A row's arithmetic thus
    // depends only on its own run, never on what else shares the step: batching changes no
    // result.
    ROWS.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let RowScratch {
            runs,
            single,
            chunks,
            first,
        } = &mut *scratch;
        runs.clear();
        single.clear();
        let mut i = 0;
        while i < rows {
            let e = (i + 1..rows).find(|&e| slots[e] != slots[i]).unwrap_or(rows);
            if e - i >= TILED_MIN_ROWS {
                runs.push((i, e));
            } else {
                single.extend(i..e);
            }
            i = e;
        }
        let c = Cache {
            s,
            q,
            positions,
            slots,
            kc,
            vc,
            simd,
        };
        if !runs.is_empty() {
            c.tiled_runs(pool, runs, &mut out[..rows * qcols]);
        }
        if !single.is_empty() {
            c.row_by_row(
                pool,
                spin,
                threads,
                single,
                (chunks, first),
                &mut out[..rows * qcols],
            );
        }
    });
    true
}

/// The calling thread's lists of a step's rows ([`attend`]), kept so that decode steps
/// allocate nothing.
#[derive(Default)]
struct RowScratch {
    /// Runs of rows of one slot attended in tiles.
    runs: Vec<(usize, usize)>,
    /// Rows attended one by one.
    single: Vec<usize>,
    /// Each single row's chunks.
    chunks: Vec<usize>,
    /// Where each single row's partials start.
    first: Vec<usize>,
}

thread_local! {
    static ROWS: RefCell<RowScratch> = RefCell::default();
}

/// What every row's attention reads.
struct Cache<'a> {
    s: &'a AttentionShape,
    q: &'a [f32],
    positions: &'a [u32],
    slots: &'a [u32],
    kc: KvRows<'a>,
    vc: KvRows<'a>,
    simd: Option<Simd>,
}

/// The largest head an `f16` cache is read with (its rows widened into a buffer of this size).
const MAX_F16_HEAD: usize = 512;

/// Proof that F16C and AVX were detected at run time; only [`F16c::detect`] makes one (once per
/// attention, not per cached row).
#[derive(Clone, Copy)]
pub(super) struct F16c(());

impl F16c {
    fn detect() -> Option<F16c> {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx") {
            return Some(F16c(()));
        }
        None
    }
}

/// A KV cache's elements.
#[derive(Clone, Copy)]
pub(super) enum KvRows<'a> {
    F32(&'a [f32]),
    /// IEEE half floats, as bits, and whether they widen with F16C.
    F16(&'a [u16], Option<F16c>),
}

impl KvRows<'_> {
    /// The `out.len()` values at `at`, as `f32`, into `out`.
    pub(super) fn widen_into(&self, at: usize, out: &mut [f32]) {
        match self {
            KvRows::F32(c) => out.copy_from_slice(&c[at..at + out.len()]),
            KvRows::F16(c, f16c) => widen(&c[at..at + out.len()], out, *f16c),
        }
    }

    /// The `hd` values at `at` as `f32`: in place, or widened into `buf`.
    #[inline(always)]
    fn row<'b>(&'b self, at: usize, hd: usize, buf: &'b mut [f32; MAX_F16_HEAD]) -> &'b [f32] {
        match self {
            KvRows::F32(c) => &c[at..at + hd],
            KvRows::F16(..) => {
                self.widen_into(at, &mut buf[..hd]);
                &buf[..hd]
            }
        }
    }
}

/// `out[i] = f32(h[i])` for half floats given as bits (with F16C where `f16c`).
fn widen(h: &[u16], out: &mut [f32], f16c: Option<F16c>) {
    #[cfg(target_arch = "x86_64")]
    if f16c.is_some() {
        // SAFETY: an `F16c` exists only where F16C and AVX were detected at run time.
        return unsafe { widen_f16c(h, out) };
    }
    let _ = f16c;
    for (o, &b) in out.iter_mut().zip(h) {
        *o = half::f16::from_bits(b).to_f32();
    }
}

/// [`widen`] eight values at a time with `vcvtph2ps`.
///
/// # Safety
/// The CPU has F16C and AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn widen_f16c(h: &[u16], out: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = h.len().min(out.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `h[i..i + 8]` and `out[i..i + 8]` are in bounds (i + 8 <= n); both accesses
        // are unaligned loads and stores of exactly eight elements.
        unsafe {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(h[i..i + 8].as_ptr() as *const __m128i));
            _mm256_storeu_ps(out[i..i + 8].as_mut_ptr(), v);
        }
        i += 8;
    }
    for j in i..n {
        out[j] = half::f16::from_bits(h[j]).to_f32();
    }
}

impl Cache<'_> {
    /// The runs `runs` (row ranges of one slot each) in [`tiled`] blocks of at most
    /// `tiled::MAX_QUERIES / group` rows from each run's first row, the blocks in parallel.
    fn tiled_runs(&self, pool: &rayon::ThreadPool, runs: &[(usize, usize)], out: &mut [f32]) {
        let s = self.s;
        let (hd, qcols, group) = (s.head_dim, s.heads * s.head_dim, s.heads / s.kv_heads);
        let width = tiled::Width::detect(self.simd);
        let qb = tiled::MAX_QUERIES / group;
        let mut blocks: Vec<(usize, &mut [f32])> = Vec::new();
        let (mut rest, mut at) = (out, 0usize);
        for &(a, e) in runs {
            let mut b = a;
            while b < e {
                let n = qb.min(e - b);
                let (_, tail) = std::mem::take(&mut rest).split_at_mut((b - at) * qcols);
                let (block, tail) = tail.split_at_mut(n * qcols);
                blocks.push((b, block));
                rest = tail;
                (at, b) = (b + n, b + n);
            }
        }
        pool.install(|| {
            blocks.into_par_iter().for_each(|(r0, ob)| {
                let n = ob.len() / qcols;
                let tiled = tiled::block(
                    width,
                    s,
                    &self.q[r0 * qcols..(r0 + n) * qcols],
                    &self.positions[r0..r0 + n],
                    self.slots[r0],
                    self.kc,
                    self.vc,
                    ob,
                );
                if !tiled {
                    for r in 0..n {
                        for (g, og) in ob[r * qcols..(r + 1) * qcols].chunks_mut(group * hd).enumerate() {
                            self.group(r0 + r, g, og);
                        }
                    }
                }
            })
        });
    }

    /// Row `r`'s attention for KV head `g`, whole ([`attend_group`]).
    fn group(&self, r: usize, g: usize, og: &mut [f32]) {
        let c = self;
        attend_group(c.simd, c.s, c.q, c.positions, c.slots, &c.kc, &c.vc, r, g, og);
    }

    /// How many chunks row `r`'s keys split into: as many as keep `2 * threads` busy on one
    /// row, with at least [`MIN_SPLIT_KEYS`] keys each. Depends on the row alone.
    fn chunks(&self, r: usize, threads: usize) -> usize {
        let p = self.positions[r];
        let keys = (p - self.s.window.map_or(0, |w| (p + 1).saturating_sub(w as u32)) + 1) as usize;
        (2 * threads).min(keys / MIN_SPLIT_KEYS).max(1)
    }

    /// The rows `rows` one by one: each (row, KV head) whole where its keys make one chunk,
    /// else its chunks attended in parallel and then combined (one task per (row, KV head)
    /// each time: the group's query heads read each cached K and V row once).
    fn row_by_row(
        &self,
        pool: &rayon::ThreadPool,
        spin: Option<&crate::spin::SpinPool>,
        threads: usize,
        rows: &[usize],
        (chunks, first): (&mut Vec<usize>, &mut Vec<usize>),
        out: &mut [f32],
    ) {
        let s = self.s;
        let (hd, qcols, group, heads) = (s.head_dim, s.heads * s.head_dim, s.heads / s.kv_heads, s.kv_heads);
        let part = group * (hd + 2);
        // Each row's chunks, and where its (KV head, chunk) partials start (rows of one chunk
        // take none).
        chunks.clear();
        chunks.extend(rows.iter().map(|&r| self.chunks(r, threads)));
        first.clear();
        let mut tasks = 0usize;
        for &n in chunks.iter() {
            first.push(tasks);
            if n > 1 {
                tasks += heads * n;
            }
        }
        first.push(tasks);
        let (chunks, first) = (&*chunks, &*first);
        // The loops below on the spinning threads where given, else on the pool.
        let each = |data: &mut [f32], len: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)| match spin {
            Some(p) => crate::spin::chunks_mut(p, data, len, f),
            None => pool.install(|| data.par_chunks_mut(len).enumerate().for_each(|(i, c)| f(i, c))),
        };
        PARTIALS.with(|cell| {
            let mut parts = cell.borrow_mut();
            if parts.len() < tasks * part {
                parts.resize(tasks * part, 0.0);
            }
            let parts = &mut parts[..tasks * part];
            if tasks > 0 {
                each(parts, part, &|t, pt| {
                    let j = first.partition_point(|&f| f <= t) - 1;
                    let (n, local) = (chunks[j], t - first[j]);
                    let c = self;
                    partial_group(
                        c.simd,
                        s,
                        c.q,
                        c.positions,
                        c.slots,
                        &c.kc,
                        &c.vc,
                        rows[j],
                        local / n,
                        local % n,
                        n,
                        pt,
                    )
                });
            }
            let parts = &*parts;
            // Row j's head g: whole, or its chunks combined.
            let finish = |j: usize, g: usize, og: &mut [f32]| {
                let n = chunks[j];
                if n == 1 {
                    self.group(rows[j], g, og);
                } else {
                    let at = (first[j] + g * n) * part;
                    combine(&parts[at..at + n * part], group, hd, og);
                }
            };
            let contiguous = rows.iter().enumerate().all(|(j, &r)| r == j) && rows.len() * qcols <= out.len();
            if contiguous {
                each(&mut out[..rows.len() * qcols], group * hd, &|i, og| {
                    finish(i / heads, i % heads, og)
                });
            } else {
                let mut segments: Vec<(usize, &mut [f32])> = Vec::with_capacity(rows.len() * heads);
                let mut want = rows.iter().enumerate().peekable();
                for (r, row) in out.chunks_mut(qcols).enumerate() {
                    if let Some((j, _)) = want.next_if(|(_, &w)| w == r) {
                        segments.extend(row.chunks_mut(group * hd).map(|og| (j, og)));
                    }
                }
                pool.install(|| {
                    segments
                        .into_par_iter()
                        .enumerate()
                        .for_each(|(i, (j, og))| finish(j, i % heads, og))
                });
            }
        });
    }
}

/// The fewest rows in a step that attend in [`tiled`] blocks.
pub(crate) const TILED_MIN_ROWS: usize = 8;

/// Row `r`'s view for KV head `g`.
struct Row<'a, F: Fn(u32) -> usize> {
    /// The group's query heads.
    qg: &'a [f32],
    /// The first position the row attends to.
    lo: u32,
    /// Positions it attends to.
    n: usize,
    /// The offset of a position's K (and V) row of this head in the cache.
    at: F,
}

impl<'a> Row<'a, fn(u32) -> usize> {
    #[allow(clippy::type_complexity)]
    fn of(
        s: &AttentionShape,
        q: &'a [f32],
        positions: &[u32],
        slots: &[u32],
        r: usize,
        g: usize,
    ) -> Row<'a, impl Fn(u32) -> usize> {
        let (hd, qcols) = (s.head_dim, s.heads * s.head_dim);
        let group = s.heads / s.kv_heads;
        let p = positions[r];
        let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w as u32));
        let (slot, capacity, kv_cols) = (slots[r] as usize, s.capacity, s.kv_heads * hd);
        Row {
            qg: &q[r * qcols + g * group * hd..r * qcols + (g + 1) * group * hd],
            lo,
            n: (p - lo + 1) as usize,
            at: move |pos: u32| (slot * capacity + pos as usize % capacity) * kv_cols + g * hd,
        }
    }
}

/// Attends row `r`'s query heads of KV head `g` into `og` (the group's heads).
#[allow(clippy::too_many_arguments)]
fn attend_group(
    simd: Option<Simd>,
    s: &AttentionShape,
    q: &[f32],
    positions: &[u32],
    slots: &[u32],
    kc: &KvRows,
    vc: &KvRows,
    r: usize,
    g: usize,
    og: &mut [f32],
) {
    let (hd, group) = (s.head_dim, s.heads / s.kv_heads);
    let mut buf = [0f32; MAX_F16_HEAD];
    let Row { qg, lo, n, at } = Row::of(s, q, positions, slots, r, g);
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        if scores.len() < group * n {
            scores.resize(group * n, 0.0);
        }
        // Head `h`'s scores at `scores[h * n..(h + 1) * n]`.
        let scores = &mut scores[..group * n];
        score_keys(simd, s, qg, kc, &at, lo, n, scores);
        for sh in scores.chunks_exact_mut(n) {
            let (_, sum) = exp_from_max(sh);
            for sc in sh.iter_mut() {
                *sc /= sum;
            }
        }
        og.fill(0.0);
        let mut w = [0f32; MAX_GROUP];
        for (j, pos) in (lo..lo + n as u32).enumerate() {
            for (h, w) in w[..group].iter_mut().enumerate() {
                *w = scores[h * n + j];
            }
            group_axpy(simd, &w[..group], vc.row(at(pos), hd, &mut buf), og);
        }
    })
}

/// The scaled (and soft-capped) scores of the group's query heads `qg` against the `n` keys
/// from position `first` (row offsets in `kc` by `at`): head `h`'s at `scores[h * n..]`.
#[allow(clippy::too_many_arguments)]
fn score_keys(
    simd: Option<Simd>,
    s: &AttentionShape,
    qg: &[f32],
    kc: &KvRows,
    at: &dyn Fn(u32) -> usize,
    first: u32,
    n: usize,
    scores: &mut [f32],
) {
    let (hd, group) = (s.head_dim, s.heads / s.kv_heads);
    let mut dots = [0f32; MAX_GROUP];
    let mut buf = [0f32; MAX_F16_HEAD];
    for j in 0..n {
        let row = at(first + j as u32);
        group_dots(simd, qg, kc.row(row, hd, &mut buf), &mut dots[..group]);
        for (h, &d) in dots[..group].iter().enumerate() {
            let mut v = d * s.scale;
            if let Some(cap) = s.softcap {
                v = cap * (v / cap).tanh();
            }
            scores[h * n + j] = v;
        }
    }
}

/// Replaces each score by `exp(score - max)`; returns the maximum and the sum of the
/// exponentials (the softmax's two reductions).
fn exp_from_max(scores: &mut [f32]) -> (f32, f32) {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f32;
    for sc in scores.iter_mut() {
        *sc = (*sc - max).exp();
        sum += *sc;
    }
    (max, sum)
}

/// The fewest keys per chunk where a decode step's keys are split across threads.
const MIN_SPLIT_KEYS: usize = 32;

thread_local! {
    /// The calling thread's partial results of split attention: per (row, KV head, chunk) and
    /// query head, the chunk's score maximum, its sum of exponentials and its unnormalised
    /// weighted values.
    static PARTIALS: RefCell<Vec<f32>> = RefCell::default();
}

/// Chunk `c` of `chunks` of row `r`'s keys for KV head `g`: per query head `h` of the group,
/// `part[h * (hd + 2)..]` receives the chunk's largest score, the sum of `exp(score - max)`,
/// and the `hd` values weighted by those exponentials (an empty chunk: maximum `-inf`).
#[allow(clippy::too_many_arguments)]
fn partial_group(
    simd: Option<Simd>,
    s: &AttentionShape,
    q: &[f32],
    positions: &[u32],
    slots: &[u32],
    kc: &KvRows,
    vc: &KvRows,
    r: usize,
    g: usize,
    c: usize,
    chunks: usize,
    part: &mut [f32],
) {
    let mut buf = [0f32; MAX_F16_HEAD];
    let (hd, group) = (s.head_dim, s.heads / s.kv_heads);
    let Row { qg, lo, n: total, at } = Row::of(s, q, positions, slots, r, g);
    let (k0, k1) = (total * c / chunks, total * (c + 1) / chunks);
    let n = k1 - k0;
    part.fill(0.0);
    if n == 0 {
        for ph in part.chunks_exact_mut(hd + 2) {
            ph[0] = f32::NEG_INFINITY;
        }
        return;
    }
    let first = lo + k0 as u32;
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        if scores.len() < group * n {
            scores.resize(group * n, 0.0);
        }
        let scores = &mut scores[..group * n];
        score_keys(simd, s, qg, kc, &at, first, n, scores);
        for (sh, ph) in scores.chunks_exact_mut(n).zip(part.chunks_exact_mut(hd + 2)) {
            (ph[0], ph[1]) = exp_from_max(sh);
        }
        let mut w = [0f32; MAX_GROUP];
        for j in 0..n {
            let pos = first + j as u32;
            for (h, w) in w[..group].iter_mut().enumerate() {
                *w = scores[h * n + j];
            }
            // The group's weighted sums, `hd + 2` apart.
            let v = vc.row(at(pos), hd, &mut buf);
            for (h, ph) in part.chunks_exact_mut(hd + 2).enumerate() {
                group_axpy(simd, &w[h..h + 1], v, &mut ph[2..]);
            }
        }
    })
}

/// Combines a (row, KV head)'s chunks (`parts`: per chunk, per query head, maximum, sum and
/// weighted values) into the group's outputs `og`: the softmax over all the chunks' keys.
fn combine(parts: &[f32], group: usize, hd: usize, og: &mut [f32]) {
    let part = group * (hd + 2);
    for (h, o) in og.chunks_exact_mut(hd).enumerate() {
        let heads = || {
            parts
                .chunks_exact(part)
                .map(|p| &p[h * (hd + 2)..(h + 1) * (hd + 2)])
        };
        let max = heads().fold(f32::NEG_INFINITY, |m, p| m.max(p[0]));
        let mut sum = 0f32;
        o.fill(0.0);
        for p in heads() {
            if p[0] == f32::NEG_INFINITY {
                continue;
            }
            let f = (p[0] - max).exp();
            sum += p[1] * f;
            for (o, v) in o.iter_mut().zip(&p[2..]) {
                *o += v * f;
            }
        }
        let inv = 1.0 / sum;
        for o in o.iter_mut() {
            *o *= inv;
        }
    }
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

    fn vals(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 16) % 200) as f32 / 100.0 - 1.0)
            .collect()
    }

    fn to_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn shape(heads: usize, kv_heads: usize, head_dim: usize, capacity: usize) -> AttentionShape {
        AttentionShape {
            heads,
            kv_heads,
            head_dim,
            capacity,
            scale: 0.3,
            window: None,
            softcap: None,
            cache_dtype: DType::F32,
        }
    }

    /// `attend` (on `pool`, or on `spin` where given) against the reference kernel, over caches
    /// of two slots filled from `seed`: within 1e-5 of the largest output (only the order of
    /// the f32 sums differs).
    fn check(
        pool: &rayon::ThreadPool,
        spin: Option<&crate::spin::SpinPool>,
        s: &AttentionShape,
        positions: &[u32],
        slots: &[u32],
        seed: u32,
    ) {
        let kv_cols = s.kv_heads * s.head_dim;
        // Aligned copies of the caches for the zero-copy view (f16: as half-float bits).
        let kw = vals(2 * s.capacity * kv_cols, seed);
        let vw = vals(2 * s.capacity * kv_cols, seed + 1);
        let half = |v: &[f32]| -> Vec<u16> { v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect() };
        let (kh, vh) = (half(&kw), half(&vw));
        let (kb, vb) = match s.cache_dtype {
            DType::F16 => (
                bytemuck::cast_slice::<u16, u8>(&kh).to_vec(),
                bytemuck::cast_slice::<u16, u8>(&vh).to_vec(),
            ),
            _ => (to_bytes(&kw), to_bytes(&vw)),
        };
        let q = vals(positions.len() * s.heads * s.head_dim, seed + 2);
        let mut want = vec![0f32; q.len()];
        kernels::attend(pool, s, &q, positions, positions, slots, &kb, &vb, &mut want);
        let mut got = vec![0f32; q.len()];
        let (kc, vc): (&[u8], &[u8]) = match s.cache_dtype {
            DType::F16 => (bytemuck::cast_slice(&kh), bytemuck::cast_slice(&vh)),
            _ => (bytemuck::cast_slice(&kw), bytemuck::cast_slice(&vw)),
        };
        assert!(attend(pool, spin, s, &q, positions, slots, kc, vc, &mut got));
        let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * max.max(1.0),
                "heads {}/{} {:?} {:?} value {i}: {g} vs {w}",
                s.heads,
                s.kv_heads,
                s.window,
                s.softcap
            );
        }
    }

    /// Prefill-sized steps (the tiled blocks): 23 rows of two slots (a block split where the
    /// slot changes, a partial last block), windowed and soft-capped, groups of 1, 2 and 6
    /// query heads (queries padded to the tile), a head size that is not a multiple of the
    /// tile's 4; and rows whose keys overflow a block (the per-row kernel takes them).
    #[test]
    fn tiled_blocks_match_the_reference_kernel() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for (heads, kv_heads, head_dim, capacity, window, softcap, start) in [
            (2, 2, 18, 64, None, None, 0u32),
            (4, 2, 18, 64, Some(9), Some(3.0), 5),
            (6, 1, 8, 64, Some(20), None, 30),
            (2, 1, 8, 5000, None, None, 4090),
        ] {
            let s = AttentionShape {
                window,
                softcap,
                ..shape(heads, kv_heads, head_dim, capacity)
            };
            // 14 rows of slot 1 then 9 of slot 0, consecutive positions in each.
            let slots: Vec<u32> = (0..23).map(|r| u32::from(r < 14)).collect();
            let positions: Vec<u32> = (0..23u32)
                .map(|r| if r < 14 { start + r } else { start + 3 + (r - 14) })
                .collect();
            check(&pool, None, &s, &positions, &slots, 1);
        }
    }

    /// The vision tower's block attention in tiles against the reference kernel: blocks that
    /// end inside a tile of queries and blocks longer than one, head
    /// sizes that fill no vector; within 1e-5 of the largest output. A block longer than the
    /// score buffer holds is refused, with nothing written.
    #[test]
    fn block_attention_tiles_match_the_reference_kernel() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for (heads, head_dim, rows, block) in [
            (3, 72, 111, 37),
            (2, 18, 150, 150),
            (1, 8, 210, 70),
            (4, 16, 64, 64),
        ] {
            let cols = heads * head_dim;
            let (q, k, v) = (vals(rows * cols, 1), vals(rows * cols, 2), vals(rows * cols, 3));
            let mut want = vec![0f32; rows * cols];
            kernels::block_attention(&pool, &q, &k, &v, heads, head_dim, 0.3, block, &mut want);
            let mut got = vec![f32::NAN; rows * cols];
            assert!(block_attention(
                &pool, &q, &k, &v, heads, head_dim, 0.3, block, &mut got
            ));
            let top = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * top,
                    "{heads}x{head_dim}, {rows} rows in blocks of {block}: value {i}: {a} against {b}"
                );
            }
        }
        let (rows, cols) = (5000, 4);
        let (q, k, v) = (vals(rows * cols, 1), vals(rows * cols, 2), vals(rows * cols, 3));
        let mut out = vec![7f32; rows * cols];
        assert!(!block_attention(&pool, &q, &k, &v, 1, 4, 0.3, rows, &mut out));
        assert!(out.iter().all(|&x| x == 7.0));
    }

    /// Decode-sized steps whose keys are split across threads (then combined), on the pool and
    /// on the spinning threads: one row and two rows (one with fewer keys than chunks need),
    /// windowed and soft-capped, 1 and 3 KV heads.
    #[test]
    fn split_keys_match_the_reference_kernel() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
        let spin = crate::spin::SpinPool::new(4).unwrap();
        for (heads, kv_heads, window, softcap, positions) in [
            (4, 1, None, None, vec![700u32]),
            (6, 3, Some(300), Some(5.0), vec![650]),
            (2, 1, Some(1000), None, vec![259, 999]),
        ] {
            let s = AttentionShape {
                window,
                softcap,
                ..shape(heads, kv_heads, 24, 1024)
            };
            let slots: Vec<u32> = (0..positions.len() as u32).collect();
            for spin in [None, Some(&spin)] {
                check(&pool, spin, &s, &positions, &slots, 11);
            }
        }
    }

    /// `f16` caches (read as half-float bits, each row widened as it is read) against the
    /// reference kernel over the same caches: a prompt-sized run (tiles over widened rows), decode
    /// rows with split keys on the pool and the spinning threads, windowed and soft-capped,
    /// grouped, and a head size that is not a multiple of eight (the widening's tail).
    #[test]
    fn f16_caches_match_the_reference_kernel() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
        let spin = crate::spin::SpinPool::new(4).unwrap();
        let f16 = |heads, kv_heads, head_dim, capacity, window, softcap| AttentionShape {
            window,
            softcap,
            cache_dtype: DType::F16,
            ..shape(heads, kv_heads, head_dim, capacity)
        };
        let slots: Vec<u32> = (0..23).map(|r| u32::from(r < 14)).collect();
        let positions: Vec<u32> = (0..23u32)
            .map(|r| if r < 14 { 5 + r } else { 8 + (r - 14) })
            .collect();
        check(
            &pool,
            None,
            &f16(4, 2, 18, 64, Some(9), Some(3.0)),
            &positions,
            &slots,
            3,
        );
        for spin in [None, Some(&spin)] {
            check(
                &pool,
                spin,
                &f16(6, 3, 24, 1024, Some(300), Some(5.0)),
                &[650],
                &[0],
                11,
            );
            check(
                &pool,
                spin,
                &f16(2, 1, 20, 1024, None, None),
                &[259, 999],
                &[0, 1],
                12,
            );
        }
    }

    /// A windowed, soft-capped, grouped case with two rows of two slots (one task per row and
    /// KV head): groups of 2 and 6 query heads per KV head (6: a chunk of four and a chunk of
    /// two).
    #[test]
    fn matches_the_reference_kernel() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for (heads, kv_heads, window, softcap) in [
            (4, 2, None, None),
            (4, 2, Some(5), Some(3.0)),
            (6, 1, Some(7), None),
        ] {
            let s = AttentionShape {
                window,
                softcap,
                ..shape(heads, kv_heads, 20, 16)
            };
            check(&pool, None, &s, &[9, 13], &[0, 1], 1);
        }
    }
}
