//! `Op::Attention`: the K/V store into the cache (unless a fused norm-rope group did it), the
//! attention proper, split over the cached positions where the grid would be small, and the
//! combination of the splits.
//!
//! The attention proper:
//! - `attention_gqa` for one-row decode ([`GQA_MAX_ROWS`]) where `head_dim <= 256` (every
//!   Gemma 3): one workgroup of 128 per (KV head,
//!   row, split) attends all `heads / kv_heads` query heads of that KV head (8 at a time), so each
//!   cached K and V row is read once per group; scores of 4 positions per subgroup at once with
//!   vec4 loads, values accumulated by (4 dimensions, every R-th position) invocations with their
//!   own online softmax, merged at the end. Grid `[kv_heads, rows, splits]`.
//! - `attention` otherwise (prefill, and head_dim up to 512): one workgroup of 64 per (query
//!   head, row, split). Grid `[heads, rows, splits]`. On the H100 it beats `attention_gqa` in
//!   prefill (4B q4_k, 512 rows: 31.6 ms of attention against 76.0), where `attention_gqa` wins
//!   decode (0.88 ms a step against 1.98).
//!
//! `TANDEM_VULKAN_ATTENTION=gqa|plain` forces one kernel (where the head fits), for tuning runs.
//!
//! Both use [`attention_splits`] splits (what `attention_scratch_bytes` sizes the scratch for),
//! and write split partials as `[rows][heads][splits][head_dim]` unnormalised outputs followed,
//! in the same scratch buffer, by `[rows][heads][splits][2]` maxima and sums;
//! `attention_combine` (one workgroup of 256 per (head, row, 64 dimensions)) merges them.

use tandem_backend_api::plan::{attention_splits, div_up};
use tandem_backend_api::{BackendError, DType, Op};

use super::cmd::{Access, Cmd, Push};
use super::{Ctx, WG};
use crate::VulkanBackend;

/// `attention_gqa` takes heads of at most this size (its shared memory holds 8 heads' queries).
const GQA_MAX_HEAD_DIM: usize = 256;

/// Rows up to which attention takes `attention_gqa` (single-sequence decode). H100, decode
/// tok/s with `attention_gqa` against `attention`: 1 row 207 against 194 (4B q4_k), 329
/// against 279 (1B); batched, 4 rows 305 against 335, 8 rows 395 against 422, 16 rows 438
/// against 468, 32 rows 554 against 603 (4B).
const GQA_MAX_ROWS: usize = 1;

/// Whether an attention of `rows` rows and heads of `head_dim` takes `attention_gqa`.
fn use_gqa(rows: usize, head_dim: usize) -> bool {
    if head_dim > GQA_MAX_HEAD_DIM {
        return false;
    }
    match std::env::var("TANDEM_VULKAN_ATTENTION").as_deref() {
        Ok("gqa") => true,
        Ok("plain") => false,
        _ => rows <= GQA_MAX_ROWS,
    }
}

impl VulkanBackend {
    /// The commands of attention node `node`.
    pub(super) fn lower_attention(&self, ctx: &Ctx, node: usize) -> Result<Vec<Cmd>, BackendError> {
        let n = &ctx.graph.nodes[node];
        let Op::Attention {
            q,
            k,
            v,
            cache,
            heads,
            kv_heads,
            head_dim,
            scale,
            window,
            softcap,
        } = &n.op
        else {
            return Err(BackendError::internal(format!("node {node} is not an attention")));
        };
        let kb = &self.buffer(cache.k)?.mem;
        let vb = &self.buffer(cache.v)?.mem;
        let (kc, vc) = (kb.address, vb.address);
        let caches = [(kc, kc + kb.size), (vc, vc + vb.size)];
        let f16 = u32::from(cache.dtype == DType::F16);
        let kv_cols = kv_heads * head_dim;
        let rows = ctx.graph.rows;
        let mut cmds = Vec::new();
        if !ctx.stored[node] {
            cmds.push(Cmd::Dispatch {
                kernel: "kv_store".into(),
                spec: [0, 0],
                push: Push::default()
                    .u64(ctx.addr(*k)?)
                    .u64(ctx.addr(*v)?)
                    .u64(kc)
                    .u64(vc)
                    .u64(ctx.positions())
                    .u64(ctx.slots())
                    .u32(kv_cols as u32)
                    .u32(cache.capacity as u32)
                    .u32(f16)
                    .0,
                groups: [div_up(kv_cols, WG as usize), rows as u32, 1],
                access: Access::new([ctx.span(*k)?, ctx.span(*v)?], caches),
            });
        }
        let splits = attention_splits(rows, *heads, *window, cache.capacity);
        let out = ctx.addr(n.outputs[0])?;
        let out_span = ctx.span(n.outputs[0])?;
        let reads = [ctx.span(*q)?, caches[0], caches[1]];
        // Partials: outputs, then maxima and sums.
        let part_o = ctx.scratch.0;
        let part_ml = part_o + (rows * heads * splits * head_dim * 4) as u64;
        let (kernel, wgs) = if use_gqa(rows, *head_dim) {
            ("attention_gqa", *kv_heads)
        } else {
            ("attention", *heads)
        };
        cmds.push(Cmd::Dispatch {
            kernel: kernel.into(),
            spec: [0, 0],
            push: Push::default()
                .u64(ctx.addr(*q)?)
                .u64(kc)
                .u64(vc)
                .u64(out)
                .u64(ctx.positions())
                .u64(ctx.slots())
                .u64(part_o)
                .u64(part_ml)
                .u32(*heads as u32)
                .u32(*kv_heads as u32)
                .u32(*head_dim as u32)
                .u32(cache.capacity as u32)
                .f32(*scale)
                .u32(window.unwrap_or(0) as u32)
                .f32(softcap.unwrap_or(0.0))
                .u32(f16)
                .u32(splits as u32)
                .0,
            groups: [wgs as u32, rows as u32, splits as u32],
            access: Access::new(reads, [if splits > 1 { ctx.scratch } else { out_span }]),
        });
        if splits > 1 {
            cmds.push(Cmd::Dispatch {
                kernel: "attention_combine".into(),
                spec: [0, 0],
                push: Push::default()
                    .u64(part_o)
                    .u64(part_ml)
                    .u64(out)
                    .u32(*heads as u32)
                    .u32(*head_dim as u32)
                    .u32(splits as u32)
                    .0,
                groups: [*heads as u32, rows as u32, div_up(*head_dim, 64)],
                access: Access::new([ctx.scratch], [out_span]),
            });
        }
        Ok(cmds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_takes_the_grouped_kernel_and_prefill_the_plain_one() {
        if std::env::var_os("TANDEM_VULKAN_ATTENTION").is_some() {
            return;
        }
        assert!(use_gqa(1, 256));
        assert!(use_gqa(GQA_MAX_ROWS, 64));
        assert!(!use_gqa(GQA_MAX_ROWS + 1, 64));
        assert!(!use_gqa(1, 512));
    }
}
