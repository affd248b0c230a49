//! Checkpoint files: what a model is stored as, and nothing about running it.
//!
//! - [`gguf`]: llama.cpp's format (reader, writer, and Gemma 3 as its converter stores it).
//! - [`safetensors`] and [`hf`]: Hugging Face model directories; [`config`]: their `config.json`;
//!   [`generation`]: their `generation_config.json` (the model's default sampling).
//! - [`source`]: the [`source::WeightSource`] trait the model loader reads weights through, under
//!   canonical tensor names, whatever the format.
//! - [`quantize`]: encoding f32 into ggml's block formats; [`synth`]: random-weight GGUF files
//!   of the real Gemma 3 shapes.
//! - [`tuning`]: whether the metadata says instruction-tuned, base, or no chat template.
//! - [`vision`]: Gemma 3's vision tower and projector in Hugging Face checkpoints (their config
//!   and tensors).

pub mod config;
pub mod error;
pub mod generation;
pub mod gguf;
pub mod hf;
mod pages;
pub mod quantize;
pub mod safetensors;
pub mod source;
pub mod synth;
pub mod tuning;
pub mod vision;

pub use error::CheckpointError;
