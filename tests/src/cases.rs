//! The conformance cases: every op at awkward shapes (one row, sizes that are not multiples of
//! 32, odd head counts, rings that wrap, several sequences in one step). Each case builds its
//! graph on the backend under test through the trait, runs one or more steps, and returns what
//! its `Output` nodes wrote; `expected` comes from the f64 oracle.

use half::{bf16, f16};
use tandem_backend_api::{
    BackendError, BufferId, ComputeBackend, DType, GraphBuilder, KvCacheRef, Op, StepArgs, TensorDesc, Usage,
    ValueId, WeightRef,
};

use crate::oracle::{self, AttentionSpec, KvHistory};
use crate::Rng;

/// One step's arguments and the contents of the graph's `Input` buffers, in `input` order.
#[derive(Debug, Clone, Default)]
pub struct StepData {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Positions.
    pub positions: Vec<u32>,
    /// Slots.
    pub slots: Vec<u32>,
    /// Selected rows.
    pub select: Vec<u32>,
    /// Values of each `Input`.
    pub inputs: Vec<Vec<f32>>,
    /// New contents of the case's rewritable weights ([`Ctx::rewritable_weight`], in their
    /// order), written with `ComputeBackend::write` before this step runs; empty: left as they
    /// are.
    pub rewrites: Vec<Vec<f32>>,
}

impl StepData {
    /// A step of `rows` rows of slot 0 at positions `0..rows`, with token ids 0.
    pub fn rows(rows: usize) -> Self {
        StepData {
            tokens: vec![0; rows],
            positions: (0..rows as u32).collect(),
            slots: vec![0; rows],
            ..Default::default()
        }
    }
}

type Build = dyn Fn(&mut Ctx<'_>) -> Result<(), BackendError>;

/// A conformance case.
pub struct Case {
    /// Name, with the shape.
    pub name: String,
    /// Tolerance relative to the largest expected magnitude.
    pub tol: f64,
    /// Step row count.
    pub rows: usize,
    /// Selected row count.
    pub selected_rows: usize,
    /// The steps.
    pub steps: Vec<StepData>,
    /// Builds the graph (inputs, ops, outputs) on a backend.
    pub build: Box<Build>,
    /// The oracle's outputs, concatenated over steps and outputs.
    pub expected: Vec<f64>,
}

/// Builds a case's graph on one backend.
pub struct Ctx<'a> {
    backend: &'a mut dyn ComputeBackend,
    graph: GraphBuilder,
    inputs: Vec<BufferId>,
    outputs: Vec<(BufferId, usize)>,
    buffers: Vec<BufferId>,
    /// The f32 weights the steps rewrite ([`StepData::rewrites`]).
    rewritable: Vec<BufferId>,
    rows: usize,
    selected_rows: usize,
}

/// Rounds `v` to what `dtype` stores.
pub fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::Bf16 => bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn encode(dtype: DType, vals: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F16 => vals
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        DType::Bf16 => vals
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

impl Ctx<'_> {
    fn alloc(&mut self, desc: TensorDesc, usage: Usage) -> Result<BufferId, BackendError> {
        let id = self.backend.alloc(&desc, usage)?;
        self.buffers.push(id);
        Ok(id)
    }

    /// A weight of `dtype` holding `vals` (rounded to the dtype).
    pub fn weight(&mut self, dtype: DType, shape: &[usize], vals: &[f32]) -> Result<WeightRef, BackendError> {
        let desc = TensorDesc::new(dtype, shape.to_vec());
        let buffer = self.alloc(desc.clone(), Usage::Weight)?;
        self.backend.write(buffer, 0, &encode(dtype, vals))?;
        Ok(WeightRef { buffer, desc })
    }

    /// An f32 weight holding `vals` that the steps may rewrite between executions (the host's
    /// images' rows): [`StepData::rewrites`] gives its new contents, in the order these are
    /// made.
    pub fn rewritable_weight(&mut self, shape: &[usize], vals: &[f32]) -> Result<WeightRef, BackendError> {
        let w = self.weight(DType::F32, shape, vals)?;
        self.rewritable.push(w.buffer);
        Ok(w)
    }

    /// A weight of `dtype` holding `bytes` as stored (block-quantized formats).
    pub fn weight_bytes(
        &mut self,
        dtype: DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<WeightRef, BackendError> {
        let desc = TensorDesc::new(dtype, shape.to_vec());
        let buffer = self.alloc(desc.clone(), Usage::Weight)?;
        self.backend.write(buffer, 0, bytes)?;
        Ok(WeightRef { buffer, desc })
    }

    /// An `Input` of `cols` columns (selected rows when `selected`), filled from each step's
    /// next input.
    pub fn input(&mut self, cols: usize, selected: bool) -> Result<ValueId, BackendError> {
        let rows = if selected { self.selected_rows } else { self.rows };
        let buffer = self.alloc(TensorDesc::new(DType::F32, [rows, cols]), Usage::Activation)?;
        self.inputs.push(buffer);
        Ok(self.graph.push1(Op::Input {
            buffer,
            cols,
            selected,
        }))
    }

    /// An `Output` of `x`, which has `elems` values.
    pub fn output(&mut self, x: ValueId, elems: usize) -> Result<(), BackendError> {
        let buffer = self.alloc(TensorDesc::new(DType::F32, [elems]), Usage::Activation)?;
        self.outputs.push((buffer, elems));
        self.graph.push(Op::Output { x, buffer });
        Ok(())
    }

    /// A KV cache of `[slots, capacity, cols]` per buffer.
    pub fn cache(
        &mut self,
        dtype: DType,
        slots: usize,
        capacity: usize,
        cols: usize,
    ) -> Result<KvCacheRef, BackendError> {
        let desc = TensorDesc::new(dtype, [slots, capacity, cols]);
        let k = self.alloc(desc.clone(), Usage::KvCache)?;
        let v = self.alloc(desc, Usage::KvCache)?;
        Ok(KvCacheRef {
            k,
            v,
            dtype,
            slots,
            capacity,
        })
    }

    /// Appends a node.
    pub fn push(&mut self, op: Op) -> Vec<ValueId> {
        self.graph.push(op)
    }

    /// Appends a node with one output.
    pub fn push1(&mut self, op: Op) -> ValueId {
        self.graph.push1(op)
    }
}

impl Case {
    /// Runs the case on `backend`: builds, compiles, executes every step and reads the outputs.
    /// Frees what it allocated.
    pub fn run(&self, backend: &mut dyn ComputeBackend) -> Result<Vec<f32>, BackendError> {
        let mut ctx = Ctx {
            backend,
            graph: GraphBuilder::new(self.name.clone(), self.rows, self.selected_rows),
            inputs: vec![],
            outputs: vec![],
            buffers: vec![],
            rewritable: vec![],
            rows: self.rows,
            selected_rows: self.selected_rows,
        };
        let result = (self.build)(&mut ctx).and_then(|()| {
            let graph = std::mem::replace(&mut ctx.graph, GraphBuilder::new("", 1, 0)).finish();
            let program = ctx.backend.compile(&graph)?;
            let mut got = Vec::new();
            let run = (|| {
                for step in &self.steps {
                    for (buf, vals) in ctx.inputs.iter().zip(&step.inputs) {
                        ctx.backend.write(*buf, 0, &encode(DType::F32, vals))?;
                    }
                    for (buf, vals) in ctx.rewritable.iter().zip(&step.rewrites) {
                        ctx.backend.write(*buf, 0, &encode(DType::F32, vals))?;
                    }
                    let args = StepArgs {
                        tokens: &step.tokens,
                        positions: &step.positions,
                        slots: &step.slots,
                        select: &step.select,
                    };
                    let t = ctx.backend.execute(program, &args)?;
                    ctx.backend.wait(t)?;
                    for (buf, elems) in &ctx.outputs {
                        let mut bytes = vec![0u8; elems * 4];
                        ctx.backend.read(*buf, 0, &mut bytes)?;
                        got.extend(
                            bytes
                                .chunks_exact(4)
                                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                        );
                    }
                }
                Ok(())
            })();
            ctx.backend.release(program)?;
            run.map(|()| got)
        });
        for b in ctx.buffers.drain(..) {
            ctx.backend.free(b)?;
        }
        result
    }
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|x| *x as f64).collect()
}

fn rounded(dtype: DType, v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| round_to(dtype, *x)).collect()
}

fn input_output(rows: usize, cols: usize) -> Case {
    let x = Rng::new(1).vec(rows * cols, 3.0);
    let mut step = StepData::rows(rows);
    step.inputs = vec![x.clone()];
    Case {
        name: format!("input_output rows={rows} cols={cols}"),
        tol: 0.0,
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let x = c.input(cols, false)?;
            c.output(x, rows * cols)
        }),
        expected: f64s(&x),
    }
}

fn embed(dtype: DType, vocab: usize, hidden: usize, tokens: Vec<u32>) -> Case {
    let table = rounded(dtype, &Rng::new(2).vec(vocab * hidden, 1.0));
    let scale = 1.7f32;
    let rows = tokens.len();
    let expected = oracle::embed(&f64s(&table), hidden, &tokens, scale as f64);
    let step = StepData {
        tokens,
        ..StepData::rows(rows)
    };
    Case {
        name: format!("embed {dtype} vocab={vocab} hidden={hidden} rows={rows}"),
        tol: 1e-6,
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let t = c.weight(dtype, &[vocab, hidden], &table)?;
            let e = c.push1(Op::Embed {
                table: t,
                scale,
                extra: None,
            });
            c.output(e, rows * hidden)
        }),
        expected,
    }
}

/// `Op::Embed` with `extra` rows past the vocabulary (images' soft tokens): each step's tokens
/// mix vocabulary ids and extra ids; before each step after the first the extra table is
/// rewritten with `write` (new rows each time), and the step must read the new rows.
fn embed_extra(dtype: DType, vocab: usize, hidden: usize, extra_rows: usize, steps: Vec<Vec<u32>>) -> Case {
    let mut rng = Rng::new(90 + hidden as u64);
    let (bytes, table) = if matches!(dtype, DType::F32 | DType::F16 | DType::Bf16) {
        let t = rounded(dtype, &rng.vec(vocab * hidden, 1.0));
        (encode(dtype, &t), t)
    } else {
        quantized_weight(dtype, vocab, hidden, &mut rng)
    };
    let scale = 1.7f32;
    let rows = steps[0].len();
    let mut expected = Vec::new();
    let mut data = Vec::new();
    let mut first_extra = Vec::new();
    for (i, tokens) in steps.iter().enumerate() {
        assert_eq!(tokens.len(), rows, "every step has {rows} rows");
        let extra = rng.vec(extra_rows * hidden, 3.0);
        expected.extend(oracle::embed_extra(
            &f64s(&table),
            &f64s(&extra),
            hidden,
            tokens,
            scale as f64,
        ));
        let rewrites = if i == 0 {
            first_extra = extra;
            vec![]
        } else {
            vec![extra]
        };
        data.push(StepData {
            tokens: tokens.clone(),
            rewrites,
            ..StepData::rows(rows)
        });
    }
    Case {
        name: format!(
            "embed+extra {dtype} vocab={vocab} hidden={hidden} extra={extra_rows} rows={rows} steps={}",
            steps.len()
        ),
        tol: 1e-6,
        rows,
        selected_rows: 0,
        steps: data,
        build: Box::new(move |c| {
            let t = c.weight_bytes(dtype, &[vocab, hidden], &bytes)?;
            let extra = c.rewritable_weight(&[extra_rows, hidden], &first_extra)?;
            let e = c.push1(Op::Embed {
                table: t,
                scale,
                extra: Some(extra),
            });
            c.output(e, rows * hidden)
        }),
        expected,
    }
}

fn rms_norm(dtype: DType, rows: usize, cols: usize, group: usize, offset: f32) -> Case {
    let mut rng = Rng::new(3);
    let x = rng.vec(rows * cols, 2.0);
    let w = rounded(dtype, &rng.vec(group, 0.5));
    let eps = 1e-6f32;
    let expected = oracle::rms_norm(&f64s(&x), &f64s(&w), eps as f64, offset as f64);
    let mut step = StepData::rows(rows);
    step.inputs = vec![x];
    Case {
        name: format!("rms_norm {dtype} rows={rows} cols={cols} group={group} offset={offset}"),
        tol: 1e-5,
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let x = c.input(cols, false)?;
            let weight = c.weight(dtype, &[group], &w)?;
            let y = c.push1(Op::RmsNorm {
                x,
                weight,
                eps,
                weight_offset: offset,
            });
            c.output(y, rows * cols)
        }),
        expected,
    }
}

/// The vision tower's norm (`Op::LayerNorm`), on rows of SigLIP-like widths.
fn layer_norm(dtype: DType, rows: usize, cols: usize) -> Case {
    let mut rng = Rng::new(60 + cols as u64);
    let x = rng.vec(rows * cols, 2.0);
    let w = rounded(dtype, &rng.vec(cols, 1.0));
    let b = rounded(dtype, &rng.vec(cols, 0.5));
    let eps = 1e-6f32;
    let expected = oracle::layer_norm(&f64s(&x), &f64s(&w), &f64s(&b), eps as f64);
    let mut step = StepData::rows(rows);
    step.inputs = vec![x];
    Case {
        name: format!("layer_norm {dtype} rows={rows} cols={cols}"),
        tol: 1e-5,
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let x = c.input(cols, false)?;
            let weight = c.weight(dtype, &[cols], &w)?;
            let bias = c.weight(dtype, &[cols], &b)?;
            let y = c.push1(Op::LayerNorm { x, weight, bias, eps });
            c.output(y, rows * cols)
        }),
        expected,
    }
}

/// A linear layer with its bias and the GELU after it (`Op::MatMul`, `Op::Bias`, `Op::Gelu`):
/// SigLIP's MLP half.
fn linear_bias_gelu(dtype: DType, rows: usize, k: usize, n: usize) -> Case {
    let mut rng = Rng::new(70 + n as u64);
    let x = rng.vec(rows * k, 1.0);
    let w = rounded(dtype, &rng.vec(n * k, 0.5));
    let b = rounded(dtype, &rng.vec(n, 1.0));
    let lin = oracle::matmul(&f64s(&x), rows, &f64s(&w), n);
    let expected = lin
        .iter()
        .enumerate()
        .map(|(i, v)| oracle::gelu(v + b[i % n] as f64))
        .collect();
    let mut step = StepData::rows(rows);
    step.inputs = vec![x];
    Case {
        name: format!("matmul+bias+gelu {dtype} rows={rows} k={k} n={n}"),
        tol: 1e-5,
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let x = c.input(k, false)?;
            let weight = c.weight(dtype, &[n, k], &w)?;
            let bias = c.weight(dtype, &[n], &b)?;
            let y = c.push1(Op::MatMul {
                x,
                weight,
                splits: vec![n],
            });
            let y = c.push1(Op::Bias { x: y, bias });
            let y = c.push1(Op::Gelu { x: y });
            c.output(y, rows * n)
        }),
        expected,
    }
}

/// `Op::BlockAttention`: `rows / block` images of `block` patches each.
fn block_attention(rows: usize, block: usize, heads: usize, head_dim: usize) -> Case {
    let width = heads * head_dim;
    let mut rng = Rng::new(80 + rows as u64);
    let (q, k, v) = (
        rng.vec(rows * width, 1.0),
        rng.vec(rows * width, 1.0),
        rng.vec(rows * width, 1.0),
    );
    let scale = 1.0 / (head_dim as f32).sqrt();
    let expected = oracle::block_attention(
        &f64s(&q),
        &f64s(&k),
        &f64s(&v),
        heads,
        head_dim,
        scale as f64,
        block,
    );
    let mut step = StepData::rows(rows);
    step.inputs = vec![q, k, v];
    Case {
        name: format!("block_attention rows={rows} block={block} heads={heads} head_dim={head_dim}"),
        tol: 1e-5,
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let q = c.input(width, false)?;
            let k = c.input(width, false)?;
            let v = c.input(width, false)?;
            let y = c.push1(Op::BlockAttention {
                q,
                k,
                v,
                heads,
                head_dim,
                scale,
                block,
            });
            c.output(y, rows * width)
        }),
        expected,
    }
}

fn matmul(dtype: DType, rows: usize, k: usize, splits: Vec<usize>) -> Case {
    matmul_within(dtype, rows, k, splits, 1e-5)
}

/// `matmul` within `tol` of the largest output.
fn matmul_within(dtype: DType, rows: usize, k: usize, splits: Vec<usize>, tol: f64) -> Case {
    let n: usize = splits.iter().sum();
    let mut rng = Rng::new(4 + k as u64);
    let x = rng.vec(rows * k, 1.0);
    let w = rounded(dtype, &rng.vec(n * k, 0.5));
    let full = oracle::matmul(&f64s(&x), rows, &f64s(&w), n);
    let expected = oracle::split_cols(&full, rows, &splits).concat();
    let mut step = StepData::rows(rows);
    step.inputs = vec![x];
    Case {
        name: format!("matmul {dtype} rows={rows} k={k} n={n} splits={splits:?}"),
        tol,
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let x = c.input(k, false)?;
            let weight = c.weight(dtype, &[n, k], &w)?;
            let outs = c.push(Op::MatMul {
                x,
                weight,
                splits: splits.clone(),
            });
            for (o, cols) in outs.into_iter().zip(&splits) {
                c.output(o, rows * cols)?;
            }
            Ok(())
        }),
        expected,
    }
}

/// Random block-quantized weight bytes whose `f16` scales (at each format's offsets) are small
/// and finite, and the values they decode to.
fn quantized_weight(dtype: DType, n: usize, k: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let row_bytes = dtype.row_bytes(k).expect("whole blocks");
    let mut bytes: Vec<u8> = (0..n * row_bytes).map(|_| (rng.next_u64() >> 56) as u8).collect();
    let (block, scale_at): (usize, &[usize]) = match dtype {
        DType::Q8_0 => (34, &[0]),
        DType::Q5_0 => (22, &[0]),
        DType::Q4K => (144, &[0, 2]),
        DType::Q6K => (210, &[208]),
        DType::Q4_0 => (18, &[0]),
        DType::Q4_1 => (20, &[0, 2]),
        DType::Q5_1 => (24, &[0, 2]),
        other => panic!("no quantized weight generator for {other}"),
    };
    for blk in bytes.chunks_exact_mut(block) {
        for &at in scale_at {
            let v = f16::from_f32(rng.uniform(0.02)).to_le_bytes();
            blk[at..at + 2].copy_from_slice(&v);
        }
    }
    let mut vals = vec![0f32; n * k];
    for (row, out) in bytes.chunks_exact(row_bytes).zip(vals.chunks_exact_mut(k)) {
        tandem_backend_api::kit::quant::dequantize_row(dtype, row, out).expect("whole blocks");
    }
    (bytes, vals)
}

/// A matmul on block-quantized weights. Tolerance 1e-3 of the largest output: the CPU backend's
/// fast kernels round activations to 16 bits per block of 32 (at most 1/65534 of the block's
/// largest magnitude per value), which over `k` terms of random sign moves an output by about
/// 1e-5 to 1e-4 of the largest; a backend with 8-bit activations (ggml's `q8_0`, error 1/254 per
/// value) would need about 1e-2. The reference kernels meet 1e-5 here.
fn matmul_quantized(dtype: DType, rows: usize, k: usize, splits: Vec<usize>) -> Case {
    matmul_quantized_input(dtype, rows, k, splits, false)
}

/// [`matmul_quantized`], its input quantised to 8 bits per block of 32 in the oracle where
/// `act8` ([`oracle::quantize_q8`]: the product a `precision = "fast"` kernel computes, exact
/// to the integer), at a tolerance (1e-5 of the largest output) that one value rounded the
/// other way would break (about 1e-3).
fn matmul_quantized_input(dtype: DType, rows: usize, k: usize, splits: Vec<usize>, act8: bool) -> Case {
    let n: usize = splits.iter().sum();
    let mut rng = Rng::new(40 + rows as u64 + k as u64);
    let x = rng.vec(rows * k, 2.0);
    let (bytes, w) = quantized_weight(dtype, n, k, &mut rng);
    let xs = if act8 { oracle::quantize_q8(&x) } else { f64s(&x) };
    let full = oracle::matmul(&xs, rows, &f64s(&w), n);
    let expected = oracle::split_cols(&full, rows, &splits).concat();
    let mut step = StepData::rows(rows);
    step.inputs = vec![x];
    Case {
        name: format!(
            "matmul {dtype} rows={rows} k={k} n={n} splits={splits:?}{}",
            if act8 { " (8-bit input)" } else { "" }
        ),
        tol: if act8 { 1e-5 } else { 1e-3 },
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let x = c.input(k, false)?;
            let weight = c.weight_bytes(dtype, &[n, k], &bytes)?;
            let outs = c.push(Op::MatMul {
                x,
                weight,
                splits: splits.clone(),
            });
            for (o, cols) in outs.into_iter().zip(&splits) {
                c.output(o, rows * cols)?;
            }
            Ok(())
        }),
        expected,
    }
}

/// A matmul on block-quantized or float weights whose two equal halves only a GeGlu reads
/// (Gemma's gate and up projections over one fused weight: a backend may compute the GeGlu in
/// the matmul); the GeGlu is the output.
fn matmul_geglu(dtype: DType, rows: usize, k: usize, half: usize) -> Case {
    let mut rng = Rng::new(50 + rows as u64);
    let x = rng.vec(rows * k, 2.0);
    let (bytes, w) = if matches!(dtype, DType::F32 | DType::F16 | DType::Bf16) {
        let w = rounded(dtype, &rng.vec(2 * half * k, 0.5));
        (encode(dtype, &w), w)
    } else {
        quantized_weight(dtype, 2 * half, k, &mut rng)
    };
    let full = oracle::matmul(&f64s(&x), rows, &f64s(&w), 2 * half);
    let parts = oracle::split_cols(&full, rows, &[half, half]);
    let expected = oracle::geglu(&parts[0], &parts[1]);
    let mut step = StepData::rows(rows);
    step.inputs = vec![x];
    Case {
        name: format!(
            "matmul {dtype} rows={rows} k={k} n={} then geglu of its halves",
            2 * half
        ),
        tol: 1e-3,
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let x = c.input(k, false)?;
            let weight = c.weight_bytes(dtype, &[2 * half, k], &bytes)?;
            let gu = c.push(Op::MatMul {
                x,
                weight,
                splits: vec![half, half],
            });
            let m = c.push1(Op::GeGlu {
                gate: gu[0],
                up: gu[1],
            });
            c.output(m, rows * half)
        }),
        expected,
    }
}

fn rope(positions: Vec<u32>, heads: usize, head_dim: usize, theta: f32, factor: f32) -> Case {
    let rows = positions.len();
    let cols = heads * head_dim;
    let x = Rng::new(5).vec(rows * cols, 1.0);
    let expected = oracle::rope(&f64s(&x), cols, &positions, head_dim, theta as f64, factor as f64);
    let step = StepData {
        positions: positions.clone(),
        inputs: vec![x],
        ..StepData::rows(rows)
    };
    Case {
        name: format!(
            "rope positions={positions:?} heads={heads} head_dim={head_dim} theta={theta} factor={factor}"
        ),
        // f32 angles at large positions lose ~ position * 2^-24 radians.
        tol: 1e-4,
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let x = c.input(cols, false)?;
            let y = c.push1(Op::Rope {
                x,
                head_dim,
                theta,
                factor,
            });
            c.output(y, rows * cols)
        }),
        expected,
    }
}

/// One step of an attention case: (positions, slots).
type AttnStep = (Vec<u32>, Vec<u32>);

fn attention(
    label: &str,
    spec: AttentionSpec,
    cache_dtype: DType,
    slots: usize,
    capacity: usize,
    steps: Vec<AttnStep>,
) -> Case {
    let steps = steps.into_iter().map(|(p, s)| (vec![0; p.len()], p, s)).collect();
    attention_case(
        &format!("attention {label}"),
        spec,
        None,
        cache_dtype,
        slots,
        capacity,
        steps,
    )
}

/// The token id from which the image attention cases' rows are images' (Gemma 3's soft tokens
/// are past its vocabulary of 262,144).
const IMAGE_FROM: u32 = 262_144;

/// One step of an image attention case, as runs of rows `(slot, first position, rows, image)`:
/// image rows take token ids from [`IMAGE_FROM`] on, text rows ids below it.
type Runs<'a> = &'a [(u32, u32, usize, bool)];

/// Attention with `bidirectional_from` (Gemma 3's image blocks): each step given as runs
/// ([`Runs`]); the oracle computes every row's end itself ([`oracle::block_ends`]).
fn image_attention(
    label: &str,
    spec: AttentionSpec,
    cache_dtype: DType,
    slots: usize,
    capacity: usize,
    steps: &[Runs<'_>],
) -> Case {
    let steps = steps.iter().map(|runs| runs_step(runs)).collect();
    attention_case(
        &format!("image_attention {label}"),
        spec,
        Some(IMAGE_FROM),
        cache_dtype,
        slots,
        capacity,
        steps,
    )
}

/// The (tokens, positions, slots) of a step given as runs.
fn runs_step(runs: Runs<'_>) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let (mut tokens, mut positions, mut slot_ids) = (vec![], vec![], vec![]);
    for &(slot, first, n, image) in runs {
        for i in 0..n as u32 {
            let at = tokens.len() as u32;
            tokens.push(if image { IMAGE_FROM + at } else { 7 + at });
            positions.push(first + i);
            slot_ids.push(slot);
        }
    }
    (tokens, positions, slot_ids)
}

/// An attention case named `name` (then the shape), steps of (tokens, positions, slots).
fn attention_case(
    name: &str,
    spec: AttentionSpec,
    from: Option<u32>,
    cache_dtype: DType,
    slots: usize,
    capacity: usize,
    steps: Vec<(Vec<u32>, Vec<u32>, Vec<u32>)>,
) -> Case {
    let rows = steps[0].1.len();
    assert!(
        steps
            .iter()
            .all(|s| s.0.len() == rows && s.1.len() == rows && s.2.len() == rows),
        "case {name}: every step has {rows} rows"
    );
    let (qc, kvc) = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
    let mut rng = Rng::new(6);
    let mut hist = KvHistory::default();
    let mut expected = Vec::new();
    let mut data = Vec::new();
    for (tokens, positions, slot_ids) in &steps {
        let q = rng.vec(rows * qc, 1.0);
        let k = rng.vec(rows * kvc, 1.0);
        let v = rng.vec(rows * kvc, 1.0);
        // The oracle sees keys and values as the cache stores them.
        let (kr, vr) = (rounded(cache_dtype, &k), rounded(cache_dtype, &v));
        let ends = match from {
            Some(f) => oracle::block_ends(tokens, positions, slot_ids, f),
            None => positions.clone(),
        };
        expected.extend(oracle::attention_to(
            &spec,
            &mut hist,
            &f64s(&q),
            &f64s(&kr),
            &f64s(&vr),
            positions,
            &ends,
            slot_ids,
        ));
        data.push(StepData {
            tokens: tokens.clone(),
            positions: positions.clone(),
            slots: slot_ids.clone(),
            select: vec![],
            inputs: vec![q, k, v],
            rewrites: vec![],
        });
    }
    let AttentionSpec {
        heads,
        kv_heads,
        head_dim,
        scale,
        window,
        softcap,
    } = spec;
    Case {
        name: format!(
            "{name} heads={heads}/{kv_heads} head_dim={head_dim} window={window:?} softcap={softcap:?} kv={cache_dtype} capacity={capacity} rows={rows}"
        ),
        tol: 1e-5,
        rows,
        selected_rows: 0,
        steps: data,
        build: Box::new(move |c| {
            let q = c.input(qc, false)?;
            let k = c.input(kvc, false)?;
            let v = c.input(kvc, false)?;
            let cache = c.cache(cache_dtype, slots, capacity, kvc)?;
            let o = c.push1(Op::Attention {
                q,
                k,
                v,
                cache,
                heads,
                kv_heads,
                head_dim,
                scale: scale as f32,
                window,
                softcap: softcap.map(|s| s as f32),
                bidirectional_from: from,
            });
            c.output(o, rows * qc)
        }),
        expected,
    }
}

/// RmsNorm -> Add [-> RmsNorm] over whole rows (Gemma's post-norm, residual add and next
/// pre-norm: a backend may run them as one kernel); every value is an output.
fn norm_add_norm(dtype: DType, rows: usize, cols: usize, next: bool) -> Case {
    norm_add_norm_outputs(dtype, rows, cols, next, true)
}

/// [`norm_add_norm`]; with `y1_out` false the first norm's result is read by the add alone (as in
/// the model, where a backend's fusion of the three nodes applies), and only the sum and the
/// next norm are outputs.
fn norm_add_norm_outputs(dtype: DType, rows: usize, cols: usize, next: bool, y1_out: bool) -> Case {
    let mut rng = Rng::new(11);
    let a = rng.vec(rows * cols, 3.0);
    let h = rng.vec(rows * cols, 2.0);
    let w1 = rounded(dtype, &rng.vec(cols, 0.5));
    let w2 = rounded(dtype, &rng.vec(cols, 0.5));
    let eps = 1e-6f32;
    let y1 = oracle::rms_norm(&f64s(&a), &f64s(&w1), eps as f64, 1.0);
    let sum = oracle::add(&f64s(&h), &y1);
    let mut expected = if y1_out {
        [y1, sum.clone()].concat()
    } else {
        sum.clone()
    };
    if next {
        expected.extend(oracle::rms_norm(&sum, &f64s(&w2), eps as f64, 0.0));
    }
    let mut step = StepData::rows(rows);
    step.inputs = vec![a, h];
    Case {
        name: format!(
            "rms_norm+add{} {dtype} rows={rows} cols={cols}{}",
            if next { "+rms_norm" } else { "" },
            if y1_out {
                ""
            } else {
                " (norm read by the add alone)"
            }
        ),
        tol: 1e-5,
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let a = c.input(cols, false)?;
            let h = c.input(cols, false)?;
            let weight = c.weight(dtype, &[cols], &w1)?;
            let y1 = c.push1(Op::RmsNorm {
                x: a,
                weight,
                eps,
                weight_offset: 1.0,
            });
            let s = c.push1(Op::Add { a: h, b: y1 });
            if y1_out {
                c.output(y1, rows * cols)?;
            }
            if next {
                let weight = c.weight(dtype, &[cols], &w2)?;
                let y2 = c.push1(Op::RmsNorm {
                    x: s,
                    weight,
                    eps,
                    weight_offset: 0.0,
                });
                c.output(s, rows * cols)?;
                c.output(y2, rows * cols)
            } else {
                c.output(s, rows * cols)
            }
        }),
        expected,
    }
}

/// Per-head q and k norms, rope, then attention (Gemma's attention block: a backend may run each
/// norm and rope as one kernel, and store K and V from it); outputs the attention and the roped K.
fn qk_norm_rope_attention(
    spec: AttentionSpec,
    cache_dtype: DType,
    capacity: usize,
    steps: Vec<AttnStep>,
) -> Case {
    qk_norm_rope_attention_outputs(spec, cache_dtype, capacity, steps, true)
}

/// [`qk_norm_rope_attention`]; with `k_out` false the roped K is read by the attention alone (as
/// in the model, where a backend may store K and V from the norm and rope kernel), and only the
/// attention is an output.
fn qk_norm_rope_attention_outputs(
    spec: AttentionSpec,
    cache_dtype: DType,
    capacity: usize,
    steps: Vec<AttnStep>,
    k_out: bool,
) -> Case {
    let steps = steps.into_iter().map(|(p, s)| (vec![0; p.len()], p, s)).collect();
    qk_norm_rope_attention_case(spec, None, cache_dtype, capacity, steps, k_out)
}

/// [`qk_norm_rope_attention_outputs`] with images' blocks (`bidirectional_from`), each step given
/// as runs ([`Runs`]), the roped K read by the attention alone (the fused store's path).
fn qk_norm_rope_image_attention(
    spec: AttentionSpec,
    cache_dtype: DType,
    capacity: usize,
    steps: &[Runs<'_>],
) -> Case {
    let steps = steps.iter().map(|runs| runs_step(runs)).collect();
    qk_norm_rope_attention_case(spec, Some(IMAGE_FROM), cache_dtype, capacity, steps, false)
}

/// The case of [`qk_norm_rope_attention_outputs`], steps of (tokens, positions, slots).
fn qk_norm_rope_attention_case(
    spec: AttentionSpec,
    from: Option<u32>,
    cache_dtype: DType,
    capacity: usize,
    steps: Vec<(Vec<u32>, Vec<u32>, Vec<u32>)>,
    k_out: bool,
) -> Case {
    let rows = steps[0].1.len();
    let hd = spec.head_dim;
    let (qc, kvc) = (spec.heads * hd, spec.kv_heads * hd);
    let (theta, factor, eps) = (10_000.0f32, 1.0f32, 1e-6f32);
    let mut rng = Rng::new(12);
    let wq = rounded(DType::Bf16, &rng.vec(hd, 0.5));
    let wk = rounded(DType::Bf16, &rng.vec(hd, 0.5));
    let mut hist = KvHistory::default();
    let mut expected = Vec::new();
    let mut data = Vec::new();
    for (tokens, positions, slot_ids) in &steps {
        let q = rng.vec(rows * qc, 2.0);
        let k = rng.vec(rows * kvc, 2.0);
        let v = rng.vec(rows * kvc, 1.0);
        let qr = oracle::rope(
            &oracle::rms_norm(&f64s(&q), &f64s(&wq), eps as f64, 1.0),
            qc,
            positions,
            hd,
            theta as f64,
            factor as f64,
        );
        let kr = oracle::rope(
            &oracle::rms_norm(&f64s(&k), &f64s(&wk), eps as f64, 1.0),
            kvc,
            positions,
            hd,
            theta as f64,
            factor as f64,
        );
        let kr_cached: Vec<f64> = kr
            .iter()
            .map(|x| round_to(cache_dtype, *x as f32) as f64)
            .collect();
        let vr = f64s(&rounded(cache_dtype, &v));
        let ends = match from {
            Some(f) => oracle::block_ends(tokens, positions, slot_ids, f),
            None => positions.clone(),
        };
        expected.extend(oracle::attention_to(
            &spec, &mut hist, &qr, &kr_cached, &vr, positions, &ends, slot_ids,
        ));
        if k_out {
            expected.extend(kr);
        }
        data.push(StepData {
            tokens: tokens.clone(),
            positions: positions.clone(),
            slots: slot_ids.clone(),
            select: vec![],
            inputs: vec![q, k, v],
            rewrites: vec![],
        });
    }
    let AttentionSpec {
        heads,
        kv_heads,
        head_dim,
        scale,
        window,
        softcap,
    } = spec;
    Case {
        name: format!(
            "qk_norm+rope+{}attention heads={heads}/{kv_heads} head_dim={head_dim} window={window:?} kv={cache_dtype} capacity={capacity} rows={rows}{}",
            if from.is_some() { "image_" } else { "" },
            if k_out { "" } else { " (K read by the attention alone)" }
        ),
        // f16 keys: the oracle rounds its f64 roped keys, a backend its f32 ones.
        tol: if cache_dtype == DType::F16 { 2e-3 } else { 1e-4 },
        rows,
        selected_rows: 0,
        steps: data,
        build: Box::new(move |c| {
            let q = c.input(qc, false)?;
            let k = c.input(kvc, false)?;
            let v = c.input(kvc, false)?;
            let cache = c.cache(cache_dtype, 2, capacity, kvc)?;
            let normed_roped = |c: &mut Ctx<'_>, x: ValueId, w: &[f32]| -> Result<ValueId, BackendError> {
                let weight = c.weight(DType::Bf16, &[head_dim], w)?;
                let n = c.push1(Op::RmsNorm {
                    x,
                    weight,
                    eps,
                    weight_offset: 1.0,
                });
                Ok(c.push1(Op::Rope {
                    x: n,
                    head_dim,
                    theta,
                    factor,
                }))
            };
            let qr = normed_roped(c, q, &wq)?;
            let kr = normed_roped(c, k, &wk)?;
            let o = c.push1(Op::Attention {
                q: qr,
                k: kr,
                v,
                cache,
                heads,
                kv_heads,
                head_dim,
                scale: scale as f32,
                window,
                softcap: softcap.map(|s| s as f32),
                bidirectional_from: from,
            });
            c.output(o, rows * qc)?;
            if k_out {
                c.output(kr, rows * kvc)?;
            }
            Ok(())
        }),
        expected,
    }
}

fn elementwise(rows: usize, cols: usize) -> Vec<Case> {
    let mut rng = Rng::new(7);
    let a = rng.vec(rows * cols, 4.0);
    let b = rng.vec(rows * cols, 4.0);
    let mk = |name: &str, expected: Vec<f64>, op: fn(ValueId, ValueId) -> Op| {
        let mut step = StepData::rows(rows);
        step.inputs = vec![a.clone(), b.clone()];
        Case {
            name: format!("{name} rows={rows} cols={cols}"),
            tol: 1e-6,
            rows,
            selected_rows: 0,
            steps: vec![step],
            build: Box::new(move |c| {
                let x = c.input(cols, false)?;
                let y = c.input(cols, false)?;
                let z = c.push1(op(x, y));
                c.output(z, rows * cols)
            }),
            expected,
        }
    };
    let (fa, fb) = (f64s(&a), f64s(&b));
    vec![
        mk("geglu", oracle::geglu(&fa, &fb), |gate, up| Op::GeGlu {
            gate,
            up,
        }),
        mk("add", oracle::add(&fa, &fb), |a, b| Op::Add { a, b }),
        mk("softcap", oracle::softcap(&fa, 1.5), |x, _| Op::Softcap {
            x,
            cap: 1.5,
        }),
    ]
}

/// A row's best `k` values and their indices, from values on a coarse grid (so that ties, which
/// go to the lower index, are everywhere). Rows longer than one sort on the GPU (2048) take
/// several passes there.
fn top_k(rows: usize, cols: usize, k: usize) -> Case {
    let mut rng = Rng::new(11);
    let x: Vec<f32> = (0..rows * cols)
        .map(|_| (rng.next_u64() % 201) as f32 * 0.5 - 50.0)
        .collect();
    let expected = oracle::top_k(&f64s(&x), cols, k);
    let mut step = StepData::rows(rows);
    step.inputs = vec![x];
    Case {
        name: format!("top_k rows={rows} cols={cols} k={k}"),
        tol: 0.0,
        rows,
        selected_rows: 0,
        steps: vec![step],
        build: Box::new(move |c| {
            let x = c.input(cols, false)?;
            let y = c.push1(Op::TopK { x, k });
            c.output(y, rows * 2 * k)
        }),
        expected,
    }
}

/// Selects rows, then multiplies only the selected ones (as the logits of a prefill do).
fn select_then_matmul(rows: usize, select: Vec<u32>, k: usize, n: usize) -> Case {
    let mut rng = Rng::new(8);
    let x = rng.vec(rows * k, 1.0);
    let w = rng.vec(n * k, 1.0);
    let picked = oracle::select_rows(&f64s(&x), k, &select);
    let sel = select.len();
    let mut expected = picked.clone();
    expected.extend(oracle::matmul(&picked, sel, &f64s(&w), n));
    let step = StepData {
        select: select.clone(),
        inputs: vec![x],
        ..StepData::rows(rows)
    };
    Case {
        name: format!("select_rows rows={rows} select={select:?} then matmul k={k} n={n}"),
        tol: 1e-5,
        rows,
        selected_rows: sel,
        steps: vec![step],
        build: Box::new(move |c| {
            let x = c.input(k, false)?;
            let s = c.push1(Op::SelectRows { x });
            c.output(s, sel * k)?;
            let weight = c.weight(DType::F32, &[n, k], &w)?;
            let y = c.push1(Op::MatMul {
                x: s,
                weight,
                splits: vec![n],
            });
            c.output(y, sel * n)
        }),
        expected,
    }
}

/// Reads selected rows back from an `Input` (the cross-backend edge with selected rows).
fn selected_input(sel: usize, cols: usize) -> Case {
    let x = Rng::new(9).vec(sel * cols, 1.0);
    let step = StepData {
        select: (0..sel as u32).collect(),
        inputs: vec![x.clone()],
        ..StepData::rows(sel + 1)
    };
    Case {
        name: format!("input selected rows={sel} cols={cols}"),
        tol: 0.0,
        rows: sel + 1,
        selected_rows: sel,
        steps: vec![step],
        build: Box::new(move |c| {
            let x = c.input(cols, true)?;
            let y = c.push1(Op::Add { a: x, b: x });
            c.output(y, sel * cols)
        }),
        expected: x.iter().map(|v| 2.0 * *v as f64).collect(),
    }
}

/// Matmuls on every block format at decode's row counts (one row, each row-slice size of the
/// GPU's matrix-vector kernels and a partial slice) and k of several 32-element units: the
/// cases for a backend's 8-bit-activation path (Vulkan's `matvec_dot_<fmt>`), which the caller
/// checks at its own tolerance.
pub fn int_dot_matmuls() -> Vec<Case> {
    int_dot_cases(false)
}

/// [`int_dot_matmuls`] against the oracle of 8-bit input (`precision = "fast"`): the integer
/// sums exact, so at 1e-5 of the largest output.
pub fn int8_dot_matmuls() -> Vec<Case> {
    int_dot_cases(true)
}

fn int_dot_cases(act8: bool) -> Vec<Case> {
    let mut v = Vec::new();
    for d in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
    ] {
        let k = if matches!(d, DType::Q4K | DType::Q6K) {
            512
        } else {
            96
        };
        for rows in [1, 2, 3, 8, 13] {
            // q4_k's one-row products take their own kernel on f32 input on both GPU backends
            // (`matvec_q4k`, `matvec_q4k_rows`), whatever the precision.
            let act8 = act8 && !(d == DType::Q4K && rows == 1);
            v.push(matmul_quantized_input(d, rows, k, vec![64, 37], act8));
        }
    }
    v
}

/// Every case of the suite.
pub fn all() -> Vec<Case> {
    let mut v = vec![input_output(1, 1), input_output(3, 37), selected_input(2, 19)];
    for d in [DType::F32, DType::F16, DType::Bf16] {
        v.push(embed(d, 11, 35, vec![3, 0, 10]));
    }
    v.push(embed(DType::F32, 7, 64, vec![6]));
    // Images' rows past the vocabulary, rewritten between steps: float tables of a width that
    // is no multiple of 4 and one that is, block formats (decoded 32 values at a time).
    v.push(embed_extra(
        DType::F32,
        11,
        35,
        5,
        vec![vec![3, 11, 0, 15, 12, 10], vec![15, 14, 1, 11, 10, 13]],
    ));
    v.push(embed_extra(
        DType::Bf16,
        6,
        36,
        3,
        vec![vec![6, 8, 5, 0], vec![0, 7, 7, 6], vec![8, 1, 2, 6]],
    ));
    v.push(embed_extra(
        DType::Q8_0,
        9,
        64,
        4,
        vec![vec![9, 0, 12, 8, 10], vec![1, 11, 9, 9, 12]],
    ));
    v.push(embed_extra(
        DType::Q4K,
        3,
        256,
        2,
        vec![vec![4, 0, 3], vec![3, 2, 4]],
    ));
    v.push(rms_norm(DType::F32, 1, 45, 45, 1.0));
    v.push(rms_norm(DType::Bf16, 3, 18, 6, 0.0));
    v.push(rms_norm(DType::F16, 2, 96, 32, 1.0));
    // Rows of many values per invocation of a GPU kernel's workgroup of 256 (both GPU backends'),
    // and rows past 6,144 values (what a kernel holding a row in registers would hold: the
    // Vulkan backend's norm_add does, 512 x 12).
    v.push(rms_norm(DType::F16, 2, 2560, 2560, 0.0));
    v.push(rms_norm(DType::F32, 1, 6500, 6500, 1.0));
    // The vision tower's ops: SigLIP's norm, MLP half and attention over whole images.
    v.push(layer_norm(DType::F32, 3, 72));
    v.push(layer_norm(DType::Bf16, 2, 1152));
    v.push(linear_bias_gelu(DType::F32, 5, 48, 37));
    v.push(linear_bias_gelu(DType::F16, 2, 64, 16));
    v.push(block_attention(8, 4, 2, 16));
    v.push(block_attention(9, 9, 3, 8));
    // SigLIP's head of 72 over blocks of more keys than a GPU kernel's chunk of 64 and tiles of
    // 32 rows that straddle two images (two images of 65 patches, and 2 of 100), f16 layer-norm
    // weights.
    v.push(block_attention(130, 65, 2, 72));
    v.push(block_attention(200, 100, 3, 72));
    // The largest head the tiled and cooperative-matrix kernels take, over 64-row workgroups
    // that straddle two images.
    v.push(block_attention(140, 70, 1, 256));
    // A head past the GPUs' tiled kernel's 256 (Vulkan: a workgroup per head and row).
    v.push(block_attention(10, 5, 1, 320));
    v.push(layer_norm(DType::F16, 5, 300));
    v.push(linear_bias_gelu(DType::Bf16, 3, 64, 130));
    v.push(matmul(DType::F32, 1, 50, vec![37]));
    v.push(matmul(DType::F16, 5, 33, vec![7, 5, 7]));
    v.push(matmul(DType::Bf16, 7, 64, vec![20, 20]));
    v.push(matmul(DType::F32, 3, 1, vec![1]));
    // Every block-quantized format the CPU fast kernels cover: one row (decode), a row count
    // that is not a multiple of their tile of 4 (prefill), and split outputs.
    for d in [DType::Q8_0, DType::Q5_0, DType::Q4K, DType::Q6K] {
        let k = if matches!(d, DType::Q4K | DType::Q6K) {
            512
        } else {
            96
        };
        v.push(matmul_quantized(d, 1, k, vec![37]));
        v.push(matmul_quantized(d, 7, k, vec![20, 13]));
    }
    // Batched decode's row counts around each GPU kernel switch (the rows kernel from 8, the
    // cooperative-matrix ones from 32, their 64-row tiles and split k below 128), with a split
    // boundary at 64 (a whole tile there) and a partial last tile.
    for d in [DType::Q4K, DType::Q5_0, DType::Q8_0] {
        let k = if d == DType::Q4K { 512 } else { 96 };
        for rows in [8, 9, 31, 32, 33, 64, 127, 128] {
            v.push(matmul_quantized(d, rows, k, vec![64, 37]));
        }
    }
    // A prefill-sized q4_k product whose split boundary is a whole 128-row tile (so NV
    // cooperative matrix 2 takes it where the device has it), over four blocks of k (its tile
    // loop stages each block's scales while the one before multiplies), with a partial last
    // tile of weight rows and of input rows.
    v.push(matmul_quantized(DType::Q4K, 130, 1024, vec![128, 77]));
    // A long matrix, as the logits' is (a GPU may give a workgroup several of its columns),
    // with a column count that is no multiple of 4, split in two.
    for rows in [1, 3] {
        v.push(matmul_quantized(DType::Q8_0, rows, 32, vec![20_000, 20_001]));
    }
    // Rows long enough that a GPU may give each output column more invocations (wgpu's
    // subgroup matvec: from 256 groups of 4 values).
    for rows in [1, 3, 5] {
        v.push(matmul_quantized(DType::Q4K, rows, 2048, vec![40, 25]));
    }
    // q4_k rows of one super-block, and of 10 (a GPU kernel taking one word of a super-block per
    // invocation may leave some of them idle on its last pass over the row).
    v.push(matmul_quantized(DType::Q4K, 1, 256, vec![9]));
    v.push(matmul_quantized(DType::Q4K, 2, 2560, vec![19]));
    // The prefill kernels (16 rows and more) on every weight format: a row count that is not a
    // multiple of any tile, k not a multiple of a 64-wide slice where the format allows, more
    // than one tile of 128 weight rows, and splits across tile boundaries. Tolerance 1e-3 as for
    // the block formats: GPU kernels may stage the input and weights in f16 (the wgpu and
    // Vulkan backends' f16 tiles and cooperative matrices).
    let prefill_splits = vec![100, 60, 37];
    for (d, k) in [
        (DType::F32, 100),
        (DType::F16, 100),
        (DType::F16, 33),
        (DType::Bf16, 100),
    ] {
        v.push(matmul_within(d, 37, k, prefill_splits.clone(), 1e-3));
    }
    for d in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
    ] {
        let k = if matches!(d, DType::Q4K | DType::Q6K) {
            256
        } else {
            96
        };
        v.push(matmul_quantized(d, 37, k, prefill_splits.clone()));
    }
    v.push(rope(vec![0, 5, 17, 300], 3, 10, 10_000.0, 1.0));
    v.push(rope(vec![4095], 2, 16, 1_000_000.0, 8.0));
    let spec = |heads, kv_heads, head_dim, window, softcap| AttentionSpec {
        heads,
        kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f64).sqrt(),
        window,
        softcap,
    };
    // Prefill then decode, MQA with an odd head count.
    v.push(attention(
        "prefill+decode",
        spec(3, 1, 6, None, None),
        DType::F32,
        1,
        16,
        vec![((0..5).collect(), vec![0; 5])],
    ));
    v.push(attention(
        "decode",
        spec(3, 1, 6, None, None),
        DType::F32,
        1,
        16,
        (0..6).map(|p| (vec![p], vec![0])).collect(),
    ));
    // A sliding window over a ring that wraps several times.
    // A query-head group larger than the grouped kernel holds at once (8): two passes.
    v.push(attention(
        "decode-group-of-12",
        spec(12, 1, 8, None, None),
        DType::F32,
        1,
        16,
        (0..6).map(|p| (vec![p], vec![0])).collect(),
    ));
    v.push(attention(
        "ring",
        spec(4, 2, 8, Some(3), None),
        DType::F32,
        1,
        4,
        (0..11).map(|p| (vec![p], vec![0])).collect(),
    ));
    // Window shorter than a prefill chunk that fits the ring (capacity >= window + rows - 1).
    v.push(attention(
        "windowed-prefill",
        spec(2, 2, 4, Some(3), None),
        DType::F32,
        1,
        6,
        vec![((0..4).collect(), vec![0; 4]), ((4..8).collect(), vec![0; 4])],
    ));
    // A prefill longer than a backend's decode-attention kernel takes (Vulkan: 1 row), GQA,
    // window shorter than the chunk, in two chunks.
    v.push(attention(
        "long-prefill",
        spec(4, 2, 16, Some(24), None),
        DType::F16,
        1,
        64,
        vec![
            ((0..40).collect(), vec![0; 40]),
            ((40..80).collect(), vec![0; 40]),
        ],
    ));
    // Prefill blocks (Vulkan's tiled kernel: 32 rows) of one slot and of two: 20 rows of each of
    // two sequences per step, a head of 72 (two 64-wide chunks, the second partial), GQA,
    // soft-capped scores over a full-context cache.
    v.push(attention(
        "two-sequence-prefill",
        spec(4, 2, 72, None, Some(20.0)),
        DType::F32,
        2,
        48,
        vec![
            (
                (0..20).chain(0..20).collect(),
                [vec![0; 20], vec![1; 20]].concat(),
            ),
            (
                (20..40).chain(20..40).collect(),
                [vec![1; 20], vec![0; 20]].concat(),
            ),
        ],
    ));
    // Enough heads and rows that Vulkan's tiled kernel takes each block's key tiles in one
    // workgroup (64 heads x 16 blocks of 32 rows), with a window shorter than the step.
    v.push(attention(
        "wide-prefill",
        spec(64, 8, 8, Some(100), None),
        DType::F16,
        1,
        611,
        vec![((0..512).collect(), vec![0; 512])],
    ));
    // 27B's head of 128 over an f32 cache, few heads and many key tiles (so Vulkan's tiled
    // kernels split each block's tiles over several workgroups and combine the partials).
    v.push(attention(
        "head-128-prefill",
        spec(2, 1, 128, None, None),
        DType::F32,
        1,
        300,
        vec![((0..260).collect(), vec![0; 260])],
    ));
    // Gemma 3's head of 256 with grouped queries in prefill blocks (the tiled kernels: 32 rows):
    // a first chunk of 70 rows (two whole blocks and a partial one), then 30 more rows of that
    // sequence followed by the 40 first of another, so the first block spans both slots and the
    // next ones are the second's; window shorter than the chunk, soft-capped scores, f16 cache.
    v.push(attention(
        "gemma-prefill",
        spec(4, 1, 256, Some(40), Some(30.0)),
        DType::F16,
        2,
        112,
        vec![
            ((0..70).collect(), vec![0; 70]),
            (
                (70..100).chain(0..40).collect(),
                [vec![0; 30], vec![1; 40]].concat(),
            ),
        ],
    ));
    // The same head over an f32 cache, no window or cap, two chunks of 40 rows.
    v.push(attention(
        "gemma-prefill-f32",
        spec(8, 2, 256, None, None),
        DType::F32,
        1,
        80,
        vec![
            ((0..40).collect(), vec![0; 40]),
            ((40..80).collect(), vec![0; 40]),
        ],
    ));
    // Several sequences in one step, at different positions, f16 cache, soft-capped scores.
    v.push(attention(
        "batched",
        spec(4, 2, 8, None, Some(2.0)),
        DType::F16,
        3,
        8,
        vec![
            (vec![0, 0, 0], vec![0, 1, 2]),
            (vec![1, 1, 0], vec![0, 1, 2]),
            (vec![2, 3, 1], vec![0, 0, 2]),
            (vec![2, 4, 2], vec![1, 0, 2]),
        ],
    ));
    // Batched decode: one row per sequence, at row counts around GPU kernel switches (8, 33),
    // Gemma 3's head of 256 and one KV head; slot 0 is a long sequence (its prompt fills the
    // first step), the others start at the second step.
    // 8, 33 and 64 rows take the grouped kernel on the GPUs, 65 the per-head one.
    for (rows, cache) in [
        (8usize, DType::F16),
        (33, DType::F32),
        (64, DType::F16),
        (65, DType::F32),
    ] {
        let first: (Vec<u32>, Vec<u32>) = ((0..rows as u32).collect(), vec![0; rows]);
        let mut steps = vec![first];
        for t in 0..3u32 {
            let positions = std::iter::once(rows as u32 + t)
                .chain(std::iter::repeat_n(t, rows - 1))
                .collect();
            steps.push((positions, (0..rows as u32).collect()));
        }
        v.push(attention(
            &format!("batched-decode-{rows}"),
            spec(4, 1, 256, None, None),
            cache,
            rows,
            rows + 4,
            steps,
        ));
    }
    // Batched decode with few splits (rows x heads large), so that one split holds more
    // positions than the grouped kernels take per chunk (wgpu's subgroup kernel: 64), and two
    // passes of query heads per KV head.
    // Slot 0's prompt in chunks of 8 rows, then one row in each slot.
    let mut steps: Vec<(Vec<u32>, Vec<u32>)> = (0..18u32)
        .map(|c| ((8 * c..8 * c + 8).collect(), vec![0; 8]))
        .collect();
    let positions = std::iter::once(144).chain(std::iter::repeat_n(0, 7)).collect();
    steps.push((positions, (0..8).collect()));
    v.push(attention(
        "long-batched-decode",
        spec(64, 8, 32, None, None),
        DType::F16,
        8,
        160,
        steps,
    ));
    // Images' blocks (`bidirectional_from`): every row of a block sees to its block's end.
    // Prefill of 40 rows (the GPUs' tiled kernels: blocks of 32 rows, their key tiles split):
    // blocks at the start, in the middle, across the 32-row boundary and at the end of a step,
    // then a block of 34 rows from the start of the next; GQA over an f32 cache.
    let (t, i) = (false, true);
    v.push(image_attention(
        "blocks-prefill",
        spec(4, 2, 16, None, None),
        DType::F32,
        1,
        96,
        &[
            &[
                (0, 0, 5, i),
                (0, 5, 7, t),
                (0, 12, 8, i),
                (0, 20, 8, t),
                (0, 28, 8, i),
                (0, 36, 1, t),
                (0, 37, 3, i),
            ],
            &[(0, 40, 34, i), (0, 74, 6, t)],
        ],
    ));
    // A window shorter than the distance to the block's start (later rows of a block see
    // neither its first rows nor what precedes them, yet all of it to its end), over a ring
    // that wraps in the second step, f16 cache.
    v.push(image_attention(
        "windowed-blocks-prefill",
        spec(4, 2, 16, Some(6), None),
        DType::F16,
        1,
        48,
        &[
            &[(0, 0, 12, i), (0, 12, 10, t), (0, 22, 18, i)],
            &[(0, 40, 3, t), (0, 43, 20, i), (0, 63, 17, t)],
        ],
    ));
    // 17 rows of two slots (blocks of several slots: the GPUs' per-row kernels): a block cut by
    // a position jump (slot 0 at 17..=20, then back at 5..=7, rewritten), one in slot 1 followed
    // by its text; soft-capped scores, f16 cache.
    v.push(image_attention(
        "two-slots-jump",
        spec(4, 2, 8, None, Some(20.0)),
        DType::F16,
        2,
        48,
        &[
            &[(0, 0, 17, t)],
            &[(0, 17, 4, i), (0, 5, 3, i), (1, 0, 6, i), (1, 6, 4, t)],
            &[(1, 10, 3, t), (0, 21, 14, i)],
        ],
    ));
    // Decode: one row a step, image and text in turn (a block of one row sees itself).
    v.push(image_attention(
        "decode",
        spec(4, 2, 16, None, None),
        DType::F32,
        1,
        16,
        &[
            &[(0, 0, 1, i)],
            &[(0, 1, 1, t)],
            &[(0, 2, 1, i)],
            &[(0, 3, 1, i)],
            &[(0, 4, 1, t)],
        ],
    ));
    // Batched steps of 6 rows over three slots (decode's grouped kernels), blocks of 1 to 6
    // rows, a window of 5 over a ring of 16 that wraps.
    v.push(image_attention(
        "batched",
        spec(4, 2, 32, Some(5), None),
        DType::F16,
        3,
        16,
        &[
            &[(0, 0, 3, i), (1, 0, 1, t), (2, 0, 2, i)],
            &[(0, 3, 1, t), (1, 1, 3, i), (2, 2, 2, t)],
            &[(0, 4, 6, i)],
            &[(0, 10, 1, i), (1, 4, 1, i), (2, 4, 4, i)],
            &[(2, 8, 2, t), (0, 11, 4, i)],
            &[(0, 15, 6, i)],
        ],
    ));
    // A head past the tiled and grouped kernels' 256 (the per-head kernels), two slots.
    v.push(image_attention(
        "head-320",
        spec(2, 1, 320, None, None),
        DType::F32,
        2,
        40,
        &[&[(0, 0, 9, i), (1, 0, 8, i)], &[(1, 8, 5, t), (0, 9, 12, i)]],
    ));
    // Gemma 3's head of 256, one KV head, a window of 40 shorter than the image's 64 rows, over
    // 70 rows (three tiled blocks, more rows than the grouped kernels take): one slot, then two
    // (the first block then holds both: the per-head kernel takes it).
    v.push(image_attention(
        "gemma-prefill",
        spec(4, 1, 256, Some(40), None),
        DType::F16,
        2,
        112,
        &[
            &[(0, 0, 3, t), (0, 3, 64, i), (0, 67, 3, t)],
            &[(0, 70, 30, i), (1, 0, 3, t), (1, 3, 37, i)],
        ],
    ));
    // Chains a backend may fuse: whole-row norm, add, norm; per-head norms, rope and attention,
    // prefill then decode, in two slots.
    v.push(norm_add_norm(DType::F16, 3, 300, true));
    v.push(norm_add_norm(DType::F32, 2, 45, false));
    // Wider than a backend may keep in registers.
    v.push(norm_add_norm(DType::Bf16, 1, 6500, true));
    v.push(qk_norm_rope_attention(
        spec(4, 2, 8, None, None),
        DType::F32,
        16,
        vec![
            ((0..2).collect(), vec![0, 0]),
            (vec![2, 0], vec![0, 1]),
            (vec![3, 1], vec![0, 1]),
        ],
    ));
    v.push(qk_norm_rope_attention(
        spec(2, 1, 64, Some(4), None),
        DType::F16,
        8,
        (0..7).map(|p| (vec![p], vec![1])).collect(),
    ));
    // The same chains as the model has them: the first norm read by the add alone, the roped K
    // by the attention alone (K and V stored by the fused kernel), f32 and f16 caches.
    v.push(norm_add_norm_outputs(DType::F32, 2, 300, true, false));
    v.push(qk_norm_rope_attention_outputs(
        spec(4, 2, 8, None, None),
        DType::F32,
        16,
        vec![
            ((0..2).collect(), vec![0, 0]),
            (vec![2, 0], vec![0, 1]),
            (vec![3, 1], vec![0, 1]),
        ],
        false,
    ));
    v.push(qk_norm_rope_attention_outputs(
        spec(2, 1, 64, Some(4), None),
        DType::F16,
        8,
        (0..7).map(|p| (vec![p], vec![1])).collect(),
        false,
    ));
    // The same chain over images' blocks (the fused norm-rope kernels storing K and V, then the
    // image-aware attention): a prefill of 20 rows (the GPUs' tiled kernels) in two slots, then
    // decode-sized steps.
    v.push(qk_norm_rope_image_attention(
        spec(4, 2, 8, None, None),
        DType::F32,
        40,
        &[
            &[(0, 0, 2, t), (0, 2, 9, i), (0, 11, 1, t), (1, 0, 8, i)],
            &[(0, 12, 4, i), (1, 8, 1, t), (1, 9, 15, i)],
        ],
    ));
    v.push(qk_norm_rope_image_attention(
        spec(2, 1, 64, Some(4), None),
        DType::F16,
        12,
        &[&[(1, 0, 3, i)], &[(1, 3, 3, i)], &[(1, 6, 3, t)], &[(1, 9, 3, i)]],
    ));
    // Gate and up over one weight, then GeGlu: decode's row counts (one, a batch) and a prefill.
    for rows in [1, 3, 20] {
        v.push(matmul_geglu(DType::Q4K, rows, 512, 37));
    }
    // Rows long enough for more than one pass of a 64-invocation workgroup over q4_k words.
    v.push(matmul_geglu(DType::Q4K, 1, 1024, 37));
    // f16 at decode's row counts with rows of a multiple of 8 values (wgpu's matvec_f16 takes
    // items of 8), one of more than 64 items, with and without the GeGlu.
    v.push(matmul(DType::F16, 1, 520, vec![37]));
    v.push(matmul(DType::F16, 8, 72, vec![20, 13]));
    v.push(matmul_geglu(DType::F16, 3, 64, 37));
    v.push(matmul_geglu(DType::F16, 1, 520, 9));
    v.extend(elementwise(3, 29));
    v.extend(elementwise(1, 1));
    v.push(select_then_matmul(5, vec![4, 0, 4], 13, 9));
    // One sort per row; three passes (17 blocks, then 2 lists of merges, then 1); k = cols.
    v.push(top_k(2, 300, 5));
    v.push(top_k(3, 34_817, 128));
    v.push(top_k(1, 7, 7));
    v
}
