//! One request holding a KV cache slot: its prompt (fed in chunks), its sampler with its own
//! seeded random state, its streamed text and its stop rules.

use std::time::Instant;

use super::metrics::{Metrics, Outcome};
use super::request::{Event, EventSink, Request};
use super::stop::StopMatcher;
use crate::runtime::sampler::Sampler;
use crate::runtime::session::FinishReason;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// A running request.
pub(crate) struct Sequence<'t> {
    /// Its KV cache slot.
    pub slot: u32,
    prompt: Vec<u32>,
    /// Prompt tokens already in the cache.
    fed: usize,
    /// The last sampled token, to feed at the next decode step.
    pub next: Option<u32>,
    /// Prompt and generated ids, kept only for a repetition penalty.
    history: Vec<u32>,
    sampler: Sampler,
    max_tokens: usize,
    generated: usize,
    /// Text of the generated ids (`None` without a tokenizer vocabulary).
    decoder: Option<StreamDecoder<'t>>,
    stop: StopMatcher,
    stop_ids: &'t [u32],
    sink: Box<dyn EventSink>,
    arrived: Instant,
    last_token: Option<Instant>,
}

impl<'t> Sequence<'t> {
    /// Starts `request` in `slot`, sampling with `sampler` (made from its settings).
    pub fn new(request: Request, sampler: Sampler, slot: u32, tokenizer: &'t Tokenizer) -> Self {
        let history = if request.sampling.repetition_penalty != 1.0 {
            request.prompt.clone()
        } else {
            Vec::new()
        };
        Sequence {
            slot,
            history,
            sampler,
            max_tokens: request.max_tokens,
            generated: 0,
            decoder: tokenizer.has_vocabulary().then(|| tokenizer.stream_decoder(true)),
            stop: StopMatcher::new(&request.stop),
            stop_ids: tokenizer.stop_ids(),
            sink: request.sink,
            arrived: request.arrived,
            last_token: None,
            prompt: request.prompt,
            fed: 0,
            next: None,
        }
    }

    /// Tokens in the prompt.
    pub fn prompt_len(&self) -> usize {
        self.prompt.len()
    }

    /// Whether part of the prompt is still to be fed.
    pub fn prefilling(&self) -> bool {
        self.fed < self.prompt.len()
    }

    /// The next piece of the prompt, at most `chunk` tokens.
    pub fn next_chunk(&self, chunk: usize) -> &[u32] {
        let end = (self.fed + chunk).min(self.prompt.len());
        &self.prompt[self.fed..end]
    }

    /// Records that `n` more prompt tokens are in the cache.
    pub fn fed(&mut self, n: usize) {
        self.fed += n;
    }

    /// Whether the client has gone.
    pub fn is_closed(&self) -> bool {
        self.sink.is_closed()
    }

    /// Tells the client the request failed.
    pub fn fail(&mut self, message: String) {
        self.sink.send(Event::Failed { message });
    }

    /// Samples the next token from this sequence's `logits` and sends it; `at_limit`: the
    /// context has no room for another token
    /// ([`crate::runtime::session::Session::at_context_limit`]). Returns how the request
    /// ended, or `None` if it goes on (with [`Sequence::next`] set).
    pub fn accept(&mut self, logits: &mut [f32], at_limit: bool, metrics: &Metrics) -> Option<Outcome> {
        let id = self.sampler.sample(logits, &self.history);
        if self.sampler.config().repetition_penalty != 1.0 {
            self.history.push(id);
        }
        self.generated += 1;
        metrics.generated();
        let now = Instant::now();
        match self.last_token {
            None => metrics.ttft.observe(now - self.arrived),
            Some(prev) => metrics.itl.observe(now - prev),
        }
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
        }) {
            return Some(Outcome::Cancelled);
        }
        let Some(reason) = finish.as_mut() else {
            self.next = Some(id);
            return None;
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
        let done = Event::Done {
            text,
            finish_reason: *reason,
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.generated,
        };
        if !self.sink.send(done) {
            return Some(Outcome::Cancelled);
        }
        Some(match reason {
            FinishReason::Stop => Outcome::Stop,
            FinishReason::Length => Outcome::Length,
        })
    }
}
