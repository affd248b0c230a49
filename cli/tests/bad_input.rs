//! Damaged model directories and bad flags: the engine fails with exit status 1 and one
//! `error: ...` line that names the file and the tensor, field or value at fault; never a panic.
//!
//! Each case copies a working fixture (tests/fixtures/models) into a temporary directory, breaks
//! one thing, and runs `engine logits` (or `engine run`) on it.

mod common;

use std::path::Path;

use common::{fixture, Install};
use serde_json::{json, Value};

/// The layer-0 tensors the cases break; every fixture has them.
const DOWN_PROJ: &str = "model.layers.0.mlp.down_proj.weight";
const UP_PROJ: &str = "model.layers.0.mlp.up_proj.weight";
const K_PROJ: &str = "model.layers.0.self_attn.k_proj.weight";
const V_PROJ: &str = "model.layers.0.self_attn.v_proj.weight";

/// A writable copy of a fixture directory (its files are flat).
fn copy_fixture(case: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(fixture(case)).expect("fixture directory") {
        let entry = entry.expect("directory entry");
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).expect("copy fixture file");
    }
    dir
}

/// A safetensors file split into its JSON header and the data after it.
struct Safetensors {
    header: serde_json::Map<String, Value>,
    data: Vec<u8>,
}

impl Safetensors {
    fn read(path: &Path) -> Self {
        let bytes = std::fs::read(path).expect("read safetensors");
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = match serde_json::from_slice(&bytes[8..8 + n]).expect("header JSON") {
            Value::Object(map) => map,
            other => panic!("header is not an object: {other}"),
        };
        Safetensors {
            header,
            data: bytes[8 + n..].to_vec(),
        }
    }

    /// Writes the file back with a length prefix that matches the new header.
    fn write(&self, path: &Path) {
        let header = serde_json::to_vec(&self.header).expect("header JSON");
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(&self.data);
        std::fs::write(path, bytes).expect("write safetensors");
    }

    fn entry(&mut self, tensor: &str) -> &mut serde_json::Map<String, Value> {
        self.header
            .get_mut(tensor)
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("no tensor {tensor} in the header"))
    }

    fn offsets(&mut self, tensor: &str) -> (u64, u64) {
        let o = &self.entry(tensor)["data_offsets"];
        (o[0].as_u64().unwrap(), o[1].as_u64().unwrap())
    }
}

/// Reads, changes and rewrites a safetensors file in place.
fn rewrite(path: &Path, change: impl FnOnce(&mut Safetensors)) {
    let mut st = Safetensors::read(path);
    change(&mut st);
    st.write(path);
}

/// Reads, changes and rewrites `config.json` in place.
fn rewrite_config(dir: &Path, change: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    change(config.as_object_mut().expect("config object"));
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
}

/// Runs the engine, asserts a clean failure (exit status 1, exactly one non-empty `error:` line
/// on stderr, no panic) and returns that line.
fn fail(install: &Install, args: &[&str]) -> String {
    common::error_line(args, &install.run(args))
}

/// Runs `engine logits --tokens 2,5` on `dir` and returns the error line.
fn fail_logits(install: &Install, dir: &Path) -> String {
    fail(
        install,
        &[
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--tokens",
            "2,5",
            "--backend",
            "cpu",
            "--json",
        ],
    )
}

/// Asserts that the error line mentions every one of `names`.
fn assert_names(line: &str, names: &[&str]) {
    for n in names {
        assert!(line.contains(n), "error does not name {n:?}: {line}");
    }
}

#[test]
fn truncated_checkpoint_names_the_file_and_a_tensor() {
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-published");
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let cut = header_end + (bytes.len() - header_end) / 2;
    std::fs::write(&path, &bytes[..cut]).unwrap();

    let line = fail_logits(&install, dir.path());
    assert_names(&line, &[path.to_str().unwrap(), "truncated"]);
    assert!(
        line.contains("tensor model."),
        "error does not name a tensor: {line}"
    );
}

#[test]
fn data_offsets_past_the_end_name_the_file_and_tensor() {
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-published");
    let path = dir.path().join("model.safetensors");
    rewrite(&path, |st| {
        let data_len = st.data.len() as u64;
        let (begin, end) = st.offsets(V_PROJ);
        st.entry(V_PROJ)["data_offsets"] = json!([data_len + begin, data_len + end]);
    });

    let line = fail_logits(&install, dir.path());
    assert_names(&line, &[path.to_str().unwrap(), V_PROJ, "data_offsets"]);
}

#[test]
fn wrong_shape_names_the_tensor_and_both_shapes() {
    // [32, 64] -> [64, 32]: the same bytes, transposed dimensions. (q_proj is [64, 64] in this
    // fixture, so swapping its dimensions would change nothing.)
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-published");
    let path = dir.path().join("model.safetensors");
    rewrite(&path, |st| {
        assert_eq!(st.entry(K_PROJ)["shape"], json!([32, 64]));
        st.entry(K_PROJ)["shape"] = json!([64, 32]);
    });

    let line = fail_logits(&install, dir.path());
    assert_names(&line, &["model.safetensors", K_PROJ, "[64, 32]", "[32, 64]"]);
}

#[test]
fn unsupported_dtype_names_the_tensor_and_dtype() {
    // F32 -> I32: the same byte count, so the header stays self-consistent.
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-published");
    let path = dir.path().join("model.safetensors");
    rewrite(&path, |st| {
        assert_eq!(st.entry(UP_PROJ)["dtype"], json!("F32"));
        st.entry(UP_PROJ)["dtype"] = json!("I32");
    });

    let line = fail_logits(&install, dir.path());
    assert_names(&line, &["model.safetensors", UP_PROJ, "I32"]);
}

#[test]
fn dtype_whose_size_disagrees_with_the_data_names_the_tensor_and_dtype() {
    // F32 -> F16 without halving data_offsets: the header claims twice as many bytes as the
    // dtype and shape call for.
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-published");
    let path = dir.path().join("model.safetensors");
    rewrite(&path, |st| {
        st.entry(UP_PROJ)["dtype"] = json!("F16");
    });

    let line = fail_logits(&install, dir.path());
    assert_names(&line, &["model.safetensors", UP_PROJ, "F16"]);
}

#[test]
fn missing_tensor_is_named() {
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-published");
    let path = dir.path().join("model.safetensors");
    rewrite(&path, |st| {
        let entry = st.header.remove(DOWN_PROJ).expect("down_proj entry");
        st.header.insert(format!("{DOWN_PROJ}.renamed"), entry);
    });

    let line = fail_logits(&install, dir.path());
    assert_names(&line, &[&format!("{DOWN_PROJ} ")]);
    assert!(
        line.contains(dir.path().to_str().unwrap()),
        "error does not name the checkpoint: {line}"
    );
}

#[test]
fn mistyped_config_field_names_the_file_and_field() {
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-published");
    rewrite_config(dir.path(), |c| {
        c.insert("hidden_size".into(), json!("64"));
    });
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &["config.json", "hidden_size"]);
}

#[test]
fn missing_or_null_config_field_names_the_file_and_field() {
    let install = Install::new(&["cpu"]);

    // model_type is the one field without a default.
    let dir = copy_fixture("text-published");
    rewrite_config(dir.path(), |c| {
        c.remove("model_type").expect("model_type");
    });
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &["config.json", "model_type"]);

    let dir = copy_fixture("text-published");
    rewrite_config(dir.path(), |c| {
        c.insert("hidden_size".into(), Value::Null);
    });
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &["config.json", "hidden_size"]);
}

#[test]
fn missing_config_field_takes_the_default_and_the_checkpoint_disagrees() {
    // As in transformers, a missing num_hidden_layers means 26; the 6-layer checkpoint then
    // lacks layer 6.
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-published");
    rewrite_config(dir.path(), |c| {
        c.remove("num_hidden_layers").expect("num_hidden_layers");
    });
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &["model.layers.6.", "not in the checkpoint"]);
}

#[test]
fn heads_that_do_not_divide_name_both_fields() {
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-published");
    rewrite_config(dir.path(), |c| {
        c.insert("num_attention_heads".into(), json!(4));
        c.insert("num_key_value_heads".into(), json!(3));
    });
    let line = fail_logits(&install, dir.path());
    assert_names(
        &line,
        &["config.json", "num_attention_heads", "num_key_value_heads"],
    );
}

#[test]
fn another_architecture_names_model_type() {
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-published");
    rewrite_config(dir.path(), |c| {
        c.insert("model_type".into(), json!("llama"));
    });
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &["config.json", "model_type", "llama"]);
}

#[test]
fn token_outside_the_vocabulary_names_the_id_and_vocabulary_size() {
    let install = Install::new(&["cpu"]);
    let dir = fixture("text-published");
    let vocab = {
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let config: Value = serde_json::from_str(&text).unwrap();
        config["vocab_size"].as_u64().unwrap().to_string()
    };
    let line = fail(
        &install,
        &[
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--tokens",
            "2,99999",
            "--backend",
            "cpu",
            "--json",
        ],
    );
    assert_names(&line, &["99999", &vocab]);

    let line = fail(
        &install,
        &[
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--tokens",
            "2,99999",
            "--max-tokens",
            "2",
            "--temperature",
            "0",
            "--backend",
            "cpu",
            "--json",
        ],
    );
    assert_names(&line, &["99999", &vocab]);
}

#[test]
fn missing_shard_is_named() {
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-newer");
    let shard = "model-00002-of-00004.safetensors";
    std::fs::remove_file(dir.path().join(shard)).unwrap();
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &[shard, "model.safetensors.index.json"]);
}

#[test]
fn missing_directory_is_named() {
    let install = Install::new(&["cpu"]);
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("no-such-model");
    let line = fail_logits(&install, &dir);
    assert_names(&line, &[dir.to_str().unwrap()]);
}

#[test]
fn token_that_is_not_a_number_names_the_flag_and_value() {
    let install = Install::new(&["cpu"]);
    let dir = fixture("text-published");
    for command in ["logits", "run"] {
        let line = fail(
            &install,
            &[
                command,
                "--model",
                dir.to_str().unwrap(),
                "--tokens",
                "2,abc",
                "--backend",
                "cpu",
            ],
        );
        assert_names(&line, &["--tokens", "'abc'"]);
    }
}

#[test]
fn missing_or_damaged_files_are_named() {
    let install = Install::new(&["cpu"]);

    let dir = copy_fixture("text-published");
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &["config.json"]);

    let dir = copy_fixture("text-published");
    std::fs::write(
        dir.path().join("config.json"),
        "{\"model_type\": \"gemma3_text\",",
    )
    .unwrap();
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &["config.json", "JSON"]);

    // Without tokenizer.json token ids still run; text fails naming the file.
    let dir = copy_fixture("text-published");
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let model = dir.path().to_str().unwrap();
    let out = install.run(&[
        "logits",
        "--model",
        model,
        "--tokens",
        "2,5",
        "--backend",
        "cpu",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = fail(
        &install,
        &["run", "--model", model, "--prompt", "hi", "--backend", "cpu"],
    );
    assert_names(&line, &["tokenizer.json"]);

    let dir = copy_fixture("text-published");
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &["model.safetensors", dir.path().to_str().unwrap()]);

    let dir = copy_fixture("text-published");
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, [1u8, 2, 3, 4]).unwrap();
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &[path.to_str().unwrap()]);

    // A header length far past the end of the file.
    let dir = copy_fixture("text-published");
    let path = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &[path.to_str().unwrap(), "header"]);

    // A header that is not JSON.
    let dir = copy_fixture("text-published");
    let path = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = b'[';
    std::fs::write(&path, &bytes).unwrap();
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &[path.to_str().unwrap(), "JSON"]);
}

#[test]
fn index_that_misplaces_a_tensor_names_the_tensor_and_shard() {
    let install = Install::new(&["cpu"]);
    let dir = copy_fixture("text-newer");
    let index = dir.path().join("model.safetensors.index.json");
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    let wrong = "model-00001-of-00004.safetensors";
    assert_ne!(doc["weight_map"][DOWN_PROJ], json!(wrong));
    doc["weight_map"][DOWN_PROJ] = json!(wrong);
    std::fs::write(&index, doc.to_string()).unwrap();
    let line = fail_logits(&install, dir.path());
    assert_names(&line, &[DOWN_PROJ, wrong, "model.safetensors.index.json"]);
}

/// Careless flags get the range check's answer, naming a flag that exists: a negative number
/// is a value, not an unknown flag.
#[test]
fn careless_sampling_flags_reach_the_range_check_and_name_the_flag() {
    let install = Install::new(&["cpu"]);
    let dir = fixture("text-published");
    let model = dir.to_str().unwrap();
    for (flag, value, want) in [
        (
            "--temperature",
            "-1",
            "error: --temperature must be >= 0 and finite (0 is greedy), got -1",
        ),
        (
            "--repeat-penalty",
            "0",
            "error: --repeat-penalty must be > 0 and finite (1 turns it off), got 0",
        ),
        (
            "--top-p",
            "-0.5",
            "error: --top-p must be in (0, 1] (1 turns it off), got -0.5",
        ),
        (
            "--min-p",
            "1",
            "error: --min-p must be in [0, 1) (0 turns it off), got 1",
        ),
        (
            "--max-tokens",
            "0",
            "error: --max-tokens must be between 1 and the context",
        ),
    ] {
        let args = [
            "run",
            "--model",
            model,
            "--tokens",
            "2,5",
            "--backend",
            "cpu",
            flag,
            value,
        ];
        let line = fail(&install, &args);
        assert!(line.starts_with(want), "{flag} {value}: {line}");
    }
}

/// A typo in the config file, a table for a backend tandem does not have or a key its backend
/// does not read, is an error naming the file, line and key instead of a setting ignored.
#[test]
fn config_typos_name_the_file_line_and_key() {
    let install = Install::new(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tandem.toml");
    for (text, want) in [
        (
            "[backend.cpu]\nthread = 2\n",
            "line 2: backend.cpu.thread: not an option of cpu",
        ),
        (
            "[placement]\ndefault = [\"cpu\"]\n[backend.vulkn]\n",
            "line 3: [backend.vulkn]: no backend of that name",
        ),
    ] {
        std::fs::write(&config, text).unwrap();
        let line = fail(&install, &["--config", config.to_str().unwrap(), "backends"]);
        assert_names(&line, &[config.to_str().unwrap(), want, "did you mean"]);
    }
}

/// `engine run ... | head -c 10`: the reader leaves early, and the engine ends quietly.
#[test]
fn a_closed_stdout_ends_quietly() {
    let install = Install::new(&["cpu"]);
    let model = fixture("text-published");
    let mut child = std::process::Command::new(install.path().join("engine"))
        .args([
            "run",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "hello",
            "--max-tokens",
            "8",
        ])
        .args(["--temperature", "0", "--backend", "cpu"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("engine starts");
    // The reader is gone before the first token is written: every write fails with EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("engine ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(
        !stderr.contains("error") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

/// A text too short for one chunk names its token count, the chunk length it needs and the flag
/// that sets it.
#[test]
fn perplexity_on_a_text_shorter_than_a_chunk_suggests_ctx_size() {
    let install = Install::new(&["cpu"]);
    let dir = fixture("text-published");
    let text = "the cat sat on the mat";
    let n = tandem_engine::tokenizer::Tokenizer::from_dir(&dir)
        .unwrap()
        .encode(text, false)
        .unwrap()
        .len();
    assert!((4..64).contains(&n), "{n} tokens");
    let file = install.path().join("short.txt");
    std::fs::write(&file, text).unwrap();
    let args = [
        "perplexity",
        "--model",
        dir.to_str().unwrap(),
        "--file",
        file.to_str().unwrap(),
        "--ctx-size",
        "64",
        "--backend",
        "cpu",
    ];
    let line = fail(&install, &args);
    assert!(
        line.contains(&format!("{n} tokens")) && line.contains("64") && line.contains("--ctx-size"),
        "{line}"
    );
}

/// A KL-divergence reference that is not one, or was made over another --ctx-size, is an error
/// naming the file and what differs; both KL flags at once are refused.
#[test]
fn perplexity_refuses_a_wrong_kl_divergence_reference() {
    let install = Install::new(&["cpu"]);
    let dir = fixture("text-published");
    let file = install.path().join("text.txt");
    std::fs::write(
        &file,
        "the cat sat on the mat and the dog ran far away from the cat again",
    )
    .unwrap();
    let base = install.path().join("base.kld");
    let run = |ctx: &str, flag: &str, path: &std::path::Path| {
        vec![
            "perplexity".to_string(),
            "--model".into(),
            dir.to_str().unwrap().into(),
            "--file".into(),
            file.to_str().unwrap().into(),
            "--ctx-size".into(),
            ctx.into(),
            "--backend".into(),
            "cpu".into(),
            flag.into(),
            path.to_str().unwrap().into(),
        ]
    };
    let args = run("8", "--kl-divergence-base", &base);
    let out = install.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let args = run("16", "--kl-divergence", &base);
    let line = fail(&install, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        line.contains("base.kld") && line.contains("--ctx-size is 8, this run's 16"),
        "{line}"
    );
    let junk = install.path().join("junk.kld");
    std::fs::write(&junk, "not a reference").unwrap();
    let args = run("8", "--kl-divergence", &junk);
    let line = fail(&install, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        line.contains("junk.kld") && line.contains("not a KL-divergence reference"),
        "{line}"
    );
    let mut args = run("8", "--kl-divergence", &base);
    args.extend([
        "--kl-divergence-base".to_string(),
        junk.to_str().unwrap().to_string(),
    ]);
    let out = install.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}
