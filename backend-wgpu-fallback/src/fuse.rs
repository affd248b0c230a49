//! Fusion matching for this backend: the shared matching (`tandem_gpu_kit::fuse`, the
//! same as the Vulkan backend's, so both fuse the same chains of the same op graph) under this
//! backend's rules. Its kernels: `norm_add.wgsl`, `norm_rope.wgsl` (a layer's q and k as one
//! dispatch: `NormRopePair`), and a decode matvec that computes the GeGlu of its halves
//! (`MatMulGeGlu`, where the backend's predicate takes the MatMul).

use tandem_backend_api::{Graph, ValueShape};
use tandem_gpu_kit::fuse::{self, Rules};
pub use tandem_gpu_kit::fuse::{Fusion, Group};

/// The largest head `norm_rope.wgsl` takes.
pub const MAX_HEAD_DIM: usize = 512;

/// Plans the groups of `graph`; with `enabled` false every node is its own group. `geglu_ok`
/// says whether the backend computes a GeGlu in the MatMul node it is given.
pub fn plan(graph: &Graph, shapes: &[ValueShape], enabled: bool, geglu_ok: &dyn Fn(usize) -> bool) -> Fusion {
    // norm_rope.wgsl holds a head of up to MAX_HEAD_DIM in workgroup memory and stores f16
    // caches two values (one word) at a time: even heads only.
    let rules = Rules {
        rope_head: &|d| d <= MAX_HEAD_DIM && d.is_multiple_of(2),
        geglu: Some(geglu_ok),
        pair_norm_ropes: true,
    };
    fuse::plan(graph, shapes, enabled.then_some(&rules))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_backend_api::{BufferId, DType, GraphBuilder, KvCacheRef, Op, TensorDesc, ValueId, WeightRef};

    fn w(id: u64, n: usize) -> WeightRef {
        WeightRef {
            buffer: BufferId(id),
            desc: TensorDesc::new(DType::F32, [n]),
        }
    }

    fn norm(g: &mut GraphBuilder, x: ValueId, n: usize) -> ValueId {
        g.push1(Op::RmsNorm {
            x,
            weight: w(9, n),
            eps: 1e-6,
            weight_offset: 1.0,
        })
    }

    /// Gemma's attention block and residual: q/k norms with rope (k stored by its group), the
    /// post-norm, add and next norm as one group; the output reads the sum.
    #[test]
    fn gemma_blocks_fuse_and_run_at_their_last_node() {
        let (hd, heads) = (8, 2);
        let mut g = GraphBuilder::new("t", 2, 0);
        let input = |g: &mut GraphBuilder, cols| {
            g.push1(Op::Input {
                buffer: BufferId(1),
                cols,
                selected: false,
            })
        };
        let q = input(&mut g, heads * hd); // 0
        let k = input(&mut g, hd); // 1
        let v = input(&mut g, hd); // 2
        let h = input(&mut g, heads * hd); // 3
        let qn = norm(&mut g, q, hd); // 4
        let kn = norm(&mut g, k, hd); // 5
        let rope = |g: &mut GraphBuilder, x| {
            g.push1(Op::Rope {
                x,
                head_dim: hd,
                theta: 1e4,
                factor: 1.0,
            })
        };
        let qr = rope(&mut g, qn); // 6
        let kr = rope(&mut g, kn); // 7
        let a = g.push1(Op::Attention {
            q: qr,
            k: kr,
            v,
            cache: KvCacheRef {
                k: BufferId(5),
                v: BufferId(6),
                dtype: DType::F32,
                slots: 1,
                capacity: 8,
            },
            heads,
            kv_heads: 1,
            head_dim: hd,
            scale: 1.0,
            window: None,
            softcap: None,
            bidirectional_from: None,
        }); // 8
        let an = norm(&mut g, a, heads * hd); // 9
        let s = g.push1(Op::Add { a: h, b: an }); // 10
        let sn = norm(&mut g, s, heads * hd); // 11
        g.push(Op::Output {
            x: sn,
            buffer: BufferId(7),
        }); // 12
        let graph = g.finish();
        let shapes = graph.infer_shapes().unwrap();
        let f = plan(&graph, &shapes, true, &|_| true);
        assert_eq!(
            f.groups[4..],
            [
                // The q and k groups (the k one storing K and V) run as one kernel.
                Group::NormRopePair {
                    a: (4, 6),
                    b: (5, 7),
                    store: Some(8)
                },
                Group::Single(8),
                Group::NormAdd {
                    norm: 9,
                    add: 10,
                    next: Some(11)
                },
                Group::Single(12),
            ]
        );
        assert!(f.stored[8]);
        assert_eq!(f.time[4], 7);
        assert_eq!(f.time[6], 7);
        assert_eq!(f.time[9], 11);
        // Every node once.
        let mut all: Vec<usize> = f.groups.iter().flat_map(|g| g.nodes()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..graph.nodes.len()).collect::<Vec<_>>());
        // Disabled: one group per node, in order.
        let f2 = plan(&graph, &shapes, false, &|_| true);
        assert!(!f2.groups.iter().any(|g| matches!(g, Group::MatMulGeGlu { .. })));
        let f = plan(&graph, &shapes, false, &|_| true);
        assert!(f.groups.iter().enumerate().all(|(i, g)| *g == Group::Single(i)));
        assert!(!f.stored.iter().any(|s| *s));
    }

    /// Gate and up over one weight then GeGlu fuse where the backend takes it; halves in the other
    /// order, a half read elsewhere, or a refusing predicate leave the nodes alone.
    #[test]
    fn gate_up_and_geglu_fuse_where_the_backend_takes_them() {
        let build = |swapped: bool, extra_reader: bool| {
            let mut g = GraphBuilder::new("ffn", 1, 0);
            let x = g.push1(Op::Input {
                buffer: BufferId(1),
                cols: 32,
                selected: false,
            });
            let gu = g.push(Op::MatMul {
                x,
                weight: WeightRef {
                    buffer: BufferId(2),
                    desc: TensorDesc::new(DType::Q8_0, [8, 32]),
                },
                splits: vec![4, 4],
            });
            let (gate, up) = if swapped { (gu[1], gu[0]) } else { (gu[0], gu[1]) };
            let m = g.push1(Op::GeGlu { gate, up });
            g.push(Op::Output {
                x: m,
                buffer: BufferId(3),
            });
            if extra_reader {
                g.push(Op::Output {
                    x: gu[1],
                    buffer: BufferId(4),
                });
            }
            g.finish()
        };
        let graph = build(false, false);
        let shapes = graph.infer_shapes().unwrap();
        let f = plan(&graph, &shapes, true, &|i| i == 1);
        assert_eq!(f.groups[1], Group::MatMulGeGlu { matmul: 1, geglu: 2 });
        assert_eq!(f.time[1], 2);
        let f = plan(&graph, &shapes, true, &|_| false);
        assert_eq!(f.groups[1], Group::Single(1));
        for graph in [build(true, false), build(false, true)] {
            let shapes = graph.infer_shapes().unwrap();
            let f = plan(&graph, &shapes, true, &|_| true);
            assert!(
                f.groups.iter().all(|g| matches!(g, Group::Single(_))),
                "{:?}",
                f.groups
            );
        }
    }
}
