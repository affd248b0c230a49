//! A cost model of the NPU running tandem's attention kernel: what `npu-emu` reports as its
//! profile and what the simulation (`npu-sim`) uses to answer whether an NPU would help. Every
//! figure is an assumption with a source, not a measurement of ours: no NPU was available.
//!
//! One dispatch costs `dispatch + max(dram bytes / dma bandwidth, flops / bf16 throughput)`: the
//! tiles stream K/V blocks while they compute, so the slower of the two bounds the kernel.

use serde::Serialize;

use crate::contract::{AttnParams, KV_BLOCK};

/// One NPU generation's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NpuModel {
    /// `npu1` (Phoenix, Hawk Point) or `npu4` (Strix, Krackan, Strix Halo).
    pub generation: &'static str,
    /// The parts it stands for.
    pub parts: &'static str,
    /// Host-side cost of one kernel run through the driver, submit to completion seen, in
    /// seconds.
    pub dispatch_s: f64,
    /// DRAM bandwidth the NPU's shim DMAs reach, bytes per second.
    pub dma_bytes_per_s: f64,
    /// Sustained bf16 throughput of the compute tiles, FLOP per second.
    pub bf16_flops_per_s: f64,
    /// Where each figure comes from.
    pub sources: &'static [&'static str],
}

/// Phoenix / Hawk Point (XDNA, AIE2, 4 columns of compute tiles).
pub const NPU1: NpuModel = NpuModel {
    generation: "npu1",
    parts: "Ryzen 7040 / 8040 (Phoenix, Hawk Point)",
    dispatch_s: 45e-6,
    dma_bytes_per_s: 20e9,
    bf16_flops_per_s: 3e12,
    sources: &[
        "dispatch: an empty mlir-aie kernel run and waited through XRT takes ~45 us (github Xilinx/mlir-aie issue 2381)",
        "dma: no published figure found; assumed half of npu4's, as npu1 has 4 shim columns to npu4's 8",
        "bf16: ~3 TFLOPS, the best measured bf16 GEMM on Phoenix (issue 19's facts)",
    ],
};

/// Strix / Krackan / Strix Halo (XDNA2, AIE2P, 8 columns of compute tiles).
pub const NPU4: NpuModel = NpuModel {
    generation: "npu4",
    parts: "Ryzen AI 300 / Max (Strix, Krackan, Strix Halo)",
    dispatch_s: 64e-6,
    dma_bytes_per_s: 40e9,
    bf16_flops_per_s: 15e12,
    sources: &[
        "dispatch: ~64 us per shot is the floor reported on NPU2 even with a persistent core (github Xilinx/mlir-aie issue 3793); 45 us for an empty kernel through XRT (issue 2381)",
        "dma: FastFlowLM decodes Gemma 3 4B at 18 tok/s on a Ryzen AI 7 350; with ~2.3 GB of 4-bit weights read per token that is ~40 GB/s, taken as what the NPU's DMAs sustain",
        "bf16: ~15 TFLOPS, the best measured bf16 GEMM on Strix (issue 19's facts)",
    ],
};

/// The model of a generation name (`npu1`, `npu4`; `npu5`/`npu6` are AIE2P parts like npu4).
pub fn model(generation: &str) -> Option<&'static NpuModel> {
    match generation {
        "npu1" => Some(&NPU1),
        "npu4" | "npu5" | "npu6" => Some(&NPU4),
        _ => None,
    }
}

/// What one dispatch moves and computes, and what the model makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DispatchCost {
    /// Bytes read and written in DRAM: q, the K/V blocks each tile streams, params, out.
    pub dram_bytes: f64,
    /// FLOPs of the two products (`2 d` per key per head for `q.k`, again for `p.v`).
    pub flops: f64,
    /// Modelled seconds.
    pub seconds: f64,
}

/// The modelled cost of one dispatch with these parameters.
pub fn dispatch(model: &NpuModel, p: &AttnParams) -> DispatchCost {
    let d = p.head_dim as f64;
    let group = (p.heads / p.kv_heads.max(1)) as f64;
    let visible: f64 = (0..p.rows)
        .map(|r| (p.positions[r] as usize + 1 - p.lo(r)) as f64)
        .sum();
    // Each tile (q rows of one slot x one kv head, as the kernel cuts them) streams the key
    // blocks its rows see, K and V, in bf16; every query head of the group shares them.
    let kv_positions: f64 = crate::emu::tiles(p)
        .iter()
        .map(|t| {
            let first = t.rows.iter().map(|&r| p.lo(r)).min().unwrap_or(0) / KV_BLOCK * KV_BLOCK;
            let last = t.rows.iter().map(|&r| p.positions[r] as usize).max().unwrap_or(0);
            (last + 1 - first) as f64
        })
        .sum();
    let kv_bytes = kv_positions * d * 2.0 * 2.0;
    let q_out_bytes = (p.rows * p.heads) as f64 * d * 2.0 * 2.0;
    let dram_bytes = kv_bytes + q_out_bytes + 4.0 * (9 + 2 * p.rows) as f64;
    let flops = visible * p.kv_heads as f64 * group * 4.0 * d;
    let seconds = model.dispatch_s + (dram_bytes / model.dma_bytes_per_s).max(flops / model.bf16_flops_per_s);
    DispatchCost {
        dram_bytes,
        flops,
        seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_is_bound_by_dispatch_then_by_dma() {
        let p = |pos: u32| AttnParams {
            rows: 1,
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            capacity: 32768,
            window: None,
            scale: 1.0,
            slots: 1,
            positions: vec![pos],
            row_slots: vec![0],
        };
        let short = dispatch(&NPU4, &p(10));
        assert!(short.seconds < NPU4.dispatch_s * 1.01, "{short:?}");
        // 32k positions of K and V, bf16, one kv head of 256: 32 MiB at 40 GB/s = 0.84 ms.
        let long = dispatch(&NPU4, &p(32767));
        let kv = 32768.0 * 256.0 * 2.0 * 2.0;
        assert!((long.dram_bytes - kv).abs() < 10_000.0, "{long:?}");
        let want = NPU4.dispatch_s + long.dram_bytes / NPU4.dma_bytes_per_s;
        assert!((long.seconds - want).abs() < 1e-12);
        assert!(dispatch(&NPU1, &p(32767)).seconds > long.seconds);
    }

    #[test]
    fn prefill_tiles_share_key_blocks() {
        let rows = 64;
        let p = AttnParams {
            rows,
            heads: 8,
            kv_heads: 4,
            head_dim: 256,
            capacity: 4096,
            window: None,
            scale: 1.0,
            slots: 1,
            positions: (0..rows as u32).collect(),
            row_slots: vec![0; rows],
        };
        let c = dispatch(&NPU4, &p);
        // Two 32-row tiles: positions 0..=31 and 0..=63 (one block each) per kv head.
        let kv = (32.0 + 64.0) * 4.0 * 256.0 * 4.0;
        let io = 64.0 * 8.0 * 256.0 * 4.0;
        assert_eq!(c.dram_bytes, kv + io + 4.0 * (9.0 + 128.0));
        // Causal: row r sees r + 1 keys.
        assert_eq!(c.flops, (64.0 * 65.0 / 2.0) * 8.0 * 4.0 * 256.0);
        assert!(model("npu5").is_some() && model("npu2").is_none());
    }
}
