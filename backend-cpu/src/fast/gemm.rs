//! The prefill product (many activation rows): each weight row is unpacked once per task into
//! `i16` values (with the format's integer sub-block scales folded in) and an `f32` scale per
//! block of [`QK`], then register tiles run integer dots over it for every activation row of
//! the task. A task covers a panel of weight rows (output columns) and a block of activation
//! rows, and writes its part of the product row-major ([`crate::layout::Layout::Panels`]),
//! so that the copy into each output is a run of contiguous values per row.
//!
//! Two tile shapes:
//! - With vectors (`avx512_vnni`, `avx512`, `avx2`): outer products. The unpacked weights are
//!   interleaved so that one vector holds a pair of consecutive values of 16 (AVX2: 8) weight
//!   rows; a pair of activation values is broadcast, and `vpdpwssd` (or `vpmaddwd` and an add)
//!   accumulates the pairs' products into one lane per output column. A 512-bit tile is
//!   [`PANEL`] columns by [`MR`] activation rows: 12 integer accumulators, converted and scaled
//!   into 12 `f32` ones once per block (every 16 values for `q6_k`, whose largest products would
//!   overflow 32 bits over a whole block); a 256-bit one 16 columns by 3 rows. No horizontal
//!   sums.
//! - Scalar: dot products along `k`, [`WR`] weight rows by [`AR`] activation rows.
//!
//! The arithmetic is the fused kernels' (`super::scalar`): the same integer products per block
//! (here with the sub-block scale inside the integer, which is exact: the largest unpacked value
//! is 32 * 128 for `q6_k`, 16 of whose products with 16-bit activations stay below 2^31, and
//! 31 * 63 for `q5_k`, 32 of whose do), scaled by the same `f32` factors; only the order of the
//! `f32` additions differs.

use std::cell::RefCell;

use super::{f16_at, grow, k_scale_min, Acts, KernelSet, Kind, QK};

/// Weight rows per tile of the scalar product.
pub(super) const WR: usize = 2;
/// Activation rows per tile of the scalar product.
pub(super) const AR: usize = 4;
/// Weight rows (output columns) per interleaved panel of the AVX-512 product: two vectors of 16.
pub(super) const PANEL: usize = 32;
/// Activation rows per register tile of the AVX-512 product.
const MR: usize = 6;
/// Activation rows whose quantized blocks stay in cache while the scalar tiles pass over them
/// (64 rows of `k = 6912` in 16 bits: 864 KiB, within a core's L2 on current x86).
const ROW_BLOCK: usize = 64;
/// The most weight rows a task unpacks at once (a multiple of [`PANEL`] and of [`WR`]).
pub(super) const MAX_TASK_ROWS: usize = 64;

/// A task's unpacked weight rows.
#[derive(Default)]
pub(super) struct Unpacked {
    /// `rows * k` values (interleaved in panels for the AVX-512 product).
    w: Vec<i16>,
    /// `rows * k / QK` block scales.
    scale: Vec<f32>,
    /// `rows * k / QK` block offsets (`q4_k`'s `dmin * min`), subtracted times the activation
    /// block's scale and sum.
    bias: Vec<f32>,
    /// One row of `k` values, before interleaving.
    row: Vec<i16>,
    /// One row's scales, before interleaving.
    row_scale: Vec<f32>,
    /// One row's offsets, before interleaving.
    row_bias: Vec<f32>,
}

thread_local! {
    static UNPACKED: RefCell<Unpacked> = RefCell::default();
}

/// Grows the calling thread's unpacked-weight storage for rows of `k` values.
pub(super) fn reserve(k: usize) {
    UNPACKED.with(|cell| {
        let mut u = cell.borrow_mut();
        grow(&mut u.w, MAX_TASK_ROWS * k);
        grow(&mut u.scale, MAX_TASK_ROWS * k / QK);
        grow(&mut u.bias, MAX_TASK_ROWS * k / QK);
        grow(&mut u.row, k);
        grow(&mut u.row_scale, k / QK);
        grow(&mut u.row_bias, k / QK);
    });
}

/// One panel column: weight row `row` unpacked as [`unpack`] does, or zeros where the panel runs
/// past the last weight row (`None`; those columns are never written out).
pub(super) fn unpack_column<const FOLD: bool>(
    kind: Kind,
    row: Option<&[u8]>,
    w: &mut [i16],
    scale: &mut [f32],
    bias: &mut [f32],
) {
    match row {
        Some(row) => unpack::<FOLD>(kind, row, w, scale, bias),
        None => {
            w.fill(0);
            scale.fill(0.0);
            bias.fill(0.0);
        }
    }
}

/// Unpacks one weight row of `kind` (whole blocks) into `w` (`k` values), `scale` and `bias`
/// (`k / QK` each). With `FOLD`, the integer sub-block scales of `q4_k` and `q5_k` multiply the
/// values; without it (values of at most 8 bits, for the AMX tiles) they multiply the block's
/// `f32` scale.
#[inline(always)]
pub(super) fn unpack<const FOLD: bool>(
    kind: Kind,
    row: &[u8],
    w: &mut [i16],
    scale: &mut [f32],
    bias: &mut [f32],
) {
    match kind {
        Kind::Q8_0 => {
            for (b, blk) in row.chunks_exact(34).enumerate() {
                scale[b] = f16_at(blk, 0);
                bias[b] = 0.0;
                for (o, &q) in w[32 * b..32 * b + 32].iter_mut().zip(&blk[2..34]) {
                    *o = i16::from(q as i8);
                }
            }
        }
        Kind::Q5_0 => {
            for (b, blk) in row.chunks_exact(22).enumerate() {
                scale[b] = f16_at(blk, 0);
                bias[b] = 0.0;
                let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                let (lo, hi) = w[32 * b..32 * b + 32].split_at_mut(16);
                for (j, &q) in blk[6..22].iter().enumerate() {
                    let h0 = ((qh >> j) & 1) as u8;
                    let h1 = ((qh >> (j + 16)) & 1) as u8;
                    lo[j] = i16::from((q & 0x0F) | (h0 << 4)) - 16;
                    hi[j] = i16::from((q >> 4) | (h1 << 4)) - 16;
                }
            }
        }
        Kind::Q4K => {
            for (b, blk) in row.chunks_exact(144).enumerate() {
                let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                let packed = &blk[4..16];
                let qs = &blk[16..144];
                for c in 0..4 {
                    let q = &qs[32 * c..32 * c + 32];
                    let (s0, m0) = k_scale_min(packed, 2 * c);
                    let (s1, m1) = k_scale_min(packed, 2 * c + 1);
                    let (j0, j1) = (8 * b + 2 * c, 8 * b + 2 * c + 1);
                    bias[j0] = dmin * f32::from(m0);
                    bias[j1] = dmin * f32::from(m1);
                    let (s0, s1) = fold::<FOLD>(d, s0, s1, &mut scale[j0..=j1]);
                    let (lo, hi) = w[32 * j0..32 * j0 + 64].split_at_mut(32);
                    for (l, &v) in q.iter().enumerate() {
                        lo[l] = i16::from(v & 0x0F) * s0;
                        hi[l] = i16::from(v >> 4) * s1;
                    }
                }
            }
        }
        Kind::Q4_0 | Kind::Q4_1 => {
            let (bytes, qs_at) = if kind == Kind::Q4_0 { (18, 2) } else { (20, 4) };
            for (b, blk) in row.chunks_exact(bytes).enumerate() {
                scale[b] = f16_at(blk, 0);
                // `q4_1`: value `d q + m`, so `m` times the activation sum is added (a negative
                // offset); `q4_0`: `d (q - 8)`.
                bias[b] = if kind == Kind::Q4_1 { -f16_at(blk, 2) } else { 0.0 };
                let off = if kind == Kind::Q4_0 { 8 } else { 0 };
                let (lo, hi) = w[32 * b..32 * b + 32].split_at_mut(16);
                for (j, &q) in blk[qs_at..qs_at + 16].iter().enumerate() {
                    lo[j] = i16::from(q & 0x0F) - off;
                    hi[j] = i16::from(q >> 4) - off;
                }
            }
        }
        Kind::Q5_1 => {
            for (b, blk) in row.chunks_exact(24).enumerate() {
                scale[b] = f16_at(blk, 0);
                bias[b] = -f16_at(blk, 2);
                let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
                let (lo, hi) = w[32 * b..32 * b + 32].split_at_mut(16);
                for (j, &q) in blk[8..24].iter().enumerate() {
                    let h0 = ((qh >> j) & 1) as u8;
                    let h1 = ((qh >> (j + 16)) & 1) as u8;
                    lo[j] = i16::from((q & 0x0F) | (h0 << 4));
                    hi[j] = i16::from((q >> 4) | (h1 << 4));
                }
            }
        }
        Kind::Q5K => {
            for (b, blk) in row.chunks_exact(176).enumerate() {
                let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                let packed = &blk[4..16];
                let qh = &blk[16..48];
                let qs = &blk[48..176];
                for c in 0..4 {
                    let q = &qs[32 * c..32 * c + 32];
                    let (s0, m0) = k_scale_min(packed, 2 * c);
                    let (s1, m1) = k_scale_min(packed, 2 * c + 1);
                    let (j0, j1) = (8 * b + 2 * c, 8 * b + 2 * c + 1);
                    bias[j0] = dmin * f32::from(m0);
                    bias[j1] = dmin * f32::from(m1);
                    let (s0, s1) = fold::<FOLD>(d, s0, s1, &mut scale[j0..=j1]);
                    let (u0, u1) = (1u8 << (2 * c), 2u8 << (2 * c));
                    let (lo, hi) = w[32 * j0..32 * j0 + 64].split_at_mut(32);
                    for (l, (&v, &h)) in q.iter().zip(qh).enumerate() {
                        let h0 = if h & u0 != 0 { 16 } else { 0 };
                        let h1 = if h & u1 != 0 { 16 } else { 0 };
                        lo[l] = (i16::from(v & 0x0F) + h0) * s0;
                        hi[l] = (i16::from(v >> 4) + h1) * s1;
                    }
                }
            }
        }
        Kind::Q6K => {
            for (b, blk) in row.chunks_exact(210).enumerate() {
                let d = f16_at(blk, 208);
                let scales = &blk[192..208];
                for half in 0..2 {
                    let ql = &blk[64 * half..64 * half + 64];
                    let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
                    for s in 0..4 {
                        let ab = 8 * b + 4 * half + s;
                        scale[ab] = d;
                        bias[ab] = 0.0;
                        let out = &mut w[32 * ab..32 * ab + 32];
                        for sub in 0..2 {
                            let sc = i16::from(scales[8 * half + 2 * s + sub] as i8);
                            for l in 16 * sub..16 * sub + 16 {
                                let low = if s < 2 {
                                    ql[l + 32 * s] & 0x0F
                                } else {
                                    ql[l + 32 * (s - 2)] >> 4
                                };
                                let v = i16::from(low | (((qh[l] >> (2 * s)) & 3) << 4)) - 32;
                                out[l] = v * sc;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The block scales of a pair of K-format sub-blocks (`d` times the sub-block scales `s0`, `s1`
/// unless `FOLD`) and the integer factors of their values (the sub-block scales if `FOLD`, else 1).
#[inline(always)]
fn fold<const FOLD: bool>(d: f32, s0: u8, s1: u8, scale: &mut [f32]) -> (i16, i16) {
    if FOLD {
        scale[0] = d;
        scale[1] = d;
        (i16::from(s0), i16::from(s1))
    } else {
        scale[0] = d * f32::from(s0);
        scale[1] = d * f32::from(s1);
        (1, 1)
    }
}

/// Writes a tile's results `out` (one array per activation row from row `r`, columns from
/// `col0`) into a task's row-major `dst` of `width` columns, leaving out the columns past it.
pub(super) fn store_tile<const P: usize>(
    dst: &mut [f32],
    width: usize,
    r: usize,
    col0: usize,
    out: &[[f32; P]],
) {
    let cols = (width - col0).min(P);
    for (i, o) in out.iter().enumerate() {
        let at = (r + i) * width + col0;
        dst[at..at + cols].copy_from_slice(&o[..cols]);
    }
}

/// One unpacked weight row.
#[derive(Clone, Copy)]
pub(super) struct WRow<'a> {
    pub(super) w: &'a [i16],
    pub(super) scale: &'a [f32],
    pub(super) bias: &'a [f32],
}

/// Writes the products of weight rows `j0..j0 + width` (bytes `rb` each in `bytes`) with
/// activation rows `r0..r0 + dst.len() / width` of `acts` into `dst`, row-major (`width`
/// values per activation row), in `set`'s vector tiles (the `amx` set's 512-bit ones: the AMX
/// tiles are chosen before, by `super::prefill_task`) or the scalar ones.
#[allow(clippy::too_many_arguments)]
pub(super) fn task(
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
    {
        let proof = match (set.vnni(), set.wide(), set.simd()) {
            (Some(v), _, _) => Some(wide::Proof::Vnni(v)),
            (None, Some(w), _) => Some(wide::Proof::Wide(w)),
            (None, None, Some(s)) => Some(wide::Proof::Avx2(s)),
            _ => None,
        };
        if let Some(proof) = proof {
            return wide::task(proof, kind, bytes, rb, k, acts, r0, j0, width, dst);
        }
    }
    let rows = dst.len() / width;
    let n = width;
    let nb = k / QK;
    UNPACKED.with(|cell| {
        let mut u = cell.borrow_mut();
        grow(&mut u.w, n * k);
        grow(&mut u.scale, n * nb);
        grow(&mut u.bias, n * nb);
        let Unpacked { w, scale, bias, .. } = &mut *u;
        for j in 0..n {
            let row = &bytes[(j0 + j) * rb..(j0 + j + 1) * rb];
            unpack::<true>(
                kind,
                row,
                &mut w[j * k..(j + 1) * k],
                &mut scale[j * nb..(j + 1) * nb],
                &mut bias[j * nb..(j + 1) * nb],
            );
        }
        let wrow = |j: usize| WRow {
            w: &w[j * k..(j + 1) * k],
            scale: &scale[j * nb..(j + 1) * nb],
            bias: &bias[j * nb..(j + 1) * nb],
        };
        let has_bias = kind.has_bias();
        for b0 in (0..rows).step_by(ROW_BLOCK) {
            let b1 = (b0 + ROW_BLOCK).min(rows);
            let mut j = 0;
            while j < n {
                let wn = (n - j).min(WR);
                let ws = [wrow(j), wrow((j + 1).min(n - 1))];
                let mut r = b0;
                while r < b1 {
                    let an = (b1 - r).min(AR);
                    let mut out = [[0f32; AR]; WR];
                    tile(&ws[..wn], acts, r0 + r, an, k, &mut out);
                    for (wi, o) in out.iter().enumerate().take(wn) {
                        for (ai, v) in o.iter().enumerate().take(an) {
                            let mut v = *v;
                            if has_bias {
                                v -= bias_term(ws[wi].bias, acts, r0 + r + ai, k);
                            }
                            dst[(r + ai) * width + j + wi] = v;
                        }
                    }
                    r += an;
                }
                j += wn;
            }
        }
    });
}

/// `sum_b bias[b] * d_a[b] * sum_a[b]` for activation row `r`.
fn bias_term(bias: &[f32], acts: &Acts, r: usize, k: usize) -> f32 {
    let a = acts.row(r, k);
    bias.iter()
        .zip(a.d)
        .zip(a.sums)
        .map(|((b, d), s)| b * d * *s as f32)
        .sum()
}

/// The scaled integer dots of up to [`WR`] weight rows with activation rows `r..r + an`.
fn tile(ws: &[WRow], acts: &Acts, r: usize, an: usize, k: usize, out: &mut [[f32; AR]; WR]) {
    for (wi, wr) in ws.iter().enumerate() {
        for (ai, o) in out[wi].iter_mut().enumerate().take(an) {
            let a = acts.row(r + ai, k);
            let mut acc = 0f32;
            for b in 0..k / QK {
                let isum: i64 = wr.w[QK * b..QK * b + QK]
                    .iter()
                    .zip(&a.qs[QK * b..QK * b + QK])
                    .map(|(&x, &y)| i64::from(x) * i64::from(y))
                    .sum();
                acc += (wr.scale[b] * a.d[b]) * isum as f32;
            }
            *o = acc;
        }
    }
}

/// The outer-product tiles over interleaved panels: 512-bit (AVX-512) and 256-bit (AVX2).
#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::*;

    use super::super::{ActRow, Simd, Vnni, Wide};
    use super::*;

    /// Which integer dot the CPU was found to have.
    #[derive(Clone, Copy)]
    pub(super) enum Proof {
        /// 256-bit `vpmaddwd` and `vpaddd`: panels of 16 columns, tiles of 3 rows (16 vector
        /// registers).
        Avx2(Simd),
        /// 512-bit `vpmaddwd` and `vpaddd`.
        Wide(Wide),
        /// `vpdpwssd`.
        Vnni(Vnni),
    }

    /// [`super::task`] with vectors: weight rows unpacked into panels of [`PANEL`] (AVX2: 16)
    /// interleaved rows, then tiles of [`MR`] (AVX2: 3) activation rows by one panel.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn task(
        proof: Proof,
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
        match proof {
            Proof::Avx2(_) => task_in::<16, 3>(proof, kind, bytes, rb, k, acts, r0, j0, width, dst),
            _ => task_in::<PANEL, MR>(proof, kind, bytes, rb, k, acts, r0, j0, width, dst),
        }
    }

    /// [`task`] with panels of `P` columns and tiles of `M` rows.
    #[allow(clippy::too_many_arguments)]
    fn task_in<const P: usize, const M: usize>(
        proof: Proof,
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
        let panels = width.div_ceil(P);
        UNPACKED.with(|cell| {
            let mut u = cell.borrow_mut();
            let u = &mut *u;
            grow(&mut u.w, panels * P * k);
            grow(&mut u.scale, panels * P * nb);
            grow(&mut u.bias, panels * P * nb);
            grow(&mut u.row, k);
            grow(&mut u.row_scale, nb);
            grow(&mut u.row_bias, nb);
            for j in 0..panels * P {
                let (row, rs, rbias) = (&mut u.row[..k], &mut u.row_scale[..nb], &mut u.row_bias[..nb]);
                let weights = (j < width).then(|| &bytes[(j0 + j) * rb..(j0 + j + 1) * rb]);
                unpack_column::<true>(kind, weights, row, rs, rbias);
                interleave::<P>(j, row, rs, rbias, &mut u.w, &mut u.scale, &mut u.bias, k);
            }
            let (w, scale, bias) = (&u.w, &u.scale, &u.bias);
            let has_bias = kind.has_bias();
            let mut r = 0;
            while r < rows {
                let an = (rows - r).min(M);
                let a: [ActRow; M] = std::array::from_fn(|i| acts.row(r0 + r + i.min(an - 1), k));
                for p in 0..panels {
                    let pw = &w[p * P * k..(p + 1) * P * k];
                    let ps = &scale[p * P * nb..(p + 1) * P * nb];
                    let pb = &bias[p * P * nb..(p + 1) * P * nb];
                    let mut out = [[0f32; P]; M];
                    tile::<P, M>(proof, kind == Kind::Q6K, has_bias, pw, ps, pb, &a, nb, &mut out);
                    store_tile(dst, width, r, p * P, &out[..an]);
                }
                r += an;
            }
        });
    }

    /// Places unpacked row `j` of a task (its values, scales and offsets) in the interleaved
    /// panels of `P` rows (vectors of `P / 2` lanes): value pair `q` of panel row `l` at
    /// `(2q + l / (P / 2)) * P + 2 (l % (P / 2))`, block `b`'s scale at
    /// `(2b + l / (P / 2)) * (P / 2) + l % (P / 2)`.
    #[allow(clippy::too_many_arguments)]
    fn interleave<const P: usize>(
        j: usize,
        row: &[i16],
        rs: &[f32],
        rbias: &[f32],
        w: &mut [i16],
        scale: &mut [f32],
        bias: &mut [f32],
        k: usize,
    ) {
        let nb = k / QK;
        let lanes = P / 2;
        let (p, l) = (j / P, j % P);
        let (v, lane) = (l / lanes, l % lanes);
        let pw = &mut w[p * P * k..(p + 1) * P * k];
        for (q, pair) in row.chunks_exact(2).enumerate() {
            let at = (2 * q + v) * P + 2 * lane;
            pw[at..at + 2].copy_from_slice(pair);
        }
        let ps = &mut scale[p * P * nb..(p + 1) * P * nb];
        let pb = &mut bias[p * P * nb..(p + 1) * P * nb];
        for b in 0..nb {
            let at = (2 * b + v) * lanes + lane;
            ps[at] = rs[b];
            pb[at] = rbias[b];
        }
    }

    /// One tile: the products of a panel of `P` columns with the `M` activation rows `a`, into
    /// `out` (`[row][column]`).
    #[allow(clippy::too_many_arguments)]
    fn tile<const P: usize, const M: usize>(
        proof: Proof,
        halves: bool,
        has_bias: bool,
        w: &[i16],
        scale: &[f32],
        bias: &[f32],
        a: &[ActRow; M],
        nb: usize,
        out: &mut [[f32; P]; M],
    ) {
        let k = nb * QK;
        assert!(
            w.len() >= P * k
                && scale.len() >= P * nb
                && bias.len() >= P * nb
                && a.iter()
                    .all(|r| r.qs.len() >= k && r.d.len() >= nb && r.sums.len() >= nb)
                && (P, M)
                    == if matches!(proof, Proof::Avx2(_)) {
                        (16, 3)
                    } else {
                        (PANEL, MR)
                    }
        );
        let o = out.as_flattened_mut();
        // SAFETY: (every arm) the proof exists only where its features were detected at run
        // time; the lengths the kernel reads within, and the tile's shape, are checked above.
        unsafe {
            match (proof, halves, has_bias) {
                (Proof::Vnni(_), false, false) => vnni::<16, false>(w, scale, bias, a, nb, o),
                (Proof::Vnni(_), false, true) => vnni::<16, true>(w, scale, bias, a, nb, o),
                (Proof::Vnni(_), true, _) => vnni::<8, false>(w, scale, bias, a, nb, o),
                (Proof::Wide(_), false, false) => madd::<16, false>(w, scale, bias, a, nb, o),
                (Proof::Wide(_), false, true) => madd::<16, true>(w, scale, bias, a, nb, o),
                (Proof::Wide(_), true, _) => madd::<8, false>(w, scale, bias, a, nb, o),
                (Proof::Avx2(_), false, false) => avx2::<16, false>(w, scale, bias, a, nb, o),
                (Proof::Avx2(_), false, true) => avx2::<16, true>(w, scale, bias, a, nb, o),
                (Proof::Avx2(_), true, _) => avx2::<8, false>(w, scale, bias, a, nb, o),
            }
        }
    }

    /// Defines a tile kernel with target features `$features`, whose integer step
    /// `acc += w * x` (pairs of 16-bit values into 32-bit lanes) is `$dp`.
    macro_rules! kernel {
        ($(#[$doc:meta])* $name:ident, $features:literal, |$acc:ident, $w:ident, $x:ident| $dp:expr) => {
            $(#[$doc])*
            ///
            /// # Safety
            /// The CPU has the features named; `w` holds `PANEL * nb * QK` values, `scale` and
            /// `bias` `PANEL * nb`, `a` `MR` rows of `nb * QK` values and `nb` scales and sums,
            /// `out` `MR * PANEL` values.
            #[target_feature(enable = $features)]
            unsafe fn $name<const SEG: usize, const BIAS: bool>(
                w: &[i16],
                scale: &[f32],
                bias: &[f32],
                a: &[ActRow],
                nb: usize,
                out: &mut [f32],
            ) {
                let mut acc = [[_mm512_setzero_ps(); MR]; 2];
                let wp = w.as_ptr();
                for b in 0..nb {
                    for s in 0..16 / SEG {
                        let mut ia = [[_mm512_setzero_si512(); MR]; 2];
                        for p in 0..SEG {
                            // Value pair `kp` of the row: 16 pairs per block of `QK`.
                            let kp = 16 * b + SEG * s + p;
                            // SAFETY: `kp < nb * QK / 2`, so both vectors lie within `w`
                            // (`PANEL * nb * QK` values), and the pair within each row of `a`.
                            let (w0, w1) = unsafe {
                                (
                                    _mm512_loadu_si512(wp.add(64 * kp) as *const __m512i),
                                    _mm512_loadu_si512(wp.add(64 * kp + 32) as *const __m512i),
                                )
                            };
                            for r in 0..MR {
                                // SAFETY: as above.
                                let pair = unsafe {
                                    std::ptr::read_unaligned(a[r].qs.as_ptr().add(2 * kp) as *const i32)
                                };
                                let $x = _mm512_set1_epi32(pair);
                                {
                                    let ($acc, $w) = (ia[0][r], w0);
                                    ia[0][r] = $dp;
                                }
                                {
                                    let ($acc, $w) = (ia[1][r], w1);
                                    ia[1][r] = $dp;
                                }
                            }
                        }
                        // SAFETY: `b < nb`: 32 scales at `32 b` within `scale`.
                        let (s0, s1) = unsafe {
                            (
                                _mm512_loadu_ps(scale.as_ptr().add(32 * b)),
                                _mm512_loadu_ps(scale.as_ptr().add(32 * b + 16)),
                            )
                        };
                        for r in 0..MR {
                            let d = _mm512_set1_ps(a[r].d[b]);
                            let v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(ia[0][r]), s0);
                            let v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(ia[1][r]), s1);
                            acc[0][r] = _mm512_fmadd_ps(v0, d, acc[0][r]);
                            acc[1][r] = _mm512_fmadd_ps(v1, d, acc[1][r]);
                        }
                    }
                    if BIAS {
                        // SAFETY: as for the scales.
                        let (b0, b1) = unsafe {
                            (
                                _mm512_loadu_ps(bias.as_ptr().add(32 * b)),
                                _mm512_loadu_ps(bias.as_ptr().add(32 * b + 16)),
                            )
                        };
                        for r in 0..MR {
                            let m = _mm512_set1_ps(a[r].d[b] * a[r].sums[b] as f32);
                            acc[0][r] = _mm512_fnmadd_ps(b0, m, acc[0][r]);
                            acc[1][r] = _mm512_fnmadd_ps(b1, m, acc[1][r]);
                        }
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
        };
    }

    kernel!(
        /// The tile with `vpdpwssd` (AVX-512 VNNI).
        vnni,
        "avx512f,avx512bw,avx512vnni,avx2,fma,f16c",
        |acc, w, x| _mm512_dpwssd_epi32(acc, w, x)
    );
    kernel!(
        /// The tile with `vpmaddwd` and `vpaddd` (AVX-512 BW).
        madd,
        "avx512f,avx512bw,avx2,fma,f16c",
        |acc, w, x| _mm512_add_epi32(acc, _mm512_madd_epi16(w, x))
    );

    /// The 256-bit tile (AVX2): a panel of 16 columns in two vectors of 8 lanes by 3 activation
    /// rows (6 integer and 6 `f32` accumulators of the 16 vector registers), `vpmaddwd` and
    /// `vpaddd`, scaled once per block as the 512-bit tiles are.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `w` holds `16 * nb * QK` values, `scale` and `bias`
    /// `16 * nb`, `a` 3 rows of `nb * QK` values and `nb` scales and sums, `out` 48 values.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2<const SEG: usize, const BIAS: bool>(
        w: &[i16],
        scale: &[f32],
        bias: &[f32],
        a: &[ActRow],
        nb: usize,
        out: &mut [f32],
    ) {
        const R: usize = 3;
        let mut acc = [[_mm256_setzero_ps(); R]; 2];
        let wp = w.as_ptr();
        for b in 0..nb {
            for s in 0..16 / SEG {
                let mut ia = [[_mm256_setzero_si256(); R]; 2];
                for p in 0..SEG {
                    let kp = 16 * b + SEG * s + p;
                    // SAFETY: `kp < nb * QK / 2`, so both vectors (16 values each) lie within
                    // `w` (`16 * nb * QK` values), and the pair within each row of `a`.
                    let (w0, w1) = unsafe {
                        (
                            _mm256_loadu_si256(wp.add(32 * kp) as *const __m256i),
                            _mm256_loadu_si256(wp.add(32 * kp + 16) as *const __m256i),
                        )
                    };
                    for r in 0..R {
                        // SAFETY: as above.
                        let pair =
                            unsafe { std::ptr::read_unaligned(a[r].qs.as_ptr().add(2 * kp) as *const i32) };
                        let x = _mm256_set1_epi32(pair);
                        ia[0][r] = _mm256_add_epi32(ia[0][r], _mm256_madd_epi16(w0, x));
                        ia[1][r] = _mm256_add_epi32(ia[1][r], _mm256_madd_epi16(w1, x));
                    }
                }
                // SAFETY: `b < nb`: 16 scales at `16 b` within `scale`.
                let (s0, s1) = unsafe {
                    (
                        _mm256_loadu_ps(scale.as_ptr().add(16 * b)),
                        _mm256_loadu_ps(scale.as_ptr().add(16 * b + 8)),
                    )
                };
                for r in 0..R {
                    let d = _mm256_set1_ps(a[r].d[b]);
                    let v0 = _mm256_mul_ps(_mm256_cvtepi32_ps(ia[0][r]), s0);
                    let v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(ia[1][r]), s1);
                    acc[0][r] = _mm256_fmadd_ps(v0, d, acc[0][r]);
                    acc[1][r] = _mm256_fmadd_ps(v1, d, acc[1][r]);
                }
            }
            if BIAS {
                // SAFETY: as for the scales.
                let (b0, b1) = unsafe {
                    (
                        _mm256_loadu_ps(bias.as_ptr().add(16 * b)),
                        _mm256_loadu_ps(bias.as_ptr().add(16 * b + 8)),
                    )
                };
                for r in 0..R {
                    let m = _mm256_set1_ps(a[r].d[b] * a[r].sums[b] as f32);
                    acc[0][r] = _mm256_fnmadd_ps(b0, m, acc[0][r]);
                    acc[1][r] = _mm256_fnmadd_ps(b1, m, acc[1][r]);
                }
            }
        }
        for (o, r) in out.chunks_exact_mut(16).zip(0..R) {
            let (lo, hi) = o.split_at_mut(8);
            // SAFETY: each half holds 8 `f32`.
            unsafe {
                _mm256_storeu_ps(lo.as_mut_ptr(), acc[0][r]);
                _mm256_storeu_ps(hi.as_mut_ptr(), acc[1][r]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::tests::{random_acts, random_rows, rng};
    use crate::fast::{scalar, ActRow};

    /// The scalar tile (forced, so x86 CI covers it) and every SIMD set the CPU runs compute the same
    /// products on odd shapes: 5 weight rows (a half tile), 11 activation rows (a partial tile).
    #[test]
    fn scalar_and_simd_tiles_agree() {
        let mut seed = 7u64;
        for kind in crate::fast::tests::ALL_KINDS {
            let (n, k, rows) = (5usize, 768usize, 11usize);
            let rb = k / kind.block() * kind.block_bytes();
            let bytes = random_rows(kind, n, k, &mut seed);
            let x = random_acts(rows * k, &mut seed);
            let mut acts = Acts::default();
            assert!(acts.quantize(
                &rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap(),
                None,
                &x,
                rows,
                k
            ));
            // The byte planes of the AMX product, where the CPU has it.
            #[cfg(target_arch = "x86_64")]
            if KernelSet::Amx.available() {
                crate::fast::amx::split(
                    &mut acts,
                    &rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap(),
                    rows,
                    k,
                );
            }
            let (mut forced, mut detected) = (vec![0f32; n * rows], vec![0f32; n * rows]);
            task(
                kind,
                KernelSet::Scalar,
                &bytes,
                rb,
                k,
                &acts,
                0,
                0,
                n,
                &mut forced,
            );
            for set in KernelSet::ALL.into_iter().filter(|s| s.available()) {
                crate::fast::prefill_task(kind, set, &bytes, rb, k, &acts, 0, 0, n, &mut detected);
                // Only the order of the f32 additions differs: within 1e-5 of the largest product.
                let scale = forced.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (i, (a, b)) in forced.iter().zip(&detected).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * scale,
                        "{kind:?} {set:?} value {i}: scalar {a}, simd {b}"
                    );
                }
            }
            assert!(forced.iter().any(|v| *v != 0.0), "{kind:?}: all zero");
        }
    }

    /// The unpacked row times quantized activations, block by block in `f64`, equals the fused
    /// scalar kernel's dot (the same integers and scales).
    #[test]
    fn unpacked_rows_carry_the_fused_kernels_values() {
        let mut seed = 99u64;
        for kind in crate::fast::tests::ALL_KINDS {
            let k = 512;
            let mut row: Vec<u8> = (0..k / kind.block() * kind.block_bytes())
                .map(|_| (rng(&mut seed) >> 24) as u8)
                .collect();
            // Finite scales.
            for blk in row.chunks_exact_mut(kind.block_bytes()) {
                for at in match kind {
                    Kind::Q8_0 | Kind::Q5_0 | Kind::Q4_0 => vec![0],
                    Kind::Q4K | Kind::Q5K | Kind::Q4_1 | Kind::Q5_1 => vec![0, 2],
                    Kind::Q6K => vec![208],
                } {
                    blk[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
                }
            }
            let x: Vec<f32> = (0..k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
            let mut acts = Acts::default();
            assert!(acts.quantize(
                &rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap(),
                None,
                &x,
                1,
                k
            ));
            let a: ActRow = acts.row(0, k);
            let (mut w, mut scale, mut bias) = (vec![0i16; k], vec![0f32; k / QK], vec![0f32; k / QK]);
            unpack::<true>(kind, &row, &mut w, &mut scale, &mut bias);
            let mut got = 0f64;
            for b in 0..k / QK {
                let isum: i64 = (0..QK)
                    .map(|i| i64::from(w[QK * b + i]) * i64::from(a.qs[QK * b + i]))
                    .sum();
                got += f64::from(scale[b]) * f64::from(a.d[b]) * isum as f64
                    - f64::from(bias[b]) * f64::from(a.d[b]) * f64::from(a.sums[b]);
            }
            let want = f64::from(scalar::dot(kind, &row, a));
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{kind:?}: unpacked {got}, fused {want}"
            );
        }
    }
}
