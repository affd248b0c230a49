//! `engine serve` on loopback, driven as a real process: batching changes no result (16
//! concurrent streams, each identical to the same request alone and to `engine run`), a
//! dropped client frees its slot, a full queue answers 503, a bad key 401, bad input a 4xx in
//! OpenAI's error shape while the server keeps serving, the context limit ends with `length`,
//! a model without a tokenizer serves token ids, SIGTERM stops it cleanly, a prompt sharing a
//! prefix with what its slot held keeps that prefix and changes no token; on the default
//! model, greedy completions equal `engine run --temperature 0`.

mod common;
mod http;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{default_model, fixture, ids, text_published, Install};
use http::{get, post, request, Events, Server};
use serde_json::{json, Value};

/// What one generation gave.
#[derive(Debug, Clone, PartialEq)]
struct Generation {
    ids: Vec<u32>,
    text: String,
    finish: String,
}

/// A streamed completion or chat completion, read to `[DONE]`.
fn streamed(addr: &str, path: &str, doc: &Value) -> Generation {
    let mut ev = Events::open(addr, path, doc);
    assert_eq!(ev.status, 200, "{doc}");
    let chat = path.contains("chat");
    let mut g = Generation {
        ids: vec![],
        text: String::new(),
        finish: String::new(),
    };
    loop {
        let data = ev.next_data().expect("the stream ends with [DONE]");
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&data).expect("a JSON chunk");
        let Some(c) = chunk["choices"].get(0) else {
            continue;
        };
        g.ids.extend(ids(&c["token_ids"]));
        let piece = if chat {
            c["delta"]["content"].as_str()
        } else {
            c["text"].as_str()
        };
        g.text.push_str(piece.unwrap_or(""));
        if let Some(f) = c["finish_reason"].as_str() {
            g.finish = f.to_string();
        }
    }
    assert!(ev.next_data().is_none(), "nothing after [DONE]");
    g
}

/// A whole (non-streamed) completion.
fn whole(addr: &str, doc: &Value) -> (Generation, Value) {
    let r = post(addr, "/v1/completions", doc);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let c = &v["choices"][0];
    let g = Generation {
        ids: ids(&c["token_ids"]),
        text: c["text"].as_str().expect("text").to_string(),
        finish: c["finish_reason"].as_str().expect("finish_reason").to_string(),
    };
    (g, v)
}

/// Asserts an error answer in OpenAI's shape with `status`; returns its message.
fn assert_error(r: &http::Response, status: u16, what: &str) -> String {
    assert_eq!(r.status, status, "{what}: {}", r.text());
    let v = r.json();
    let e = &v["error"];
    assert!(e.is_object(), "{what}: no error object: {v}");
    for key in ["message", "type", "param", "code"] {
        assert!(e.get(key).is_some(), "{what}: error without {key}: {v}");
    }
    let message = e["message"].as_str().expect("message is a string");
    assert!(!message.is_empty(), "{what}");
    assert!(e["type"].is_string(), "{what}: {v}");
    message.to_string()
}

#[test]
fn sixteen_concurrent_streams_each_equal_the_request_alone() {
    sixteen_streams(&[], 0, "off");
}

/// The same with top-k 40, every batched step reading back only each row's best 128 logits,
/// ranked by the backend (what a GPU does; forced on the CPU here by `TANDEM_RANKED_LOGITS`): the
/// samplers pick from those what `engine run` picks from the whole rows. And every step padded
/// to a bucket of rows with rows of a slot set aside (what a GPU does; forced here): the padding
/// changes no token.
#[test]
fn sixteen_concurrent_padded_streams_from_each_rows_best_logits_equal_the_request_alone() {
    sixteen_streams(&[("TANDEM_RANKED_LOGITS", "128")], 40, "on");
}

/// 16 sampled requests (temperature 1, top-k `top_k`, seeds 1000..) at once, each against itself
/// alone and a few against `engine run`; `env` for the server, `buckets` its `--step-buckets`.
fn sixteen_streams(env: &[(&str, &str)], top_k: u32, buckets: &str) {
    let install = Install::new(&["cpu"]);
    let model = text_published();
    // 8 slots for 16 requests: batches of every size, slots freed and reused, a queue; 4-token
    // prefill chunks, so longer prompts are fed over several steps between decode steps.
    let server = Server::start_with_env(
        &install.path().join("engine"),
        &[
            "--model",
            &model,
            "--backend",
            "cpu",
            "--parallel",
            "8",
            "--queue",
            "16",
            "--chunk",
            "4",
            "--step-buckets",
            buckets,
        ],
        env,
    );
    let requests: Vec<Value> = (0..16u32)
        .map(|i| {
            let prompt: Vec<u32> = std::iter::once(2)
                .chain((0..1 + (i * 7) % 23).map(|j| 3 + (i * 31 + j * 17) % 400))
                .collect();
            json!({
                "prompt": prompt,
                "max_tokens": 6 + (i * 13) % 41,
                "temperature": 1.0,
                "top_k": top_k,
                "top_p": 1.0,
                "seed": 1000 + i,
                "stream": true,
            })
        })
        .collect();
    let addr = server.addr.clone();
    let together: Vec<Generation> = std::thread::scope(|s| {
        let handles: Vec<_> = requests
            .iter()
            .map(|doc| {
                let addr = &addr;
                s.spawn(move || streamed(addr, "/v1/completions", doc))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });
    assert!(
        server.metric("tandem_requests_total{outcome=\"length\"}")
            + server.metric("tandem_requests_total{outcome=\"stop\"}")
            >= 16.0
    );
    // Warm-up built its shapes before the server listened, and the count says so.
    assert!(server.metric("tandem_step_shapes_built_total") >= 2.0);
    for (i, (doc, got)) in requests.iter().zip(&together).enumerate() {
        let alone = streamed(&addr, "/v1/completions", doc);
        assert_eq!(
            got, &alone,
            "request {i} in the batch differs from the same request alone"
        );
        let max = doc["max_tokens"].as_u64().unwrap() as usize;
        assert!(
            !got.ids.is_empty() && got.ids.len() <= max,
            "request {i}: {got:?}"
        );
        if got.finish == "length" {
            assert_eq!(got.ids.len(), max, "request {i}");
        }
    }
    // Different seeds gave different streams (the comparison above is not trivially true).
    let distinct: std::collections::HashSet<_> = together.iter().map(|g| g.ids.clone()).collect();
    assert!(distinct.len() > 8, "{distinct:?}");
    // And the server samples as `engine run` does, for a few of them.
    for doc in requests.iter().step_by(5) {
        let prompt: Vec<String> = ids(&doc["prompt"]).iter().map(u32::to_string).collect();
        let out = install.run(&[
            "run",
            "--model",
            &model,
            "--backend",
            "cpu",
            "--chunk",
            "4",
            "--tokens",
            &prompt.join(","),
            "--max-tokens",
            &doc["max_tokens"].to_string(),
            "--temperature",
            "1",
            "--top-k",
            &top_k.to_string(),
            "--top-p",
            "1",
            "--seed",
            &doc["seed"].to_string(),
            "--json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let run: Value = serde_json::from_slice(&out.stdout).unwrap();
        let i = requests.iter().position(|d| d == doc).unwrap();
        assert_eq!(
            ids(&run["tokens"]),
            together[i].ids,
            "request {i} against engine run"
        );
        // Not the text: the random fixture emits byte-fallback tokens that form no valid UTF-8,
        // where streamed text (the server's, and plain `engine run`'s) and `--json`'s decoding
        // of all ids at once differ. The default-model test compares the text.
        assert_eq!(run["finish_reason"].as_str().unwrap(), together[i].finish);
    }
}

/// A stream that would run for minutes: the fixture with a long context.
fn long_request() -> Value {
    json!({"prompt": [2, 17, 5], "max_tokens": 90000, "temperature": 0, "stream": true})
}

fn long_server(install: &Install, extra: &[&str]) -> Server {
    let model = text_published();
    let mut args = vec![
        "--model",
        model.as_str(),
        "--backend",
        "cpu",
        "--context",
        "100000",
    ];
    args.extend_from_slice(extra);
    Server::start(&install.path().join("engine"), &args)
}

#[test]
fn a_client_dropped_mid_stream_frees_its_slot() {
    let install = Install::new(&["cpu"]);
    let server = long_server(&install, &["--parallel", "1"]);
    let mut ev = Events::open(&server.addr, "/v1/completions", &long_request());
    assert_eq!(ev.status, 200);
    for _ in 0..3 {
        let data = ev.next_data().expect("a chunk");
        assert!(data.starts_with('{'), "{data}");
    }
    assert_eq!(server.metric("tandem_running_sequences"), 1.0);
    drop(ev);
    server.wait_for(30, "the dropped request to be cancelled", |s| {
        s.metric("tandem_requests_total{outcome=\"cancelled\"}") == 1.0
            && s.metric("tandem_running_sequences") == 0.0
    });
    assert_eq!(server.metric("tandem_requests_total{outcome=\"length\"}"), 0.0);
    // The one slot serves the next request.
    let (g, _) = whole(
        &server.addr,
        &json!({"prompt": [2, 17, 5], "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!((g.ids.len(), g.finish.as_str()), (4, "length"));
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let install = Install::new(&["cpu"]);
    let server = long_server(&install, &["--parallel", "1", "--queue", "1"]);
    let mut running = Events::open(&server.addr, "/v1/completions", &long_request());
    assert!(running.next_data().is_some());
    let waiting = Events::open(&server.addr, "/v1/completions", &long_request());
    server.wait_for(10, "one queued request", |s| {
        s.metric("tandem_queue_depth") == 1.0
    });
    let r = post(&server.addr, "/v1/completions", &long_request());
    let msg = assert_error(&r, 503, "queue overflow");
    assert!(msg.contains("busy"), "{msg}");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["code"], "queue_full");
    assert_eq!(server.metric("tandem_requests_rejected_total"), 1.0);
    // Both leave; the server serves again.
    drop(running);
    drop(waiting);
    server.wait_for(30, "the slot and the queue to empty", |s| {
        s.metric("tandem_running_sequences") == 0.0 && s.metric("tandem_queue_depth") == 0.0
    });
    let (g, _) = whole(&server.addr, &json!({"prompt": [2, 17], "max_tokens": 2}));
    assert_eq!(g.ids.len(), 2);
}

/// Two slots and one queue place hold three requests, however they arrive: on an idle server
/// three sent at once all succeed (a bounded channel refused the third before the batcher had
/// taken any into a slot); a fourth while three are held is 503.
#[test]
fn two_slots_and_a_queue_of_one_hold_three_simultaneous_requests() {
    let install = Install::new(&["cpu"]);
    let server = long_server(&install, &["--parallel", "2", "--queue", "1"]);
    let addr = server.addr.clone();
    for round in 0..3 {
        let start = std::sync::Arc::new(std::sync::Barrier::new(3));
        let answers: Vec<http::Response> = std::thread::scope(|scope| {
            let sent: Vec<_> = (0..3)
                .map(|i| {
                    let (addr, start) = (addr.clone(), start.clone());
                    scope.spawn(move || {
                        start.wait();
                        let doc = json!({"prompt": [2, 17, 5 + i], "max_tokens": 8, "temperature": 0});
                        post(&addr, "/v1/completions", &doc)
                    })
                })
                .collect();
            sent.into_iter().map(|h| h.join().expect("a client")).collect()
        });
        for (i, r) in answers.iter().enumerate() {
            assert_eq!(r.status, 200, "round {round}, request {i}: {}", r.text());
            assert_eq!(
                r.json()["usage"]["completion_tokens"],
                8,
                "round {round}, request {i}"
            );
        }
    }
    assert_eq!(server.metric("tandem_requests_rejected_total"), 0.0);
    // Three held (two running, one waiting): the fourth is over capacity.
    let mut held: Vec<Events> = (0..3)
        .map(|_| Events::open(&server.addr, "/v1/completions", &long_request()))
        .collect();
    for ev in &mut held[..2] {
        assert_eq!(ev.status, 200);
        assert!(ev.next_data().is_some());
    }
    server.wait_for(60, "two running and one queued", |s| {
        s.metric("tandem_running_sequences") == 2.0 && s.metric("tandem_queue_depth") == 1.0
    });
    let r = post(&server.addr, "/v1/completions", &long_request());
    assert_error(&r, 503, "a fourth request");
    assert_eq!(server.metric("tandem_requests_rejected_total"), 1.0);
}

#[test]
fn a_wrong_or_missing_api_key_is_401() {
    let install = Install::new(&["cpu"]);
    let model = text_published();
    let server = Server::start(
        &install.path().join("engine"),
        &["--model", &model, "--backend", "cpu", "--api-key", "sesame"],
    );
    let body = json!({"prompt": [2, 17], "max_tokens": 2}).to_string();
    for headers in [
        vec![],
        vec![("Authorization", "Bearer sesam")],
        vec![("Authorization", "Bearer sesame2")],
        vec![("Authorization", "sesame")],
        vec![("Authorization", "bearer sesam")],
        vec![("Authorization", "Bearersesame")],
    ] {
        let r = request(&server.addr, "POST", "/v1/completions", &headers, body.as_bytes());
        assert_error(&r, 401, &format!("{headers:?}"));
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    }
    let r = request(&server.addr, "GET", "/v1/models", &[], b"");
    assert_error(&r, 401, "models without a key");
    let good = [("Authorization", "Bearer sesame")];
    let r = request(&server.addr, "POST", "/v1/completions", &good, body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request(&server.addr, "GET", "/v1/models", &good, b"");
    assert_eq!(r.json()["data"][0]["id"], "text-published");
    // The scheme is case-insensitive (RFC 9110 section 11.1), and one or more spaces follow it.
    for auth in ["bearer sesame", "BEARER sesame", "Bearer  sesame"] {
        let r = request(&server.addr, "GET", "/v1/models", &[("Authorization", auth)], b"");
        assert_eq!(r.status, 200, "{auth}: {}", r.text());
    }
    assert_eq!(get(&server.addr, "/health").status, 200);
}

/// `engine serve ARGS` on an ephemeral port, which must exit with an error before it listens;
/// returns its stderr.
fn refused(install: &Install, args: &[&str]) -> String {
    use std::io::BufRead;
    let mut child = install
        .command()
        .arg("serve")
        .args(["--host", "127.0.0.1", "--port", "0"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("engine serve starts");
    let mut err = String::new();
    for line in std::io::BufReader::new(child.stderr.take().expect("stderr")).lines() {
        let line = line.expect("stderr");
        if line.starts_with("listening on") {
            let _ = child.kill();
            let _ = child.wait();
            panic!("engine serve {args:?} was not refused:\n{err}{line}");
        }
        err.push_str(&line);
        err.push('\n');
    }
    let status = child.wait().expect("wait");
    assert!(!status.success(), "{args:?}: {err}");
    err
}

/// A zero body limit and an empty model name are refused at start-up, naming the flag; so is a
/// `--parallel` whose KV cache does not fit, saying to lower it.
#[test]
fn flags_that_cannot_serve_are_refused_at_start_up() {
    let install = Install::new(&["cpu"]);
    let model = text_published();
    let base = ["--model", model.as_str(), "--backend", "cpu"];
    let err = refused(&install, &[&base[..], &["--max-body-bytes", "0"]].concat());
    assert!(
        err.contains("--max-body-bytes") && err.contains("at least 1"),
        "{err}"
    );
    for name in ["", "  "] {
        let err = refused(&install, &[&base[..], &["--model-name", name]].concat());
        assert!(err.contains("--model-name") && err.contains("empty"), "{err}");
    }
    // 1024 slots of the fixture's 256-token context are about 384 MiB of KV cache.
    let config = install.config("[backend.cpu]\nmemory_limit = \"64MiB\"\n");
    let err = refused(
        &install,
        &[&base[..], &["--config", &config, "--parallel", "1024"]].concat(),
    );
    assert!(
        err.contains("does not fit") && err.contains("lower --parallel (1024 now"),
        "{err}"
    );
}

#[test]
fn bad_input_is_a_4xx_in_openai_shape_and_the_server_keeps_serving() {
    let install = Install::new(&["cpu"]);
    let model = text_published();
    let server = Server::start(
        &install.path().join("engine"),
        &[
            "--model",
            &model,
            "--backend",
            "cpu",
            "--context",
            "64",
            "--max-body-bytes",
            "4096",
        ],
    );
    let addr = server.addr.as_str();
    let raw = |path: &str, body: &str| request(addr, "POST", path, &[], body.as_bytes());
    let cases: Vec<(&str, http::Response, u16, Option<&str>)> = vec![
        (
            "malformed JSON",
            raw("/v1/completions", "{\"prompt\": [2,"),
            400,
            None,
        ),
        ("not an object", raw("/v1/completions", "[1, 2]"), 400, None),
        ("empty body", raw("/v1/chat/completions", ""), 400, None),
        (
            "missing messages",
            post(addr, "/v1/chat/completions", &json!({"max_tokens": 3})),
            400,
            Some("messages"),
        ),
        (
            "messages not a list",
            post(addr, "/v1/chat/completions", &json!({"messages": "hi"})),
            400,
            Some("messages"),
        ),
        (
            "unknown role",
            post(
                addr,
                "/v1/chat/completions",
                &json!({"messages": [{"role": "wizard", "content": "hi"}]}),
            ),
            400,
            Some("messages"),
        ),
        (
            "missing prompt",
            post(addr, "/v1/completions", &json!({"max_tokens": 3})),
            400,
            Some("prompt"),
        ),
        (
            "prompt of the wrong type",
            post(addr, "/v1/completions", &json!({"prompt": {"a": 1}})),
            400,
            Some("prompt"),
        ),
        (
            "max_tokens a string",
            post(
                addr,
                "/v1/completions",
                &json!({"prompt": "hi", "max_tokens": "3"}),
            ),
            400,
            Some("max_tokens"),
        ),
        (
            "temperature a string",
            post(
                addr,
                "/v1/completions",
                &json!({"prompt": "hi", "temperature": "hot"}),
            ),
            400,
            Some("temperature"),
        ),
        (
            "stream a string",
            post(addr, "/v1/completions", &json!({"prompt": "hi", "stream": "yes"})),
            400,
            Some("stream"),
        ),
        (
            "stop a number",
            post(addr, "/v1/completions", &json!({"prompt": "hi", "stop": 5})),
            400,
            Some("stop"),
        ),
        (
            "max_tokens 0",
            post(addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 0})),
            400,
            Some("max_tokens"),
        ),
        (
            "max_tokens absurd",
            post(
                addr,
                "/v1/completions",
                &json!({"prompt": "hi", "max_tokens": 1_000_000_000_000u64}),
            ),
            400,
            Some("max_tokens"),
        ),
        (
            "max_tokens negative",
            post(
                addr,
                "/v1/completions",
                &json!({"prompt": "hi", "max_tokens": -1}),
            ),
            400,
            Some("max_tokens"),
        ),
        (
            "negative temperature",
            post(
                addr,
                "/v1/completions",
                &json!({"prompt": "hi", "temperature": -1}),
            ),
            400,
            Some("temperature"),
        ),
        (
            "top_p 0",
            post(addr, "/v1/completions", &json!({"prompt": "hi", "top_p": 0})),
            400,
            Some("top_p"),
        ),
        (
            "n 2",
            post(addr, "/v1/completions", &json!({"prompt": "hi", "n": 2})),
            400,
            Some("n"),
        ),
        (
            "token id outside the vocabulary",
            post(addr, "/v1/completions", &json!({"prompt": [2, 100000]})),
            400,
            Some("prompt"),
        ),
        (
            "prompt longer than the context",
            post(addr, "/v1/completions", &json!({"prompt": vec![5; 64]})),
            400,
            Some("prompt"),
        ),
        (
            "body over the limit",
            raw(
                "/v1/completions",
                &format!("{{\"prompt\": \"{}\"}}", "a".repeat(5000)),
            ),
            413,
            None,
        ),
        (
            "response_format json_object",
            post(
                addr,
                "/v1/completions",
                &json!({"prompt": "hi", "response_format": {"type": "json_object"}}),
            ),
            400,
            Some("response_format"),
        ),
        (
            "response_format a string",
            post(
                addr,
                "/v1/completions",
                &json!({"prompt": "hi", "response_format": "json"}),
            ),
            400,
            Some("response_format"),
        ),
        (
            "top_logprobs over 20 in chat",
            post(
                addr,
                "/v1/chat/completions",
                &json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21}),
            ),
            400,
            Some("top_logprobs"),
        ),
        (
            "logprobs a string in completions",
            post(addr, "/v1/completions", &json!({"prompt": "hi", "logprobs": "5"})),
            400,
            Some("logprobs"),
        ),
        (
            "tools",
            post(
                addr,
                "/v1/chat/completions",
                &json!({
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}],
                }),
            ),
            400,
            Some("tools"),
        ),
        ("unknown route", post(addr, "/v1/engines", &json!({})), 404, None),
        ("unknown GET route", get(addr, "/nothing/here"), 404, None),
        ("wrong method", get(addr, "/v1/completions"), 405, None),
        (
            "wrong method on models",
            post(addr, "/v1/models", &json!({})),
            405,
            None,
        ),
    ];
    // Messages speak the API's field names, not the command line's flags or Rust's types.
    let said = |what: &str| {
        let (_, r, _, _) = cases.iter().find(|c| c.0 == what).expect("a case");
        r.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        said("max_tokens a string"),
        "`max_tokens` must be an integer >= 1, got the string \"3\""
    );
    assert_eq!(
        said("stop a number"),
        "`stop` must be a string or a list of strings, got the number 5"
    );
    assert_eq!(
        said("negative temperature"),
        "temperature must be >= 0 and finite (0 is greedy), got -1"
    );
    // The limit is the operator's, so its message names the flag and the size.
    assert_eq!(
        said("body over the limit"),
        "the request body is larger than --max-body-bytes (4096 bytes)"
    );
    assert_eq!(
        said("logprobs a string in completions"),
        "`logprobs` must be an integer from 0 to 20, got the string \"5\""
    );
    for field in ["response_format", "tools"] {
        let what = cases.iter().find(|c| c.3 == Some(field)).expect("a case").0;
        let message = said(what);
        assert!(
            message.contains(field) && message.contains("not supported"),
            "{message}"
        );
    }
    for (what, r, status, param) in &cases {
        let message = assert_error(r, *status, what);
        for word in ["--", "untagged", "expected u64", "expected f32", "invalid type"] {
            if *status != 413 || word != "--" {
                assert!(!message.contains(word), "{what}: {message}");
            }
        }
        if let Some(p) = param {
            assert_eq!(r.json()["error"]["param"], *p, "{what}");
        }
        // Still serving.
        let (g, _) = whole(addr, &json!({"prompt": [2, 17], "max_tokens": 1}));
        assert_eq!(g.ids.len(), 1, "after {what}");
    }
    let too_long = post(addr, "/v1/completions", &json!({"prompt": vec![5; 64]}));
    assert_eq!(too_long.json()["error"]["code"], "context_length_exceeded");
    // Unknown fields are ignored, as OpenAI's servers do.
    let (g, v) = whole(
        addr,
        &json!({"prompt": [2, 17], "max_tokens": 2, "frobnicate": true, "user": "x", "logit_bias": {}}),
    );
    assert_eq!(g.ids.len(), 2);
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4})
    );
    // Fields that ask for nothing unsupported are accepted.
    let (g, _) = whole(
        addr,
        &json!({
            "prompt": [2, 17], "max_tokens": 1, "logprobs": false,
            "response_format": {"type": "text"}, "tools": [],
        }),
    );
    assert_eq!(g.ids.len(), 1);
    assert!(!server.stderr.lock().unwrap().contains("panicked"));
}

#[test]
fn the_context_limit_ends_with_length_keeping_the_text_in_serve_and_run() {
    let install = Install::new(&["cpu"]);
    let model = text_published();
    let server = Server::start(
        &install.path().join("engine"),
        &["--model", &model, "--backend", "cpu", "--context", "16"],
    );
    // 6 prompt tokens leave 10 in the context: asking for 15 gives 10, with `length`.
    let doc = json!({"prompt": [2, 17, 5, 9, 11, 30], "max_tokens": 15, "temperature": 0});
    let (g, v) = whole(&server.addr, &doc);
    assert_eq!((g.ids.len(), g.finish.as_str()), (10, "length"));
    assert_eq!(v["usage"]["total_tokens"], 16);
    let mut stream_doc = doc.clone();
    stream_doc["stream"] = json!(true);
    assert_eq!(streamed(&server.addr, "/v1/completions", &stream_doc), g);
    // engine run shares the rule, and prints what it generated.
    let out = install.run(&[
        "run",
        "--model",
        &model,
        "--backend",
        "cpu",
        "--context",
        "16",
        "--max-tokens",
        "100",
        "--tokens",
        "2,17,5,9,11,30",
        "--temperature",
        "0",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids(&run["tokens"]), g.ids);
    assert_eq!(run["text"].as_str().unwrap(), g.text);
    assert_eq!(run["finish_reason"], "length");
}

/// `engine run --json` with `flags` and `--tokens 2,17,5,9,11,30` on the fixture.
fn run_json(install: &Install, flags: &[&str]) -> Value {
    let model = text_published();
    let mut args = vec![
        "run",
        "--model",
        &model,
        "--backend",
        "cpu",
        "--tokens",
        "2,17,5,9,11,30",
        "--json",
    ];
    args.extend_from_slice(flags);
    let out = install.run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn run_and_serve_share_one_loop_sampled_with_a_seed_and_cut_at_a_stop_string() {
    let install = Install::new(&["cpu"]);
    let server = Server::start(
        &install.path().join("engine"),
        &["--model", &text_published(), "--backend", "cpu"],
    );
    let sampled = [
        "--temperature",
        "0.9",
        "--top-p",
        "0.9",
        "--top-k",
        "0",
        "--seed",
        "11",
        "--max-tokens",
        "24",
    ];
    let doc = json!({"prompt": [2, 17, 5, 9, 11, 30], "max_tokens": 24, "temperature": 0.9,
        "top_p": 0.9, "top_k": 0, "seed": 11});
    let (free, _) = whole(&server.addr, &doc);
    let run = run_json(&install, &sampled);
    assert_eq!(ids(&run["tokens"]), free.ids, "sampled ids");
    assert_eq!(run["text"].as_str().unwrap(), free.text, "sampled text");
    // A stop string from the middle of that text: both cut there, with `stop`.
    let chars: Vec<char> = free.text.chars().collect();
    assert!(chars.len() >= 6, "too little text to cut: {:?}", free.text);
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let mut cut_doc = doc.clone();
    cut_doc["stop"] = json!([stop]);
    let (cut, _) = whole(&server.addr, &cut_doc);
    assert_eq!(cut.finish, "stop");
    assert!(
        !cut.text.contains(&stop) && cut.ids.len() < free.ids.len(),
        "{cut:?}"
    );
    let mut flags = sampled.to_vec();
    flags.extend(["--stop", &stop]);
    let run = run_json(&install, &flags);
    assert_eq!(ids(&run["tokens"]), cut.ids, "ids cut at {stop:?}");
    assert_eq!(run["text"].as_str().unwrap(), cut.text, "text cut at {stop:?}");
    assert_eq!(run["finish_reason"], "stop");
}

/// Issue 53: a sampling setting neither the command line nor the request gives takes the
/// model's default, its generation_config.json (else tandem's), in `run` and in `serve` alike.
#[test]
fn run_and_serve_take_the_same_model_defaults_for_what_is_not_given() {
    let install = Install::new(&["cpu"]);
    // The fixture's generation_config.json: do_sample, top-k 64, top-p 0.95.
    let server = Server::start(
        &install.path().join("engine"),
        &["--model", &text_published(), "--backend", "cpu"],
    );
    let flags = ["--temperature", "0.8", "--seed", "5", "--max-tokens", "24"];
    let doc = json!({"prompt": [2, 17, 5, 9, 11, 30], "max_tokens": 24, "temperature": 0.8,
        "seed": 5});
    let (served, _) = whole(&server.addr, &doc);
    let run = run_json(&install, &flags);
    assert_eq!(
        ids(&run["tokens"]),
        served.ids,
        "run and serve without top-k/top-p"
    );
    assert_eq!(run["text"].as_str().unwrap(), served.text);
    // The defaults matter here: with top-k and top-p off the tokens differ.
    let mut off = flags.to_vec();
    off.extend(["--top-k", "0", "--top-p", "1"]);
    assert_ne!(ids(&run_json(&install, &off)["tokens"]), served.ids);

    // A copy whose generation_config.json says top-k 3, top-p 1, temperature 0.7: `run` without
    // flags and `serve` without fields both sample with it.
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(fixture("text-published").join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"bos_token_id": 2, "do_sample": true, "temperature": 0.7, "top_k": 3, "top_p": 1.0}"#,
    )
    .unwrap();
    let copy = dir.path().to_string_lossy().into_owned();
    let explicit = run_json(
        &install,
        &[
            "--temperature",
            "0.7",
            "--top-k",
            "3",
            "--top-p",
            "1",
            "--seed",
            "5",
            "--max-tokens",
            "24",
        ],
    );
    let out = install.run(&[
        "run",
        "--model",
        &copy,
        "--backend",
        "cpu",
        "--tokens",
        "2,17,5,9,11,30",
        "--json",
        "--seed",
        "5",
        "--max-tokens",
        "24",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let defaulted: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        defaulted["tokens"], explicit["tokens"],
        "run takes generation_config.json"
    );
    let copy_server = Server::start(
        &install.path().join("engine"),
        &["--model", &copy, "--backend", "cpu"],
    );
    let (served, _) = whole(
        &copy_server.addr,
        &json!({"prompt": [2, 17, 5, 9, 11, 30], "max_tokens": 24, "seed": 5}),
    );
    assert_eq!(
        json!(served.ids),
        explicit["tokens"],
        "serve takes generation_config.json"
    );

    // A malformed one is refused at load, naming the file and the key.
    std::fs::write(dir.path().join("generation_config.json"), r#"{"top_k": "many"}"#).unwrap();
    let out = install.run(&[
        "run",
        "--model",
        &copy,
        "--backend",
        "cpu",
        "--tokens",
        "2,17",
        "--max-tokens",
        "2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("generation_config.json") && err.contains("`top_k`"),
        "{err}"
    );
}

#[test]
fn a_model_without_a_tokenizer_serves_token_ids() {
    let install = Install::new(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(fixture("text-published").join(f), dir.path().join(f)).unwrap();
    }
    let bare = dir.path().to_string_lossy().into_owned();
    let with = Server::start(
        &install.path().join("engine"),
        &["--model", &text_published(), "--backend", "cpu"],
    );
    let without = Server::start(
        &install.path().join("engine"),
        &["--model", &bare, "--backend", "cpu"],
    );
    let doc = json!({"prompt": [2, 17, 5, 9], "max_tokens": 12, "seed": 7});
    let (a, _) = whole(&with.addr, &doc);
    let (b, _) = whole(&without.addr, &doc);
    assert_eq!(a.ids, b.ids);
    assert_eq!(b.text, "");
    let r = post(&without.addr, "/v1/completions", &json!({"prompt": "hello"}));
    let msg = assert_error(&r, 400, "text prompt without a tokenizer");
    assert!(msg.contains("tokenizer"), "{msg}");
    let r = post(
        &without.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_error(&r, 400, "chat without a tokenizer");
}

#[test]
fn chat_streams_and_whole_answers_agree_and_stop_strings_cut_the_text() {
    let install = Install::new(&["cpu"]);
    let server = Server::start(
        &install.path().join("engine"),
        &["--model", &text_published(), "--backend", "cpu", "--chunk", "8"],
    );
    let addr = server.addr.as_str();
    let doc = json!({
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}],
        "max_tokens": 24, "seed": 3, "stream_options": {"include_usage": true},
    });
    let r = post(addr, "/v1/chat/completions", &doc);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let mut s = doc.clone();
    s["stream"] = json!(true);
    let g = streamed(addr, "/v1/chat/completions", &s);
    assert_eq!(g.text, text);
    assert_eq!(g.ids, ids(&v["choices"][0]["token_ids"]));
    // A stop string taken from inside the text ends it just before.
    let chars: Vec<char> = text.chars().collect();
    if chars.len() >= 4 {
        let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
        let at = text.find(&stop).unwrap();
        let mut d = doc.clone();
        d["stop"] = json!([stop]);
        let r = post(addr, "/v1/chat/completions", &d).json();
        assert_eq!(r["choices"][0]["message"]["content"], text[..at]);
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
        d["stream"] = json!(true);
        let g = streamed(addr, "/v1/chat/completions", &d);
        assert_eq!((g.text.as_str(), g.finish.as_str()), (&text[..at], "stop"));
    }
}

/// The instruction-tuned chat fixture (tests/fixtures/chat/README.md): every reply is
/// " answer" (id 394), then `<end_of_turn>` (id 6).
fn chat_fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat/gemma3-tiny-it")
}

/// Chat stops at the template's end-of-turn token, which the text does not show, whole and
/// streamed; an instruction-tuned model gets no warning, and one without a chat template
/// (the fixture with `chat_template` taken out) gets one in the log, once, and in every chat
/// response, naming the key, while completions carry none.
#[test]
fn chat_stops_at_end_of_turn_and_a_model_without_a_template_is_warned_of() {
    let install = Install::new(&["cpu"]);
    let engine = install.path().join("engine");
    let model = chat_fixture();
    let server = Server::start(&engine, &["--model", model.to_str().unwrap(), "--backend", "cpu"]);
    let addr = server.addr.as_str();
    let doc =
        json!({"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, "temperature": 0});
    let r = post(addr, "/v1/chat/completions", &doc);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let c = &v["choices"][0];
    assert_eq!(
        (c["message"]["content"].as_str(), c["finish_reason"].as_str()),
        (Some(" answer"), Some("stop")),
        "{v}"
    );
    assert_eq!(ids(&c["token_ids"]), [394, 6]);
    assert!(v.get("warning").is_none(), "{v}");
    let mut s = doc.clone();
    s["stream"] = json!(true);
    let g = streamed(addr, "/v1/chat/completions", &s);
    assert_eq!(
        (g.text.as_str(), g.finish.as_str(), g.ids.as_slice()),
        (" answer", "stop", &[394, 6][..])
    );
    assert!(
        !server.stderr.lock().unwrap().contains("note:"),
        "{}",
        server.stderr.lock().unwrap()
    );
    drop(server);

    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&model).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let config_path = dir.path().join("tokenizer_config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let server = Server::start(
        &engine,
        &["--model", dir.path().to_str().unwrap(), "--backend", "cpu"],
    );
    let addr = server.addr.as_str();
    let v = post(addr, "/v1/chat/completions", &doc).json();
    let warning = v["warning"].as_str().unwrap_or_else(|| panic!("no warning: {v}"));
    assert!(
        warning.contains("no chat template") && warning.contains("`tokenizer_config.json chat_template"),
        "{warning}"
    );
    // Gemma's built-in turn format renders what the template would.
    assert_eq!(v["choices"][0]["message"]["content"], " answer", "{v}");
    let mut ev = Events::open(addr, "/v1/chat/completions", &s);
    let first: Value = serde_json::from_str(&ev.next_data().expect("a chunk")).unwrap();
    assert_eq!(first["warning"].as_str(), Some(warning), "{first}");
    let v = post(addr, "/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1})).json();
    assert!(v.get("warning").is_none(), "{v}");
    // Such a model's chat requests without max_tokens stop at 128 tokens, and the warning says
    // so (the base default model once streamed 4,083 tokens to the README's example).
    assert!(
        warning.contains("without max_tokens stops after 128 tokens"),
        "{warning}"
    );
    drop(server);
    let base_dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(text_published()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, base_dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let config_path = base_dir.path().join("tokenizer_config.json");
    if let Ok(bytes) = std::fs::read(&config_path) {
        let mut config: Value = serde_json::from_slice(&bytes).unwrap();
        config.as_object_mut().unwrap().remove("chat_template");
        std::fs::write(&config_path, config.to_string()).unwrap();
    }
    let _ = std::fs::remove_file(base_dir.path().join("chat_template.jinja"));
    let base = Server::start(
        &engine,
        &["--model", base_dir.path().to_str().unwrap(), "--backend", "cpu"],
    );
    let open_ended = json!({"messages": [{"role": "user", "content": "Go on"}], "temperature": 0});
    let v = post(&base.addr, "/v1/chat/completions", &open_ended).json();
    let used = v["usage"]["completion_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(used <= 128, "{v}");
    if v["choices"][0]["finish_reason"] == "length" {
        assert_eq!(used, 128, "{v}");
    }
    assert!(
        v["warning"].as_str().is_some_and(|w| w.contains("128 tokens")),
        "{v}"
    );
    let log = base.stderr.lock().unwrap().clone();
    assert!(log.contains("stops after 128 tokens"), "{log}");
    drop(base);
    let server = Server::start(
        &engine,
        &["--model", dir.path().to_str().unwrap(), "--backend", "cpu"],
    );
    let _ = post(&server.addr, "/v1/chat/completions", &doc);
    let log = server.stderr.lock().unwrap().clone();
    assert_eq!(log.matches("no chat template").count(), 1, "{log}");
    assert!(
        log.lines()
            .any(|l| l.starts_with("note: this model has no chat template")),
        "{log}"
    );
}

#[test]
fn sigterm_finishes_the_running_request_and_exits_cleanly() {
    let install = Install::new(&["cpu"]);
    let mut server = Server::start(
        &install.path().join("engine"),
        &["--model", &text_published(), "--backend", "cpu"],
    );
    let doc = json!({"prompt": [2, 17], "max_tokens": 200, "temperature": 0, "stream": true});
    let mut ev = Events::open(&server.addr, "/v1/completions", &doc);
    assert!(ev.next_data().is_some());
    let kill = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    // The running stream is finished, not cut.
    let mut last = String::new();
    while let Some(d) = ev.next_data() {
        last = d;
    }
    assert_eq!(last, "[DONE]");
    let t = Instant::now();
    let status = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "still running after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}: {}", server.stderr.lock().unwrap());
}

#[test]
fn default_model_greedy_completions_equal_engine_run() {
    let Some(model) = default_model() else { return };
    let model = model.to_string_lossy().into_owned();
    let install = Install::new(&["cpu"]);
    let server = Server::start(
        &install.path().join("engine"),
        &[
            "--model",
            &model,
            "--backend",
            "cpu",
            "--parallel",
            "2",
            "--context",
            "512",
        ],
    );
    let prompts = ["The capital of France is", "def fibonacci(n):"];
    let got: Vec<Generation> = std::thread::scope(|s| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let addr = server.addr.clone();
                s.spawn(move || {
                    let doc = json!({"prompt": p, "max_tokens": 20, "temperature": 0, "stream": true});
                    streamed(&addr, "/v1/completions", &doc)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (p, g) in prompts.iter().zip(&got) {
        let out = install.run(&[
            "run",
            "--model",
            &model,
            "--backend",
            "cpu",
            "--context",
            "512",
            "--prompt",
            p,
            "--max-tokens",
            "20",
            "--temperature",
            "0",
            "--json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let run: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(ids(&run["tokens"]), g.ids, "{p}");
        assert_eq!(run["text"].as_str().unwrap(), g.text, "{p}");
    }
}

/// A prompt sharing a prefix with what the slot last held keeps that prefix's cache, in whole
/// chunks (`tandem_prompt_tokens_reused_total` counts it) and gives the tokens `engine run` gives
/// without it; a request whose prefix another request evicted from the one slot, and a chat
/// turn continuing the slot's whole history, answer the same as alone too.
#[test]
fn a_shared_prefix_is_reused_and_changes_no_token() {
    let install = Install::new(&["cpu"]);
    let model = text_published();
    let server = Server::start(
        &install.path().join("engine"),
        &[
            "--model",
            &model,
            "--backend",
            "cpu",
            "--parallel",
            "1",
            "--chunk",
            "10",
        ],
    );
    let reused = || server.metric("tandem_prompt_tokens_reused_total");
    let prefix: Vec<u32> = std::iter::once(2)
        .chain((0..19).map(|j| 3 + (j * 37) % 400))
        .collect();
    let with = |tail: &[u32]| -> Vec<u32> { prefix.iter().chain(tail).copied().collect() };
    let ask = |prompt: &[u32]| -> Generation {
        whole(
            &server.addr,
            &json!({"prompt": prompt, "max_tokens": 6, "temperature": 0}),
        )
        .0
    };
    let alone = |prompt: &[u32]| -> Vec<u32> {
        let list: Vec<String> = prompt.iter().map(u32::to_string).collect();
        let out = install.run(&[
            "run",
            "--model",
            &model,
            "--backend",
            "cpu",
            "--tokens",
            &list.join(","),
            "--max-tokens",
            "6",
            "--temperature",
            "0",
            "--chunk",
            "10",
            "--json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        ids(&serde_json::from_slice::<Value>(&out.stdout).unwrap()["tokens"])
    };
    // What the slot holds after a request: its prompt and every generated token but the last
    // (sampled, never fed).
    let held = |prompt: &[u32], g: &Generation| -> Vec<u32> {
        prompt.iter().chain(&g.ids[..g.ids.len() - 1]).copied().collect()
    };
    let shared = |a: &[u32], b: &[u32]| {
        a.iter()
            .zip(b)
            .take_while(|(x, y)| x == y)
            .count()
            .min(b.len() - 1)
            / 10
            * 10
    };

    let a = with(&[401]);
    let ga = ask(&a);
    assert_eq!(reused(), 0.0, "an empty slot holds nothing to reuse");
    let b = with(&[402, 403]);
    let gb = ask(&b);
    let mut want = shared(&held(&a, &ga), &b);
    assert_eq!(want, prefix.len());
    assert_eq!(reused(), want as f64);
    assert_eq!(gb.ids, alone(&b), "with the prefix kept");
    // Another prompt takes the one slot: of B's prefix only the first id (2) stays shared.
    let c: Vec<u32> = vec![2, 300, 301, 302];
    let gc = ask(&c);
    want += shared(&held(&b, &gb), &c);
    assert_eq!(reused(), want as f64);
    assert_eq!(gc.ids, alone(&c));
    let gb2 = ask(&b);
    want += shared(&held(&c, &gc), &b);
    assert_eq!(reused(), want as f64);
    assert_eq!(gb2.ids, gb.ids, "after its prefix was evicted");
    // A chat turn: the whole history and a new tail.
    let d: Vec<u32> = held(&b, &gb2).into_iter().chain([404, 405]).collect();
    let gd = ask(&d);
    want += held(&b, &gb2).len() / 10 * 10;
    assert_eq!(reused(), want as f64);
    assert_eq!(gd.ids, alone(&d), "continuing the slot's history");
    assert!(
        server.metric("tandem_prompt_tokens_total") > reused(),
        "every prompt counts whole in tandem_prompt_tokens_total"
    );
}
