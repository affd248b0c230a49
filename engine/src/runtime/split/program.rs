//! A step graph compiled as one program per segment of its [`SplitPlan`], joined by the graph's
//! own `Output` and `Input` ops, and replayed every step. A value that crosses to another unit is
//! read into host staging and written to that unit's input buffer after its producer's program
//! finishes; a value that only crosses to a later program on the same unit is read there from the
//! buffer it was written to. Everything (buffers, programs, staging) is made at build time, so a
//! step allocates nothing.

use std::collections::HashMap;

use tandem_backend_api::{
    BackendError, BufferId, DType, Graph, GraphBuilder, NodeTime, Op, ProgramId, RowCount, StepArgs,
    TensorDesc, Ticket, Usage, ValueId,
};

use super::plan::{value_bytes, SplitPlan};
use super::{err, step_err, ScheduleError, Unit};

struct Copy {
    from: BufferId,
    to: Vec<(usize, BufferId)>,
    bytes: usize,
}

struct Segment {
    unit: usize,
    program: ProgramId,
    copies: Vec<Copy>,
}

/// A step graph compiled as one program per segment, ready to replay.
pub struct Scheduled {
    segments: Vec<Segment>,
    logits: (usize, BufferId),
    activations: Vec<(usize, BufferId)>,
    staging: Vec<u8>,
    moved: u64,
}

impl Scheduled {
    /// Splits `graph` (whose final `Output` names [`BufferId::UNBOUND`], the logits, `[selected,
    /// vocab]`) by `assign` (a unit per node), allocates the boundary buffers and the logits, and
    /// compiles every segment on its unit.
    pub fn build(
        units: &mut [Unit],
        graph: &Graph,
        assign: &[usize],
        vocab: usize,
    ) -> Result<Scheduled, ScheduleError> {
        let shapes = graph.infer_shapes().map_err(err("checking the step graph"))?;
        let plan = SplitPlan::new(graph, assign, &shapes);
        let (rows, selected) = (graph.rows, graph.selected_rows);
        let mut s = Scheduled {
            segments: Vec::new(),
            logits: (0, BufferId::UNBOUND),
            activations: Vec::new(),
            staging: Vec::new(),
            moved: 0,
        };
        let result = s.compile(units, graph, &plan, rows, selected, vocab);
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
            .map_err(err(format!(
                "allocating a {rows}x{cols} boundary buffer on {}",
                unit.name
            )))?;
        self.activations.push((u, b));
        Ok(b)
    }

    fn compile(
        &mut self,
        units: &mut [Unit],
        graph: &Graph,
        plan: &SplitPlan,
        rows: usize,
        selected: usize,
        vocab: usize,
    ) -> Result<(), ScheduleError> {
        // Where each crossing is written, and where each unit reads it.
        let mut written: HashMap<ValueId, BufferId> = HashMap::new();
        let mut read: HashMap<(ValueId, usize), BufferId> = HashMap::new();
        for c in &plan.crossings {
            let from = plan.segments[c.from_segment].0;
            let r = if c.shape.rows == RowCount::Step {
                rows
            } else {
                selected
            };
            let out = self.alloc(units, from, r, c.shape.cols)?;
            written.insert(c.value, out);
            read.insert((c.value, from), out);
            for u in plan.copy_targets(c) {
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
                if !to.is_empty() {
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
            let program = unit
                .backend
                .compile(&g.finish())
                .map_err(err(format!("compiling the step graph on {}", unit.name)))?;
            self.segments.push(Segment {
                unit: u,
                program,
                copies,
            });
        }
        if self.logits.1 == BufferId::UNBOUND {
            return Err(ScheduleError {
                context: "scheduling the step graph".into(),
                error: BackendError::invalid("the graph writes no logits"),
            });
        }
        Ok(())
    }

    /// Runs one step: every segment in order, each boundary copy after its producer.
    pub fn run(&mut self, units: &mut [Unit], args: &StepArgs<'_>) -> Result<(), ScheduleError> {
        for i in 0..self.segments.len() {
            let ticket = self.submit(i, units, args)?;
            self.finish(i, ticket, units)?;
        }
        Ok(())
    }

    /// Submits segment `i` (its inputs must be in place: segment `i - 1` finished).
    pub fn submit(&self, i: usize, units: &mut [Unit], args: &StepArgs<'_>) -> Result<Ticket, ScheduleError> {
        let seg = &self.segments[i];
        let unit = &mut units[seg.unit];
        unit.backend
            .execute(seg.program, args)
            .map_err(step_err("running a step on", &unit.name))
    }

    /// Waits for segment `i`'s execution `ticket`, then copies what it computed to the units that
    /// read it.
    pub fn finish(&mut self, i: usize, ticket: Ticket, units: &mut [Unit]) -> Result<(), ScheduleError> {
        let Scheduled {
            segments,
            staging,
            moved,
            ..
        } = self;
        let seg = &segments[i];
        let unit = &mut units[seg.unit];
        unit.backend
            .wait(ticket)
            .map_err(step_err("waiting for a step on", &unit.name))?;
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
        Ok(())
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
    pub fn profile(&self, units: &mut [Unit]) -> Result<Vec<NodeTime>, ScheduleError> {
        let mut out = Vec::new();
        for seg in &self.segments {
            let unit = &mut units[seg.unit];
            out.extend(
                unit.backend
                    .profile(seg.program)
                    .map_err(err(format!("reading the step's profile on {}", unit.name)))?,
            );
        }
        Ok(out)
    }

    /// Releases the programs and frees the buffers (errors ignored: used on drop and failure).
    pub fn release(&mut self, units: &mut [Unit]) {
        for seg in self.segments.drain(..) {
            let _ = units[seg.unit].backend.release(seg.program);
        }
        for (u, b) in self.activations.drain(..) {
            let _ = units[u].backend.free(b);
        }
    }
}
