//! Compute pipelines from the embedded SPIR-V, created on first use and cached per (kernel,
//! specialisation constant). One pipeline layout serves them all: no descriptor sets, 128 bytes
//! of push constants (buffer device addresses and small parameters).

use std::collections::HashMap;

use ash::vk;
use tandem_backend_api::BackendError;

use crate::device::{map, Gpu};

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
}

impl Pipelines {
    pub fn new(gpu: &Gpu) -> Result<Pipelines, BackendError> {
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(PUSH_BYTES)];
        let info = vk::PipelineLayoutCreateInfo::default().push_constant_ranges(&ranges);
        // SAFETY: a valid create info on our device.
        let layout = map("vkCreatePipelineLayout", &gpu.name, unsafe {
            gpu.device.create_pipeline_layout(&info, None)
        })?;
        Ok(Pipelines {
            layout,
            modules: HashMap::new(),
            pipelines: HashMap::new(),
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
        let info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(self.layout);
        // SAFETY: the module and layout are ours and alive; the create info lives on this frame.
        let created = unsafe {
            gpu.device
                .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
        };
        let pipeline = match created {
            Ok(v) => v.into_iter().next(),
            Err((_, e)) => return map("vkCreateComputePipelines", &gpu.name, Err(e)),
        }
        .ok_or_else(|| BackendError::internal("vkCreateComputePipelines returned nothing"))?;
        self.pipelines.insert((name.to_string(), spec), pipeline);
        Ok(pipeline)
    }

    /// Destroys every pipeline, module and the layout (the device must be idle).
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
    }
}
