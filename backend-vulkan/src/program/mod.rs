//! Programs: a graph planned once (fusions, value arena, step-argument layout, one command list)
//! and recorded into one command buffer that every `execute` resubmits.
//!
//! The pieces, in the order a graph goes through them:
//! - `fuse`: which nodes run as one kernel;
//! - `lower` (with `matmul` and `attention`): which kernel runs each group, with which push
//!   constants and grid, and what memory it reads and writes;
//! - `record`: the command buffer, with a barrier only where a command's memory overlaps what
//!   ran since the last one, and timestamps only when profiling.

mod attention;
mod block_attention;
mod cmd;
mod fuse;
mod lower;
pub(crate) mod matmul;
mod record;
mod top_k;

use ash::vk;
use tandem_backend_api::{BackendError, BufferId, DType, Graph, Op, ValueId, ValueShape};

use tandem_gpu_kit::params::rope_inv_freq;

use crate::memory::{GpuBuffer, Place};
use crate::VulkanBackend;
use cmd::Span;

/// Alignment of values in the arena.
const ARENA_ALIGN: u64 = 256;

/// Threads per workgroup of the one-dimensional kernels.
const WG: u32 = 64;

/// Where the step arguments live in the program's argument buffer (byte offsets).
#[derive(Debug, Clone, Copy)]
pub struct ArgsLayout {
    pub tokens: u64,
    pub positions: u64,
    pub slots: u64,
    pub select: u64,
}

/// A compiled program.
pub struct Program {
    pub cmd: vk::CommandBuffer,
    pub arena: Option<GpuBuffer>,
    pub args: GpuBuffer,
    /// Attention's per-split partial results, when an attention is split.
    pub scratch: Option<GpuBuffer>,
    /// Where a product whose weight is in host memory (`Usage::HostWeight`: a prefill op
    /// offload) has it copied before it multiplies: sized for the largest such weight.
    pub stream: Option<GpuBuffer>,
    pub layout: ArgsLayout,
    pub queries: Option<vk::QueryPool>,
    /// Timeline value of the last submission.
    pub last_submit: u64,
    /// The nodes, and the names their times go under, in the order their timestamps were
    /// written (query `k + 1` follows `order[k]`), when profiling.
    pub order: Vec<(usize, String)>,
    /// The graph, where a matmul took a stand-in kernel while its cooperative-matrix-2 one was
    /// compiled behind: the program is built again from it once that one is made.
    pub stand_in: Option<Graph>,
    /// Each `bidirectional_from` of the graph's attentions and the byte offset in `args` of its
    /// rows' last visible positions (`kit::step::visible_ends`), written each step beside the
    /// positions.
    pub ends: Vec<(u32, u64)>,
    /// Room for one step's ends.
    pub ends_scratch: Vec<u32>,
}

/// Where a program's values and step arguments are, for lowering.
pub(crate) struct Ctx<'a> {
    pub graph: &'a Graph,
    pub shapes: &'a [ValueShape],
    /// Per value: (buffer, byte offset, device address).
    values: Vec<Option<(vk::Buffer, u64, u64)>>,
    /// Device address of the step arguments.
    args: u64,
    layout: ArgsLayout,
    /// Device addresses of the scratch buffer: attention's partial results, matmul_cm2's f16
    /// inputs.
    pub scratch: Span,
    /// The program's stream buffer and its device addresses, where a product's weight is in
    /// host memory ([`Program::stream`]).
    pub stream: Option<(vk::Buffer, Span)>,
    /// Per node: the device address of its rope table.
    tables: Vec<Option<u64>>,
    /// Per `bidirectional_from` value: byte offset of its rows' ends in the step arguments.
    ends: &'a [(u32, u64)],
    /// Attention nodes whose K/V store a fused group does.
    pub stored: &'a [bool],
}

impl Ctx<'_> {
    pub fn loc(&self, v: ValueId) -> Result<(vk::Buffer, u64, u64), BackendError> {
        self.values
            .get(v.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| BackendError::internal(format!("value {} has no storage", v.0)))
    }
    pub fn addr(&self, v: ValueId) -> Result<u64, BackendError> {
        self.loc(v).map(|l| l.2)
    }
    /// Rows of a value.
    pub fn rows(&self, v: ValueId) -> usize {
        tandem_backend_api::kit::plan::value_rows(self.graph, &self.shapes[v.0 as usize])
    }
    pub fn cols(&self, v: ValueId) -> usize {
        self.shapes[v.0 as usize].cols
    }
    /// The device addresses a value's f32 elements occupy.
    pub fn span(&self, v: ValueId) -> Result<Span, BackendError> {
        let a = self.addr(v)?;
        Ok((a, a + (self.rows(v) * self.cols(v) * 4) as u64))
    }
    pub fn tokens(&self) -> u64 {
        self.args + self.layout.tokens
    }
    pub fn positions(&self) -> u64 {
        self.args + self.layout.positions
    }
    pub fn slots(&self) -> u64 {
        self.args + self.layout.slots
    }
    pub fn select(&self) -> u64 {
        self.args + self.layout.select
    }
    /// Device address of each row's last visible position under `bidirectional_from = from`.
    pub fn ends(&self, from: u32) -> Result<u64, BackendError> {
        self.ends
            .iter()
            .find(|(f, _)| *f == from)
            .map(|(_, at)| self.args + at)
            .ok_or_else(|| BackendError::internal(format!("no ends for bidirectional_from {from}")))
    }
    pub fn rope_table(&self, node: usize) -> Result<u64, BackendError> {
        self.tables
            .get(node)
            .copied()
            .flatten()
            .ok_or_else(|| BackendError::internal(format!("node {node} has no rope table")))
    }
}

/// The weight-format name of kernel variants (`matmul_q4_k`).
pub fn format_name(d: DType) -> &'static str {
    d.name()
}

/// Whether the matmul/embed kernels decode this weight format.
pub fn weight_format_supported(d: DType) -> bool {
    crate::pipelines::Pipelines::has(&format!("matmul_{}", d.name()))
}

impl VulkanBackend {
    /// Checks that every op is supported and the buffers a graph names; returns those it uses.
    fn check_buffers(&self, graph: &Graph, shapes: &[ValueShape]) -> Result<Vec<BufferId>, BackendError> {
        tandem_gpu_kit::check_ops(graph, &crate::COVERAGE)?;
        tandem_backend_api::kit::check_buffers(graph, shapes, |id| {
            self.buffers.get(id).map(|b| b.desc.clone())
        })
    }

    /// Validates, plans and records `graph`; returns the program and the buffers it uses.
    pub(crate) fn build_program(&mut self, graph: &Graph) -> Result<(Program, Vec<BufferId>), BackendError> {
        self.stand_in.set(false);
        self.pipelines.poll();
        let shapes = graph.infer_shapes()?;
        let buffers = self.check_buffers(graph, &shapes)?;
        let fusion = fuse::plan(graph, &shapes, self.fuse);
        let (offsets, arena_size) =
            tandem_gpu_kit::plan::plan_arena_at(graph, &shapes, ARENA_ALIGN, &fusion.time);

        // Step arguments, then each rope's inverse frequencies.
        let rows = graph.rows as u64;
        let layout = ArgsLayout {
            tokens: 0,
            positions: rows * 4,
            slots: rows * 8,
            select: rows * 12,
        };
        let mut tables: Vec<(usize, Vec<f32>)> = Vec::new();
        let mut args_size = rows * 12 + graph.selected_rows as u64 * 4;
        // Each image-aware attention's rows' ends (one array per `bidirectional_from` value).
        let mut ends: Vec<(u32, u64)> = Vec::new();
        for node in &graph.nodes {
            if let Op::Attention {
                bidirectional_from: Some(from),
                ..
            } = &node.op
            {
                if !ends.iter().any(|(f, _)| f == from) {
                    ends.push((*from, args_size));
                    args_size += rows * 4;
                }
            }
        }
        for (i, node) in graph.nodes.iter().enumerate() {
            if let Op::Rope { head_dim, theta, .. } = &node.op {
                tables.push((i, rope_inv_freq(*head_dim, *theta)));
            }
        }
        let mut table_at = Vec::new();
        for (_, t) in &tables {
            table_at.push(args_size);
            args_size += t.len() as u64 * 4;
        }
        let mut args = self
            .memory
            .create(&self.gpu, args_size, Place::Host, "step arguments")?;
        if let Some(m) = args.mapped() {
            for ((_, t), at) in tables.iter().zip(&table_at) {
                let bytes: &[u8] = bytemuck::cast_slice(t);
                m[*at as usize..*at as usize + bytes.len()].copy_from_slice(bytes);
            }
        }
        let arena = if arena_size > 0 {
            match self
                .memory
                .create(&self.gpu, arena_size, Place::Device, "program arena")
            {
                Ok(a) => Some(a),
                Err(e) => {
                    self.memory.destroy(&self.gpu, args);
                    return Err(e);
                }
            }
        } else {
            None
        };
        // Attention's split partials, matmul_cm2's f16 inputs, matmul_coopmat's split-k partials,
        // matvec_dot's quantised inputs, top_k's lists and block attention's f16 keys and values
        // (never live at once).
        let scratch_size = attention::scratch_bytes(graph)
            .max(block_attention::scratch_bytes(graph, self.gpu.coopmat))
            .max(matmul::cm2_scratch_bytes(graph, &shapes, self.unit()))
            .max(matmul::coopmat_scratch_bytes(graph, &shapes, self.unit()))
            .max(matmul::dot_scratch_bytes(graph, &shapes, self.unit()))
            .max(top_k::scratch_bytes(graph, &shapes));
        let scratch = if scratch_size > 0 {
            match self
                .memory
                .create(&self.gpu, scratch_size, Place::Device, "program scratch")
            {
                Ok(a) => Some(a),
                Err(e) => {
                    self.memory.destroy(&self.gpu, args);
                    if let Some(a) = arena {
                        self.memory.destroy(&self.gpu, a);
                    }
                    return Err(e);
                }
            }
        } else {
            None
        };
        // The largest weight a product reads from host memory: copied to the device first
        // (a DMA over the bus once, where the kernels' own reads of host memory crossed it
        // once per tile).
        let stream_size = graph
            .nodes
            .iter()
            .filter_map(|node| match &node.op {
                Op::MatMul { weight, .. } => self
                    .buffers
                    .get(weight.buffer)
                    .ok()
                    .filter(|b| b.mem.place == Place::Host)
                    .map(|b| b.mem.size),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let stream = if stream_size > 0 {
            match self
                .memory
                .create(&self.gpu, stream_size, Place::Device, "program weight stream")
            {
                Ok(a) => Some(a),
                Err(e) => {
                    self.memory.destroy(&self.gpu, args);
                    for b in [arena, scratch].into_iter().flatten() {
                        self.memory.destroy(&self.gpu, b);
                    }
                    return Err(e);
                }
            }
        } else {
            None
        };
        let scratch_span = scratch
            .as_ref()
            .map_or((0, 0), |s| (s.address, s.address + s.size));
        let stream_at = stream
            .as_ref()
            .map(|s| (s.buffer, (s.address, s.address + s.size)));
        let result = self.lower_and_record(
            graph,
            &shapes,
            &fusion,
            &offsets,
            arena.as_ref(),
            &args,
            scratch_span,
            stream_at,
            layout,
            &tables,
            &table_at,
            &ends,
        );
        match result {
            Ok((cmd, queries, order)) => Ok((
                Program {
                    cmd,
                    arena,
                    args,
                    scratch,
                    stream,
                    layout,
                    queries,
                    last_submit: 0,
                    order,
                    stand_in: self.stand_in.get().then(|| graph.clone()),
                    ends,
                    ends_scratch: Vec::with_capacity(graph.rows),
                },
                buffers,
            )),
            Err(e) => {
                self.memory.destroy(&self.gpu, args);
                for b in [arena, scratch, stream].into_iter().flatten() {
                    self.memory.destroy(&self.gpu, b);
                }
                Err(e)
            }
        }
    }

    /// Lowers every group of `fusion` to commands and records them.
    #[allow(clippy::too_many_arguments)]
    fn lower_and_record(
        &mut self,
        graph: &Graph,
        shapes: &[ValueShape],
        fusion: &fuse::Fusion,
        offsets: &[Option<u64>],
        arena: Option<&GpuBuffer>,
        args: &GpuBuffer,
        scratch: Span,
        stream: Option<(vk::Buffer, Span)>,
        layout: ArgsLayout,
        tables: &[(usize, Vec<f32>)],
        table_at: &[u64],
        ends: &[(u32, u64)],
    ) -> Result<record::Recorded, BackendError> {
        let mut values: Vec<Option<(vk::Buffer, u64, u64)>> = vec![None; shapes.len()];
        for (v, o) in offsets.iter().enumerate() {
            if let (Some(o), Some(ar)) = (o, arena) {
                values[v] = Some((ar.buffer, *o, ar.address + o));
            }
        }
        for node in &graph.nodes {
            if let Op::Input { buffer, .. } = &node.op {
                let b = self.buffers.get(*buffer)?;
                values[node.outputs[0].0 as usize] = Some((b.mem.buffer, 0, b.mem.address));
            }
        }
        let mut rope_tables = vec![None; graph.nodes.len()];
        for ((node, _), at) in tables.iter().zip(table_at) {
            rope_tables[*node] = Some(args.address + at);
        }
        let ctx = Ctx {
            graph,
            shapes,
            values,
            args: args.address,
            layout,
            scratch,
            stream,
            tables: rope_tables,
            ends,
            stored: &fusion.stored,
        };
        let mut groups = Vec::with_capacity(fusion.groups.len());
        for g in &fusion.groups {
            groups.push((g.nodes(), self.lower(&ctx, g)?));
        }
        self.record(&groups, graph)
    }

    /// Frees a program's Vulkan objects (its last submission must have finished).
    pub(crate) fn destroy_program(&mut self, p: Program) {
        // SAFETY: the caller waited for the program's last submission.
        unsafe {
            self.gpu.device.free_command_buffers(self.gpu.pool, &[p.cmd]);
            if let Some(q) = p.queries {
                self.gpu.device.destroy_query_pool(q, None);
            }
        }
        self.memory.destroy(&self.gpu, p.args);
        for b in [p.arena, p.scratch, p.stream].into_iter().flatten() {
            self.memory.destroy(&self.gpu, b);
        }
    }
}
