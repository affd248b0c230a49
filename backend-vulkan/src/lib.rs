//! tandem's Vulkan backend, on ash: every op of the op set as a GLSL compute kernel (compiled to
//! SPIR-V at build time, `shaders/vulkan/`), weights resident in device memory, and one
//! pre-recorded command buffer per program that `execute` resubmits after writing the step's
//! arguments.
//!
//! The crate reads top to bottom as: `device` (loader, device choice, features, validation,
//! queue and timeline), `memory` (buffers through gpu-allocator), `pipelines` (SPIR-V to
//! pipelines, cached; `pipeline_cache` and `cache_file`: the `VkPipelineCache` kept on disk), `program` (planning and recording), and here the trait.
//!
//! Kernels reach every buffer through its device address (`GL_EXT_buffer_reference`), passed in
//! push constants; there are no descriptor sets, and no tensor is limited by
//! `maxStorageBufferRange`.
//!
//! Options (`[backend.vulkan]` in the config, or the environment): `device` /
//! `TANDEM_VULKAN_DEVICE` (an index or a name substring), `validation` /
//! `TANDEM_VULKAN_VALIDATION=1` (the Khronos validation layer; any warning or error it reports
//! fails every later call), `profile` / `TANDEM_VULKAN_PROFILE=1` (timestamps after every node
//! for `profile`, which serialise the program: off by default), `fuse` / `TANDEM_VULKAN_FUSE`
//! (on by default: nodes fused into one kernel where `program::fuse` finds a pattern),
//! `coopmat` / `TANDEM_VULKAN_COOPMAT` (the cooperative-matrix prefill kernels, on by default),
//! `coopmat2` / `TANDEM_VULKAN_COOPMAT2` (of those, the workgroup-scope NV cooperative-matrix-2
//! matmul where the device has it, on by default), `int_dot` / `TANDEM_VULKAN_INT_DOT` (decode's
//! integer-dot-product kernels: by default where the device's packed 8-bit dot product is
//! accelerated, `true` wherever it has one, `false` never), `precision` /
//! `TANDEM_VULKAN_PRECISION` (`exact`, the default: those kernels take their input at 16 bits;
//! `fast`: at 8, as ggml's q8_1, docs/precision.md; `info().features` says `precision=exact|fast`,
//! `exact` where the integer kernels do not run), `memory_limit` (the most device-local memory
//! the backend may hold, `8GiB`: at most the device-local heap, which is the budget without it;
//! `info().memory_bytes` reports the budget, and buffers and program arenas past it are
//! `OutOfMemory`), `pipeline_cache` / `TANDEM_PIPELINE_CACHE` (the `VkPipelineCache` on disk,
//! on by default: `false` turns it off, `log` says on stderr what it read, built and wrote;
//! `info().features` says `pipeline_cache=cold|warm|off`, and once pipelines were built
//! `pipelines=N`, `pipeline_cache_hits=M` where the device reports creation feedback, and
//! `pipelines_ms=T`; see `pipeline_cache` and `cache_file`).
//!
//! Device-side boundaries (`tandem_backend_api::boundary`): `import_host` makes the caller's
//! host memory a buffer where the device has `VK_EXT_external_memory_host` (feature
//! `external_memory_host`), and `export_timeline` / `import_timeline` / `execute_after` let one
//! Vulkan device's queue wait on another's timeline on the device where it has
//! `VK_KHR_external_semaphore_fd` with exportable timelines (feature `timeline_export`).

mod cache_file;
mod device;
mod memory;
mod pipeline_cache;
mod pipelines;
mod program;

use ash::vk;
use tandem_backend_api::kit::{check_ticket, Buffers, Programs, StepShape};
use tandem_backend_api::{
    BackendError, BackendInfo, BackendOptions, BackendPlugin, BufferId, ComputeBackend, MemoryUse, NodeTime,
    Op, ProgramId, SharedTimeline, StepArgs, Support, TensorDesc, Ticket, TimelineId, Usage, MEMORY_LIMIT,
};

use tandem_gpu_kit::options::{flag, setting, tristate};
use tandem_gpu_kit::{op_support, Coverage};

use device::{DeviceRequest, Gpu};
use memory::{GpuBuffer, Memory, Place};
use pipelines::Pipelines;
use program::Program;

/// Bytes of the staging buffer through which the host writes and reads device-local memory.
const STAGING_BYTES: u64 = 32 << 20;

/// Reads of host buffers from this size on are copied by several threads (a batched step's
/// logits: 32 rows of a 262,144-token vocabulary are 33.5 MB, which one thread copies out of
/// mapped memory at about a third of what four do).
const PARALLEL_COPY_BYTES: usize = 4 << 20;

/// Copies `src` into `out` (same length), by up to 8 threads when it is large
/// (`TANDEM_VULKAN_COPY_THREADS=n` sets how many, for tuning runs).
fn copy_out(out: &mut [u8], src: &[u8]) {
    // Decided once: `available_parallelism` reads the cgroup files on Linux.
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let threads = *THREADS.get_or_init(|| {
        std::env::var("TANDEM_VULKAN_COPY_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(8))
    });
    if out.len() < PARALLEL_COPY_BYTES || threads < 2 {
        out.copy_from_slice(src);
        return;
    }
    // Pieces of whole 4 KiB pages.
    let piece = out.len().div_ceil(threads).next_multiple_of(4096);
    std::thread::scope(|s| {
        for (o, i) in out.chunks_mut(piece).zip(src.chunks(piece)) {
            s.spawn(move || o.copy_from_slice(i));
        }
    });
}

/// Environment variable naming the device.
pub const DEVICE_VAR: &str = "TANDEM_VULKAN_DEVICE";

/// The variable standing in for the backend option `wait_spin_us` (microseconds a wait for the
/// device polls before it blocks).
pub const WAIT_SPIN_VAR: &str = "TANDEM_VULKAN_WAIT_SPIN_US";

/// The environment variable behind option `precision` (`exact` or `fast`).
pub const PRECISION_VAR: &str = "TANDEM_VULKAN_PRECISION";

/// `wait_spin_us`'s default on a hardware device: longer than a decode step of the models the
/// backend runs at batch 1, so such a step's wait never blocks.
const DEFAULT_WAIT_SPIN: std::time::Duration = std::time::Duration::from_millis(3);
/// Environment variable enabling the validation layer.
pub const VALIDATION_VAR: &str = "TANDEM_VULKAN_VALIDATION";

/// A buffer of the trait.
struct Buffer {
    desc: TensorDesc,
    mem: GpuBuffer,
    len: u64,
    /// Timeline value of the last submission that uses it.
    last_use: u64,
}

/// The Vulkan backend.
pub struct VulkanBackend {
    gpu: Gpu,
    memory: Memory,
    pipelines: Pipelines,
    staging: Option<GpuBuffer>,
    transfer_cb: vk::CommandBuffer,
    buffers: Buffers<Buffer>,
    programs: Programs<Program>,
    /// Timestamps after every node, for `profile` (option `profile`).
    profile: bool,
    /// Fuse nodes into one kernel where `program::fuse` finds a pattern (option `fuse`).
    fuse: bool,
    /// Option `prepare` / `TANDEM_VULKAN_PREPARE` (off by default; `engine serve` turns it on):
    /// a compile creates, together on several threads, every kernel variant its matmuls may
    /// take at any row count up to its own, instead of only those it uses.
    prepare: bool,
    /// Whether the program being built took a stand-in for a kernel still being compiled
    /// behind (set by the matmul lowering, read by `build_program`).
    stand_in: std::cell::Cell<bool>,
    /// The matmul weight shapes (n, k, format) and the row count up to which their kernel
    /// variants were created up front.
    prepared: Vec<((usize, usize, tandem_backend_api::DType), usize)>,
    /// Option `precision = "fast"`: the integer-dot decode kernels take their input at 8 bits
    /// (docs/precision.md); `false` (`"exact"`, the default) keeps 16.
    narrow: bool,
    /// Option `precision = "fast"`: the cooperative-matrix-2 kernels accumulate in f16
    /// (docs/precision.md); `false` (`"exact"`) in f32.
    f16_acc: bool,
}

/// What the Vulkan kernels cover, for the shared op support rule
/// ([`tandem_gpu_kit::op_support`]): the weight formats with a `matmul_<fmt>` kernel, up to 4
/// output splits, heads up to 512; top-k of any k, f16 caches of any width.
pub(crate) const COVERAGE: Coverage = Coverage {
    kernels: "Vulkan",
    weight_format: program::weight_format_supported,
    max_splits: 4,
    max_head_dim: 512,
    top_k_max: None,
    f16_kv_pairs: false,
    image_rows: true,
    vision_ops: true,
};

impl BackendPlugin for VulkanBackend {
    const NAME: &'static str = "vulkan";

    fn create(options: &BackendOptions) -> Result<Self, BackendError> {
        let device = setting(options, "device", DEVICE_VAR).filter(|s| !s.is_empty());
        let validation = flag(options, "validation", VALIDATION_VAR, false);
        // `coopmat = false` / TANDEM_VULKAN_COOPMAT=0: the tiled f32 prefill kernel even where
        // the device has cooperative matrices (side-by-side measurement).
        let coopmat = flag(options, "coopmat", "TANDEM_VULKAN_COOPMAT", true);
        // `coopmat2 = false` / TANDEM_VULKAN_COOPMAT2=0: the subgroup-scope cooperative-matrix
        // kernel even where the device has VK_NV_cooperative_matrix2.
        let coopmat2 = flag(options, "coopmat2", "TANDEM_VULKAN_COOPMAT2", true);
        // `profile` / TANDEM_VULKAN_PROFILE=1: per-node timestamps (and a barrier after every
        // node) for `profile`; off by default, as they cost speed.
        let profile = flag(options, "profile", "TANDEM_VULKAN_PROFILE", false);
        // `fuse = false` / TANDEM_VULKAN_FUSE=0: every node its own kernel (side-by-side
        // measurement and tests of the fused kernels).
        let fuse = flag(options, "fuse", "TANDEM_VULKAN_FUSE", true);
        let prepare = flag(options, "prepare", "TANDEM_VULKAN_PREPARE", false);
        // `int_dot = false` / TANDEM_VULKAN_INT_DOT=0: the f32 matrix-vector kernels even where
        // the device has accelerated integer dot products; `true` / 1: the integer kernels
        // wherever the device has the feature (lavapipe's are not accelerated; the tests force
        // them there).
        let int_dot = tristate(options, "int_dot", "TANDEM_VULKAN_INT_DOT");
        // `pipeline_cache = false` / TANDEM_PIPELINE_CACHE=0: no pipeline cache on disk; `log`:
        // the cache, with what it did on stderr (`pipeline_cache`).
        let pipeline_cache =
            cache_file::Mode::parse(setting(options, cache_file::OPTION, cache_file::VAR).as_deref());
        let fast = tandem_gpu_kit::options::fast_precision(options, PRECISION_VAR)?;
        let mut gpu = Gpu::open(&DeviceRequest {
            device,
            validation,
            coopmat,
            coopmat2,
            int_dot,
        })?;
        // `wait_spin_us` / TANDEM_VULKAN_WAIT_SPIN_US: how long a wait for the device polls its
        // timeline before blocking. A thread blocked in vkWaitSemaphores woke late after the
        // short submissions of decode (H200, 1B q4_k batch 1: 414.6 tok/s blocking at once,
        // 437.7 polling up to 3 ms; bench/results/2026-11-28-split-decode). Zero on a software
        // device (lavapipe), whose own threads need the cores a poll would take.
        gpu.wait_spin = match setting(options, "wait_spin_us", WAIT_SPIN_VAR) {
            Some(v) => std::time::Duration::from_micros(v.trim().parse::<u64>().map_err(|_| {
                BackendError::invalid(format!(
                    "backend option 'wait_spin_us' must be a whole number of microseconds, not '{v}'"
                ))
            })?),
            None if gpu.kind == tandem_backend_api::DeviceKind::SoftwareGpu => std::time::Duration::ZERO,
            None => DEFAULT_WAIT_SPIN,
        };
        // The device-local heap, or the smaller `memory_limit` (an error when it is larger).
        let budget = options.memory_budget(gpu.memory_bytes)?;
        if options.get(MEMORY_LIMIT).is_some() {
            gpu.features.push(format!("memory_limit={budget}"));
        }
        // `fast` changes the integer-dot kernels' input and the cooperative-matrix-2 kernels'
        // accumulators: where neither kind runs, the arithmetic is `exact` whatever was asked,
        // and the feature says so. (The KHR path's prefill kernels keep f32 accumulators:
        // H200, 4B prefill 512, f16 ones were no faster there, 30.5 ms of q4_k products a step
        // against 29.5, f16 weights 30.3 against 30.4.)
        let narrow = fast && gpu.int_dot;
        let f16_acc = fast && gpu.coopmat2;
        gpu.features.push(format!(
            "precision={}",
            if narrow || f16_acc { "fast" } else { "exact" }
        ));
        let memory = Memory::new(&gpu, budget)?;
        let pipelines = Pipelines::new(&gpu, pipeline_cache)?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(gpu.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is ours.
        let transfer_cb = device::map("vkAllocateCommandBuffers", &gpu.name, unsafe {
            gpu.device.allocate_command_buffers(&alloc)
        })?[0];
        let mut b = VulkanBackend {
            gpu,
            memory,
            pipelines,
            staging: None,
            transfer_cb,
            buffers: Buffers::new(),
            programs: Programs::new(),
            profile,
            fuse,
            prepare,
            stand_in: std::cell::Cell::new(false),
            prepared: Vec::new(),
            narrow,
            f16_acc,
        };
        let staging = b.memory.create(&b.gpu, STAGING_BYTES, Place::Host, "staging")?;
        b.staging = Some(staging);
        b.validation()?;
        Ok(b)
    }
}

tandem_backend_api::export_backend!(VulkanBackend);

impl VulkanBackend {
    /// What this device offers a matmul, as the kernel choice takes it (cooperative matrix 2
    /// as the device has it; a node may not suit it).
    pub(crate) fn unit(&self) -> program::matmul::Unit {
        program::matmul::Unit {
            coopmat: self.gpu.coopmat,
            cm2: self.gpu.coopmat2,
            int_dot: self.gpu.int_dot,
            narrow: self.narrow,
            f16_acc: self.f16_acc,
        }
    }

    /// Fails once the validation layer has said anything.
    fn validation(&self) -> Result<(), BackendError> {
        match self.gpu.validation_error() {
            Some(m) => Err(BackendError::internal(format!("Vulkan validation: {m}"))),
            None => Ok(()),
        }
    }

    fn range(buf: &Buffer, id: BufferId, offset: u64, len: usize) -> Result<(), BackendError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= buf.len => Ok(()),
            _ => Err(BackendError::invalid(format!(
                "buffer {} ({}): {len} bytes at offset {offset} run past its {} bytes",
                id.0, buf.desc, buf.len
            ))),
        }
    }

    /// Records `f` into the transfer command buffer, submits it and waits for it.
    fn transfer(&mut self, f: impl FnOnce(&ash::Device, vk::CommandBuffer)) -> Result<(), BackendError> {
        let dev = &self.gpu.device;
        let cb = self.transfer_cb;
        let all = vk::PipelineStageFlags::ALL_COMMANDS;
        let mb = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)];
        let to_host = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ)];
        // SAFETY: the transfer command buffer is ours and not pending (every transfer waits for
        // its submission before returning); the barriers order it after earlier submissions.
        let recorded = unsafe {
            dev.reset_command_buffer(cb, vk::CommandBufferResetFlags::empty())
                .and_then(|_| {
                    dev.begin_command_buffer(
                        cb,
                        &vk::CommandBufferBeginInfo::default()
                            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                    )
                })
                .map(|_| {
                    dev.cmd_pipeline_barrier(
                        cb,
                        all | vk::PipelineStageFlags::HOST,
                        all,
                        vk::DependencyFlags::empty(),
                        &mb,
                        &[],
                        &[],
                    );
                    f(dev, cb);
                    dev.cmd_pipeline_barrier(
                        cb,
                        vk::PipelineStageFlags::TRANSFER,
                        vk::PipelineStageFlags::HOST,
                        vk::DependencyFlags::empty(),
                        &to_host,
                        &[],
                        &[],
                    );
                })
                .and_then(|_| dev.end_command_buffer(cb))
        };
        device::check("recording a transfer", &self.gpu.name, recorded)?;
        let v = self.gpu.submit(cb, &[])?;
        self.gpu.wait_for(v)
    }

    /// Runs `program` on `args` (see `execute`), the device starting only once every timeline
    /// semaphore of `waits` has reached its value.
    /// Builds program `id` again from its graph (kept because it took stand-in kernels), now
    /// that the kernels it waited for are made; where that fails, it keeps its stand-ins.
    fn rebuild(&mut self, id: ProgramId) -> Result<(), BackendError> {
        let c = self.programs.get_mut(id)?;
        let Some(graph) = c.program.stand_in.take() else {
            return Ok(());
        };
        let last = c.program.last_submit;
        let before = self.pipelines.cache.counts;
        let built = self.build_program(&graph);
        self.pipelines
            .cache
            .compiled(&self.gpu, &format!("'{}' again", graph.name), before);
        if let Ok((new, _)) = built {
            self.gpu.wait_for(last)?;
            let old = std::mem::replace(&mut self.programs.get_mut(id)?.program, new);
            self.destroy_program(old);
        }
        Ok(())
    }

    fn submit_program(
        &mut self,
        program: ProgramId,
        args: &StepArgs<'_>,
        waits: &[(vk::Semaphore, u64)],
    ) -> Result<Ticket, BackendError> {
        self.validation()?;
        // A program built with stand-ins for kernels compiled behind is built again once they
        // are all made.
        if self.programs.get(program)?.program.stand_in.is_some() && !self.pipelines.deferring() {
            self.rebuild(program)?;
        }
        let c = self.programs.for_step(program, args)?;
        // The previous submission may still read the argument buffer.
        self.gpu.wait_for(c.program.last_submit)?;
        let prog = &mut c.program;
        let l = prog.layout;
        let m = prog
            .args
            .mapped()
            .ok_or_else(|| BackendError::internal("argument buffer not mapped"))?;
        for (at, vals) in [
            (l.tokens, args.tokens),
            (l.positions, args.positions),
            (l.slots, args.slots),
            (l.select, args.select),
        ] {
            let bytes: &[u8] = bytemuck::cast_slice(vals);
            m[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
        }
        // Image-aware attentions' per-row ends, beside the positions.
        for &(from, at) in &prog.ends {
            tandem_backend_api::kit::step::visible_ends(args, Some(from), &mut prog.ends_scratch);
            let bytes: &[u8] = bytemuck::cast_slice(&prog.ends_scratch);
            m[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
        }
        let value = self.gpu.submit(prog.cmd, waits)?;
        prog.last_submit = value;
        for id in c.buffers() {
            if let Ok(b) = self.buffers.get_mut(*id) {
                b.last_use = value;
            }
        }
        Ok(Ticket(value))
    }

    /// Waits for the submissions using buffer `id`.
    fn wait_buffer(&self, id: BufferId) -> Result<(), BackendError> {
        let b = self.buffers.get(id)?;
        self.gpu.wait_for(b.last_use)
    }

    /// Measures a device-to-device copy of `bytes`, in seconds (best of a few).
    fn time_copy(&mut self, bytes: u64) -> Result<Option<f64>, BackendError> {
        let Some(period) = self.gpu.timestamp_period else {
            return Ok(None);
        };
        let a = self
            .memory
            .create(&self.gpu, bytes, Place::Device, "bandwidth source")?;
        let b = match self
            .memory
            .create(&self.gpu, bytes, Place::Device, "bandwidth destination")
        {
            Ok(b) => b,
            Err(e) => {
                self.memory.destroy(&self.gpu, a);
                return Err(e);
            }
        };
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(2);
        // SAFETY: a valid create info on our device.
        let pool = unsafe { self.gpu.device.create_query_pool(&info, None) };
        let pool = match pool {
            Ok(p) => p,
            Err(e) => {
                self.memory.destroy(&self.gpu, a);
                self.memory.destroy(&self.gpu, b);
                return device::map("vkCreateQueryPool", &self.gpu.name, Err(e));
            }
        };
        let mut best = f64::INFINITY;
        let mut result = self.pipelines.get(&self.gpu, "copy", [0, 0]).map(|_| ());
        let pipeline = self.pipelines.get(&self.gpu, "copy", [0, 0]).unwrap_or_default();
        let layout = self.pipelines.layout;
        // The copy kernel (vec4 loads and stores), as the model's kernels read memory.
        let vec4s = (a.size / 16) as u32;
        let groups = vec4s.div_ceil(256);
        let (gx, gy) = (
            groups.clamp(1, 32768),
            groups.div_ceil(groups.clamp(1, 32768)).max(1),
        );
        let mut push = Vec::with_capacity(20);
        push.extend_from_slice(&a.address.to_le_bytes());
        push.extend_from_slice(&b.address.to_le_bytes());
        push.extend_from_slice(&vec4s.to_le_bytes());
        for _ in 0..5 {
            if result.is_err() {
                break;
            }
            result = self.transfer(|dev, cb| {
                // SAFETY: recording into the transfer command buffer; both buffers, the pipeline
                // and the pool live until after the wait below; the push constants fit the
                // layout's range.
                unsafe {
                    dev.cmd_reset_query_pool(cb, pool, 0, 2);
                    dev.cmd_write_timestamp(cb, vk::PipelineStageFlags::TOP_OF_PIPE, pool, 0);
                    dev.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, pipeline);
                    dev.cmd_push_constants(cb, layout, vk::ShaderStageFlags::COMPUTE, 0, &push);
                    dev.cmd_dispatch(cb, gx, gy, 1);
                    dev.cmd_write_timestamp(cb, vk::PipelineStageFlags::BOTTOM_OF_PIPE, pool, 1);
                }
            });
            if result.is_err() {
                break;
            }
            let mut ts = [0u64; 2];
            // SAFETY: the submission writing both queries has finished.
            let got = unsafe {
                self.gpu
                    .device
                    .get_query_pool_results(pool, 0, &mut ts, vk::QueryResultFlags::TYPE_64)
            };
            if got.is_ok() && ts[1] > ts[0] {
                best = best.min((ts[1] - ts[0]) as f64 * period * 1e-9);
            }
        }
        // SAFETY: the transfers finished (each waited).
        unsafe { self.gpu.device.destroy_query_pool(pool, None) };
        self.memory.destroy(&self.gpu, a);
        self.memory.destroy(&self.gpu, b);
        result?;
        Ok(best.is_finite().then_some(best))
    }
}

impl ComputeBackend for VulkanBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: Self::NAME.to_string(),
            device: self.gpu.name.clone(),
            kind: self.gpu.kind,
            memory_bytes: Some(self.memory.budget),
            features: self
                .gpu
                .features
                .iter()
                .cloned()
                .chain(self.pipelines.cache.features())
                .collect(),
            physical_device: Some(self.gpu.physical_device.clone()),
            decode_rows: Some(tandem_gpu_kit::matmul::DECODE_ROWS - 1),
        }
    }

    fn supports(&self, op: &Op) -> Support {
        match op_support(op, &COVERAGE) {
            Ok(()) => Support::Yes,
            Err(reason) => Support::No { reason },
        }
    }

    fn alloc(&mut self, desc: &TensorDesc, usage: Usage) -> Result<BufferId, BackendError> {
        self.validation()?;
        let len = desc.byte_size()?;
        let place = match usage {
            Usage::Weight | Usage::KvCache => Place::Device,
            // Read by the kernels over the bus (HOST_WEIGHTS_FEATURE), outside the budget.
            Usage::Activation | Usage::HostWeight => Place::Host,
        };
        // Device memory past what the budget has left, or host memory past the heap, is refused
        // before Vulkan is asked.
        let (bound, available) = match place {
            Place::Device => (self.memory.budget, self.memory.device_available()),
            Place::Host => {
                let heap = self.gpu.host_memory_bytes;
                let host_in_use = self.memory.in_use.saturating_sub(self.memory.device_in_use);
                (heap, heap.saturating_sub(host_in_use))
            }
        };
        if len > bound || (place == Place::Device && len > available) {
            return Err(BackendError::OutOfMemory {
                requested: len,
                available,
            });
        }
        let name = format!("{usage:?} {desc}");
        let mem = self
            .memory
            .create(&self.gpu, len, place, &name)
            .map_err(|e| match e {
                BackendError::OutOfMemory { .. } => BackendError::OutOfMemory {
                    requested: len,
                    available,
                },
                e => e,
            })?;
        if place == Place::Device {
            let buf = mem.buffer;
            let filled = self.transfer(|dev, cb| {
                // SAFETY: recording into the transfer command buffer; the buffer is ours.
                unsafe { dev.cmd_fill_buffer(cb, buf, 0, vk::WHOLE_SIZE, 0) };
            });
            if let Err(e) = filled {
                self.memory.destroy(&self.gpu, mem);
                return Err(e);
            }
        }
        let id = self.buffers.insert(Buffer {
            desc: desc.clone(),
            mem,
            len,
            last_use: 0,
        });
        self.validation()?;
        Ok(id)
    }

    fn write(&mut self, buffer: BufferId, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        self.validation()?;
        let b = self.buffers.get(buffer)?;
        Self::range(b, buffer, offset, data.len())?;
        self.wait_buffer(buffer)?;
        let b = self.buffers.get_mut(buffer)?;
        if b.mem.place == Place::Host {
            let m = b
                .mem
                .mapped()
                .ok_or_else(|| BackendError::internal("host buffer not mapped"))?;
            m[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            return Ok(());
        }
        let dst = b.mem.buffer;
        let mut done = 0usize;
        while done < data.len() {
            let n = (data.len() - done).min(STAGING_BYTES as usize);
            let staging = self
                .staging
                .as_mut()
                .ok_or_else(|| BackendError::internal("no staging buffer"))?;
            let m = staging
                .mapped()
                .ok_or_else(|| BackendError::internal("staging not mapped"))?;
            m[..n].copy_from_slice(&data[done..done + n]);
            let src = staging.buffer;
            let at = offset + done as u64;
            self.transfer(|dev, cb| {
                let region = vk::BufferCopy::default()
                    .src_offset(0)
                    .dst_offset(at)
                    .size(n as u64);
                // SAFETY: recording into the transfer command buffer; both buffers are ours and
                // the region lies within them (checked above).
                unsafe { dev.cmd_copy_buffer(cb, src, dst, &[region]) };
            })?;
            done += n;
        }
        self.validation()
    }

    fn read(&mut self, buffer: BufferId, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.validation()?;
        let b = self.buffers.get(buffer)?;
        Self::range(b, buffer, offset, out.len())?;
        self.wait_buffer(buffer)?;
        let b = self.buffers.get_mut(buffer)?;
        if b.mem.place == Place::Host {
            let m = b
                .mem
                .mapped()
                .ok_or_else(|| BackendError::internal("host buffer not mapped"))?;
            copy_out(out, &m[offset as usize..offset as usize + out.len()]);
            return Ok(());
        }
        let src = b.mem.buffer;
        let mut done = 0usize;
        while done < out.len() {
            let n = (out.len() - done).min(STAGING_BYTES as usize);
            let dst = self
                .staging
                .as_ref()
                .ok_or_else(|| BackendError::internal("no staging buffer"))?
                .buffer;
            let at = offset + done as u64;
            self.transfer(|dev, cb| {
                let region = vk::BufferCopy::default()
                    .src_offset(at)
                    .dst_offset(0)
                    .size(n as u64);
                // SAFETY: as in `write`.
                unsafe { dev.cmd_copy_buffer(cb, src, dst, &[region]) };
            })?;
            let staging = self
                .staging
                .as_mut()
                .ok_or_else(|| BackendError::internal("no staging buffer"))?;
            let m = staging
                .mapped()
                .ok_or_else(|| BackendError::internal("staging not mapped"))?;
            copy_out(&mut out[done..done + n], &m[..n]);
            done += n;
        }
        self.validation()
    }

    fn free(&mut self, buffer: BufferId) -> Result<(), BackendError> {
        self.validation()?;
        self.programs.check_unused(buffer)?;
        self.wait_buffer(buffer)?;
        let b = self.buffers.free(buffer, &self.programs)?;
        self.memory.destroy(&self.gpu, b.mem);
        Ok(())
    }

    fn compile(&mut self, graph: &tandem_backend_api::Graph) -> Result<ProgramId, BackendError> {
        self.validation()?;
        let before = self.pipelines.cache.counts;
        // Every kernel variant the matmuls of this model may take at any step size up to this
        // graph's rows, created together on several threads the first time a weight shape is met
        // at that size (later, smaller step shapes then find their pipelines made; `engine
        // serve` warms its largest step first), where option `prepare` asks; on a real GPU
        // only: a software rasteriser (lavapipe, the tests' device) compiles each pipeline
        // quickly and would build variants no test runs, unless `TANDEM_VULKAN_PREPARE=1`.
        let software = self.gpu.kind == tandem_backend_api::DeviceKind::SoftwareGpu
            && std::env::var("TANDEM_VULKAN_PREPARE").as_deref() != Ok("1");
        let ahead = self.prepare && !software;
        let fresh: Vec<_> = graph
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                tandem_backend_api::Op::MatMul { weight, .. } => match weight.desc.shape[..] {
                    [n, k] => Some((n, k, weight.desc.dtype)),
                    _ => None,
                },
                _ => None,
            })
            .filter(|s| ahead && !self.prepared.iter().any(|(p, r)| p == s && *r >= graph.rows))
            .collect();
        let built = if fresh.is_empty() {
            Ok(())
        } else {
            let unit = self.unit();
            let keys = program::matmul::variants(graph, unit, graph.rows);
            self.prepared.retain(|(p, _)| !fresh.contains(p));
            self.prepared.extend(fresh.into_iter().map(|s| (s, graph.rows)));
            // The cooperative-matrix-2 matmuls take the NVIDIA driver seconds each (17 s for
            // q4_k's 128 x 128 tiles on an H200): compiled behind, the programs meanwhile
            // taking the KHR kernels (a fifth of a second each); the rest made now.
            // With the cache seeded from its file they come from it in milliseconds: all now.
            let warm = self.pipelines.cache.warm();
            let (slow, fast): (Vec<_>, Vec<_>) = keys
                .into_iter()
                .partition(|(k, _)| !warm && k.starts_with("matmul_cm2"));
            self.pipelines
                .prepare(&self.gpu, &fast)
                .and_then(|()| self.pipelines.defer(&self.gpu, &slow))
        };
        let built = built.and_then(|()| self.build_program(graph));
        // The pipelines this compile built go to disk now (a server stopped by a signal keeps
        // them), even where the compile failed after building some.
        let what = format!("'{}'", graph.name);
        self.pipelines.cache.compiled(&self.gpu, &what, before);
        let (prog, buffers) = built?;
        let id = self.programs.insert(prog, buffers, StepShape::of(graph));
        self.validation()?;
        Ok(id)
    }

    fn execute(&mut self, program: ProgramId, args: &StepArgs<'_>) -> Result<Ticket, BackendError> {
        self.submit_program(program, args, &[])
    }

    fn wait(&mut self, ticket: Ticket) -> Result<(), BackendError> {
        check_ticket(ticket, self.gpu.submitted)?;
        self.gpu.wait_for(ticket.0)?;
        self.validation()
    }

    fn release(&mut self, program: ProgramId) -> Result<(), BackendError> {
        let last = self.programs.get(program)?.program.last_submit;
        self.gpu.wait_for(last)?;
        let p = self.programs.release(program)?;
        self.destroy_program(p);
        self.validation()
    }

    fn profile(&mut self, program: ProgramId) -> Result<Vec<NodeTime>, BackendError> {
        self.validation()?;
        let prog = &self.programs.get(program)?.program;
        let (Some(pool), Some(period)) = (prog.queries, self.gpu.timestamp_period) else {
            return Ok(Vec::new());
        };
        if prog.last_submit == 0 || self.gpu.completed()? < prog.last_submit {
            return Ok(Vec::new());
        }
        let n = prog.order.len();
        let mut ts = vec![0u64; n + 1];
        // SAFETY: the program's last submission, which wrote every query, has finished.
        let got = unsafe {
            self.gpu
                .device
                .get_query_pool_results(pool, 0, &mut ts, vk::QueryResultFlags::TYPE_64)
        };
        device::check("vkGetQueryPoolResults", &self.gpu.name, got)?;
        // Query k + 1 follows node order[k] (fused groups run out of graph order).
        let mut times: Vec<NodeTime> = prog
            .order
            .iter()
            .zip(ts.windows(2))
            .map(|((node, op), t)| NodeTime {
                node: *node,
                op: op.clone(),
                seconds: t[1].saturating_sub(t[0]) as f64 * period * 1e-9,
            })
            .collect();
        times.sort_by_key(|t| t.node);
        Ok(times)
    }

    fn memory(&mut self) -> Result<Option<MemoryUse>, BackendError> {
        Ok(Some(MemoryUse {
            in_use_bytes: self.memory.in_use,
            peak_bytes: self.memory.peak,
        }))
    }

    fn copy_bandwidth(&mut self) -> Result<Option<f64>, BackendError> {
        self.validation()?;
        // Two buffers within what the budget has left (an error where not even 2 MiB is).
        let budget = self.memory.budget;
        let bytes = (256u64 << 20)
            .min(budget / 16)
            .min(self.memory.device_available() / 2)
            .max(1 << 20)
            / 16
            * 16;
        Ok(self.time_copy(bytes)?.map(|s| 2.0 * bytes as f64 / s))
    }

    /// Imports the host region as a buffer through `VK_EXT_external_memory_host`: the buffer's
    /// memory is the region itself (host-visible, ideally coherent), so programs, `read` and
    /// `write` use it in place, and programs end with a barrier to host reads that makes their
    /// writes visible there. `Unsupported` where the device lacks the extension;
    /// `InvalidArgument` for a null, misaligned (to the device's
    /// `minImportedHostPointerAlignment`) or too short region.
    unsafe fn import_host(
        &mut self,
        ptr: *mut u8,
        len: usize,
        desc: &TensorDesc,
    ) -> Result<BufferId, BackendError> {
        self.validation()?;
        let Some(align) = self.gpu.host_import.as_ref().map(|h| h.alignment) else {
            return Err(BackendError::unsupported(
                "import_host",
                format!("{} lacks VK_EXT_external_memory_host", self.gpu.name),
            ));
        };
        let need = desc.byte_size()?;
        if ptr.is_null() {
            return Err(BackendError::invalid("import_host: the pointer is null"));
        }
        let len64 = len as u64;
        if !(ptr as usize as u64).is_multiple_of(align) || !len64.is_multiple_of(align) || len == 0 {
            return Err(BackendError::invalid(format!(
                "import_host: {len} bytes at {ptr:p}: {} imports only regions whose start and \
                 size are non-zero multiples of {align} bytes",
                self.gpu.name
            )));
        }
        if len64 < need {
            return Err(BackendError::invalid(format!(
                "import_host: {len} bytes are too few for {desc} ({need} bytes)"
            )));
        }
        // SAFETY: `ptr` is non-null and, with `len`, aligned as the device asks (checked
        // above); this function's contract makes the caller keep the region valid and untouched
        // through Rust references until the buffer is freed, which destroys it.
        let mem = unsafe { self.memory.import(&self.gpu, ptr, len64) }?;
        let id = self.buffers.insert(Buffer {
            desc: desc.clone(),
            mem,
            len: need,
            last_use: 0,
        });
        self.validation()?;
        Ok(id)
    }

    fn export_timeline(&mut self) -> Result<Option<SharedTimeline>, BackendError> {
        self.validation()?;
        self.gpu.export_timeline()
    }

    fn import_timeline(&mut self, timeline: &SharedTimeline) -> Result<Option<TimelineId>, BackendError> {
        self.validation()?;
        let id = self.gpu.import_timeline(timeline)?;
        self.validation()?;
        Ok(id)
    }

    /// `execute`, with the submission waiting (all commands) on each imported timeline for its
    /// ticket's value, on the device: the host does not wait. An id `import_timeline` did not
    /// return is `InvalidArgument`. A ticket the other backend never submits leaves this queue
    /// waiting: then `wait`, `read`, `write` and `free` of what the program uses, the program's
    /// next `execute`, and dropping the backend block until it does.
    fn execute_after(
        &mut self,
        program: ProgramId,
        args: &StepArgs<'_>,
        waits: &[(TimelineId, Ticket)],
    ) -> Result<Ticket, BackendError> {
        // A fixed array: a step's submission allocates nothing.
        let mut sems = [(vk::Semaphore::null(), 0u64); device::MAX_WAITS];
        if waits.len() > sems.len() {
            return Err(BackendError::invalid(format!(
                "execute_after: at most {} waits, not {}",
                sems.len(),
                waits.len()
            )));
        }
        for (s, (id, t)) in sems.iter_mut().zip(waits) {
            *s = (self.gpu.imported_timeline(*id)?, t.0);
        }
        self.submit_program(program, args, &sems[..waits.len()])
    }
}

impl Drop for VulkanBackend {
    fn drop(&mut self) {
        // SAFETY: waiting for the device before destroying what it may still use.
        unsafe {
            let _ = self.gpu.device.device_wait_idle();
        }
        let programs: Vec<Program> = self.programs.drain().collect();
        for p in programs {
            self.destroy_program(p);
        }
        let buffers: Vec<Buffer> = self.buffers.drain().collect();
        for b in buffers {
            self.memory.destroy(&self.gpu, b.mem);
        }
        if let Some(s) = self.staging.take() {
            self.memory.destroy(&self.gpu, s);
        }
        // SAFETY: the device is idle; the transfer command buffer is not pending.
        unsafe {
            self.gpu
                .device
                .free_command_buffers(self.gpu.pool, &[self.transfer_cb]);
        }
        self.pipelines.destroy(&self.gpu);
        self.memory.shut_down();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_backend_api::DType;

    #[test]
    fn large_copies_split_over_threads_copy_every_byte() {
        // Above the threshold, at a length that is no multiple of the pieces; and below it.
        for len in [PARALLEL_COPY_BYTES + 12_345, 1000] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
            let mut out = vec![0u8; len];
            copy_out(&mut out, &src);
            assert!(out == src, "copy of {len} bytes differs");
        }
    }

    /// The backend on this machine's Vulkan device (lavapipe here) with validation on and
    /// `memory_limit` set; `None` (the test says so) where there is no device, except under CI.
    fn with_limit(limit: &str) -> Option<Result<VulkanBackend, BackendError>> {
        let mut o = BackendOptions::default();
        o.set("validation", "true").set(MEMORY_LIMIT, limit);
        open(&o)
    }

    /// The backend with validation on and no other option, as `with_limit`.
    fn backend() -> Option<VulkanBackend> {
        let mut o = BackendOptions::default();
        o.set("validation", "true");
        open(&o).map(|r| r.expect("the Vulkan backend with validation"))
    }

    /// The backend with `o`; `None` (the test says so) where there is no device, except under CI.
    fn open(o: &BackendOptions) -> Option<Result<VulkanBackend, BackendError>> {
        match VulkanBackend::create(o) {
            Err(BackendError::Unavailable { reason }) if std::env::var_os("CI").is_none() => {
                eprintln!("skipping: no Vulkan device here: {reason}");
                None
            }
            Err(BackendError::Unavailable { reason }) => {
                panic!("CI must run the Vulkan backend (lavapipe): {reason}")
            }
            r => Some(r),
        }
    }

    #[test]
    fn memory_limit_bounds_device_memory() {
        let Some(b) = with_limit("1MiB") else { return };
        let mut b = b.expect("a 1 MiB budget");
        let info = b.info();
        assert_eq!(info.memory_bytes, Some(1 << 20));
        assert!(
            info.features.contains(&"memory_limit=1048576".to_string()),
            "{info:?}"
        );
        let w = b
            .alloc(&TensorDesc::new(DType::F32, [3 << 16]), Usage::Weight)
            .expect("768 KiB within 1 MiB");
        b.write(w, 0, &[1u8; 64]).unwrap();
        let err = b
            .alloc(&TensorDesc::new(DType::F32, [1 << 17]), Usage::KvCache)
            .expect_err("512 KiB more: past 1 MiB");
        assert_eq!(
            err,
            BackendError::OutOfMemory {
                requested: 512 << 10,
                available: 256 << 10
            }
        );
        // Host-visible activations are not device memory: the budget does not bound them.
        let a = b
            .alloc(&TensorDesc::new(DType::F32, [1 << 18]), Usage::Activation)
            .expect("a 1 MiB activation");
        b.free(a).unwrap();
        b.free(w).unwrap();
        // A program's arena is device memory too: with the budget full, compiling is refused.
        let table = TensorDesc::new(DType::F32, [4, 16]);
        let t = b.alloc(&table, Usage::Weight).unwrap();
        let out = b
            .alloc(&TensorDesc::new(DType::F32, [1, 16]), Usage::Activation)
            .unwrap();
        let fill = b
            .alloc(&TensorDesc::new(DType::F32, [(1 << 18) - 64]), Usage::KvCache)
            .expect("the rest of the budget");
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
        let graph = g.finish();
        let err = b.compile(&graph).expect_err("no budget left for an arena");
        assert!(
            matches!(err, BackendError::OutOfMemory { available: 0, .. }),
            "{err}"
        );
        b.free(fill).unwrap();
        let p = b.compile(&graph).expect("room for the arena once freed");
        b.release(p).unwrap();
    }

    #[test]
    fn a_memory_limit_past_the_device_fails_creation() {
        let Some(r) = with_limit("1000TiB") else { return };
        let err = r.err().expect("1000 TiB is more than any device-local heap");
        assert!(
            matches!(err, BackendError::InvalidArgument { .. }) && err.to_string().contains("memory_limit"),
            "{err}"
        );
    }

    /// A zeroed host region of `HOST_IMPORT_ALIGN`-aligned size, read and written through its
    /// raw pointer only (never a Rust reference while a backend has it imported).
    struct Region {
        ptr: *mut u8,
        layout: std::alloc::Layout,
    }

    impl Region {
        fn new(len: usize) -> Region {
            let layout = std::alloc::Layout::from_size_align(len, tandem_backend_api::HOST_IMPORT_ALIGN)
                .expect("a valid layout");
            // SAFETY: the layout has a non-zero size.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            assert!(!ptr.is_null(), "allocating {len} bytes");
            Region { ptr, layout }
        }

        /// The first `n` f32s, copied out through the pointer.
        fn f32s(&self, n: usize) -> Vec<f32> {
            assert!(n * 4 <= self.layout.size());
            let mut out = vec![0f32; n];
            // SAFETY: `n * 4` bytes of the region, copied into a vector of their own; no
            // device work that writes the region is pending when the tests call this.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr as *const f32, out.as_mut_ptr(), n) };
            out
        }

        /// Copies `v` to the start of the region through the pointer.
        fn set_f32s(&self, v: &[f32]) {
            assert!(v.len() * 4 <= self.layout.size());
            // SAFETY: as in `f32s`, the other way.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr as *mut f32, v.len()) };
        }
    }

    impl Drop for Region {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout; every backend that imported it has
            // freed the buffer (or been dropped) by now: tests declare regions before backends.
            unsafe { std::alloc::dealloc(self.ptr, self.layout) };
        }
    }

    fn le_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn from_le(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// `out = x + x` for a `[rows, cols]` f32 `input`: `Input`, `Add`, `Output`.
    fn doubling(input: BufferId, out: BufferId, rows: usize, cols: usize) -> tandem_backend_api::Graph {
        let mut g = tandem_backend_api::GraphBuilder::new("double", rows, 0);
        let x = g.push1(Op::Input {
            buffer: input,
            cols,
            selected: false,
        });
        let y = g.push1(Op::Add { a: x, b: x });
        g.push(Op::Output { x: y, buffer: out });
        g.finish()
    }

    /// Step arguments for a graph of `rows` rows with no embedding or attention.
    fn zeros(rows: usize) -> Vec<u32> {
        vec![0u32; rows]
    }

    fn step(z: &[u32]) -> StepArgs<'_> {
        StepArgs {
            tokens: z,
            positions: z,
            slots: z,
            select: &[],
        }
    }

    #[test]
    fn imported_host_memory_is_a_buffer_in_place() {
        use tandem_backend_api::HOST_IMPORT_ALIGN;
        let (ra, rc) = (Region::new(HOST_IMPORT_ALIGN), Region::new(HOST_IMPORT_ALIGN));
        let Some(mut b) = backend() else { return };
        let desc = TensorDesc::new(DType::F32, [4, 8]);
        if !b.info().features.iter().any(|f| f == "external_memory_host") {
            // SAFETY: the region is valid and aligned; the import is refused anyway.
            let err = unsafe { b.import_host(ra.ptr, HOST_IMPORT_ALIGN, &desc) }.expect_err("no extension");
            assert!(matches!(err, BackendError::Unsupported { .. }), "{err}");
            eprintln!("{} lacks VK_EXT_external_memory_host", b.info().device);
            return;
        }
        let before = b.memory().unwrap().unwrap();
        // SAFETY: both regions are aligned, HOST_IMPORT_ALIGN long, live until after the
        // buffers are freed (or the backend dropped), and touched only through raw pointers.
        let a = unsafe { b.import_host(ra.ptr, HOST_IMPORT_ALIGN, &desc) }.expect("import a");
        // SAFETY: as above.
        let c = unsafe { b.import_host(rc.ptr, HOST_IMPORT_ALIGN, &desc) }.expect("import c");
        let during = b.memory().unwrap().unwrap();
        assert_eq!(
            during.in_use_bytes,
            before.in_use_bytes + 2 * HOST_IMPORT_ALIGN as u64
        );

        // Written through the backend, seen through the pointer.
        let vals: Vec<f32> = (0..32).map(|i| i as f32 * 0.5 - 3.0).collect();
        b.write(a, 0, &le_bytes(&vals)).unwrap();
        assert_eq!(ra.f32s(32), vals);
        // Written through the pointer, read through the backend.
        let other: Vec<f32> = (0..32).map(|i| i as f32 + 1.0).collect();
        ra.set_f32s(&other);
        let mut out = vec![0u8; 128];
        b.read(a, 0, &mut out).unwrap();
        assert_eq!(from_le(&out), other);
        // Out of the tensor's bytes, though inside the region: refused as for any buffer.
        assert!(b.read(a, 64, &mut out).is_err());

        // A program reads one imported buffer and writes the other, in place.
        let p = b.compile(&doubling(a, c, 4, 8)).expect("compile");
        let z = zeros(4);
        let t = b.execute(p, &step(&z)).expect("execute");
        b.wait(t).unwrap();
        let doubled: Vec<f32> = other.iter().map(|v| v * 2.0).collect();
        assert_eq!(rc.f32s(32), doubled);
        b.release(p).unwrap();
        b.free(a).unwrap();
        b.free(c).unwrap();
        assert_eq!(b.memory().unwrap().unwrap().in_use_bytes, before.in_use_bytes);
    }

    #[test]
    fn bad_host_regions_are_refused() {
        use tandem_backend_api::HOST_IMPORT_ALIGN;
        let r = Region::new(2 * HOST_IMPORT_ALIGN);
        let Some(mut b) = backend() else { return };
        if !b.info().features.iter().any(|f| f == "external_memory_host") {
            return; // `imported_host_memory_is_a_buffer_in_place` checks the refusal.
        }
        let desc = TensorDesc::new(DType::F32, [4, 8]);
        let long = TensorDesc::new(DType::F32, [HOST_IMPORT_ALIGN]);
        let cases: [(*mut u8, usize, &TensorDesc, &str); 5] = [
            (
                r.ptr.wrapping_add(64),
                HOST_IMPORT_ALIGN,
                &desc,
                "misaligned pointer",
            ),
            (r.ptr, 100, &desc, "misaligned length"),
            (r.ptr, 0, &desc, "empty region"),
            (r.ptr, HOST_IMPORT_ALIGN, &long, "region shorter than the tensor"),
            (std::ptr::null_mut(), HOST_IMPORT_ALIGN, &desc, "null pointer"),
        ];
        for (ptr, len, d, what) in cases {
            // SAFETY: every range lies inside the region, which outlives the backend (or is
            // null); each import is refused before Vulkan sees the pointer.
            match unsafe { b.import_host(ptr, len, d) } {
                Err(BackendError::InvalidArgument { what: w }) => eprintln!("{what}: {w}"),
                other => panic!("{what}: expected InvalidArgument, got {other:?}"),
            }
        }
        // Still usable afterwards.
        // SAFETY: as above, a valid import.
        let ok = unsafe { b.import_host(r.ptr, 2 * HOST_IMPORT_ALIGN, &desc) }.expect("a good region");
        b.free(ok).unwrap();
    }

    #[test]
    fn execute_after_runs_like_execute_and_refuses_unknown_timelines() {
        let Some(mut b) = backend() else { return };
        let desc = TensorDesc::new(DType::F32, [2, 8]);
        let x = b.alloc(&desc, Usage::Activation).unwrap();
        let y = b.alloc(&desc, Usage::Activation).unwrap();
        let vals: Vec<f32> = (0..16).map(|i| i as f32 - 5.0).collect();
        b.write(x, 0, &le_bytes(&vals)).unwrap();
        let p = b.compile(&doubling(x, y, 2, 8)).unwrap();
        let z = zeros(2);
        let err = b
            .execute_after(p, &step(&z), &[(TimelineId(7), Ticket(1))])
            .expect_err("timeline 7 was never imported");
        assert!(
            matches!(err, BackendError::InvalidArgument { .. }) && err.to_string().contains("timeline 7"),
            "{err}"
        );
        let t = b.execute_after(p, &step(&z), &[]).expect("no waits: execute");
        b.wait(t).unwrap();
        let mut out = vec![0u8; 64];
        b.read(y, 0, &mut out).unwrap();
        assert_eq!(from_le(&out), vals.iter().map(|v| v * 2.0).collect::<Vec<_>>());
        b.release(p).unwrap();
        b.free(x).unwrap();
        b.free(y).unwrap();
    }

    #[test]
    fn a_timeline_is_shared_where_the_device_can() {
        use tandem_backend_api::boundary::VULKAN_OPAQUE_FD;
        use tandem_backend_api::HOST_IMPORT_ALIGN;
        // Regions before backends: dropped after them.
        let (rx, rs, ry) = (
            Region::new(HOST_IMPORT_ALIGN),
            Region::new(HOST_IMPORT_ALIGN),
            Region::new(HOST_IMPORT_ALIGN),
        );
        let Some(mut a) = backend() else { return };
        let Some(mut b) = backend() else { return };
        let made_up = |device: &str, kind: &str| SharedTimeline {
            fd: 0,
            kind: kind.into(),
            device: device.into(),
        };
        let Some(shared) = a.export_timeline().expect("export") else {
            assert!(!a.info().features.iter().any(|f| f == "timeline_export"));
            assert_eq!(
                b.import_timeline(&made_up("00/00", VULKAN_OPAQUE_FD)).unwrap(),
                None
            );
            eprintln!("{} cannot export timelines", a.info().device);
            return;
        };
        assert!(a.info().features.iter().any(|f| f == "timeline_export"));
        assert_eq!(shared.kind, VULKAN_OPAQUE_FD);
        // Another device, another kind: not importable.
        assert_eq!(
            b.import_timeline(&made_up("00/00", VULKAN_OPAQUE_FD)).unwrap(),
            None
        );
        assert_eq!(
            b.import_timeline(&made_up(&shared.device, "dma_fence")).unwrap(),
            None
        );
        let id = b
            .import_timeline(&shared)
            .expect("import")
            .expect("same driver and device");
        // SAFETY: the fd is ours (exported for us); b imported a duplicate.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(shared.fd) });

        let desc = TensorDesc::new(DType::F32, [4, 8]);
        let vals: Vec<f32> = (0..32).map(|i| i as f32 * 0.25).collect();
        let quadrupled: Vec<f32> = vals.iter().map(|v| v * 4.0).collect();
        let z = zeros(4);
        if a.info().features.iter().any(|f| f == "external_memory_host") {
            // a doubles x into the shared region s; b doubles s into y once a's ticket is
            // reached. b is submitted first, waiting on a ticket a has not submitted yet.
            // SAFETY: the regions are aligned, long enough, outlive both backends and are
            // touched only through raw pointers.
            let (ax, as_, bs, by) = unsafe {
                (
                    a.import_host(rx.ptr, HOST_IMPORT_ALIGN, &desc).unwrap(),
                    a.import_host(rs.ptr, HOST_IMPORT_ALIGN, &desc).unwrap(),
                    b.import_host(rs.ptr, HOST_IMPORT_ALIGN, &desc).unwrap(),
                    b.import_host(ry.ptr, HOST_IMPORT_ALIGN, &desc).unwrap(),
                )
            };
            rx.set_f32s(&vals);
            let pa = a.compile(&doubling(ax, as_, 4, 8)).unwrap();
            let pb = b.compile(&doubling(bs, by, 4, 8)).unwrap();
            // A first run of a tells the ticket the next one gets.
            let first = a.execute(pa, &step(&z)).unwrap();
            a.wait(first).unwrap();
            rs.set_f32s(&[0.0; 32]);
            let next = Ticket(first.0 + 1);
            let tb = b.execute_after(pb, &step(&z), &[(id, next)]).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert_eq!(ry.f32s(32), vec![0.0; 32], "b ran before a's ticket");
            let ta = a.execute(pa, &step(&z)).unwrap();
            assert_eq!(ta, next);
            b.wait(tb).unwrap();
            assert_eq!(ry.f32s(32), quadrupled);
            a.wait(ta).unwrap();
            a.release(pa).unwrap();
            b.release(pb).unwrap();
            for id in [ax, as_] {
                a.free(id).unwrap();
            }
            for id in [bs, by] {
                b.free(id).unwrap();
            }
        } else {
            // Without shared memory: b's own program, submitted after a's ticket.
            let x = b.alloc(&desc, Usage::Activation).unwrap();
            let y = b.alloc(&desc, Usage::Activation).unwrap();
            b.write(x, 0, &le_bytes(&vals)).unwrap();
            let pb = b.compile(&doubling(x, y, 4, 8)).unwrap();
            let ax = a.alloc(&desc, Usage::Activation).unwrap();
            let ay = a.alloc(&desc, Usage::Activation).unwrap();
            let pa = a.compile(&doubling(ax, ay, 4, 8)).unwrap();
            let ta = a.execute(pa, &step(&z)).unwrap();
            let tb = b.execute_after(pb, &step(&z), &[(id, ta)]).unwrap();
            b.wait(tb).unwrap();
            let mut out = vec![0u8; 128];
            b.read(y, 0, &mut out).unwrap();
            assert_eq!(from_le(&out), vals.iter().map(|v| v * 2.0).collect::<Vec<_>>());
            a.wait(ta).unwrap();
        }
    }
}
