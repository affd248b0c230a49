//! The CLI as a new user first meets it: the README's usage block, command by command, on a
//! fixture (each exits 0; no README command names a flag its `--help` does not know), and the
//! first run with `--backend auto` on a machine without a display (lavapipe, `XDG_RUNTIME_DIR`
//! unset) prints only tandem's own lines on stderr.

mod common;
mod http;

use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

use common::Install;
use serde_json::Value;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/text-published")
}

fn readme() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(path).expect("README.md")
}

/// The README's "Using it" block: one entry per command (continuation lines joined).
fn usage_commands() -> Vec<String> {
    let text = readme();
    let start = text.find("## Using it").expect("a \"Using it\" section");
    let block = &text[start..];
    let open = block.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let close = open + block[open..].find("```").expect("the block's end");
    let mut commands: Vec<String> = Vec::new();
    for line in block[open..close].lines() {
        let code = line.split(" # ").next().unwrap_or_default().trim_end();
        if code.trim_start().starts_with("engine ") {
            commands.push(code.trim().to_string());
        } else if let Some(last) = commands.last_mut() {
            last.push(' ');
            last.push_str(code.trim());
        }
    }
    commands
}

/// Every `--flag` of every README command is known to that command's `--help`.
#[test]
fn every_flag_the_readme_names_is_one_help_knows() {
    let install = Install::new(&[]);
    let commands = usage_commands();
    assert!(commands.len() >= 10, "{commands:?}");
    for command in &commands {
        let sub = command.split_whitespace().nth(1).expect("a subcommand");
        let out = install.run(&[sub, "--help"]);
        assert!(out.status.success(), "engine {sub} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        for flag in command
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2)
        {
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "the README's `{command}` names {flag}, which `engine {sub} --help` does not know"
            );
        }
    }
}

/// Runs `engine args` in `install` with `stdin`, asserts exit 0 and that stderr holds only
/// tandem's own lines; returns stdout.
fn ok(install: &Install, args: &[&str], stdin: &str) -> String {
    let mut child = install
        .command()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("engine starts");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).expect("write stdin");
    drop(input);
    let out = child.wait_with_output().expect("engine ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "engine {args:?}: {:?}\n{stderr}",
        out.status
    );
    assert_own_lines(&stderr, &args);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every stderr line is one tandem writes: a `note:` or `warning:`, or a line of a command's
/// own report.
fn assert_own_lines(stderr: &str, what: &dyn std::fmt::Debug) {
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            !line.starts_with("error:") && !line.contains("XDG_RUNTIME_DIR"),
            "{what:?}: a line tandem did not decide to print: {line}\n{stderr}"
        );
    }
}

/// The usage block's commands at tiny sizes on a fixture, each exiting 0 and printing what the
/// README says it prints.
#[test]
fn the_readme_usage_block_runs_command_by_command() {
    let install = Install::new(&["cpu"]);
    let model = fixture();
    let m = model.to_str().unwrap();
    let listed: Value = serde_json::from_str(&ok(&install, &["backends", "--json"], "")).unwrap();
    assert!(listed["backends"]
        .as_array()
        .is_some_and(|b| b.iter().any(|b| b["name"] == "cpu")));
    let text = ok(
        &install,
        &["run", "--model", m, "--prompt", "Hello", "--max-tokens", "3"],
        "",
    );
    assert!(!text.trim().is_empty());
    let doc: Value = serde_json::from_str(&ok(
        &install,
        &[
            "run",
            "--model",
            m,
            "--prompt",
            "Hello",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
            "--json",
        ],
        "",
    ))
    .unwrap();
    for key in ["tokens", "text", "finish_reason", "prompt_tokens", "stats"] {
        assert!(doc.get(key).is_some(), "run --json without {key}: {doc}");
    }
    let ids = ok(
        &install,
        &["run", "--model", m, "--tokens", "2,17,5", "--max-tokens", "2"],
        "",
    );
    assert!(!ids.trim().is_empty());
    let logits: Value = serde_json::from_str(&ok(
        &install,
        &["logits", "--model", m, "--tokens", "2,17,5", "--json"],
        "",
    ))
    .unwrap();
    assert!(logits.is_object() || logits.is_array());
    let chat = ok(
        &install,
        &["chat", "--model", m, "--max-tokens", "3"],
        "Hi\n/exit\n",
    );
    assert!(chat.starts_with("> "), "{chat}");
    let tokens: Value = serde_json::from_str(&ok(
        &install,
        &["tokenize", "--model", m, "--prompt", "Hello", "--json"],
        "",
    ))
    .unwrap();
    assert!(tokens.is_object() || tokens.is_array(), "{tokens}");
    let dir = tempfile::tempdir().unwrap();
    let text_file = dir.path().join("text.txt");
    std::fs::write(
        &text_file,
        "The quick brown fox jumps over the lazy dog. ".repeat(8),
    )
    .unwrap();
    let ppl = ok(
        &install,
        &[
            "perplexity",
            "--model",
            m,
            "--file",
            text_file.to_str().unwrap(),
            "--ctx-size",
            "32",
        ],
        "",
    );
    assert!(
        ppl.to_lowercase().contains("perplexity") || ppl.contains("PPL"),
        "{ppl}"
    );
    let placed = ok(&install, &["placement", "--model", m, "--json"], "");
    assert!(serde_json::from_str::<Value>(&placed).is_ok(), "{placed}");
}

/// The first run on a machine without a display: `--backend auto` probes vulkan and wgpu on
/// lavapipe, with `XDG_RUNTIME_DIR` unset, and stderr holds only tandem's own lines (once it
/// held libwayland's `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` per
/// probe). A software GPU named explicitly gets one note saying what it is.
#[test]
fn auto_without_a_display_prints_only_tandems_own_lines() {
    let install = Install::new(&["cpu", "vulkan", "wgpu"]);
    let model = fixture();
    let run = |backend: &str| {
        install
            .command()
            .args(["run", "--model", model.to_str().unwrap(), "--tokens", "2,17,5"])
            .args(["--max-tokens", "2", "--temperature", "0", "--backend", backend])
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("WAYLAND_DISPLAY")
            .env_remove("NODEVICE_SELECT")
            .output()
            .expect("engine runs")
    };
    let out = run("auto");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for line in stderr.lines() {
        assert!(
            line.starts_with("note: ") || line.starts_with("warning: "),
            "a line tandem did not decide to print: {line:?}\n{stderr}"
        );
    }
    // Where vulkan runs on a software GPU (lavapipe), naming it gets one note.
    let listed = install.run(&["backends", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("backends JSON");
    let software = listed["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["name"] == "vulkan"))
        .is_some_and(|b| b["info"]["kind"] == "software_gpu");
    if software {
        let out = run("vulkan");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let notes: Vec<&str> = stderr.lines().filter(|l| l.contains("software GPU")).collect();
        assert_eq!(notes.len(), 1, "{stderr}");
        assert!(
            notes[0].starts_with("note: vulkan runs on ") && notes[0].contains("slower than --backend cpu"),
            "{stderr}"
        );
    } else {
        assert!(std::env::var_os("CI").is_none(), "CI runs vulkan on lavapipe");
    }
}

/// A conversation that outgrows the context drops its oldest turns with one note, instead of
/// ending; `/exit` after it still leaves cleanly.
#[test]
fn chat_past_the_context_drops_its_oldest_turns_with_one_note() {
    let install = Install::new(&["cpu"]);
    let model = fixture();
    let args = ["chat", "--model", model.to_str().unwrap(), "--backend", "cpu"];
    let turn = "tell me about the quick brown fox and the lazy dog\n";
    let mut child = install
        .command()
        .args(args)
        .args(["--context", "96", "--max-tokens", "8", "--temperature", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("engine starts");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(turn.repeat(8).as_bytes()).unwrap();
    input.write_all(b"/exit\n").unwrap();
    drop(input);
    let out = child.wait_with_output().expect("engine ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("oldest turns are dropped").count(), 1, "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // A prompt for each of the eight turns and one after the last.
    assert_eq!(stdout.matches("> ").count(), 9, "{stdout}");
}

/// The default model is a base checkpoint without a chat template: chat says so once, naming
/// the GGUF key that decided it.
#[test]
fn chat_on_a_model_without_a_template_says_so_once() {
    let Some(model) = common::default_model() else {
        return;
    };
    let install = Install::new(&["cpu"]);
    let mut child = install
        .command()
        .args(["chat", "--model", model.to_str().unwrap(), "--backend", "cpu"])
        .args(["--max-tokens", "2", "--temperature", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("engine starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"Hi\nHello\n")
        .unwrap();
    let out = child.wait_with_output().expect("engine ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let notes: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("no chat template"))
        .collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    assert!(
        notes[0].starts_with("note: ") && notes[0].contains("`tokenizer.chat_template`"),
        "{stderr}"
    );
}

/// The usage block's commands that run longer, at tiny sizes, each exiting 0 and printing what
/// the README says: `perplexity` llama.cpp's `Final estimate: PPL = ...`, `synth` a GGUF file
/// of the shape, `bench` its table of tokens/s per batch (on that file, CPU), `serve` the
/// address it listens on and OpenAI's completion for one request, `loadgen` tokens/s, TTFT and
/// ITL per number of clients against it.
#[test]
fn the_readme_perplexity_synth_bench_serve_and_loadgen_print_what_it_says() {
    let commands = usage_commands();
    for sub in ["perplexity", "synth", "bench", "serve", "loadgen"] {
        assert!(
            commands.iter().any(|c| c.starts_with(&format!("engine {sub} "))),
            "the README's usage block has no `engine {sub}`: {commands:?}"
        );
    }
    let install = Install::new(&["cpu"]);
    let model = fixture();
    let m = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();

    let text_file = dir.path().join("text.txt");
    std::fs::write(
        &text_file,
        "The quick brown fox jumps over the lazy dog. ".repeat(8),
    )
    .unwrap();
    let text_arg = text_file.to_str().unwrap();
    let ppl = ok(
        &install,
        &[
            "perplexity",
            "--model",
            m,
            "--file",
            text_arg,
            "--ctx-size",
            "32",
            "--backend",
            "cpu",
        ],
        "",
    );
    let estimate = ppl
        .lines()
        .find_map(|l| l.strip_prefix("Final estimate: PPL = "))
        .unwrap_or_else(|| panic!("no `Final estimate: PPL = `: {ppl}"));
    let value: f64 = estimate.split_whitespace().next().unwrap().parse().unwrap();
    // Every token scored with probability at most 1, and a finite loss.
    assert!(value.is_finite() && value >= 1.0, "{ppl}");

    let synth = dir.path().join("tiny.gguf");
    let synth_arg = synth.to_str().unwrap();
    ok(
        &install,
        &["synth", "--shape", "tiny", "--dtype", "q4_k", "--out", synth_arg],
        "",
    );
    let mut magic = [0u8; 4];
    std::io::Read::read_exact(&mut std::fs::File::open(&synth).unwrap(), &mut magic).unwrap();
    assert_eq!(&magic, b"GGUF");

    let table = ok(
        &install,
        &[
            "bench",
            "--model",
            synth_arg,
            "--backend",
            "cpu",
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "4",
            "--batch",
            "1,2",
            "--repeat",
            "1",
        ],
        "",
    );
    assert!(table.contains("prefill tok/s  decode tok/s"), "{table}");
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.split_whitespace().next().is_some_and(|w| w == "1" || w == "2"))
        .collect();
    assert_eq!(rows.len(), 2, "a row per batch size: {table}");
    for row in rows {
        let decode: f64 = row.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert!(decode > 0.0, "{table}");
    }

    let server = http::Server::start(
        &install.path().join("engine"),
        &["--model", m, "--backend", "cpu", "--parallel", "2"],
    );
    let r = http::post(
        &server.addr,
        "/v1/completions",
        &serde_json::json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let doc = r.json();
    assert_eq!(doc["object"], "text_completion", "{doc}");
    assert!(
        doc["choices"][0]["text"].is_string() && doc["usage"]["completion_tokens"] == 3,
        "{doc}"
    );
    let url = format!("http://{}", server.addr);
    let load = ok(
        &install,
        &[
            "loadgen",
            "--url",
            &url,
            "--clients",
            "1,2",
            "--requests",
            "2",
            "--max-tokens",
            "2",
        ],
        "",
    );
    let levels: Vec<&str> = load.lines().filter(|l| l.starts_with("clients")).collect();
    assert_eq!(levels.len(), 2, "a line per client count: {load}");
    for level in levels {
        assert!(
            level.contains("tok/s") && level.contains("TTFT p50") && level.contains("ITL p50"),
            "{load}"
        );
    }
    let log = server.stderr.lock().unwrap().clone();
    assert_own_lines(&log, &"serve");
}

/// Start-up off a terminal: with stderr a pipe, a load prints no progress (no bar, no steps),
/// only tandem's notes; `auto` caches what it learnt of the adapters (`adapters.json` in the
/// cache directory) and its next start, reading them, says the same.
#[test]
fn start_up_off_a_terminal_prints_no_progress_and_auto_reads_its_adapter_cache() {
    let install = Install::new(&["cpu", "vulkan", "wgpu"]);
    let cache = tempfile::tempdir().unwrap();
    let model = fixture();
    let run = |backend: &str| {
        let out = install
            .command()
            .args(["run", "--model", model.to_str().unwrap(), "--tokens", "2,17,5"])
            .args(["--max-tokens", "1", "--temperature", "0", "--backend", backend])
            .env("TANDEM_CACHE_DIR", cache.path())
            .output()
            .expect("engine runs");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{backend}: {stderr}");
        stderr
    };
    assert_eq!(run("cpu"), "", "nothing but notes off a terminal");
    let first = run("auto");
    for line in first.lines() {
        assert!(
            line.starts_with("note: ") || line.starts_with("warning: "),
            "{first}"
        );
    }
    assert!(!first.contains('\r') && !first.contains("loading"), "{first}");
    let cached = std::fs::read_to_string(cache.path().join("adapters.json")).expect("adapters.json");
    assert!(cached.contains("\"backend\": \"vulkan\""), "{cached}");
    assert_eq!(run("auto"), first, "the second start, from the cache");
}
