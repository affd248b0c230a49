//! Speculative decoding: a drafter proposes the next few tokens, the target checks them all
//! in one step of `k + 1` rows (the pending token and the `k` drafts, every row's logits kept),
//! and every draft token it agrees with is a decode step saved.
//!
//! - [`verify`]: the acceptance rule. Greedy output is plain greedy decoding's, token for
//!   token where the target computes a row of a `k + 1`-row step as it computes a one-row step;
//!   sampled output keeps the target's distribution (the rejection rule) with the request's
//!   seed.
//! - [`ngram`] and [`draft`]: the drafters (lookup in the text so far; a small model of the
//!   same vocabulary in a session of its own, on any unit).
//! - [`generate`]: one request, as [`crate::runtime::stepper::generate`] runs it (the prompt
//!   through the request engine's step, every accepted token through the sequence, so stop
//!   rules, budgets and streaming are the same), its decode in blocks. The target's cache keeps
//!   the accepted rows only ([`Session::truncate`], ring caches of sliding-window layers
//!   included). A draft model on units the target does not use runs ahead: while the target
//!   verifies a block it drafts the next one as if every token were kept, and that block is
//!   used where they were (and its first token was the target's own next one).
//! - [`Depth`]: `k` is the one the measured acceptance and step times say gives the most
//!   tokens per second; none (plain steps, tried again now and then) where speculation does
//!   not pay.

pub mod draft;
pub mod ngram;
pub mod verify;

use std::time::Instant;

use crate::model::StepModel;
use crate::runtime::sampler::SamplerConfig;
use crate::runtime::sequence::{GenerationStats, Latency, Limits, Outcome, Request, Sequence};
use crate::runtime::session::{Logits, Session, SessionError, Step};
use crate::runtime::split::Phase;
use crate::runtime::stepper::{GenerateError, Stepper};
use crate::tokenizer::Tokenizer;

/// A proposal: the draft tokens and, for a sampled draft, the distribution each was drawn
/// from (empty: deterministic, a point mass at each token).
#[derive(Debug, Default)]
pub struct Draft {
    /// The proposed tokens, in order.
    pub tokens: Vec<u32>,
    /// Per token, the draft's distribution (ids with probabilities); empty for a
    /// deterministic draft.
    pub dists: Vec<Vec<(u32, f64)>>,
    /// Spent distributions, kept for their memory.
    spare: Vec<Vec<(u32, f64)>>,
}

impl Draft {
    /// Empties the proposal (keeping its memory).
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.spare.append(&mut self.dists);
    }

    /// An empty vector for a distribution.
    fn spare(&mut self) -> Vec<(u32, f64)> {
        let mut v = self.spare.pop().unwrap_or_default();
        v.clear();
        v
    }

    /// Drops the first `n` tokens (those a block already used).
    fn advance(&mut self, n: usize) {
        let n = n.min(self.tokens.len());
        self.tokens.drain(..n);
        let d = n.min(self.dists.len());
        let used: Vec<_> = self.dists.drain(..d).collect();
        self.spare.extend(used);
    }
}

/// A source of draft tokens.
pub trait Drafter: Send {
    /// Sets the drafter up for a request sampled with `sampling` (a model draft draws from its
    /// own distribution under the same warpers).
    fn configure(&mut self, _sampling: &SamplerConfig) {}

    /// Proposes up to `k` tokens to follow `history` (the prompt and the generated ids, the
    /// last being the one the target has picked and not yet fed); fewer, or none, where it
    /// has nothing to offer.
    fn propose(&mut self, history: &[u32], k: usize, out: &mut Draft) -> Result<(), SessionError>;

    /// The width of its logits, for a model draft (it must be the target's).
    fn vocab(&self) -> Option<usize> {
        None
    }

    /// The units it computes on (none for a lookup).
    fn units(&self) -> Vec<String> {
        Vec::new()
    }

    /// What it is, for reports.
    fn name(&self) -> String;
}

/// A drafter owned with its settings, for a caller that builds its [`Speculator`] later (the
/// server's batcher thread).
pub struct DraftSetup {
    /// The drafter.
    pub drafter: Box<dyn Drafter>,
    /// The most draft tokens per block.
    pub max_tokens: usize,
    /// Always `max_tokens` ([`Speculator::fixed`]).
    pub fixed: bool,
    /// Whether it runs ahead, where the caller says ([`Speculator::set_overlap`]); `None`: by
    /// the units.
    pub overlap: Option<bool>,
}

impl DraftSetup {
    /// The speculator over this drafter for `target`.
    pub fn speculator(&mut self, target: &Target) -> Result<Speculator<'_>, SpeculationError> {
        let mut spec = Speculator::new(self.drafter.as_mut(), self.max_tokens, target)?;
        if let Some(on) = self.overlap {
            spec.set_overlap(on && !spec.drafter.units().is_empty());
        }
        Ok(match self.fixed {
            true => spec.fixed(self.max_tokens),
            false => spec,
        })
    }
}

/// Why speculation cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum SpeculationError {
    /// The draft model's vocabulary is not the target's.
    #[error("the draft model's vocabulary has {draft} tokens and the target's {target}: a draft must share the target's vocabulary")]
    Vocabulary {
        /// The draft's logit width.
        draft: usize,
        /// The target's.
        target: usize,
    },
    /// `k` out of range.
    #[error("draft tokens must be between 1 and {max}, got {got}")]
    Depth {
        /// The most.
        max: usize,
        /// Asked.
        got: usize,
    },
}

/// The most draft tokens a block may hold.
pub const MAX_DRAFT_TOKENS: usize = 16;

/// How many draft tokens the next block takes: the `k` that maximises the expected tokens per
/// second, `(1 + a + a^2 + ... + a^k) / (step(k + 1) + k * draft)`, with `a` the measured
/// chance that a draft token is kept (each judged draft a trial, recent blocks weighing more),
/// `step(n)` the measured time of a target step of `n` rows (a line through the plain step's
/// time and the slope of the block sizes measured: a CPU's rows cost nearly in proportion, a
/// GPU's almost nothing until it is busy) and `draft` the drafter's time per token where it
/// does not run ahead. `k = 0` (a plain step) wins where speculation does not pay; every
/// [`PROBE_STEPS`] plain steps one block is tried again, so that a text that turns
/// copy-heavy is noticed. The first step is plain and the second a block of half the most
/// drafts, so that both are measured before the model chooses.
#[derive(Debug, Clone)]
pub struct Depth {
    max: usize,
    adaptive: bool,
    fixed: usize,
    /// A step's seconds by its rows (index `rows - 1`), moving averages.
    cost: Vec<Option<f64>>,
    /// Drafts kept and blocks that ended in a rejection, decayed per block.
    kept: f64,
    rejected: f64,
    /// The drafter's seconds per draft token outside an overlap.
    draft: Option<f64>,
    /// Plain steps since speculation was last tried, while plain steps won.
    idle: usize,
    /// The last depth tried.
    last: usize,
}

/// Plain steps between two tries of speculation while it does not pay.
pub const PROBE_STEPS: usize = 32;
/// The weight of a new measurement in the moving averages.
const EWMA: f64 = 0.25;
/// How much the acceptance counts of the blocks before weigh, per block.
const DECAY: f64 = 0.9;

impl Depth {
    /// Up to `max` draft tokens, chosen by the measurements.
    pub fn adaptive(max: usize) -> Self {
        Depth {
            max,
            adaptive: true,
            fixed: max,
            cost: vec![None; max + 1],
            kept: 0.0,
            rejected: 0.0,
            draft: None,
            idle: 0,
            last: max.div_ceil(2).max(1),
        }
    }

    /// Always `k` draft tokens (tests, and measuring one depth).
    pub fn fixed(k: usize) -> Self {
        Depth {
            adaptive: false,
            fixed: k,
            ..Depth::adaptive(k)
        }
    }

    /// The chance that a draft token is kept: the trials so far with one kept and one
    /// rejected added (0.5 before any).
    pub fn acceptance(&self) -> f64 {
        (self.kept + 1.0) / (self.kept + self.rejected + 2.0)
    }

    /// The modelled time of a target step of `rows` rows, where the plain step was measured.
    fn step_cost(&self, rows: usize) -> Option<f64> {
        let plain = self.cost.first().copied().flatten()?;
        if let Some(Some(c)) = self.cost.get(rows - 1) {
            return Some(*c);
        }
        // The slope through the plain step and the sizes measured (least squares through the
        // plain step's point); half a plain step per row before any.
        let (mut num, mut den) = (0.0, 0.0);
        for (i, c) in self.cost.iter().enumerate().skip(1) {
            if let Some(c) = c {
                num += (c - plain) * i as f64;
                den += (i * i) as f64;
            }
        }
        let slope = if den > 0.0 {
            (num / den).max(0.0)
        } else {
            0.5 * plain
        };
        Some(plain + slope * (rows - 1) as f64)
    }

    /// The draft tokens to ask for now (0: a plain step).
    pub fn choose(&mut self) -> usize {
        if !self.adaptive {
            return self.fixed;
        }
        let Some(plain) = self.step_cost(1) else {
            // The first step measures a plain step.
            return 0;
        };
        if self.cost.iter().skip(1).all(Option::is_none) {
            // Then a block of half the most, to measure one.
            return self.last;
        }
        let a = self.acceptance();
        let draft = self.draft.unwrap_or(0.0);
        let (mut best, mut best_rate) = (0, 1.0 / plain);
        let mut expected = 1.0;
        let mut term = 1.0;
        for k in 1..=self.max {
            term *= a;
            expected += term;
            let Some(step) = self.step_cost(k + 1) else {
                break;
            };
            let rate = expected / (step + k as f64 * draft);
            if rate > best_rate {
                (best, best_rate) = (k, rate);
            }
        }
        if best > 0 {
            self.idle = 0;
            self.last = best;
            return best;
        }
        self.idle += 1;
        if self.idle >= PROBE_STEPS {
            self.idle = 0;
            return self.last;
        }
        0
    }

    /// Records a step: `drafted` tokens proposed (its rows are `drafted + 1`), `kept` of them
    /// kept, whether the block ended in a rejection, the target step's `seconds`, and the
    /// drafter's `draft_seconds` spent before it (outside an overlap).
    pub fn record(&mut self, drafted: usize, kept: usize, rejected: bool, seconds: f64, draft_seconds: f64) {
        let avg = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + EWMA * (new - o)));
        if let Some(c) = self.cost.get_mut(drafted) {
            *c = avg(*c, seconds);
        }
        if drafted > 0 {
            self.kept = self.kept * DECAY + kept as f64;
            self.rejected = self.rejected * DECAY + f64::from(u8::from(rejected));
            self.draft = avg(self.draft, draft_seconds / drafted as f64);
        }
    }
}

/// Speculation for a generation (or a server's single running sequence): the drafter, the
/// depth, whether the drafter runs ahead, what happened, and the blocks' scratch.
pub struct Speculator<'d> {
    drafter: &'d mut dyn Drafter,
    depth: Depth,
    overlap: bool,
    /// The ids the target's cache holds before the request's prompt (a chat's earlier turns,
    /// continued): the drafter reads them before the prompt.
    pub before: Vec<u32>,
    /// What happened.
    pub stats: SpecStats,
    block: Block,
    /// The block drafted ahead, whether it still holds, and the text it was drafted after.
    ahead: Draft,
    ahead_valid: bool,
    ahead_history: Vec<u32>,
    /// Scratch: `before` and the sequence's history.
    full: Vec<u32>,
}

/// What speculation did in a generation.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SpecStats {
    /// The drafter.
    pub drafter: String,
    /// Target steps after the first token (plain and speculative).
    pub target_steps: usize,
    /// Blocks with draft tokens.
    pub blocks: usize,
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens the target kept.
    pub accepted: usize,
    /// Tokens emitted by the decode steps (kept drafts and the target's own).
    pub emitted: usize,
    /// Whether the drafter ran ahead of the target.
    pub overlap: bool,
    /// Blocks whose draft was ready, drafted while the previous block was verified.
    pub ready_blocks: usize,
    /// Seconds spent drafting outside an overlap (the target waiting).
    pub draft_seconds: f64,
    /// Seconds in the target's verification steps.
    pub verify_seconds: f64,
}

impl SpecStats {
    /// Draft tokens kept per draft token proposed.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }

    /// Tokens emitted per target step.
    pub fn tokens_per_step(&self) -> f64 {
        self.emitted as f64 / self.target_steps.max(1) as f64
    }
}

/// What one block did.
#[derive(Debug, Clone, Copy)]
pub struct Blocked {
    /// Tokens the target's cache took (the pending token and the kept drafts).
    pub fed: usize,
    /// How the sequence ended, where it did.
    pub ended: Option<Outcome>,
}

/// What speculation needs to know of the target's session.
#[derive(Debug, Clone)]
pub struct Target {
    /// The width of its logits.
    pub vocab: usize,
    /// Its units' instance names.
    pub units: Vec<String>,
    /// The most rows of one sequence every unit computes as a single row
    /// (`BackendInfo::decode_rows`): a block's rows stay within it.
    pub decode_rows: Option<usize>,
}

impl Target {
    /// `session`'s (asks each unit for its info once).
    pub fn of<M: StepModel>(session: &Session<M>) -> Target {
        Target {
            vocab: session.vocab(),
            units: session.unit_names().into_iter().map(str::to_string).collect(),
            decode_rows: session.decode_rows(),
        }
    }
}

impl<'d> Speculator<'d> {
    /// Speculation with `drafter`, at most `max_tokens` drafts per block, for `target`: a
    /// model draft must have its vocabulary; it runs ahead where it shares no unit with it.
    /// A block's rows (the pending token and the drafts) stay within the rows the target's
    /// units compute as single rows, so that greedy output is plain decoding's.
    pub fn new(
        drafter: &'d mut dyn Drafter,
        max_tokens: usize,
        target: &Target,
    ) -> Result<Self, SpeculationError> {
        if max_tokens == 0 || max_tokens > MAX_DRAFT_TOKENS {
            return Err(SpeculationError::Depth {
                max: MAX_DRAFT_TOKENS,
                got: max_tokens,
            });
        }
        if let Some(v) = drafter.vocab() {
            if v != target.vocab {
                return Err(SpeculationError::Vocabulary {
                    draft: v,
                    target: target.vocab,
                });
            }
        }
        let max_tokens = match target.decode_rows {
            Some(rows) => max_tokens.min(rows.saturating_sub(1)).max(1),
            None => max_tokens,
        };
        let units = drafter.units();
        let overlap = !units.is_empty() && units.iter().all(|u| !target.units.contains(u));
        let stats = SpecStats {
            drafter: drafter.name(),
            overlap,
            ..SpecStats::default()
        };
        Ok(Speculator {
            drafter,
            depth: Depth::adaptive(max_tokens),
            overlap,
            before: Vec::new(),
            stats,
            block: Block::default(),
            ahead: Draft::default(),
            ahead_valid: false,
            ahead_history: Vec::new(),
            full: Vec::new(),
        })
    }

    /// Whether the drafter runs ahead of the target on another thread (`Speculator::new`
    /// decides by the units; a caller may say otherwise).
    pub fn set_overlap(&mut self, on: bool) {
        self.overlap = on;
        self.stats.overlap = on;
    }

    /// Every block asks for `k` drafts (no adaptation, no pause): tests, and measuring one
    /// depth.
    pub fn fixed(mut self, k: usize) -> Self {
        self.depth = Depth::fixed(k.clamp(1, self.depth.max));
        self
    }

    /// Sets the drafter up for a new request sampled with `sampling`; forgets a block drafted
    /// ahead for another.
    pub fn start(&mut self, sampling: &SamplerConfig) {
        self.drafter.configure(sampling);
        self.ahead_valid = false;
    }

    /// One decode block of `seq` (which has a picked token to feed) on `session`: drafts (or
    /// takes the block drafted ahead), verifies in one step of the pending token and the
    /// drafts, hands every emitted token to `seq` (`on_token` hears each one's latency), and
    /// keeps the accepted rows of the cache.
    pub fn block<M: StepModel>(
        &mut self,
        session: &mut Session<M>,
        seq: &mut Sequence<'_>,
        on_token: &mut dyn FnMut(Latency),
    ) -> Result<Blocked, GenerateError> {
        let slot = seq.slot;
        // What the drafter reads: the ids before the prompt, the prompt and what came since.
        let history: &[u32] = if self.before.is_empty() {
            seq.history()
        } else {
            self.full.clear();
            self.full.extend_from_slice(&self.before);
            self.full.extend_from_slice(seq.history());
            &self.full
        };
        let base = session.len(slot as usize);
        // The block's rows (the pending token and the drafts) fit the context, the step size
        // and the tokens still to generate.
        let k = self
            .depth
            .choose()
            .min(session.context().saturating_sub(base + 1))
            .min(session.chunk().saturating_sub(1))
            .min(seq.remaining().saturating_sub(1));
        let started = Instant::now();
        let mut draft_seconds = 0.0;
        let draft = &mut self.block.draft;
        if self.ahead_valid {
            // Drafted while the last block was verified, after its first token (the guess of
            // the target's next one, now confirmed).
            std::mem::swap(draft, &mut self.ahead);
            draft.advance(1);
            draft.tokens.truncate(k);
            draft.dists.truncate(k);
            self.stats.ready_blocks += 1;
        } else if k > 0 {
            if let Err(e) = self.drafter.propose(history, k, draft) {
                seq.fail(format!("the draft failed: {e}"));
                return Err(e.into());
            }
            draft_seconds = started.elapsed().as_secs_f64();
            self.stats.draft_seconds += draft_seconds;
        } else {
            draft.clear();
        }
        let drafted = draft.tokens.len();
        let verify_start = Instant::now();
        // Verify; a drafter on other units drafts the next block meanwhile, as if this one
        // were kept whole (its first token is its guess of the target's next one).
        let overlap = self.overlap && drafted > 0;
        let (verified, drafted_ahead) = if overlap {
            self.ahead_history.clear();
            self.ahead_history.extend_from_slice(history);
            self.ahead_history.extend_from_slice(&draft.tokens);
            let drafter = &mut *self.drafter;
            let (hist, ahead) = (&self.ahead_history, &mut self.ahead);
            let block = &mut self.block;
            let next_k = k + 1;
            std::thread::scope(|scope| {
                let drafting = scope.spawn(move || drafter.propose(hist, next_k, ahead));
                let verified = block.verify(session, seq, on_token);
                (verified, drafting.join())
            })
        } else {
            (self.block.verify(session, seq, on_token), Ok(Ok(())))
        };
        let (kept, emitted, ended) = verified?;
        let verify_seconds = verify_start.elapsed().as_secs_f64();
        self.stats.verify_seconds += verify_seconds;
        self.ahead_valid = false;
        if overlap {
            match drafted_ahead {
                // Usable where every draft was kept and the target's own token is the
                // draft's guess.
                Ok(Ok(())) => {
                    self.ahead_valid = kept == drafted
                        && ended.is_none()
                        && self.ahead.tokens.len() > 1
                        && seq.next == self.ahead.tokens.first().copied();
                }
                Ok(Err(e)) => {
                    seq.fail(format!("the draft failed: {e}"));
                    return Err(e.into());
                }
                Err(_) => {
                    let e = SessionError::Invalid("the draft thread panicked".into());
                    seq.fail(e.to_string());
                    return Err(e.into());
                }
            }
        }
        // A block that ended with the target's own token after fewer drafts than it had was
        // rejected there (not cut short by the end of the sequence).
        let rejected = kept < drafted && ended.is_none();
        self.depth
            .record(drafted, kept, rejected, verify_seconds, draft_seconds);
        self.stats.target_steps += 1;
        self.stats.emitted += emitted;
        if drafted > 0 {
            self.stats.blocks += 1;
            self.stats.drafted += drafted;
            self.stats.accepted += kept;
        }
        Ok(Blocked { fed: 1 + kept, ended })
    }
}

/// [`crate::runtime::stepper::generate`] with speculation: runs `request` alone in `slot` of
/// `session`, its prompt through the request engine's step, its decode in blocks that
/// `spec`'s drafter proposes and the target verifies ([`Speculator::block`]). `before_step`
/// is heard before each step as there. Returns the timing.
pub fn generate<M: StepModel>(
    session: &mut Session<M>,
    tokenizer: &Tokenizer,
    request: Request<'_>,
    slot: u32,
    keep: bool,
    spec: &mut Speculator<'_>,
    before_step: &mut dyn FnMut(&Sequence<'_>) -> bool,
) -> Result<GenerationStats, GenerateError> {
    if !keep {
        session.reset(slot as usize);
    }
    let limits = Limits::of(session, tokenizer);
    let sampler = request.check(limits, session.len(slot as usize))?;
    spec.start(sampler.config());
    let mut seq = [Sequence::new(request, sampler, slot, tokenizer)];
    // The prompt, up to the first token.
    let mut stepper = Stepper::default();
    loop {
        if !before_step(&seq[0]) {
            return Ok(seq[0].stats());
        }
        match stepper.step(session, &mut seq, None, &mut |_| {}) {
            Ok(Some(stepped)) if stepped.ended.is_empty() => {
                if seq[0].next.is_some() {
                    break;
                }
            }
            Ok(_) => return Ok(seq[0].stats()),
            Err(failed) => return Err(failed.error.into()),
        }
    }
    while seq[0].next.is_some() && before_step(&seq[0]) {
        if spec.block(session, &mut seq[0], &mut |_| {})?.ended.is_some() {
            break;
        }
    }
    Ok(seq[0].stats())
}

/// One block's scratch.
#[derive(Default)]
struct Block {
    draft: Draft,
    tokens: Vec<u32>,
    slots: Vec<u32>,
    select: Vec<u32>,
    scratch: verify::Scratch,
}

impl Block {
    /// Runs the target over the pending token and the drafts, judges each row in turn, hands
    /// every emitted token to `seq`, and keeps the accepted rows of the cache. Returns the
    /// drafts kept, the tokens emitted, and how the sequence ended, where it did.
    fn verify<M: StepModel>(
        &mut self,
        session: &mut Session<M>,
        seq: &mut Sequence<'_>,
        on_token: &mut dyn FnMut(Latency),
    ) -> Result<(usize, usize, Option<Outcome>), GenerateError> {
        let slot = seq.slot;
        let Some(pending) = seq.next.take() else {
            return Ok((0, 0, None));
        };
        let base = session.len(slot as usize);
        let context = session.context();
        let drafts = &self.draft.tokens;
        self.tokens.clear();
        self.tokens.push(pending);
        self.tokens.extend_from_slice(drafts);
        let n = self.tokens.len();
        self.slots.clear();
        self.slots.resize(n, slot);
        self.select.clear();
        self.select.extend(0..n as u32);
        // A greedy request's rows may come ranked (the best logits where they are on a
        // device); a sampled one's rule needs whole rows.
        let greedy = seq.sampler().config().temperature == 0.0;
        let logits = if greedy {
            session.logits_for([seq.sampler()])
        } else {
            Logits::Rows
        };
        let (ranked, width) = match logits {
            Logits::Best(k) => (true, 2 * k),
            Logits::Rows => (false, session.vocab()),
        };
        if let Err(e) = session.step(Step {
            phase: Phase::Decode,
            tokens: &self.tokens,
            slots: &self.slots,
            select: &self.select,
            logits,
        }) {
            seq.fail(e.to_string());
            return Err(e.into());
        }
        let rows = session.logits_mut();
        let mut kept = 0;
        let mut emitted = 0;
        let mut ended = None;
        for (i, row) in rows.chunks_exact_mut(width).take(n).enumerate() {
            let draft = drafts.get(i).copied();
            let (sampler, history) = seq.sampler_parts();
            let (id, keep) = match draft {
                Some(x) if ranked => {
                    let id = sampler.sample_ranked(row);
                    (id, id == x)
                }
                Some(x) => {
                    let q = self.draft.dists.get(i).map(Vec::as_slice);
                    verify::judge(sampler, row, history, x, q, &mut self.scratch)
                }
                None if ranked => (sampler.sample_ranked(row), false),
                None => (sampler.sample(row, history), false),
            };
            // The cache holds the pending token and the drafts before this row's pick.
            let at_limit = base + i + 2 >= context;
            let (outcome, latency) = seq.accept_id(id, at_limit);
            on_token(latency);
            emitted += 1;
            if outcome.is_some() {
                ended = outcome;
                break;
            }
            if !keep {
                break;
            }
            kept += 1;
        }
        // Rows past the last kept draft go: the cache keeps the pending token and the kept
        // drafts.
        if !session.truncate(slot as usize, base + 1 + kept) {
            let e = SessionError::Invalid(format!(
                "a speculative block of {n} rows cannot be rolled back by {} (the ring caches hold too few spare rows)",
                n - 1 - kept
            ));
            seq.fail(e.to_string());
            return Err(e.into());
        }
        Ok((kept, emitted, ended))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_depth_is_always_its_k() {
        let mut d = Depth::fixed(5);
        for _ in 0..3 {
            assert_eq!(d.choose(), 5);
            d.record(5, 0, true, 1.0, 0.0);
        }
    }

    #[test]
    fn the_first_step_is_plain_the_second_a_block_then_the_model_chooses() {
        let mut d = Depth::adaptive(8);
        assert_eq!(d.choose(), 0);
        d.record(0, 0, false, 0.010, 0.0);
        assert_eq!(d.choose(), 4);
        // Cheap rows (a GPU: 5 rows cost 1.1 plain steps) and every draft kept: deeper.
        for _ in 0..5 {
            d.record(4, 4, false, 0.011, 0.0);
        }
        assert_eq!(d.choose(), 8, "{d:?}");
    }

    #[test]
    fn speculation_stops_where_it_does_not_pay_and_is_tried_again() {
        let mut d = Depth::adaptive(8);
        assert_eq!(d.choose(), 0);
        d.record(0, 0, false, 0.010, 0.0);
        let k = d.choose();
        assert_eq!(k, 4);
        // Each row costs a plain step (a busy CPU) and drafts are rarely kept.
        for _ in 0..10 {
            d.record(4, 0, true, 0.050, 0.0);
        }
        let mut plain = 0;
        while d.choose() == 0 {
            d.record(0, 0, false, 0.010, 0.0);
            plain += 1;
            assert!(plain <= PROBE_STEPS, "{d:?}");
        }
        assert_eq!(plain, PROBE_STEPS - 1, "a probe after {PROBE_STEPS} plain steps");
    }

    #[test]
    fn the_depth_follows_the_acceptance_on_rows_that_cost() {
        // Rows cost 30% of a plain step each (the 2-core CPU's measured curve): a high
        // acceptance takes a few drafts, a middling one fewer.
        let run = |kept_of_4: usize| {
            let mut d = Depth::adaptive(6);
            d.choose();
            d.record(0, 0, false, 0.010, 0.0);
            for _ in 0..20 {
                let k = d.choose().max(1);
                let kept = kept_of_4.min(k);
                d.record(k, kept, kept < k, 0.010 * (1.0 + 0.3 * k as f64), 0.0);
            }
            d.choose()
        };
        let (high, low) = (run(4), run(1));
        assert!(high >= 3, "{high}");
        assert!(low < high, "{low} {high}");
    }
}
