//! The request engine's step: one step of the running sequences, whatever runs them. `engine
//! run` and `chat` step one sequence ([`generate`]); `engine serve`'s batcher
//! steps many, admitting and retiring them between steps. Each step is
//!
//! 1. a row for every sequence with a sampled token to feed, then prompt chunks (each at most
//!    the session's step size, together at most that: the budget) of the oldest prompts still
//!    being read, so that a long prompt is interleaved with the others' decoding instead of
//!    stalling it and many short prompts are read at once;
//! 2. padded where the caller pads steps to shape buckets ([`Padding`]);
//! 3. run through [`Session::step`], asking for each row's best logits only where every
//!    picking row's sampler needs no more ([`Session::logits_for`]);
//! 4. sampled (rows spread over threads where whole rows came back) and accepted by each
//!    sequence, which streams its text and says whether it ended.

use super::sampler::{sample_rows, Sampler};
use super::sequence::{GenerationStats, Latency, Limits, Outcome, Request, RequestError, Sequence};
use super::session::{Logits, Session, SessionError, Step};
use super::split::Phase;
use crate::model::StepModel;
use crate::tokenizer::Tokenizer;

/// Pads a step's rows to a shape the caller has built programs for (`engine serve`'s step
/// buckets): given the rows the sequences fed, adds rows of a slot of its own (the sink, reset
/// before every padded step).
pub trait Padding {
    /// The slot padding rows feed: no sequence's.
    fn sink(&self) -> u32;
    /// Pads `tokens`, `slots` and `select` in place.
    fn pad(&self, tokens: &mut Vec<u32>, slots: &mut Vec<u32>, select: &mut Vec<u32>);
}

/// What one step did.
#[derive(Debug)]
pub struct Stepped<'s> {
    /// The tokens the sequences fed (padding left out), with their slots: what each slot's
    /// KV cache now holds in addition.
    pub fed: (&'s [u32], &'s [u32]),
    /// The sequences (indices into the slice stepped) that ended in this step, and how.
    pub ended: &'s [(usize, Outcome)],
}

/// A step that failed: the error, and the sequences it was feeding (each already told, through
/// [`Sequence::fail`]); their slots' caches are unknown.
#[derive(Debug)]
pub struct StepFailed {
    /// Why.
    pub error: SessionError,
    /// The sequences (indices into the slice stepped) that had rows in the step.
    pub sequences: Vec<usize>,
}

/// Runs steps of sequences; holds the scratch a step needs (reused: nothing is allocated per
/// step once warm).
#[derive(Default)]
pub struct Stepper {
    tokens: Vec<u32>,
    slots: Vec<u32>,
    select: Vec<u32>,
    /// The sequences with a decode row, in row order.
    rows: Vec<usize>,
    picks: Vec<u32>,
    at_limits: Vec<bool>,
    /// The step's prompt chunks: sequence, tokens, whether it ends the prompt.
    chunks: Vec<(usize, usize, bool)>,
    /// The sequences whose prompts this step ends (their first pick).
    picking: Vec<usize>,
    ended: Vec<(usize, Outcome)>,
    /// The rows the sequences fed, before any padding.
    fed: usize,
}

impl Stepper {
    /// One step of `seqs` on `session` (padded by `padding`, where given); `on_token` hears the
    /// latency of every accepted token. `Ok(None)`: no sequence had anything to feed.
    pub fn step<'s, M: StepModel>(
        &'s mut self,
        session: &mut Session<M>,
        seqs: &mut [Sequence<'_>],
        padding: Option<&dyn Padding>,
        on_token: &mut dyn FnMut(Latency),
    ) -> Result<Option<Stepped<'s>>, StepFailed> {
        if !self.gather(session, seqs) {
            return Ok(None);
        }
        self.fed = self.tokens.len();
        if let Some(p) = padding {
            session.reset(p.sink() as usize);
            p.pad(&mut self.tokens, &mut self.slots, &mut self.select);
        }
        let phase = if self.chunks.is_empty() {
            Phase::Decode
        } else {
            Phase::Prefill
        };
        let logits = session.logits_for(self.rows.iter().chain(&self.picking).map(|&i| seqs[i].sampler()));
        let step = Step {
            phase,
            tokens: &self.tokens,
            slots: &self.slots,
            select: &self.select,
            logits,
        };
        if let Err(error) = session.step(step) {
            let sequences: Vec<usize> = self
                .rows
                .iter()
                .copied()
                .chain(self.chunks.iter().map(|c| c.0))
                .collect();
            for &i in &sequences {
                seqs[i].fail(error.to_string());
            }
            return Err(StepFailed { error, sequences });
        }
        for &(i, n, _) in &self.chunks {
            seqs[i].fed(n);
        }
        self.accept(session, seqs, logits, on_token);
        Ok(Some(Stepped {
            fed: (&self.tokens[..self.fed], &self.slots[..self.fed]),
            ended: &self.ended,
        }))
    }

    /// Gathers the step's rows (decode rows, then prompt chunks) and selected rows; false when
    /// there are none.
    fn gather<M: StepModel>(&mut self, session: &Session<M>, seqs: &mut [Sequence<'_>]) -> bool {
        let (chunk, vocab) = (session.chunk(), session.vocab());
        self.tokens.clear();
        self.slots.clear();
        self.rows.clear();
        for (i, s) in seqs.iter_mut().enumerate() {
            if let Some(t) = s.next.take() {
                self.tokens.push(t);
                self.slots.push(s.slot);
                self.rows.push(i);
            }
        }
        let decoding = self.rows.len();
        // A prompt's chunks are those it would be fed in alone; the first always goes, later
        // ones while they fit the budget.
        self.chunks.clear();
        let mut budget = chunk;
        for (i, s) in seqs.iter().enumerate().filter(|(_, s)| s.prefilling()) {
            let piece = s.next_chunk(chunk, vocab);
            if !self.chunks.is_empty() && piece.len() > budget {
                break;
            }
            budget = budget.saturating_sub(piece.len());
            self.tokens.extend_from_slice(piece);
            self.slots.resize(self.tokens.len(), s.slot);
            self.chunks.push((i, piece.len(), piece.len() == s.prompt_left()));
            if budget == 0 {
                break;
            }
        }
        if self.tokens.is_empty() {
            return false;
        }
        self.select.clear();
        self.select.extend(0..decoding as u32);
        // The sequences whose prompts this step ends: the last row of each one's chunk gives
        // its first pick.
        self.picking.clear();
        let mut end = decoding;
        for &(i, n, ends) in &self.chunks {
            end += n;
            if ends {
                self.picking.push(i);
                self.select.push(end as u32 - 1);
            }
        }
        if self.select.is_empty() {
            // (Chunks that end no prompt still select the last row: a step selects at least
            // one.)
            self.select.push(self.tokens.len() as u32 - 1);
        }
        true
    }

    /// Samples every picking row of the step just run and hands each pick to its sequence.
    fn accept<M: StepModel>(
        &mut self,
        session: &mut Session<M>,
        seqs: &mut [Sequence<'_>],
        logits: Logits,
        on_token: &mut dyn FnMut(Latency),
    ) {
        let decoding = self.rows.len();
        self.ended.clear();
        // Whether each picking sequence has reached the context, asked before the logits are
        // borrowed: the decoding rows, then the prompts just read.
        self.at_limits.clear();
        self.at_limits.extend(
            self.rows
                .iter()
                .chain(&self.picking)
                .map(|&i| session.at_context_limit(seqs[i].slot as usize)),
        );
        let width = match logits {
            Logits::Best(k) => 2 * k,
            Logits::Rows => session.vocab(),
        };
        let ranked = matches!(logits, Logits::Best(_));
        let (decoded, last) = session.logits_mut().split_at_mut(decoding * width);
        self.picks.clear();
        self.picks.resize(decoding, 0);
        if ranked {
            for ((&i, pick), best) in self
                .rows
                .iter()
                .zip(self.picks.iter_mut())
                .zip(decoded.chunks_exact(width))
            {
                *pick = seqs[i].sampler_parts().0.sample_ranked(best);
            }
        } else {
            // Each row sampled in place with its sequence's sampler, the rows spread over
            // threads.
            let mut want = self.rows.iter().peekable();
            let mut parts: Vec<(&mut Sampler, &[u32], &mut [f32], &mut u32)> = seqs
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| want.next_if_eq(&i).is_some())
                .map(|(_, s)| s.sampler_parts())
                .zip(decoded.chunks_exact_mut(width))
                .zip(self.picks.iter_mut())
                .map(|(((sampler, history), row), pick)| (sampler, history, row, pick))
                .collect();
            sample_rows(&mut parts);
        }
        for ((&i, &id), &at_limit) in self.rows.iter().zip(&self.picks).zip(&self.at_limits) {
            let (outcome, latency) = seqs[i].accept_id(id, at_limit);
            on_token(latency);
            if let Some(o) = outcome {
                self.ended.push((i, o));
            }
        }
        for ((&i, row), &at_limit) in self
            .picking
            .iter()
            .zip(last.chunks_exact_mut(width))
            .zip(&self.at_limits[decoding..])
        {
            let s = &mut seqs[i];
            let (outcome, latency) = if ranked {
                let id = s.sampler_parts().0.sample_ranked(row);
                s.accept_id(id, at_limit)
            } else {
                // Sampled in place: the session's logits are scratch until the next step.
                s.accept(row, at_limit)
            };
            on_token(latency);
            if let Some(o) = outcome {
                self.ended.push((i, o));
            }
        }
    }
}

/// Why [`generate`] stopped early.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The request was refused.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The session failed.
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// Runs `request` alone in `slot` of `session` (continuing the slot's cached sequence when
/// `keep`, else resetting it first): the request engine's steps ([`Stepper`]) with one
/// sequence, so prompt chunks, then one decode step per token, until the sequence ends.
/// Before each step `before_step` sees the sequence (how much of its prompt is read) and
/// answers whether to go on: `false` ends it there, without error (a person's Ctrl-C).
/// Returns its timing; a receiver that went away ends it early, without error.
pub fn generate<M: StepModel>(
    session: &mut Session<M>,
    tokenizer: &Tokenizer,
    request: Request<'_>,
    slot: u32,
    keep: bool,
    before_step: &mut dyn FnMut(&Sequence<'_>) -> bool,
) -> Result<GenerationStats, GenerateError> {
    if !keep {
        session.reset(slot as usize);
    }
    let limits = Limits::of(session, tokenizer);
    let sampler = request.check(limits, session.len(slot as usize))?;
    let mut seq = [Sequence::new(request, sampler, slot, tokenizer)];
    let mut stepper = Stepper::default();
    loop {
        if !before_step(&seq[0]) {
            break;
        }
        match stepper.step(session, &mut seq, None, &mut |_| {}) {
            Ok(Some(stepped)) if stepped.ended.is_empty() => {}
            Ok(_) => break,
            Err(failed) => return Err(failed.error.into()),
        }
    }
    Ok(seq[0].stats())
}
