//! Why the scheduler refuses a request.

use crate::runtime::sampler::SamplerError;

/// A request the scheduler does not take. [`SubmitError::param`] names the request field at
/// fault, for OpenAI's error shape.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Every slot is busy and the queue is full.
    #[error("the server is busy: {queued} requests are waiting; retry later")]
    QueueFull {
        /// Requests waiting.
        queued: usize,
    },
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt leaves no room for a generated token.
    #[error("the prompt has {tokens} tokens; the context holds {context} (prompt and generated tokens together), so it leaves no room to generate")]
    PromptTooLong {
        /// Prompt tokens.
        tokens: usize,
        /// The server's context.
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
        /// The server's context.
        context: usize,
    },
    /// A sampling setting out of range.
    #[error(transparent)]
    Sampling(#[from] SamplerError),
}

impl SubmitError {
    /// The request field at fault (OpenAI's `param`), if one is.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            SubmitError::QueueFull { .. } | SubmitError::ShuttingDown => None,
            SubmitError::EmptyPrompt
            | SubmitError::PromptTooLong { .. }
            | SubmitError::TokenOutOfRange { .. } => Some("prompt"),
            SubmitError::MaxTokens { .. } => Some("max_tokens"),
            SubmitError::Sampling(SamplerError::Invalid { flag, .. }) => Some(match *flag {
                "--temperature" => "temperature",
                "--top-p" => "top_p",
                "--min-p" => "min_p",
                _ => "repetition_penalty",
            }),
        }
    }

    /// Whether the server, not the request, is at fault (busy or stopping): retry later.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, SubmitError::QueueFull { .. } | SubmitError::ShuttingDown)
    }
}
