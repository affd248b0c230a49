//! Bench results against their schema, and the report made of them.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tandem_cli::report::{
    bench_schema, load_result, markdown, series_label, validate_against_schema, write_report, ReportError,
};
use tandem_engine::bench::results::{BenchResult, OpTime, SCHEMA_ID};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/bench")
        .join(name)
}

const SAMPLES: [&str; 2] = [
    "tandem-cpu-gemma3-270m-q4_k.json",
    "transformers-compile-gemma3-1b-bf16.json",
];

fn schema_file() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench-schema.json");
    let text = std::fs::read_to_string(&path).expect("docs/bench-schema.json is readable");
    serde_json::from_str(&text).expect("docs/bench-schema.json is JSON")
}

fn sample_doc(name: &str) -> Value {
    let text = std::fs::read_to_string(data(name)).expect("sample is readable");
    serde_json::from_str(&text).expect("sample is JSON")
}

fn samples() -> Vec<BenchResult> {
    SAMPLES
        .iter()
        .map(|n| load_result(&data(n)).expect("sample loads"))
        .collect()
}

#[test]
fn the_built_in_schema_is_the_documented_file() {
    assert_eq!(bench_schema().expect("built-in schema parses"), schema_file());
}

#[test]
fn samples_validate_and_round_trip() {
    let schema = schema_file();
    for name in SAMPLES {
        let doc = sample_doc(name);
        validate_against_schema(&doc, &schema).unwrap_or_else(|e| panic!("{name}: {e}"));
        let result: BenchResult = serde_json::from_value(doc.clone()).expect("deserialises");
        assert_eq!(result.schema, SCHEMA_ID);
        // What the engine writes validates too.
        let written = serde_json::to_value(&result).expect("serialises");
        validate_against_schema(&written, &schema).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(written, doc, "{name}: round trip");
    }
}

#[test]
fn a_missing_field_is_named() {
    let schema = schema_file();
    let mut doc = sample_doc(SAMPLES[0]);
    doc["machine"].as_object_mut().expect("machine").remove("cores");
    doc["runs"][1].as_object_mut().expect("run").remove("ttft_ms");
    let err = validate_against_schema(&doc, &schema).expect_err("must fail");
    assert!(err.contains("$.machine.cores: required field missing"), "{err}");
    assert!(err.contains("$.runs[1].ttft_ms: required field missing"), "{err}");
}

#[test]
fn a_wrong_type_is_named() {
    let schema = schema_file();
    let mut doc = sample_doc(SAMPLES[0]);
    doc["runs"][0]["decode_tokens_per_s"]["median"] = Value::String("fast".into());
    doc["settings"]["repeat"] = serde_json::json!(2.5);
    let err = validate_against_schema(&doc, &schema).expect_err("must fail");
    assert!(
        err.contains("$.runs[0].decode_tokens_per_s.median: expected number, found string \"fast\""),
        "{err}"
    );
    assert!(
        err.contains("$.settings.repeat: expected integer, found number 2.5"),
        "{err}"
    );
}

#[test]
fn other_violations_are_named() {
    let schema = schema_file();
    let mut doc = sample_doc(SAMPLES[1]);
    doc["schema"] = Value::String("tandem-bench/0".into());
    doc["backend"]["kind"] = Value::String("gpu".into());
    doc["runs"][0]["batch"] = serde_json::json!(0);
    doc["runs"][0]["extra"] = serde_json::json!(1);
    doc["limits"]["peak_flops"] = serde_json::json!(0.0);
    doc["machine"]["gpu"] = serde_json::json!(7);
    let err = validate_against_schema(&doc, &schema).expect_err("must fail");
    for needle in [
        "$.schema: expected \"tandem-bench/1\"",
        "$.backend.kind: expected one of",
        "$.runs[0].batch: 0 is below the minimum 1",
        "$.runs[0].extra: unknown field",
        "$.limits.peak_flops: 0 must be greater than 0",
        "$.machine.gpu: expected string or null, found number 7",
    ] {
        assert!(err.contains(needle), "{needle} not in {err}");
    }
}

#[test]
fn nullable_fields_take_null_and_values() {
    let schema = schema_file();
    let mut doc = sample_doc(SAMPLES[0]);
    doc["machine"]["gpu"] = Value::String("NVIDIA H100".into());
    doc["runs"][0]["device_memory_bytes"] = serde_json::json!(1024);
    validate_against_schema(&doc, &schema).expect("valid");
}

#[test]
fn an_unknown_schema_keyword_is_refused() {
    let schema = serde_json::json!({"type": "string", "maxLength": 3});
    let err = validate_against_schema(&Value::String("ab".into()), &schema).expect_err("refused");
    assert!(err.contains("maxLength"), "{err}");
}

#[test]
fn load_result_names_the_file_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.json");
    let mut doc = sample_doc(SAMPLES[0]);
    doc["model"]["params"] = Value::String("many".into());
    std::fs::write(&path, doc.to_string()).expect("write");
    let err = load_result(&path).expect_err("invalid");
    let text = err.to_string();
    assert!(matches!(err, ReportError::Invalid { .. }), "{text}");
    assert!(text.contains("bad.json"), "{text}");
    assert!(text.contains("$.model.params"), "{text}");
}

/// A small XML well-formedness check: every tag closes in order, attributes are quoted.
fn assert_well_formed(svg: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg;
    while let Some(start) = rest.find('<') {
        let text = &rest[..start];
        assert!(!text.contains('>'), "stray '>' in text {text:?}");
        rest = &rest[start..];
        if let Some(after) = rest.strip_prefix("<!--") {
            let end = after.find("-->").expect("comment closes");
            rest = &after[end + 3..];
            continue;
        }
        let end = rest.find('>').expect("tag closes");
        let tag = &rest[1..end];
        rest = &rest[end + 1..];
        if tag.starts_with('?') || tag.starts_with('!') {
            continue;
        }
        assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes in <{tag}>");
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().expect("a closing tag has an opening one");
            assert_eq!(open, name.trim(), "tags close in order");
        } else if !tag.ends_with('/') {
            let name = tag.split_whitespace().next().expect("a tag has a name");
            stack.push(name.to_string());
        }
    }
    assert!(stack.is_empty(), "unclosed tags: {stack:?}");
    assert!(svg.trim_start().starts_with("<svg"), "an SVG document");
}

#[test]
fn the_report_renders() {
    let results = samples();
    let dir = tempfile::tempdir().expect("tempdir");
    // TANDEM_KEEP_REPORT=DIR keeps the sample report, to look at the charts.
    let out = std::env::var_os("TANDEM_KEEP_REPORT")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.path().join("report"));
    let files = write_report(&results, &out).expect("report");
    let md = std::fs::read_to_string(&files.markdown).expect("report.md");
    assert!(md.contains("| tandem | cpu (AMD EPYC 7B13 (2 threads)) | gemma3-270m | q4_k_m | 32 |"));
    assert!(md.contains(
        "| transformers-compile | cuda (NVIDIA H100 80GB HBM3) | gemma3-1b (synthetic) | bf16 | 8 |"
    ));
    assert_eq!(md.lines().filter(|l| l.starts_with("| tandem ")).count(), 3);
    assert!(md.contains("batch sizes asked for that did not run: 32"));
    for path in [&files.tokens_per_s_svg, &files.roofline_svg] {
        let svg = std::fs::read_to_string(path).expect("svg");
        assert_well_formed(&svg);
        for r in &results {
            assert!(
                svg.contains(&series_label(r)),
                "{} lacks {}",
                path.display(),
                series_label(r)
            );
        }
    }
    let tokens = std::fs::read_to_string(&files.tokens_per_s_svg).expect("svg");
    assert!(tokens.contains("(log scale)"), "the sample spans 100×");
    assert!(tokens.contains("batch size"));
    let roofline = std::fs::read_to_string(&files.roofline_svg).expect("svg");
    assert!(roofline.contains("limit (1.0)"));
    assert!(roofline.contains("53.8%"));
}

#[test]
fn the_report_needs_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(matches!(
        write_report(&[], dir.path()),
        Err(ReportError::NoResults)
    ));
}

#[test]
fn a_result_with_no_runs_still_renders() {
    let mut result = samples().remove(0);
    result.runs.clear();
    let dir = tempfile::tempdir().expect("tempdir");
    let files = write_report(&[result], dir.path()).expect("report");
    for path in [&files.tokens_per_s_svg, &files.roofline_svg] {
        assert_well_formed(&std::fs::read_to_string(path).expect("svg"));
    }
    let md = std::fs::read_to_string(&files.markdown).expect("md");
    assert!(md.contains("no batch size ran"));
}

#[test]
fn report_markdown_snapshot() {
    let results = samples();
    let dir = tempfile::tempdir().expect("tempdir");
    let files = write_report(&results, dir.path()).expect("report");
    let md = std::fs::read_to_string(&files.markdown).expect("report.md");
    insta::assert_snapshot!("report_md", md);
}

#[test]
fn a_profile_validates_renders_and_is_checked() {
    let schema = schema_file();
    let mut doc = sample_doc(SAMPLES[0]);
    doc["runs"][0]["profile"] = serde_json::json!({
        "prefill": [{"op": "matmul(q4_k)", "nodes": 72, "seconds": 0.004}],
        "decode": [{"op": "attention", "nodes": 18, "seconds": 0.0002},
                   {"op": "rms_norm", "nodes": 90, "seconds": 0.0001}],
    });
    validate_against_schema(&doc, &schema).expect("a run with a profile validates");
    let result: BenchResult = serde_json::from_value(doc.clone()).expect("deserialises");
    assert_eq!(
        serde_json::to_value(&result).expect("serialises"),
        doc,
        "round trip"
    );
    let md = markdown(&[result]);
    assert!(md.contains("## Where the device time goes"), "{md}");
    assert!(md.contains("| decode | attention | 18 | 0.200 | 66.7% |"), "{md}");

    doc["runs"][0]["profile"]["decode"][1]
        .as_object_mut()
        .expect("object")
        .remove("nodes");
    let err = validate_against_schema(&doc, &schema).expect_err("a profile entry without nodes");
    assert!(err.contains("nodes"), "{err}");
}

#[test]
fn node_times_sum_by_op_most_time_first() {
    let ops = OpTime::by_op([
        ("matmul(q8_0)", 1.0),
        ("add", 0.5),
        ("matmul(q8_0)", 2.0),
        ("add", 0.25),
        ("rope", 5.0),
    ]);
    let got: Vec<(&str, u32, f64)> = ops.iter().map(|o| (o.op.as_str(), o.nodes, o.seconds)).collect();
    assert_eq!(
        got,
        vec![("rope", 1, 5.0), ("matmul(q8_0)", 2, 3.0), ("add", 2, 0.75)]
    );
}

#[test]
fn tandem_runs_are_set_against_a_peer_on_the_same_machine() {
    let mut ours = sample_doc(SAMPLES[0]);
    let peer = sample_doc(SAMPLES[1]);
    let md_apart = markdown(&[
        serde_json::from_value(ours.clone()).expect("ours"),
        serde_json::from_value(peer.clone()).expect("peer"),
    ]);
    assert!(
        !md_apart.contains("Against the peer"),
        "different machines: no comparison"
    );
    // The same GPU machine (a CPU-only peer would be left out: it measures no peak of its own).
    ours["machine"] = peer["machine"].clone();
    let ours_r: BenchResult = serde_json::from_value(ours.clone()).expect("ours");
    let peer_r: BenchResult = serde_json::from_value(peer).expect("peer");
    let md = markdown(&[ours_r.clone(), peer_r.clone()]);
    assert!(md.contains("## Against the peer's limits"), "{md}");
    let run = &ours_r.runs[0];
    let share = run.prefill_flops_fraction * ours_r.limits.peak_flops / peer_r.limits.peak_flops;
    let want = format!(
        "{:.1}% of {:.1} TFLOP/s",
        share * 100.0,
        peer_r.limits.peak_flops / 1e12
    );
    assert!(md.contains(&want), "{want} not in {md}");
}
