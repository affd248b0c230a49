//! Programs: a graph planned once (value arena, step-argument layout, one dispatch list) and
//! recorded into one command buffer that every `execute` resubmits.

use ash::vk;
use tandem_backend_api::{BackendError, BufferId, DType, Graph, Op, ValueShape};

use crate::device::map;
use crate::memory::{GpuBuffer, Place};
use crate::VulkanBackend;

/// Alignment of values in the arena.
const ARENA_ALIGN: u64 = 256;

/// Rows from which a matmul takes the tiled matrix-matrix kernel instead of the matrix-vector
/// one (block formats other than q4_k: at 32 rows on the H100 the tiled kernel took 5.5 ms per
/// step for a 4B model's q8_0 logits, `matvec_q8_0` 14.4).
const TILED_ROWS: usize = 16;

/// The same for q4_k and the float formats: up to a tile's worth of rows (batched decode) their
/// matrix-vector kernels, reading each weight once per 8 rows, beat the tiled kernel on the
/// H100 (4B f16 at 32 rows: 41.7 ms of matmul per step against 86.6).
const TILED_ROWS_WIDE: usize = 64;

/// `matvec_<fmt>`'s weight rows per workgroup in split mode (block formats, one input row): the
/// workgroup's 128 invocations split the k of 4 rows, which share each slot of x loaded; a 4B
/// model's smallest matrix (2560 rows) still makes 640 workgroups. On the H100 (4B q4_k, one
/// row) 4 rows took 2.58 ms of q4_k matmul per step, 2 rows 3.62, 8 rows 3.04.
const MATVEC_COLS: usize = 4;

/// `matvec_<fmt>`'s subgroup mode (float formats, and several input rows): each subgroup takes
/// its own weight rows, two at a time.
const MATVEC_SUBGROUP_ROWS: u32 = 256;

/// `TANDEM_VULKAN_MATVEC_COLS` (1 to 16): a fixed `matvec_<fmt>` rows per workgroup, for tuning
/// runs.
fn matvec_cols_override() -> Option<usize> {
    std::env::var("TANDEM_VULKAN_MATVEC_COLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|c| (1..=16).contains(c))
}

/// Rows from which a matmul takes the cooperative-matrix kernel (`matmul_coopmat_<fmt>`) where
/// the device has it (prefill).
const COOPMAT_ROWS: usize = 64;

/// `TANDEM_VULKAN_TILED_ROWS`: a fixed row count from which matmuls take the tiled kernel, for
/// tuning runs.
fn tiled_rows_override() -> Option<usize> {
    std::env::var("TANDEM_VULKAN_TILED_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// Threads per workgroup of the one-dimensional kernels.
const WG: u32 = 64;

/// Push constants in the kernels' scalar layout.
#[derive(Default)]
struct Push(Vec<u8>);

impl Push {
    fn u64(mut self, v: u64) -> Self {
        while !self.0.len().is_multiple_of(8) {
            self.0.push(0);
        }
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn f32(mut self, v: f32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// One command of a node.
enum Cmd {
    Dispatch {
        kernel: String,
        /// Specialisation constants 0 and 1.
        spec: [u32; 2],
        push: Vec<u8>,
        groups: [u32; 3],
    },
    Copy {
        src: vk::Buffer,
        src_offset: u64,
        dst: vk::Buffer,
        size: u64,
    },
    /// A barrier between two dispatches of one node.
    Barrier,
}

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
    pub graph: Graph,
    pub cmd: vk::CommandBuffer,
    pub arena: Option<GpuBuffer>,
    pub args: GpuBuffer,
    /// Attention's per-split partial results, when an attention is split.
    pub scratch: Option<GpuBuffer>,
    pub layout: ArgsLayout,
    pub queries: Option<vk::QueryPool>,
    /// Buffers the program reads or writes.
    pub buffers: Vec<BufferId>,
    /// Slot count of the smallest KV cache, when there is attention.
    pub slots: Option<usize>,
    /// Timeline value of the last submission.
    pub last_submit: u64,
}

use tandem_backend_api::plan::{attention_splits, div_up, spread};

/// The weight-format name of kernel variants (`matmul_q4_k`).
pub fn format_name(d: DType) -> &'static str {
    d.name()
}

/// Whether the matmul/embed kernels decode this weight format.
pub fn weight_format_supported(d: DType) -> bool {
    crate::pipelines::Pipelines::has(&format!("matmul_{}", d.name()))
}

impl VulkanBackend {
    fn rows_of(graph: &Graph, s: &ValueShape) -> usize {
        tandem_backend_api::plan::value_rows(graph, s)
    }

    /// Checks that every op is supported and the buffers a graph names; returns those it uses
    /// and the smallest slot count.
    fn check_buffers(
        &self,
        graph: &Graph,
        shapes: &[ValueShape],
    ) -> Result<(Vec<BufferId>, Option<usize>), BackendError> {
        for (i, node) in graph.nodes.iter().enumerate() {
            if let crate::SupportCheck::No(reason) = crate::op_support(&node.op) {
                return Err(BackendError::unsupported(
                    node.op.name(),
                    format!("node {i}: {reason}"),
                ));
            }
        }
        let u = tandem_backend_api::plan::check_buffers(graph, shapes, |id| {
            self.buffer(id).map(|b| b.desc.clone())
        })?;
        Ok((u.buffers, u.slots))
    }

    /// Validates, plans and records `graph`.
    pub(crate) fn build_program(&mut self, graph: &Graph) -> Result<Program, BackendError> {
        let shapes = graph.infer_shapes()?;
        let (buffers, slots) = self.check_buffers(graph, &shapes)?;
        let (offsets, arena_size) = tandem_backend_api::plan::plan_arena(graph, &shapes, ARENA_ALIGN);

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
        for (i, node) in graph.nodes.iter().enumerate() {
            if let Op::Rope { head_dim, theta, .. } = &node.op {
                let half = head_dim / 2;
                let t: Vec<f32> = (0..half)
                    .map(|d| 1.0 / theta.powf((2 * d) as f32 / *head_dim as f32))
                    .collect();
                tables.push((i, t));
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
        let scratch_size = tandem_backend_api::plan::attention_scratch_bytes(graph);
        let scratch = if scratch_size > 0 {
            match self
                .memory
                .create(&self.gpu, scratch_size, Place::Device, "attention partials")
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
        let scratch_addr = scratch.as_ref().map_or(0, |s| s.address);
        let result = self.record(
            graph,
            &shapes,
            &offsets,
            arena.as_ref(),
            &args,
            scratch_addr,
            layout,
            &tables,
            &table_at,
        );
        match result {
            Ok((cmd, queries)) => Ok(Program {
                graph: graph.clone(),
                cmd,
                arena,
                args,
                scratch,
                layout,
                queries,
                buffers,
                slots,
                last_submit: 0,
            }),
            Err(e) => {
                self.memory.destroy(&self.gpu, args);
                for b in [arena, scratch].into_iter().flatten() {
                    self.memory.destroy(&self.gpu, b);
                }
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        graph: &Graph,
        shapes: &[ValueShape],
        offsets: &[Option<u64>],
        arena: Option<&GpuBuffer>,
        args: &GpuBuffer,
        scratch: u64,
        layout: ArgsLayout,
        tables: &[(usize, Vec<f32>)],
        table_at: &[u64],
    ) -> Result<(vk::CommandBuffer, Option<vk::QueryPool>), BackendError> {
        // Where each value lives: (buffer, offset, device address).
        let mut input_alias: Vec<Option<(vk::Buffer, u64)>> = vec![None; shapes.len()];
        for node in &graph.nodes {
            if let Op::Input { buffer, .. } = &node.op {
                let b = self.buffer(*buffer)?;
                input_alias[node.outputs[0].0 as usize] = Some((b.mem.buffer, b.mem.address));
            }
        }
        let loc = |v: tandem_backend_api::ValueId| -> Result<(vk::Buffer, u64, u64), BackendError> {
            let i = v.0 as usize;
            if let Some((b, a)) = input_alias[i] {
                return Ok((b, 0, a));
            }
            match (offsets[i], arena) {
                (Some(o), Some(ar)) => Ok((ar.buffer, o, ar.address + o)),
                _ => Err(BackendError::internal(format!("value {i} has no storage"))),
            }
        };
        let addr = |v| loc(v).map(|l| l.2);
        let tokens = args.address + layout.tokens;
        let positions = args.address + layout.positions;
        let slots_addr = args.address + layout.slots;
        let select = args.address + layout.select;

        let mut nodes_cmds: Vec<Vec<Cmd>> = Vec::with_capacity(graph.nodes.len());
        for (i, node) in graph.nodes.iter().enumerate() {
            let mut cmds = Vec::new();
            let rows_x = |x: &tandem_backend_api::ValueId| Self::rows_of(graph, &shapes[x.0 as usize]);
            match &node.op {
                Op::Input { .. } => {}
                Op::Embed { table, scale } => {
                    let t = self.buffer(table.buffer)?;
                    let cols = table.desc.shape[1];
                    let dt = table.desc.dtype;
                    let row_bytes = dt.row_bytes(cols).unwrap_or(0) as u32;
                    let units = if dt.is_quantized() { cols / 32 } else { cols };
                    cmds.push(Cmd::Dispatch {
                        kernel: format!("embed_{}", format_name(dt)),
                        spec: [0, 0],
                        push: Push::default()
                            .u64(t.mem.address)
                            .u64(addr(node.outputs[0])?)
                            .u64(tokens)
                            .u32(cols as u32)
                            .u32(row_bytes)
                            .f32(*scale)
                            .0,
                        groups: [div_up(units, WG as usize), graph.rows as u32, 1],
                    });
                }
                Op::RmsNorm {
                    x,
                    weight,
                    eps,
                    weight_offset,
                } => {
                    let w = self.buffer(weight.buffer)?;
                    let cols = shapes[x.0 as usize].cols;
                    let group = weight.desc.numel();
                    let wfmt = match weight.desc.dtype {
                        DType::F32 => 0,
                        DType::F16 => 1,
                        _ => 2,
                    };
                    cmds.push(Cmd::Dispatch {
                        kernel: "rms_norm".into(),
                        spec: [0, 0],
                        push: Push::default()
                            .u64(addr(*x)?)
                            .u64(w.mem.address)
                            .u64(addr(node.outputs[0])?)
                            .u32(cols as u32)
                            .u32(group as u32)
                            .f32(*eps)
                            .f32(*weight_offset)
                            .u32(wfmt)
                            .0,
                        groups: [(cols / group) as u32, rows_x(x) as u32, 1],
                    });
                }
                Op::MatMul { x, weight, splits } => {
                    let w = self.buffer(weight.buffer)?;
                    let (n, k) = (weight.desc.shape[0], weight.desc.shape[1]);
                    let rows = rows_x(x);
                    let dt = weight.desc.dtype;
                    let r = if rows == 1 {
                        1
                    } else if rows <= 4 {
                        4
                    } else {
                        8
                    };
                    let mut dsts = [0u64; 4];
                    let mut ends = [n as u32; 3];
                    let mut acc = 0usize;
                    for (s, (width, out)) in splits.iter().zip(&node.outputs).enumerate() {
                        dsts[s] = addr(*out)?;
                        acc += width;
                        if s < 3 {
                            ends[s] = acc as u32;
                        }
                    }
                    let push = Push::default()
                        .u64(w.mem.address)
                        .u64(addr(*x)?)
                        .u64(dsts[0])
                        .u64(dsts[1])
                        .u64(dsts[2])
                        .u64(dsts[3])
                        .u32(k as u32)
                        .u32(n as u32)
                        .u32(rows as u32)
                        .u32(dt.row_bytes(k).unwrap_or(0) as u32)
                        .u32(ends[0])
                        .u32(ends[1])
                        .u32(ends[2])
                        .0;
                    // Decode (few rows) takes a matrix-vector kernel, from TILED_ROWS(_WIDE) rows
                    // the tiled one:
                    // - float rows whose k is not a multiple of 16: matmul_<fmt>, one weight row
                    //   per workgroup;
                    // - q4_k, several rows: matvec_rows_q4_k, 4 weight rows x 8 input rows per
                    //   workgroup (at 32 rows on the H100 28.9 ms of a 4B step against 36.0 for
                    //   matvec_q4_k's subgroup mode);
                    // - else matvec_<fmt>: split mode for block formats with one row, subgroup
                    //   mode otherwise (f16 one row: 3.64 ms a 4B step against 3.99 in split
                    //   mode), R = 1, 2, 4 or 8 input rows per workgroup.
                    let float = matches!(dt, DType::F32 | DType::F16 | DType::Bf16);
                    let wide = float || dt == DType::Q4K;
                    let tiled_from =
                        tiled_rows_override().unwrap_or(if wide { TILED_ROWS_WIDE } else { TILED_ROWS });
                    if rows >= COOPMAT_ROWS && self.gpu.coopmat {
                        // Prefill on cooperative matrices: 64 x 128 output tiles.
                        cmds.push(Cmd::Dispatch {
                            kernel: format!("matmul_coopmat_{}", format_name(dt)),
                            spec: [0, 0],
                            push,
                            groups: [div_up(n, 128), div_up(rows, 64), 1],
                        });
                    } else if rows >= tiled_from {
                        cmds.push(Cmd::Dispatch {
                            kernel: format!("matmul_tiled_{}", format_name(dt)),
                            spec: [0, 0],
                            push,
                            groups: [div_up(n, 64), div_up(rows, 64), 1],
                        });
                    } else if float && !k.is_multiple_of(16) {
                        let [gx, gy] = spread(n as u32);
                        cmds.push(Cmd::Dispatch {
                            kernel: format!("matmul_{}", format_name(dt)),
                            spec: [r, 1],
                            push,
                            groups: [gx, gy, div_up(rows, r as usize)],
                        });
                    } else if dt == DType::Q4K && rows > 1 {
                        let [gx, gy] = spread(div_up(n, 4));
                        cmds.push(Cmd::Dispatch {
                            kernel: "matvec_rows_q4_k".into(),
                            spec: [r, 4],
                            push,
                            groups: [gx, gy, div_up(rows, r as usize)],
                        });
                    } else {
                        // The ceil(rows / R) row slices of one weight block are neighbouring
                        // workgroups (its weights shared through the L2).
                        let r = rows.next_power_of_two().min(8);
                        let slices = rows.div_ceil(r);
                        let subgroup_mode = float || rows > 1;
                        // Subgroup mode: 8 rows per workgroup (2 per subgroup) where that leaves
                        // >= 1024 workgroups, else 4 (one per subgroup).
                        let cols = if !subgroup_mode {
                            MATVEC_COLS
                        } else if div_up(n, 8) as usize * slices >= 1024 {
                            8
                        } else {
                            4
                        };
                        let cols = matvec_cols_override().unwrap_or(cols);
                        let mode = cols as u32 | if subgroup_mode { MATVEC_SUBGROUP_ROWS } else { 0 };
                        let [gx, gy] = spread(div_up(n, cols).saturating_mul(slices as u32));
                        cmds.push(Cmd::Dispatch {
                            kernel: format!("matvec_{}", format_name(dt)),
                            spec: [r as u32, mode],
                            push,
                            groups: [gx, gy, 1],
                        });
                    }
                }
                Op::Rope {
                    x, head_dim, factor, ..
                } => {
                    let cols = shapes[x.0 as usize].cols;
                    let t = tables
                        .iter()
                        .position(|(n, _)| *n == i)
                        .map(|k| table_at[k])
                        .unwrap_or(0);
                    cmds.push(Cmd::Dispatch {
                        kernel: "rope".into(),
                        spec: [0, 0],
                        push: Push::default()
                            .u64(addr(*x)?)
                            .u64(addr(node.outputs[0])?)
                            .u64(positions)
                            .u64(args.address + t)
                            .u32(cols as u32)
                            .u32(*head_dim as u32)
                            .f32(*factor)
                            .0,
                        groups: [div_up(cols / 2, WG as usize), rows_x(x) as u32, 1],
                    });
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
                    softcap,
                } => {
                    let kc = self.buffer(cache.k)?.mem.address;
                    let vc = self.buffer(cache.v)?.mem.address;
                    let f16 = u32::from(cache.dtype == DType::F16);
                    let kv_cols = kv_heads * head_dim;
                    let rows = graph.rows;
                    cmds.push(Cmd::Dispatch {
                        kernel: "kv_store".into(),
                        spec: [0, 0],
                        push: Push::default()
                            .u64(addr(*k)?)
                            .u64(addr(*v)?)
                            .u64(kc)
                            .u64(vc)
                            .u64(positions)
                            .u64(slots_addr)
                            .u32(kv_cols as u32)
                            .u32(cache.capacity as u32)
                            .u32(f16)
                            .0,
                        groups: [div_up(kv_cols, WG as usize), rows as u32, 1],
                    });
                    cmds.push(Cmd::Barrier);
                    let splits = attention_splits(rows, *heads, *window, cache.capacity);
                    let out = addr(node.outputs[0])?;
                    cmds.push(Cmd::Dispatch {
                        kernel: "attention".into(),
                        spec: [0, 0],
                        push: Push::default()
                            .u64(addr(*q)?)
                            .u64(kc)
                            .u64(vc)
                            .u64(out)
                            .u64(positions)
                            .u64(slots_addr)
                            .u64(scratch)
                            .u32(*heads as u32)
                            .u32(*kv_heads as u32)
                            .u32(*head_dim as u32)
                            .u32(cache.capacity as u32)
                            .f32(*scale)
                            .u32(window.unwrap_or(0) as u32)
                            .f32(softcap.unwrap_or(0.0))
                            .u32(f16)
                            .u32(splits as u32)
                            .0,
                        groups: [*heads as u32, rows as u32, splits as u32],
                    });
                    if splits > 1 {
                        cmds.push(Cmd::Barrier);
                        cmds.push(Cmd::Dispatch {
                            kernel: "attention_combine".into(),
                            spec: [0, 0],
                            push: Push::default()
                                .u64(scratch)
                                .u64(out)
                                .u32(*heads as u32)
                                .u32(*head_dim as u32)
                                .u32(splits as u32)
                                .0,
                            groups: [*heads as u32, rows as u32, 1],
                        });
                    }
                }
                Op::GeGlu { gate: a, up: b } | Op::Add { a, b } => {
                    let s = shapes[a.0 as usize];
                    let n = Self::rows_of(graph, &s) * s.cols;
                    let op = u32::from(matches!(node.op, Op::GeGlu { .. }));
                    let [gx, gy] = spread(div_up(n, WG as usize));
                    cmds.push(Cmd::Dispatch {
                        kernel: "eltwise".into(),
                        spec: [0, 0],
                        push: Push::default()
                            .u64(addr(*a)?)
                            .u64(addr(*b)?)
                            .u64(addr(node.outputs[0])?)
                            .u32(n as u32)
                            .u32(op)
                            .f32(0.0)
                            .0,
                        groups: [gx, gy, 1],
                    });
                }
                Op::Softcap { x, cap } => {
                    let s = shapes[x.0 as usize];
                    let n = Self::rows_of(graph, &s) * s.cols;
                    let a = addr(*x)?;
                    let [gx, gy] = spread(div_up(n, WG as usize));
                    cmds.push(Cmd::Dispatch {
                        kernel: "eltwise".into(),
                        spec: [0, 0],
                        push: Push::default()
                            .u64(a)
                            .u64(a)
                            .u64(addr(node.outputs[0])?)
                            .u32(n as u32)
                            .u32(2)
                            .f32(*cap)
                            .0,
                        groups: [gx, gy, 1],
                    });
                }
                Op::SelectRows { x } => {
                    let cols = shapes[x.0 as usize].cols;
                    cmds.push(Cmd::Dispatch {
                        kernel: "select_rows".into(),
                        spec: [0, 0],
                        push: Push::default()
                            .u64(addr(*x)?)
                            .u64(addr(node.outputs[0])?)
                            .u64(select)
                            .u32(cols as u32)
                            .0,
                        groups: [div_up(cols, WG as usize), graph.selected_rows as u32, 1],
                    });
                }
                Op::Output { x, buffer } => {
                    let s = shapes[x.0 as usize];
                    let size = (Self::rows_of(graph, &s) * s.cols * 4) as u64;
                    let (src, src_offset, _) = loc(*x)?;
                    let dst = self.buffer(*buffer)?.mem.buffer;
                    if size > 0 {
                        cmds.push(Cmd::Copy {
                            src,
                            src_offset,
                            dst,
                            size,
                        });
                    }
                }
            }
            nodes_cmds.push(cmds);
        }

        // Pipelines first (creation may fail; nothing is recorded yet).
        let mut pipes: Vec<Vec<Option<vk::Pipeline>>> = Vec::with_capacity(nodes_cmds.len());
        for cmds in &nodes_cmds {
            let mut v = Vec::new();
            for c in cmds {
                v.push(match c {
                    Cmd::Dispatch { kernel, spec, .. } => Some(self.pipelines.get(&self.gpu, kernel, *spec)?),
                    _ => None,
                });
            }
            pipes.push(v);
        }

        let dev = &self.gpu.device;
        let name = &self.gpu.name;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.gpu.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is ours and used from this thread only.
        let cb = map("vkAllocateCommandBuffers", name, unsafe {
            dev.allocate_command_buffers(&alloc)
        })?[0];
        let queries = match self.gpu.timestamp_period {
            Some(_) => {
                let info = vk::QueryPoolCreateInfo::default()
                    .query_type(vk::QueryType::TIMESTAMP)
                    .query_count(graph.nodes.len() as u32 + 1);
                // SAFETY: a valid create info on our device.
                match unsafe { dev.create_query_pool(&info, None) } {
                    Ok(q) => Some(q),
                    Err(e) => {
                        // SAFETY: the command buffer was never submitted.
                        unsafe { dev.free_command_buffers(self.gpu.pool, &[cb]) };
                        return map("vkCreateQueryPool", name, Err(e));
                    }
                }
            }
            None => None,
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
        let record = || -> Result<(), vk::Result> {
            // SAFETY: `cb` was just allocated from our pool; every handle recorded (pipelines,
            // layout, buffers, query pool) outlives the program, which is released before any
            // of them is destroyed; push-constant sizes are within the layout's 128 bytes.
            unsafe {
                dev.begin_command_buffer(cb, &vk::CommandBufferBeginInfo::default())?;
                if let Some(q) = queries {
                    dev.cmd_reset_query_pool(cb, q, 0, graph.nodes.len() as u32 + 1);
                }
                // Everything submitted before (uploads, other programs) happens before this.
                barrier(
                    vk::PipelineStageFlags::ALL_COMMANDS | vk::PipelineStageFlags::HOST,
                    vk::AccessFlags::MEMORY_WRITE | vk::AccessFlags::HOST_WRITE,
                    work,
                    work_rw,
                );
                if let Some(q) = queries {
                    dev.cmd_write_timestamp(cb, vk::PipelineStageFlags::TOP_OF_PIPE, q, 0);
                }
                let mut bound = vk::Pipeline::null();
                for (i, cmds) in nodes_cmds.iter().enumerate() {
                    for (c, p) in cmds.iter().zip(&pipes[i]) {
                        match c {
                            Cmd::Dispatch { push, groups, .. } => {
                                let p = p.unwrap_or_default();
                                if p != bound {
                                    dev.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, p);
                                    bound = p;
                                }
                                dev.cmd_push_constants(
                                    cb,
                                    self.pipelines.layout,
                                    vk::ShaderStageFlags::COMPUTE,
                                    0,
                                    push,
                                );
                                dev.cmd_dispatch(cb, groups[0], groups[1], groups[2]);
                            }
                            Cmd::Copy {
                                src,
                                src_offset,
                                dst,
                                size,
                            } => {
                                let region = vk::BufferCopy::default()
                                    .src_offset(*src_offset)
                                    .dst_offset(0)
                                    .size(*size);
                                dev.cmd_copy_buffer(cb, *src, *dst, &[region]);
                            }
                            Cmd::Barrier => barrier(work, work_write, work, work_rw),
                        }
                    }
                    if !cmds.is_empty() {
                        barrier(work, work_write, work, work_rw);
                    }
                    if let Some(q) = queries {
                        dev.cmd_write_timestamp(cb, vk::PipelineStageFlags::BOTTOM_OF_PIPE, q, i as u32 + 1);
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
        Ok((cb, queries))
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
        for b in [p.arena, p.scratch].into_iter().flatten() {
            self.memory.destroy(&self.gpu, b);
        }
    }
}
