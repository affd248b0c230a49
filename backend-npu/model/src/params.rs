//! Every parameter of the calibrated laptop model ([`crate::calibration`]) and every published
//! figure it is fitted to, each with its source. This is the one file to edit; the test in
//! `calibration.rs` fails when a change here breaks the fit.
//!
//! Nothing here was measured by tandem: no NPU and no laptop iGPU was available. The published
//! figures were read from their sources on 2026-11-26 (see each `source`); the fitted values are
//! what `npu-sim --calibration` computes from them, rounded.

use crate::gpu::GpuModel;

/// The FastFlowLM benchmark page every NPU figure below comes from.
pub const FLM_SOURCE: &str = "FastFlowLM docs/docs/benchmarks/gemma3_results.md (FastFlowLM v0.9.23, \
     Ryzen AI 7 350 Krackan Point, 32 GB, NPU power mode Performance), read from the superm1/FastFlowLM \
     mirror of github.com/FastFlowLM/FastFlowLM; weights Q4_1 per docs/docs/models/gemma.md";

/// One published whole-model-on-NPU figure.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Published {
    /// `1B` or `4B`.
    pub model: &'static str,
    /// `decode` (tokens per second starting at `context`) or `prefill` (prompt of `context`).
    pub phase: &'static str,
    /// Context length in tokens (FastFlowLM's "1k" is taken as 1024).
    pub context: usize,
    /// Tokens per second.
    pub tokens_per_s: f64,
}

const fn fig(model: &'static str, phase: &'static str, k: usize, tokens_per_s: f64) -> Published {
    Published {
        model,
        phase,
        context: k * 1024,
        tokens_per_s,
    }
}

/// FastFlowLM's Gemma 3 table ([`FLM_SOURCE`]), every cell. The issue quoted the 1k cells, 1B
/// decode at 32k, 4B decode at 128k and the prefill peaks; all match the source.
pub const FLM_GEMMA3: [Published; 26] = [
    fig("1B", "decode", 1, 40.0),
    fig("1B", "decode", 2, 39.3),
    fig("1B", "decode", 4, 38.1),
    fig("1B", "decode", 8, 35.8),
    fig("1B", "decode", 16, 32.6),
    fig("1B", "decode", 32, 26.7),
    fig("4B", "decode", 1, 18.0),
    fig("4B", "decode", 2, 17.8),
    fig("4B", "decode", 4, 17.6),
    fig("4B", "decode", 8, 17.1),
    fig("4B", "decode", 16, 16.1),
    fig("4B", "decode", 32, 14.5),
    fig("4B", "decode", 64, 13.2),
    fig("4B", "decode", 128, 11.2),
    fig("1B", "prefill", 1, 1004.0),
    fig("1B", "prefill", 2, 1321.0),
    fig("1B", "prefill", 4, 1528.0),
    fig("1B", "prefill", 8, 1645.0),
    fig("1B", "prefill", 16, 1657.0),
    fig("1B", "prefill", 32, 1596.0),
    fig("4B", "prefill", 1, 528.0),
    fig("4B", "prefill", 2, 654.0),
    fig("4B", "prefill", 4, 738.0),
    fig("4B", "prefill", 8, 754.0),
    fig("4B", "prefill", 16, 739.0),
    fig("4B", "prefill", 32, 673.0),
];

/// The XDNA2 NPU (Strix and Krackan have the same 50-TOPS, 8-column array) running a whole
/// model as FastFlowLM does, and running tandem's attention kernel.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct NpuParams {
    /// Host-side floor of one dispatch, submit to completion seen, seconds.
    pub dispatch_floor_s: f64,
    /// Each runtime-parameter word a dispatch writes, seconds.
    pub rtp_word_s: f64,
    /// Runtime-parameter words of one FastFlowLM GEMM dispatch.
    pub rtp_words: f64,
    /// Bits per weight of the published runs' format (Q4_1: 32 weights in 20 bytes).
    pub weight_bits: f64,
    /// Bytes per cached key or value element (bf16).
    pub kv_bytes: f64,
    /// The measured rate of FastFlowLM's shipped GEMM overlay, FLOP per second (a cross-check
    /// of the fitted prefill rate, not used by the model).
    pub flm_gemm_flops_per_s: f64,
    /// The best published bf16-class GEMM rate on XDNA2, FLOP per second: the cap on the
    /// compute of a batched decode.
    pub gemm_peak_flops_per_s: f64,
    /// FITTED: dispatches per layer of a decode step, each paying the floor and its words.
    pub decode_dispatches_per_layer: f64,
    /// FITTED: bandwidth at which a decode step streams the weights, bytes per second.
    pub weight_bytes_per_s: f64,
    /// FITTED: bandwidth at which attention streams the KV cache, per KV head, bytes per second
    /// (the published decode slows with context far more for 1 KV head than for 4).
    pub kv_bytes_per_s_per_head: f64,
    /// FITTED: fixed cost per layer of one prompt's prefill, seconds.
    pub prefill_layer_s: f64,
    /// FITTED: cost per token per layer of a prefill, seconds (what scales with rows but not
    /// with FLOPs: dequantisation, norms, rope, activations, attention bookkeeping).
    pub prefill_row_s: f64,
    /// FITTED: the rate at which a prefill does its matrix and attention FLOPs, FLOP per second.
    pub prefill_flops_per_s: f64,
    /// Where each figure comes from.
    pub sources: &'static [&'static str],
}

/// The fitted XDNA2 parameters.
pub const XDNA2: NpuParams = NpuParams {
    dispatch_floor_s: 107e-6,
    rtp_word_s: 2e-6,
    rtp_words: 6.0,
    weight_bits: 5.0,
    kv_bytes: 2.0,
    flm_gemm_flops_per_s: 2.0 * 1024.0 * 1536.0 * 6144.0 / 2175e-6,
    gemm_peak_flops_per_s: 24.6e12,
    decode_dispatches_per_layer: 5.46,
    weight_bytes_per_s: 76.1e9,
    kv_bytes_per_s_per_head: 16.8e9,
    prefill_layer_s: 16.6e-3,
    prefill_row_s: 15.0e-6,
    prefill_flops_per_s: 8.63e12,
    sources: &[
        "dispatch floor ~107 us and ~2 us per runtime-parameter word: github.com/amd/IRON \
         iron/operators/flm/gemm/README.md, 'Runtime parameters' (measured on NPU2)",
        "6 runtime-parameter words per GEMM dispatch: the same section's table of six words",
        "Q4_1 weights (5 bits per weight): FastFlowLM docs/docs/models/gemma.md, gemma-3-1b-it and \
         gemma-3-4b-it model cards",
        "bf16 KV cache: assumption (FastFlowLM does not say)",
        "FastFlowLM's shipped GEMM overlay: M=1024 K=1536 N=6144 in 2175 us (8.9 TFLOP/s), IRON's \
         port of it in 1143 us (16.9 TFLOP/s): amd/IRON iron/operators/flm/gemm/README.md, \
         'Performance, NPU2'",
        "24.6 TFLOP/s BFP16-BF16 GEMM on XDNA2, 'a new performance record': arXiv 2511.16041 \
         (Wang et al., 'Can Asymmetric Tile Buffering Be Beneficial?', with AMD). The issue's \
         '~31 TFLOP/s mlir-aie GEMM peak' was not found in mlir-aie's GEMM READMEs, so it is not used",
        "fitted: weighted least squares (relative error) over every cell of FastFlowLM's Gemma 3 \
         table; `npu-sim --calibration` refits and prints each figure beside its prediction",
    ],
};

/// Radeon 890M (Ryzen AI 9 HX 370, Strix Point).
pub const RADEON_890M: GpuModel = GpuModel {
    name: "Radeon 890M (Ryzen AI 9 HX 370), LPDDR5X-7500",
    bytes_per_s: 84e9,
    flops_per_s: 5.9e12,
    node_s: 4e-6,
    handoff_s: 20e-6,
    sources: &[
        "16 RDNA 3.5 CUs at 2.9 GHz: computerbase.de/2024-07/ryzen-ai-9-hx-375-amd-macht-die-55-tops-apu-offiziell \
         (AMD's table for the HX 370); AMD's product page lists the same",
        "f16: 16 CUs x 64 lanes x 2 (dual issue) x 2 (FMA) x 2.9 GHz = 11.9 TFLOP/s peak; assumed half reached",
        "bandwidth: LPDDR5X-7500 on a 128-bit bus = 120 GB/s peak (AMD lists LPDDR5x-7500 for the HX 370); \
         assumed 70% reached by streaming reads (not measured on an iGPU)",
        "dispatch ~4 us and hand-off 20 us: assumptions (tandem's smallest Vulkan node on the H100; \
         a fence wait and a submission)",
    ],
};

/// Radeon 860M (Ryzen AI 7 350, Krackan Point).
pub const RADEON_860M: GpuModel = GpuModel {
    name: "Radeon 860M (Ryzen AI 7 350), LPDDR5X-7500",
    bytes_per_s: 84e9,
    flops_per_s: 3.1e12,
    node_s: 4e-6,
    handoff_s: 20e-6,
    sources: &[
        "8 RDNA 3.5 CUs (512 shaders): notebookcheck.net's Ryzen AI 7 450 page ('identical to the Ryzen AI 7 350' \
         but for clocks and memory) and topcpu.net's Krackan report; 3.0 GHz from AMD's product page \
         (not re-read here)",
        "f16: 8 x 64 x 2 x 2 x 3.0 GHz = 6.1 TFLOP/s peak; assumed half reached",
        "bandwidth: LPDDR5X-7500 assumed (the Krackan part allows up to LPDDR5X-8000; FastFlowLM's test \
         machine does not say which), 128-bit, 120 GB/s peak, 70% reached",
        "dispatch and hand-off: as for the 890M (assumptions)",
    ],
};

/// Bandwidth the NPU and the iGPU share when both stream at once: 70% of the LPDDR5X-7500
/// 128-bit peak (the same assumption as the iGPU's own), bytes per second.
pub const SHARED_BYTES_PER_S: f64 = 84e9;

/// Relative uncertainty of every iGPU figure (not calibrated: no published tandem-on-iGPU
/// figure exists): the 70% of peak bandwidth and 50% of peak FLOPs could be 55-85% and
/// 35-65%, roughly +-25%.
pub const GPU_UNCERTAINTY: f64 = 0.25;

/// Bits per weight of tandem's iGPU path (Q4_K_M: 4.5 bits for most matrices).
pub const GPU_WEIGHT_BITS: f64 = 4.5;
