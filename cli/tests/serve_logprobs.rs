//! `engine serve`'s log-probabilities (issue 53) and its text without special tokens, driven as
//! a real process on the fixture models: OpenAI's shapes for chat (`logprobs`, `top_logprobs`)
//! and completions (`logprobs` N), whole and streamed; asking for them changes no token (the
//! same seed, sampled, with a repetition penalty, and where steps would read back only each
//! row's best logits); the values are the log-softmax of `engine logits`' raw logits; a special
//! token the model generates is in `token_ids` but not in the text.

mod common;
mod http;

use std::path::PathBuf;

use common::{ids, text_published, Install};
use http::{post, Events, Server};
use serde_json::{json, Value};

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// A whole answer's first choice.
fn choice(addr: &str, path: &str, doc: &Value) -> Value {
    let r = post(addr, path, doc);
    assert_eq!(r.status, 200, "{doc}: {}", r.text());
    r.json()["choices"][0].clone()
}

/// A stream's choices (every chunk that has one), read to `[DONE]`.
fn chunks(addr: &str, path: &str, doc: &Value) -> Vec<Value> {
    let mut doc = doc.clone();
    doc["stream"] = json!(true);
    let mut ev = Events::open(addr, path, &doc);
    assert_eq!(ev.status, 200, "{doc}");
    let mut out = Vec::new();
    loop {
        let data = ev.next_data().expect("the stream ends with [DONE]");
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&data).expect("a JSON chunk");
        if let Some(c) = chunk["choices"].get(0) {
            out.push(c.clone());
        }
    }
    out
}

/// Checks one chat `logprobs.content` entry: its fields, a log-probability <= 0, `bytes` the
/// token's UTF-8, `top` alternatives in descending order, and the chosen token's log-probability
/// equal to its entry among them when it is there. Returns whether it was there.
fn check_chat_entry(e: &Value, top: usize) -> bool {
    let token = e["token"].as_str().unwrap_or_else(|| panic!("token: {e}"));
    let logprob = num(&e["logprob"]);
    assert!(logprob <= 0.0, "{e}");
    let bytes: Vec<u8> = serde_json::from_value(e["bytes"].clone()).expect("bytes");
    if !token.starts_with("bytes:") {
        assert_eq!(token.as_bytes(), bytes, "{e}");
    }
    let alts = e["top_logprobs"]
        .as_array()
        .unwrap_or_else(|| panic!("top_logprobs: {e}"));
    assert_eq!(alts.len(), top, "{e}");
    let mut found = false;
    for (k, a) in alts.iter().enumerate() {
        let l = num(&a["logprob"]);
        assert!(l <= 0.0, "{e}");
        assert!(a["token"].is_string() && a["bytes"].is_array(), "{e}");
        if k > 0 {
            assert!(l <= num(&alts[k - 1]["logprob"]), "not in descending order: {e}");
        }
        if a["token"] == e["token"] {
            assert!((l - logprob).abs() < 1e-9, "{e}");
            found = true;
        }
    }
    found
}

/// Checks a completions `logprobs` object for `n` tokens with `top` alternatives each; returns
/// the chosen tokens' log-probabilities.
fn check_completion_logprobs(lp: &Value, n: usize, top: usize, text: &str) -> Vec<f64> {
    let tokens = lp["tokens"].as_array().unwrap_or_else(|| panic!("tokens: {lp}"));
    let chosen: Vec<f64> = lp["token_logprobs"]
        .as_array()
        .unwrap_or_else(|| panic!("token_logprobs: {lp}"))
        .iter()
        .map(num)
        .collect();
    let tops = lp["top_logprobs"]
        .as_array()
        .unwrap_or_else(|| panic!("top_logprobs: {lp}"));
    let offsets: Vec<u64> = serde_json::from_value(lp["text_offset"].clone()).expect("text_offset");
    assert_eq!(
        (tokens.len(), chosen.len(), tops.len(), offsets.len()),
        (n, n, n, n),
        "{lp}"
    );
    for ((t, &l), m) in tokens.iter().zip(&chosen).zip(tops) {
        assert!(l <= 0.0, "{lp}");
        let m = m.as_object().unwrap_or_else(|| panic!("a map: {m}"));
        // The `top` best, and the chosen one (which may be among them); fewer where two share
        // a text (a byte token and a character token).
        assert!(!m.is_empty() && m.len() <= top + 1, "{lp}");
        let mine = m
            .get(t.as_str().expect("a token"))
            .expect("the chosen token is in the map");
        assert!((num(mine) - l).abs() < 1e-9, "{lp}");
        assert!(m.values().all(|v| num(v) <= 0.0), "{lp}");
    }
    assert!(offsets.first().is_none_or(|&o| o == 0), "{lp}");
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{lp}");
    assert!(
        offsets.iter().all(|&o| o as usize <= text.chars().count()),
        "{lp}"
    );
    chosen
}

/// Chat and completions, whole and streamed, with log-probabilities: OpenAI's shapes, values
/// at most 0, alternatives in descending order with the chosen token's value among them, a
/// stream's pieces equal to the whole answer's, and the same tokens as without them for the
/// same seed (sampled; and greedy with a repetition penalty).
#[test]
fn logprobs_have_openais_shape_and_change_no_token() {
    let install = Install::new(&["cpu"]);
    // Without prefix reuse every request feeds its prompt in the same chunks, so that a stream's
    // values can be compared exactly with the whole answer's (a prompt read after a kept prefix
    // may differ in the last bits).
    let server = Server::start(
        &install.path().join("engine"),
        &[
            "--model",
            &text_published(),
            "--backend",
            "cpu",
            "--chunk",
            "4",
            "--no-prefix-reuse",
        ],
    );
    let addr = server.addr.as_str();

    // Completions: sampled, top-k off (whole rows), then greedy with a repetition penalty.
    let sampled = json!({"prompt": [2, 17, 5, 9, 11, 30], "max_tokens": 16, "temperature": 0.9,
        "top_p": 0.9, "top_k": 0, "seed": 11});
    let penalised = json!({"prompt": [2, 17, 5, 9, 11, 30], "max_tokens": 16, "temperature": 0,
        "repetition_penalty": 1.3});
    for base in [&sampled, &penalised] {
        let plain = choice(addr, "/v1/completions", base);
        assert!(plain["logprobs"].is_null(), "not asked for: {plain}");
        for top in [0usize, 3, 20] {
            let mut doc = base.clone();
            doc["logprobs"] = json!(top);
            let c = choice(addr, "/v1/completions", &doc);
            assert_eq!(
                c["token_ids"], plain["token_ids"],
                "logprobs {top} changed the tokens"
            );
            assert_eq!(c["text"], plain["text"]);
            let n = ids(&c["token_ids"]).len();
            let text = c["text"].as_str().unwrap();
            check_completion_logprobs(&c["logprobs"], n, top, text);
            // Streamed: each chunk carries its token's, together the whole answer's.
            let parts = chunks(addr, "/v1/completions", &doc);
            let mut joined =
                json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
            for p in &parts {
                if p["finish_reason"].is_string() && p["token_ids"].as_array().unwrap().is_empty() {
                    assert!(p["logprobs"].is_null(), "{p}");
                    continue;
                }
                for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
                    let more = p["logprobs"][key]
                        .as_array()
                        .unwrap_or_else(|| panic!("{p}"))
                        .clone();
                    assert_eq!(more.len(), 1, "{p}");
                    joined[key].as_array_mut().unwrap().extend(more);
                }
            }
            // (A stream cannot know where the text will end: the whole answer's offsets are
            // limited to its text.)
            let len = text.chars().count() as u64;
            for o in joined["text_offset"].as_array_mut().unwrap() {
                *o = json!(o.as_u64().unwrap().min(len));
            }
            assert_eq!(joined, c["logprobs"], "streamed and whole differ");
        }
    }

    // Chat: whole and streamed, sampled and greedy.
    let messages = json!([{"role": "user", "content": "hello there"}]);
    for (temperature, seed) in [(1.0, 3), (0.0, 0)] {
        let base = json!({"messages": messages, "max_tokens": 12, "temperature": temperature,
            "top_k": 0, "seed": seed});
        let plain = choice(addr, "/v1/chat/completions", &base);
        assert!(plain["logprobs"].is_null(), "{plain}");
        for top in [0usize, 5] {
            let mut doc = base.clone();
            doc["logprobs"] = json!(true);
            doc["top_logprobs"] = json!(top);
            let c = choice(addr, "/v1/chat/completions", &doc);
            assert_eq!(c["token_ids"], plain["token_ids"], "logprobs changed the tokens");
            assert_eq!(c["message"], plain["message"]);
            let content = c["logprobs"]["content"]
                .as_array()
                .unwrap_or_else(|| panic!("{c}"));
            assert_eq!(content.len(), ids(&c["token_ids"]).len());
            for e in content {
                let among = check_chat_entry(e, top);
                if temperature == 0.0 && top > 0 {
                    // Greedy picks the most likely token: the first alternative.
                    assert!(among && e["top_logprobs"][0]["token"] == e["token"], "{e}");
                }
            }
            let parts = chunks(addr, "/v1/chat/completions", &doc);
            let mut joined = Vec::new();
            for p in &parts {
                match p["logprobs"]["content"].as_array() {
                    Some(one) => {
                        assert_eq!(one.len(), 1, "{p}");
                        joined.extend(one.iter().cloned());
                    }
                    None => assert!(p["finish_reason"].is_string() && p["logprobs"].is_null(), "{p}"),
                }
            }
            assert_eq!(&joined, content, "streamed and whole differ");
        }
    }

    // Out of range, or top_logprobs without logprobs: a 400 naming the field.
    for (path, doc, param) in [
        (
            "/v1/completions",
            json!({"prompt": [2], "logprobs": 21}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": [2], "logprobs": -1}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": [2], "logprobs": true}),
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": messages, "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": messages, "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": messages, "logprobs": 1}),
            "logprobs",
        ),
    ] {
        let r = post(addr, path, &doc);
        assert_eq!(r.status, 400, "{doc}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{doc}");
    }
}

/// Where every step would read back only each row's best logits (what a GPU does; forced on
/// the CPU by `TANDEM_RANKED_LOGITS`), a request with log-probabilities still gets them for
/// every token, the same as with whole rows, and the same tokens as without them.
#[test]
fn logprobs_are_whole_where_steps_would_read_back_only_the_best_logits() {
    let install = Install::new(&["cpu"]);
    let engine = install.path().join("engine");
    let model = text_published();
    let args = ["--model", model.as_str(), "--backend", "cpu"];
    let ranked = Server::start_with_env(&engine, &args, &[("TANDEM_RANKED_LOGITS", "128")]);
    let whole = Server::start(&engine, &args);
    // Greedy and top-k 40 fit ranked logits: only log-probabilities make these whole rows.
    for base in [
        json!({"prompt": [2, 17, 5, 9], "max_tokens": 10, "temperature": 0}),
        json!({"prompt": [2, 17, 5, 9], "max_tokens": 10, "temperature": 1, "top_k": 40, "top_p": 1, "seed": 4}),
    ] {
        let plain = choice(&ranked.addr, "/v1/completions", &base);
        let mut doc = base.clone();
        doc["logprobs"] = json!(2);
        let a = choice(&ranked.addr, "/v1/completions", &doc);
        let b = choice(&whole.addr, "/v1/completions", &doc);
        assert_eq!(a["token_ids"], plain["token_ids"]);
        assert_eq!(a["token_ids"], b["token_ids"]);
        let n = ids(&a["token_ids"]).len();
        let text = a["text"].as_str().unwrap();
        let got = check_completion_logprobs(&a["logprobs"], n, 2, text);
        let want = check_completion_logprobs(&b["logprobs"], n, 2, text);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-4, "{got:?} against {want:?}");
        }
        // Interleaved with a request that needs none, in the same steps.
        let streams = std::thread::scope(|s| {
            let other = s.spawn(|| choice(&ranked.addr, "/v1/completions", &base));
            let mine = choice(&ranked.addr, "/v1/completions", &doc);
            (mine, other.join().unwrap())
        });
        assert_eq!(streams.0["token_ids"], a["token_ids"]);
        assert_eq!(streams.0["logprobs"]["tokens"].as_array().unwrap().len(), n);
        assert_eq!(streams.1["token_ids"], plain["token_ids"]);
    }
}

/// `engine logits --json`: the raw logits of every position of `tokens`.
fn raw_logits(install: &Install, tokens: &[u32]) -> Vec<Vec<f64>> {
    let list = tokens.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let out = install.run(&[
        "logits",
        "--model",
        &text_published(),
        "--backend",
        "cpu",
        "--tokens",
        &list,
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    serde_json::from_value(doc["logits"].clone()).unwrap()
}

fn log_softmax(row: &[f64]) -> Vec<f64> {
    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = row.iter().map(|l| (l - max).exp()).sum();
    row.iter().map(|l| l - max - sum.ln()).collect()
}

/// The first generated token's log-probability and its alternatives are the log-softmax of the
/// prompt's last raw logits as `engine logits` prints them (temperature 1, before any penalty):
/// greedy, and greedy with a repetition penalty of 0.01, which multiplies the prompt's positive
/// logits by 100 (so it picks a prompt token, whose log-probability is still the raw row's).
#[test]
fn the_first_tokens_logprob_is_the_log_softmax_of_the_raw_logits() {
    let install = Install::new(&["cpu"]);
    let server = Server::start(
        &install.path().join("engine"),
        &["--model", &text_published(), "--backend", "cpu"],
    );
    let prompt = [2u32, 17, 5, 9, 11, 30, 41, 77];
    let rows = raw_logits(&install, &prompt);
    let exact = log_softmax(rows.last().expect("a row per position"));
    let mut ranked: Vec<usize> = (0..exact.len()).collect();
    ranked.sort_by(|&a, &b| exact[b].total_cmp(&exact[a]).then(a.cmp(&b)));
    for penalty in [1.0, 0.01] {
        let doc = json!({"prompt": prompt, "max_tokens": 1, "temperature": 0,
            "repetition_penalty": penalty, "logprobs": 5});
        let c = choice(&server.addr, "/v1/completions", &doc);
        let id = ids(&c["token_ids"])[0] as usize;
        let got = num(&c["logprobs"]["token_logprobs"][0]);
        assert!(
            (got - exact[id]).abs() < 1e-4,
            "penalty {penalty}: token {id}: {got} against {}",
            exact[id]
        );
        if penalty == 1.0 {
            assert_eq!(id, ranked[0], "greedy takes the most likely");
        } else {
            // A prompt token, whose logit the penalty changed before the pick.
            assert!(
                prompt.contains(&(id as u32)),
                "the penalty favours the prompt: {id}"
            );
            assert!(rows.last().unwrap()[id] != 0.0);
        }
        // The alternatives: the five largest values of the raw row (the chosen one's too).
        let mut values: Vec<f64> = c["logprobs"]["top_logprobs"][0]
            .as_object()
            .unwrap()
            .values()
            .map(num)
            .collect();
        values.sort_by(|a, b| b.total_cmp(a));
        let mut want: Vec<f64> = ranked[..5].iter().map(|&i| exact[i]).collect();
        if !ranked[..5].contains(&id) {
            want.push(exact[id]);
        }
        assert_eq!(values.len(), want.len(), "{c}");
        for (g, w) in values.iter().zip(&want) {
            assert!((g - w).abs() < 1e-4, "{values:?} against {want:?}");
        }
    }
}

/// The chat fixture with `<end_of_turn>` and `<start_of_image>` swapping ids (both special), and
/// its generation config naming the new end of turn: the model, which replies " answer" (394)
/// then id 6, now generates `<start_of_image>` and goes on.
fn image_token_fixture() -> tempfile::TempDir {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat/gemma3-tiny-it");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let swap = |s: &str| match s {
        "<end_of_turn>" => "<start_of_image>".to_string(),
        "<start_of_image>" => "<end_of_turn>".to_string(),
        other => other.to_string(),
    };
    let path = dir.path().join("tokenizer.json");
    let mut tok: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for t in tok["added_tokens"].as_array_mut().unwrap() {
        let content = swap(t["content"].as_str().unwrap());
        t["content"] = json!(content);
    }
    let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
    let (eot, soi) = (vocab["<end_of_turn>"].clone(), vocab["<start_of_image>"].clone());
    assert_eq!((eot.as_u64(), soi.as_u64()), (Some(6), Some(7)));
    vocab.insert("<end_of_turn>".into(), soi);
    vocab.insert("<start_of_image>".into(), eot);
    std::fs::write(&path, tok.to_string()).unwrap();
    let path = dir.path().join("tokenizer_config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    if let Some(added) = cfg["added_tokens_decoder"].as_object_mut() {
        for t in added.values_mut() {
            let content = swap(t["content"].as_str().unwrap());
            t["content"] = json!(content);
        }
    }
    std::fs::write(&path, cfg.to_string()).unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"bos_token_id": 2, "eos_token_id": [1, 7], "pad_token_id": 0}"#,
    )
    .unwrap();
    dir
}

/// A special token the model generates (`<start_of_image>`) is in `token_ids` and names its
/// log-probability, but never shows in the text: completions and chat, whole and streamed, and
/// `engine run`.
#[test]
fn a_generated_special_token_is_in_the_ids_but_not_the_text() {
    let install = Install::new(&["cpu"]);
    let dir = image_token_fixture();
    let model = dir.path().to_string_lossy().into_owned();
    let server = Server::start(
        &install.path().join("engine"),
        &["--model", &model, "--backend", "cpu"],
    );
    let addr = server.addr.as_str();
    let doc = json!({"prompt": [2, 100], "max_tokens": 6, "temperature": 0, "logprobs": 0});
    let c = choice(addr, "/v1/completions", &doc);
    let generated = ids(&c["token_ids"]);
    assert_eq!(generated[..2], [394, 6], "{c}");
    let text = c["text"].as_str().unwrap();
    assert!(text.starts_with(" answer"), "{c}");
    assert!(!text.contains('<') && !text.contains("image"), "{c}");
    assert_eq!(c["logprobs"]["tokens"][1], "<start_of_image>", "{c}");
    let parts = chunks(addr, "/v1/completions", &doc);
    let streamed: String = parts.iter().filter_map(|p| p["text"].as_str()).collect();
    assert_eq!(streamed, text);

    let chat = json!({"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6,
        "temperature": 0});
    let c = choice(addr, "/v1/chat/completions", &chat);
    assert!(ids(&c["token_ids"]).contains(&6), "{c}");
    let content = c["message"]["content"].as_str().unwrap();
    assert!(content.starts_with(" answer") && !content.contains('<'), "{c}");
    let parts = chunks(addr, "/v1/chat/completions", &chat);
    let streamed: String = parts
        .iter()
        .filter_map(|p| p["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content);

    let out = install.run(&[
        "run",
        "--model",
        &model,
        "--backend",
        "cpu",
        "--tokens",
        "2,100",
        "--max-tokens",
        "6",
        "--temperature",
        "0",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids(&run["tokens"]), generated);
    assert_eq!(run["text"].as_str().unwrap(), text);
}
