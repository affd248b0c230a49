//! Attention's shared decisions: how many workgroups split one (row, head) over the cached
//! positions, the bytes of their partial results, and when prefill takes the tiled
//! (flash-attention) kernel and over how many splits of each block's key tiles. Both backends'
//! `attention_tiled` kernels take blocks of [`TILED_BLOCK_ROWS`] rows of one slot and heads of
//! up to [`TILED_MAX_HEAD_DIM`]; which kernel takes the rows it leaves (grouped-query or plain)
//! each backend decides itself.

use tandem_backend_api::{Graph, Op};

use crate::matmul::DECODE_ROWS;

/// The tiled kernel's block of query rows (its `BR`).
pub const TILED_BLOCK_ROWS: usize = 32;

/// Rows from which attention runs the tiled kernel first: prefill chunks and large batches,
/// where decode ([`DECODE_ROWS`]) ends.
pub const TILED_MIN_ROWS: usize = DECODE_ROWS;

/// The tiled kernel's largest head (four 64-wide chunks in registers).
pub const TILED_MAX_HEAD_DIM: usize = 256;

/// Workgroups the tiled kernel aims for: its blocks times their splits.
pub const TILED_TARGET_GROUPS: usize = 1024;

/// Most splits of a tiled block's key tiles.
pub const TILED_MAX_SPLITS: usize = 16;

/// How many workgroups share one (row, head) of a split attention: enough for the device to have
/// some 1024 workgroups in flight, each taking at least 16 positions of the visible range.
pub fn attention_splits(rows: usize, heads: usize, window: Option<usize>, capacity: usize) -> usize {
    let want = 1024usize.div_ceil((rows * heads).max(1));
    let visible = window.unwrap_or(capacity).min(capacity);
    want.min(visible.div_ceil(16)).clamp(1, 64)
}

/// Bytes of the f32 partial results (`[rows][heads][splits][2 + head_dim]`: maximum, sum,
/// unnormalised output) of an attention of `rows` rows split `splits` ways; 0 when unsplit.
pub fn attention_partial_bytes(rows: usize, heads: usize, head_dim: usize, splits: usize) -> u64 {
    if splits > 1 {
        (rows * heads * splits * (head_dim + 2) * 4) as u64
    } else {
        0
    }
}

/// Bytes of f32 scratch the split attentions of `graph` need for their partial results
/// (`[rows][heads][splits][2 + head_dim]`: maximum, sum, unnormalised output), the largest of
/// its attention nodes, each split [`attention_splits`] ways; 0 when none is split.
pub fn attention_scratch_bytes(graph: &Graph) -> u64 {
    graph
        .nodes
        .iter()
        .filter_map(|node| match &node.op {
            Op::Attention {
                heads,
                head_dim,
                window,
                cache,
                ..
            } => {
                let splits = attention_splits(graph.rows, *heads, *window, cache.capacity);
                (splits > 1).then(|| attention_partial_bytes(graph.rows, *heads, *head_dim, splits))
            }
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Whether an attention of `rows` rows and heads of `head_dim` runs the tiled kernel first:
/// never for heads past [`TILED_MAX_HEAD_DIM`]; else `forced` where a tuning variable forces
/// the choice, else from [`TILED_MIN_ROWS`] rows.
pub fn takes_tiled(rows: usize, head_dim: usize, forced: Option<bool>) -> bool {
    if head_dim > TILED_MAX_HEAD_DIM {
        return false;
    }
    forced.unwrap_or(rows >= TILED_MIN_ROWS)
}

/// How many workgroups share the key tiles of one (head, block of rows) in the tiled kernel:
/// enough for some [`TILED_TARGET_GROUPS`] workgroups, at most [`TILED_MAX_SPLITS`] (a block
/// sees at most as many tiles as it has positions before it, so the first blocks leave most
/// splits empty). `forced` (a tuning variable's value) wins, clamped to 1 to 64.
pub fn tiled_splits(rows: usize, heads: usize, forced: Option<usize>) -> usize {
    if let Some(n) = forced {
        return n.clamp(1, 64);
    }
    let groups = heads * rows.div_ceil(TILED_BLOCK_ROWS);
    TILED_TARGET_GROUPS
        .div_ceil(groups.max(1))
        .clamp(1, TILED_MAX_SPLITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_splits_stay_in_range() {
        assert_eq!(attention_splits(1, 4, None, 16), 1);
        assert!(attention_splits(1, 4, None, 4096) > 1);
        assert_eq!(attention_splits(512, 8, None, 4096), 1);
        assert!(attention_splits(1, 1, Some(512), 32768) <= 32);
        assert_eq!(attention_partial_bytes(2, 4, 8, 1), 0);
        assert_eq!(attention_partial_bytes(2, 4, 8, 3), 2 * 4 * 3 * 10 * 4);
    }

    #[test]
    fn prefill_of_heads_up_to_256_takes_the_tiled_kernel() {
        assert!(takes_tiled(TILED_MIN_ROWS, 256, None));
        assert!(!takes_tiled(TILED_MIN_ROWS - 1, 256, None));
        assert!(!takes_tiled(512, 512, None));
        // A forced choice, within the head limit only.
        assert!(takes_tiled(1, 256, Some(true)));
        assert!(!takes_tiled(512, 256, Some(false)));
        assert!(!takes_tiled(1, 512, Some(true)));
    }

    #[test]
    fn tiled_splits_fill_the_device_when_blocks_are_few() {
        // Gemma 3 1B, 512 rows: 4 heads x 16 blocks.
        assert_eq!(tiled_splits(512, 4, None), TILED_MAX_SPLITS);
        assert_eq!(tiled_splits(512, 64, None), 1);
        assert_eq!(tiled_splits(40, 8, None), TILED_MAX_SPLITS);
        assert_eq!(tiled_splits(512, 64, Some(100)), 64);
        assert_eq!(tiled_splits(512, 64, Some(0)), 1);
    }
}
