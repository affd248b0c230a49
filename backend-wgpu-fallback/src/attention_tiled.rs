//! When prefill attention runs `attention_tiled.wgsl` (flash attention: blocks of
//! [`BLOCK_ROWS`] rows of one slot over key tiles in workgroup memory), and over how many
//! splits of each block's key tiles.
//!
//! With it, a step's attention is: `attention_tiled` over the blocks of one slot (and
//! `attention_combine` over their rows where it splits), then `attention` with `skip_block` over
//! the rows of the other blocks (several sequences in one block: batched decode, or a step's
//! rows crossing from one sequence to the next), and its own combination of those rows; each
//! kernel writes its own partials, the tiled kernel's after the others' in the scratch.
//!
//! `TANDEM_WGPU_ATTENTION=plain` leaves every step to `attention` (side-by-side measurement);
//! `TANDEM_WGPU_TILED_SPLITS=n` forces n splits (1 to 64), for tuning runs.

use tandem_backend_api::kit::plan::attention_partial_bytes;
use tandem_backend_api::{Graph, Op};

/// The kernel's block of query rows (its `BR`).
pub const BLOCK_ROWS: usize = 32;

/// Rows from which attention runs `attention_tiled` first (prefill chunks, large batches).
const MIN_ROWS: usize = 16;

/// The kernel's largest head (four 64-wide chunks in registers).
const MAX_HEAD_DIM: usize = 256;

/// Bytes of workgroup memory the kernel declares (its arrays, summed).
pub const WORKGROUP_BYTES: u32 = 2 * 64 * 17 * 8 + 32 * 9 * 16 + 32 * 64 * 4 + 32 * 8 * 4 + 4 * 32 * 4 + 16;

/// Workgroups the kernel aims for: its blocks times their splits.
const TARGET_GROUPS: usize = 1024;

/// Most splits of a block's key tiles.
const MAX_SPLITS: usize = 16;

/// Whether an attention of `rows` rows and heads of `head_dim` runs `attention_tiled` first, on
/// an adapter with `workgroup_limit` bytes of workgroup memory.
pub fn use_tiled(rows: usize, head_dim: usize, workgroup_limit: u32) -> bool {
    if head_dim > MAX_HEAD_DIM || workgroup_limit < WORKGROUP_BYTES {
        return false;
    }
    if std::env::var("TANDEM_WGPU_ATTENTION").as_deref() == Ok("plain") {
        return false;
    }
    rows >= MIN_ROWS
}

/// How many workgroups share the key tiles of one (head, block of rows): enough for some
/// [`TARGET_GROUPS`] workgroups (a block sees at most as many tiles as it has positions before
/// it, so the first blocks leave most splits empty).
pub fn splits(rows: usize, heads: usize) -> usize {
    if let Some(n) = std::env::var("TANDEM_WGPU_TILED_SPLITS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        return n.clamp(1, 64);
    }
    let groups = heads * rows.div_ceil(BLOCK_ROWS);
    TARGET_GROUPS.div_ceil(groups.max(1)).clamp(1, MAX_SPLITS)
}

/// Bytes of scratch the tiled attentions of `graph` need for their split partials (the largest
/// node's), on an adapter with `workgroup_limit` bytes of workgroup memory.
pub fn scratch_bytes(graph: &Graph, workgroup_limit: u32) -> u64 {
    let rows = graph.rows;
    graph
        .nodes
        .iter()
        .filter_map(|node| match &node.op {
            Op::Attention { heads, head_dim, .. } if use_tiled(rows, *head_dim, workgroup_limit) => Some(
                attention_partial_bytes(rows, *heads, *head_dim, splits(rows, *heads)),
            ),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_of_heads_up_to_256_takes_the_tiled_kernel_where_it_fits() {
        if std::env::var_os("TANDEM_WGPU_ATTENTION").is_some() {
            return;
        }
        assert!(use_tiled(MIN_ROWS, 256, 32 << 10));
        assert!(!use_tiled(MIN_ROWS - 1, 256, 32 << 10));
        assert!(!use_tiled(512, 512, 32 << 10));
        // WebGPU's default 16 KiB is too little.
        assert!(!use_tiled(512, 256, 16 << 10));
    }

    #[test]
    fn splits_fill_the_device_when_blocks_are_few() {
        if std::env::var_os("TANDEM_WGPU_TILED_SPLITS").is_some() {
            return;
        }
        // Gemma 3 1B, 512 rows: 4 heads x 16 blocks.
        assert_eq!(splits(512, 4), MAX_SPLITS);
        assert_eq!(splits(512, 64), 1);
        assert_eq!(splits(40, 8), 64usize.min(MAX_SPLITS));
    }
}
