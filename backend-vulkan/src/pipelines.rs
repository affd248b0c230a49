//! Compute pipelines from the embedded SPIR-V, created on first use and cached per (kernel,
//! specialisation constant). One pipeline layout serves them all: no descriptor sets, 128 bytes
//! of push constants (buffer device addresses and small parameters). Every pipeline is created
//! with the device's `VkPipelineCache` (`pipeline_cache`: seeded from disk, written back), with
//! creation feedback where the device reports it.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

use ash::vk;
use tandem_backend_api::BackendError;

use crate::cache_file::Mode;
use crate::device::{map, Gpu};
use crate::pipeline_cache::PipelineCache;

mod table {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// Bytes of push constants every kernel may use.
pub const PUSH_BYTES: u32 = 128;

/// The cache.
pub struct Pipelines {
    pub layout: vk::PipelineLayout,
    modules: HashMap<&'static str, vk::ShaderModule>,
    pipelines: HashMap<(String, [u32; 2]), vk::Pipeline>,
    /// The device's pipeline cache, and what was built with it.
    pub cache: PipelineCache,
    /// Pipelines being created on threads of their own ([`Pipelines::defer`]), what those
    /// threads send back, and the threads (joined before anything they use is destroyed).
    pending: Vec<(String, [u32; 2])>,
    done: (Sender<Deferred>, Receiver<Deferred>),
    workers: Vec<std::thread::JoinHandle<()>>,
}

/// What a deferred pipeline's thread sends back: its key and the pipeline, or the error.
type Deferred = ((String, [u32; 2]), Result<Built, vk::Result>);

impl Pipelines {
    /// The layout and the pipeline cache (`cache`: option `pipeline_cache`).
    pub fn new(gpu: &Gpu, cache: Mode) -> Result<Pipelines, BackendError> {
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(PUSH_BYTES)];
        let info = vk::PipelineLayoutCreateInfo::default().push_constant_ranges(&ranges);
        // SAFETY: a valid create info on our device.
        let layout = map("vkCreatePipelineLayout", &gpu.name, unsafe {
            gpu.device.create_pipeline_layout(&info, None)
        })?;
        let cache = match PipelineCache::open(gpu, cache) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: the layout was just created and nothing uses it.
                unsafe { gpu.device.destroy_pipeline_layout(layout, None) };
                return Err(e);
            }
        };
        Ok(Pipelines {
            layout,
            modules: HashMap::new(),
            pipelines: HashMap::new(),
            cache,
            pending: Vec::new(),
            done: channel(),
            workers: Vec::new(),
        })
    }

    /// Whether a kernel variant exists.
    pub fn has(name: &str) -> bool {
        table::KERNELS.iter().any(|(n, _)| *n == name)
    }

    /// The pipeline of kernel `name` with specialisation constants 0 and 1 set to `spec` (a
    /// kernel without constant 1 ignores it).
    pub fn get(&mut self, gpu: &Gpu, name: &str, spec: [u32; 2]) -> Result<vk::Pipeline, BackendError> {
        if let Some(p) = self.pipelines.get(&(name.to_string(), spec)) {
            return Ok(*p);
        }
        self.prepare(gpu, &[(name.to_string(), spec)])?;
        self.pipelines
            .get(&(name.to_string(), spec))
            .copied()
            .ok_or_else(|| BackendError::internal(format!("pipeline {name} {spec:?} not built")))
    }

    /// Creates every pipeline of `keys` (kernel, specialisation constants) not yet created, at
    /// once on several threads: a driver compiles each on the calling thread, and the NVIDIA
    /// driver takes seconds for a cooperative-matrix kernel, so a server's first step shapes
    /// took 30 s one by one. The device and the pipeline cache (internally synchronised: it is
    /// created without `EXTERNALLY_SYNCHRONIZED`) are shared by the threads.
    pub fn prepare(&mut self, gpu: &Gpu, keys: &[(String, [u32; 2])]) -> Result<(), BackendError> {
        let mut todo: Vec<(&str, [u32; 2], vk::ShaderModule)> = Vec::new();
        for (name, spec) in keys {
            if self.pipelines.contains_key(&(name.clone(), *spec))
                || todo.iter().any(|(n, s, _)| n == name && s == spec)
            {
                continue;
            }
            let module = self.module(gpu, name)?;
            todo.push((name, *spec, module));
        }
        if todo.is_empty() {
            return Ok(());
        }
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(todo.len())
            .max(1);
        let (layout, cache, feedback) = (self.layout, self.cache.handle, gpu.creation_feedback);
        let subgroup_32 = gpu.subgroup_32;
        let device = &gpu.device;
        let stats = gpu.pipeline_stats.as_ref();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<Vec<(usize, Result<Built, vk::Result>)>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(&(name, spec, module)) = todo.get(i) else {
                                break;
                            };
                            let report = stats.filter(|s| s.wants(name)).map(|s| (&s.fns, name));
                            done.push((
                                i,
                                create(device, layout, cache, module, spec, feedback, subgroup_32, report),
                            ));
                        }
                        done
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_default())
                .collect()
        });
        let mut failed = None;
        let mut results: Vec<_> = results.into_iter().flatten().collect();
        if self.cache.logging() {
            // The slowest first: what a cold start waits for.
            results.sort_by_key(|(_, b)| std::cmp::Reverse(b.as_ref().map_or(Duration::ZERO, |b| b.1)));
            for (i, b) in &results {
                if let Ok((_, took, _)) = b {
                    let (name, spec, _) = todo[*i];
                    eprintln!("vulkan: pipeline {name} {spec:?}: {} ms", took.as_millis());
                }
            }
        }
        for (i, built) in results {
            match built {
                Ok((pipeline, took, fb)) => {
                    self.cache.record(took, fb);
                    let (name, spec, _) = todo[i];
                    self.pipelines.insert((name.to_string(), spec), pipeline);
                }
                Err(e) => failed = Some(e),
            }
        }
        match failed {
            Some(e) => map("vkCreateComputePipelines", &gpu.name, Err(e)),
            None if todo
                .iter()
                .all(|(n, s, _)| self.pipelines.contains_key(&(n.to_string(), *s))) =>
            {
                Ok(())
            }
            None => Err(BackendError::internal("a pipeline-creating thread panicked")),
        }
    }

    /// Starts creating every pipeline of `keys` not yet made or under way, each on a thread of
    /// its own, and returns at once: [`Pipelines::waiting_for`] says which are still under way,
    /// [`Pipelines::poll`] takes in those finished. What the driver takes seconds to compile (the
    /// cooperative-matrix-2 matmuls) is made this way while a server already serves with
    /// kernels that compile quickly. A pipeline whose thread failed is simply not made: a later
    /// [`Pipelines::get`] creates it and reports the error.
    pub fn defer(&mut self, gpu: &Gpu, keys: &[(String, [u32; 2])]) -> Result<(), BackendError> {
        self.poll();
        for key in keys {
            if self.pipelines.contains_key(key) || self.pending.contains(key) {
                continue;
            }
            let module = self.module(gpu, &key.0)?;
            let (device, layout, cache) = (gpu.device.clone(), self.layout, self.cache.handle);
            let (feedback, tx, key) = (gpu.creation_feedback, self.done.0.clone(), key.clone());
            let subgroup_32 = gpu.subgroup_32;
            let stats = gpu
                .pipeline_stats
                .as_ref()
                .filter(|s| s.wants(&key.0))
                .map(|s| s.fns.clone());
            self.pending.push(key.clone());
            self.workers.push(std::thread::spawn(move || {
                let report = stats.as_ref().map(|f| (f, key.0.as_str()));
                let built = create(
                    &device,
                    layout,
                    cache,
                    module,
                    key.1,
                    feedback,
                    subgroup_32,
                    report,
                );
                let _ = tx.send((key, built));
            }));
        }
        Ok(())
    }

    /// Takes in the deferred pipelines whose threads have finished.
    pub fn poll(&mut self) {
        while let Ok((key, built)) = self.done.1.try_recv() {
            self.pending.retain(|k| *k != key);
            if let Ok((pipeline, took, fb)) = built {
                if self.cache.logging() {
                    eprintln!(
                        "vulkan: pipeline {} {:?}: {} ms (deferred)",
                        key.0,
                        key.1,
                        took.as_millis()
                    );
                }
                self.cache.record(took, fb);
                self.pipelines.insert(key, pipeline);
            }
        }
    }

    /// Whether the pipeline of `key` was still being created by [`Pipelines::defer`] at the
    /// last [`Pipelines::poll`].
    pub fn waiting_for(&self, key: &(String, [u32; 2])) -> bool {
        self.pending.contains(key)
    }

    /// Whether any deferred pipeline is still under way.
    pub fn deferring(&mut self) -> bool {
        self.poll();
        !self.pending.is_empty()
    }

    /// Kernel `name`'s shader module, created on first use.
    fn module(&mut self, gpu: &Gpu, name: &str) -> Result<vk::ShaderModule, BackendError> {
        let Some((static_name, bytes)) = table::KERNELS.iter().find(|(n, _)| *n == name) else {
            return Err(BackendError::internal(format!("no kernel named {name}")));
        };
        if let Some(m) = self.modules.get(static_name) {
            return Ok(*m);
        }
        let words: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let info = vk::ShaderModuleCreateInfo::default().code(&words);
        // SAFETY: the words are SPIR-V that glslang produced at build time.
        let m = map("vkCreateShaderModule", &gpu.name, unsafe {
            gpu.device.create_shader_module(&info, None)
        })?;
        self.modules.insert(static_name, m);
        Ok(m)
    }

    /// Destroys every pipeline, module and the layout, and writes and destroys the pipeline
    /// cache (the device must be idle).
    pub fn destroy(&mut self, gpu: &Gpu) {
        // The deferred pipelines' threads use the device, the modules, the layout and the
        // cache: they finish first, and what they made is destroyed with the rest.
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        self.poll();
        // SAFETY: called once the device is idle, when no command buffer uses them.
        unsafe {
            for (_, p) in self.pipelines.drain() {
                gpu.device.destroy_pipeline(p, None);
            }
            for (_, m) in self.modules.drain() {
                gpu.device.destroy_shader_module(m, None);
            }
            gpu.device.destroy_pipeline_layout(self.layout, None);
        }
        self.cache.destroy(gpu);
    }
}

/// A created pipeline, how long its creation took, and its creation feedback where asked.
type Built = (
    vk::Pipeline,
    std::time::Duration,
    Option<vk::PipelineCreationFeedback>,
);

/// The pipeline-statistics entry points and the kernel's name, where its statistics are printed.
type Report<'a> = (&'a ash::khr::pipeline_executable_properties::Device, &'a str);

/// Creates the compute pipeline of `module` with specialisation constants `spec`, in `layout`,
/// through `cache`, asking for creation feedback where `feedback`; where `report` is given, with
/// its statistics captured and printed on stderr (`vulkan: pipeline stats <name> [spec]: ...`).
#[allow(clippy::too_many_arguments)]
fn create(
    device: &ash::Device,
    layout: vk::PipelineLayout,
    cache: vk::PipelineCache,
    module: vk::ShaderModule,
    spec: [u32; 2],
    feedback: bool,
    subgroup_32: bool,
    report: Option<Report>,
) -> Result<Built, vk::Result> {
    let entries = [
        vk::SpecializationMapEntry::default()
            .constant_id(0)
            .offset(0)
            .size(4),
        vk::SpecializationMapEntry::default()
            .constant_id(1)
            .offset(4)
            .size(4),
    ];
    let mut data = [0u8; 8];
    data[..4].copy_from_slice(&spec[0].to_le_bytes());
    data[4..].copy_from_slice(&spec[1].to_le_bytes());
    let spec_info = vk::SpecializationInfo::default()
        .map_entries(&entries)
        .data(&data);
    let mut size =
        vk::PipelineShaderStageRequiredSubgroupSizeCreateInfo::default().required_subgroup_size(32);
    let stage = vk::PipelineShaderStageCreateInfo::default()
        .stage(vk::ShaderStageFlags::COMPUTE)
        .module(module)
        .name(c"main")
        .specialization_info(&spec_info);
    // Subgroups of 32 where the device's default is another (`Gpu::subgroup_32`).
    let stage = if subgroup_32 {
        stage.push_next(&mut size)
    } else {
        stage
    };
    let mut fb = vk::PipelineCreationFeedback::default();
    let mut fb_info = vk::PipelineCreationFeedbackCreateInfo::default().pipeline_creation_feedback(&mut fb);
    let mut info = vk::ComputePipelineCreateInfo::default()
        .stage(stage)
        .layout(layout);
    if feedback {
        info = info.push_next(&mut fb_info);
    }
    if report.is_some() {
        info = info.flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR);
    }
    let start = Instant::now();
    // SAFETY: the module, layout and pipeline cache are the backend's and alive for the call
    // (`Pipelines::prepare` holds `&mut` of them); the pipeline cache is internally
    // synchronised, so several threads may create through it at once; the create info and its
    // chain (creation feedback only where the device has it: Vulkan 1.3 or the extension,
    // enabled; the required subgroup size only where `Gpu::subgroup_32` found subgroup size
    // control enabled and 32 allowed for compute) live on this frame.
    let created = unsafe { device.create_compute_pipelines(cache, &[info], None) };
    let took = start.elapsed();
    let pipeline = created
        .map_err(|(_, e)| e)?
        .into_iter()
        .next()
        .ok_or(vk::Result::ERROR_UNKNOWN)?;
    if let Some((fns, name)) = report {
        print_stats(fns, name, spec, pipeline);
    }
    Ok((pipeline, took, feedback.then_some(fb)))
}

/// Prints what the driver reports of each executable of `pipeline` (created with
/// `CAPTURE_STATISTICS_KHR`): one line per executable, `name = value` per statistic.
fn print_stats(
    fns: &ash::khr::pipeline_executable_properties::Device,
    name: &str,
    spec: [u32; 2],
    pipeline: vk::Pipeline,
) {
    let info = vk::PipelineInfoKHR::default().pipeline(pipeline);
    // SAFETY: the pipeline was just created on this device with CAPTURE_STATISTICS_KHR, and the
    // device enabled the extension and its feature (`Gpu::pipeline_stats` exists only then).
    let count = unsafe { fns.get_pipeline_executable_properties(&info) }.map_or(0, |v| v.len());
    for executable in 0..count as u32 {
        let exe = vk::PipelineExecutableInfoKHR::default()
            .pipeline(pipeline)
            .executable_index(executable);
        // SAFETY: as above; `executable` is below the count the driver reported.
        let stats = unsafe { fns.get_pipeline_executable_statistics(&exe) };
        let Ok(stats) = stats else {
            eprintln!("vulkan: pipeline stats {name} {spec:?}: none reported");
            continue;
        };
        let text: Vec<String> = stats
            .iter()
            .map(|st| {
                let label = st
                    .name_as_c_str()
                    .map_or("?".into(), |c| c.to_string_lossy().into_owned());
                // SAFETY: the union member read is the one `format` names.
                let value = unsafe {
                    match st.format {
                        vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (st.value.b32 != 0).to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::INT64 => st.value.i64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::UINT64 => st.value.u64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => st.value.f64.to_string(),
                        _ => "?".into(),
                    }
                };
                format!("{label} = {value}")
            })
            .collect();
        eprintln!(
            "vulkan: pipeline stats {name} {spec:?} #{executable}: {}",
            text.join(", ")
        );
    }
}
