//! Gemma 3 from a GGUF file as llama.cpp's converter writes it: hyper-parameters from the
//! `gemma3.*` metadata, tensors mapped from GGUF names (`blk.N.attn_q.weight`) onto the
//! engine's canonical names. (The SentencePiece tokenizer in `tokenizer.ggml.*` is read by
//! `crate::tokenizer::gguf`.)
//!
//! What the file leaves implicit, filled in as llama.cpp does: every 6th layer is global
//! (full attention), local layers use rope base 10 000 without scaling, the attention scale is
//! `head_dim^-0.5` (`(hidden / heads)^-0.5` for the 27B shape, whose `query_pre_attn_scalar`
//! differs), and norm weights are stored with the `+ 1` already applied.

use std::path::Path;

use tandem_backend_api::TensorDesc;

use super::reader::{GgufError, GgufFile};
use crate::checkpoint::config::{Gemma3Config, LayerType, RopeParams};
use crate::checkpoint::error::CheckpointError;
use crate::checkpoint::source::{StoredTensor, WeightSource};

/// The GGUF name of a canonical tensor name.
fn gguf_name(canonical: &str) -> Option<String> {
    match canonical {
        "embed_tokens.weight" => return Some("token_embd.weight".into()),
        "norm.weight" => return Some("output_norm.weight".into()),
        _ => {}
    }
    let rest = canonical.strip_prefix("layers.")?;
    let (layer, name) = rest.split_once('.')?;
    let mapped = match name {
        "self_attn.q_proj.weight" => "attn_q",
        "self_attn.k_proj.weight" => "attn_k",
        "self_attn.v_proj.weight" => "attn_v",
        "self_attn.o_proj.weight" => "attn_output",
        "self_attn.q_norm.weight" => "attn_q_norm",
        "self_attn.k_norm.weight" => "attn_k_norm",
        "input_layernorm.weight" => "attn_norm",
        "post_attention_layernorm.weight" => "post_attention_norm",
        "pre_feedforward_layernorm.weight" => "ffn_norm",
        "post_feedforward_layernorm.weight" => "post_ffw_norm",
        "mlp.gate_proj.weight" => "ffn_gate",
        "mlp.up_proj.weight" => "ffn_up",
        "mlp.down_proj.weight" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{mapped}.weight"))
}

/// A GGUF file's tensors under canonical names.
pub struct GgufWeights {
    file: GgufFile,
}

impl GgufWeights {
    /// Wraps an opened file.
    pub fn new(file: GgufFile) -> Self {
        GgufWeights { file }
    }

    /// The file.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }
}

impl WeightSource for GgufWeights {
    fn release(&self, data: &[u8]) {
        self.file.release(data);
    }

    fn tensor(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>, CheckpointError> {
        let gname = gguf_name(name).ok_or_else(|| CheckpointError::Layout {
            path: self.file.path().to_path_buf(),
            message: format!("no GGUF name for tensor {name}"),
        })?;
        let t = self.file.tensor(&gname)?;
        if t.desc.shape != shape {
            return Err(CheckpointError::Layout {
                path: self.file.path().to_path_buf(),
                message: format!("tensor {gname} has shape {:?}; expected {shape:?}", t.desc.shape),
            });
        }
        Ok(StoredTensor {
            name: gname,
            file: self.file.path(),
            desc: TensorDesc::new(t.desc.dtype, shape.to_vec()),
            data: t.bytes,
        })
    }

    fn norm_offset(&self) -> f32 {
        0.0
    }

    fn total_bytes(&self) -> u64 {
        self.file.tensors().iter().map(|t| t.byte_size() as u64).sum()
    }

    fn location(&self) -> &Path {
        self.file.path()
    }
}

fn invalid(file: &GgufFile, key: &str, message: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Layout {
        path: file.path().to_path_buf(),
        message: format!("metadata key `{key}`: {message}"),
    }
}

fn usize_key(file: &GgufFile, key: &str) -> Result<usize, CheckpointError> {
    let v = file.get_u32(key)? as usize;
    if v == 0 {
        return Err(invalid(file, key, "must be positive"));
    }
    Ok(v)
}

/// Gemma 3's hyper-parameters from GGUF metadata; `vocab_size` from the embedding's rows.
pub fn gemma3_config(file: &GgufFile) -> Result<Gemma3Config, CheckpointError> {
    let arch = file.get_str("general.architecture")?;
    if arch != "gemma3" {
        return Err(invalid(
            file,
            "general.architecture",
            format!("'{arch}' is another architecture; expected 'gemma3'"),
        ));
    }
    let k = |s: &str| format!("gemma3.{s}");
    let hidden = usize_key(file, &k("embedding_length"))?;
    let layers = usize_key(file, &k("block_count"))?;
    let heads = usize_key(file, &k("attention.head_count"))?;
    let kv_heads = usize_key(file, &k("attention.head_count_kv"))?;
    let head_dim = usize_key(file, &k("attention.key_length"))?;
    let value_dim = usize_key(file, &k("attention.value_length"))?;
    if value_dim != head_dim {
        return Err(invalid(
            file,
            &k("attention.value_length"),
            format!("{value_dim} differs from key_length {head_dim}"),
        ));
    }
    if heads % kv_heads != 0 {
        return Err(invalid(
            file,
            &k("attention.head_count"),
            format!("{heads} heads do not divide into {kv_heads} kv heads"),
        ));
    }
    let eps = file.get_f32(&k("attention.layer_norm_rms_epsilon"))?;
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(invalid(
            file,
            &k("attention.layer_norm_rms_epsilon"),
            format!("{eps} must be positive"),
        ));
    }
    let theta = match file.get(&k("rope.freq_base")) {
        Some(_) => file.get_f32(&k("rope.freq_base"))?,
        None => 1_000_000.0,
    };
    let factor = match file.get(&k("rope.scaling.type")) {
        None => 1.0,
        Some(_) => match file.get_str(&k("rope.scaling.type"))? {
            "none" => 1.0,
            "linear" => file.get_f32(&k("rope.scaling.factor"))?,
            other => {
                return Err(invalid(
                    file,
                    &k("rope.scaling.type"),
                    format!("'{other}' is not supported (linear only)"),
                ))
            }
        },
    };
    let embed = file
        .tensors()
        .iter()
        .find(|t| t.name() == "token_embd.weight")
        .ok_or_else(|| {
            CheckpointError::Gguf(GgufError::TensorNotFound {
                path: file.path().to_path_buf(),
                name: "token_embd.weight".into(),
            })
        })?;
    let vocab_size = embed.shape().first().copied().unwrap_or(0);
    // The 27B shape scales attention by (hidden / heads)^-0.5, the others by head_dim^-0.5.
    let query_pre_attn_scalar = if layers == 62 && hidden == 5376 {
        (hidden / heads) as f32
    } else {
        head_dim as f32
    };
    let layer_types = (0..layers)
        .map(|i| {
            if (i + 1) % 6 == 0 {
                LayerType::Full
            } else {
                LayerType::Sliding
            }
        })
        .collect();
    Ok(Gemma3Config {
        vocab_size,
        hidden_size: hidden,
        intermediate_size: usize_key(file, &k("feed_forward_length"))?,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        rms_norm_eps: eps,
        query_pre_attn_scalar,
        sliding_window: usize_key(file, &k("attention.sliding_window"))?,
        layer_types,
        rope_global: RopeParams { theta, factor },
        rope_local: RopeParams {
            theta: 10_000.0,
            factor: 1.0,
        },
        final_logit_softcapping: None,
        attn_logit_softcapping: None,
        max_position_embeddings: usize_key(file, &k("context_length"))?,
        bos_token_id: file.get_u32("tokenizer.ggml.bos_token_id").ok(),
        eos_token_ids: file
            .get_u32("tokenizer.ggml.eos_token_id")
            .ok()
            .into_iter()
            .collect(),
        pad_token_id: file.get_u32("tokenizer.ggml.padding_token_id").ok(),
        multimodal: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_onto_llama_cpp_names() {
        assert_eq!(
            gguf_name("embed_tokens.weight").as_deref(),
            Some("token_embd.weight")
        );
        assert_eq!(
            gguf_name("layers.17.mlp.down_proj.weight").as_deref(),
            Some("blk.17.ffn_down.weight")
        );
        assert_eq!(
            gguf_name("layers.0.pre_feedforward_layernorm.weight").as_deref(),
            Some("blk.0.ffn_norm.weight")
        );
        assert_eq!(
            gguf_name("layers.0.self_attn.q_norm.weight").as_deref(),
            Some("blk.0.attn_q_norm.weight")
        );
        assert_eq!(gguf_name("lm_head.weight"), None);
    }
}
