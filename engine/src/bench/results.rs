//! Benchmark results (`tandem-bench/1`): the data `engine bench` measures.
//!
//! `engine bench --json` and the peer (`bench/peer_torch.py`) write one [`BenchResult`] each, in
//! the schema `docs/bench-schema.json` documents. These types are the one definition of that
//! document on tandem's side: the engine fills them ([`super::run`]) and the command line
//! serialises and reads them back. Reading results back, checking them against the
//! schema and rendering them (markdown, charts) is the command line's business
//! (`tandem_cli::report`).

use serde::{Deserialize, Serialize};
use tandem_backend_api::DeviceKind;

/// The schema name and version every result carries in its `schema` field.
pub const SCHEMA_ID: &str = "tandem-bench/1";

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
    /// Speculative decoding's verification cost curve (`--verify-rows N`): one step of 1..N
    /// rows of one sequence; absent without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_curve: Option<Vec<VerifyPoint>>,
    /// A text generated with and without speculative decoding (`--draft ...
    /// --prompt-file F`); absent without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpeculationRun>,
    /// Image input (`--image FILE`): the vision tower's encoding and the prefill of a prompt
    /// holding the image; absent without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRun>,
}

/// One image encoded and prefilled with a short text, medians over the repeats after a warm-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageRun {
    /// The image file's name.
    pub image: String,
    /// The unit the vision tower ran on.
    pub tower_unit: String,
    /// Soft tokens per image.
    pub tokens_per_image: usize,
    /// The prompt's tokens, the image's included.
    pub prompt_tokens: usize,
    /// Decoding, preprocessing and the tower (with the projector), milliseconds.
    pub encode_ms: f64,
    /// The prompt's prefill rate (one step per chunk, the image in one).
    pub prefill_tokens_per_s: f64,
    /// Encoding plus the prefill: the image prompt's time to its first logits, milliseconds.
    pub first_logits_ms: f64,
    /// With `--profile`: the last encoding's tower and projector by op kind, most time first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Vec<OpTime>>,
}

/// A text continued greedily with and without speculative decoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeculationRun {
    /// The drafter (`ngram (2..4-grams)`, `draft model on cpu`).
    pub drafter: String,
    /// The prompt's tokens.
    pub prompt_tokens: usize,
    /// Tokens generated per run.
    pub gen_tokens: usize,
    /// Median decode rate without speculation.
    pub plain_tokens_per_s: f64,
    /// Median decode rate with it.
    pub tokens_per_s: f64,
    /// The second over the first.
    pub speedup: f64,
    /// Draft tokens kept per draft token proposed (the last run).
    pub acceptance: f64,
    /// Tokens emitted per target step (the last run).
    pub tokens_per_target_step: f64,
    /// Whether the draft ran ahead of the target.
    pub overlap: bool,
    /// Blocks drafted while the block before was verified (the last run).
    pub ready_blocks: usize,
    /// Whether every speculative run gave the plain run's tokens.
    pub same_tokens: bool,
}

/// One point of the verification cost curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyPoint {
    /// Rows of the step (the pending token and the drafts), of one sequence.
    pub rows: usize,
    /// Its median time, milliseconds.
    pub ms: f64,
    /// That time over a one-row step's.
    pub ratio: f64,
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
    /// When the model ran split across units: the `--backend` value (with `--gpu-layers N`
    /// where given) that placed it; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// When split: the units' instance names (`cpu`, `vulkan#2`); the other fields describe the
    /// unit that computed the logits. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub units: Option<Vec<String>>,
    /// The kind of device.
    pub kind: DeviceKind,
    /// The arithmetic the unit ran, where it names one (`exact`, `fast`: its `precision=`
    /// feature); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
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

/// The median of `v` (of an even count, the mean of the middle two, as llama-bench's mean of two
/// runs is; not the larger); 0 for none.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    median_of_sorted(&v)
}

/// [`median`] of values already sorted in ascending order.
pub fn median_of_sorted(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 0 => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        n => sorted[n / 2],
    }
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
    /// Where the host's time went per unit in a decode step of a split placement (the last
    /// repeat's steps, averaged); absent on one unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_host_ms: Option<Vec<UnitHostTime>>,
}

/// Device time per op kind of one prefill chunk and one decode step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepProfile {
    /// The last prefill chunk's op kinds, most time first.
    pub prefill: Vec<OpTime>,
    /// The last decode step's op kinds, most time first.
    pub decode: Vec<OpTime>,
}

/// Where the host's time went for one unit of a split in an average decode step, milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnitHostTime {
    /// The unit's instance name.
    pub unit: String,
    /// In its backend's `execute` (a CPU unit computes its part there; a GPU unit records and
    /// submits).
    pub execute: f64,
    /// Waiting for its work to finish (before a hand-over through the host, or at the end of
    /// the step).
    pub wait: f64,
    /// Copying its boundary values to the units that read them.
    pub copy: f64,
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
