//! `precision = "fast"`'s prefill product (many activation rows) for `q4_k` weights, on 8-bit
//! activations with AVX-512 VNNI's `vpdpbusd`.
//!
//! The activations are quantized exactly as the decode path's ([`int8::quantize`], one scale
//! per [`Q4K_SPAN`] values, the minimums' factor `d0 * sum0 + d1 * sum1` per 32; here one
//! vector per span, the same bits), so a row's integers are the ones the decode kernel takes.
//! The products differ from the decode kernel's only in the order of the `f32` additions.
//!
//! Each task unpacks its weight rows once into panels of [`PANEL`] rows: the 4-bit codes as
//! bytes (0..=15, `vpdpbusd`'s unsigned operand as they are), interleaved so that one 512-bit
//! vector holds 4 consecutive values of 16 rows, and per sub-block of 32 and row its `f32`
//! scale `d * scale` and offset `dmin * min`. A register tile of [`PANEL`] columns by [`MR`]
//! activation rows then broadcasts 4 activation bytes of a row at a time against two such
//! vectors (12 integer accumulators), converts the integer sums once per activation scale
//! (16 values) and scales them into 12 `f32` accumulators (`acc += isum * (d * scale) * d_a`),
//! and takes the minimums' term (`dmin * min * (d_a0 * sum0 + d_a1 * sum1)`) off once per
//! sub-block. The result is written as the 16-bit prefill product writes it
//! ([`Layout::Panels`]).

use std::arch::x86_64::*;
use std::cell::RefCell;

use rayon::prelude::*;
use tandem_backend_api::block::q4_k::{BYTES, D, DMIN, ELEMS, QS, SCALES};
use tandem_backend_api::DType;

use super::gemm::store_tile;
use super::int8::{self, Acts8, Row, Q4K_SPAN};
use super::{f16_at, grow, k_scale_min, KernelSet, Vnni, GEMM_MIN_ROWS, QK};
use crate::layout::Layout;
use crate::weight::WeightView;

/// Weight rows (output columns) per interleaved panel: two vectors of 16 lanes.
const PANEL: usize = 32;
/// Activation rows per register tile: 12 integer and 12 `f32` accumulators.
const MR: usize = 6;

/// A task's unpacked weight rows.
#[derive(Default)]
struct Unpacked {
    /// Panels of [`PANEL`] rows of `k` codes each, four bytes a word, interleaved (see
    /// [`unpack`]).
    w: Vec<u32>,
    /// Per panel, sub-block and row: `d * scale`.
    scale: Vec<f32>,
    /// Per panel, sub-block and row: `dmin * min`.
    bias: Vec<f32>,
}

thread_local! {
    static UNPACKED: RefCell<Unpacked> = RefCell::default();
}

/// The kernel set's proof for this product: the `avx512_vnni` set only (the `amx` set keeps
/// its own prefill tiles).
fn proof(set: KernelSet) -> Option<Vnni> {
    match set {
        KernelSet::Avx512Vnni => set.vnni(),
        _ => None,
    }
}

/// The product of `rows` (at least [`GEMM_MIN_ROWS`]) activation rows of `x` with the `q4_k`
/// weight `w` on 8-bit activations, into `scratch` ([`Layout::Panels`]); `None`, having
/// written nothing, where it does not cover the product (another format, another kernel set,
/// part of a super-block, an activation that is not finite): the caller takes the 16-bit path.
pub(super) fn matmul(
    pool: &rayon::ThreadPool,
    set: KernelSet,
    x: &[f32],
    rows: usize,
    w: &WeightView,
    scratch: &mut [f32],
    acts: &mut Acts8,
) -> Option<Layout> {
    let vnni = proof(set)?;
    let k = w.k;
    if w.dtype != DType::Q4K || rows < GEMM_MIN_ROWS || k == 0 || !k.is_multiple_of(ELEMS) {
        return None;
    }
    let rb = k / ELEMS * BYTES;
    if w.bytes.len() < w.n * rb || x.len() < rows * k || scratch.len() < w.n * rows {
        return None;
    }
    {
        let (ns, nb) = (rows * k / Q4K_SPAN, rows * k / QK);
        grow(&mut acts.d, ns);
        grow(&mut acts.qs, rows * k);
        grow(&mut acts.sums, ns);
        grow(&mut acts.ds, nb);
        let Acts8 { d, qs, sums, ds, .. } = acts;
        let (d, qs, sums, ds) = (&mut d[..ns], &mut qs[..rows * k], &mut sums[..ns], &mut ds[..nb]);
        // Tasks of whole rows, a few per thread.
        let per = rows.div_ceil(pool.current_num_threads() * 2);
        let finite = pool.install(|| {
            x[..rows * k]
                .par_chunks(per * k)
                .zip(d.par_chunks_mut(per * k / Q4K_SPAN))
                .zip(qs.par_chunks_mut(per * k))
                .zip(sums.par_chunks_mut(per * k / Q4K_SPAN))
                .zip(ds.par_chunks_mut(per * k / QK))
                .map(|((((x, d), qs), sums), ds)| quantize(vnni, x, d, qs, sums, ds))
                .reduce(|| true, |a, b| a && b)
        });
        if !finite {
            return None;
        }
        let acts = int8::Rows {
            k,
            span: Q4K_SPAN,
            d,
            qs,
            ds,
        };
        let run = |r0: usize, j0: usize, width: usize, dst: &mut [f32]| {
            task(
                vnni,
                &w.bytes[j0 * rb..(j0 + width) * rb],
                rb,
                k,
                acts,
                r0,
                width,
                dst,
            );
        };
        Some(super::prefill_tasks(
            pool,
            w.n,
            rows,
            &mut scratch[..w.n * rows],
            run,
        ))
    }
}

/// [`int8::quantize`] (per [`Q4K_SPAN`]) of whole rows `x` with AVX-512, and the minimums'
/// factors `ds`; `false` where a value is not finite.
fn quantize(_proof: Vnni, x: &[f32], d: &mut [f32], qs: &mut [i8], sums: &mut [i32], ds: &mut [f32]) -> bool {
    let spans = x.len() / Q4K_SPAN;
    assert!(d.len() >= spans && qs.len() >= spans * Q4K_SPAN && sums.len() >= spans && ds.len() >= spans / 2);
    // SAFETY: a `Vnni` exists only where AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C were
    // detected at run time; the lengths are checked just above.
    unsafe { quantize_512(x, d, qs, sums, ds) }
}

/// [`int8::quantize`] per [`Q4K_SPAN`] values (one vector), bit for bit: the largest magnitude
/// by a reduction (`max` is exact in any order), the scale and its inverse as scalars by the
/// same operations, `x * inv` by the same multiply, rounded half away from zero as
/// `trunc(y + copysign(0.49999997, y))` (`round`'s usual lowering, exact for every `f32`), the
/// clamp to -127..=127 in integers. A span whose inverse scale is not finite (a largest
/// magnitude below about 4e-37) goes through [`int8::quantize`] itself.
///
/// # Safety
/// The CPU has AVX-512 F, BW, VL and VNNI besides AVX2, FMA and F16C; `d` and `sums` hold
/// `x.len() / Q4K_SPAN` values, `qs` `x.len()` rounded down to whole spans, `ds` half `d`'s.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn quantize_512(x: &[f32], d: &mut [f32], qs: &mut [i8], sums: &mut [i32], ds: &mut [f32]) -> bool {
    const { assert!(Q4K_SPAN == 16) };
    let below_half = _mm512_set1_epi32(0.5f32.to_bits() as i32 - 1);
    let sign = _mm512_set1_epi32(i32::MIN);
    let infinity = _mm512_set1_ps(f32::INFINITY);
    let (lo, hi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
    for (((x, d), q), sum) in x
        .chunks_exact(Q4K_SPAN)
        .zip(d.iter_mut())
        .zip(qs.chunks_exact_mut(Q4K_SPAN))
        .zip(sums.iter_mut())
    {
        // SAFETY: `x` holds 16 `f32`; the load is unaligned.
        let v = unsafe { _mm512_loadu_ps(x.as_ptr()) };
        let a = _mm512_abs_ps(v);
        // Every value finite: its magnitude below infinity (NaN compares false).
        if _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, infinity) != 0xFFFF {
            return false;
        }
        let amax = _mm512_reduce_max_ps(a);
        let s = amax / 127.0;
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        if !inv.is_finite() {
            if !int8::quantize(x, Q4K_SPAN, std::slice::from_mut(d), q, std::slice::from_mut(sum)) {
                return false;
            }
            continue;
        }
        *d = s;
        let y = _mm512_castps_si512(_mm512_mul_ps(v, _mm512_set1_ps(inv)));
        let bias = _mm512_or_si512(_mm512_and_si512(y, sign), below_half);
        let r = _mm512_add_ps(_mm512_castsi512_ps(y), _mm512_castsi512_ps(bias));
        let i = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvttps_epi32(r), hi), lo);
        // SAFETY: `q` holds 16 bytes; the store is unaligned.
        unsafe { _mm_storeu_si128(q.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(i)) };
        *sum = _mm512_reduce_add_epi32(i);
    }
    int8::minimum_factors(d, sums, ds);
    true
}

/// One task: weight rows `ws` (`width` of them, `rb` bytes each) unpacked into panels, then
/// tiles of [`MR`] activation rows (from `r0`) by one panel, written row-major into `dst`
/// (`width` values per activation row).
#[allow(clippy::too_many_arguments)]
fn task(
    vnni: Vnni,
    ws: &[u8],
    rb: usize,
    k: usize,
    acts: int8::Rows,
    r0: usize,
    width: usize,
    dst: &mut [f32],
) {
    let rows = dst.len() / width;
    let nsb = k / QK;
    let panels = width.div_ceil(PANEL);
    UNPACKED.with(|cell| {
        let mut u = cell.borrow_mut();
        let u = &mut *u;
        grow(&mut u.w, panels * PANEL * k / 4);
        grow(&mut u.scale, panels * PANEL * nsb);
        grow(&mut u.bias, panels * PANEL * nsb);
        for p in 0..panels {
            let (pw, ps, pb) = (
                &mut u.w[p * PANEL * k / 4..(p + 1) * PANEL * k / 4],
                &mut u.scale[p * PANEL * nsb..(p + 1) * PANEL * nsb],
                &mut u.bias[p * PANEL * nsb..(p + 1) * PANEL * nsb],
            );
            // Super-block by super-block, each for every column: the words being written
            // (8 KiB per super-block) stay in L1.
            let steps = pw.chunks_exact_mut(PANEL * ELEMS / 4);
            let scales = ps.chunks_exact_mut(PANEL * 8).zip(pb.chunks_exact_mut(PANEL * 8));
            for (b, (steps, (ps, pb))) in steps.zip(scales).enumerate() {
                for l in 0..PANEL {
                    let j = p * PANEL + l;
                    match ws
                        .get(j * rb + b * BYTES..j * rb + (b + 1) * BYTES)
                        .filter(|_| j < width)
                    {
                        Some(blk) => unpack(blk, l, steps, ps, pb),
                        None => {
                            // Past the last weight row: zeros (never written out).
                            for step in steps.chunks_exact_mut(PANEL) {
                                step[l] = 0;
                            }
                            for (s, b) in ps.chunks_exact_mut(PANEL).zip(pb.chunks_exact_mut(PANEL)) {
                                (s[l], b[l]) = (0.0, 0.0);
                            }
                        }
                    }
                }
            }
        }
        let (w, scale, bias) = (&u.w, &u.scale, &u.bias);
        let mut r = 0;
        while r < rows {
            let an = (rows - r).min(MR);
            // A partial tile repeats its last row (the repeats are not written out).
            let a: [Row; MR] = std::array::from_fn(|i| acts.row(r0 + r + i.min(an - 1)));
            for p in 0..panels {
                let mut out = [[0f32; PANEL]; MR];
                tile(
                    vnni,
                    &w[p * PANEL * k / 4..(p + 1) * PANEL * k / 4],
                    &scale[p * PANEL * nsb..(p + 1) * PANEL * nsb],
                    &bias[p * PANEL * nsb..(p + 1) * PANEL * nsb],
                    &a,
                    nsb,
                    &mut out,
                );
                store_tile(dst, width, r, p * PANEL, &out[..an]);
            }
            r += an;
        }
    });
}

/// Unpacks one `q4_k` super-block `blk` of a weight row into column `l` of its part of a
/// panel: the codes of values `4q..4q + 4` (a word, one byte each) at word `PANEL * q + l` of
/// `steps` (so that the 64 bytes at `128 q` hold them for the panel's rows 0-15 and the next 64
/// for rows 16-31, four bytes per lane), and sub-block `j`'s `d * scale` and `dmin * min` at
/// `PANEL * j + l` of `ps` and `pb`.
fn unpack(blk: &[u8], l: usize, steps: &mut [u32], ps: &mut [f32], pb: &mut [f32]) {
    let l = l % PANEL;
    let (d, dmin) = (f16_at(blk, D.at), f16_at(blk, DMIN.at));
    let packed = &blk[SCALES.range()];
    for (j, (s, b)) in ps
        .chunks_exact_mut(PANEL)
        .zip(pb.chunks_exact_mut(PANEL))
        .take(8)
        .enumerate()
    {
        let (sc, m) = k_scale_min(packed, j);
        (s[l], b[l]) = (d * f32::from(sc), dmin * f32::from(m));
    }
    // Sub-blocks `2c` (low nibbles) and `2c + 1` (high nibbles) of the same 32 code bytes.
    for (codes, two) in blk[QS.range()]
        .chunks_exact(32)
        .zip(steps.chunks_exact_mut(2 * 8 * PANEL))
    {
        let (low, high) = two.split_at_mut(8 * PANEL);
        for ((four, lw), hw) in codes
            .chunks_exact(4)
            .zip(low.chunks_exact_mut(PANEL))
            .zip(high.chunks_exact_mut(PANEL))
        {
            let word = u32::from_le_bytes([four[0], four[1], four[2], four[3]]);
            lw[l] = word & 0x0F0F_0F0F;
            hw[l] = (word >> 4) & 0x0F0F_0F0F;
        }
    }
}

/// One tile: the products of a panel (`w`, `scale`, `bias` as [`unpack`] lays them out, `nsb`
/// sub-blocks) with the [`MR`] activation rows `a`, into `out` (`[row][column]`).
fn tile(
    _proof: Vnni,
    w: &[u32],
    scale: &[f32],
    bias: &[f32],
    a: &[Row; MR],
    nsb: usize,
    out: &mut [[f32; PANEL]; MR],
) {
    let k = nsb * QK;
    assert!(
        w.len() >= PANEL * k / 4
            && scale.len() >= PANEL * nsb
            && bias.len() >= PANEL * nsb
            && a.iter()
                .all(|r| r.qs.len() >= k && r.d.len() >= k / Q4K_SPAN && r.ds.len() >= nsb)
    );
    // SAFETY: a `Vnni` exists only where AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C were
    // detected at run time; the lengths the kernel reads within are checked just above.
    unsafe { tile_512(w, scale, bias, a, nsb, out.as_flattened_mut()) }
}

/// # Safety
/// The CPU has AVX-512 F, BW, VL and VNNI besides AVX2, FMA and F16C; `w` holds
/// `PANEL * nsb * QK / 4` words, `scale` and `bias` `PANEL * nsb` values, each row of `a`
/// `nsb * QK` values, `nsb * QK / Q4K_SPAN` scales and `nsb` minimums' factors; `out` holds
/// `MR * PANEL` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_512(w: &[u32], scale: &[f32], bias: &[f32], a: &[Row; MR], nsb: usize, out: &mut [f32]) {
    const STEPS: usize = Q4K_SPAN / 4;
    let mut acc = [[_mm512_setzero_ps(); MR]; 2];
    let wp = w.as_ptr() as *const u8;
    let qp: [*const i8; MR] = std::array::from_fn(|r| a[r].qs.as_ptr());
    let dp: [*const f32; MR] = std::array::from_fn(|r| a[r].d.as_ptr());
    let mp: [*const f32; MR] = std::array::from_fn(|r| a[r].ds.as_ptr());
    for sb in 0..nsb {
        // SAFETY: `sb < nsb`: 32 values at `32 sb` within `scale` and `bias`.
        let (s0, s1, b0, b1) = unsafe {
            (
                _mm512_loadu_ps(scale.as_ptr().add(32 * sb)),
                _mm512_loadu_ps(scale.as_ptr().add(32 * sb + 16)),
                _mm512_loadu_ps(bias.as_ptr().add(32 * sb)),
                _mm512_loadu_ps(bias.as_ptr().add(32 * sb + 16)),
            )
        };
        for h in 0..QK / Q4K_SPAN {
            let span = 2 * sb + h;
            let mut ia = [[_mm512_setzero_si512(); MR]; 2];
            for t in 0..STEPS {
                // K-step `q`: values `4q..4q + 4`.
                let q = STEPS * span + t;
                // SAFETY: `q < nsb * QK / 4`: both vectors (128 bytes at `128 q`, words
                // `32 q..32 q + 32`) lie within `w`, and the 4 bytes at `4q` within each row of
                // `a`.
                let (w0, w1) = unsafe {
                    (
                        _mm512_loadu_si512(wp.add(128 * q) as *const __m512i),
                        _mm512_loadu_si512(wp.add(128 * q + 64) as *const __m512i),
                    )
                };
                for r in 0..MR {
                    // SAFETY: as above.
                    let four = unsafe { std::ptr::read_unaligned(qp[r].add(4 * q) as *const i32) };
                    let x = _mm512_set1_epi32(four);
                    ia[0][r] = _mm512_dpbusd_epi32(ia[0][r], w0, x);
                    ia[1][r] = _mm512_dpbusd_epi32(ia[1][r], w1, x);
                }
            }
            for r in 0..MR {
                // SAFETY: `span < nsb * QK / Q4K_SPAN`, within each row's scales.
                let d = _mm512_set1_ps(unsafe { *dp[r].add(span) });
                let v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(ia[0][r]), s0);
                let v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(ia[1][r]), s1);
                acc[0][r] = _mm512_fmadd_ps(v0, d, acc[0][r]);
                acc[1][r] = _mm512_fmadd_ps(v1, d, acc[1][r]);
            }
        }
        for r in 0..MR {
            // SAFETY: `sb < nsb`, within each row's minimums' factors.
            let m = _mm512_set1_ps(unsafe { *mp[r].add(sb) });
            acc[0][r] = _mm512_fnmadd_ps(b0, m, acc[0][r]);
            acc[1][r] = _mm512_fnmadd_ps(b1, m, acc[1][r]);
        }
    }
    for (o, r) in out.chunks_exact_mut(PANEL).zip(0..MR) {
        let (lo, hi) = o.split_at_mut(16);
        // SAFETY: each half holds 16 `f32`.
        unsafe {
            _mm512_storeu_ps(lo.as_mut_ptr(), acc[0][r]);
            _mm512_storeu_ps(hi.as_mut_ptr(), acc[1][r]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::int8::tests::{acts, q4_k_rows};

    /// The AVX-512 quantization gives [`int8::quantize`]'s bits (scales, values, sums) and
    /// [`int8::minimum_factors`]' on random rows and on spans made to hit its edges: zeros and
    /// negative zeros, halves exactly between two integers (a largest value of 127 makes the
    /// scale 1), magnitudes whose inverse scale overflows, the largest finite values; and
    /// refuses what it refuses.
    #[test]
    fn the_vector_quantization_is_the_decode_paths_bit_for_bit() {
        let Some(vnni) = proof(KernelSet::Avx512Vnni) else {
            eprintln!("skipping: this CPU has no AVX-512 VNNI");
            return;
        };
        let mut x = acts(64 * 256, 11);
        let edges: [&[f32]; 5] = [
            &[0.0, -0.0],
            &[
                127.0,
                0.5,
                -0.5,
                1.5,
                -1.5,
                2.5,
                -2.5,
                126.5,
                -126.5,
                0.49999997,
                -0.49999997,
            ],
            &[1e-38, -3e-39, 1e-45, 0.0],
            &[f32::MAX, -f32::MAX, 1.0],
            &[1e-20, 3e-21, -7e-21],
        ];
        for (i, e) in edges.iter().enumerate() {
            for (j, v) in x[Q4K_SPAN * i..Q4K_SPAN * (i + 1)].iter_mut().enumerate() {
                *v = e[j % e.len()];
            }
        }
        let n = x.len() / Q4K_SPAN;
        let (mut d, mut q, mut s, mut ds) = (
            vec![0f32; n],
            vec![0i8; x.len()],
            vec![0i32; n],
            vec![0f32; n / 2],
        );
        assert!(quantize(vnni, &x, &mut d, &mut q, &mut s, &mut ds));
        let (mut d0, mut q0, mut s0, mut ds0) = (
            vec![0f32; n],
            vec![0i8; x.len()],
            vec![0i32; n],
            vec![0f32; n / 2],
        );
        assert!(int8::quantize(&x, Q4K_SPAN, &mut d0, &mut q0, &mut s0));
        int8::minimum_factors(&d0, &s0, &mut ds0);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&d), bits(&d0));
        assert_eq!(q, q0);
        assert_eq!(s, s0);
        assert_eq!(bits(&ds), bits(&ds0));
        // The halves round away from zero.
        assert_eq!(
            &q[Q4K_SPAN..Q4K_SPAN + 11],
            &[127, 1, -1, 2, -2, 3, -3, 127, -127, 0, 0]
        );
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut y = x.clone();
            y[100] = bad;
            assert!(!quantize(vnni, &y, &mut d, &mut q, &mut s, &mut ds));
        }
    }

    /// The prefill product against the oracle ([`int8::dot_q4_k`] on the same quantized rows)
    /// and against the decode path (each row alone through [`int8::matmul`]) on odd shapes: 5 and
    /// 37 weight rows (a partial panel), 8, 11, 17 activation rows (partial tiles) and 69 on 3
    /// threads (row blocks), one super-block and three; within 1e-5 of the largest value
    /// (only the order of the `f32` additions differs).
    #[test]
    fn the_prefill_product_matches_the_oracle_and_the_decode_path() {
        let Some(_) = proof(KernelSet::Avx512Vnni) else {
            eprintln!("skipping: this CPU has no AVX-512 VNNI");
            return;
        };
        let mut cases = vec![];
        for n in [5usize, 37] {
            for rows in [8usize, 11, 17] {
                for k in [256usize, 768] {
                    cases.push((n, k, rows, 2));
                }
            }
        }
        cases.push((37, 768, 69, 3));
        for (n, k, rows, threads) in cases {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            let rb = k / ELEMS * BYTES;
            let bytes = q4_k_rows(n, k, (n * k) as u64);
            let view = WeightView {
                dtype: DType::Q4K,
                n,
                k,
                bytes: &bytes,
            };
            let x = acts(rows * k, (rows + k) as u64);
            let mut scratch = vec![0f32; n * rows];
            // This product itself, not `fast::matmul`'s choice (which may route elsewhere first).
            let layout = matmul(
                &pool,
                KernelSet::Avx512Vnni,
                &x,
                rows,
                &view,
                &mut scratch,
                &mut Acts8::default(),
            );
            assert!(matches!(layout, Some(Layout::Panels { .. })), "{layout:?}");
            let mut got = vec![0f32; n * rows];
            crate::layout::scatter(&scratch, layout.expect("covered"), rows, 0, &mut got);
            let (mut want, mut decode) = (vec![0f32; n * rows], vec![0f32; n * rows]);
            for r in 0..rows {
                let xr = &x[r * k..(r + 1) * k];
                let (mut d, mut q, mut s) =
                    (vec![0f32; k / Q4K_SPAN], vec![0i8; k], vec![0i32; k / Q4K_SPAN]);
                assert!(int8::quantize(xr, Q4K_SPAN, &mut d, &mut q, &mut s));
                for j in 0..n {
                    want[r * n + j] = int8::dot_q4_k(&bytes[j * rb..(j + 1) * rb], &d, &q, &s);
                }
                let mut one = vec![0f32; n];
                let layout = int8::matmul(
                    &pool,
                    None,
                    KernelSet::Avx512Vnni,
                    xr,
                    1,
                    &view,
                    &mut one,
                    &mut Acts8::default(),
                )
                .expect("covered");
                crate::layout::scatter(&one, layout, 1, 0, &mut decode[r * n..(r + 1) * n]);
            }
            let largest = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, ((g, w), dec)) in got.iter().zip(&want).zip(&decode).enumerate() {
                let (r, j) = (i / n, i % n);
                for (what, other) in [("oracle", w), ("decode", dec)] {
                    assert!(
                        (g - other).abs() <= 1e-5 * largest,
                        "n {n} k {k} rows {rows}: ({r}, {j}) {g} vs {what} {other} (largest {largest})"
                    );
                }
            }
            assert!(largest > 0.0);
        }
    }
}
