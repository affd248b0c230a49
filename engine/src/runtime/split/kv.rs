//! The KV hand-off: when prefill and decode run a layer's attention on different units, each
//! slot's cached keys and values of that layer are copied to the other unit once, before the first
//! step of the other phase that touches the slot.

use super::{step_err, Phase, ScheduleError, Unit};
use crate::model::Gemma3Model;

/// Where each layer's KV cache of each slot is up to date.
pub(super) struct KvHandoff {
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
    /// A hand-off for `model`, whose layers' attention runs on `unit[phase][layer]`; `None` when
    /// both phases run every layer's attention on the same unit (nothing to hand over).
    pub fn new(model: &Gemma3Model, unit: [Vec<usize>; 2]) -> Option<KvHandoff> {
        if unit[0] == unit[1] {
            return None;
        }
        let row = model.kv_row_bytes();
        let most = model
            .layers
            .iter()
            .map(|l| l.cache.capacity * row)
            .max()
            .unwrap_or(0);
        let slots = model.cache_shape.slots;
        Some(KvHandoff {
            home: unit[0].iter().map(|&u| vec![u; slots]).collect(),
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
        model: &Gemma3Model,
        units: &mut [Unit],
        slots: &[u32],
        lengths: &[usize],
    ) -> Result<(), ScheduleError> {
        let row = model.kv_row_bytes();
        for (l, layer) in model.layers.iter().enumerate() {
            let target = self.unit[phase.index()][l];
            for &s in slots {
                let s = s as usize;
                let home = self.home[l][s];
                if home == target {
                    continue;
                }
                self.home[l][s] = target;
                let len = lengths.get(s).copied().unwrap_or(0).min(layer.cache.capacity);
                if len == 0 {
                    continue;
                }
                let offset = (s * layer.cache.capacity * row) as u64;
                let buf = &mut self.staging[..len * row];
                for planned in [layer.cache.k, layer.cache.v] {
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
