//! Serving many requests from one model: continuous batching behind a small, protocol-free API.
//! The HTTP layer (OpenAI's API, in `engine serve`) lives in the CLI and speaks to this module
//! only through [`Handle::submit`] and the [`Event`]s a request's [`EventSink`] receives.
//!
//! - [`request`]: what a request asks for and what it hears back.
//! - [`scheduler`]: the thread that owns the [`crate::runtime::session::Session`] and runs one
//!   batched step after another; requests join at the next step and leave when done.
//! - [`sequence`]: one running request: its slot, sampler, text and stop rules.
//! - [`stop`]: stop strings found in streamed text, holding back what may begin one.
//! - [`metrics`]: counters, gauges and histograms, rendered in Prometheus' text format.
//! - [`error`]: why a request is refused.

pub mod error;
pub mod metrics;
pub mod request;
pub mod scheduler;
pub mod sequence;
pub mod stop;

pub use error::SubmitError;
pub use metrics::Metrics;
pub use request::{Event, EventSink, Request};
pub use scheduler::{start, Handle, SchedulerOptions};
