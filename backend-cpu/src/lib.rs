//! tandem's CPU backend: every op of the op set in plain Rust with f32 accumulation, rows of
//! large products split across threads with rayon. With `kernels = "reference"` it is the
//! oracle the conformance suite compares every other backend against; by default (`"fast"`)
//! matmuls on block-quantized weights go through 16-bit quantized activations and SIMD integer
//! block dots (`fast`), within about 3e-4 of the oracle's logits on Gemma 3 270M. It is the
//! default where no GPU exists.
//!
//! Programs are validated and planned at `compile` (value storage allocated once); `execute`
//! runs synchronously and allocates nothing but per-task scratch.
//!
//! Memory: the buffers `alloc` makes (weights, KV caches, activations) count against a budget,
//! the host's `MemTotal` or the smaller backend option `memory_limit`; `alloc` refuses what
//! would pass it. Program storage made at `compile` and host memory imported with `import_host`
//! (the engine's, shared with another backend at a split's boundary) are not counted.

pub mod attention;
mod convert;
mod fast;
pub mod kernels;
pub mod layout;
pub mod matmul;
mod par;
pub mod shape;
pub mod spin;
mod vmath;
pub mod weight;

use tandem_backend_api::kit::plan::{value_slots, ValueSlots};
use tandem_backend_api::kit::{
    check_buffers, host_memory_bytes, Buffers, Compiled, Programs, StepShape, Tickets,
};
use tandem_backend_api::{
    BackendError, BackendInfo, BackendOptions, BackendPlugin, BufferId, ComputeBackend, DeviceKind, Graph,
    NodeTime, Op, ProgramId, RowCount, StepArgs, Support, TensorDesc, Ticket, Usage, ValueShape, WeightRef,
    MEMORY_LIMIT,
};

pub use fast::{ActScratch, KernelSet};
use shape::AttentionShape;
use weight::WeightView;

/// A buffer in host memory, 4-byte aligned so f32 data can be viewed in place.
struct Buffer {
    desc: TensorDesc,
    usage: Usage,
    storage: Storage,
    len: usize,
}

/// Where a buffer's bytes are.
enum Storage {
    /// Allocated by `alloc`, counted against the budget.
    Owned(Vec<u32>),
    /// Host memory of the engine's, imported by `import_host` (not counted).
    Imported(Region),
}

/// A region passed to `import_host`: `len` bytes at `ptr`, aligned to `HOST_IMPORT_ALIGN`.
struct Region {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain host memory that `import_host`'s caller keeps valid and does not
// touch through Rust references until the buffer is freed; the backend (and with it the region)
// is used by one thread at a time (`ComputeBackend` takes `&mut self`).
unsafe impl Send for Region {}

impl Buffer {
    /// The bytes it holds, as counted against the memory budget.
    fn held(&self) -> u64 {
        match &self.storage {
            Storage::Owned(words) => words.len() as u64 * 4,
            Storage::Imported(_) => 0,
        }
    }

    fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Owned(words) => &bytemuck::cast_slice(words)[..self.len],
            // SAFETY: `import_host`'s contract: the region is valid for reads of `r.len` bytes
            // and no Rust reference aliases it while the buffer exists; `self.len <= r.len`.
            Storage::Imported(r) => unsafe { &std::slice::from_raw_parts(r.ptr.as_ptr(), r.len)[..self.len] },
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Owned(words) => &mut bytemuck::cast_slice_mut(words)[..self.len],
            // SAFETY: as in `bytes`, for writes; `&mut self` makes this the only view.
            Storage::Imported(r) => unsafe {
                &mut std::slice::from_raw_parts_mut(r.ptr.as_ptr(), r.len)[..self.len]
            },
        }
    }
}

/// A compiled graph: shapes inferred, storage for every value allocated.
struct Program {
    graph: Graph,
    shapes: Vec<ValueShape>,
    /// Where each value lives in the backend's [`Arena`].
    slots: ValueSlots,
    /// Column-major product scratch for matmuls (largest `n * rows`) it needs.
    scratch: usize,
    /// The most activations one of its products quantizes (rows times `k`), where the
    /// backend has kernels that quantize them.
    acts: usize,
    /// Decoded norm weights (largest group).
    norm_weight: Vec<f32>,
    /// Each row's last visible position for attention (`kit::step::visible_ends`), sized at
    /// compile time.
    ends: Vec<u32>,
    /// Seconds each node took in the last execution, where the backend option `profile` is on
    /// (empty otherwise).
    times: Vec<f64>,
}

/// The storage every program's values and product scratch share (`CpuBackend::arena`): grown
/// at compile time to the largest program's, never per step.
#[derive(Default)]
struct Arena {
    slots: Vec<Vec<f32>>,
    scratch: Vec<f32>,
    /// The products' quantized activations (one set: a step runs on one thread at a time).
    acts: fast::ActScratch,
}

impl Arena {
    /// Bytes held.
    fn bytes(&self) -> u64 {
        let elements: usize = self.slots.iter().map(Vec::len).sum::<usize>() + self.scratch.len();
        elements as u64 * 4 + self.acts.bytes()
    }

    /// Bytes [`Arena::fit`] would add for `slots` and `scratch` elements of product scratch.
    fn growth(&self, slots: &ValueSlots, scratch: usize) -> u64 {
        let grown: usize = slots
            .slot_len
            .iter()
            .enumerate()
            .map(|(i, &want)| want.saturating_sub(self.slots.get(i).map_or(0, Vec::len)))
            .sum::<usize>()
            + scratch.saturating_sub(self.scratch.len());
        grown as u64 * 4
    }

    /// Grows to hold `slots` and `scratch`; false where the allocator refused.
    fn fit(&mut self, slots: &ValueSlots, scratch: usize) -> bool {
        fn grow(v: &mut Vec<f32>, len: usize) -> bool {
            if v.len() >= len {
                return true;
            }
            if v.try_reserve_exact(len - v.len()).is_err() {
                return false;
            }
            v.resize(len, 0.0);
            true
        }
        if self.slots.len() < slots.slot_len.len() {
            self.slots.resize_with(slots.slot_len.len(), Vec::new);
        }
        self.slots
            .iter_mut()
            .zip(&slots.slot_len)
            .all(|(v, &len)| grow(v, len))
            && grow(&mut self.scratch, scratch)
    }
}

/// The CPU backend.
pub struct CpuBackend {
    pool: std::sync::Arc<rayon::ThreadPool>,
    /// Backend option `spin`: the same number of threads spinning between the small parallel
    /// loops of a decode step, instead of the pool's sleeping ones. On by default where there
    /// are 4 threads or more: decode measured 9-15% faster on 16 threads of the H100 host and
    /// 10-15% slower on 2 threads here (see the README).
    spin: Option<spin::SpinPool>,
    threads: usize,
    buffers: Buffers<Buffer>,
    programs: Programs<Program>,
    tickets: Tickets,
    /// Backend option `kernels`: `"fast"` (the default: the best kernel set the CPU runs) or a
    /// set by name (`"avx512"`, `"avx2"`, `"scalar"`) takes matmuls on the formats `fast`
    /// covers through 16-bit quantized activations; `"reference"` (`None`) keeps every op on
    /// the plain `kernels` (the oracle).
    kernels: Option<KernelSet>,
    /// Backend option `precision`: `"fast"` (the default) takes decode products on `q8_0` and
    /// `q4_k` weights, and prefill products on `q4_k` weights, through 8-bit activations where
    /// the CPU has AVX-512 VNNI (`fast::int8`, `fast::int8_gemm`), as ggml does, judged on the real model by `engine perplexity --kl-divergence`
    /// (docs/precision.md); `"exact"` keeps 16-bit activations in every product (the
    /// conformance suite and the reference tests run it).
    int8: bool,
    /// The most bytes `alloc` may hold: the host's memory or the smaller `memory_limit`; `None`
    /// where the host's memory is unknown and no limit was set.
    memory_budget: Option<u64>,
    /// The values and product scratch of every program, shared: programs run one at a time,
    /// so the backend holds the largest program's live values, not the sum of every step
    /// shape's.
    arena: Arena,
    /// Bytes held by the buffers `alloc` made.
    in_use: u64,
    /// Threads asked for in the `threads` option, where more than the host's cores (then
    /// `threads` is the host's cores).
    clamped_from: Option<usize>,
    /// Backend option `profile`: time every node of each execution (two clock reads per node).
    profile: bool,
}

impl BackendPlugin for CpuBackend {
    const NAME: &'static str = "cpu";

    fn create(options: &BackendOptions) -> Result<Self, BackendError> {
        let default_threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let asked = options.parse::<usize>("threads")?.unwrap_or(default_threads);
        if asked == 0 {
            return Err(BackendError::invalid(
                "backend option 'threads' must be at least 1",
            ));
        }
        // More threads than cores only take turns on them (and spin at every parallel loop's
        // end): clamped, and `engine backends` says so.
        let threads = asked.min(default_threads);
        let clamped_from = (threads < asked).then_some(asked);
        let profile = options.parse::<bool>("profile")?.unwrap_or(false);
        let kernels = match options.get("kernels") {
            Some("reference") => None,
            None | Some("fast") => Some(KernelSet::detect()),
            Some(v) => match KernelSet::from_name(v) {
                Some(set) if set.available() => Some(set),
                Some(set) => {
                    return Err(BackendError::invalid(format!(
                        "backend option 'kernels' = '{v}': this CPU lacks the instructions of the '{}' kernel set (it runs '{}')",
                        set.name(),
                        KernelSet::detect().name()
                    )))
                }
                None => {
                    let sets: Vec<String> = KernelSet::ALL.iter().map(|s| format!("'{}'", s.name())).collect();
                    return Err(BackendError::invalid(format!(
                        "backend option 'kernels' must be 'fast', 'reference' or a kernel set ({}), not '{v}'",
                        sets.join(", ")
                    )));
                }
            },
        };
        let int8 = match options.get("precision") {
            Some("exact") => false,
            // The default: it passes the precision rule on the default model (docs/precision.md).
            // Without a kernel set that has the 8-bit products, `fast` is `exact` (and says so).
            None | Some("fast") => kernels.is_some_and(KernelSet::int8_products),
            Some(v) => {
                return Err(BackendError::invalid(format!(
                    "backend option 'precision' must be 'exact' or 'fast', not '{v}'"
                )))
            }
        };
        // The host's memory is the device's; where it cannot be read, only the option bounds.
        let memory_budget = match host_memory_bytes() {
            Some(total) => Some(options.memory_budget(total)?),
            None => options.bytes(MEMORY_LIMIT)?,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tandem-cpu-{i}"))
            .build()
            .map_err(|e| BackendError::internal(format!("cannot start {threads} threads: {e}")))?;
        let spin = match options.parse::<bool>("spin")?.unwrap_or(threads >= 4) {
            true => Some(
                spin::SpinPool::new(threads)
                    .map_err(|e| BackendError::internal(format!("cannot start {threads} threads: {e}")))?,
            ),
            false => None,
        };
        Ok(CpuBackend {
            pool: std::sync::Arc::new(pool),
            spin,
            threads,
            buffers: Buffers::new(),
            programs: Programs::new(),
            tickets: Tickets::new(),
            kernels,
            int8,
            memory_budget,
            arena: Arena::default(),
            in_use: 0,
            clamped_from,
            profile,
        })
    }
}

tandem_backend_api::export_backend!(CpuBackend);

impl CpuBackend {
    /// Bytes `alloc` may still hold (`u64::MAX` without a budget).
    fn available(&self) -> u64 {
        self.memory_budget
            .map_or(u64::MAX, |b| b.saturating_sub(self.in_use))
    }

    fn buffer(&self, id: BufferId) -> Result<&Buffer, BackendError> {
        self.buffers.get(id)
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

    /// The program for `graph` and the buffers it uses.
    fn plan(&self, graph: &Graph) -> Result<(Program, Vec<BufferId>), BackendError> {
        let shapes = graph.infer_shapes()?;
        let rows_of = |s: &ValueShape| match s.rows {
            RowCount::Step => graph.rows,
            RowCount::Selected => graph.selected_rows,
        };
        let buffers = check_buffers(graph, &shapes, |id| self.buffer(id).map(|b| b.desc.clone()))?;
        let (mut scratch, mut norm) = (0usize, 0usize);
        for node in &graph.nodes {
            match &node.op {
                Op::MatMul { x, weight, .. } => {
                    scratch = scratch.max(weight.desc.shape[0] * rows_of(&shapes[x.0 as usize]));
                }
                Op::RmsNorm { weight, .. } => norm = norm.max(weight.desc.numel()),
                _ => {}
            }
        }
        // The quantized activations at their largest (reserved by `compile`).
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
        // And the weight rows the prefill product unpacks (graphs of several rows).
        let unpacked = graph
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::MatMul { x, weight, .. } if rows_of(&shapes[x.0 as usize]) > 1 => {
                    Some(weight.desc.shape[1..].iter().product::<usize>())
                }
                _ => None,
            })
            .max();
        if let (Some(_), Some(k)) = (self.kernels, unpacked) {
            self.pool.broadcast(|_| fast::reserve_unpacked(k));
        }
        if let Some(capacity) = graph
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::Attention {
                    cache,
                    heads,
                    kv_heads,
                    ..
                } => Some(cache.capacity * (heads / (*kv_heads).max(1))),
                _ => None,
            })
            .max()
        {
            // Every pool thread's attention scores and lists of rows at their largest now, not
            // in the token loop.
            let rows = graph.rows;
            self.pool.broadcast(|_| {
                attention::reserve(capacity);
                attention::reserve_rows(rows);
            });
        }
        if let Some(head_dim) = graph
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::Attention { head_dim, .. } if graph.rows >= 8 => Some(*head_dim),
                _ => None,
            })
            .max()
        {
            // Prefill attention's block buffers, likewise.
            self.pool.broadcast(|_| attention::reserve_tiles(head_dim));
        }
        let partials = graph
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::Attention {
                    heads,
                    kv_heads,
                    head_dim,
                    cache,
                    ..
                } => {
                    let s = AttentionShape {
                        heads: *heads,
                        kv_heads: *kv_heads,
                        head_dim: *head_dim,
                        capacity: cache.capacity,
                        scale: 1.0,
                        window: None,
                        softcap: None,
                        cache_dtype: cache.dtype,
                    };
                    Some(attention::partials_for(&s, graph.rows, self.threads))
                }
                _ => None,
            })
            .max()
            .unwrap_or(0);
        if partials > 0 {
            // Decode attention's split partials, likewise (on every thread: any may run a step).
            self.pool.broadcast(|_| attention::reserve_partials(partials));
        }
        let slots = value_slots(graph, &shapes, |_| true);
        let program = Program {
            graph: graph.clone(),
            shapes,
            slots,
            scratch,
            acts: if self.kernels.is_some() {
                acts.unwrap_or(0)
            } else {
                0
            },
            norm_weight: vec![0f32; norm],
            ends: Vec::with_capacity(graph.rows),
            times: Vec::new(),
        };
        Ok((program, buffers))
    }

    /// Runs `prog` in the backend's arena (taken out for the step, put back whatever happens).
    fn run(&mut self, prog: &mut Program, args: &StepArgs<'_>) -> Result<(), BackendError> {
        let mut arena = std::mem::take(&mut self.arena);
        let result = self.run_in(prog, args, &mut arena);
        self.arena = arena;
        result
    }

    fn run_in(
        &mut self,
        prog: &mut Program,
        args: &StepArgs<'_>,
        arena: &mut Arena,
    ) -> Result<(), BackendError> {
        let rows = prog.graph.rows;
        let (slot_of, len) = (&prog.slots.slot_of, &prog.slots.len);
        prog.times.clear();
        // With `profile`, each node's time is taken when the next one starts (and after the
        // last).
        let mut mark = self.profile.then(std::time::Instant::now);
        for (i, node) in prog.graph.nodes.iter().enumerate() {
            if let (Some(m), true) = (mark.as_mut(), i > 0) {
                let now = std::time::Instant::now();
                prog.times.push((now - *m).as_secs_f64());
                *m = now;
            }
            let values = &mut arena.slots;
            let Some(&first) = node.outputs.first() else {
                // Output: the only node defining no value.
                if let Op::Output { x, buffer } = &node.op {
                    let x = x.0 as usize;
                    let src: &[u8] = bytemuck::cast_slice(&values[slot_of[x]][..len[x]]);
                    let buf = self.buffers.get_mut(*buffer)?;
                    buf.bytes_mut()[..src.len()].copy_from_slice(src);
                }
                continue;
            };
            let (first, out_slot) = (first.0 as usize, slot_of[first.0 as usize]);
            let mut taken = std::mem::take(&mut values[out_slot]);
            let out = &mut taken[..len[first]];
            let v = |id: &tandem_backend_api::ValueId| &values[slot_of[id.0 as usize]][..len[id.0 as usize]];
            match &node.op {
                Op::Input { buffer, .. } => {
                    let b = self.buffer(*buffer)?.bytes();
                    let src: &[f32] = bytemuck::cast_slice(&b[..out.len() * 4]);
                    out.copy_from_slice(src);
                }
                Op::Embed { table, scale, extra } => {
                    let t = self.weight_view(table)?;
                    let e = extra.as_ref().map(|e| self.weight_view(e)).transpose()?;
                    kernels::embed(t, e, args.tokens, *scale, out);
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
                    let (xs, nw, g, kset) = (v(x), &*nw, w.k, self.kernels);
                    par::rows(&self.pool, out, g, |first, ys| {
                        let n = ys.len();
                        let xs = &xs[first * g..first * g + n];
                        match kset {
                            Some(set) => vmath::rms_norm(set, xs, nw, *eps, *weight_offset, ys),
                            None => kernels::rms_norm(xs, nw, *eps, *weight_offset, ys),
                        }
                    });
                }
                Op::MatMul { x, weight, .. } => {
                    let w = self.weight_view(weight)?;
                    let xrows = match prog.shapes[x.0 as usize].rows {
                        RowCount::Step => rows,
                        RowCount::Selected => prog.graph.selected_rows,
                    };
                    // A row's sequence decides its kernels: rows of a run of at least
                    // GEMM_MIN_ROWS rows of one slot (a prompt chunk) take the prefill product,
                    // the others (decode rows, short chunks) the row kernels, so that batching
                    // changes no row's result. Blocks of consecutive rows of one choice are
                    // multiplied together; no allocation per step: each product lands in the
                    // arena's scratch and is copied into each split's rows in place.
                    let selected = prog.shapes[x.0 as usize].rows == RowCount::Selected;
                    let slot = |i: usize| {
                        if selected {
                            args.select
                                .get(i)
                                .and_then(|&r| args.slots.get(r as usize))
                                .copied()
                                .unwrap_or(u32::MAX)
                        } else {
                            args.slots.get(i).copied().unwrap_or(u32::MAX)
                        }
                    };
                    let run_end = |i: usize| (i + 1..xrows).find(|&e| slot(e) != slot(i)).unwrap_or(xrows);
                    // Whether the run starting at row `start` is a prompt chunk's (only ever
                    // asked at a run's first row: the loop below walks from run end to run end).
                    let long = |start: usize| run_end(start) - start >= fast::GEMM_MIN_ROWS;
                    // The input, out of the slots while the outputs are written (another slot).
                    let (xv, x_slot) = (x.0 as usize, slot_of[x.0 as usize]);
                    let x_taken = std::mem::take(&mut values[x_slot]);
                    let xs = &x_taken[..len[xv]];
                    let k = xs.len() / xrows.max(1);
                    let mut a = 0;
                    while a < xrows {
                        let gemm = long(a);
                        let mut b = run_end(a);
                        while b < xrows && long(b) == gemm {
                            b = run_end(b);
                        }
                        let m = b - a;
                        let layout = matmul::product(
                            &self.pool,
                            self.spin.as_ref(),
                            &xs[a * k..b * k],
                            m,
                            w,
                            &mut arena.scratch[..prog.scratch],
                            &mut arena.acts,
                            self.kernels,
                            gemm,
                            self.int8,
                        );
                        let scratch = &arena.scratch[..prog.scratch];
                        let rows_of = |o: &mut [f32]| {
                            let cols = o.len() / xrows.max(1);
                            (a * cols, b * cols)
                        };
                        let (o0, o1) = rows_of(out);
                        let mut j0 = par::scatter(&self.pool, scratch, layout, m, 0, &mut out[o0..o1]);
                        for o in &node.outputs[1..] {
                            let o = o.0 as usize;
                            let value = &mut values[slot_of[o]][..len[o]];
                            let (o0, o1) = rows_of(value);
                            j0 = par::scatter(&self.pool, scratch, layout, m, j0, &mut value[o0..o1]);
                        }
                        a = b;
                    }
                    values[x_slot] = x_taken;
                }
                Op::Rope {
                    x,
                    head_dim,
                    theta,
                    factor,
                } => {
                    let cols = prog.shapes[x.0 as usize].cols;
                    let xs = v(x);
                    par::rows(&self.pool, out, cols, |first, ys| {
                        let n = ys.len();
                        let positions = &args.positions[first..first + n / cols];
                        kernels::rope(
                            &xs[first * cols..first * cols + n],
                            cols,
                            positions,
                            *head_dim,
                            *theta,
                            *factor,
                            ys,
                        )
                    });
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
                    bidirectional_from,
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
                    let (kbuf, vbuf) = self.buffers.pair_mut(cache.k, cache.v)?;
                    kernels::kv_append(
                        &shape,
                        v(k),
                        v(vv),
                        args.positions,
                        args.slots,
                        kbuf.bytes_mut(),
                        vbuf.bytes_mut(),
                    );
                    // Rows of an image block see past their own position: the reference kernel
                    // takes each row's end (an image's prompt chunk only).
                    tandem_backend_api::kit::step::visible_ends(args, *bidirectional_from, &mut prog.ends);
                    let blocks = prog.ends != args.positions;
                    let fast = self.kernels.is_some()
                        && !blocks
                        && attention::attend(
                            &self.pool,
                            self.spin.as_ref(),
                            &shape,
                            v(q),
                            args.positions,
                            args.slots,
                            kbuf.bytes(),
                            vbuf.bytes(),
                            out,
                        );
                    if !fast {
                        kernels::attend(
                            &self.pool,
                            &shape,
                            v(q),
                            args.positions,
                            &prog.ends,
                            args.slots,
                            kbuf.bytes(),
                            vbuf.bytes(),
                            out,
                        );
                    }
                }
                Op::GeGlu { gate, up } => {
                    let (g, u, set) = (v(gate), v(up), self.kernels);
                    par::rows(&self.pool, out, 1, |at, o| {
                        let (g, u) = (&g[at..at + o.len()], &u[at..at + o.len()]);
                        match set {
                            Some(set) => vmath::geglu(set, g, u, o),
                            None => kernels::geglu(g, u, o),
                        }
                    });
                }
                Op::Add { a, b } => {
                    let (a, b) = (v(a), v(b));
                    par::rows(&self.pool, out, 1, |at, o| {
                        kernels::add(&a[at..at + o.len()], &b[at..at + o.len()], o)
                    });
                }
                Op::LayerNorm { x, weight, bias, eps } => {
                    let (w, b) = (self.weight_row(weight)?, self.weight_row(bias)?);
                    let (xs, cols) = (v(x), w.len());
                    par::rows(&self.pool, out, cols, |first, ys| {
                        let xs = &xs[first * cols..first * cols + ys.len()];
                        kernels::layer_norm(xs, &w, &b, *eps, ys)
                    });
                }
                Op::Bias { x, bias } => {
                    let (b, xs) = (self.weight_row(bias)?, v(x));
                    let cols = b.len();
                    par::rows(&self.pool, out, cols, |first, ys| {
                        kernels::bias(&xs[first * cols..first * cols + ys.len()], &b, ys)
                    });
                }
                Op::Gelu { x } => {
                    let (xs, set) = (v(x), self.kernels);
                    par::rows(&self.pool, out, 1, |at, o| {
                        let x = &xs[at..at + o.len()];
                        match set {
                            Some(set) => vmath::gelu(set, x, o),
                            None => kernels::gelu(x, o),
                        }
                    });
                }
                Op::BlockAttention {
                    q,
                    k,
                    v: vv,
                    heads,
                    head_dim,
                    scale,
                    block,
                } => {
                    let (q, k, vv) = (v(q), v(k), v(vv));
                    let fast = self.kernels.is_some()
                        && attention::block_attention(
                            &self.pool, q, k, vv, *heads, *head_dim, *scale, *block, out,
                        );
                    if !fast {
                        kernels::block_attention(
                            &self.pool, q, k, vv, *heads, *head_dim, *scale, *block, out,
                        );
                    }
                }
                Op::Softcap { x, cap } => kernels::softcap(v(x), *cap, out),
                Op::TopK { x, k } => {
                    let cols = prog.shapes[x.0 as usize].cols;
                    kernels::top_k(v(x), cols, *k, out);
                }
                Op::SelectRows { x } => {
                    let cols = prog.shapes[x.0 as usize].cols;
                    kernels::select_rows(v(x), cols, args.select, out);
                }
                Op::Output { .. } => unreachable!("Output defines no value"),
            }
            values[out_slot] = taken;
        }
        if let Some(m) = mark {
            prog.times.push(m.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// A 1-D weight (a norm's or a bias's) decoded to f32.
    fn weight_row(&self, w: &WeightRef) -> Result<Vec<f32>, BackendError> {
        let view = self.weight_view(w)?;
        let mut row = vec![0f32; view.n * view.k];
        convert::decode_row(view.dtype, view.bytes, &mut row);
        Ok(row)
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
            memory_bytes: self.memory_budget,
            features: vec![
                match self.clamped_from {
                    Some(asked) => format!("threads={} (of {asked} asked: the host's cores)", self.threads),
                    None => format!("threads={}", self.threads),
                },
                format!("kernels={}", self.kernels.map_or("reference", KernelSet::name)),
                format!("precision={}", if self.int8 { "fast" } else { "exact" }),
                format!(
                    "decode_threads={}",
                    if self.spin.is_some() { "spin" } else { "pool" }
                ),
            ],
            physical_device: None,
            decode_rows: Some(fast::GEMM_MIN_ROWS.min(attention::TILED_MIN_ROWS) - 1),
        }
    }

    fn supports(&self, _op: &Op) -> Support {
        // Every op, on weights of every storage type.
        Support::Yes
    }

    fn alloc(&mut self, desc: &TensorDesc, usage: Usage) -> Result<BufferId, BackendError> {
        let bytes = desc.byte_size()?;
        // Whole 4-byte words are held; more than the budget has left is refused up front.
        let available = self.available();
        if bytes.div_ceil(4).saturating_mul(4) > available {
            return Err(BackendError::OutOfMemory {
                requested: bytes,
                available,
            });
        }
        let out_of_memory = || BackendError::OutOfMemory {
            requested: bytes,
            available: if self.memory_budget.is_some() {
                available
            } else {
                0
            },
        };
        let len = usize::try_from(bytes).map_err(|_| out_of_memory())?;
        let mut words = Vec::new();
        words
            .try_reserve_exact(len.div_ceil(4))
            .map_err(|_| out_of_memory())?;
        words.resize(len.div_ceil(4), 0u32);
        let buf = Buffer {
            desc: desc.clone(),
            usage,
            storage: Storage::Owned(words),
            len,
        };
        self.in_use += buf.held();
        Ok(self.buffers.insert(buf))
    }

    unsafe fn import_host(
        &mut self,
        ptr: *mut u8,
        len: usize,
        desc: &TensorDesc,
    ) -> Result<BufferId, BackendError> {
        let (ptr, bytes) = tandem_backend_api::kit::check_host_region(ptr, len, desc)?;
        Ok(self.buffers.insert(Buffer {
            desc: desc.clone(),
            usage: Usage::Activation,
            storage: Storage::Imported(Region { ptr, len }),
            len: bytes,
        }))
    }

    fn write(&mut self, buffer: BufferId, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        let buf = self.buffers.get_mut(buffer)?;
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
        let buf = self.buffers.free(buffer, &self.programs)?;
        self.in_use = self.in_use.saturating_sub(buf.held());
        debug_assert!(matches!(
            buf.usage,
            Usage::Weight | Usage::HostWeight | Usage::KvCache | Usage::Activation
        ));
        Ok(())
    }

    fn compile(&mut self, graph: &Graph) -> Result<ProgramId, BackendError> {
        let (prog, buffers) = self.plan(graph)?;
        // The arena grows to the program's values, counted against the budget as buffers are.
        let growth =
            self.arena.growth(&prog.slots, prog.scratch) + self.arena.acts.growth(prog.acts, self.int8);
        let available = self.available();
        let out_of_memory = BackendError::OutOfMemory {
            requested: growth,
            available: if self.memory_budget.is_some() {
                available
            } else {
                0
            },
        };
        if growth > available {
            return Err(out_of_memory);
        }
        let before = self.arena.bytes();
        if !self.arena.fit(&prog.slots, prog.scratch) {
            return Err(out_of_memory);
        }
        // The products' quantized activations: the arena's one set, grown now rather than in
        // the token loop.
        self.arena.acts.reserve(prog.acts, self.int8);
        self.in_use += self.arena.bytes() - before;
        Ok(self.programs.insert(prog, buffers, StepShape::of(graph)))
    }

    fn execute(&mut self, program: ProgramId, args: &StepArgs<'_>) -> Result<Ticket, BackendError> {
        let mut prog: Compiled<Program> = self.programs.take(program)?;
        // The whole step on one pool thread: the kernels' parallel loops then split work through
        // the workers' own queues instead of handing each loop into the pool from outside
        // (rayon's injector allocates a block per 63 jobs handed in).
        let pool = std::sync::Arc::clone(&self.pool);
        let result = pool.install(|| {
            prog.step()
                .check(args)
                .and_then(|()| self.run(&mut prog.program, args))
        });
        self.programs.put_back(prog);
        result?;
        Ok(self.tickets.issue())
    }

    fn wait(&mut self, ticket: Ticket) -> Result<(), BackendError> {
        // Executions finish before `execute` returns.
        self.tickets.check(ticket)
    }

    fn release(&mut self, program: ProgramId) -> Result<(), BackendError> {
        self.programs.release(program).map(|_| ())
    }

    fn profile(&mut self, program: ProgramId) -> Result<Vec<NodeTime>, BackendError> {
        let prog = &self.programs.get(program)?.program;
        Ok(prog
            .times
            .iter()
            .zip(&prog.graph.nodes)
            .enumerate()
            .map(|(node, (&seconds, n))| NodeTime {
                node,
                op: n.op.name(),
                seconds,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_backend_api::DType;
    use tandem_backend_api::HOST_IMPORT_ALIGN;

    fn with_limit(limit: &str) -> Result<CpuBackend, BackendError> {
        let mut o = BackendOptions::default();
        o.set(MEMORY_LIMIT, limit).set("threads", "1");
        CpuBackend::create(&o)
    }

    /// `precision`: `fast` (the default) and `exact` are named in the features; `fast` with the
    /// reference kernels, or on a CPU without AVX-512 VNNI, stays exact (no 8-bit path there);
    /// another value is refused by name.
    #[test]
    fn precision_is_exact_or_fast_and_says_which() {
        let feature = |b: &CpuBackend| {
            b.info()
                .features
                .into_iter()
                .find(|f| f.starts_with("precision="))
                .unwrap_or_default()
        };
        let mut o = BackendOptions::default();
        o.set("threads", "1");
        let fast = if KernelSet::detect().int8_products() {
            "precision=fast"
        } else {
            "precision=exact"
        };
        assert_eq!(feature(&CpuBackend::create(&o).unwrap()), fast);
        o.set("precision", "exact");
        assert_eq!(feature(&CpuBackend::create(&o).unwrap()), "precision=exact");
        o.set("precision", "fast");
        assert_eq!(feature(&CpuBackend::create(&o).unwrap()), fast);
        o.set("kernels", "reference");
        assert_eq!(feature(&CpuBackend::create(&o).unwrap()), "precision=exact");
        o.set("precision", "sloppy");
        let err = CpuBackend::create(&o)
            .err()
            .expect("precision = sloppy")
            .to_string();
        assert!(err.contains("'precision'") && err.contains("sloppy"), "{err}");
    }

    #[test]
    fn imported_host_memory_is_read_and_written_in_place() {
        use std::alloc::{alloc_zeroed, dealloc, Layout};
        use tandem_backend_api::GraphBuilder;
        let mut b = with_limit("1MiB").unwrap();
        let layout = Layout::from_size_align(HOST_IMPORT_ALIGN, HOST_IMPORT_ALIGN).unwrap();
        // SAFETY: a non-zero layout; both regions are freed below, after the buffers.
        let (a, c) = unsafe { (alloc_zeroed(layout), alloc_zeroed(layout)) };
        let desc = TensorDesc::new(DType::F32, [2, 3]);
        // SAFETY: aligned regions of HOST_IMPORT_ALIGN bytes, untouched until freed below.
        let (ia, ic) = unsafe {
            (
                b.import_host(a, HOST_IMPORT_ALIGN, &desc).unwrap(),
                b.import_host(c, HOST_IMPORT_ALIGN, &desc).unwrap(),
            )
        };
        let x: Vec<f32> = (1..=6).map(|v| v as f32).collect();
        b.write(ia, 0, bytemuck::cast_slice(&x)).unwrap();
        let mut g = GraphBuilder::new("double", 2, 2);
        let v = g.push1(Op::Input {
            buffer: ia,
            cols: 3,
            selected: false,
        });
        let y = g.push1(Op::Add { a: v, b: v });
        g.push(Op::Output { x: y, buffer: ic });
        let p = b.compile(&g.finish()).unwrap();
        let t = b
            .execute(
                p,
                &StepArgs {
                    tokens: &[0, 0],
                    positions: &[0, 1],
                    slots: &[0, 0],
                    select: &[0, 1],
                },
            )
            .unwrap();
        b.wait(t).unwrap();
        // SAFETY: the program has finished; the region holds 6 f32 written by it.
        let out = unsafe { std::slice::from_raw_parts(c as *const f32, 6) }.to_vec();
        assert_eq!(out, x.iter().map(|v| v * 2.0).collect::<Vec<_>>());
        // Imported memory is not the backend's: it does not count against its limit; the
        // program's values (two of 2 x 3) do.
        assert_eq!(b.in_use, b.arena.bytes());
        assert_eq!(b.in_use, 2 * 6 * 4);
        // Misaligned or too short: an error, not a panic.
        // SAFETY: rejected before the region is used.
        let e = unsafe { b.import_host(a.wrapping_add(4), HOST_IMPORT_ALIGN, &desc) };
        assert!(e.unwrap_err().to_string().contains("aligned"));
        let big = TensorDesc::new(DType::F32, [HOST_IMPORT_ALIGN, 1]);
        // SAFETY: rejected before the region is used.
        let e = unsafe { b.import_host(a, HOST_IMPORT_ALIGN, &big) };
        assert!(e.unwrap_err().to_string().contains("cannot hold"));
        b.release(p).unwrap();
        b.free(ia).unwrap();
        b.free(ic).unwrap();
        // SAFETY: allocated above with `layout`; the backend no longer holds them.
        unsafe {
            dealloc(a, layout);
            dealloc(c, layout);
        }
    }

    #[test]
    fn memory_limit_bounds_what_alloc_holds() {
        let mut b = with_limit("1MiB").expect("a 1 MiB budget");
        assert_eq!(b.info().memory_bytes, Some(1 << 20));
        let w = b
            .alloc(&TensorDesc::new(DType::F32, [3 << 16]), Usage::Weight)
            .expect("768 KiB within 1 MiB");
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
        // Freeing gives the bytes back: the whole budget fits again.
        b.free(w).unwrap();
        let a = b
            .alloc(&TensorDesc::new(DType::F32, [1 << 18]), Usage::Activation)
            .expect("the whole budget once free");
        b.free(a).unwrap();
    }

    #[test]
    fn a_memory_limit_past_the_hosts_memory_fails_creation() {
        match host_memory_bytes() {
            Some(total) => {
                let err = with_limit(&(total + 1).to_string())
                    .err()
                    .expect("a limit past the host's memory");
                assert!(err.to_string().contains("memory_limit"), "{err}");
                // Without the option, the host's memory is the budget.
                let b = CpuBackend::create(&BackendOptions::default()).unwrap();
                assert_eq!(b.info().memory_bytes, Some(total));
            }
            // No figure to check against: the option alone bounds.
            None => assert_eq!(with_limit("1GiB").unwrap().info().memory_bytes, Some(1 << 30)),
        }
        let err = with_limit("lots").err().expect("not a size");
        assert!(err.to_string().contains("memory_limit"), "{err}");
    }
}
