//! Fusion matching shared by the GPU backends: which nodes of a graph run as one kernel, found
//! at compile time so that the op set's contract stays one op per node. Both backends fuse the
//! same chains of the same op graph; each says through [`Rules`] which its kernels take. Every
//! fused kernel still writes each value its nodes define (a later node may read any of them),
//! and runs at the index of its last node; the arena is planned with those times
//! ([`crate::plan::plan_arena_at`]), so no value a group touches shares bytes with another it
//! touches.
//!
//! Groups:
//! - `NormAdd`: a whole-row RmsNorm whose only reader is an Add (the residual add after Gemma's
//!   post-attention and post-FFN norms), and, when the sum's first reader is a whole-row RmsNorm
//!   (the next block's input norm), that norm too: three nodes, one workgroup per row.
//! - `NormRope`: a per-head RmsNorm whose only reader is a Rope over the same head size (Gemma's
//!   q and k norms), where [`Rules::rope_head`] takes the head size; when the rope's only reader
//!   is an Attention taking it as K, the kernel also stores K and V into that attention's cache
//!   (its `kv_store` dispatch is then left out).
//! - `MatMulGeGlu` (where [`Rules::geglu`] is given): a MatMul of two equal splits both read only
//!   by one GeGlu, as gate and up (Gemma's fused gate/up projection), where the predicate takes
//!   the MatMul: its kernel computes the GeGlu itself, and the two halves are never written.
//! - `NormRopePair` (with [`Rules::pair_norm_ropes`]): two `NormRope` groups of the same head
//!   size (Gemma's q and k), the first storing nothing and read by no node before the second
//!   runs, as one kernel.

use tandem_backend_api::{DType, Graph, Op, ValueId, ValueShape};

/// A unit of lowering (node indices of the graph).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// One node by itself.
    Single(usize),
    /// RmsNorm, Add and optionally the next RmsNorm.
    NormAdd {
        /// The RmsNorm.
        norm: usize,
        /// The Add reading it.
        add: usize,
        /// The RmsNorm reading the sum, if fused too.
        next: Option<usize>,
    },
    /// Per-head RmsNorm then Rope.
    NormRope {
        /// The RmsNorm.
        norm: usize,
        /// The Rope reading it.
        rope: usize,
        /// The Attention whose cache receives K (this rope's output) and V.
        store: Option<usize>,
    },
    /// A MatMul of two equal halves, gate and up of a GeGlu that alone reads them.
    MatMulGeGlu {
        /// The MatMul.
        matmul: usize,
        /// The GeGlu.
        geglu: usize,
    },
    /// Two `NormRope` groups of one head size run as one kernel (Gemma's q and k).
    NormRopePair {
        /// The first (norm, rope): it stores nothing.
        a: (usize, usize),
        /// The second (norm, rope).
        b: (usize, usize),
        /// The Attention whose cache receives the second's K, and V.
        store: Option<usize>,
    },
}

/// What a backend's fused kernels take.
pub struct Rules<'a> {
    /// Whether the norm-rope kernel takes heads of this size.
    pub rope_head: &'a dyn Fn(usize) -> bool,
    /// Whether the backend computes a GeGlu in the MatMul node it is given; `None`: never.
    pub geglu: Option<&'a dyn Fn(usize) -> bool>,
    /// Whether a layer's q and k norm-rope groups may run as one kernel.
    pub pair_norm_ropes: bool,
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

/// Weight formats the norm kernels read.
fn norm_weight(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::Bf16)
}

/// Plans the groups of `graph` (`shapes`: its values' shapes) under `rules`; without rules every
/// node is its own group.
pub fn plan(graph: &Graph, shapes: &[ValueShape], rules: Option<&Rules<'_>>) -> Fusion {
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
    if let Some(rules) = rules {
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
                Op::Rope { head_dim, .. }
                    if weight.desc.numel() == *head_dim
                        && cols.is_multiple_of(*head_dim)
                        && (rules.rope_head)(*head_dim) =>
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
    if let Some(geglu_ok) = rules.and_then(|r| r.geglu) {
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
    if rules.is_some_and(|r| r.pair_norm_ropes) {
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
