//! Damaged and wrong GGUF files: `engine run` fails with exit status 1 and one `error: ...` line
//! that names the file, the key or tensor at fault and what was expected; never a panic.
//!
//! The files are `engine/tests/data/gguf/tiny.gguf` with bytes patched, or written by the small
//! GGUF writer below. The last case puts a file of the wrong size where the default model belongs
//! (in a cache directory named by `TANDEM_CACHE_DIR`) and runs without `--model`; a file of the
//! right size with the wrong bytes is `default_model.rs`'s.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{error_line, Install};
use tandem_engine::model::files::{CACHE_DIR_VAR, DEFAULT_MODEL_FILE, DEFAULT_MODEL_SIZE};

fn tiny_gguf() -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data/gguf/tiny.gguf");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// A minimal GGUF writer: version 3, alignment 32, string and u32 metadata, tensors of any type id.

/// A metadata value.
enum Meta {
    Str(&'static str),
    U32(u32),
}

/// A tensor: name, dimensions innermost first, ggml type id and data.
struct Tensor {
    name: &'static str,
    dims: Vec<u64>,
    type_id: u32,
    data: Vec<u8>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn pad(out: &mut Vec<u8>) {
    out.resize(out.len().next_multiple_of(32), 0);
}

fn gguf(metadata: &[(&str, Meta)], tensors: &[Tensor]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_str(&mut out, key);
        match value {
            Meta::Str(s) => {
                out.extend_from_slice(&8u32.to_le_bytes());
                put_str(&mut out, s);
            }
            Meta::U32(v) => {
                out.extend_from_slice(&4u32.to_le_bytes());
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    let mut data = Vec::new();
    for t in tensors {
        pad(&mut data);
        put_str(&mut out, t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.type_id.to_le_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        data.extend_from_slice(&t.data);
    }
    pad(&mut out);
    out.extend_from_slice(&data);
    out
}

/// An f32 embedding of 4 rows of 2: enough for the file to parse.
fn embedding(type_id: u32) -> Tensor {
    Tensor {
        name: "token_embd.weight",
        dims: vec![2, 4],
        type_id,
        data: vec![0; 32],
    }
}

// ---------------------------------------------------------------------------------------------
// Running the engine.

/// Runs the installed engine with `args` and extra environment variables.
fn run_with_env(install: &Install, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = install.command();
    cmd.args(args);
    for (key, value) in env {
        cmd.env(key, value);
    }
    cmd.output().expect("engine runs")
}

/// Writes `bytes` to `name` in a fresh directory, runs `engine run` on it and returns the
/// error line, checked to name the file.
fn fail_on(name: &str, bytes: &[u8]) -> String {
    let install = Install::new(&["cpu"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).expect("write GGUF");
    let model = path.to_str().expect("UTF-8 path");
    let args = ["run", "--model", model, "--prompt", "hi", "--backend", "cpu"];
    let line = error_line(&args, &run_with_env(&install, &args, &[]));
    assert!(
        line.contains(model),
        "error does not name the file {model}: {line}"
    );
    line
}

/// Asserts that the error line mentions every one of `parts`.
fn assert_says(line: &str, parts: &[&str]) {
    for p in parts {
        assert!(line.contains(p), "error does not say {p:?}: {line}");
    }
}

// ---------------------------------------------------------------------------------------------
// The cases.

#[test]
fn bad_magic_says_a_gguf_file_was_expected() {
    let mut bytes = tiny_gguf();
    bytes[..4].copy_from_slice(b"GGUX");
    let line = fail_on("bad-magic.gguf", &bytes);
    assert_says(&line, &["not a model", "expected a GGUF file"]);
}

#[test]
fn unknown_version_names_it_and_the_versions_read() {
    let mut bytes = tiny_gguf();
    bytes[4..8].copy_from_slice(&9u32.to_le_bytes());
    let line = fail_on("version-9.gguf", &bytes);
    assert_says(&line, &["has version 9; expected 2 or 3"]);
}

#[test]
fn file_truncated_in_the_metadata_names_the_key() {
    // Cut inside the last of the four strings of `tokenizer.ggml.tokens` (13 bytes each), late
    // enough that the tensor, metadata and element counts still fit in what is left.
    let bytes = tiny_gguf();
    let key = b"tokenizer.ggml.tokens";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("tiny.gguf has tokenizer.ggml.tokens");
    // The key, the value type, the element type, the length, then into the elements.
    let cut = at + key.len() + 4 + 4 + 8 + 3 * 13 + 6;
    let line = fail_on("truncated.gguf", &bytes[..cut]);
    assert_says(
        &line,
        &[
            "ends inside the value of metadata key `tokenizer.ggml.tokens`",
            &format!("the file is {cut} bytes long (truncated or corrupt)"),
        ],
    );
}

#[test]
fn file_truncated_in_the_data_names_the_tensor() {
    let bytes = tiny_gguf();
    let line = fail_on("truncated.gguf", &bytes[..bytes.len() - 100]);
    assert_says(
        &line,
        &["tensor `", "past the end of the file", "truncated or corrupt"],
    );
}

#[test]
fn unknown_ggml_type_names_the_tensor_and_the_types_read() {
    let bytes = gguf(&[("general.architecture", Meta::Str("gemma3"))], &[embedding(99)]);
    let line = fail_on("unknown-type.gguf", &bytes);
    assert_says(
        &line,
        &[
            "tensor `token_embd.weight` has ggml type id 99",
            "tandem reads f32 (0)",
        ],
    );
}

#[test]
fn tensor_count_that_cannot_fit_is_refused() {
    let mut bytes = gguf(&[("general.architecture", Meta::Str("gemma3"))], &[embedding(0)]);
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let line = fail_on("tensor-count.gguf", &bytes);
    assert_says(
        &line,
        &[
            "declares 18446744073709551615 tensor infos, which cannot fit",
            "bytes left",
        ],
    );
}

#[test]
fn string_length_past_the_end_names_the_key() {
    let mut bytes = gguf(&[("general.architecture", Meta::Str("gemma3"))], &[embedding(0)]);
    // Header (24), key length (8), key, value type (4), then the string's length.
    let at = 24 + 8 + "general.architecture".len() + 4;
    assert_eq!(bytes[at..at + 8], 6u64.to_le_bytes());
    bytes[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let line = fail_on("string-length.gguf", &bytes);
    assert_says(
        &line,
        &[
            "ends inside the value of metadata key `general.architecture`",
            "1099511627776 bytes needed",
        ],
    );
}

#[test]
fn another_architecture_names_it_and_gemma3() {
    let bytes = gguf(
        &[
            ("general.architecture", Meta::Str("llama")),
            ("llama.block_count", Meta::U32(2)),
        ],
        &[embedding(0)],
    );
    let line = fail_on("llama.gguf", &bytes);
    assert_says(
        &line,
        &[
            "`general.architecture`",
            "'llama' is another architecture; expected 'gemma3'",
        ],
    );
}

#[test]
fn wrong_default_model_names_the_file_and_the_size_expected() {
    let install = Install::new(&["cpu"]);
    let cache = tempfile::tempdir().expect("temp dir");
    let model = cache.path().join(DEFAULT_MODEL_FILE);
    std::fs::write(&model, tiny_gguf()).expect("write the wrong default model");
    let args = ["run", "--prompt", "hi", "--backend", "cpu"];
    let out = run_with_env(&install, &args, &[(CACHE_DIR_VAR, cache.path())]);
    let line = error_line(&args, &out);
    let size = tiny_gguf().len().to_string();
    assert_says(
        &line,
        &[
            model.to_str().expect("UTF-8 path"),
            &format!("has {size} bytes, expected {DEFAULT_MODEL_SIZE}"),
            "fetch-model.sh",
        ],
    );
}
