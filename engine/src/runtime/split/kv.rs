//! The KV hand-off: when prefill and decode run a layer's attention on different units, each
//! slot's cached keys and values of that layer are copied to the other unit once, before the first
//! step of the other phase that touches the slot.

use tandem_backend_api::{BufferId, Graph, Op};

use super::{step_err, Phase, ScheduleError, Unit};

/// One attention node's KV cache, as `backend-api` lays it out: `[slots, capacity, row]`.
struct KvLayer {
    /// Keys, then values (planned ids).
    buffers: [BufferId; 2],
    /// Sequences it holds.
    slots: usize,
    /// Positions kept per slot.
    capacity: usize,
    /// Bytes of one cached row (one token's keys, or its values).
    row: usize,
}

/// Where each layer's KV cache of each slot is up to date.
pub(super) struct KvHandoff {
    /// Per attention node of the step graph (a layer), its cache.
    layers: Vec<KvLayer>,
    /// Per phase (prefill, decode), per layer: the unit running its attention.
    unit: [Vec<usize>; 2],
    /// Per layer, per slot: the unit holding its current rows.
    home: Vec<Vec<usize>>,
    /// Host staging for one slot of one layer's keys or values.
    staging: Vec<u8>,
    /// Bytes handed over so far.
    pub moved: u64,
}

impl KvHandoff {
    /// A hand-off for the caches of `graph`'s attention nodes (the step graph a placement was
    /// made on: the model's caches are those its attention nodes name), whose attention runs on
    /// `unit[phase][layer]`; `None` when both phases run every layer's attention on the same
    /// unit (nothing to hand over).
    pub fn new(graph: &Graph, unit: [Vec<usize>; 2]) -> Option<KvHandoff> {
        if unit[0] == unit[1] {
            return None;
        }
        let layers: Vec<KvLayer> = graph
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::Attention {
                    cache,
                    kv_heads,
                    head_dim,
                    ..
                } => Some(KvLayer {
                    buffers: [cache.k, cache.v],
                    slots: cache.slots,
                    capacity: cache.capacity,
                    row: kv_heads * head_dim * cache.dtype.block_bytes(),
                }),
                _ => None,
            })
            .collect();
        let most = layers.iter().map(|l| l.capacity * l.row).max().unwrap_or(0);
        Some(KvHandoff {
            home: unit[0]
                .iter()
                .zip(&layers)
                .map(|(&u, l)| vec![u; l.slots])
                .collect(),
            layers,
            unit,
            staging: vec![0; most],
            moved: 0,
        })
    }

    /// Before a step of `phase` on `slots` (whose sequences hold `lengths[slot]` tokens): hands
    /// each layer's cached rows of every slot that last ran on another unit over to the unit this
    /// phase runs that layer's attention on.
    pub fn hand_over(
        &mut self,
        phase: Phase,
        units: &mut [Unit],
        slots: &[u32],
        lengths: &[usize],
    ) -> Result<(), ScheduleError> {
        for (l, layer) in self.layers.iter().enumerate() {
            let row = layer.row;
            let target = self.unit[phase.index()][l];
            for &s in slots {
                let s = s as usize;
                let home = self.home[l][s];
                if home == target {
                    continue;
                }
                self.home[l][s] = target;
                let len = lengths.get(s).copied().unwrap_or(0).min(layer.capacity);
                if len == 0 {
                    continue;
                }
                let offset = (s * layer.capacity * row) as u64;
                let buf = &mut self.staging[..len * row];
                for planned in layer.buffers {
                    let (from, to) = (&units[home], &units[target]);
                    let (src, dst) = (from.map.get(&planned).copied(), to.map.get(&planned).copied());
                    let (Some(src), Some(dst)) = (src, dst) else {
                        return Err(ScheduleError {
                            context: format!(
                                "handing layer {l}'s KV cache from {} to {}",
                                from.name, to.name
                            ),
                            error: tandem_backend_api::BackendError::invalid(
                                "the cache is not held on both units",
                            ),
                            unit: None,
                        });
                    };
                    let from = &mut units[home];
                    from.backend
                        .read(src, offset, buf)
                        .map_err(step_err("reading a KV cache to hand over from", &from.name))?;
                    let to = &mut units[target];
                    to.backend
                        .write(dst, offset, buf)
                        .map_err(step_err("writing a handed-over KV cache to", &to.name))?;
                    self.moved += buf.len() as u64;
                }
            }
        }
        Ok(())
    }
}
