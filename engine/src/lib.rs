//! tandem's engine: checkpoints, the Gemma 3 step graph, placement, KV cache, sampling and
//! generation, all driven through `tandem_backend_api::ComputeBackend`.

pub mod bench_report;
pub mod chat;
pub mod config;
pub mod gguf;
pub mod gguf_model;
pub mod gguf_writer;
pub mod loader;
pub mod model;
pub mod plugins;
pub mod quantize;
pub mod safetensors_ckpt;
pub mod sampler;
pub mod session;
pub mod settings;
pub mod spm;
pub mod synth;
pub mod tokenizer;
pub mod weights;
