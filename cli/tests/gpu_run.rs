//! `engine backends` and `engine run --backend vulkan|wgpu` end to end, on whatever GPU is here
//! (lavapipe in CI) with the validation layers on: each GPU plugin is listed as available and
//! greedy generation on a transformers fixture gives the reference tokens.
//!
//! Without a GPU the tests say so and pass, except under CI (`CI` set).

mod common;

use common::Install;
use serde_json::Value;

#[test]
fn engine_run_generates_on_vulkan() {
    engine_run_generates_on("vulkan");
}

#[test]
fn engine_run_generates_on_wgpu() {
    engine_run_generates_on("wgpu");
}

fn engine_run_generates_on(backend: &str) {
    // Inherited by every engine the test starts.
    std::env::set_var("TANDEM_VULKAN_VALIDATION", "1");
    std::env::set_var("TANDEM_WGPU_VALIDATION", "1");
    let install = Install::new(&["cpu", backend]);
    if !common::gpu_available(&install, backend) {
        return;
    }
    let model = common::fixture("text-published");
    let greedy = greedy_reference();
    let mut args = greedy.run_args(model.to_str().unwrap());
    args.extend_from_slice(&["--backend", backend]);
    let out = install.run(&args);
    assert!(
        out.status.success(),
        "engine run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).expect("run JSON");
    assert_eq!(
        got["tokens"], greedy.generated,
        "greedy continuation on {backend}"
    );
}

#[test]
fn auto_passes_over_a_software_gpu() {
    let install = Install::new(&["cpu", "vulkan"]);
    let vulkan = common::backend_listing(&install, "vulkan");
    let dir = common::fixture("text-published");
    let out = install.run(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--tokens",
        "2,10,20",
        "--temperature",
        "0",
        "--max-tokens",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if vulkan["available"] == true && vulkan["info"]["kind"] == "software_gpu" {
        assert!(
            stderr.contains("note: using the cpu backend (vulkan runs on")
                && stderr.contains("a software GPU"),
            "auto should pass over {vulkan}: {stderr}"
        );
    } else {
        assert!(!stderr.contains("software GPU"), "{stderr}");
    }
}

/// The first greedy case of the `text-published` fixture's reference: its prompt as `--tokens`,
/// its `--max-tokens` and the ids transformers generated.
struct Greedy {
    prompt: String,
    max_tokens: String,
    generated: Value,
}

impl Greedy {
    /// `engine run` of this case on `model`, greedy, printing JSON (backend flags to follow).
    fn run_args<'a>(&'a self, model: &'a str) -> Vec<&'a str> {
        vec![
            "run",
            "--model",
            model,
            "--tokens",
            &self.prompt,
            "--temperature",
            "0",
            "--max-tokens",
            &self.max_tokens,
            "--json",
        ]
    }
}

fn greedy_reference() -> Greedy {
    let path = common::fixture("text-published").join("reference.json");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let g = &reference["greedy"][0];
    let prompt: Vec<String> = g["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap().to_string())
        .collect();
    Greedy {
        prompt: prompt.join(","),
        max_tokens: g["max_new_tokens"].as_u64().unwrap().to_string(),
        generated: g["generated"].clone(),
    }
}

/// The prefill op offload on Vulkan (lavapipe in CI, validation on): with layer 0 on the GPU and
/// the rest on the CPU, and the offload forced from one row (`TANDEM_PREFILL_OFFLOAD_ROWS=1`;
/// it starts at 32 rows otherwise), every node of the CPU-held layers, attention included (over
/// a copy of their KV caches), runs on the GPU in the prompt's step, with their weights copied
/// from host memory. Greedy tokens stay the reference ones, and the logits of every prompt
/// position stay within the GPU's tolerance of the same split without the offload. From 8 rows
/// with 8-row chunks, the prompt's first two chunks run offloaded and its last (2 rows) and the
/// decode steps on the CPU, after the KV hand-off of the rows the GPU wrote: the same tokens.
#[test]
fn prefill_offload_gives_the_split_s_tokens_and_logits_on_vulkan() {
    std::env::set_var("TANDEM_VULKAN_VALIDATION", "1");
    let install = Install::new(&["cpu", "vulkan"]);
    if !common::gpu_available(&install, "vulkan") {
        return;
    }
    let dir = common::fixture("text-published");
    let model = dir.to_str().unwrap();
    let greedy = greedy_reference();
    let (prompt, generated) = (&greedy.prompt, &greedy.generated);
    let split = ["--backend", "vulkan", "--gpu-layers", "1"];
    // The threshold is set for each engine run alone (the engine reads it at load).
    let run = |rows: &str, args: &[&str]| {
        let out = install.run_env(args, &[("TANDEM_PREFILL_OFFLOAD_ROWS", rows)]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out
    };
    let mut args = greedy.run_args(model);
    args.extend_from_slice(&split);
    let out = run("1", &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("prefill offload: vulkan runs"),
        "no offload note: {stderr}"
    );
    assert!(
        stderr.contains("attentions over a copy of their KV caches"),
        "attention stayed on the CPU: {stderr}"
    );
    let got: Value = serde_json::from_slice(&out.stdout).expect("run JSON");
    assert_eq!(&got["tokens"], generated, "greedy continuation with the offload");
    let mut chunked = args.clone();
    chunked.extend_from_slice(&["--chunk", "8"]);
    let out = run("8", &chunked);
    let got: Value = serde_json::from_slice(&out.stdout).expect("run JSON");
    assert_eq!(
        &got["tokens"], generated,
        "greedy continuation after the KV hand-off"
    );
    let mut args = vec!["logits", "--model", model, "--tokens", prompt, "--json"];
    args.extend_from_slice(&split);
    let logits = |rows: &str| -> Vec<Vec<f64>> {
        let out = run(rows, &args);
        let v: Value = serde_json::from_slice(&out.stdout).expect("logits JSON");
        serde_json::from_value(v["logits"].clone()).expect("rows of logits")
    };
    let (with, without) = (logits("1"), logits("0"));
    assert_eq!(with.len(), without.len());
    assert!(!with.is_empty() && !with[0].is_empty());
    // The products ran elsewhere: the GPU's f32 products round unlike the CPU's kernels.
    assert_ne!(with, without, "the offload changed nothing: did it run?");
    // At the default threshold (32 rows) the prompt's step of fewer rows runs as decode does.
    assert!(
        with.len() < 32,
        "the fixture's prompt has grown: {} rows",
        with.len()
    );
    assert_eq!(
        logits("32"),
        without,
        "a step under the threshold took the offload"
    );
    for (a, b) in with.iter().zip(&without) {
        let scale = b.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(worst <= 1e-3 * scale, "logits moved by {worst} (largest {scale})");
    }
}

/// The prefill op offload under a budget that holds the GPU's own layers but not a copy of the
/// others' KV caches (`memory_limit = "70MiB"` with a 32,768-token context: the copies would take
/// the GPU's need from about 67 to 74 MiB): attention stays on the CPU, the note says why, and the
/// greedy tokens are still the reference ones.
#[test]
fn prefill_offload_keeps_attention_on_the_cpu_without_room_for_the_caches() {
    std::env::set_var("TANDEM_VULKAN_VALIDATION", "1");
    let install = Install::new(&["cpu", "vulkan"]);
    if !common::gpu_available(&install, "vulkan") {
        return;
    }
    let dir = common::fixture("text-published");
    let model = dir.to_str().unwrap();
    let tmp = tempfile::tempdir().expect("temp dir");
    let config = tmp.path().join("limit.toml");
    std::fs::write(&config, "[backend.vulkan]\nmemory_limit = \"70MiB\"\n").expect("config");
    let greedy = greedy_reference();
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend(greedy.run_args(model));
    args.extend_from_slice(&["--backend", "vulkan", "--gpu-layers", "1"]);
    args.extend_from_slice(&["--context", "32768", "--chunk", "8"]);
    let out = install.run_env(&args, &[("TANDEM_PREFILL_OFFLOAD_ROWS", "8")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("not their attention: no room for their KV caches"),
        "attention moved without room for its caches: {stderr}"
    );
    let got: Value = serde_json::from_slice(&out.stdout).expect("run JSON");
    assert_eq!(
        got["tokens"], greedy.generated,
        "greedy continuation with attention on the CPU"
    );
}

/// `[backend.vulkan] devices = [...]` with `--backend vulkan`: one instance per device, the
/// layers spread over them by their memory (two instances of lavapipe's one device here, so
/// half each), and greedy tokens still the reference ones.
#[test]
fn devices_spread_the_layers_over_instances() {
    std::env::set_var("TANDEM_VULKAN_VALIDATION", "1");
    let install = Install::new(&["cpu", "vulkan"]);
    if !common::gpu_available(&install, "vulkan") {
        return;
    }
    let dir = common::fixture("text-published");
    let model = dir.to_str().unwrap();
    let tmp = tempfile::tempdir().expect("temp dir");
    let config = tmp.path().join("devices.toml");
    std::fs::write(&config, "[backend.vulkan]\ndevices = [0, 0]\n").expect("config");
    let config = config.to_str().unwrap();
    let out = install.run(&[
        "--config",
        config,
        "placement",
        "--model",
        model,
        "--backend",
        "vulkan",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("layers: vulkan: layers 0-2, embedding; vulkan#2: layers 3-5, head"),
        "{text}"
    );
    // Greedy tokens over the two instances, then with the prompt's step (18 rows) in three
    // pieces pipelined over them, each piece's attention reading the earlier pieces' caches.
    let greedy = greedy_reference();
    let piped = tmp.path().join("piped.toml");
    std::fs::write(
        &piped,
        "[backend.vulkan]\ndevices = [0, 0]\n[placement]\nprefill_micro_batches = 3\n",
    )
    .expect("config");
    for (cfg, how) in [
        (config, "whole steps"),
        (piped.to_str().unwrap(), "the prompt in pieces"),
    ] {
        let mut args = vec!["--config", cfg];
        args.extend(greedy.run_args(model));
        args.extend_from_slice(&["--backend", "vulkan"]);
        let out = install.run(&args);
        assert!(
            out.status.success(),
            "{how}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Value = serde_json::from_slice(&out.stdout).expect("run JSON");
        assert_eq!(
            got["tokens"], greedy.generated,
            "greedy continuation over two instances, {how}"
        );
    }
    // --gpu-layers takes one device: with devices named, a clean error.
    let out = install.run(&[
        "--config",
        config,
        "placement",
        "--model",
        model,
        "--backend",
        "vulkan",
        "--gpu-layers",
        "2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("devices"), "{err}");
}
