//! A unit lost while `engine serve` runs (issue 53). The faulty test plugin stands in for a real
//! unit: it runs the CPU backend (loaded as a plugin, `TANDEM_FAULTY_DELEGATE`) until the file
//! `TANDEM_FAULTY_FAIL_WHEN` names exists, then fails its executes as `TANDEM_FAULTY_FAIL_WITH`
//! says. Only the requests in the failed step get the error (naming the unit and what failed);
//! the server goes on: a lost unit's parts move to the units that remain, and where none
//! remains, new requests get a 503 while `/health` says why.
//!
//! Needs the faulty plugin built beside the engine (`cargo build -p tandem-faulty-plugin`, or
//! `cargo build --workspace`).

mod common;
mod http;

use std::path::{Path, PathBuf};

use common::{engine_bin, ids, text_published, Install};
use http::{get, post, Events, Server};
use serde_json::{json, Value};

/// The faulty plugin cargo built, under the name discovery takes (`tandem_backend_faulty`).
fn install_faulty(install: &Install) {
    let built = format!(
        "{}tandem_faulty_plugin{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let profile = engine_bin().parent().expect("binary directory").to_path_buf();
    let src = [profile.join(&built), profile.join("deps").join(&built)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{built} not built: run `cargo build -p tandem-faulty-plugin`"));
    let dst = install
        .path()
        .join(tandem_backend_api::plugin::host::plugin_file_name("faulty"));
    std::fs::copy(&src, dst).expect("copy the faulty plugin");
}

/// An install with the CPU and faulty plugins, and the server's environment: the faulty unit
/// runs the install's CPU plugin and fails as `fail_with` says once `trigger` exists.
fn faulty_install(fail_with: &str, extra: &[(&str, &str)]) -> (Install, PathBuf, Vec<(String, String)>) {
    let install = Install::new(&["cpu"]);
    install_faulty(&install);
    let cpu = install
        .path()
        .join(tandem_backend_api::plugin::host::plugin_file_name("cpu"));
    let trigger = install.path().join("lose-the-faulty-unit");
    let mut env = vec![
        ("TANDEM_FAULTY_DELEGATE".to_string(), cpu.display().to_string()),
        (
            "TANDEM_FAULTY_FAIL_WHEN".to_string(),
            trigger.display().to_string(),
        ),
        ("TANDEM_FAULTY_FAIL_WITH".to_string(), fail_with.to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    (install, trigger, env)
}

fn start(install: &Install, backend: &str, env: &[(String, String)]) -> Server {
    let model = text_published();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Server::start_with_env(
        &install.path().join("engine"),
        &[
            "--model",
            &model,
            "--backend",
            backend,
            "--parallel",
            "1",
            "--chunk",
            "4",
            "--context",
            "100000",
        ],
        &env,
    )
}

fn lose(trigger: &Path) {
    std::fs::write(trigger, b"now").expect("write the trigger");
}

/// A greedy whole completion of `prompt`: its ids.
fn complete(addr: &str, prompt: &[u32]) -> Vec<u32> {
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    ids(&r.json()["choices"][0]["token_ids"])
}

/// The OpenAI error object of an answer with `status`.
fn error_of(r: &http::Response, status: u16) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    let e = r.json()["error"].clone();
    for key in ["message", "type", "param", "code"] {
        assert!(e.get(key).is_some(), "error without {key}: {e}");
    }
    e
}

fn stderr(server: &Server) -> String {
    server.stderr.lock().unwrap().clone()
}

#[test]
fn a_unit_lost_mid_split_fails_its_step_and_the_cpu_serves_the_rest() {
    let (install, trigger, env) = faulty_install("device_lost", &[]);
    // Attention on the CPU, everything else (the logits too) on the faulty unit.
    let server = start(&install, "cpu+faulty", &env);
    let addr = server.addr.clone();
    let h = get(&addr, "/health");
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok", "{}", h.text());
    // A few requests run on the split.
    let prompts: [&[u32]; 2] = [&[2, 17, 5, 40], &[2, 300, 9]];
    let before: Vec<Vec<u32>> = prompts.iter().map(|p| complete(&addr, p)).collect();
    assert!(before.iter().all(|g| g.len() == 6), "{before:?}");

    // A long stream holds the one slot; a second request waits in the queue behind it.
    let mut running = Events::open(
        &addr,
        "/v1/completions",
        &json!({"prompt": [2, 17, 5], "max_tokens": 90000, "temperature": 0, "stream": true}),
    );
    assert_eq!(running.status, 200);
    for _ in 0..3 {
        let data = running.next_data().expect("a chunk");
        assert!(data.starts_with('{') && !data.contains("\"error\""), "{data}");
    }
    let queued_addr = addr.clone();
    let queued = std::thread::spawn(move || complete(&queued_addr, &[2, 300, 9]));
    server.wait_for(30, "a request in the queue", |s| {
        s.metric("tandem_queue_depth") == 1.0
    });

    // The unit is lost: the stream's step fails, the stream says so and ends.
    lose(&trigger);
    let error = loop {
        let data = running.next_data().expect("the stream ends with [DONE]");
        assert_ne!(data, "[DONE]", "the stream ended without an error");
        let chunk: Value = serde_json::from_str(&data).expect("a JSON chunk");
        if chunk.get("error").is_some() {
            break chunk["error"].clone();
        }
    };
    let message = error["message"].as_str().expect("a message");
    assert!(
        message.contains("faulty") && message.contains("device lost"),
        "the error names the unit and what failed: {message}"
    );
    assert_eq!(error["type"], "server_error", "{error}");
    assert_eq!(running.next_data().as_deref(), Some("[DONE]"));
    assert_eq!(running.next_data(), None);

    // The queued request is served by the CPU alone, with the tokens the split gave.
    assert_eq!(queued.join().expect("the queued client"), before[1]);
    // And so are later ones.
    assert_eq!(complete(&addr, prompts[0]), before[0]);

    assert_eq!(server.metric("tandem_units_lost_total"), 1.0);
    assert_eq!(server.metric("tandem_model_available"), 1.0);
    assert_eq!(server.metric("tandem_requests_total{outcome=\"error\"}"), 1.0);
    let h = get(&addr, "/health");
    assert_eq!(h.status, 200, "{}", h.text());
    let v = h.json();
    assert_eq!(v["status"], "degraded", "{v}");
    assert_eq!(v["lost"], json!(["faulty"]), "{v}");
    assert_eq!(v["units"], json!(["cpu"]), "{v}");
    // One line says which unit was lost and where its parts went.
    let log = stderr(&server);
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("unit faulty lost"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    // "unit faulty lost (running a step on faulty: device lost: ...); the model now runs on
    // cpu: its default work runs on cpu; its ffn work runs on cpu"
    let line = lines[0];
    assert!(
        line.contains("device lost")
            && line.contains("now runs on cpu:")
            && line.contains("its ffn work runs on cpu")
            && line.contains("its default work runs on cpu"),
        "{line}"
    );
}

#[test]
fn a_unit_that_panics_alone_leaves_a_server_that_answers_503() {
    let (install, trigger, env) = faulty_install("panic", &[]);
    let server = start(&install, "faulty", &env);
    let addr = server.addr.clone();
    assert_eq!(complete(&addr, &[2, 17, 5]).len(), 6);
    lose(&trigger);
    // The request in the failed step hears the panic, naming the unit.
    let r = post(
        &addr,
        "/v1/completions",
        &json!({"prompt": [2, 17, 5], "max_tokens": 6, "temperature": 0}),
    );
    assert!(r.status == 500 || r.status == 503, "{}", r.text());
    let e = error_of(&r, r.status);
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("faulty") && message.contains("panicked"),
        "{message}"
    );
    // Nothing remains to run the model: new requests are refused at once, with the reason.
    server.wait_for(30, "the model to be given up", |s| {
        s.metric("tandem_model_available") == 0.0
    });
    for stream in [false, true] {
        let doc = json!({"prompt": [2, 17], "max_tokens": 2, "stream": stream});
        let r = post(&addr, "/v1/completions", &doc);
        let e = error_of(&r, 503);
        assert_eq!(e["code"], "model_unavailable", "{e}");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains("unit faulty was lost") && message.contains("cannot be placed"),
            "{message}"
        );
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    let h = get(&addr, "/health");
    assert_eq!(h.status, 503, "{}", h.text());
    let v = h.json();
    assert_eq!(
        (v["status"].as_str(), &v["lost"]),
        (Some("unavailable"), &json!(["faulty"])),
        "{v}"
    );
    assert!(v["error"].as_str().is_some_and(|e| e.contains("faulty")), "{v}");
    assert_eq!(server.metric("tandem_units_lost_total"), 1.0);
    // The server is still up and answering.
    assert_eq!(get(&addr, "/v1/models").status, 200);
    let log = stderr(&server);
    assert!(
        log.lines()
            .any(|l| l.starts_with("unit faulty lost") && l.contains("new requests get 503")),
        "{log}"
    );
}

#[test]
fn a_unit_that_fails_one_step_fails_only_that_request() {
    let (install, trigger, env) = faulty_install("error", &[("TANDEM_FAULTY_FAIL_TIMES", "1")]);
    let server = start(&install, "cpu+faulty", &env);
    let addr = server.addr.clone();
    let before = complete(&addr, &[2, 17, 5]);
    lose(&trigger);
    let r = post(
        &addr,
        "/v1/completions",
        &json!({"prompt": [2, 17, 5], "max_tokens": 6, "temperature": 0}),
    );
    let e = error_of(&r, 500);
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("faulty") && message.contains("simulated failure"),
        "{message}"
    );
    // Not a lost unit: the same split serves the next request, and nothing says degraded.
    assert_eq!(complete(&addr, &[2, 17, 5]), before);
    assert_eq!(server.metric("tandem_units_lost_total"), 0.0);
    assert_eq!(server.metric("tandem_requests_total{outcome=\"error\"}"), 1.0);
    let h = get(&addr, "/health");
    assert_eq!((h.status, h.json()["status"].clone()), (200, json!("ok")));
}
