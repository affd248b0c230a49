//! Hugging Face model directories: `config.json` and safetensors weights (one file or shards),
//! the text model's tensors found under whichever prefix the checkpoint uses.

use std::path::Path;

use tandem_backend_api::{DType, TensorDesc};

use super::config::Gemma3Config;
use super::error::CheckpointError;
use super::safetensors::{SafetensorsCheckpoint, StDtype};
use super::source::{StoredTensor, WeightSource};

/// The name prefixes of the text model's tensors in Hugging Face layouts.
const HF_PREFIXES: [&str; 3] = ["model.", "model.language_model.", "language_model.model."];

/// A Hugging Face safetensors checkpoint with its text-model prefix resolved.
pub struct HfWeights {
    ckpt: SafetensorsCheckpoint,
    prefix: &'static str,
}

impl HfWeights {
    /// Wraps a checkpoint, finding where the text model's tensors live.
    pub fn new(ckpt: SafetensorsCheckpoint) -> Result<Self, CheckpointError> {
        let prefix = HF_PREFIXES
            .into_iter()
            .find(|p| ckpt.contains(&format!("{p}embed_tokens.weight")))
            .ok_or_else(|| CheckpointError::Layout {
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
    fn release(&self, data: &[u8]) {
        self.ckpt.release(data);
    }

    fn tensor(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>, CheckpointError> {
        stored(&self.ckpt, &format!("{}{name}", self.prefix), shape)
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

/// Tensor `full_name` of `ckpt`, checked to have `shape`, as a [`StoredTensor`].
pub(super) fn stored<'a>(
    ckpt: &'a SafetensorsCheckpoint,
    full_name: &str,
    shape: &[usize],
) -> Result<StoredTensor<'a>, CheckpointError> {
    let t = ckpt.get_with_shape(full_name, shape)?;
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

/// Opens a Hugging Face model directory's config and weights.
pub fn open_hf_dir(dir: &Path) -> Result<(Gemma3Config, HfWeights), CheckpointError> {
    if !dir.is_dir() {
        return Err(CheckpointError::Layout {
            path: dir.to_path_buf(),
            message: "not a model directory".into(),
        });
    }
    let config = Gemma3Config::from_file(&dir.join("config.json"))?;
    let ckpt = SafetensorsCheckpoint::open_dir(dir)?;
    Ok((config, HfWeights::new(ckpt)?))
}
