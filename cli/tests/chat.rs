//! `engine chat` end to end on the instruction-tuned tiny fixture (tests/fixtures/chat/README.md;
//! its every reply is " answer", then `<end_of_turn>`): each turn's prompt is what transformers'
//! `apply_chat_template` renders for the conversation so far, turns accumulate, generation stops
//! at `<end_of_turn>` without printing it, `/exit` leaves, a closed stdin ends cleanly, and a
//! conversation past `--context` drops its oldest turns with one note.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use common::Install;
use serde_json::Value;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat/gemma3-tiny-it")
}

/// `chat_reference.json`'s rendered texts, in order.
fn reference_texts() -> Vec<String> {
    let text = std::fs::read_to_string(fixture().join("chat_reference.json")).expect("chat_reference.json");
    let doc: Value = serde_json::from_str(&text).expect("JSON");
    doc["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| c["text"].as_str().expect("text").to_string())
        .collect()
}

/// `engine chat` on the fixture, greedy, with `flags` and `input` on stdin (then closed).
fn chat(install: &Install, flags: &[&str], input: &str) -> Output {
    let model = fixture();
    let mut child = Command::new(install.path().join("engine"))
        .args(["chat", "--model", model.to_str().unwrap(), "--backend", "cpu"])
        .args(["--temperature", "0", "--show-prompt"])
        .args(flags)
        .env_remove("TANDEM_PLUGIN_PATH")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("engine starts");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).expect("write stdin");
    drop(stdin);
    child.wait_with_output().expect("engine ends")
}

/// The prompts `--show-prompt` printed, in order.
fn prompts(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("prompt: "))
        .map(|j| serde_json::from_str::<String>(j).expect("a JSON string"))
        .collect()
}

/// Exit 0, and no `error:` line on stderr (and no note: the fixture is instruction-tuned).
fn assert_clean(out: &Output) -> (String, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(
        stderr.lines().all(|l| l.starts_with("prompt: ")),
        "a line besides the prompts: {stderr}"
    );
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

#[test]
fn each_turn_renders_as_transformers_does_and_the_turns_accumulate_until_exit() {
    let install = Install::new(&["cpu"]);
    let want = reference_texts();
    // With a system prompt: the first turn and the second, which holds the first and its reply.
    let out = chat(
        &install,
        &["--system", "You are terse.", "--max-tokens", "8"],
        "Hello there\nAnd now?\n/exit\nnot read\n",
    );
    let (stdout, stderr) = assert_clean(&out);
    assert_eq!(prompts(&stderr), [want[1].clone(), want[2].clone()]);
    // Each reply stops at <end_of_turn>, which is not printed; /exit leaves at once.
    assert_eq!(stdout, ">  answer\n>  answer\n> ");

    // Without one, three turns, and stdin closed after the last: a clean end.
    let out = chat(
        &install,
        &["--max-tokens", "8"],
        "Hello there\n  And now?  \nBye\n",
    );
    let (stdout, stderr) = assert_clean(&out);
    let shown = prompts(&stderr);
    assert_eq!(shown.len(), 3, "{stderr}");
    assert_eq!((&shown[0], &shown[2]), (&want[0], &want[3]));
    assert!(
        shown[1].starts_with(&want[0]) && want[3].starts_with(&shown[1]),
        "{}",
        shown[1]
    );
    assert_eq!(stdout.matches("> ").count(), 4, "{stdout}");
    assert!(!stdout.contains("end_of_turn"), "{stdout}");
}

#[test]
fn run_stops_at_end_of_turn_without_printing_it() {
    let install = Install::new(&["cpu"]);
    let model = fixture();
    let out = install.run(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "--backend",
        "cpu",
        "--prompt",
        "Hello",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["tokens"], serde_json::json!([394, 6]), "{doc}");
    assert_eq!(
        (doc["text"].as_str(), doc["finish_reason"].as_str()),
        (Some(" answer"), Some("stop"))
    );
}

#[test]
fn a_conversation_past_the_context_drops_its_oldest_turns_with_one_note() {
    let install = Install::new(&["cpu"]);
    let out = chat(
        &install,
        &[
            "--context",
            "64",
            "--max-tokens",
            "4",
            "--system",
            "You are terse.",
        ],
        &"Hello there\n".repeat(8),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let notes: Vec<&str> = stderr.lines().filter(|l| l.starts_with("note: ")).collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    assert!(notes[0].contains("oldest turns are dropped"), "{stderr}");
    let shown = prompts(&stderr);
    assert_eq!(shown.len(), 8, "{stderr}");
    // Every prompt fits, keeps the system prompt, and ends asking for the model's turn.
    let want = reference_texts();
    for p in &shown {
        assert!(p.starts_with(&want[1][..want[1].find("Hello").unwrap()]), "{p}");
        assert!(p.ends_with("<start_of_turn>model\n"), "{p}");
    }
    let turns = |p: &str| p.matches("<start_of_turn>user").count();
    assert!(turns(&shown[7]) < 8, "{}", shown[7]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches(">  answer\n").count(), 8, "{stdout}");
}
