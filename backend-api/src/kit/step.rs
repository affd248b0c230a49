//! [`StepArgs`] checked against the graph a program was compiled from: lengths against the
//! graph's rows and selected rows, select indices, KV-cache slots, token ids against the
//! vocabulary, and that every position a row attends to is still in its ring.

use crate::error::BackendError;
use crate::graph::{Graph, Op, StepArgs};

/// One attention's KV cache, as the ring check needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ring {
    slots: usize,
    capacity: usize,
    window: Option<usize>,
}

/// What a compiled graph asks of its step arguments, taken from the graph once at `compile`
/// ([`StepShape::of`]) and checked at every `execute` ([`StepShape::check`]) without allocating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepShape {
    name: String,
    rows: usize,
    selected_rows: usize,
    /// The smallest slot count of the graph's KV caches, when it has attention.
    slots: Option<usize>,
    /// Every embedding's vocabulary, in node order.
    vocabs: Vec<usize>,
    /// Every attention's cache, in node order, repeats left out.
    rings: Vec<Ring>,
}

impl StepShape {
    /// The shape of `graph`'s steps (a graph [`Graph::infer_shapes`] accepted).
    pub fn of(graph: &Graph) -> Self {
        let mut shape = StepShape {
            name: graph.name.clone(),
            rows: graph.rows,
            selected_rows: graph.selected_rows,
            slots: None,
            vocabs: Vec::new(),
            rings: Vec::new(),
        };
        for node in &graph.nodes {
            match &node.op {
                Op::Embed { table, extra, .. } => {
                    let rows = |w: &crate::graph::WeightRef| w.desc.shape.first().copied().unwrap_or(0);
                    shape.vocabs.push(rows(table) + extra.as_ref().map_or(0, rows));
                }
                Op::Attention { cache, window, .. } => {
                    shape.slots = Some(shape.slots.map_or(cache.slots, |s| s.min(cache.slots)));
                    let ring = Ring {
                        slots: cache.slots,
                        capacity: cache.capacity,
                        window: *window,
                    };
                    if !shape.rings.contains(&ring) {
                        shape.rings.push(ring);
                    }
                }
                _ => {}
            }
        }
        shape
    }

    /// Step rows: the length of `tokens`, `positions` and `slots`.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Selected rows: the length of `select`.
    pub fn selected_rows(&self) -> usize {
        self.selected_rows
    }

    /// The smallest slot count of the graph's KV caches, when it has attention.
    pub fn slots(&self) -> Option<usize> {
        self.slots
    }

    /// Checks lengths against the graph, selected rows against the step's rows, when the graph
    /// has KV caches slots against the smallest cache's slot count, token ids against every
    /// embedding's vocabulary, and that every position a row attends to is still in its ring
    /// after the step's rows are stored. The error names the field (`step tokens: 1 given,
    /// graph 'g' has 2 rows`).
    pub fn check(&self, args: &StepArgs<'_>) -> Result<(), BackendError> {
        let n = self.rows;
        for (name, len) in [
            ("tokens", args.tokens.len()),
            ("positions", args.positions.len()),
            ("slots", args.slots.len()),
        ] {
            if len != n {
                return Err(BackendError::invalid(format!(
                    "step {name}: {len} given, graph '{}' has {n} rows",
                    self.name
                )));
            }
        }
        if args.select.len() != self.selected_rows {
            return Err(BackendError::invalid(format!(
                "step select: {} given, graph '{}' selects {}",
                args.select.len(),
                self.name,
                self.selected_rows
            )));
        }
        if let Some(r) = args.select.iter().find(|&&r| r as usize >= n) {
            return Err(BackendError::invalid(format!(
                "step select: row {r} out of range 0..{n}"
            )));
        }
        if let Some(limit) = self.slots {
            if let Some(s) = args.slots.iter().find(|&&s| s as usize >= limit) {
                return Err(BackendError::invalid(format!(
                    "step slots: slot {s} out of range 0..{limit}"
                )));
            }
        }
        for &vocab in &self.vocabs {
            if let Some(t) = args.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(BackendError::invalid(format!(
                    "token id {t} is outside the vocabulary of {vocab}"
                )));
            }
        }
        for ring in &self.rings {
            for slot in 0..ring.slots as u32 {
                let pos = || {
                    args.slots
                        .iter()
                        .zip(args.positions)
                        .filter(move |(s, _)| **s == slot)
                        .map(|(_, p)| *p)
                };
                let (Some(min), Some(max)) = (pos().min(), pos().max()) else {
                    continue;
                };
                let lo = ring.window.map_or(0, |w| (min + 1).saturating_sub(w as u32));
                if (max - lo) as usize >= ring.capacity {
                    return Err(BackendError::invalid(format!(
                        "slot {slot}: positions {lo}..={max} do not fit the KV cache's {} positions",
                        ring.capacity
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The last position each step row sees under [`Op::Attention`]'s `bidirectional_from`: its own
/// position, or for a row of a block (consecutive rows of one slot at consecutive positions,
/// every token `>= from`) the block's last position. Written into `ends`, one per row.
pub fn visible_ends(args: &StepArgs<'_>, from: Option<u32>, ends: &mut Vec<u32>) {
    ends.clear();
    ends.extend_from_slice(args.positions);
    let Some(from) = from else { return };
    let n = args.tokens.len().min(args.positions.len()).min(args.slots.len());
    let mut r = n;
    // Walk backwards: a block row's end is its successor's when the successor continues it.
    while r > 0 {
        r -= 1;
        let continues = r + 1 < n
            && args.tokens[r] >= from
            && args.tokens[r + 1] >= from
            && args.slots[r + 1] == args.slots[r]
            && args.positions[r + 1] == args.positions[r].wrapping_add(1);
        if continues {
            ends[r] = ends[r + 1];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BufferId, DType, GraphBuilder, KvCacheRef, TensorDesc, WeightRef};

    /// Two rows, one selected, a vocabulary of 10 and a cache of 2 slots x 4 positions with a
    /// window of 3.
    fn shape() -> StepShape {
        let mut g = GraphBuilder::new("g", 2, 1);
        let x = g.push1(Op::Embed {
            table: WeightRef {
                buffer: BufferId(1),
                desc: TensorDesc::new(DType::F32, [10, 4]),
            },
            scale: 1.0,
            extra: None,
        });
        let a = g.push1(Op::Attention {
            q: x,
            k: x,
            v: x,
            cache: KvCacheRef {
                k: BufferId(2),
                v: BufferId(3),
                dtype: DType::F32,
                slots: 2,
                capacity: 4,
            },
            heads: 1,
            kv_heads: 1,
            head_dim: 4,
            scale: 1.0,
            window: Some(3),
            softcap: None,
            bidirectional_from: None,
        });
        g.push1(Op::SelectRows { x: a });
        let graph = g.finish();
        graph.infer_shapes().unwrap();
        StepShape::of(&graph)
    }

    const OK: StepArgs<'static> = StepArgs {
        tokens: &[1, 2],
        positions: &[0, 1],
        slots: &[0, 0],
        select: &[1],
    };

    fn err(args: StepArgs<'_>) -> String {
        shape().check(&args).unwrap_err().to_string()
    }

    #[test]
    fn good_steps_pass_and_the_shape_is_read_from_the_graph() {
        let s = shape();
        s.check(&OK).unwrap();
        assert_eq!((s.rows(), s.selected_rows(), s.slots()), (2, 1, Some(2)));
        // Positions 5 and 6 of slot 1 see 3..=6 with the window: four positions fit.
        s.check(&StepArgs {
            positions: &[5, 6],
            slots: &[1, 1],
            ..OK
        })
        .unwrap();
    }

    #[test]
    fn bad_steps_are_refused_naming_the_field() {
        for (args, want) in [
            (
                StepArgs { tokens: &[1], ..OK },
                "step tokens: 1 given, graph 'g' has 2 rows",
            ),
            (
                StepArgs {
                    positions: &[0, 1, 2],
                    ..OK
                },
                "step positions: 3 given",
            ),
            (StepArgs { slots: &[], ..OK }, "step slots: 0 given"),
            (
                StepArgs { select: &[], ..OK },
                "step select: 0 given, graph 'g' selects 1",
            ),
            (
                StepArgs { select: &[2], ..OK },
                "step select: row 2 out of range 0..2",
            ),
            (
                StepArgs { slots: &[0, 2], ..OK },
                "step slots: slot 2 out of range 0..2",
            ),
            (
                StepArgs {
                    tokens: &[1, 10],
                    ..OK
                },
                "token id 10 is outside the vocabulary of 10",
            ),
            (
                StepArgs {
                    positions: &[0, 4],
                    ..OK
                },
                "slot 0: positions 0..=4 do not fit the KV cache's 4 positions",
            ),
        ] {
            let e = err(args);
            assert!(e.contains(want), "{e} (wanted {want})");
        }
    }

    #[test]
    fn block_rows_see_to_their_block_end() {
        let mut ends = Vec::new();
        // Slot 0: text 4, image 5..=7, text 8; slot 1: image rows at 2, 3; then slot 0's second
        // image right after a text row, broken by a position jump.
        let args = StepArgs {
            tokens: &[1, 50, 51, 52, 2, 60, 61, 3, 70, 71],
            positions: &[4, 5, 6, 7, 8, 2, 3, 9, 10, 12],
            slots: &[0, 0, 0, 0, 0, 1, 1, 0, 0, 0],
            select: &[],
        };
        visible_ends(&args, Some(50), &mut ends);
        assert_eq!(ends, [4, 7, 7, 7, 8, 3, 3, 9, 10, 12]);
        visible_ends(&args, None, &mut ends);
        assert_eq!(ends, args.positions);
    }
}
