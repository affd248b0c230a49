//! Why a model could not be loaded onto a backend.

use std::path::PathBuf;

use tandem_backend_api::BackendError;

use crate::checkpoint::config::ConfigError;
use crate::checkpoint::gguf::GgufError;
use crate::checkpoint::safetensors::SafetensorsError;
use crate::checkpoint::CheckpointError;
use crate::tokenizer::TokenizerError;

/// Why a model could not be loaded; every message names the file and the tensor or field.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The checkpoint (config, weights) is unusable.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The tokenizer files are unusable.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The path does not hold the model (missing, incomplete, not a model).
    #[error("{path}: {message}")]
    Layout {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The backend refused (allocation, upload, compile).
    #[error("{context}: {error}")]
    Backend {
        /// What was being done.
        context: String,
        /// The backend's error.
        error: BackendError,
    },
}

impl From<ConfigError> for ModelError {
    fn from(e: ConfigError) -> Self {
        ModelError::Checkpoint(e.into())
    }
}

impl From<SafetensorsError> for ModelError {
    fn from(e: SafetensorsError) -> Self {
        ModelError::Checkpoint(e.into())
    }
}

impl From<GgufError> for ModelError {
    fn from(e: GgufError) -> Self {
        ModelError::Checkpoint(e.into())
    }
}
