//! The simulation behind `npu-sim`: on a Ryzen AI laptop, is `npu+vulkan` (attention on the NPU,
//! the rest on the integrated GPU) faster than `vulkan` alone for Gemma 3 1B and 4B? Nothing
//! here is measured: the NPU's figures are [`crate::cost`]'s, the GPUs' are below, each with
//! its source or labelled an assumption. Every op is costed as a roofline (bytes over
//! bandwidth or FLOPs over throughput, whichever is larger) plus a fixed cost per dispatch.
//!
//! The split is costed as tandem schedules it at batch 1: serially, layer by layer, with two
//! hand-offs per layer (to the NPU before attention, back after), each a GPU fence the host
//! waits for and a new submission. The hand-off assumes zero-copy buffers (the NPU reads the
//! same DRAM), which tandem's scheduler does not do yet (it stages through host copies): the
//! simulation is the split's best case. An "overlap" bound, where NPU and GPU work of
//! different micro-batches run at once, is given for prefill.

use serde::Serialize;

use crate::contract::AttnParams;
use crate::cost::{self, NpuModel};

/// A Gemma 3 size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Shape {
    /// `1B`, `4B`.
    pub name: &'static str,
    /// Hidden size.
    pub hidden: usize,
    /// FFN width.
    pub intermediate: usize,
    /// Layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head size.
    pub head_dim: usize,
    /// Sliding window of the local layers.
    pub window: usize,
    /// Vocabulary.
    pub vocab: usize,
}

/// Gemma 3 1B (`shared/design/gemma3.md`).
pub const GEMMA3_1B: Shape = Shape {
    name: "1B",
    hidden: 1152,
    intermediate: 6912,
    layers: 26,
    heads: 4,
    kv_heads: 1,
    head_dim: 256,
    window: 512,
    vocab: 262_144,
};

/// Gemma 3 4B's text model.
pub const GEMMA3_4B: Shape = Shape {
    name: "4B",
    hidden: 2560,
    intermediate: 10240,
    layers: 34,
    heads: 8,
    kv_heads: 4,
    head_dim: 256,
    window: 1024,
    vocab: 262_208,
};

/// An integrated GPU's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuModel {
    /// The part.
    pub name: &'static str,
    /// DRAM bandwidth reached by streaming reads, bytes per second.
    pub bytes_per_s: f64,
    /// f16 matrix throughput reached by a good kernel, FLOP per second.
    pub flops_per_s: f64,
    /// The fixed cost of one dispatch inside a recorded command buffer.
    pub node_s: f64,
    /// A hand-off to or from another unit: the host waits for a fence, then submits.
    pub handoff_s: f64,
    /// Where the figures come from.
    pub sources: &'static [&'static str],
}

/// Radeon 780M (Phoenix), DDR5-5600 dual channel.
pub const RADEON_780M: GpuModel = GpuModel {
    name: "Radeon 780M (Phoenix), DDR5-5600",
    bytes_per_s: 63e9,
    flops_per_s: 4.3e12,
    node_s: 4e-6,
    handoff_s: 20e-6,
    sources: &[
        "bandwidth: 89.6 GB/s peak for DDR5-5600 dual channel (the memory of the Phoenix laptop chipsandcheese tested); assumed 70% reached",
        "f16: 12 CUs x 64 lanes x 2 (dual issue) x 2 (FMA) x 2.8 GHz = 8.6 TFLOPS peak; assumed half reached",
        "dispatch: ~4 us, the smallest node of tandem's Vulkan backend on the H100 (issue 21), assumed the same",
        "hand-off: assumed 20 us for a fence wait and a submission; not measured on an iGPU",
    ],
};

/// Radeon 890M (Strix Point), LPDDR5X-7500.
pub const RADEON_890M: GpuModel = GpuModel {
    name: "Radeon 890M (Strix), LPDDR5X-7500",
    bytes_per_s: 84e9,
    flops_per_s: 6e12,
    node_s: 4e-6,
    handoff_s: 20e-6,
    sources: &[
        "bandwidth: 120 GB/s peak for LPDDR5X-7500 on a 128-bit bus; assumed 70% reached",
        "f16: 16 CUs x 64 x 2 x 2 x 2.9 GHz = 11.9 TFLOPS peak; assumed half reached",
        "dispatch and hand-off: as for the 780M (assumptions)",
    ],
};

/// A laptop: an NPU beside an iGPU.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Laptop {
    /// `Phoenix`, `Strix`.
    pub name: &'static str,
    /// The NPU.
    pub npu: &'static NpuModel,
    /// The GPU.
    pub gpu: &'static GpuModel,
}

/// The two laptop classes the question names.
pub const LAPTOPS: [Laptop; 2] = [
    Laptop {
        name: "Phoenix (Ryzen 7 7840HS class)",
        npu: &cost::NPU1,
        gpu: &RADEON_780M,
    },
    Laptop {
        name: "Strix (Ryzen AI 9 HX 370 class)",
        npu: &cost::NPU4,
        gpu: &RADEON_890M,
    },
];

/// One step to cost: `rows` new tokens of one sequence, the first at position `start`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Step {
    /// `decode` or `prefill`.
    pub phase: &'static str,
    /// Tokens in the step.
    pub rows: usize,
    /// Position of the first.
    pub start: usize,
}

/// The answer for one (model, laptop, step).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// Seconds with every op on the GPU.
    pub vulkan_s: f64,
    /// Seconds with attention on the NPU, serial as tandem schedules it.
    pub split_s: f64,
    /// Seconds if the NPU's attention and the GPU's work overlapped perfectly (a bound).
    pub overlap_s: f64,
    /// Of `vulkan_s`, the attention ops.
    pub gpu_attention_s: f64,
    /// Of `split_s`, the NPU dispatches.
    pub npu_s: f64,
    /// Of `split_s`, the hand-offs.
    pub handoff_s: f64,
}

/// Bytes per weight of Q4_K_M (4.5 bits for most matrices).
pub const WEIGHT_BYTES: f64 = 4.5 / 8.0;

fn roofline(gpu: &GpuModel, bytes: f64, flops: f64) -> f64 {
    gpu.node_s + (bytes / gpu.bytes_per_s).max(flops / gpu.flops_per_s)
}

/// Costs one step of `shape` on `laptop`.
pub fn simulate(shape: &Shape, laptop: &Laptop, step: Step) -> Outcome {
    let gpu = laptop.gpu;
    let (h, d, rows) = (shape.hidden as f64, shape.head_dim as f64, step.rows as f64);
    let q_cols = (shape.heads * shape.head_dim) as f64;
    let kv_cols = (shape.kv_heads * shape.head_dim) as f64;
    let matmul = |n: f64, k: f64| {
        roofline(
            gpu,
            n * k * WEIGHT_BYTES + rows * (n + k) * 4.0,
            2.0 * rows * n * k,
        )
    };
    let elementwise = |cols: f64| roofline(gpu, rows * cols * 4.0 * 3.0, rows * cols * 4.0);
    let mut vulkan = 0.0;
    let mut rest = 0.0;
    let mut gpu_attention = 0.0;
    let mut npu = 0.0;
    for layer in 0..shape.layers {
        let local = (layer + 1) % 6 != 0;
        let other = matmul(q_cols + 2.0 * kv_cols, h)
            + matmul(h, q_cols)
            + matmul(2.0 * shape.intermediate as f64, h)
            + matmul(h, shape.intermediate as f64)
            + 6.0 * elementwise(h)
            + 2.0 * elementwise(q_cols)
            + elementwise(shape.intermediate as f64);
        // Attention: row r at position start + r sees `visible(r)` keys.
        let visible = |r: usize| {
            let p = step.start + r + 1;
            if local {
                p.min(shape.window)
            } else {
                p
            }
        };
        let seen: f64 = (0..step.rows).map(|r| visible(r) as f64).sum();
        let first = if local {
            (step.start + 1).saturating_sub(shape.window)
        } else {
            0
        };
        let span = (step.start + step.rows - first) as f64;
        // The GPU's cache is f16; each row block reads its span of K and V once.
        let att_gpu = roofline(
            gpu,
            span * kv_cols * 2.0 * 2.0 + rows * q_cols * 8.0,
            4.0 * seen * shape.heads as f64 * d,
        );
        let params = AttnParams {
            rows: step.rows,
            heads: shape.heads,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            capacity: if local {
                shape.window + step.rows
            } else {
                step.start + step.rows
            },
            window: local.then_some(shape.window),
            scale: 1.0,
            slots: 1,
            positions: (step.start as u32..(step.start + step.rows) as u32).collect(),
            row_slots: vec![0; step.rows],
        };
        let att_npu = cost::dispatch(laptop.npu, &params).seconds;
        vulkan += other + att_gpu;
        rest += other;
        gpu_attention += att_gpu;
        npu += att_npu;
    }
    let head = matmul(shape.vocab as f64, h) + roofline(gpu, shape.vocab as f64 * 4.0, 0.0);
    vulkan += head;
    rest += head;
    let handoff = 2.0 * shape.layers as f64 * gpu.handoff_s;
    Outcome {
        vulkan_s: vulkan,
        split_s: rest + npu + handoff,
        overlap_s: rest.max(npu) + handoff,
        gpu_attention_s: gpu_attention,
        npu_s: npu,
        handoff_s: handoff,
    }
}

/// The steps the report covers: decode at 1k and 8k positions, a 512-token prefill chunk at
/// the start of a prompt and one at position 7680 (the end of an 8k prompt).
pub const STEPS: [Step; 4] = [
    Step {
        phase: "decode",
        rows: 1,
        start: 1023,
    },
    Step {
        phase: "decode",
        rows: 1,
        start: 8191,
    },
    Step {
        phase: "prefill",
        rows: 512,
        start: 0,
    },
    Step {
        phase: "prefill",
        rows: 512,
        start: 7680,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_on_the_gpu_is_bound_by_the_weights() {
        let o = simulate(&GEMMA3_1B, &LAPTOPS[1], STEPS[0]);
        // ~0.99 G matrix weights (with the tied embedding as the logits matrix) at 4.5 bits.
        let weights =
            26.0 * (1152.0 * (1024.0 + 512.0) + 1024.0 * 1152.0 + 3.0 * 1152.0 * 6912.0) + 262_144.0 * 1152.0;
        let floor = weights * WEIGHT_BYTES / RADEON_890M.bytes_per_s;
        assert!(o.vulkan_s > floor && o.vulkan_s < floor * 1.6, "{o:?} vs {floor}");
    }

    #[test]
    fn the_split_pays_its_hand_offs_and_dispatches() {
        for laptop in &LAPTOPS {
            let o = simulate(&GEMMA3_4B, laptop, STEPS[0]);
            assert_eq!(o.handoff_s, 68.0 * laptop.gpu.handoff_s);
            assert!(o.npu_s >= 34.0 * laptop.npu.dispatch_s);
            let gpu_rest = o.vulkan_s - o.gpu_attention_s;
            assert!((o.split_s - (gpu_rest + o.npu_s + o.handoff_s)).abs() < 1e-12);
            assert!(o.overlap_s <= o.split_s);
        }
    }
}
