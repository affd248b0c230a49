//! `Op::Attention`: the K/V store into the cache (unless a fused norm-rope group did it), the
//! attention proper, split over the cached positions where the grid would be small, and the
//! combination of the splits.
//!
//! The attention proper:
//! - `attention_gqa` for decode ([`GQA_MAX_ROWS`]) where `head_dim <= 256` (every
//!   Gemma 3): one workgroup of 128 per (KV head,
//!   row, split) attends all `heads / kv_heads` query heads of that KV head (up to 8 at a time, a
//!   specialisation constant), so each
//!   cached K and V row is read once per group; scores of 4 positions per subgroup at once with
//!   vec4 loads, values accumulated by (4 dimensions, every R-th position) invocations with their
//!   own online softmax, merged at the end. Grid `[kv_heads, rows, splits]`.
//! - `attention_tiled` first for steps of at least 16 rows where `head_dim <= 256` (prefill
//!   chunks; the rule is `tandem_gpu_kit::attention::takes_tiled`, shared with wgpu): one workgroup of 256 per (query head, block of [`TILED_ROWS`] rows)
//!   whose rows all belong to one slot; K and V tiles of 32 positions are loaded once into
//!   shared memory for the block's rows (flash attention, f32 arithmetic). Grid
//!   `[heads, rows / 32, 1]`. Blocks of several slots (batched decode) exit at once, and
//!   `attention_gqa` (up to [`GQA_MAX_ROWS`] rows) or `attention` takes them, told by
//!   `skip_block`.
//! - `attention` otherwise: one workgroup of 64 per (query head, row, split), reading the cached rows
//!   once per query row. Grid `[heads, rows, splits]`. On the H100 it beats `attention_gqa` in
//!   prefill (4B q4_k, 512 rows: 31.6 ms of attention against 76.0), where `attention_gqa` wins
//!   decode (0.88 ms a step against 1.98).
//!
//! Images' blocks (`bidirectional_from`): every kernel above has an image-aware variant, chosen by
//! its specialisation constant 1 (`IMAGE_ROWS`) only for such attentions, so text programs keep
//! their pipelines: each row attends `lo ..= ends[r]` (its block's last position, from
//! `kit::step::visible_ends`, which `execute` writes beside the positions each step) with `lo`
//! from its own position; `attention_tiled` ends a block's key tiles at the largest end of its
//! rows. `attention_coopmat` has no such variant: image-aware attentions take `attention_tiled`.
//!
//! Where the device has KHR cooperative matrices (both tensor-core paths), the blocks
//! `attention_tiled` would take go to `attention_coopmat` instead ([`takes_coopmat_attention`]):
//! the same blocks, splits and partials, QK^T and P V on cooperative matrices with an f32 online
//! softmax, two query heads of one KV head per workgroup (grid `[heads / 2, rows / 32, splits]`).
//!
//! `TANDEM_VULKAN_ATTENTION=gqa|plain|tiled` forces one kernel (where the head fits), for tuning
//! runs (`tiled` at every row count, decode included).
//!
//! `attention_gqa` uses [`attention_splits`] splits (counting its workgroups per KV head),
//! `attention` enough for [`PLAIN_TARGET_GROUPS`] workgroups, `attention_tiled`
//! [`tiled_splits`] (of each block's key tiles); each writes its split partials as
//! `[rows][heads][splits][head_dim]` unnormalised outputs followed by `[rows][heads][splits][2]`
//! maxima and sums, the tiled kernel's after the others' in the scratch buffer
//! ([`scratch_bytes`]); `attention_combine` (one workgroup of 256 per (head, row, 64
//! dimensions)) merges them, once for each kernel's rows.

use tandem_backend_api::{BackendError, DType, Graph, Op};
use tandem_gpu_kit::attention::{
    attention_partial_bytes as partial_bytes, attention_splits, takes_tiled, TILED_BLOCK_ROWS as TILED_ROWS,
};
use tandem_gpu_kit::launch::div_up;

use super::cmd::{Access, Cmd, Push};
use super::{Ctx, WG};
use crate::VulkanBackend;

/// `attention_gqa` takes heads of at most this size (its shared memory holds 8 heads' queries).
const GQA_MAX_HEAD_DIM: usize = 256;

/// Rows up to which attention takes `attention_gqa` (decode, one sequence or a batch; above,
/// the rows `attention_tiled` leaves take `attention`). With its query heads per pass a
/// specialisation constant (a group of 2 holds 2 heads' registers, not 8), H100, decode tok/s
/// at 512 + 64 tokens against `attention`: 1B q4_k 8 sequences 1,002 against 855, 32
/// sequences 2,895 against 2,775; 4B 518 against 512 and 1,263 against 1,267, and with an f16
/// cache 1,368 against 1,210 at 32.
const GQA_MAX_ROWS: usize = 64;

/// Workgroups `attention` aims for through its splits (each split at least 16 positions). Its
/// loop over a split's positions waits on one load after another, so batched decode wants
/// short splits: H100, 32 sequences at 512 + 64 tokens, decode 1B q4_k 2,290 tok/s against
/// 1,922 at 1,024 workgroups, 4B 1,065 against 884 (`TANDEM_VULKAN_ATTENTION_GROUPS`, which
/// sets it for tuning runs; `attention_gqa` got slower with more splits: 1B 2,018 at 512, 1,879
/// at 4,096).
const PLAIN_TARGET_GROUPS: usize = 4096;

/// How many workgroups share the key tiles of one (head, block of rows) in `attention_tiled`
/// (`tandem_gpu_kit::attention::tiled_splits`); `TANDEM_VULKAN_TILED_SPLITS=n` forces n (1 to
/// 64), for tuning runs.
fn tiled_splits(rows: usize, heads: usize) -> usize {
    tandem_gpu_kit::attention::tiled_splits(rows, heads, forced_splits())
}

/// `TANDEM_VULKAN_TILED_SPLITS`, for tuning runs.
fn forced_splits() -> Option<usize> {
    std::env::var("TANDEM_VULKAN_TILED_SPLITS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
}

/// Workgroups `attention_coopmat` aims for through its splits: about one per SM of the H200's
/// 132 (its workgroups are large: 256 invocations, 43 KB of shared memory). H200, prefill 512
/// (bench/results/2026-11-28-attention-khr): 1B q4_k (2 head pairs x 16 blocks) 30,147 tok/s
/// with 4 splits against 27,785 with 1 and 28,706 with 16; 4B (4 pairs) 13,267 with 2, 13,166
/// with 4, 13,122 with 8.
const COOPMAT_TARGET_GROUPS: usize = 128;

/// How many workgroups share the key tiles of one (head pair, block of rows) in
/// `attention_coopmat`: [`COOPMAT_TARGET_GROUPS`] over its grid, rounded, 1 to 16;
/// `TANDEM_VULKAN_TILED_SPLITS` forces it too.
fn coopmat_splits(rows: usize, heads: usize) -> usize {
    if let Some(n) = forced_splits() {
        return n.clamp(1, 64);
    }
    let groups = (heads / 2).max(1) * rows.div_ceil(TILED_ROWS);
    ((COOPMAT_TARGET_GROUPS + groups / 2) / groups).clamp(1, 16)
}

/// `TANDEM_VULKAN_ATTN_MODE` (0 to 15): `attention_coopmat`'s and `block_attention_coopmat`'s
/// probe bits (their specialisation constant 0), which skip parts of their work to see where
/// their time goes (1 the score products, 2 the P V products, 4 the global loads after the first
/// tile, 8 the output stores or, in `block_attention_coopmat`, the softmax's exponentials);
/// results are wrong with any bit set. For tuning runs only (bench/attention-probe.sh).
pub(super) fn coopmat_mode() -> u32 {
    std::env::var("TANDEM_VULKAN_ATTN_MODE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|m| *m <= 15)
        .unwrap_or(0)
}

/// Bytes of scratch the attention nodes of `graph` need for their split partials: the largest
/// node's, the plain kernels' and `attention_tiled`'s side by side.
pub(super) fn scratch_bytes(graph: &Graph) -> u64 {
    let rows = graph.rows;
    graph
        .nodes
        .iter()
        .filter_map(|node| match &node.op {
            Op::Attention {
                heads,
                kv_heads,
                head_dim,
                window,
                cache,
                ..
            } => {
                let plain = plain_splits(rows, *heads, *kv_heads, *head_dim, *window, cache.capacity);
                let tiled = if use_tiled(rows, *head_dim) {
                    tiled_splits(rows, *heads).max(coopmat_splits(rows, *heads))
                } else {
                    1
                };
                Some(
                    partial_bytes(rows, *heads, *head_dim, plain)
                        + partial_bytes(rows, *heads, *head_dim, tiled),
                )
            }
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Whether an attention of `rows` rows and heads of `head_dim` runs `attention_tiled` first
/// (`tandem_gpu_kit::attention::takes_tiled`, unless `TANDEM_VULKAN_ATTENTION` forces a kernel).
fn use_tiled(rows: usize, head_dim: usize) -> bool {
    let forced = match std::env::var("TANDEM_VULKAN_ATTENTION").as_deref() {
        Ok("gqa" | "plain") => Some(false),
        Ok("tiled") => Some(true),
        _ => None,
    };
    takes_tiled(rows, head_dim, forced)
}

/// Whether the blocks `attention_tiled` would take go to `attention_coopmat` (QK^T and P V on
/// KHR cooperative matrices, two query heads of one KV head per workgroup): where the device
/// has cooperative matrices, the head's size is a multiple of 32 up to 256, the query heads per
/// KV head are even, q and the caches are 16-byte aligned and the attention is text only (the
/// kernel has no image-aware variant). `TANDEM_VULKAN_ATTN_COOPMAT=0` keeps `attention_tiled`,
/// for A/B runs.
fn takes_coopmat_attention(
    coopmat: bool,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    aligned: bool,
    image: bool,
) -> bool {
    let off = std::env::var("TANDEM_VULKAN_ATTN_COOPMAT").is_ok_and(|v| v == "0");
    coopmat
        && !off
        && !image
        && aligned
        && head_dim.is_multiple_of(32)
        && head_dim <= tandem_gpu_kit::attention::TILED_MAX_HEAD_DIM
        && kv_heads > 0
        && heads.is_multiple_of(kv_heads)
        && (heads / kv_heads).is_multiple_of(2)
}

/// Whether an attention of `rows` rows and heads of `head_dim` takes `attention_gqa` (for the
/// rows `attention_tiled` leaves, where it runs first).
fn use_gqa(rows: usize, head_dim: usize) -> bool {
    if head_dim > GQA_MAX_HEAD_DIM {
        return false;
    }
    match std::env::var("TANDEM_VULKAN_ATTENTION").as_deref() {
        Ok("gqa") => true,
        Ok("plain" | "tiled") => false,
        _ => rows <= gqa_max_rows(),
    }
}

/// [`GQA_MAX_ROWS`], or `TANDEM_VULKAN_GQA_ROWS=n` for tuning runs.
fn gqa_max_rows() -> usize {
    std::env::var("TANDEM_VULKAN_GQA_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(GQA_MAX_ROWS)
}

/// Splits of the cached positions for the kernel that takes the rows `attention_tiled` leaves:
/// enough workgroups for the GPU counted in that kernel's own grid (`attention_gqa` has one
/// workgroup per KV head, `attention` one per query head).
fn plain_splits(
    rows: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    window: Option<usize>,
    capacity: usize,
) -> usize {
    let gqa = use_gqa(rows, head_dim);
    let per_row = if gqa { kv_heads } else { heads };
    let target = std::env::var("TANDEM_VULKAN_ATTENTION_GROUPS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    match target {
        None if gqa => attention_splits(rows, per_row, window, capacity),
        _ => {
            let visible = window.unwrap_or(capacity).min(capacity);
            target
                .unwrap_or(PLAIN_TARGET_GROUPS)
                .div_ceil((rows * per_row).max(1))
                .min(visible.div_ceil(16))
                .clamp(1, 64)
        }
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
            bidirectional_from,
        } = &n.op
        else {
            return Err(BackendError::internal(format!("node {node} is not an attention")));
        };
        // Images' blocks: the kernels' variant that reads each row's end (specialisation
        // constant 1), and where the ends are; text attentions keep their variant 0.
        let (image, ends) = match bidirectional_from {
            Some(from) => (1u32, ctx.ends(*from)?),
            None => (0, 0),
        };
        let kb = &self.buffers.get(cache.k)?.mem;
        let vb = &self.buffers.get(cache.v)?.mem;
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
        let splits = plain_splits(rows, *heads, *kv_heads, *head_dim, *window, cache.capacity);
        let out = ctx.addr(n.outputs[0])?;
        let out_span = ctx.span(n.outputs[0])?;
        let reads = [ctx.span(*q)?, caches[0], caches[1]];
        // Partials: outputs, then maxima and sums; the tiled kernel's after the others'.
        let part_o = ctx.scratch.0;
        let part_ml = part_o + (rows * heads * splits * head_dim * 4) as u64;
        let tiled = use_tiled(rows, *head_dim);
        // The kernel that takes the one-slot blocks, where `attention_tiled` would.
        let aligned = [ctx.addr(*q)?, kc, vc].iter().all(|a| a.is_multiple_of(16));
        let coopmat = tiled
            && takes_coopmat_attention(
                self.gpu.coopmat,
                *heads,
                *kv_heads,
                *head_dim,
                aligned,
                image != 0,
            );
        let tsplits = if coopmat {
            coopmat_splits(rows, *heads)
        } else if tiled {
            tiled_splits(rows, *heads)
        } else {
            1
        };
        let tpart_o = part_o + partial_bytes(rows, *heads, *head_dim, splits);
        let tpart_ml = tpart_o + (rows * heads * tsplits * head_dim * 4) as u64;
        let push = |part: (u64, u64), splits: usize, skip_block: usize| -> Result<Vec<u8>, BackendError> {
            Ok(Push::default()
                .u64(ctx.addr(*q)?)
                .u64(kc)
                .u64(vc)
                .u64(out)
                .u64(ctx.positions())
                .u64(ctx.slots())
                .u64(part.0)
                .u64(part.1)
                .u32(*heads as u32)
                .u32(*kv_heads as u32)
                .u32(*head_dim as u32)
                .u32(cache.capacity as u32)
                .f32(*scale)
                .u32(window.unwrap_or(0) as u32)
                .f32(softcap.unwrap_or(0.0))
                .u32(f16)
                .u32(splits as u32)
                .u32(rows as u32)
                .u32(skip_block as u32)
                .u64(ends)
                .0)
        };
        // `block` 0: every row; else the rows of one-slot blocks (`one_slot`) or of the others.
        let combine = |part: (u64, u64), splits: usize, block: usize, one_slot: bool| Cmd::Dispatch {
            kernel: "attention_combine".into(),
            spec: [0, 0],
            push: Push::default()
                .u64(part.0)
                .u64(part.1)
                .u64(out)
                .u64(ctx.slots())
                .u32(*heads as u32)
                .u32(*head_dim as u32)
                .u32(splits as u32)
                .u32(rows as u32)
                .u32(block as u32)
                .u32(u32::from(one_slot))
                .0,
            groups: [*heads as u32, rows as u32, div_up(*head_dim, 64)],
            access: Access::new([ctx.scratch], [out_span]),
        };
        // With `attention_tiled`, the blocks of one slot are its; `attention` (and the
        // combination of its splits) takes the rest, both writing disjoint rows of the output.
        let skip_block = if tiled { TILED_ROWS } else { 0 };
        if tiled {
            // The cooperative-matrix kernel in its place where the device, the heads and the
            // addresses suit it (text attentions only: it has no image-aware variant).
            let (kernel, head_groups, spec) = if coopmat {
                ("attention_coopmat", heads / 2, [coopmat_mode(), 0])
            } else {
                ("attention_tiled", *heads, [0, image])
            };
            cmds.push(Cmd::Dispatch {
                kernel: kernel.into(),
                spec,
                push: push((tpart_o, tpart_ml), tsplits, 0)?,
                groups: [head_groups as u32, div_up(rows, TILED_ROWS), tsplits as u32],
                access: Access::new(reads, [if tsplits > 1 { ctx.scratch } else { out_span }]),
            });
            if tsplits > 1 {
                cmds.push(combine((tpart_o, tpart_ml), tsplits, TILED_ROWS, true));
            }
        }
        let (kernel, wgs, spec) = if use_gqa(rows, *head_dim) {
            // Query heads held per pass: the group, up to 8.
            let gm = (heads / kv_heads).clamp(1, 8) as u32;
            ("attention_gqa", *kv_heads, [gm, image])
        } else {
            ("attention", *heads, [0, image])
        };
        cmds.push(Cmd::Dispatch {
            kernel: kernel.into(),
            spec,
            push: push((part_o, part_ml), splits, skip_block)?,
            groups: [wgs as u32, rows as u32, splits as u32],
            access: Access::new(reads, [if splits > 1 { ctx.scratch } else { out_span }]),
        });
        if splits > 1 {
            cmds.push(combine((part_o, part_ml), splits, skip_block, false));
        }
        Ok(cmds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_takes_the_grouped_kernel_and_prefill_the_tiled_one() {
        if std::env::var_os("TANDEM_VULKAN_ATTENTION").is_some() {
            return;
        }
        assert!(use_gqa(1, 256));
        assert!(use_gqa(gqa_max_rows(), 64));
        assert!(!use_gqa(gqa_max_rows() + 1, 64));
        assert!(!use_gqa(1, 512));
        let min = tandem_gpu_kit::attention::TILED_MIN_ROWS;
        assert!(use_tiled(min, 256));
        assert!(!use_tiled(min - 1, 256));
        assert!(!use_tiled(512, 512));
    }
}
