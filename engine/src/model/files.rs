//! Opening a model from what the user names: a GGUF file, a Hugging Face directory, or nothing
//! (the default model in the cache).

use std::path::{Path, PathBuf};

use super::error::ModelError;
use crate::checkpoint::config::Gemma3Config;
use crate::checkpoint::generation::{read_generation_config, GenerationConfig};
use crate::checkpoint::gguf::{gemma3_config, GgufFile, GgufWeights};
use crate::checkpoint::hf::open_hf_dir;
use crate::checkpoint::source::WeightSource;
use crate::checkpoint::tuning::{judge, Metadata, Verdict};
use crate::tokenizer::Tokenizer;

/// The default model's file name.
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";
/// Its size in bytes.
pub const DEFAULT_MODEL_SIZE: u64 = 253_113_024;
/// Its SHA-256.
pub const DEFAULT_MODEL_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
/// Overrides the cache directory.
pub const CACHE_DIR_VAR: &str = "TANDEM_CACHE_DIR";

/// Config, weights and tokenizer of a model.
pub struct ModelFiles {
    /// Hyper-parameters.
    pub config: Gemma3Config,
    /// The weights.
    pub weights: Box<dyn WeightSource>,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// Where it was loaded from.
    pub path: PathBuf,
    /// Whether the metadata says it is made for chat, and which key decided it.
    pub tuning: Verdict,
    /// Its `generation_config.json`, where a Hugging Face directory has one (a GGUF file carries
    /// none): the runtime's default sampling for it (`runtime::sampler::sampling_defaults`).
    pub generation: Option<GenerationConfig>,
    /// The vision tower found for it, where images were asked for (set by the load path).
    pub vision: Option<super::vision_source::VisionSource>,
}

/// tandem's cache directory: `$TANDEM_CACHE_DIR`, else `$XDG_CACHE_HOME/tandem`, else
/// `~/.cache/tandem`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(CACHE_DIR_VAR).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(d).join("tandem"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("tandem"))
}

/// Where the default model lives, or an error saying how to get it.
pub fn default_model() -> Result<PathBuf, ModelError> {
    let how = "run ./scripts/fetch-model.sh (or pass --model PATH)";
    let dir = cache_dir().ok_or_else(|| ModelError::Layout {
        path: PathBuf::from("$HOME"),
        message: format!("no cache directory: set {CACHE_DIR_VAR}, or {how}"),
    })?;
    let path = dir.join(DEFAULT_MODEL_FILE);
    let meta = std::fs::metadata(&path).map_err(|_| ModelError::Layout {
        path: path.clone(),
        message: format!("the default model is not there: {how}"),
    })?;
    if meta.len() != DEFAULT_MODEL_SIZE {
        return Err(ModelError::Layout {
            path,
            message: format!(
                "the default model has {} bytes, expected {DEFAULT_MODEL_SIZE} (incomplete or wrong file): {how}",
                meta.len()
            ),
        });
    }
    verify_checksum(&path, &meta, how)?;
    Ok(path)
}

/// Checks the default model's SHA-256 once; a stamp file beside it records the size and
/// modification time it was verified at, so later runs skip the 250 MB read.
fn verify_checksum(path: &Path, meta: &std::fs::Metadata, how: &str) -> Result<(), ModelError> {
    use sha2::Digest;
    use std::io::Read;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let stamp_text = format!("{DEFAULT_MODEL_SHA256} {} {mtime}\n", meta.len());
    let stamp = path.with_extension("gguf.verified");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == stamp_text) {
        return Ok(());
    }
    let io = |e: std::io::Error| ModelError::Layout {
        path: path.to_path_buf(),
        message: format!("cannot read: {e}"),
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let found: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if found != DEFAULT_MODEL_SHA256 {
        return Err(ModelError::Layout {
            path: path.to_path_buf(),
            message: format!("SHA-256 {found}, expected {DEFAULT_MODEL_SHA256}: delete the file and {how}"),
        });
    }
    // A stamp that cannot be written only costs a re-check next time.
    let _ = std::fs::write(&stamp, stamp_text);
    Ok(())
}

/// Opens `path` (a GGUF file or a Hugging Face directory), or the default model when `None`.
pub fn open_model(path: Option<&Path>) -> Result<ModelFiles, ModelError> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => default_model()?,
    };
    if path.is_dir() {
        let (config, weights) = open_hf_dir(&path)?;
        let tokenizer = Tokenizer::from_dir(&path)?;
        let tuning = judge_tokenizer(Metadata::HfDir(&path), &tokenizer);
        let generation = read_generation_config(&path)?;
        return Ok(ModelFiles {
            vision: None,
            config,
            weights: Box::new(weights),
            tokenizer,
            path,
            tuning,
            generation,
        });
    }
    if !path.exists() {
        return Err(ModelError::Layout {
            path,
            message: "no such file or directory".into(),
        });
    }
    if is_gguf(&path) {
        let file = GgufFile::open(&path)?;
        let config = gemma3_config(&file)?;
        let tokenizer = crate::tokenizer::gguf::from_gguf(&file)?;
        let tuning = judge_tokenizer(Metadata::Gguf(file.metadata()), &tokenizer);
        let weights = GgufWeights::new(file);
        // A GGUF file carries no generation config: tandem's defaults.
        return Ok(ModelFiles {
            vision: None,
            config,
            weights: Box::new(weights),
            tokenizer,
            path,
            tuning,
            generation: None,
        });
    }
    Err(ModelError::Layout {
        path,
        message: "not a model: expected a GGUF file or a Hugging Face model directory".into(),
    })
}

/// [`judge`] with what the tokenizer found: its chat template and `<end_of_turn>`.
fn judge_tokenizer(metadata: Metadata<'_>, tokenizer: &Tokenizer) -> Verdict {
    judge(
        metadata,
        tokenizer.chat_template().is_some(),
        tokenizer.token_id("<end_of_turn>"),
    )
}

/// Whether `path` starts with the GGUF magic.
fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(case: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/models")
            .join(case)
    }

    #[test]
    fn a_model_directory_carries_its_generation_config_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            std::fs::copy(fixture("text-published").join(f), dir.path().join(f)).unwrap();
        }
        let gen = dir.path().join("generation_config.json");
        std::fs::write(&gen, r#"{"do_sample": true, "top_k": 7, "top_p": 0.5}"#).unwrap();
        let files = open_model(Some(dir.path())).unwrap();
        let g = files.generation.expect("the directory's generation_config.json");
        assert_eq!((g.top_k, g.top_p), (Some(7), Some(0.5)));
        std::fs::write(&gen, r#"{"do_sample": true, "top_k": "seven"}"#).unwrap();
        let e = open_model(Some(dir.path()))
            .err()
            .expect("a bad top_k is an error")
            .to_string();
        assert!(
            e.contains("generation_config.json") && e.contains("`top_k`"),
            "{e}"
        );
    }
}
