//! The prefill product on Intel AMX tiles (`tdpbssd`/`tdpbusd`: 16 x 16 x 32 byte products per
//! instruction), for CPUs that have AMX-INT8 and an OS that grants the tile state.
//!
//! The arithmetic is exactly the 16-bit integer dots of the other sets. Each 16-bit activation
//! `x` is split into a signed high byte and an unsigned low byte, `x = 256 hi + lo` (exact for
//! every `i16`); a weight block (values of at most 8 bits: every covered format but `q6_k`, whose
//! 16-value sub-blocks go to the 512-bit tiles) is multiplied by both planes, and
//! `256 C_hi + C_lo` is the same integer block dot. So the products differ from the
//! `avx512_vnni` set's only where the sub-block scale of `q4_k`/`q5_k` is applied (here in
//! `f32`, to the block dot, there inside the integer) and in the order of the `f32` additions.
//!
//! Per block of 32 values, a tile of 16 activation rows by 32 weight rows (output columns):
//! two activation tiles (high and low planes, 16 x 32 bytes), two weight tiles (16 columns each,
//! 32 values in the "VNNI" layout of 8 rows of 16 x 4 bytes), four 16 x 16 `i32` results,
//! stored and scaled into `f32` accumulators with AVX-512 (the weight's block scale per column,
//! the activation's per row, the offsets of the `_1`/K formats through the block sums).
//!
//! All inline assembly of the CPU backend lives here; each block says why it is sound.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use super::{grow, Acts, Kind, Vnni, QK};

/// Output columns per panel: two result tiles of 16.
const COLS: usize = 32;
/// Activation rows per tile.
const ROWS: usize = 16;
/// Bytes of one block's weights in a panel: two tiles of 8 rows by 64 bytes.
const PANEL_BLOCK: usize = COLS * QK;

/// Proof that the CPU has AMX-TILE and AMX-INT8 besides [`Vnni`]'s features, and that the OS
/// granted this process the tile state; only [`Amx::detect`] makes one.
#[derive(Clone, Copy)]
pub(super) struct Amx(());

impl Amx {
    pub(super) fn detect() -> Option<Amx> {
        static GRANTED: OnceLock<bool> = OnceLock::new();
        let ok = *GRANTED.get_or_init(|| Vnni::detect().is_some() && cpu_has_amx() && os_grants_tiles());
        ok.then_some(Amx(()))
    }
}

/// CPUID leaf 7: AMX-TILE (EDX bit 24) and AMX-INT8 (bit 25).
fn cpu_has_amx() -> bool {
    let edx = cpuid7_edx();
    edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

/// EDX of CPUID leaf 7 (sub-leaf 0), where the AMX features are named; 0 where the CPU has no
/// leaf 7.
pub(super) fn cpuid7_edx() -> u32 {
    #[allow(unused_unsafe)]
    // SAFETY: `cpuid` exists on every x86-64 CPU; leaf 0 gives the highest leaf, checked
    // before leaf 7 is read.
    unsafe {
        if __cpuid(0).eax >= 7 {
            __cpuid_count(7, 0).edx
        } else {
            0
        }
    }
}

/// Linux hands out the tile data state only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`, once per process); without it the first tile instruction faults.
#[cfg(target_os = "linux")]
fn os_grants_tiles() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: this `arch_prctl` request takes two integers and touches no memory of ours; a
    // kernel without it returns an error, which is the answer.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn os_grants_tiles() -> bool {
    false
}

/// The 64-byte tile configuration that `ldtilecfg` reads (palette 1); the bfloat16 tiles
/// (`super::amx_bf16`) load one too.
#[repr(C, align(64))]
pub(super) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// Tiles 0 to 7 with these (bytes per row, rows); 8 to 15 unused.
    pub(super) fn of(tiles: [(u16, u8); 8]) -> TileConfig {
        let mut colsb = [0u16; 16];
        let mut rows = [0u8; 16];
        for (t, (c, r)) in tiles.into_iter().enumerate() {
            (colsb[t], rows[t]) = (c, r);
        }
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb,
            rows,
        }
    }

    /// Tiles 0 and 1: `m` activation rows of one block (32 bytes); 2 and 3: a block of 16
    /// columns' weights (8 rows of 64 bytes); 4 to 7: `m` rows of 16 `i32` results.
    fn for_rows(m: usize) -> TileConfig {
        let m = m.clamp(1, ROWS) as u8;
        let (act, weight, result) = ((QK as u16, m), (64, (QK / 4) as u8), (64, m));
        TileConfig::of([act, act, weight, weight, result, result, result, result])
    }
}

/// A task's weight panels in the tiles' layout, and the results of one block.
#[derive(Default)]
struct Panels {
    /// Per panel of [`COLS`] columns, per block: two tiles of 8 x 64 bytes.
    w: Vec<i8>,
    /// Per panel, per block: the [`COLS`] columns' scales.
    scale: Vec<f32>,
    /// Per panel, per block: the columns' offsets.
    bias: Vec<f32>,
    /// One unpacked row (values, scales, offsets).
    row: Vec<i16>,
    row_scale: Vec<f32>,
    row_bias: Vec<f32>,
}

thread_local! {
    static PANELS: RefCell<Panels> = RefCell::default();
}

/// Whether [`task`] covers `kind`: values of at most 8 bits with one scale per 32.
pub(super) fn covers(kind: Kind) -> bool {
    kind != Kind::Q6K
}

/// Fills `acts`' high and low byte planes (`256 hi + lo` is each value) for `rows` rows of `k`,
/// in the tiles' order: per 16 rows, per block of 32, the 16 rows' 32 bytes one after another
/// (so that a tile is 512 contiguous bytes); and each block's scale times its sum.
pub(super) fn split(acts: &mut Acts, pool: &rayon::ThreadPool, rows: usize, k: usize) {
    use rayon::prelude::*;
    let nb = k / QK;
    let tiles = rows.div_ceil(ROWS);
    let tile = nb * ROWS * QK;
    grow(&mut acts.hi, tiles * tile);
    grow(&mut acts.lo, tiles * tile);
    grow(&mut acts.ms, rows * nb);
    let (qs, hi, lo) = (
        &acts.qs[..rows * k],
        &mut acts.hi[..tiles * tile],
        &mut acts.lo[..tiles * tile],
    );
    let (d, sums, ms) = (
        &acts.d[..rows * nb],
        &acts.sums[..rows * nb],
        &mut acts.ms[..rows * nb],
    );
    pool.install(|| {
        hi.par_chunks_mut(tile)
            .zip(lo.par_chunks_mut(tile))
            .enumerate()
            .for_each(|(t, (h, l))| {
                for i in 0..ROWS.min(rows - t * ROWS) {
                    let q = &qs[(t * ROWS + i) * k..(t * ROWS + i + 1) * k];
                    for (b, q) in q.chunks_exact(QK).enumerate() {
                        let at = (b * ROWS + i) * QK;
                        for ((q, h), l) in q.iter().zip(&mut h[at..at + QK]).zip(&mut l[at..at + QK]) {
                            *h = (*q >> 8) as i8;
                            *l = *q as u8;
                        }
                    }
                }
            });
        ms.par_iter_mut()
            .zip(d.par_iter().zip(sums.par_iter()))
            .for_each(|(m, (d, s))| *m = d * *s as f32);
    });
    acts.planes = true;
}

/// [`super::gemm::task`] on AMX tiles (chosen by `super::prefill_task`): the products of weight
/// rows `j0..j0 + width` with activation rows `r0..r0 + dst.len() / width` into `dst`,
/// row-major. `acts` holds the byte planes ([`split`]) of those rows; `kind` is covered
/// ([`covers`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn task(
    amx: Amx,
    kind: Kind,
    bytes: &[u8],
    rb: usize,
    k: usize,
    acts: &Acts,
    r0: usize,
    j0: usize,
    width: usize,
    dst: &mut [f32],
) {
    let rows = dst.len() / width;
    let nb = k / QK;
    let panels = width.div_ceil(COLS);
    let tile = nb * ROWS * QK;
    assert!(
        covers(kind)
            && acts.planes
            && k.is_multiple_of(QK)
            && r0.is_multiple_of(ROWS)
            && acts.hi.len() >= (r0 + rows).div_ceil(ROWS) * tile
            && acts.lo.len() >= (r0 + rows).div_ceil(ROWS) * tile
            && acts.d.len() >= (r0 + rows) * nb
            && acts.ms.len() >= (r0 + rows) * nb
    );
    PANELS.with(|cell| {
        let mut p = cell.borrow_mut();
        let p = &mut *p;
        grow(&mut p.w, panels * nb * PANEL_BLOCK);
        grow(&mut p.scale, panels * nb * COLS);
        grow(&mut p.bias, panels * nb * COLS);
        grow(&mut p.row, k);
        grow(&mut p.row_scale, nb);
        grow(&mut p.row_bias, nb);
        for j in 0..panels * COLS {
            let (pi, c) = (j / COLS, j % COLS);
            let w = &mut p.w[pi * nb * PANEL_BLOCK..(pi + 1) * nb * PANEL_BLOCK];
            let scale = &mut p.scale[pi * nb * COLS..(pi + 1) * nb * COLS];
            let bias = &mut p.bias[pi * nb * COLS..(pi + 1) * nb * COLS];
            let (row, rs, rbias) = (&mut p.row[..k], &mut p.row_scale[..nb], &mut p.row_bias[..nb]);
            let weights = (j < width).then(|| &bytes[(j0 + j) * rb..(j0 + j + 1) * rb]);
            super::gemm::unpack_column::<false>(kind, weights, row, rs, rbias);
            for b in 0..nb {
                let mut v = [0i8; QK];
                for (o, &x) in v.iter_mut().zip(&row[QK * b..QK * b + QK]) {
                    // Every covered format's values fit a byte ([`covers`]).
                    *o = x as i8;
                }
                place(w, b, c, &v);
                scale[b * COLS + c] = rs[b];
                bias[b * COLS + c] = rbias[b];
            }
        }
        let has_bias = kind.has_bias();
        let mut r = 0;
        while r < rows {
            let m = (rows - r).min(ROWS);
            let cfg = TileConfig::for_rows(m);
            let at = (r0 + r) / ROWS * tile;
            let mut out = [[0f32; COLS]; ROWS];
            for pi in 0..panels {
                // SAFETY: the proof says the CPU has AMX-INT8 and AVX-512 and the OS granted
                // the tile state; the planes hold the tile of rows `r0 + r ..` (`nb` blocks of
                // 512 bytes, asserted above), the panel `nb` blocks of weights, scales and
                // offsets (grown above), the activations `nb` scales and scaled sums per row
                // (asserted), and `out` `m` rows.
                unsafe {
                    panel(
                        amx,
                        &cfg,
                        acts.hi[at..].as_ptr(),
                        acts.lo[at..].as_ptr(),
                        &p.w[pi * nb * PANEL_BLOCK..(pi + 1) * nb * PANEL_BLOCK],
                        &p.scale[pi * nb * COLS..(pi + 1) * nb * COLS],
                        &p.bias[pi * nb * COLS..(pi + 1) * nb * COLS],
                        &acts.d[(r0 + r) * nb..(r0 + r + m) * nb],
                        &acts.ms[(r0 + r) * nb..(r0 + r + m) * nb],
                        nb,
                        m,
                        has_bias,
                        &mut out,
                    )
                };
                super::gemm::store_tile(dst, width, r, pi * COLS, &out[..m]);
            }
            r += m;
        }
        // SAFETY: returns the tile state to its initial form; valid after any tile use, and
        // this thread's next task loads its configuration again.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    });
}

/// Places column `c`'s values of block `b` in the panel's tile layout: value `4g + t` at row
/// `g`, byte `4 (c % 16) + t` of tile `c / 16`.
fn place(w: &mut [i8], b: usize, c: usize, v: &[i8; QK]) {
    let tile = &mut w[b * PANEL_BLOCK + (c / 16) * (PANEL_BLOCK / 2)..][..PANEL_BLOCK / 2];
    for (g, four) in v.chunks_exact(4).enumerate() {
        let at = g * 64 + 4 * (c % 16);
        tile[at..at + 4].copy_from_slice(four);
    }
}

/// One panel of [`COLS`] columns by `m` activation rows over `nb` blocks, into `out`.
///
/// # Safety
/// The CPU has AMX-INT8 and AVX-512 F/BW/VNNI and the OS granted the tile state (`_amx`);
/// `hi` and `lo` point at `nb` tiles of 512 bytes (`m` rows of 32 used); `w` holds
/// `nb * PANEL_BLOCK` bytes, `scale` and `bias` `nb * COLS` values, `d` and `ms` `m * nb`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
unsafe fn panel(
    _amx: Amx,
    cfg: &TileConfig,
    hi: *const i8,
    lo: *const u8,
    w: &[i8],
    scale: &[f32],
    bias: &[f32],
    d: &[f32],
    ms: &[f32],
    nb: usize,
    m: usize,
    has_bias: bool,
    out: &mut [[f32; COLS]; ROWS],
) {
    debug_assert!(w.len() >= nb * PANEL_BLOCK && scale.len() >= nb * COLS && d.len() >= m * nb);
    let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
    // Four 16 x 16 `i32` results: column tile 0 high and low, tile 1 high and low.
    let mut c = [[0i32; 256]; 4];
    let cp = c.as_mut_ptr() as *mut i32;
    // SAFETY: `cfg` is a valid palette-1 configuration (`TileConfig::for_rows`), 64 bytes,
    // 64-aligned.
    unsafe { asm!("ldtilecfg [{}]", in(reg) cfg as *const TileConfig, options(nostack, readonly)) };
    for b in 0..nb {
        // Column tile 0's products are stored while tile 1's run, and read out while tile 1's
        // are stored.
        // SAFETY: the activation tiles read `m` rows of 32 bytes at `b * 512`, 32 apart,
        // within the planes; the weight tiles 8 rows of 64 bytes at `b * PANEL_BLOCK` and 512
        // further, within `w`; the stores write 2 x `m` rows of 64 bytes into `c` (4 x 1 KiB).
        unsafe {
            asm!(
                "tilezero tmm4",
                "tilezero tmm5",
                "tilezero tmm6",
                "tilezero tmm7",
                "tileloadd tmm0, [{hi} + {a} * 1]",
                "tileloadd tmm1, [{lo} + {a} * 1]",
                "tileloadd tmm2, [{w0} + {s} * 1]",
                "tileloadd tmm3, [{w1} + {s} * 1]",
                "tdpbssd tmm4, tmm0, tmm2",
                "tdpbusd tmm5, tmm1, tmm2",
                "tdpbssd tmm6, tmm0, tmm3",
                "tdpbusd tmm7, tmm1, tmm3",
                "tilestored [{c0} + {s} * 1], tmm4",
                "tilestored [{c1} + {s} * 1], tmm5",
                hi = in(reg) hi.add(b * ROWS * QK),
                lo = in(reg) lo.add(b * ROWS * QK),
                a = in(reg) QK,
                w0 = in(reg) w.as_ptr().add(b * PANEL_BLOCK),
                w1 = in(reg) w.as_ptr().add(b * PANEL_BLOCK + PANEL_BLOCK / 2),
                s = in(reg) 64usize,
                c0 = in(reg) cp,
                c1 = in(reg) cp.add(256),
                options(nostack),
            )
        };
        for t in 0..2 {
            if t == 1 {
                // SAFETY: as above, the second pair of results.
                unsafe {
                    asm!(
                        "tilestored [{c2} + {s} * 1], tmm6",
                        "tilestored [{c3} + {s} * 1], tmm7",
                        s = in(reg) 64usize,
                        c2 = in(reg) cp.add(512),
                        c3 = in(reg) cp.add(768),
                        options(nostack),
                    )
                };
            }
            // SAFETY: `b < nb`: 32 scales and offsets at `32 b`; rows `r < m` of the results
            // and `r * nb + b < m * nb` of `d` and `ms`.
            unsafe {
                let sv = _mm512_loadu_ps(scale.as_ptr().add(COLS * b + 16 * t));
                let bv = _mm512_loadu_ps(bias.as_ptr().add(COLS * b + 16 * t));
                let ch = cp.add(512 * t);
                for (r, acc) in acc.iter_mut().enumerate().take(m) {
                    let h = _mm512_loadu_si512(ch.add(16 * r) as *const __m512i);
                    let l = _mm512_loadu_si512(ch.add(256 + 16 * r) as *const __m512i);
                    let v = _mm512_add_epi32(_mm512_slli_epi32::<8>(h), l);
                    let dv = _mm512_set1_ps(*d.get_unchecked(r * nb + b));
                    acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), sv), dv, acc[t]);
                    if has_bias {
                        let mv = _mm512_set1_ps(*ms.get_unchecked(r * nb + b));
                        acc[t] = _mm512_fnmadd_ps(bv, mv, acc[t]);
                    }
                }
            }
        }
    }
    for (o, a) in out.iter_mut().zip(&acc).take(m) {
        let (lo, hi) = o.split_at_mut(16);
        // SAFETY: each half holds 16 `f32`.
        unsafe {
            _mm512_storeu_ps(lo.as_mut_ptr(), a[0]);
            _mm512_storeu_ps(hi.as_mut_ptr(), a[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::tests::{random_acts, random_rows};
    use crate::fast::KernelSet;

    /// `256 hi + lo` gives back every 16-bit value, on the planes `split` writes.
    #[test]
    fn byte_planes_give_back_every_value() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let (rows, k) = (9usize, 64usize);
        let mut acts = Acts::default();
        let all: Vec<i16> = (i16::MIN..=i16::MAX)
            .step_by(113)
            .chain([i16::MIN, -1, 0, 255, 256, i16::MAX])
            .collect();
        acts.qs = (0..rows * k).map(|i| all[i % all.len()]).collect();
        acts.d = vec![0.5; rows * k / QK];
        acts.sums = (0..rows * k / QK).map(|i| i as i32 - 7).collect();
        split(&mut acts, &pool, rows, k);
        assert!(acts.planes);
        for (i, m) in acts.ms[..rows * k / QK].iter().enumerate() {
            assert_eq!(*m, 0.5 * (i as f32 - 7.0));
        }
        let nb = k / QK;
        for (i, &q) in acts.qs[..rows * k].iter().enumerate() {
            let (r, e) = (i / k, i % k);
            let at = ((r / ROWS * nb + e / QK) * ROWS + r % ROWS) * QK + e % QK;
            assert_eq!(
                256 * i32::from(acts.hi[at]) + i32::from(acts.lo[at]),
                i32::from(q),
                "value {i}"
            );
        }
    }

    /// The configuration pairs each product's shapes: activation bytes per row equal 4 times
    /// the weight tile's rows, results as many rows as the activations and 16 `i32` wide.
    #[test]
    fn tile_configuration_matches_the_products() {
        for m in [1, 7, 16, 40] {
            let c = TileConfig::for_rows(m);
            assert_eq!(c.palette, 1);
            assert_eq!(usize::from(c.colsb[0]), 4 * usize::from(c.rows[2]));
            for t in [4, 5, 6, 7] {
                assert_eq!(c.rows[t], c.rows[0]);
                assert_eq!(c.colsb[t], c.colsb[2]);
            }
            assert_eq!(usize::from(c.rows[0]), m.min(ROWS));
            assert_eq!(std::mem::size_of::<TileConfig>(), 64);
        }
    }

    /// Where the CPU has AMX: the tiles' products equal the 512-bit VNNI tiles' (the same
    /// integer block dots) within float rounding, for every covered format, on a partial panel
    /// (37 columns) and a full plus a partial row tile (21 rows). Elsewhere, the set is
    /// reported unavailable.
    #[test]
    fn amx_products_match_the_vnni_tiles() {
        let Some(_) = Amx::detect() else {
            assert!(!KernelSet::Amx.available());
            eprintln!("no AMX here: the AMX products were not run");
            return;
        };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut seed = 11u64;
        for kind in crate::fast::tests::ALL_KINDS.into_iter().filter(|k| covers(*k)) {
            let (n, k, rows) = (37usize, 512usize, 21usize);
            let rb = k / kind.block() * kind.block_bytes();
            let bytes = random_rows(kind, n, k, &mut seed);
            let x = random_acts(rows * k, &mut seed);
            let mut acts = Acts::default();
            assert!(acts.quantize(&pool, None, &x, rows, k));
            let mut vnni = vec![0f32; n * rows];
            super::super::gemm::task(
                kind,
                KernelSet::Avx512Vnni,
                &bytes,
                rb,
                k,
                &acts,
                0,
                0,
                n,
                &mut vnni,
            );
            split(&mut acts, &pool, rows, k);
            let mut tiles = vec![0f32; n * rows];
            super::super::prefill_task(kind, KernelSet::Amx, &bytes, rb, k, &acts, 0, 0, n, &mut tiles);
            let scale = vnni.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(scale > 0.0, "{kind:?}: all zero");
            for (i, (a, b)) in vnni.iter().zip(&tiles).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * scale,
                    "{kind:?} value {i}: vnni {a}, amx {b}"
                );
            }
        }
    }
}
