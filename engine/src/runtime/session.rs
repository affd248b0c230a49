//! A loaded model on one backend or split across several (units), its KV cache state per slot,
//! and generation. Each step runs through the scheduler ([`super::schedule`]); when prefill
//! and decode place a layer's attention on different units, that layer's cached keys and values
//! of a sequence are handed from one unit to the other once, at the first step of the other
//! phase.

use std::collections::HashMap;

use tandem_backend_api::{BackendError, BufferId, ComputeBackend, NodeTime, StepArgs};

use super::placement::{attention_units, Phase};
use super::sampler::Sampler;
use super::schedule::{ScheduleError, Scheduled, Unit};
use crate::model::Gemma3Model;

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
    #[error("sequence of {needed} tokens exceeds the context of {context} (use --context)")]
    ContextFull {
        /// Tokens needed.
        needed: usize,
        /// Context size.
        context: usize,
    },
    /// Bad use of the API.
    #[error("{0}")]
    Invalid(String),
    /// Building or running the split program failed.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
}

fn be(context: &str) -> impl FnOnce(BackendError) -> SessionError + '_ {
    move |error| SessionError::Backend {
        context: context.to_string(),
        error,
    }
}

/// Where each layer's KV cache of each slot is up to date, when prefill and decode run a
/// layer's attention on different units.
struct KvHandoff {
    /// Per phase (prefill, decode), per layer: the unit running its attention.
    unit: [Vec<usize>; 2],
    /// Per layer, per slot: the unit holding its current rows.
    home: Vec<Vec<usize>>,
    /// Host staging for one slot of one layer's keys or values.
    staging: Vec<u8>,
    /// Bytes handed over so far.
    moved: u64,
}

/// The most micro-batches [`Session::set_micro_batches`] takes.
pub const MAX_MICRO_BATCHES: usize = 4;

fn phase_index(phase: Phase) -> usize {
    match phase {
        Phase::Prefill => 0,
        Phase::Decode => 1,
    }
}

/// The model on its units, with per-slot sequence lengths.
pub struct Session {
    units: Vec<Unit>,
    model: Gemma3Model,
    /// Per phase, the unit of every node of the step graph (`None`: all on unit 0).
    placement: Option<[Vec<usize>; 2]>,
    kv: Option<KvHandoff>,
    /// Per step shape (phase, rows, selected rows, micro-batches): one schedule, or one per
    /// micro-batch when decode steps are pipelined across units.
    programs: HashMap<(Phase, usize, usize, usize), Vec<Scheduled>>,
    /// Micro-batches a split decode step of several sequences is cut into (1: none).
    micro_batches: usize,
    /// `0, 1, 2, ...`: the select rows of a micro-batch (reused: grown, never shrunk).
    iota: Vec<u32>,
    /// Tokens already in the cache, per slot.
    lengths: Vec<usize>,
    /// Scratch for step arguments (reused: nothing allocated per token once warm).
    tokens: Vec<u32>,
    positions: Vec<u32>,
    slots: Vec<u32>,
    select: Vec<u32>,
    logits_bytes: Vec<u8>,
    logits: Vec<f32>,
    /// Scratch for the lengths after a step (swapped with `lengths`).
    next_lengths: Vec<usize>,
    /// The program the last step ran.
    last_program: Option<(Phase, usize, usize, usize)>,
}

impl Session {
    /// Wraps a model loaded on one backend ([`Gemma3Model::load`]).
    pub fn new(backend: Box<dyn ComputeBackend>, model: Gemma3Model) -> Self {
        let name = backend.info().name;
        Self::with_units(
            vec![Unit {
                name,
                backend,
                map: HashMap::new(),
            }],
            model,
            None,
        )
    }

    /// A model split across `units` ([`Gemma3Model::plan`]ned, each unit holding the tensors its
    /// nodes read): `placement` gives the unit (an index into `units`) of every node of the step
    /// graph, for prefill and for decode.
    pub fn split(units: Vec<Unit>, model: Gemma3Model, placement: [Vec<usize>; 2]) -> Self {
        Self::with_units(units, model, Some(placement))
    }

    fn with_units(units: Vec<Unit>, model: Gemma3Model, placement: Option<[Vec<usize>; 2]>) -> Self {
        let slots = model.cache_shape.slots;
        let kv = placement.as_ref().and_then(|p| {
            let (graph, _) = model.step_graph_parts(1, 1, BufferId::UNBOUND);
            let unit = [0, 1].map(|ph| attention_units(&graph, &p[ph]));
            if unit[0] == unit[1] {
                return None;
            }
            let row = model.kv_row_bytes();
            let most = model
                .layers
                .iter()
                .map(|l| l.cache.capacity * row)
                .max()
                .unwrap_or(0);
            Some(KvHandoff {
                home: unit[0].iter().map(|&u| vec![u; slots]).collect(),
                unit,
                staging: vec![0; most],
                moved: 0,
            })
        });
        Session {
            units,
            model,
            placement,
            kv,
            programs: HashMap::new(),
            micro_batches: 1,
            iota: Vec::new(),
            lengths: vec![0; slots],
            tokens: vec![],
            positions: vec![],
            slots: vec![],
            select: vec![],
            logits_bytes: vec![],
            logits: vec![],
            next_lengths: vec![],
            last_program: None,
        }
    }

    /// The model.
    pub fn model(&self) -> &Gemma3Model {
        &self.model
    }

    /// The backend that computes the logits (the only one, unless split).
    pub fn backend(&self) -> &dyn ComputeBackend {
        self.units[self.main_unit()].backend.as_ref()
    }

    /// [`Session::backend`], for measurements between steps (`engine bench`).
    pub fn backend_mut(&mut self) -> &mut dyn ComputeBackend {
        let u = self.main_unit();
        self.units[u].backend.as_mut()
    }

    /// The unit of the last node of a decode step: where the logits are computed.
    fn main_unit(&self) -> usize {
        self.placement
            .as_ref()
            .and_then(|p| p[1].last().copied())
            .unwrap_or(0)
    }

    /// Micro-batches the last step ran in (1: whole; 0: no step yet).
    pub fn last_step_micro_batches(&self) -> usize {
        self.last_program.map_or(0, |k| k.3)
    }

    /// The units' instance names, in unit order.
    pub fn unit_names(&self) -> Vec<&str> {
        self.units.iter().map(|u| u.name.as_str()).collect()
    }

    /// Bytes moved between units so far: boundary values through the host, and KV caches
    /// handed from the prefill unit to the decode unit.
    pub fn moved_bytes(&self) -> (u64, u64) {
        (
            self.programs.values().flatten().map(Scheduled::moved_bytes).sum(),
            self.kv.as_ref().map_or(0, |k| k.moved),
        )
    }

    /// Per-node device time of the last step, where the backends measure it (empty otherwise).
    pub fn profile_last_step(&mut self) -> Result<Vec<NodeTime>, SessionError> {
        match self.last_program.and_then(|k| self.programs.get(&k)?.first()) {
            Some(p) => Ok(p.profile(&mut self.units)?),
            None => Ok(Vec::new()),
        }
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

    /// The phase whose placement a step runs with: decode when both phases run alike.
    fn phase_key(&self, phase: Phase) -> Phase {
        match &self.placement {
            Some(p) if p[0] != p[1] => phase,
            _ => Phase::Decode,
        }
    }

    /// Sets how many micro-batches a split decode step of several sequences (every row
    /// selected) is cut into, at most [`MAX_MICRO_BATCHES`]: while one unit runs a part of one
    /// micro-batch, the other unit runs the next part of another. 1 (the default) runs each step
    /// whole.
    pub fn set_micro_batches(&mut self, n: usize) {
        self.micro_batches = n.clamp(1, MAX_MICRO_BATCHES);
    }

    /// The micro-batches a step of `rows` rows selecting `select` runs as: their row bounds.
    fn micro_bounds(
        &self,
        phase: Phase,
        rows: usize,
        select: &[u32],
    ) -> ([usize; MAX_MICRO_BATCHES + 1], usize) {
        let mut bounds = [0; MAX_MICRO_BATCHES + 1];
        let split_decode = match &self.placement {
            Some(p) => p[1].windows(2).any(|w| w[0] != w[1]),
            None => false,
        };
        let all_rows = select.len() == rows && select.iter().enumerate().all(|(i, &r)| r as usize == i);
        let m = if phase == Phase::Decode && split_decode && all_rows {
            self.micro_batches.min(rows)
        } else {
            1
        };
        for (j, b) in bounds.iter_mut().enumerate().take(m + 1) {
            *b = rows * j / m;
        }
        (bounds, m)
    }

    fn program(
        &mut self,
        phase: Phase,
        rows: usize,
        selected: usize,
        bounds: &[usize],
    ) -> Result<(), SessionError> {
        let key = (phase, rows, selected, bounds.len() - 1);
        if !self.programs.contains_key(&key) {
            let vocab = self.model.config.vocab_size;
            let mut schedules = Vec::new();
            for w in bounds.windows(2) {
                // A micro-batch selects all its rows; a whole step selects `selected`.
                let (r, sel) = if bounds.len() > 2 {
                    (w[1] - w[0], w[1] - w[0])
                } else {
                    (rows, selected)
                };
                let graph = self.model.step_graph(r, sel, BufferId::UNBOUND);
                let assign = match &self.placement {
                    Some(p) => p[phase_index(phase)].clone(),
                    None => vec![0; graph.nodes.len()],
                };
                match Scheduled::build(&mut self.units, &graph, &assign, vocab) {
                    Ok(s) => schedules.push(s),
                    Err(e) => {
                        for mut s in schedules {
                            s.release(&mut self.units);
                        }
                        return Err(e.into());
                    }
                }
            }
            self.programs.insert(key, schedules);
        }
        Ok(())
    }

    /// Before a step of `phase` on `slots`: hands each layer's cached rows of every slot that
    /// last ran on another unit over to the unit this phase runs that layer's attention on.
    fn hand_over(&mut self, phase: Phase) -> Result<(), SessionError> {
        let Some(kv) = self.kv.as_mut() else {
            return Ok(());
        };
        let row = self.model.kv_row_bytes();
        for (l, layer) in self.model.layers.iter().enumerate() {
            let target = kv.unit[phase_index(phase)][l];
            for &s in &self.slots {
                let s = s as usize;
                let home = kv.home[l][s];
                if home == target {
                    continue;
                }
                kv.home[l][s] = target;
                let len = self
                    .lengths
                    .get(s)
                    .copied()
                    .unwrap_or(0)
                    .min(layer.cache.capacity);
                if len == 0 {
                    continue;
                }
                let offset = (s * layer.cache.capacity * row) as u64;
                let buf = &mut kv.staging[..len * row];
                for planned in [layer.cache.k, layer.cache.v] {
                    let (from, to) = (&self.units[home], &self.units[target]);
                    let (src, dst) = (from.map.get(&planned).copied(), to.map.get(&planned).copied());
                    let (Some(src), Some(dst)) = (src, dst) else {
                        return Err(SessionError::Invalid(format!(
                            "layer {l}: its KV cache is not on both {} and {}",
                            from.name, to.name
                        )));
                    };
                    let from = &mut self.units[home];
                    from.backend
                        .read(src, offset, buf)
                        .map_err(be("reading a KV cache to hand over"))?;
                    let to = &mut self.units[target];
                    to.backend
                        .write(dst, offset, buf)
                        .map_err(be("writing a handed-over KV cache"))?;
                    kv.moved += buf.len() as u64;
                }
            }
        }
        Ok(())
    }

    /// Appends `tokens` to the sequences of the given slots (row `r`: `tokens[r]` of slot
    /// `slots[r]`, in order) and returns the logits of the rows in `select` (`[select, vocab]`):
    /// a decode step.
    pub fn step(&mut self, tokens: &[u32], slots: &[u32], select: &[u32]) -> Result<&[f32], SessionError> {
        self.step_in(Phase::Decode, tokens, slots, select)
    }

    /// [`Session::step`], run with `phase`'s placement.
    pub fn step_in(
        &mut self,
        phase: Phase,
        tokens: &[u32],
        slots: &[u32],
        select: &[u32],
    ) -> Result<&[f32], SessionError> {
        let vocab = self.model.config.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(SessionError::TokenOutOfRange { id, vocab });
        }
        if tokens.len() != slots.len() || tokens.is_empty() {
            return Err(SessionError::Invalid(format!(
                "{} tokens for {} slots",
                tokens.len(),
                slots.len()
            )));
        }
        let context = self.model.cache_shape.context;
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
        let (rows, selected) = (tokens.len(), select.len());
        let phase = self.phase_key(phase);
        let (bounds, m) = self.micro_bounds(phase, rows, select);
        let key = (phase, rows, selected, m);
        let bounds = &bounds[..=m];
        self.program(phase, rows, selected, bounds)?;
        self.hand_over(phase)?;
        if self.iota.len() < rows {
            self.iota.extend(self.iota.len() as u32..rows as u32);
        }
        let schedules = self
            .programs
            .get_mut(&key)
            .ok_or_else(|| SessionError::Invalid("program cache".into()))?;
        let units = &mut self.units;
        let (tokens, positions, slots, select, iota) = (
            &self.tokens,
            &self.positions,
            &self.slots,
            &self.select,
            &self.iota,
        );
        // The step arguments of micro-batch `j` (of the whole step when there is one).
        let args = |j: usize| {
            if m == 1 {
                return StepArgs {
                    tokens,
                    positions,
                    slots,
                    select,
                };
            }
            let (a, b) = (bounds[j], bounds[j + 1]);
            StepArgs {
                tokens: &tokens[a..b],
                positions: &positions[a..b],
                slots: &slots[a..b],
                select: &iota[..b - a],
            }
        };
        if m == 1 {
            schedules[0].run(units, &args(0))?;
        } else {
            // Each unit alternates micro-batches: after micro-batch j's part i finishes on its
            // unit, its part i + 1 is submitted to the next unit, which works on it while the
            // first unit goes on with micro-batch j + 1's part i.
            let parts = schedules[0].len();
            let mut tickets = [tandem_backend_api::Ticket(0); MAX_MICRO_BATCHES];
            for (j, t) in tickets.iter_mut().enumerate().take(m) {
                *t = schedules[j].submit(0, units, &args(j))?;
            }
            for i in 0..parts {
                for (j, t) in tickets.iter_mut().enumerate().take(m) {
                    schedules[j].finish(i, *t, units)?;
                    if i + 1 < parts {
                        *t = schedules[j].submit(i + 1, units, &args(j))?;
                    }
                }
            }
        }
        self.last_program = Some(key);
        self.next_lengths = std::mem::replace(&mut self.lengths, lens);
        self.logits_bytes.resize(selected * vocab * 4, 0);
        for (j, s) in schedules.iter().enumerate() {
            let (a, b) = if m == 1 {
                (0, selected)
            } else {
                (bounds[j], bounds[j + 1])
            };
            s.read_logits(units, &mut self.logits_bytes[a * vocab * 4..b * vocab * 4])?;
        }
        self.logits.clear();
        self.logits.extend(
            self.logits_bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
        Ok(&self.logits)
    }

    /// Feeds `tokens` to `slot` in chunks of at most the cache's step size; returns the logits
    /// of the last token, or of every token when `all` (`[n, vocab]`).
    pub fn prefill(&mut self, slot: u32, tokens: &[u32], all: bool) -> Result<Vec<f32>, SessionError> {
        let chunk = self.model.cache_shape.max_step_rows.max(1);
        let mut out = Vec::new();
        let slots = vec![slot; chunk];
        for piece in tokens.chunks(chunk) {
            let n = piece.len() as u32;
            let select: Vec<u32> = if all { (0..n).collect() } else { vec![n - 1] };
            let logits = self.step_in(Phase::Prefill, piece, &slots[..piece.len()], &select)?;
            if all {
                out.extend_from_slice(logits);
            } else {
                out.clear();
                out.extend_from_slice(logits);
            }
        }
        Ok(out)
    }

    /// Generates up to `max_new` tokens after `prompt` in slot 0 (which is reset first unless
    /// `keep` is set, in which case `prompt` continues the cached sequence), calling `on_token`
    /// with each new id; stops after a token in `stop` (which is reported, not kept out), or when
    /// the sequence fills the context ([`Session::at_context_limit`]), keeping what was generated.
    /// A prompt that leaves no room for one generated token is an error.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        sampler: &mut Sampler,
        stop: &[u32],
        keep: bool,
        mut on_token: impl FnMut(u32) -> Result<(), SessionError>,
    ) -> Result<GenerationStats, SessionError> {
        if prompt.is_empty() {
            return Err(SessionError::Invalid("the prompt has no tokens".into()));
        }
        if !keep {
            self.reset(0);
        }
        let context = self.model.cache_shape.context;
        let needed = self.len(0) + prompt.len();
        if needed >= context {
            return Err(SessionError::ContextFull {
                needed: needed + 1,
                context,
            });
        }
        let mut history: Vec<u32> = prompt.to_vec();
        let t0 = std::time::Instant::now();
        let mut logits = self.prefill(0, prompt, false)?;
        let prefill_s = t0.elapsed().as_secs_f64();
        let t1 = std::time::Instant::now();
        let mut generated = 0usize;
        let mut finish_reason = FinishReason::Length;
        while generated < max_new {
            let next = sampler.sample(&mut logits, &history);
            history.push(next);
            generated += 1;
            on_token(next)?;
            if stop.contains(&next) {
                finish_reason = FinishReason::Stop;
                break;
            }
            if generated == max_new || self.at_context_limit(0) {
                break;
            }
            let l = self.step(&[next], &[0], &[0])?;
            logits.clear();
            logits.extend_from_slice(l);
        }
        Ok(GenerationStats {
            prompt_tokens: prompt.len(),
            generated_tokens: generated,
            prefill_seconds: prefill_s,
            decode_seconds: t1.elapsed().as_secs_f64(),
            finish_reason,
        })
    }

    /// Whether `slot`'s sequence, with one sampled token not yet fed, has reached the context:
    /// generation stops there (finish reason [`FinishReason::Length`]), since the prompt and
    /// the generated tokens together never exceed the context. `engine run` and `engine serve`
    /// share this rule.
    pub fn at_context_limit(&self, slot: usize) -> bool {
        self.len(slot) + 1 >= self.model.cache_shape.context
    }

    /// The context: the most tokens (prompt and generated) a sequence holds.
    pub fn context(&self) -> usize {
        self.model.cache_shape.context
    }

    /// The KV cache slots: the most sequences in one step.
    pub fn slots(&self) -> usize {
        self.model.cache_shape.slots
    }

    /// The most prompt tokens fed in one step.
    pub fn chunk(&self) -> usize {
        self.model.cache_shape.max_step_rows.max(1)
    }
}

/// Why generation ended: OpenAI's `finish_reason` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token (or a stop string) was generated.
    Stop,
    /// The token budget (`max_tokens`) or the context ran out.
    Length,
}

impl FinishReason {
    /// `"stop"` or `"length"`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Timing of one generation.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct GenerationStats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Seconds spent on the prompt (to the first token's logits).
    pub prefill_seconds: f64,
    /// Seconds from the first sampled token to the end.
    pub decode_seconds: f64,
    /// Why it ended.
    pub finish_reason: FinishReason,
}

impl Drop for Session {
    fn drop(&mut self) {
        for p in self.programs.values_mut().flatten() {
            p.release(&mut self.units);
        }
    }
}

impl Session {
    /// Shortens `slot`'s sequence to its first `len` tokens, when every ring cache still holds
    /// what the following steps will read; returns false (and changes nothing) otherwise.
    pub fn truncate(&mut self, slot: usize, len: usize) -> bool {
        let Some(cur) = self.lengths.get(slot).copied() else {
            return false;
        };
        if len > cur {
            return false;
        }
        let c = &self.model.config;
        let safe = self.model.layers.iter().all(|l| {
            l.cache.capacity >= self.model.cache_shape.context
                || l.cache.capacity.saturating_sub(c.sliding_window) >= cur - len
        });
        if safe {
            self.lengths[slot] = len;
        }
        safe
    }
}
