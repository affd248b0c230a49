//! The buffer table every backend keeps, and the check of the buffers a graph names against
//! what they hold.

use std::collections::HashMap;

use crate::error::BackendError;
use crate::graph::{Graph, Op, ValueShape};
use crate::kit::plan::value_rows;
use crate::kit::programs::Programs;
use crate::tensor::{BufferId, TensorDesc};
use crate::DType;

/// The error for a buffer id this backend did not issue (or already freed):
/// `unknown buffer 7`.
pub fn unknown_buffer(id: BufferId) -> BackendError {
    BackendError::invalid(format!("unknown buffer {}", id.0))
}

/// A backend's buffers by id: `B` is whatever the backend keeps per buffer (device memory, host
/// bytes, its [`TensorDesc`]). Ids are issued from 1 upwards and never reused.
#[derive(Debug)]
pub struct Buffers<B> {
    entries: HashMap<u64, B>,
    next: u64,
}

impl<B> Default for Buffers<B> {
    fn default() -> Self {
        Buffers {
            entries: HashMap::new(),
            next: 1,
        }
    }
}

impl<B> Buffers<B> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a buffer and returns its new id.
    pub fn insert(&mut self, buffer: B) -> BufferId {
        let id = self.next;
        self.next += 1;
        self.entries.insert(id, buffer);
        BufferId(id)
    }

    /// The buffer behind `id`, or `unknown buffer N`.
    pub fn get(&self, id: BufferId) -> Result<&B, BackendError> {
        self.entries.get(&id.0).ok_or_else(|| unknown_buffer(id))
    }

    /// The buffer behind `id`, mutably, or `unknown buffer N`.
    pub fn get_mut(&mut self, id: BufferId) -> Result<&mut B, BackendError> {
        self.entries.get_mut(&id.0).ok_or_else(|| unknown_buffer(id))
    }

    /// Two distinct buffers at once, mutably (a kernel writing both halves of a KV cache).
    /// Fails when either is unknown or both ids are the same.
    pub fn pair_mut(&mut self, a: BufferId, b: BufferId) -> Result<(&mut B, &mut B), BackendError> {
        if a == b {
            return Err(BackendError::invalid(format!(
                "buffer {} is named twice where two buffers are needed",
                a.0
            )));
        }
        let (mut first, mut second) = (None, None);
        for (id, buf) in self.entries.iter_mut() {
            if *id == a.0 {
                first = Some(buf);
            } else if *id == b.0 {
                second = Some(buf);
            }
        }
        match (first, second) {
            (Some(x), Some(y)) => Ok((x, y)),
            (None, _) => Err(unknown_buffer(a)),
            (_, None) => Err(unknown_buffer(b)),
        }
    }

    /// Removes a buffer that no program of `programs` names (see [`Programs::check_unused`]),
    /// and returns it for the backend to release its memory.
    pub fn free<P>(&mut self, id: BufferId, programs: &Programs<P>) -> Result<B, BackendError> {
        programs.check_unused(id)?;
        self.entries.remove(&id.0).ok_or_else(|| unknown_buffer(id))
    }

    /// Every buffer, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (BufferId, &B)> {
        self.entries.iter().map(|(id, b)| (BufferId(*id), b))
    }

    /// Every buffer, mutably, in no particular order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (BufferId, &mut B)> {
        self.entries.iter_mut().map(|(id, b)| (BufferId(*id), b))
    }

    /// Removes every buffer (a backend being dropped), whether programs name them or not.
    pub fn drain(&mut self) -> impl Iterator<Item = B> + '_ {
        self.entries.drain().map(|(_, b)| b)
    }

    /// How many buffers there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Every buffer the graph's nodes name (weights, KV caches, inputs and outputs), sorted, once
/// each: what a program keeps from being freed, for backends that check their buffers their own
/// way.
pub fn named_buffers(graph: &Graph) -> Vec<BufferId> {
    let mut used: Vec<BufferId> = graph
        .nodes
        .iter()
        .flat_map(|n| {
            let mut op = n.op.clone();
            op.buffers_mut().into_iter().map(|b| *b).collect::<Vec<_>>()
        })
        .collect();
    used.sort();
    used.dedup();
    used
}

/// Checks every buffer a graph names against what it holds (`desc_of` looks a buffer up, and
/// fails for an unknown id): weights hold the graph's description, input and output buffers
/// enough f32 values, KV caches `[slots, capacity, kv_heads * head_dim]` of the cache's dtype in
/// two distinct buffers. Errors name the node and the buffer. Returns every buffer the graph
/// reads or writes, sorted, once each (what [`Programs::insert`] takes).
///
/// `shapes` are the graph's value shapes, from [`Graph::infer_shapes`].
pub fn check_buffers(
    graph: &Graph,
    shapes: &[ValueShape],
    desc_of: impl Fn(BufferId) -> Result<TensorDesc, BackendError>,
) -> Result<Vec<BufferId>, BackendError> {
    let shape = |v: crate::ValueId| {
        shapes
            .get(v.0 as usize)
            .copied()
            .ok_or_else(|| BackendError::internal(format!("value {} has no inferred shape", v.0)))
    };
    let mut used = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        for w in node.op.weights() {
            let held = desc_of(w.buffer)?;
            if held != w.desc {
                return Err(BackendError::invalid(format!(
                    "node {i}: weight buffer {} holds {held}, the graph says {}",
                    w.buffer.0, w.desc
                )));
            }
            used.push(w.buffer);
        }
        let act = |id: BufferId, elems: usize| -> Result<(), BackendError> {
            let held = desc_of(id)?;
            if held.dtype != DType::F32 || held.numel() < elems {
                return Err(BackendError::invalid(format!(
                    "node {i}: buffer {} ({held}) cannot hold {elems} f32 values",
                    id.0
                )));
            }
            Ok(())
        };
        match &node.op {
            Op::Input { buffer, cols, .. } => {
                let out = node
                    .outputs
                    .first()
                    .ok_or_else(|| BackendError::invalid(format!("node {i}: an input defines no value")))?;
                act(*buffer, value_rows(graph, &shape(*out)?) * cols)?;
                used.push(*buffer);
            }
            Op::Output { x, buffer } => {
                let s = shape(*x)?;
                act(*buffer, value_rows(graph, &s) * s.cols)?;
                used.push(*buffer);
            }
            Op::Attention {
                cache,
                kv_heads,
                head_dim,
                ..
            } => {
                let want = TensorDesc::new(cache.dtype, [cache.slots, cache.capacity, kv_heads * head_dim]);
                for id in [cache.k, cache.v] {
                    let held = desc_of(id)?;
                    if held != want {
                        return Err(BackendError::invalid(format!(
                            "node {i}: KV cache buffer {} holds {held}, attention needs {want}",
                            id.0
                        )));
                    }
                    used.push(id);
                }
                if cache.k == cache.v {
                    return Err(BackendError::invalid(format!(
                        "node {i}: keys and values share buffer {}",
                        cache.k.0
                    )));
                }
            }
            _ => {}
        }
    }
    used.sort();
    used.dedup();
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::step::StepShape;
    use crate::{GraphBuilder, KvCacheRef, WeightRef};

    /// A table holding an f32 `[4, 8]` weight, an activation of 8 values and two KV caches,
    /// and a graph over them.
    fn setup() -> (Buffers<TensorDesc>, Graph, [BufferId; 4]) {
        let mut bufs = Buffers::new();
        let w = bufs.insert(TensorDesc::new(DType::F32, [4, 8]));
        let out = bufs.insert(TensorDesc::new(DType::F32, [8]));
        let k = bufs.insert(TensorDesc::new(DType::F32, [1, 4, 4]));
        let v = bufs.insert(TensorDesc::new(DType::F32, [1, 4, 4]));
        let mut g = GraphBuilder::new("t", 2, 0);
        let x = g.push1(Op::Embed {
            table: WeightRef {
                buffer: w,
                desc: TensorDesc::new(DType::F32, [4, 8]),
            },
            scale: 1.0,
            extra: None,
        });
        let qkv = g.push(Op::MatMul {
            x,
            weight: WeightRef {
                buffer: w,
                desc: TensorDesc::new(DType::F32, [4, 8]),
            },
            splits: vec![4],
        });
        let a = g.push1(Op::Attention {
            q: qkv[0],
            k: qkv[0],
            v: qkv[0],
            cache: KvCacheRef {
                k,
                v,
                dtype: DType::F32,
                slots: 1,
                capacity: 4,
            },
            heads: 1,
            kv_heads: 1,
            head_dim: 4,
            scale: 1.0,
            window: None,
            softcap: None,
            bidirectional_from: None,
        });
        g.push(Op::Output { x: a, buffer: out });
        (bufs, g.finish(), [w, out, k, v])
    }

    fn desc_of(bufs: &Buffers<TensorDesc>) -> impl Fn(BufferId) -> Result<TensorDesc, BackendError> + '_ {
        |id| bufs.get(id).cloned()
    }

    #[test]
    fn a_buffer_in_use_is_refused_until_its_program_is_released() {
        let (mut bufs, graph, [w, out, k, v]) = setup();
        let shapes = graph.infer_shapes().unwrap();
        let used = check_buffers(&graph, &shapes, desc_of(&bufs)).unwrap();
        assert_eq!(used, vec![w, out, k, v]);
        assert_eq!(named_buffers(&graph), used);
        let mut programs = Programs::new();
        let p = programs.insert((), used, StepShape::of(&graph));
        let err = bufs.free(k, &programs).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "invalid argument: buffer {} is used by program {}: release it first",
                k.0, p.0
            )
        );
        assert!(bufs.get(k).is_ok(), "a refused free keeps the buffer");
        programs.release(p).unwrap();
        bufs.free(k, &programs).unwrap();
        let err = bufs.free(k, &programs).unwrap_err().to_string();
        assert_eq!(err, format!("invalid argument: unknown buffer {}", k.0));
        assert_eq!(bufs.len(), 3);
    }

    #[test]
    fn buffers_that_do_not_match_the_graph_are_named() {
        let (mut bufs, graph, [w, out, k, _]) = setup();
        let shapes = graph.infer_shapes().unwrap();
        *bufs.get_mut(w).unwrap() = TensorDesc::new(DType::F16, [4, 8]);
        let err = check_buffers(&graph, &shapes, desc_of(&bufs))
            .unwrap_err()
            .to_string();
        assert!(err.contains("node 0: weight buffer 1 holds f16[4, 8]"), "{err}");
        *bufs.get_mut(w).unwrap() = TensorDesc::new(DType::F32, [4, 8]);
        *bufs.get_mut(out).unwrap() = TensorDesc::new(DType::F32, [7]);
        let err = check_buffers(&graph, &shapes, desc_of(&bufs))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("node 3: buffer 2 (f32[7]) cannot hold 8 f32 values"),
            "{err}"
        );
        *bufs.get_mut(out).unwrap() = TensorDesc::new(DType::F32, [8]);
        *bufs.get_mut(k).unwrap() = TensorDesc::new(DType::F16, [1, 4, 4]);
        let err = check_buffers(&graph, &shapes, desc_of(&bufs))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("node 2: KV cache buffer 3 holds f16[1, 4, 4]"),
            "{err}"
        );
        bufs.free(k, &Programs::<()>::new()).unwrap();
        let err = check_buffers(&graph, &shapes, desc_of(&bufs))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown buffer 3"), "{err}");
    }

    #[test]
    fn pairs_are_two_distinct_known_buffers() {
        let (mut bufs, _, [w, out, _, _]) = setup();
        let (a, b) = bufs.pair_mut(w, out).unwrap();
        assert_eq!((a.numel(), b.numel()), (32, 8));
        assert!(bufs
            .pair_mut(w, w)
            .unwrap_err()
            .to_string()
            .contains("named twice"));
        let err = bufs.pair_mut(w, BufferId(99)).unwrap_err().to_string();
        assert!(err.contains("unknown buffer 99"), "{err}");
    }
}
