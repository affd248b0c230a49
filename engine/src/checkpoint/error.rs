//! Why a checkpoint could not be read as a Gemma 3 model: one error over the formats, each
//! message naming the file and the tensor, field or metadata key.

use std::path::PathBuf;

use super::config::ConfigError;
use super::gguf::GgufError;
use super::safetensors::SafetensorsError;

/// Why a checkpoint's config or weights are unusable.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// config.json is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A safetensors file is unusable.
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    /// A GGUF file is unusable.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The files do not hold what a Gemma 3 model needs (a tensor, a shape, a metadata key).
    #[error("{path}: {message}")]
    Layout {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}
