//! `precision = "fast"` on CPUs with AMX-BF16 (Intel Xeon from Sapphire Rapids): the prefill
//! product on AMX tiles in bfloat16 (`tdpbf16ps`: 16 x 16 outputs by 32 values per
//! instruction, accumulated in `f32`).
//!
//! Each weight row of a task is decoded to `f32` (the format's values times its scales, less its
//! offsets) and rounded to bfloat16 once per task; the activations are rounded to bfloat16 once
//! per product. The tiles then accumulate in `f32` over the whole of `k`: no per-block read-out,
//! which is what held the integer AMX tiles (`super::amx`) back: they keep 16-bit activations
//! exact and must scale every block of 32 (bench/results/2026-11-25-cpu-amx/).
//!
//! The rounding (8 significant bits for weights and activations alike) is an approximation like
//! the 8-bit activations of `super::int8`, and `precision = "fast"`'s rule judges it on the real
//! model (`engine perplexity --kl-divergence`, docs/precision.md); `exact` never takes it.
//!
//! The weights are the tiles' first operand, rows of 32 values read in place (each weight row
//! decoded into a row of bfloat16, `2 k` bytes apart: no reordering of the many weight values),
//! and the activations the second, in the tiles' pair layout (per 16 rows and 32 values of `k`,
//! 16 pairs of values by the 16 rows), reordered once per product. Register blocking: 32
//! output columns by 32 activation rows per pass (two weight tiles, two activation tiles, four
//! 16 x 16 `f32` results, which come out transposed: columns by rows).

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

use super::amx::{cpuid7_edx, Amx, TileConfig};
use super::{grow, KernelSet, Kind};
use crate::layout::Layout;
use crate::weight::WeightView;

/// Values of `k` per tile product.
const KS: usize = 32;
/// Output columns per weight tile.
const TC: usize = 16;
/// Activation rows per tile.
const TR: usize = 16;
/// `u16` values of one activation tile (16 pairs of values by 16 rows x 2).
const XTILE: usize = KS * TR;
/// `u16` values a task's bfloat16 weight row takes beyond its `k`: one cache line, so that the
/// 16 rows of a weight tile do not share one set of the L1 cache where `2 k` bytes are a
/// multiple of 4 KiB (Gemma 3 4B's `k = 10240`).
const ROW_PAD: usize = 32;

/// Proof that the CPU has AMX-BF16 and AVX-512 BF16 besides [`Amx`]'s features (which include
/// the OS's grant of the tile state); only [`AmxBf16::detect`] makes one.
#[derive(Clone, Copy)]
pub(super) struct AmxBf16(());

impl AmxBf16 {
    pub(super) fn detect() -> Option<AmxBf16> {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let ok = *OK.get_or_init(|| {
            Amx::detect().is_some() && cpu_has_amx_bf16() && is_x86_feature_detected!("avx512bf16")
        });
        ok.then_some(AmxBf16(()))
    }
}

/// The proof where `set` may take these tiles (the detected `avx512_vnni` set, or `amx` named)
/// and the CPU has them, unless `TANDEM_CPU_AMX_BF16=0` (for A/B runs against the 8-bit
/// products).
pub(super) fn for_set(set: KernelSet) -> Option<AmxBf16> {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var("TANDEM_CPU_AMX_BF16").is_ok_and(|v| v == "0"));
    if off || !matches!(set, KernelSet::Avx512Vnni | KernelSet::Amx) {
        return None;
    }
    AmxBf16::detect()
}

/// CPUID leaf 7: AMX-BF16 (EDX bit 22).
fn cpu_has_amx_bf16() -> bool {
    cpuid7_edx() & (1 << 22) != 0
}

/// Per task: its weight rows in bfloat16, one decoded row, `super::gemm::unpack`'s scratch.
#[derive(Default)]
struct Panel {
    /// The task's weight rows (an even number of groups of [`TC`]), `k` values each,
    /// `k + ROW_PAD` apart.
    w: Vec<u16>,
    /// One weight row decoded to `f32`.
    row: Vec<f32>,
    /// Scratch of `super::gemm::unpack`.
    q: Vec<i16>,
    scale: Vec<f32>,
    bias: Vec<f32>,
}

thread_local! {
    static PANEL: RefCell<Panel> = RefCell::default();
}

/// Whether the product takes `w`: a format `super::gemm::unpack` reads, `k` a whole number of
/// [`KS`] and of the format's blocks.
fn covers(w: &WeightView) -> Option<Kind> {
    let kind = Kind::of(w.dtype)?;
    (w.k > 0 && w.k.is_multiple_of(KS) && w.k.is_multiple_of(kind.block())).then_some(kind)
}

/// The product of `rows` activation rows `x` with `w` into `scratch`, in the prefill product's
/// panels, the activations rounded into `xb` (the backend's, kept between products); `None`,
/// having written nothing, where `w` is not covered or an activation is not finite (the
/// caller then takes another path).
pub(super) fn matmul(
    pool: &rayon::ThreadPool,
    proof: AmxBf16,
    x: &[f32],
    rows: usize,
    w: &WeightView,
    scratch: &mut [f32],
    xb: &mut Vec<u16>,
) -> Option<Layout> {
    use rayon::prelude::*;
    let kind = covers(w)?;
    let k = w.k;
    let rb = k / kind.block() * kind.block_bytes();
    if rows == 0 || w.bytes.len() < w.n * rb || x.len() < rows * k || scratch.len() < w.n * rows {
        return None;
    }
    // Tiles of 16 activation rows, and one more: a pass takes two, the task's last may take
    // the next task's first or zeros.
    let tiles = rows.div_ceil(TR) + 1;
    let steps = k / KS;
    {
        grow(xb, tiles * steps * XTILE);
        let xs: &mut [u16] = &mut xb[..tiles * steps * XTILE];
        let finite = pool.install(|| {
            xs.par_chunks_mut(steps * XTILE)
                .enumerate()
                .map(|(t, o)| {
                    let r0 = (t * TR).min(rows);
                    let r1 = (r0 + TR).min(rows);
                    // SAFETY: the proof says the CPU has AVX-512 F and BF16; `o` holds one
                    // tile of `steps` steps, the rows `k` values each, a multiple of 32
                    // (`covers`), and at most 16 of them.
                    unsafe { to_bf16(proof, &x[r0 * k..r1 * k], k, o) }
                })
                .reduce(|| true, |a, b| a && b)
        });
        if !finite {
            return None;
        }
        let xb = &xb[..tiles * steps * XTILE];
        let task = |r0: usize, j0: usize, width: usize, dst: &mut [f32]| {
            run_task(proof, kind, w.bytes, rb, k, xb, r0, j0, width, dst)
        };
        Some(super::prefill_tasks(
            pool,
            w.n,
            rows,
            &mut scratch[..w.n * rows],
            task,
        ))
    }
}

/// Rounds activation rows `x` (at most 16 of `k` values) to bfloat16 (to nearest, ties to even)
/// into one tile's pair layout `out` (value `2 i + t` of row `r` in step `s` at
/// `s * XTILE + 32 i + 2 r + t`; rows past `x`'s zero); whether every value was finite.
///
/// # Safety
/// The CPU has AVX-512 F and BF16 (`_p`); `k` is a multiple of 32, `x` holds whole rows of `k`,
/// at most [`TR`] of them, and `out` `k / 32` steps of [`XTILE`] values.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn to_bf16(_p: AmxBf16, x: &[f32], k: usize, out: &mut [u16]) -> bool {
    debug_assert!(k.is_multiple_of(KS) && x.len() <= TR * k && out.len() >= k / KS * XTILE);
    out.fill(0);
    let mut finite = _mm512_set1_epi32(-1);
    let exp = _mm512_set1_epi32(0x7F80_0000);
    // Pair `i` of a step goes 16 `u32`s (one per row) after pair `i - 1`.
    let index = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(TR as i32),
    );
    for (r, row) in x.chunks_exact(k).enumerate() {
        for (s, v) in row.chunks_exact(KS).enumerate() {
            // SAFETY: 32 values in; the 16 `u32` stores land at `s * XTILE + 2 r + 32 i`
            // (`i < 16`, `r < 16`), within step `s` of `out`.
            unsafe {
                let lo = _mm512_loadu_ps(v.as_ptr());
                let hi = _mm512_loadu_ps(v.as_ptr().add(16));
                for h in [lo, hi] {
                    // Finite: the exponent bits are not all ones.
                    let e = _mm512_and_si512(_mm512_castps_si512(h), exp);
                    let m = _mm512_cmpneq_epi32_mask(e, exp);
                    finite = _mm512_maskz_mov_epi32(m, finite);
                }
                let b = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
                let base = out.as_mut_ptr().add(s * XTILE + 2 * r) as *mut i32;
                _mm512_i32scatter_epi32::<4>(base as *mut _, index, b);
            }
        }
    }
    _mm512_reduce_and_epi32(finite) == -1
}

/// One task of the product: weight rows `j0..j0 + width` by activation rows `r0..` (`dst`'s
/// rows; `r0` a multiple of [`TR`]), row-major into `dst`.
#[allow(clippy::too_many_arguments)]
fn run_task(
    proof: AmxBf16,
    kind: Kind,
    bytes: &[u8],
    rb: usize,
    k: usize,
    xb: &[u16],
    r0: usize,
    j0: usize,
    width: usize,
    dst: &mut [f32],
) {
    let rows = dst.len() / width;
    let steps = k / KS;
    // Column groups, an even number (a pass takes two; rows past the last column are zeros).
    let cols = width.div_ceil(2 * TC) * 2 * TC;
    PANEL.with(|cell| {
        let mut p = cell.borrow_mut();
        let p = &mut *p;
        let nb = k / super::QK;
        let ld = k + ROW_PAD;
        grow(&mut p.w, cols * ld);
        grow(&mut p.row, k);
        grow(&mut p.q, k);
        grow(&mut p.scale, nb);
        grow(&mut p.bias, nb);
        for j in 0..cols {
            let out = &mut p.w[j * ld..j * ld + k];
            if j >= width {
                out.fill(0);
                continue;
            }
            let row = &bytes[(j0 + j) * rb..(j0 + j + 1) * rb];
            decode(
                proof,
                kind,
                row,
                &mut p.row[..k],
                &mut p.q[..k],
                &mut p.scale[..nb],
                &mut p.bias[..nb],
            );
            // SAFETY: the proof says the CPU has AVX-512 F and BF16; both hold `k` values, a
            // multiple of 32.
            unsafe { round_row(proof, &p.row[..k], out) };
        }
        let cfg = tile_config();
        // SAFETY: the proof says the CPU has AMX and the OS granted the tile state; `cfg` is a
        // valid palette-1 configuration (`tile_config`), 64 bytes, 64-aligned.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg as *const TileConfig, options(nostack, readonly)) };
        let mut out = [[0f32; 2 * TR]; 2 * TC];
        let t0 = r0 / TR;
        for (pass_no, r) in (0..rows).step_by(2 * TR).enumerate() {
            let m = (rows - r).min(2 * TR);
            let x = &xb[(t0 + 2 * pass_no) * steps * XTILE..];
            for c0 in (0..cols).step_by(2 * TC) {
                // SAFETY: the configuration is loaded; the weight tiles read rows `c0..c0 + 32`
                // of the panel (`cols` rows of `ld`), 64 bytes at each step; the activation
                // tiles two tiles of `steps` steps from `x` (the product keeps one tile past
                // its rows, so the second exists); the results go to `out`.
                unsafe { pass(proof, p.w[c0 * ld..].as_ptr(), ld, x.as_ptr(), steps, &mut out) };
                let n = width.saturating_sub(c0).min(2 * TC);
                for (i, drow) in dst[r * width..(r + m) * width]
                    .chunks_exact_mut(width)
                    .enumerate()
                {
                    for (d, o) in drow[c0..c0 + n].iter_mut().zip(&out) {
                        *d = o[i];
                    }
                }
            }
        }
        // SAFETY: returns the tile state to its initial form; valid after any tile use, and
        // the next task loads its configuration again.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    });
}

/// Weight row `row` of `kind` (whole blocks) decoded to `f32` into `out` (`k` values): `q4_k`
/// 32 values at a time ([`decode_q4k`]), the other formats as `scale * value - bias` per block
/// through `super::gemm::unpack`'s integers (`q`, `scale`, `bias`: its scratch).
fn decode(
    proof: AmxBf16,
    kind: Kind,
    row: &[u8],
    out: &mut [f32],
    q: &mut [i16],
    scale: &mut [f32],
    bias: &mut [f32],
) {
    if kind == Kind::Q4K {
        // SAFETY: the proof says the CPU has AVX-512 F and BW; `row` holds whole blocks and
        // `out` their values.
        return unsafe { decode_q4k(proof, row, out) };
    }
    super::gemm::unpack::<true>(kind, row, q, scale, bias);
    for (b, (o, v)) in out
        .chunks_exact_mut(super::QK)
        .zip(q.chunks_exact(super::QK))
        .enumerate()
    {
        let (s, m) = (scale[b], bias[b]);
        for (o, v) in o.iter_mut().zip(v) {
            *o = s * f32::from(*v) - m;
        }
    }
}

/// A `q4_k` row decoded to `f32` into `out`: per sub-block of 32, `d * scale * q - dmin * min`,
/// 32 values at a time.
///
/// # Safety
/// The CPU has AVX-512 F and BW (`_p`); `row` holds whole blocks of 144 bytes and `out` 256
/// values per block.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn decode_q4k(_p: AmxBf16, row: &[u8], out: &mut [f32]) {
    debug_assert!(out.len() >= row.len() / 144 * 256);
    let low = _mm512_set1_epi16(0x0F);
    for (blk, o) in row.chunks_exact(144).zip(out.chunks_exact_mut(256)) {
        let (d, dmin) = (super::f16_at(blk, 0), super::f16_at(blk, 2));
        let packed = &blk[4..16];
        for c in 0..4 {
            // SAFETY: 32 bytes of nibbles at `16 + 32 c` within the block's 144.
            let q = unsafe {
                _mm512_cvtepu8_epi16(_mm256_loadu_si256(blk.as_ptr().add(16 + 32 * c) as *const __m256i))
            };
            for (h, q) in [_mm512_and_si512(q, low), _mm512_srli_epi16::<4>(q)]
                .into_iter()
                .enumerate()
            {
                let j = 2 * c + h;
                let (sc, m) = super::k_scale_min(packed, j);
                let ds = _mm512_set1_ps(d * f32::from(sc));
                let dm = _mm512_set1_ps(dmin * f32::from(m));
                let q0 = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(q)));
                let q1 = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(q)));
                // SAFETY: sub-block `j`'s 32 values at `32 j` within the block's 256.
                unsafe {
                    _mm512_storeu_ps(o.as_mut_ptr().add(32 * j), _mm512_fmsub_ps(ds, q0, dm));
                    _mm512_storeu_ps(o.as_mut_ptr().add(32 * j + 16), _mm512_fmsub_ps(ds, q1, dm));
                }
            }
        }
    }
}

/// Rounds decoded row `row` to bfloat16 into `out`.
///
/// # Safety
/// The CPU has AVX-512 F and BF16 (`_p`); `row` and `out` hold the same whole number of 32
/// values.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn round_row(_p: AmxBf16, row: &[f32], out: &mut [u16]) {
    debug_assert!(row.len() == out.len() && row.len().is_multiple_of(KS));
    for (o, v) in out.chunks_exact_mut(KS).zip(row.chunks_exact(KS)) {
        // SAFETY: 32 values each side.
        unsafe {
            let lo = _mm512_loadu_ps(v.as_ptr());
            let hi = _mm512_loadu_ps(v.as_ptr().add(16));
            let b = _mm512_cvtne2ps_pbh(hi, lo);
            _mm512_storeu_si512(
                o.as_mut_ptr() as *mut __m512i,
                std::mem::transmute::<__m512bh, __m512i>(b),
            );
        }
    }
}

/// The tile configuration of [`pass`]: every tile 16 rows of 64 bytes (0 and 1 two groups of
/// 16 weight rows by 32 values, 2 and 3 two tiles of 16 activation rows in pairs, 4 to 7 the
/// results: 16 columns by 16 rows of `f32`).
fn tile_config() -> TileConfig {
    TileConfig::of([(64, 16); 8])
}

/// One pass: 32 weight rows at `w` (`ld` values apart) by the 32 activation rows of the two
/// tiles at `x` (`steps` steps each), over `32 steps` values, into `out` (`[column][row]`).
///
/// # Safety
/// The CPU has AMX-BF16, the OS granted the tile state and [`tile_config`]'s configuration
/// is loaded (`_p`); `w` points at 32 rows of at least `32 steps` values, `ld` apart, and `x`
/// at two tiles of `steps` steps of [`XTILE`] values.
#[target_feature(enable = "avx512f")]
unsafe fn pass(
    _p: AmxBf16,
    w: *const u16,
    ld: usize,
    x: *const u16,
    steps: usize,
    out: &mut [[f32; 2 * TR]; 2 * TC],
) {
    let o = out.as_mut_ptr() as *mut f32;
    // SAFETY: the loads read within the rows the caller vouches for (weight tile `s`: 64 bytes
    // at value `32 s` of 16 rows `2 ld` bytes apart; activation tile `s`: 1 KiB at step `s` of
    // each tile); the stores write 16 rows of 64 bytes, 128 apart, into each quarter of `out`.
    unsafe {
        asm!(
            "tilezero tmm4",
            "tilezero tmm5",
            "tilezero tmm6",
            "tilezero tmm7",
            options(nostack, nomem)
        );
        for s in 0..steps {
            asm!(
                "tileloadd tmm0, [{w0} + {ws} * 1]",
                "tileloadd tmm1, [{w1} + {ws} * 1]",
                "tileloadd tmm2, [{x0} + {xs} * 1]",
                "tileloadd tmm3, [{x1} + {xs} * 1]",
                "tdpbf16ps tmm4, tmm0, tmm2",
                "tdpbf16ps tmm5, tmm0, tmm3",
                "tdpbf16ps tmm6, tmm1, tmm2",
                "tdpbf16ps tmm7, tmm1, tmm3",
                w0 = in(reg) w.add(KS * s),
                w1 = in(reg) w.add(KS * s + TC * ld),
                ws = in(reg) 2 * ld,
                x0 = in(reg) x.add(XTILE * s),
                x1 = in(reg) x.add(XTILE * (steps + s)),
                xs = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
        asm!(
            "tilestored [{o0} + {os} * 1], tmm4",
            "tilestored [{o1} + {os} * 1], tmm5",
            "tilestored [{o2} + {os} * 1], tmm6",
            "tilestored [{o3} + {os} * 1], tmm7",
            o0 = in(reg) o,
            o1 = in(reg) o.add(TR),
            o2 = in(reg) o.add(TC * 2 * TR),
            o3 = in(reg) o.add(TC * 2 * TR + TR),
            os = in(reg) 2 * TR * 4,
            options(nostack),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::tests::{random_acts, random_rows};
    use tandem_backend_api::DType;

    fn bf16(v: f32) -> f64 {
        f64::from(half::bf16::from_f32(v).to_f32())
    }

    /// Where the CPU has AMX-BF16: every format's product equals the dot of the bfloat16-rounded
    /// decoded weights and activations (summed in `f64`) within `f32` accumulation error, on
    /// odd shapes (a partial column group, a partial and a single activation tile); and a
    /// non-finite activation is refused. Elsewhere there is nothing to run.
    #[test]
    fn tiles_match_the_rounded_dot() {
        let Some(proof) = AmxBf16::detect() else {
            eprintln!("no AMX-BF16 here: the tiles were not run");
            return;
        };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut seed = 5u64;
        for dtype in [
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q4K,
            DType::Q5K,
            DType::Q6K,
        ] {
            let kind = Kind::of(dtype).expect("a block format");
            for (n, k, rows) in [(37usize, 512usize, 21usize), (70, 256, 8), (5, 768, 40)] {
                let rb = k / kind.block() * kind.block_bytes();
                let bytes = random_rows(kind, n, k, &mut seed);
                let w = WeightView {
                    bytes: &bytes,
                    dtype,
                    n,
                    k,
                };
                let x = random_acts(rows * k, &mut seed);
                let mut scratch = vec![0f32; n * rows];
                let layout =
                    matmul(&pool, proof, &x, rows, &w, &mut scratch, &mut Vec::new()).expect("covered");
                let nb = k / crate::fast::QK;
                let (mut dec, mut want_dec) = (vec![0f32; k], vec![0f32; k]);
                let (mut q, mut sc, mut bias) = (vec![0i16; k], vec![0f32; nb], vec![0f32; nb]);
                for j in 0..n {
                    // The decoded row is the reference decoder's within f32 rounding.
                    decode(
                        proof,
                        kind,
                        &bytes[j * rb..(j + 1) * rb],
                        &mut dec,
                        &mut q,
                        &mut sc,
                        &mut bias,
                    );
                    w.decode(j, &mut want_dec);
                    for (a, b) in dec.iter().zip(&want_dec) {
                        assert!(
                            (a - b).abs() <= 1e-6 * b.abs().max(1e-3),
                            "{kind:?}: decoded {a}, reference {b}"
                        );
                    }
                    for r in 0..rows {
                        let xr = &x[r * k..(r + 1) * k];
                        let want: f64 = dec.iter().zip(xr).map(|(a, b)| bf16(*a) * bf16(*b)).sum();
                        let mag: f64 = dec.iter().zip(xr).map(|(a, b)| (bf16(*a) * bf16(*b)).abs()).sum();
                        let mut got = [0f32];
                        layout.copy_row(&scratch, rows, r, j, &mut got);
                        assert!(
                            (f64::from(got[0]) - want).abs() <= 1e-5 * mag + 1e-6,
                            "{kind:?} {n}x{k} rows {rows}: row {r} column {j}: {} against {want}",
                            got[0]
                        );
                    }
                }
                assert!(scratch.iter().any(|v| *v != 0.0));
                let mut bad = x.clone();
                bad[rows * k - 1] = f32::NAN;
                assert!(matmul(&pool, proof, &bad, rows, &w, &mut scratch, &mut Vec::new()).is_none());
            }
        }
    }
}
