//! What the runtime sees of a model: its step graph for any shape, with the part and region of
//! each node that placement reads ([`StepModel`]). The split scheduler (`runtime::split`) runs
//! any model through this trait alone; [`super::Gemma3Model`] is one.

use tandem_backend_api::{BufferId, DType, Graph};

/// The parts of a model that placement lists name (`[placement] attention`, `ffn`, `default`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// The attention block (Gemma: Q|K|V projection, q/k norms, rope, attention, output
    /// projection).
    Attention,
    /// The feed-forward network (Gemma: gate|up projection, GeGLU, down projection).
    Ffn,
    /// Everything else (embedding, the norms around the blocks, residual adds, logits): the
    /// `default` list's part.
    #[serde(rename = "default")]
    Other,
}

impl Part {
    /// The key naming it in `[placement]`.
    pub fn key(self) -> &'static str {
        match self {
            Part::Attention => "attention",
            Part::Ffn => "ffn",
            Part::Other => "default",
        }
    }
}

/// The stretch of the model a node belongs to: what layer placement (`[placement.layers]`,
/// `--gpu-layers`) puts on a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Region {
    /// The token embedding lookup.
    Embedding,
    /// Decoder layer `n` (Gemma: from its input norm to the residual add after its feed-forward
    /// network).
    Layer(usize),
    /// The output head (Gemma: the selected rows, the final norm, the logits and their soft cap).
    Head,
}

/// A model as the split scheduler runs it: a step graph per shape, built from `backend-api`
/// ops over planned buffer ids (which each unit's `map` binds to its own buffers).
///
/// What the scheduler relies on:
/// - **Node positions**: the graph of every shape has the same nodes, with the same ops, in the
///   same order as the one-row graph a placement was made on (only row counts differ).
/// - **The output**: the last node is the [`tandem_backend_api::Op::Output`] of the logits,
///   `[selected, vocab_size]` f32, into the buffer passed as `logits`.
/// - **KV caches**: every cache the model keeps is the [`tandem_backend_api::KvCacheRef`] of an
///   [`tandem_backend_api::Op::Attention`] node, laid out as `backend-api` defines it
///   (`[slots, capacity, kv_heads * head_dim]`). The scheduler reads the KV layout from those
///   nodes (to hand caches between units where prefill and decode place attention apart), so
///   the graph is its only description: nothing else can disagree with it.
pub trait StepModel {
    /// The step graph for `rows` rows, keeping `selected` rows for the logits, which it writes
    /// to `logits` (`[selected, vocab]` f32); with the part of the model each node belongs to
    /// (what the placement's preference lists are keyed by) and its region (what layer
    /// placement places), one of each per node.
    fn step_graph_parts(
        &self,
        rows: usize,
        selected: usize,
        logits: BufferId,
    ) -> (Graph, Vec<Part>, Vec<Region>);

    /// [`StepModel::step_graph_parts`]'s graph alone.
    fn step_graph(&self, rows: usize, selected: usize, logits: BufferId) -> Graph {
        self.step_graph_parts(rows, selected, logits).0
    }

    /// The logits per row: the width of the step graph's output.
    fn vocab_size(&self) -> usize;

    /// How its KV caches are sized (slots, context, rows per step, element type): what a
    /// session's steps are checked against.
    fn cache_shape(&self) -> CacheShape;

    /// The most rows one slot may take in a step that starts from an empty slot: every cache
    /// holds them all (a ring at least its window), within the context.
    fn fresh_rows(&self) -> usize;

    /// Whether a sequence of `len` tokens may be shortened by `by` tokens (a kept prefix,
    /// `engine serve`'s prefix reuse): every cache that is a ring still holds what the following
    /// steps read.
    fn can_rewind(&self, len: usize, by: usize) -> bool;

    /// Its table of images' soft tokens, where it has one (token ids `vocab ..< vocab + rows`
    /// read it).
    fn image_rows(&self) -> Option<ImageTable> {
        None
    }
}

/// A model's table of images' soft tokens: f32 `[rows, width]` under a planned id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageTable {
    /// Its planned id.
    pub id: BufferId,
    /// Rows: soft tokens it holds at once.
    pub rows: usize,
    /// Values per row: the model's width.
    pub width: usize,
}

/// How the KV caches are sized.
#[derive(Debug, Clone, Copy)]
pub struct CacheShape {
    /// Sequences held at once.
    pub slots: usize,
    /// Longest sequence (prompt + generated), in tokens.
    pub context: usize,
    /// Most rows one step may hold (prefill chunk).
    pub max_step_rows: usize,
    /// The caches' element type: f32 or f16.
    pub dtype: DType,
}
