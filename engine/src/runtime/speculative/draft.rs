//! Drafts by a small model (Gemma 3 270M for the larger Gemma 3s: one vocabulary) in a session
//! of its own, on any unit, with its own KV cache (one slot).
//!
//! The drafter keeps a copy of what its cache holds; each proposal first shortens the cache to
//! where it agrees with the text so far (the tokens the target rejected go, exactly as the
//! target's do) and feeds what is missing, then drafts one token per step. A sampled request's
//! draft draws each token from the draft model's own distribution (the request's warpers, a
//! seed of its own), which the acceptance rule needs.

use super::{Draft, Drafter};
use crate::model::gemma3::Gemma3Model;
use crate::model::StepModel;
use crate::runtime::sampler::{Sampler, SamplerConfig};
use crate::runtime::session::{Logits, Session, SessionError, Step};
use crate::runtime::split::Phase;

/// Rows fed to the draft as one decode-shaped step; more go through its prefill placement.
const DECODE_ROWS: usize = 4;

/// A draft model's session, drafting for one sequence at a time.
pub struct ModelDrafter<M: StepModel = Gemma3Model> {
    session: Session<M>,
    /// The ids in the draft's cache (slot 0), in order.
    fed: Vec<u32>,
    /// The draft's sampler: greedy for a greedy request, else the request's warpers.
    sampler: Sampler,
    greedy: bool,
}

impl<M: StepModel> ModelDrafter<M> {
    /// A drafter over `session` (slot 0 is its own).
    pub fn new(session: Session<M>) -> Self {
        ModelDrafter {
            session,
            fed: Vec::new(),
            sampler: Sampler::new(SamplerConfig::greedy()).expect("greedy settings are valid"),
            greedy: true,
        }
    }

    /// Feeds `tokens` after what the cache holds and leaves the last one's logits in the
    /// session's logits (whole rows).
    fn feed(&mut self, tokens: &[u32]) -> Result<(), SessionError> {
        let mut rest = tokens;
        while !rest.is_empty() {
            let n = rest.len().min(self.session.chunk());
            let (piece, tail) = rest.split_at(n);
            let phase = if n <= DECODE_ROWS {
                Phase::Decode
            } else {
                Phase::Prefill
            };
            let slots = vec![0u32; n];
            let select = [n as u32 - 1];
            self.session.step(Step {
                phase,
                tokens: piece,
                slots: &slots,
                select: &select,
                logits: Logits::Rows,
            })?;
            self.fed.extend_from_slice(piece);
            rest = tail;
        }
        Ok(())
    }

    /// Picks from the last fed row's logits; records the distribution it drew from for a
    /// sampled request.
    fn pick(&mut self, history: &[u32], out: &mut Draft) -> u32 {
        let row = self.session.logits_mut();
        if self.greedy {
            return self.sampler.sample(row, history);
        }
        let mut dist = out.spare();
        self.sampler.distribution(row, history, &mut dist);
        let id = self.sampler.draw_from(&dist);
        out.dists.push(dist);
        id
    }
}

impl<M: StepModel> Drafter for ModelDrafter<M>
where
    Session<M>: Send,
{
    fn configure(&mut self, sampling: &SamplerConfig) {
        self.greedy = sampling.temperature == 0.0;
        let mut cfg = *sampling;
        // A seed of its own: the draft's draws are not the target's.
        cfg.seed = sampling.seed ^ 0x5EC0_D4A7_D4A7_5EC0;
        if let Ok(s) = Sampler::new(cfg) {
            self.sampler = s;
        }
    }

    fn propose(&mut self, history: &[u32], k: usize, out: &mut Draft) -> Result<(), SessionError> {
        out.clear();
        if k == 0 || history.is_empty() {
            return Ok(());
        }
        // What the cache holds that the text agrees with, leaving at least the last token to
        // feed (its logits give the first draft token).
        let agree = self
            .fed
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(history.len() - 1);
        if self.session.truncate(0, agree) {
            self.fed.truncate(agree);
        } else {
            self.session.reset(0);
            self.fed.clear();
        }
        let room = self.session.context().saturating_sub(history.len());
        let k = k.min(room);
        if k == 0 {
            return Ok(());
        }
        let start = self.fed.len();
        self.feed(&history[start..])?;
        let mut seen = history.to_vec();
        for i in 0..k {
            let id = self.pick(&seen, out);
            out.tokens.push(id);
            seen.push(id);
            if i + 1 < k {
                self.feed(&[id])?;
            }
        }
        Ok(())
    }

    fn vocab(&self) -> Option<usize> {
        Some(self.session.vocab())
    }

    fn units(&self) -> Vec<String> {
        self.session
            .unit_names()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    fn name(&self) -> String {
        format!("draft model on {}", self.units().join("+"))
    }
}
