//! A generation request and the events it receives.

use std::time::Instant;

use crate::runtime::sampler::SamplerConfig;
use crate::runtime::session::FinishReason;

/// One generation: a prompt of token ids, how much to generate and how to sample it.
pub struct Request {
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
    pub sink: Box<dyn EventSink>,
    /// When the request arrived (time to first token is counted from here).
    pub arrived: Instant,
}

/// What a request hears, in order: one [`Event::Token`] per generated token, then one
/// [`Event::Done`] or [`Event::Failed`].
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token and the text that became final with it (often one piece, sometimes
    /// empty: an incomplete character, a special token, or text held back because it may begin
    /// a stop string).
    Token {
        /// The token id.
        id: u32,
        /// Text released with it.
        text: String,
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

/// Where a request's events go: the HTTP layer's channel. The scheduler never waits on it.
pub trait EventSink: Send {
    /// Delivers one event; `false` when the receiver has gone (the client disconnected), which
    /// frees the request's slot.
    fn send(&mut self, event: Event) -> bool;

    /// Whether the receiver has gone, checked before each step (a request still in its prompt
    /// sends nothing, so this is how its cancellation is seen).
    fn is_closed(&self) -> bool;
}
