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

use tandem_backend_api::{Graph, Op};
use tandem_gpu_kit::attention::{attention_partial_bytes, takes_tiled};

/// The kernel's block of query rows (its `BR`).
pub use tandem_gpu_kit::attention::TILED_BLOCK_ROWS as BLOCK_ROWS;

/// Bytes of workgroup memory the kernel declares (its arrays, summed).
pub const WORKGROUP_BYTES: u32 = 2 * 64 * 17 * 8 + 32 * 9 * 16 + 32 * 64 * 4 + 32 * 8 * 4 + 4 * 32 * 4 + 16;

/// Whether an attention of `rows` rows and heads of `head_dim` runs `attention_tiled` first, on
/// an adapter with `workgroup_limit` bytes of workgroup memory: where the kernel fits, the
/// shared rule (`tandem_gpu_kit::attention::takes_tiled`), never under
/// `TANDEM_WGPU_ATTENTION=plain`.
pub fn use_tiled(rows: usize, head_dim: usize, workgroup_limit: u32) -> bool {
    if workgroup_limit < WORKGROUP_BYTES {
        return false;
    }
    let plain = std::env::var("TANDEM_WGPU_ATTENTION").as_deref() == Ok("plain");
    takes_tiled(rows, head_dim, plain.then_some(false))
}

/// How many workgroups share the key tiles of one (head, block of rows)
/// (`tandem_gpu_kit::attention::tiled_splits`), or `TANDEM_WGPU_TILED_SPLITS`'s count.
pub fn splits(rows: usize, heads: usize) -> usize {
    let forced = std::env::var("TANDEM_WGPU_TILED_SPLITS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    tandem_gpu_kit::attention::tiled_splits(rows, heads, forced)
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
        let min = tandem_gpu_kit::attention::TILED_MIN_ROWS;
        assert!(use_tiled(min, 256, 32 << 10));
        assert!(!use_tiled(min - 1, 256, 32 << 10));
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
        let max = tandem_gpu_kit::attention::TILED_MAX_SPLITS;
        assert_eq!(splits(512, 4), max);
        assert_eq!(splits(512, 64), 1);
        assert_eq!(splits(40, 8), 64usize.min(max));
    }
}
