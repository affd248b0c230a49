//! `Op::TopK`: a row's best k values and their indices, by bitonic sorts of 2048 keys in
//! shared memory (`top_k.comp`), pass after pass: the first sorts each block of 2048 values of
//! a row and keeps its best k keys, each later one merges groups of the lists the one before
//! kept, until one list per row is left, which the last pass writes as values and indices.
//! The lists live in the program scratch, in two areas the passes write in turn.

use tandem_backend_api::kit::plan::value_rows;
use tandem_backend_api::{BackendError, Graph, Op, ValueId, ValueShape};

use super::cmd::{Access, Cmd, Push};
use super::Ctx;

/// Keys one workgroup sorts (the shader's `N`).
const SORT_KEYS: usize = 2048;

/// One pass over a row: workgroups per row, source elements per workgroup, source elements per
/// row, and whether the source is the values (the first pass).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pass {
    groups: usize,
    per: usize,
    n: usize,
    from_values: bool,
}

/// The passes for rows of `cols` values and `k` kept (`k <= 128`, so a merge takes at least
/// 16 lists at once).
fn passes(cols: usize, k: usize) -> Vec<Pass> {
    let mut out = vec![Pass {
        groups: cols.div_ceil(SORT_KEYS),
        per: SORT_KEYS,
        n: cols,
        from_values: true,
    }];
    let lists = (SORT_KEYS / k).max(2);
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

/// Bytes of scratch the top-k nodes of `graph` need: two areas of the first pass's lists (8
/// bytes a key) for the largest; 0 where every row fits one sort.
pub(super) fn scratch_bytes(graph: &Graph, shapes: &[ValueShape]) -> u64 {
    graph
        .nodes
        .iter()
        .filter_map(|node| match &node.op {
            Op::TopK { x, k } => {
                let s = shapes.get(x.0 as usize)?;
                let groups = s.cols.div_ceil(SORT_KEYS);
                (groups > 1).then(|| (2 * value_rows(graph, s) * groups * k * 8) as u64)
            }
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// The commands of a top-k node: `x` in, `out` (`[rows, 2k]`) out.
pub(super) fn lower(ctx: &Ctx, x: ValueId, k: usize, out: ValueId) -> Result<Vec<Cmd>, BackendError> {
    let (rows, cols) = (ctx.rows(x), ctx.cols(x));
    let passes = passes(cols, k);
    let area = (rows * passes[0].groups * k * 8) as u64;
    let areas = [
        (ctx.scratch.0, ctx.scratch.0 + area),
        (ctx.scratch.0 + area, ctx.scratch.0 + 2 * area),
    ];
    if passes.len() > 1 && areas[1].1 > ctx.scratch.1 {
        return Err(BackendError::internal(format!(
            "top_k's lists ({rows} rows of {cols}, k {k}) do not fit the program's scratch"
        )));
    }
    let mut cmds = Vec::with_capacity(passes.len());
    for (i, pass) in passes.iter().enumerate() {
        let last = i + 1 == passes.len();
        let src = if pass.from_values {
            ctx.span(x)?
        } else {
            areas[(i + 1) % 2]
        };
        let dst = if last { ctx.span(out)? } else { areas[i % 2] };
        cmds.push(Cmd::Dispatch {
            kernel: "top_k".into(),
            spec: [0, 0],
            push: Push::default()
                .u64(src.0)
                .u64(dst.0)
                .u32(pass.n as u32)
                .u32(k as u32)
                .u32(pass.per as u32)
                .u32(u32::from(pass.from_values))
                .u32(u32::from(last))
                .u32(pass.groups as u32)
                .0,
            groups: [pass.groups as u32, rows as u32, 1],
            access: Access::new([src], [dst]),
        });
    }
    Ok(cmds)
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
    }
}
