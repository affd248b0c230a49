//! `precision = "fast"`: decode products on 8-bit activations, as ggml's CPU backend computes
//! every product, for `q8_0` and `q4_k` weights. Each activation row is quantized once per
//! product to blocks of `i8` values with an `f32` scale (`d = max |x| / 127`,
//! `q = round(x / d)`) and the block's integer sum (ggml's `bsums`): blocks of 32 for `q8_0`, of
//! 16 for `q4_k` ([`Q4K_SPAN`]: per 32, the default model failed the precision rule). A weight
//! block's dot with it is then exact integer sums scaled by the blocks' scales. With AVX-512
//! VNNI, `vpdpbusd` takes 64 byte products per instruction, where the 16-bit path (`exact`)
//! takes 32 per `vpmaddwd` after widening the weights: the decode step of the default model
//! spends two thirds of its time in its 262,144-row `q8_0` output head, and a 4B model's in its
//! `q4_k` layers.
//!
//! `vpdpbusd` multiplies unsigned bytes by signed ones. `q8_0`: the weight's magnitude (`|w|`,
//! 128 for -128 as an unsigned byte) goes in as the unsigned operand and its sign moves onto the
//! activation (`-q` where `w < 0`; activations stay within -127..=127, so negating is exact).
//! `q4_k`: the 4-bit codes (0..=15) go in as they are; the minimums' term
//! (`dmin * min * sum x`) comes from the block sums.
//!
//! The `q4_k` prefill product (8 rows or more) on the same activations, quantized by the same
//! [`quantize`], is `super::int8_gemm`.
//!
//! The error this adds is judged on the real model by `engine perplexity --kl-divergence`
//! (docs/precision.md), not by the random-weight fixtures' logit bounds, which stay on `exact`.

use half::f16;
use tandem_backend_api::block;
use tandem_backend_api::DType;

use super::{column_chunk, grow, in_columns, shortfall, KernelSet, Vnni, QK};
use crate::layout::Layout;
use crate::weight::WeightView;

/// 8-bit activation rows: per block (of [`QK`] values, or [`Q4K_SPAN`] for `q4_k`) an `f32`
/// scale, the values and their sum (ggml's `bsums`), and what the `q4_k` kernel reads besides;
/// the backend's one set ([`super::ActScratch`]), which `int8_gemm` fills too.
#[derive(Default)]
pub struct Acts8 {
    pub(super) d: Vec<f32>,
    pub(super) qs: Vec<i8>,
    pub(super) sums: Vec<i32>,
    /// Per [`QK`] values, the blocks' scales times their sums (`d0 * sum0 + d1 * sum1`): the
    /// factor of `q4_k`'s minimums.
    pub(super) ds: Vec<f32>,
    /// The values in `q4_k`'s order ([`Q4K_ORDER`]), for the `q4_k` kernel.
    q4: Vec<i8>,
}

impl Acts8 {
    /// Each part's length for `values` activations (rows times `k`) in either format: `d`,
    /// `qs`, `sums`, `ds`, `q4`.
    fn lens(values: usize) -> [usize; 5] {
        let spans = values.div_ceil(Q4K_SPAN);
        [spans, values, spans, values.div_ceil(QK), values]
    }

    /// Grows every part to `values` activations in either format, so that products of at most
    /// that many allocate nothing.
    pub(super) fn reserve(&mut self, values: usize) {
        let [d, qs, sums, ds, q4] = Self::lens(values);
        grow(&mut self.d, d);
        grow(&mut self.qs, qs);
        grow(&mut self.sums, sums);
        grow(&mut self.ds, ds);
        grow(&mut self.q4, q4);
    }

    /// Bytes [`Acts8::reserve`] would add for `values`.
    pub(super) fn growth(&self, values: usize) -> usize {
        let [d, qs, sums, ds, q4] = Self::lens(values);
        shortfall(&self.d, d)
            + shortfall(&self.qs, qs)
            + shortfall(&self.sums, sums)
            + shortfall(&self.ds, ds)
            + shortfall(&self.q4, q4)
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.d.capacity() * 4
            + self.qs.capacity()
            + self.sums.capacity() * 4
            + self.ds.capacity() * 4
            + self.q4.capacity()
    }
}

/// The weight formats the 8-bit products take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Q8_0,
    Q4K,
}

impl Format {
    /// Values per weight block.
    fn block(self) -> usize {
        match self {
            Format::Q8_0 => QK,
            Format::Q4K => block::q4_k::ELEMS,
        }
    }

    /// Bytes per weight block.
    fn block_bytes(self) -> usize {
        match self {
            Format::Q8_0 => block::q8_0::BYTES,
            Format::Q4K => block::q4_k::BYTES,
        }
    }
}

/// Where the `q4_k` kernel reads each activation block of a super-block of 256 values: position
/// `p` holds block `Q4K_ORDER[p]` (its own inverse). A `q4_k` block keeps sub-blocks `2c` and
/// `2c + 1` in the low and high nibbles of the same 32 bytes, so the low nibbles of 64 bytes
/// are sub-blocks 0 and 2 (or 4 and 6), the high ones 1 and 3 (5 and 7): reordered once per
/// product, each 64-byte activation load then meets the nibbles one mask or shift gives.
pub const Q4K_ORDER: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];

/// Activation values per scale in the `q4_k` products: 16, half a sub-block (the `q8_0`
/// products: 32, a weight block). On the default model, `q4_k` at 8 bits per 32 moved the
/// logits past the precision rule (CI's 8 chunks: same top token 97.80%, mean KL 0.00066);
/// a scale per 16, which halves the reach of a block's largest value for one more multiply per
/// super-block and row, passes it (98.34%, 0.00056; docs/precision.md).
pub const Q4K_SPAN: usize = 16;

/// Quantizes `x` (whole blocks of `span` values) to per-block scales `d`, values `qs` and their
/// sums `sums`; `false` where a value is not finite.
pub fn quantize(x: &[f32], span: usize, d: &mut [f32], qs: &mut [i8], sums: &mut [i32]) -> bool {
    for (((x, d), q), sum) in x
        .chunks_exact(span)
        .zip(d.iter_mut())
        .zip(qs.chunks_exact_mut(span))
        .zip(sums.iter_mut())
    {
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
        let mut total = 0i32;
        for (q, v) in q.iter_mut().zip(x) {
            *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
            total += i32::from(*q);
        }
        *sum = total;
    }
    true
}

/// The `q4_k` minimums' factors: per [`QK`] values, `d0 * sum0 + d1 * sum1` of its two
/// blocks of [`Q4K_SPAN`] (`d`, `sums`) into `ds`.
#[inline(always)]
pub fn minimum_factors(d: &[f32], sums: &[i32], ds: &mut [f32]) {
    for ((o, d), s) in ds.iter_mut().zip(d.chunks_exact(2)).zip(sums.chunks_exact(2)) {
        *o = d[0] * s[0] as f32 + d[1] * s[1] as f32;
    }
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

/// The oracle: one `q4_k` weight row's dot with one 8-bit activation row quantized per
/// [`Q4K_SPAN`] values (`d`, `qs` in their own order, `sums`), sub-block by sub-block: for each
/// half an exact integer sum of the 4-bit codes with the activations times
/// `(d * scale) * d_a`, less `(dmin * min) * (d_a0 * sum0 + d_a1 * sum1)`, summed in order.
/// (The x86-64 kernel has no scalar tail; off x86-64 this is the product.)
#[cfg(any(test, not(target_arch = "x86_64")))]
pub fn dot_q4_k(w: &[u8], d: &[f32], qs: &[i8], sums: &[i32]) -> f32 {
    use block::q4_k::{BYTES, D, DMIN, QS, SCALES};
    const H: usize = Q4K_SPAN;
    let mut acc = 0.0f32;
    for (b, blk) in w.chunks_exact(BYTES).enumerate() {
        let wd = f16::from_le_bytes([blk[D.at], blk[D.at + 1]]).to_f32();
        let wm = f16::from_le_bytes([blk[DMIN.at], blk[DMIN.at + 1]]).to_f32();
        let codes = &blk[QS.range()];
        for j in 0..8 {
            let (sc, m) = super::k_scale_min(&blk[SCALES.range()], j);
            let (c, shift) = (j / 2, 4 * (j % 2));
            let a = 8 * b + j;
            let half = |h: usize| -> i32 {
                codes[32 * c + H * h..32 * c + H * h + H]
                    .iter()
                    .zip(&qs[QK * a + H * h..QK * a + H * h + H])
                    .map(|(&v, &q)| i32::from((v >> shift) & 0x0F) * i32::from(q))
                    .sum()
            };
            let ws = wd * f32::from(sc);
            let ds = d[2 * a] * sums[2 * a] as f32 + d[2 * a + 1] * sums[2 * a + 1] as f32;
            acc += (ws * d[2 * a]) * half(0) as f32 + (ws * d[2 * a + 1]) * half(1) as f32
                - (wm * f32::from(m)) * ds;
        }
    }
    acc
}

/// The format of a product the fast path covers: `q8_0` weights of whole blocks or `q4_k` of
/// whole super-blocks, with AVX-512 VNNI in the kernel set.
fn covers(set: KernelSet, w: &WeightView) -> Option<(Vnni, Format)> {
    let format = match w.dtype {
        DType::Q8_0 => Format::Q8_0,
        DType::Q4K => Format::Q4K,
        _ => return None,
    };
    if w.k == 0 || !w.k.is_multiple_of(format.block()) {
        return None;
    }
    Some((set.vnni()?, format))
}

/// The activation rows of a product as the kernels read them.
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    /// Values per row.
    pub k: usize,
    /// Values per scale: [`QK`], or [`Q4K_SPAN`] for the `q4_k` kernel.
    pub span: usize,
    /// The scales.
    pub d: &'a [f32],
    /// The values (in [`Q4K_ORDER`] for the `q4_k` kernel).
    pub qs: &'a [i8],
    /// Per [`QK`] values: their blocks' scales times their sums (the `q4_k` kernel's
    /// minimums; empty for `q8_0`).
    pub ds: &'a [f32],
}

/// One activation row of [`Rows`].
#[derive(Clone, Copy)]
pub struct Row<'a> {
    pub d: &'a [f32],
    pub qs: &'a [i8],
    pub ds: &'a [f32],
}

impl<'a> Rows<'a> {
    /// Row `r`.
    pub fn row(&self, r: usize) -> Row<'a> {
        let (k, nb, ns) = (self.k, self.k / QK, self.k / self.span);
        Row {
            d: &self.d[r * ns..(r + 1) * ns],
            qs: &self.qs[r * k..(r + 1) * k],
            ds: if self.ds.is_empty() {
                &[]
            } else {
                &self.ds[r * nb..(r + 1) * nb]
            },
        }
    }
}

/// The product of `rows` activation rows of `x` with `w` on 8-bit activations, into `scratch`
/// ([`Layout::Columns`]); `None` where the fast path does not cover it (the caller takes the
/// 16-bit path).
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    pool: &rayon::ThreadPool,
    spin: Option<&crate::spin::SpinPool>,
    set: KernelSet,
    x: &[f32],
    rows: usize,
    w: &WeightView,
    scratch: &mut [f32],
    acts: &mut Acts8,
) -> Option<Layout> {
    let (vnni, format) = covers(set, w)?;
    let k = w.k;
    let rb = k / format.block() * format.block_bytes();
    if rows == 0 || w.bytes.len() < w.n * rb || x.len() < rows * k || scratch.len() < w.n * rows {
        return None;
    }
    {
        let span = match format {
            Format::Q8_0 => QK,
            Format::Q4K => Q4K_SPAN,
        };
        let (nb, ns) = (rows * k / QK, rows * k / span);
        grow(&mut acts.d, ns);
        grow(&mut acts.qs, rows * k);
        grow(&mut acts.sums, ns);
        let Acts8 { d, qs, sums, ds, q4 } = acts;
        if !quantize(
            &x[..rows * k],
            span,
            &mut d[..ns],
            &mut qs[..rows * k],
            &mut sums[..ns],
        ) {
            return None;
        }
        let acts = match format {
            Format::Q8_0 => Rows {
                k,
                span,
                d: &d[..ns],
                qs: &qs[..rows * k],
                ds: &[],
            },
            Format::Q4K => {
                // Once per product: the minimums' factors and the values in the kernel's order.
                grow(ds, nb);
                grow(q4, rows * k);
                minimum_factors(&d[..ns], &sums[..ns], &mut ds[..nb]);
                for (src, dst) in qs[..rows * k].chunks_exact(256).zip(q4.chunks_exact_mut(256)) {
                    for (p, &from) in Q4K_ORDER.iter().enumerate() {
                        dst[QK * p..QK * p + QK].copy_from_slice(&src[QK * from..QK * from + QK]);
                    }
                }
                Rows {
                    k,
                    span,
                    d: &d[..ns],
                    qs: &q4[..rows * k],
                    ds: &ds[..nb],
                }
            }
        };
        let chunk_rows = column_chunk(pool, spin, w.n);
        // One weight row at a time: the weights then stream through memory in order. Four
        // rows side by side (the 16-bit path's matrix-vector shape) took the `q8_0` head's
        // product from 13.0 to 21.0 ms on one thread of the 2-core VM (two rows: 20.6). Several
        // activation rows share each weight row's loads and unpacking ([`vnni::columns`]), each
        // row's sum the same operations in the same order as alone: a row's result never
        // depends on how many rows share the step.
        let task = |chunk: usize, dst: &mut [f32]| {
            let j0 = chunk * chunk_rows;
            let cols = dst.len() / rows;
            vnni::columns(
                vnni,
                format,
                &w.bytes[j0 * rb..(j0 + cols) * rb],
                rb,
                acts,
                rows,
                dst,
            );
        };
        in_columns(pool, spin, &mut scratch[..w.n * rows], chunk_rows * rows, task);
        Some(Layout::Columns)
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use tandem_backend_api::block::q8_0::{BYTES, D, QS};

    use super::super::{Vnni, QK};
    use super::{Format, Row, Rows};

    /// The dots of the weight rows `ws` (`rb` bytes each, whole blocks of `format`) with the
    /// activation rows `a`, into `dst` column by column (`dst[c * rows + r]`): the oracles'
    /// ([`super::dot_q8_0`], [`super::dot_q4_k`]) integer block sums, in another order of `f32`
    /// additions, the same for a row whatever `rows` is. The rows go in groups of up to 8,
    /// each group's rows sharing every weight row's loads.
    pub fn columns(
        _proof: Vnni,
        format: Format,
        ws: &[u8],
        rb: usize,
        a: Rows,
        rows: usize,
        dst: &mut [f32],
    ) {
        // SAFETY: a `Vnni` exists only where AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C were
        // detected at run time; every read below goes through a checked slice.
        unsafe {
            match format {
                Format::Q8_0 => columns_of::<Q8_0>(ws, rb, a, rows, dst),
                Format::Q4K => columns_of::<Q4K>(ws, rb, a, rows, dst),
            }
        }
    }

    /// The kernels' numbers for [`columns_of`]'s `F`.
    const Q8_0: u8 = 0;
    const Q4K: u8 = 1;

    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI besides AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn columns_of<const F: u8>(ws: &[u8], rb: usize, a: Rows, rows: usize, dst: &mut [f32]) {
        let mut r0 = 0;
        while r0 < rows {
            let n = (rows - r0).min(8);
            // SAFETY: the features are those of this function.
            unsafe {
                match n {
                    8 => group::<F, 8>(ws, rb, a, rows, r0, dst),
                    7 => group::<F, 7>(ws, rb, a, rows, r0, dst),
                    6 => group::<F, 6>(ws, rb, a, rows, r0, dst),
                    5 => group::<F, 5>(ws, rb, a, rows, r0, dst),
                    4 => group::<F, 4>(ws, rb, a, rows, r0, dst),
                    3 => group::<F, 3>(ws, rb, a, rows, r0, dst),
                    2 => group::<F, 2>(ws, rb, a, rows, r0, dst),
                    _ => group::<F, 1>(ws, rb, a, rows, r0, dst),
                }
            }
            r0 += n;
        }
    }

    /// Rows `r0..r0 + R` against every weight row of `ws`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI besides AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn group<const F: u8, const R: usize>(
        ws: &[u8],
        rb: usize,
        a: Rows,
        rows: usize,
        r0: usize,
        dst: &mut [f32],
    ) {
        let a: [Row; R] = std::array::from_fn(|i| a.row(r0 + i));
        for (w, col) in ws.chunks_exact(rb).zip(dst.chunks_exact_mut(rows)) {
            // SAFETY: the features are those of this function.
            let out = unsafe {
                if F == Q4K {
                    q4_k_rows::<R>(w, a)
                } else {
                    q8_0_rows::<R>(w, a)
                }
            };
            col[r0..r0 + R].copy_from_slice(&out);
        }
    }

    /// The f16 at `blk[at..at + 2]` as `f32`, by F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn half_at(blk: &[u8], at: usize) -> f32 {
        let bits = u16::from_le_bytes([blk[at], blk[at + 1]]);
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

    /// 64 bytes of `s` (checked) as a vector.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn load64u(s: &[u8]) -> __m512i {
        let s = &s[..64];
        // SAFETY: `s` holds 64 bytes; the load is unaligned.
        unsafe { _mm512_loadu_si512(s.as_ptr() as *const __m512i) }
    }

    /// 8 `f32` of `s` (checked) as a vector.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load8(s: &[f32]) -> __m256 {
        let s = &s[..8];
        // SAFETY: `s` holds 8 `f32`; the load is unaligned.
        unsafe { _mm256_loadu_ps(s.as_ptr()) }
    }

    /// 16 `f32` of `s` (checked) as a vector.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn load16(s: &[f32]) -> __m512 {
        let s = &s[..16];
        // SAFETY: `s` holds 16 `f32`; the load is unaligned.
        unsafe { _mm512_loadu_ps(s.as_ptr()) }
    }

    /// The eight bytes of `v` as `f32` lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn bytes_f32(v: u64) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)))
    }

    /// The dots of one `q8_0` weight row with `R` activation rows. The weight side (loads,
    /// signs, magnitudes, scales) is done once for all rows; each row's sum is the same sequence
    /// of operations as with `R = 1`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI besides AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn q8_0_rows<const R: usize>(w: &[u8], a: [Row; R]) -> [f32; R] {
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
                let Row { d, qs, .. } = a[r];
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
            let (s0, s1) = (half_at(two, D.at), half_at(&two[BYTES..], D.at));
            for r in 0..R {
                let Row { d, qs, .. } = a[r];
                let y = load64(&qs[QK * b..QK * b + 2 * QK]);
                let s =
                    _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s0 * d[b]), _mm512_set1_ps(s1 * d[b + 1]));
                acc[r] = _mm512_fmadd_ps(pair(w01, y), s, acc[r]);
            }
            b += 2;
        }
        std::array::from_fn(|r| {
            let Row { d, qs, .. } = a[r];
            let mut total = _mm512_reduce_add_ps(acc[r]);
            if b < nb {
                // An odd last block.
                total += super::dot_q8_0(&w[BYTES * b..BYTES * nb], &d[b..nb], &qs[QK * b..QK * nb]);
            }
            total
        })
    }

    /// The dots of one `q4_k` weight row with `R` activation rows (values in
    /// [`super::Q4K_ORDER`]). Per super-block, the weight side is done once for all rows: its
    /// 128 code bytes as four vectors of 64 unsigned 4-bit values (`vpdpbusd`'s unsigned
    /// operand as they are), lanes 0-7 of each one sub-block and lanes 8-15 another; its eight
    /// `d * scale` (each twice: one per activation scale) and eight `dmin * min` as `f32`. Per
    /// row: four `vpdpbusd` of 64 values, each vector's lanes converted and multiplied by
    /// their half sub-block's `d * scale * d_a` (a permute of the sixteen), and the minimums'
    /// term `dmin * min * (d_a0 * sum0 + d_a1 * sum1)` taken off lanes 0-7; each row's sum the
    /// same sequence of operations as with `R = 1`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI besides AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn q4_k_rows<const R: usize>(w: &[u8], a: [Row; R]) -> [f32; R] {
        use tandem_backend_api::block::q4_k::{BYTES, D, DMIN, QS, SCALES};
        let nb = w.len() / BYTES;
        let m4 = _mm512_set1_epi8(0x0F);
        let zero = _mm512_setzero_si512();
        // The half sub-blocks (activation scales) of each dot vector's lanes 0-3, 4-7, 8-11 and
        // 12-15 (see `Q4K_ORDER`), and each half's sub-block (weight scale).
        let lanes = |a: i32, b: i32| {
            _mm512_set_epi32(
                b + 1,
                b + 1,
                b + 1,
                b + 1,
                b,
                b,
                b,
                b,
                a + 1,
                a + 1,
                a + 1,
                a + 1,
                a,
                a,
                a,
                a,
            )
        };
        let pick = [lanes(0, 4), lanes(2, 6), lanes(8, 12), lanes(10, 14)];
        let twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
        let mut acc = [_mm512_setzero_ps(); R];
        let mut acc2 = [_mm512_setzero_ps(); R];
        for b in 0..nb {
            let blk = &w[BYTES * b..BYTES * (b + 1)];
            for line in [0, 64, 128] {
                _mm_prefetch::<_MM_HINT_T0>(blk.as_ptr().wrapping_add(4096 + line) as *const i8);
            }
            let (sc, mn) = super::super::avx2::q4k_scales_mins(&blk[SCALES.range()]);
            let ws = _mm256_mul_ps(bytes_f32(sc), _mm256_set1_ps(half_at(blk, D.at)));
            let ws = _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(ws));
            let wm = _mm512_zextps256_ps512(_mm256_mul_ps(
                bytes_f32(mn),
                _mm256_set1_ps(half_at(blk, DMIN.at)),
            ));
            let codes = &blk[QS.range()];
            let (v0, v1) = (load64u(codes), load64u(&codes[64..]));
            let q = [
                _mm512_and_si512(v0, m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(v0), m4),
                _mm512_and_si512(v1, m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(v1), m4),
            ];
            for r in 0..R {
                let Row { d, qs, ds } = a[r];
                let f = _mm512_mul_ps(ws, load16(&d[16 * b..]));
                let y = &qs[256 * b..256 * b + 256];
                let dot = |i: usize| -> __m512 {
                    _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, q[i], load64(&y[64 * i..])))
                };
                acc[r] = _mm512_fmadd_ps(dot(0), _mm512_permutexvar_ps(pick[0], f), acc[r]);
                acc2[r] = _mm512_fmadd_ps(dot(1), _mm512_permutexvar_ps(pick[1], f), acc2[r]);
                acc[r] = _mm512_fmadd_ps(dot(2), _mm512_permutexvar_ps(pick[2], f), acc[r]);
                acc2[r] = _mm512_fmadd_ps(dot(3), _mm512_permutexvar_ps(pick[3], f), acc2[r]);
                acc2[r] = _mm512_fnmadd_ps(wm, _mm512_zextps256_ps512(load8(&ds[8 * b..])), acc2[r]);
            }
        }
        std::array::from_fn(|r| _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc2[r])))
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod vnni {
    use super::super::{Vnni, QK};
    use super::{Format, Rows, Q4K_ORDER};

    /// No VNNI off x86-64 ([`Vnni`] is never made there): the oracles.
    pub fn columns(
        _proof: Vnni,
        format: Format,
        ws: &[u8],
        rb: usize,
        a: Rows,
        rows: usize,
        dst: &mut [f32],
    ) {
        let k = a.k;
        let mut natural = vec![0i8; k];
        let mut sums = vec![0i32; k / super::Q4K_SPAN];
        for (w, col) in ws.chunks_exact(rb).zip(dst.chunks_exact_mut(rows)) {
            for (r, o) in col.iter_mut().enumerate() {
                let row = a.row(r);
                *o = match format {
                    Format::Q8_0 => super::dot_q8_0(w, row.d, row.qs),
                    Format::Q4K => {
                        for (s, n) in row.qs.chunks_exact(256).zip(natural.chunks_exact_mut(256)) {
                            for (p, &from) in Q4K_ORDER.iter().enumerate() {
                                n[QK * from..QK * from + QK].copy_from_slice(&s[QK * p..QK * p + QK]);
                            }
                        }
                        for (s, v) in sums.iter_mut().zip(natural.chunks_exact(super::Q4K_SPAN)) {
                            *s = v.iter().map(|&q| i32::from(q)).sum();
                        }
                        super::dot_q4_k(w, row.d, &natural, &sums)
                    }
                };
            }
        }
    }
}

#[cfg(test)]
pub(in crate::fast) mod tests {
    use super::*;

    /// A linear congruential generator's next 31 bits.
    fn lcg(s: &mut u64) -> u32 {
        *s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*s >> 33) as u32
    }

    /// `q8_0` rows of random blocks (scales within f16's normal range), every byte value
    /// including -128.
    fn q8_0_rows(n: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut out = Vec::with_capacity(n * k / QK * 34);
        for _ in 0..n * k / QK {
            let d = f16::from_f32(0.001 + (lcg(&mut s) % 1000) as f32 * 1e-5);
            out.extend_from_slice(&d.to_le_bytes());
            for _ in 0..QK {
                out.push(lcg(&mut s) as u8);
            }
        }
        out
    }

    /// `q4_k` rows of random super-blocks: random codes, scales and minimums (all 6 bits),
    /// `d` and `dmin` of either sign within f16's normal range.
    pub(in crate::fast) fn q4_k_rows(n: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut out = Vec::with_capacity(n * k / 256 * 144);
        for _ in 0..n * k / 256 {
            for _ in 0..2 {
                let v = (0.001 + (lcg(&mut s) % 1000) as f32 * 1e-5)
                    * if lcg(&mut s).is_multiple_of(4) { -1.0 } else { 1.0 };
                out.extend_from_slice(&f16::from_f32(v).to_le_bytes());
            }
            for _ in 0..140 {
                out.push(lcg(&mut s) as u8);
            }
        }
        out
    }

    pub(in crate::fast) fn acts(len: usize, seed: u64) -> Vec<f32> {
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

    /// One row quantized per `span` values: scales, values, sums.
    fn quantized(x: &[f32], span: usize) -> (Vec<f32>, Vec<i8>, Vec<i32>) {
        let nb = x.len() / span;
        let (mut d, mut q, mut s) = (vec![0.0; nb], vec![0i8; x.len()], vec![0i32; nb]);
        assert!(quantize(x, span, &mut d, &mut q, &mut s));
        (d, q, s)
    }

    #[test]
    fn quantization_is_round_to_nearest_of_the_block_scale_and_refuses_non_finite_values() {
        let mut x = acts(64, 3);
        x[5] = 10.0;
        let (d, q, sums) = quantized(&x, QK);
        assert_eq!(d[0], 10.0 / 127.0);
        assert_eq!(q[5], 127);
        for (i, (v, q)) in x.iter().zip(&q).enumerate() {
            let back = f32::from(*q) * d[i / QK];
            assert!((back - v).abs() <= d[i / QK] * 0.5 + 1e-6, "{i}: {v} -> {q}");
        }
        for (b, s) in sums.iter().enumerate() {
            assert_eq!(
                *s,
                q[QK * b..QK * b + QK].iter().map(|&v| i32::from(v)).sum::<i32>()
            );
        }
        // A zero block quantizes to zeros with a zero scale and sum.
        let (d, q, s) = quantized(&[0.0; 32], QK);
        assert_eq!((d[0], q.iter().all(|&v| v == 0), s[0]), (0.0, true, 0));
        x[40] = f32::NAN;
        assert!(!quantize(&x, QK, &mut [0.0; 2], &mut [0i8; 64], &mut [0; 2]));
        // Per 16 (the `q4_k` products): the other half's largest value sets its scale.
        let (d, _, _) = quantized(&acts(64, 3)[..32], Q4K_SPAN);
        assert_eq!(d.len(), 2);
    }

    /// The oracles' integer block sums against the dequantized values' `f64` dot (the only
    /// difference is the `f32` scaling and summing).
    #[test]
    fn the_oracles_are_the_dots_of_the_dequantized_values() {
        let (k, rows) = (512, 3);
        let x = acts(k, 4);
        for (dtype, w, rb, span) in [
            (DType::Q8_0, q8_0_rows(rows, k, 9), k / QK * 34, QK),
            (DType::Q4K, q4_k_rows(rows, k, 9), k / 256 * 144, Q4K_SPAN),
        ] {
            let (d, q, sums) = quantized(&x, span);
            let xq: Vec<f64> = q
                .iter()
                .enumerate()
                .map(|(i, &v)| f64::from(d[i / span]) * f64::from(v))
                .collect();
            for r in 0..rows {
                let row = &w[r * rb..(r + 1) * rb];
                let mut wf = vec![0f32; k];
                crate::convert::decode_row(dtype, row, &mut wf);
                let want: f64 = wf.iter().zip(&xq).map(|(&w, &x)| f64::from(w) * x).sum();
                let scale: f64 = wf.iter().zip(&xq).map(|(&w, &x)| (f64::from(w) * x).abs()).sum();
                let got = f64::from(match dtype {
                    DType::Q8_0 => dot_q8_0(row, &d, &q),
                    _ => dot_q4_k(row, &d, &q, &sums),
                });
                assert!((got - want).abs() <= 1e-5 * scale, "{dtype:?}: {got} vs {want}");
            }
        }
    }

    /// The bound on a dot's `f32` rounding that the SIMD kernels' other order of additions
    /// may add to the oracle's: `1e-5` of the sum of the terms' magnitudes (`|w_i x_i|` of the
    /// decoded weights and quantized activations, and for `q4_k` its minimums' `|dmin m x_i|`;
    /// at most a few hundred additions of `f32`, each off by half an ulp, 6e-8).
    fn tolerance(dtype: DType, w: &[u8], d: &[f32], q: &[i8]) -> f32 {
        let (k, span) = (q.len(), q.len() / d.len());
        let mut wf = vec![0f32; k];
        crate::convert::decode_row(dtype, w, &mut wf);
        let mut scale: f32 = (0..k)
            .map(|i| (wf[i] * d[i / span] * f32::from(q[i])).abs())
            .sum();
        if dtype == DType::Q4K {
            use block::q4_k::{BYTES, DMIN, SCALES};
            for (b, blk) in w.chunks_exact(BYTES).enumerate() {
                let wm = f16::from_le_bytes([blk[DMIN.at], blk[DMIN.at + 1]])
                    .to_f32()
                    .abs();
                for j in 0..8 {
                    let m = f32::from(super::super::k_scale_min(&blk[SCALES.range()], j).1);
                    let a = 8 * b + j;
                    let x: f32 = (QK * a..QK * a + QK)
                        .map(|i| d[i / span] * f32::from(q[i]).abs())
                        .sum();
                    scale += wm * m * x;
                }
            }
        }
        1e-5 * scale.max(1e-30)
    }

    /// The VNNI products against the oracles through `matmul`'s tasks on a pool: every
    /// activation row count 1..=8 and 13 (two groups), one super-block and several (`k`),
    /// weight rows not a multiple of a task's (4), within [`tolerance`] (the kernels sum the
    /// same integers, in another order of `f32` additions).
    #[test]
    fn the_vnni_products_match_the_oracles() {
        let Some(_) = KernelSet::Avx512Vnni.vnni() else {
            eprintln!("skipping: this CPU has no AVX-512 VNNI");
            return;
        };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut cases = vec![];
        for rows in (1..=8).chain([13]) {
            // `q8_0`: even and odd block counts; `q4_k`: 1, 3 and 10 super-blocks.
            cases.push((DType::Q8_0, 37 + rows, [32, 96, 160, 224, 256][rows % 5], rows));
            cases.push((DType::Q4K, 5 + 4 * rows, [256, 768, 2560][rows % 3], rows));
        }
        for (dtype, n, k, rows) in cases {
            let (w, rb) = match dtype {
                DType::Q8_0 => (q8_0_rows(n, k, n as u64), k / QK * 34),
                _ => (q4_k_rows(n, k, n as u64), k / 256 * 144),
            };
            let x = acts(rows * k, k as u64 + rows as u64);
            let view = WeightView {
                dtype,
                n,
                k,
                bytes: &w,
            };
            let mut scratch = vec![0.0f32; n * rows];
            let layout = matmul(
                &pool,
                None,
                KernelSet::Avx512Vnni,
                &x,
                rows,
                &view,
                &mut scratch,
                &mut Acts8::default(),
            );
            assert!(matches!(layout, Some(Layout::Columns)));
            for r in 0..rows {
                let span = if dtype == DType::Q4K { Q4K_SPAN } else { QK };
                let (d, q, sums) = quantized(&x[r * k..(r + 1) * k], span);
                for j in 0..n {
                    let wr = &w[j * rb..(j + 1) * rb];
                    let want = match dtype {
                        DType::Q8_0 => dot_q8_0(wr, &d, &q),
                        _ => dot_q4_k(wr, &d, &q, &sums),
                    };
                    let got = scratch[j * rows + r];
                    let tol = tolerance(dtype, wr, &d, &q);
                    assert!(
                        (got - want).abs() <= tol,
                        "{dtype:?} n {n} k {k} row {r} col {j}: {got} vs {want} (within {tol})"
                    );
                }
            }
        }
        // Formats it does not cover, and `q4_k` rows of part of a super-block, are left to the
        // 16-bit path.
        for (dtype, k, bytes) in [(DType::Q5_0, 32, 22), (DType::Q4K, 32, 144)] {
            let view = WeightView {
                dtype,
                n: 1,
                k,
                bytes: &vec![0; bytes],
            };
            assert!(matmul(
                &pool,
                None,
                KernelSet::Avx512Vnni,
                &vec![0.0; k],
                1,
                &view,
                &mut [0.0],
                &mut Acts8::default()
            )
            .is_none());
        }
    }

    /// A row's result is the same bits whatever else shares the product: each row of 1-15 rows
    /// against that row alone (the rows go through the kernel in groups of up to 8), for both
    /// formats.
    #[test]
    fn a_rows_result_does_not_depend_on_the_rows_beside_it() {
        let Some(_) = KernelSet::Avx512Vnni.vnni() else {
            eprintln!("skipping: this CPU has no AVX-512 VNNI");
            return;
        };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for (dtype, n, k) in [(DType::Q8_0, 19usize, 288usize), (DType::Q4K, 11, 512)] {
            let w = match dtype {
                DType::Q8_0 => q8_0_rows(n, k, 77),
                _ => q4_k_rows(n, k, 77),
            };
            let view = WeightView {
                dtype,
                n,
                k,
                bytes: &w,
            };
            let x = acts(15 * k, 5);
            let product = |rows: usize| {
                let mut out = vec![0.0f32; n * rows];
                matmul(
                    &pool,
                    None,
                    KernelSet::Avx512Vnni,
                    &x[..rows * k],
                    rows,
                    &view,
                    &mut out,
                    &mut Acts8::default(),
                )
                .expect("covered");
                out
            };
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
                        &mut Acts8::default(),
                    )
                    .expect("covered");
                    out
                })
                .collect();
            for rows in 2..=15 {
                let scratch = product(rows);
                for r in 0..rows {
                    for j in 0..n {
                        assert_eq!(
                            scratch[j * rows + r].to_bits(),
                            alone[r][j].to_bits(),
                            "{dtype:?}: rows {rows}, row {r}, column {j}"
                        );
                    }
                }
            }
        }
    }
}
