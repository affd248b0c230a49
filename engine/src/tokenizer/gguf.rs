//! The SentencePiece tokenizer that GGUF metadata describes (`tokenizer.ggml.*`, as llama.cpp's
//! converter writes it), with the chat template the file carries.

use super::spm::{SpmTokenizer, SpmVocab};
use super::{Tokenizer, TokenizerError};
use crate::checkpoint::gguf::GgufFile;

/// The tokenizer GGUF metadata describes (`tokenizer.ggml.model = "llama"`).
pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
    let model = file.get_str("tokenizer.ggml.model")?;
    if model != "llama" {
        return Err(TokenizerError::GgufMetadata {
            path: file.path().to_path_buf(),
            message: format!("metadata key `tokenizer.ggml.model`: '{model}' is not supported (SentencePiece 'llama' only)"),
        });
    }
    let opt_u32 = |key: &str| file.get(key).map(|_| file.get_u32(key)).transpose();
    let opt_bool = |key: &str, default: bool| {
        file.get(key)
            .map(|_| file.get_bool(key))
            .transpose()
            .map(|v| v.unwrap_or(default))
    };
    let vocab = SpmVocab {
        tokens: file.get_str_array("tokenizer.ggml.tokens")?.to_vec(),
        scores: file.get_f32_array("tokenizer.ggml.scores")?.to_vec(),
        types: file.get_i32_array("tokenizer.ggml.token_type")?.to_vec(),
        bos: opt_u32("tokenizer.ggml.bos_token_id")?,
        eos: opt_u32("tokenizer.ggml.eos_token_id")?,
        unk: opt_u32("tokenizer.ggml.unknown_token_id")?,
        add_bos: opt_bool("tokenizer.ggml.add_bos_token", true)?,
        add_space_prefix: opt_bool("tokenizer.ggml.add_space_prefix", false)?,
    };
    let spm = SpmTokenizer::new(vocab).map_err(|e| TokenizerError::GgufMetadata {
        path: file.path().to_path_buf(),
        message: format!("tokenizer.ggml.*: {e}"),
    })?;
    let template = match file.get("tokenizer.chat_template") {
        Some(_) => Some(file.get_str("tokenizer.chat_template")?.to_string()),
        None => None,
    };
    Ok(Tokenizer::from_spm(spm, template))
}
