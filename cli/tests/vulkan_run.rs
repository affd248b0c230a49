//! `engine backends` and `engine run --backend vulkan` end to end, on whatever Vulkan device is
//! here (lavapipe in CI) with the validation layer on: the plugin is listed as available and
//! greedy generation on a transformers fixture gives the reference tokens.
//!
//! Without a Vulkan device the test says so and passes, except under CI (`CI` set).

mod common;

use std::path::PathBuf;

use common::Install;
use serde_json::Value;

#[test]
fn engine_run_generates_on_vulkan() {
    // Inherited by every engine the test starts.
    std::env::set_var("TANDEM_VULKAN_VALIDATION", "1");
    let install = Install::new(&["cpu", "vulkan"]);
    let out = install.run(&["backends", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let listed: Value = serde_json::from_str(&text).expect("backends JSON");
    let vulkan = listed["backends"]
        .as_array()
        .and_then(|a| a.iter().find(|b| b["name"] == "vulkan"))
        .cloned()
        .unwrap_or_else(|| panic!("vulkan is not listed: {text}"));
    if vulkan["available"] != true {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the Vulkan backend (lavapipe): {vulkan}"
        );
        eprintln!("skipping: the Vulkan backend is unavailable here: {vulkan}");
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
        "vulkan",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "engine run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).expect("run JSON");
    assert_eq!(got["tokens"], g["generated"], "greedy continuation on vulkan");
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
