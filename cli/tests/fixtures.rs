//! `engine logits` and `engine run --temperature 0` against Hugging Face transformers on the
//! tiny random-weight fixtures (tests/fixtures, made by tests/fixtures/make_fixtures.py): logits
//! within 1e-4 of the largest logit, argmax identical at every position, greedy continuations
//! identical.

mod common;

use common::{fixture, Install};
use serde_json::Value;

const CASES: [&str; 5] = [
    "text-published",
    "text-newer",
    "multimodal",
    "multimodal-legacy",
    "softcap",
];

fn reference(case: &str) -> Value {
    let text = std::fs::read_to_string(fixture(case).join("reference.json")).expect("reference.json");
    serde_json::from_str(&text).expect("reference JSON")
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

fn csv(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn argmax(row: &[f64]) -> usize {
    row.iter()
        .enumerate()
        .fold(0, |b, (i, v)| if *v > row[b] { i } else { b })
}

fn json_run(install: &Install, args: &[&str]) -> Value {
    let out = install.run(args);
    assert!(
        out.status.success(),
        "engine {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

fn check_logits(install: &Install, case: &str, extra: &[&str]) {
    check_logits_within(install, case, extra, 1e-4);
}

/// As [`check_logits`], within `tol` of the largest reference logit.
fn check_logits_within(install: &Install, case: &str, extra: &[&str], tol: f64) {
    let r = reference(case);
    let dir = fixture(case);
    for seq in r["sequences"].as_array().expect("sequences") {
        let tokens = csv(&ids(&seq["tokens"]));
        let mut args = vec![
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--tokens",
            &tokens,
            "--backend",
            "cpu",
            "--json",
        ];
        args.extend_from_slice(extra);
        let got = json_run(install, &args);
        let want: Vec<Vec<f64>> = serde_json::from_value(seq["logits"].clone()).unwrap();
        let got: Vec<Vec<f64>> = serde_json::from_value(got["logits"].clone()).unwrap();
        assert_eq!(got.len(), want.len(), "{case}: positions");
        let scale = want.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
        for (p, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len(), "{case}: vocabulary at position {p}");
            let err = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(
                err <= tol * scale,
                "{case} {extra:?}: position {p}: error {err:e} > {tol:e} x {scale}"
            );
            assert_eq!(argmax(g), argmax(w), "{case} {extra:?}: argmax at position {p}");
        }
    }
}

#[test]
fn logits_match_transformers_on_every_fixture() {
    let install = Install::new(&["cpu"]);
    for case in CASES {
        check_logits(&install, case, &[]);
    }
}

#[test]
fn f16_kv_caches_stay_close_to_transformers() {
    // Keys and values rounded to f16 (11-bit significands) as they are stored.
    let install = Install::new(&["cpu"]);
    check_logits_within(
        &install,
        "text-published",
        &["--kv-cache", "f16", "--chunk", "3"],
        1e-2,
    );
    let out = install.run(&["logits", "--kv-cache", "bf16", "--tokens", "2,5"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--kv-cache must be f32 or f16, not 'bf16'"),
        "{err}"
    );
}

#[test]
fn chunked_prefill_through_the_ring_gives_the_same_logits() {
    // Chunks of 3 through sliding windows of 3-4 positions: the rings wrap inside one prefill.
    let install = Install::new(&["cpu"]);
    for case in ["text-published", "text-newer"] {
        check_logits(&install, case, &["--chunk", "3"]);
        check_logits(&install, case, &["--chunk", "1"]);
    }
}

#[test]
fn greedy_continuations_match_transformers() {
    // On the CPU, and with attention on the emulated NPU (its bf16 kernels) beside it.
    let install = Install::new(&["cpu", "npu_emu"]);
    for backend in ["cpu", "npu-emu+cpu"] {
        for case in CASES {
            let r = reference(case);
            let dir = fixture(case);
            for g in r["greedy"].as_array().expect("greedy") {
                let prompt = csv(&ids(&g["prompt"]));
                let n = g["max_new_tokens"].as_u64().unwrap().to_string();
                let got = json_run(
                    &install,
                    &[
                        "run",
                        "--model",
                        dir.to_str().unwrap(),
                        "--tokens",
                        &prompt,
                        "--temperature",
                        "0",
                        "--max-tokens",
                        &n,
                        "--backend",
                        backend,
                        "--json",
                    ],
                );
                assert_eq!(
                    ids(&got["tokens"]),
                    ids(&g["generated"]),
                    "{case} on {backend}: greedy continuation of {prompt}"
                );
                assert_eq!(ids(&got["prompt_tokens"]), ids(&g["prompt"]));
            }
        }
    }
}

#[test]
fn tokenizer_matches_transformers() {
    for case in ["text-published", "multimodal"] {
        let r = reference(case);
        let tk = tandem_engine::tokenizer::Tokenizer::from_dir(&fixture(case)).expect("tokenizer");
        for t in r["tokenization"].as_array().expect("tokenization") {
            let text = t["text"].as_str().unwrap();
            let got: Vec<u64> = tk
                .encode(text, true)
                .unwrap()
                .into_iter()
                .map(u64::from)
                .collect();
            assert_eq!(got, ids(&t["ids"]), "{case}: {text:?}");
        }
    }
}

#[test]
fn prompt_text_streams_and_json_reports_prompt_tokens() {
    let install = Install::new(&["cpu"]);
    let dir = fixture("text-published");
    let out = install.run(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "the cat",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        "--backend",
        "cpu",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let streamed = String::from_utf8_lossy(&out.stdout)
        .trim_end_matches('\n')
        .to_string();
    let doc = json_run(
        &install,
        &[
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            "the cat",
            "--max-tokens",
            "4",
            "--temperature",
            "0",
            "--backend",
            "cpu",
            "--json",
        ],
    );
    assert_eq!(
        doc["text"].as_str().unwrap(),
        streamed,
        "streamed text equals the JSON text"
    );
    let prompt = ids(&doc["prompt_tokens"]);
    assert_eq!(prompt.first(), Some(&2), "BOS first: {prompt:?}");
    assert!(ids(&doc["tokens"]).len() <= 4);
}

#[test]
fn sampling_is_reproducible_with_a_seed() {
    let install = Install::new(&["cpu"]);
    let dir = fixture("text-newer");
    let args = [
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--tokens",
        "2,300,301",
        "--max-tokens",
        "6",
        "--temperature",
        "1.5",
        "--top-k",
        "0",
        "--top-p",
        "1",
        "--seed",
        "7",
        "--backend",
        "cpu",
        "--json",
    ];
    let a = json_run(&install, &args);
    let b = json_run(&install, &args);
    assert_eq!(a["tokens"], b["tokens"]);
}

#[test]
fn chat_keeps_the_conversation_going() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let install = Install::new(&["cpu"]);
    let dir = fixture("text-published");
    let mut child = Command::new(install.path().join("engine"))
        .args([
            "chat",
            "--model",
            dir.to_str().unwrap(),
            "--max-tokens",
            "5",
            "--temperature",
            "0",
            "--backend",
            "cpu",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("engine chat starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello there\nand again\n/exit\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    // One prompt per turn plus the final one.
    assert_eq!(text.matches("> ").count(), 3, "{text}");
}

#[test]
fn perplexity_agrees_with_the_logits_it_is_made_of() {
    // One chunk of 16 tokens, scored in steps of 5 rows; recompute the same mean NLL from
    // `engine logits` over the chunk (BOS in front, second half scored).
    let install = Install::new(&["cpu"]);
    let dir = fixture("text-published");
    let text = "the cat sat on the mat and the dog ran far away from the cat";
    let file = install.path().join("text.txt");
    std::fs::write(&file, text).unwrap();
    let doc = json_run(
        &install,
        &[
            "perplexity",
            "--model",
            dir.to_str().unwrap(),
            "--file",
            file.to_str().unwrap(),
            "--ctx-size",
            "16",
            "--chunks",
            "1",
            "--chunk",
            "5",
            "--backend",
            "cpu",
            "--json",
        ],
    );
    let tk = tandem_engine::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    let mut chunk: Vec<u64> = tk
        .encode(text, false)
        .unwrap()
        .into_iter()
        .take(16)
        .map(u64::from)
        .collect();
    assert_eq!(chunk.len(), 16, "the text must give a whole chunk");
    chunk[0] = u64::from(tk.bos_id().unwrap());
    let logits = json_run(
        &install,
        &[
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--tokens",
            &csv(&chunk),
            "--backend",
            "cpu",
            "--json",
        ],
    );
    let rows: Vec<Vec<f64>> = serde_json::from_value(logits["logits"].clone()).unwrap();
    let mut nll = 0.0;
    for p in 7..15 {
        let l = &rows[p];
        let max = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + l.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        nll += lse - l[chunk[p + 1] as usize];
    }
    let want = (nll / 8.0).exp();
    let got = doc["perplexity"].as_f64().unwrap();
    assert_eq!(doc["scored_tokens"], 8);
    assert!(
        (got - want).abs() <= 1e-4 * want,
        "perplexity {got}, recomputed {want}"
    );
}

/// `--kl-divergence-base` then `--kl-divergence` on the same backend: zero divergence, every top
/// token the same, equal perplexities; against the CPU's reference kernels (`kernels=reference`,
/// other summation orders): a divergence above zero but tiny, the same top tokens.
#[test]
fn kl_divergence_against_a_saved_reference() {
    let install = Install::new(&["cpu"]);
    let dir = fixture("text-published");
    let text =
        "the cat sat on the mat and the dog ran far away from the cat and then it came back home to sleep";
    let file = install.path().join("text.txt");
    std::fs::write(&file, text).unwrap();
    let base = install.path().join("base.kld");
    let common = [
        "perplexity",
        "--model",
        dir.to_str().unwrap(),
        "--file",
        file.to_str().unwrap(),
        "--ctx-size",
        "16",
        "--backend",
        "cpu",
        "--json",
    ];
    let with =
        |extra: &[&str]| -> Vec<String> { common.iter().chain(extra).map(|s| s.to_string()).collect() };
    let run = |args: Vec<String>| json_run(&install, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let saved = run(with(&[
        "--kl-divergence-base",
        base.to_str().unwrap(),
        "--kl-top-k",
        "8",
    ]));
    let scored = saved["scored_tokens"].as_u64().unwrap();
    assert!(scored >= 16, "{saved}");
    // Header (40 bytes) and one record of 8 + 8 x 8 bytes per scored token.
    assert_eq!(std::fs::metadata(&base).unwrap().len(), 40 + scored * 72);
    let same = run(with(&["--kl-divergence", base.to_str().unwrap()]));
    let kl = &same["kl_divergence"];
    assert_eq!(kl["tokens"].as_u64(), Some(scored), "{same}");
    assert_eq!(kl["kl_mean"].as_f64(), Some(0.0), "{same}");
    assert_eq!(kl["kl_max"].as_f64(), Some(0.0), "{same}");
    assert_eq!(kl["same_top"].as_f64(), Some(1.0), "{same}");
    assert_eq!(kl["top_k"].as_u64(), Some(8), "{same}");
    assert_eq!(kl["ppl"], kl["ppl_reference"], "{same}");
    let cfg = install.path().join("tandem.toml");
    std::fs::write(&cfg, "[backend.cpu]\nkernels = \"reference\"\n").unwrap();
    let mut args = vec!["--config".to_string(), cfg.to_str().unwrap().to_string()];
    args.extend(with(&["--kl-divergence", base.to_str().unwrap()]));
    let other = run(args);
    let kl = &other["kl_divergence"];
    let mean = kl["kl_mean"].as_f64().unwrap();
    assert!(mean < 1e-6, "{other}");
    assert!(
        kl["kl_p99"].as_f64().unwrap() <= kl["kl_max"].as_f64().unwrap(),
        "{other}"
    );
    assert_eq!(kl["same_top"].as_f64(), Some(1.0), "{other}");
}

#[test]
fn tokenize_prints_the_ids_the_model_sees() {
    let install = Install::new(&["cpu"]);
    let dir = fixture("text-published");
    let r = reference("text-published");
    let t = &r["tokenization"][0];
    let doc = json_run(
        &install,
        &[
            "tokenize",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            t["text"].as_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(ids(&doc["tokens"]), ids(&t["ids"]));
}
