//! Fusion matching: which nodes of a graph run as one kernel, found at compile time so that the
//! op set's contract stays one op per node. The same matching as the Vulkan backend's
//! (`backend-vulkan/src/program/fuse.rs`), so both backends fuse the same chains of the same op
//! graph. Every fused kernel still writes each value its nodes define (a later node may read any
//! of them), and runs at the index of its last node; the arena is planned with those times
//! (`plan_arena_at`), so no value a group touches shares bytes with another it touches.
//!
//! Groups:
//! - `NormAdd`: a whole-row RmsNorm whose only reader is an Add (the residual add after Gemma's
//!   post-attention and post-FFN norms), and, when the sum's first reader is a whole-row RmsNorm
//!   (the next block's input norm), that norm too: three nodes, one workgroup per row
//!   (`norm_add.wgsl`).
//! - `NormRope`: a per-head RmsNorm whose only reader is a Rope over the same head size (Gemma's
//!   q and k norms); when the rope's only reader is an Attention taking it as K, the kernel also
//!   stores K and V into that attention's cache (its `kv_store` dispatch is then left out)
//!   (`norm_rope.wgsl`).
//! - `MatMulGeGlu` (this backend's own): a MatMul of two equal splits both read only by one
//!   GeGlu, as gate and up (Gemma's fused gate/up projection), where the backend's predicate
//!   takes it (decode's matvec, the weight bound whole): the matvec computes the GeGlu itself, and
//!   the two halves are never written.
//! - `NormRopePair` (this backend's own): two `NormRope` groups of the same head size (Gemma's q
//!   and k), the first storing nothing and read by no node before the second runs, as one kernel.

use tandem_backend_api::{DType, Graph, Op, ValueId, ValueShape};

/// A unit of lowering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// One node by itself.
    Single(usize),
    /// RmsNorm, Add and optionally the next RmsNorm.
    NormAdd {
        norm: usize,
        add: usize,
        next: Option<usize>,
    },
    /// Per-head RmsNorm then Rope; `store`: the Attention whose cache receives K (this rope's
    /// output) and V.
    NormRope {
        norm: usize,
        rope: usize,
        store: Option<usize>,
    },
    /// A MatMul of two equal halves, gate and up of a GeGlu that alone reads them.
    MatMulGeGlu { matmul: usize, geglu: usize },
    /// Two `NormRope` groups of one head size run as one kernel (Gemma's q and k): `a` stores
    /// nothing, `b` stores K and V into `store`'s cache where given.
    NormRopePair {
        a: (usize, usize),
        b: (usize, usize),
        store: Option<usize>,
    },
}

impl Group {
    /// The graph nodes the group runs, in graph order.
    pub fn nodes(&self) -> Vec<usize> {
        match *self {
            Group::Single(i) => vec![i],
            Group::NormAdd { norm, add, next } => {
                [Some(norm), Some(add), next].into_iter().flatten().collect()
            }
            Group::NormRope { norm, rope, .. } => vec![norm, rope],
            Group::MatMulGeGlu { matmul, geglu } => vec![matmul, geglu],
            Group::NormRopePair { a, b, .. } => {
                let mut v = vec![a.0, a.1, b.0, b.1];
                v.sort_unstable();
                v
            }
        }
    }

    /// Where the group runs: at its last node.
    pub fn at(&self) -> usize {
        self.nodes().into_iter().max().unwrap_or(0)
    }
}

/// The fusion plan of a graph.
pub struct Fusion {
    /// Every node in exactly one group, groups in the order they run.
    pub groups: Vec<Group>,
    /// When each node runs (the index of its group's last node).
    pub time: Vec<usize>,
    /// Attention nodes whose K/V store a `NormRope` group does.
    pub stored: Vec<bool>,
}

/// The largest head `norm_rope.wgsl` takes.
pub const MAX_HEAD_DIM: usize = 512;

/// Weight formats the norm kernels read.
fn norm_weight(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::Bf16)
}

/// Plans the groups of `graph`; with `enabled` false every node is its own group. `geglu_ok`
/// says whether the backend computes a GeGlu in the MatMul node it is given.
pub fn plan(graph: &Graph, shapes: &[ValueShape], enabled: bool, geglu_ok: &dyn Fn(usize) -> bool) -> Fusion {
    let n = graph.nodes.len();
    let mut def = vec![usize::MAX; shapes.len()];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); shapes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        for o in &node.outputs {
            def[o.0 as usize] = i;
        }
        for v in node.op.inputs() {
            let u = &mut users[v.0 as usize];
            if u.last() != Some(&i) {
                u.push(i);
            }
        }
    }
    let only_user = |v: ValueId| match users[v.0 as usize].as_slice() {
        [u] => Some(*u),
        _ => None,
    };
    let out = |i: usize| graph.nodes[i].outputs.first().copied();
    // A whole-row norm (one group per row) reading `x`.
    let row_norm = |i: usize| match &graph.nodes[i].op {
        Op::RmsNorm { x, weight, .. } => {
            norm_weight(weight.desc.dtype) && weight.desc.numel() == shapes[x.0 as usize].cols
        }
        _ => false,
    };
    let mut taken = vec![false; n];
    let mut groups_at: Vec<Option<Group>> = vec![None; n];
    let mut stored = vec![false; n];
    if enabled {
        for i in 0..n {
            if taken[i] {
                continue;
            }
            let Op::RmsNorm { x, weight, .. } = &graph.nodes[i].op else {
                continue;
            };
            let Some(y) = out(i) else { continue };
            let Some(j) = only_user(y) else { continue };
            if taken[j] || !norm_weight(weight.desc.dtype) {
                continue;
            }
            let cols = shapes[x.0 as usize].cols;
            match &graph.nodes[j].op {
                Op::Add { a, b } if row_norm(i) && (*a == y) != (*b == y) => {
                    let Some(s) = out(j) else { continue };
                    // The sum's first reader, if a whole-row norm that nothing reads before it.
                    let next = users[s.0 as usize]
                        .first()
                        .copied()
                        .filter(|&k| !taken[k] && row_norm(k) && shapes[s.0 as usize].cols == cols);
                    let g = Group::NormAdd {
                        norm: i,
                        add: j,
                        next,
                    };
                    for m in g.nodes() {
                        taken[m] = true;
                    }
                    groups_at[g.at()] = Some(g);
                }
                // norm_rope.wgsl holds a head of up to MAX_HEAD_DIM in workgroup memory and
                // stores f16 caches two values (one word) at a time: even heads only.
                Op::Rope { head_dim, .. }
                    if weight.desc.numel() == *head_dim
                        && cols.is_multiple_of(*head_dim)
                        && *head_dim <= MAX_HEAD_DIM
                        && head_dim.is_multiple_of(2) =>
                {
                    let r = j;
                    let store = out(r).and_then(only_user).filter(|&a| {
                        let Op::Attention {
                            k,
                            v,
                            cache,
                            kv_heads,
                            head_dim: hd,
                            ..
                        } = &graph.nodes[a].op
                        else {
                            return false;
                        };
                        // V exists when the rope runs, the rope's output is K (of the cache's
                        // width), and no node between the rope and the attention touches the cache.
                        Some(*k) == out(r)
                            && def[v.0 as usize] < r
                            && *hd == *head_dim
                            && kv_heads * hd == cols
                            && shapes[v.0 as usize].cols == cols
                            && !graph.nodes[r + 1..a].iter().any(|m| match &m.op {
                                Op::Attention { cache: c, .. } => {
                                    c.k == cache.k || c.v == cache.v || c.k == cache.v || c.v == cache.k
                                }
                                _ => false,
                            })
                    });
                    if let Some(a) = store {
                        stored[a] = true;
                    }
                    let g = Group::NormRope {
                        norm: i,
                        rope: r,
                        store,
                    };
                    taken[i] = true;
                    taken[r] = true;
                    groups_at[g.at()] = Some(g);
                }
                _ => {}
            }
        }
    }
    if enabled {
        for i in 0..n {
            let Op::MatMul { splits, .. } = &graph.nodes[i].op else {
                continue;
            };
            let outs = &graph.nodes[i].outputs;
            if taken[i] || splits.len() != 2 || splits[0] != splits[1] || outs.len() != 2 {
                continue;
            }
            let (Some(j), Some(j2)) = (only_user(outs[0]), only_user(outs[1])) else {
                continue;
            };
            let is_geglu =
                matches!(&graph.nodes[j].op, Op::GeGlu { gate, up } if *gate == outs[0] && *up == outs[1]);
            if j != j2 || taken[j] || !is_geglu || !geglu_ok(i) {
                continue;
            }
            let g = Group::MatMulGeGlu { matmul: i, geglu: j };
            taken[i] = true;
            taken[j] = true;
            groups_at[g.at()] = Some(g);
        }
    }
    if enabled {
        pair_norm_ropes(graph, &users, &mut groups_at);
    }
    let mut groups = Vec::with_capacity(n);
    let mut time: Vec<usize> = (0..n).collect();
    for i in 0..n {
        match groups_at[i] {
            Some(g) => {
                for m in g.nodes() {
                    time[m] = i;
                }
                groups.push(g);
            }
            None if !taken[i] => groups.push(Group::Single(i)),
            None => {}
        }
    }
    Fusion { groups, time, stored }
}

/// Pairs each `NormRope` group without a store with the next `NormRope` group of the same head
/// size, when no node runs between them that reads the first's values (they become the
/// second's, at its time).
fn pair_norm_ropes(graph: &Graph, users: &[Vec<usize>], groups_at: &mut [Option<Group>]) {
    let head_dim = |rope: usize| match &graph.nodes[rope].op {
        Op::Rope { head_dim, .. } => Some(*head_dim),
        _ => None,
    };
    let n = groups_at.len();
    let mut t = 0;
    while t < n {
        let Some(Group::NormRope {
            norm,
            rope,
            store: None,
        }) = groups_at[t]
        else {
            t += 1;
            continue;
        };
        let next = (t + 1..n).find(|&u| matches!(groups_at[u], Some(Group::NormRope { .. })));
        let Some(u) = next else { break };
        let Some(Group::NormRope {
            norm: nb,
            rope: rb,
            store,
        }) = groups_at[u]
        else {
            break;
        };
        let read_before = [norm, rope].iter().any(|&m| {
            graph.nodes[m]
                .outputs
                .iter()
                .any(|o| users[o.0 as usize].iter().any(|&r| r <= u && r != rope))
        });
        if head_dim(rope).is_some() && head_dim(rope) == head_dim(rb) && !read_before {
            groups_at[t] = None;
            groups_at[u] = Some(Group::NormRopePair {
                a: (norm, rope),
                b: (nb, rb),
                store,
            });
        }
        t = u + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_backend_api::{BufferId, GraphBuilder, KvCacheRef, TensorDesc, WeightRef};

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
