//! Serving many requests from one model: continuous batching behind a small, protocol-free API.
//! The HTTP layer (OpenAI's API, in `engine serve`) lives in the CLI and speaks to this module
//! only through [`Handle::submit`] and the [`Event`]s a request's [`EventSink`] receives.
//!
//! - [`batcher`]: the thread that owns the [`crate::runtime::session::Session`] and runs one
//!   batched step after another; requests join at the next step and leave when done. Each is a
//!   [`crate::runtime::sequence::Sequence`], the generation loop `engine run` uses too. A step
//!   that fails fails its requests only; a unit lost in one is left behind ([`Replace`]).
//! - [`buckets`]: steps padded to a few shapes, so that a GPU builds few step programs.
//! - [`metrics`]: counters, gauges and histograms, rendered in Prometheus' text format.
//! - [`error`]: why a request is refused.

pub mod batcher;
pub mod buckets;
pub mod error;
pub mod metrics;

pub use crate::runtime::sequence::{Event, EventSink, FinishReason, Request, RequestError};
pub use batcher::{start, start_with, BatcherOptions, Handle, Health, Replace};
pub use buckets::StepBuckets;
pub use error::SubmitError;
pub use metrics::Metrics;
