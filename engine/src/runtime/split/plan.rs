//! How a placed step graph splits at unit boundaries, before any backend is asked: the segments
//! (runs of consecutive nodes on one unit) and the values that cross between them.

use std::collections::HashMap;

use tandem_backend_api::{Graph, RowCount, ValueId, ValueShape};

/// A value that one program computes and a later one reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crossing {
    /// The value in the whole graph.
    pub value: ValueId,
    /// The segment that computes it.
    pub from_segment: usize,
    /// The later segments that read it.
    pub to_segments: Vec<usize>,
    /// Its shape.
    pub shape: ValueShape,
}

/// How a graph splits at unit boundaries, before any backend is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitPlan {
    /// Per segment: its unit and the range of nodes it runs.
    pub segments: Vec<(usize, std::ops::Range<usize>)>,
    /// Values read by a segment other than the one computing them.
    pub crossings: Vec<Crossing>,
}

impl SplitPlan {
    /// Splits `graph` where `units[node]` changes.
    pub fn new(graph: &Graph, units: &[usize], shapes: &[ValueShape]) -> SplitPlan {
        let mut segments: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for (i, &u) in units.iter().enumerate().take(graph.nodes.len()) {
            match segments.last_mut() {
                Some((unit, range)) if *unit == u => range.end = i + 1,
                _ => segments.push((u, i..i + 1)),
            }
        }
        let mut producer: HashMap<ValueId, usize> = HashMap::new();
        let mut crossings: Vec<Crossing> = Vec::new();
        for (s, (_, range)) in segments.iter().enumerate() {
            for node in &graph.nodes[range.clone()] {
                for v in node.op.inputs() {
                    let Some(&p) = producer.get(&v) else { continue };
                    if p == s {
                        continue;
                    }
                    match crossings.iter_mut().find(|c| c.value == v) {
                        Some(c) if !c.to_segments.contains(&s) => c.to_segments.push(s),
                        Some(_) => {}
                        None => crossings.push(Crossing {
                            value: v,
                            from_segment: p,
                            to_segments: vec![s],
                            shape: shapes[v.0 as usize],
                        }),
                    }
                }
                for &o in &node.outputs {
                    producer.insert(o, s);
                }
            }
        }
        SplitPlan { segments, crossings }
    }

    /// The units other than the producer's that read `c`: each gets one copy per step.
    pub fn copy_targets(&self, c: &Crossing) -> Vec<usize> {
        let from = self.segments[c.from_segment].0;
        let mut out: Vec<usize> = Vec::new();
        for &s in &c.to_segments {
            let u = self.segments[s].0;
            if u != from && !out.contains(&u) {
                out.push(u);
            }
        }
        out
    }

    /// Bytes one step moves between units through the host (read once, written to each other
    /// unit), for a step of `rows` rows keeping `selected`.
    pub fn host_bytes(&self, rows: usize, selected: usize) -> u64 {
        self.crossings
            .iter()
            .map(|c| value_bytes(c.shape, rows, selected) as u64 * self.copy_targets(c).len() as u64)
            .sum()
    }
}

pub(super) fn value_bytes(shape: ValueShape, rows: usize, selected: usize) -> usize {
    let r = match shape.rows {
        RowCount::Step => rows,
        RowCount::Selected => selected,
    };
    r * shape.cols * 4
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use tandem_backend_api::{BufferId, DType, GraphBuilder, Op, TensorDesc, WeightRef};

    fn graph() -> Graph {
        let w = WeightRef {
            buffer: BufferId(1),
            desc: TensorDesc::new(DType::F32, [8, 4]),
        };
        toy_graph("t", 3, 1, w)
    }

    /// embed -> x + x -> that + x -> select -> output: the toy graph the split tests cut (here
    /// and in `program.rs`).
    pub(in crate::runtime::split) fn toy_graph(
        name: &str,
        rows: usize,
        selected: usize,
        table: WeightRef,
    ) -> Graph {
        let mut g = GraphBuilder::new(name, rows, selected);
        let x = g.push1(Op::Embed {
            table,
            scale: 1.0,
            extra: None,
        });
        let y = g.push1(Op::Add { a: x, b: x });
        let z = g.push1(Op::Add { a: y, b: x });
        let s = g.push1(Op::SelectRows { x: z });
        g.push(Op::Output {
            x: s,
            buffer: BufferId::UNBOUND,
        });
        g.finish()
    }

    #[test]
    fn splits_at_unit_changes_and_counts_crossings_once_per_unit() {
        let g = graph();
        let shapes = g.infer_shapes().unwrap();
        // embed on 0, the first add on 1, the rest on 0 again.
        let plan = SplitPlan::new(&g, &[0, 1, 0, 0, 0], &shapes);
        assert_eq!(plan.segments, vec![(0, 0..1), (1, 1..2), (0, 2..5)]);
        // x (read by both later segments) and y cross.
        assert_eq!(plan.crossings.len(), 2);
        assert_eq!(plan.crossings[0].to_segments, vec![1, 2]);
        // x goes to unit 1 by copy (unit 0's later segment reads it in place); y back to unit 0.
        assert_eq!(plan.copy_targets(&plan.crossings[0]), vec![1]);
        assert_eq!(plan.copy_targets(&plan.crossings[1]), vec![0]);
        assert_eq!(plan.host_bytes(3, 1), 2 * 3 * 4 * 4);
        let one = SplitPlan::new(&g, &[0; 5], &shapes);
        assert_eq!(one.segments.len(), 1);
        assert_eq!(one.host_bytes(3, 1), 0);
    }
}
