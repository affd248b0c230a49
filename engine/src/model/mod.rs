//! The models: Gemma 3, opening its files ([`files`]: a GGUF file, a Hugging Face directory, or
//! the cached default model), uploading its weights to a backend and building its step graph
//! ([`gemma3`]); and what the runtime sees of any model ([`step_model`]: the [`StepModel`]
//! trait, whose step graph the split scheduler runs); and Gemma 3's vision tower and projector
//! ([`vision`]: an image's pixels to the soft tokens the language model reads). The graphs name
//! no backend: the backend runs whatever graph it is handed.

pub mod error;
pub mod files;
pub mod gemma3;
pub mod step_model;
pub mod vision;
pub mod vision_source;

pub use error::ModelError;
pub use gemma3::{Gemma3Model, LayerWeights, LoadProgress, ModelTensor};
pub use step_model::{CacheShape, ImageTable, Part, Region, StepModel};
