//! Speculative decoding measured: the verification cost curve (the time of one target step of
//! `n` rows of one sequence, the token it picked last and `n - 1` drafts, every row's logits kept
//! as a greedy verification asks for them, against a one-row step) and the speedup such a curve
//! predicts at a given acceptance (`engine bench --verify-rows N`); and a text generated with and
//! without a drafter ([`speculation`], `engine bench --draft ... --prompt-file F`).

use std::time::Instant;

use super::error::BenchError;
use super::results::{SpeculationRun, VerifyPoint};
use crate::runtime::sampler::{Sampler, SamplerConfig};
use crate::runtime::sequence::{Event, EventSink, Request};
use crate::runtime::session::{Session, Step};
use crate::runtime::speculative::{self, SpecStats, Speculator};
use crate::runtime::split::Phase;
use crate::runtime::stepper::generate;
use crate::tokenizer::Tokenizer;

/// Steps of 1 to `max_rows` rows of slot 0 after a prompt of `prompt` (fed first), each shape
/// stepped once to build it, then `repeat` times from the same point (the rows cut off the
/// cache after each); the median time of each, and its ratio to the one-row step's.
pub fn curve(
    session: &mut Session,
    prompt: &[u32],
    max_rows: usize,
    repeat: usize,
    token: &mut dyn FnMut() -> u32,
) -> Result<Vec<VerifyPoint>, BenchError> {
    session.reset(0);
    session.prefill(0, prompt, false)?;
    let base = session.len(0);
    let greedy = Sampler::new(crate::runtime::sampler::SamplerConfig::greedy())
        .map_err(|e| BenchError::Options(e.to_string()))?;
    let logits = session.logits_for([&greedy]);
    let mut out: Vec<VerifyPoint> = Vec::new();
    for rows in 1..=max_rows {
        let slots = vec![0u32; rows];
        let select: Vec<u32> = (0..rows as u32).collect();
        let mut times = Vec::with_capacity(repeat);
        for rep in 0..=repeat {
            let tokens: Vec<u32> = (0..rows).map(|_| token()).collect();
            let t = Instant::now();
            session.step(Step {
                phase: Phase::Decode,
                tokens: &tokens,
                slots: &slots,
                select: &select,
                logits,
            })?;
            let s = t.elapsed().as_secs_f64();
            if !session.truncate(0, base) {
                return Err(BenchError::Options(format!(
                    "the caches cannot be rolled back by {rows} rows (--chunk is smaller than --verify-rows)"
                )));
            }
            if rep > 0 {
                times.push(s);
            }
        }
        let ms = super::results::median(&times) * 1e3;
        let one = out.first().map_or(ms, |p| p.ms);
        out.push(VerifyPoint {
            rows,
            ms,
            ratio: ms / one,
        });
    }
    Ok(out)
}

/// The speedup over plain decoding that `points` predict at `acceptance` (each draft token
/// kept with that chance, independently), with the draft costing `draft_ratio` of a one-row
/// target step per token (0 where it runs ahead on another unit): the best over the depths
/// the curve covers of `(1 + a + ... + a^k) / (ratio(k + 1) + k * draft_ratio)`, and that
/// depth.
pub fn predicted_speedup(points: &[VerifyPoint], acceptance: f64, draft_ratio: f64) -> (f64, usize) {
    let mut best = (1.0, 0);
    let (mut expected, mut term) = (1.0, 1.0);
    for p in points.iter().skip(1) {
        let k = p.rows - 1;
        term *= acceptance;
        expected += term;
        let s = expected / (p.ratio + k as f64 * draft_ratio);
        if s > best.0 {
            best = (s, k);
        }
    }
    best
}

/// Collects a generation's ids.
struct Ids<'a>(&'a mut Vec<u32>);

impl EventSink for Ids<'_> {
    fn send(&mut self, event: Event) -> bool {
        if let Event::Token { id, .. } = event {
            self.0.push(id);
        }
        true
    }

    fn is_closed(&self) -> bool {
        false
    }
}

/// `prompt` continued greedily by `gen_tokens` in slot 0 of `session`, plainly and with `spec`,
/// one warm-up of each and then `repeat` of each in turn: the median decode rate of each, the
/// speedup, the last speculative run's acceptance and tokens per target step, and whether every
/// speculative run gave the plain run's tokens.
pub fn speculation(
    session: &mut Session,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    gen_tokens: usize,
    repeat: usize,
    spec: &mut Speculator<'_>,
) -> Result<SpeculationRun, BenchError> {
    let one = |session: &mut Session, spec: Option<&mut Speculator<'_>>| {
        let mut ids = Vec::new();
        let request = Request {
            prompt: prompt.to_vec(),
            max_tokens: gen_tokens,
            sampling: SamplerConfig::greedy(),
            stop: Vec::new(),
            sink: Box::new(Ids(&mut ids)),
            arrived: Instant::now(),
            images: Vec::new(),
        };
        let stats = match spec {
            None => generate(session, tokenizer, request, 0, false, &mut |_| true),
            Some(s) => speculative::generate(session, tokenizer, request, 0, false, s, &mut |_| true),
        }
        .map_err(|e| BenchError::Options(format!("generating: {e}")))?;
        let rate = stats.generated_tokens.saturating_sub(1) as f64 / stats.decode_seconds.max(1e-9);
        Ok::<_, BenchError>((ids, rate))
    };
    let drafter = spec.stats.drafter.clone();
    let (mut plain, mut fast) = (Vec::new(), Vec::new());
    let mut same = true;
    let mut last = SpecStats::default();
    for rep in 0..=repeat {
        let (want, p) = one(session, None)?;
        spec.stats = SpecStats {
            drafter: drafter.clone(),
            overlap: spec.stats.overlap,
            ..SpecStats::default()
        };
        let (got, f) = one(session, Some(spec))?;
        same &= got == want;
        if rep > 0 {
            plain.push(p);
            fast.push(f);
        }
        last = spec.stats.clone();
    }
    let (plain, fast) = (super::results::median(&plain), super::results::median(&fast));
    Ok(SpeculationRun {
        drafter,
        prompt_tokens: prompt.len(),
        gen_tokens,
        plain_tokens_per_s: plain,
        tokens_per_s: fast,
        speedup: fast / plain,
        acceptance: last.acceptance(),
        tokens_per_target_step: last.tokens_per_step(),
        overlap: last.overlap,
        ready_blocks: last.ready_blocks,
        same_tokens: same,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(ratios: &[f64]) -> Vec<VerifyPoint> {
        ratios
            .iter()
            .enumerate()
            .map(|(i, &ratio)| VerifyPoint {
                rows: i + 1,
                ms: ratio,
                ratio,
            })
            .collect()
    }

    #[test]
    fn free_rows_predict_the_expected_tokens_per_block() {
        // Rows cost nothing: the deepest block wins, and its expected tokens are the speedup.
        let p = points(&[1.0; 9]);
        let (s, k) = predicted_speedup(&p, 0.5, 0.0);
        assert_eq!(k, 8);
        assert!((s - (2.0 - 0.5f64.powi(8))).abs() < 1e-12, "{s}");
    }

    #[test]
    fn rows_that_cost_a_plain_step_each_never_pay() {
        let p = points(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(predicted_speedup(&p, 0.9, 0.0), (1.0, 0));
        // A draft that costs as much as the target's step never pays either.
        let p = points(&[1.0, 1.0, 1.0]);
        assert_eq!(predicted_speedup(&p, 0.9, 1.0).1, 0);
    }
}
