//! A step graph compiled as one program per segment of its [`SplitPlan`], joined by the graph's
//! own `Output` and `Input` ops, and replayed every step. A value that only crosses to a later
//! program on the same unit is read there from the buffer it was written to. A value that
//! crosses to another unit goes one of two ways:
//! - **device-side** (where the units allow it): the value lives in a host region that the
//!   producer and every consumer imported (`import_host`), so nothing is copied; and a consumer
//!   that imported the producer's timeline is submitted at once, its device waiting for the
//!   producer's ticket (`execute_after`), so the host does not wait either;
//! - **through the host**: after the producer's program finishes, the value is read into host
//!   staging and written to each consumer's input buffer.
//!
//! Everything (buffers, regions, programs, staging) is made at build time, so a step allocates
//! nothing.

use std::collections::HashMap;

use tandem_backend_api::{
    BackendError, BufferId, DType, Graph, GraphBuilder, NodeTime, Op, ProgramId, RowCount, StepArgs,
    TensorDesc, Ticket, TimelineId, Usage, ValueId,
};

use super::plan::{value_bytes, SplitPlan};
use super::shared::HostRegion;
use super::{err, step_err, unit_err, ScheduleError, Unit};

/// How a split's boundaries may pass values, per ordered pair of units.
pub struct Boundaries<'a> {
    /// Whether crossings may use host regions that both ends import.
    pub share_memory: bool,
    /// `timelines[consumer][producer]`: the producer's timeline as the consumer imported it,
    /// where it could (empty: no device waits).
    pub timelines: &'a [Vec<Option<TimelineId>>],
}

impl Boundaries<'_> {
    /// Only through the host.
    pub const HOST: Boundaries<'static> = Boundaries {
        share_memory: false,
        timelines: &[],
    };

    fn timeline(&self, consumer: usize, producer: usize) -> Option<TimelineId> {
        self.timelines.get(consumer)?.get(producer).copied().flatten()
    }
}

struct Copy {
    from: BufferId,
    to: Vec<(usize, BufferId)>,
    bytes: usize,
}

struct Segment {
    unit: usize,
    program: ProgramId,
    copies: Vec<Copy>,
    /// Whether the host waits for this segment before later ones on other units may run (a
    /// copy to make, or a consumer that cannot wait on this unit's timeline).
    host_handoff: bool,
    /// Earlier segments on other units whose tickets this one's device waits for, with the
    /// producer's timeline as this unit imported it.
    device_waits: Vec<(usize, TimelineId)>,
}

/// What a step's boundaries did, for reports: values shared in host memory or copied, and
/// handoffs the devices waited for or the host did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BoundaryCounts {
    /// Crossing values in host regions imported by both ends (no copy).
    pub shared_values: usize,
    /// Crossing values copied through host staging.
    pub copied_values: usize,
    /// Segment handoffs to another unit where the consumer's device waits.
    pub device_waits: usize,
    /// Segments the host waits for before another unit's segment is submitted.
    pub host_waits: usize,
}

/// A step graph compiled as one program per segment, ready to replay.
pub struct Scheduled {
    segments: Vec<Segment>,
    logits: (usize, BufferId),
    activations: Vec<(usize, BufferId)>,
    regions: Vec<HostRegion>,
    staging: Vec<u8>,
    moved: u64,
    /// The ticket of every segment's last submission.
    tickets: Vec<Ticket>,
    /// Scratch for one submission's waits (capacity set at build: no allocation per step).
    waits: Vec<(TimelineId, Ticket)>,
    counts: BoundaryCounts,
    /// Host time spent per unit (by unit index) since the last [`Scheduled::take_times`].
    times: Vec<HostTimes>,
}

/// Where the host's time went for one unit of a split, over some steps: in its backend's
/// `execute` (a CPU unit computes its part there; a GPU unit records and submits), waiting for
/// its work to finish before a hand-over or at the end of a step, and copying the values it
/// produced to other units through the host.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostTimes {
    /// In `execute` (or `execute_after`).
    pub execute: std::time::Duration,
    /// Waiting for its submissions.
    pub wait: std::time::Duration,
    /// Reading its boundary values and writing them to the units that read them.
    pub copy: std::time::Duration,
}

impl HostTimes {
    fn add(&mut self, o: HostTimes) {
        self.execute += o.execute;
        self.wait += o.wait;
        self.copy += o.copy;
    }
}

impl Scheduled {
    /// Splits `graph` (whose final `Output` names [`BufferId::UNBOUND`], the logits, `[selected,
    /// vocab]`) by `assign` (a unit per node), allocates the boundary buffers and the logits, and
    /// compiles every segment on its unit.
    /// Crossings between units use `boundaries` where both ends allow it.
    pub fn build(
        units: &mut [Unit],
        graph: &Graph,
        assign: &[usize],
        vocab: usize,
        boundaries: &Boundaries<'_>,
    ) -> Result<Scheduled, ScheduleError> {
        let shapes = graph.infer_shapes().map_err(err("checking the step graph"))?;
        let plan = SplitPlan::new(graph, assign, &shapes);
        let (rows, selected) = (graph.rows, graph.selected_rows);
        let mut s = Scheduled {
            segments: Vec::new(),
            logits: (0, BufferId::UNBOUND),
            activations: Vec::new(),
            regions: Vec::new(),
            staging: Vec::new(),
            moved: 0,
            tickets: Vec::new(),
            waits: Vec::new(),
            counts: BoundaryCounts::default(),
            times: vec![HostTimes::default(); units.len()],
        };
        let result = s.compile(units, graph, &plan, rows, selected, vocab, boundaries);
        match result {
            Ok(()) => Ok(s),
            Err(e) => {
                s.release(units);
                Err(e)
            }
        }
    }

    fn alloc(
        &mut self,
        units: &mut [Unit],
        u: usize,
        rows: usize,
        cols: usize,
    ) -> Result<BufferId, ScheduleError> {
        let unit = &mut units[u];
        let b = unit
            .backend
            .alloc(&TensorDesc::new(DType::F32, [rows, cols]), Usage::Activation)
            .map_err(unit_err(
                format!("allocating a {rows}x{cols} boundary buffer on {}", unit.name),
                &unit.name,
            ))?;
        self.activations.push((u, b));
        Ok(b)
    }

    /// Imports one host region for a `rows x cols` f32 value into `from` and every unit of
    /// `to`, returning the buffers in that order; `None` (nothing left behind) when a unit
    /// cannot import host memory or the host has none.
    fn share(
        &mut self,
        units: &mut [Unit],
        from: usize,
        to: &[usize],
        rows: usize,
        cols: usize,
    ) -> Option<Vec<BufferId>> {
        let desc = TensorDesc::new(DType::F32, [rows, cols]);
        let region = HostRegion::new(rows * cols * 4)?;
        let mut made: Vec<(usize, BufferId)> = Vec::new();
        for &u in std::iter::once(&from).chain(to) {
            match region.import(units[u].backend.as_mut(), &desc) {
                Ok(b) => made.push((u, b)),
                Err(_) => {
                    let mut freed = true;
                    for (u, b) in made {
                        freed &= units[u].backend.free(b).is_ok();
                    }
                    // A buffer a backend failed to free may still point at the region: leak it.
                    if freed {
                        region.free();
                    }
                    return None;
                }
            }
        }
        self.regions.push(region);
        self.activations.extend(made.iter().copied());
        Some(made.into_iter().map(|(_, b)| b).collect())
    }

    #[allow(clippy::too_many_arguments)]
    fn compile(
        &mut self,
        units: &mut [Unit],
        graph: &Graph,
        plan: &SplitPlan,
        rows: usize,
        selected: usize,
        vocab: usize,
        boundaries: &Boundaries<'_>,
    ) -> Result<(), ScheduleError> {
        // Where each crossing is written, and where each unit reads it; which are shared.
        let mut written: HashMap<ValueId, BufferId> = HashMap::new();
        let mut read: HashMap<(ValueId, usize), BufferId> = HashMap::new();
        let mut shared: Vec<ValueId> = Vec::new();
        for c in &plan.crossings {
            let from = plan.segments[c.from_segment].0;
            let r = if c.shape.rows == RowCount::Step {
                rows
            } else {
                selected
            };
            let targets = plan.copy_targets(c);
            if boundaries.share_memory && !targets.is_empty() {
                if let Some(bufs) = self.share(units, from, &targets, r, c.shape.cols) {
                    written.insert(c.value, bufs[0]);
                    read.insert((c.value, from), bufs[0]);
                    for (&u, &b) in targets.iter().zip(&bufs[1..]) {
                        read.insert((c.value, u), b);
                    }
                    shared.push(c.value);
                    continue;
                }
            }
            let out = self.alloc(units, from, r, c.shape.cols)?;
            written.insert(c.value, out);
            read.insert((c.value, from), out);
            for u in targets {
                let inb = self.alloc(units, u, r, c.shape.cols)?;
                read.insert((c.value, u), inb);
            }
        }
        let n = plan.segments.len();
        for (si, (u, range)) in plan.segments.iter().enumerate() {
            let u = *u;
            let name = if n == 1 {
                graph.name.clone()
            } else {
                format!("{} part {}/{n} on {}", graph.name, si + 1, units[u].name)
            };
            let mut g = GraphBuilder::new(name, rows, selected);
            let mut ids: HashMap<ValueId, ValueId> = HashMap::new();
            for c in plan.crossings.iter().filter(|c| c.to_segments.contains(&si)) {
                let buffer = read[&(c.value, u)];
                let v = g.push1(Op::Input {
                    buffer,
                    cols: c.shape.cols,
                    selected: c.shape.rows == RowCount::Selected,
                });
                ids.insert(c.value, v);
            }
            for node in &graph.nodes[range.clone()] {
                let mut op = node.op.clone();
                for v in op.inputs_mut() {
                    *v = ids.get(v).copied().unwrap_or(*v);
                }
                // Every buffer the step graph names is a planned tensor this unit holds, but the
                // logits' (unbound until here).
                for b in op.buffers_mut() {
                    if *b != BufferId::UNBOUND {
                        *b = units[u].bind(*b, &node.op)?;
                    }
                }
                if let Op::Output { buffer, .. } = &mut op {
                    if *buffer == BufferId::UNBOUND {
                        let logits = self.alloc(units, u, selected, vocab)?;
                        self.logits = (u, logits);
                        *buffer = logits;
                    }
                }
                let outs = g.push(op);
                for (old, new) in node.outputs.iter().zip(outs) {
                    ids.insert(*old, new);
                }
            }
            let mut copies = Vec::new();
            for c in plan.crossings.iter().filter(|c| c.from_segment == si) {
                let buffer = written[&c.value];
                g.push(Op::Output {
                    x: ids[&c.value],
                    buffer,
                });
                let to: Vec<(usize, BufferId)> = plan
                    .copy_targets(c)
                    .into_iter()
                    .map(|t| (t, read[&(c.value, t)]))
                    .collect();
                if !to.is_empty() && !shared.contains(&c.value) {
                    let bytes = value_bytes(c.shape, rows, selected);
                    self.staging.resize(self.staging.len().max(bytes), 0);
                    copies.push(Copy {
                        from: buffer,
                        to,
                        bytes,
                    });
                }
            }
            let unit = &mut units[u];
            let program = unit.backend.compile(&g.finish()).map_err(unit_err(
                format!("compiling the step graph on {}", unit.name),
                &unit.name,
            ))?;
            // The host hands over when a value must be copied, or a consumer on another unit
            // cannot wait on this unit's timeline.
            let host_handoff = !copies.is_empty()
                || plan
                    .crossings
                    .iter()
                    .filter(|c| c.from_segment == si)
                    .flat_map(|c| plan.copy_targets(c))
                    .any(|t| boundaries.timeline(t, u).is_none());
            self.segments.push(Segment {
                unit: u,
                program,
                copies,
                host_handoff,
                device_waits: Vec::new(),
            });
        }
        // Each segment's device waits: the earlier segments on other units it reads from whose
        // handoff is on the device.
        for si in 0..self.segments.len() {
            let u = self.segments[si].unit;
            let mut waits: Vec<(usize, TimelineId)> = Vec::new();
            for c in plan.crossings.iter().filter(|c| c.to_segments.contains(&si)) {
                let p = c.from_segment;
                let pu = self.segments[p].unit;
                if pu == u || self.segments[p].host_handoff || waits.iter().any(|w| w.0 == p) {
                    continue;
                }
                if let Some(t) = boundaries.timeline(u, pu) {
                    waits.push((p, t));
                }
            }
            self.segments[si].device_waits = waits;
        }
        let most_waits = self
            .segments
            .iter()
            .map(|s| s.device_waits.len())
            .max()
            .unwrap_or(0);
        self.waits = Vec::with_capacity(most_waits);
        self.tickets = vec![Ticket(0); self.segments.len()];
        let n = self.segments.len();
        self.counts = BoundaryCounts {
            shared_values: shared.len(),
            copied_values: plan
                .crossings
                .iter()
                .filter(|c| !plan.copy_targets(c).is_empty() && !shared.contains(&c.value))
                .count(),
            device_waits: self.segments.iter().map(|s| s.device_waits.len()).sum(),
            host_waits: self.segments[..n.saturating_sub(1)]
                .iter()
                .filter(|s| s.host_handoff)
                .count(),
        };
        if self.logits.1 == BufferId::UNBOUND {
            return Err(ScheduleError {
                context: "scheduling the step graph".into(),
                error: BackendError::invalid("the graph writes no logits"),
                unit: None,
            });
        }
        Ok(())
    }

    /// Runs one step: every segment in order, each handed over as its boundaries allow, and
    /// waits until all have finished.
    pub fn run(&mut self, units: &mut [Unit], args: &StepArgs<'_>) -> Result<(), ScheduleError> {
        for i in 0..self.segments.len() {
            self.submit(i, units, args)?;
            self.finish(i, units)?;
        }
        self.settle(units)
    }

    /// Submits segment `i`: its device waits for the earlier segments it reads from on other
    /// units whose handoff is on the device; those handed over by the host must be finished
    /// (`finish`).
    pub fn submit(&mut self, i: usize, units: &mut [Unit], args: &StepArgs<'_>) -> Result<(), ScheduleError> {
        let Scheduled {
            segments,
            tickets,
            waits,
            ..
        } = self;
        let seg = &segments[i];
        waits.clear();
        waits.extend(seg.device_waits.iter().map(|&(p, t)| (t, tickets[p])));
        let unit = &mut units[seg.unit];
        let started = std::time::Instant::now();
        let ticket = if waits.is_empty() {
            unit.backend.execute(seg.program, args)
        } else {
            unit.backend.execute_after(seg.program, args, waits)
        }
        .map_err(step_err("running a step on", &unit.name))?;
        self.times[seg.unit].execute += started.elapsed();
        tickets[i] = ticket;
        Ok(())
    }

    /// Hands segment `i`'s results over where the host must: waits for it, then copies what
    /// it computed to the units that read it. Nothing, where the consumers' devices wait.
    pub fn finish(&mut self, i: usize, units: &mut [Unit]) -> Result<(), ScheduleError> {
        let Scheduled {
            segments,
            staging,
            moved,
            tickets,
            times,
            ..
        } = self;
        let seg = &segments[i];
        if !seg.host_handoff {
            return Ok(());
        }
        let unit = &mut units[seg.unit];
        let started = std::time::Instant::now();
        unit.backend
            .wait(tickets[i])
            .map_err(step_err("waiting for a step on", &unit.name))?;
        let waited = std::time::Instant::now();
        times[seg.unit].wait += waited - started;
        for c in &seg.copies {
            let buf = &mut staging[..c.bytes];
            let from = &mut units[seg.unit];
            from.backend
                .read(c.from, 0, buf)
                .map_err(step_err("reading a boundary value from", &from.name))?;
            for &(t, to) in &c.to {
                let unit = &mut units[t];
                unit.backend
                    .write(to, 0, buf)
                    .map_err(step_err("writing a boundary value to", &unit.name))?;
                *moved += c.bytes as u64;
            }
        }
        times[seg.unit].copy += waited.elapsed();
        Ok(())
    }

    /// Waits until every segment of the step has finished (the last submission on each unit):
    /// the next step may then reuse the boundary buffers.
    pub fn settle(&mut self, units: &mut [Unit]) -> Result<(), ScheduleError> {
        let mut seen = 0u128;
        for (seg, &t) in self.segments.iter().zip(&self.tickets).rev() {
            let bit = 1u128 << (seg.unit % 128);
            if seen & bit != 0 {
                continue;
            }
            seen |= bit;
            let unit = &mut units[seg.unit];
            let started = std::time::Instant::now();
            unit.backend
                .wait(t)
                .map_err(step_err("waiting for a step on", &unit.name))?;
            self.times[seg.unit].wait += started.elapsed();
        }
        Ok(())
    }

    /// Adds the host time per unit since the last call to `into` (by unit index), and starts
    /// counting again.
    pub fn take_times(&mut self, into: &mut [HostTimes]) {
        for (t, o) in self.times.iter_mut().zip(into.iter_mut()) {
            o.add(*t);
            *t = HostTimes::default();
        }
    }

    /// What this schedule's boundaries do each step.
    pub fn boundary_counts(&self) -> BoundaryCounts {
        self.counts
    }

    /// Segments (programs) per step.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// Whether the schedule has no program (never, once built).
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Reads the logits of the last step into `out` (`selected * vocab * 4` bytes).
    pub fn read_logits(&self, units: &mut [Unit], out: &mut [u8]) -> Result<(), ScheduleError> {
        let unit = &mut units[self.logits.0];
        unit.backend
            .read(self.logits.1, 0, out)
            .map_err(step_err("reading the logits from", &unit.name))
    }

    /// Bytes the boundary copies have moved through the host since the build.
    pub fn moved_bytes(&self) -> u64 {
        self.moved
    }

    /// The unit whose program wrote the logits.
    pub fn logits_unit(&self) -> usize {
        self.logits.0
    }

    /// Per-node device time of the last step, segment after segment, where the units measure it.
    /// Where the step runs on more than one unit, each op's name starts with its unit's
    /// (`cpu: matmul(q4_k)`), so that a profile's sums by op keep the units apart.
    pub fn profile(&self, units: &mut [Unit]) -> Result<Vec<NodeTime>, ScheduleError> {
        let mut out = Vec::new();
        let several = self.segments.iter().any(|s| s.unit != self.segments[0].unit);
        for seg in &self.segments {
            let unit = &mut units[seg.unit];
            let times = unit.backend.profile(seg.program).map_err(unit_err(
                format!("reading the step's profile on {}", unit.name),
                &unit.name,
            ))?;
            out.extend(times.into_iter().map(|mut t| {
                if several {
                    t.op = format!("{}: {}", unit.name, t.op);
                }
                t
            }));
        }
        Ok(out)
    }

    /// Releases the programs and frees the buffers (errors ignored: used on drop and failure).
    pub fn release(&mut self, units: &mut [Unit]) {
        for seg in self.segments.drain(..) {
            let _ = units[seg.unit].backend.release(seg.program);
        }
        let mut freed = true;
        for (u, b) in self.activations.drain(..) {
            freed &= units[u].backend.free(b).is_ok();
        }
        // Only once every backend has freed its buffers in them; a buffer that failed to free
        // may still point at a region, so then they are leaked (dropping one does not free it).
        for r in self.regions.drain(..) {
            if freed {
                r.free();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::runtime::split::fake::{Fake, Registry};
    use tandem_backend_api::WeightRef;

    const VOCAB: usize = 5;
    const COLS: usize = 3;

    /// embed (unit 0) -> x + x (unit 1) -> that + x, select, output (unit 0): `x` crosses to unit
    /// 1, the sum back to unit 0; the logits are 3 * table[token].
    fn toy(units: &mut [Unit], table: &[f32]) -> Graph {
        let desc = TensorDesc::new(DType::F32, [VOCAB, COLS]);
        let b = units[0].backend.alloc(&desc, Usage::Weight).unwrap();
        units[0].backend.write(b, 0, bytemuck::cast_slice(table)).unwrap();
        units[0].map.insert(BufferId(1), b);
        let w = WeightRef {
            buffer: BufferId(1),
            desc,
        };
        crate::runtime::split::plan::tests::toy_graph("toy", 2, 2, w)
    }

    /// Runs three steps of the toy split with fakes that do (`device_side`) or do not share
    /// memory and timelines, under `mode` (`None`: the host path; `Some(false)`: shared memory
    /// without timelines), checking the logits; returns the counts and the device waits made.
    fn steps(device_side: [bool; 2], mode: Option<bool>) -> (BoundaryCounts, usize) {
        let registry = Arc::new(Mutex::new(Registry::default()));
        let mut units: Vec<Unit> = (0..2)
            .map(|i| Unit {
                name: format!("fake{i}"),
                backend: Box::new(Fake::new(i, &registry, device_side[i])),
                map: HashMap::new(),
            })
            .collect();
        let table: Vec<f32> = (0..VOCAB * COLS).map(|v| v as f32 * 0.5 - 2.0).collect();
        let graph = toy(&mut units, &table);
        // What `SplitScheduler::share_timelines` would find.
        let mut timelines = vec![vec![None; 2]; 2];
        for (c, row) in timelines.iter_mut().enumerate() {
            let p = 1 - c;
            let t = units[p].backend.export_timeline().unwrap();
            row[p] = t.and_then(|t| units[c].backend.import_timeline(&t).unwrap());
        }
        let boundaries = match mode {
            None => Boundaries::HOST,
            Some(true) => Boundaries {
                share_memory: true,
                timelines: &timelines,
            },
            Some(false) => Boundaries {
                share_memory: true,
                timelines: &[],
            },
        };
        let mut s = Scheduled::build(&mut units, &graph, &[0, 1, 0, 0, 0], COLS, &boundaries).unwrap();
        assert_eq!(s.len(), 3);
        for (step, tokens) in [[1u32, 4], [0, 2], [3, 3]].iter().enumerate() {
            let args = StepArgs {
                tokens,
                positions: &[0, 1],
                slots: &[0, 0],
                select: &[1, 0],
            };
            s.run(&mut units, &args).unwrap();
            let mut out = vec![0u8; 2 * COLS * 4];
            s.read_logits(&mut units, &mut out).unwrap();
            let got: Vec<f32> = out
                .chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let want: Vec<f32> = [tokens[1], tokens[0]]
                .iter()
                .flat_map(|&t| {
                    table[t as usize * COLS..(t as usize + 1) * COLS]
                        .iter()
                        .map(|v| 3.0 * v)
                })
                .collect();
            assert_eq!(got, want, "step {step}, {device_side:?}, {mode:?}");
        }
        let counts = s.boundary_counts();
        s.release(&mut units);
        let waits = registry.lock().unwrap().device_waits;
        (counts, waits)
    }

    #[test]
    fn device_boundaries_share_memory_and_wait_for_the_latest_ticket() {
        let (c, waits) = steps([true, true], Some(true));
        assert_eq!(
            c,
            BoundaryCounts {
                shared_values: 2,
                copied_values: 0,
                device_waits: 2,
                host_waits: 0,
            }
        );
        // Both handoffs of each of the three steps waited on the device, for the producer's
        // latest ticket (the fake refuses any other).
        assert_eq!(waits, 6);
    }

    #[test]
    fn without_timelines_memory_is_shared_and_the_host_waits() {
        let (c, waits) = steps([true, true], Some(false));
        assert_eq!(
            (c.shared_values, c.copied_values, c.device_waits, c.host_waits),
            (2, 0, 0, 2)
        );
        assert_eq!(waits, 0);
    }

    #[test]
    fn a_unit_without_device_side_boundaries_falls_back_to_host_copies() {
        for (sides, mode) in [([true, false], Some(true)), ([true, true], None)] {
            let (c, waits) = steps(sides, mode);
            assert_eq!(
                (c.shared_values, c.copied_values, c.device_waits, c.host_waits),
                (0, 2, 0, 2),
                "{sides:?} {mode:?}"
            );
            assert_eq!(waits, 0);
        }
    }
}
