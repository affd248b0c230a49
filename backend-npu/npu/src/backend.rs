//! The NPU backend: `ComputeBackend` over an [`Executor`]. It runs the attention op (and the
//! `Input`/`Output` nodes of the programs the scheduler gives it); every other op is refused by
//! `supports`, so the placement sends it to the next backend of its list.
//!
//! Activations live in host memory (on a Ryzen AI laptop the NPU reads the same DRAM). KV
//! caches live in the executor, in bf16, the kernels' type: a cache buffer is read and written
//! by the host in the dtype the graph declares (f32 or f16) and converted on the way, so a
//! cache handed to another backend loses the bits bf16 lacks, which the kernels never saw.
//!
//! Memory: both live in the host's DRAM, so the device figure is the host's `MemTotal`; the
//! option `memory_limit` lowers the budget (`info().memory_bytes`), and `alloc` refuses a buffer
//! that would take the bytes held (host buffers, caches, the executor's staging) past it.

use std::marker::PhantomData;

use half::f16;
use tandem_backend_api::kit::{
    host_memory_bytes, named_buffers, Buffers, Compiled, Programs, StepShape, Tickets,
};
use tandem_backend_api::{
    BackendError, BackendInfo, BackendOptions, BufferId, ComputeBackend, DType, DeviceKind, Graph, MemoryUse,
    NodeTime, Op, ProgramId, RowCount, StepArgs, Support, TensorDesc, Ticket, Usage, MEMORY_LIMIT,
};

use crate::contract::{bf16_round, bf16_to_f32, kernel_shape, AttnParams, KernelShape};
use crate::executor::{span, Executor, KvId};

/// What distinguishes `npu` from `npu-emu`: the name and how the executor is made.
pub trait Flavor: Send + 'static {
    /// The backend's name.
    const NAME: &'static str;
    /// The executor for these options, or why there is none here.
    fn executor(options: &BackendOptions) -> Result<Box<dyn Executor>, BackendError>;
}

enum Buffer {
    Host { bytes: Vec<u8> },
    Kv { desc: TensorDesc, kv: KvId },
}

struct Program {
    graph: Graph,
    shapes: Vec<KernelShape>,
    last: Vec<NodeTime>,
}

/// The NPU backend of flavour `F`.
pub struct NpuBackend<F: Flavor> {
    exec: Box<dyn Executor>,
    buffers: Buffers<Buffer>,
    programs: Programs<Program>,
    tickets: Tickets,
    peak: u64,
    /// The most bytes the backend may hold: the host's memory or the smaller `memory_limit`;
    /// `None` where the host's memory is unknown and no limit was set.
    memory_budget: Option<u64>,
    flavor: PhantomData<F>,
}

impl<F: Flavor> NpuBackend<F> {
    /// A backend over `exec`, with no memory budget.
    pub fn with_executor(exec: Box<dyn Executor>) -> Self {
        NpuBackend {
            exec,
            buffers: Buffers::new(),
            programs: Programs::new(),
            tickets: Tickets::new(),
            peak: 0,
            memory_budget: None,
            flavor: PhantomData,
        }
    }

    /// A backend over `exec` whose budget is the host's memory, or the smaller `memory_limit`
    /// of `options` (an error when it is larger; only the limit where the host's memory cannot
    /// be read).
    pub fn with_budget(exec: Box<dyn Executor>, options: &BackendOptions) -> Result<Self, BackendError> {
        let memory_budget = match host_memory_bytes() {
            Some(total) => Some(options.memory_budget(total)?),
            None => options.bytes(MEMORY_LIMIT)?,
        };
        Ok(NpuBackend {
            memory_budget,
            ..NpuBackend::with_executor(exec)
        })
    }

    fn host_bytes(&self) -> u64 {
        self.buffers
            .iter()
            .map(|(_, b)| match b {
                Buffer::Host { bytes, .. } => bytes.len() as u64,
                Buffer::Kv { .. } => 0,
            })
            .sum::<u64>()
            + self.exec.bytes_in_use()
    }

    fn buffer(&self, id: BufferId) -> Result<&Buffer, BackendError> {
        self.buffers.get(id)
    }

    /// Checks one node at compile time: the op is one this backend runs, its buffers exist
    /// and have the sizes the op implies.
    fn check_node(&self, graph: &Graph, op: &Op, cols: usize) -> Result<Option<KernelShape>, BackendError> {
        let rows = |selected: bool| if selected { graph.selected_rows } else { graph.rows };
        match op {
            Op::Input { buffer, selected, .. } => {
                self.check_activation(*buffer, rows(*selected) * cols * 4)?;
                Ok(None)
            }
            Op::Output { buffer, .. } => {
                // For an output, `cols` is the bytes the written value takes.
                self.check_activation(*buffer, cols)?;
                Ok(None)
            }
            Op::Attention {
                cache,
                kv_heads,
                head_dim,
                ..
            } => {
                let shape = kernel_shape(op).map_err(|reason| BackendError::Unsupported {
                    op: op.name(),
                    reason,
                })?;
                self.exec
                    .supports(shape)
                    .map_err(|reason| BackendError::Unsupported {
                        op: op.name(),
                        reason,
                    })?;
                let want = [cache.slots, cache.capacity, kv_heads * head_dim];
                for b in [cache.k, cache.v] {
                    match self.buffer(b)? {
                        Buffer::Kv { desc, .. }
                            if desc.dtype == cache.dtype
                                && desc.numel() == want.iter().product::<usize>() => {}
                        _ => {
                            return Err(BackendError::invalid(format!(
                                "attention cache buffer {} is not a {} KV cache of {want:?}",
                                b.0, cache.dtype
                            )))
                        }
                    }
                }
                Ok(Some(shape))
            }
            other => Err(BackendError::Unsupported {
                op: other.name(),
                reason: kernel_shape(other).err().unwrap_or_default(),
            }),
        }
    }

    fn check_activation(&self, id: BufferId, bytes: usize) -> Result<(), BackendError> {
        match self.buffer(id)? {
            Buffer::Host { bytes: b, .. } if b.len() >= bytes => Ok(()),
            Buffer::Host { bytes: b, .. } => Err(BackendError::invalid(format!(
                "buffer {} holds {} bytes, the graph needs {bytes}",
                id.0,
                b.len()
            ))),
            Buffer::Kv { .. } => Err(BackendError::invalid(format!(
                "buffer {} is a KV cache, not an activation",
                id.0
            ))),
        }
    }

    fn run(&mut self, prog: &mut Program, args: &StepArgs<'_>) -> Result<(), BackendError> {
        let g = &prog.graph;
        let mut values: Vec<Vec<f32>> = vec![Vec::new(); g.value_count()];
        let mut times = Vec::with_capacity(g.nodes.len());
        let mut shapes = prog.shapes.iter();
        for (i, node) in g.nodes.iter().enumerate() {
            let mut seconds = 0.0;
            match &node.op {
                Op::Input {
                    buffer,
                    cols,
                    selected,
                } => {
                    let n = if *selected { g.selected_rows } else { g.rows } * cols;
                    let Buffer::Host { bytes, .. } = self.buffer(*buffer)? else {
                        return Err(BackendError::internal("input buffer changed kind"));
                    };
                    values[node.outputs[0].0 as usize] = bytes[..n * 4]
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                }
                Op::Output { x, buffer } => {
                    let data: Vec<u8> = values[x.0 as usize]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect();
                    match self.buffers.get_mut(*buffer) {
                        Ok(Buffer::Host { bytes, .. }) if bytes.len() >= data.len() => {
                            bytes[..data.len()].copy_from_slice(&data)
                        }
                        _ => return Err(BackendError::internal("output buffer changed")),
                    }
                }
                Op::Attention {
                    q,
                    k,
                    v,
                    cache,
                    heads,
                    kv_heads,
                    head_dim,
                    scale,
                    window,
                    ..
                } => {
                    let shape = *shapes
                        .next()
                        .ok_or_else(|| BackendError::internal("attention node without a kernel shape"))?;
                    let (kid, vid) = (self.kv_of(cache.k)?, self.kv_of(cache.v)?);
                    let row = kv_heads * head_dim;
                    // The host stores the step's keys and values (the kernel reads them from the
                    // cache with the rest).
                    for (src, dst) in [(*k, kid), (*v, vid)] {
                        let vals = &values[src.0 as usize];
                        for r in 0..g.rows {
                            let at = (args.slots[r] as usize * cache.capacity
                                + args.positions[r] as usize % cache.capacity)
                                * row;
                            let bf: Vec<u16> = vals[r * row..(r + 1) * row]
                                .iter()
                                .map(|x| bf16_round(*x))
                                .collect();
                            self.exec.write_kv(dst, at, &bf)?;
                        }
                    }
                    let params = AttnParams {
                        rows: g.rows,
                        heads: *heads,
                        kv_heads: *kv_heads,
                        head_dim: *head_dim,
                        capacity: cache.capacity,
                        window: *window,
                        scale: *scale,
                        slots: cache.slots,
                        positions: args.positions.to_vec(),
                        row_slots: args.slots.to_vec(),
                    };
                    let qb: Vec<u16> = values[q.0 as usize].iter().map(|x| bf16_round(*x)).collect();
                    let mut out = vec![0u16; qb.len()];
                    let t = self.exec.attention(shape, &params, &qb, kid, vid, &mut out)?;
                    seconds = t.seconds;
                    values[node.outputs[0].0 as usize] = out.into_iter().map(bf16_to_f32).collect();
                }
                other => {
                    return Err(BackendError::Unsupported {
                        op: other.name(),
                        reason: "compiled into an NPU program by mistake".into(),
                    })
                }
            }
            times.push(NodeTime {
                node: i,
                op: node.op.name(),
                seconds,
            });
        }
        prog.last = times;
        Ok(())
    }

    fn kv_of(&self, id: BufferId) -> Result<KvId, BackendError> {
        match self.buffer(id)? {
            Buffer::Kv { kv, .. } => Ok(*kv),
            Buffer::Host { .. } => Err(BackendError::invalid(format!(
                "buffer {} is not a KV cache",
                id.0
            ))),
        }
    }
}

/// Element size of a KV cache's declared dtype.
fn kv_elem(dtype: DType) -> Result<usize, BackendError> {
    match dtype {
        DType::F32 => Ok(4),
        DType::F16 => Ok(2),
        other => Err(BackendError::invalid(format!(
            "KV cache dtype {other}: the NPU keeps f32 or f16 caches"
        ))),
    }
}

impl<F: Flavor> ComputeBackend for NpuBackend<F> {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: F::NAME.to_string(),
            device: self.exec.device(),
            kind: DeviceKind::Npu,
            memory_bytes: self.memory_budget,
            features: self.exec.features(),
        }
    }

    fn supports(&self, op: &Op) -> Support {
        match op {
            Op::Input { .. } | Op::Output { .. } => Support::Yes,
            _ => match kernel_shape(op).and_then(|s| self.exec.supports(s)) {
                Ok(()) => Support::Yes,
                Err(reason) => Support::No { reason },
            },
        }
    }

    fn alloc(&mut self, desc: &TensorDesc, usage: Usage) -> Result<BufferId, BackendError> {
        let bytes = desc.byte_size()?;
        if let Some(budget) = self.memory_budget {
            // What the buffer will hold: a cache keeps bf16 elements whatever its dtype.
            let held = match usage {
                Usage::KvCache => (desc.numel() as u64).saturating_mul(2),
                Usage::Activation | Usage::Weight => bytes,
            };
            let available = budget.saturating_sub(self.host_bytes());
            if held > available {
                return Err(BackendError::OutOfMemory {
                    requested: held,
                    available,
                });
            }
        }
        let buffer = match usage {
            Usage::KvCache => {
                kv_elem(desc.dtype)?;
                let kv = self.exec.alloc_kv(desc.numel())?;
                Buffer::Kv {
                    desc: desc.clone(),
                    kv,
                }
            }
            Usage::Activation | Usage::Weight => {
                let len = usize::try_from(bytes)
                    .map_err(|_| BackendError::invalid(format!("{desc} is too large")))?;
                Buffer::Host { bytes: vec![0; len] }
            }
        };
        let id = self.buffers.insert(buffer);
        self.peak = self.peak.max(self.host_bytes());
        Ok(id)
    }

    fn write(&mut self, buffer: BufferId, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        let offset = usize::try_from(offset).map_err(|_| BackendError::invalid("offset out of range"))?;
        match self.buffer(buffer)? {
            Buffer::Host { .. } => {
                let Ok(Buffer::Host { bytes, .. }) = self.buffers.get_mut(buffer) else {
                    return Err(BackendError::internal("buffer vanished"));
                };
                let r = span(offset, data.len(), bytes.len())?;
                bytes[r].copy_from_slice(data);
                Ok(())
            }
            Buffer::Kv { desc, kv } => {
                let (kv, size) = (*kv, kv_elem(desc.dtype)?);
                if !offset.is_multiple_of(size) || !data.len().is_multiple_of(size) {
                    return Err(BackendError::invalid(format!(
                        "KV cache write of {} bytes at {offset}: not whole {} elements",
                        data.len(),
                        desc.dtype
                    )));
                }
                let vals: Vec<u16> = if size == 4 {
                    data.chunks_exact(4)
                        .map(|c| bf16_round(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                        .collect()
                } else {
                    data.chunks_exact(2)
                        .map(|c| bf16_round(f16::from_le_bytes([c[0], c[1]]).to_f32()))
                        .collect()
                };
                self.exec.write_kv(kv, offset / size, &vals)
            }
        }
    }

    fn read(&mut self, buffer: BufferId, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        let offset = usize::try_from(offset).map_err(|_| BackendError::invalid("offset out of range"))?;
        match self.buffer(buffer)? {
            Buffer::Host { bytes, .. } => {
                let r = span(offset, out.len(), bytes.len())?;
                out.copy_from_slice(&bytes[r]);
                Ok(())
            }
            Buffer::Kv { desc, kv } => {
                let (kv, size) = (*kv, kv_elem(desc.dtype)?);
                if !offset.is_multiple_of(size) || !out.len().is_multiple_of(size) {
                    return Err(BackendError::invalid(format!(
                        "KV cache read of {} bytes at {offset}: not whole {} elements",
                        out.len(),
                        desc.dtype
                    )));
                }
                let mut vals = vec![0u16; out.len() / size];
                self.exec.read_kv(kv, offset / size, &mut vals)?;
                for (o, v) in out.chunks_exact_mut(size).zip(vals) {
                    let x = bf16_to_f32(v);
                    if size == 4 {
                        o.copy_from_slice(&x.to_le_bytes());
                    } else {
                        o.copy_from_slice(&f16::from_f32(x).to_le_bytes());
                    }
                }
                Ok(())
            }
        }
    }

    fn free(&mut self, buffer: BufferId) -> Result<(), BackendError> {
        match self.buffers.free(buffer, &self.programs)? {
            Buffer::Kv { kv, .. } => self.exec.free_kv(kv),
            Buffer::Host { .. } => Ok(()),
        }
    }

    fn compile(&mut self, graph: &Graph) -> Result<ProgramId, BackendError> {
        let value_shapes = graph.infer_shapes()?;
        let mut shapes = Vec::new();
        for node in &graph.nodes {
            let cols = match &node.op {
                Op::Input { cols, .. } => *cols,
                Op::Output { x, .. } => {
                    let s = value_shapes[x.0 as usize];
                    let rows = match s.rows {
                        RowCount::Step => graph.rows,
                        RowCount::Selected => graph.selected_rows,
                    };
                    rows * s.cols * 4
                }
                _ => 0,
            };
            if let Some(shape) = self.check_node(graph, &node.op, cols)? {
                shapes.push(shape);
            }
        }
        let program = Program {
            graph: graph.clone(),
            shapes,
            last: Vec::new(),
        };
        Ok(self
            .programs
            .insert(program, named_buffers(graph), StepShape::of(graph)))
    }

    fn execute(&mut self, program: ProgramId, args: &StepArgs<'_>) -> Result<Ticket, BackendError> {
        let mut prog: Compiled<Program> = self.programs.take(program)?;
        let result = prog
            .step()
            .check(args)
            .and_then(|()| self.run(&mut prog.program, args));
        self.programs.put_back(prog);
        result?;
        Ok(self.tickets.issue())
    }

    fn wait(&mut self, ticket: Ticket) -> Result<(), BackendError> {
        // Dispatches are waited for inside `execute`.
        self.tickets.check(ticket)
    }

    fn release(&mut self, program: ProgramId) -> Result<(), BackendError> {
        self.programs.release(program).map(|_| ())
    }

    fn profile(&mut self, program: ProgramId) -> Result<Vec<NodeTime>, BackendError> {
        self.programs.get(program).map(|p| p.program.last.clone())
    }

    fn memory(&mut self) -> Result<Option<MemoryUse>, BackendError> {
        Ok(Some(MemoryUse {
            in_use_bytes: self.host_bytes(),
            peak_bytes: self.peak.max(self.host_bytes()),
        }))
    }
}

impl<F: Flavor> tandem_backend_api::BackendPlugin for NpuBackend<F> {
    const NAME: &'static str = F::NAME;

    fn create(options: &BackendOptions) -> Result<Self, BackendError> {
        // A malformed limit is refused before the device is opened.
        options.bytes(MEMORY_LIMIT)?;
        NpuBackend::with_budget(F::executor(options)?, options)
    }
}

#[cfg(test)]
mod tests {
    use tandem_backend_api::BackendPlugin;

    use super::*;
    use crate::NpuEmu;

    fn with_limit(limit: &str) -> Result<NpuEmu, BackendError> {
        let mut o = BackendOptions::default();
        o.set(MEMORY_LIMIT, limit);
        NpuEmu::create(&o)
    }

    #[test]
    fn memory_limit_bounds_host_buffers_and_caches() {
        let mut b = with_limit("1MiB").expect("a 1 MiB budget");
        assert_eq!(b.info().memory_bytes, Some(1 << 20));
        let a = b
            .alloc(&TensorDesc::new(DType::F32, [1 << 17]), Usage::Activation)
            .expect("512 KiB within 1 MiB");
        // An f32 cache holds bf16: 2 bytes an element.
        let k = b
            .alloc(&TensorDesc::new(DType::F32, [1, 1 << 16, 2]), Usage::KvCache)
            .expect("256 KiB of cache within 1 MiB");
        let err = b
            .alloc(&TensorDesc::new(DType::F32, [1 << 17]), Usage::Activation)
            .expect_err("512 KiB more: past 1 MiB");
        assert_eq!(
            err,
            BackendError::OutOfMemory {
                requested: 512 << 10,
                available: 256 << 10
            }
        );
        b.free(k).unwrap();
        b.free(a).unwrap();
        let a = b
            .alloc(&TensorDesc::new(DType::F32, [1 << 18]), Usage::Activation)
            .expect("the whole budget once free");
        b.free(a).unwrap();
    }

    #[test]
    fn a_memory_limit_past_the_hosts_memory_fails_creation() {
        if let Some(total) = host_memory_bytes() {
            let err = with_limit(&(total + 1).to_string())
                .err()
                .expect("a limit past the host's memory");
            assert!(err.to_string().contains("memory_limit"), "{err}");
            let b = NpuEmu::create(&BackendOptions::default()).unwrap();
            assert_eq!(b.info().memory_bytes, Some(total));
        }
        let err = with_limit("lots").err().expect("not a size");
        assert!(err.to_string().contains("memory_limit"), "{err}");
    }
}
