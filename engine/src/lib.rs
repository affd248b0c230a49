//! tandem's engine: checkpoints, tokenizers, the Gemma 3 step graph, and the run time that puts it
//! on backends and generates, all driven through `tandem_backend_api::ComputeBackend`.
//!
//! The folders, from the bottom up (each uses only those above it):
//! - [`checkpoint`]: file formats (GGUF read and write, safetensors, `config.json`) and the
//!   `WeightSource` trait; quantizers and the synthetic-model writer.
//! - [`tokenizer`]: text <-> token ids (`tokenizer.json`, SentencePiece from GGUF) and chat
//!   templates.
//! - [`model`]: Gemma 3: opening a model's files, uploading its weights, its step graph.
//! - [`runtime`]: plugins, settings, the choice of backend (placement), sessions and sampling.
//! - [`bench`]: measuring a session's speed against the hardware's limits, and the reports.
//! - [`serve`]: many requests sharing one session (continuous batching), the metrics; the HTTP
//!   layer is in the CLI.

pub mod bench;
pub mod checkpoint;
pub mod model;
pub mod runtime;
pub mod serve;
pub mod tokenizer;
