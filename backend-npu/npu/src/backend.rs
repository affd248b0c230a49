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
//! that would take the bytes held (host buffers, caches, the executor's staging) past it. Host
//! memory imported with `import_host` (the engine's, shared with another backend at a split's
//! boundary) is not the backend's: it is not counted.
//!
//! Device-side boundaries (`tandem_backend_api::boundary`): both flavours import host memory
//! (`import_host`: `Input` nodes read it and `Output` nodes write it in place, no copy). Where
//! the executor shares timelines (the device executor: a DRM timeline syncobj, kind
//! `drm_syncobj_fd`), `export_timeline` hands out the timeline the tickets count on (signalled
//! at each ticket after the program's last dispatch), `import_timeline` takes another
//! backend's syncobj fd, and `execute_after` makes the program wait on imported timelines:
//! first on the host, because the program reads its `Input` buffers on the host (to convert
//! them to bf16) before it dispatches and cannot convert inputs it does not have yet; then on
//! the device (a dependency on the dispatch's context), which keeps the order right once the
//! kernels read f32 inputs from shared memory themselves. The emulator shares no timelines.
//! None of this has run on an NPU: the device path is tested against a fake device only.

use std::marker::PhantomData;
use std::os::fd::{AsFd, IntoRawFd};

use half::f16;
use tandem_backend_api::boundary::{DRM_SYNCOBJ_FD, MAX_WAITS};
use tandem_backend_api::kit::{
    host_memory_bytes, named_buffers, Buffers, Compiled, Programs, StepShape, Tickets,
};
use tandem_backend_api::{
    BackendError, BackendInfo, BackendOptions, BufferId, ComputeBackend, CostAnswer, CostQuery, DType,
    DeviceKind, Graph, MemoryUse, NodeTime, Op, ProgramId, RowCount, SharedTimeline, StepArgs, Support,
    TensorDesc, Ticket, TimelineId, Usage, MEMORY_LIMIT,
};

use crate::contract::{bf16_round, bf16_to_f32, kernel_shape, AttnParams, KernelShape};
use crate::executor::{span, Dispatch, Executor, KvId};

/// What distinguishes `npu` from `npu-emu`: the name and how the executor is made.
pub trait Flavor: Send + 'static {
    /// The backend's name.
    const NAME: &'static str;
    /// The executor for these options, or why there is none here.
    fn executor(options: &BackendOptions) -> Result<Box<dyn Executor>, BackendError>;
}

enum Buffer {
    /// An activation in host memory: allocated here or imported.
    Host(host::HostBytes),
    Kv {
        desc: TensorDesc,
        kv: KvId,
    },
}

/// Host buffers: owned bytes, or a region of the engine's imported by `import_host`. The only
/// `unsafe` of the backend is here.
mod host {
    use std::ptr::NonNull;

    use tandem_backend_api::{BackendError, TensorDesc};

    /// An activation's bytes.
    pub(super) enum HostBytes {
        /// Allocated by `alloc`, counted against the budget.
        Owned(Vec<u8>),
        /// Host memory of the engine's, imported by `import_host` (not counted).
        Imported(Region),
    }

    /// A region passed to `import_host`: the buffer's `len` bytes at `ptr`, inside a region
    /// aligned to `HOST_IMPORT_ALIGN`.
    pub(super) struct Region {
        ptr: NonNull<u8>,
        len: usize,
    }

    // SAFETY: the region is plain host memory that `import_host`'s caller keeps valid and does
    // not touch through Rust references until the buffer is freed; the backend (and with it the
    // region) is used by one thread at a time (`ComputeBackend` takes `&mut self`).
    unsafe impl Send for Region {}

    impl HostBytes {
        /// Checks an `import_host` region for a tensor of `desc`: not null, start and length
        /// aligned to `HOST_IMPORT_ALIGN`, long enough.
        ///
        /// # Safety
        /// `import_host`'s contract: when this returns `Ok`, the region must stay valid for
        /// reads and writes, and untouched through Rust references, until the buffer is freed.
        pub(super) unsafe fn import(
            ptr: *mut u8,
            len: usize,
            desc: &TensorDesc,
        ) -> Result<Self, BackendError> {
            let (ptr, len) = tandem_backend_api::kit::check_host_region(ptr, len, desc)?;
            Ok(HostBytes::Imported(Region { ptr, len }))
        }

        /// Bytes counted against the memory budget.
        pub(super) fn held(&self) -> u64 {
            match self {
                HostBytes::Owned(v) => v.len() as u64,
                HostBytes::Imported(_) => 0,
            }
        }

        pub(super) fn len(&self) -> usize {
            match self {
                HostBytes::Owned(v) => v.len(),
                HostBytes::Imported(r) => r.len,
            }
        }

        pub(super) fn bytes(&self) -> &[u8] {
            match self {
                HostBytes::Owned(v) => v,
                // SAFETY: `import_host`'s contract (see `import`): the region is valid for reads
                // of at least `r.len` bytes and no Rust reference aliases it while the buffer
                // exists; the slice borrows `self`.
                HostBytes::Imported(r) => unsafe { std::slice::from_raw_parts(r.ptr.as_ptr(), r.len) },
            }
        }

        pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
            match self {
                HostBytes::Owned(v) => v,
                // SAFETY: as in `bytes`, for writes; `&mut self` makes this the only view.
                HostBytes::Imported(r) => unsafe { std::slice::from_raw_parts_mut(r.ptr.as_ptr(), r.len) },
            }
        }
    }
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
    /// Whether `export_timeline` has run (the timeline then exists and tickets signal it).
    exported: bool,
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
            exported: false,
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
                Buffer::Host(h) => h.held(),
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
            Buffer::Host(b) if b.len() >= bytes => Ok(()),
            Buffer::Host(b) => Err(BackendError::invalid(format!(
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
        // A step's attention dispatches go to the executor together (one chained submission on
        // the device), flushed early only where a node reads what a pending one writes.
        let mut pending: Vec<(usize, Dispatch)> = Vec::new();
        let mut outputs = Vec::new();
        let mut seconds_of = vec![0.0; g.nodes.len()];
        for (i, node) in g.nodes.iter().enumerate() {
            let reads: Vec<usize> = match &node.op {
                Op::Attention { q, k, v, .. } => vec![q.0 as usize, k.0 as usize, v.0 as usize],
                _ => Vec::new(),
            };
            if pending.iter().any(|(out, _)| reads.contains(out)) {
                self.flush(&mut pending, &mut values, &mut seconds_of)?;
            }
            match &node.op {
                Op::Input {
                    buffer,
                    cols,
                    selected,
                } => {
                    let n = if *selected { g.selected_rows } else { g.rows } * cols;
                    let Buffer::Host(host) = self.buffer(*buffer)? else {
                        return Err(BackendError::internal("input buffer changed kind"));
                    };
                    let bytes = host
                        .bytes()
                        .get(..n * 4)
                        .ok_or_else(|| BackendError::internal("input buffer shrank"))?;
                    values[node.outputs[0].0 as usize] = bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                }
                // Outputs are written once every dispatch has run (nothing in the program reads
                // them), so they do not split the step's chain.
                Op::Output { x, buffer } => outputs.push((*x, *buffer)),
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
                    let out = vec![0u16; qb.len()];
                    pending.push((
                        node.outputs[0].0 as usize,
                        Dispatch {
                            node: i,
                            shape,
                            params,
                            q: qb,
                            k: kid,
                            v: vid,
                            out,
                        },
                    ));
                }
                other => {
                    return Err(BackendError::Unsupported {
                        op: other.name(),
                        reason: "compiled into an NPU program by mistake".into(),
                    })
                }
            }
        }
        self.flush(&mut pending, &mut values, &mut seconds_of)?;
        for (x, buffer) in outputs {
            let data: Vec<u8> = values[x.0 as usize]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            match self.buffers.get_mut(buffer) {
                Ok(Buffer::Host(host)) if host.len() >= data.len() => {
                    host.bytes_mut()[..data.len()].copy_from_slice(&data)
                }
                _ => return Err(BackendError::internal("output buffer changed")),
            }
        }
        for (i, node) in g.nodes.iter().enumerate() {
            times.push(NodeTime {
                node: i,
                op: node.op.name(),
                seconds: seconds_of[i],
            });
        }
        prog.last = times;
        Ok(())
    }

    /// Runs the pending dispatches as one chain and stores their outputs and times.
    fn flush(
        &mut self,
        pending: &mut Vec<(usize, Dispatch)>,
        values: &mut [Vec<f32>],
        seconds_of: &mut [f64],
    ) -> Result<(), BackendError> {
        if pending.is_empty() {
            return Ok(());
        }
        let (outs, mut chain): (Vec<usize>, Vec<Dispatch>) = pending.drain(..).unzip();
        let times = self.exec.attention_chain(&mut chain)?;
        for ((out, d), t) in outs.into_iter().zip(chain).zip(times) {
            seconds_of[d.node] = t.seconds;
            values[out] = d.out.into_iter().map(bf16_to_f32).collect();
        }
        Ok(())
    }

    fn kv_of(&self, id: BufferId) -> Result<KvId, BackendError> {
        match self.buffer(id)? {
            Buffer::Kv { kv, .. } => Ok(*kv),
            Buffer::Host(_) => Err(BackendError::invalid(format!(
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
            features: {
                let mut f = self.exec.features();
                if self.exec.shares_timelines() {
                    f.push("timeline_export".into());
                }
                f
            },
            physical_device: None,
            decode_rows: None,
        }
    }

    /// The calibrated cost model's estimates ([`crate::estimate`]): for an XDNA2 NPU (the
    /// device executor's `generation=` feature) beside a laptop iGPU it knows; `None` elsewhere,
    /// the emulator included.
    fn estimate_decode(&self, query: &CostQuery) -> Option<CostAnswer> {
        crate::estimate::estimate_decode(&self.info(), query)
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
                Usage::Activation | Usage::Weight | Usage::HostWeight => bytes,
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
            Usage::Activation | Usage::Weight | Usage::HostWeight => {
                let len = usize::try_from(bytes)
                    .map_err(|_| BackendError::invalid(format!("{desc} is too large")))?;
                Buffer::Host(host::HostBytes::Owned(vec![0; len]))
            }
        };
        let id = self.buffers.insert(buffer);
        self.peak = self.peak.max(self.host_bytes());
        Ok(id)
    }

    fn write(&mut self, buffer: BufferId, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        let offset = usize::try_from(offset).map_err(|_| BackendError::invalid("offset out of range"))?;
        match self.buffer(buffer)? {
            Buffer::Host(_) => {
                let Ok(Buffer::Host(host)) = self.buffers.get_mut(buffer) else {
                    return Err(BackendError::internal("buffer vanished"));
                };
                let r = span(offset, data.len(), host.len())?;
                host.bytes_mut()[r].copy_from_slice(data);
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
            Buffer::Host(host) => {
                let r = span(offset, out.len(), host.len())?;
                out.copy_from_slice(&host.bytes()[r]);
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
            Buffer::Host(_) => Ok(()),
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
                // The kernels (and instruction streams) a step of this shape runs are loaded
                // now, not on its first step.
                if let Op::Attention { cache, .. } = &node.op {
                    self.exec.prepare(shape, cache.capacity)?;
                }
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
        let ticket = self.tickets.issue();
        // The exported timeline (if any) reaches the ticket once the program's last dispatch
        // has finished.
        self.exec.signal(ticket)?;
        Ok(ticket)
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

    /// The region becomes an activation buffer that `Input` nodes read and `Output` nodes
    /// write in place (so do `read` and `write`); it is not counted against the memory budget.
    unsafe fn import_host(
        &mut self,
        ptr: *mut u8,
        len: usize,
        desc: &TensorDesc,
    ) -> Result<BufferId, BackendError> {
        // SAFETY: this function's contract is `import`'s: the caller keeps the region valid
        // and untouched through Rust references until the buffer is freed.
        let host = unsafe { host::HostBytes::import(ptr, len, desc) }?;
        Ok(self.buffers.insert(Buffer::Host(host)))
    }

    /// The executor's timeline (a DRM timeline syncobj, [`DRM_SYNCOBJ_FD`]) as a new fd that
    /// the caller owns and closes; `None` where the executor shares none (the emulator).
    fn export_timeline(&mut self) -> Result<Option<SharedTimeline>, BackendError> {
        let Some(fd) = self.exec.export_timeline()? else {
            return Ok(None);
        };
        if !self.exported {
            self.exported = true;
            // Tickets issued before the timeline existed have finished (`execute` returns once
            // its dispatches have): the timeline starts at the last of them.
            if self.tickets.issued() > 0 {
                self.exec.signal(Ticket(self.tickets.issued()))?;
            }
        }
        Ok(Some(SharedTimeline {
            // The caller owns the descriptor from here (as with Vulkan's export).
            fd: fd.into_raw_fd(),
            kind: DRM_SYNCOBJ_FD.into(),
            device: self.exec.timeline_device(),
        }))
    }

    /// Imports a [`DRM_SYNCOBJ_FD`] timeline (any DRM device's: syncobjs are the DRM core's)
    /// through a duplicate of its fd, which stays the caller's; `None` for other kinds and
    /// where the executor shares no timelines (the emulator).
    fn import_timeline(&mut self, timeline: &SharedTimeline) -> Result<Option<TimelineId>, BackendError> {
        if timeline.kind != DRM_SYNCOBJ_FD || !self.exec.shares_timelines() {
            return Ok(None);
        }
        let fd = xrt_sys::dup_fd(timeline.fd)
            .map_err(|e| BackendError::invalid(format!("import_timeline of {}: {e}", timeline.device)))?;
        self.exec.import_timeline(fd.as_fd())
    }

    /// `execute` once every imported timeline of `waits` has reached its ticket: the executor
    /// waits on the host first (the program converts its inputs on the host before it
    /// dispatches), then makes the dispatch wait on the device too (see the module doc).
    fn execute_after(
        &mut self,
        program: ProgramId,
        args: &StepArgs<'_>,
        waits: &[(TimelineId, Ticket)],
    ) -> Result<Ticket, BackendError> {
        if waits.len() > MAX_WAITS {
            return Err(BackendError::invalid(format!(
                "execute_after: at most {MAX_WAITS} waits, not {}",
                waits.len()
            )));
        }
        self.exec.wait_for(waits)?;
        let result = self.execute(program, args);
        if result.is_err() {
            // No dispatch is left to take the device waits.
            let _ = self.exec.wait_for(&[]);
        }
        result
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
    use tandem_backend_api::{BackendPlugin, HOST_IMPORT_ALIGN};

    use super::*;
    use crate::NpuEmu;

    fn with_limit(limit: &str) -> Result<NpuEmu, BackendError> {
        let mut o = BackendOptions::default();
        o.set(MEMORY_LIMIT, limit);
        NpuEmu::create(&o)
    }

    #[test]
    fn the_emulator_has_no_cost_answer() {
        let b = NpuEmu::create(&BackendOptions::default()).unwrap();
        let q = crate::estimate::tests::query("AMD Radeon 890M Graphics (RADV GFX1150)");
        assert_eq!(b.estimate_decode(&q), None);
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

    /// Aligned host regions for `import_host`, freed on drop (after the backends of a test,
    /// which are made after them).
    struct Regions {
        ptrs: Vec<*mut u8>,
        layout: std::alloc::Layout,
    }

    impl Regions {
        fn new(n: usize) -> Self {
            let layout = std::alloc::Layout::from_size_align(HOST_IMPORT_ALIGN, HOST_IMPORT_ALIGN).unwrap();
            // SAFETY: a non-zero layout; each region is freed in `drop` with the same layout.
            let ptrs = (0..n)
                .map(|_| unsafe { std::alloc::alloc_zeroed(layout) })
                .collect::<Vec<_>>();
            assert!(ptrs.iter().all(|p| !p.is_null()));
            Regions { ptrs, layout }
        }
    }

    impl Drop for Regions {
        fn drop(&mut self) {
            for p in &self.ptrs {
                // SAFETY: allocated in `new` with `layout`; the backends that imported it are gone.
                unsafe { std::alloc::dealloc(*p, self.layout) };
            }
        }
    }

    fn copy_graph(x: BufferId, y: BufferId) -> Graph {
        let mut g = tandem_backend_api::GraphBuilder::new("copy", 2, 2);
        let v = g.push1(Op::Input {
            buffer: x,
            cols: 3,
            selected: false,
        });
        g.push(Op::Output { x: v, buffer: y });
        g.finish()
    }

    const ARGS: StepArgs<'static> = StepArgs {
        tokens: &[0, 0],
        positions: &[0, 1],
        slots: &[0, 0],
        select: &[0, 1],
    };

    #[test]
    fn imported_host_memory_is_read_and_written_in_place() {
        let regions = Regions::new(2);
        let (a, c) = (regions.ptrs[0], regions.ptrs[1]);
        let mut b = with_limit("1MiB").unwrap();
        let before = b.memory().unwrap().unwrap();
        let desc = TensorDesc::new(DType::F32, [2, 3]);
        // SAFETY: aligned regions of HOST_IMPORT_ALIGN bytes that outlive the backend and are
        // touched below only between the backend's calls, through raw pointers.
        let (ia, ic) = unsafe {
            (
                b.import_host(a, HOST_IMPORT_ALIGN, &desc).unwrap(),
                b.import_host(c, HOST_IMPORT_ALIGN, &desc).unwrap(),
            )
        };
        // Not counted: the budget and the figures are what they were.
        assert_eq!(b.memory().unwrap().unwrap(), before);
        let whole = b
            .alloc(&TensorDesc::new(DType::F32, [1 << 18]), Usage::Activation)
            .expect("the whole 1 MiB budget is still free");
        b.free(whole).unwrap();

        // Written through the raw region, read by the program's Input, written by its Output
        // into the other raw region: no copy through the backend.
        let x: Vec<f32> = (1..=6).map(|v| v as f32 * 0.5).collect();
        // SAFETY: `a` holds HOST_IMPORT_ALIGN bytes, 4-aligned; no reference to it is live.
        unsafe { std::ptr::copy_nonoverlapping(x.as_ptr(), a.cast::<f32>(), 6) };
        let p = b.compile(&copy_graph(ia, ic)).unwrap();
        let t = b.execute(p, &ARGS).unwrap();
        b.wait(t).unwrap();
        // SAFETY: the program has finished; `c` holds 6 f32 written by it.
        let out = unsafe { std::slice::from_raw_parts(c as *const f32, 6) }.to_vec();
        assert_eq!(out, x);
        // `read` and `write` reach the same memory.
        b.write(ia, 4, &7.0f32.to_le_bytes()).unwrap();
        // SAFETY: as above; the backend is not running.
        assert_eq!(unsafe { *a.cast::<f32>().add(1) }, 7.0);
        let mut back = [0u8; 4];
        b.read(ic, 8, &mut back).unwrap();
        assert_eq!(f32::from_le_bytes(back), 1.5);
        // Bounds hold on an imported buffer as on any other.
        assert!(b.read(ic, 24, &mut back).is_err());
        b.release(p).unwrap();
        b.free(ia).unwrap();
        b.free(ic).unwrap();
    }

    #[test]
    fn bad_regions_are_refused() {
        let regions = Regions::new(1);
        let a = regions.ptrs[0];
        let mut b = NpuEmu::create(&BackendOptions::default()).unwrap();
        let desc = TensorDesc::new(DType::F32, [2, 3]);
        // SAFETY: every call below is refused before the region is used.
        let errs = unsafe {
            [
                b.import_host(std::ptr::null_mut(), HOST_IMPORT_ALIGN, &desc),
                b.import_host(a.wrapping_add(4), HOST_IMPORT_ALIGN, &desc),
                b.import_host(a, HOST_IMPORT_ALIGN - 4, &desc),
                b.import_host(
                    a,
                    HOST_IMPORT_ALIGN,
                    &TensorDesc::new(DType::F32, [HOST_IMPORT_ALIGN, 1]),
                ),
            ]
        };
        let msgs: Vec<String> = errs.into_iter().map(|e| e.unwrap_err().to_string()).collect();
        assert!(msgs[0].contains("null pointer"), "{}", msgs[0]);
        assert!(msgs[1].contains("not aligned"), "{}", msgs[1]);
        assert!(msgs[2].contains("not aligned"), "{}", msgs[2]);
        assert!(msgs[3].contains("cannot hold"), "{}", msgs[3]);
        assert_eq!(b.memory().unwrap().unwrap().in_use_bytes, 0);
    }

    #[test]
    fn the_emulator_shares_no_timeline_and_still_runs_execute_after() {
        use tandem_backend_api::boundary::DRM_SYNCOBJ_FD;
        let mut b = NpuEmu::create(&BackendOptions::default()).unwrap();
        assert!(!b.info().features.iter().any(|f| f == "timeline_export"));
        assert_eq!(b.export_timeline().unwrap(), None);
        // fd -1: the emulator does not even look at it.
        let t = SharedTimeline {
            fd: -1,
            kind: DRM_SYNCOBJ_FD.into(),
            device: "amdxdna:0000:c6:00.1".into(),
        };
        assert_eq!(b.import_timeline(&t).unwrap(), None);
        let desc = TensorDesc::new(DType::F32, [2, 3]);
        let (x, y) = (
            b.alloc(&desc, Usage::Activation).unwrap(),
            b.alloc(&desc, Usage::Activation).unwrap(),
        );
        let data: Vec<u8> = (0..6).flat_map(|i| (i as f32 + 0.25).to_le_bytes()).collect();
        b.write(x, 0, &data).unwrap();
        let p = b.compile(&copy_graph(x, y)).unwrap();
        let t = b.execute_after(p, &ARGS, &[]).unwrap();
        assert_eq!(t, Ticket(1));
        let mut out = vec![0u8; 24];
        b.read(y, 0, &mut out).unwrap();
        assert_eq!(out, data);
        let e = b
            .execute_after(p, &ARGS, &[(TimelineId(0), Ticket(1))])
            .unwrap_err()
            .to_string();
        assert!(e.contains("timeline 0 was not imported"), "{e}");
        let nine = [(TimelineId(0), Ticket(1)); MAX_WAITS + 1];
        assert!(b
            .execute_after(p, &ARGS, &nine)
            .unwrap_err()
            .to_string()
            .contains("at most"));
        // Refused before running: no ticket was issued for them.
        assert_eq!(b.execute(p, &ARGS).unwrap(), Ticket(2));
    }
}
