//! `engine chat` at a terminal, through a pseudo-terminal (rexpect): `/help`, `/clear`, an
//! unknown command, `/quit`, Ctrl-D, Ctrl-C at the prompt and during a reply; and `engine run`'s
//! progress line for a long prompt, which only a terminal gets. On the instruction-tuned tiny
//! fixture (every reply " answer") and, for a reply long enough to stop, a random-weight fixture
//! whose greedy reply runs to `--max-tokens`.

#![cfg(unix)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Install;
use rexpect::process::WaitStatus;
use rexpect::session::{spawn_with_options, Options, PtySession};

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(rel)
}

/// The instruction-tuned fixture: every reply is " answer".
fn tiny_it() -> PathBuf {
    fixture("chat/gemma3-tiny-it")
}

/// A random-weight fixture: its greedy reply to "Hello" never ends before `--max-tokens`.
fn random() -> PathBuf {
    fixture("models/text-published")
}

/// `engine chat` on `model` in a pseudo-terminal, greedy, with `--show-prompt` and `flags`; its
/// history under `state`.
fn chat(install: &Install, model: &Path, flags: &[&str], state: &Path) -> PtySession {
    let mut cmd = install.command();
    cmd.args(["chat", "--model", model.to_str().unwrap(), "--backend", "cpu"])
        .args(["--temperature", "0", "--show-prompt"])
        .args(flags)
        .env("XDG_STATE_HOME", state)
        .env("TERM", "xterm");
    spawn(cmd)
}

fn spawn(cmd: Command) -> PtySession {
    let options = Options::new()
        .timeout_ms(Some(30_000))
        .strip_ansi_escape_codes(true);
    spawn_with_options(cmd, options).expect("engine starts in a pseudo-terminal")
}

/// Types `text` and Enter.
fn enter(p: &mut PtySession, text: &str) {
    p.send(text).unwrap();
    p.send("\r").unwrap();
    p.flush().unwrap();
}

/// Waits for the prompt `> `.
fn prompt(p: &mut PtySession) {
    p.exp_string("> ").expect("the prompt");
}

/// Waits for the next `--show-prompt` line and returns the prompt it shows.
fn shown_prompt(p: &mut PtySession) -> String {
    let (_, line) = p.exp_regex(r#"prompt: "[^\r\n]*"\r?\n"#).expect("a prompt: line");
    let json = utf8(line.trim_end().strip_prefix("prompt: ").unwrap());
    serde_json::from_str(&json).expect("a JSON string")
}

/// rexpect's text as the UTF-8 it read: it makes each byte a char.
fn utf8(read: &str) -> String {
    let bytes: Vec<u8> = read.chars().map(|c| c as u32 as u8).collect();
    String::from_utf8(bytes).expect("UTF-8")
}

/// Waits for the end of the output and the exit; asserts exit status 0.
fn ends_cleanly(p: &mut PtySession) -> String {
    let rest = p.exp_eof().expect("the end of the output");
    match p.process().wait().expect("the exit status") {
        WaitStatus::Exited(_, 0) => rest,
        other => panic!("engine chat ended with {other:?}; last output: {rest:?}"),
    }
}

/// `/help` lists the commands, an unknown `/word` gets a hint and is not sent, `/clear` forgets
/// the conversation (the next prompt is a first turn's again), `/quit` leaves; the lines typed
/// are kept in the history file.
#[test]
fn slash_commands_help_clear_and_quit_and_unknown_ones_are_not_sent() {
    let install = Install::new(&["cpu"]);
    let state = tempfile::tempdir().unwrap();
    let mut p = chat(&install, &tiny_it(), &[], state.path());
    prompt(&mut p);
    enter(&mut p, "/help");
    for line in ["/help", "/clear", "/exit, /quit"] {
        p.exp_string(line).expect("the help lists the command");
    }
    prompt(&mut p);
    enter(&mut p, "/frobnicate now");
    p.exp_string("/frobnicate: no such command (/help lists them)")
        .unwrap();
    prompt(&mut p);
    enter(&mut p, "Hello there");
    let first = shown_prompt(&mut p);
    assert!(!first.contains("frobnicate"), "{first}");
    assert!(first.ends_with("<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n"));
    assert_eq!(first.matches("<start_of_turn>user").count(), 1, "{first}");
    p.exp_string("answer").unwrap();
    prompt(&mut p);
    enter(&mut p, "And now?");
    let second = shown_prompt(&mut p);
    assert_eq!(second.matches("<start_of_turn>user").count(), 2, "{second}");
    prompt(&mut p);
    enter(&mut p, "/clear");
    p.exp_string("(the conversation is cleared)").unwrap();
    prompt(&mut p);
    enter(&mut p, "Hello there");
    assert_eq!(shown_prompt(&mut p), first, "/clear forgets the conversation");
    prompt(&mut p);
    enter(&mut p, "/quit");
    ends_cleanly(&mut p);
    let history = std::fs::read_to_string(state.path().join("tandem/chat_history")).unwrap();
    for line in [
        "/help",
        "/frobnicate now",
        "Hello there",
        "And now?",
        "/clear",
        "/quit",
    ] {
        assert!(history.lines().any(|l| l == line), "{line} not in {history:?}");
    }
}

/// Ctrl-D on an empty line leaves, with a newline after the prompt so that the shell's prompt
/// does not follow `> ` on the same line.
#[test]
fn ctrl_d_leaves_on_a_line_of_its_own() {
    let install = Install::new(&["cpu"]);
    let state = tempfile::tempdir().unwrap();
    let mut p = chat(&install, &tiny_it(), &[], state.path());
    prompt(&mut p);
    p.send_control('d').unwrap();
    let rest = ends_cleanly(&mut p);
    assert!(
        rest.contains('\n') && rest.trim().is_empty(),
        "after the prompt: {rest:?}"
    );
}

/// Ctrl-C at the prompt drops the line typed (the session goes on), and a second Ctrl-C, on the
/// empty line, leaves; one on an empty line alone only says how to leave.
#[test]
fn ctrl_c_at_the_prompt_clears_the_line_and_a_second_leaves() {
    let install = Install::new(&["cpu"]);
    let state = tempfile::tempdir().unwrap();
    let mut p = chat(&install, &tiny_it(), &[], state.path());
    prompt(&mut p);
    p.send("a draft").unwrap();
    p.flush().unwrap();
    p.exp_string("a draft").unwrap();
    p.send_control('c').unwrap();
    prompt(&mut p);
    enter(&mut p, "Hello there");
    let shown = shown_prompt(&mut p);
    assert!(!shown.contains("draft"), "the cleared line was sent: {shown}");
    p.exp_string("answer").unwrap();
    prompt(&mut p);
    // Alone on an empty line: a hint, and the session goes on.
    p.send_control('c').unwrap();
    p.exp_string("Ctrl-C again or Ctrl-D leaves").unwrap();
    prompt(&mut p);
    p.send_control('c').unwrap();
    ends_cleanly(&mut p);
}

/// Ctrl-C during a reply stops that reply, not the session: the text so far stays in the
/// conversation (the next turn's prompt holds it, shorter than the whole reply), and the next
/// turn is answered.
#[test]
fn ctrl_c_during_a_long_reply_stops_it_and_the_next_turn_works() {
    let install = Install::new(&["cpu"]);
    let state = tempfile::tempdir().unwrap();
    let flags = ["--context", "16384", "--max-tokens", "4000"];
    // The whole reply (about 3 s of tokens here), piped: what an unstopped reply would be.
    let whole = {
        let mut cmd = install.command();
        cmd.args(["chat", "--model", random().to_str().unwrap(), "--backend", "cpu"])
            .args(["--temperature", "0"])
            .args(flags)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let mut child = cmd.spawn().unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"Hello\n").unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let reply = text
            .strip_prefix("> ")
            .unwrap()
            .strip_suffix("\n> ")
            .unwrap()
            .to_string();
        assert!(reply.len() > 4000, "{reply:?}");
        reply
    };
    let mut p = chat(&install, &random(), &flags, state.path());
    prompt(&mut p);
    enter(&mut p, "Hello");
    shown_prompt(&mut p);
    // Some of the reply has come: stop it.
    p.exp_regex(r"[^\s]").unwrap();
    p.send_control('c').unwrap();
    prompt(&mut p);
    enter(&mut p, "Again");
    let next = shown_prompt(&mut p);
    let start = "<start_of_turn>model\n";
    let kept = &next[next.find(start).expect("the first reply") + start.len()..];
    let kept = &kept[..kept.find("<end_of_turn>").expect("its end")];
    assert!(!kept.is_empty(), "{next}");
    // (The chat template trims each turn.)
    assert!(
        whole.trim_start().starts_with(kept),
        "kept {kept:?}, not the start of the reply"
    );
    assert!(
        kept.len() < whole.len() / 2,
        "the reply ran on: {} of {} bytes kept",
        kept.len(),
        whole.len()
    );
    assert!(next.ends_with("<start_of_turn>user\nAgain<end_of_turn>\n<start_of_turn>model\n"));
    // The second turn is answered too (and stopped the same way).
    p.exp_regex(r"[^\s]").unwrap();
    p.send_control('c').unwrap();
    prompt(&mut p);
    p.send_control('d').unwrap();
    ends_cleanly(&mut p);
}

/// `engine run` on a terminal shows a long prompt's feeding on stderr (`prompt [bar] n/N tokens`)
/// and clears that line before the generated text is printed.
#[test]
fn run_shows_a_long_prompts_progress_on_a_terminal_and_clears_it_before_the_text() {
    let install = Install::new(&["cpu"]);
    // 3000 prompt tokens fed one per step: well over the bar's 0.3 s.
    let tokens = vec!["100"; 3000].join(",");
    let mut cmd = install.command();
    cmd.args(["run", "--model", random().to_str().unwrap(), "--backend", "cpu"])
        .args(["--tokens", &tokens, "--chunk", "1", "--context", "4096"])
        .args(["--max-tokens", "3", "--temperature", "0"])
        .env("TERM", "xterm");
    let options = Options::new().timeout_ms(Some(60_000));
    let mut p = spawn_with_options(cmd, options).unwrap();
    let out = p.exp_eof().unwrap();
    assert!(
        matches!(p.process().wait().unwrap(), WaitStatus::Exited(_, 0)),
        "{out:?}"
    );
    let bar = out
        .rfind("/3000 tokens")
        .unwrap_or_else(|| panic!("no progress line: {out:?}"));
    // The line's last clearing comes after its last drawing, and the text after both.
    let clear = out.rfind("\x1b[2K").expect("the line cleared");
    assert!(bar < clear, "{out:?}");
    let text = utf8(&out[clear + "\x1b[2K".len()..]);
    assert!(
        !text.trim().is_empty() && text.ends_with("\r\n"),
        "the text is not after the cleared line: {:?}",
        &out[bar..]
    );
}
