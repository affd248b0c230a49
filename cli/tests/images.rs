//! Images in prompts through the binary (issue 58), on the tiny multimodal `vision` fixture
//! (tests/fixtures/models/vision, transformers' reference.json): `engine run --image`, `engine
//! chat`'s `/image` and `engine serve`'s chat completions with `image_url` data URLs give
//! transformers' greedy tokens, also
//! for two image requests in the same steps; bad images, remote URLs and a model without a
//! vision tower are clear errors, and the server keeps serving.

mod common;
mod http;

use std::path::PathBuf;

use common::{error_line, fixture, ids, text_published, Install};
use http::{post, Server};
use serde_json::{json, Value};

fn reference() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(fixture("vision").join("reference.json")).expect("reference"),
    )
    .expect("JSON")
}

fn image(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/images")
        .join(name)
}

/// The reference's greedy tokens for `image`'s prompt of `kind`.
fn greedy(r: &Value, image: &str, kind: &str) -> Vec<u32> {
    let im = r["images"]
        .as_array()
        .expect("images")
        .iter()
        .find(|i| i["image"] == image)
        .expect("the image");
    let p = im["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .find(|p| p["kind"] == kind)
        .expect("the prompt");
    ids(&p["greedy"]["generated"])
}

#[test]
fn run_with_an_image_gives_transformers_greedy_tokens_and_bad_input_is_an_error() {
    let install = Install::new(&["cpu"]);
    let r = reference();
    let model = fixture("vision").to_string_lossy().into_owned();
    for name in ["photo.png", "tiny_gray.png"] {
        let file = image(name).to_string_lossy().into_owned();
        // The raw prompt without its marker: the image goes first.
        let args = [
            "run",
            "--model",
            &model,
            "--backend",
            "cpu",
            "--prompt",
            "What is this?",
            "--image",
            &file,
            "--max-tokens",
            "8",
            "--temperature",
            "0",
            "--json",
        ];
        let out = install.run(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(ids(&doc["tokens"]), greedy(&r, name, "raw"), "{name}");
    }
    let missing = [
        "run",
        "--model",
        &model,
        "--backend",
        "cpu",
        "--prompt",
        "hi",
        "--image",
        "no-such.png",
    ];
    let line = error_line(&missing, &install.run(&missing));
    assert!(line.contains("reading the image no-such.png"), "{line}");
    let text = text_published();
    let photo = image("photo.png").to_string_lossy().into_owned();
    let no_tower = [
        "run",
        "--model",
        &text,
        "--backend",
        "cpu",
        "--prompt",
        "hi",
        "--image",
        &photo,
    ];
    let line = error_line(&no_tower, &install.run(&no_tower));
    assert!(line.contains("the model has no vision tower"), "{line}");
    assert!(line.contains("text-published"), "{line}");
}

fn chat_request(image: &str) -> Value {
    let bytes = std::fs::read(crate::image(image)).expect("image");
    let url = format!("data:image/png;base64,{}", base64::encode(bytes));
    json!({
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is it?"},
        ]}],
        "max_tokens": 8,
        "temperature": 0,
    })
}

fn token_ids(addr: &str, doc: &Value) -> Vec<u32> {
    let r = post(addr, "/v1/chat/completions", doc);
    assert_eq!(r.status, 200, "{}", r.text());
    ids(&r.json()["choices"][0]["token_ids"])
}

#[test]
fn serve_takes_image_url_parts_and_refuses_what_it_cannot_read() {
    let install = Install::new(&["cpu"]);
    let r = reference();
    let model = fixture("vision").to_string_lossy().into_owned();
    let server = Server::start(
        &install.path().join("engine"),
        &[
            "--model",
            &model,
            "--backend",
            "cpu",
            "--max-images",
            "2",
            "--chunk",
            "6",
        ],
    );
    let addr = server.addr.clone();
    let (photo, gray) = (chat_request("photo.png"), chat_request("tiny_gray.png"));
    assert_eq!(token_ids(&addr, &photo), greedy(&r, "photo.png", "chat"));
    // Two image requests at once (their prompts read in the same steps, each image in its own
    // place of the table), then the first again (its slot's prefix ends before the image).
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| token_ids(&addr, &photo));
        let b = s.spawn(|| token_ids(&addr, &gray));
        (a.join().expect("a"), b.join().expect("b"))
    });
    assert_eq!(a, greedy(&r, "photo.png", "chat"));
    assert_eq!(b, greedy(&r, "tiny_gray.png", "chat"));
    assert_eq!(token_ids(&addr, &gray), greedy(&r, "tiny_gray.png", "chat"));
    // Refused with the part named, and the server goes on.
    for (url, want) in [
        ("https://example.com/a.png", "URLs are not fetched"),
        ("data:image/png;base64,AAAA", "unsupported image format"),
        ("data:image/png;base64,%%%", "not valid base64"),
    ] {
        let doc = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}]});
        let resp = post(&addr, "/v1/chat/completions", &doc);
        assert_eq!(resp.status, 400, "{}", resp.text());
        let message = resp.json()["error"]["message"]
            .as_str()
            .expect("message")
            .to_string();
        assert!(message.contains("messages[0].content[0].image_url"), "{message}");
        assert!(message.contains(want), "{message}");
    }
    assert_eq!(token_ids(&addr, &photo), greedy(&r, "photo.png", "chat"));
    drop(server);
    // A server started without image input refuses an image part.
    let plain = Server::start(
        &install.path().join("engine"),
        &["--model", &model, "--backend", "cpu"],
    );
    let resp = post(&plain.addr, "/v1/chat/completions", &photo);
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert!(
        resp.text().contains("this server takes no images"),
        "{}",
        resp.text()
    );
}

#[test]
fn bench_measures_the_tower_and_the_image_prefill() {
    let install = Install::new(&["cpu"]);
    let model = fixture("vision").to_string_lossy().into_owned();
    let photo = image("photo.png").to_string_lossy().into_owned();
    // The tower from llama.cpp's mmproj file of the fixture (the batch sizes still run on text).
    let mmproj = fixture("vision")
        .join("mmproj-f32.gguf")
        .to_string_lossy()
        .into_owned();
    let args = [
        "bench",
        "--model",
        &model,
        "--mmproj",
        &mmproj,
        "--backend",
        "cpu",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "2",
        "--repeat",
        "1",
        "--image",
        &photo,
        "--json",
    ];
    let out = install.run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let im = &doc["image"];
    assert_eq!(im["image"], "photo.png", "{doc}");
    assert_eq!(im["tower_unit"], "cpu");
    assert_eq!(im["tokens_per_image"], 4);
    // BOS, "\n\n", <start_of_image>, 4 soft tokens, <end_of_image>, "\n\n" and the text.
    assert!(im["prompt_tokens"].as_u64().expect("prompt_tokens") > 9, "{im}");
    for key in ["encode_ms", "prefill_tokens_per_s", "first_logits_ms"] {
        assert!(im[key].as_f64().expect(key) > 0.0, "{key}: {im}");
    }
    assert!(im["first_logits_ms"].as_f64() >= im["encode_ms"].as_f64(), "{im}");
}

#[test]
fn the_vision_tower_takes_the_first_unit_of_its_list_that_runs_it() {
    let install = Install::new(&["cpu"]);
    let cfg = install.config("[placement]\nvision = [\"nosuch\", \"cpu\"]\n");
    let model = fixture("vision").to_string_lossy().into_owned();
    let photo = image("photo.png").to_string_lossy().into_owned();
    let args = [
        "run",
        "--config",
        &cfg,
        "--model",
        &model,
        "--backend",
        "cpu",
        "--prompt",
        "What is this?",
        "--image",
        &photo,
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--json",
    ];
    let out = install.run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("the vision tower passed over nosuch"), "{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(ids(&doc["tokens"]), greedy(&reference(), "photo.png", "raw"));
    // Nothing in the list runs it: an error naming what was tried.
    // (The same file as `--config` names.)
    assert_eq!(install.config("[placement]\nvision = [\"nosuch\"]\n"), cfg);
    let line = error_line(&args, &install.run(&args));
    assert!(line.contains("nosuch"), "{line}");
}

/// `engine bench --image --profile` on the fixture: the image round's figures, and the tower's
/// profile by op kind, one `block_attention` node per vision layer.
#[test]
fn bench_profiles_the_vision_tower() {
    let install = Install::new(&["cpu"]);
    let model = fixture("vision").to_string_lossy().into_owned();
    let photo = image("photo.png").to_string_lossy().into_owned();
    let out = install.run(&[
        "bench",
        "--model",
        &model,
        "--backend",
        "cpu",
        "--image",
        &photo,
        "--prompt-tokens",
        "4",
        "--gen-tokens",
        "2",
        "--repeat",
        "1",
        "--profile",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let im = &doc["image"];
    assert!(im["encode_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{im}");
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("vision").join("config.json")).expect("config"),
    )
    .expect("config JSON");
    assert_eq!(im["tokens_per_image"], config["mm_tokens_per_image"], "{im}");
    let ops = im["profile"].as_array().expect("a tower profile");
    let attention = ops
        .iter()
        .find(|o| o["op"] == "block_attention")
        .unwrap_or_else(|| panic!("no block_attention in {ops:?}"));
    assert_eq!(
        attention["nodes"], config["vision_config"]["num_hidden_layers"],
        "{attention}"
    );
    assert!(
        ops.iter()
            .all(|o| o["seconds"].as_f64().is_some_and(|s| s >= 0.0)),
        "{ops:?}"
    );
}

/// `engine placement` with image input on: the tower's unit and each candidate's verdict, in
/// the text and the JSON, nothing uploaded; the NPU (its emulator here) refuses the tower's
/// ops with a reason.
#[test]
fn placement_reports_where_the_vision_tower_runs() {
    let install = Install::new(&["cpu", "npu_emu"]);
    let cfg = install.config("[placement]\nvision = [\"nosuch\", \"npu-emu\", \"cpu\"]\n");
    let model = fixture("vision").to_string_lossy().into_owned();
    let args = [
        "placement",
        "--config",
        &cfg,
        "--model",
        &model,
        "--backend",
        "cpu",
        "--max-images",
        "1",
    ];
    let out = install.run(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tower = text
        .lines()
        .find(|l| l.starts_with("vision tower: "))
        .unwrap_or_else(|| panic!("no tower line: {text}"));
    assert!(tower.ends_with(", on cpu"), "{tower}");
    assert!(tower.contains("(the model's own tower)"), "{tower}");
    assert!(text.contains("\n  nosuch     not available: "), "{text}");
    assert!(text.contains("\n  npu-emu    refuses: "), "{text}");
    assert!(text.contains("\n  cpu        runs the tower\n"), "{text}");
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = install.run(&json_args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let v = &doc["vision"];
    assert_eq!(v["unit"], "cpu", "{v}");
    assert!(v["weight_bytes"].as_u64().is_some_and(|b| b > 0), "{v}");
    let names: Vec<&str> = v["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["nosuch", "npu-emu", "cpu"]);
    // Without image input the report has no tower.
    let out = install.run(&["placement", "--model", &model, "--backend", "cpu", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(doc.get("vision").is_none(), "{doc}");
}

/// The fixture's text of `ids` from its tokenizer.json's pieces (`▁` a space, `<0xNN>` a byte).
fn decode(ids: &[u32]) -> String {
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("vision").join("tokenizer.json")).expect("tokenizer.json"),
    )
    .expect("JSON");
    let vocab = doc["model"]["vocab"].as_object().expect("vocab");
    let mut bytes = Vec::new();
    for &id in ids {
        let piece = vocab
            .iter()
            .find(|(_, v)| v.as_u64() == Some(u64::from(id)))
            .map(|(p, _)| p.as_str())
            .expect("the id's piece");
        match piece.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
            Some(hex) => bytes.push(u8::from_str_radix(hex, 16).expect("a byte")),
            None => bytes.extend(piece.replace('\u{2581}', " ").into_bytes()),
        }
    }
    String::from_utf8(bytes).expect("UTF-8")
}

/// `engine chat`'s `/image FILE` on the fixture: the turn's prompt is transformers' chat
/// rendering with the image's marker, and the greedy reply is transformers' tokens.
#[test]
fn chat_answers_an_image_prompt_with_transformers_tokens() {
    use std::io::Write;
    let install = Install::new(&["cpu"]);
    let r = reference();
    let model = fixture("vision").to_string_lossy().into_owned();
    let photo = image("photo.png").to_string_lossy().into_owned();
    let mut child = install
        .command()
        .args(["chat", "--model", &model, "--backend", "cpu", "--max-images", "1"])
        .args(["--temperature", "0", "--max-tokens", "8", "--show-prompt"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("engine starts");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(format!("/image {photo}\nWhat is it?\n").as_bytes())
        .expect("write stdin");
    drop(stdin);
    let out = child.wait_with_output().expect("engine ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("(1 image(s) for the next turn)"), "{stderr}");
    let chat = r["images"][0]["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .find(|p| p["kind"] == "chat")
        .expect("the chat prompt");
    let shown = stderr
        .lines()
        .find_map(|l| l.strip_prefix("prompt: "))
        .map(|j| serde_json::from_str::<String>(j).expect("a JSON string"))
        .unwrap_or_else(|| panic!("no prompt shown: {stderr}"));
    assert_eq!(shown, chat["text"].as_str().expect("text"));
    let reply = decode(&greedy(&r, "photo.png", "chat"));
    assert!(stdout.contains(&reply), "{stdout:?} lacks {reply:?}");
}
