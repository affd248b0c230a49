//! `engine bench` end to end on a tiny synthetic shape: the JSON it prints validates against
//! the documented schema (docs/bench-schema.json), its figures are positive, and
//! `engine bench --report` renders it. On a Vulkan device (lavapipe in CI) the result also
//! carries per-op device times from the GPU timestamps.

mod common;

use std::path::Path;

use common::Install;
use serde_json::Value;
use tandem_cli::report::{load_result, validate_against_schema};

fn schema() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench-schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("schema")).expect("schema JSON")
}

fn bench(install: &Install, backend: &str) -> Value {
    let out = install.run(&[
        "bench",
        "--profile",
        "--synthetic",
        "tiny",
        "--dtype",
        "q8_0",
        "--backend",
        backend,
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "4",
        "--batch",
        "1,2",
        "--repeat",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "engine bench --backend {backend}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("bench prints JSON")
}

#[test]
fn bench_json_follows_the_schema_and_renders() {
    let cache = tempfile::tempdir().expect("tempdir");
    std::env::set_var("TANDEM_CACHE_DIR", cache.path());
    std::env::set_var("TANDEM_VULKAN_VALIDATION", "1");
    let install = Install::new(&["cpu", "vulkan"]);
    let schema = schema();

    let cpu = bench(&install, "cpu");
    validate_against_schema(&cpu, &schema).unwrap_or_else(|e| panic!("cpu result: {e}\n{cpu:#}"));
    let runs = cpu["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "one run per batch size");
    for (run, batch) in runs.iter().zip([1, 2]) {
        assert_eq!(run["batch"], batch);
        for field in ["prefill_tokens_per_s", "decode_tokens_per_s", "ttft_ms"] {
            let median = run[field]["median"].as_f64().expect(field);
            assert!(median > 0.0, "{field} = {median}");
            assert!(run[field]["min"].as_f64() <= Some(median) && Some(median) <= run[field]["max"].as_f64());
        }
        assert!(run["decode_bytes_per_step"].as_u64() > Some(0));
        // The CPU's profile is each node's wall time: every op of the graph, none negative.
        for step in ["prefill", "decode"] {
            let ops = run["profile"][step].as_array().expect("a CPU profile");
            assert!(
                ops.iter()
                    .any(|o| o["op"].as_str().is_some_and(|s| s.starts_with("matmul(q8_0)"))),
                "{step}: {ops:?}"
            );
            assert!(
                ops.iter().all(|o| o["seconds"].as_f64() >= Some(0.0)),
                "{step}: {ops:?}"
            );
        }
    }
    assert!(cpu["limits"]["peak_flops"].as_f64() > Some(0.0));
    assert!(
        cpu["limits"]["copy_bandwidth_source"]
            .as_str()
            .is_some_and(|s| s.starts_with("host memcpy")),
        "{cpu:#}"
    );
    // One unit: no split times. Two CPU instances: each unit's share of a decode step.
    assert!(runs.iter().all(|r| r.get("split_host_ms").is_none()), "{cpu:#}");
    let split = bench(&install, "cpu+cpu");
    validate_against_schema(&split, &schema).unwrap_or_else(|e| panic!("cpu+cpu result: {e}\n{split:#}"));
    let host = split["runs"][0]["split_host_ms"].as_array().expect("split times");
    let units: Vec<&str> = host.iter().filter_map(|u| u["unit"].as_str()).collect();
    assert_eq!(units, ["cpu#2", "cpu"], "{host:?}");
    // A split's profile names each op's unit.
    let ops = split["runs"][0]["profile"]["decode"]
        .as_array()
        .expect("a split profile");
    let unit_of = |o: &Value| {
        o["op"]
            .as_str()
            .and_then(|s| s.split_once(": "))
            .map(|(u, _)| u.to_string())
    };
    let named: Vec<Option<String>> = ops.iter().map(unit_of).collect();
    assert!(
        named
            .iter()
            .all(|u| matches!(u.as_deref(), Some("cpu" | "cpu#2")))
            && named.iter().any(|u| u.as_deref() == Some("cpu#2")),
        "{ops:?}"
    );
    // Each CPU unit computes its part inside execute: time spent there, none negative.
    assert!(host.iter().all(|u| u["execute"].as_f64() > Some(0.0)), "{host:?}");
    assert!(host
        .iter()
        .all(|u| u["wait"].as_f64() >= Some(0.0) && u["copy"].as_f64() >= Some(0.0)));
    let mut files = vec![];
    let json_path = cache.path().join("cpu.json");
    std::fs::write(&json_path, serde_json::to_string(&cpu).expect("json")).expect("write");
    files.push(json_path);

    let listed: Value =
        serde_json::from_slice(&install.run(&["backends", "--json"]).stdout).expect("backends");
    let vulkan_up = listed["backends"]
        .as_array()
        .and_then(|a| a.iter().find(|b| b["name"] == "vulkan"))
        .is_some_and(|b| b["available"] == true);
    assert!(
        vulkan_up || std::env::var_os("CI").is_none(),
        "CI runs the Vulkan backend"
    );
    if vulkan_up {
        let gpu = bench(&install, "vulkan");
        validate_against_schema(&gpu, &schema).unwrap_or_else(|e| panic!("vulkan result: {e}\n{gpu:#}"));
        let run = &gpu["runs"][0];
        let decode = run["profile"]["decode"].as_array().expect("a decode profile");
        assert!(
            decode
                .iter()
                .any(|o| o["op"].as_str().is_some_and(|s| s.starts_with("attention"))),
            "{decode:?}"
        );
        assert!(decode.iter().all(|o| o["seconds"].as_f64() >= Some(0.0)));
        assert!(run["device_memory_bytes"].as_u64() > Some(0), "{run:#}");
        assert!(
            gpu["limits"]["copy_bandwidth_source"]
                .as_str()
                .is_some_and(|s| s.starts_with("vulkan")),
            "{gpu:#}"
        );
        let json_path = cache.path().join("vulkan.json");
        std::fs::write(&json_path, serde_json::to_string(&gpu).expect("json")).expect("write");
        files.push(json_path);
    }

    let report = cache.path().join("report");
    let mut args = vec![
        "bench".to_string(),
        "--report".into(),
        report.display().to_string(),
    ];
    args.extend(files.iter().map(|f| f.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = install.run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let md = std::fs::read_to_string(report.join("report.md")).expect("report.md");
    assert!(md.contains("| tandem | cpu"), "{md}");
    if vulkan_up {
        assert!(md.contains("## Where the device time goes"), "{md}");
    }
    for f in &files {
        load_result(f).expect("the written result loads back");
    }
}

/// `--verify-rows` and `--draft ngram --prompt-file`: the curve's points and the speculative
/// run are in the JSON, which still follows the schema; the speculative tokens are the plain
/// ones.
#[test]
fn bench_measures_the_verification_curve_and_a_speculative_run() {
    // Its own cache directory, given to its processes alone: the other test of this binary
    // sets the variable for the whole process, and both run at once.
    let cache = tempfile::tempdir().expect("tempdir");
    let cache_dir = cache.path().to_string_lossy().into_owned();
    let env = [("TANDEM_CACHE_DIR", cache_dir.as_str())];
    let install = Install::new(&["cpu"]);
    let prompt = cache.path().join("prompt.txt");
    std::fs::write(
        &prompt,
        "one two three four five six. one two three four five six. one two",
    )
    .unwrap();
    let prompt = prompt.to_string_lossy().into_owned();
    let out = install.run_env(
        &[
            "bench",
            "--synthetic",
            "tiny",
            "--dtype",
            "q8_0",
            "--backend",
            "cpu",
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "12",
            "--repeat",
            "1",
            "--verify-rows",
            "4",
            "--draft",
            "ngram",
            "--prompt-file",
            &prompt,
            "--json",
        ],
        &env,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("bench prints JSON");
    validate_against_schema(&v, &schema()).unwrap_or_else(|e| panic!("{e}\n{v:#}"));
    let curve = v["verify_curve"].as_array().expect("a curve");
    assert_eq!(curve.len(), 4);
    assert_eq!(curve[0]["ratio"].as_f64(), Some(1.0));
    assert!(curve.iter().all(|p| p["ms"].as_f64() > Some(0.0)), "{curve:?}");
    let s = &v["speculation"];
    assert_eq!(s["same_tokens"], true, "{s}");
    assert_eq!(s["gen_tokens"], 12);
    assert!(s["tokens_per_s"].as_f64() > Some(0.0) && s["plain_tokens_per_s"].as_f64() > Some(0.0));
    // Without a drafter the prompt file is refused, naming both flags.
    let out = install.run_env(
        &[
            "bench",
            "--synthetic",
            "tiny",
            "--backend",
            "cpu",
            "--prompt-file",
            &prompt,
        ],
        &env,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--prompt-file") && err.contains("--draft"), "{err}");
}
