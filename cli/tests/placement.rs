//! Split placements end to end: `engine placement` (text and JSON) for `--backend cpu+cpu`,
//! `engine run` degrading from a missing backend with one note (or failing under `strict`), and
//! bad `--backend` values and `[placement]` configs failing cleanly with the flag, file, line or
//! op named. Only the CPU and NPU plugins are installed (the NPU one reports itself
//! unavailable everywhere), so every result is the same on every machine.

mod common;

use std::path::{Path, PathBuf};

use common::Install;
use serde_json::Value;

const FIXTURE: &str = "text-published";

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(FIXTURE)
}

fn model() -> String {
    fixture().to_str().expect("UTF-8 path").to_string()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Runs the engine and asserts success.
fn ok(install: &Install, args: &[&str]) -> std::process::Output {
    let out = install.run(args);
    assert!(
        out.status.success(),
        "engine {args:?}: {:?}\n{}",
        out.status,
        stderr(&out)
    );
    out
}

/// `engine placement --json` for `backend` (and `extra` flags).
fn placement_json(install: &Install, backend: &str, extra: &[&str]) -> Value {
    let model = model();
    let mut args = vec![
        "placement",
        "--backend",
        backend,
        "--model",
        &model,
        "--context",
        "64",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = ok(install, &args);
    serde_json::from_slice(&out.stdout).expect("placement JSON")
}

/// A config file in `dir` holding `text`.
fn config(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write config");
    p.to_str().expect("UTF-8 path").to_string()
}

/// The greedy reference prompt of the fixture, as `--tokens`.
fn prompt() -> String {
    let text = std::fs::read_to_string(fixture().join("reference.json")).expect("reference.json");
    let r: Value = serde_json::from_str(&text).expect("reference JSON");
    r["greedy"][0]["prompt"]
        .as_array()
        .expect("prompt ids")
        .iter()
        .map(|v| v.as_u64().expect("id").to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// `engine run --temperature 0 --max-tokens 4 --json` with `extra` flags: the generated ids.
fn run_tokens(install: &Install, extra: &[&str]) -> (Vec<u64>, String) {
    let (model, tokens) = (model(), prompt());
    let mut args = vec![
        "run",
        "--model",
        &model,
        "--tokens",
        &tokens,
        "--temperature",
        "0",
        "--max-tokens",
        "4",
        "--context",
        "64",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = ok(install, &args);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("run JSON");
    let ids = doc["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|v| v.as_u64().expect("id"))
        .collect();
    (ids, stderr(&out))
}

#[test]
fn placement_text_names_both_cpu_instances() {
    let install = Install::new(&["cpu", "npu"]);
    let model = model();
    let args = [
        "placement",
        "--backend",
        "cpu+cpu",
        "--model",
        &model,
        "--context",
        "64",
    ];
    let out = ok(&install, &args);
    assert_eq!(stderr(&out), "", "engine placement prints no notice here");
    let mut text = install.stdout(&out);
    assert!(text.contains("memory: needs "), "{text}");
    assert!(
        text.starts_with(
            "placement from --backend cpu+cpu: attention on cpu#2, ffn on cpu, default on cpu\n"
        ),
        "{text}"
    );
    // The CPU's device name names the host's architecture and OS: replaced, as the only
    // machine-dependent text.
    let json = placement_json(&install, "cpu+cpu", &[]);
    for u in json["units"].as_array().expect("units") {
        let device = u["device"].as_str().expect("an available unit's device");
        assert!(!device.is_empty());
        text = text.replace(device, "[CPU DEVICE]");
    }
    // The budget is the host's memory: machine-dependent too.
    let mut redacted = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("its budget of ") {
        let start = at + "its budget of ".len();
        let end = rest[start..].find('\n').map_or(rest.len(), |e| start + e);
        redacted.push_str(&rest[..start]);
        redacted.push_str("[HOST MEMORY]");
        rest = &rest[end..];
    }
    redacted.push_str(rest);
    // The process's own memory is measured: redacted, its presence kept.
    let text: String = redacted
        .lines()
        .map(|l| {
            if l.starts_with("host memory: peak about ") {
                "host memory: [MEASURED]".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    assert!(
        text.contains("\n  cpu#2      [CPU DEVICE]: 42 prefill / 42 decode nodes"),
        "{text}"
    );
    assert!(
        text.contains("\n  cpu        [CPU DEVICE]: 59 prefill / 59 decode nodes"),
        "{text}"
    );
    insta::assert_snapshot!(text);
}

#[test]
fn placement_json_places_every_node_in_both_phases() {
    let install = Install::new(&["cpu", "npu"]);
    let split = placement_json(&install, "cpu+cpu", &[]);
    let units: Vec<&str> = split["units"]
        .as_array()
        .expect("units")
        .iter()
        .map(|u| u["name"].as_str().expect("unit name"))
        .collect();
    assert_eq!(units, ["cpu#2", "cpu"]);
    let nodes = split["nodes"].as_array().expect("nodes");
    assert!(nodes.len() > 10, "{} nodes", nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n["index"], i, "{n}");
        assert!(n["op"].as_str().is_some_and(|o| !o.is_empty()), "{n}");
        let part = n["part"].as_str().expect("part");
        for phase in ["prefill", "decode"] {
            let unit = n[phase]["unit"]
                .as_str()
                .unwrap_or_else(|| panic!("node {i} has no {phase} unit: {n}"));
            // A+B: attention on A (here the second instance), everything else on B.
            let want = if part == "attention" { "cpu#2" } else { "cpu" };
            assert_eq!(unit, want, "node {i} ({part}) in {phase}: {n}");
            assert_eq!(n[phase]["why"], "", "node {i}: its first choice");
        }
    }
    assert!(nodes.iter().any(|n| n["part"] == "attention"));
    let decode = split["decode_bytes_per_token"].as_u64().expect("decode bytes");
    assert!(decode > 0, "{split}");
    assert!(split["prefill_bytes_per_token"].as_f64().expect("prefill bytes") > 0.0);
    assert_eq!(split["kv_handoff_bytes_per_token"], 0);
    assert_eq!(split["shared_weights"], serde_json::json!([]));

    // The same model on one backend: nothing crosses, and the split holds each weight once.
    let whole = placement_json(&install, "cpu", &[]);
    assert_eq!(whole["decode_bytes_per_token"], 0);
    assert_eq!(whole["programs_per_step"], serde_json::json!([1, 1]));
    let weights = |doc: &Value| -> u64 {
        doc["units"]
            .as_array()
            .expect("units")
            .iter()
            .map(|u| u["weight_bytes"].as_u64().expect("weight bytes"))
            .sum()
    };
    assert_eq!(weights(&split), weights(&whole));
    assert!(weights(&whole) > 0);
}

#[test]
fn a_missing_backend_degrades_with_one_note() {
    let install = Install::new(&["cpu", "npu"]);
    let (split, err) = run_tokens(&install, &["--backend", "npu+cpu"]);
    let mentions: Vec<&str> = err.lines().filter(|l| l.contains("npu is unavailable")).collect();
    assert_eq!(mentions.len(), 1, "stderr:\n{err}");
    assert!(
        mentions[0].starts_with("note: ") && mentions[0].contains("runs on cpu"),
        "{}",
        mentions[0]
    );
    assert!(!err.contains("panicked"), "{err}");
    let (whole, _) = run_tokens(&install, &["--backend", "cpu"]);
    assert_eq!(whole.len(), 4);
    assert_eq!(split, whole, "npu+cpu against cpu");
}

#[test]
fn a_strict_missing_backend_is_an_error() {
    let install = Install::new(&["cpu", "npu"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = config(dir.path(), "tandem.toml", "[backend.npu]\nstrict = true\n");
    let (model, tokens) = (model(), prompt());
    for command in ["run", "placement"] {
        let mut args = vec![
            "--config",
            &cfg,
            command,
            "--backend",
            "npu+cpu",
            "--model",
            &model,
        ];
        if command == "run" {
            args.extend_from_slice(&["--tokens", &tokens, "--max-tokens", "4"]);
        }
        let line = common::error_line(&args, &install.run(&args));
        assert!(
            line.contains("strict") && line.contains("npu") && line.contains("[backend.npu]"),
            "{line}"
        );
    }
}

/// Asserts `args` fail cleanly through both `engine run` and `engine placement`, with an error
/// line naming every one of `names`.
fn assert_fails(install: &Install, config: Option<&str>, backend: &str, names: &[&str]) {
    let (model, tokens) = (model(), prompt());
    for command in ["run", "placement"] {
        let mut args: Vec<&str> = Vec::new();
        if let Some(c) = config {
            args.extend_from_slice(&["--config", c]);
        }
        args.extend_from_slice(&[command, "--model", &model, "--backend"]);
        // `backend` may carry more flags after the name (`cpu --gpu-layers 2`).
        args.extend(backend.split(' '));
        if command == "run" {
            args.extend_from_slice(&["--tokens", &tokens, "--max-tokens", "1"]);
        }
        let line = common::error_line(&args, &install.run(&args));
        for n in names {
            assert!(
                line.contains(n),
                "engine {args:?}: the error does not name {n:?}: {line}"
            );
        }
    }
}

#[test]
fn bad_backend_flags_are_clean_errors() {
    let install = Install::new(&["cpu", "npu"]);
    for bad in ["a+b+c", "cpu+", "+cpu", "cpu+cpu+cpu"] {
        assert_fails(
            &install,
            None,
            bad,
            &[&format!("--backend {bad}:"), "expected one backend"],
        );
    }
    for bad in ["nosuch", "nosuch+cpu", "cpu+nosuch"] {
        assert_fails(
            &install,
            None,
            bad,
            &[&format!("--backend {bad}"), "unknown backend 'nosuch'", "cpu"],
        );
    }
}

#[test]
fn bad_placement_configs_are_clean_errors() {
    let install = Install::new(&["cpu", "npu"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let cases: [(&str, &[&str]); 4] = [
        ("[placement]\nattention = []\n", &["line 2", "empty list"]),
        ("[placement]\nattn = [\"cpu\"]\n", &["line 2", "attn"]),
        // The line is named, and what was expected (the key is on that line).
        ("[placement]\nffn = \"cpu\"\n", &["line 2", "expected a sequence"]),
        (
            "[placement.decode]\n\nffn = [\"cpu\"]\nattention = []\n",
            &["line 4", "empty list"],
        ),
    ];
    for (i, (text, names)) in cases.into_iter().enumerate() {
        let cfg = config(dir.path(), &format!("bad{i}.toml"), text);
        let mut names = names.to_vec();
        names.push(&cfg);
        assert_fails(&install, Some(&cfg), "auto", &names);
    }
}

#[test]
fn attention_nowhere_available_names_the_op_and_the_reason() {
    let install = Install::new(&["cpu", "npu"]);
    // The first attention node of the step graph, as the whole-model placement lists it.
    let whole = placement_json(&install, "cpu", &[]);
    let first = whole["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["part"] == "attention")
        .expect("an attention node")
        .clone();
    let node = format!(
        "node {} ({}, attention part",
        first["index"],
        first["op"].as_str().expect("op")
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = config(dir.path(), "tandem.toml", "[placement]\nattention = [\"npu\"]\n");
    assert_fails(
        &install,
        Some(&cfg),
        "auto",
        &["no backend can run", &node, "npu: ", "unavailable"],
    );
}

/// `[placement.layers]` runs whole layers per unit: the same greedy ids as one CPU, a note
/// naming the layers, and `engine placement` saying what runs where.
#[test]
fn layer_ranges_run_and_are_reported() {
    let install = Install::new(&["cpu", "npu"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = config(
        dir.path(),
        "layers.toml",
        "[placement.layers]\ncpu = \"0-2\"\n\"cpu#2\" = \"3-5\"\n",
    );
    let (want, _) = run_tokens(&install, &["--backend", "cpu"]);
    let (got, err) = run_tokens(&install, &["--config", &cfg]);
    assert_eq!(got, want, "layer split against one CPU");
    assert!(
        err.contains(
            "note: placement (the config's [placement]): cpu: layers 0-2, embedding, head; cpu#2: layers 3-5"
        ),
        "{err}"
    );
    let model = model();
    let out = ok(
        &install,
        &[
            "--config",
            &cfg,
            "placement",
            "--model",
            &model,
            "--context",
            "64",
        ],
    );
    let text = install.stdout(&out);
    assert!(
        text.contains("\nlayers: cpu: layers 0-2, embedding, head; cpu#2: layers 3-5\n"),
        "{text}"
    );
    assert!(text.contains("programs per step: 3 prefill, 3 decode"), "{text}");
}

/// Layer rules and budgets that cannot be met fail before loading, naming the flag or key.
#[test]
fn bad_layer_rules_and_budgets_are_clean_errors() {
    let install = Install::new(&["cpu", "npu"]);
    let dir = tempfile::tempdir().expect("temp dir");
    assert_fails(
        &install,
        None,
        "cpu --gpu-layers 2",
        &["--gpu-layers 2", "GPU backend"],
    );
    // `auto` notes here that it passes over the GPU backends (not installed): the budget case
    // names the CPU, to keep to one line on stderr.
    let cases: [(&str, &str, &[&str]); 4] = [
        (
            "auto",
            "[placement.layers]\ncpu = \"0-9\"\n",
            &["cpu = \"0-9\"", "layers 0-5"],
        ),
        (
            "auto",
            "[placement.layers]\ncpu = \"0-3\"\n",
            &["layers 4-5 are on no unit"],
        ),
        (
            "auto",
            "[placement.layers]\ncpu = \"two\"\n",
            &["placement.layers.cpu", "'two'"],
        ),
        (
            "cpu",
            "[backend.cpu]\nmemory_limit = \"64KiB\"\n",
            &[
                "does not fit cpu",
                "memory_limit = \"64KiB\"",
                "64.0 KiB",
                "weights",
            ],
        ),
    ];
    for (i, (backend, text, names)) in cases.into_iter().enumerate() {
        let cfg = config(dir.path(), &format!("bad{i}.toml"), text);
        assert_fails(&install, Some(&cfg), backend, names);
    }
}
