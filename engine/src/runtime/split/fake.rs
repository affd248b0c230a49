//! A host-memory backend for the scheduler's tests: the few ops of a toy step graph (`embed`,
//! `add`, `select_rows`, `input`, `output`) run synchronously in `execute`, imported host
//! memory, and timelines that other fakes of the same [`Registry`] import. `execute_after`
//! refuses a wait for anything but the producer's latest ticket: a scheduler that waits for a
//! stale or future ticket fails the test.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tandem_backend_api::{
    BackendError, BackendInfo, BufferId, ComputeBackend, DeviceKind, Graph, Op, ProgramId, SharedTimeline,
    StepArgs, Support, TensorDesc, Ticket, TimelineId, Usage, ValueShape,
};

/// What the fakes of one test share: each one's latest ticket, and the waits they were given.
#[derive(Default)]
pub struct Registry {
    /// Latest ticket per fake.
    pub latest: Vec<u64>,
    /// Waits passed to `execute_after`, all fakes together.
    pub device_waits: usize,
}

enum Storage {
    Owned(Vec<u8>),
    /// Imported host memory: address and length.
    Imported(usize, usize),
}

/// The fake backend.
pub struct Fake {
    id: usize,
    registry: Arc<Mutex<Registry>>,
    /// Whether it imports host memory and shares timelines.
    pub device_side: bool,
    /// The kind of device its info says (the CPU unless set).
    pub kind: DeviceKind,
    buffers: HashMap<u64, Storage>,
    programs: HashMap<u64, (Graph, Vec<ValueShape>)>,
    next: u64,
    ticket: u64,
}

impl Fake {
    /// Fake number `id` (its index in the registry).
    pub fn new(id: usize, registry: &Arc<Mutex<Registry>>, device_side: bool) -> Fake {
        let mut r = registry.lock().unwrap();
        if r.latest.len() <= id {
            r.latest.resize(id + 1, 0);
        }
        Fake {
            id,
            registry: registry.clone(),
            device_side,
            kind: DeviceKind::Cpu,
            buffers: HashMap::new(),
            programs: HashMap::new(),
            next: 1,
            ticket: 0,
        }
    }

    fn bytes(&mut self, b: BufferId) -> Result<&mut [u8], BackendError> {
        match self.buffers.get_mut(&b.0) {
            Some(Storage::Owned(v)) => Ok(v),
            // SAFETY: `import_host`'s contract keeps the region valid and otherwise untouched
            // while the buffer exists; the fake is used by one thread.
            Some(Storage::Imported(p, n)) => Ok(unsafe { std::slice::from_raw_parts_mut(*p as *mut u8, *n) }),
            None => Err(BackendError::invalid(format!("no buffer {}", b.0))),
        }
    }

    fn f32s(&mut self, b: BufferId) -> Result<Vec<f32>, BackendError> {
        Ok(self
            .bytes(b)?
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

impl ComputeBackend for Fake {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: format!("fake{}", self.id),
            device: "host".into(),
            kind: self.kind,
            memory_bytes: None,
            features: vec![],
            physical_device: None,
            decode_rows: None,
        }
    }
    fn supports(&self, _: &Op) -> Support {
        Support::Yes
    }
    fn alloc(&mut self, desc: &TensorDesc, _: Usage) -> Result<BufferId, BackendError> {
        self.next += 1;
        self.buffers
            .insert(self.next, Storage::Owned(vec![0; desc.byte_size()? as usize]));
        Ok(BufferId(self.next))
    }
    unsafe fn import_host(
        &mut self,
        ptr: *mut u8,
        len: usize,
        _: &TensorDesc,
    ) -> Result<BufferId, BackendError> {
        if !self.device_side {
            return Err(BackendError::unsupported("import_host", "this fake copies"));
        }
        self.next += 1;
        self.buffers
            .insert(self.next, Storage::Imported(ptr as usize, len));
        Ok(BufferId(self.next))
    }
    fn write(&mut self, b: BufferId, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        let o = offset as usize;
        self.bytes(b)?[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn read(&mut self, b: BufferId, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        let o = offset as usize;
        out.copy_from_slice(&self.bytes(b)?[o..o + out.len()]);
        Ok(())
    }
    fn free(&mut self, b: BufferId) -> Result<(), BackendError> {
        self.buffers
            .remove(&b.0)
            .map(|_| ())
            .ok_or_else(|| BackendError::invalid("freed twice"))
    }
    fn compile(&mut self, graph: &Graph) -> Result<ProgramId, BackendError> {
        let shapes = graph.infer_shapes()?;
        self.next += 1;
        self.programs.insert(self.next, (graph.clone(), shapes));
        Ok(ProgramId(self.next))
    }
    fn execute(&mut self, program: ProgramId, args: &StepArgs<'_>) -> Result<Ticket, BackendError> {
        let (graph, shapes) = self
            .programs
            .get(&program.0)
            .cloned()
            .ok_or_else(|| BackendError::invalid("no program"))?;
        let mut values: Vec<Vec<f32>> = vec![Vec::new(); shapes.len()];
        for node in &graph.nodes {
            let out = match &node.op {
                Op::Embed { table, scale, .. } => {
                    let t = self.f32s(table.buffer)?;
                    let cols = table.desc.shape[1];
                    args.tokens
                        .iter()
                        .flat_map(|&tok| {
                            t[tok as usize * cols..(tok as usize + 1) * cols]
                                .iter()
                                .map(|v| v * scale)
                        })
                        .collect()
                }
                Op::Input {
                    buffer,
                    cols,
                    selected,
                } => {
                    let rows = if *selected {
                        graph.selected_rows
                    } else {
                        graph.rows
                    };
                    self.f32s(*buffer)?[..rows * cols].to_vec()
                }
                Op::Add { a, b } => values[a.0 as usize]
                    .iter()
                    .zip(&values[b.0 as usize])
                    .map(|(x, y)| x + y)
                    .collect(),
                Op::SelectRows { x } => {
                    let cols = shapes[x.0 as usize].cols;
                    let v = &values[x.0 as usize];
                    args.select
                        .iter()
                        .flat_map(|&r| v[r as usize * cols..(r as usize + 1) * cols].to_vec())
                        .collect()
                }
                Op::Output { x, buffer } => {
                    let bytes: Vec<u8> = values[x.0 as usize]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect();
                    self.bytes(*buffer)?[..bytes.len()].copy_from_slice(&bytes);
                    continue;
                }
                op => return Err(BackendError::unsupported(op.name(), "not in the fake")),
            };
            values[node.outputs[0].0 as usize] = out;
        }
        self.ticket += 1;
        self.registry.lock().unwrap().latest[self.id] = self.ticket;
        Ok(Ticket(self.ticket))
    }
    fn export_timeline(&mut self) -> Result<Option<SharedTimeline>, BackendError> {
        Ok(self.device_side.then(|| SharedTimeline {
            fd: -1,
            kind: "fake".into(),
            device: self.id.to_string(),
        }))
    }
    fn import_timeline(&mut self, t: &SharedTimeline) -> Result<Option<TimelineId>, BackendError> {
        if !self.device_side || t.kind != "fake" {
            return Ok(None);
        }
        Ok(t.device.parse().ok().map(TimelineId))
    }
    fn execute_after(
        &mut self,
        program: ProgramId,
        args: &StepArgs<'_>,
        waits: &[(TimelineId, Ticket)],
    ) -> Result<Ticket, BackendError> {
        {
            let mut r = self.registry.lock().unwrap();
            for (t, k) in waits {
                let latest = r.latest[t.0 as usize];
                if k.0 != latest {
                    return Err(BackendError::invalid(format!(
                        "waited for ticket {} of fake{} whose latest is {latest}",
                        k.0, t.0
                    )));
                }
            }
            r.device_waits += waits.len();
        }
        self.execute(program, args)
    }
    fn wait(&mut self, t: Ticket) -> Result<(), BackendError> {
        if t.0 > self.ticket {
            return Err(BackendError::invalid("waited for a ticket never issued"));
        }
        Ok(())
    }
    fn release(&mut self, p: ProgramId) -> Result<(), BackendError> {
        self.programs
            .remove(&p.0)
            .map(|_| ())
            .ok_or_else(|| BackendError::invalid("released twice"))
    }
}
