//! The Gemma 3 shapes and the laptop iGPU's per-op roofline: every op costed as bytes over
//! bandwidth or FLOPs over throughput, whichever is larger, plus a fixed cost per dispatch.
//! Nothing here is measured; each GPU's figures carry their sources (see [`crate::params`]).

use serde::Serialize;

/// A Gemma 3 size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Shape {
    /// `1B`, `4B` (or what the caller calls the model it describes).
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
    /// Sliding window of the local layers (five of every six).
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

/// Bytes per weight of Q4_K_M (4.5 bits for most matrices).
pub const WEIGHT_BYTES: f64 = 4.5 / 8.0;

/// One step of a model on the iGPU alone.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuStep {
    /// Seconds with every op on the GPU.
    pub all_s: f64,
    /// Of `all_s`, the attention ops.
    pub attention_s: f64,
}

fn roofline(gpu: &GpuModel, bytes: f64, flops: f64) -> f64 {
    gpu.node_s + (bytes / gpu.bytes_per_s).max(flops / gpu.flops_per_s)
}

/// Whether layer `l` is a local (sliding-window) layer: five of every six.
pub fn local(l: usize) -> bool {
    !(l + 1).is_multiple_of(6)
}

/// Costs one step of `shape` on `gpu`, every op on the GPU.
pub fn step(shape: &Shape, gpu: &GpuModel, step: Step) -> GpuStep {
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
    let mut all = 0.0;
    let mut attention = 0.0;
    for layer in 0..shape.layers {
        let local = local(layer);
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
        let att = roofline(
            gpu,
            span * kv_cols * 2.0 * 2.0 + rows * q_cols * 8.0,
            4.0 * seen * shape.heads as f64 * d,
        );
        all += other + att;
        attention += att;
    }
    all += matmul(shape.vocab as f64, h) + roofline(gpu, shape.vocab as f64 * 4.0, 0.0);
    GpuStep {
        all_s: all,
        attention_s: attention,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_on_the_gpu_is_bound_by_the_weights() {
        let o = step(
            &GEMMA3_1B,
            &crate::params::RADEON_890M,
            Step {
                phase: "decode",
                rows: 1,
                start: 1023,
            },
        );
        // ~0.99 G matrix weights (with the tied embedding as the logits matrix) at 4.5 bits.
        let weights =
            26.0 * (1152.0 * (1024.0 + 512.0) + 1024.0 * 1152.0 + 3.0 * 1152.0 * 6912.0) + 262_144.0 * 1152.0;
        let floor = weights * WEIGHT_BYTES / crate::params::RADEON_890M.bytes_per_s;
        assert!(o.all_s > floor && o.all_s < floor * 1.6, "{o:?} vs {floor}");
        assert!(o.attention_s > 0.0 && o.attention_s < o.all_s);
    }
}
