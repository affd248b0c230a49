//! Rendering what the engine measures and plans. `engine bench` results: reading
//! `tandem-bench/1` files back ([`load_result`]), checking them against
//! `docs/bench-schema.json` ([`schema`]), and writing a markdown table ([`markdown`]) and two SVG
//! charts ([`charts`]): decode tokens/s by batch size, and each run's fraction of its measured
//! limits (its roofline). `engine placement`'s text ([`placement`]).
//!
//! The data itself ([`BenchResult`] and its parts, the placement report) is the engine's
//! (`tandem_engine::bench::results`, `tandem_engine::runtime::placement_report`): the engine
//! measures and plans, the command line presents.

pub mod charts;
pub mod markdown;
pub mod placement;
pub mod schema;

use std::path::{Path, PathBuf};

use serde_json::Value;
use tandem_engine::bench::results::{BenchResult, SCHEMA_ID};

pub use charts::{roofline_chart, tokens_chart};
pub use markdown::markdown;
pub use placement::placement_text;
pub use schema::validate_against_schema;

/// The JSON Schema of a result (`docs/bench-schema.json`), as text.
pub const SCHEMA_JSON: &str = include_str!("../../../docs/bench-schema.json");

/// The name of a result's series in the charts: tool · backend · model · dtype.
pub fn series_label(r: &BenchResult) -> String {
    format!(
        "{} · {} · {} · {}",
        r.tool, r.backend.name, r.model.name, r.model.dtype
    )
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
    /// The schema built into the command line is unreadable (a build defect).
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

fn write_file(path: &Path, text: &str) -> Result<(), ReportError> {
    std::fs::write(path, text).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use tandem_backend_api::DeviceKind;
    use tandem_engine::bench::results::{
        BackendDesc, BatchRun, BenchSettings, Limits, Machine, ModelDesc, OpTime, Percentiles,
        SpeculationRun, Spread, StepProfile, VerifyPoint,
    };

    use super::*;

    /// Figures that print and parse back exactly (serde_json's float parsing is not exact for
    /// every 17-digit figure, with or without this change).
    fn spread(median: f64) -> Spread {
        Spread {
            median,
            min: median - 1.5,
            max: median + 2.25,
        }
    }

    fn run(batch: u32, device_memory: Option<u64>, profile: Option<StepProfile>) -> BatchRun {
        BatchRun {
            batch,
            prefill_tokens_per_s: spread(740.5 * batch as f64),
            decode_tokens_per_s: spread(2892.25 * batch as f64),
            ttft_ms: spread(10.5),
            token_latency_ms: Percentiles {
                p50: 0.3,
                p90: 0.35,
                p99: 0.4,
            },
            decode_bytes_per_step: 2_500_000,
            decode_bandwidth_fraction: 0.277,
            prefill_flops_fraction: 0.027,
            peak_rss_bytes: 400 << 20,
            device_memory_bytes: device_memory,
            profile,
            split_host_ms: None,
        }
    }

    /// A result as `engine bench` fills it: split over two units when `split`, with device
    /// memory and a profile on the GPU.
    fn filled(split: bool) -> BenchResult {
        let (name, kind) = if split {
            ("vulkan", DeviceKind::DiscreteGpu)
        } else {
            ("cpu", DeviceKind::Cpu)
        };
        let profile = StepProfile {
            prefill: OpTime::by_op([("matmul(q8_0)", 0.01), ("rope", 1e-4), ("matmul(q8_0)", 2e-3)]),
            decode: OpTime::by_op([("attention(kv f32)", 8e-5), ("matmul(q8_0)", 2e-4)]),
        };
        BenchResult {
            schema: SCHEMA_ID.to_string(),
            tool: "tandem".into(),
            date: "2026-11-22T22:00:00Z".into(),
            machine: Machine {
                host: "dev-1".into(),
                cpu: "AMD EPYC".into(),
                cores: 2,
                os: "linux".into(),
                gpu: split.then(|| "a GPU".to_string()),
            },
            backend: BackendDesc {
                name: name.into(),
                device: format!("{name} device"),
                placement: split.then(|| "vulkan+cpu --gpu-layers 3".to_string()),
                units: split.then(|| vec!["vulkan".to_string(), "cpu".to_string()]),
                kind,
                precision: None,
            },
            model: ModelDesc {
                name: "tiny".into(),
                source: "synthetic:tiny".into(),
                dtype: "q8_0".into(),
                params: 1_245_184,
                weight_bytes: 2_000_000,
                synthetic: true,
            },
            settings: BenchSettings {
                prompt_tokens: 8,
                gen_tokens: 4,
                repeat: 2,
                warmup: 1,
                batch: vec![1, 2],
                kv_cache: Some("f32".into()),
            },
            limits: Limits {
                copy_bandwidth_bytes_per_s: 1.5e10,
                copy_bandwidth_source: "host memcpy 1 GiB (read + write)".into(),
                peak_flops: 6.5e10,
                peak_flops_source: "cpu backend matmul".into(),
            },
            runs: if split {
                vec![
                    run(1, Some(1 << 30), Some(profile.clone())),
                    run(2, Some(1 << 30), Some(profile)),
                ]
            } else {
                vec![run(1, None, None), run(2, None, None)]
            },
            verify_curve: split.then(|| {
                vec![
                    VerifyPoint {
                        rows: 1,
                        ms: 2.0,
                        ratio: 1.0,
                    },
                    VerifyPoint {
                        rows: 2,
                        ms: 2.5,
                        ratio: 1.25,
                    },
                ]
            }),
            speculation: split.then(|| SpeculationRun {
                drafter: "ngram (2..4-grams)".into(),
                prompt_tokens: 300,
                gen_tokens: 128,
                plain_tokens_per_s: 80.0,
                tokens_per_s: 140.0,
                speedup: 1.75,
                acceptance: 0.84,
                tokens_per_target_step: 2.4,
                overlap: false,
                ready_blocks: 0,
                same_tokens: true,
            }),
            image: split.then(|| tandem_engine::bench::results::ImageRun {
                image: "photo.png".into(),
                tower_unit: "cpu".into(),
                tokens_per_image: 256,
                prompt_tokens: 270,
                encode_ms: 812.5,
                prefill_tokens_per_s: 2100.0,
                first_logits_ms: 941.0,
                profile: None,
            }),
        }
    }

    /// What the engine fills, serialised as `engine bench --json` writes it, follows the schema
    /// and reads back through [`load_result`] unchanged.
    #[test]
    fn a_filled_result_follows_the_schema_and_reads_back() {
        let schema = bench_schema().expect("the built-in schema parses");
        let dir = tempfile::tempdir().expect("temp dir");
        for split in [false, true] {
            let result = filled(split);
            let text = serde_json::to_string_pretty(&result).expect("serialises");
            let doc: Value = serde_json::from_str(&text).expect("JSON");
            validate_against_schema(&doc, &schema).unwrap_or_else(|e| panic!("split {split}: {e}\n{text}"));
            // Optional fields: absent when unset, never null; nullable ones null.
            let backend = doc["backend"].as_object().expect("backend");
            assert_eq!(backend.contains_key("placement"), split, "{text}");
            assert_eq!(backend.contains_key("units"), split, "{text}");
            assert_eq!(doc["runs"][0].get("profile").is_some(), split, "{text}");
            assert_eq!(doc["runs"][0]["device_memory_bytes"].is_null(), !split, "{text}");
            assert_eq!(doc["machine"]["gpu"].is_null(), !split, "{text}");
            let path = dir.path().join(format!("split-{split}.json"));
            std::fs::write(&path, &text).expect("write");
            assert_eq!(load_result(&path).expect("loads back"), result);
        }
    }
}
