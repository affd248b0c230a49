//! tandem's CPU backend: every op of the op set in plain Rust with f32 accumulation, rows of
//! large products split across threads with rayon. With `kernels = "reference"` it is the
//! oracle the conformance suite compares every other backend against; by default (`"fast"`)
//! matmuls on block-quantized weights go through 16-bit quantized activations and SIMD integer
//! block dots (`fast`), within about 3e-4 of the oracle's logits on Gemma 3 270M. It is the
//! default where no GPU exists.
//!
//! Programs are validated and planned at `compile` (value storage allocated once); `execute`
//! runs synchronously and allocates nothing but per-task scratch.

pub mod attention;
mod convert;
mod fast;
pub mod kernels;
pub mod weight;

use std::collections::HashMap;

use tandem_backend_api::{
    BackendError, BackendInfo, BackendOptions, BackendPlugin, BufferId, ComputeBackend, DType, DeviceKind,
    Graph, Op, ProgramId, RowCount, StepArgs, Support, TensorDesc, Ticket, Usage, ValueShape, WeightRef,
};

use kernels::AttentionShape;
use weight::WeightView;

/// A buffer in host memory, 4-byte aligned so f32 data can be viewed in place.
struct Buffer {
    desc: TensorDesc,
    usage: Usage,
    words: Vec<u32>,
    len: usize,
}

impl Buffer {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

/// A compiled graph: shapes inferred, storage for every value allocated.
struct Program {
    graph: Graph,
    shapes: Vec<ValueShape>,
    values: Vec<Vec<f32>>,
    /// Column-major product scratch for matmuls (largest `n * rows`).
    scratch: Vec<f32>,
    /// Decoded norm weights (largest group).
    norm_weight: Vec<f32>,
    /// Buffers the program reads or writes; they cannot be freed while it lives.
    buffers: Vec<BufferId>,
    /// Slot count of the smallest KV cache, when there is attention.
    slots: Option<usize>,
}

/// The CPU backend.
pub struct CpuBackend {
    pool: std::sync::Arc<rayon::ThreadPool>,
    threads: usize,
    buffers: HashMap<u64, Buffer>,
    programs: HashMap<u64, Program>,
    next_id: u64,
    executions: u64,
    /// Backend option `kernels`: `"fast"` (the default) takes matmuls on the formats `fast`
    /// covers through 16-bit quantized activations; `"reference"` keeps every op on the plain
    /// `kernels` (the oracle).
    fast_kernels: bool,
}

impl BackendPlugin for CpuBackend {
    const NAME: &'static str = "cpu";

    fn create(options: &BackendOptions) -> Result<Self, BackendError> {
        let default_threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let threads = options.parse::<usize>("threads")?.unwrap_or(default_threads);
        if threads == 0 {
            return Err(BackendError::invalid(
                "backend option 'threads' must be at least 1",
            ));
        }
        let fast_kernels = match options.get("kernels") {
            Some("reference") => false,
            None | Some("fast") => true,
            Some(v) => {
                return Err(BackendError::invalid(format!(
                    "backend option 'kernels' must be 'reference' or 'fast', not '{v}'"
                )))
            }
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tandem-cpu-{i}"))
            .build()
            .map_err(|e| BackendError::internal(format!("cannot start {threads} threads: {e}")))?;
        Ok(CpuBackend {
            pool: std::sync::Arc::new(pool),
            threads,
            buffers: HashMap::new(),
            programs: HashMap::new(),
            next_id: 1,
            executions: 0,
            fast_kernels,
        })
    }
}

tandem_backend_api::export_backend!(CpuBackend);

fn unknown_buffer(id: BufferId) -> BackendError {
    BackendError::invalid(format!("unknown buffer {}", id.0))
}

impl CpuBackend {
    fn buffer(&self, id: BufferId) -> Result<&Buffer, BackendError> {
        self.buffers.get(&id.0).ok_or_else(|| unknown_buffer(id))
    }

    fn range(
        buf: &Buffer,
        id: BufferId,
        offset: u64,
        len: usize,
    ) -> Result<std::ops::Range<usize>, BackendError> {
        let start = usize::try_from(offset)
            .ok()
            .filter(|s| s.checked_add(len).is_some_and(|e| e <= buf.len));
        start.map(|s| s..s + len).ok_or_else(|| {
            BackendError::invalid(format!(
                "buffer {} ({}): {len} bytes at offset {offset} run past its {} bytes",
                id.0, buf.desc, buf.len
            ))
        })
    }

    /// Checks that a weight reference matches its buffer.
    fn check_weight(&self, w: &WeightRef, node: usize) -> Result<(), BackendError> {
        let buf = self.buffer(w.buffer)?;
        if buf.desc != w.desc {
            return Err(BackendError::invalid(format!(
                "node {node}: weight buffer {} holds {}, the graph says {}",
                w.buffer.0, buf.desc, w.desc
            )));
        }
        Ok(())
    }

    /// Checks an f32 activation buffer holds at least `elems` values.
    fn check_activation(&self, id: BufferId, elems: usize, node: usize) -> Result<(), BackendError> {
        let buf = self.buffer(id)?;
        if buf.desc.dtype != DType::F32 || buf.desc.numel() < elems {
            return Err(BackendError::invalid(format!(
                "node {node}: buffer {} ({}) cannot hold {elems} f32 values",
                id.0, buf.desc
            )));
        }
        Ok(())
    }

    fn plan(&self, graph: &Graph) -> Result<Program, BackendError> {
        let shapes = graph.infer_shapes()?;
        let rows_of = |s: &ValueShape| match s.rows {
            RowCount::Step => graph.rows,
            RowCount::Selected => graph.selected_rows,
        };
        let mut buffers = Vec::new();
        let mut slots: Option<usize> = None;
        let (mut scratch, mut norm) = (0usize, 0usize);
        for (i, node) in graph.nodes.iter().enumerate() {
            for w in node.op.weights() {
                self.check_weight(w, i)?;
                buffers.push(w.buffer);
            }
            match &node.op {
                Op::Input { buffer, cols, .. } => {
                    self.check_activation(*buffer, rows_of(&shapes[node.outputs[0].0 as usize]) * cols, i)?;
                    buffers.push(*buffer);
                }
                Op::Output { x, buffer } => {
                    let s = shapes[x.0 as usize];
                    self.check_activation(*buffer, rows_of(&s) * s.cols, i)?;
                    buffers.push(*buffer);
                }
                Op::MatMul { x, weight, .. } => {
                    scratch = scratch.max(weight.desc.shape[0] * rows_of(&shapes[x.0 as usize]));
                }
                Op::RmsNorm { weight, .. } => norm = norm.max(weight.desc.numel()),
                Op::Attention {
                    cache,
                    kv_heads,
                    head_dim,
                    ..
                } => {
                    let want =
                        TensorDesc::new(cache.dtype, [cache.slots, cache.capacity, kv_heads * head_dim]);
                    for id in [cache.k, cache.v] {
                        let buf = self.buffer(id)?;
                        if buf.desc != want {
                            return Err(BackendError::invalid(format!(
                                "node {i}: KV cache buffer {} holds {}, attention needs {want}",
                                id.0, buf.desc
                            )));
                        }
                        buffers.push(id);
                    }
                    if cache.k == cache.v {
                        return Err(BackendError::invalid(format!(
                            "node {i}: keys and values share buffer {}",
                            cache.k.0
                        )));
                    }
                    slots = Some(slots.map_or(cache.slots, |s| s.min(cache.slots)));
                }
                _ => {}
            }
        }
        // Every pool thread's quantized activations at their largest now, not in the token loop.
        let acts = graph
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::MatMul { x, weight, .. } => {
                    Some(rows_of(&shapes[x.0 as usize]) * weight.desc.shape[1..].iter().product::<usize>())
                }
                _ => None,
            })
            .max();
        if let (true, Some(values)) = (self.fast_kernels, acts) {
            self.pool.broadcast(|_| fast::reserve(values));
        }
        if let Some(capacity) = graph
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::Attention { cache, .. } => Some(cache.capacity),
                _ => None,
            })
            .max()
        {
            // Every pool thread's attention scores at their largest now, not in the token loop.
            self.pool.broadcast(|_| attention::reserve(capacity));
        }
        let values = shapes.iter().map(|s| vec![0f32; rows_of(s) * s.cols]).collect();
        buffers.sort();
        buffers.dedup();
        Ok(Program {
            graph: graph.clone(),
            shapes,
            values,
            scratch: vec![0f32; scratch],
            norm_weight: vec![0f32; norm],
            buffers,
            slots,
        })
    }

    fn run(&mut self, prog: &mut Program, args: &StepArgs<'_>) -> Result<(), BackendError> {
        let rows = prog.graph.rows;
        for node in &prog.graph.nodes {
            let values = &mut prog.values;
            let Some(&first) = node.outputs.first() else {
                // Output: the only node defining no value.
                if let Op::Output { x, buffer } = &node.op {
                    let src: &[u8] = bytemuck::cast_slice(&values[x.0 as usize]);
                    let buf = self
                        .buffers
                        .get_mut(&buffer.0)
                        .ok_or_else(|| unknown_buffer(*buffer))?;
                    buf.bytes_mut()[..src.len()].copy_from_slice(src);
                }
                continue;
            };
            let mut out = std::mem::take(&mut values[first.0 as usize]);
            let v = |id: &tandem_backend_api::ValueId| values[id.0 as usize].as_slice();
            match &node.op {
                Op::Input { buffer, .. } => {
                    let b = self.buffer(*buffer)?.bytes();
                    let src: &[f32] = bytemuck::cast_slice(&b[..out.len() * 4]);
                    out.copy_from_slice(src);
                }
                Op::Embed { table, scale } => {
                    let t = self.weight_view(table)?;
                    kernels::embed(t, args.tokens, *scale, &mut out);
                }
                Op::RmsNorm {
                    x,
                    weight,
                    eps,
                    weight_offset,
                } => {
                    let w = self.weight_view(weight)?;
                    let nw = &mut prog.norm_weight[..w.k];
                    convert::decode_row(w.dtype, w.bytes, nw);
                    kernels::rms_norm(v(x), nw, *eps, *weight_offset, &mut out);
                }
                Op::MatMul { x, weight, .. } => {
                    let w = self.weight_view(weight)?;
                    let xrows = match prog.shapes[x.0 as usize].rows {
                        RowCount::Step => rows,
                        RowCount::Selected => prog.graph.selected_rows,
                    };
                    // No allocation per step: the product lands in the program's scratch and
                    // is copied into each split's value in place.
                    kernels::product(
                        &self.pool,
                        &values[x.0 as usize],
                        xrows,
                        w,
                        &mut prog.scratch,
                        self.fast_kernels,
                    );
                    let mut j0 = kernels::scatter(&prog.scratch, xrows, 0, &mut out);
                    for o in &node.outputs[1..] {
                        j0 = kernels::scatter(&prog.scratch, xrows, j0, &mut values[o.0 as usize]);
                    }
                }
                Op::Rope {
                    x,
                    head_dim,
                    theta,
                    factor,
                } => {
                    let cols = prog.shapes[x.0 as usize].cols;
                    kernels::rope(v(x), cols, args.positions, *head_dim, *theta, *factor, &mut out);
                }
                Op::Attention {
                    q,
                    k,
                    v: vv,
                    cache,
                    heads,
                    kv_heads,
                    head_dim,
                    scale,
                    window,
                    softcap,
                } => {
                    let shape = AttentionShape {
                        heads: *heads,
                        kv_heads: *kv_heads,
                        head_dim: *head_dim,
                        capacity: cache.capacity,
                        scale: *scale,
                        window: *window,
                        softcap: *softcap,
                        cache_dtype: cache.dtype,
                    };
                    let mut kbuf = self
                        .buffers
                        .remove(&cache.k.0)
                        .ok_or_else(|| unknown_buffer(cache.k))?;
                    let vbuf = self.buffers.get_mut(&cache.v.0);
                    let result = match vbuf {
                        None => Err(unknown_buffer(cache.v)),
                        Some(vbuf) => {
                            kernels::kv_append(
                                &shape,
                                v(k),
                                v(vv),
                                args.positions,
                                args.slots,
                                kbuf.bytes_mut(),
                                vbuf.bytes_mut(),
                            );
                            let fast = self.fast_kernels
                                && attention::attend(
                                    &self.pool,
                                    &shape,
                                    v(q),
                                    args.positions,
                                    args.slots,
                                    kbuf.bytes(),
                                    vbuf.bytes(),
                                    &mut out,
                                );
                            if !fast {
                                kernels::attend(
                                    &self.pool,
                                    &shape,
                                    v(q),
                                    args.positions,
                                    args.slots,
                                    kbuf.bytes(),
                                    vbuf.bytes(),
                                    &mut out,
                                );
                            }
                            Ok(())
                        }
                    };
                    self.buffers.insert(cache.k.0, kbuf);
                    result?;
                }
                Op::GeGlu { gate, up } => kernels::geglu(v(gate), v(up), &mut out),
                Op::Add { a, b } => kernels::add(v(a), v(b), &mut out),
                Op::Softcap { x, cap } => kernels::softcap(v(x), *cap, &mut out),
                Op::SelectRows { x } => {
                    let cols = prog.shapes[x.0 as usize].cols;
                    kernels::select_rows(v(x), cols, args.select, &mut out);
                }
                Op::Output { .. } => unreachable!("Output defines no value"),
            }
            values[first.0 as usize] = out;
        }
        Ok(())
    }

    fn weight_view(&self, w: &WeightRef) -> Result<WeightView<'_>, BackendError> {
        let buf = self.buffer(w.buffer)?;
        let (n, k) = match w.desc.shape.as_slice() {
            [n, k] => (*n, *k),
            [k] => (1, *k),
            s => return Err(BackendError::invalid(format!("weight of shape {s:?}"))),
        };
        Ok(WeightView {
            bytes: buf.bytes(),
            dtype: w.desc.dtype,
            n,
            k,
        })
    }
}

impl ComputeBackend for CpuBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: Self::NAME.to_string(),
            device: format!("host CPU ({} {})", std::env::consts::ARCH, std::env::consts::OS),
            kind: DeviceKind::Cpu,
            memory_bytes: None,
            features: vec![
                format!("threads={}", self.threads),
                format!("kernels={}", if self.fast_kernels { "fast" } else { "reference" }),
            ],
        }
    }

    fn supports(&self, _op: &Op) -> Support {
        // Every op, on weights of every storage type.
        Support::Yes
    }

    fn alloc(&mut self, desc: &TensorDesc, usage: Usage) -> Result<BufferId, BackendError> {
        let bytes = desc.byte_size()?;
        let len = usize::try_from(bytes).map_err(|_| BackendError::OutOfMemory {
            requested: bytes,
            available: 0,
        })?;
        let mut words = Vec::new();
        words
            .try_reserve_exact(len.div_ceil(4))
            .map_err(|_| BackendError::OutOfMemory {
                requested: bytes,
                available: 0,
            })?;
        words.resize(len.div_ceil(4), 0u32);
        let id = self.next_id;
        self.next_id += 1;
        self.buffers.insert(
            id,
            Buffer {
                desc: desc.clone(),
                usage,
                words,
                len,
            },
        );
        Ok(BufferId(id))
    }

    fn write(&mut self, buffer: BufferId, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        let buf = self
            .buffers
            .get_mut(&buffer.0)
            .ok_or_else(|| unknown_buffer(buffer))?;
        let r = Self::range(buf, buffer, offset, data.len())?;
        buf.bytes_mut()[r].copy_from_slice(data);
        Ok(())
    }

    fn read(&mut self, buffer: BufferId, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        let buf = self.buffer(buffer)?;
        let r = Self::range(buf, buffer, offset, out.len())?;
        out.copy_from_slice(&buf.bytes()[r]);
        Ok(())
    }

    fn free(&mut self, buffer: BufferId) -> Result<(), BackendError> {
        if let Some((pid, _)) = self.programs.iter().find(|(_, p)| p.buffers.contains(&buffer)) {
            return Err(BackendError::invalid(format!(
                "buffer {} is used by program {pid}: release it first",
                buffer.0
            )));
        }
        let buf = self
            .buffers
            .remove(&buffer.0)
            .ok_or_else(|| unknown_buffer(buffer))?;
        debug_assert!(matches!(
            buf.usage,
            Usage::Weight | Usage::KvCache | Usage::Activation
        ));
        Ok(())
    }

    fn compile(&mut self, graph: &Graph) -> Result<ProgramId, BackendError> {
        let prog = self.plan(graph)?;
        let id = self.next_id;
        self.next_id += 1;
        self.programs.insert(id, prog);
        Ok(ProgramId(id))
    }

    fn execute(&mut self, program: ProgramId, args: &StepArgs<'_>) -> Result<Ticket, BackendError> {
        let mut prog = self
            .programs
            .remove(&program.0)
            .ok_or_else(|| BackendError::invalid(format!("unknown program {}", program.0)))?;
        // The whole step on one pool thread: the kernels' parallel loops then split work through
        // the workers' own queues instead of handing each loop into the pool from outside
        // (rayon's injector allocates a block per 63 jobs handed in).
        let pool = std::sync::Arc::clone(&self.pool);
        let result = pool.install(|| {
            args.validate(&prog.graph, prog.slots)
                .and_then(|()| self.run(&mut prog, args))
        });
        self.programs.insert(program.0, prog);
        result?;
        self.executions += 1;
        Ok(Ticket(self.executions))
    }

    fn wait(&mut self, ticket: Ticket) -> Result<(), BackendError> {
        // Executions finish before `execute` returns.
        if ticket.0 == 0 || ticket.0 > self.executions {
            return Err(BackendError::invalid(format!("unknown ticket {}", ticket.0)));
        }
        Ok(())
    }

    fn release(&mut self, program: ProgramId) -> Result<(), BackendError> {
        self.programs
            .remove(&program.0)
            .map(|_| ())
            .ok_or_else(|| BackendError::invalid(format!("unknown program {}", program.0)))
    }
}
