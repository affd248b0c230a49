//! `Op::TopK` on a GPU, planned once for every backend: a row's best k values and their
//! indices by bitonic sorts of [`SORT_KEYS`] keys in workgroup memory, pass after pass. The
//! first pass sorts each block of [`SORT_KEYS`] values of a row and keeps its best k keys; each
//! later one merges groups of the lists the one before kept, until one list per row is left,
//! which the last pass writes as k values then k indices. A key orders a (value, index) pair as
//! the op ranks them: the value's bits made monotonic in the high word (NaN as -inf), the
//! index's complement in the low word, so a larger key ranks first; key 0 pads. The lists live
//! in a program's scratch (8 bytes a key), in two areas the passes write in turn.

use super::plan::value_rows;
use crate::{Graph, Op, ValueShape};

/// Keys one workgroup sorts.
pub const SORT_KEYS: usize = 2048;

/// One pass over a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Workgroups per row (the lists this pass writes per row).
    pub groups: usize,
    /// Source elements per workgroup.
    pub per: usize,
    /// Source elements per row: values (the first pass) or keys.
    pub n: usize,
    /// Whether the source is the values (the first pass) rather than the lists.
    pub from_values: bool,
}

/// The passes for rows of `cols` values and `k` kept (`k <= 128`, so a merge takes at least
/// 16 lists at once).
pub fn passes(cols: usize, k: usize) -> Vec<Pass> {
    let mut out = vec![Pass {
        groups: cols.div_ceil(SORT_KEYS),
        per: SORT_KEYS,
        n: cols,
        from_values: true,
    }];
    let lists = (SORT_KEYS / k.max(1)).max(2);
    let mut m = out[0].groups;
    while m > 1 {
        let groups = m.div_ceil(lists);
        out.push(Pass {
            groups,
            per: lists * k,
            n: m * k,
            from_values: false,
        });
        m = groups;
    }
    out
}

/// Bytes of one of the two areas of lists a top-k of `rows` rows of `cols` values keeps:
/// the first pass's lists.
pub fn area_bytes(rows: usize, cols: usize, k: usize) -> u64 {
    (rows * cols.div_ceil(SORT_KEYS) * k * 8) as u64
}

/// Bytes of scratch the top-k nodes of `graph` need: two areas of the first pass's lists for
/// the largest; 0 where every row fits one sort.
pub fn scratch_bytes(graph: &Graph, shapes: &[ValueShape]) -> u64 {
    graph
        .nodes
        .iter()
        .filter_map(|node| match &node.op {
            Op::TopK { x, k } => {
                let s = shapes.get(x.0 as usize)?;
                (s.cols > SORT_KEYS).then(|| 2 * area_bytes(value_rows(graph, s), s.cols, *k))
            }
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_merge_until_one_list_per_row_is_left() {
        // Gemma 3's vocabulary, k 64: 128 blocks, then 4 groups of 32 lists, then one of 4.
        let p = passes(262_144, 64);
        assert_eq!(
            p.iter().map(|p| (p.groups, p.per, p.n)).collect::<Vec<_>>(),
            [(128, 2048, 262_144), (4, 2048, 8192), (1, 2048, 256)]
        );
        // A row that fits one sort: one pass.
        assert_eq!(passes(2048, 128).len(), 1);
        // k 128: 16 lists a merge.
        assert_eq!(
            passes(2049, 128)[1],
            Pass {
                groups: 1,
                per: 2048,
                n: 256,
                from_values: false
            }
        );
        // k 1 (greedy): 128 blocks, then one merge of their 128 keys.
        assert_eq!(
            passes(262_144, 1)
                .iter()
                .map(|p| (p.groups, p.per))
                .collect::<Vec<_>>(),
            [(128, 2048), (1, 2048)]
        );
    }
}
