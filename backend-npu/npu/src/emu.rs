//! The emulator: tandem's NPU attention kernel run on the CPU, with the kernel's arithmetic step
//! for step (`shaders/npu/CONTRACT.md`): bf16 inputs, dot products in 16 f32 lanes reduced
//! pairwise, the online softmax over 128-key blocks aligned to absolute positions, `exp2` of an
//! f32 argument scaled by a bf16 `log2(e)` and rounded to bf16, the probabilities and the
//! correction factors in bf16, the block sums and the output accumulators in f32, and the
//! output rounded to bf16.
//!
//! The work is cut as the kernels cut it: tiles of query rows of one sequence (one row in
//! decode, up to [`PREFILL_Q_BLOCK`] in prefill) times one kv head, each visiting the key blocks
//! in ascending order with every query head of the group. Tiles are independent, so they run in
//! parallel here; within a (row, head) the order of every f32 operation is the contract's, which
//! is what makes the result exact rather than merely close.

use rayon::prelude::*;

use crate::contract::{
    bf16_round, bf16_to_f32, AttnParams, Phase, KV_BLOCK, LANES, LOG2E_BF16, PREFILL_Q_BLOCK,
};

/// Wrong buffer sizes for the parameters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NPU attention buffers: {0}")]
pub struct EmuError(pub String);

/// One tile: rows of one slot (ascending in the step) and one kv head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tile {
    /// Step rows of the tile, all of one slot.
    pub rows: Vec<usize>,
    /// The kv head.
    pub kv_head: usize,
}

/// The tiles of a step in the kernel's order: sequences by first appearance, their rows in
/// blocks of one (decode) or [`PREFILL_Q_BLOCK`] (prefill), then kv heads.
pub fn tiles(p: &AttnParams) -> Vec<Tile> {
    let q_block = match Phase::of_step(&p.row_slots) {
        Phase::Decode => 1,
        Phase::Prefill => PREFILL_Q_BLOCK,
    };
    let mut order: Vec<u32> = Vec::new();
    for s in &p.row_slots {
        if !order.contains(s) {
            order.push(*s);
        }
    }
    let mut out = Vec::new();
    for slot in order {
        let rows: Vec<usize> = (0..p.rows).filter(|&r| p.row_slots[r] == slot).collect();
        for chunk in rows.chunks(q_block) {
            for kv_head in 0..p.kv_heads {
                out.push(Tile {
                    rows: chunk.to_vec(),
                    kv_head,
                });
            }
        }
    }
    out
}

/// `exp2(x)` as the AIE's exp2 unit returns it: the bf16 nearest the exact value.
pub fn exp2_bf16(x: f32) -> f32 {
    bf16_to_f32(bf16_round((x as f64).exp2() as f32))
}

/// The dot product of a bf16 query and key row as the kernel accumulates it: lane `l` sums
/// `q[i] * k[i]` for `i = l (mod 16)` in ascending `i`, then the lanes are added pairwise
/// (8, 4, 2, 1 apart).
pub fn dot_lanes(q: &[f32], k: &[u16]) -> f32 {
    let mut lanes = [0f32; LANES];
    for (i, (a, b)) in q.iter().zip(k).enumerate() {
        lanes[i % LANES] += a * bf16_to_f32(*b);
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
        width /= 2;
    }
    lanes[0]
}

/// The running state of one (row, query head).
struct RowState {
    m: f32,
    l: f32,
    acc: Vec<f32>,
}

/// Runs one dispatch: `q` and `out` are bf16 `[rows, heads, head_dim]`, `k` and `v` bf16
/// `[slots, capacity, kv_heads, head_dim]` with this step's keys and values already stored.
pub fn attention(p: &AttnParams, q: &[u16], k: &[u16], v: &[u16], out: &mut [u16]) -> Result<(), EmuError> {
    p.check().map_err(|e| EmuError(e.to_string()))?;
    let (qn, cn) = (p.q_elems(), p.cache_elems());
    if q.len() != qn || out.len() != qn || k.len() != cn || v.len() != cn {
        return Err(EmuError(format!(
            "q {} / out {} elements for {qn}, k {} / v {} for {cn}",
            q.len(),
            out.len(),
            k.len(),
            v.len()
        )));
    }
    let results: Vec<(Tile, Vec<Vec<u16>>)> = tiles(p)
        .into_par_iter()
        .map(|t| {
            let o = run_tile(p, &t, q, k, v);
            (t, o)
        })
        .collect();
    let (d, group) = (p.head_dim, p.heads / p.kv_heads);
    for (t, rows) in results {
        let mut it = rows.into_iter();
        for &r in &t.rows {
            for h in t.kv_head * group..(t.kv_head + 1) * group {
                if let Some(vals) = it.next() {
                    let at = (r * p.heads + h) * d;
                    out[at..at + d].copy_from_slice(&vals);
                }
            }
        }
    }
    Ok(())
}

/// One tile: per key block, every (row, head) of the tile; outputs in (row, head) order.
fn run_tile(p: &AttnParams, t: &Tile, q: &[u16], k: &[u16], v: &[u16]) -> Vec<Vec<u16>> {
    let (d, group) = (p.head_dim, p.heads / p.kv_heads);
    let heads: Vec<usize> = (t.kv_head * group..(t.kv_head + 1) * group).collect();
    let queries: Vec<Vec<f32>> = t
        .rows
        .iter()
        .flat_map(|&r| {
            heads.iter().map(move |&h| {
                let at = (r * p.heads + h) * d;
                q[at..at + d].iter().map(|b| bf16_to_f32(*b)).collect()
            })
        })
        .collect();
    let mut states: Vec<RowState> = queries
        .iter()
        .map(|_| RowState {
            m: f32::NEG_INFINITY,
            l: 0.0,
            acc: vec![0.0; d],
        })
        .collect();
    let slot = p.row_slots[t.rows[0]] as usize;
    let row_at = |pos: usize| ((slot * p.capacity + pos % p.capacity) * p.kv_heads + t.kv_head) * d;
    let first = t.rows.iter().map(|&r| p.lo(r)).min().unwrap_or(0);
    let last = t.rows.iter().map(|&r| p.positions[r] as usize).max().unwrap_or(0);
    let mut scores = Vec::with_capacity(KV_BLOCK);
    let mut probs = Vec::with_capacity(KV_BLOCK);
    let mut part = vec![0f32; d];
    for block in first / KV_BLOCK..=last / KV_BLOCK {
        let (b_lo, b_hi) = (block * KV_BLOCK, block * KV_BLOCK + KV_BLOCK - 1);
        for (i, &r) in t.rows.iter().enumerate() {
            let (lo, hi) = (p.lo(r).max(b_lo), (p.positions[r] as usize).min(b_hi));
            if lo > hi {
                continue;
            }
            for (j, query) in queries[i * group..(i + 1) * group].iter().enumerate() {
                let st = &mut states[i * group + j];
                scores.clear();
                scores.extend(
                    (lo..=hi).map(|pos| dot_lanes(query, &k[row_at(pos)..row_at(pos) + d]) * p.scale),
                );
                let block_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let m_new = st.m.max(block_max);
                let c = exp2_bf16((st.m - m_new) * LOG2E_BF16);
                probs.clear();
                probs.extend(scores.iter().map(|s| exp2_bf16((s - m_new) * LOG2E_BF16)));
                let mut block_sum = 0f32;
                for pj in &probs {
                    block_sum += pj;
                }
                st.l = st.l * c + block_sum;
                part.iter_mut().for_each(|x| *x = 0.0);
                for (pj, pos) in probs.iter().zip(lo..=hi) {
                    let vrow = &v[row_at(pos)..row_at(pos) + d];
                    for (x, vb) in part.iter_mut().zip(vrow) {
                        *x += pj * bf16_to_f32(*vb);
                    }
                }
                for (a, x) in st.acc.iter_mut().zip(&part) {
                    *a = *a * c + x;
                }
                st.m = m_new;
            }
        }
    }
    states
        .into_iter()
        .map(|st| st.acc.iter().map(|a| bf16_round(a / st.l)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::through_bf16;

    fn params(
        rows: usize,
        heads: usize,
        kv_heads: usize,
        d: usize,
        cap: usize,
        window: Option<usize>,
    ) -> AttnParams {
        AttnParams {
            rows,
            heads,
            kv_heads,
            head_dim: d,
            capacity: cap,
            window,
            scale: 1.0 / (d as f32).sqrt(),
            slots: 1,
            positions: (0..rows as u32).collect(),
            row_slots: vec![0; rows],
        }
    }

    fn noise(n: usize, seed: u32) -> Vec<u16> {
        let mut x = seed.wrapping_mul(747_796_405).wrapping_add(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                bf16_round((x as f32 / u32::MAX as f32) * 2.0 - 1.0)
            })
            .collect()
    }

    /// Softmax attention in f64 over the same bf16 inputs.
    fn exact(p: &AttnParams, q: &[u16], k: &[u16], v: &[u16]) -> Vec<f64> {
        let (d, g) = (p.head_dim, p.heads / p.kv_heads);
        let f = |b: u16| bf16_to_f32(b) as f64;
        let mut out = vec![0f64; p.q_elems()];
        for r in 0..p.rows {
            let (lo, hi) = (p.lo(r), p.positions[r] as usize);
            for h in 0..p.heads {
                let kvh = h / g;
                let at = |pos: usize| {
                    ((p.row_slots[r] as usize * p.capacity + pos % p.capacity) * p.kv_heads + kvh) * d
                };
                let qa = (r * p.heads + h) * d;
                let s: Vec<f64> = (lo..=hi)
                    .map(|pos| (0..d).map(|i| f(q[qa + i]) * f(k[at(pos) + i])).sum::<f64>() * p.scale as f64)
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = w.iter().sum();
                for i in 0..d {
                    out[qa + i] = (lo..=hi)
                        .zip(&w)
                        .map(|(pos, wj)| wj * f(v[at(pos) + i]))
                        .sum::<f64>()
                        / z;
                }
            }
        }
        out
    }

    #[test]
    fn dot_lanes_reduce_in_the_documented_order() {
        // With values whose sums are exact in f32, any order agrees; pick ones where the lane
        // order matters: a large value cancelled in its own lane before small ones are added.
        let mut q = vec![1.0f32; 32];
        let mut k = vec![bf16_round(1.0); 32];
        q[0] = 1.0;
        k[0] = bf16_round(16_777_216.0); // 2^24 in lane 0
        k[16] = bf16_round(-16_777_216.0); // cancelled by lane 0's second term
                                           // Lane 0: 2^24 + (-2^24) = 0; the other 15 lanes hold 2 each; total 30.
        assert_eq!(dot_lanes(&q, &k), 30.0);
        // A running sum in index order would lose the ones added to 2^24 before the cancel.
        let naive: f32 = q.iter().zip(&k).map(|(a, b)| a * bf16_to_f32(*b)).sum();
        assert_ne!(naive, 30.0);
    }

    #[test]
    fn long_contexts_cross_blocks_and_stay_close_to_exact_softmax() {
        // 300 keys: three blocks, the last partial; a window that starts mid-block.
        for window in [None, Some(200)] {
            let mut p = params(1, 4, 2, 64, 512, window);
            p.positions = vec![299];
            p.row_slots = vec![0];
            let q = noise(p.q_elems(), 1);
            let k = noise(p.cache_elems(), 2);
            let v = noise(p.cache_elems(), 3);
            let mut out = vec![0u16; p.q_elems()];
            attention(&p, &q, &k, &v, &mut out).unwrap();
            let want = exact(&p, &q, &k, &v);
            let worst = out
                .iter()
                .zip(&want)
                .map(|(o, w)| (bf16_to_f32(*o) as f64 - w).abs())
                .fold(0.0, f64::max);
            let scale = want.iter().map(|w| w.abs()).fold(0.0, f64::max);
            assert!(worst <= 0.02 * scale, "window {window:?}: {worst} of {scale}");
        }
    }

    #[test]
    fn a_prefill_tile_gives_what_each_row_gives_alone() {
        // 40 rows of one sequence: a 32-row tile and an 8-row one, against decode-style
        // single rows: the per-(row, head) arithmetic must not depend on the tiling.
        let mut p = params(40, 2, 1, 16, 64, Some(20));
        let q = noise(p.q_elems(), 4);
        let k = noise(p.cache_elems(), 5);
        let v = noise(p.cache_elems(), 6);
        let mut batch = vec![0u16; p.q_elems()];
        attention(&p, &q, &k, &v, &mut batch).unwrap();
        assert_eq!(tiles(&p).len(), 2);
        for r in 0..40 {
            let mut one = p.clone();
            one.rows = 1;
            one.positions = vec![p.positions[r]];
            one.row_slots = vec![0];
            let span = p.heads * p.head_dim;
            let mut out = vec![0u16; span];
            attention(&one, &q[r * span..(r + 1) * span], &k, &v, &mut out).unwrap();
            assert_eq!(out, batch[r * span..(r + 1) * span], "row {r}");
        }
        p.rows = 3;
        assert!(
            attention(&p, &q, &k, &v, &mut batch).is_err(),
            "3 rows with 40 positions"
        );
    }

    #[test]
    fn one_key_returns_its_value_in_bf16() {
        let p = params(1, 1, 1, 20, 4, None);
        let q = noise(20, 7);
        let mut k = vec![0u16; p.cache_elems()];
        let v: Vec<u16> = (0..p.cache_elems())
            .map(|i| bf16_round(i as f32 * 0.37 - 3.0))
            .collect();
        k[..20].copy_from_slice(&noise(20, 8));
        let mut out = vec![0u16; 20];
        attention(&p, &q, &k, &v, &mut out).unwrap();
        // p = exp2(0) = 1, l = 1: the value comes back exactly.
        assert_eq!(out, v[..20].to_vec());
        assert_eq!(through_bf16(exp2_bf16(0.0)), 1.0);
        assert_eq!(exp2_bf16(f32::NEG_INFINITY), 0.0);
    }
}
