//! Recording: one command buffer per program. A barrier goes before a command only where it reads
//! memory written, or writes memory read or written, since the last barrier (`cmd::Hazards`), so
//! independent kernels (the q and k norms, a layer's small dispatches and the next one's
//! unrelated reads) overlap. When profiling (`profile` option), every group is followed by a
//! barrier and a timestamp per node instead: per-node times of a serialised program, a fused
//! group's time on its first node, named after all of its nodes (`rms_norm(f32)+add+rms_norm(f32)`).

use ash::vk;
use tandem_backend_api::BackendError;

use super::cmd::{Cmd, Hazards};
use crate::VulkanBackend;

/// A recorded program: its command buffer, its timestamp pool when profiling, and the nodes (with
/// the names their times go under) in the order their timestamps are written.
pub(super) type Recorded = (vk::CommandBuffer, Option<vk::QueryPool>, Vec<(usize, String)>);

impl VulkanBackend {
    /// Records `groups` (each: its nodes of `graph` and its commands); returns the command
    /// buffer, the timestamp pool when profiling, and the nodes (with the names their times go
    /// under) in the order their timestamps are written.
    pub(super) fn record(
        &mut self,
        groups: &[(Vec<usize>, Vec<Cmd>)],
        graph: &tandem_backend_api::Graph,
    ) -> Result<Recorded, BackendError> {
        // Pipelines first (creation may fail; nothing is recorded yet).
        let mut pipes: Vec<Vec<Option<vk::Pipeline>>> = Vec::with_capacity(groups.len());
        for (_, cmds) in groups {
            let mut v = Vec::with_capacity(cmds.len());
            for c in cmds {
                v.push(match c {
                    Cmd::Dispatch { kernel, spec, .. } => Some(self.pipelines.get(&self.gpu, kernel, *spec)?),
                    Cmd::Copy { .. } => None,
                });
            }
            pipes.push(v);
        }
        let profiling = self.profile && self.gpu.timestamp_period.is_some();
        // `TANDEM_VULKAN_PROFILE_KERNELS=1` (tuning runs): a timestamp after every command
        // rather than every node, named `node:kernel`.
        let per_cmd = profiling && std::env::var_os("TANDEM_VULKAN_PROFILE_KERNELS").is_some();
        let mut order: Vec<(usize, String)> = Vec::new();
        if profiling {
            for (members, cmds) in groups {
                let names: Vec<String> = members.iter().map(|&m| graph.nodes[m].op.name()).collect();
                if per_cmd {
                    for c in cmds {
                        let kernel = match c {
                            Cmd::Dispatch { kernel, .. } => kernel.as_str(),
                            Cmd::Copy { .. } => "copy",
                        };
                        order.push((members[0], format!("{}:{kernel}", names.join("+"))));
                    }
                    continue;
                }
                for (k, &m) in members.iter().enumerate() {
                    order.push((m, if k == 0 { names.join("+") } else { names[k].clone() }));
                }
            }
        }
        let stamps = order.len() as u32 + 1;

        let dev = &self.gpu.device;
        let name = &self.gpu.name;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.gpu.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is ours and used from this thread only.
        let cb = crate::device::map("vkAllocateCommandBuffers", name, unsafe {
            dev.allocate_command_buffers(&alloc)
        })?[0];
        let queries = if profiling {
            let info = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(stamps);
            // SAFETY: a valid create info on our device.
            match unsafe { dev.create_query_pool(&info, None) } {
                Ok(q) => Some(q),
                Err(e) => {
                    // SAFETY: the command buffer was never submitted.
                    unsafe { dev.free_command_buffers(self.gpu.pool, &[cb]) };
                    return crate::device::map("vkCreateQueryPool", name, Err(e));
                }
            }
        } else {
            None
        };
        let barrier = |src: vk::PipelineStageFlags,
                       src_access: vk::AccessFlags,
                       dst: vk::PipelineStageFlags,
                       dst_access: vk::AccessFlags| {
            let mb = [vk::MemoryBarrier::default()
                .src_access_mask(src_access)
                .dst_access_mask(dst_access)];
            // SAFETY: `cb` is in the recording state.
            unsafe { dev.cmd_pipeline_barrier(cb, src, dst, vk::DependencyFlags::empty(), &mb, &[], &[]) };
        };
        let work = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        let work_write = vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE;
        let work_rw = vk::AccessFlags::SHADER_READ
            | vk::AccessFlags::SHADER_WRITE
            | vk::AccessFlags::TRANSFER_READ
            | vk::AccessFlags::TRANSFER_WRITE;
        let layout = self.pipelines.layout;
        let record = || -> Result<(), vk::Result> {
            // SAFETY: `cb` was just allocated from our pool; every handle recorded (pipelines,
            // layout, buffers, query pool) outlives the program, which is released before any
            // of them is destroyed; push-constant sizes are within the layout's 128 bytes.
            unsafe {
                dev.begin_command_buffer(cb, &vk::CommandBufferBeginInfo::default())?;
                if let Some(q) = queries {
                    dev.cmd_reset_query_pool(cb, q, 0, stamps);
                }
                // Everything submitted before (uploads, other programs) happens before this.
                barrier(
                    vk::PipelineStageFlags::ALL_COMMANDS | vk::PipelineStageFlags::HOST,
                    vk::AccessFlags::MEMORY_WRITE | vk::AccessFlags::HOST_WRITE,
                    work,
                    work_rw,
                );
                let mut written = 0u32;
                if let Some(q) = queries {
                    dev.cmd_write_timestamp(cb, vk::PipelineStageFlags::TOP_OF_PIPE, q, 0);
                    written = 1;
                }
                let mut hazards = Hazards::default();
                let mut bound = vk::Pipeline::null();
                for ((members, cmds), pipes) in groups.iter().zip(&pipes) {
                    for (c, p) in cmds.iter().zip(pipes) {
                        if hazards.conflicts(c.access()) {
                            barrier(work, work_write, work, work_rw);
                            hazards.clear();
                        }
                        hazards.add(c.access());
                        match c {
                            Cmd::Dispatch { push, groups, .. } => {
                                let p = p.unwrap_or_default();
                                if p != bound {
                                    dev.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, p);
                                    bound = p;
                                }
                                dev.cmd_push_constants(cb, layout, vk::ShaderStageFlags::COMPUTE, 0, push);
                                dev.cmd_dispatch(cb, groups[0], groups[1], groups[2]);
                            }
                            Cmd::Copy {
                                src,
                                src_offset,
                                dst,
                                size,
                                ..
                            } => {
                                let region = vk::BufferCopy::default()
                                    .src_offset(*src_offset)
                                    .dst_offset(0)
                                    .size(*size);
                                dev.cmd_copy_buffer(cb, *src, *dst, &[region]);
                            }
                        }
                        if let (Some(q), true) = (queries, per_cmd) {
                            barrier(work, work_write, work, work_rw);
                            hazards.clear();
                            dev.cmd_write_timestamp(cb, vk::PipelineStageFlags::BOTTOM_OF_PIPE, q, written);
                            written += 1;
                        }
                    }
                    if let (Some(q), false) = (queries, per_cmd) {
                        if !cmds.is_empty() {
                            barrier(work, work_write, work, work_rw);
                            hazards.clear();
                        }
                        for _ in members {
                            dev.cmd_write_timestamp(cb, vk::PipelineStageFlags::BOTTOM_OF_PIPE, q, written);
                            written += 1;
                        }
                    }
                }
                barrier(
                    work,
                    work_write,
                    vk::PipelineStageFlags::HOST,
                    vk::AccessFlags::HOST_READ,
                );
                dev.end_command_buffer(cb)?;
            }
            Ok(())
        };
        if let Err(e) = record() {
            // SAFETY: never submitted.
            unsafe {
                dev.free_command_buffers(self.gpu.pool, &[cb]);
                if let Some(q) = queries {
                    dev.destroy_query_pool(q, None);
                }
            }
            return Err(crate::device::vk_err("recording a program", name, e));
        }
        Ok((cb, queries, order))
    }
}
