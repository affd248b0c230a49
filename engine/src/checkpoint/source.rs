//! Where a model's weights come from: one interface over Hugging Face safetensors checkpoints
//! (`HfWeights` in `hf.rs`) and GGUF files (`GgufWeights` in `gguf/gemma3.rs`), speaking the engine's
//! canonical tensor names (Hugging Face's, without the `model.` prefix: `embed_tokens.weight`,
//! `layers.3.self_attn.q_proj.weight`, ...).

use std::path::Path;

use tandem_backend_api::TensorDesc;

use super::error::CheckpointError;

/// One stored tensor, in its stored type, row-major.
#[derive(Debug, Clone)]
pub struct StoredTensor<'a> {
    /// Its name in the file.
    pub name: String,
    /// The file holding it.
    pub file: &'a Path,
    /// Storage type and row-major shape.
    pub desc: TensorDesc,
    /// The bytes, exactly `desc.byte_size()` of them.
    pub data: &'a [u8],
}

/// A checkpoint the model loader can read.
pub trait WeightSource {
    /// The tensor with canonical name `name`, checked to have `shape` (row-major).
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>, CheckpointError>;
    /// What to add to every stored RMSNorm weight (Hugging Face stores `w`, GGUF `1 + w`).
    fn norm_offset(&self) -> f32;
    /// Total bytes of tensor data, for progress.
    fn total_bytes(&self) -> u64;
    /// The file or directory, for messages.
    fn location(&self) -> &Path;
    /// Says that the caller has copied `data`, a tensor's bytes this source handed out, and will
    /// not read them again soon: a mapped source gives the pages back to the file, so a load
    /// holds each weight once. Reading the tensor again still works. The default does nothing.
    fn release(&self, data: &[u8]) {
        let _ = data;
    }
}
