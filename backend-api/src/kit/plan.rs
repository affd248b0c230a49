//! Row counts of values, which the buffer checks ([`super::buffers`]) and top-k's scratch
//! ([`super::top_k`]) read. The GPU backends' planning (the value arena, workgroups, attention
//! splits) lives in their own kit, `tandem-gpu-kit` (folder `backend-gpu`).

use crate::graph::{Graph, RowCount, ValueShape};

/// The number of rows a value of `shape` has in `graph`.
pub fn value_rows(graph: &Graph, shape: &ValueShape) -> usize {
    match shape.rows {
        RowCount::Step => graph.rows,
        RowCount::Selected => graph.selected_rows,
    }
}

/// Where a backend that keeps each value in a buffer of its own (the CPU) stores a graph's
/// values: a few reusable slots instead of one buffer per value. Two values share a slot only
/// when the first's last use comes before the second is defined (a node's outputs never share
/// with its inputs), so the slots hold at most the graph's live set at its widest, not the sum
/// of every value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueSlots {
    /// Each value's slot (values no node on the unit defines get slot 0 and length 0).
    pub slot_of: Vec<usize>,
    /// Each value's length in elements (rows times columns).
    pub len: Vec<usize>,
    /// Each slot's length in elements: the longest value it holds.
    pub slot_len: Vec<usize>,
}

impl ValueSlots {
    /// Elements the slots hold together.
    pub fn elements(&self) -> usize {
        self.slot_len.iter().sum()
    }
}

/// Slots for the values of `graph`'s nodes (with value shapes `shapes`) that `keep` accepts,
/// run in order: each value takes the free slot that fits it most tightly, else the largest
/// free slot grown to fit it, else a new one; the slots a node's inputs held are freed after
/// its outputs are placed, those of values never read at once.
pub fn value_slots(graph: &Graph, shapes: &[ValueShape], keep: impl Fn(usize) -> bool) -> ValueSlots {
    value_slots_at(graph, shapes, graph.rows, graph.selected_rows, keep)
}

/// [`value_slots`] as if `graph` ran `rows` rows per step and kept `selected` of them (what an
/// estimate for another step size asks).
pub fn value_slots_at(
    graph: &Graph,
    shapes: &[ValueShape],
    rows: usize,
    selected: usize,
    keep: impl Fn(usize) -> bool,
) -> ValueSlots {
    let n = shapes.len();
    let len: Vec<usize> = shapes
        .iter()
        .map(|s| {
            let r = match s.rows {
                RowCount::Step => rows,
                RowCount::Selected => selected,
            };
            r * s.cols
        })
        .collect();
    let mut last_use = vec![0usize; n];
    for (i, node) in graph.nodes.iter().enumerate() {
        for o in &node.outputs {
            last_use[o.0 as usize] = last_use[o.0 as usize].max(i);
        }
        for v in node.op.inputs() {
            last_use[v.0 as usize] = last_use[v.0 as usize].max(i);
        }
    }
    let mut slot_of = vec![0usize; n];
    let mut placed = vec![false; n];
    let mut slot_len: Vec<usize> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut ends: Vec<Vec<usize>> = vec![Vec::new(); graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        if !keep(i) {
            continue;
        }
        for o in &node.outputs {
            let v = o.0 as usize;
            let need = len[v].max(1);
            let tight = free
                .iter()
                .enumerate()
                .filter(|(_, &s)| slot_len[s] >= need)
                .min_by_key(|(_, &s)| slot_len[s])
                .map(|(at, _)| at);
            let largest = || {
                free.iter()
                    .enumerate()
                    .max_by_key(|(_, &s)| slot_len[s])
                    .map(|(at, _)| at)
            };
            let slot = match tight.or_else(largest) {
                Some(at) => free.swap_remove(at),
                None => {
                    slot_len.push(0);
                    slot_len.len() - 1
                }
            };
            slot_len[slot] = slot_len[slot].max(need);
            slot_of[v] = slot;
            placed[v] = true;
            ends[last_use[v].max(i)].push(v);
        }
        for v in std::mem::take(&mut ends[i]) {
            free.push(slot_of[v]);
        }
    }
    let len = len
        .iter()
        .zip(&placed)
        .map(|(&l, &p)| if p { l } else { 0 })
        .collect();
    ValueSlots {
        slot_of,
        len,
        slot_len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{GraphBuilder, Op};
    use crate::BufferId;

    /// A chain of adds: at most three values live at once (the input, the running sum and the
    /// new sum), so three slots hold them all however long the chain, and no value shares a
    /// slot with a value live at the same time.
    #[test]
    fn a_chain_reuses_its_slots_and_live_values_never_share() {
        let mut g = GraphBuilder::new("chain", 4, 1);
        let x = g.push1(Op::Input {
            buffer: BufferId(1),
            cols: 8,
            selected: false,
        });
        let mut h = x;
        for _ in 0..10 {
            h = g.push1(Op::Add { a: h, b: x });
        }
        g.push(Op::Output {
            x: h,
            buffer: BufferId(2),
        });
        let graph = g.finish();
        let shapes = graph.infer_shapes().expect("shapes");
        let s = value_slots(&graph, &shapes, |_| true);
        assert_eq!(s.slot_len.len(), 3, "{s:?}");
        assert_eq!(s.elements(), 3 * 4 * 8);
        // x lives to the last add: no later value may take its slot.
        let xs = s.slot_of[x.0 as usize];
        assert!(s
            .slot_of
            .iter()
            .enumerate()
            .all(|(v, &slot)| v == x.0 as usize || slot != xs));
        // Consecutive sums are live together (the add reads one and defines the next).
        for w in graph.nodes.windows(2) {
            if let (Some(a), Some(b)) = (w[0].outputs.first(), w[1].outputs.first()) {
                assert_ne!(s.slot_of[a.0 as usize], s.slot_of[b.0 as usize]);
            }
        }
        // Nodes left out allocate nothing.
        let none = value_slots(&graph, &shapes, |_| false);
        assert_eq!(none.elements(), 0);
    }
}
