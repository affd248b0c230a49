//! Issue 53 ("lost output"): the text `engine run` streams is the decode of the ids it generated,
//! also where byte tokens form invalid UTF-8. On the `text-published` fixture this prompt makes
//! the model write `l`, `<0xE1>`, `#`, four `<0xAB>` (not UTF-8 as a run: seven U+FFFD in
//! `tokenizer.json`'s decode) and then words; the stream released `l` and then nothing more.

mod common;

use std::path::PathBuf;

use common::Install;
use serde_json::{json, Value};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/text-published")
}

#[test]
fn invalid_byte_runs_lose_no_text() {
    let install = Install::new(&["cpu"]);
    let model = fixture();
    let mut args = vec![
        "run",
        "--model",
        model.to_str().unwrap(),
        "--backend",
        "cpu",
        "--tokens",
        "2,17,5,9,11,30",
        "--temperature",
        "0",
        "--repeat-penalty",
        "1.3",
        "--max-tokens",
        "16",
    ];
    let want = format!("{}OOO con con", "\u{FFFD}".repeat(7));

    let out = install.run(&args);
    assert!(
        out.status.success(),
        "engine {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{want}\n"));

    args.push("--json");
    let out = install.run(&args);
    assert!(
        out.status.success(),
        "engine {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(
        v["tokens"],
        json!([118, 235, 45, 181, 181, 181, 181, 292, 292, 292, 484, 484, 1])
    );
    assert_eq!(v["text"], json!(want));
}
