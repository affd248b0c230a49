//! A loaded model on its units (one backend, or several: see [`super::split`]), its KV cache
//! state per slot, and steps: token ids in, logits out. Generation (sampling, stop rules, text)
//! is [`super::sequence`]'s.

use tandem_backend_api::{BackendError, ComputeBackend, NodeTime, StepArgs};

use super::sampler::Sampler;
use super::split::program::BoundaryCounts;
use super::split::{BoundaryMode, Phase, ScheduleError, SplitScheduler};
use crate::model::{CacheShape, Gemma3Model, StepModel};

/// How many of each row's best logits a decode step reads back instead of the row, where the
/// logits are computed on a device ([`Session::ranked_k`]) and the sampler needs no more
/// (greedy, or top-k up to this; no repetition penalty): the default top-k (64) and then some.
pub const RANKED_K: usize = 128;

/// Bytes of logits a step keeping every row's logits may bring back ([`Session::scoring_chunk`]).
pub const SCORING_LOGIT_BYTES: usize = 64 << 20;

/// Which logits of a step's selected rows come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Every selected row's logits (`[select, vocab]`).
    Rows,
    /// Each selected row's best `k` logits in rank order (higher first, equal ones by lower id,
    /// NaN as -inf), then their ids as f32 (`[select, 2k]`): computed on the unit that computes
    /// the logits (`Op::TopK`), so a batched step reads back a few kilobytes instead of every
    /// row's logits. For samplers that `fits_ranked(k)` (`Sampler::sample_ranked`), where
    /// [`Session::supports_top_k`] says so ([`Session::logits_for`] decides).
    Best(usize),
}

/// Where the prompt piece starting at `start` ends: at most `max` tokens on, but never inside an
/// image's rows (ids from `vocab` on, which attend to each other and so run in one step): a cut
/// there moves back to their start, or, where they begin the piece, on to their end. The one
/// rule every prompt is cut by (generation's chunks, [`Session::prefill`]).
pub fn piece_end(tokens: &[u32], start: usize, max: usize, vocab: usize) -> usize {
    let mut end = (start + max.max(1)).min(tokens.len());
    let image = |i: usize| tokens[i] as usize >= vocab;
    if end < tokens.len() && end > start && image(end - 1) && image(end) {
        let mut first = end - 1;
        while first > start && image(first - 1) {
            first -= 1;
        }
        if first > start {
            end = first;
        } else {
            while end < tokens.len() && image(end) {
                end += 1;
            }
        }
    }
    end
}

/// One step of a session: its rows (a token and a KV cache slot each), the rows whose logits
/// come back, which logits, and the placement it runs with.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// The placement's phase: a step that carries a prompt chunk runs prefill's.
    pub phase: Phase,
    /// One token per row.
    pub tokens: &'a [u32],
    /// Each row's KV cache slot.
    pub slots: &'a [u32],
    /// The rows whose logits come back, in order.
    pub select: &'a [u32],
    /// Which of their logits.
    pub logits: Logits,
}

impl<'a> Step<'a> {
    /// A decode step's rows, their whole logits.
    pub fn decode(tokens: &'a [u32], slots: &'a [u32], select: &'a [u32]) -> Step<'a> {
        Step {
            phase: Phase::Decode,
            tokens,
            slots,
            select,
            logits: Logits::Rows,
        }
    }

    /// A prompt chunk's rows (prefill's placement), their whole logits.
    pub fn prefill(tokens: &'a [u32], slots: &'a [u32], select: &'a [u32]) -> Step<'a> {
        Step {
            phase: Phase::Prefill,
            ..Step::decode(tokens, slots, select)
        }
    }

    /// This step asking for `logits`.
    pub fn with(self, logits: Logits) -> Step<'a> {
        Step { logits, ..self }
    }
}

/// What went wrong while running the model.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The backend failed.
    #[error("{context}: {error}")]
    Backend {
        /// What was being done.
        context: String,
        /// The backend's error.
        error: BackendError,
    },
    /// A token id the model does not have.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The sequence would outgrow the KV cache.
    #[error("sequence of {needed} tokens exceeds the context of {context}")]
    ContextFull {
        /// Tokens needed.
        needed: usize,
        /// Context size.
        context: usize,
    },
    /// Bad use of the API.
    #[error("{0}")]
    Invalid(String),
    /// Building or running the step's programs failed.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
}

/// The model on its units, with per-slot sequence lengths. It sees the model through
/// [`StepModel`] alone; Gemma 3 is the one the engine loads (the default `M`).
pub struct Session<M: StepModel = Gemma3Model> {
    scheduler: SplitScheduler,
    model: M,
    /// The model's cache shape ([`StepModel::cache_shape`]), read once.
    shape: CacheShape,
    /// Tokens already in the cache, per slot.
    lengths: Vec<usize>,
    /// Scratch for step arguments (reused: nothing allocated per token once warm).
    tokens: Vec<u32>,
    positions: Vec<u32>,
    slots: Vec<u32>,
    select: Vec<u32>,
    /// The last step's logits, read by the backend straight into `f32`s (their bytes are
    /// little-endian: converted in place on a big-endian host).
    logits: Vec<f32>,
    /// Scratch for the lengths after a step (swapped with `lengths`).
    next_lengths: Vec<usize>,
    /// The `k` the units were last found able to rank ([`Logits::Best`]).
    top_k_ok: Option<usize>,
    /// [`Session::ranked_k`].
    ranked_k: usize,
}

impl<M: StepModel> Session<M> {
    /// The model on the units of `scheduler` (built by `runtime::load`).
    pub fn new(scheduler: SplitScheduler, model: M) -> Self {
        let shape = model.cache_shape();
        let slots = shape.slots;
        let mut session = Session {
            scheduler,
            model,
            shape,
            lengths: vec![0; slots],
            tokens: vec![],
            positions: vec![],
            slots: vec![],
            select: vec![],
            logits: vec![],
            next_lengths: vec![],
            top_k_ok: None,
            ranked_k: 0,
        };
        session.ranked_k = session.find_ranked_k();
        session
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The logits per row.
    pub fn vocab(&self) -> usize {
        self.model.vocab_size()
    }

    /// Rows for images' soft tokens (token ids `vocab ..< vocab + image_rows()`); 0: the model
    /// was loaded without them.
    pub fn image_rows(&self) -> usize {
        self.model.image_rows().map_or(0, |t| t.rows)
    }

    /// Writes `rows` (`[n, width]` f32, whole rows) into the images' table from row `first`:
    /// what token ids `vocab + first ..` embed as from the next step on.
    pub fn write_image_rows(&mut self, first: usize, rows: &[f32]) -> Result<(), SessionError> {
        let invalid = |message: String| {
            SessionError::Schedule(ScheduleError {
                context: "writing an image's soft tokens".into(),
                error: BackendError::invalid(message),
                unit: None,
            })
        };
        let Some(t) = self.model.image_rows() else {
            return Err(invalid("the model was loaded without rows for images".into()));
        };
        let n = rows.len() / t.width.max(1);
        if !rows.len().is_multiple_of(t.width.max(1)) || first + n > t.rows {
            return Err(invalid(format!(
                "{} values from row {first} do not fit the table of {} rows of {}",
                rows.len(),
                t.rows,
                t.width
            )));
        }
        let offset = (first * t.width * 4) as u64;
        self.scheduler
            .write_planned(t.id, offset, bytemuck::cast_slice(rows))
            .map_err(SessionError::Schedule)?;
        Ok(())
    }

    /// The backend that computes the logits (the only one, unless split).
    pub fn backend(&self) -> &dyn ComputeBackend {
        self.scheduler.units()[self.scheduler.main_unit()]
            .backend
            .as_ref()
    }

    /// [`Session::backend`], for measurements between steps (`engine bench`).
    pub fn backend_mut(&mut self) -> &mut dyn ComputeBackend {
        self.scheduler.main_backend()
    }

    /// Micro-batches the last step ran in (1: whole; 0: no step yet).
    pub fn last_step_micro_batches(&self) -> usize {
        self.scheduler.last_step_micro_batches()
    }

    /// Sets how many micro-batches a split decode step of several sequences is cut into
    /// ([`SplitScheduler::set_micro_batches`]).
    pub fn set_micro_batches(&mut self, n: usize) {
        self.scheduler.set_micro_batches(n);
    }

    /// Sets how many micro-batches a prompt step on a split is cut into
    /// ([`SplitScheduler::set_prefill_micro_batches`]).
    pub fn set_prefill_micro_batches(&mut self, n: usize, min_rows: usize) {
        self.scheduler.set_prefill_micro_batches(n, min_rows);
    }

    /// Whether a prompt step of `rows` rows runs on more than one unit
    /// ([`SplitScheduler::prompt_changes_unit`]).
    pub fn prompt_changes_unit(&self, rows: usize) -> bool {
        self.scheduler.prompt_changes_unit(rows)
    }

    /// Sets how values cross between the units of a split
    /// ([`SplitScheduler::set_boundaries`]).
    pub fn set_boundaries(&mut self, mode: BoundaryMode) {
        self.scheduler.set_boundaries(mode);
    }

    /// What the last step's boundaries did ([`SplitScheduler::boundary_counts`]).
    pub fn boundary_counts(&self) -> BoundaryCounts {
        self.scheduler.boundary_counts()
    }

    /// The most rows of one sequence every unit computes as it computes a single row
    /// (`BackendInfo::decode_rows`, asked of each unit); `None` where none says.
    pub fn decode_rows(&self) -> Option<usize> {
        self.scheduler
            .units()
            .iter()
            .filter_map(|u| u.backend.info().decode_rows)
            .min()
    }

    /// The units' instance names, in unit order.
    pub fn unit_names(&self) -> Vec<&str> {
        self.scheduler.units().iter().map(|u| u.name.as_str()).collect()
    }

    /// Where the host's time went per unit since the last call
    /// ([`crate::runtime::split::SplitScheduler::take_host_times`]).
    pub fn take_host_times(&mut self) -> Vec<(String, crate::runtime::split::HostTimes)> {
        self.scheduler.take_host_times()
    }

    /// Bytes moved between units so far: boundary values through the host, and KV caches
    /// handed from the prefill unit to the decode unit.
    pub fn moved_bytes(&self) -> (u64, u64) {
        self.scheduler.moved_bytes()
    }

    /// Per-node device time of the last step, where the backends measure it (empty otherwise).
    pub fn profile_last_step(&mut self) -> Result<Vec<NodeTime>, SessionError> {
        Ok(self.scheduler.profile_last_step()?)
    }

    /// Step shapes whose programs are built now: at most `split::MAX_SHAPES`, the least
    /// recently run released first.
    pub fn step_shapes(&self) -> usize {
        self.scheduler.shapes_built()
    }

    /// Step shapes built so far (a released shape built again counts again) and the time
    /// building them took.
    pub fn step_builds(&self) -> (u64, std::time::Duration) {
        self.scheduler.builds()
    }

    /// The most rows one slot may take in a step that starts from an empty slot: every layer's
    /// cache holds them all (a sliding-window layer's ring is at least its window), within the
    /// context.
    pub fn fresh_rows(&self) -> usize {
        self.model.fresh_rows()
    }

    /// Tokens held in `slot`'s cache.
    pub fn len(&self, slot: usize) -> usize {
        self.lengths.get(slot).copied().unwrap_or(0)
    }

    /// Forgets `slot`'s sequence (its cache rows are overwritten by the next one).
    pub fn reset(&mut self, slot: usize) {
        if let Some(l) = self.lengths.get_mut(slot) {
            *l = 0;
        }
    }

    /// Runs one step: appends `step.tokens` to the sequences of their slots (row `r`:
    /// `tokens[r]` of slot `slots[r]`, in order) with `step.phase`'s placement, and returns the
    /// logits of the rows in `step.select` as `step.logits` asks: `[select, vocab]`, or each
    /// row's best `k` and their ids (`[select, 2k]`). The one way a session is stepped: prompt
    /// chunks ([`Session::prefill`]), decode steps and batched steps of many sequences alike.
    pub fn step(&mut self, step: Step<'_>) -> Result<&[f32], SessionError> {
        let k = match step.logits {
            Logits::Rows => 0,
            Logits::Best(k) => {
                // Asked of the units once per `k` (a call across the plugin boundary), not every
                // step.
                if self.top_k_ok != Some(k) {
                    if k == 0 || !self.supports_top_k(k) {
                        return Err(SessionError::Invalid(format!(
                            "the best {k} logits of a row cannot be computed where this model's logits are"
                        )));
                    }
                    self.top_k_ok = Some(k);
                }
                k
            }
        };
        self.run_step(step.phase, step.tokens, step.slots, step.select, k)?;
        Ok(&self.logits)
    }

    /// The logits a step should ask for when its picking rows are sampled by `samplers`: each
    /// row's best [`Session::ranked_k`] where the logits are computed on a device that ranks
    /// them and every sampler picks from those what it would pick from the whole row
    /// ([`Sampler::fits_ranked`]); the whole rows otherwise. The one place this is decided.
    pub fn logits_for<'s>(&self, samplers: impl IntoIterator<Item = &'s Sampler>) -> Logits {
        let k = self.ranked_k;
        if k > 0 && samplers.into_iter().all(|s| s.fits_ranked(k)) {
            Logits::Best(k)
        } else {
            Logits::Rows
        }
    }

    /// The `k` of [`Logits::Best`] that decode steps should ask for when their samplers
    /// need no more (`Sampler::fits_ranked`): [`RANKED_K`] where the logits are computed on a
    /// device that can rank them, else 0 (whole rows: on the CPU they are in host memory
    /// already). `TANDEM_RANKED_LOGITS=n` sets it (0: whole rows), for A/B runs.
    pub fn ranked_k(&self) -> usize {
        self.ranked_k
    }

    /// [`Session::ranked_k`], worked out (once, at [`Session::new`]).
    fn find_ranked_k(&self) -> usize {
        let k = std::env::var("TANDEM_RANKED_LOGITS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                if self.backend().info().kind == tandem_backend_api::DeviceKind::Cpu {
                    0
                } else {
                    RANKED_K
                }
            });
        if k > 0 && self.supports_top_k(k) {
            k
        } else {
            0
        }
    }

    /// Whether a step can give ([`Logits::Best`]) the best `k` logits of a row.
    pub fn supports_top_k(&self, k: usize) -> bool {
        (1..=tandem_backend_api::TOP_K_MAX).contains(&k)
            && k <= self.model.vocab_size()
            && self.scheduler.supports_top_k(k)
    }

    /// Runs one step, leaving in `self.logits` the selected rows' logits, or with `top_k > 0`
    /// their best `top_k` and ids.
    fn run_step(
        &mut self,
        phase: Phase,
        tokens: &[u32],
        slots: &[u32],
        select: &[u32],
        top_k: usize,
    ) -> Result<(), SessionError> {
        let vocab = self.model.vocab_size();
        // Ids past the vocabulary are images' rows, where the model holds them.
        let limit = vocab + self.image_rows();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= limit) {
            return Err(SessionError::TokenOutOfRange { id, vocab });
        }
        if tokens.len() != slots.len() || tokens.is_empty() {
            return Err(SessionError::Invalid(format!(
                "{} tokens for {} slots",
                tokens.len(),
                slots.len()
            )));
        }
        let context = self.shape.context;
        let (mut positions, mut lens) = (
            std::mem::take(&mut self.positions),
            std::mem::take(&mut self.next_lengths),
        );
        positions.clear();
        lens.clear();
        lens.extend_from_slice(&self.lengths);
        for &s in slots {
            let l = lens
                .get_mut(s as usize)
                .ok_or_else(|| SessionError::Invalid(format!("slot {s} out of range")))?;
            if *l >= context {
                return Err(SessionError::ContextFull {
                    needed: *l + 1,
                    context,
                });
            }
            positions.push(*l as u32);
            *l += 1;
        }
        self.positions = positions;
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
        self.slots.clear();
        self.slots.extend_from_slice(slots);
        self.select.clear();
        self.select.extend_from_slice(select);
        let selected = select.len();
        let width = if top_k > 0 { 2 * top_k } else { vocab };
        self.logits.resize(selected * width, 0.0);
        let args = StepArgs {
            tokens: &self.tokens,
            positions: &self.positions,
            slots: &self.slots,
            select: &self.select,
        };
        self.scheduler.run(
            &self.model,
            phase,
            &args,
            &self.lengths,
            top_k,
            bytemuck::cast_slice_mut(&mut self.logits[..]),
        )?;
        self.next_lengths = std::mem::replace(&mut self.lengths, lens);
        if cfg!(target_endian = "big") {
            for v in &mut self.logits {
                *v = f32::from_bits(u32::from_le(v.to_bits()));
            }
        }
        Ok(())
    }

    /// The last step's logits (`[select, vocab]`; after a [`Logits::Best`] step, its best
    /// logits and ids), writable: a caller may sample in place (the repetition penalty edits
    /// them) instead of copying them out. The next step overwrites them.
    pub fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits
    }

    /// Feeds `tokens` to `slot` in chunks of at most the cache's step size ([`Session::chunks`]);
    /// returns the logits of the last token, or of every token when `all` (`[n, vocab]`, fed
    /// in [`Session::scoring_chunk`]s).
    pub fn prefill(&mut self, slot: u32, tokens: &[u32], all: bool) -> Result<Vec<f32>, SessionError> {
        let mut out = Vec::new();
        let slots = vec![slot; self.chunk()];
        let mut select = Vec::new();
        let step = if all { self.scoring_chunk() } else { self.chunk() };
        let (vocab, mut at) = (self.vocab(), 0);
        while at < tokens.len() {
            let end = piece_end(tokens, at, step, vocab);
            let piece = &tokens[at..end];
            at = end;
            let n = piece.len() as u32;
            select.clear();
            if all {
                select.extend(0..n);
            } else {
                select.push(n - 1);
                out.clear();
            }
            let logits = self.step(Step::prefill(piece, &slots[..piece.len()], &select))?;
            out.extend_from_slice(logits);
        }
        Ok(out)
    }

    /// The most rows a step that keeps every row's logits (perplexity, `engine logits`) feeds:
    /// the step size, but no more rows than [`SCORING_LOGIT_BYTES`] of logits hold, so that
    /// scoring a long text holds a bounded slice of logits (64 rows of a 262,144-token
    /// vocabulary) instead of a step's worth.
    pub fn scoring_chunk(&self) -> usize {
        self.chunk()
            .min(SCORING_LOGIT_BYTES / (4 * self.vocab()).max(1))
            .max(1)
    }

    /// `tokens` in the pieces a text prompt is fed in: at most [`Session::chunk`] each
    /// (perplexity, `engine logits`). A prompt with images is cut by [`piece_end`].
    pub fn chunks<'t>(&self, tokens: &'t [u32]) -> std::slice::Chunks<'t, u32> {
        tokens.chunks(self.chunk())
    }

    /// Whether `slot`'s sequence, with one sampled token not yet fed, has reached the context:
    /// generation stops there (finish reason [`super::sequence::FinishReason::Length`]), since the prompt and
    /// the generated tokens together never exceed the context. `engine run` and `engine serve`
    /// share this rule.
    pub fn at_context_limit(&self, slot: usize) -> bool {
        self.len(slot) + 1 >= self.shape.context
    }

    /// The context: the most tokens (prompt and generated) a sequence holds.
    pub fn context(&self) -> usize {
        self.shape.context
    }

    /// The KV cache slots: the most sequences in one step.
    pub fn slots(&self) -> usize {
        self.shape.slots
    }

    /// The most prompt tokens fed in one step.
    pub fn chunk(&self) -> usize {
        self.shape.max_step_rows.max(1)
    }
}

impl<M: StepModel> Session<M> {
    /// Shortens `slot`'s sequence to its first `len` tokens, when every ring cache still holds
    /// what the following steps will read; returns false (and changes nothing) otherwise.
    pub fn truncate(&mut self, slot: usize, len: usize) -> bool {
        let Some(cur) = self.lengths.get(slot).copied() else {
            return false;
        };
        if len > cur {
            return false;
        }
        let safe = self.model.can_rewind(cur, cur - len);
        if safe {
            self.lengths[slot] = len;
        }
        safe
    }
}
