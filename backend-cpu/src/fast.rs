//! Quantized-activation matmul for block-quantized weights, in the manner of ggml's CPU backend
//! but with 16-bit activations.
//!
//! Each activation row is quantized once per matmul to blocks of 32 `i16` values with an `f32`
//! scale (and the block's integer sum, for the `q4_k` minimums). A dot product is then an exact
//! integer dot per 32 (or 16) values, scaled and summed in `f32`. The AVX2 functions compute the
//! same integer sums as the scalar ones and differ from them only in the order of the `f32`
//! additions.
//!
//! Why 16 bits: 8-bit activations (ggml's `q8_0`/`q8_K`) moved the logits of Gemma 3 270M by
//! up to 10% of the largest logit against the `f32` reference kernels, and no single matmul
//! carried the error (the reference path for the tied-embedding logits left 10%, for q5_0 7%,
//! for both K formats 4.5%): the rounding compounds over 18 layers. 16-bit activations bring the rounding down
//! by a factor of 256 while keeping integer dots (`madd_epi16`: 16 products per AVX2 instruction,
//! a quarter of a weight block's unpacking per product).
//!
//! Several activation rows (a prefill step) go through each weight block together, up to
//! [`TILE`] at a time, so each weight block is loaded and unpacked once per tile of rows.

use half::f16;
use rayon::prelude::*;
use tandem_backend_api::block::{self, BlockLayout};
use tandem_backend_api::DType;

use crate::layout::Layout;
use crate::weight::WeightView;

/// Parallel tasks per thread in a matmul: enough for the work-stealing to even out threads
/// slowed by other processes, few enough that a task is long (the tied-embedding logits matvec
/// in tasks of 16 weight rows spent a large share of a decode step scheduling 16 384 tasks).
const TASKS_PER_THREAD: usize = 16;

/// The fewest weight rows (output columns) per parallel task.
const MIN_CHUNK: usize = 4;

/// Activation rows that share each unpacked weight block.
const TILE: usize = 4;

/// Values per activation block.
const QK: usize = 32;

/// Weight rows that a matrix-vector product (one activation row) reads side by side.
const WROWS: usize = 4;

/// The fewest activation rows that go through [`gemm`] (weights unpacked once per matmul)
/// rather than the fused kernels (weights unpacked once per [`TILE`] rows).
pub const GEMM_MIN_ROWS: usize = 8;

/// Parallel tasks per thread in a [`gemm`] product.
const GEMM_TASKS_PER_THREAD: usize = 4;

/// The fewest activation rows per [`gemm`] task where the product is split by rows as well.
const GEMM_MIN_BLOCK_ROWS: usize = 48;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod amx_bf16;
mod float16;
mod gemm;
pub mod int8;
#[cfg(target_arch = "x86_64")]
mod int8_gemm;

/// The weight formats this module covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Q8_0,
    Q5_0,
    Q4K,
    Q6K,
    Q4_0,
    Q4_1,
    Q5_1,
    Q5K,
}

impl Kind {
    fn of(dtype: DType) -> Option<Kind> {
        match dtype {
            DType::Q8_0 => Some(Kind::Q8_0),
            DType::Q5_0 => Some(Kind::Q5_0),
            DType::Q4K => Some(Kind::Q4K),
            DType::Q6K => Some(Kind::Q6K),
            DType::Q4_0 => Some(Kind::Q4_0),
            DType::Q4_1 => Some(Kind::Q4_1),
            DType::Q5_1 => Some(Kind::Q5_1),
            DType::Q5K => Some(Kind::Q5K),
            _ => None,
        }
    }

    /// The weight block's layout (backend-api's `block`, the one definition).
    fn layout(self) -> BlockLayout {
        match self {
            Kind::Q8_0 => block::q8_0::LAYOUT,
            Kind::Q5_0 => block::q5_0::LAYOUT,
            Kind::Q4K => block::q4_k::LAYOUT,
            Kind::Q6K => block::q6_k::LAYOUT,
            Kind::Q4_0 => block::q4_0::LAYOUT,
            Kind::Q4_1 => block::q4_1::LAYOUT,
            Kind::Q5_1 => block::q5_1::LAYOUT,
            Kind::Q5K => block::q5_k::LAYOUT,
        }
    }

    /// Elements per weight block.
    fn block(self) -> usize {
        self.layout().elems
    }

    fn block_bytes(self) -> usize {
        self.layout().bytes
    }

    /// Whether the format's values carry an offset per block (`dmin * min`, or `-m`), taken
    /// off through the activation block sums.
    fn has_bias(self) -> bool {
        matches!(self, Kind::Q4K | Kind::Q5K | Kind::Q4_1 | Kind::Q5_1)
    }
}

/// A set of kernels for the formats this module covers, chosen at run time (the best the CPU
/// has, or one named in the backend's `kernels` option). Every set computes the same integer
/// block dots; they differ only in the order of the `f32` additions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSet {
    /// [`KernelSet::Avx512Vnni`] with the prefill product on Intel AMX tiles (AMX-INT8: the
    /// same integer block dots, 16-bit activations split into two byte planes). Chosen by name
    /// only (see [`KernelSet::detect`]).
    Amx,
    /// [`KernelSet::Avx512`] with the prefill product's 16-bit dots fused with their
    /// accumulation (AVX-512 VNNI `vpdpwssd`), and under `precision = "fast"` the 8-bit
    /// products (`vpdpbusd`): decode-shaped ones on `q8_0` and `q4_k` ([`int8`]) and the `q4_k`
    /// prefill product (`int8_gemm`).
    Avx512Vnni,
    /// 512-bit integer dots (AVX-512 F and BW) for the prefill product and the logits' `q8_0`
    /// matrix-vector product, AVX2 elsewhere.
    Avx512,
    /// 256-bit integer dots (AVX2, FMA, F16C).
    Avx2,
    /// Plain Rust, on every CPU.
    Scalar,
}

impl KernelSet {
    /// Every set, best first.
    pub const ALL: [KernelSet; 5] = [
        KernelSet::Amx,
        KernelSet::Avx512Vnni,
        KernelSet::Avx512,
        KernelSet::Avx2,
        KernelSet::Scalar,
    ];

    /// The best set this CPU runs. [`KernelSet::Amx`] is chosen only by name: on the one AMX
    /// host measured (a Xeon under KVM) its products were 12-18% faster than the VNNI tiles'
    /// but whole prefills no faster (`bench/results/2026-11-25-cpu-amx/`).
    pub fn detect() -> KernelSet {
        KernelSet::ALL
            .into_iter()
            .filter(|s| *s != KernelSet::Amx)
            .find(|s| s.available())
            .unwrap_or(KernelSet::Scalar)
    }

    /// Whether this CPU runs the set.
    pub fn available(self) -> bool {
        match self {
            KernelSet::Amx => self.amx().is_some(),
            KernelSet::Avx512Vnni => Vnni::detect().is_some(),
            KernelSet::Avx512 => Wide::detect().is_some(),
            KernelSet::Avx2 => Simd::detect().is_some(),
            KernelSet::Scalar => true,
        }
    }

    /// The set's name in the `kernels` option and in `engine backends`.
    pub fn name(self) -> &'static str {
        match self {
            KernelSet::Amx => "amx",
            KernelSet::Avx512Vnni => "avx512_vnni",
            KernelSet::Avx512 => "avx512",
            KernelSet::Avx2 => "avx2",
            KernelSet::Scalar => "scalar",
        }
    }

    /// The set named `name`, if any.
    pub fn from_name(name: &str) -> Option<KernelSet> {
        KernelSet::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The AVX2 proof, where the set uses AVX2 and the CPU has it.
    fn simd(self) -> Option<Simd> {
        match self {
            KernelSet::Scalar => None,
            _ => Simd::detect(),
        }
    }

    /// The AVX-512 proof, where the set uses AVX-512 and the CPU has it.
    fn wide(self) -> Option<Wide> {
        match self {
            KernelSet::Avx512 | KernelSet::Avx512Vnni | KernelSet::Amx => Wide::detect(),
            _ => None,
        }
    }

    /// Whether the set takes `precision = "fast"`'s 8-bit products ([`int8`]; the `q4_k`
    /// prefill product's, `int8_gemm`, on [`KernelSet::Avx512Vnni`] only): it uses AVX-512
    /// VNNI and the CPU has it.
    pub fn int8_products(self) -> bool {
        self.vnni().is_some()
    }

    /// The AVX-512 VNNI proof, where the set uses VNNI and the CPU has it.
    fn vnni(self) -> Option<Vnni> {
        match self {
            KernelSet::Avx512Vnni | KernelSet::Amx => Vnni::detect(),
            _ => None,
        }
    }

    /// The AMX proof, where the set uses AMX and the CPU and OS allow it.
    #[cfg(target_arch = "x86_64")]
    fn amx(self) -> Option<amx::Amx> {
        match self {
            KernelSet::Amx => amx::Amx::detect(),
            _ => None,
        }
    }

    /// No AMX off x86-64.
    #[cfg(not(target_arch = "x86_64"))]
    fn amx(self) -> Option<()> {
        None
    }
}

/// Proof that AVX2, FMA and F16C were detected at run time; only [`Simd::detect`] makes one.
#[derive(Clone, Copy)]
struct Simd(());

impl Simd {
    fn detect() -> Option<Simd> {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                return Some(Simd(()));
            }
        }
        None
    }
}

/// Proof that AVX-512 F, BW and VL were detected at run time, besides AVX2's [`Simd`]; only
/// [`Wide::detect`] makes one.
#[derive(Clone, Copy)]
struct Wide(());

impl Wide {
    fn detect() -> Option<Wide> {
        #[cfg(target_arch = "x86_64")]
        {
            if Simd::detect().is_some()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
            {
                return Some(Wide(()));
            }
        }
        None
    }
}

/// Proof that AVX-512 VNNI was detected at run time, besides [`Wide`]'s features; only
/// [`Vnni::detect`] makes one.
#[derive(Clone, Copy)]
struct Vnni(());

impl Vnni {
    fn detect() -> Option<Vnni> {
        #[cfg(target_arch = "x86_64")]
        {
            if Wide::detect().is_some() && is_x86_feature_detected!("avx512vnni") {
                return Some(Vnni(()));
            }
        }
        None
    }
}

/// Quantized activation rows: per block of [`QK`] values an `f32` scale, the `i16` values, and
/// their sum. The scale is chosen per `span` values (a multiple of [`QK`]; each block's `d`
/// repeats it): per block by default, per 256 for the `q4_k` matrix-vector product, whose
/// kernel then sums a whole weight block in integers.
#[derive(Default)]
struct Acts {
    d: Vec<f32>,
    qs: Vec<i16>,
    sums: Vec<i32>,
    span: usize,
    /// The values' high bytes (`qs >> 8`), for the AMX product (filled by `amx::split`).
    hi: Vec<i8>,
    /// The values' low bytes (`qs & 255`), as `hi`.
    lo: Vec<u8>,
    /// Each block's scale times its sum (`d * sums`), for the AMX product's offsets.
    ms: Vec<f32>,
    /// Whether `hi`, `lo` and `ms` hold the current values (set by `amx::split`, cleared by each
    /// quantization).
    planes: bool,
}

/// One quantized activation row.
#[derive(Clone, Copy)]
struct ActRow<'a> {
    d: &'a [f32],
    qs: &'a [i16],
    sums: &'a [i32],
    /// Values per scale (see [`Acts`]).
    span: usize,
}

impl Acts {
    /// Quantizes `rows` rows of `k` values (`k` a whole number of blocks), reusing storage, on
    /// `pool`'s threads where there are many rows. Returns `false` where a value is not finite
    /// (no 16-bit scale represents it).
    #[cfg(test)]
    fn quantize(
        &mut self,
        pool: &rayon::ThreadPool,
        simd: Option<Simd>,
        x: &[f32],
        rows: usize,
        k: usize,
    ) -> bool {
        self.quantize_span(pool, simd, x, rows, k, QK)
    }

    /// Quantizes `rows` rows of `k` values (`k` a whole number of blocks) with one scale per
    /// `span` values (where `k` is a multiple of it, else per block), reusing storage, on
    /// `pool`'s threads where there are many rows. Returns `false` where a value is not finite
    /// (no 16-bit scale represents it).
    fn quantize_span(
        &mut self,
        pool: &rayon::ThreadPool,
        simd: Option<Simd>,
        x: &[f32],
        rows: usize,
        k: usize,
        span: usize,
    ) -> bool {
        let span = if span >= QK && span.is_multiple_of(QK) && k.is_multiple_of(span) {
            span
        } else {
            QK
        };
        self.span = span;
        self.planes = false;
        let total = rows * k;
        grow(&mut self.d, total / QK);
        grow(&mut self.qs, total);
        grow(&mut self.sums, total / QK);
        let (x, d, qs, sums) = (
            &x[..total],
            &mut self.d[..total / QK],
            &mut self.qs[..total],
            &mut self.sums[..total / QK],
        );
        let blocks = |x: &[f32], d: &mut [f32], qs: &mut [i16], sums: &mut [i32]| {
            #[cfg(target_arch = "x86_64")]
            if let Some(s) = simd {
                return avx2::quantize(s, x, d, qs, sums, span);
            }
            let _ = simd;
            quantize_blocks(x, d, qs, sums, span)
        };
        if rows < GEMM_MIN_ROWS {
            return blocks(x, d, qs, sums);
        }
        // Tasks of whole rows, a few per thread.
        let per = rows.div_ceil(pool.current_num_threads() * 2) * k;
        pool.install(|| {
            x.par_chunks(per)
                .zip(d.par_chunks_mut(per / QK))
                .zip(qs.par_chunks_mut(per))
                .zip(sums.par_chunks_mut(per / QK))
                .map(|(((x, d), qs), sums)| blocks(x, d, qs, sums))
                .reduce(|| true, |a, b| a && b)
        })
    }

    fn row(&self, r: usize, k: usize) -> ActRow<'_> {
        let nb = k / QK;
        ActRow {
            d: &self.d[r * nb..(r + 1) * nb],
            qs: &self.qs[r * k..(r + 1) * k],
            sums: &self.sums[r * nb..(r + 1) * nb],
            span: self.span,
        }
    }
}

/// Quantizes `x` (whole spans of `span` values, a multiple of [`QK`]) to `d`, `qs` and `sums`
/// (per block of [`QK`]; `d` the same for every block of a span); `false` where a value is not
/// finite.
#[inline(always)]
fn quantize_blocks(x: &[f32], d: &mut [f32], qs: &mut [i16], sums: &mut [i32], span: usize) -> bool {
    let per = span / QK;
    for (sp, (xs, qs)) in x.chunks_exact(span).zip(qs.chunks_exact_mut(span)).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        if !amax.is_finite() {
            return false;
        }
        let (ds, ss) = (
            &mut d[sp * per..(sp + 1) * per],
            &mut sums[sp * per..(sp + 1) * per],
        );
        if amax == 0.0 {
            ds.fill(0.0);
            qs.fill(0);
            ss.fill(0);
            continue;
        }
        let id = 32767.0 / amax;
        ds.fill(amax / 32767.0);
        for ((xs, qs), sum) in xs
            .chunks_exact(QK)
            .zip(qs.chunks_exact_mut(QK))
            .zip(ss.iter_mut())
        {
            let mut s = 0i32;
            for (q, v) in qs.iter_mut().zip(xs) {
                *q = (v * id).round_ties_even().clamp(-32767.0, 32767.0) as i16;
                s += i32::from(*q);
            }
            *sum = s;
        }
    }
    true
}

fn grow<T: Default + Clone>(v: &mut Vec<T>, len: usize) {
    if v.len() < len {
        v.resize(len, T::default());
    }
}

/// Bytes [`grow`] would add to `v` for `len` elements.
fn shortfall<T>(v: &[T], len: usize) -> usize {
    len.saturating_sub(v.len()) * std::mem::size_of::<T>()
}

/// The activations of the product being run, quantized (or rounded) once per product by the
/// step's thread and read by every task: one set per backend (in its arena, `CpuBackend::run`
/// takes it for the step), since a step runs on one pool thread at a time. They were one set
/// per pool thread, each grown where a step happened to run: sixteen copies of a 4B prefill
/// step's 12 MB of 16-bit activations on sixteen threads, none of them in the estimate.
#[derive(Default)]
pub struct ActScratch {
    /// 16-bit activations (`exact`, and formats without an 8-bit product).
    acts: Acts,
    /// 8-bit activations (`int8`'s decode products and `int8_gemm`'s prefill product).
    acts8: int8::Acts8,
    /// bfloat16 activations in the AMX tiles' pair layout (`amx_bf16`).
    #[cfg(target_arch = "x86_64")]
    bf16: Vec<u16>,
}

impl ActScratch {
    /// Grows the 16-bit activations, and the 8-bit ones where `int8`, to `values` (rows times
    /// `k`), so that the decode products of at most that many allocate nothing
    /// (`CpuBackend::compile` runs it for every program).
    pub fn reserve(&mut self, values: usize, int8: bool) {
        let blocks = values.div_ceil(QK);
        grow(&mut self.acts.d, blocks);
        grow(&mut self.acts.qs, blocks * QK);
        grow(&mut self.acts.sums, blocks);
        if int8 {
            self.acts8.reserve(values);
        }
    }

    /// Bytes [`ActScratch::reserve`] would add for `values` and `int8`.
    pub fn growth(&self, values: usize, int8: bool) -> u64 {
        let blocks = values.div_ceil(QK);
        let sixteen = shortfall(&self.acts.d, blocks)
            + shortfall(&self.acts.qs, blocks * QK)
            + shortfall(&self.acts.sums, blocks);
        let eight = if int8 { self.acts8.growth(values) } else { 0 };
        (sixteen + eight) as u64
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        let bf16 = self.bf16.capacity() * 2;
        #[cfg(not(target_arch = "x86_64"))]
        let bf16 = 0;
        (self.acts.d.capacity() * 4
            + self.acts.qs.capacity() * 2
            + self.acts.sums.capacity() * 4
            + self.acts8.bytes()
            + bf16) as u64
    }
}

/// Grows the calling thread's storage for weight rows of `k` values unpacked by the prefill
/// product, so that it allocates nothing (`CpuBackend::compile` runs it on every pool thread).
pub fn reserve_unpacked(k: usize) {
    gemm::reserve(k);
}

/// `Op::MatMul` through quantized activations, writing the product to `scratch`: column-major
/// as `kernels::matmul` does for a few rows, in row-major panels for the prefill product.
/// Returns the layout, or `None`, having written nothing, where the weight format is not
/// covered or the activations are not all finite; the caller then uses the reference path.
///
/// `gemm` chooses the kernels: the prefill product (weights unpacked once; `rows` at least
/// [`GEMM_MIN_ROWS`]) or the fused row kernels, whose every row equals that row alone bit for
/// bit. The caller decides by each row's own sequence, so that a row's result never depends
/// on what else shares the step.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    pool: &rayon::ThreadPool,
    spin: Option<&crate::spin::SpinPool>,
    set: KernelSet,
    x: &[f32],
    rows: usize,
    w: &WeightView,
    scratch: &mut [f32],
    act: &mut ActScratch,
    gemm: bool,
    int8: bool,
) -> Option<Layout> {
    let gemm = gemm && rows >= GEMM_MIN_ROWS;
    if int8 && !gemm {
        if let Some(layout) = int8::matmul(pool, spin, set, x, rows, w, scratch, &mut act.acts8) {
            return Some(layout);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if int8 && gemm {
        if let Some(proof) = amx_bf16::for_set(set) {
            if let Some(layout) = amx_bf16::matmul(pool, proof, x, rows, w, scratch, &mut act.bf16) {
                return Some(layout);
            }
        }
        if let Some(layout) = int8_gemm::matmul(pool, set, x, rows, w, scratch, &mut act.acts8) {
            return Some(layout);
        }
    }
    if matches!(w.dtype, DType::Bf16 | DType::F16) {
        return float16::matmul(pool, set.simd()?, set.wide(), x, rows, w, scratch, gemm);
    }
    let kind = Kind::of(w.dtype)?;
    let k = w.k;
    if rows == 0 || k == 0 || !k.is_multiple_of(kind.block()) {
        return None;
    }
    let rb = k / kind.block() * kind.block_bytes();
    if w.bytes.len() < w.n * rb || x.len() < rows * k || scratch.len() < w.n * rows {
        return None;
    }
    let simd = set.simd();
    {
        let acts = &mut act.acts;
        // The `q4_k` matrix-vector kernels sum whole weight blocks in integers over one scale
        // per 256 activations.
        let span = if !gemm && matches!(kind, Kind::Q4K | Kind::Q5K) {
            256
        } else {
            QK
        };
        if !acts.quantize_span(pool, simd, x, rows, k, span) {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        if gemm && set.amx().is_some() && amx::covers(kind) {
            amx::split(acts, pool, rows, k);
        }
        let acts = &*acts;
        if gemm {
            let task = |r0: usize, j0: usize, width: usize, dst: &mut [f32]| {
                prefill_task(kind, set, w.bytes, rb, k, acts, r0, j0, width, dst)
            };
            return Some(prefill_tasks(pool, w.n, rows, &mut scratch[..w.n * rows], task));
        }
        let chunk_rows = column_chunk(pool, spin, w.n);
        let wrow = |j: usize| &w.bytes[j * rb..(j + 1) * rb];
        let task = |chunk: usize, dst: &mut [f32]| {
            let j0 = chunk * chunk_rows;
            if rows == 1 {
                // A matrix-vector product: [`WROWS`] weight rows at a time.
                let a = [acts.row(0, k)];
                for (g, out) in dst.chunks_mut(WROWS).enumerate() {
                    let j = j0 + g * WROWS;
                    if out.len() == WROWS {
                        let ws: [&[u8]; WROWS] = std::array::from_fn(|i| wrow(j + i));
                        dots(kind, set, &ws, &a, out);
                    } else {
                        for (i, o) in out.chunks_mut(1).enumerate() {
                            dots(kind, set, &[wrow(j + i)], &a, o);
                        }
                    }
                }
                return;
            }
            let mut tile = [ActRow {
                d: &[],
                qs: &[],
                sums: &[],
                span: QK,
            }; TILE];
            for (c, col) in dst.chunks_exact_mut(rows).enumerate() {
                let wr = wrow(j0 + c);
                for (t, out) in col.chunks_mut(TILE).enumerate() {
                    for (i, a) in tile[..out.len()].iter_mut().enumerate() {
                        *a = acts.row(t * TILE + i, k);
                    }
                    dots(kind, set, &[wr], &tile[..out.len()], out);
                }
            }
        };
        in_columns(pool, spin, &mut scratch[..w.n * rows], chunk_rows * rows, task);
        Some(Layout::Columns)
    }
}

/// Runs the prefill product's tasks on `pool` over `scratch` (`n` columns by `rows`), each
/// `task(r0, j0, width, dst)`: activation rows `r0..` by weight rows `j0..j0 + width`, written
/// row-major into `dst` (`width` values per row). Tasks of a panel of weight rows (at most
/// [`gemm::MAX_TASK_ROWS`], unpacked once per task) by a block of activation rows: the panels
/// alone where they make enough tasks, row blocks as well where they do not (the panel's
/// unpacking then repeats per block). Returns the product's layout.
fn prefill_tasks<F>(pool: &rayon::ThreadPool, n: usize, rows: usize, scratch: &mut [f32], task: F) -> Layout
where
    F: Fn(usize, usize, usize, &mut [f32]) + Sync,
{
    let tasks = pool.current_num_threads() * GEMM_TASKS_PER_THREAD;
    let width = n
        .div_ceil(tasks)
        .next_multiple_of(gemm::PANEL)
        .clamp(gemm::PANEL, gemm::MAX_TASK_ROWS);
    let blocks = tasks
        .div_ceil(n.div_ceil(width))
        .min(rows.div_ceil(GEMM_MIN_BLOCK_ROWS))
        .max(1);
    // Whole tiles of 16 rows (the AMX product's activation tiles).
    let block = rows.div_ceil(blocks).next_multiple_of(16);
    pool.install(|| {
        scratch[..n * rows]
            .par_chunks_mut(width * rows)
            .enumerate()
            .flat_map(|(c, panel)| {
                let wc = panel.len() / rows;
                <[f32]>::par_chunks_mut(panel, block * wc)
                    .enumerate()
                    .map(move |(b, dst)| (c, wc, b, dst))
            })
            .for_each(|(c, wc, b, dst)| task(b * block, c * width, wc, dst))
    });
    Layout::Panels { width, n }
}

/// Weight rows (output columns) per parallel task of a decode-shaped product over `n` of them:
/// [`TASKS_PER_THREAD`] tasks per thread of `spin` (where given) or `pool`, at least
/// [`MIN_CHUNK`], a whole number of [`WROWS`].
fn column_chunk(pool: &rayon::ThreadPool, spin: Option<&crate::spin::SpinPool>, n: usize) -> usize {
    let threads = spin.map_or(pool.current_num_threads(), |p| p.threads());
    n.div_ceil(threads * TASKS_PER_THREAD)
        .max(MIN_CHUNK)
        .next_multiple_of(WROWS)
}

/// Runs `task(i, chunk)` over the chunks of `len` values of `out` on the spinning threads where
/// given, else on `pool`.
fn in_columns<F>(
    pool: &rayon::ThreadPool,
    spin: Option<&crate::spin::SpinPool>,
    out: &mut [f32],
    len: usize,
    task: F,
) where
    F: Fn(usize, &mut [f32]) + Sync,
{
    match spin {
        Some(p) => crate::spin::chunks_mut(p, out, len, task),
        None => pool.install(|| {
            out.par_chunks_mut(len)
                .enumerate()
                .for_each(|(chunk, dst)| task(chunk, dst))
        }),
    }
}

/// One task of the prefill product ([`gemm::task`]'s arguments): on AMX tiles ([`amx::task`])
/// where the set is [`KernelSet::Amx`], the CPU and OS allow it, `kind` is covered, the
/// activations' byte planes are filled and the task's first row is a multiple of 16 (a whole
/// activation tile); else [`gemm::task`].
#[allow(clippy::too_many_arguments)]
fn prefill_task(
    kind: Kind,
    set: KernelSet,
    bytes: &[u8],
    rb: usize,
    k: usize,
    acts: &Acts,
    r0: usize,
    j0: usize,
    width: usize,
    dst: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(amx) = set.amx() {
        if amx::covers(kind) && acts.planes && r0.is_multiple_of(16) {
            return amx::task(amx, kind, bytes, rb, k, acts, r0, j0, width, dst);
        }
    }
    gemm::task(kind, set, bytes, rb, k, acts, r0, j0, width, dst)
}

/// The dot products of weight rows `ws` (whole blocks of `kind` each) with activation rows `a`,
/// into `out[w * a.len() + r]`: one weight row with up to [`TILE`] activation rows, or
/// [`WROWS`] weight rows with one activation row.
fn dots(kind: Kind, set: KernelSet, ws: &[&[u8]], a: &[ActRow], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = set.simd() {
        return avx2::dots(s, set.wide(), kind, ws, a, out);
    }
    let _ = set;
    for (o, w) in out.chunks_exact_mut(a.len().max(1)).zip(ws) {
        for (o, r) in o.iter_mut().zip(a) {
            *o = scalar::dot(kind, w, *r);
        }
    }
}

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a `q4_k` block from its 12 packed bytes.
#[inline(always)]
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

/// `q4_k` block `b`: `sum over sub-blocks j of d_a[j] * min_j * sum_j`, the term its `dmin`
/// multiplies.
#[inline(always)]
fn q4k_mins(packed: &[u8], a: &ActRow, b: usize) -> f32 {
    (0..8)
        .map(|j| {
            let (_, m) = k_scale_min(packed, j);
            a.d[8 * b + j] * (i32::from(m) * a.sums[8 * b + j]) as f32
        })
        .sum()
}

mod scalar {
    use super::*;

    pub(super) fn dot(kind: Kind, w: &[u8], a: ActRow) -> f32 {
        match kind {
            Kind::Q8_0 => q8_0(w, a),
            Kind::Q5_0 => q5_0(w, a),
            Kind::Q4K => q4_k(w, a),
            Kind::Q6K => q6_k(w, a),
            Kind::Q4_0 | Kind::Q4_1 | Kind::Q5_1 | Kind::Q5K => unpacked(kind, w, a),
        }
    }

    /// Any format through `gemm::unpack`, one weight block at a time: the same integers and
    /// scales as the prefill product, an exact 32-bit sum per block of 32 (at most 32 products of
    /// 1953 by 32767 for `q5_k`).
    #[inline(always)]
    pub(super) fn unpacked(kind: Kind, w: &[u8], a: ActRow) -> f32 {
        let (block, bytes) = (kind.block(), kind.block_bytes());
        let (mut v, mut sc, mut bias) = ([0i16; 256], [0f32; 8], [0f32; 8]);
        let mut acc = 0f32;
        for (wb, blk) in w.chunks_exact(bytes).enumerate() {
            let nb = block / QK;
            gemm::unpack::<true>(kind, blk, &mut v[..block], &mut sc[..nb], &mut bias[..nb]);
            for j in 0..nb {
                let b = wb * nb + j;
                let y = &a.qs[QK * b..QK * b + QK];
                let isum: i32 = v[QK * j..QK * j + QK]
                    .iter()
                    .zip(y)
                    .map(|(&q, &y)| i32::from(q) * i32::from(y))
                    .sum();
                acc += (sc[j] * a.d[b]) * isum as f32 - bias[j] * a.d[b] * a.sums[b] as f32;
            }
        }
        acc
    }

    fn idot(w: impl Iterator<Item = i32>, y: &[i16]) -> i32 {
        w.zip(y).map(|(q, &y)| q * i32::from(y)).sum()
    }

    fn q8_0(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        use block::q8_0::{BYTES, D, QS};
        for (b, blk) in w.chunks_exact(BYTES).enumerate() {
            let y = &a.qs[32 * b..32 * b + 32];
            let isum = idot(blk[QS.range()].iter().map(|&q| i32::from(q as i8)), y);
            acc += (f16_at(blk, D.at) * a.d[b]) * isum as f32;
        }
        acc
    }

    fn q5_0(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        use block::q5_0::{BYTES, D, QH, QS};
        for (b, blk) in w.chunks_exact(BYTES).enumerate() {
            let qh = u32::from_le_bytes([blk[QH.at], blk[QH.at + 1], blk[QH.at + 2], blk[QH.at + 3]]);
            let y = &a.qs[32 * b..32 * b + 32];
            let v = |j: usize| {
                let q = blk[QS.at + j % 16];
                let (nib, h) = if j < 16 {
                    (q & 0x0F, (qh >> j) & 1)
                } else {
                    (q >> 4, (qh >> j) & 1)
                };
                i32::from(nib | ((h as u8) << 4)) - 16
            };
            let isum = idot((0..32).map(v), y);
            acc += (f16_at(blk, D.at) * a.d[b]) * isum as f32;
        }
        acc
    }

    fn q4_k(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        use block::q4_k::{BYTES, D, DMIN, QS, SCALES};
        for (b, blk) in w.chunks_exact(BYTES).enumerate() {
            let packed = &blk[SCALES.range()];
            let qs = &blk[QS.range()];
            let mut sum = 0f32;
            for c in 0..4 {
                let q = &qs[32 * c..32 * c + 32];
                for (h, shift) in [(0usize, 0u32), (1, 4)] {
                    let j = 2 * c + h;
                    let (s, _) = k_scale_min(packed, j);
                    let p = idot(
                        q.iter().map(|&v| i32::from((v >> shift) & 0x0F)),
                        &a.qs[32 * (8 * b + j)..32 * (8 * b + j) + 32],
                    );
                    sum += (a.d[8 * b + j] * f32::from(s)) * p as f32;
                }
            }
            acc += f16_at(blk, D.at) * sum - f16_at(blk, DMIN.at) * q4k_mins(packed, &a, b);
        }
        acc
    }

    fn q6_k(w: &[u8], a: ActRow) -> f32 {
        let mut acc = 0f32;
        use block::q6_k::{BYTES, D, QH, QL, SCALES};
        for (b, blk) in w.chunks_exact(BYTES).enumerate() {
            let scales = &blk[SCALES.range()];
            let mut sum = 0f32;
            for half in 0..2 {
                let ql = &blk[QL.range()][64 * half..64 * half + 64];
                let qh = &blk[QH.range()][32 * half..32 * half + 32];
                for s in 0..4 {
                    let ab = 8 * b + 4 * half + s;
                    let y = &a.qs[32 * ab..32 * ab + 32];
                    let v = |l: usize| {
                        let low = if s < 2 {
                            ql[l + 32 * s] & 0x0F
                        } else {
                            ql[l + 32 * (s - 2)] >> 4
                        };
                        i32::from(low | (((qh[l] >> (2 * s)) & 3) << 4)) - 32
                    };
                    for sub in 0..2 {
                        let p = idot((16 * sub..16 * sub + 16).map(v), &y[16 * sub..16 * sub + 16]);
                        let sc = f32::from(scales[8 * half + 2 * s + sub] as i8);
                        sum += (a.d[ab] * sc) * p as f32;
                    }
                }
            }
            acc += f16_at(blk, D.at) * sum;
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::*;

    pub(super) fn dots(
        _proof: Simd,
        wide: Option<Wide>,
        kind: Kind,
        ws: &[&[u8]],
        a: &[ActRow],
        out: &mut [f32],
    ) {
        let nb = ws.first().map_or(0, |w| w.len() / kind.block_bytes());
        let k = nb * kind.block();
        assert!(
            ws.iter().all(|w| w.len() == nb * kind.block_bytes())
                && out.len() == ws.len() * a.len()
                && !a.is_empty()
                && a.len() <= TILE
                && (ws.len() == 1 || (a.len() == 1 && ws.len() == WROWS))
                && a.iter()
                    .all(|r| r.d.len() >= k / QK && r.qs.len() >= k && r.sums.len() >= k / QK)
        );
        // `pick!(kernel)` or `pick!(kernel, C)`: the kernel for these row counts, with the
        // leading const argument `C` where it takes one.
        macro_rules! pick {
            ($f:ident $(, $c:expr)?) => {
                match (ws.len(), a.len()) {
                    (WROWS, _) => $f::<$({ $c },)? WROWS, 1>(ws, a, out),
                    (_, 4) => $f::<$({ $c },)? 1, 4>(ws, a, out),
                    (_, 3) => $f::<$({ $c },)? 1, 3>(ws, a, out),
                    (_, 2) => $f::<$({ $c },)? 1, 2>(ws, a, out),
                    _ => $f::<$({ $c },)? 1, 1>(ws, a, out),
                }
            };
        }
        // SAFETY: a `Simd` exists only where AVX2, FMA and F16C were detected at run time, a
        // `Wide` only where AVX-512 F and BW were too; the slice lengths the functions read
        // within are checked just above.
        unsafe {
            match kind {
                Kind::Q8_0 if wide.is_some() => pick!(q8_0_512),
                Kind::Q8_0 => pick!(q8_0),
                Kind::Q5_0 if wide.is_some() => pick!(legacy_512, LEGACY_Q5_0),
                Kind::Q5_0 => pick!(q5_0),
                Kind::Q4K if wide.is_some() && a.iter().all(|r| r.span == 256) => pick!(k_512, false),
                Kind::Q4K => pick!(q4_k),
                Kind::Q6K => pick!(q6_k),
                Kind::Q4_0 if wide.is_some() => pick!(legacy_512, LEGACY_Q4_0),
                Kind::Q4_1 if wide.is_some() => pick!(legacy_512, LEGACY_Q4_1),
                Kind::Q5_1 if wide.is_some() => pick!(legacy_512, LEGACY_Q5_1),
                Kind::Q5K if wide.is_some() && a.iter().all(|r| r.span == 256) => pick!(k_512, true),
                Kind::Q4_0 | Kind::Q4_1 | Kind::Q5_1 | Kind::Q5K => unpacked(kind, ws, a, out),
            }
        }
    }

    /// The 32-value formats' numbers for [`legacy_512`].
    const LEGACY_Q4_0: u8 = 0;
    const LEGACY_Q4_1: u8 = 1;
    const LEGACY_Q5_0: u8 = 2;
    const LEGACY_Q5_1: u8 = 3;

    /// [`scalar::unpacked`] for each weight row and activation row, compiled for AVX2 (the
    /// block dots in vector registers).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn unpacked(kind: Kind, ws: &[&[u8]], a: &[ActRow], out: &mut [f32]) {
        for (o, w) in out.chunks_exact_mut(a.len()).zip(ws) {
            for (o, r) in o.iter_mut().zip(a) {
                *o = scalar::unpacked(kind, w, *r);
            }
        }
    }

    /// [`quantize_blocks`] compiled for AVX2 (the same arithmetic, in vector registers).
    pub(super) fn quantize(
        _proof: Simd,
        x: &[f32],
        d: &mut [f32],
        qs: &mut [i16],
        sums: &mut [i32],
        span: usize,
    ) -> bool {
        // SAFETY: a `Simd` exists only where AVX2, FMA and F16C were detected at run time; the
        // function is safe Rust compiled with those features.
        unsafe { quantize_avx2(x, d, qs, sums, span) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn quantize_avx2(x: &[f32], d: &mut [f32], qs: &mut [i16], sums: &mut [i32], span: usize) -> bool {
        quantize_blocks(x, d, qs, sums, span)
    }

    /// The `f16` at `b[at..at + 2]` as `f32`, by the F16C instruction (the same value
    /// `f16_at` computes in software).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn h2f(b: &[u8], at: usize) -> f32 {
        let bits = u16::from_le_bytes([b[at], b[at + 1]]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// The sum of the eight `f32` lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// 32 bytes from `p` (the caller keeps `p..p + 32` in bounds).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 32 readable bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }

    /// How far ahead of the block being read the weight stream is prefetched, in bytes.
    const PREFETCH_AHEAD: usize = 4096;

    /// Asks for the cache line [`PREFETCH_AHEAD`] bytes past `blk`'s start (a hint: it never
    /// faults, so an address past the weights is harmless).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn prefetch(blk: &[u8]) {
        let p = blk.as_ptr().wrapping_add(PREFETCH_AHEAD);
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
    }

    /// 16 `i16` from `y[at..at + 16]`.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load16(y: &[i16], at: usize) -> __m256i {
        let s = &y[at..at + 16];
        // SAFETY: `s` holds 16 `i16`, 32 bytes.
        unsafe { load(s.as_ptr() as *const u8) }
    }

    /// 32 signed bytes as two vectors of 16 `i16` (elements 0..16, 16..32).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn widen(q: __m256i) -> [__m256i; 2] {
        [
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(q)),
        ]
    }

    /// `sum(w[i] * y[at + i])` over 16 `i16` pairs as eight `f32` lane sums (exact: each lane
    /// is two products below 2^23 in magnitude).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn pdot(w: __m256i, y: &[i16], at: usize) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_madd_epi16(w, load16(y, at)))
    }

    /// As [`pdot`] over 32 values, with both halves summed in integers (exact: four products of
    /// at most 2^7 * 2^15).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn pdot32(w: &[__m256i; 2], y: &[i16], at: usize) -> __m256 {
        let p = _mm256_add_epi32(
            _mm256_madd_epi16(w[0], load16(y, at)),
            _mm256_madd_epi16(w[1], load16(y, at + 16)),
        );
        _mm256_cvtepi32_ps(p)
    }

    /// `out[w * R + r] = hsum(acc[w][r])`: the column-major layout of the products.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn finish<const W: usize, const R: usize>(acc: [[__m256; R]; W], out: &mut [f32]) {
        for (o, v) in out.chunks_exact_mut(R).zip(acc) {
            for (o, v) in o.iter_mut().zip(v) {
                *o = hsum(v);
            }
        }
    }

    /// [`finish`] for 512-bit lane sums.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn finish512<const W: usize, const R: usize>(acc: [[__m512; R]; W], out: &mut [f32]) {
        for (o, v) in out.chunks_exact_mut(R).zip(acc) {
            for (o, v) in o.iter_mut().zip(v) {
                *o = _mm512_reduce_add_ps(v);
            }
        }
    }

    // The kernels below take `W` weight rows (`ws`, whole blocks each) and `R` activation rows
    // and write the `W * R` dots to `out` (`out[w * R + r]`). Several weight rows at once give a
    // decode step's matrix-vector product independent chains of loads and sums, and share each
    // activation block between them.

    /// # Safety
    /// The CPU has AVX2, FMA and F16C (the caller checks at run time). Every read goes through
    /// a checked slice, so short inputs panic rather than read out of bounds.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8_0<const W: usize, const R: usize>(ws: &[&[u8]], a: &[ActRow], out: &mut [f32]) {
        let mut acc = [[_mm256_setzero_ps(); R]; W];
        use block::q8_0::{BYTES, D, QS};
        for b in 0..ws[0].len() / BYTES {
            for (wi, acc) in acc.iter_mut().enumerate() {
                let blk = &ws[wi][BYTES * b..BYTES * b + BYTES];
                prefetch(blk);
                let wd = h2f(blk, D.at);
                // SAFETY: `blk[QS]` holds 32 bytes.
                let q = widen(unsafe { load(blk[QS.range()].as_ptr()) });
                for r in 0..R {
                    let d = _mm256_set1_ps(wd * a[r].d[b]);
                    acc[r] = _mm256_fmadd_ps(pdot32(&q, a[r].qs, 32 * b), d, acc[r]);
                }
            }
        }
        finish(acc, out)
    }

    /// [`q8_0`] with 512-bit vectors: a block's 32 values in one integer dot.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW besides AVX2, FMA and F16C (the caller checks at run time).
    /// Every read goes through a checked slice, so short inputs panic rather than read out of
    /// bounds.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn q8_0_512<const W: usize, const R: usize>(ws: &[&[u8]], a: &[ActRow], out: &mut [f32]) {
        let mut acc = [[_mm512_setzero_ps(); R]; W];
        use block::q8_0::{BYTES, D, QS};
        for b in 0..ws[0].len() / BYTES {
            for (wi, acc) in acc.iter_mut().enumerate() {
                let blk = &ws[wi][BYTES * b..BYTES * b + BYTES];
                prefetch(blk);
                let wd = h2f(blk, D.at);
                // SAFETY: `blk[QS]` holds 32 bytes.
                let q = _mm512_cvtepi8_epi16(unsafe { load(blk[QS.range()].as_ptr()) });
                for r in 0..R {
                    let y = &a[r].qs[32 * b..32 * b + 32];
                    // SAFETY: `y` holds 32 `i16`, 64 bytes; the load is unaligned.
                    let y = unsafe { _mm512_loadu_si512(y.as_ptr() as *const __m512i) };
                    let p = _mm512_cvtepi32_ps(_mm512_madd_epi16(q, y));
                    acc[r] = _mm512_fmadd_ps(p, _mm512_set1_ps(wd * a[r].d[b]), acc[r]);
                }
            }
        }
        finish512(acc, out)
    }

    /// The 32-value formats but `q8_0` (`F`: one of the `LEGACY_*` numbers) with 512-bit vectors:
    /// a block's 32 values widened to 16 bits in one vector (the `q5_*` fifth bits expanded from
    /// the block's 32-bit mask in one instruction), one integer dot per activation row; the `_1`
    /// formats' offset `m` times the activation block's sum.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VL besides AVX2, FMA and F16C (the caller checks at run
    /// time). Every read goes through a checked slice, so short inputs panic rather than read
    /// out of bounds.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn legacy_512<const F: u8, const W: usize, const R: usize>(
        ws: &[&[u8]],
        a: &[ActRow],
        out: &mut [f32],
    ) {
        // Bytes per block, where `d` is, where the nibbles start, where the `m` is (if any),
        // where the fifth bits are (if any), the offset taken off the values.
        let (bytes, d_at, qs_at, m_at, qh_at, off) = {
            use block::{q4_0, q4_1, q5_0, q5_1};
            match F {
                LEGACY_Q4_0 => (q4_0::BYTES, q4_0::D.at, q4_0::QS.at, None, None, 8),
                LEGACY_Q4_1 => (q4_1::BYTES, q4_1::D.at, q4_1::QS.at, Some(q4_1::M.at), None, 0),
                LEGACY_Q5_0 => (q5_0::BYTES, q5_0::D.at, q5_0::QS.at, None, Some(q5_0::QH.at), 16),
                _ => (
                    q5_1::BYTES,
                    q5_1::D.at,
                    q5_1::QS.at,
                    Some(q5_1::M.at),
                    Some(q5_1::QH.at),
                    0,
                ),
            }
        };
        let mut acc = [[_mm512_setzero_ps(); R]; W];
        let mut mins = [[0f32; R]; W];
        let m4 = _mm256_set1_epi8(0x0F);
        let fifth = _mm256_set1_epi8(0x10);
        let off = _mm256_set1_epi8(off);
        for b in 0..ws[0].len() / bytes {
            for (wi, acc) in acc.iter_mut().enumerate() {
                let blk = &ws[wi][bytes * b..bytes * b + bytes];
                prefetch(blk);
                let wd = h2f(blk, d_at);
                // SAFETY: `blk[qs_at..qs_at + 16]` holds 16 bytes.
                let lo = unsafe { _mm_loadu_si128(blk[qs_at..qs_at + 16].as_ptr() as *const __m128i) };
                let mut nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(lo), lo), m4);
                if let Some(h) = qh_at {
                    // Value j's fifth bit is bit j of `qh`.
                    let qh = u32::from_le_bytes([blk[h], blk[h + 1], blk[h + 2], blk[h + 3]]);
                    nib = _mm256_or_si256(nib, _mm256_and_si256(_mm256_movm_epi8(qh), fifth));
                }
                let q = _mm512_cvtepi8_epi16(_mm256_sub_epi8(nib, off));
                for r in 0..R {
                    let y = &a[r].qs[32 * b..32 * b + 32];
                    // SAFETY: `y` holds 32 `i16`, 64 bytes; the load is unaligned.
                    let y = unsafe { _mm512_loadu_si512(y.as_ptr() as *const __m512i) };
                    let p = _mm512_cvtepi32_ps(_mm512_madd_epi16(q, y));
                    acc[r] = _mm512_fmadd_ps(p, _mm512_set1_ps(wd * a[r].d[b]), acc[r]);
                    if let Some(m_at) = m_at {
                        mins[wi][r] += h2f(blk, m_at) * a[r].d[b] * a[r].sums[b] as f32;
                    }
                }
            }
        }
        for (o, (v, m)) in out.chunks_exact_mut(R).zip(acc.iter().zip(&mins)) {
            for r in 0..R {
                o[r] = _mm512_reduce_add_ps(v[r]) + m[r];
            }
        }
    }

    /// The eight 6-bit scales and eight 6-bit minimums of a `q4_k` block's 12 packed bytes
    /// (the values `k_scale_min` gives one at a time), each as the bytes of a `u64`.
    #[inline(always)]
    pub(super) fn q4k_scales_mins(p: &[u8]) -> (u64, u64) {
        let w = |i: usize| u32::from_le_bytes([p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]]);
        let (u0, u1, u2) = (w(0), w(1), w(2));
        let sc_lo = u0 & 0x3f3f_3f3f;
        let mn_lo = u1 & 0x3f3f_3f3f;
        let sc_hi = (u2 & 0x0f0f_0f0f) | (((u0 >> 6) & 0x0303_0303) << 4);
        let mn_hi = ((u2 >> 4) & 0x0f0f_0f0f) | (((u1 >> 6) & 0x0303_0303) << 4);
        (
            u64::from(sc_lo) | (u64::from(sc_hi) << 32),
            u64::from(mn_lo) | (u64::from(mn_hi) << 32),
        )
    }

    /// `q4_k`, and `q5_k` where `FIVE`, over activations with one scale per 256 values
    /// (`ActRow::span`): the sub-block scales multiply the 16-bit unpacked weights, so a whole
    /// weight block is one integer sum per lane (at most 16 products of 945, or 31 * 63 for
    /// `q5_k`, by 32767 each, below 2^31), converted and scaled once; the minimums' term is an
    /// integer dot of the eight minimums with the eight block sums. `q5_k`'s fifth bits come
    /// from its block's 32 bytes of high bits.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VL besides AVX2, FMA and F16C (the caller checks at run
    /// time); every row of `a` has `span == 256`. Every read goes through a checked slice, so
    /// short inputs panic rather than read out of bounds.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn k_512<const FIVE: bool, const W: usize, const R: usize>(
        ws: &[&[u8]],
        a: &[ActRow],
        out: &mut [f32],
    ) {
        // Bytes per block and where the nibbles start (`q5_k`: after 32 bytes of high bits).
        let (bytes, qs_at) = if FIVE {
            (block::q5_k::BYTES, block::q5_k::QS.at)
        } else {
            (block::q4_k::BYTES, block::q4_k::QS.at)
        };
        // The two share where `d`, `dmin` and the scales are.
        use block::q4_k::{D, DMIN, SCALES};
        let mut acc = [[_mm512_setzero_ps(); R]; W];
        let mut mins = [[_mm256_setzero_ps(); R]; W];
        let m4 = _mm256_set1_epi8(0x0F);
        let sixteen = _mm256_set1_epi8(16);
        for b in 0..ws[0].len() / bytes {
            for wi in 0..W {
                let blk = &ws[wi][bytes * b..bytes * b + bytes];
                prefetch(blk);
                prefetch(&blk[64..]);
                prefetch(&blk[128..]);
                let (wd, wm) = (h2f(blk, D.at), h2f(blk, DMIN.at));
                let (sc, mn) = q4k_scales_mins(&blk[SCALES.range()]);
                let qh = if FIVE {
                    // SAFETY: `blk[q5_k::QH]` holds 32 bytes.
                    unsafe { load(blk[block::q5_k::QH.range()].as_ptr()) }
                } else {
                    _mm256_setzero_si256()
                };
                // 16 where bit `k` of a value's high-bits byte is set (`q5_k`).
                let bit = |k: i32| {
                    let m = _mm256_set1_epi8(1i8 << k);
                    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m), sixteen)
                };
                let qs = &blk[qs_at..bytes];
                let mut isum = [_mm512_setzero_si512(); R];
                for c in 0..4 {
                    // SAFETY: `qs[32c..32c + 32]` is in bounds.
                    let q = unsafe { load(qs[32 * c..32 * c + 32].as_ptr()) };
                    let mut v0 = _mm256_and_si256(q, m4);
                    let mut v1 = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                    if FIVE {
                        v0 = _mm256_add_epi8(v0, bit(2 * c as i32));
                        v1 = _mm256_add_epi8(v1, bit(2 * c as i32 + 1));
                    }
                    let s0 = ((sc >> (16 * c)) & 0xff) as i16;
                    let s1 = ((sc >> (16 * c + 8)) & 0xff) as i16;
                    let lo = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(v0), _mm512_set1_epi16(s0));
                    let hi = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(v1), _mm512_set1_epi16(s1));
                    for r in 0..R {
                        let y = &a[r].qs[256 * b + 64 * c..256 * b + 64 * c + 64];
                        // SAFETY: `y` holds 64 `i16`, two vectors; the loads are unaligned.
                        let (y0, y1) = unsafe {
                            (
                                _mm512_loadu_si512(y.as_ptr() as *const __m512i),
                                _mm512_loadu_si512(y.as_ptr().add(32) as *const __m512i),
                            )
                        };
                        isum[r] = _mm512_add_epi32(
                            isum[r],
                            _mm512_add_epi32(_mm512_madd_epi16(lo, y0), _mm512_madd_epi16(hi, y1)),
                        );
                    }
                }
                let mn = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64));
                for r in 0..R {
                    let d = a[r].d[8 * b];
                    acc[wi][r] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_set1_ps(wd * d), acc[wi][r]);
                    let sums = &a[r].sums[8 * b..8 * b + 8];
                    // SAFETY: `sums` holds 8 `i32`, 32 bytes; the load is unaligned.
                    let sums = unsafe { _mm256_loadu_si256(sums.as_ptr() as *const __m256i) };
                    let ms = _mm256_cvtepi32_ps(_mm256_mullo_epi32(mn, sums));
                    mins[wi][r] = _mm256_fmadd_ps(ms, _mm256_set1_ps(wm * d), mins[wi][r]);
                }
            }
        }
        for (o, (v, m)) in out.chunks_exact_mut(R).zip(acc.iter().zip(&mins)) {
            for r in 0..R {
                o[r] = _mm512_reduce_add_ps(v[r]) - hsum(m[r]);
            }
        }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C (the caller checks at run time). Every read goes through
    /// a checked slice, so short inputs panic rather than read out of bounds.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q5_0<const W: usize, const R: usize>(ws: &[&[u8]], a: &[ActRow], out: &mut [f32]) {
        let mut acc = [[_mm256_setzero_ps(); R]; W];
        let m4 = _mm256_set1_epi8(0x0F);
        let hi_off = _mm256_set1_epi8(0xF0u8 as i8);
        let spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        let ones = _mm256_set1_epi64x(-1);
        use block::q5_0::{BYTES, D, QH, QS};
        for b in 0..ws[0].len() / BYTES {
            for (wi, acc) in acc.iter_mut().enumerate() {
                let blk = &ws[wi][BYTES * b..BYTES * b + BYTES];
                prefetch(blk);
                let wd = h2f(blk, D.at);
                let qh = u32::from_le_bytes([blk[QH.at], blk[QH.at + 1], blk[QH.at + 2], blk[QH.at + 3]]);
                // SAFETY: `blk[QS]` holds 16 bytes.
                let lo = unsafe { _mm_loadu_si128(blk[QS.range()].as_ptr() as *const __m128i) };
                let nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(lo), lo), m4);
                // Byte j all ones where bit j of `qh` is set.
                let bits = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
                let set = _mm256_cmpeq_epi8(_mm256_or_si256(bits, bit_mask), ones);
                // Fifth bit clear: value q - 16, i.e. q | 0xF0 as a signed byte.
                let q = widen(_mm256_or_si256(nib, _mm256_andnot_si256(set, hi_off)));
                for r in 0..R {
                    let d = _mm256_set1_ps(wd * a[r].d[b]);
                    acc[r] = _mm256_fmadd_ps(pdot32(&q, a[r].qs, 32 * b), d, acc[r]);
                }
            }
        }
        finish(acc, out)
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C (the caller checks at run time). Every read goes through
    /// a checked slice, so short inputs panic rather than read out of bounds.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_k<const W: usize, const R: usize>(ws: &[&[u8]], a: &[ActRow], out: &mut [f32]) {
        let mut acc = [[_mm256_setzero_ps(); R]; W];
        let mut mins = [[0f32; R]; W];
        let m4 = _mm256_set1_epi8(0x0F);
        use block::q4_k::{BYTES, D, DMIN, QS, SCALES};
        for b in 0..ws[0].len() / BYTES {
            for wi in 0..W {
                let blk = &ws[wi][BYTES * b..BYTES * b + BYTES];
                prefetch(blk);
                prefetch(&blk[64..]);
                prefetch(&blk[128..]);
                let (wd, wm) = (h2f(blk, D.at), h2f(blk, DMIN.at));
                let packed = &blk[SCALES.range()];
                let qs = &blk[QS.range()];
                let mut sums = [_mm256_setzero_ps(); R];
                for c in 0..4 {
                    let (s1, _) = k_scale_min(packed, 2 * c);
                    let (s2, _) = k_scale_min(packed, 2 * c + 1);
                    // SAFETY: `qs[32c..32c + 32]` is in bounds.
                    let q = unsafe { load(qs[32 * c..32 * c + 32].as_ptr()) };
                    let lo = widen(_mm256_and_si256(q, m4));
                    let hi = widen(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4));
                    let (j1, j2) = (8 * b + 2 * c, 8 * b + 2 * c + 1);
                    for r in 0..R {
                        let d1 = _mm256_set1_ps(a[r].d[j1] * f32::from(s1));
                        let d2 = _mm256_set1_ps(a[r].d[j2] * f32::from(s2));
                        sums[r] = _mm256_fmadd_ps(pdot32(&lo, a[r].qs, 32 * j1), d1, sums[r]);
                        sums[r] = _mm256_fmadd_ps(pdot32(&hi, a[r].qs, 32 * j2), d2, sums[r]);
                    }
                }
                let m: [f32; 8] = std::array::from_fn(|j| f32::from(k_scale_min(packed, j).1));
                for r in 0..R {
                    acc[wi][r] = _mm256_fmadd_ps(sums[r], _mm256_set1_ps(wd), acc[wi][r]);
                    let (d, bs) = (&a[r].d[8 * b..8 * b + 8], &a[r].sums[8 * b..8 * b + 8]);
                    let mut ms = 0f32;
                    for j in 0..8 {
                        ms += d[j] * (m[j] * bs[j] as f32);
                    }
                    mins[wi][r] += wm * ms;
                }
            }
        }
        for (o, (v, m)) in out.chunks_exact_mut(R).zip(acc.iter().zip(&mins)) {
            for r in 0..R {
                o[r] = hsum(v[r]) - m[r];
            }
        }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C (the caller checks at run time). Every read goes through
    /// a checked slice, so short inputs panic rather than read out of bounds.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q6_k<const W: usize, const R: usize>(ws: &[&[u8]], a: &[ActRow], out: &mut [f32]) {
        let mut acc = [[_mm256_setzero_ps(); R]; W];
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let off = _mm256_set1_epi8(32);
        use block::q6_k::{BYTES, D, QH, QL, SCALES};
        for b in 0..ws[0].len() / BYTES {
            for wi in 0..W {
                let blk = &ws[wi][BYTES * b..BYTES * b + BYTES];
                prefetch(blk);
                prefetch(&blk[64..]);
                prefetch(&blk[128..]);
                prefetch(&blk[192..]);
                let wd = h2f(blk, D.at);
                let scales = &blk[SCALES.range()];
                let mut sums = [_mm256_setzero_ps(); R];
                for half in 0..2 {
                    let (ql, qh) = (&blk[QL.range()], &blk[QH.range()]);
                    // SAFETY: `ql[64 half..64 half + 64]` and `qh[32 half..32 half + 32]` are in
                    // bounds.
                    let (qa, qb, qh) = unsafe {
                        (
                            load(ql[64 * half..64 * half + 32].as_ptr()),
                            load(ql[64 * half + 32..64 * half + 64].as_ptr()),
                            load(qh[32 * half..32 * half + 32].as_ptr()),
                        )
                    };
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
                        let wv = widen(_mm256_sub_epi8(qs, off));
                        let ab = 8 * b + 4 * half + s;
                        let sa = f32::from(scales[8 * half + 2 * s] as i8);
                        let sb = f32::from(scales[8 * half + 2 * s + 1] as i8);
                        for r in 0..R {
                            let d = a[r].d[ab];
                            let y = a[r].qs;
                            sums[r] =
                                _mm256_fmadd_ps(pdot(wv[0], y, 32 * ab), _mm256_set1_ps(d * sa), sums[r]);
                            sums[r] = _mm256_fmadd_ps(
                                pdot(wv[1], y, 32 * ab + 16),
                                _mm256_set1_ps(d * sb),
                                sums[r],
                            );
                        }
                    }
                }
                for r in 0..R {
                    acc[wi][r] = _mm256_fmadd_ps(sums[r], _mm256_set1_ps(wd), acc[wi][r]);
                }
            }
        }
        finish(acc, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::decode_row;

    /// A xorshift step: the fast kernels' tests' random numbers.
    pub(crate) fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    /// `n` rows of `k` values of `kind`: random bytes with every block's scales (and the
    /// `_1`/K formats' second scales) set to 0.02, so that values stay finite and moderate.
    pub(crate) fn random_rows(kind: Kind, n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let rb = k / kind.block() * kind.block_bytes();
        let mut bytes: Vec<u8> = (0..n * rb).map(|_| (rng(seed) >> 24) as u8).collect();
        for blk in bytes.chunks_exact_mut(kind.block_bytes()) {
            let ats: &[usize] = match kind {
                Kind::Q6K => &[208],
                Kind::Q8_0 | Kind::Q5_0 | Kind::Q4_0 => &[0],
                _ => &[0, 2],
            };
            for &at in ats {
                blk[at..at + 2].copy_from_slice(&half::f16::from_f32(0.02).to_bits().to_le_bytes());
            }
        }
        bytes
    }

    /// `len` activations, uniform in [-0.5, 0.5).
    pub(crate) fn random_acts(len: usize, seed: &mut u64) -> Vec<f32> {
        (0..len)
            .map(|_| (rng(seed) >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            .collect()
    }

    /// Every format the fast kernels take.
    pub(super) const ALL_KINDS: [Kind; 8] = [
        Kind::Q8_0,
        Kind::Q5_0,
        Kind::Q4K,
        Kind::Q6K,
        Kind::Q4_0,
        Kind::Q4_1,
        Kind::Q5_1,
        Kind::Q5K,
    ];

    fn one_thread() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap()
    }

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
            Kind::Q8_0 | Kind::Q5_0 | Kind::Q4_0 => &[0],
            Kind::Q4K | Kind::Q5K | Kind::Q4_1 | Kind::Q5_1 => &[0, 2],
            Kind::Q6K => &[block::q6_k::D.at],
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
            Kind::Q4_0 => DType::Q4_0,
            Kind::Q4_1 => DType::Q4_1,
            Kind::Q5_1 => DType::Q5_1,
            Kind::Q5K => DType::Q5K,
        }
    }

    /// Fast (every kernel set the CPU runs, one row and a tile of rows) against the f32 reference:
    /// `|fast - ref| <= 1e-4 * sum |x_i w_i|`. 16-bit activations carry a relative rounding
    /// error of at most 1/65534 of their block's largest value, so the dot's error is below
    /// about 2e-5 of `sum |x_i w_i|` on these uniform values; 1e-4 leaves room for f32 sums.
    #[test]
    fn fast_dots_match_the_reference() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        // `q4_k` with one activation scale per block and per 256 (its own matrix-vector kernel).
        let cases = [
            (Kind::Q8_0, QK),
            (Kind::Q5_0, QK),
            (Kind::Q4K, QK),
            (Kind::Q4K, 256),
            (Kind::Q6K, QK),
            (Kind::Q4_0, QK),
            (Kind::Q4_1, QK),
            (Kind::Q5_1, QK),
            (Kind::Q5K, QK),
            (Kind::Q5K, 256),
        ];
        for (kind, span) in cases {
            for &k in &[256usize, 1024, 2560] {
                for _ in 0..10 {
                    let w = random_row(kind, k, &mut rng);
                    let x: Vec<f32> = (0..TILE * k).map(|_| rng.unit() * 3.0).collect();
                    let mut wf = vec![0f32; k];
                    decode_row(dtype(kind), &w, &mut wf);
                    let mut acts = Acts::default();
                    assert!(acts.quantize_span(&one_thread(), Simd::detect(), &x, TILE, k, span));
                    assert_eq!(acts.span, span);
                    let rows: Vec<ActRow> = (0..TILE).map(|r| acts.row(r, k)).collect();
                    for set in KernelSet::ALL.into_iter().filter(|s| s.available()) {
                        let mut tiled = [0f32; TILE];
                        dots(kind, set, &[&w], &rows, &mut tiled);
                        for (r, row) in rows.iter().enumerate() {
                            let xr = &x[r * k..(r + 1) * k];
                            let reference: f32 = xr.iter().zip(&wf).map(|(a, b)| a * b).sum();
                            let scale: f32 = xr.iter().zip(&wf).map(|(a, b)| (a * b).abs()).sum();
                            let s = scalar::dot(kind, &w, *row);
                            let mut one = [0f32];
                            dots(kind, set, &[&w], &rows[r..r + 1], &mut one);
                            for (what, v) in [("scalar", s), ("single", one[0]), ("tiled", tiled[r])] {
                                assert!(
                                    (v - reference).abs() <= 1e-4 * scale,
                                    "{kind:?} {set:?} k={k} {what}: fast {v}, reference {reference}, scale {scale}"
                                );
                            }
                            // The SIMD paths sum the same integers in another order.
                            assert!(
                                (one[0] - s).abs() <= 1e-5 * scale,
                                "{kind:?} {set:?} k={k}: {} vs {s}",
                                one[0]
                            );
                            assert_eq!(
                                one[0].to_bits(),
                                tiled[r].to_bits(),
                                "{kind:?} {set:?} k={k}: tile"
                            );
                        }
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
        for kind in ALL_KINDS {
            for _ in 0..50 {
                let k = 512;
                let w = random_row(kind, k, &mut rng);
                let x: Vec<f32> = (0..k).map(|_| rng.unit()).collect();
                let mut wf = vec![0f32; k];
                decode_row(dtype(kind), &w, &mut wf);
                let mut acts = Acts::default();
                assert!(acts.quantize(&one_thread(), Simd::detect(), &x, 1, k));
                let row = acts.row(0, k);
                let (mut exact, mut scale) = (0f64, 0f64);
                for (i, &wv) in wf.iter().enumerate() {
                    let xq = f64::from(row.d[i / QK]) * f64::from(row.qs[i]);
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

    /// Both products: the fused kernels (7 rows) and the unpacked one (prefill: 8 rows, and 69
    /// rows, more than a row block, on an odd number of weight rows), 1 and 3 threads.
    #[test]
    fn matmul_matches_the_reference_for_several_rows() {
        for (n, k, rows, threads) in [(37, 512, 7, 2), (37, 512, 8, 1), (37, 768, 69, 3), (1, 256, 9, 2)] {
            matmul_against_reference(n, k, rows, threads);
        }
    }

    /// The matrix-vector product ([`WROWS`] weight rows at a time, and the rows left over): 37
    /// weight rows on 2 threads, and 3 (fewer than [`WROWS`]) on 1.
    #[test]
    fn matvec_matches_the_reference() {
        for (n, k, rows, threads) in [(37, 512, 1, 2), (3, 256, 1, 1)] {
            matmul_against_reference(n, k, rows, threads);
        }
    }

    fn matmul_against_reference(n: usize, k: usize, rows: usize, threads: usize) {
        let mut rng = Rng(12345 + rows as u64);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for kind in ALL_KINDS {
            let bytes: Vec<u8> = (0..n).flat_map(|_| random_row(kind, k, &mut rng)).collect();
            let w = WeightView {
                bytes: &bytes,
                dtype: dtype(kind),
                n,
                k,
            };
            let x: Vec<f32> = (0..rows * k).map(|_| rng.unit()).collect();
            for set in KernelSet::ALL.into_iter().filter(|s| s.available()) {
                let mut scratch = vec![0f32; n * rows];
                let layout = matmul(
                    &pool,
                    None,
                    set,
                    &x,
                    rows,
                    &w,
                    &mut scratch,
                    &mut ActScratch::default(),
                    true,
                    false,
                )
                .expect("covered");
                let mut product = vec![0f32; n * rows];
                crate::layout::scatter(&scratch, layout, rows, 0, &mut product);
                let mut wf = vec![0f32; k];
                for j in 0..n {
                    w.decode(j, &mut wf);
                    for r in 0..rows {
                        let xr = &x[r * k..(r + 1) * k];
                        let reference: f32 = xr.iter().zip(&wf).map(|(a, b)| a * b).sum();
                        let scale: f32 = xr.iter().zip(&wf).map(|(a, b)| (a * b).abs()).sum();
                        let got = product[r * n + j];
                        assert!(
                            (got - reference).abs() <= 1e-4 * scale,
                            "{kind:?} {set:?} n={n} k={k} rows={rows}: ({j}, {r}) {got} vs {reference}"
                        );
                    }
                }
            }
        }
    }

    /// What the backend's routing by sequence relies on: through the row kernels (`gemm` false)
    /// every row of a step of many rows equals that row alone bit for bit, for every format and
    /// kernel set; the prefill product (`gemm` true) does not (it sums in another order), which
    /// is why a decode row never goes through it beside a prompt chunk.
    #[test]
    fn row_kernels_give_each_row_of_many_its_result_alone() {
        let mut rng = Rng(99);
        let pool = one_thread();
        for kind in ALL_KINDS {
            let (n, k, rows) = (24, 512, 12);
            let w: Vec<u8> = (0..n).flat_map(|_| random_row(kind, k, &mut rng)).collect();
            let x: Vec<f32> = (0..rows * k).map(|_| rng.unit()).collect();
            let view = WeightView {
                bytes: &w,
                dtype: dtype(kind),
                n,
                k,
            };
            let product = |set, rows: usize, gemm| {
                let mut scratch = vec![0f32; n * rows];
                let layout = matmul(
                    &pool,
                    None,
                    set,
                    &x[..rows * k],
                    rows,
                    &view,
                    &mut scratch,
                    &mut ActScratch::default(),
                    gemm,
                    false,
                )
                .expect("a covered format");
                let mut out = vec![0f32; n * rows];
                crate::layout::scatter(&scratch, layout, rows, 0, &mut out);
                out
            };
            for set in KernelSet::ALL.into_iter().filter(|s| s.available()) {
                let many = product(set, rows, false);
                for r in [0, 5, rows - 1] {
                    let alone = {
                        let mut scratch = vec![0f32; n];
                        let xr = &x[r * k..(r + 1) * k];
                        let layout = matmul(
                            &pool,
                            None,
                            set,
                            xr,
                            1,
                            &view,
                            &mut scratch,
                            &mut ActScratch::default(),
                            false,
                            false,
                        )
                        .expect("covered");
                        let mut out = vec![0f32; n];
                        crate::layout::scatter(&scratch, layout, 1, 0, &mut out);
                        out
                    };
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&many[r * n..(r + 1) * n]),
                        bits(&alone),
                        "{kind:?} {set:?} row {r}"
                    );
                }
            }
        }
    }

    /// [`WROWS`] weight rows side by side give each row's single-row dot bit for bit (each row
    /// keeps its own sums in the same order).
    #[test]
    fn side_by_side_rows_equal_single_rows() {
        let mut rng = Rng(4242);
        let cases = [
            (Kind::Q8_0, QK),
            (Kind::Q5_0, QK),
            (Kind::Q4K, QK),
            (Kind::Q4K, 256),
            (Kind::Q6K, QK),
            (Kind::Q4_0, QK),
            (Kind::Q4_1, QK),
            (Kind::Q5_1, QK),
            (Kind::Q5K, QK),
            (Kind::Q5K, 256),
        ];
        for (kind, span) in cases {
            let k = 768;
            let ws: Vec<Vec<u8>> = (0..WROWS).map(|_| random_row(kind, k, &mut rng)).collect();
            let x: Vec<f32> = (0..k).map(|_| rng.unit()).collect();
            let mut acts = Acts::default();
            assert!(acts.quantize_span(&one_thread(), Simd::detect(), &x, 1, k, span));
            let a = [acts.row(0, k)];
            let refs: Vec<&[u8]> = ws.iter().map(|w| w.as_slice()).collect();
            for set in KernelSet::ALL.into_iter().filter(|s| s.available()) {
                let mut together = [0f32; WROWS];
                dots(kind, set, &refs, &a, &mut together);
                for (i, w) in refs.iter().enumerate() {
                    let mut one = [0f32];
                    dots(kind, set, &[w], &a, &mut one);
                    assert_eq!(
                        one[0].to_bits(),
                        together[i].to_bits(),
                        "{kind:?} {set:?} row {i}"
                    );
                    assert_ne!(one[0], 0.0, "{kind:?} {set:?} row {i}: zero");
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
        assert!(matmul(
            &pool,
            None,
            KernelSet::detect(),
            &x,
            1,
            &w,
            &mut scratch,
            &mut ActScratch::default(),
            false,
            false
        )
        .is_none());
    }
}
