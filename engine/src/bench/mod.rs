//! Benchmarks: [`report`] reads results (tandem's and peers') back and renders markdown and
//! charts.

pub mod report;
