//! Compute pipelines from the embedded SPIR-V, created on first use and cached per (kernel,
//! specialisation constant). One pipeline layout serves them all: no descriptor sets, 128 bytes
//! of push constants (buffer device addresses and small parameters). Every pipeline is created
//! with the device's `VkPipelineCache` (`pipeline_cache`: seeded from disk, written back), with
//! creation feedback where the device reports it.

use std::collections::HashMap;
use std::time::Instant;

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
}

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
        let Some((static_name, bytes)) = table::KERNELS.iter().find(|(n, _)| *n == name) else {
            return Err(BackendError::internal(format!("no kernel named {name}")));
        };
        let module = match self.modules.get(static_name) {
            Some(m) => *m,
            None => {
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
                m
            }
        };
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
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main")
            .specialization_info(&spec_info);
        let mut feedback = vk::PipelineCreationFeedback::default();
        let mut feedback_info =
            vk::PipelineCreationFeedbackCreateInfo::default().pipeline_creation_feedback(&mut feedback);
        let mut info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(self.layout);
        if gpu.creation_feedback {
            info = info.push_next(&mut feedback_info);
        }
        let start = Instant::now();
        // SAFETY: the module, layout and pipeline cache are ours and alive (the cache is used by
        // this thread only: the backend is `&mut`); the create info and its chain (creation
        // feedback only where the device has it: Vulkan 1.3 or the extension, enabled) live on
        // this frame.
        let created = unsafe {
            gpu.device
                .create_compute_pipelines(self.cache.handle, &[info], None)
        };
        let took = start.elapsed();
        if created.is_ok() {
            self.cache.record(took, gpu.creation_feedback.then_some(feedback));
        }
        let pipeline = match created {
            Ok(v) => v.into_iter().next(),
            Err((_, e)) => return map("vkCreateComputePipelines", &gpu.name, Err(e)),
        }
        .ok_or_else(|| BackendError::internal("vkCreateComputePipelines returned nothing"))?;
        self.pipelines.insert((name.to_string(), spec), pipeline);
        Ok(pipeline)
    }

    /// Destroys every pipeline, module and the layout, and writes and destroys the pipeline
    /// cache (the device must be idle).
    pub fn destroy(&mut self, gpu: &Gpu) {
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
