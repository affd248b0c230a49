//! Fusion matching for this backend: the shared matching (`tandem_gpu_kit::fuse`, the
//! same as the wgpu backend's) under this backend's rules: `NormAdd` (`norm_add.comp`) and
//! `NormRope` (`norm_rope.comp`, storing K and V where the rope's reader is the attention), of
//! any head size; no GeGlu in a matmul, no paired norm-ropes.

use tandem_backend_api::{Graph, ValueShape};
use tandem_gpu_kit::fuse::{self, Rules};
pub use tandem_gpu_kit::fuse::{Fusion, Group};

/// Plans the groups of `graph`; with `enabled` false every node is its own group.
pub fn plan(graph: &Graph, shapes: &[ValueShape], enabled: bool) -> Fusion {
    let rules = Rules {
        rope_head: &|_| true,
        geglu: None,
        pair_norm_ropes: false,
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
        let f = plan(&graph, &shapes, true);
        assert_eq!(
            f.groups[4..],
            [
                Group::NormRope {
                    norm: 4,
                    rope: 6,
                    store: None
                },
                Group::NormRope {
                    norm: 5,
                    rope: 7,
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
        assert_eq!(f.time[4], 6);
        assert_eq!(f.time[9], 11);
        // Every node once.
        let mut all: Vec<usize> = f.groups.iter().flat_map(|g| g.nodes()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..graph.nodes.len()).collect::<Vec<_>>());
        // Disabled: one group per node, in order.
        let f = plan(&graph, &shapes, false);
        assert!(f.groups.iter().enumerate().all(|(i, g)| *g == Group::Single(i)));
        assert!(!f.stored.iter().any(|s| *s));
    }
}
