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
use tandem_npu_model::gpu::{self, local};
pub use tandem_npu_model::gpu::{GpuModel, Shape, Step, GEMMA3_1B, GEMMA3_4B, WEIGHT_BYTES};

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

/// Costs one step of `shape` on `laptop`: the iGPU's ops from [`gpu::step`], the NPU's
/// attention dispatches from [`cost::dispatch`].
pub fn simulate(shape: &Shape, laptop: &Laptop, step: Step) -> Outcome {
    let g = gpu::step(shape, laptop.gpu, step);
    let npu: f64 = (0..shape.layers)
        .map(|layer| {
            let local = local(layer);
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
            cost::dispatch(laptop.npu, &params).seconds
        })
        .sum();
    let rest = g.all_s - g.attention_s;
    let handoff = 2.0 * shape.layers as f64 * laptop.gpu.handoff_s;
    Outcome {
        vulkan_s: g.all_s,
        split_s: rest + npu + handoff,
        overlap_s: rest.max(npu) + handoff,
        gpu_attention_s: g.attention_s,
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
