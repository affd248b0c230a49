//! Speculative decoding from the command line (docs/speculative.md): `engine run --draft ngram`
//! and `--draft-model` give the tokens `engine run` gives without them and say what speculation
//! did; `engine serve --draft ngram` answers a lone request with those tokens too; a draft of
//! another vocabulary, or a bad depth, is refused naming the flag and both sizes.

mod common;
mod http;

use common::{fixture, ids, text_published, Install};
use http::{post, Server};
use serde_json::{json, Value};

/// A prompt that repeats itself, so that lookup finds continuations.
const TOKENS: &str = "2,40,41,42,43,44,45,46,40,41,42,43,44,45,46,40,41,42";

fn run(install: &Install, extra: &[&str]) -> Value {
    let model = text_published();
    let mut args = vec![
        "run",
        "--model",
        &model,
        "--backend",
        "cpu",
        "--tokens",
        TOKENS,
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = install.run(&args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("run --json")
}

#[test]
fn run_and_serve_speculate_to_the_plain_tokens() {
    let install = Install::new(&["cpu"]);
    let plain = run(&install, &[]);
    assert!(plain["speculation"].is_null());
    let want = ids(&plain["tokens"]);
    let ngram = run(&install, &["--draft", "ngram"]);
    assert_eq!(ids(&ngram["tokens"]), want);
    let s = &ngram["speculation"];
    assert_eq!(s["drafter"], "ngram (2..4-grams)", "{s}");
    assert!(s["target_steps"].as_u64() > Some(0), "{s}");
    // Another fixture of the same vocabulary drafts: rejections, the same tokens.
    let draft = fixture("text-newer");
    let draft = draft.to_string_lossy();
    let model = run(
        &install,
        &["--draft-model", &draft, "--draft-tokens", "3", "--draft-fixed"],
    );
    assert_eq!(ids(&model["tokens"]), want);
    let s = &model["speculation"];
    assert!(s["drafted"].as_u64() > Some(0), "{s}");
    assert_eq!(s["overlap"], false, "the draft shares the target's CPU: {s}");

    let m = text_published();
    let server = Server::start(
        &install.path().join("engine"),
        &[
            "--model",
            &m,
            "--backend",
            "cpu",
            "--parallel",
            "1",
            "--draft",
            "ngram",
        ],
    );
    let prompt: Vec<u32> = TOKENS.split(',').map(|t| t.parse().unwrap()).collect();
    let r = post(
        &server.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 24, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let doc = r.json();
    let text = doc["choices"][0]["text"].as_str().expect("text");
    assert_eq!(text, plain["text"].as_str().expect("run's text"), "{doc}");
}

#[test]
fn a_draft_of_another_vocabulary_or_depth_is_refused() {
    let install = Install::new(&["cpu"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let other = dir.path().join("tiny.gguf");
    let other_s = other.to_string_lossy().into_owned();
    let out = install.run(&["synth", "--shape", "tiny", "--dtype", "q8_0", "--out", &other_s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let model = text_published();
    let args = [
        "run",
        "--model",
        &model,
        "--backend",
        "cpu",
        "--tokens",
        "2,40",
        "--draft-model",
        &other_s,
    ];
    let out = install.run(&args);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--draft-model")
            && err.contains(&other_s)
            && err.contains("has 512 tokens and the target's 486"),
        "{err}"
    );
    let out = install.run(&[
        "run",
        "--model",
        &model,
        "--tokens",
        "2",
        "--draft",
        "ngram",
        "--draft-tokens",
        "17",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--draft-tokens must be between 1 and 16"),
        "{err}"
    );
    let out = install.run(&["run", "--model", &model, "--tokens", "2", "--draft", "model"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--draft model needs --draft-model"),
        "{err}"
    );
}
