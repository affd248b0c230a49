//! A loaded model on a backend, its KV cache state per slot, and generation.

use std::collections::HashMap;

use tandem_backend_api::{
    BackendError, BufferId, ComputeBackend, DType, NodeTime, ProgramId, StepArgs, TensorDesc, Usage,
};

use super::sampler::Sampler;
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
}

fn be(context: &str) -> impl FnOnce(BackendError) -> SessionError + '_ {
    move |error| SessionError::Backend {
        context: context.to_string(),
        error,
    }
}

/// A compiled step program and its logits buffer.
struct StepProgram {
    program: ProgramId,
    logits: BufferId,
}

/// The model on a backend, with per-slot sequence lengths.
pub struct Session {
    backend: Box<dyn ComputeBackend>,
    model: Gemma3Model,
    programs: HashMap<(usize, usize), StepProgram>,
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
    last_program: Option<ProgramId>,
}

impl Session {
    /// Wraps a loaded model.
    pub fn new(backend: Box<dyn ComputeBackend>, model: Gemma3Model) -> Self {
        let slots = model.cache_shape.slots;
        Session {
            backend,
            model,
            programs: HashMap::new(),
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

    /// The backend.
    pub fn backend(&self) -> &dyn ComputeBackend {
        self.backend.as_ref()
    }

    /// The backend, for measurements between steps (`engine bench`).
    pub fn backend_mut(&mut self) -> &mut dyn ComputeBackend {
        self.backend.as_mut()
    }

    /// Per-node device time of the last step, where the backend measures it (empty otherwise).
    pub fn profile_last_step(&mut self) -> Result<Vec<NodeTime>, SessionError> {
        match self.last_program {
            Some(p) => self.backend.profile(p).map_err(be("reading the step's profile")),
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

    fn program(&mut self, rows: usize, selected: usize) -> Result<&StepProgram, SessionError> {
        if !self.programs.contains_key(&(rows, selected)) {
            let vocab = self.model.config.vocab_size;
            let logits = self
                .backend
                .alloc(&TensorDesc::new(DType::F32, [selected, vocab]), Usage::Activation)
                .map_err(be("allocating the logits"))?;
            let graph = self.model.step_graph(rows, selected, logits);
            let program = self
                .backend
                .compile(&graph)
                .map_err(be("compiling the step graph"))?;
            self.programs
                .insert((rows, selected), StepProgram { program, logits });
        }
        self.programs
            .get(&(rows, selected))
            .ok_or_else(|| SessionError::Invalid("program cache".into()))
    }

    /// Appends `tokens` to the sequences of the given slots (row `r`: `tokens[r]` of slot
    /// `slots[r]`, in order) and returns the logits of the rows in `select` (`[select, vocab]`).
    pub fn step(&mut self, tokens: &[u32], slots: &[u32], select: &[u32]) -> Result<&[f32], SessionError> {
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
        let (program, logits) = {
            let p = self.program(rows, selected)?;
            (p.program, p.logits)
        };
        let args = StepArgs {
            tokens: &self.tokens,
            positions: &self.positions,
            slots: &self.slots,
            select: &self.select,
        };
        let ticket = self
            .backend
            .execute(program, &args)
            .map_err(be("running a step"))?;
        self.backend.wait(ticket).map_err(be("waiting for a step"))?;
        self.last_program = Some(program);
        self.next_lengths = std::mem::replace(&mut self.lengths, lens);
        self.logits_bytes.resize(selected * vocab * 4, 0);
        self.backend
            .read(logits, 0, &mut self.logits_bytes)
            .map_err(be("reading the logits"))?;
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
            let logits = self.step(piece, &slots[..piece.len()], &select)?;
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
    /// with each new id; stops after a token in `stop` (which is reported, not kept out).
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
        let mut history: Vec<u32> = prompt.to_vec();
        let t0 = std::time::Instant::now();
        let mut logits = self.prefill(0, prompt, false)?;
        let prefill_s = t0.elapsed().as_secs_f64();
        let t1 = std::time::Instant::now();
        let mut generated = 0usize;
        while generated < max_new {
            let next = sampler.sample(&mut logits, &history);
            history.push(next);
            generated += 1;
            on_token(next)?;
            if stop.contains(&next) || generated == max_new {
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
        })
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
}

impl Drop for Session {
    fn drop(&mut self) {
        for p in self.programs.values() {
            let _ = self.backend.release(p.program);
            let _ = self.backend.free(p.logits);
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
