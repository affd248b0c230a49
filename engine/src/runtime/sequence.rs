//! The generation loop, once for `engine run`, `chat` and `serve`: a [`Request`] (prompt ids, token
//! budget, sampling, stop strings, an [`EventSink`]) is checked once at the engine's edge
//! ([`Request::check`]), then becomes a [`Sequence`] in one KV cache slot. A sequence feeds its
//! prompt in chunks, samples each token with its own seeded sampler, streams the text that became
//! final and ends at a stop token, a stop string, its budget or the context, the same way whoever
//! steps it:
//! - [`generate`] steps one sequence alone (`run`, `chat`);
//! - `serve::batcher` steps many together, one prompt chunk and one decode row each per turn.

use std::time::Instant;

use super::sampler::{Sampler, SamplerConfig, SamplerError, TokenLogprobs};
use super::session::Session;
use super::stop::StopMatcher;
use crate::model::StepModel;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// One generation: a prompt of token ids, how much to generate and how to sample it.
pub struct Request<'s> {
    /// The prompt (already tokenized, chat template applied).
    pub prompt: Vec<u32>,
    /// Most tokens to generate; generation also stops at the context.
    pub max_tokens: usize,
    /// Sampling, with this request's own seed.
    pub sampling: SamplerConfig,
    /// Stop strings: generation ends before the first one the text contains (the text is cut
    /// there). Empty strings are ignored. Needs a tokenizer.
    pub stop: Vec<String>,
    /// Where the events go.
    pub sink: Box<dyn EventSink + 's>,
    /// When the request arrived (time to first token is counted from here).
    pub arrived: Instant,
    /// Images' soft tokens the prompt's image rows read, written into the model's image table
    /// when the request is admitted (`engine serve`; `run` and `chat` write theirs first).
    pub images: Vec<ImageRows>,
}

/// One image's soft tokens for the model's image table: `values` (`[n, width]` f32) from row
/// `first` on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImageRows {
    /// The first row.
    pub first: usize,
    /// The rows.
    pub values: Vec<f32>,
}

/// What a request hears, in order: one [`Event::Token`] per generated token, then one
/// [`Event::Done`] or [`Event::Failed`].
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token and the text that became final with it (often one piece, sometimes
    /// empty: an incomplete character, a special token, or text held back because it may begin
    /// a stop string). Special tokens (`<end_of_turn>`, `<start_of_image>`, `<pad>`: those the
    /// tokenizer marks special) never show in the text; their ids still come.
    Token {
        /// The token id.
        id: u32,
        /// Text released with it.
        text: String,
        /// Its log-probability and the most likely tokens of its row, where the sink asked for
        /// them ([`EventSink::logprobs`]).
        logprobs: Option<TokenLogprobs>,
    },
    /// Generation ended.
    Done {
        /// Text released at the end (held back until now).
        text: String,
        /// Why it ended.
        finish_reason: FinishReason,
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// Tokens generated (a stop token included).
        completion_tokens: usize,
    },
    /// The model failed while running this request.
    Failed {
        /// What went wrong.
        message: String,
    },
}

/// Where a request's events go: standard output for `engine run`, the HTTP layer's channel for
/// `engine serve`. The loop never waits on it.
pub trait EventSink: Send {
    /// Delivers one event; `false` when the receiver has gone (a client disconnected, an output
    /// that cannot be written), which ends the request.
    fn send(&mut self, event: Event) -> bool;

    /// Whether the receiver has gone, checked before each step (a request still in its prompt
    /// sends nothing, so this is how its cancellation is seen).
    fn is_closed(&self) -> bool;

    /// Whether each [`Event::Token`] should carry the token's log-probability, and with how many
    /// of its row's most likely tokens (OpenAI's `logprobs` and `top_logprobs`; at most
    /// [`super::sampler::MAX_TOP_LOGPROBS`]): `None` (the default) for none. Asked once, by
    /// [`Request::check`]. A sequence that wants them has its steps read back whole rows of
    /// logits; its tokens stay those it would pick without.
    fn logprobs(&self) -> Option<usize> {
        None
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

/// How a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It finished, for this reason.
    Finished(FinishReason),
    /// Its receiver went away.
    Cancelled,
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

/// A request the engine does not take: the prompt, the token budget or a sampling setting.
/// [`RequestError::field`] names the request field at fault.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt leaves no room for a generated token.
    #[error("the prompt has {tokens} tokens; the context holds {context} (prompt and generated tokens together), so it leaves no room to generate")]
    PromptTooLong {
        /// Prompt tokens (with those already cached, when a prompt continues a sequence).
        tokens: usize,
        /// The context.
        context: usize,
    },
    /// A prompt token id outside the model's vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// `max_tokens` is 0 or more than the context.
    #[error("max_tokens must be between 1 and the context ({context}), got {value}")]
    MaxTokens {
        /// The value asked for.
        value: u64,
        /// The context.
        context: usize,
    },
    /// A sampling setting out of range.
    #[error(transparent)]
    Sampling(#[from] SamplerError),
    /// Stop strings, where the model has no tokenizer vocabulary to turn tokens into text.
    #[error("stop strings need a tokenizer, and this model has none (no tokenizer.json)")]
    StopWithoutText,
}

impl RequestError {
    /// The request field at fault: `prompt`, `max_tokens`, or the sampling setting's name.
    pub fn field(&self) -> &'static str {
        match self {
            RequestError::EmptyPrompt
            | RequestError::PromptTooLong { .. }
            | RequestError::TokenOutOfRange { .. } => "prompt",
            RequestError::MaxTokens { .. } => "max_tokens",
            RequestError::StopWithoutText => "stop",
            RequestError::Sampling(SamplerError::Invalid { setting, .. }) => setting,
        }
    }
}

/// What a request is checked against: the model's vocabulary, the session's context, and
/// whether tokens can be turned into text.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Vocabulary size.
    pub vocab: usize,
    /// The context: prompt and generated tokens of one sequence together.
    pub context: usize,
    /// The tokenizer has a vocabulary (stop strings can be matched in the text).
    pub text: bool,
    /// Rows of images' soft tokens the model holds past its vocabulary (0: none).
    pub image_rows: usize,
}

impl Limits {
    /// The limits of `session` with `tokenizer`.
    pub fn of<M: StepModel>(session: &Session<M>, tokenizer: &Tokenizer) -> Limits {
        Limits {
            vocab: session.vocab(),
            context: session.context(),
            text: tokenizer.has_vocabulary(),
            image_rows: session.image_rows(),
        }
    }
}

impl Request<'_> {
    /// Checks the prompt (continuing `cached` tokens already in the slot), the token budget, the
    /// stop strings and the sampling settings; returns the request's sampler (reporting
    /// log-probabilities where the sink asks for them). The one place a request is checked.
    pub fn check(&self, limits: Limits, cached: usize) -> Result<Sampler, RequestError> {
        let context = limits.context;
        if self.prompt.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        // Ids past the vocabulary are images' rows, where the model holds them.
        if let Some(&id) = self
            .prompt
            .iter()
            .find(|&&t| t as usize >= limits.vocab + limits.image_rows)
        {
            return Err(RequestError::TokenOutOfRange {
                id,
                vocab: limits.vocab,
            });
        }
        let tokens = cached + self.prompt.len();
        if tokens >= context {
            return Err(RequestError::PromptTooLong { tokens, context });
        }
        if self.max_tokens == 0 || self.max_tokens > context {
            return Err(RequestError::MaxTokens {
                value: self.max_tokens as u64,
                context,
            });
        }
        if !self.stop.is_empty() && !limits.text {
            return Err(RequestError::StopWithoutText);
        }
        Ok(Sampler::new(self.sampling)?.with_logprobs(self.sink.logprobs()))
    }
}

/// A running request in a KV cache slot.
pub struct Sequence<'t> {
    /// Its KV cache slot.
    pub slot: u32,
    prompt: Vec<u32>,
    /// Prompt tokens already in the cache.
    fed: usize,
    /// The last sampled token, to feed at the next decode step.
    pub next: Option<u32>,
    /// Prompt and generated ids: what a repetition penalty looks at.
    history: Vec<u32>,
    sampler: Sampler,
    max_tokens: usize,
    generated: usize,
    /// Text of the generated ids (`None` without a tokenizer vocabulary).
    decoder: Option<StreamDecoder<'t>>,
    stop: StopMatcher,
    stop_ids: &'t [u32],
    sink: Box<dyn EventSink + 't>,
    arrived: Instant,
    /// When the first token's logits were ready, and when the last token was sent.
    first_logits: Option<Instant>,
    last_token: Option<Instant>,
    finish: Option<FinishReason>,
}

/// The time since the last token (or since arrival, for the first): for the serve metrics.
#[derive(Debug, Clone, Copy)]
pub enum Latency {
    /// Time to the first token, from the request's arrival.
    First(std::time::Duration),
    /// Time between this token and the one before.
    Between(std::time::Duration),
}

impl<'t> Sequence<'t> {
    /// Starts `request` in `slot`, sampling with `sampler` (from [`Request::check`]).
    pub fn new(request: Request<'t>, sampler: Sampler, slot: u32, tokenizer: &'t Tokenizer) -> Self {
        Sequence {
            slot,
            history: request.prompt.clone(),
            sampler,
            max_tokens: request.max_tokens,
            generated: 0,
            decoder: tokenizer.has_vocabulary().then(|| tokenizer.stream_decoder(true)),
            stop: StopMatcher::new(&request.stop),
            stop_ids: tokenizer.stop_ids(),
            sink: request.sink,
            arrived: request.arrived,
            first_logits: None,
            last_token: None,
            finish: None,
            prompt: request.prompt,
            fed: 0,
            next: None,
        }
    }

    /// The prompt and the generated ids so far (the last generated one is [`Sequence::next`]
    /// until it is fed).
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Tokens it may still generate (its `max_tokens` less those generated).
    pub fn remaining(&self) -> usize {
        self.max_tokens.saturating_sub(self.generated)
    }

    /// Tokens in the prompt.
    pub fn prompt_len(&self) -> usize {
        self.prompt.len()
    }

    /// Whether part of the prompt is still to be fed.
    pub fn prefilling(&self) -> bool {
        self.fed < self.prompt.len()
    }

    /// The next piece of the prompt, at most `chunk` tokens, never cutting through an image's
    /// rows (ids from `vocab` on: [`super::session::piece_end`]).
    pub fn next_chunk(&self, chunk: usize, vocab: usize) -> &[u32] {
        let end = super::session::piece_end(&self.prompt, self.fed, chunk, vocab);
        &self.prompt[self.fed..end]
    }

    /// Prompt tokens not yet in the cache.
    pub fn prompt_left(&self) -> usize {
        self.prompt.len() - self.fed
    }

    /// Records that the slot already holds the prompt's first `n` tokens (a prefix kept from
    /// the slot's previous request): feeding starts after them. Before any feeding; at most
    /// all but the last prompt token, whose logits give the first pick.
    pub fn skip_cached(&mut self, n: usize) {
        if self.fed == 0 {
            self.fed = n.min(self.prompt.len().saturating_sub(1));
        }
    }

    /// Records that `n` more prompt tokens are in the cache.
    pub fn fed(&mut self, n: usize) {
        self.fed += n;
    }

    /// Whether the receiver has gone.
    pub fn is_closed(&self) -> bool {
        self.sink.is_closed()
    }

    /// Tells the receiver the request failed.
    pub fn fail(&mut self, message: String) {
        self.sink.send(Event::Failed { message });
    }

    /// Samples the next token from this sequence's `logits` and sends it; `at_limit`: the
    /// context has no room for another token ([`Session::at_context_limit`]). Returns how the
    /// request ended, or `None` if it goes on (with [`Sequence::next`] set), and the latency of
    /// this token.
    pub fn accept(&mut self, logits: &mut [f32], at_limit: bool) -> (Option<Outcome>, Latency) {
        let (sampler, history) = self.sampler_parts();
        let id = sampler.sample(logits, history);
        self.accept_id(id, at_limit)
    }

    /// This sequence's sampler and the history it reads (for the repetition penalty), to pick
    /// its next token elsewhere (a batched step samples its rows on several threads) and hand
    /// it to [`Sequence::accept_id`]. Marks the time the first token's logits were ready.
    pub fn sampler_parts(&mut self) -> (&mut Sampler, &[u32]) {
        self.first_logits.get_or_insert_with(Instant::now);
        (&mut self.sampler, &self.history)
    }

    /// This sequence's sampler (what [`Session::logits_for`] asks whether the best logits of a
    /// row are enough).
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// [`Sequence::accept`] for a token already picked by this sequence's sampler (through
    /// [`Sequence::sampler_parts`]).
    pub fn accept_id(&mut self, id: u32, at_limit: bool) -> (Option<Outcome>, Latency) {
        self.first_logits.get_or_insert_with(Instant::now);
        let logprobs = self.sampler.take_logprobs();
        self.history.push(id);
        self.generated += 1;
        let now = Instant::now();
        let latency = match self.last_token {
            None => Latency::First(now - self.arrived),
            Some(prev) => Latency::Between(now - prev),
        };
        self.last_token = Some(now);
        // An id the tokenizer does not know (the embedding may have more rows) adds no text.
        let piece = self
            .decoder
            .as_mut()
            .and_then(|d| d.push(id).ok().flatten())
            .unwrap_or_default();
        let released = self.stop.push(&piece);
        let mut finish = if self.stop_ids.contains(&id) || released.stopped {
            Some(FinishReason::Stop)
        } else if self.generated >= self.max_tokens || at_limit {
            Some(FinishReason::Length)
        } else {
            None
        };
        if !self.sink.send(Event::Token {
            id,
            text: released.text,
            logprobs,
        }) {
            return (Some(Outcome::Cancelled), latency);
        }
        let Some(reason) = finish.as_mut() else {
            self.next = Some(id);
            return (None, latency);
        };
        let mut text = String::new();
        if !released.stopped {
            let tail = self
                .decoder
                .as_mut()
                .and_then(|d| d.finish().ok().flatten())
                .unwrap_or_default();
            let r = self.stop.push(&tail);
            text = r.text;
            if r.stopped {
                *reason = FinishReason::Stop;
            } else {
                text.push_str(&self.stop.finish());
            }
        }
        self.finish = Some(*reason);
        let done = Event::Done {
            text,
            finish_reason: *reason,
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.generated,
        };
        if !self.sink.send(done) {
            return (Some(Outcome::Cancelled), latency);
        }
        (Some(Outcome::Finished(*reason)), latency)
    }

    /// Its timing so far.
    pub fn stats(&self) -> GenerationStats {
        let end = self.last_token.unwrap_or_else(Instant::now);
        let first = self.first_logits.unwrap_or(end);
        GenerationStats {
            prompt_tokens: self.prompt.len(),
            generated_tokens: self.generated,
            prefill_seconds: (first - self.arrived).as_secs_f64(),
            decode_seconds: (end - first).as_secs_f64(),
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nowhere;

    impl EventSink for Nowhere {
        fn send(&mut self, _: Event) -> bool {
            true
        }

        fn is_closed(&self) -> bool {
            false
        }
    }

    fn request(prompt: Vec<u32>, max_tokens: usize) -> Request<'static> {
        Request {
            prompt,
            max_tokens,
            sampling: SamplerConfig::greedy(),
            stop: Vec::new(),
            sink: Box::new(Nowhere),
            arrived: Instant::now(),
            images: Vec::new(),
        }
    }

    /// Every event a sequence sends, and the log-probabilities it asks for.
    struct Heard<'a> {
        events: &'a std::sync::Mutex<Vec<Event>>,
        logprobs: Option<usize>,
    }

    impl EventSink for Heard<'_> {
        fn send(&mut self, event: Event) -> bool {
            self.events.lock().unwrap().push(event);
            true
        }

        fn is_closed(&self) -> bool {
            false
        }

        fn logprobs(&self) -> Option<usize> {
            self.logprobs
        }
    }

    /// A Gemma-like SentencePiece vocabulary as a GGUF file gives it: control tokens, the image
    /// markers and an HTML tag as user-defined tokens, the byte tokens, a few words.
    fn spm_tokenizer() -> Tokenizer {
        use crate::tokenizer::spm::{SpmTokenizer, SpmVocab};
        let mut pieces: Vec<(String, i32)> = [
            ("<pad>", 3),
            ("<eos>", 3),
            ("<bos>", 3),
            ("<unk>", 3),
            ("<start_of_turn>", 3),
            ("<end_of_turn>", 3),
            ("<start_of_image>", 4),
            ("<end_of_image>", 4),
            ("<b>", 4),
        ]
        .iter()
        .map(|&(t, k)| (t.to_string(), k))
        .collect();
        pieces.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 6)));
        pieces.extend(["▁", "a", "b", "▁a"].iter().map(|&t| (t.to_string(), 1)));
        let vocab = SpmVocab {
            scores: (0..pieces.len()).map(|i| -(i as f32)).collect(),
            types: pieces.iter().map(|p| p.1).collect(),
            tokens: pieces.into_iter().map(|p| p.0).collect(),
            bos: Some(2),
            eos: Some(1),
            unk: Some(3),
            add_bos: true,
            add_space_prefix: false,
        };
        Tokenizer::from_spm(SpmTokenizer::new(vocab).unwrap(), None)
    }

    /// Special tokens (control tokens, and the image markers a GGUF vocabulary types as
    /// user-defined) add no text to what a sequence streams, and their ids still come; text-like
    /// user-defined tokens (`<b>`) do show.
    #[test]
    fn special_tokens_are_not_streamed_as_text() {
        let tokenizer = spm_tokenizer();
        let id = |t: &str| tokenizer.token_id(t).unwrap();
        let events = std::sync::Mutex::new(Vec::new());
        let mut r = request(vec![2], 16);
        r.sink = Box::new(Heard {
            events: &events,
            logprobs: None,
        });
        let limits = Limits {
            vocab: tokenizer.vocab_size(),
            context: 64,
            text: true,
            image_rows: 0,
        };
        let sampler = r.check(limits, 0).unwrap();
        let mut seq = Sequence::new(r, sampler, 0, &tokenizer);
        let ids = [
            id("▁a"),
            id("<start_of_image>"),
            id("<b>"),
            id("<pad>"),
            id("<end_of_image>"),
            id("<start_of_turn>"),
            id("b"),
            id("<eos>"),
        ];
        for &t in &ids {
            seq.accept_id(t, false);
        }
        drop(seq);
        let events = events.into_inner().unwrap();
        let mut text = String::new();
        let mut heard = Vec::new();
        for e in &events {
            match e {
                Event::Token {
                    id,
                    text: t,
                    logprobs,
                } => {
                    heard.push(*id);
                    text.push_str(t);
                    assert!(logprobs.is_none(), "not asked for");
                }
                Event::Done { text: t, .. } => text.push_str(t),
                Event::Failed { message } => panic!("{message}"),
            }
        }
        assert_eq!(heard, ids, "every id comes");
        assert_eq!(text, " a<b>b");
        assert!(matches!(
            events.last(),
            Some(Event::Done {
                finish_reason: FinishReason::Stop,
                ..
            })
        ));
    }

    /// A sink that asks for log-probabilities gets them with each token its sequence samples
    /// from a whole row, and the token is the one it would pick without.
    #[test]
    fn a_sink_that_asks_hears_each_tokens_logprobs() {
        let tokenizer = spm_tokenizer();
        let vocab = tokenizer.vocab_size();
        let limits = Limits {
            vocab,
            context: 64,
            text: true,
            image_rows: 0,
        };
        let row: Vec<f32> = (0..vocab).map(|i| ((i * 37) % 101) as f32 * 0.1).collect();
        let mut picks = Vec::new();
        for logprobs in [None, Some(2)] {
            let events = std::sync::Mutex::new(Vec::new());
            let mut r = request(vec![2], 4);
            r.sampling = SamplerConfig {
                seed: 9,
                ..SamplerConfig::default()
            };
            r.sink = Box::new(Heard {
                events: &events,
                logprobs,
            });
            let sampler = r.check(limits, 0).unwrap();
            assert_eq!(sampler.logprobs(), logprobs);
            let mut seq = Sequence::new(r, sampler, 0, &tokenizer);
            for _ in 0..3 {
                seq.accept(&mut row.clone(), false);
            }
            drop(seq);
            let events = events.into_inner().unwrap();
            let mut ids = Vec::new();
            for e in &events {
                if let Event::Token { id, logprobs: lp, .. } = e {
                    ids.push(*id);
                    match (logprobs, lp) {
                        (None, None) => {}
                        (Some(n), Some(lp)) => {
                            assert_eq!(lp.top.len(), n);
                            assert!(lp.logprob <= 0.0 && lp.top[0].1 >= lp.top[1].1);
                        }
                        other => panic!("{other:?}"),
                    }
                }
            }
            picks.push(ids);
        }
        assert_eq!(picks[0], picks[1]);
    }

    #[test]
    fn a_request_is_checked_against_the_vocabulary_the_context_and_its_budget() {
        let limits = Limits {
            vocab: 10,
            context: 8,
            text: false,
            image_rows: 0,
        };
        let field = |r: Request<'_>, cached| r.check(limits, cached).map(|_| ()).map_err(|e| e.field());
        assert_eq!(field(request(vec![1, 2], 4), 0), Ok(()));
        assert_eq!(field(request(vec![], 4), 0), Err("prompt"));
        assert_eq!(field(request(vec![1, 10], 4), 0), Err("prompt"));
        assert_eq!(field(request(vec![1; 7], 4), 0), Ok(()));
        assert_eq!(field(request(vec![1; 8], 4), 0), Err("prompt"));
        assert_eq!(
            field(request(vec![1; 4], 4), 4),
            Err("prompt"),
            "cached tokens count"
        );
        assert_eq!(field(request(vec![1], 0), 0), Err("max_tokens"));
        assert_eq!(field(request(vec![1], 9), 0), Err("max_tokens"));
        let mut hot = request(vec![1], 4);
        hot.sampling.temperature = -1.0;
        assert_eq!(field(hot, 0), Err("temperature"));
        let mut stops = request(vec![1], 4);
        stops.stop = vec!["\n".into()];
        assert_eq!(field(stops, 0), Err("stop"), "stop strings without a vocabulary");
        let mut stops = request(vec![1], 4);
        stops.stop = vec!["\n".into()];
        let with_text = Limits { text: true, ..limits };
        assert!(stops.check(with_text, 0).is_ok());
    }
}
