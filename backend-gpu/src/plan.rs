//! Every value of a graph in one arena, first fit over the space of values freed after their
//! last use, and per-node times from timestamps.

use tandem_backend_api::kit::plan::value_rows;
use tandem_backend_api::{Graph, NodeTime, Op, ValueShape};

/// Per-node device times from `ticks`, a timestamp before the first node and one after each
/// node, `ns_per_tick` nanoseconds apart (nodes past the ticks given are left out).
pub fn node_times(graph: &Graph, ticks: &[u64], ns_per_tick: f64) -> Vec<NodeTime> {
    graph
        .nodes
        .iter()
        .zip(ticks.windows(2))
        .enumerate()
        .map(|(i, (node, t))| NodeTime {
            node: i,
            op: node.op.name(),
            seconds: t[1].saturating_sub(t[0]) as f64 * ns_per_tick * 1e-9,
        })
        .collect()
}

/// Bytes a value of `shape` takes in the arena: its f32 elements, at least 4 bytes, rounded up
/// to `align`.
pub fn value_bytes(graph: &Graph, shape: &ValueShape, align: u64) -> u64 {
    ((value_rows(graph, shape) * shape.cols * 4) as u64)
        .max(4)
        .div_ceil(align)
        * align
}

/// Arena byte offsets per value (`None` for the values of [`Op::Input`], which a backend reads
/// from their own buffers) and the arena's size. Offsets are multiples of `align`; two values
/// share bytes only when one's last use comes before the other is defined.
pub fn plan_arena(graph: &Graph, shapes: &[ValueShape], align: u64) -> (Vec<Option<u64>>, u64) {
    let order: Vec<usize> = (0..graph.nodes.len()).collect();
    plan_arena_at(graph, shapes, align, &order)
}

/// [`plan_arena`] for a backend that runs node `i` at time `time[i]` (a backend fusing nodes into
/// one kernel gives every node of a fused group the time the group runs at). A value is live
/// from the earliest time of its defining node to the latest time of its users; two values share
/// bytes only when one's life ends before the other's begins, so the nodes of one time never
/// overwrite what another node of that time reads. `time` must be at least each node's index
/// (a group runs once its last node's inputs exist) and hold one entry per node.
pub fn plan_arena_at(
    graph: &Graph,
    shapes: &[ValueShape],
    align: u64,
    time: &[usize],
) -> (Vec<Option<u64>>, u64) {
    let n = shapes.len();
    let nodes = graph.nodes.len();
    let at = |i: usize| time.get(i).copied().unwrap_or(i).min(nodes.saturating_sub(1));
    let mut last_use = vec![0usize; n];
    let mut defined_at = vec![0usize; n];
    for (i, node) in graph.nodes.iter().enumerate() {
        for o in &node.outputs {
            defined_at[o.0 as usize] = at(i);
            last_use[o.0 as usize] = last_use[o.0 as usize].max(at(i));
        }
        for v in node.op.inputs() {
            last_use[v.0 as usize] = last_use[v.0 as usize].max(at(i));
        }
    }
    let mut by_time: Vec<Vec<usize>> = vec![Vec::new(); nodes];
    for i in 0..nodes {
        by_time[at(i)].push(i);
    }
    let mut offsets: Vec<Option<u64>> = vec![None; n];
    let mut free: Vec<(u64, u64)> = Vec::new(); // (offset, size), sorted by offset
    let mut end = 0u64;
    for (t, group) in by_time.iter().enumerate() {
        for &i in group {
            let node = &graph.nodes[i];
            if matches!(node.op, Op::Input { .. }) {
                continue;
            }
            for o in &node.outputs {
                let size = value_bytes(graph, &shapes[o.0 as usize], align);
                let at = match free.iter().position(|(_, fs)| *fs >= size) {
                    Some(k) => {
                        let (fo, fs) = free[k];
                        if fs == size {
                            free.remove(k);
                        } else {
                            free[k] = (fo + size, fs - size);
                        }
                        fo
                    }
                    None => {
                        let at = end;
                        end += size;
                        at
                    }
                };
                offsets[o.0 as usize] = Some(at);
            }
        }
        for v in 0..n {
            if last_use[v] == t && defined_at[v] <= t {
                if let Some(at) = offsets[v] {
                    free.push((at, value_bytes(graph, &shapes[v], align)));
                    free.sort_unstable();
                    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(free.len());
                    for (o, s) in free.drain(..) {
                        match merged.last_mut() {
                            Some((lo, ls)) if *lo + *ls == o => *ls += s,
                            _ => merged.push((o, s)),
                        }
                    }
                    free = merged;
                }
            }
        }
    }
    (offsets, end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_backend_api::{BufferId, DType, GraphBuilder, TensorDesc, ValueId, WeightRef};

    #[test]
    fn fused_nodes_keep_every_value_they_touch_apart() {
        let mut g = GraphBuilder::new("t", 1, 0);
        let x = g.push1(Op::Input {
            buffer: BufferId(1),
            cols: 64,
            selected: false,
        });
        let a = g.push1(Op::RmsNorm {
            x,
            weight: WeightRef {
                buffer: BufferId(2),
                desc: TensorDesc::new(DType::F32, [64]),
            },
            eps: 0.0,
            weight_offset: 0.0,
        });
        let b = g.push1(Op::Add { a, b: a });
        let c = g.push1(Op::Add { a: b, b });
        let d = g.push1(Op::Add { a: c, b: c });
        let graph = g.finish();
        let shapes = graph.infer_shapes().unwrap();
        let o = |off: &[Option<u64>], v: ValueId| off[v.0 as usize].unwrap();
        // One node at a time, c takes a's bytes (a is dead once b is computed).
        let (seq, _) = plan_arena(&graph, &shapes, 256);
        assert_eq!(o(&seq, c), o(&seq, a));
        // b and c run as one kernel at c's time: a is read while c is written.
        let (fused, _) = plan_arena_at(&graph, &shapes, 256, &[0, 1, 3, 3, 4]);
        let all = [a, b, c].map(|v| o(&fused, v));
        assert!(
            all[0] != all[1] && all[1] != all[2] && all[0] != all[2],
            "{all:?}"
        );
        assert_ne!(o(&fused, d), o(&fused, c));
    }

    #[test]
    fn values_reuse_space_only_after_their_last_use() {
        let mut g = GraphBuilder::new("t", 2, 0);
        let x = g.push1(Op::Input {
            buffer: BufferId(1),
            cols: 8,
            selected: false,
        });
        let w = WeightRef {
            buffer: BufferId(2),
            desc: TensorDesc::new(DType::F32, [8]),
        };
        let a = g.push1(Op::RmsNorm {
            x,
            weight: w.clone(),
            eps: 0.0,
            weight_offset: 0.0,
        });
        let b = g.push1(Op::Add { a, b: a });
        let c = g.push1(Op::Add { a: b, b });
        let graph = g.finish();
        let shapes = graph.infer_shapes().unwrap();
        let (off, size) = plan_arena(&graph, &shapes, 256);
        assert_eq!(off[x.0 as usize], None);
        let (oa, ob, oc) = (
            off[a.0 as usize].unwrap(),
            off[b.0 as usize].unwrap(),
            off[c.0 as usize].unwrap(),
        );
        // a and b are live together; c is defined at b's last use (an op may read and write
        // one place only if the planner says so: c must not overlap b).
        assert_ne!(oa, ob);
        assert_ne!(ob, oc);
        assert!(oa % 256 == 0 && ob % 256 == 0 && oc % 256 == 0);
        assert!((2 * 256..=3 * 256).contains(&size), "{size}");
        // The timestamps after each node, as durations.
        let times = node_times(&graph, &[10, 12, 15, 15, 20], 2.0);
        assert_eq!(times.len(), 4);
        assert_eq!(times[1].op, "rms_norm(f32)");
        assert!((times[1].seconds - 6e-9).abs() < 1e-15 && times[2].seconds == 0.0);
    }
}
