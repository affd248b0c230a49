//! Why the server refuses a request.

use crate::runtime::sequence::RequestError;

/// A request the server does not take. [`SubmitError::param`] names the request field at
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
    /// A unit was lost and the model cannot run on the units that remain: why.
    #[error("{0}")]
    Unavailable(String),
    /// The request itself is invalid (its prompt, budget or sampling).
    #[error(transparent)]
    Request(#[from] RequestError),
}

impl SubmitError {
    /// The request field at fault (OpenAI's `param`), if one is.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            SubmitError::QueueFull { .. } | SubmitError::ShuttingDown | SubmitError::Unavailable(_) => None,
            SubmitError::Request(e) => Some(e.field()),
        }
    }

    /// Whether the server, not the request, is at fault (busy, stopping, or without the units
    /// to run the model): retry later, or elsewhere.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            SubmitError::QueueFull { .. } | SubmitError::ShuttingDown | SubmitError::Unavailable(_)
        )
    }
}
