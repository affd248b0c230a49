//! The precision rule (docs/precision.md): on the real default model over a public-domain text
//! (tests/fixtures/text, Jules Verne's *Around the World in Eighty Days*, chapters I-V), every
//! backend's `precision = "fast"` against its `"exact"`, by `engine perplexity
//! --kl-divergence`: mean KL divergence <= 1e-3, the same top token >= 98% of the time, and
//! perplexity within 0.5%. Steps of 4 rows (`--chunk 4`), so the decode-shaped products the fast
//! path covers score every token, and of 64 (the prefill products); 8 chunks of 512 tokens.

mod common;

use common::Install;
use serde_json::Value;

/// The text the rule is checked on.
fn text() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/text/around-the-world-in-80-days-1-5.txt")
}

#[test]
fn fast_precision_on_the_cpu_keeps_the_rule_on_the_default_model() {
    rule_holds("4");
}

/// The same with steps of 64 rows: the prefill products' fast paths (8-bit activations on
/// AVX-512 VNNI, bfloat16 AMX tiles where the CPU has AMX-BF16).
#[test]
fn fast_prefill_products_keep_the_rule_on_the_default_model() {
    rule_holds("64");
}

/// `engine perplexity` over 8 chunks of the text in steps of `chunk` rows, fast against exact.
fn rule_holds(chunk: &str) {
    let Some(model) = common::default_model() else {
        return;
    };
    let install = Install::new(&["cpu"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let config = |precision: &str| {
        let p = dir.path().join(format!("{precision}.toml"));
        std::fs::write(&p, format!("[backend.cpu]\nprecision = \"{precision}\"\n")).expect("config");
        p
    };
    let (exact, fast) = (config("exact"), config("fast"));
    let base = dir.path().join("exact.kl");
    let (model, text, base_s) = (model.to_str().unwrap(), text(), base.to_str().unwrap());
    let text = text.to_str().unwrap();
    let common = [
        "perplexity",
        "--model",
        model,
        "--backend",
        "cpu",
        "--file",
        text,
        "--chunk",
        chunk,
        "--chunks",
        "8",
    ];
    let run = |config: &std::path::Path, extra: &[&str]| -> Value {
        let mut args = vec!["--config", config.to_str().unwrap()];
        args.extend_from_slice(&common);
        args.extend_from_slice(extra);
        args.push("--json");
        let out = install.run(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("perplexity JSON")
    };
    run(&exact, &["--kl-divergence-base", base_s]);
    let got = run(&fast, &["--kl-divergence", base_s]);
    let kl = &got["kl_divergence"];
    let f = |key: &str| kl[key].as_f64().unwrap_or_else(|| panic!("{key} in {kl}"));
    assert_eq!(kl["tokens"].as_u64(), Some(8 * 256), "{kl}");
    eprintln!(
        "fast against exact, steps of {chunk}: mean KL {:.6}, same top {:.4}, ppl {:.4} / {:.4}",
        f("kl_mean"),
        f("same_top"),
        f("ppl"),
        f("ppl_reference")
    );
    assert!(f("kl_mean") <= 1e-3, "mean KL divergence {}", f("kl_mean"));
    assert!(f("same_top") >= 0.98, "same top token {}", f("same_top"));
    assert!(
        (f("ppl") / f("ppl_reference") - 1.0).abs() <= 0.005,
        "perplexity {} against {}",
        f("ppl"),
        f("ppl_reference")
    );
}

/// `--precision` on a model command reaches the CPU backend: `engine bench` names the precision
/// its unit ran (`fast` where the CPU has AVX-512 VNNI, else `exact`), and `fast` is the
/// default.
#[test]
fn the_precision_flag_reaches_the_backend_and_bench_names_it() {
    let install = Install::new(&["cpu"]);
    let model = common::fixture("text-published");
    let bench = |extra: &[&str]| -> Value {
        let mut args = vec!["bench", "--model", model.to_str().unwrap(), "--backend", "cpu"];
        args.extend_from_slice(&[
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "2",
            "--repeat",
            "1",
            "--json",
        ]);
        args.extend_from_slice(extra);
        let out = install.run(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("bench JSON")
    };
    // The CPU backend's 8-bit products need AVX-512 F, BW, VL and VNNI with AVX2, FMA, F16C.
    #[cfg(target_arch = "x86_64")]
    let vnni = std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    let vnni = false;
    let fast = if vnni { "fast" } else { "exact" };
    assert_eq!(bench(&[])["backend"]["precision"], fast);
    assert_eq!(bench(&["--precision", "fast"])["backend"]["precision"], fast);
    assert_eq!(bench(&["--precision", "exact"])["backend"]["precision"], "exact");
}

/// On a model without `q8_0` weights (the fixture's f32/bf16 ones) `fast` (the default) gives
/// `exact`'s logits bit for bit: the 8-bit path covers only what the rule judged.
#[test]
fn fast_touches_only_what_it_covers() {
    let install = Install::new(&["cpu"]);
    let model = common::fixture("text-published");
    let logits = |extra: &[&str]| -> Value {
        let mut args = vec!["logits", "--model", model.to_str().unwrap(), "--backend", "cpu"];
        args.extend_from_slice(&["--tokens", "2,17,5,9,11", "--json"]);
        args.extend_from_slice(extra);
        let out = install.run(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).expect("logits JSON");
        v["logits"].clone()
    };
    let default = logits(&[]);
    assert!(
        default.as_array().is_some_and(|rows| !rows.is_empty()),
        "{default}"
    );
    assert_eq!(logits(&["--precision", "exact"]), default);
    assert_eq!(logits(&["--precision", "fast"]), default);
}
