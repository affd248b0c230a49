//! Where a model's weights come from: one interface over Hugging Face safetensors checkpoints and
//! GGUF files, speaking the engine's canonical tensor names (Hugging Face's, without the
//! `model.` prefix: `embed_tokens.weight`, `layers.3.self_attn.q_proj.weight`, ...).

use std::path::Path;

use tandem_backend_api::{DType, TensorDesc};

use crate::model::ModelError;
use crate::safetensors_ckpt::{SafetensorsCheckpoint, StDtype};

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
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>, ModelError>;
    /// What to add to every stored RMSNorm weight (Hugging Face stores `w`, GGUF `1 + w`).
    fn norm_offset(&self) -> f32;
    /// Total bytes of tensor data, for progress.
    fn total_bytes(&self) -> u64;
    /// The file or directory, for messages.
    fn location(&self) -> &Path;
}

/// The name prefixes of the text model's tensors in Hugging Face layouts.
const HF_PREFIXES: [&str; 3] = ["model.", "model.language_model.", "language_model.model."];

/// A Hugging Face safetensors checkpoint with its text-model prefix resolved.
pub struct HfWeights {
    ckpt: SafetensorsCheckpoint,
    prefix: &'static str,
}

impl HfWeights {
    /// Wraps a checkpoint, finding where the text model's tensors live.
    pub fn new(ckpt: SafetensorsCheckpoint) -> Result<Self, ModelError> {
        let prefix = HF_PREFIXES
            .into_iter()
            .find(|p| ckpt.contains(&format!("{p}embed_tokens.weight")))
            .ok_or_else(|| ModelError::Layout {
                path: ckpt.source().to_path_buf(),
                message: format!(
                    "missing tensor embed_tokens.weight (looked for {})",
                    HF_PREFIXES.map(|p| format!("{p}embed_tokens.weight")).join(", ")
                ),
            })?;
        Ok(HfWeights { ckpt, prefix })
    }
}

impl WeightSource for HfWeights {
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>, ModelError> {
        let t = self
            .ckpt
            .get_with_shape(&format!("{}{name}", self.prefix), shape)?;
        let dtype = match t.dtype {
            StDtype::F32 => DType::F32,
            StDtype::F16 => DType::F16,
            StDtype::BF16 => DType::Bf16,
        };
        Ok(StoredTensor {
            name: t.name.to_string(),
            file: t.file,
            desc: TensorDesc::new(dtype, shape.to_vec()),
            data: t.data,
        })
    }

    fn norm_offset(&self) -> f32 {
        1.0
    }

    fn total_bytes(&self) -> u64 {
        self.ckpt.total_bytes()
    }

    fn location(&self) -> &Path {
        self.ckpt.source()
    }
}
