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
//! - [`Depth`]: `k` follows the measured acceptance, and speculation stops while it does not
//!   pay (a block's time per emitted token above a plain step's).

pub mod draft;
pub mod ngram;
pub mod verify;

use std::time::Instant;

use crate::model::StepModel;
use crate::runtime::sampler::SamplerConfig;
use crate::runtime::sequence::{GenerationStats, Limits, Request, Sequence};
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

/// How many draft tokens the next block takes: up by one after a block kept whole, down after
/// one rejected early; and none for [`PAUSE_STEPS`] steps once the blocks' time per emitted
/// token (a moving average over at least [`MEASURED_BLOCKS`] blocks) is above a plain step's
/// (measured the same way, by the plain steps: the first decode step is one).
#[derive(Debug, Clone)]
pub struct Depth {
    max: usize,
    k: usize,
    adaptive: bool,
    /// Seconds per plain (one-row) step, and per emitted token of a speculative block.
    plain: Option<f64>,
    spec: Option<f64>,
    /// Blocks measured since speculation last resumed.
    measured: usize,
    /// Plain steps left before speculation is tried again.
    pause: usize,
}

/// Plain steps taken before speculation is tried again, once it did not pay.
pub const PAUSE_STEPS: usize = 32;
/// Blocks measured before speculation may be paused.
pub const MEASURED_BLOCKS: usize = 4;
/// The weight of a new measurement in the moving averages.
const EWMA: f64 = 0.25;

impl Depth {
    /// Up to `max` draft tokens, starting at half of it, adapting.
    pub fn adaptive(max: usize) -> Self {
        Depth {
            max,
            k: max.div_ceil(2).max(1),
            adaptive: true,
            plain: None,
            spec: None,
            measured: 0,
            pause: 0,
        }
    }

    /// Always `k` draft tokens (tests, and measuring one depth).
    pub fn fixed(k: usize) -> Self {
        Depth {
            adaptive: false,
            ..Depth::adaptive(k)
        }
        .with_k(k)
    }

    fn with_k(mut self, k: usize) -> Self {
        self.k = k;
        self
    }

    /// The draft tokens to ask for now (0: a plain step).
    pub fn k(&self) -> usize {
        match self.adaptive && (self.pause > 0 || self.plain.is_none()) {
            true => 0,
            false => self.k,
        }
    }

    /// Records a step: `drafted` tokens proposed, `kept` of them kept, `emitted` tokens out,
    /// in `seconds`.
    pub fn record(&mut self, drafted: usize, kept: usize, emitted: usize, seconds: f64) {
        if !self.adaptive {
            return;
        }
        let avg = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + EWMA * (new - o)));
        if drafted == 0 {
            self.plain = avg(self.plain, seconds);
            if self.pause > 0 {
                self.pause -= 1;
                if self.pause == 0 {
                    // Measured afresh once speculation resumes.
                    self.spec = None;
                    self.measured = 0;
                }
            }
            return;
        }
        self.spec = avg(self.spec, seconds / emitted.max(1) as f64);
        self.measured += 1;
        self.k = if kept == drafted {
            self.k + 1
        } else {
            (kept + 1).max(self.k.saturating_sub(1))
        }
        .clamp(1, self.max);
        if let (Some(p), Some(s)) = (self.plain, self.spec) {
            if self.measured >= MEASURED_BLOCKS && s > p {
                self.pause = PAUSE_STEPS;
            }
        }
    }
}

/// Speculation for a generation: the drafter, the most draft tokens per block, whether the
/// drafter runs ahead, and what happened.
pub struct Speculator<'d> {
    drafter: &'d mut dyn Drafter,
    depth: Depth,
    overlap: bool,
    /// The ids the target's cache holds before the request's prompt (a chat's earlier turns,
    /// continued): the drafter reads them before the prompt.
    pub before: Vec<u32>,
    /// What happened.
    pub stats: SpecStats,
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

impl<'d> Speculator<'d> {
    /// Speculation with `drafter`, at most `max_tokens` drafts per block, for a target whose
    /// logits are `target_vocab` wide on `target_units`: a model draft must have the same
    /// width; it runs ahead where it shares no unit with the target.
    pub fn new(
        drafter: &'d mut dyn Drafter,
        max_tokens: usize,
        target_vocab: usize,
        target_units: &[&str],
    ) -> Result<Self, SpeculationError> {
        if max_tokens == 0 || max_tokens > MAX_DRAFT_TOKENS {
            return Err(SpeculationError::Depth {
                max: MAX_DRAFT_TOKENS,
                got: max_tokens,
            });
        }
        if let Some(v) = drafter.vocab() {
            if v != target_vocab {
                return Err(SpeculationError::Vocabulary {
                    draft: v,
                    target: target_vocab,
                });
            }
        }
        let units = drafter.units();
        let overlap = !units.is_empty() && units.iter().all(|u| !target_units.contains(&u.as_str()));
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
        self.depth = Depth::fixed(k.clamp(1, MAX_DRAFT_TOKENS));
        self
    }
}

/// [`crate::runtime::stepper::generate`] with speculation: runs `request` alone in `slot` of
/// `session`, its prompt through the request engine's step, its decode in blocks that
/// `spec`'s drafter proposes and the target verifies. `before_step` is heard before each step
/// as there. Returns the timing.
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
    spec.drafter.configure(sampler.config());
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
    let mut block = Block::default();
    let mut ahead = Draft::default();
    let mut ahead_history: Vec<u32> = Vec::new();
    let mut full: Vec<u32> = Vec::new();
    let mut ahead_valid = false;
    while seq[0].next.is_some() {
        if !before_step(&seq[0]) {
            break;
        }
        let s = &seq[0];
        // What the drafter reads: the ids before the prompt, the prompt and what came since.
        let history: &[u32] = if spec.before.is_empty() {
            s.history()
        } else {
            full.clear();
            full.extend_from_slice(&spec.before);
            full.extend_from_slice(s.history());
            &full
        };
        let base = session.len(slot as usize);
        // The block's rows (the pending token and the drafts) fit the context, the step size
        // and the tokens still to generate.
        let k = spec
            .depth
            .k()
            .min(session.context().saturating_sub(base + 1))
            .min(session.chunk().saturating_sub(1))
            .min(s.remaining().saturating_sub(1));
        let started = Instant::now();
        if ahead_valid {
            // Drafted while the last block was verified, after its first token (the guess of
            // the target's next one, now confirmed).
            std::mem::swap(&mut block.draft, &mut ahead);
            block.draft.advance(1);
            block.draft.tokens.truncate(k);
            block.draft.dists.truncate(k);
            spec.stats.ready_blocks += 1;
        } else if k > 0 {
            spec.drafter.propose(history, k, &mut block.draft)?;
            spec.stats.draft_seconds += started.elapsed().as_secs_f64();
        } else {
            block.draft.clear();
        }
        let drafted = block.draft.tokens.len();
        let verify_start = Instant::now();
        // Verify; a drafter on other units drafts the next block meanwhile, as if this one
        // were kept whole (its first token is its guess of the target's next one).
        let overlap = spec.overlap && drafted > 0;
        let result = if overlap {
            ahead_history.clear();
            ahead_history.extend_from_slice(history);
            ahead_history.extend_from_slice(&block.draft.tokens);
            let drafter = &mut *spec.drafter;
            let hist = &ahead_history;
            let ahead_ref = &mut ahead;
            let next_k = k + 1;
            std::thread::scope(|scope| {
                let drafting = scope.spawn(move || drafter.propose(hist, next_k, ahead_ref));
                let verified = block.verify(session, &mut seq[0], slot);
                let drafted_ahead = drafting.join();
                (verified, drafted_ahead)
            })
        } else {
            (block.verify(session, &mut seq[0], slot), Ok(Ok(())))
        };
        let (verified, drafted_ahead) = result;
        let (kept, emitted, ended) = verified?;
        spec.stats.verify_seconds += verify_start.elapsed().as_secs_f64();
        ahead_valid = false;
        if overlap {
            match drafted_ahead {
                Ok(Ok(())) => {
                    // Usable where every draft was kept and the target's own token is the
                    // draft's guess.
                    ahead_valid = kept == drafted
                        && !ended
                        && ahead.tokens.len() > 1
                        && seq[0].next == ahead.tokens.first().copied();
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => {
                    return Err(SessionError::Invalid("the draft thread panicked".into()).into());
                }
            }
        }
        spec.depth
            .record(drafted, kept, emitted, started.elapsed().as_secs_f64());
        spec.stats.target_steps += 1;
        spec.stats.emitted += emitted;
        if drafted > 0 {
            spec.stats.blocks += 1;
            spec.stats.drafted += drafted;
            spec.stats.accepted += kept;
        }
        if ended {
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
    /// drafts kept, the tokens emitted, and whether the sequence ended.
    fn verify<M: StepModel>(
        &mut self,
        session: &mut Session<M>,
        seq: &mut Sequence<'_>,
        slot: u32,
    ) -> Result<(usize, usize, bool), GenerateError> {
        let Some(pending) = seq.next.take() else {
            return Ok((0, 0, true));
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
        let ranked = matches!(logits, Logits::Best(_));
        let width = match logits {
            Logits::Best(k) => 2 * k,
            Logits::Rows => session.vocab(),
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
        let mut ended = false;
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
            let (outcome, _) = seq.accept_id(id, at_limit);
            emitted += 1;
            if outcome.is_some() {
                ended = true;
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
