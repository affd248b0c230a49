//! The Gemma 3 model: opening its files ([`files`]: a GGUF file, a Hugging Face directory, or the
//! cached default model), uploading its weights to a backend and building its step graph
//! ([`gemma3`]). The graph names no backend: the backend runs whatever graph it is handed.

pub mod error;
pub mod files;
pub mod gemma3;

pub use error::ModelError;
pub use gemma3::{CacheShape, Gemma3Model, LayerWeights, LoadProgress, ModelTensor, Part, Region};
