//! Choosing the next token from the logits: greedy, or sampling after the warpers
//! `transformers` applies, in its order: repetition penalty, temperature, top-k, top-p, min-p.
//!
//! [`Sampler::sample`] allocates nothing after its first call (its scratch vectors are kept and
//! only grow if the vocabulary does), since it runs once per generated token. The random numbers
//! come from a xoshiro256** generator seeded from [`SamplerConfig::seed`], so the same seed and
//! the same logits give the same tokens.
//!
//! A sampler can also report each pick's log-probability and the row's most likely tokens
//! ([`Sampler::with_logprobs`], OpenAI's `logprobs`): the log-softmax of the raw logits
//! (temperature 1, before the repetition penalty and every warper), in f64 over the whole row,
//! computed before the row is touched and without drawing a random number, so that asking for
//! them changes no pick.

use std::cmp::Ordering;

use crate::checkpoint::generation::GenerationConfig;

/// Sampling settings. The field docs name the command-line flag each one comes from; a flag or
/// request field not given takes the model's default (`Loaded::sampling`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// `--temperature`: logits are divided by it; `0` means greedy (argmax, no randomness).
    pub temperature: f32,
    /// `--top-k`: keep only the `top_k` most likely tokens; `0` turns it off.
    pub top_k: usize,
    /// `--top-p`: keep the most likely tokens until their probabilities sum to at least `top_p`;
    /// `1` turns it off. In `(0, 1]`.
    pub top_p: f32,
    /// `--min-p`: drop tokens less likely than `min_p` times the most likely one; `0` turns it
    /// off. In `[0, 1)`.
    pub min_p: f32,
    /// `repetition_penalty` (`--repeat-penalty`): for each distinct token already in the history, positive logits
    /// are divided by it and negative ones multiplied; `1` turns it off. Greater than 0.
    pub repetition_penalty: f32,
    /// `--seed`: seed of the random number generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// tandem's own defaults, for a model without a `generation_config.json` (a GGUF file, or a
    /// directory without one) and for each key such a file lacks; they are those of Gemma 3's
    /// instruction-tuned models (their `generation_config.json`): temperature 1, top-k 64,
    /// top-p 0.95; min-p and repetition penalty off; seed 0, so that runs are reproducible
    /// unless a seed is given. A loaded model's defaults are `Loaded::sampling`
    /// ([`sampling_defaults`]); `run`, `chat` and `serve` apply the user's
    /// settings over those.
    fn default() -> Self {
        SamplerConfig {
            temperature: 1.0,
            top_k: 64,
            top_p: 0.95,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding: temperature 0, the other warpers off.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }

    /// Checks the ranges; the error names the setting and the accepted range.
    pub fn validate(&self) -> Result<(), SamplerError> {
        let invalid = |setting, value, requirement| {
            Err(SamplerError::Invalid {
                setting,
                value,
                requirement,
            })
        };
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return invalid("temperature", self.temperature, ">= 0 and finite (0 is greedy)");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return invalid("top_p", self.top_p, "in (0, 1] (1 turns it off)");
        }
        if !(self.min_p >= 0.0 && self.min_p < 1.0) {
            return invalid("min_p", self.min_p, "in [0, 1) (0 turns it off)");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return invalid(
                "repetition_penalty",
                self.repetition_penalty,
                "> 0 and finite (1 turns it off)",
            );
        }
        Ok(())
    }
}

/// Errors from [`SamplerConfig::validate`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    /// A setting is out of range.
    #[error("{setting} must be {requirement}, got {value}")]
    Invalid {
        /// The setting, as the request field names it (`temperature`, `top_p`); a command line
        /// names it by its flag instead (see [`SamplerError::with_name`]).
        setting: &'static str,
        /// The value given.
        value: f32,
        /// The accepted range (`>= 0 and finite (0 is greedy)`).
        requirement: &'static str,
    },
}

impl SamplerError {
    /// The same message with the setting called `name` (a command-line flag: `--temperature`).
    pub fn with_name(&self, name: &str) -> String {
        match self {
            SamplerError::Invalid {
                value, requirement, ..
            } => format!("{name} must be {requirement}, got {value}"),
        }
    }

    /// The setting at fault, as the request field names it.
    pub fn setting(&self) -> &'static str {
        match self {
            SamplerError::Invalid { setting, .. } => setting,
        }
    }
}

/// Picks tokens from logits according to a [`SamplerConfig`]; holds the random state and the
/// scratch space, so keep one per generation.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Xoshiro256,
    /// Candidate token ids.
    candidates: Vec<u32>,
    /// `exp(logit - max)` of each candidate, in the same order.
    weights: Vec<f32>,
    /// One bit per token id: seen in the history (all zero between calls).
    seen: Vec<u64>,
    /// How many of the row's most likely tokens to report with each pick's log-probability;
    /// `None`: no log-probabilities ([`Sampler::with_logprobs`]).
    logprobs: Option<usize>,
    /// The last pick's log-probabilities, until taken ([`Sampler::take_logprobs`]).
    last: Option<TokenLogprobs>,
    /// Scratch: the ids of the row's most likely tokens; the raw logits of the history's ids
    /// (which the repetition penalty changes in place).
    top_ids: Vec<u32>,
    raw_history: Vec<f32>,
}

/// The most alternatives [`Sampler::with_logprobs`] reports per token (OpenAI's
/// `top_logprobs` allows 20).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A picked token's log-probability and the row's most likely tokens with theirs: the
/// log-softmax of the raw logits (temperature 1, before the repetition penalty and the
/// warpers), computed in f64 over the whole row. NaN logits count as `-inf`; where some logits
/// are `+inf`, those share the probability and every other token's is `-inf`.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The picked token's log-probability (at most 0; `-inf` for a token of probability 0).
    pub logprob: f64,
    /// The row's most likely tokens (as many as asked, fewer where fewer logits are above
    /// `-inf`) with their log-probabilities, most likely first, equal ones by lower id.
    pub top: Vec<(u32, f64)>,
}

/// A row's log-softmax: its maximum (NaN skipped) and `ln(sum(exp(l - max)))` in f64. Also what
/// scoring reads (`bench::divergence`: perplexity and KL divergence).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogSoftmax {
    max: f32,
    log_sum: f64,
    /// How many logits are `+inf` (where `max` is).
    infinite: usize,
}

impl LogSoftmax {
    pub(crate) fn of(logits: &[f32]) -> LogSoftmax {
        let max = nan_free_max(logits);
        if max == f32::INFINITY {
            let infinite = logits.iter().filter(|&&l| l == f32::INFINITY).count();
            return LogSoftmax {
                max,
                log_sum: (infinite as f64).ln(),
                infinite,
            };
        }
        let m = f64::from(max);
        let sum: f64 = logits
            .iter()
            .filter(|&&l| l > f32::NEG_INFINITY)
            .map(|&l| (f64::from(l) - m).exp())
            .sum();
        LogSoftmax {
            max,
            log_sum: sum.ln(),
            infinite: 0,
        }
    }

    /// The log-probability of a token whose logit is `l`.
    pub(crate) fn of_logit(&self, l: f32) -> f64 {
        if l.is_nan() || l == f32::NEG_INFINITY || self.max == f32::NEG_INFINITY {
            return f64::NEG_INFINITY;
        }
        if self.infinite > 0 {
            return if l == f32::INFINITY {
                -self.log_sum
            } else {
                f64::NEG_INFINITY
            };
        }
        (f64::from(l) - f64::from(self.max)) - self.log_sum
    }

    /// The `k` most likely tokens of `logits` (the row this is the log-softmax of) with their
    /// log-probabilities, most likely first, equal ones by lower id; fewer where fewer logits are
    /// above `-inf`. `ids` is scratch.
    pub(crate) fn top(&self, logits: &[f32], k: usize, ids: &mut Vec<u32>) -> Vec<(u32, f64)> {
        ids.clear();
        if k > 0 {
            top_k_by_rank(logits, k, |l| l, ids);
        }
        ids.iter()
            .map(|&id| (id, self.of_logit(logits[id as usize])))
            .collect()
    }
}

impl Sampler {
    /// A sampler for `cfg`, after [`SamplerConfig::validate`].
    pub fn new(cfg: SamplerConfig) -> Result<Self, SamplerError> {
        cfg.validate()?;
        Ok(Sampler {
            cfg,
            rng: Xoshiro256::from_seed(cfg.seed),
            candidates: Vec::new(),
            weights: Vec::new(),
            seen: Vec::new(),
            logprobs: None,
            last: None,
            top_ids: Vec::new(),
            raw_history: Vec::new(),
        })
    }

    /// This sampler reporting each pick's log-probability and the row's `top` most likely tokens
    /// (at most [`MAX_TOP_LOGPROBS`]; 0: the pick's alone) after every [`Sampler::sample`]
    /// ([`Sampler::take_logprobs`]); `None`: none. A sampler that reports them needs whole rows
    /// ([`Sampler::fits_ranked`] says no). The picks stay those of the sampler without.
    pub fn with_logprobs(mut self, top: Option<usize>) -> Self {
        self.logprobs = top.map(|n| n.min(MAX_TOP_LOGPROBS));
        self
    }

    /// How many alternatives each pick's log-probabilities carry, where they are reported.
    pub fn logprobs(&self) -> Option<usize> {
        self.logprobs
    }

    /// The last pick's log-probabilities (where [`Sampler::with_logprobs`] asked for them and
    /// the pick came from a whole row); `None` once taken.
    pub fn take_logprobs(&mut self) -> Option<TokenLogprobs> {
        self.last.take()
    }

    /// The configuration.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Picks the next token. `logits` are modified in place by the repetition penalty (they are
    /// scratch). `history` = prompt + generated ids (for repetition penalty); ids not below
    /// `logits.len()` are ignored. The warpers rank tokens by their logits (higher first, equal
    /// ones by lower id), and weigh them by the warped logits.
    ///
    /// NaN logits count as `-inf`. A `+inf` logit wins: the choice is among the `+inf` ones.
    /// When no logit is above `-inf` (or `logits` is empty) the result is 0, the same as greedy
    /// argmax with ties broken towards the lowest id. With temperature 0 no random number is
    /// drawn, and neither is one when only a single candidate is left.
    ///
    /// With [`Sampler::with_logprobs`], the pick's log-probability and the row's most likely
    /// tokens are worked out from the row as it came, before anything changes it, and kept for
    /// [`Sampler::take_logprobs`]; no random number is drawn for them.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let Some(top) = self.logprobs else {
            return self.pick(logits, history);
        };
        let norm = LogSoftmax::of(logits);
        let best = norm.top(logits, top, &mut self.top_ids);
        // The penalty changes the history's logits in place: keep them as they came.
        let penalised = self.cfg.repetition_penalty != 1.0;
        self.raw_history.clear();
        if penalised {
            self.raw_history.extend(
                history
                    .iter()
                    .map(|&h| logits.get(h as usize).copied().unwrap_or(f32::NAN)),
            );
        }
        let id = self.pick(logits, history);
        let raw = match history.iter().position(|&h| h == id) {
            Some(at) if penalised => self.raw_history[at],
            _ => logits.get(id as usize).copied().unwrap_or(f32::NAN),
        };
        self.last = Some(TokenLogprobs {
            logprob: norm.of_logit(raw),
            top: best,
        });
        id
    }

    /// [`Sampler::sample`] without the log-probabilities.
    fn pick(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        if self.cfg.repetition_penalty != 1.0 {
            self.apply_repetition_penalty(logits, history);
        }
        if self.cfg.temperature == 0.0 {
            return argmax(logits);
        }
        self.sample_warped(logits)
    }

    /// transformers' `RepetitionPenaltyLogitsProcessor`, once per distinct id in `history`.
    fn apply_repetition_penalty(&mut self, logits: &mut [f32], history: &[u32]) {
        let penalty = self.cfg.repetition_penalty;
        let words = logits.len().div_ceil(64);
        if self.seen.len() < words {
            self.seen.resize(words, 0);
        }
        for &id in history {
            let i = id as usize;
            if i >= logits.len() {
                continue;
            }
            let (word, bit) = (i / 64, 1u64 << (i % 64));
            if self.seen[word] & bit == 0 {
                self.seen[word] |= bit;
                let l = &mut logits[i];
                *l = if *l < 0.0 { *l * penalty } else { *l / penalty };
            }
        }
        for &id in history {
            if let Some(word) = self.seen.get_mut(id as usize / 64) {
                *word = 0;
            }
        }
    }

    fn sample_warped(&mut self, logits: &[f32]) -> u32 {
        // The maximum, NaN counting as -inf.
        let max = nan_free_max(logits);
        if max == f32::NEG_INFINITY {
            return 0;
        }
        let warp = warp_for(max, self.cfg.temperature);
        self.fill_candidates(logits, &warp);
        let pick = self.draw(|i| warp(logits[i as usize]));
        self.candidates[pick]
    }

    /// The candidates of a row before top-p and min-p: its top-k by rank, or every token with
    /// a warped logit above `-inf` (in rank order where top-p will need it).
    fn fill_candidates(&mut self, logits: &[f32], warp: &impl Fn(f32) -> f32) {
        let k = self.cfg.top_k;
        let candidates = &mut self.candidates;
        candidates.clear();
        if k > 0 {
            top_k_by_rank(logits, k, warp, candidates);
        } else {
            candidates.extend(
                logits
                    .iter()
                    .enumerate()
                    .filter(|(_, &l)| warp(l) > f32::NEG_INFINITY)
                    .map(|(i, _)| i as u32),
            );
            if self.cfg.top_p < 1.0 {
                candidates.sort_unstable_by(|a, b| by_rank(logits, *a, *b));
            }
        }
    }

    /// The distribution [`Sampler::sample`] draws from for `logits` and `history` (after the
    /// repetition penalty, which edits `logits` in place, and every warper), in `out`: each
    /// candidate with its probability, most likely first (equal ones by lower id); greedy, or
    /// a row with no logit above `-inf`: the one token `sample` picks, with probability 1.
    /// Draws no random number. Speculative decoding's acceptance rule reads it
    /// (`runtime::speculative`).
    pub fn distribution(&mut self, logits: &mut [f32], history: &[u32], out: &mut Vec<(u32, f64)>) {
        out.clear();
        if self.cfg.repetition_penalty != 1.0 {
            self.apply_repetition_penalty(logits, history);
        }
        let max = nan_free_max(logits);
        if self.cfg.temperature == 0.0 || max == f32::NEG_INFINITY {
            out.push((argmax(logits), 1.0));
            return;
        }
        let warp = warp_for(max, self.cfg.temperature);
        self.fill_candidates(logits, &warp);
        self.restrict(|i| warp(logits[i as usize]));
        if self.candidates.is_empty() {
            out.push((argmax(logits), 1.0));
            return;
        }
        let total: f64 = self.weights.iter().map(|&w| f64::from(w)).sum();
        out.extend(
            self.candidates
                .iter()
                .zip(&self.weights)
                .map(|(&id, &w)| (id, f64::from(w) / total)),
        );
    }

    /// A token drawn from `dist` (ids with weights, not necessarily normalised) with one of
    /// this sampler's random numbers; its first id when every weight is 0.
    pub fn draw_from(&mut self, dist: &[(u32, f64)]) -> u32 {
        let total: f64 = dist.iter().map(|&(_, w)| w.max(0.0)).sum();
        let Some(&(first, _)) = dist.first() else {
            return 0;
        };
        if total.is_nan() || total <= 0.0 {
            return first;
        }
        let target = self.rng.next_f64() * total;
        let mut cumulative = 0.0f64;
        for &(id, w) in dist {
            cumulative += w.max(0.0);
            if cumulative > target {
                return id;
            }
        }
        dist.iter()
            .rev()
            .find(|&&(_, w)| w > 0.0)
            .map_or(first, |&(id, _)| id)
    }

    /// One of this sampler's random numbers, uniform in `[0, 1)` (speculative decoding's
    /// acceptance test draws it from the request's own seeded stream).
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// [`Sampler::sample`] for a row of which only its best `k` logits are known, given as
    /// `Op::TopK` writes them: `best` is `k` logits in rank order (higher first, equal ones by
    /// lower id; NaN counted as -inf), then their token ids as f32. Picks what `sample` picks on
    /// the whole row, with the same draws, wherever [`Sampler::fits_ranked`] says `k` is enough
    /// (no repetition penalty, and top-k within it, or greedy).
    ///
    /// It reports no log-probabilities (a sampler that reports them never fits ranked).
    pub fn sample_ranked(&mut self, best: &[f32]) -> u32 {
        self.last = None;
        let n = best.len() / 2;
        let (values, ids) = best.split_at(n);
        let id = |i: usize| ids[i] as u32;
        if n == 0 || values[0].is_nan() || values[0] == f32::NEG_INFINITY {
            return 0;
        }
        if self.cfg.temperature == 0.0 {
            return id(0);
        }
        let warp = warp_for(values[0], self.cfg.temperature);
        let k = if self.cfg.top_k > 0 {
            self.cfg.top_k.min(n)
        } else {
            n
        };
        self.candidates.clear();
        // A prefix: the warp is non-decreasing, so those above -inf come first.
        self.candidates
            .extend((0..k as u32).take_while(|&i| warp(values[i as usize]) > f32::NEG_INFINITY));
        let pick = self.draw(|i| warp(values[i as usize]));
        id(self.candidates[pick] as usize)
    }

    /// Whether [`Sampler::sample_ranked`] over a row's best `n` logits picks what
    /// [`Sampler::sample`] picks over the whole row: without a repetition penalty, greedy, or
    /// top-k of at most `n`; never where it reports log-probabilities, which take the whole
    /// row's log-softmax ([`Sampler::with_logprobs`]).
    pub fn fits_ranked(&self, n: usize) -> bool {
        self.logprobs.is_none()
            && self.cfg.repetition_penalty == 1.0
            && n > 0
            && (self.cfg.temperature == 0.0 || (1..=n).contains(&self.cfg.top_k))
    }

    /// Top-p, min-p and the draw over `self.candidates` (in rank order where top-p needs it),
    /// whose warped logits `warped` gives; returns the index of the pick in `candidates`.
    fn draw(&mut self, warped: impl Fn(u32) -> f32) -> usize {
        self.restrict(warped);
        let candidates = &mut self.candidates;
        let weights = &self.weights;
        match candidates.len() {
            // Unreachable: the maximum has weight 1 and survives every warper.
            0 => {
                candidates.push(0);
                0
            }
            1 => 0,
            _ => {
                let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
                let target = self.rng.next_f64() * total;
                let mut cumulative = 0.0f64;
                for (i, &w) in weights.iter().enumerate() {
                    cumulative += f64::from(w);
                    if cumulative > target {
                        return i;
                    }
                }
                candidates.len() - 1
            }
        }
    }

    /// Weighs the candidates (`exp` of their warped logits) and applies top-p and min-p to
    /// them, leaving `candidates` and `weights` as the draw sees them.
    fn restrict(&mut self, warped: impl Fn(u32) -> f32) {
        let candidates = &mut self.candidates;
        // Weights relative to the most likely candidate, whose warped logit is 0 (weight 1).
        let weights = &mut self.weights;
        weights.clear();
        weights.extend(candidates.iter().map(|&id| warped(id).exp()));

        // Top-p: keep a candidate while the mass of those ranked above it is below `top_p`.
        let top_p = self.cfg.top_p;
        if top_p < 1.0 {
            let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
            let threshold = f64::from(top_p) * total;
            let mut before = 0.0f64;
            let mut keep = weights.len();
            for (i, &w) in weights.iter().enumerate() {
                if i > 0 && before >= threshold {
                    keep = i;
                    break;
                }
                before += f64::from(w);
            }
            candidates.truncate(keep);
            weights.truncate(keep);
        }

        // Min-p: a weight is the probability relative to the most likely candidate's.
        let min_p = self.cfg.min_p;
        if min_p > 0.0 {
            let mut kept = 0;
            for i in 0..weights.len() {
                if weights[i] >= min_p {
                    weights[kept] = weights[i];
                    candidates[kept] = candidates[i];
                    kept += 1;
                }
            }
            candidates.truncate(kept);
            weights.truncate(kept);
        }
    }
}

/// Rows from which [`sample_rows`] spreads its rows over threads, and the fewest rows a thread
/// takes.
const ROWS_PER_THREAD: usize = 4;

/// Picks one token per row, each with its own sampler and history (`rows[r]`: sampler, history,
/// logits, where the pick goes), spreading the rows over up to 8 threads when there are at
/// least 2 x [`ROWS_PER_THREAD`] of them: a batched step's sampling, which is the same per row
/// as [`Sampler::sample`] on one thread.
pub fn sample_rows(rows: &mut [(&mut Sampler, &[u32], &mut [f32], &mut u32)]) {
    // Asked once: `available_parallelism` reads the cgroup files on Linux.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let threads = cores.min(8).min(rows.len() / ROWS_PER_THREAD);
    if threads < 2 {
        for (sampler, history, logits, out) in rows.iter_mut() {
            **out = sampler.sample(logits, history);
        }
        return;
    }
    let per = rows.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for part in rows.chunks_mut(per) {
            scope.spawn(move || {
                for (sampler, history, logits, out) in part.iter_mut() {
                    **out = sampler.sample(logits, history);
                }
            });
        }
    });
}

/// The index of the largest logit; NaN counts as `-inf`, ties go to the lowest index, and 0 when
/// nothing is above `-inf`.
///
/// Two passes, each of which the compiler vectorises: the maximum in [`LANES`] independent
/// lanes (`f32::max` skips NaN), then the first block holding it. One compare chain over a
/// 262,144-token vocabulary was most of a batched step's sampling (see the test's timing note).
pub fn argmax(logits: &[f32]) -> u32 {
    let best = nan_free_max(logits);
    if best == f32::NEG_INFINITY {
        return 0;
    }
    for (b, block) in logits.chunks(LANES).enumerate() {
        if block.iter().fold(false, |hit, &l| hit | (l == best)) {
            let i = block.iter().position(|&l| l == best).unwrap_or(0);
            return (b * LANES + i) as u32;
        }
    }
    0
}

/// Independent maxima [`argmax`] keeps (two AVX-512 or four AVX2 vectors).
const LANES: usize = 32;

/// The maximum of `logits`, NaN skipped, in [`LANES`] independent lanes (read only).
#[inline]
fn nan_free_max(logits: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let blocks = logits.chunks_exact(LANES);
    let tail = blocks.remainder();
    for block in blocks {
        for (m, &l) in lanes.iter_mut().zip(block) {
            *m = m.max(l);
        }
    }
    tail.iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &l| m.max(l))
}

/// A logit shifted so that the row's maximum `max` is 0, then over the temperature: the same
/// probabilities as `logit / temperature`, without overflow at small temperatures. With a
/// +inf maximum, +inf becomes 0 and everything else -inf. Non-decreasing; NaN stays NaN.
fn warp_for(max: f32, temperature: f32) -> impl Fn(f32) -> f32 + Copy {
    move |l: f32| -> f32 {
        if max == f32::INFINITY {
            if l == f32::INFINITY {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        } else {
            (l - max) / temperature
        }
    }
}

/// The sampler's rank: higher logit first, equal logits by lower id (neither NaN).
fn by_rank(logits: &[f32], a: u32, b: u32) -> Ordering {
    logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b))
}

/// Positions [`top_k_by_rank`] skips at once when none of them can enter.
const TOP_K_BLOCK: usize = 64;

/// Fills `out` with the ids of the `k` best of `logits` by [`by_rank`] among those whose
/// `warp`ed logit is above -inf (NaN never: it compares false), in rank order; with fewer than
/// `k`, all of those. One pass in blocks: a block whose maximum is not above the k-th best so
/// far is skipped (a later id never wins a tie), the others add their entries above it; the
/// kept ids are cut back to the best `k` whenever they reach `2k`.
fn top_k_by_rank(logits: &[f32], k: usize, warp: impl Fn(f32) -> f32, out: &mut Vec<u32>) {
    let rank = |a: &u32, b: &u32| by_rank(logits, *a, *b);
    let mut floor = f32::NEG_INFINITY;
    for (b, block) in logits.chunks(TOP_K_BLOCK).enumerate() {
        // The block's maximum in 16 lanes (faster on blocks this short than `nan_free_max`'s
        // 32); not NaN: `max` skips it, so -inf at worst.
        let mut lanes = [f32::NEG_INFINITY; 16];
        for part in block.chunks(16) {
            for (m, &l) in lanes.iter_mut().zip(part) {
                *m = m.max(l);
            }
        }
        let top = lanes.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        if top <= floor {
            continue;
        }
        let base = b * TOP_K_BLOCK;
        for (i, &l) in block.iter().enumerate() {
            if l > floor && warp(l) > f32::NEG_INFINITY {
                out.push((base + i) as u32);
            }
        }
        if out.len() >= 2 * k.max(8) {
            out.select_nth_unstable_by(k - 1, rank);
            out.truncate(k);
            floor = logits[out[k - 1] as usize];
        }
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, rank);
        out.truncate(k);
    }
    out.sort_unstable_by(rank);
}

/// xoshiro256** (Blackman and Vigna), seeded through splitmix64.
#[derive(Debug, Clone)]
struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    fn from_seed(seed: u64) -> Self {
        let mut x = seed;
        let mut splitmix = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        // splitmix64 never yields four zeros in a row, so the state is never all zero.
        Xoshiro256 {
            s: [splitmix(), splitmix(), splitmix(), splitmix()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`, 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A model's default sampling: its `generation_config.json` where it has one, else tandem's
/// defaults ([`SamplerConfig::default`]: temperature 1, top-k 64, top-p 0.95, min-p and
/// repetition penalty off, seed 0).
///
/// `do_sample: false` means greedy ([`SamplerConfig::greedy`]); otherwise each key the file
/// gives (`temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`) replaces tandem's
/// default for it, and a key it lacks keeps tandem's default. (`transformers` would read a file
/// without `do_sample` as greedy and a missing `top_k` as 50; tandem reads a file that names no
/// sampling key, such as a base checkpoint's `{"bos_token_id": 2, ...}`, as saying nothing.)
/// The seed is never the model's: 0 here, for the caller to replace.
pub fn sampling_defaults(generation: Option<&GenerationConfig>) -> SamplerConfig {
    let base = SamplerConfig::default();
    let Some(g) = generation else {
        return base;
    };
    if g.do_sample == Some(false) {
        return SamplerConfig::greedy();
    }
    SamplerConfig {
        temperature: g.temperature.unwrap_or(base.temperature),
        top_k: g.top_k.unwrap_or(base.top_k),
        top_p: g.top_p.unwrap_or(base.top_p),
        min_p: g.min_p.unwrap_or(base.min_p),
        repetition_penalty: g.repetition_penalty.unwrap_or(base.repetition_penalty),
        seed: base.seed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::generation::parse_generation_config;

    fn cfg(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplerConfig {
        SamplerConfig {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty: 1.0,
            seed: 42,
        }
    }

    /// Deterministic pseudo-random logits for `steps` steps of a `vocab`-token model.
    fn random_logits(steps: usize, vocab: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = Xoshiro256::from_seed(seed);
        (0..steps)
            .map(|_| {
                (0..vocab)
                    .map(|_| (rng.next_f64() * 20.0 - 10.0) as f32)
                    .collect()
            })
            .collect()
    }

    fn run(cfg: SamplerConfig, steps: &[Vec<f32>]) -> Vec<u32> {
        let mut s = Sampler::new(cfg).unwrap();
        steps.iter().map(|l| s.sample(&mut l.clone(), &[])).collect()
    }

    fn counts(cfg: SamplerConfig, logits: &[f32], draws: usize) -> Vec<usize> {
        let mut s = Sampler::new(cfg).unwrap();
        let mut counts = vec![0; logits.len()];
        for _ in 0..draws {
            counts[s.sample(&mut logits.to_vec(), &[]) as usize] += 1;
        }
        counts
    }

    #[test]
    fn greedy_takes_argmax_lowest_id_on_ties() {
        let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
        assert_eq!(s.sample(&mut [0.1, 3.0, -2.0, 3.0], &[]), 1);
        assert_eq!(s.sample(&mut [f32::NAN, 1.0, f32::NAN], &[]), 1);
        assert_eq!(s.sample(&mut [1.0, f32::INFINITY, 2.0], &[]), 1);
    }

    /// The two-pass argmax equals the one-pass definition (NaN as `-inf`, lowest index on ties,
    /// 0 when nothing is above `-inf`) on lengths around its lane count, with NaN, infinities
    /// and repeated maxima placed at random.
    #[test]
    fn argmax_matches_its_definition() {
        fn one_pass(logits: &[f32]) -> u32 {
            let (mut best, mut value) = (0usize, f32::NEG_INFINITY);
            for (i, &l) in logits.iter().enumerate() {
                if l > value {
                    (best, value) = (i, l);
                }
            }
            best as u32
        }
        let mut rng = Xoshiro256::from_seed(0x9E37_79B9_7F4A_7C15);
        let mut next = || rng.next_u64();
        for len in [0usize, 1, 2, 31, 32, 33, 63, 64, 65, 1000, 4099] {
            for trial in 0..40 {
                let mut v: Vec<f32> = (0..len).map(|_| (next() % 64) as f32 - 40.0).collect();
                for _ in 0..(trial % 5) {
                    if len > 0 {
                        let i = next() as usize % len;
                        v[i] = match next() % 4 {
                            0 => f32::NAN,
                            1 => f32::INFINITY,
                            2 => f32::NEG_INFINITY,
                            _ => 23.0,
                        };
                    }
                }
                if trial % 7 == 0 {
                    v.iter_mut().for_each(|x| {
                        *x = if next() % 2 == 0 {
                            f32::NAN
                        } else {
                            f32::NEG_INFINITY
                        }
                    });
                }
                assert_eq!(argmax(&v), one_pass(&v), "len {len} trial {trial}: {v:?}");
            }
        }
    }

    /// The warpers by their definition over the whole row: every token whose warped logit is
    /// above -inf ranked (higher logit first, equal ones by lower id), the first `top_k` kept, then top-p
    /// and min-p, then one draw over what is left in rank order.
    fn by_definition(cfg: SamplerConfig, logits: &[f32], rng: &mut Xoshiro256) -> u32 {
        let clean: Vec<f32> = logits
            .iter()
            .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l })
            .collect();
        let max = clean.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        if max == f32::NEG_INFINITY {
            return 0;
        }
        let shifted: Vec<f32> = if max == f32::INFINITY {
            let inf = |l: f32| {
                if l == f32::INFINITY {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            };
            clean.iter().map(|&l| inf(l)).collect()
        } else {
            clean.iter().map(|&l| (l - max) / cfg.temperature).collect()
        };
        let mut ranked: Vec<u32> = (0..shifted.len() as u32)
            .filter(|&i| shifted[i as usize] > f32::NEG_INFINITY)
            .collect();
        // Ranked by the logits themselves (the warp is non-decreasing: the same order, but
        // for values it rounds together).
        ranked.sort_by(|a, b| clean[*b as usize].total_cmp(&clean[*a as usize]).then(a.cmp(b)));
        if cfg.top_k > 0 {
            ranked.truncate(cfg.top_k);
        }
        let mut weights: Vec<f32> = ranked.iter().map(|&i| shifted[i as usize].exp()).collect();
        if cfg.top_p < 1.0 {
            let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
            let (mut before, mut keep) = (0.0f64, weights.len());
            for (i, &w) in weights.iter().enumerate() {
                if i > 0 && before >= f64::from(cfg.top_p) * total {
                    keep = i;
                    break;
                }
                before += f64::from(w);
            }
            ranked.truncate(keep);
            weights.truncate(keep);
        }
        let kept: Vec<(u32, f32)> = ranked
            .into_iter()
            .zip(weights)
            .filter(|&(_, w)| cfg.min_p == 0.0 || w >= cfg.min_p)
            .collect();
        if kept.len() == 1 {
            return kept[0].0;
        }
        let total: f64 = kept.iter().map(|&(_, w)| f64::from(w)).sum();
        let target = rng.next_f64() * total;
        let mut cumulative = 0.0f64;
        for &(id, w) in &kept {
            cumulative += f64::from(w);
            if cumulative > target {
                return id;
            }
        }
        kept[kept.len() - 1].0
    }

    #[test]
    fn warpers_match_their_definition_over_the_whole_row() {
        // Rows long enough for the top-k pass's blocks to be skipped and its kept ids cut back,
        // with ties (values on a coarse grid), NaN, -inf, +inf, ascending runs (every block
        // enters), and fewer finite values than k.
        let mut rng = Xoshiro256::from_seed(0x1234_5678_9ABC_DEF1);
        let mut next = || rng.next_u64();
        let configs = [
            cfg(1.0, 64, 0.95, 0.0),
            cfg(1.0, 64, 1.0, 0.0),
            cfg(0.7, 5, 1.0, 0.05),
            cfg(1.3, 200, 0.9, 0.0),
            cfg(0.01, 3, 0.5, 0.0),
            cfg(2.0, 1, 1.0, 0.0),
            cfg(1.0, 0, 0.8, 0.1),
        ];
        for case in 0..60u64 {
            let n = [1usize, 7, 63, 64, 65, 1000, 5000][case as usize % 7];
            let mut row: Vec<f32> = (0..n)
                .map(|i| match next() % 23 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 if case % 5 == 0 => f32::INFINITY,
                    3 => i as f32 * 0.01, // an ascending run
                    _ => ((next() % 64) as f32 - 32.0) * 0.25,
                })
                .collect();
            if case % 11 == 3 {
                // Few finite values: fewer than most k.
                for (i, l) in row.iter_mut().enumerate() {
                    if i % 9 != 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            for c in configs {
                let seeded = SamplerConfig { seed: case, ..c };
                let mut s = Sampler::new(seeded).unwrap();
                let mut rng = Xoshiro256::from_seed(case);
                for draw in 0..3 {
                    let got = s.sample(&mut row.clone(), &[]);
                    let want = by_definition(seeded, &row, &mut rng);
                    assert_eq!(got, want, "case {case} (n {n}), {c:?}, draw {draw}");
                }
            }
        }
    }

    /// A row's best `n` logits, then their ids as f32, as `Op::TopK` writes them: rank order,
    /// NaN as -inf.
    fn top_n(logits: &[f32], n: usize) -> Vec<f32> {
        let clean: Vec<f32> = logits
            .iter()
            .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l })
            .collect();
        let mut ids: Vec<u32> = (0..clean.len() as u32).collect();
        ids.sort_by(|a, b| clean[*b as usize].total_cmp(&clean[*a as usize]).then(a.cmp(b)));
        ids.truncate(n);
        let values = ids.iter().map(|&i| clean[i as usize]);
        values.chain(ids.iter().map(|&i| i as f32)).collect()
    }

    #[test]
    fn a_rows_best_logits_pick_what_the_whole_row_picks() {
        let mut rng = Xoshiro256::from_seed(0x0DDB_A11C_0FFE_E123);
        let mut next = || rng.next_u64();
        let n = 64;
        let configs = [
            SamplerConfig::greedy(),
            cfg(1.0, 64, 0.95, 0.0),
            cfg(1.0, 64, 1.0, 0.0),
            cfg(0.7, 5, 1.0, 0.05),
            cfg(0.01, 3, 0.5, 0.0),
            cfg(1e-38, 10, 1.0, 0.0),
        ];
        for case in 0..40u64 {
            let len = [64usize, 65, 300, 4000][case as usize % 4];
            let row: Vec<f32> = (0..len)
                .map(|_| match next() % 29 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 if case % 7 == 0 => f32::INFINITY,
                    _ => ((next() % 48) as f32 - 24.0) * 0.5,
                })
                .collect();
            let best = top_n(&row, n);
            for c in configs {
                let seeded = SamplerConfig { seed: case, ..c };
                let mut whole = Sampler::new(seeded).unwrap();
                let mut ranked = Sampler::new(seeded).unwrap();
                assert!(ranked.fits_ranked(n), "{c:?}");
                for draw in 0..3 {
                    let want = whole.sample(&mut row.clone(), &[]);
                    let got = ranked.sample_ranked(&best);
                    assert_eq!(got, want, "case {case}, {c:?}, draw {draw}");
                }
            }
        }
        // What the best logits cannot answer.
        let fits = |c: SamplerConfig| Sampler::new(c).unwrap().fits_ranked(n);
        assert!(!fits(cfg(1.0, 0, 0.9, 0.0)), "top-k off needs the whole row");
        assert!(!fits(cfg(1.0, 65, 1.0, 0.0)), "top-k above what is known");
        assert!(!fits(SamplerConfig {
            repetition_penalty: 1.2,
            ..SamplerConfig::greedy()
        }));
    }

    #[test]
    fn rows_sampled_on_threads_pick_what_each_sampler_alone_picks() {
        let vocab = 3000;
        let steps = random_logits(24, vocab, 21);
        let configs: Vec<SamplerConfig> = (0..24u64)
            .map(|i| SamplerConfig {
                seed: i,
                repetition_penalty: if i % 3 == 0 { 1.3 } else { 1.0 },
                ..cfg(0.8, if i % 2 == 0 { 40 } else { 0 }, 0.9, 0.0)
            })
            .collect();
        let history: Vec<u32> = (0..50).map(|i| i * 37 % vocab as u32).collect();
        // Alone, one after another.
        let alone: Vec<u32> = configs
            .iter()
            .zip(&steps)
            .map(|(c, l)| Sampler::new(*c).unwrap().sample(&mut l.clone(), &history))
            .collect();
        // Together (24 rows: threads wherever this machine has two cores or more).
        let mut samplers: Vec<Sampler> = configs.iter().map(|c| Sampler::new(*c).unwrap()).collect();
        let mut rows_of = steps.clone();
        let mut picks = vec![u32::MAX; steps.len()];
        let mut rows: Vec<(&mut Sampler, &[u32], &mut [f32], &mut u32)> = samplers
            .iter_mut()
            .zip(rows_of.iter_mut())
            .zip(picks.iter_mut())
            .map(|((s, l), p)| (s, &history[..], &mut l[..], p))
            .collect();
        sample_rows(&mut rows);
        assert_eq!(picks, alone);
        assert!(
            alone.iter().any(|&id| id != alone[0]),
            "the rows differ: {alone:?}"
        );
    }

    /// The log-softmax by its definition, in f64 over the whole row (NaN as -inf).
    fn log_softmax(row: &[f32]) -> Vec<f64> {
        let max = row
            .iter()
            .filter(|l| !l.is_nan())
            .fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
        let sum: f64 = row
            .iter()
            .filter(|l| !l.is_nan())
            .map(|&l| (f64::from(l) - max).exp())
            .sum();
        row.iter()
            .map(|&l| {
                if l.is_nan() {
                    f64::NEG_INFINITY
                } else {
                    f64::from(l) - max - sum.ln()
                }
            })
            .collect()
    }

    /// Asking for log-probabilities changes no pick (the same draws, a repetition penalty
    /// included), and they are the raw row's log-softmax: the pick's, and the `top` best ids in
    /// rank order with theirs.
    #[test]
    fn logprobs_are_the_raw_rows_log_softmax_and_change_no_pick() {
        let vocab = 3000;
        let steps = random_logits(12, vocab, 31);
        let history: Vec<u32> = (0..200).map(|i| i * 53 % vocab as u32).collect();
        let penalised = |c: SamplerConfig, p: f32| SamplerConfig {
            repetition_penalty: p,
            ..c
        };
        let configs = [
            SamplerConfig::greedy(),
            cfg(1.0, 64, 0.95, 0.0),
            cfg(0.7, 0, 0.9, 0.05),
            cfg(3.0, 0, 1.0, 0.0),
            penalised(cfg(1.0, 40, 1.0, 0.0), 1.3),
            penalised(SamplerConfig::greedy(), 0.5),
        ];
        let mut from_history = 0;
        for c in configs {
            for top in [0, 1, 5, MAX_TOP_LOGPROBS] {
                let mut plain = Sampler::new(c).unwrap();
                let mut with = Sampler::new(c).unwrap().with_logprobs(Some(top));
                assert!(
                    !with.fits_ranked(RANKED),
                    "{c:?}: log-probabilities need whole rows"
                );
                for (step, row) in steps.iter().enumerate() {
                    let want = plain.sample(&mut row.clone(), &history);
                    let got = with.sample(&mut row.clone(), &history);
                    assert_eq!(got, want, "{c:?}, top {top}, step {step}");
                    assert!(plain.take_logprobs().is_none());
                    let lp = with.take_logprobs().expect("log-probabilities");
                    assert!(with.take_logprobs().is_none(), "taken once");
                    let exact = log_softmax(row);
                    assert!(
                        (lp.logprob - exact[got as usize]).abs() < 1e-9,
                        "{c:?}, step {step}: {} against {}",
                        lp.logprob,
                        exact[got as usize]
                    );
                    from_history += usize::from(history.contains(&got));
                    let mut ranked: Vec<u32> = (0..vocab as u32).collect();
                    ranked.sort_by(|a, b| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b)));
                    let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
                    assert_eq!(ids, ranked[..top], "{c:?}, step {step}");
                    for &(id, l) in &lp.top {
                        assert!((l - exact[id as usize]).abs() < 1e-9);
                        assert!(l <= 0.0);
                    }
                }
            }
        }
        // The penalty (0.5 favours the history) had picks whose logits it changed: their
        // log-probabilities are the raw row's, checked above.
        assert!(from_history > 0);
    }

    /// How many best logits the ranked tests read.
    const RANKED: usize = 128;

    #[test]
    fn logprobs_of_rows_with_nan_and_infinities() {
        let mut s = Sampler::new(SamplerConfig::greedy())
            .unwrap()
            .with_logprobs(Some(3));
        // NaN and -inf have probability 0; two equal logits share it.
        assert_eq!(s.sample(&mut [f32::NAN, f32::NEG_INFINITY, 1.0, 1.0], &[]), 2);
        let lp = s.take_logprobs().unwrap();
        let half = 0.5f64.ln();
        assert!((lp.logprob - half).abs() < 1e-12);
        assert_eq!(lp.top.len(), 2, "only the tokens above -inf: {lp:?}");
        assert_eq!((lp.top[0].0, lp.top[1].0), (2, 3));
        // +inf logits share the whole probability.
        assert_eq!(s.sample(&mut [f32::INFINITY, 5.0, f32::INFINITY], &[]), 0);
        let lp = s.take_logprobs().unwrap();
        assert!((lp.logprob - half).abs() < 1e-12);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 2, 1]);
        assert_eq!(lp.top[2].1, f64::NEG_INFINITY);
        // Nothing above -inf: the pick (0) has probability 0.
        assert_eq!(s.sample(&mut [f32::NAN, f32::NEG_INFINITY], &[]), 0);
        let lp = s.take_logprobs().unwrap();
        assert_eq!((lp.logprob, lp.top.len()), (f64::NEG_INFINITY, 0));
        // A ranked pick carries none.
        let mut r = Sampler::new(SamplerConfig::greedy()).unwrap();
        r.sample_ranked(&[2.0, 1.0, 7.0, 3.0]);
        assert!(r.take_logprobs().is_none());
    }

    #[test]
    fn no_finite_logit_gives_zero() {
        let all_bad = [f32::NAN, f32::NEG_INFINITY, f32::NAN];
        for c in [SamplerConfig::greedy(), SamplerConfig::default()] {
            let mut s = Sampler::new(c).unwrap();
            assert_eq!(s.sample(&mut all_bad.clone(), &[]), 0);
            assert_eq!(s.sample(&mut [], &[]), 0);
        }
    }

    #[test]
    fn infinite_logits_are_chosen_among_themselves() {
        let logits = [5.0, f32::INFINITY, f32::NAN, f32::INFINITY];
        let c = counts(cfg(1.0, 0, 1.0, 0.0), &logits, 400);
        assert_eq!(c[0] + c[2], 0, "{c:?}");
        assert!(c[1] > 100 && c[3] > 100, "{c:?}");
    }

    #[test]
    fn top_k_one_equals_greedy() {
        let steps = random_logits(50, 1000, 7);
        let greedy = run(SamplerConfig::greedy(), &steps);
        assert_eq!(run(cfg(1.0, 1, 1.0, 0.0), &steps), greedy);
        assert_eq!(run(cfg(0.7, 1, 0.9, 0.1), &steps), greedy);
    }

    #[test]
    fn tiny_top_p_equals_greedy() {
        let steps = random_logits(50, 1000, 8);
        let greedy = run(SamplerConfig::greedy(), &steps);
        assert_eq!(run(cfg(1.0, 0, 1e-6, 0.0), &steps), greedy);
        assert_eq!(run(cfg(1.5, 64, 1e-6, 0.0), &steps), greedy);
    }

    #[test]
    fn tiny_temperature_equals_greedy() {
        let steps = random_logits(50, 1000, 9);
        let greedy = run(SamplerConfig::greedy(), &steps);
        assert_eq!(run(cfg(1e-30, 0, 1.0, 0.0), &steps), greedy);
    }

    #[test]
    fn same_seed_same_tokens() {
        let steps = random_logits(200, 50, 10);
        let c = SamplerConfig {
            temperature: 5.0,
            top_k: 0,
            top_p: 1.0,
            ..SamplerConfig::default()
        };
        let a = run(c, &steps);
        assert_eq!(a, run(c, &steps));
        let other = run(SamplerConfig { seed: 1, ..c }, &steps);
        assert_ne!(a, other);
        // Sampling at a high temperature is not greedy.
        assert_ne!(a, run(SamplerConfig::greedy(), &steps));
    }

    #[test]
    fn draws_follow_the_probabilities() {
        // p = 0.75 / 0.25; 4000 draws: sd of the count = sqrt(4000 * 0.75 * 0.25) ~ 27.4.
        let logits = [3.0f32.ln(), 0.0];
        let c = counts(cfg(1.0, 0, 1.0, 0.0), &logits, 4000);
        assert!((c[0] as i64 - 3000).abs() < 140, "{c:?}");
        // Temperature 2 flattens to sqrt(3) : 1, p0 ~ 0.634 (sd ~ 30.5).
        let c = counts(cfg(2.0, 0, 1.0, 0.0), &logits, 4000);
        let expected = 4000.0 * 3f64.sqrt() / (3f64.sqrt() + 1.0);
        assert!((c[0] as f64 - expected).abs() < 155.0, "{c:?}");
    }

    #[test]
    fn top_k_top_p_min_p_restrict_the_candidates() {
        // p = 0.5, 0.3, 0.15, 0.05.
        let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let c = counts(cfg(1.0, 2, 1.0, 0.0), &logits, 2000);
        assert!(c[0] > 0 && c[1] > 0 && c[2] + c[3] == 0, "top-k {c:?}");
        // Mass before: 0, 0.5, 0.8 -> top-p 0.7 keeps the first two.
        let c = counts(cfg(1.0, 0, 0.7, 0.0), &logits, 2000);
        assert!(c[0] > 0 && c[1] > 0 && c[2] + c[3] == 0, "top-p {c:?}");
        // 0.8 is reached exactly by two; 0.81 needs the third.
        let c = counts(cfg(1.0, 0, 0.81, 0.0), &logits, 2000);
        assert!(c[2] > 0 && c[3] == 0, "top-p {c:?}");
        // min-p 0.35: keep p >= 0.175.
        let c = counts(cfg(1.0, 0, 1.0, 0.35), &logits, 2000);
        assert!(c[0] > 0 && c[1] > 0 && c[2] + c[3] == 0, "min-p {c:?}");
        // Order: top-k 3 then top-p over the renormalised three (0.526, 0.316, 0.158).
        let c = counts(cfg(1.0, 3, 0.84, 0.0), &logits, 2000);
        assert!(c[2] == 0 && c[3] == 0, "top-k then top-p {c:?}");
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let mut s = Sampler::new(SamplerConfig {
            repetition_penalty: 2.0,
            ..SamplerConfig::greedy()
        })
        .unwrap();
        let mut logits = [4.0, -1.0, 3.0, 1.0];
        // Repeated ids are penalised once; out-of-range ids are ignored.
        s.apply_repetition_penalty(&mut logits, &[0, 1, 0, 0, 99]);
        assert_eq!(logits, [2.0, -2.0, 3.0, 1.0]);
        assert!(s.seen.iter().all(|&w| w == 0));

        let mut logits = [4.0, -1.0, 3.0, 1.0];
        assert_eq!(s.sample(&mut logits, &[0]), 2);
        let mut logits = [4.0, -1.0, 3.0, 1.0];
        assert_eq!(s.sample(&mut logits, &[]), 0);
    }

    #[test]
    fn validation_names_the_setting() {
        let cases = [
            (
                SamplerConfig {
                    temperature: -0.5,
                    ..SamplerConfig::default()
                },
                "temperature",
            ),
            (
                SamplerConfig {
                    temperature: f32::NAN,
                    ..SamplerConfig::default()
                },
                "temperature",
            ),
            (
                SamplerConfig {
                    top_p: 0.0,
                    ..SamplerConfig::default()
                },
                "top_p",
            ),
            (
                SamplerConfig {
                    top_p: 1.5,
                    ..SamplerConfig::default()
                },
                "top_p",
            ),
            (
                SamplerConfig {
                    min_p: 1.0,
                    ..SamplerConfig::default()
                },
                "min_p",
            ),
            (
                SamplerConfig {
                    min_p: -0.1,
                    ..SamplerConfig::default()
                },
                "min_p",
            ),
            (
                SamplerConfig {
                    repetition_penalty: 0.0,
                    ..SamplerConfig::default()
                },
                "repetition_penalty",
            ),
        ];
        for (c, setting) in cases {
            let err = Sampler::new(c).unwrap_err().to_string();
            assert!(err.starts_with(&format!("{setting} must be ")), "{err}");
        }
        let e = SamplerConfig {
            temperature: -1.0,
            ..SamplerConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.with_name("--temperature"),
            "--temperature must be >= 0 and finite (0 is greedy), got -1"
        );
        assert!(SamplerConfig::default().validate().is_ok());
        assert!(SamplerConfig::greedy().validate().is_ok());
    }

    #[test]
    fn scratch_is_reused() {
        let steps = random_logits(3, 5000, 11);
        let mut s = Sampler::new(SamplerConfig {
            top_k: 0,
            repetition_penalty: 1.3,
            ..SamplerConfig::default()
        })
        .unwrap();
        s.sample(&mut steps[0].clone(), &[1, 2, 3]);
        let caps = (s.candidates.capacity(), s.weights.capacity(), s.seen.capacity());
        let ptrs = (s.candidates.as_ptr(), s.weights.as_ptr(), s.seen.as_ptr());
        for l in &steps[1..] {
            s.sample(&mut l.clone(), &[4, 5, 4999]);
        }
        assert_eq!(
            caps,
            (s.candidates.capacity(), s.weights.capacity(), s.seen.capacity())
        );
        assert_eq!(ptrs, (s.candidates.as_ptr(), s.weights.as_ptr(), s.seen.as_ptr()));
    }

    #[test]
    fn the_generation_config_gives_the_default_sampling() {
        let g = parse_generation_config(
            r#"{"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.8, "eos_token_id": 1}"#,
        )
        .unwrap();
        assert_eq!(
            sampling_defaults(Some(&g)),
            SamplerConfig {
                temperature: 0.6,
                top_k: 20,
                top_p: 0.8,
                min_p: 0.0,
                repetition_penalty: 1.0,
                seed: 0,
            }
        );
        let greedy = parse_generation_config(r#"{"do_sample": false, "top_k": 20}"#).unwrap();
        assert_eq!(sampling_defaults(Some(&greedy)), SamplerConfig::greedy());
        // No file, or one that names no sampling key: tandem's defaults.
        assert_eq!(sampling_defaults(None), SamplerConfig::default());
        let silent = parse_generation_config(r#"{"bos_token_id": 2}"#).unwrap();
        assert_eq!(sampling_defaults(Some(&silent)), SamplerConfig::default());
    }
}
