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

/// What a front end (the CLI, a server) needs to load a model and generate, in one place: the
/// modules below stay reachable for the rest (bench, serve, chat templates, file formats).
pub use checkpoint::synth::{write_synthetic_gguf, write_synthetic_mmproj, SynthDtype, SynthShape};
pub use model::files::{open_model, DEFAULT_MODEL_FILE};
pub use runtime::environment::prepare_for_gpu_probes;
pub use runtime::load::{load, plan, KvCacheType, LoadError, Loaded, ModelOptions, Planned};
pub use runtime::notice::Notice;
pub use runtime::plugins::{report as backend_report, PluginSearch};
pub use runtime::sampler::SamplerConfig;
pub use runtime::sequence::{Event, EventSink, FinishReason, GenerationStats, Request, RequestError};
pub use runtime::session::{Logits, Session, SessionError, Step};
pub use runtime::settings::Settings;
pub use runtime::stepper::{generate, GenerateError};
pub use tokenizer::Tokenizer;

pub mod bench;
pub mod checkpoint;
pub mod model;
pub mod runtime;
pub mod serve;
pub mod tokenizer;
