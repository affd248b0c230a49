//! Programs: a graph planned once (one arena for every value, the step-argument layout, one
//! dispatch list with its parameters and bind groups made at compile) and encoded every step as
//! one command encoder: the input copies, one compute pass, the output copies, one submit.

use tandem_backend_api::kit::check_buffers;
use tandem_backend_api::kit::plan::value_rows;
use tandem_backend_api::kit::top_k;
use tandem_backend_api::{BackendError, BufferId, DType, Graph, Op, ValueId, ValueShape, WeightRef};
use tandem_gpu_kit::attention::{attention_scratch_bytes, attention_splits};
use tandem_gpu_kit::launch::{div_up, spread};
use tandem_gpu_kit::matmul::{dot_columns, dot_rows, DECODE_ROWS};
use tandem_gpu_kit::params::{norm_format, rope_inv_freq, split_ends};
use tandem_gpu_kit::plan::{plan_arena_at, value_bytes};

use crate::attention_tiled;
use crate::fuse::{self, Group};
use crate::kernels::{dot_supported, Format, Kernel, PipelineKey, COVERAGE};
use crate::tuning::{
    coopmat_staged, dot_columns_override, dot_q4k_one_row, f16_items_off, half_fm, half_subgroups,
    matvec_columns_override, matvec_wide_groups, matvec_width_override, q4k_rows_off, q4k_rows_shape,
};
use crate::WgpuBackend;

/// Alignment of values in the arena (bytes).
const ARENA_ALIGN: u64 = 256;

/// Rows from which a matmul takes the tiled kernel instead of matvec: where decode ends
/// (`tandem_gpu_kit::matmul::DECODE_ROWS`, the Vulkan backend's too for block formats).
const TILED_ROWS: usize = DECODE_ROWS;

/// Output columns from which the subgroup matvec takes [`MATVEC_COLUMNS`] per workgroup.
const MATVEC_LONG: usize = 32_768;

/// Output columns per workgroup of the subgroup matvec on a long matrix.
const MATVEC_COLUMNS: usize = 4;

/// The most bytes the f16 staging buffer of the cooperative-matrix prefill path may take (a
/// step's input rows and the largest weight it decodes); a matmul needing more keeps
/// `matmul_coopmat.wgsl`, which stages in workgroup memory.
const HALF_STAGING_MAX: u64 = 256 << 20;

/// The largest head `attention_gqa.wgsl` takes.
const GQA_MAX_HEAD_DIM: usize = 256;

/// Bytes of each dispatch's parameter slot (the uniform-offset alignment WebGPU guarantees).
const PARAM_SLOT: u64 = 256;

/// A weight binding: buffer, byte offset and size of the bound range.
#[derive(Debug, Clone, Copy)]
struct WeightRange {
    buffer: BufferId,
    offset: u64,
    size: u64,
}

/// One dispatch before its pipeline and bind group exist.
struct Planned {
    node: usize,
    key: PipelineKey,
    params: Vec<u32>,
    weight: Option<WeightRange>,
    /// A second weight (binding 6: the next norm's of a NormAdd group).
    weight2: Option<WeightRange>,
    caches: Option<(BufferId, BufferId)>,
    groups: [u32; 3],
}

/// One dispatch, ready to encode.
pub struct Dispatch {
    pub node: usize,
    pub pipeline: wgpu::ComputePipeline,
    pub bind_group: wgpu::BindGroup,
    pub groups: [u32; 3],
}

/// A copy between a buffer of the trait and the arena.
pub struct Copy {
    pub buffer: BufferId,
    /// Byte offset in the arena.
    pub arena_offset: u64,
    pub size: u64,
}

/// Per-node timestamps (when the device has them and profiling was asked for).
pub struct Timestamps {
    pub set: wgpu::QuerySet,
    pub resolve: wgpu::Buffer,
    pub readback: wgpu::Buffer,
}

/// A compiled program.
pub struct Program {
    pub graph: Graph,
    pub arena: wgpu::Buffer,
    pub args: wgpu::Buffer,
    pub params: wgpu::Buffer,
    /// The staging buffer of the cooperative-matrix prefill matmuls (f16 rows) and of the
    /// integer-dot decode matvecs (quantised input), where they run: held for the program's
    /// life (its bind groups use it).
    pub _half: Option<wgpu::Buffer>,
    pub inputs: Vec<Copy>,
    pub outputs: Vec<Copy>,
    pub dispatches: Vec<Dispatch>,
    pub timestamps: Option<Timestamps>,
    /// Bytes of device memory the program holds.
    pub bytes: u64,
    /// The last submission, and whether its timestamps were resolved.
    pub last: Option<wgpu::SubmissionIndex>,
    /// The next step's commands, recorded after the last submission while the device runs it
    /// (a step's commands never depend on its arguments, which live in `args`).
    pub ready: Option<wgpu::CommandBuffer>,
    /// Each `bidirectional_from` of the graph's attentions and the word offset in `args` of
    /// its rows' ends, written each step beside the positions.
    pub ends: Vec<(u32, u32)>,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Row ranges of a weight bound in chunks within the binding limit: each chunk starts at a
/// multiple of the storage offset alignment. Errors name the tensor and the limit.
pub fn weight_chunks(
    what: &str,
    rows: usize,
    row_bytes: u64,
    buffer_size: u64,
    max_binding: u64,
    offset_align: u64,
) -> Result<Vec<(usize, usize, u64, u64)>, BackendError> {
    let total = rows as u64 * row_bytes;
    // The decoders may read the word after a row's last byte: bind 4 bytes past it.
    let bind = |bytes: u64| (bytes + 4).div_ceil(4) * 4;
    if bind(total) <= max_binding {
        return Ok(vec![(0, rows, 0, bind(total).min(buffer_size))]);
    }
    let step = offset_align / gcd(row_bytes, offset_align).max(1);
    let fit = max_binding.saturating_sub(8) / row_bytes.max(1);
    let per = fit / step * step;
    if per == 0 {
        return Err(BackendError::unsupported(
            what,
            format!(
                "one row of {row_bytes} bytes (bound {step} rows at a time for the {offset_align}-byte \
                 offset alignment) exceeds the adapter's max_storage_buffer_binding_size of {max_binding} bytes"
            ),
        ));
    }
    let mut out = Vec::new();
    let mut r0 = 0usize;
    while r0 < rows {
        let r1 = (r0 + per as usize).min(rows);
        let offset = r0 as u64 * row_bytes;
        let size = bind((r1 - r0) as u64 * row_bytes).min(buffer_size - offset);
        out.push((r0, r1, offset, size));
        r0 = r1;
    }
    Ok(out)
}

/// The step-argument buffer's layout in 32-bit words: tokens, positions, slots and selected
/// rows, then each rope's inverse frequencies.
struct Args {
    tokens: u32,
    positions: u32,
    slots: u32,
    select: u32,
    /// Words in all.
    words: usize,
    /// Each `bidirectional_from` of the graph's attentions and the word offset of its rows'
    /// last visible positions (`kit::step::visible_ends`), written each step.
    ends: Vec<(u32, u32)>,
    /// (rope node, word offset, inverse frequencies).
    tables: Vec<(usize, u32, Vec<f32>)>,
}

impl Args {
    fn of(graph: &Graph) -> Args {
        let rows = graph.rows as u32;
        let mut words = 3 * graph.rows + graph.selected_rows;
        let mut ends: Vec<(u32, u32)> = Vec::new();
        for node in &graph.nodes {
            if let Op::Attention {
                bidirectional_from: Some(from),
                ..
            } = &node.op
            {
                if !ends.iter().any(|(f, _)| f == from) {
                    ends.push((*from, words as u32));
                    words += graph.rows;
                }
            }
        }
        let mut tables = Vec::new();
        for (i, node) in graph.nodes.iter().enumerate() {
            if let Op::Rope { head_dim, theta, .. } = &node.op {
                let t = rope_inv_freq(*head_dim, *theta);
                let at = words as u32;
                words += t.len();
                tables.push((i, at, t));
            }
        }
        Args {
            tokens: 0,
            positions: rows,
            slots: 2 * rows,
            select: 3 * rows,
            words,
            ends,
            tables,
        }
    }
}

/// Where a program's values and scratch areas are in its arena, with the fusion and step
/// arguments they were planned for: what choosing each node's dispatches reads.
struct Layout<'a> {
    graph: &'a Graph,
    shapes: &'a [ValueShape],
    fusion: &'a fuse::Fusion,
    /// Per value, its byte offset in the arena.
    offsets: Vec<Option<u64>>,
    /// The arena's bytes: values, attention's partials, top-k's lists.
    arena_bytes: u64,
    /// Byte offset of attention's split partials (`scratch_bytes` of them); `attention_tiled`'s
    /// follow.
    scratch_at: u64,
    scratch_bytes: u64,
    /// Word offset of top-k's two list areas.
    top_k_at: u32,
    args: Args,
}

impl Layout<'_> {
    /// The word offset of value `v` in the arena.
    fn elem(&self, v: ValueId) -> Result<u32, BackendError> {
        self.offsets[v.0 as usize]
            .map(|o| (o / 4) as u32)
            .ok_or_else(|| BackendError::internal(format!("value {} has no storage", v.0)))
    }
}

/// A program's dispatches before their device objects exist, and the copies around its pass.
#[derive(Default)]
struct Dispatches {
    planned: Vec<Planned>,
    /// Bytes of the cooperative-matrix prefill path's f16 staging buffer (0: none).
    half_needed: u64,
    inputs: Vec<Copy>,
    outputs: Vec<Copy>,
}

/// A program's own device buffers.
struct DeviceBuffers {
    arena: wgpu::Buffer,
    /// The staging buffer of the prefill matmuls' f16 rows and decode's quantised inputs.
    half: Option<wgpu::Buffer>,
    args: wgpu::Buffer,
    args_bytes: u64,
    /// One slot of `slot` bytes of parameters per dispatch.
    params: wgpu::Buffer,
    slot: u64,
}

impl WgpuBackend {
    /// Validates, plans and builds `graph`; returns the program and the buffers it uses. The
    /// steps: [`Self::validate`], [`Self::plan_fusion`], [`Self::plan_layout`],
    /// [`Self::plan_dispatches`] (each node's kernels), [`Self::make_buffers`],
    /// [`Self::bind_dispatches`], [`Self::make_timestamps`].
    pub(crate) fn build_program(&mut self, graph: &Graph) -> Result<(Program, Vec<BufferId>), BackendError> {
        let (shapes, used) = self.validate(graph)?;
        let fusion = self.plan_fusion(graph, &shapes);
        let layout = self.plan_layout(graph, &shapes, &fusion)?;
        let d = self.plan_dispatches(&layout)?;
        let b = self.make_buffers(&layout, &d)?;
        let dispatches = self.bind_dispatches(graph, &d.planned, &b)?;
        let timestamps = self.make_timestamps(graph);
        self.gpu.check()?;
        let program = Program {
            graph: graph.clone(),
            bytes: layout.arena_bytes
                + b.args_bytes
                + b.params.size()
                + b.half.as_ref().map_or(0, |h| h.size()),
            arena: b.arena,
            _half: b.half,
            args: b.args,
            params: b.params,
            inputs: d.inputs,
            outputs: d.outputs,
            dispatches,
            timestamps,
            last: None,
            ready: None,
            ends: layout.args.ends.clone(),
        };
        Ok((program, used))
    }

    /// The graph's shapes and the buffers it uses, once every op is one the kernels take
    /// ([`COVERAGE`]) and every buffer it names is one this backend holds, as the graph says.
    fn validate(&self, graph: &Graph) -> Result<(Vec<ValueShape>, Vec<BufferId>), BackendError> {
        let shapes = graph.infer_shapes()?;
        tandem_gpu_kit::check_ops(graph, &COVERAGE)?;
        let used = check_buffers(graph, &shapes, |id| self.buffers.get(id).map(|b| b.desc.clone()))?;
        Ok((shapes, used))
    }

    /// Which nodes run as one kernel (`fuse`): a GeGlu in decode's matvec only where the weight
    /// is bound whole (both halves in reach).
    fn plan_fusion(&self, graph: &Graph, shapes: &[ValueShape]) -> fuse::Fusion {
        let max_binding = self.gpu.limits.max_storage_buffer_binding_size;
        let align = u64::from(self.gpu.limits.min_storage_buffer_offset_alignment);
        let geglu_ok = |i: usize| match &graph.nodes[i].op {
            Op::MatMul { x, weight, .. } => {
                let (n, k) = (weight.desc.shape[0], weight.desc.shape[1]);
                let row_bytes = weight.desc.dtype.row_bytes(k).unwrap_or(0) as u64;
                value_rows(graph, &shapes[x.0 as usize]) < TILED_ROWS
                    && Format::for_rows(weight.desc.dtype, k).is_some()
                    && self.buffers.get(weight.buffer).is_ok_and(|b| {
                        weight_chunks("", n, row_bytes, b.size, max_binding, align)
                            .is_ok_and(|c| c.len() == 1)
                    })
            }
            _ => false,
        };
        fuse::plan(graph, shapes, self.fuse, &geglu_ok)
    }

    /// The arena (every value, fused groups at their last node, outputs live to the end as
    /// they are copied out after the pass; then the inputs' values, copied in before it;
    /// attention's partials; top-k's lists) and the step arguments. An arena past the
    /// adapter's binding limit is `Unsupported`.
    fn plan_layout<'a>(
        &self,
        graph: &'a Graph,
        shapes: &'a [ValueShape],
        fusion: &'a fuse::Fusion,
    ) -> Result<Layout<'a>, BackendError> {
        let max_binding = self.gpu.limits.max_storage_buffer_binding_size;
        let last = graph.nodes.len().saturating_sub(1);
        let time: Vec<usize> = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                if matches!(n.op, Op::Output { .. }) {
                    last
                } else {
                    fusion.time[i]
                }
            })
            .collect();
        let (mut offsets, mut arena_bytes) = plan_arena_at(graph, shapes, ARENA_ALIGN, &time);
        // The values of Input nodes are copied into the arena before the pass.
        for node in &graph.nodes {
            if let Op::Input { .. } = node.op {
                let v = node.outputs[0].0 as usize;
                offsets[v] = Some(arena_bytes);
                arena_bytes += value_bytes(graph, &shapes[v], ARENA_ALIGN);
            }
        }
        // Attention's per-split partials after the values, attention_tiled's after attention's.
        let workgroup_limit = self.gpu.limits.max_compute_workgroup_storage_size;
        let scratch_bytes = attention_scratch_bytes(graph);
        let scratch_at = arena_bytes;
        arena_bytes += scratch_bytes + attention_tiled::scratch_bytes(graph, workgroup_limit);
        // Top-k's lists after them.
        let top_k_at = (arena_bytes / 4) as u32;
        arena_bytes += top_k::scratch_bytes(graph, shapes);
        // A whole number of 16-byte values (the arena is also bound as vec4s).
        let arena_bytes = arena_bytes.max(16).next_multiple_of(16);
        if arena_bytes > max_binding || arena_bytes > self.gpu.limits.max_buffer_size {
            return Err(BackendError::unsupported(
                "compile",
                format!(
                    "graph '{}' needs an arena of {arena_bytes} bytes for its values, over the adapter's \
                     max_storage_buffer_binding_size of {max_binding} bytes (fewer rows per step fit)",
                    graph.name
                ),
            ));
        }
        Ok(Layout {
            graph,
            shapes,
            fusion,
            offsets,
            arena_bytes,
            scratch_at,
            scratch_bytes,
            top_k_at,
            args: Args::of(graph),
        })
    }

    /// Every node's dispatches in graph order: a fused group's at its last node
    /// ([`Self::plan_group`]), each other node's by [`Self::plan_node`].
    fn plan_dispatches(&self, l: &Layout) -> Result<Dispatches, BackendError> {
        let mut groups_at: Vec<Option<Group>> = vec![None; l.graph.nodes.len()];
        for g in &l.fusion.groups {
            if !matches!(g, Group::Single(_)) {
                groups_at[g.at()] = Some(*g);
            }
        }
        let elem = |v: ValueId| l.elem(v);
        let mut d = Dispatches::default();
        for (i, group) in groups_at.iter().enumerate() {
            if let Some(g) = *group {
                d.planned.extend(self.plan_group(
                    l.graph,
                    l.shapes,
                    g,
                    &elem,
                    &l.args.tables,
                    l.args.positions,
                    l.args.slots,
                )?);
                continue;
            }
            if l.fusion.time[i] != i {
                // In a fused group that runs later.
                continue;
            }
            self.plan_node(l, i, &mut d)?;
        }
        Ok(d)
    }

    /// The dispatches (or copies) of node `i`, run by itself.
    fn plan_node(&self, l: &Layout, i: usize, d: &mut Dispatches) -> Result<(), BackendError> {
        let (graph, shapes) = (l.graph, l.shapes);
        let node = &graph.nodes[i];
        let elem = |v: ValueId| l.elem(v);
        let rows_of = |x: &ValueId| value_rows(graph, &shapes[x.0 as usize]);
        let rows = graph.rows as u32;
        let (tokens, positions, select) = (l.args.tokens, l.args.positions, l.args.select);
        let top_k_at = l.top_k_at;
        let max_binding = self.gpu.limits.max_storage_buffer_binding_size;
        let align = u64::from(self.gpu.limits.min_storage_buffer_offset_alignment);
        let tables = &l.args.tables;
        let planned = &mut d.planned;
        match &node.op {
            Op::Input { buffer, .. } => {
                let v = node.outputs[0];
                let s = shapes[v.0 as usize];
                d.inputs.push(Copy {
                    buffer: *buffer,
                    arena_offset: u64::from(elem(v)?) * 4,
                    size: (value_rows(graph, &s) * s.cols * 4) as u64,
                });
            }
            Op::Output { x, buffer } => {
                let s = shapes[x.0 as usize];
                d.outputs.push(Copy {
                    buffer: *buffer,
                    arena_offset: u64::from(elem(*x)?) * 4,
                    size: (value_rows(graph, &s) * s.cols * 4) as u64,
                });
            }
            Op::Embed { table, scale, extra } => {
                // The table's rows, scaled; then images' rows past the vocabulary (f32, as
                // they are), each dispatch writing the rows whose token falls in its range. The
                // extra table is bound where it is, so the host may rewrite it between steps.
                let vocab = table.desc.shape[0];
                let parts = std::iter::once((table, *scale, 0)).chain(extra.iter().map(|e| (e, 1.0, vocab)));
                for (table, scale, first) in parts {
                    let (n, cols) = (table.desc.shape[0], table.desc.shape[1]);
                    let dt = table.desc.dtype;
                    let format = Format::for_rows(dt, cols)
                        .ok_or_else(|| BackendError::unsupported(node.op.name(), "no decoder"))?;
                    let row_bytes = dt.row_bytes(cols).unwrap_or(0) as u64;
                    let buf = self.buffers.get(table.buffer)?;
                    let what = format!("embedding table {}", table.desc);
                    for (r0, r1, offset, size) in
                        weight_chunks(&what, n, row_bytes, buf.size, max_binding, align)?
                    {
                        planned.push(Planned {
                            node: i,
                            key: (Kernel::Embed, Some(format), 0),
                            params: vec![
                                elem(node.outputs[0])?,
                                tokens,
                                cols as u32,
                                row_bytes as u32,
                                (first + r0) as u32,
                                (first + r1) as u32,
                                scale.to_bits(),
                            ],
                            weight: Some(WeightRange {
                                buffer: table.buffer,
                                offset,
                                size,
                            }),
                            weight2: None,
                            caches: None,
                            groups: [div_up(cols / format.group(), 64), rows, 1],
                        });
                    }
                }
            }
            Op::RmsNorm {
                x,
                weight,
                eps,
                weight_offset,
            } => {
                let cols = shapes[x.0 as usize].cols;
                let group = weight.desc.numel();
                let wfmt = norm_format(weight.desc.dtype);
                let buf = self.buffers.get(weight.buffer)?;
                planned.push(Planned {
                    node: i,
                    key: (Kernel::RmsNorm, None, 0),
                    params: vec![
                        elem(*x)?,
                        elem(node.outputs[0])?,
                        cols as u32,
                        group as u32,
                        eps.to_bits(),
                        weight_offset.to_bits(),
                        wfmt,
                    ],
                    weight: Some(WeightRange {
                        buffer: weight.buffer,
                        offset: 0,
                        size: buf.size,
                    }),
                    weight2: None,
                    caches: None,
                    groups: [(cols / group) as u32, rows_of(x) as u32, 1],
                });
            }
            Op::MatMul { x, weight, splits } => self.plan_matmul(l, i, x, weight, splits, d)?,
            Op::Rope {
                x, head_dim, factor, ..
            } => {
                let cols = shapes[x.0 as usize].cols;
                let table = tables.iter().find(|t| t.0 == i).map_or(0, |t| t.1);
                planned.push(Planned {
                    node: i,
                    key: (Kernel::Rope, None, 0),
                    params: vec![
                        elem(*x)?,
                        elem(node.outputs[0])?,
                        positions,
                        table,
                        cols as u32,
                        *head_dim as u32,
                        factor.to_bits(),
                    ],
                    weight: None,
                    weight2: None,
                    caches: None,
                    groups: [div_up(cols / 2, 64), rows_of(x) as u32, 1],
                });
            }
            Op::Attention { .. } => self.plan_attention(l, i, planned)?,
            Op::GeGlu { gate: a, up: b } | Op::Add { a, b } => {
                let s = shapes[a.0 as usize];
                let n = value_rows(graph, &s) * s.cols;
                let op = u32::from(matches!(node.op, Op::GeGlu { .. }));
                let [gx, gy] = spread(div_up(n, 64));
                planned.push(Planned {
                    node: i,
                    key: (Kernel::Eltwise, None, 0),
                    params: vec![elem(*a)?, elem(*b)?, elem(node.outputs[0])?, n as u32, op, 0],
                    weight: None,
                    weight2: None,
                    caches: None,
                    groups: [gx, gy, 1],
                });
            }
            Op::LayerNorm { x, weight, bias, eps } => {
                let cols = shapes[x.0 as usize].cols;
                let whole = |w: &tandem_backend_api::WeightRef| -> Result<WeightRange, BackendError> {
                    Ok(WeightRange {
                        buffer: w.buffer,
                        offset: 0,
                        size: self.buffers.get(w.buffer)?.size,
                    })
                };
                planned.push(Planned {
                    node: i,
                    key: (Kernel::LayerNorm, None, 0),
                    params: vec![
                        elem(*x)?,
                        elem(node.outputs[0])?,
                        cols as u32,
                        eps.to_bits(),
                        norm_format(weight.desc.dtype),
                        norm_format(bias.desc.dtype),
                    ],
                    weight: Some(whole(weight)?),
                    weight2: Some(whole(bias)?),
                    caches: None,
                    groups: [1, rows_of(x) as u32, 1],
                });
            }
            Op::Bias { x, .. } | Op::Gelu { x } => {
                let s = shapes[x.0 as usize];
                let n = value_rows(graph, &s) * s.cols;
                let [gx, gy] = spread(div_up(n, 64));
                let (key, params, weight) = match &node.op {
                    Op::Bias { bias, .. } => (
                        Kernel::Bias,
                        vec![
                            elem(*x)?,
                            elem(node.outputs[0])?,
                            n as u32,
                            s.cols as u32,
                            norm_format(bias.desc.dtype),
                        ],
                        Some(WeightRange {
                            buffer: bias.buffer,
                            offset: 0,
                            size: self.buffers.get(bias.buffer)?.size,
                        }),
                    ),
                    _ => (
                        Kernel::Gelu,
                        vec![elem(*x)?, elem(node.outputs[0])?, n as u32],
                        None,
                    ),
                };
                planned.push(Planned {
                    node: i,
                    key: (key, None, 0),
                    params,
                    weight,
                    weight2: None,
                    caches: None,
                    groups: [gx, gy, 1],
                });
            }
            Op::BlockAttention {
                q,
                k,
                v,
                heads,
                head_dim,
                scale,
                block,
            } => {
                let rows = rows_of(q);
                // Heads up to 256 where the adapter has the workgroup memory: tiles of 32 query
                // rows sharing each key tile (`block_attention_tiled.wgsl`); else a workgroup per
                // (head, row).
                let tiled = *head_dim <= tandem_gpu_kit::attention::TILED_MAX_HEAD_DIM
                    && self.gpu.limits.max_compute_workgroup_storage_size >= attention_tiled::WORKGROUP_BYTES;
                let (kernel, groups) = if tiled {
                    let tiles = div_up(rows, attention_tiled::BLOCK_ROWS);
                    (Kernel::BlockAttentionTiled, [*heads as u32, tiles, 1])
                } else {
                    let [gx, gy] = spread((rows * heads) as u32);
                    (Kernel::BlockAttention, [gx, gy, 1])
                };
                planned.push(Planned {
                    node: i,
                    key: (kernel, None, 0),
                    params: vec![
                        elem(*q)?,
                        elem(*k)?,
                        elem(*v)?,
                        elem(node.outputs[0])?,
                        *heads as u32,
                        *head_dim as u32,
                        rows as u32,
                        *block as u32,
                        scale.to_bits(),
                    ],
                    weight: None,
                    weight2: None,
                    caches: None,
                    groups,
                });
            }
            Op::Softcap { x, cap } => {
                let s = shapes[x.0 as usize];
                let n = value_rows(graph, &s) * s.cols;
                let [gx, gy] = spread(div_up(n, 64));
                let a = elem(*x)?;
                planned.push(Planned {
                    node: i,
                    key: (Kernel::Eltwise, None, 0),
                    params: vec![a, a, elem(node.outputs[0])?, n as u32, 2, cap.to_bits()],
                    weight: None,
                    weight2: None,
                    caches: None,
                    groups: [gx, gy, 1],
                });
            }
            Op::TopK { x, k } => {
                // The passes `kit::top_k` plans; their lists in the two areas after the
                // attention scratch, written in turn.
                let s = shapes[x.0 as usize];
                let rows = value_rows(graph, &s);
                let passes = top_k::passes(s.cols, *k);
                let area = (top_k::area_bytes(rows, s.cols, *k) / 4) as u32;
                let areas = [top_k_at, top_k_at + area];
                let count = passes.len();
                for (p, pass) in passes.iter().enumerate() {
                    let last = p + 1 == count;
                    let src = if pass.from_values {
                        elem(*x)?
                    } else {
                        areas[(p + 1) % 2]
                    };
                    let dst = if last {
                        elem(node.outputs[0])?
                    } else {
                        areas[p % 2]
                    };
                    planned.push(Planned {
                        node: i,
                        key: (Kernel::TopK, None, 0),
                        params: vec![
                            src,
                            dst,
                            pass.n as u32,
                            *k as u32,
                            pass.per as u32,
                            u32::from(pass.from_values),
                            u32::from(last),
                            pass.groups as u32,
                        ],
                        weight: None,
                        weight2: None,
                        caches: None,
                        groups: [pass.groups as u32, rows as u32, 1],
                    });
                }
            }
            Op::SelectRows { x } => {
                let cols = shapes[x.0 as usize].cols;
                planned.push(Planned {
                    node: i,
                    key: (Kernel::SelectRows, None, 0),
                    params: vec![elem(*x)?, elem(node.outputs[0])?, select, cols as u32],
                    weight: None,
                    weight2: None,
                    caches: None,
                    groups: [div_up(cols, 64), graph.selected_rows as u32, 1],
                });
            }
        }
        Ok(())
    }

    /// A matmul node's dispatches: per chunk of weight rows bound, the cooperative-matrix
    /// prefill path (the input staged as f16 once, each chunk read in place or decoded to f16),
    /// the tiled kernel from [`TILED_ROWS`] rows, else decode's matvec
    /// ([`Self::decode_matvec`]), after the input's quantisation where it takes integer dots.
    fn plan_matmul(
        &self,
        l: &Layout,
        i: usize,
        x: &ValueId,
        weight: &WeightRef,
        splits: &[usize],
        d: &mut Dispatches,
    ) -> Result<(), BackendError> {
        let node = &l.graph.nodes[i];
        let elem = |v: ValueId| l.elem(v);
        let rows_of = |x: &ValueId| value_rows(l.graph, &l.shapes[x.0 as usize]);
        let max_binding = self.gpu.limits.max_storage_buffer_binding_size;
        let align = u64::from(self.gpu.limits.min_storage_buffer_offset_alignment);
        let (n, k) = (weight.desc.shape[0], weight.desc.shape[1]);
        let dt = weight.desc.dtype;
        let format =
            Format::for_rows(dt, k).ok_or_else(|| BackendError::unsupported(node.op.name(), "no decoder"))?;
        let row_bytes = dt.row_bytes(k).unwrap_or(0) as u64;
        let m = rows_of(x);
        let mut dsts = [0u32; 4];
        for (s, out) in node.outputs.iter().take(splits.len()).enumerate() {
            dsts[s] = elem(*out)?;
        }
        let ends = split_ends(splits, n);
        let buf = self.buffers.get(weight.buffer)?;
        let what = format!("weight {}", weight.desc);
        let chunks = weight_chunks(&what, n, row_bytes, buf.size, max_binding, align)?;
        // The cooperative-matrix prefill path: the input rows staged as f16 once,
        // each chunk read in place (f16 rows needing no padding) or decoded to f16.
        let ((sgm, sgn), fm) = (half_subgroups(), half_fm());
        let (bm, bn) = (16 * fm * sgm, 64 * sgn);
        let kp = k.next_multiple_of(16);
        let mp = m.next_multiple_of(bm);
        let native = |count: usize| dt == DType::F16 && k.is_multiple_of(16) && count.is_multiple_of(bn);
        let decoded = chunks
            .iter()
            .filter(|c| !native(c.1 - c.0))
            .map(|c| (c.1 - c.0).next_multiple_of(bn) * kp)
            .max()
            .unwrap_or(0);
        let half_bytes = 2 * (mp * kp + decoded) as u64;
        let half = m >= TILED_ROWS
            && self.gpu.variant.coopmat
            && !coopmat_staged()
            && mp <= 65_535
            && half_bytes <= HALF_STAGING_MAX.min(max_binding);
        // Params (matmul_common.wgsl) of the chunk of rows r0 .. r0 + count.
        let x_at = elem(*x)?;
        let chunk_params = |r0: usize, count: usize| {
            vec![
                x_at,
                k as u32,
                m as u32,
                row_bytes as u32,
                r0 as u32,
                count as u32,
                n as u32,
                dsts[0],
                dsts[1],
                dsts[2],
                dsts[3],
                ends[0],
                ends[1],
                ends[2],
            ]
        };
        // The same with the staging fields: the input rows at 0, the weight rows
        // at h_b, np staged weight rows.
        let half_params = |r0: usize, count: usize, h_b: usize, np: usize| {
            let mut v = chunk_params(r0, count);
            v.extend([0, h_b as u32, kp as u32, np as u32]);
            v
        };
        let dot = self.dot_takes(m, k, dt);
        if dot {
            d.planned
                .push(quantize_planned(i, chunk_params(0, 0), m, k, !self.narrow));
        }
        if half {
            d.half_needed = d.half_needed.max(half_bytes);
            d.planned.push(Planned {
                node: i,
                key: (Kernel::StageHalf, None, 0),
                params: half_params(0, 0, 0, 0),
                weight: None,
                weight2: None,
                caches: None,
                groups: [div_up(kp / 4, 64), mp as u32, 1],
            });
        }
        for (r0, r1, offset, size) in chunks {
            let count = r1 - r0;
            let params = chunk_params(r0, count);
            let weight = Some(WeightRange {
                buffer: weight.buffer,
                offset,
                size,
            });
            if half {
                let np = count.next_multiple_of(bn);
                let in_place = native(count);
                if !in_place {
                    d.planned.push(Planned {
                        node: i,
                        key: (Kernel::DequantHalf, Some(format), 0),
                        params: half_params(r0, count, mp * kp, np),
                        weight,
                        weight2: None,
                        caches: None,
                        groups: [div_up(kp / 4, 64), np.min(32_768) as u32, div_up(np, 32_768)],
                    });
                }
                // In place, the weight rows are the bound f16 rows themselves.
                let h_b = if in_place { 0 } else { mp * kp };
                d.planned.push(Planned {
                    node: i,
                    key: (
                        if in_place {
                            Kernel::MatMulHalfNative
                        } else {
                            Kernel::MatMulHalf
                        },
                        None,
                        (sgm | sgn << 8 | fm << 16) as u32,
                    ),
                    params: half_params(r0, count, h_b, np),
                    weight: in_place.then_some(weight).flatten(),
                    weight2: None,
                    caches: None,
                    groups: [(mp / bm) as u32, (np / bn) as u32, 1],
                });
            } else if m >= TILED_ROWS {
                let (tile_n, tile_m) = self.gpu.variant.matmul_tile();
                d.planned.push(Planned {
                    node: i,
                    key: (Kernel::MatMulTiled, Some(format), 0),
                    params,
                    weight,
                    weight2: None,
                    caches: None,
                    groups: [div_up(count, tile_n), div_up(m, tile_m), 1],
                });
            } else {
                let (key, groups) = self.decode_matvec(m, count, k, format, offset, false);
                d.planned.push(Planned {
                    node: i,
                    key,
                    params,
                    weight,
                    weight2: None,
                    caches: None,
                    groups,
                });
            }
        }
        Ok(())
    }

    /// An attention node's dispatches: the K/V store (unless its NormRope group stored them),
    /// `attention_tiled` first for prefill (and the combination of its splits), then
    /// `attention_gqa` for decode with grouped queries or `attention` for the rows left, and
    /// the combination of their splits. With `bidirectional_from` (images' blocks) each of them
    /// takes its `IMAGE_ROWS` variant (pipeline key 1), reading every row's end from the step
    /// arguments (written at `execute`); text attentions keep variant 0.
    fn plan_attention(&self, l: &Layout, i: usize, planned: &mut Vec<Planned>) -> Result<(), BackendError> {
        let graph = l.graph;
        let node = &graph.nodes[i];
        let Op::Attention {
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
            bidirectional_from,
        } = &node.op
        else {
            return Err(BackendError::internal(format!("node {i} is not an attention")));
        };
        // Images' blocks: the kernels' IMAGE_ROWS variant (pipeline key 1), reading each row's
        // end from the step arguments; text attentions keep their variant 0.
        let (image, ends) = match bidirectional_from {
            Some(from) => {
                let at = l.args.ends.iter().find(|(f, _)| f == from).map(|(_, at)| *at);
                (
                    1,
                    at.ok_or_else(|| BackendError::internal("no ends for bidirectional_from"))?,
                )
            }
            None => (0, 0),
        };
        let elem = |v: ValueId| l.elem(v);
        let rows = graph.rows as u32;
        let (positions, slots_at) = (l.args.positions, l.args.slots);
        let (scratch_at, scratch_bytes) = (l.scratch_at, l.scratch_bytes);
        let workgroup_limit = self.gpu.limits.max_compute_workgroup_storage_size;
        let fusion = l.fusion;
        let f16 = u32::from(cache.dtype == DType::F16);
        let kv_cols = kv_heads * head_dim;
        let per_invocation = if f16 == 1 { 2 } else { 1 };
        // Stored by the NormRope group that makes K.
        if !fusion.stored[i] {
            planned.push(Planned {
                node: i,
                key: (Kernel::KvStore, None, 0),
                params: vec![
                    elem(*k)?,
                    elem(*v)?,
                    positions,
                    slots_at,
                    kv_cols as u32,
                    cache.capacity as u32,
                    f16,
                ],
                weight: None,
                weight2: None,
                caches: Some((cache.k, cache.v)),
                groups: [div_up(kv_cols.div_ceil(per_invocation), 64), rows, 1],
            });
        }
        let splits = attention_splits(graph.rows, *heads, *window, cache.capacity);
        let out = elem(node.outputs[0])?;
        let partial = (scratch_at / 4) as u32;
        // Prefill: attention_tiled first, over the blocks of rows of one slot; the
        // plain kernel below then skips those rows.
        let tiled = attention_tiled::use_tiled(graph.rows, *head_dim, workgroup_limit);
        let skip_block = if tiled {
            attention_tiled::BLOCK_ROWS as u32
        } else {
            0
        };
        if tiled {
            let tsplits = attention_tiled::splits(graph.rows, *heads) as u32;
            let tpartial = ((scratch_at + scratch_bytes) / 4) as u32;
            planned.push(Planned {
                node: i,
                key: (Kernel::AttentionTiled, None, image),
                params: vec![
                    elem(*q)?,
                    out,
                    positions,
                    slots_at,
                    tpartial,
                    *heads as u32,
                    *kv_heads as u32,
                    *head_dim as u32,
                    cache.capacity as u32,
                    scale.to_bits(),
                    window.unwrap_or(0) as u32,
                    softcap.unwrap_or(0.0).to_bits(),
                    f16,
                    tsplits,
                    0, // coop: attention.wgsl's
                    0, // skip_block: attention.wgsl's
                    rows,
                    ends,
                ],
                weight: None,
                weight2: None,
                caches: Some((cache.k, cache.v)),
                groups: [
                    *heads as u32,
                    div_up(graph.rows, attention_tiled::BLOCK_ROWS),
                    tsplits,
                ],
            });
            if tsplits > 1 {
                planned.push(Planned {
                    node: i,
                    key: (Kernel::AttentionCombine, None, 0),
                    params: vec![
                        tpartial,
                        out,
                        *heads as u32,
                        *head_dim as u32,
                        tsplits,
                        slots_at,
                        skip_block,
                        1,
                    ],
                    weight: None,
                    weight2: None,
                    caches: None,
                    groups: [*heads as u32, rows, 1],
                });
            }
        }
        // Decode with grouped queries: by KV head, each K/V row read once per group.
        // The subgroup variant takes heads of an even size (pairs of dimensions).
        let gqa = graph.rows < TILED_ROWS
            && heads > kv_heads
            && *head_dim <= GQA_MAX_HEAD_DIM
            && (!self.gpu.variant.subgroups || head_dim.is_multiple_of(2));
        // The rows attention_tiled leaves are the plain kernel's (it has skip_block).
        let gqa = gqa && !tiled;
        let (kernel, first_groups) = if gqa {
            (Kernel::AttentionGqa, *kv_heads as u32)
        } else {
            (Kernel::Attention, *heads as u32)
        };
        planned.push(Planned {
            node: i,
            key: (kernel, None, image),
            params: vec![
                elem(*q)?,
                out,
                positions,
                slots_at,
                partial,
                *heads as u32,
                *kv_heads as u32,
                *head_dim as u32,
                cache.capacity as u32,
                scale.to_bits(),
                window.unwrap_or(0) as u32,
                softcap.unwrap_or(0.0).to_bits(),
                f16,
                splits as u32,
                // Cooperative scoring for single-row steps only: on the H100 it
                // raised batch-1 decode and lowered batch-8 decode and prefill.
                u32::from(graph.rows == 1),
                skip_block,
                rows,
                ends,
            ],
            weight: None,
            weight2: None,
            caches: Some((cache.k, cache.v)),
            groups: [first_groups, rows, splits as u32],
        });
        if splits > 1 {
            planned.push(Planned {
                node: i,
                key: (Kernel::AttentionCombine, None, 0),
                params: vec![
                    partial,
                    out,
                    *heads as u32,
                    *head_dim as u32,
                    splits as u32,
                    slots_at,
                    skip_block,
                    if tiled { 2 } else { 0 },
                ],
                weight: None,
                weight2: None,
                caches: None,
                groups: [*heads as u32, rows, 1],
            });
        }
        Ok(())
    }

    /// The program's own buffers: its arena, the staging buffer its matmuls share (where any
    /// takes it; past the binding limit `Unsupported`), the step arguments with the rope
    /// tables written, and every dispatch's parameters written into their slots.
    fn make_buffers(&self, l: &Layout, d: &Dispatches) -> Result<DeviceBuffers, BackendError> {
        let max_binding = self.gpu.limits.max_storage_buffer_binding_size;
        let dev = &self.gpu.device;
        let arena = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("program arena"),
            size: l.arena_bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        // The staging buffer, which the matmuls of the program take in turn: the prefill
        // matmuls' f16 rows (binding 7), decode's quantised input rows (binding 10).
        let dot_needed = d
            .planned
            .iter()
            .filter(|p| p.key.0 == Kernel::QuantizeQ8)
            .map(|p| dot_input_bytes(p.params[2] as usize, p.params[1] as usize, !self.narrow))
            .max()
            .unwrap_or(0);
        let staging_needed = d.half_needed.max(dot_needed);
        if staging_needed > max_binding {
            return Err(BackendError::unsupported(
                "compile",
                format!(
                    "graph '{}' needs a staging buffer of {staging_needed} bytes, over the adapter's \
                     max_storage_buffer_binding_size of {max_binding} bytes",
                    l.graph.name
                ),
            ));
        }
        let half = (staging_needed > 0).then(|| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some("staging"),
                size: staging_needed.next_multiple_of(16),
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        });
        let args_bytes = ((l.args.words * 4) as u64).max(16).div_ceil(4) * 4;
        let args = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("step arguments"),
            size: args_bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        for (_, at, t) in &l.args.tables {
            let bytes: &[u8] = bytemuck::cast_slice(t);
            self.gpu.queue.write_buffer(&args, u64::from(*at) * 4, bytes);
        }
        let slot = PARAM_SLOT.max(u64::from(self.gpu.limits.min_uniform_buffer_offset_alignment));
        let params = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dispatch parameters"),
            size: (d.planned.len() as u64).max(1) * slot,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut all_params = vec![0u8; (d.planned.len() as u64 * slot) as usize];
        for (j, p) in d.planned.iter().enumerate() {
            let bytes: &[u8] = bytemuck::cast_slice(&p.params);
            let at = j * slot as usize;
            all_params[at..at + bytes.len()].copy_from_slice(bytes);
        }
        if !all_params.is_empty() {
            self.gpu.queue.write_buffer(&params, 0, &all_params);
        }
        Ok(DeviceBuffers {
            arena,
            half,
            args,
            args_bytes,
            params,
            slot,
        })
    }

    /// Each planned dispatch's pipeline and bind group: its parameter slot, the arena, the
    /// step arguments, its weights, caches and staging buffer as its kernel's bindings say.
    fn bind_dispatches(
        &mut self,
        graph: &Graph,
        planned: &[Planned],
        b: &DeviceBuffers,
    ) -> Result<Vec<Dispatch>, BackendError> {
        let max_binding = self.gpu.limits.max_storage_buffer_binding_size;
        let mut dispatches = Vec::with_capacity(planned.len());
        for (j, p) in planned.iter().enumerate() {
            let pipeline = self.pipelines.get(&self.gpu.device, p.key)?;
            let layout = pipeline.get_bind_group_layout(0);
            let mut entries: Vec<wgpu::BindGroupEntry<'_>> = Vec::new();
            for &binding in p.key.0.bindings(p.key.1, self.gpu.variant) {
                let resource = match binding {
                    0 => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &b.params,
                        offset: j as u64 * b.slot,
                        size: wgpu::BufferSize::new(PARAM_SLOT.min(b.slot)),
                    }),
                    // 8: the arena again, as 16-byte values (matvec_q4k.wgsl).
                    1 | 8 => b.arena.as_entire_binding(),
                    2 => b.args.as_entire_binding(),
                    // 9: the weights again, as 16-byte words (matvec_q4k.wgsl).
                    3 | 9 => {
                        let w = p
                            .weight
                            .ok_or_else(|| BackendError::internal("a weight kernel without a weight"))?;
                        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &self.buffers.get(w.buffer)?.buf,
                            offset: w.offset,
                            size: wgpu::BufferSize::new(w.size),
                        })
                    }
                    6 => {
                        let w = p.weight2.ok_or_else(|| {
                            BackendError::internal("a two-weight kernel without its second")
                        })?;
                        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &self.buffers.get(w.buffer)?.buf,
                            offset: w.offset,
                            size: wgpu::BufferSize::new(w.size),
                        })
                    }
                    4 | 5 => {
                        let (kc, vc) = p
                            .caches
                            .ok_or_else(|| BackendError::internal("an attention kernel without caches"))?;
                        let id = if binding == 4 { kc } else { vc };
                        let buf = self.buffers.get(id)?;
                        if buf.size > max_binding {
                            return Err(BackendError::unsupported(
                                node_name(graph, p.node),
                                format!(
                                    "KV cache {} of {} bytes exceeds the adapter's \
                                     max_storage_buffer_binding_size of {max_binding} bytes",
                                    buf.desc, buf.size
                                ),
                            ));
                        }
                        buf.buf.as_entire_binding()
                    }
                    7 | 10 => b
                        .half
                        .as_ref()
                        .ok_or_else(|| BackendError::internal("a matmul without its staging buffer"))?
                        .as_entire_binding(),
                    _ => return Err(BackendError::internal(format!("binding {binding}"))),
                };
                entries.push(wgpu::BindGroupEntry { binding, resource });
            }
            let bind_group = self.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &layout,
                entries: &entries,
            });
            dispatches.push(Dispatch {
                node: p.node,
                pipeline,
                bind_group,
                groups: p.groups,
            });
        }
        Ok(dispatches)
    }

    /// Per-node timestamps (a query set, its resolve and readback buffers) where the adapter
    /// has timestamps inside passes and profiling was asked for.
    fn make_timestamps(&self, graph: &Graph) -> Option<Timestamps> {
        let dev = &self.gpu.device;
        if self.gpu.timestamps {
            let count = graph.nodes.len() as u32 + 1;
            let bytes = u64::from(count) * 8;
            Some(Timestamps {
                set: dev.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("node timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count,
                }),
                resolve: dev.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("timestamp resolve"),
                    size: bytes,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }),
                readback: dev.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("timestamp readback"),
                    size: bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
            })
        } else {
            None
        }
    }

    /// The dispatches of a fused group (`fuse::Group`, never `Single`): one, or for a
    /// MatMulGeGlu on the integer-dot path the input's quantisation and then the matvec.
    #[allow(clippy::too_many_arguments)]
    fn plan_group(
        &self,
        graph: &Graph,
        shapes: &[tandem_backend_api::ValueShape],
        group: Group,
        elem: &dyn Fn(ValueId) -> Result<u32, BackendError>,
        tables: &[(usize, u32, Vec<f32>)],
        positions: u32,
        slots_at: u32,
    ) -> Result<Vec<Planned>, BackendError> {
        let out = |i: usize| {
            graph.nodes[i]
                .outputs
                .first()
                .copied()
                .ok_or_else(|| BackendError::internal(format!("node {i} has no output")))
        };
        let norm_weight = |w: &tandem_backend_api::WeightRef| -> Result<WeightRange, BackendError> {
            Ok(WeightRange {
                buffer: w.buffer,
                offset: 0,
                size: self.buffers.get(w.buffer)?.size,
            })
        };
        let bad = || BackendError::internal(format!("fused group {group:?} does not match its nodes"));
        match group {
            Group::Single(_) => Err(bad()),
            Group::MatMulGeGlu { matmul, geglu } => {
                let Op::MatMul { x, weight, .. } = &graph.nodes[matmul].op else {
                    return Err(bad());
                };
                let (n, k) = (weight.desc.shape[0], weight.desc.shape[1]);
                let half = n / 2;
                let format = Format::for_rows(weight.desc.dtype, k).ok_or_else(bad)?;
                let row_bytes = weight.desc.dtype.row_bytes(k).unwrap_or(0) as u64;
                let m = value_rows(graph, &shapes[x.0 as usize]);
                let buf = self.buffers.get(weight.buffer)?;
                let bind = (n as u64 * row_bytes + 4).div_ceil(4) * 4;
                let dot = self.dot_takes(m, k, weight.desc.dtype);
                let (key, groups) = self.decode_matvec(m, half, k, format, 0, true);
                let out = elem(out(geglu)?)?;
                let params = vec![
                    elem(*x)?,
                    k as u32,
                    m as u32,
                    row_bytes as u32,
                    0,
                    half as u32,
                    half as u32,
                    out,
                    out,
                    out,
                    out,
                    half as u32,
                    half as u32,
                    half as u32,
                ];
                let mut v = Vec::new();
                if dot {
                    v.push(quantize_planned(group.at(), params.clone(), m, k, !self.narrow));
                }
                v.push(Planned {
                    node: group.at(),
                    key,
                    params,
                    weight: Some(WeightRange {
                        buffer: weight.buffer,
                        offset: 0,
                        size: bind.min(buf.size),
                    }),
                    weight2: None,
                    caches: None,
                    groups,
                });
                Ok(v)
            }
            Group::NormAdd { norm, add, next } => {
                let Op::RmsNorm {
                    x: a,
                    weight: w1,
                    eps: eps1,
                    weight_offset: off1,
                } = &graph.nodes[norm].op
                else {
                    return Err(bad());
                };
                let y1 = out(norm)?;
                let Op::Add { a: aa, b: bb } = &graph.nodes[add].op else {
                    return Err(bad());
                };
                let h = if *aa == y1 { *bb } else { *aa };
                let sum = out(add)?;
                let cols = shapes[a.0 as usize].cols;
                let rows = value_rows(graph, &shapes[a.0 as usize]);
                let (y2, w2, eps2, off2, has_next) = match next {
                    Some(k) => {
                        let Op::RmsNorm {
                            weight,
                            eps,
                            weight_offset,
                            ..
                        } = &graph.nodes[k].op
                        else {
                            return Err(bad());
                        };
                        (elem(out(k)?)?, weight, *eps, *weight_offset, 1)
                    }
                    None => (elem(sum)?, w1, 0.0, 0.0, 0),
                };
                Ok(vec![Planned {
                    node: group.at(),
                    key: (Kernel::NormAdd, None, 0),
                    params: vec![
                        elem(*a)?,
                        elem(h)?,
                        elem(y1)?,
                        elem(sum)?,
                        y2,
                        cols as u32,
                        eps1.to_bits(),
                        off1.to_bits(),
                        norm_format(w1.desc.dtype),
                        eps2.to_bits(),
                        off2.to_bits(),
                        norm_format(w2.desc.dtype),
                        has_next,
                    ],
                    weight: Some(norm_weight(w1)?),
                    weight2: Some(norm_weight(w2)?),
                    caches: None,
                    groups: [1, rows as u32, 1],
                }])
            }
            Group::NormRope { norm, rope, store } => Ok(vec![self.plan_norm_rope(
                graph,
                shapes,
                group,
                (norm, rope),
                None,
                store,
                elem,
                tables,
                positions,
                slots_at,
            )?]),
            Group::NormRopePair { a, b, store } => Ok(vec![self.plan_norm_rope(
                graph,
                shapes,
                group,
                a,
                Some(b),
                store,
                elem,
                tables,
                positions,
                slots_at,
            )?]),
        }
    }

    /// The dispatch of one `NormRope` group (`b` None) or of a pair; the store is `b`'s where
    /// there is a `b`, else `a`'s.
    #[allow(clippy::too_many_arguments)]
    fn plan_norm_rope(
        &self,
        graph: &Graph,
        shapes: &[tandem_backend_api::ValueShape],
        group: Group,
        a: (usize, usize),
        b: Option<(usize, usize)>,
        store: Option<usize>,
        elem: &dyn Fn(ValueId) -> Result<u32, BackendError>,
        tables: &[(usize, u32, Vec<f32>)],
        positions: u32,
        slots_at: u32,
    ) -> Result<Planned, BackendError> {
        let bad = || BackendError::internal(format!("fused group {group:?} does not match its nodes"));
        // One set of parameters (9 words), its weight, heads, rows and head size.
        let set = |(norm, rope): (usize, usize)| -> Result<(Vec<u32>, WeightRange, usize, usize, usize), BackendError> {
            let Op::RmsNorm {
                x,
                weight,
                eps,
                weight_offset,
            } = &graph.nodes[norm].op
            else {
                return Err(bad());
            };
            let Op::Rope { head_dim, factor, .. } = &graph.nodes[rope].op else {
                return Err(bad());
            };
            let out = |i: usize| {
                graph.nodes[i]
                    .outputs
                    .first()
                    .copied()
                    .ok_or_else(|| BackendError::internal(format!("node {i} has no output")))
            };
            let cols = shapes[x.0 as usize].cols;
            let rows = value_rows(graph, &shapes[x.0 as usize]);
            let table = tables.iter().find(|t| t.0 == rope).map_or(0, |t| t.1);
            let w = WeightRange {
                buffer: weight.buffer,
                offset: 0,
                size: self.buffers.get(weight.buffer)?.size,
            };
            let params = vec![
                elem(*x)?,
                elem(out(norm)?)?,
                elem(out(rope)?)?,
                table,
                cols as u32,
                eps.to_bits(),
                weight_offset.to_bits(),
                norm_format(weight.desc.dtype),
                factor.to_bits(),
            ];
            Ok((params, w, cols / head_dim, rows, *head_dim))
        };
        let (pa, wa, heads_a, rows, head_dim) = set(a)?;
        let (pb, wb, heads_b) = match b {
            Some(b) => {
                let (pb, wb, heads_b, rows_b, hd_b) = set(b)?;
                if rows_b != rows || hd_b != head_dim {
                    return Err(bad());
                }
                (pb, wb, heads_b)
            }
            None => (pa.clone(), wa, 0),
        };
        let (kernel, v, caches, capacity, f16) = match store {
            Some(at) => {
                let Op::Attention { v, cache, .. } = &graph.nodes[at].op else {
                    return Err(bad());
                };
                (
                    Kernel::NormRopeStore,
                    elem(*v)?,
                    Some((cache.k, cache.v)),
                    cache.capacity as u32,
                    u32::from(cache.dtype == DType::F16),
                )
            }
            None => (Kernel::NormRope, 0, None, 0, 0),
        };
        let mut params = pa;
        params.extend(pb);
        params.extend([
            heads_a as u32,
            u32::from(b.is_some()),
            positions,
            head_dim as u32,
            v,
            slots_at,
            capacity,
            f16,
        ]);
        Ok(Planned {
            node: group.at(),
            key: (kernel, None, 0),
            params,
            weight: Some(wa),
            weight2: Some(wb),
            caches,
            groups: [(heads_a + heads_b) as u32, rows as u32, 1],
        })
    }

    /// Records the commands of one step of `prog`: the input copies, the pass, the output
    /// copies (and the timestamps' resolve where profiling).
    pub(crate) fn encode(&self, prog: &Program) -> Result<wgpu::CommandBuffer, BackendError> {
        let dev = &self.gpu.device;
        let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        for c in &prog.inputs {
            let src = &self.buffers.get(c.buffer)?.buf;
            enc.copy_buffer_to_buffer(src, 0, &prog.arena, c.arena_offset, c.size);
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(&prog.graph.name),
                timestamp_writes: None,
            });
            let nodes = prog.graph.nodes.len();
            let mut d = 0usize;
            if let Some(t) = &prog.timestamps {
                pass.write_timestamp(&t.set, 0);
            }
            for node in 0..nodes {
                while d < prog.dispatches.len() && prog.dispatches[d].node == node {
                    let x = &prog.dispatches[d];
                    pass.set_pipeline(&x.pipeline);
                    pass.set_bind_group(0, &x.bind_group, &[]);
                    pass.dispatch_workgroups(x.groups[0], x.groups[1], x.groups[2]);
                    d += 1;
                }
                if let Some(t) = &prog.timestamps {
                    pass.write_timestamp(&t.set, node as u32 + 1);
                }
            }
        }
        for c in &prog.outputs {
            let b = self.buffers.get(c.buffer)?;
            enc.copy_buffer_to_buffer(&prog.arena, c.arena_offset, &b.buf, 0, c.size);
            if let Some(m) = &b.mirror {
                enc.copy_buffer_to_buffer(&prog.arena, c.arena_offset, m, 0, c.size);
            }
        }
        if let Some(t) = &prog.timestamps {
            let count = prog.graph.nodes.len() as u32 + 1;
            enc.resolve_query_set(&t.set, 0..count, &t.resolve, 0);
            enc.copy_buffer_to_buffer(&t.resolve, 0, &t.readback, 0, t.resolve.size());
        }
        Ok(enc.finish())
    }
}

fn node_name(graph: &Graph, i: usize) -> String {
    graph.nodes.get(i).map_or_else(String::new, |n| n.op.name())
}

/// `matvec_q4k_rows.wgsl`'s override constants (NR, W from bit 8, GEGLU at bit 16) and
/// workgroups for `n` output columns of q4_k rows of `k` values against one input row.
fn q4k_rows_launch(n: usize, k: usize, geglu: bool) -> (u32, [u32; 3]) {
    let (nr, w) = q4k_rows_shape(n, k / 256);
    let [gx, gy] = spread(div_up(n, 4 * nr));
    ((nr | w << 8 | usize::from(geglu) << 16) as u32, [gx, gy, 1])
}

/// `matvec_dot.wgsl`'s override constants (R, NC from bit 8, WIDE at bit 16, GEGLU at 17) and
/// workgroups for `n` output columns (with `geglu`, gate rows) against `m` input rows: R = m
/// up to 2, else 4 or 8 input rows per workgroup (`tandem_gpu_kit::matmul::dot_rows`). The
/// kernel holds at most 4 weight rows (a GeGlu's columns are two each) and 32 sums (weight
/// rows x R). Its output columns per workgroup are the shared rule's
/// (`tandem_gpu_kit::matmul::dot_columns`: the most that leave 1024 workgroups): 4, 2 or 1
/// below 4 input rows per workgroup, 2 or 1 from 4. Unlike the Vulkan backend's `matvec_dot`
/// (1 from 4 rows), 2 at 8 rows: on the H100, decode at batch 8 went from 618.8 to 732.1 tok/s
/// on 4B q4_k (1B: 1,125.8 to 1,129.0).
fn dot_launch(n: usize, m: usize, geglu: bool, wide: bool) -> (u32, [u32; 3]) {
    let r = dot_rows(m);
    let slices = m.div_ceil(r);
    let most = if r < 4 { 4 } else { 2 };
    let nc = dot_columns_override().unwrap_or(dot_columns(n, slices, most));
    let nc = if geglu { nc.min(2) } else { nc };
    let [gx, gy] = spread(div_up(n, nc));
    let key = r | nc << 8 | usize::from(wide) << 16 | usize::from(geglu) << 17;
    (key as u32, [gx, gy, slices as u32])
}

/// Bytes of the quantised input of `m` rows of `k` values (`parts/dot_input.wgsl`), at 16
/// bits (`wide`) or 8.
fn dot_input_bytes(m: usize, k: usize, wide: bool) -> u64 {
    tandem_gpu_kit::matmul::dot_input_bytes(m, k, wide)
}

/// The dispatch quantising a matmul's `m` input rows of `k` values for `matvec_dot.wgsl`, with
/// the matmul's parameters (x, k, rows): one invocation per block of 32.
fn quantize_planned(node: usize, params: Vec<u32>, m: usize, k: usize, wide: bool) -> Planned {
    let [gx, gy] = spread(div_up(m * (k / 32), 64));
    Planned {
        node,
        key: (Kernel::QuantizeQ8, None, u32::from(wide)),
        params,
        weight: None,
        weight2: None,
        caches: None,
        groups: [gx, gy, 1],
    }
}

impl WgpuBackend {
    /// Decode's kernel (fewer than [`TILED_ROWS`] input rows) for `n` output columns of weights
    /// in `format` with rows of `k` values, bound from byte `offset`, against `m` input rows,
    /// with its key and workgroups; with `geglu`, the fused gate/up GeGlu, `n` its gate rows.
    /// In order: `matvec_dot` ([`Self::dot_takes`]), `matvec_q4k_rows` for one row of q4_k,
    /// `matvec_f16` ([`Self::f16_items`]), else `matvec` (`matvec_geglu` with `geglu`).
    fn decode_matvec(
        &self,
        m: usize,
        n: usize,
        k: usize,
        format: Format,
        offset: u64,
        geglu: bool,
    ) -> (PipelineKey, [u32; 3]) {
        let dt = format.dtype;
        if self.dot_takes(m, k, dt) {
            let (r, groups) = dot_launch(n, m, geglu, !self.narrow);
            return ((Kernel::MatVecDot, Some(format), r), groups);
        }
        if m == 1 && dt == DType::Q4K && !q4k_rows_off() {
            let (r, groups) = q4k_rows_launch(n, k, geglu);
            return ((Kernel::MatVecQ4kRows, Some(format), r), groups);
        }
        let r = m.next_power_of_two().min(8);
        let subgroups = self.gpu.variant.subgroups;
        // A long matrix (the logits'): several columns per workgroup. A GeGlu's columns take
        // one workgroup each, of 64 invocations.
        let nc = if geglu || !subgroups {
            1
        } else if let Some(n) = matvec_columns_override() {
            n
        } else if n >= MATVEC_LONG {
            MATVEC_COLUMNS
        } else {
            1
        };
        // Long rows: more invocations per row, fewer loads each.
        let wide = if !geglu && subgroups && k / format.group() >= matvec_wide_groups() {
            matvec_width_override().unwrap_or(2)
        } else {
            1
        };
        let f16 = self.f16_items(dt, k, offset);
        let kernel = match (f16, geglu) {
            (true, _) => Kernel::MatVecF16,
            (false, true) => Kernel::MatVecGeGlu,
            (false, false) => Kernel::MatVec,
        };
        // matvec_f16 takes its GEGLU from bit 24; matvec_geglu is a kernel of its own.
        let key = r | nc << 8 | wide << 16 | usize::from(f16 && geglu) << 24;
        let [gx, gy] = spread(div_up(n, nc));
        ((kernel, Some(format), key as u32), [gx, gy, div_up(m, r)])
    }

    /// Whether a matvec over `dt` weights with rows of `k` values, bound from byte `offset`,
    /// takes `matvec_f16.wgsl`: the subgroups variant, f16 rows of a multiple of 8 values bound
    /// 16-byte aligned (`TANDEM_WGPU_F16_ITEMS=4` keeps `matvec_subgroup.wgsl`'s items of 4).
    fn f16_items(&self, dt: DType, k: usize, offset: u64) -> bool {
        self.gpu.variant.subgroups
            && dt == DType::F16
            && k.is_multiple_of(8)
            && offset.is_multiple_of(16)
            && !f16_items_off()
    }

    /// Whether a matmul of `m` input rows over weights of `dt` with rows of `k` values takes the
    /// integer-dot path: the `int_dot` variant, a block format, k a multiple of 32 and decode's
    /// row counts; one-row q4_k keeps `matvec_q4k_rows.wgsl` (`TANDEM_WGPU_DOT_Q4K1=1` sends
    /// it here too), as the Vulkan backend keeps `matvec_q4k`.
    fn dot_takes(&self, m: usize, k: usize, dt: DType) -> bool {
        self.gpu.variant.int_dot
            && dot_supported(dt)
            && k.is_multiple_of(32)
            && m < TILED_ROWS
            && (dt != DType::Q4K || m > 1 || q4k_rows_off() || dot_q4k_one_row())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_launches_stay_within_the_kernels_rows_and_sums() {
        for m in 1..16 {
            for n in [1, 37, 1152, 2560, 10_240, 262_144] {
                for geglu in [false, true] {
                    let (key, groups) = dot_launch(n, m, geglu, true);
                    let (r, nc) = ((key & 0xFF) as usize, ((key >> 8) & 0xFF) as usize);
                    let nw = if geglu { 2 * nc } else { nc };
                    assert!(matches!(r, 1 | 2 | 4 | 8) && r >= m.min(2), "m={m}: R={r}");
                    assert!(nw <= 4 && nw * r <= 32, "m={m} n={n} geglu={geglu}: {nc} x {r}");
                    assert_eq!((key >> 17) & 1, u32::from(geglu));
                    // Every column and input row is some workgroup's.
                    let wgs = (groups[0] * groups[1]) as usize;
                    assert!(wgs * nc >= n, "m={m} n={n}: {groups:?} NC={nc}");
                    assert!(groups[2] as usize * r >= m, "m={m}: {groups:?} R={r}");
                }
            }
        }
        // Batch 8 on 4B's 2560 columns: two columns per workgroup (1,280 workgroups).
        assert_eq!((dot_launch(2560, 8, false, true).0 >> 8) & 0xFF, 2);
        // One row of 1B's 1152 columns: one column per workgroup (fewer leave under 1,024).
        assert_eq!((dot_launch(1152, 1, false, true).0 >> 8) & 0xFF, 1);
    }

    #[test]
    fn large_weights_bind_in_aligned_chunks_within_the_limit() {
        // The default model's q8_0 embedding: 262144 rows of 680 bytes, 178 MB, on lavapipe's
        // 128 MiB bindings.
        let rows = 262_144;
        let rb = 680;
        let size = rows as u64 * rb + 16;
        let chunks = weight_chunks("t", rows, rb, size, 128 << 20, 256).unwrap();
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].0, 0);
        assert_eq!(chunks.last().unwrap().1, rows);
        for w in chunks.windows(2) {
            assert_eq!(w[0].1, w[1].0);
        }
        for (r0, r1, off, sz) in &chunks {
            assert_eq!(off % 256, 0);
            assert_eq!(*off, *r0 as u64 * rb);
            assert!(*sz <= 128 << 20 && *sz >= (*r1 - *r0) as u64 * rb);
            assert!(off + sz <= size);
        }
        // One chunk when it fits.
        assert_eq!(
            weight_chunks("t", 10, 680, 6816, 128 << 20, 256).unwrap().len(),
            1
        );
        // A row larger than the limit is an error naming the limit and the tensor.
        let e = weight_chunks("weight q8_0[1, 340000]", 1, 361_250, 361_266, 65_536, 256)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("max_storage_buffer_binding_size") && e.contains("q8_0[1, 340000]"),
            "{e}"
        );
    }
}
