//! The arithmetic of every op, as plain loops with f32 accumulation. Each function documents the
//! op it implements in `tandem_backend_api::Op`; the conformance suite checks them against an
//! independent oracle.

use rayon::prelude::*;

use crate::convert::{decode_row, encode_row};
use crate::layout::{scatter, Layout};
use crate::shape::AttentionShape;
use crate::weight::WeightView;

/// Columns (weight rows) per parallel task in [`product_columns`].
const MATMUL_CHUNK: usize = 16;

/// `Op::Embed`.
pub fn embed(table: WeightView, extra: Option<WeightView>, tokens: &[u32], scale: f32, out: &mut [f32]) {
    let vocab = table.n;
    for (row, &t) in out.chunks_exact_mut(table.k).zip(tokens) {
        match extra {
            // Past the vocabulary: the extra rows, as they are (the step check bounds `t`).
            Some(e) if t as usize >= vocab => e.decode(t as usize - vocab, row),
            _ => {
                table.decode(t as usize, row);
                for v in row.iter_mut() {
                    *v *= scale;
                }
            }
        }
    }
}

/// `Op::RmsNorm` over groups of `weight.len()` columns.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, offset: f32, out: &mut [f32]) {
    let g = weight.len();
    for (xs, ys) in x.chunks_exact(g).zip(out.chunks_exact_mut(g)) {
        let ms = xs.iter().map(|v| v * v).sum::<f32>() / g as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((y, v), w) in ys.iter_mut().zip(xs).zip(weight) {
            *y = v * inv * (offset + w);
        }
    }
}

/// `Op::MatMul`: `scratch` (`n * rows`) receives the product column-major; `outs` the split,
/// row-major results.
pub fn matmul(
    pool: &rayon::ThreadPool,
    x: &[f32],
    rows: usize,
    w: WeightView,
    scratch: &mut [f32],
    outs: &mut [&mut [f32]],
) {
    product_columns(pool, x, rows, w, scratch, dot);
    let mut j0 = 0;
    for out in outs.iter_mut() {
        j0 = scatter(scratch, Layout::Columns, rows, j0, out);
    }
}

/// The product of `Op::MatMul` into `scratch` (`n * rows`) by the reference loops, column-major
/// ([`Layout::Columns`]): each value `dot` of an activation row and a weight row (decoded per
/// task where it is not `f32`): `kernels::dot` for the reference's single running sum, the fast
/// kernel sets' eight lanes from `matmul::product`.
pub fn product_columns(
    pool: &rayon::ThreadPool,
    x: &[f32],
    rows: usize,
    w: WeightView,
    scratch: &mut [f32],
    dot: fn(&[f32], &[f32]) -> f32,
) {
    let k = w.k;
    pool.install(|| {
        scratch[..w.n * rows]
            .par_chunks_mut(MATMUL_CHUNK * rows)
            .enumerate()
            .for_each_init(
                || vec![0f32; k],
                |wrow, (chunk, dst)| {
                    for (c, col) in dst.chunks_exact_mut(rows).enumerate() {
                        let j = chunk * MATMUL_CHUNK + c;
                        let wr: &[f32] = match w.f32_row(j) {
                            Some(r) => r,
                            None => {
                                w.decode(j, wrow);
                                wrow
                            }
                        };
                        for (r, o) in col.iter_mut().enumerate() {
                            *o = dot(&x[r * k..(r + 1) * k], wr);
                        }
                    }
                },
            )
    });
}

/// The reference dot product: one running sum.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The most rotated pairs per head whose angles [`rope`] computes once per row for all its
/// heads (head sizes up to 512); larger heads compute them per head.
const ROPE_TABLE: usize = 256;

/// `Op::Rope` in the rotate-half layout. Each row's angles (the same arithmetic for every
/// head) are computed once per row and shared by its heads.
pub fn rope(
    x: &[f32],
    cols: usize,
    positions: &[u32],
    head_dim: usize,
    theta: f32,
    factor: f32,
    out: &mut [f32],
) {
    let half = head_dim / 2;
    let inv_freq = |d: usize| 1.0 / theta.powf((2 * d) as f32 / head_dim as f32);
    let (mut inv, mut sin, mut cos) = ([0f32; ROPE_TABLE], [0f32; ROPE_TABLE], [0f32; ROPE_TABLE]);
    let table = half <= ROPE_TABLE;
    if table {
        for (d, f) in inv[..half].iter_mut().enumerate() {
            *f = inv_freq(d);
        }
    }
    for ((xr, yr), &p) in x
        .chunks_exact(cols)
        .zip(out.chunks_exact_mut(cols))
        .zip(positions)
    {
        if table {
            for d in 0..half {
                (sin[d], cos[d]) = ((p as f32 / factor) * inv[d]).sin_cos();
            }
        }
        for (xh, yh) in xr.chunks_exact(head_dim).zip(yr.chunks_exact_mut(head_dim)) {
            for d in 0..half {
                let (s, c) = if table {
                    (sin[d], cos[d])
                } else {
                    ((p as f32 / factor) * inv_freq(d)).sin_cos()
                };
                let (x1, x2) = (xh[d], xh[d + half]);
                yh[d] = x1 * c - x2 * s;
                yh[d + half] = x2 * c + x1 * s;
            }
        }
    }
}

/// Stores the step's keys and values in the caches (first half of `Op::Attention`).
pub fn kv_append(
    s: &AttentionShape,
    k: &[f32],
    v: &[f32],
    positions: &[u32],
    slots: &[u32],
    kc: &mut [u8],
    vc: &mut [u8],
) {
    let n = s.kv_cols();
    let bytes = n * s.elem();
    for r in 0..positions.len() {
        let at = s.at(slots[r], positions[r]);
        encode_row(s.cache_dtype, &k[r * n..(r + 1) * n], &mut kc[at..at + bytes]);
        encode_row(s.cache_dtype, &v[r * n..(r + 1) * n], &mut vc[at..at + bytes]);
    }
}

/// Attends every row over its slot's cached positions (second half of `Op::Attention`).
#[allow(clippy::too_many_arguments)]
pub fn attend(
    pool: &rayon::ThreadPool,
    s: &AttentionShape,
    q: &[f32],
    positions: &[u32],
    ends: &[u32],
    slots: &[u32],
    kc: &[u8],
    vc: &[u8],
    out: &mut [f32],
) {
    let (hd, qcols) = (s.head_dim, s.heads * s.head_dim);
    let group = s.heads / s.kv_heads;
    pool.install(|| {
        out.par_chunks_mut(qcols).enumerate().for_each_init(
            || (vec![0f32; s.capacity], vec![0f32; hd], vec![0f32; hd]),
            |(scores, kbuf, vbuf), (r, orow)| {
                // Rows of an image block see up to its end (`Op::Attention`'s `bidirectional_from`).
                let (p, end) = (positions[r], ends[r].max(positions[r]));
                let lo = match s.window {
                    Some(w) => (p + 1).saturating_sub(w as u32),
                    None => 0,
                };
                let n = (end - lo + 1) as usize;
                for h in 0..s.heads {
                    let g = h / group;
                    let qh = &q[r * qcols + h * hd..r * qcols + (h + 1) * hd];
                    let mut max = f32::NEG_INFINITY;
                    for (j, pos) in (lo..=end).enumerate() {
                        let at = s.at(slots[r], pos) + g * hd * s.elem();
                        decode_row(s.cache_dtype, &kc[at..at + hd * s.elem()], kbuf);
                        let mut sc = dot(qh, kbuf) * s.scale;
                        if let Some(cap) = s.softcap {
                            sc = cap * (sc / cap).tanh();
                        }
                        scores[j] = sc;
                        max = max.max(sc);
                    }
                    let mut sum = 0f32;
                    for sc in &mut scores[..n] {
                        *sc = (*sc - max).exp();
                        sum += *sc;
                    }
                    let oh = &mut orow[h * hd..(h + 1) * hd];
                    oh.fill(0.0);
                    for (j, pos) in (lo..=end).enumerate() {
                        let at = s.at(slots[r], pos) + g * hd * s.elem();
                        decode_row(s.cache_dtype, &vc[at..at + hd * s.elem()], vbuf);
                        let wgt = scores[j] / sum;
                        for (o, v) in oh.iter_mut().zip(vbuf.iter()) {
                            *o += wgt * v;
                        }
                    }
                }
            },
        )
    });
}

/// `gelu_tanh(x)`, as PyTorch's `gelu(approximate="tanh")`.
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// `Op::GeGlu`.
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh(*g) * u;
    }
}

/// `Op::LayerNorm` on rows of `weight.len()` values: the mean and the biased variance in f32.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
    let cols = weight.len();
    for (row, o) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let mean = row.iter().sum::<f32>() / cols as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / cols as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (((o, v), w), b) in o.iter_mut().zip(row).zip(weight).zip(bias) {
            *o = (v - mean) * inv * w + b;
        }
    }
}

/// `Op::Bias` on rows of `bias.len()` values.
pub fn bias(x: &[f32], bias: &[f32], out: &mut [f32]) {
    for (row, o) in x.chunks_exact(bias.len()).zip(out.chunks_exact_mut(bias.len())) {
        for ((o, v), b) in o.iter_mut().zip(row).zip(bias) {
            *o = v + b;
        }
    }
}

/// `Op::Gelu`.
pub fn gelu(x: &[f32], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o = gelu_tanh(*v);
    }
}

/// `Op::BlockAttention`: each row's heads against every row of its block of `block` rows, on
/// `pool` (a row per task): scores in f32, the softmax shifted by its largest score.
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
) {
    use rayon::prelude::*;
    let width = heads * head_dim;
    pool.install(|| {
        out.par_chunks_mut(width).enumerate().for_each(|(r, orow)| {
            let first = r / block * block;
            let mut scores = vec![0f32; block];
            for h in 0..heads {
                let at = h * head_dim;
                let qh = &q[r * width + at..r * width + at + head_dim];
                let mut max = f32::NEG_INFINITY;
                for (j, sc) in scores.iter_mut().enumerate() {
                    let kr = (first + j) * width + at;
                    let kh = &k[kr..kr + head_dim];
                    *sc = scale * dot_lanes(qh, kh);
                    max = max.max(*sc);
                }
                let mut sum = 0f32;
                for sc in &mut scores {
                    *sc = (*sc - max).exp();
                    sum += *sc;
                }
                let oh = &mut orow[at..at + head_dim];
                oh.fill(0.0);
                for (j, sc) in scores.iter().enumerate() {
                    let vr = (first + j) * width + at;
                    let wgt = sc / sum;
                    for (o, x) in oh.iter_mut().zip(&v[vr..vr + head_dim]) {
                        *o += wgt * x;
                    }
                }
            }
        })
    });
}

/// `a . b` in eight running sums, added at the end: a loop the compiler vectorises (one
/// running sum is a chain of dependent additions), for the vision tower's block attention,
/// whose blocks are thousands of keys long.
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `Op::Add`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

/// `Op::Softcap`.
pub fn softcap(x: &[f32], cap: f32, out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o = cap * (v / cap).tanh();
    }
}

/// `Op::TopK`: per row of `cols` values, the `k` best in rank order (larger first, equal ones by
/// lower index, NaN as -inf), then their indices as f32.
pub fn top_k(x: &[f32], cols: usize, k: usize, out: &mut [f32]) {
    let mut ids: Vec<u32> = Vec::with_capacity(cols);
    for (row, o) in x.chunks_exact(cols).zip(out.chunks_exact_mut(2 * k)) {
        let value = |i: u32| {
            let v = row[i as usize];
            if v.is_nan() {
                f32::NEG_INFINITY
            } else {
                v
            }
        };
        let rank = |a: &u32, b: &u32| value(*b).total_cmp(&value(*a)).then(a.cmp(b));
        ids.clear();
        ids.extend(0..cols as u32);
        if k < cols {
            ids.select_nth_unstable_by(k - 1, rank);
            ids.truncate(k);
        }
        ids.sort_unstable_by(rank);
        let (values, indices) = o.split_at_mut(k);
        for ((v, i), &id) in values.iter_mut().zip(indices.iter_mut()).zip(&ids) {
            *v = value(id);
            *i = id as f32;
        }
    }
}

/// `Op::SelectRows`.
pub fn select_rows(x: &[f32], cols: usize, select: &[u32], out: &mut [f32]) {
    for (o, &r) in out.chunks_exact_mut(cols).zip(select) {
        o.copy_from_slice(&x[r as usize * cols..(r as usize + 1) * cols]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_ranks_nan_as_minus_infinity_and_ties_by_index() {
        let ninf = f32::NEG_INFINITY;
        let x = [
            1.0,
            f32::NAN,
            3.0,
            1.0,
            ninf,
            3.0,
            /* row 2 */ f32::NAN,
            ninf,
            2.0,
            ninf,
            0.5,
            f32::NAN,
        ];
        let mut out = [0.0f32; 2 * 2 * 4];
        top_k(&x, 6, 4, &mut out);
        assert_eq!(&out[..8], &[3.0, 3.0, 1.0, 1.0, 2.0, 5.0, 0.0, 3.0]);
        // NaN and -inf alike, by index: 0 (NaN), 1 (-inf).
        assert_eq!(&out[8..], &[2.0, 0.5, ninf, ninf, 2.0, 4.0, 0.0, 1.0]);
    }

    #[test]
    fn rms_norm_of_three_four() {
        // mean square of [3, 4] is 12.5; with eps 0 the result is x / sqrt(12.5) * (1 + w).
        let mut out = [0f32; 2];
        rms_norm(&[3.0, 4.0], &[0.0, 1.0], 0.0, 1.0, &mut out);
        let inv = 1.0 / 12.5f32.sqrt();
        assert!(
            (out[0] - 3.0 * inv).abs() < 1e-6 && (out[1] - 8.0 * inv).abs() < 1e-6,
            "{out:?}"
        );
    }

    #[test]
    fn gelu_tanh_known_values() {
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert!((gelu_tanh(-3.0) + 0.003_637_4).abs() < 1e-5);
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_rotates_later() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut y = [0f32; 4];
        rope(&x, 4, &[0], 4, 10_000.0, 1.0, &mut y);
        assert_eq!(y, x);
        // d = 0 pair at position 1 rotates by 1 radian.
        rope(&x, 4, &[1], 4, 10_000.0, 1.0, &mut y);
        let (s, c) = 1f32.sin_cos();
        assert!((y[0] - (1.0 * c - 3.0 * s)).abs() < 1e-6);
        assert!((y[2] - (3.0 * c + 1.0 * s)).abs() < 1e-6);
    }
}
