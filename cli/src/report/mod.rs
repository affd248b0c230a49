//! Rendering `engine bench` results: reading `tandem-bench/1` files back ([`load_result`]),
//! checking them against `docs/bench-schema.json` ([`schema`]), and writing a markdown table
//! ([`markdown`]) and two SVG charts ([`charts`]): decode tokens/s by batch size, and each run's
//! fraction of its measured limits (its roofline).
//!
//! The data itself ([`BenchResult`] and its parts) is the engine's
//! (`tandem_engine::bench::results`): the engine measures, the command line presents.

pub mod charts;
pub mod markdown;
pub mod schema;

use std::path::{Path, PathBuf};

use serde_json::Value;
use tandem_engine::bench::results::{BenchResult, SCHEMA_ID};

pub use charts::{roofline_chart, tokens_chart};
pub use markdown::markdown;
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
