//! `engine chat` end to end on the instruction-tuned tiny fixture (tests/fixtures/chat/README.md;
//! its every reply is " answer", then `<end_of_turn>`): each turn's prompt is what transformers'
//! `apply_chat_template` renders for the conversation so far, turns accumulate, generation stops
//! at `<end_of_turn>` without printing it, `/exit` leaves, a closed stdin ends cleanly, a
//! conversation past `--context` drops its oldest turns with one note, flags are checked before
//! the first prompt, `run`'s sampling and stop flags work, and a turn longer than the context is
//! refused while the session goes on. The terminal's behaviour (editing, commands, Ctrl-C,
//! Ctrl-D) is in `chat_terminal.rs`.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Output, Stdio};

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
    let mut all = vec!["--temperature", "0", "--show-prompt"];
    all.extend_from_slice(flags);
    chat_with(install, &all, input)
}

/// `engine chat` on the fixture with only `flags`, and `input` on stdin (then closed).
fn chat_with(install: &Install, flags: &[&str], input: &str) -> Output {
    let model = fixture();
    let mut child = install
        .command()
        .args(["chat", "--model", model.to_str().unwrap(), "--backend", "cpu"])
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("engine starts");
    let mut stdin = child.stdin.take().expect("stdin");
    // (A chat that refuses its flags has gone before reading: the pipe is closed.)
    if let Err(e) = stdin.write_all(input.as_bytes()) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
    }
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

/// A flag out of range, or a system prompt the context cannot hold, is refused before the first
/// prompt: one error line naming the flag, exit status 1, and no `> ` on stdout (before, `chat
/// --temperature -1` printed `> ` and failed only after the first message).
#[test]
fn flags_are_refused_before_the_first_prompt() {
    let install = Install::new(&["cpu"]);
    let long_system = "You are terse. ".repeat(20);
    for (flags, want) in [
        (
            vec!["--temperature", "-1"],
            "error: --temperature must be >= 0 and finite (0 is greedy), got -1",
        ),
        (
            vec!["--top-p", "0"],
            "error: --top-p must be in (0, 1] (1 turns it off), got 0",
        ),
        (
            vec!["--min-p", "1"],
            "error: --min-p must be in [0, 1) (0 turns it off), got 1",
        ),
        (
            vec!["--repeat-penalty", "0"],
            "error: --repeat-penalty must be > 0 and finite (1 turns it off), got 0",
        ),
        (
            vec!["--max-tokens", "0"],
            "error: --max-tokens must be between 1 and the context",
        ),
        (
            vec!["--context", "32", "--system", long_system.as_str()],
            "error: --system takes ",
        ),
    ] {
        let out = chat_with(&install, &flags, "Hello there\n");
        let line = common::error_line(&flags, &out);
        assert!(line.starts_with(want), "{flags:?}: {line}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "",
            "{flags:?}: a prompt was shown"
        );
        if flags[0] == "--context" {
            assert!(
                line.contains("the context holds 32") && line.contains("--context sets it"),
                "{line}"
            );
        }
    }
}

/// `run`'s sampling and stop flags reach `chat` too: `--stop` cuts the reply, and the cut reply
/// is what the conversation keeps (the template trims it).
#[test]
fn chat_takes_the_sampling_and_stop_flags_of_run() {
    let install = Install::new(&["cpu"]);
    let out = chat(
        &install,
        &[
            "--stop",
            "swer",
            "--top-k",
            "5",
            "--top-p",
            "0.9",
            "--min-p",
            "0.05",
            "--repeat-penalty",
            "1.0",
        ],
        "Hello there\nAnd now?\n",
    );
    let (stdout, stderr) = assert_clean(&out);
    assert_eq!(stdout, ">  an\n>  an\n> ");
    let shown = prompts(&stderr);
    assert_eq!(shown.len(), 2, "{stderr}");
    assert!(
        shown[1].contains("<start_of_turn>model\nan<end_of_turn>"),
        "{}",
        shown[1]
    );
}

/// A turn that does not fit the context even alone is refused with a message naming the
/// context and `--context`; the conversation goes on without it.
#[test]
fn a_turn_longer_than_the_context_is_refused_and_the_session_goes_on() {
    let install = Install::new(&["cpu"]);
    let long = "Hello there ".repeat(40);
    let out = chat(
        &install,
        &["--context", "64", "--max-tokens", "4"],
        &format!("Hello there\n{long}\nAnd now?\n"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    let refused: Vec<&str> = stderr.lines().filter(|l| l.starts_with("not sent: ")).collect();
    assert_eq!(refused.len(), 1, "{stderr}");
    assert!(
        refused[0].contains("the context holds 64") && refused[0].contains("--context"),
        "{stderr}"
    );
    // The other turns were answered, and the conversation does not hold the long one.
    let shown = prompts(&stderr);
    assert_eq!(shown.len(), 2, "{stderr}");
    assert_eq!(shown[0], reference_texts()[0]);
    assert!(
        !shown[1].contains(long.trim()) && shown[1].contains("And now?"),
        "{}",
        shown[1]
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), ">  answer\n> >  answer\n> ");
}
