//! Benchmarks: [`run`] measures a model's prefill and decode speed on a backend against the limits
//! the same run measures ([`limits`]) and writes the `tandem-bench/1` result; [`report`] reads
//! results (tandem's and peers') back and renders markdown and charts.

pub mod error;
pub mod limits;
pub mod machine;
pub mod report;
pub mod run;
