//! The op set and the step graph a backend compiles once and replays every step.
//!
//! Every value in a graph is an `f32` matrix of `[rows, cols]`, where `rows` is either the
//! step's row count (one row per token processed in the step, across all sequences) or the
//! number of rows picked by [`Op::SelectRows`]. Shapes are static per graph; what changes from
//! step to step (token ids, positions, KV-cache slots, which rows to keep) travels in
//! [`StepArgs`].

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::BackendError;
use crate::tensor::{BufferId, TensorDesc};

/// A value (an `f32` matrix) produced by one node of a graph. Ids are dense: `0..n_values`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

/// A weight tensor a node reads: the buffer and what it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightRef {
    /// The backend buffer holding the weight ([`BufferId::UNBOUND`] in capability queries).
    pub buffer: BufferId,
    /// The weight's shape and storage type.
    pub desc: TensorDesc,
}

/// One layer's KV cache: two buffers of `[slots, capacity, kv_heads * head_dim]` elements of
/// `dtype`. The key and value of the token at position `p` of slot `s` live at row
/// `p % capacity` of slot `s` (a ring when `capacity` is smaller than the context).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvCacheRef {
    /// Keys.
    pub k: BufferId,
    /// Values.
    pub v: BufferId,
    /// Storage type of both buffers (`f32` or `f16`).
    pub dtype: DType,
    /// Number of sequences the cache holds.
    pub slots: usize,
    /// Positions kept per sequence.
    pub capacity: usize,
}

/// An operation of the graph. The doc of each variant states its inputs, its outputs and the
/// exact arithmetic; the CPU reference backend implements exactly that.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Reads `[rows, cols]` f32 from an [`crate::Usage::Activation`] buffer, row-major from
    /// offset 0 (a value computed by another program or backend). `selected` picks the row
    /// count: the step's rows (`false`) or the selected rows (`true`).
    Input {
        /// The buffer to read.
        buffer: BufferId,
        /// Columns.
        cols: usize,
        /// Whether the value has the selected-row count.
        selected: bool,
    },
    /// `out[r, :] = table[tokens[r], :] * scale`, table `[vocab, hidden]` of any weight dtype.
    /// With `extra`, token ids past the vocabulary read it: `out[r, :] = extra[tokens[r] -
    /// vocab, :]`, not scaled.
    Embed {
        /// The embedding table.
        table: WeightRef,
        /// Multiplier applied after the lookup (Gemma: `sqrt(hidden)`).
        scale: f32,
        /// Rows past the vocabulary: an f32 `[n, hidden]` table (the soft tokens of images,
        /// which the host rewrites between steps). Token ids `vocab ..< vocab + n` are valid.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        extra: Option<WeightRef>,
    },
    /// RMS normalisation of each group of `weight.len` consecutive columns:
    /// `y = x / sqrt(mean(x^2) + eps) * (weight_offset + w)`, in f32. With a weight of
    /// `head_dim` elements over a `[rows, heads * head_dim]` value, this is per-head QK-norm.
    RmsNorm {
        /// Input.
        x: ValueId,
        /// `[group]` weight.
        weight: WeightRef,
        /// Added to the mean square.
        eps: f32,
        /// Added to every weight element (Gemma's Hugging Face checkpoints: 1.0; GGUF: 0.0).
        weight_offset: f32,
    },
    /// `y = x @ W^T` with `W` of `[n, k]` (PyTorch's `Linear` layout), any weight dtype, f32
    /// accumulation. The output columns are split into one value per entry of `splits`
    /// (which sum to `n`): a fused Q|K|V or gate|up projection is one node.
    MatMul {
        /// Input `[rows, k]`.
        x: ValueId,
        /// Weight `[n, k]`.
        weight: WeightRef,
        /// Output widths, summing to `n`.
        splits: Vec<usize>,
    },
    /// Rotary embedding in the rotate-half layout, applied to every head of `x`
    /// (`[rows, heads * head_dim]`): for `d < head_dim / 2`, with
    /// `a = (positions[r] / factor) * theta^(-2d / head_dim)`,
    /// `y[d] = x[d] cos a - x[d + h/2] sin a`, `y[d + h/2] = x[d + h/2] cos a + x[d] sin a`.
    Rope {
        /// Input.
        x: ValueId,
        /// Size of one head.
        head_dim: usize,
        /// Base of the frequencies.
        theta: f32,
        /// Linear scaling: positions are divided by it (1.0 = none).
        factor: f32,
    },
    /// Causal attention with GQA over a KV cache. First the step's keys and values are stored
    /// at row `positions[r] % capacity` of slot `slots[r]`; then each row `r` attends, per query
    /// head `h` (kv head `h / (heads / kv_heads)`), to the cached positions `lo ..= p` of its
    /// slot, where `p = positions[r]` and `lo = p + 1 - window` with a window, else 0:
    /// `s_j = scale * q . k_j`, optionally `s_j = softcap * tanh(s_j / softcap)`,
    /// `out = sum_j softmax(s)_j v_j`. Output `[rows, heads * head_dim]`.
    ///
    /// With `bidirectional_from = Some(t)`, rows whose token id is at least `t` (the soft tokens
    /// of an image) see their whole block: a block is a run of consecutive step rows of one slot
    /// at consecutive positions whose tokens are all `>= t`, and each of its rows sees up to the
    /// block's last position, `lo ..= end` with `lo` from its own position as above (Gemma 3's
    /// image mask). [`crate::kit::step::visible_ends`] gives every row's `end`. A block must lie
    /// within one step.
    Attention {
        /// Queries `[rows, heads * head_dim]`.
        q: ValueId,
        /// Keys `[rows, kv_heads * head_dim]`.
        k: ValueId,
        /// Values `[rows, kv_heads * head_dim]`.
        v: ValueId,
        /// This layer's cache.
        cache: KvCacheRef,
        /// Query heads.
        heads: usize,
        /// Key/value heads (divides `heads`).
        kv_heads: usize,
        /// Size of one head.
        head_dim: usize,
        /// Multiplier of the dot products.
        scale: f32,
        /// Sliding window: a row sees at most this many positions, its own included.
        window: Option<usize>,
        /// Soft-capping of the scores.
        softcap: Option<f32>,
        /// Token ids from which rows attend bidirectionally within their block (see above).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bidirectional_from: Option<u32>,
    },
    /// `gelu_tanh(gate) * up`, with
    /// `gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
    GeGlu {
        /// Gate input.
        gate: ValueId,
        /// Up input (same shape).
        up: ValueId,
    },
    /// `a + b`, same shapes.
    Add {
        /// Left input.
        a: ValueId,
        /// Right input.
        b: ValueId,
    },
    /// Layer normalisation of each row over its columns:
    /// `y = (x - mean) / sqrt(var + eps) * w + b` with the biased variance, in f32 (SigLIP's,
    /// in the vision tower).
    LayerNorm {
        /// Input.
        x: ValueId,
        /// `[cols]` weight.
        weight: WeightRef,
        /// `[cols]` bias.
        bias: WeightRef,
        /// Added to the variance.
        eps: f32,
    },
    /// `y = x + b` on every row, `b` a `[cols]` weight (a linear layer's bias).
    Bias {
        /// Input.
        x: ValueId,
        /// `[cols]` bias.
        bias: WeightRef,
    },
    /// `gelu_tanh(x)`, [`Op::GeGlu`]'s activation without the product.
    Gelu {
        /// Input.
        x: ValueId,
    },
    /// Bidirectional attention within consecutive blocks of `block` step rows (the patches of
    /// one image): row `r` of block `b` attends, per head `h`, to every row of its block:
    /// `s_j = scale * q_r . k_j`, `out_r = sum_j softmax(s)_j v_j`. No cache, no positions, as
    /// many key/value heads as query heads. Output `[rows, heads * head_dim]`; the step's rows
    /// are a multiple of `block`.
    BlockAttention {
        /// Queries `[rows, heads * head_dim]`.
        q: ValueId,
        /// Keys, the same shape.
        k: ValueId,
        /// Values, the same shape.
        v: ValueId,
        /// Heads.
        heads: usize,
        /// Size of one head.
        head_dim: usize,
        /// Multiplier of the dot products.
        scale: f32,
        /// Rows per block.
        block: usize,
    },
    /// `cap * tanh(x / cap)`.
    Softcap {
        /// Input.
        x: ValueId,
        /// The cap.
        cap: f32,
    },
    /// The `k` largest values of each row of `x` and their column indices, `[rows, 2k]`: the
    /// values in rank order (larger first, equal values by lower index; NaN counts as -inf and
    /// is written as -inf) in columns `0..k`, then their indices, as exact f32 integers, in
    /// columns `k..2k`. `1 <= k <= TOP_K_MAX`, `k <= cols`, and `cols` at most 2^24 (so every
    /// index is exact). What a sampler needs of a row of logits when it keeps only the best
    /// `k` tokens.
    TopK {
        /// Input.
        x: ValueId,
        /// How many.
        k: usize,
    },
    /// Keeps the rows named by `StepArgs::select`, in that order: `[selected_rows, cols]`.
    SelectRows {
        /// Input (step rows).
        x: ValueId,
    },
    /// Writes `x` row-major at offset 0 of an [`crate::Usage::Activation`] f32 buffer, which the
    /// host (or another backend) reads after the step. Produces no value.
    Output {
        /// The value to write.
        x: ValueId,
        /// Destination buffer.
        buffer: BufferId,
    },
}

/// The largest `k` of [`Op::TopK`].
pub const TOP_K_MAX: usize = 128;

impl Op {
    /// Every op kind, as [`Op::kind`] names them.
    pub const KINDS: [&'static str; 16] = [
        "input",
        "embed",
        "rms_norm",
        "matmul",
        "rope",
        "attention",
        "geglu",
        "add",
        "layer_norm",
        "bias",
        "gelu",
        "block_attention",
        "softcap",
        "top_k",
        "select_rows",
        "output",
    ];

    /// The op's kind (`matmul`, `attention`, ...), one of [`Op::KINDS`].
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Embed { .. } => "embed",
            Op::RmsNorm { .. } => "rms_norm",
            Op::MatMul { .. } => "matmul",
            Op::Rope { .. } => "rope",
            Op::Attention { .. } => "attention",
            Op::GeGlu { .. } => "geglu",
            Op::Add { .. } => "add",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Bias { .. } => "bias",
            Op::Gelu { .. } => "gelu",
            Op::BlockAttention { .. } => "block_attention",
            Op::Softcap { .. } => "softcap",
            Op::TopK { .. } => "top_k",
            Op::SelectRows { .. } => "select_rows",
            Op::Output { .. } => "output",
        }
    }

    /// A short name for messages: the kind, with the weight dtype where there is one
    /// (`matmul(q4_k)`).
    pub fn name(&self) -> String {
        let base = self.kind();
        match self {
            Op::Embed { table: w, .. }
            | Op::RmsNorm { weight: w, .. }
            | Op::MatMul { weight: w, .. }
            | Op::LayerNorm { weight: w, .. }
            | Op::Bias { bias: w, .. } => {
                format!("{base}({})", w.desc.dtype)
            }
            Op::Attention { cache, .. } => format!("{base}(kv {})", cache.dtype),
            _ => base.to_string(),
        }
    }

    /// The values this op reads.
    pub fn inputs(&self) -> Vec<ValueId> {
        match self {
            Op::Input { .. } | Op::Embed { .. } => vec![],
            Op::RmsNorm { x, .. }
            | Op::MatMul { x, .. }
            | Op::Rope { x, .. }
            | Op::Softcap { x, .. }
            | Op::LayerNorm { x, .. }
            | Op::Bias { x, .. }
            | Op::Gelu { x }
            | Op::TopK { x, .. }
            | Op::SelectRows { x }
            | Op::Output { x, .. } => vec![*x],
            Op::Attention { q, k, v, .. } | Op::BlockAttention { q, k, v, .. } => vec![*q, *k, *v],
            Op::GeGlu { gate: a, up: b } | Op::Add { a, b } => vec![*a, *b],
        }
    }

    /// The values this op reads, to rename them (a host moving the op into another graph).
    pub fn inputs_mut(&mut self) -> Vec<&mut ValueId> {
        match self {
            Op::Input { .. } | Op::Embed { .. } => vec![],
            Op::RmsNorm { x, .. }
            | Op::MatMul { x, .. }
            | Op::Rope { x, .. }
            | Op::Softcap { x, .. }
            | Op::LayerNorm { x, .. }
            | Op::Bias { x, .. }
            | Op::Gelu { x }
            | Op::TopK { x, .. }
            | Op::SelectRows { x }
            | Op::Output { x, .. } => vec![x],
            Op::Attention { q, k, v, .. } | Op::BlockAttention { q, k, v, .. } => vec![q, k, v],
            Op::GeGlu { gate: a, up: b } | Op::Add { a, b } => vec![a, b],
        }
    }

    /// The weights this op reads.
    pub fn weights(&self) -> Vec<&WeightRef> {
        match self {
            Op::Embed { table, extra, .. } => std::iter::once(table).chain(extra.as_ref()).collect(),
            Op::RmsNorm { weight: w, .. } | Op::MatMul { weight: w, .. } => vec![w],
            Op::LayerNorm { weight, bias, .. } => vec![weight, bias],
            Op::Bias { bias, .. } => vec![bias],
            _ => vec![],
        }
    }

    /// Every buffer this op names (weights, KV caches, input and output buffers), for a host
    /// that binds a graph built over its own ids to the ids one backend issued.
    pub fn buffers_mut(&mut self) -> Vec<&mut BufferId> {
        match self {
            Op::Input { buffer, .. } | Op::Output { buffer, .. } => vec![buffer],
            Op::Embed { table, extra, .. } => std::iter::once(&mut table.buffer)
                .chain(extra.as_mut().map(|e| &mut e.buffer))
                .collect(),
            Op::RmsNorm { weight: w, .. } | Op::MatMul { weight: w, .. } => vec![&mut w.buffer],
            Op::Attention { cache, .. } => vec![&mut cache.k, &mut cache.v],
            Op::LayerNorm { weight, bias, .. } => vec![&mut weight.buffer, &mut bias.buffer],
            Op::Bias { bias, .. } => vec![&mut bias.buffer],
            Op::Rope { .. }
            | Op::Gelu { .. }
            | Op::BlockAttention { .. }
            | Op::GeGlu { .. }
            | Op::Add { .. }
            | Op::Softcap { .. }
            | Op::TopK { .. }
            | Op::SelectRows { .. } => vec![],
        }
    }

    /// How many values this op produces.
    pub fn output_count(&self) -> usize {
        match self {
            Op::MatMul { splits, .. } => splits.len(),
            Op::Output { .. } => 0,
            _ => 1,
        }
    }
}

/// A node: one op and the ids of the values it defines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// The values it defines, `op.output_count()` of them.
    pub outputs: Vec<ValueId>,
}

/// A whole step (or a backend's share of one), compiled once and executed many times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    /// A name for messages and profiles (`gemma3 rows=1`).
    pub name: String,
    /// Rows per step: tokens processed per execution, across all sequences.
    pub rows: usize,
    /// Rows kept by [`Op::SelectRows`] (0 when the graph has none).
    pub selected_rows: usize,
    /// Nodes in execution order; every input is defined by an earlier node.
    pub nodes: Vec<Node>,
}

/// Which row count a value has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RowCount {
    /// `Graph::rows`.
    Step,
    /// `Graph::selected_rows`.
    Selected,
}

/// The inferred shape of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueShape {
    /// Its row count.
    pub rows: RowCount,
    /// Its column count.
    pub cols: usize,
}

impl Graph {
    /// Number of values the graph defines.
    pub fn value_count(&self) -> usize {
        self.nodes.iter().map(|n| n.outputs.len()).sum()
    }

    /// Checks the graph and infers the shape of every value (indexed by [`ValueId`]): ids dense
    /// and defined before use, output counts, weight shapes, column counts and head sizes.
    /// Every backend calls this in `compile`; the error names the node and what was expected.
    pub fn infer_shapes(&self) -> Result<Vec<ValueShape>, BackendError> {
        let mut shapes: Vec<Option<ValueShape>> = vec![None; self.value_count()];
        if self.rows == 0 {
            return Err(BackendError::invalid(format!(
                "graph '{}': rows must be at least 1",
                self.name
            )));
        }
        for (i, node) in self.nodes.iter().enumerate() {
            let err = |what: String| {
                BackendError::invalid(format!(
                    "graph '{}', node {i} ({}): {what}",
                    self.name,
                    node.op.name()
                ))
            };
            let get = |v: ValueId| -> Result<ValueShape, BackendError> {
                shapes
                    .get(v.0 as usize)
                    .copied()
                    .flatten()
                    .ok_or_else(|| err(format!("value {} is used before it is defined", v.0)))
            };
            let weight_2d = |w: &WeightRef| -> Result<(usize, usize), BackendError> {
                w.desc.byte_size().map_err(|e| err(e.to_string()))?;
                match w.desc.shape.as_slice() {
                    [n, k] => Ok((*n, *k)),
                    s => Err(err(format!("weight must be 2-D, found shape {s:?}"))),
                }
            };
            let step = |cols| ValueShape {
                rows: RowCount::Step,
                cols,
            };
            let outs: Vec<ValueShape> = match &node.op {
                Op::Input { cols, selected, .. } => {
                    let rows = if *selected {
                        RowCount::Selected
                    } else {
                        RowCount::Step
                    };
                    vec![ValueShape { rows, cols: *cols }]
                }
                Op::Embed { table, extra, .. } => {
                    let (_, hidden) = weight_2d(table)?;
                    if let Some(extra) = extra {
                        let (_, cols) = weight_2d(extra)?;
                        if cols != hidden || extra.desc.dtype != DType::F32 {
                            return Err(err(format!(
                                "the extra rows must be f32 [n, {hidden}], found {} {:?}",
                                extra.desc.dtype, extra.desc.shape
                            )));
                        }
                    }
                    vec![step(hidden)]
                }
                Op::RmsNorm { x, weight, eps, .. } => {
                    let s = get(*x)?;
                    let group = match weight.desc.shape.as_slice() {
                        [g] if *g > 0 => *g,
                        other => {
                            return Err(err(format!("weight must be 1-D and non-empty, found {other:?}")))
                        }
                    };
                    if s.cols % group != 0 {
                        return Err(err(format!(
                            "{} columns are not a multiple of the weight's {group}",
                            s.cols
                        )));
                    }
                    if !(eps.is_finite() && *eps >= 0.0) {
                        return Err(err(format!("eps must be finite and >= 0, found {eps}")));
                    }
                    vec![s]
                }
                Op::MatMul { x, weight, splits } => {
                    let s = get(*x)?;
                    let (n, k) = weight_2d(weight)?;
                    if s.cols != k {
                        return Err(err(format!(
                            "input has {} columns, weight [{n}, {k}] expects {k}",
                            s.cols
                        )));
                    }
                    if splits.is_empty() || splits.contains(&0) || splits.iter().sum::<usize>() != n {
                        return Err(err(format!("splits {splits:?} must be non-zero and sum to {n}")));
                    }
                    splits
                        .iter()
                        .map(|&c| ValueShape {
                            rows: s.rows,
                            cols: c,
                        })
                        .collect()
                }
                Op::Rope {
                    x,
                    head_dim,
                    theta,
                    factor,
                } => {
                    let s = get(*x)?;
                    if *head_dim == 0 || head_dim % 2 != 0 || s.cols % head_dim != 0 {
                        return Err(err(format!(
                            "head_dim {head_dim} must be even and divide the {} columns",
                            s.cols
                        )));
                    }
                    if !(*theta > 0.0 && *factor > 0.0) {
                        return Err(err(format!("theta {theta} and factor {factor} must be positive")));
                    }
                    vec![s]
                }
                Op::Attention {
                    q,
                    k,
                    v,
                    cache,
                    heads,
                    kv_heads,
                    head_dim,
                    window,
                    ..
                } => {
                    let (sq, sk, sv) = (get(*q)?, get(*k)?, get(*v)?);
                    if *heads == 0 || *kv_heads == 0 || *head_dim == 0 || heads % kv_heads != 0 {
                        return Err(err(format!(
                            "{heads} heads must be a positive multiple of {kv_heads} kv heads (head_dim {head_dim})"
                        )));
                    }
                    if sq.cols != heads * head_dim || sk.cols != kv_heads * head_dim || sv.cols != sk.cols {
                        return Err(err(format!(
                            "q/k/v have {}/{}/{} columns, expected {}/{}/{}",
                            sq.cols,
                            sk.cols,
                            sv.cols,
                            heads * head_dim,
                            kv_heads * head_dim,
                            kv_heads * head_dim
                        )));
                    }
                    if [sq.rows, sk.rows, sv.rows].iter().any(|r| *r != RowCount::Step) {
                        return Err(err("q, k and v must have the step's rows".into()));
                    }
                    if !matches!(cache.dtype, DType::F32 | DType::F16) {
                        return Err(err(format!("KV cache dtype {} must be f32 or f16", cache.dtype)));
                    }
                    if cache.slots == 0 || cache.capacity == 0 || *window == Some(0) {
                        return Err(err("cache slots, capacity and window must be positive".into()));
                    }
                    if let Some(w) = window {
                        if *w > cache.capacity {
                            return Err(err(format!(
                                "window {w} exceeds the cache capacity {}",
                                cache.capacity
                            )));
                        }
                    }
                    vec![sq]
                }
                Op::GeGlu { gate: a, up: b } | Op::Add { a, b } => {
                    let (sa, sb) = (get(*a)?, get(*b)?);
                    if sa != sb {
                        return Err(err(format!("operand shapes differ: {sa:?} and {sb:?}")));
                    }
                    vec![sa]
                }
                Op::LayerNorm { x, weight, bias, eps } => {
                    let s = get(*x)?;
                    for (what, w) in [("weight", weight), ("bias", bias)] {
                        if w.desc.shape.as_slice() != [s.cols] {
                            return Err(err(format!(
                                "{what} must be [{}] (the input's columns), found {:?}",
                                s.cols, w.desc.shape
                            )));
                        }
                    }
                    if !(eps.is_finite() && *eps >= 0.0) {
                        return Err(err(format!("eps must be finite and >= 0, found {eps}")));
                    }
                    vec![s]
                }
                Op::Bias { x, bias } => {
                    let s = get(*x)?;
                    if bias.desc.shape.as_slice() != [s.cols] {
                        return Err(err(format!(
                            "bias must be [{}] (the input's columns), found {:?}",
                            s.cols, bias.desc.shape
                        )));
                    }
                    vec![s]
                }
                Op::Gelu { x } => vec![get(*x)?],
                Op::BlockAttention {
                    q,
                    k,
                    v,
                    heads,
                    head_dim,
                    block,
                    ..
                } => {
                    let (sq, sk, sv) = (get(*q)?, get(*k)?, get(*v)?);
                    let width = heads * head_dim;
                    if *heads == 0 || *head_dim == 0 || *block == 0 {
                        return Err(err("heads, head_dim and block must be positive".into()));
                    }
                    if [sq.cols, sk.cols, sv.cols] != [width; 3] {
                        return Err(err(format!(
                            "q, k and v must have {heads} x {head_dim} = {width} columns, found {}, {}, {}",
                            sq.cols, sk.cols, sv.cols
                        )));
                    }
                    if [sq.rows, sk.rows, sv.rows].iter().any(|r| *r != RowCount::Step) {
                        return Err(err("q, k and v must have the step's rows".into()));
                    }
                    if !self.rows.is_multiple_of(*block) {
                        return Err(err(format!(
                            "the step's {} rows are not a whole number of blocks of {block}",
                            self.rows
                        )));
                    }
                    vec![sq]
                }
                Op::Softcap { x, cap } => {
                    if !(cap.is_finite() && *cap > 0.0) {
                        return Err(err(format!("cap must be positive, found {cap}")));
                    }
                    vec![get(*x)?]
                }
                Op::TopK { x, k } => {
                    let s = get(*x)?;
                    if *k == 0 || *k > TOP_K_MAX || *k > s.cols || s.cols > 1 << 24 {
                        return Err(err(format!(
                            "k {k} must be 1 to {TOP_K_MAX} and at most the {} columns (at most 2^24)",
                            s.cols
                        )));
                    }
                    vec![ValueShape {
                        rows: s.rows,
                        cols: 2 * k,
                    }]
                }
                Op::SelectRows { x } => {
                    let s = get(*x)?;
                    if s.rows != RowCount::Step || self.selected_rows == 0 {
                        return Err(err("selects from step rows into selected_rows >= 1".into()));
                    }
                    vec![ValueShape {
                        rows: RowCount::Selected,
                        cols: s.cols,
                    }]
                }
                Op::Output { x, .. } => {
                    get(*x)?;
                    vec![]
                }
            };
            if outs.len() != node.outputs.len() {
                return Err(err(format!(
                    "defines {} values, the op produces {}",
                    node.outputs.len(),
                    outs.len()
                )));
            }
            for (id, shape) in node.outputs.iter().zip(outs) {
                match shapes.get_mut(id.0 as usize) {
                    Some(slot @ None) => *slot = Some(shape),
                    Some(Some(_)) => return Err(err(format!("value {} is defined twice", id.0))),
                    None => {
                        return Err(err(format!(
                            "value id {} is not dense (graph has {})",
                            id.0,
                            self.value_count()
                        )))
                    }
                }
            }
        }
        shapes
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                s.ok_or_else(|| {
                    BackendError::invalid(format!("graph '{}': value {i} never defined", self.name))
                })
            })
            .collect()
    }
}

/// Builds a [`Graph`], handing out value ids.
#[derive(Debug)]
pub struct GraphBuilder {
    graph: Graph,
    next: u32,
}

impl GraphBuilder {
    /// An empty graph of `rows` step rows and `selected_rows` selected rows.
    pub fn new(name: impl Into<String>, rows: usize, selected_rows: usize) -> Self {
        GraphBuilder {
            graph: Graph {
                name: name.into(),
                rows,
                selected_rows,
                nodes: Vec::new(),
            },
            next: 0,
        }
    }

    /// Appends a node and returns the values it defines.
    pub fn push(&mut self, op: Op) -> Vec<ValueId> {
        let outputs: Vec<ValueId> = (0..op.output_count())
            .map(|i| ValueId(self.next + i as u32))
            .collect();
        self.next += outputs.len() as u32;
        self.graph.nodes.push(Node {
            op,
            outputs: outputs.clone(),
        });
        outputs
    }

    /// Appends a node that defines exactly one value and returns it.
    ///
    /// # Panics
    /// If the op defines no value or several (a bug in the caller, not an input error).
    pub fn push1(&mut self, op: Op) -> ValueId {
        let outs = self.push(op);
        assert_eq!(outs.len(), 1, "push1 on an op with {} outputs", outs.len());
        outs[0]
    }

    /// Nodes pushed so far.
    pub fn node_count(&self) -> usize {
        self.graph.nodes.len()
    }

    /// The graph built so far.
    pub fn finish(self) -> Graph {
        self.graph
    }
}

/// What changes from one execution of a program to the next. Row `r` of the step is token
/// `tokens[r]` at position `positions[r]` of the sequence in KV-cache slot `slots[r]`.
///
/// Valid arguments have one token, position and slot per step row and `selected_rows` select
/// indices below the step's rows; slots below every KV cache's slot count, token ids below every
/// embedding's vocabulary, and every position a row attends to still in its cache's ring.
/// Backends check this in `execute` with [`crate::kit::step::StepShape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepArgs<'a> {
    /// Token ids, one per step row.
    pub tokens: &'a [u32],
    /// Positions in their sequence, one per step row.
    pub positions: &'a [u32],
    /// KV-cache slots, one per step row.
    pub slots: &'a [u32],
    /// Rows kept by [`Op::SelectRows`], `Graph::selected_rows` of them.
    pub select: &'a [u32],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_and_inputs_can_be_renamed() {
        let mut op = Op::MatMul {
            x: ValueId(3),
            weight: WeightRef {
                buffer: BufferId(7),
                desc: TensorDesc::new(DType::F32, [4, 4]),
            },
            splits: vec![4],
        };
        for b in op.buffers_mut() {
            b.0 += 100;
        }
        for v in op.inputs_mut() {
            v.0 = 0;
        }
        assert_eq!(op.inputs(), vec![ValueId(0)]);
        assert_eq!(op.weights()[0].buffer, BufferId(107));
        let mut att = Op::Attention {
            q: ValueId(1),
            k: ValueId(2),
            v: ValueId(3),
            cache: KvCacheRef {
                k: BufferId(5),
                v: BufferId(6),
                dtype: DType::F32,
                slots: 1,
                capacity: 4,
            },
            heads: 1,
            kv_heads: 1,
            head_dim: 4,
            scale: 1.0,
            window: None,
            softcap: None,
            bidirectional_from: None,
        };
        let ids: Vec<u64> = att.buffers_mut().into_iter().map(|b| b.0).collect();
        assert_eq!(ids, vec![5, 6]);
        assert_eq!(att.inputs_mut().len(), 3);
        assert!(Op::Add {
            a: ValueId(0),
            b: ValueId(1)
        }
        .buffers_mut()
        .is_empty());
    }
}
