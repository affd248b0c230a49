//! A Hugging Face directory's `generation_config.json`: the sampling its authors chose, in
//! `transformers`' keys (`do_sample`, `temperature`, `top_k`, `top_p`, `min_p`,
//! `repetition_penalty`).
//!
//! Only those keys are read; every other key (`bos_token_id`, `eos_token_id`,
//! `transformers_version`, ...) is ignored, as `transformers` keeps unknown keys without
//! complaint. A key that is absent or `null` says nothing, and the caller keeps its own default
//! for it (`runtime::sampler::sampling_defaults`). A key of the wrong type or out of range is
//! an error naming the file and the key. GGUF files carry no sampling (llama.cpp's converter
//! writes no such metadata that tandem reads), so this is for Hugging Face directories only.

use std::path::Path;

use serde_json::{Map, Value};

use super::CheckpointError;

/// The file's name in a model directory.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// The sampling keys of a `generation_config.json`; `None` where the key is absent or `null`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenerationConfig {
    /// `do_sample`: `false` means greedy decoding (the other keys are then not used).
    pub do_sample: Option<bool>,
    /// `temperature`: `>= 0` and finite.
    pub temperature: Option<f32>,
    /// `top_k`: an integer `>= 0` (`0` turns it off).
    pub top_k: Option<usize>,
    /// `top_p`: in `(0, 1]`.
    pub top_p: Option<f32>,
    /// `min_p`: in `[0, 1)`.
    pub min_p: Option<f32>,
    /// `repetition_penalty`: `> 0` and finite.
    pub repetition_penalty: Option<f32>,
}

/// Reads `dir/generation_config.json`; `Ok(None)` when the directory has none.
pub fn read_generation_config(dir: &Path) -> Result<Option<GenerationConfig>, CheckpointError> {
    let path = dir.join(GENERATION_CONFIG_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(CheckpointError::Layout {
                path,
                message: format!("cannot read it: {e}"),
            })
        }
    };
    parse_generation_config(&text)
        .map(Some)
        .map_err(|message| CheckpointError::Layout { path, message })
}

/// Parses the text of a `generation_config.json`; the error names the key at fault.
pub fn parse_generation_config(text: &str) -> Result<GenerationConfig, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(obj) = doc else {
        return Err("not a JSON object".into());
    };
    let do_sample = match present(&obj, "do_sample") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => return Err(wrong("do_sample", "true or false", v)),
    };
    let top_k = match present(&obj, "top_k") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|k| usize::try_from(k).ok())
                .ok_or_else(|| wrong("top_k", "an integer >= 0 (0 turns it off)", v))?,
        ),
    };
    Ok(GenerationConfig {
        do_sample,
        temperature: number(&obj, "temperature", "a number >= 0", |t| t >= 0.0)?,
        top_k,
        top_p: number(&obj, "top_p", "a number in (0, 1]", |p| p > 0.0 && p <= 1.0)?,
        min_p: number(&obj, "min_p", "a number in [0, 1)", |p| (0.0..1.0).contains(&p))?,
        repetition_penalty: number(&obj, "repetition_penalty", "a number > 0", |r| r > 0.0)?,
    })
}

/// The value of `key`, unless absent or `null`.
fn present<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// The message for `key` holding `value` instead of `expected`.
fn wrong(key: &str, expected: &str, value: &Value) -> String {
    format!("`{key}` must be {expected}, got {value}")
}

/// A finite number at `key` that passes `ok`, if present.
fn number(
    obj: &Map<String, Value>,
    key: &str,
    expected: &str,
    ok: impl Fn(f32) -> bool,
) -> Result<Option<f32>, String> {
    let Some(v) = present(obj, key) else {
        return Ok(None);
    };
    match v.as_f64().map(|x| x as f32) {
        Some(x) if x.is_finite() && ok(x) => Ok(Some(x)),
        _ => Err(wrong(key, expected, v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_sampling_keys_and_ignores_the_others() {
        let g = parse_generation_config(
            r#"{"bos_token_id": 2, "do_sample": true, "eos_token_id": [1, 106],
                "temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": null,
                "repetition_penalty": 1.1, "transformers_version": "4.50.0", "cache_implementation": "hybrid"}"#,
        )
        .unwrap();
        assert_eq!(
            g,
            GenerationConfig {
                do_sample: Some(true),
                temperature: Some(0.7),
                top_k: Some(20),
                top_p: Some(0.8),
                min_p: None,
                repetition_penalty: Some(1.1),
            }
        );
        assert_eq!(
            parse_generation_config(r#"{"pad_token_id": 0}"#).unwrap(),
            GenerationConfig::default()
        );
    }

    #[test]
    fn a_bad_key_is_named() {
        for (text, key) in [
            (r#"{"top_k": "64"}"#, "`top_k`"),
            (r#"{"top_k": -1}"#, "`top_k`"),
            (r#"{"top_k": 1.5}"#, "`top_k`"),
            (r#"{"top_p": 1.5}"#, "`top_p`"),
            (r#"{"temperature": -1}"#, "`temperature`"),
            (r#"{"do_sample": "yes"}"#, "`do_sample`"),
            (r#"{"min_p": 1}"#, "`min_p`"),
            (r#"{"repetition_penalty": 0}"#, "`repetition_penalty`"),
        ] {
            let e = parse_generation_config(text).unwrap_err();
            assert!(e.contains(key), "{text}: {e}");
        }
        assert!(parse_generation_config("{").unwrap_err().contains("JSON"));
        assert!(parse_generation_config("[]").unwrap_err().contains("object"));
    }

    #[test]
    fn the_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_generation_config(dir.path()).unwrap(), None);
        std::fs::write(dir.path().join(GENERATION_CONFIG_FILE), r#"{"top_p": 2}"#).unwrap();
        let e = read_generation_config(dir.path()).unwrap_err().to_string();
        assert!(e.contains(GENERATION_CONFIG_FILE) && e.contains("`top_p`"), "{e}");
    }
}
