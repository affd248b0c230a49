//! The NPU cost model calibrated against published XDNA2 figures, and the placements it
//! recommends on a Ryzen AI laptop. SIMULATED: nothing here ran on an NPU or a laptop iGPU.
//!
//! Whole model on the NPU (FastFlowLM's way), per step:
//! - decode: `layers x dispatches x (floor + words x word) + weight bytes / weight bandwidth +
//!   KV bytes / (kv heads x per-head bandwidth)`; a batch of `b` reads the weights once, pays
//!   `b` rows of KV, and at least `b x 2 x params / peak` of compute;
//! - prefill of `n` tokens: `layers x fixed + layers x n x per-row + (matrix FLOPs + attention
//!   FLOPs) / rate`.
//!
//! The six fitted terms ([`NpuParams`]) come from weighted least squares over FastFlowLM's
//! table ([`params::FLM_GEMMA3`]); [`fit`] recomputes them and [`calibration`] prints each
//! figure beside its prediction. The iGPU side is [`crate::gpu`]'s roofline with
//! [`params::RADEON_890M`] / [`params::RADEON_860M`].

use serde::Serialize;

use crate::gpu::{self, local, GpuModel, Shape, Step, GEMMA3_1B, GEMMA3_4B};
use crate::params::{self, NpuParams, Published, FLM_GEMMA3, GPU_UNCERTAINTY, SHARED_BYTES_PER_S, XDNA2};

/// The Gemma 3 size named `1B` or `4B`.
pub fn shape(name: &str) -> Option<&'static Shape> {
    match name {
        "1B" => Some(&GEMMA3_1B),
        "4B" => Some(&GEMMA3_4B),
        _ => None,
    }
}

/// Matrix weights of one layer and of the logits head (the tied embedding).
fn weights(s: &Shape) -> (f64, f64) {
    let (h, q, kv, f) = (
        s.hidden as f64,
        (s.heads * s.head_dim) as f64,
        (s.kv_heads * s.head_dim) as f64,
        s.intermediate as f64,
    );
    (h * (q + 2.0 * kv) + q * h + 3.0 * h * f, s.vocab as f64 * h)
}

/// Keys one decode row at `context` positions sees, summed over layers, times `kv_heads x
/// head_dim x 2` (K and V): cached elements read per decoded token.
fn decode_kv_elems(s: &Shape, context: usize) -> f64 {
    let row = (s.kv_heads * s.head_dim * 2) as f64;
    (0..s.layers)
        .map(|l| if local(l) { context.min(s.window) } else { context } as f64 * row)
        .sum()
}

/// Attention FLOPs of a prefill of `n` tokens (`4 x head_dim` per visible key per query head).
fn prefill_attention_flops(s: &Shape, n: usize) -> f64 {
    let per_key = 4.0 * (s.heads * s.head_dim) as f64;
    let (nf, w) = (n as f64, s.window as f64);
    (0..s.layers)
        .map(|l| {
            let keys = if local(l) && n > s.window {
                w * (w + 1.0) / 2.0 + (nf - w) * w
            } else {
                nf * (nf + 1.0) / 2.0
            };
            keys * per_key
        })
        .sum()
}

/// The terms a decode step's time is linear in: (dispatch seconds, weight bytes, KV bytes per
/// KV head), for `batch` rows at `context`.
fn decode_terms(p: &NpuParams, s: &Shape, context: usize, batch: usize) -> [f64; 3] {
    let (layer, head) = weights(s);
    let dispatch = s.layers as f64 * (p.dispatch_floor_s + p.rtp_words * p.rtp_word_s);
    let bytes = (s.layers as f64 * layer + head) * p.weight_bits / 8.0;
    let kv = batch as f64 * decode_kv_elems(s, context) * p.kv_bytes / s.kv_heads as f64;
    [dispatch, bytes, kv]
}

/// The terms a prefill's time is linear in: (layers, layers x tokens, FLOPs), for a prompt of
/// `n` tokens.
fn prefill_terms(s: &Shape, n: usize) -> [f64; 3] {
    let (layer, _) = weights(s);
    let flops = 2.0 * s.layers as f64 * layer * n as f64 + prefill_attention_flops(s, n);
    [s.layers as f64, (s.layers * n) as f64, flops]
}

/// Modelled seconds of one whole-model-on-NPU decode step of `batch` sequences at `context`.
pub fn npu_decode_s(p: &NpuParams, s: &Shape, context: usize, batch: usize) -> f64 {
    let [dispatch, bytes, kv] = decode_terms(p, s, context, batch);
    let (layer, head) = weights(s);
    let compute = batch as f64 * 2.0 * (s.layers as f64 * layer + head) / p.gemm_peak_flops_per_s;
    p.decode_dispatches_per_layer * dispatch
        + (bytes / p.weight_bytes_per_s).max(compute)
        + kv / p.kv_bytes_per_s_per_head
}

/// Modelled seconds of a whole-model-on-NPU prefill of an `n`-token prompt.
pub fn npu_prefill_s(p: &NpuParams, s: &Shape, n: usize) -> f64 {
    let [layers, rows, flops] = prefill_terms(s, n);
    layers * p.prefill_layer_s + rows * p.prefill_row_s + flops / p.prefill_flops_per_s
}

/// The model's tokens per second for a published figure's case.
pub fn predict(p: &NpuParams, f: &Published) -> Option<f64> {
    let s = shape(f.model)?;
    match f.phase {
        "decode" => Some(1.0 / npu_decode_s(p, s, f.context, 1)),
        "prefill" => Some(f.context as f64 / npu_prefill_s(p, s, f.context)),
        _ => None,
    }
}

/// Solves `a x = b` (small, dense) by Gaussian elimination with partial pivoting; `None` when
/// singular.
fn solve<const N: usize>(mut a: [[f64; N]; N], mut b: [f64; N]) -> Option<[f64; N]> {
    for c in 0..N {
        let pivot = (c..N).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        if a[pivot][c].abs() < 1e-300 {
            return None;
        }
        a.swap(c, pivot);
        b.swap(c, pivot);
        let pivot_row = a[c];
        for r in c + 1..N {
            let f = a[r][c] / pivot_row[c];
            for (x, p) in a[r][c..].iter_mut().zip(&pivot_row[c..]) {
                *x -= f * p;
            }
            b[r] -= f * b[c];
        }
    }
    let mut x = [0.0; N];
    for r in (0..N).rev() {
        let tail: f64 = (r + 1..N).map(|k| a[r][k] * x[k]).sum();
        x[r] = (b[r] - tail) / a[r][r];
    }
    Some(x)
}

/// Least squares of relative error: `t_i ~ sum_k x_k terms_i[k]`, each row weighted by `1/t_i`.
fn relative_least_squares<const N: usize>(rows: &[([f64; N], f64)]) -> Option<[f64; N]> {
    let mut a = [[0.0; N]; N];
    let mut b = [0.0; N];
    for (terms, t) in rows {
        let w: Vec<f64> = terms.iter().map(|x| x / t).collect();
        for i in 0..N {
            for j in 0..N {
                a[i][j] += w[i] * w[j];
            }
            b[i] += w[i];
        }
    }
    solve(a, b)
}

/// The fitted terms computed afresh from [`FLM_GEMMA3`], the fixed terms taken from `base`.
pub fn fit(base: &NpuParams) -> Option<NpuParams> {
    let mut dec = Vec::new();
    let mut pre = Vec::new();
    for f in &FLM_GEMMA3 {
        let s = shape(f.model)?;
        match f.phase {
            "decode" => dec.push((decode_terms(base, s, f.context, 1), 1.0 / f.tokens_per_s)),
            _ => pre.push((prefill_terms(s, f.context), f.context as f64 / f.tokens_per_s)),
        }
    }
    let [d, w, kv] = relative_least_squares(&dec)?;
    let [layer, row, flops] = relative_least_squares(&pre)?;
    Some(NpuParams {
        decode_dispatches_per_layer: d,
        weight_bytes_per_s: 1.0 / w,
        kv_bytes_per_s_per_head: 1.0 / kv,
        prefill_layer_s: layer,
        prefill_row_s: row,
        prefill_flops_per_s: 1.0 / flops,
        ..base.clone()
    })
}

/// One published figure beside the model's prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// The figure.
    pub published: Published,
    /// The model's tokens per second.
    pub predicted: f64,
    /// `predicted / published - 1`.
    pub error: f64,
}

/// Every published figure beside the prediction of `p`.
pub fn calibration(p: &NpuParams) -> Vec<Check> {
    FLM_GEMMA3
        .iter()
        .filter_map(|f| {
            let predicted = predict(p, f)?;
            Some(Check {
                published: *f,
                predicted,
                error: predicted / f.tokens_per_s - 1.0,
            })
        })
        .collect()
}

/// The largest |error| of a phase's figures: the NPU side's stated uncertainty for it.
pub fn max_error(checks: &[Check], phase: &str) -> f64 {
    checks
        .iter()
        .filter(|c| c.published.phase == phase)
        .map(|c| c.error.abs())
        .fold(0.0, f64::max)
}

/// A Ryzen AI laptop class.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Laptop {
    /// `Strix`, `Krackan`.
    pub name: &'static str,
    /// Its iGPU.
    pub gpu: &'static GpuModel,
}

/// The two laptops the question names (both have the same 8-column XDNA2 NPU).
pub const LAPTOPS: [Laptop; 2] = [
    Laptop {
        name: "Strix (Ryzen AI 9 HX 370, Radeon 890M)",
        gpu: &params::RADEON_890M,
    },
    Laptop {
        name: "Krackan (Ryzen AI 7 350, Radeon 860M)",
        gpu: &params::RADEON_860M,
    },
];

/// The placements ranked.
pub const PLACEMENTS: [&str; 6] = [
    "gpu-only",
    "npu-attention+gpu",
    "npu-attention+gpu overlapped (bound)",
    "npu-prefill+gpu-decode (AMD hybrid)",
    "layer split: first half npu, rest gpu",
    "whole model on npu",
];

/// A phase at a batch: decode steps of `batch` sequences at `context`, or `batch` prompts of
/// `context` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Case {
    /// `decode` or `prefill`.
    pub phase: &'static str,
    /// Sequences.
    pub batch: usize,
    /// Positions seen (decode) or prompt length (prefill).
    pub context: usize,
}

/// One placement's modelled time: the NPU's share and the iGPU's share (each with its own
/// uncertainty) and what the pair means in tokens per second.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    /// One of [`PLACEMENTS`].
    pub placement: &'static str,
    /// Seconds on (or caused by) the NPU, at the calibration's error.
    pub npu_s: f64,
    /// Seconds on the iGPU (and hand-offs), at [`GPU_UNCERTAINTY`].
    pub gpu_s: f64,
    /// Tokens per second, central.
    pub tokens_per_s: f64,
    /// Tokens per second with every term at its slow end.
    pub low: f64,
    /// Tokens per second with every term at its fast end.
    pub high: f64,
}

/// iGPU seconds for `case` from [`gpu::step`]: (all ops, attention only).
fn gpu_s(s: &Shape, gpu: &'static GpuModel, case: Case) -> (f64, f64) {
    let one = |rows, start, phase| gpu::step(s, gpu, Step { phase, rows, start });
    match case.phase {
        "decode" => {
            // b rows at once for the matrices; each row's attention over its own cache.
            let all = one(case.batch, case.context - 1, "decode");
            let att = one(1, case.context - 1, "decode").attention_s * case.batch as f64;
            (all.all_s - all.attention_s + att, att)
        }
        _ => {
            let o = one(case.context, 0, "prefill");
            let b = case.batch as f64;
            (o.all_s * b, o.attention_s * b)
        }
    }
}

/// NPU seconds for tandem's attention kernel over a case's layers (one dispatch per layer, the
/// KV streamed at the fitted per-head bandwidth, prefill FLOPs at the fitted rate), and the
/// bytes it streams.
fn npu_attention_s(p: &NpuParams, s: &Shape, case: Case) -> (f64, f64) {
    let dispatch = s.layers as f64 * (p.dispatch_floor_s + p.rtp_words * p.rtp_word_s);
    let kv_bw = p.kv_bytes_per_s_per_head * s.kv_heads as f64;
    match case.phase {
        "decode" => {
            let bytes = case.batch as f64 * decode_kv_elems(s, case.context) * p.kv_bytes;
            (dispatch + bytes / kv_bw, bytes)
        }
        _ => {
            let flops = prefill_attention_flops(s, case.context) * case.batch as f64;
            let bytes = case.batch as f64 * decode_kv_elems(s, case.context) * p.kv_bytes;
            (
                case.batch as f64 * dispatch + (flops / p.prefill_flops_per_s).max(bytes / kv_bw),
                bytes,
            )
        }
    }
}

/// Every placement's estimate for `s` on `laptop` in `case`; `npu_err` is the calibration
/// error of the case's phase.
pub fn estimates(p: &NpuParams, s: &Shape, laptop: &Laptop, case: Case, npu_err: f64) -> Vec<Estimate> {
    let gpu = laptop.gpu;
    let (gpu_all, gpu_att) = gpu_s(s, gpu, case);
    let gpu_rest = gpu_all - gpu_att;
    // Overlap needs two micro-batches, each reading the weights on its own.
    let half = Case {
        batch: (case.batch / 2).max(1),
        ..case
    };
    let (half_all, half_att) = gpu_s(s, gpu, half);
    let gpu_rest_overlapped = (half_all - half_att) * (case.batch as f64 / half.batch as f64).max(2.0)
        / if case.batch == 1 { 2.0 } else { 1.0 };
    let (npu_att, npu_att_bytes) = npu_attention_s(p, s, case);
    let handoffs = 2.0
        * s.layers as f64
        * gpu.handoff_s
        * if case.phase == "decode" {
            1.0
        } else {
            case.batch as f64
        };
    let npu_whole = match case.phase {
        "decode" => npu_decode_s(p, s, case.context, case.batch),
        _ => case.batch as f64 * npu_prefill_s(p, s, case.context),
    };
    // Gemma's KV cache written by the NPU in bf16, read by the iGPU in f16: one conversion pass.
    let kv_handover = case.batch as f64 * decode_kv_elems(s, case.context) * 2.0 * 2.0 / gpu.bytes_per_s;
    // The iGPU's bytes when its share runs beside the NPU's (the weights, at 4.5 bits).
    let (layer, head) = weights(s);
    let gpu_bytes = (s.layers as f64 * layer + head) * params::GPU_WEIGHT_BITS / 8.0;
    let passes = if case.batch > 1 { 2.0 } else { 1.0 };
    let overlap_floor = (passes * gpu_bytes + npu_att_bytes) / SHARED_BYTES_PER_S;
    let tokens = case.batch as f64
        * if case.phase == "decode" {
            1.0
        } else {
            case.context as f64
        };
    let rows: [(&'static str, f64, f64); 6] = [
        (PLACEMENTS[0], 0.0, gpu_all),
        (PLACEMENTS[1], npu_att, gpu_rest + handoffs),
        // Two micro-batches: the NPU's attention of one beside the iGPU's rest of the other,
        // both streaming from the same LPDDR5X (a bound: perfect overlap).
        (PLACEMENTS[2], 0.0, 0.0),
        match case.phase {
            "decode" => (PLACEMENTS[3], 0.0, gpu_all),
            _ => (PLACEMENTS[3], npu_whole, kv_handover),
        },
        (
            PLACEMENTS[4],
            npu_whole / 2.0,
            gpu_all / 2.0 + gpu.handoff_s * 2.0,
        ),
        (PLACEMENTS[5], npu_whole, 0.0),
    ];
    // A decode step of one sequence has nothing to overlap with.
    let overlap_applies = case.phase != "decode" || case.batch > 1;
    rows.iter()
        .filter(|r| overlap_applies || r.0 != PLACEMENTS[2])
        .map(|&(placement, npu_s, gpu_s)| {
            let time = |ne: f64, ge: f64| {
                if placement == PLACEMENTS[2] {
                    (gpu_rest_overlapped * ge)
                        .max(npu_att * ne)
                        .max(overlap_floor * ge)
                        + handoffs * ge
                } else {
                    npu_s * ne + gpu_s * ge
                }
            };
            let (npu_s, gpu_s) = if placement == PLACEMENTS[2] {
                let t = time(1.0, 1.0);
                (npu_att.min(t), t - npu_att.min(t))
            } else {
                (npu_s, gpu_s)
            };
            Estimate {
                placement,
                npu_s,
                gpu_s,
                tokens_per_s: tokens / time(1.0, 1.0),
                low: tokens / time(1.0 + npu_err, 1.0 + GPU_UNCERTAINTY),
                high: tokens / time(1.0 - npu_err, 1.0 - GPU_UNCERTAINTY),
            }
        })
        .collect()
}

/// The cases the laptop answer covers: decode at 1k positions and 1k-token prompts, each at
/// batch 1 and 8.
pub const CASES: [Case; 4] = [
    Case {
        phase: "prefill",
        batch: 1,
        context: 1024,
    },
    Case {
        phase: "prefill",
        batch: 8,
        context: 1024,
    },
    Case {
        phase: "decode",
        batch: 1,
        context: 1024,
    },
    Case {
        phase: "decode",
        batch: 8,
        context: 1024,
    },
];

/// One ranked table: a model, a laptop, a case, its placements fastest first.
#[derive(Debug, Clone, Serialize)]
pub struct Ranking {
    /// `1B`, `4B`.
    pub model: &'static str,
    /// The laptop's name.
    pub laptop: &'static str,
    /// The case.
    pub case: Case,
    /// Fastest first.
    pub ranked: Vec<Estimate>,
    /// Whether the first is faster than the second even with the first at its slow end and
    /// the second at its fast end.
    pub clear: bool,
}

/// The laptop answer: every model, laptop and case, ranked, with the calibrated parameters.
pub fn rankings(p: &NpuParams) -> Vec<Ranking> {
    let checks = calibration(p);
    let mut out = Vec::new();
    for s in [&GEMMA3_1B, &GEMMA3_4B] {
        for laptop in &LAPTOPS {
            for case in CASES {
                let mut ranked = estimates(p, s, laptop, case, max_error(&checks, case.phase));
                ranked.sort_by(|a, b| b.tokens_per_s.total_cmp(&a.tokens_per_s));
                let clear = ranked.len() < 2 || ranked[0].low > ranked[1].high;
                out.push(Ranking {
                    model: s.name,
                    laptop: laptop.name,
                    case,
                    ranked,
                    clear,
                });
            }
        }
    }
    out
}

/// The calibrated parameters.
pub fn calibrated() -> &'static NpuParams {
    &XDNA2
}

/// The laptop whose iGPU a backend's device name names (Mesa's `AMD Radeon 890M Graphics
/// (RADV GFX1150)`, `... 860M ...`), when the model has figures for it.
pub fn laptop_for_gpu(device: &str) -> Option<&'static Laptop> {
    let d = device.to_ascii_lowercase();
    if d.contains("890m") {
        Some(&LAPTOPS[0])
    } else if d.contains("860m") {
        Some(&LAPTOPS[1])
    } else {
        None
    }
}

/// Whether the model has figures for an NPU of this amdxdna generation: the XDNA2 parts
/// (`npu4`, `npu5`, `npu6`), which FastFlowLM's figures and IRON's dispatch floor were
/// measured on. Not `npu1` (XDNA, 4 columns), nor the early `npu2`.
pub fn npu_has_figures(generation: &str) -> bool {
    matches!(generation, "npu4" | "npu5" | "npu6")
}

/// What `auto` asks of the model on a machine with an XDNA2 NPU beside a known iGPU: one
/// sequence's decode at `context` positions with the whole model on the iGPU, and with
/// attention on the NPU and the rest on the iGPU (the two placements tandem can run with an NPU:
/// its kernels are attention only).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AutoDecode {
    /// [`PLACEMENTS`]`[0]`, `gpu-only`.
    pub gpu_only: Estimate,
    /// [`PLACEMENTS`]`[1]`, `npu-attention+gpu`.
    pub npu_attention: Estimate,
    /// The calibration's decode error, the NPU side's uncertainty.
    pub npu_error: f64,
}

/// The model's [`AutoDecode`] for `s` on `laptop` at `context` positions (at least 1).
pub fn auto_decode(s: &Shape, laptop: &Laptop, context: usize) -> AutoDecode {
    let p = calibrated();
    let npu_error = max_error(&calibration(p), "decode");
    let case = Case {
        phase: "decode",
        batch: 1,
        context: context.max(1),
    };
    let all = estimates(p, s, laptop, case, npu_error);
    let find = |name: &str| all.iter().find(|e| e.placement == name).cloned();
    // Batch-1 decode has no overlapped row; the other two are always there.
    let (Some(gpu_only), Some(npu_attention)) = (find(PLACEMENTS[0]), find(PLACEMENTS[1])) else {
        unreachable!("estimates always returns gpu-only and npu-attention+gpu")
    };
    AutoDecode {
        gpu_only,
        npu_attention,
        npu_error,
    }
}

/// Whether `a` is slower than `b` at every end of the model's uncertainty: the NPU's terms
/// scaled by `1 +- npu_error` and the iGPU's by `1 +- GPU_UNCERTAINTY`, the same factor for
/// both placements (they run on the same NPU and iGPU, so a parameter that is off is off for
/// both). For placements whose time is `npu_s + gpu_s` (not the overlapped bound).
pub fn slower_everywhere(a: &Estimate, b: &Estimate, npu_error: f64) -> bool {
    let corners = [1.0 - npu_error, 1.0 + npu_error]
        .into_iter()
        .flat_map(|n| [1.0 - GPU_UNCERTAINTY, 1.0 + GPU_UNCERTAINTY].map(|g| (n, g)));
    corners
        .into_iter()
        .all(|(n, g)| a.npu_s * n + a.gpu_s * g > b.npu_s * n + b.gpu_s * g)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stated error of the fit: every published figure within these of its prediction.
    const DECODE_ERROR: f64 = 0.12;
    const PREFILL_ERROR: f64 = 0.10;

    #[test]
    fn the_stored_parameters_reproduce_the_published_figures() {
        let checks = calibration(&XDNA2);
        assert_eq!(checks.len(), FLM_GEMMA3.len());
        for c in &checks {
            let bound = if c.published.phase == "decode" {
                DECODE_ERROR
            } else {
                PREFILL_ERROR
            };
            assert!(c.error.abs() <= bound, "{c:?}");
        }
        // The four 1k figures the issue names, tighter.
        for c in checks.iter().filter(|c| c.published.context == 1024) {
            assert!(c.error.abs() <= 0.05, "{c:?}");
        }
    }

    #[test]
    fn the_stored_parameters_are_the_fit_rounded() {
        let f = fit(&XDNA2).unwrap();
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 0.01;
        assert!(
            close(f.decode_dispatches_per_layer, XDNA2.decode_dispatches_per_layer),
            "{f:?}"
        );
        assert!(close(f.weight_bytes_per_s, XDNA2.weight_bytes_per_s), "{f:?}");
        assert!(
            close(f.kv_bytes_per_s_per_head, XDNA2.kv_bytes_per_s_per_head),
            "{f:?}"
        );
        assert!(close(f.prefill_layer_s, XDNA2.prefill_layer_s), "{f:?}");
        assert!(close(f.prefill_row_s, XDNA2.prefill_row_s), "{f:?}");
        assert!(close(f.prefill_flops_per_s, XDNA2.prefill_flops_per_s), "{f:?}");
    }

    #[test]
    fn least_squares_recovers_an_exact_model() {
        let rows: Vec<([f64; 2], f64)> = (1..5)
            .map(|i| {
                let t = [i as f64, (i * i) as f64];
                (t, 3.0 * t[0] + 0.5 * t[1])
            })
            .collect();
        let [a, b] = relative_least_squares(&rows).unwrap();
        assert!((a - 3.0).abs() < 1e-9 && (b - 0.5).abs() < 1e-9);
    }

    #[test]
    fn auto_knows_the_two_laptops_and_xdna2_only() {
        assert_eq!(
            laptop_for_gpu("AMD Radeon 890M Graphics (RADV GFX1150)").map(|l| l.name),
            Some(LAPTOPS[0].name)
        );
        assert_eq!(
            laptop_for_gpu("AMD Radeon 860M").map(|l| l.name),
            Some(LAPTOPS[1].name)
        );
        assert!(laptop_for_gpu("NVIDIA H100 80GB HBM3").is_none());
        assert!(npu_has_figures("npu4") && !npu_has_figures("npu1"));
    }

    #[test]
    fn auto_decode_puts_npu_attention_behind_the_igpu_everywhere() {
        for laptop in &LAPTOPS {
            for s in [&GEMMA3_1B, &GEMMA3_4B] {
                let a = auto_decode(s, laptop, 80);
                assert!(a.npu_error > 0.0 && a.npu_error < DECODE_ERROR);
                assert_eq!(a.gpu_only.npu_s, 0.0);
                assert!(
                    slower_everywhere(&a.npu_attention, &a.gpu_only, a.npu_error),
                    "{a:?}"
                );
                assert!(!slower_everywhere(&a.gpu_only, &a.npu_attention, a.npu_error));
                assert!(!slower_everywhere(&a.gpu_only, &a.gpu_only, a.npu_error));
            }
        }
    }

    #[test]
    fn every_case_ranks_every_placement_with_bounds_around_it() {
        let r = rankings(&XDNA2);
        assert_eq!(r.len(), 2 * 2 * CASES.len());
        for t in &r {
            let overlap = t.case.phase != "decode" || t.case.batch > 1;
            assert_eq!(t.ranked.len(), PLACEMENTS.len() - usize::from(!overlap));
            for e in &t.ranked {
                assert!(e.low <= e.tokens_per_s && e.tokens_per_s <= e.high, "{e:?}");
            }
            assert!(t.ranked[0].tokens_per_s >= t.ranked[1].tokens_per_s);
        }
    }
}
