//! The error type every backend returns. It is plain data (serialisable) so that it crosses the
//! plugin boundary intact.

use serde::{Deserialize, Serialize};

/// An error from a backend.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BackendError {
    /// The backend cannot run on this machine (no loader, no device, missing feature).
    #[error("backend unavailable: {reason}")]
    Unavailable {
        /// Why, naming the device or library that is missing.
        reason: String,
    },
    /// The backend does not implement this op, dtype or shape.
    #[error("unsupported {op}: {reason}")]
    Unsupported {
        /// The op (or op and dtype) that was asked for.
        op: String,
        /// Why it is not supported.
        reason: String,
    },
    /// A device allocation failed.
    #[error("out of memory: {requested} bytes requested, {available} available")]
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes the backend believed were free (0 when unknown).
        available: u64,
    },
    /// The device stopped working; the backend must be recreated.
    #[error("device lost: {device}")]
    DeviceLost {
        /// The device's name.
        device: String,
    },
    /// A caller error: an unknown id, a wrong size, a malformed graph or step arguments.
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// What was wrong, naming the argument.
        what: String,
    },
    /// A plugin panicked inside a call; the backend is unusable afterwards.
    #[error("backend panicked in {call}: {message}")]
    Panicked {
        /// The plugin function that panicked.
        call: String,
        /// The panic message.
        message: String,
    },
    /// A bug or an unexpected failure inside the backend.
    #[error("internal backend error: {message}")]
    Internal {
        /// What happened.
        message: String,
    },
}

impl BackendError {
    /// Shorthand for [`BackendError::InvalidArgument`].
    pub fn invalid(what: impl Into<String>) -> Self {
        BackendError::InvalidArgument { what: what.into() }
    }

    /// Shorthand for [`BackendError::Unsupported`].
    pub fn unsupported(op: impl Into<String>, reason: impl Into<String>) -> Self {
        BackendError::Unsupported {
            op: op.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`BackendError::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        BackendError::Internal {
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_round_trip_as_json() {
        let errs = [
            BackendError::Unavailable {
                reason: "no libvulkan.so.1".into(),
            },
            BackendError::unsupported("matmul(q2_k)", "not implemented"),
            BackendError::OutOfMemory {
                requested: 10,
                available: 3,
            },
            BackendError::DeviceLost {
                device: "gpu0".into(),
            },
            BackendError::invalid("buffer 7"),
            BackendError::Panicked {
                call: "execute".into(),
                message: "boom".into(),
            },
            BackendError::internal("x"),
        ];
        for e in errs {
            let s = serde_json::to_string(&e).unwrap();
            let back: BackendError = serde_json::from_str(&s).unwrap();
            assert_eq!(back, e);
        }
        assert_eq!(
            BackendError::OutOfMemory {
                requested: 10,
                available: 3
            }
            .to_string(),
            "out of memory: 10 bytes requested, 3 available"
        );
    }
}
