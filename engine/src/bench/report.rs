//! Benchmark results (`tandem-bench/1`) and the report made of them.
//!
//! `engine bench --json` and the peer (`bench/peer_torch.py`) write one [`BenchResult`] each, in
//! the schema `docs/bench-schema.json` documents. [`load_result`] reads one back and checks it
//! against that schema with [`validate_against_schema`]; [`write_report`] turns several into a
//! markdown table and two SVG charts: decode tokens/s by batch size, and each run's fraction of its
//! measured limits (its roofline).
//!
//! The charts are drawn with plotters' SVG backend and no font crate: plotters only estimates
//! text widths, and the SVG's `<text>` elements are laid out by whatever renders the file.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tandem_backend_api::DeviceKind;

/// The schema name and version every result carries in its `schema` field.
pub const SCHEMA_ID: &str = "tandem-bench/1";

/// The JSON Schema of a result (`docs/bench-schema.json`), as text.
pub const SCHEMA_JSON: &str = include_str!("../../../docs/bench-schema.json");

/// One benchmark result: one tool on one backend and one model, at one or more batch sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// Always [`SCHEMA_ID`].
    pub schema: String,
    /// What was measured: `tandem`, `transformers-eager` or `transformers-compile`.
    pub tool: String,
    /// When the run started, RFC 3339 in UTC.
    pub date: String,
    /// The machine the run measured.
    pub machine: Machine,
    /// The backend the model ran on.
    pub backend: BackendDesc,
    /// The model that ran.
    pub model: ModelDesc,
    /// What was asked of the run.
    pub settings: BenchSettings,
    /// The hardware limits measured in the same run.
    pub limits: Limits,
    /// One entry per batch size that ran.
    pub runs: Vec<BatchRun>,
}

/// The machine a result was measured on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// The host name.
    pub host: String,
    /// The CPU model.
    pub cpu: String,
    /// Logical CPUs available to the process.
    pub cores: u32,
    /// The operating system (`linux`).
    pub os: String,
    /// The GPU's name, where the run used or saw one.
    pub gpu: Option<String>,
}

/// The backend a result ran on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendDesc {
    /// tandem's plugin name (`cpu`, `vulkan`), or the peer's device type (`cuda`).
    pub name: String,
    /// The device as the user would recognise it.
    pub device: String,
    /// The kind of device.
    pub kind: DeviceKind,
}

/// The model a result ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDesc {
    /// The shape's name (`gemma3-270m`).
    pub name: String,
    /// A file path, or `synthetic:SHAPE`.
    pub source: String,
    /// The stored weight format (`q4_k`, `bf16`).
    pub dtype: String,
    /// Parameters, embeddings included.
    pub params: u64,
    /// Bytes of weights as stored on the backend.
    pub weight_bytes: u64,
    /// True when the weights are random.
    pub synthetic: bool,
}

/// What was asked of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchSettings {
    /// Prompt tokens per sequence.
    pub prompt_tokens: u32,
    /// Tokens generated per sequence.
    pub gen_tokens: u32,
    /// Timed repeats per batch size.
    pub repeat: u32,
    /// Untimed runs before the timed ones.
    pub warmup: u32,
    /// The batch sizes asked for.
    pub batch: Vec<u32>,
    /// The KV caches' element type (`f32`, `f16`); absent in results from before the option.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<String>,
}

/// The limits a run measured, to put its speeds in proportion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Bytes read plus bytes written per second by a large copy in the backend's memory.
    pub copy_bandwidth_bytes_per_s: f64,
    /// How the copy bandwidth was measured.
    pub copy_bandwidth_source: String,
    /// The best FLOP/s of a large dense matrix product on the backend.
    pub peak_flops: f64,
    /// How the peak was measured.
    pub peak_flops_source: String,
}

/// The median, minimum and maximum over the timed repeats.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The median.
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

/// Percentiles over every timed decode step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// The 50th percentile.
    pub p50: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// The 99th percentile.
    pub p99: f64,
}

/// The measurements at one batch size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchRun {
    /// Sequences run together.
    pub batch: u32,
    /// Prompt tokens per second, summed over the batch.
    pub prefill_tokens_per_s: Spread,
    /// Generated tokens per second, summed over the batch.
    pub decode_tokens_per_s: Spread,
    /// Time to first token, milliseconds.
    pub ttft_ms: Spread,
    /// Milliseconds per decode step.
    pub token_latency_ms: Percentiles,
    /// Bytes one decode step reads: weights plus KV cache.
    pub decode_bytes_per_step: u64,
    /// Achieved decode bandwidth as a fraction of the measured copy bandwidth.
    pub decode_bandwidth_fraction: f64,
    /// Achieved prefill FLOP/s as a fraction of the measured peak.
    pub prefill_flops_fraction: f64,
    /// Peak resident host memory, bytes.
    pub peak_rss_bytes: u64,
    /// Peak device memory, bytes, where the backend can tell.
    pub device_memory_bytes: Option<u64>,
    /// Device time per op kind, where the backend measures it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<StepProfile>,
}

/// Device time per op kind of one prefill chunk and one decode step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepProfile {
    /// The last prefill chunk's op kinds, most time first.
    pub prefill: Vec<OpTime>,
    /// The last decode step's op kinds, most time first.
    pub decode: Vec<OpTime>,
}

/// The device time of every node of one op kind in one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpTime {
    /// The op's short name (`matmul(q4_k)`).
    pub op: String,
    /// Nodes of this kind.
    pub nodes: u32,
    /// Their summed device time, seconds.
    pub seconds: f64,
}

impl OpTime {
    /// Sums node times by op name, most time first.
    pub fn by_op<'a>(nodes: impl IntoIterator<Item = (&'a str, f64)>) -> Vec<OpTime> {
        let mut out: Vec<OpTime> = Vec::new();
        for (op, seconds) in nodes {
            match out.iter_mut().find(|o| o.op == op) {
                Some(o) => {
                    o.nodes += 1;
                    o.seconds += seconds;
                }
                None => out.push(OpTime {
                    op: op.to_string(),
                    nodes: 1,
                    seconds,
                }),
            }
        }
        out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        out
    }
}

impl BenchResult {
    /// The name of this result's series in the charts: tool · backend · model · dtype.
    pub fn series_label(&self) -> String {
        format!(
            "{} · {} · {} · {}",
            self.tool, self.backend.name, self.model.name, self.model.dtype
        )
    }
}

/// What [`write_report`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportFiles {
    /// `report.md`: the table, the machines and the limits.
    pub markdown: PathBuf,
    /// `tokens_per_s.svg`: decode tokens/s by batch size.
    pub tokens_per_s_svg: PathBuf,
    /// `roofline.svg`: each run's fractions of its measured limits.
    pub roofline_svg: PathBuf,
}

/// Why a result could not be read or a report not written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A result file is not JSON, or not a result once validated.
    #[error("{path}: not valid JSON for {SCHEMA_ID}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What serde said.
        source: serde_json::Error,
    },
    /// A result file does not follow the schema.
    #[error("{path}: does not follow {SCHEMA_ID}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every field that is wrong, by JSON path.
        message: String,
    },
    /// The schema built into the engine is unreadable (a build defect).
    #[error("docs/bench-schema.json as built in: {0}")]
    Schema(String),
    /// A chart could not be drawn.
    #[error("{path}: drawing the chart failed: {message}")]
    Chart {
        /// The SVG file.
        path: PathBuf,
        /// What plotters said.
        message: String,
    },
    /// `write_report` was given no results.
    #[error("no results to report")]
    NoResults,
}

/// The schema of a result, parsed from [`SCHEMA_JSON`].
pub fn bench_schema() -> Result<Value, ReportError> {
    serde_json::from_str(SCHEMA_JSON).map_err(|e| ReportError::Schema(e.to_string()))
}

/// Reads one result file, checks it against the schema, and returns it.
pub fn load_result(path: &Path) -> Result<BenchResult, ReportError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let doc: Value = serde_json::from_str(&text).map_err(|source| ReportError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    let schema = bench_schema()?;
    validate_against_schema(&doc, &schema).map_err(|message| ReportError::Invalid {
        path: path.to_path_buf(),
        message,
    })?;
    serde_json::from_value(doc).map_err(|source| ReportError::Json {
        path: path.to_path_buf(),
        source,
    })
}

// ---------------------------------------------------------------------------------------------
// The schema validator
// ---------------------------------------------------------------------------------------------

/// Keywords that only annotate: the validator reads past them.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "title",
    "description",
    "format",
    "examples",
    "default",
];

/// How deep `$ref`s may nest before the schema is taken to loop.
const MAX_DEPTH: usize = 64;

/// Checks `doc` against `schema`, for the subset of JSON Schema (draft 2020-12) that
/// `docs/bench-schema.json` uses: `type` (a name or an array of names, `null` among them for a
/// nullable field), `required`, `properties`, `additionalProperties` (`false` or a schema),
/// `items`, `enum`, `const`, `minimum`, `exclusiveMinimum`, and `$ref` to `#/...` within the
/// schema. `description`, `title`, `format` and the other annotations are read past; any other
/// keyword is an error, so that a schema cannot rely on a check that is silently skipped.
///
/// `integer` means a number written without a fraction or exponent (as serde reads an integer),
/// which is stricter than the specification's `1.0`.
///
/// On failure the message lists every field that is wrong, by JSON path (`$.runs[0].batch`),
/// separated by `; `.
pub fn validate_against_schema(doc: &Value, schema: &Value) -> Result<(), String> {
    let mut errors = Vec::new();
    check(doc, schema, schema, "$", 0, &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn check(doc: &Value, schema: &Value, root: &Value, at: &str, depth: usize, errors: &mut Vec<String>) {
    if depth > MAX_DEPTH {
        errors.push(format!("{at}: the schema's $refs nest deeper than {MAX_DEPTH}"));
        return;
    }
    let rules = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            errors.push(format!("{at}: not allowed here"));
            return;
        }
        Value::Object(rules) => rules,
        other => {
            errors.push(format!("{at}: the schema here is {other}, not an object"));
            return;
        }
    };
    for key in rules.keys() {
        let known = matches!(
            key.as_str(),
            "type"
                | "required"
                | "properties"
                | "additionalProperties"
                | "items"
                | "enum"
                | "const"
                | "minimum"
                | "exclusiveMinimum"
                | "$ref"
        );
        if !known && !ANNOTATIONS.contains(&key.as_str()) {
            errors.push(format!(
                "{at}: the schema uses `{key}`, which this validator does not know"
            ));
        }
    }
    if let Some(reference) = rules.get("$ref") {
        match reference.as_str().and_then(|r| resolve_ref(root, r)) {
            Some(target) => check(doc, target, root, at, depth + 1, errors),
            None => errors.push(format!("{at}: the schema's $ref {reference} leads nowhere")),
        }
    }
    if let Some(ty) = rules.get("type") {
        let names: Vec<&str> = match ty {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !names.iter().any(|n| has_type(doc, n)) {
            errors.push(format!(
                "{at}: expected {}, found {}",
                names.join(" or "),
                describe(doc)
            ));
            // The other checks would only repeat the mismatch.
            return;
        }
    }
    if let Some(expected) = rules.get("const") {
        if doc != expected {
            errors.push(format!("{at}: expected {expected}, found {}", describe(doc)));
        }
    }
    if let Some(Value::Array(options)) = rules.get("enum") {
        if !options.contains(doc) {
            let list: Vec<String> = options.iter().map(Value::to_string).collect();
            errors.push(format!(
                "{at}: expected one of {}, found {}",
                list.join(", "),
                describe(doc)
            ));
        }
    }
    if let (Some(min), Some(x)) = (rules.get("minimum").and_then(Value::as_f64), doc.as_f64()) {
        if x < min {
            errors.push(format!("{at}: {x} is below the minimum {min}"));
        }
    }
    if let (Some(min), Some(x)) = (
        rules.get("exclusiveMinimum").and_then(Value::as_f64),
        doc.as_f64(),
    ) {
        if x <= min {
            errors.push(format!("{at}: {x} must be greater than {min}"));
        }
    }
    if let Value::Object(fields) = doc {
        if let Some(Value::Array(required)) = rules.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !fields.contains_key(name) {
                    errors.push(format!("{at}.{name}: required field missing"));
                }
            }
        }
        let properties = rules.get("properties").and_then(Value::as_object);
        for (name, value) in fields {
            let path = format!("{at}.{name}");
            match properties.and_then(|p| p.get(name)) {
                Some(sub) => check(value, sub, root, &path, depth + 1, errors),
                None => match rules.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        errors.push(format!("{path}: unknown field"));
                    }
                    Some(sub @ Value::Object(_)) => check(value, sub, root, &path, depth + 1, errors),
                    _ => {}
                },
            }
        }
    }
    if let (Value::Array(elements), Some(items)) = (doc, rules.get("items")) {
        for (i, element) in elements.iter().enumerate() {
            check(element, items, root, &format!("{at}[{i}]"), depth + 1, errors);
        }
    }
}

/// Follows a `#/a/b` JSON pointer within the schema.
fn resolve_ref<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

fn has_type(doc: &Value, name: &str) -> bool {
    match name {
        "null" => doc.is_null(),
        "boolean" => doc.is_boolean(),
        "object" => doc.is_object(),
        "array" => doc.is_array(),
        "string" => doc.is_string(),
        "number" => doc.is_number(),
        "integer" => doc.is_i64() || doc.is_u64(),
        _ => false,
    }
}

fn describe(doc: &Value) -> String {
    let kind = match doc {
        Value::Null => return "null".to_string(),
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => return "an array".to_string(),
        Value::Object(_) => return "an object".to_string(),
    };
    let mut text = doc.to_string();
    if text.len() > 40 {
        let cut = (0..=40).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    format!("{kind} {text}")
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

/// Writes `report.md`, `tokens_per_s.svg` and `roofline.svg` for `results` into `dir`
/// (created if missing).
pub fn write_report(results: &[BenchResult], dir: &Path) -> Result<ReportFiles, ReportError> {
    if results.is_empty() {
        return Err(ReportError::NoResults);
    }
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let files = ReportFiles {
        markdown: dir.join("report.md"),
        tokens_per_s_svg: dir.join("tokens_per_s.svg"),
        roofline_svg: dir.join("roofline.svg"),
    };
    write_file(&files.markdown, &markdown(results))?;
    let svg = tokens_chart(results).map_err(|message| ReportError::Chart {
        path: files.tokens_per_s_svg.clone(),
        message,
    })?;
    write_file(&files.tokens_per_s_svg, &svg)?;
    let svg = roofline_chart(results).map_err(|message| ReportError::Chart {
        path: files.roofline_svg.clone(),
        message,
    })?;
    write_file(&files.roofline_svg, &svg)?;
    Ok(files)
}

/// Each tandem run's achieved prefill FLOP/s and decode bandwidth against the limits a peer
/// (another tool) measured on the same GPU machine in the same set of results: the
/// matrix-product rate PyTorch reaches on the card, and its device copy bandwidth. CPU peers are
/// left out: llama-bench measures no peak of its own.
fn peer_limits_section(results: &[BenchResult], md: &mut String) {
    let mut rows = Vec::new();
    for r in results.iter().filter(|r| r.tool == "tandem") {
        let peer = results
            .iter()
            .filter(|p| {
                p.tool != "tandem"
                    && p.machine.gpu.is_some()
                    && p.machine.host == r.machine.host
                    && p.machine.gpu == r.machine.gpu
            })
            .max_by(|a, b| a.limits.peak_flops.total_cmp(&b.limits.peak_flops));
        let Some(peer) = peer else { continue };
        for run in &r.runs {
            let flops = run.prefill_flops_fraction * r.limits.peak_flops;
            let bw = run.decode_bandwidth_fraction * r.limits.copy_bandwidth_bytes_per_s;
            rows.push(format!(
                "| {} | {} | {:.2} TFLOP/s | {} of {:.1} TFLOP/s | {:.0} GB/s | {} of {:.0} GB/s |",
                cell(&r.series_label()),
                run.batch,
                flops / 1e12,
                percent(flops / peer.limits.peak_flops),
                peer.limits.peak_flops / 1e12,
                bw / 1e9,
                percent(bw / peer.limits.copy_bandwidth_bytes_per_s),
                peer.limits.copy_bandwidth_bytes_per_s / 1e9,
            ));
        }
    }
    if rows.is_empty() {
        return;
    }
    md.push_str(
        "\n## Against the peer's limits\n\nEach tandem run's prefill FLOP/s and decode bandwidth \
         against the best matrix-product rate and the copy bandwidth that a peer measured on the same \
         machine (its `limits`).\n\n| series | batch | prefill | of the peer's matmul peak | decode \
         | of the peer's copy bandwidth |\n|---|--:|--:|--:|--:|--:|\n",
    );
    for row in rows {
        md.push_str(&row);
        md.push('\n');
    }
}

fn write_file(path: &Path, text: &str) -> Result<(), ReportError> {
    std::fs::write(path, text).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The markdown report: one table row per result and batch size, then a line per result with its
/// machine, settings and limits.
pub fn markdown(results: &[BenchResult]) -> String {
    let mut md = String::new();
    md.push_str("# tandem bench report\n\n");
    md.push_str(
        "| tool | backend (device) | model | dtype | batch | prefill tok/s | decode tok/s \
         | TTFT ms | latency p50 / p99 ms | bandwidth | FLOPs | peak RSS | device memory |\n",
    );
    md.push_str("|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for r in results {
        for run in &r.runs {
            let _ = writeln!(
                md,
                "| {} | {} ({}) | {}{} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} |",
                cell(&r.tool),
                cell(&r.backend.name),
                cell(&r.backend.device),
                cell(&r.model.name),
                if r.model.synthetic { " (synthetic)" } else { "" },
                cell(&r.model.dtype),
                run.batch,
                spread(&run.prefill_tokens_per_s),
                spread(&run.decode_tokens_per_s),
                spread(&run.ttft_ms),
                number(run.token_latency_ms.p50),
                number(run.token_latency_ms.p99),
                percent(run.decode_bandwidth_fraction),
                percent(run.prefill_flops_fraction),
                bytes(run.peak_rss_bytes),
                run.device_memory_bytes.map_or_else(|| "–".to_string(), bytes),
            );
        }
        if r.runs.is_empty() {
            let _ = writeln!(
                md,
                "| {} | {} ({}) | {} | {} | – | no batch size ran | | | | | | | |",
                cell(&r.tool),
                cell(&r.backend.name),
                cell(&r.backend.device),
                cell(&r.model.name),
                cell(&r.model.dtype),
            );
        }
    }
    md.push_str(
        "\nMedians over the timed repeats, min–max in parentheses; tokens/s are summed over the \
         batch. Bandwidth: weight and KV-cache bytes read per decode step / median step time, as a \
         share of the copy bandwidth measured in the same run. FLOPs: 2 × params × prompt tokens of the whole batch \
         / median prefill time, as a share of the matrix-product peak measured in the same run.\n",
    );
    peer_limits_section(results, &mut md);
    let profiled: Vec<_> = results
        .iter()
        .flat_map(|r| r.runs.iter().map(move |run| (r, run)))
        .filter_map(|(r, run)| run.profile.as_ref().map(|p| (r, run, p)))
        .collect();
    if !profiled.is_empty() {
        md.push_str(
            "\n## Where the device time goes\n\nGPU timestamps per op kind: the last prefill chunk and \
             the last decode step of the last repeat; share of the step's summed node time.\n\n",
        );
        md.push_str("| series | batch | step | op | nodes | ms | share |\n|---|--:|---|---|--:|--:|--:|\n");
        for (r, run, p) in profiled {
            for (step, ops) in [("prefill", &p.prefill), ("decode", &p.decode)] {
                let total: f64 = ops.iter().map(|o| o.seconds).sum();
                for o in ops.iter().take(6) {
                    let _ = writeln!(
                        md,
                        "| {} | {} | {} | {} | {} | {:.3} | {} |",
                        cell(&r.series_label()),
                        run.batch,
                        step,
                        cell(&o.op),
                        o.nodes,
                        o.seconds * 1e3,
                        percent(if total > 0.0 { o.seconds / total } else { 0.0 }),
                    );
                }
            }
        }
    }
    md.push_str("\n## Results\n\n");
    for r in results {
        let m = &r.machine;
        let s = &r.settings;
        let _ = writeln!(
            md,
            "- **{}** on {}, {}: {}, {} cores, {}, GPU {}; model `{}`, {} params, {} of weights; \
             {} prompt and {} generated tokens, {} timed repeats after {} warm-up",
            cell(&r.series_label()),
            cell(&r.date),
            cell(&m.host),
            cell(&m.cpu),
            m.cores,
            cell(&m.os),
            m.gpu.as_deref().map_or_else(|| "none".to_string(), cell),
            cell(&r.model.source),
            count(r.model.params),
            bytes(r.model.weight_bytes),
            s.prompt_tokens,
            s.gen_tokens,
            s.repeat,
            s.warmup,
        );
        let _ = writeln!(
            md,
            "  - limits: copy bandwidth {} ({}); peak {} ({})",
            si(r.limits.copy_bandwidth_bytes_per_s, "B/s"),
            cell(&r.limits.copy_bandwidth_source),
            si(r.limits.peak_flops, "FLOP/s"),
            cell(&r.limits.peak_flops_source),
        );
        let ran: BTreeSet<u32> = r.runs.iter().map(|run| run.batch).collect();
        let missing: Vec<String> = s
            .batch
            .iter()
            .filter(|b| !ran.contains(b))
            .map(u32::to_string)
            .collect();
        if !missing.is_empty() {
            let _ = writeln!(
                md,
                "  - batch sizes asked for that did not run: {}",
                missing.join(", ")
            );
        }
    }
    md
}

/// A table cell's text: no pipes or line breaks.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

fn spread(s: &Spread) -> String {
    format!("{} ({}–{})", number(s.median), number(s.min), number(s.max))
}

/// An axis label: whole numbers without a fraction, others as [`number`] writes them.
fn axis_number(x: f64) -> String {
    if x.is_finite() && (x - x.round()).abs() < 1e-9 {
        format!("{x:.0}")
    } else {
        number(x)
    }
}

/// A measurement with as many digits as it deserves.
fn number(x: f64) -> String {
    if !x.is_finite() {
        return "–".to_string();
    }
    let a = x.abs();
    if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

fn percent(f: f64) -> String {
    if f.is_finite() {
        format!("{:.1}%", f * 100.0)
    } else {
        "–".to_string()
    }
}

fn bytes(b: u64) -> String {
    const KIB: f64 = 1024.0;
    let x = b as f64;
    if x >= KIB * KIB * KIB {
        format!("{:.2} GiB", x / (KIB * KIB * KIB))
    } else if x >= KIB * KIB {
        format!("{:.1} MiB", x / (KIB * KIB))
    } else if x >= KIB {
        format!("{:.1} KiB", x / KIB)
    } else {
        format!("{b} B")
    }
}

fn count(n: u64) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.2} B", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.1} M", x / 1e6)
    } else {
        n.to_string()
    }
}

/// `x` with a decimal SI prefix: `1.23 GB/s`, `798 TFLOP/s`.
fn si(x: f64, unit: &str) -> String {
    const PREFIXES: [(f64, &str); 5] = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    for (scale, prefix) in PREFIXES {
        if x.abs() >= scale {
            return format!("{} {prefix}{unit}", number(x / scale));
        }
    }
    format!("{} {unit}", number(x))
}

// ---------------------------------------------------------------------------------------------
// The charts
// ---------------------------------------------------------------------------------------------

const WIDTH: u32 = 1000;
const FONT: &str = "sans-serif";
/// A rough width of one character at the label size, for laying out legends and row labels.
const CHAR_PX: u32 = 7;

/// Dark, distinguishable colours on white (Tableau 10).
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// A point marker.
#[derive(Clone, Copy)]
enum Marker {
    Circle,
    Triangle,
    Square,
}

/// How one series is drawn: past ten series the colours repeat with another dash and marker.
#[derive(Clone, Copy)]
struct Look {
    colour: RGBColor,
    /// Dash and gap lengths in pixels; solid when `None`.
    dash: Option<(u32, u32)>,
    marker: Marker,
}

fn look(i: usize) -> Look {
    let (dash, marker) = match (i / COLOURS.len()) % 3 {
        0 => (None, Marker::Circle),
        1 => (Some((9, 5)), Marker::Triangle),
        _ => (Some((3, 4)), Marker::Square),
    };
    Look {
        colour: colour(i),
        dash,
        marker,
    }
}

/// Draws a polyline in a series' look on any drawing area.
fn draw_line<DB, CT>(area: &DrawingArea<DB, CT>, points: Vec<CT::From>, look: Look) -> Result<(), String>
where
    DB: DrawingBackend,
    CT: CoordTranslate,
    CT::From: Clone,
{
    let style = look.colour.stroke_width(2);
    match look.dash {
        None => area.draw(&PathElement::new(points, style)),
        Some((dash, gap)) => area.draw(&DashedPathElement::new(points, dash, gap, style)),
    }
    .map_err(|e| e.to_string())
}

/// Draws a series' marker at `at` on any drawing area.
fn draw_marker<DB, CT>(area: &DrawingArea<DB, CT>, at: CT::From, look: Look) -> Result<(), String>
where
    DB: DrawingBackend,
    CT: CoordTranslate,
{
    let style = look.colour.filled();
    match look.marker {
        Marker::Circle => area.draw(&Circle::new(at, 4, style)),
        Marker::Triangle => area.draw(&TriangleMarker::new(at, 6, style)),
        Marker::Square => area.draw(&(EmptyElement::at(at) + Rectangle::new([(-4, -4), (4, 4)], style))),
    }
    .map_err(|e| e.to_string())
}

/// One line of the tokens/s chart.
struct Series {
    label: String,
    /// (index of the batch size on the x axis, decode tokens/s spread)
    points: Vec<(usize, Spread)>,
}

/// Groups the runs by (tool, backend, model, dtype) and lists the batch sizes on the x axis.
fn tokens_series(results: &[BenchResult]) -> (Vec<u32>, Vec<Series>) {
    let batches: Vec<u32> = results
        .iter()
        .flat_map(|r| r.runs.iter().map(|run| run.batch))
        .collect::<BTreeSet<u32>>()
        .into_iter()
        .collect();
    let mut series: Vec<Series> = Vec::new();
    for r in results {
        let label = r.series_label();
        let index = match series.iter().position(|s| s.label == label) {
            Some(i) => i,
            None => {
                series.push(Series {
                    label,
                    points: Vec::new(),
                });
                series.len() - 1
            }
        };
        for run in &r.runs {
            if let Some(x) = batches.iter().position(|&b| b == run.batch) {
                series[index].points.push((x, run.decode_tokens_per_s));
            }
        }
    }
    for s in &mut series {
        s.points.sort_by_key(|&(x, _)| x);
    }
    (batches, series)
}

fn text_style(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().color(&BLACK)
}

/// A legend of coloured entries laid out in columns; returns the height it needs.
fn legend_height(labels: &[String]) -> u32 {
    let (_, rows) = legend_grid(labels);
    rows * 22 + 16
}

fn legend_grid(labels: &[String]) -> (u32, u32) {
    let longest = labels.iter().map(|l| l.chars().count() as u32).max().unwrap_or(0);
    let column = longest * CHAR_PX + 48;
    let columns = ((WIDTH - 60) / column.max(1)).clamp(1, 4);
    let n = labels.len() as u32;
    (columns, n.div_ceil(columns).max(1))
}

/// How a legend entry shows what it names.
#[derive(Clone, Copy)]
enum Swatch {
    /// A series of points: its line and marker.
    Series(Look),
    /// A kind of bar: a filled box.
    Bar(RGBColor),
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[(String, Swatch)],
) -> Result<(), String> {
    let labels: Vec<String> = entries.iter().map(|(l, _)| l.clone()).collect();
    let (columns, _) = legend_grid(&labels);
    let column_px = ((WIDTH - 60) / columns) as i32;
    for (i, (label, swatch)) in entries.iter().enumerate() {
        let col = (i as u32 % columns) as i32;
        let row = (i as u32 / columns) as i32;
        let x = 60 + col * column_px;
        let y = 12 + row * 22;
        match *swatch {
            Swatch::Series(look) => {
                draw_line(area, vec![(x, y), (x + 28, y)], look)?;
                draw_marker(area, (x + 14, y), look)?;
            }
            Swatch::Bar(c) => {
                area.draw(&Rectangle::new([(x + 4, y - 7), (x + 24, y + 7)], c.filled()))
                    .map_err(|e| e.to_string())?;
            }
        }
        area.draw(&Text::new(
            label.clone(),
            (x + 36, y),
            text_style(14).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The SVG of decode tokens/s by batch size, one line per (tool, backend, model, dtype), with
/// min–max bars; the y axis is logarithmic when the values span more than 30×.
pub fn tokens_chart(results: &[BenchResult]) -> Result<String, String> {
    let (batches, series) = tokens_series(results);
    let values: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter())
        .flat_map(|(_, sp)| [sp.median, sp.min, sp.max])
        .filter(|v| v.is_finite())
        .collect();
    let hi = values.iter().copied().fold(0.0f64, f64::max);
    let lo = values
        .iter()
        .copied()
        .filter(|&v| v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let log = lo.is_finite() && hi / lo > 30.0;
    let labels: Vec<String> = series.iter().map(|s| s.label.clone()).collect();
    let legend_h = legend_height(&labels);
    let height = 520 + legend_h;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (top, bottom) = root.split_vertically(520);
        let title = if log {
            "Decode tokens/s by batch size (log scale)"
        } else {
            "Decode tokens/s by batch size"
        };
        let n = batches.len().max(1) as f64;
        let x_range = -0.5..(n - 0.5);
        let mut builder = ChartBuilder::on(&top);
        builder
            .caption(title, text_style(22))
            .margin(16)
            .margin_right(30)
            .x_label_area_size(50)
            .y_label_area_size(80);
        if log {
            let chart = builder
                .build_cartesian_2d(x_range, (lo / 1.5..hi * 1.5).log_scale())
                .map_err(|e| e.to_string())?;
            draw_tokens(chart, &batches, &series, true)?;
        } else {
            let top_y = if hi > 0.0 { hi * 1.12 } else { 1.0 };
            let chart = builder
                .build_cartesian_2d(x_range, 0.0..top_y)
                .map_err(|e| e.to_string())?;
            draw_tokens(chart, &batches, &series, false)?;
        }
        let entries: Vec<(String, Swatch)> = labels
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), Swatch::Series(look(i))))
            .collect();
        draw_legend(&bottom, &entries)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

fn draw_tokens<DB, Y>(
    mut chart: ChartContext<'_, DB, Cartesian2d<RangedCoordf64, Y>>,
    batches: &[u32],
    series: &[Series],
    log: bool,
) -> Result<(), String>
where
    DB: DrawingBackend,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let x_label = |x: &f64| -> String {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            batches.get(i as usize).map_or_else(String::new, u32::to_string)
        } else {
            String::new()
        }
    };
    // On a log axis the labels are drawn below with the 1-2-5 grid.
    let y_label = |y: &f64| if log { String::new() } else { axis_number(*y) };
    let mut mesh = chart.configure_mesh();
    mesh.x_labels(batches.len().max(1))
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label)
        .disable_x_mesh()
        .light_line_style(RGBColor(240, 240, 240))
        .bold_line_style(RGBColor(215, 215, 215))
        .x_desc("batch size (sequences decoded together)")
        .y_desc("decode tokens/s, summed over the batch")
        .label_style(text_style(14))
        .axis_desc_style(text_style(15));
    if log {
        // plotters' log axis labels only the powers of ten: draw the 1-2-5 grid here instead.
        mesh.disable_y_mesh().y_labels(0);
    }
    mesh.draw().map_err(|e| e.to_string())?;
    if log {
        let x_range = chart.x_range();
        let y_range = chart.y_range();
        let grid = RGBColor(215, 215, 215);
        for tick in log_ticks(y_range.start, y_range.end) {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x_range.start, tick), (x_range.end, tick)],
                    grid.stroke_width(1),
                )))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((x_range.start, tick))
                        + PathElement::new(vec![(-5, 0), (0, 0)], BLACK.stroke_width(1))
                        + Text::new(
                            if tick >= 1.0 {
                                format!("{tick:.0}")
                            } else {
                                format!("{tick}")
                            },
                            (-8, 0),
                            text_style(14).pos(Pos::new(HPos::Right, VPos::Center)),
                        ),
                ))
                .map_err(|e| e.to_string())?;
        }
    }
    let count = series.len().max(1) as f64;
    let area = chart.plotting_area();
    for (i, s) in series.iter().enumerate() {
        let look = look(i);
        let c = look.colour;
        // Spread the series a little along x so their min–max bars do not overlap.
        let shift = if series.len() > 1 {
            (i as f64 / (count - 1.0) - 0.5) * 0.08
        } else {
            0.0
        };
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|&(x, sp)| (x as f64 + shift, sp.median))
            .collect();
        draw_line(area, points.clone(), look)?;
        for &(x, sp) in &s.points {
            let x = x as f64 + shift;
            area.draw(&PathElement::new(
                vec![(x, sp.min), (x, sp.max)],
                c.stroke_width(1),
            ))
            .map_err(|e| e.to_string())?;
        }
        for &(x, y) in &points {
            draw_marker(area, (x, y), look)?;
            // Each median written beside its point, while there are few enough to read.
            if series.len() <= 6 {
                area.draw(
                    &(EmptyElement::at((x, y))
                        + Text::new(
                            number(y),
                            (8, -4),
                            text_style(12).color(&c).pos(Pos::new(HPos::Left, VPos::Bottom)),
                        )),
                )
                .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}

/// 1, 2 and 5 times the powers of ten within `lo..=hi` (both positive).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    if !(lo > 0.0 && hi > lo && hi.is_finite()) {
        return ticks;
    }
    let mut power = 10f64.powf(lo.log10().floor());
    while power <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = m * power;
            if t >= lo && t <= hi {
                ticks.push(t);
            }
        }
        power *= 10.0;
    }
    ticks
}

/// The SVG of each run's decode bandwidth fraction and prefill FLOP fraction, as horizontal
/// bars against a line at 1.0 (the limit measured in the same run).
pub fn roofline_chart(results: &[BenchResult]) -> Result<String, String> {
    let rows: Vec<(String, f64, f64)> = results
        .iter()
        .flat_map(|r| {
            r.runs.iter().map(move |run| {
                (
                    format!("{} · batch {}", r.series_label(), run.batch),
                    run.decode_bandwidth_fraction,
                    run.prefill_flops_fraction,
                )
            })
        })
        .collect();
    let longest = rows
        .iter()
        .map(|(l, _, _)| l.chars().count() as u32)
        .max()
        .unwrap_or(10);
    let label_w = (longest * CHAR_PX + 24).clamp(120, 520);
    let row_h = 34;
    let n = rows.len().max(1);
    let plot_h = n as u32 * row_h;
    let height = plot_h + 160;
    let top_x = rows
        .iter()
        .flat_map(|&(_, a, b)| [a, b])
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max)
        * 1.15;
    let bandwidth_colour = colour(0);
    let flops_colour = colour(1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (top, bottom) = root.split_vertically(height - 40);
        let mut chart = ChartBuilder::on(&top)
            .caption("Fraction of the limits measured in the same run", text_style(22))
            .margin(16)
            .margin_right(30)
            .x_label_area_size(50)
            .y_label_area_size(label_w)
            .build_cartesian_2d(0.0..top_x, 0.0..n as f64)
            .map_err(|e| e.to_string())?;
        let x_label = |x: &f64| format!("{:.0}%", x * 100.0);
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_label_formatter(&x_label)
            .light_line_style(RGBColor(240, 240, 240))
            .bold_line_style(RGBColor(215, 215, 215))
            .x_desc("fraction of the limit (decode: copy bandwidth; prefill: matmul peak)")
            .label_style(text_style(14))
            .axis_desc_style(text_style(15))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (label, bw, fl)) in rows.iter().enumerate() {
            // Row 0 at the top.
            let y0 = (n - 1 - i) as f64;
            let bars = [
                (*bw, y0 + 0.5, y0 + 0.88, bandwidth_colour),
                (*fl, y0 + 0.12, y0 + 0.5, flops_colour),
            ];
            for (v, lo, hi, c) in bars {
                let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
                chart
                    .draw_series(std::iter::once(Rectangle::new([(0.0, lo), (v, hi)], c.filled())))
                    .map_err(|e| e.to_string())?;
                let (px, py) = chart.backend_coord(&(v, (lo + hi) / 2.0));
                root.draw(&Text::new(
                    percent(v),
                    (px + 5, py),
                    text_style(12).pos(Pos::new(HPos::Left, VPos::Center)),
                ))
                .map_err(|e| e.to_string())?;
            }
            let (px, py) = chart.backend_coord(&(0.0, y0 + 0.5));
            root.draw(&Text::new(
                label.clone(),
                (px - 8, py),
                text_style(13).pos(Pos::new(HPos::Right, VPos::Center)),
            ))
            .map_err(|e| e.to_string())?;
        }
        if rows.is_empty() {
            let (px, py) = chart.backend_coord(&(top_x / 2.0, 0.5));
            root.draw(&Text::new(
                "no runs",
                (px, py),
                text_style(16).pos(Pos::new(HPos::Center, VPos::Center)),
            ))
            .map_err(|e| e.to_string())?;
        }
        let limit = RGBColor(200, 0, 0);
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(1.0, 0.0), (1.0, n as f64)],
                limit.stroke_width(2),
            )))
            .map_err(|e| e.to_string())?;
        let (px, py) = chart.backend_coord(&(1.0, n as f64));
        root.draw(&Text::new(
            "limit (1.0)",
            (px + 4, py + 4),
            text_style(12).color(&limit).pos(Pos::new(HPos::Left, VPos::Top)),
        ))
        .map_err(|e| e.to_string())?;
        let entries = [
            (
                "decode: bytes per step / step time ÷ copy bandwidth".to_string(),
                Swatch::Bar(bandwidth_colour),
            ),
            (
                "prefill: FLOP/s ÷ matmul peak".to_string(),
                Swatch::Bar(flops_colour),
            ),
        ];
        draw_legend(&bottom, &entries)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}
