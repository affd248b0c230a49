//! `engine backends` and `engine run --backend vulkan|wgpu` end to end, on whatever GPU is here
//! (lavapipe in CI) with the validation layers on: each GPU plugin is listed as available and
//! greedy generation on a transformers fixture gives the reference tokens.
//!
//! Without a GPU the tests say so and pass, except under CI (`CI` set).

mod common;

use std::path::PathBuf;

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
    let out = install.run(&["backends", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let listed: Value = serde_json::from_str(&text).expect("backends JSON");
    let listing = listed["backends"]
        .as_array()
        .and_then(|a| a.iter().find(|b| b["name"] == backend))
        .cloned()
        .unwrap_or_else(|| panic!("{backend} is not listed: {text}"));
    if listing["available"] != true {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the {backend} backend (lavapipe): {listing}"
        );
        eprintln!("skipping: the {backend} backend is unavailable here: {listing}");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/text-published");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let g = &reference["greedy"][0];
    let prompt: Vec<String> = g["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap().to_string())
        .collect();
    let n = g["max_new_tokens"].as_u64().unwrap().to_string();
    let out = install.run(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--tokens",
        &prompt.join(","),
        "--temperature",
        "0",
        "--max-tokens",
        &n,
        "--backend",
        backend,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "engine run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).expect("run JSON");
    assert_eq!(got["tokens"], g["generated"], "greedy continuation on {backend}");
}

#[test]
fn auto_passes_over_a_software_gpu() {
    let install = Install::new(&["cpu", "vulkan"]);
    let out = install.run(&["backends", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: Value = serde_json::from_slice(&out.stdout).expect("backends JSON");
    let vulkan = listed["backends"]
        .as_array()
        .and_then(|a| a.iter().find(|b| b["name"] == "vulkan"))
        .cloned()
        .expect("vulkan is listed");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/text-published");
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
