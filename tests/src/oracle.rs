//! The ops' arithmetic in f64, written independently of any backend, from the op docs in
//! `tandem_backend_api::Op`.

/// `Op::Embed`.
pub fn embed(table: &[f64], hidden: usize, tokens: &[u32], scale: f64) -> Vec<f64> {
    tokens
        .iter()
        .flat_map(|&t| {
            table[t as usize * hidden..(t as usize + 1) * hidden]
                .iter()
                .map(move |v| v * scale)
        })
        .collect()
}

/// `Op::Embed` with `extra` rows: ids below `vocab` read the table, scaled; the others read row
/// `id - vocab` of `extra`, as they are.
pub fn embed_extra(table: &[f64], extra: &[f64], hidden: usize, tokens: &[u32], scale: f64) -> Vec<f64> {
    let vocab = table.len() / hidden;
    tokens
        .iter()
        .flat_map(|&t| {
            let t = t as usize;
            if t < vocab {
                table[t * hidden..(t + 1) * hidden]
                    .iter()
                    .map(|v| v * scale)
                    .collect::<Vec<_>>()
            } else {
                extra[(t - vocab) * hidden..(t - vocab + 1) * hidden].to_vec()
            }
        })
        .collect()
}

/// `Op::RmsNorm`.
pub fn rms_norm(x: &[f64], w: &[f64], eps: f64, offset: f64) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|g| {
            let rms = (g.iter().map(|v| v * v).sum::<f64>() / g.len() as f64 + eps).sqrt();
            g.iter()
                .zip(w)
                .map(move |(v, wi)| v / rms * (offset + wi))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `Op::LayerNorm`: rows of `w.len()` values, biased variance.
pub fn layer_norm(x: &[f64], w: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|row| {
            let n = row.len() as f64;
            let mean = row.iter().sum::<f64>() / n;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
            let inv = 1.0 / (var + eps).sqrt();
            row.iter()
                .zip(w)
                .zip(b)
                .map(move |((v, wi), bi)| (v - mean) * inv * wi + bi)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `gelu_tanh`, in f64.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// `Op::BlockAttention` over `[rows, heads * head_dim]` q, k, v.
pub fn block_attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    heads: usize,
    head_dim: usize,
    scale: f64,
    block: usize,
) -> Vec<f64> {
    let width = heads * head_dim;
    let rows = q.len() / width;
    let mut out = vec![0.0; rows * width];
    for r in 0..rows {
        let first = r / block * block;
        for h in 0..heads {
            let at = h * head_dim;
            let dot = |j: usize| -> f64 {
                (0..head_dim)
                    .map(|d| q[r * width + at + d] * k[j * width + at + d])
                    .sum::<f64>()
                    * scale
            };
            let s: Vec<f64> = (first..first + block).map(dot).collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (i, j) in (first..first + block).enumerate() {
                for d in 0..head_dim {
                    out[r * width + at + d] += e[i] / sum * v[j * width + at + d];
                }
            }
        }
    }
    out
}

/// `Op::MatMul` without splitting: `[rows, n]`.
pub fn matmul(x: &[f64], rows: usize, w: &[f64], n: usize) -> Vec<f64> {
    let k = w.len() / n;
    let mut out = vec![0.0; rows * n];
    for r in 0..rows {
        for j in 0..n {
            out[r * n + j] = (0..k).map(|i| x[r * k + i] * w[j * k + i]).sum();
        }
    }
    out
}

/// `x` as an 8-bit-activation product sees it (`precision = "fast"`, ggml's q8_0/q8_1 input):
/// per block of 32 values, `d = max |x| / 127` and `q = round(x / d)` in `f32` (ties away
/// from zero), each value replaced by `d * q`. The integer sums of such a product are exact, so
/// its result is [`matmul`] of these values up to the `f32` scaling of each block's sum.
pub fn quantize_q8(x: &[f32]) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for block in x.chunks(32) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(
            block
                .iter()
                .map(|v| f64::from(d) * f64::from((v * inv).round().clamp(-127.0, 127.0))),
        );
    }
    out
}

/// Splits a `[rows, n]` matrix into column blocks.
pub fn split_cols(m: &[f64], rows: usize, splits: &[usize]) -> Vec<Vec<f64>> {
    let n: usize = splits.iter().sum();
    let mut start = 0;
    splits
        .iter()
        .map(|&c| {
            let block = (0..rows)
                .flat_map(|r| m[r * n + start..r * n + start + c].to_vec())
                .collect();
            start += c;
            block
        })
        .collect()
}

/// `Op::Rope`.
pub fn rope(x: &[f64], cols: usize, positions: &[u32], head_dim: usize, theta: f64, factor: f64) -> Vec<f64> {
    let half = head_dim / 2;
    let mut out = x.to_vec();
    for (r, &p) in positions.iter().enumerate() {
        for h in 0..cols / head_dim {
            let base = r * cols + h * head_dim;
            for d in 0..half {
                let a = (p as f64 / factor) * theta.powf(-2.0 * d as f64 / head_dim as f64);
                let (x1, x2) = (x[base + d], x[base + d + half]);
                out[base + d] = x1 * a.cos() - x2 * a.sin();
                out[base + d + half] = x2 * a.cos() + x1 * a.sin();
            }
        }
    }
    out
}

/// Everything the attention oracle needs about one layer.
#[derive(Debug, Clone, Copy)]
pub struct AttentionSpec {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head size.
    pub head_dim: usize,
    /// Score scale.
    pub scale: f64,
    /// Sliding window.
    pub window: Option<usize>,
    /// Score soft-cap.
    pub softcap: Option<f64>,
}

/// The keys and values each slot has seen, by position.
#[derive(Debug, Default, Clone)]
pub struct KvHistory {
    entries: std::collections::HashMap<(u32, u32), (Vec<f64>, Vec<f64>)>,
}

/// `Op::Attention` for one step: stores the step's keys and values, then attends.
pub fn attention(
    spec: &AttentionSpec,
    hist: &mut KvHistory,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    positions: &[u32],
    slots: &[u32],
) -> Vec<f64> {
    let ends = positions.to_vec();
    attention_to(spec, hist, q, k, v, positions, &ends, slots)
}

/// The last position each row sees under `Op::Attention`'s `bidirectional_from = Some(from)`:
/// a row whose token is at least `from` sees to the last row of its block, the run of rows
/// after it (one slot, each at the position after the one before, every token `>= from`);
/// any other row, its own position. Walked forwards from each row (the kit walks backwards).
pub fn block_ends(tokens: &[u32], positions: &[u32], slots: &[u32], from: u32) -> Vec<u32> {
    (0..positions.len())
        .map(|r| {
            if tokens[r] < from {
                return positions[r];
            }
            let mut j = r;
            while j + 1 < positions.len()
                && tokens[j + 1] >= from
                && slots[j + 1] == slots[r]
                && positions[j + 1] == positions[j] + 1
            {
                j += 1;
            }
            positions[j]
        })
        .collect()
}

/// [`attention`] where row `r` sees the positions `lo ..= ends[r]` (`lo` from its own position
/// and the window): image blocks ([`block_ends`]).
#[allow(clippy::too_many_arguments)]
pub fn attention_to(
    spec: &AttentionSpec,
    hist: &mut KvHistory,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    positions: &[u32],
    ends: &[u32],
    slots: &[u32],
) -> Vec<f64> {
    let (hd, kvc, qc) = (
        spec.head_dim,
        spec.kv_heads * spec.head_dim,
        spec.heads * spec.head_dim,
    );
    for (r, (&p, &s)) in positions.iter().zip(slots).enumerate() {
        hist.entries.insert(
            (s, p),
            (
                k[r * kvc..(r + 1) * kvc].to_vec(),
                v[r * kvc..(r + 1) * kvc].to_vec(),
            ),
        );
    }
    let mut out = vec![0.0; positions.len() * qc];
    for (r, (&p, &s)) in positions.iter().zip(slots).enumerate() {
        let lo = spec.window.map_or(0, |w| (p as i64 + 1 - w as i64).max(0) as u32);
        for h in 0..spec.heads {
            let g = h / (spec.heads / spec.kv_heads);
            let qh = &q[r * qc + h * hd..r * qc + (h + 1) * hd];
            let keys: Vec<&(Vec<f64>, Vec<f64>)> =
                (lo..=ends[r].max(p)).map(|j| &hist.entries[&(s, j)]).collect();
            let scores: Vec<f64> = keys
                .iter()
                .map(|(kk, _)| {
                    let sc = spec.scale
                        * qh.iter()
                            .zip(&kk[g * hd..(g + 1) * hd])
                            .map(|(a, b)| a * b)
                            .sum::<f64>();
                    spec.softcap.map_or(sc, |c| c * (sc / c).tanh())
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = exps.iter().sum();
            for (e, (_, vv)) in exps.iter().zip(&keys) {
                for d in 0..hd {
                    out[r * qc + h * hd + d] += e / sum * vv[g * hd + d];
                }
            }
        }
    }
    out
}

/// `gelu_tanh(gate) * up`.
pub fn geglu(gate: &[f64], up: &[f64]) -> Vec<f64> {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    gate.iter()
        .zip(up)
        .map(|(g, u)| 0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()) * u)
        .collect()
}

/// `a + b`.
pub fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// `cap * tanh(x / cap)`.
pub fn softcap(x: &[f64], cap: f64) -> Vec<f64> {
    x.iter().map(|v| cap * (v / cap).tanh()).collect()
}

/// `Op::TopK` (no NaN in `x`): per row, the `k` largest values (equal ones by lower index),
/// then their indices.
pub fn top_k(x: &[f64], cols: usize, k: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for row in x.chunks_exact(cols) {
        let mut ids: Vec<usize> = (0..cols).collect();
        ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        ids.truncate(k);
        out.extend(ids.iter().map(|&i| row[i]));
        out.extend(ids.iter().map(|&i| i as f64));
    }
    out
}

/// `Op::SelectRows`.
pub fn select_rows(x: &[f64], cols: usize, select: &[u32]) -> Vec<f64> {
    select
        .iter()
        .flat_map(|&r| x[r as usize * cols..(r as usize + 1) * cols].to_vec())
        .collect()
}

#[cfg(test)]
mod q8_tests {
    #[test]
    fn quantize_q8_is_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
        let q = super::quantize_q8(&x);
        for (b, (xs, qs)) in x.chunks(32).zip(q.chunks(32)).enumerate() {
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (a, b2) in xs.iter().zip(qs) {
                assert!(
                    (f64::from(*a) - b2).abs() <= f64::from(amax) / 254.0 + 1e-7,
                    "block {b}: {a} {b2}"
                );
            }
        }
    }
}
