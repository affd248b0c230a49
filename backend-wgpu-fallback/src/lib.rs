//! tandem's portable wgpu backend: every op of the op set as a WGSL compute kernel
//! (`shaders/wgsl/`), on any adapter wgpu offers (Vulkan, Metal, DX12, GL), for where the raw
//! Vulkan backend cannot run.
//!
//! The crate reads top to bottom as: `device` (adapter choice, limits and features, error
//! sinks), `kernels` (WGSL modules and pipelines), `program` (planning, dispatch list, bind
//! groups, per-step encoding), and here the trait.
//!
//! Everything a step needs is made at compile: pipelines, one uniform slot of parameters per
//! dispatch, every bind group. A step writes its arguments (`queue.write_buffer`) and submits
//! one command buffer: copies of the program's inputs into its arena, one compute pass, copies
//! of its outputs. That command buffer was recorded right after the program's previous step was
//! submitted, while the device ran it, so recording is off the host's path of a step. Each
//! output is also copied to a host-mappable mirror of its buffer, so reading it (the logits,
//! every step) maps that mirror: no submission, copy or wait beyond the step's own. Weights
//! larger than the adapter's binding limit are bound in chunks of rows.
//!
//! Options (`[backend.wgpu]` in the config, or the environment): `adapter` /
//! `TANDEM_WGPU_ADAPTER` (an index or a name substring), `backends` / `TANDEM_WGPU_BACKENDS`
//! (`vulkan,metal,dx12,gl`), `validation` / `TANDEM_WGPU_VALIDATION=1` (the API's validation
//! layer; any message fails the next call), `profile` / `TANDEM_WGPU_PROFILE=1` (per-node
//! timestamps for `profile`, where the adapter has timestamps inside passes; compile then also
//! says on stderr how many dispatches each program has), `fuse` / `TANDEM_WGPU_FUSE=0` (every
//! node its own kernel, for side-by-side measurement), `features` /
//! `TANDEM_WGPU_FEATURES` (the kernel variants: `auto`, the default, takes every optional
//! feature the adapter offers; `portable` none; or a list such as `subgroups`, an error where
//! the adapter lacks one: `subgroups`, `f16`, `coopmat`, `int_dot`; `info().features` names
//! them as `kernels=...`, and `int8_dot` whether the packed dot product is accelerated, the
//! condition for `auto` to take it), `memory_limit`
//! (the most device memory the backend may hold, `8GiB`; see below), `pipeline_cache` /
//! `TANDEM_PIPELINE_CACHE` (wgpu's pipeline cache on disk, on Vulkan adapters: on by default,
//! `false` turns it off, `log` says on stderr what it read, built and wrote; `info().features`
//! says `pipeline_cache=cold|warm|off|unsupported`, and once pipelines were built
//! `pipelines=N` and `pipelines_ms=T`; see `pipeline_cache`).
//!
//! Nodes fuse into one kernel where `fuse` finds the chains the Vulkan backend fuses (norm, add
//! and norm; per-head norm, rope and the K/V store), and decode attention with grouped queries
//! reads each KV head's cache once for its query heads (`attention_gqa.wgsl`). Prefill attention
//! runs flash-attention style by blocks of rows over key tiles in workgroup memory
//! (`attention_tiled.wgsl`, where the adapter has 32 KiB of it; see `attention_tiled`).
//!
//! Memory: wgpu tells no heap size, so without `memory_limit` `info().memory_bytes` is `None`
//! (unknown: the engine's budget check passes the unit by) and nothing bounds the total but the
//! driver (`max_buffer_size` bounds one buffer, not all of them; on Mesa it is 2 GiB). With the
//! option set, `info().memory_bytes` is the limit, taken as written (there is no device figure to
//! check it against), and buffers, program arenas and the bandwidth measurement's buffers past it
//! are `OutOfMemory`.

mod attention_tiled;
// The pipeline cache's file (directory, frame, checks, atomic write): the Vulkan backend's,
// which knows no graphics API (its Vulkan header check is the Vulkan backend's alone).
#[allow(dead_code)]
#[path = "../../backend-vulkan/src/cache_file.rs"]
mod cache_file;
mod device;
mod fuse;
mod kernels;
mod pipeline_cache;
mod program;
mod tuning;

use std::collections::VecDeque;

use tandem_backend_api::kit::{Buffers, Programs, StepShape, Tickets};
use tandem_backend_api::{
    BackendError, BackendInfo, BackendOptions, BackendPlugin, BufferId, ComputeBackend, MemoryUse, NodeTime,
    Op, ProgramId, StepArgs, Support, TensorDesc, Ticket, Usage, MEMORY_LIMIT,
};

use device::{Gpu, Request};
use kernels::Pipelines;
use pipeline_cache::DiskCache;
use program::Program;

/// Bytes written or read per staging round.
const CHUNK_BYTES: usize = 32 << 20;

/// Submissions remembered for `wait` (waiting for a later one covers an earlier one).
const TICKETS_KEPT: usize = 64;

/// A buffer of the trait.
pub(crate) struct Buffer {
    pub desc: TensorDesc,
    pub buf: wgpu::Buffer,
    /// The tensor's bytes.
    pub len: u64,
    /// The buffer's size: `len` rounded up, with room for a decoder's last word.
    pub size: u64,
    /// A host-mappable copy (`MAP_READ`) of a program output, of `size` bytes, which every
    /// program writing this buffer also writes in the same commands: reading an output is then
    /// a map of it, with no submission, copy or wait of its own. Made when a program that
    /// outputs here is compiled.
    pub mirror: Option<wgpu::Buffer>,
    /// The submission that last wrote the buffer, where it also wrote the mirror, and the
    /// bytes from 0 it wrote; `None` once anything else writes the buffer.
    pub mirrored: Option<(wgpu::SubmissionIndex, u64)>,
}

/// The wgpu backend.
pub struct WgpuBackend {
    gpu: Gpu,
    pipelines: Pipelines,
    /// The pipeline cache on disk (option `pipeline_cache`).
    disk_cache: DiskCache,
    buffers: Buffers<Buffer>,
    programs: Programs<Program>,
    tickets: Tickets,
    /// The last submissions, by ticket.
    submissions: VecDeque<(u64, wgpu::SubmissionIndex)>,
    readback: Option<wgpu::Buffer>,
    in_use: u64,
    peak: u64,
    /// Option `memory_limit`: the most bytes buffers and programs may hold; `None` without the
    /// option.
    memory_limit: Option<u64>,
    /// Option `fuse` (`TANDEM_WGPU_FUSE`, on by default): chains run as one kernel.
    fuse: bool,
    /// Option `profile`: compile also says on stderr how many dispatches a program has.
    profile: bool,
    /// Option `precision = "fast"` where the integer-dot kernels run: their input at 8 bits.
    narrow: bool,
}

impl BackendPlugin for WgpuBackend {
    const NAME: &'static str = "wgpu";

    fn create(options: &BackendOptions) -> Result<Self, BackendError> {
        let req = Request::from_options(options)?;
        let mut gpu = Gpu::open(&req)?;
        // wgpu tells no heap size: the limit is taken as written; without it `max_buffer_size`
        // bounds one buffer only (`alloc`).
        let memory_limit = options.bytes(MEMORY_LIMIT)?;
        if let Some(limit) = memory_limit {
            gpu.features.push(format!("memory_limit={limit}"));
        }
        // `fast` changes only the integer-dot kernels' input: where they do not run, the
        // arithmetic is `exact` whatever was asked, and the feature says so.
        let narrow = req.fast && gpu.variant.int_dot;
        gpu.features
            .push(format!("precision={}", if narrow { "fast" } else { "exact" }));
        let mut pipelines = Pipelines::new(gpu.variant);
        let disk_cache = DiskCache::open(&gpu.device, gpu.cache_identity, req.pipeline_cache);
        pipelines.cache = disk_cache.cache.clone();
        Ok(WgpuBackend {
            gpu,
            pipelines,
            disk_cache,
            buffers: Buffers::new(),
            programs: Programs::new(),
            tickets: Tickets::new(),
            submissions: VecDeque::new(),
            readback: None,
            in_use: 0,
            peak: 0,
            memory_limit,
            fuse: req.fuse,
            profile: req.profile,
            narrow,
        })
    }
}

tandem_backend_api::export_backend!(WgpuBackend);

impl WgpuBackend {
    fn range(buf: &Buffer, id: BufferId, offset: u64, len: usize) -> Result<(), BackendError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= buf.len => Ok(()),
            _ => Err(BackendError::invalid(format!(
                "buffer {} ({}): {len} bytes at offset {offset} run past its {} bytes",
                id.0, buf.desc, buf.len
            ))),
        }
    }

    /// Whether the op's tensors fit this adapter's limits: a weight within `max_buffer_size`
    /// with each row within the binding limit, KV caches within the binding limit (the
    /// placement then puts the node elsewhere, naming the limit and the tensor).
    fn fits_limits(&self, op: &Op) -> Result<(), String> {
        let l = &self.gpu.limits;
        for w in op.weights() {
            let bytes = w.desc.byte_size().map_err(|e| e.to_string())?;
            if bytes + 16 > l.max_buffer_size {
                return Err(format!(
                    "weight {} of {bytes} bytes exceeds the adapter's max_buffer_size of {} bytes",
                    w.desc, l.max_buffer_size
                ));
            }
            let row = w
                .desc
                .dtype
                .row_bytes(*w.desc.shape.last().unwrap_or(&1))
                .unwrap_or(0) as u64;
            let align = u64::from(l.min_storage_buffer_offset_alignment);
            if let Op::Embed { .. } | Op::MatMul { .. } = op {
                let rows = w.desc.shape.first().copied().unwrap_or(1);
                program::weight_chunks(
                    &w.desc.to_string(),
                    rows,
                    row,
                    bytes + 16,
                    l.max_storage_buffer_binding_size,
                    align,
                )
                .map_err(|e| e.to_string())?;
            }
        }
        if let Op::Attention {
            cache,
            kv_heads,
            head_dim,
            ..
        } = op
        {
            let bytes =
                (cache.slots * cache.capacity * kv_heads * head_dim * cache.dtype.row_bytes(1).unwrap_or(4))
                    as u64;
            if bytes > l.max_storage_buffer_binding_size {
                return Err(format!(
                    "a KV cache of {bytes} bytes ({} slots x {} positions) exceeds the adapter's \
                     max_storage_buffer_binding_size of {} bytes",
                    cache.slots, cache.capacity, l.max_storage_buffer_binding_size
                ));
            }
        }
        Ok(())
    }

    /// `OutOfMemory` where `bytes` more would pass `memory_limit`.
    fn within_limit(&self, bytes: u64) -> Result<(), BackendError> {
        match self.memory_limit {
            Some(limit) if bytes > limit.saturating_sub(self.in_use) => Err(BackendError::OutOfMemory {
                requested: bytes,
                available: limit.saturating_sub(self.in_use),
            }),
            _ => Ok(()),
        }
    }

    fn track(&mut self, bytes: u64) {
        self.in_use += bytes;
        self.peak = self.peak.max(self.in_use);
    }

    /// Copies `len` bytes (offset and length multiples of 4) of `src` to the host.
    fn read_aligned(&mut self, src: &wgpu::Buffer, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        let len = out.len() as u64;
        let need = len.max(4);
        if self.readback.as_ref().is_none_or(|b| b.size() < need) {
            let size = need.max(1 << 20).div_ceil(4) * 4;
            self.readback = Some(self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let rb = self
            .readback
            .as_ref()
            .ok_or_else(|| BackendError::internal("no readback buffer"))?;
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.copy_buffer_to_buffer(src, offset, rb, 0, len);
        let index = self.gpu.queue.submit([enc.finish()]);
        map_and_copy(&self.gpu, rb, index, 0, out)
    }

    /// Gives each output buffer of `prog` a mirror (`Buffer::mirror`) where it has none and the
    /// memory limit allows one; a new mirror drops the other programs' recorded commands, so
    /// that every program writing the buffer writes it too. Without a mirror, reads copy.
    fn mirror_outputs(&mut self, prog: &Program) -> Result<(), BackendError> {
        let mut made = false;
        for c in &prog.outputs {
            let b = self.buffers.get(c.buffer)?;
            if b.mirror.is_some() || self.within_limit(b.size).is_err() {
                continue;
            }
            let (size, label) = (b.size, format!("mirror of {}", b.desc));
            let mirror = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&label),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            // `mirrored` is None: only a buffer with a mirror is ever marked.
            self.buffers.get_mut(c.buffer)?.mirror = Some(mirror);
            self.track(size);
            made = true;
        }
        if made {
            for c in self.programs.iter_mut() {
                c.program.ready = None;
            }
        }
        Ok(())
    }
}

/// Maps `rb` once the submission `index` has finished and copies its bytes from `at` to `out`
/// (the range mapped from `at` down to a multiple of 8 up to a multiple of 4, within `rb`).
fn map_and_copy(
    gpu: &Gpu,
    rb: &wgpu::Buffer,
    index: wgpu::SubmissionIndex,
    at: u64,
    out: &mut [u8],
) -> Result<(), BackendError> {
    let from = at / wgpu::MAP_ALIGNMENT * wgpu::MAP_ALIGNMENT;
    let to = (at + out.len() as u64).div_ceil(4) * 4;
    let skip = (at - from) as usize;
    let slice = rb.slice(from..to);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    gpu.wait(Some(index))?;
    match rx.try_recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err(BackendError::internal(format!(
                "{}: mapping a readback: {e}",
                gpu.name
            )))
        }
        Err(_) => {
            return Err(BackendError::internal(format!(
                "{}: a readback never mapped",
                gpu.name
            )))
        }
    }
    {
        let view = slice
            .get_mapped_range()
            .map_err(|e| BackendError::internal(format!("{}: readback view: {e}", gpu.name)))?;
        out.copy_from_slice(&view[skip..skip + out.len()]);
    }
    rb.unmap();
    Ok(())
}

impl ComputeBackend for WgpuBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: Self::NAME.to_string(),
            device: self.gpu.name.clone(),
            kind: self.gpu.kind,
            memory_bytes: self.memory_limit,
            features: self
                .gpu
                .features
                .iter()
                .cloned()
                .chain(
                    self.disk_cache
                        .features(self.pipelines.built, self.pipelines.time),
                )
                .collect(),
            physical_device: self.gpu.physical_device.clone(),
            decode_rows: Some(tandem_gpu_kit::matmul::DECODE_ROWS - 1),
        }
    }

    fn supports(&self, op: &Op) -> Support {
        match tandem_gpu_kit::op_support(op, &kernels::COVERAGE).and_then(|()| self.fits_limits(op)) {
            Ok(()) => Support::Yes,
            Err(reason) => Support::No { reason },
        }
    }

    fn alloc(&mut self, desc: &TensorDesc, usage: Usage) -> Result<BufferId, BackendError> {
        self.gpu.check()?;
        let len = desc.byte_size()?;
        let size = len.saturating_add(4).div_ceil(16).saturating_mul(16);
        let max = self.gpu.limits.max_buffer_size;
        if size > max {
            return Err(BackendError::unsupported(
                "alloc",
                format!(
                    "{usage:?} tensor {desc} of {len} bytes exceeds the adapter's max_buffer_size of {max} bytes"
                ),
            ));
        }
        self.within_limit(size)?;
        let err = self.gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(&format!("{usage:?} {desc}")),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if pollster::block_on(err.pop()).is_some() {
            return Err(BackendError::OutOfMemory {
                requested: size,
                available: 0,
            });
        }
        let id = self.buffers.insert(Buffer {
            desc: desc.clone(),
            buf,
            len,
            size,
            mirror: None,
            mirrored: None,
        });
        self.track(size);
        self.gpu.check()?;
        Ok(id)
    }

    fn write(&mut self, buffer: BufferId, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        self.gpu.check()?;
        let b = self.buffers.get_mut(buffer)?;
        Self::range(b, buffer, offset, data.len())?;
        b.mirrored = None;
        if data.is_empty() {
            return Ok(());
        }
        // Copies run in 4-byte words: an unaligned head or tail keeps the bytes around it.
        let start = offset / 4 * 4;
        let end = (offset + data.len() as u64).div_ceil(4) * 4;
        let mut head = [0u8; 4];
        let mut tail = [0u8; 4];
        let buf = b.buf.clone();
        if start != offset {
            self.read_aligned(&buf, start, &mut head)?;
        }
        if end != offset + data.len() as u64 {
            self.read_aligned(&buf, end - 4, &mut tail)?;
        }
        let data_end = offset + data.len() as u64;
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(CHUNK_BYTES);
            let (lo, hi) = (offset.max(at), data_end.min(at + n as u64));
            let from_data = &data[(lo - offset) as usize..(hi - offset) as usize];
            if lo == at && hi == at + n as u64 {
                self.gpu.queue.write_buffer(&buf, at, from_data);
            } else {
                let mut chunk = vec![0u8; n];
                chunk[(lo - at) as usize..(hi - at) as usize].copy_from_slice(from_data);
                if at == start && start != offset {
                    let k = (offset - start) as usize;
                    chunk[..k].copy_from_slice(&head[..k]);
                }
                if at + n as u64 == end && end != data_end {
                    let k = (data_end - (end - 4)) as usize;
                    chunk[n - 4 + k..].copy_from_slice(&tail[k..]);
                }
                self.gpu.queue.write_buffer(&buf, at, &chunk);
            }
            // Flush each chunk, so staging memory stays at one chunk.
            self.gpu.queue.submit([]);
            at += n as u64;
        }
        self.gpu.check()
    }

    fn read(&mut self, buffer: BufferId, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.gpu.check()?;
        let b = self.buffers.get(buffer)?;
        Self::range(b, buffer, offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let buf = b.buf.clone();
        let start = offset / 4 * 4;
        let end = (offset + out.len() as u64).div_ceil(4) * 4;
        if let (Some(mirror), Some((index, written))) = (&b.mirror, &b.mirrored) {
            if end <= *written {
                // The last step's own copy: map it where it lies.
                map_and_copy(&self.gpu, mirror, index.clone(), offset, out)?;
                return self.gpu.check();
            }
        }
        if start == offset && end == offset + out.len() as u64 {
            // Whole words: straight into `out`.
            for (i, part) in out.chunks_mut(CHUNK_BYTES).enumerate() {
                self.read_aligned(&buf, offset + (i * CHUNK_BYTES) as u64, part)?;
            }
            return self.gpu.check();
        }
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(CHUNK_BYTES);
            let mut words = vec![0u8; n];
            self.read_aligned(&buf, at, &mut words)?;
            // The part of [at, at + n) inside [offset, offset + len).
            let lo = offset.max(at);
            let hi = (offset + out.len() as u64).min(at + n as u64);
            out[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&words[(lo - at) as usize..(hi - at) as usize]);
            at += n as u64;
        }
        self.gpu.check()
    }

    fn free(&mut self, buffer: BufferId) -> Result<(), BackendError> {
        self.gpu.check()?;
        let b = self.buffers.free(buffer, &self.programs)?;
        // wgpu keeps the memory until the submissions using it have finished.
        b.buf.destroy();
        self.in_use = self.in_use.saturating_sub(b.size);
        if let Some(m) = b.mirror {
            m.destroy();
            self.in_use = self.in_use.saturating_sub(b.size);
        }
        Ok(())
    }

    fn compile(&mut self, graph: &tandem_backend_api::Graph) -> Result<ProgramId, BackendError> {
        self.gpu.check()?;
        let before = (self.pipelines.built, self.pipelines.time);
        let built = self.build_program(graph);
        // The pipelines this compile made go to disk now (a server stopped by a signal keeps
        // them), even where the compile failed after making some.
        let what = format!("'{}'", graph.name);
        self.disk_cache
            .compiled(&what, self.pipelines.built, self.pipelines.time, before);
        let (prog, buffers) = built?;
        if self.profile {
            eprintln!(
                "wgpu: program '{}' ({} rows): {} nodes, {} dispatches",
                graph.name,
                graph.rows,
                graph.nodes.len(),
                prog.dispatches.len()
            );
        }
        if let Err(e) = self.within_limit(prog.bytes) {
            prog.arena.destroy();
            prog.params.destroy();
            prog.args.destroy();
            return Err(e);
        }
        self.track(prog.bytes);
        self.mirror_outputs(&prog)?;
        Ok(self.programs.insert(prog, buffers, StepShape::of(graph)))
    }

    fn execute(&mut self, program: ProgramId, args: &StepArgs<'_>) -> Result<Ticket, BackendError> {
        self.gpu.check()?;
        let c = self.programs.get_mut(program)?;
        c.step().check(args)?;
        let ready = c.program.ready.take();
        let prog = &self.programs.get(program)?.program;
        let mut words: Vec<u32> = Vec::with_capacity(3 * args.tokens.len() + args.select.len());
        words.extend_from_slice(args.tokens);
        words.extend_from_slice(args.positions);
        words.extend_from_slice(args.slots);
        words.extend_from_slice(args.select);
        // Ordered after every earlier submission and before this step's.
        self.gpu
            .queue
            .write_buffer(&prog.args, 0, bytemuck::cast_slice(&words));
        // Image-aware attentions' per-row ends, beside the positions.
        for &(from, at) in &prog.ends {
            tandem_backend_api::kit::step::visible_ends(args, Some(from), &mut words);
            self.gpu
                .queue
                .write_buffer(&prog.args, u64::from(at) * 4, bytemuck::cast_slice(&words));
        }
        let commands = match ready {
            Some(c) => c,
            None => self.encode(prog)?,
        };
        let index = self.gpu.queue.submit([commands]);
        self.gpu.check()?;
        // The next step's commands, recorded while the device runs this one: on the host's
        // path of a step there is then only the arguments' write and the submit.
        let next = self.encode(prog)?;
        let ticket = self.tickets.issue();
        self.submissions.push_back((ticket.0, index.clone()));
        if self.submissions.len() > TICKETS_KEPT {
            self.submissions.pop_front();
        }
        // The outputs as `encode` wrote them: with their mirrors where they have one.
        for c in &self.programs.get(program)?.program.outputs {
            let b = self.buffers.get_mut(c.buffer)?;
            b.mirrored = b.mirror.is_some().then(|| (index.clone(), c.size));
        }
        let prog = &mut self.programs.get_mut(program)?.program;
        prog.last = Some(index);
        prog.ready = Some(next);
        Ok(ticket)
    }

    fn wait(&mut self, ticket: Ticket) -> Result<(), BackendError> {
        self.tickets.check(ticket)?;
        // The submission itself, or the oldest one remembered (which is later).
        let index = self
            .submissions
            .iter()
            .find(|(t, _)| *t >= ticket.0)
            .map(|(_, i)| i.clone());
        self.gpu.wait(index)
    }

    fn release(&mut self, program: ProgramId) -> Result<(), BackendError> {
        let p = self.programs.release(program)?;
        self.in_use = self.in_use.saturating_sub(p.bytes);
        p.arena.destroy();
        p.params.destroy();
        self.gpu.check()
    }

    fn profile(&mut self, program: ProgramId) -> Result<Vec<NodeTime>, BackendError> {
        self.gpu.check()?;
        let prog = &self.programs.get(program)?.program;
        let (Some(t), Some(last)) = (&prog.timestamps, prog.last.clone()) else {
            return Ok(Vec::new());
        };
        let n = prog.graph.nodes.len();
        let mut raw = vec![0u8; (n + 1) * 8];
        map_and_copy(&self.gpu, &t.readback, last, 0, &mut raw)?;
        let ts: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        let period = f64::from(self.gpu.queue.get_timestamp_period());
        Ok(tandem_gpu_kit::plan::node_times(&prog.graph, &ts, period))
    }

    /// A device-to-device `copy_buffer_to_buffer` of up to 256 MiB, timed on the host clock
    /// from submit to completion (best of five, after one warm-up): wgpu has no timestamps
    /// outside passes on every adapter. The submit and wait overhead (tens of microseconds)
    /// makes the figure a slight underestimate.
    fn copy_bandwidth(&mut self) -> Result<Option<f64>, BackendError> {
        self.gpu.check()?;
        let mut bytes = (256u64 << 20)
            .min(self.gpu.limits.max_buffer_size / 4)
            .max(1 << 20);
        if let Some(limit) = self.memory_limit {
            // Two buffers within what the limit has left (an error where not even 2 MiB is).
            let left = limit.saturating_sub(self.in_use);
            bytes = bytes.min(limit / 16).min(left / 2).max(1 << 20);
            self.within_limit(2 * bytes)?;
        }
        let bytes = bytes / 4 * 4;
        let make = |label| {
            self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let (a, b) = (make("bandwidth source"), make("bandwidth destination"));
        let mut best = f64::INFINITY;
        for i in 0..6 {
            let mut enc = self
                .gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            enc.copy_buffer_to_buffer(&a, 0, &b, 0, bytes);
            let start = std::time::Instant::now();
            let index = self.gpu.queue.submit([enc.finish()]);
            self.gpu.wait(Some(index))?;
            if i > 0 {
                best = best.min(start.elapsed().as_secs_f64());
            }
        }
        a.destroy();
        b.destroy();
        Ok((best.is_finite() && best > 0.0).then(|| 2.0 * bytes as f64 / best))
    }

    fn memory(&mut self) -> Result<Option<MemoryUse>, BackendError> {
        Ok(Some(MemoryUse {
            in_use_bytes: self.in_use,
            peak_bytes: self.peak,
        }))
    }
}

impl Drop for WgpuBackend {
    fn drop(&mut self) {
        let _ = self.gpu.wait(None);
        self.disk_cache.finish(self.pipelines.built, self.pipelines.time);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::{Format, Kernel};
    use tandem_backend_api::DType;

    /// The backend on this machine's adapter with validation on; `None` (the test says so) where
    /// there is none, except under CI, where lavapipe must be there.
    fn backend() -> Option<WgpuBackend> {
        let mut o = BackendOptions::default();
        o.set("validation", "true");
        match WgpuBackend::create(&o) {
            Ok(b) => Some(b),
            Err(e) if std::env::var_os("CI").is_none() => {
                eprintln!("skipping: no wgpu adapter here: {e}");
                None
            }
            Err(e) => panic!("CI must run the wgpu backend (lavapipe): {e}"),
        }
    }

    #[test]
    fn coopmat_opens_where_offered_and_is_refused_naming_why_elsewhere() {
        let mut o = BackendOptions::default();
        o.set("validation", "true").set("features", "coopmat");
        match WgpuBackend::create(&o) {
            Ok(b) => {
                assert!(b.gpu.variant.coopmat, "{:?}", b.gpu.variant);
                assert!(
                    b.gpu.features.iter().any(|f| f.starts_with("kernels=coopmat")),
                    "{:?}",
                    b.gpu.features
                );
            }
            Err(BackendError::Unavailable { reason }) => {
                // lavapipe (Mesa 22.3) has no cooperative matrices; no adapter at all is the
                // other way here (outside CI).
                assert!(
                    reason.contains("features = coopmat") || std::env::var_os("CI").is_none(),
                    "{reason}"
                );
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn every_kernel_compiles_for_every_format_and_variant() {
        let Some(b) = backend() else { return };
        if std::env::var_os("CI").is_some() {
            // lavapipe offers subgroups and f16: CI compiles both variants of every kernel.
            assert!(
                b.gpu.variant.subgroups && b.gpu.variant.f16,
                "CI's adapter lost a variant: {:?}",
                b.gpu.variant
            );
        }
        let formats = [
            DType::F32,
            DType::F16,
            DType::Bf16,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q4K,
            DType::Q6K,
        ];
        for kernel in Kernel::ALL {
            if matches!(kernel, Kernel::AttentionTiled | Kernel::BlockAttentionTiled)
                && b.gpu.limits.max_compute_workgroup_storage_size < attention_tiled::WORKGROUP_BYTES
            {
                continue; // never planned on this adapter
            }
            let variants: Vec<Option<Format>> = if kernel == Kernel::MatVecDot {
                // The block formats, each with its unit decoder.
                formats
                    .iter()
                    .filter(|&&d| kernels::dot_supported(d))
                    .map(|&d| Format::for_rows(d, 256))
                    .collect()
            } else if kernel.reads_format() {
                formats
                    .iter()
                    .flat_map(|&d| [Format::for_rows(d, 256), Format::for_rows(d, 257)])
                    .flatten()
                    .map(Some)
                    .collect()
            } else {
                vec![None]
            };
            // The portable variant, and the one the adapter gets (subgroups on lavapipe).
            for variant in [kernels::Variant::PORTABLE, b.gpu.variant] {
                if kernel.needs_coopmat() && !variant.coopmat {
                    continue; // the coopmat path's kernels: SPIR-V checked in kernels.rs
                }
                if kernel.needs_subgroups() && !variant.subgroups {
                    continue;
                }
                let mut pipelines = Pipelines::new(variant);
                // matvec_q4k_rows: its smallest shape, and its largest with the GeGlu.
                let overrides: &[u32] = match kernel {
                    Kernel::MatVec | Kernel::MatVecGeGlu => &[8],
                    Kernel::MatVecQ4kRows => &[1 | 1 << 8, 4 | 8 << 8 | 1 << 16],
                    // matvec_f16: one row, and 8 rows of 128 invocations with the GeGlu.
                    Kernel::MatVecF16 => &[1, 8 | 2 << 16 | 1 << 24],
                    // matvec_dot: one row and one column at 16 bits, 8 rows at 8 bits, 4
                    // columns, and 2 GeGlu columns of 2 rows at 16 bits.
                    Kernel::MatVecDot => {
                        &[1 | 1 << 8 | 1 << 16, 8 | 1 << 8, 1 | 4 << 8, 2 | 2 << 8 | 3 << 16]
                    }
                    Kernel::QuantizeQ8 => &[0, 1],
                    // The attention kernels without and with images' blocks (IMAGE_ROWS).
                    Kernel::Attention | Kernel::AttentionGqa | Kernel::AttentionTiled => &[0, 1],
                    _ => &[0],
                };
                for f in &variants {
                    for &o in overrides {
                        pipelines
                            .get(&b.gpu.device, (kernel, *f, o))
                            .unwrap_or_else(|e| panic!("{} {f:?} {variant:?} {o:#x}: {e}", kernel.name()));
                        b.gpu
                            .check()
                            .unwrap_or_else(|e| panic!("{} {f:?} {variant:?} {o:#x}: {e}", kernel.name()));
                    }
                }
            }
        }
    }

    #[test]
    fn ops_over_the_adapters_limits_are_declined_naming_limit_and_tensor() {
        let Some(b) = backend() else { return };
        let rows = (b.gpu.limits.max_buffer_size / 4 / 64 + 1) as usize;
        let op = Op::MatMul {
            x: tandem_backend_api::ValueId(0),
            weight: tandem_backend_api::WeightRef {
                buffer: BufferId::UNBOUND,
                desc: TensorDesc::new(DType::F32, [rows, 64]),
            },
            splits: vec![rows],
        };
        match b.supports(&op) {
            Support::No { reason } => {
                assert!(
                    reason.contains("max_buffer_size") && reason.contains(&format!("f32[{rows}, 64]")),
                    "{reason}"
                )
            }
            Support::Yes => panic!("a weight over max_buffer_size is supported"),
        }
        let small = Op::MatMul {
            x: tandem_backend_api::ValueId(0),
            weight: tandem_backend_api::WeightRef {
                buffer: BufferId::UNBOUND,
                desc: TensorDesc::new(DType::Q4K, [8, 256]),
            },
            splits: vec![8],
        };
        assert!(b.supports(&small).is_yes());
    }

    /// The backend with validation on and `memory_limit` set; `None` as in `backend`.
    fn with_limit(limit: &str) -> Option<Result<WgpuBackend, BackendError>> {
        let mut o = BackendOptions::default();
        o.set("validation", "true").set(MEMORY_LIMIT, limit);
        match WgpuBackend::create(&o) {
            Err(BackendError::Unavailable { reason }) if std::env::var_os("CI").is_none() => {
                eprintln!("skipping: no wgpu adapter here: {reason}");
                None
            }
            Err(BackendError::Unavailable { reason }) => {
                panic!("CI must run the wgpu backend (lavapipe): {reason}")
            }
            r => Some(r),
        }
    }

    #[test]
    fn memory_limit_bounds_buffers() {
        let Some(b) = with_limit("1MiB") else { return };
        let mut b = b.expect("a 1 MiB budget");
        assert_eq!(b.info().memory_bytes, Some(1 << 20));
        // Buffers hold their bytes plus 4, rounded up to 16.
        let w = b
            .alloc(&TensorDesc::new(DType::F32, [3 << 16]), Usage::Weight)
            .expect("768 KiB within 1 MiB");
        let held = (3 << 18) + 16;
        let err = b
            .alloc(&TensorDesc::new(DType::F32, [1 << 17]), Usage::KvCache)
            .expect_err("512 KiB more: past 1 MiB");
        assert_eq!(
            err,
            BackendError::OutOfMemory {
                requested: (1 << 19) + 16,
                available: (1 << 20) - held
            }
        );
        b.free(w).unwrap();
        // A program's arena counts too: with the budget full, compiling is refused.
        let table = TensorDesc::new(DType::F32, [4, 16]);
        let t = b.alloc(&table, Usage::Weight).unwrap();
        let out = b
            .alloc(&TensorDesc::new(DType::F32, [1, 16]), Usage::Activation)
            .unwrap();
        let left = (1 << 20) - 272 - 80;
        let fill = b
            .alloc(&TensorDesc::new(DType::F32, [(left - 4) / 4]), Usage::KvCache)
            .expect("the rest of the budget");
        let graph = embed_graph(t, table, out);
        let err = b.compile(&graph).expect_err("no budget left for an arena");
        assert!(
            matches!(err, BackendError::OutOfMemory { available: 0, .. }),
            "{err}"
        );
        b.free(fill).unwrap();
        let p = b.compile(&graph).expect("room for the arena once freed");
        b.release(p).unwrap();
        // wgpu knows no heap size: a limit is taken as written, a malformed one refused.
        let Some(r) = with_limit("16000000TiB") else {
            return;
        };
        let b = r.expect("a large limit is accepted");
        assert_eq!(b.info().memory_bytes, Some(16_000_000u64 << 40));
        let Some(r) = with_limit("lots") else {
            return;
        };
        let err = r.err().expect("a malformed limit");
        assert!(err.to_string().contains("memory_limit"), "{err}");
    }

    #[test]
    fn copy_bandwidth_is_measured() {
        let Some(mut b) = backend() else { return };
        let bw = b.copy_bandwidth().unwrap().expect("a figure");
        // Any real device copies faster than 10 MB/s and slower than 100 TB/s.
        assert!(bw > 1e7 && bw < 1e14, "{bw}");
    }

    /// Outputs are read from their mirror, which the step's own commands fill; a host write to
    /// the buffer after the step wins over it, and the next step's output over that.
    #[test]
    fn outputs_read_the_latest_write_through_their_mirror() {
        let Some(mut b) = backend() else { return };
        let table = TensorDesc::new(DType::F32, [4, 16]);
        let t = b.alloc(&table, Usage::Weight).unwrap();
        let vals: Vec<f32> = (0..64).map(|i| i as f32).collect();
        b.write(t, 0, bytemuck::cast_slice(&vals)).unwrap();
        let out = b
            .alloc(&TensorDesc::new(DType::F32, [1, 16]), Usage::Activation)
            .unwrap();
        let p = b.compile(&embed_graph(t, table.clone(), out)).unwrap();
        assert!(b.buffers.get(out).unwrap().mirror.is_some());
        let step = |b: &mut WgpuBackend, token: u32| {
            let args = tandem_backend_api::StepArgs {
                tokens: &[token],
                positions: &[0],
                slots: &[0],
                select: &[],
            };
            let ticket = b.execute(p, &args).unwrap();
            b.wait(ticket).unwrap();
        };
        let read = |b: &mut WgpuBackend, at: u64, n: usize| {
            let mut bytes = vec![0u8; n];
            b.read(out, at, &mut bytes).unwrap();
            bytes
        };
        let row = |r: usize| -> Vec<u8> { bytemuck::cast_slice(&vals[16 * r..16 * r + 16]).to_vec() };
        step(&mut b, 2);
        assert!(b.buffers.get(out).unwrap().mirrored.is_some());
        assert_eq!(read(&mut b, 0, 64), row(2));
        // Unaligned, from the mirror.
        assert_eq!(read(&mut b, 5, 7), row(2)[5..12].to_vec());
        b.write(out, 8, &[7; 8]).unwrap();
        let mut want = row(2);
        want[8..16].copy_from_slice(&[7; 8]);
        assert_eq!(read(&mut b, 0, 64), want);
        step(&mut b, 3);
        assert_eq!(read(&mut b, 0, 64), row(3));
        b.release(p).unwrap();
        // The mirror goes with its buffer, and its bytes from the count.
        let before = b.in_use;
        b.free(out).unwrap();
        assert_eq!(before - b.in_use, 2 * b_size(64));
    }

    /// One row's embedding from `table` (buffer `t`) to the output buffer `out`.
    fn embed_graph(t: BufferId, table: TensorDesc, out: BufferId) -> tandem_backend_api::Graph {
        let mut g = tandem_backend_api::GraphBuilder::new("embed", 1, 0);
        let e = g.push1(Op::Embed {
            table: tandem_backend_api::WeightRef {
                buffer: t,
                desc: table,
            },
            scale: 1.0,
            extra: None,
        });
        g.push(Op::Output { x: e, buffer: out });
        g.finish()
    }

    /// A buffer's size for `len` bytes (`alloc`'s rounding).
    fn b_size(len: u64) -> u64 {
        (len + 4).div_ceil(16) * 16
    }

    #[test]
    fn unaligned_writes_and_reads_keep_the_bytes_around_them() {
        let Some(mut b) = backend() else { return };
        let id = b
            .alloc(&TensorDesc::new(DType::Q4_0, [3, 32]), Usage::Weight)
            .unwrap();
        let all: Vec<u8> = (0..54u8).collect();
        b.write(id, 0, &all).unwrap();
        b.write(id, 5, &[200, 201, 202]).unwrap();
        let mut back = vec![0u8; 54];
        b.read(id, 0, &mut back).unwrap();
        let mut want = all.clone();
        want[5..8].copy_from_slice(&[200, 201, 202]);
        assert_eq!(back, want);
        let mut mid = [0u8; 3];
        b.read(id, 6, &mut mid).unwrap();
        assert_eq!(mid, [201, 202, 8]);
        let e = b.read(id, 53, &mut [0u8; 2]).unwrap_err().to_string();
        assert!(e.contains("run past its 54 bytes"), "{e}");
    }
}
