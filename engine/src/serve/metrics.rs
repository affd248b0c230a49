//! What `GET /metrics` reports, in Prometheus' text exposition format: requests by outcome,
//! rejections, the queue depth, the running sequences, prompt and generated tokens, and
//! histograms of the time to first token and the inter-token latency; units lost while serving,
//! and whether the model can still run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A stop token or string.
    Stop,
    /// `max_tokens` or the context.
    Length,
    /// The client went away (or the server stopped it while shutting down).
    Cancelled,
    /// The model failed.
    Error,
}

impl Outcome {
    const ALL: [Outcome; 4] = [Outcome::Stop, Outcome::Length, Outcome::Cancelled, Outcome::Error];

    fn label(self) -> &'static str {
        match self {
            Outcome::Stop => "stop",
            Outcome::Length => "length",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        }
    }
}

/// A cumulative histogram with fixed bucket bounds (seconds).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), then the count above the last bound.
    counts: Vec<AtomicU64>,
    /// The sum of the observations, in nanoseconds.
    sum_ns: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut total = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            total += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {total}");
        }
        total += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {total}");
    }
}

/// Time to first token bounds, seconds.
const TTFT_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Inter-token latency bounds, seconds.
const ITL_BOUNDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// The server's counters; shared between the scheduler and the HTTP layer.
#[derive(Debug)]
pub struct Metrics {
    finished: [AtomicU64; 4],
    rejected: AtomicU64,
    /// Requests waiting for a slot.
    pub(crate) queued: AtomicUsize,
    /// Requests holding a slot.
    pub(crate) running: AtomicUsize,
    prompt_tokens: AtomicU64,
    reused_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    /// Step shapes whose programs were built, and the nanoseconds that took.
    step_builds: AtomicU64,
    step_build_ns: AtomicU64,
    /// Units lost while serving (a device lost, a plugin that panicked).
    units_lost: AtomicU64,
    /// Whether the model is placed on units that can run it (false once a unit was lost and
    /// what remains cannot hold it).
    available: AtomicBool,
    /// Time from a request's arrival to its first token.
    pub ttft: Histogram,
    /// Time between consecutive tokens of one request.
    pub itl: Histogram,
    /// HTTP responses by route and status code.
    http: Mutex<BTreeMap<(String, u16), u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            finished: Default::default(),
            rejected: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            prompt_tokens: AtomicU64::new(0),
            reused_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            step_builds: AtomicU64::new(0),
            step_build_ns: AtomicU64::new(0),
            units_lost: AtomicU64::new(0),
            available: AtomicBool::new(true),
            ttft: Histogram::new(TTFT_BOUNDS),
            itl: Histogram::new(ITL_BOUNDS),
            http: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Metrics {
    pub(crate) fn finished(&self, outcome: Outcome) {
        let i = Outcome::ALL.iter().position(|&o| o == outcome).unwrap_or(0);
        self.finished[i].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn prompt(&self, tokens: usize) {
        self.prompt_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    pub(crate) fn reused(&self, tokens: usize) {
        self.reused_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    /// Prompt tokens whose KV cache rows were kept from the slot's previous request.
    pub fn reused_count(&self) -> u64 {
        self.reused_tokens.load(Ordering::Relaxed)
    }

    pub(crate) fn generated(&self) {
        self.generated_tokens.fetch_add(1, Ordering::Relaxed);
    }

    /// Sets the step shapes built so far and the time building them took (the session's
    /// totals, warm-up included).
    pub(crate) fn step_builds(&self, (n, took): (u64, Duration)) {
        self.step_builds.store(n, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.step_build_ns.store(ns, Ordering::Relaxed);
    }

    /// Counts a unit lost while serving.
    pub(crate) fn unit_lost(&self) {
        self.units_lost.fetch_add(1, Ordering::Relaxed);
    }

    /// Units lost while serving.
    pub fn units_lost(&self) -> u64 {
        self.units_lost.load(Ordering::Relaxed)
    }

    /// Records whether the model can run (after a unit was lost: whether it was placed again).
    pub(crate) fn set_available(&self, yes: bool) {
        self.available.store(yes, Ordering::Relaxed);
    }

    /// Requests that ended with `outcome`.
    pub fn finished_count(&self, outcome: Outcome) -> u64 {
        let i = Outcome::ALL.iter().position(|&o| o == outcome).unwrap_or(0);
        self.finished[i].load(Ordering::Relaxed)
    }

    /// Requests waiting for a slot.
    pub fn queue_depth(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Requests holding a slot.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Counts one HTTP response of `route` with `status`.
    pub fn http_response(&self, route: &str, status: u16) {
        if let Ok(mut m) = self.http.lock() {
            *m.entry((route.to_string(), status)).or_insert(0) += 1;
        }
    }

    /// Everything, in Prometheus' text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: usize| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let _ = writeln!(
            out,
            "# HELP tandem_requests_total Generation requests finished, by outcome.\n# TYPE tandem_requests_total counter"
        );
        for (o, c) in Outcome::ALL.iter().zip(&self.finished) {
            let _ = writeln!(
                out,
                "tandem_requests_total{{outcome=\"{}\"}} {}",
                o.label(),
                c.load(Ordering::Relaxed)
            );
        }
        counter(
            &mut out,
            "tandem_requests_rejected_total",
            "Requests refused (503): the queue was full, or the model had no units left to run on.",
            self.rejected.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "tandem_queue_depth",
            "Requests waiting for a slot.",
            self.queue_depth(),
        );
        gauge(
            &mut out,
            "tandem_running_sequences",
            "Requests holding a KV cache slot.",
            self.running(),
        );
        counter(
            &mut out,
            "tandem_prompt_tokens_total",
            "Prompt tokens of the requests that got a slot.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "tandem_prompt_tokens_reused_total",
            "Prompt tokens not prefilled: a prefix kept in the slot from its previous request.",
            self.reused_count(),
        );
        counter(
            &mut out,
            "tandem_generated_tokens_total",
            "Tokens generated.",
            self.generated_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "tandem_step_shapes_built_total",
            "Step shapes whose programs were built (warm-up included; one released and met again counts again).",
            self.step_builds.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "tandem_units_lost_total",
            "Units lost while serving (a device lost, a backend plugin that panicked); the model was placed again on the rest.",
            self.units_lost(),
        );
        gauge(
            &mut out,
            "tandem_model_available",
            "1 while the model is placed on units that run it; 0 once a unit was lost and the rest cannot hold it.",
            usize::from(self.available.load(Ordering::Relaxed)),
        );
        let _ = writeln!(
            out,
            "# HELP tandem_step_shape_build_seconds_total Time spent building step programs, which the step that met the shape waited for.\n# TYPE tandem_step_shape_build_seconds_total counter\ntandem_step_shape_build_seconds_total {}",
            self.step_build_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        self.ttft.render(
            &mut out,
            "tandem_time_to_first_token_seconds",
            "Time from a request's arrival to its first generated token.",
        );
        self.itl.render(
            &mut out,
            "tandem_inter_token_latency_seconds",
            "Time between consecutive generated tokens of one request.",
        );
        let _ = writeln!(
            out,
            "# HELP tandem_http_responses_total HTTP responses by route and status code.\n# TYPE tandem_http_responses_total counter"
        );
        if let Ok(m) = self.http.lock() {
            for ((route, code), n) in m.iter() {
                let route = route.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = writeln!(
                    out,
                    "tandem_http_responses_total{{route=\"{route}\",code=\"{code}\"}} {n}"
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_the_text_format_is_well_formed() {
        let m = Metrics::default();
        m.ttft.observe(Duration::from_millis(3));
        m.ttft.observe(Duration::from_millis(30));
        m.ttft.observe(Duration::from_secs(100));
        m.finished(Outcome::Length);
        m.http_response("/v1/completions", 200);
        let text = m.render();
        assert!(text.contains("tandem_units_lost_total 0\n"));
        assert!(text.contains("tandem_model_available 1\n"));
        m.unit_lost();
        m.set_available(false);
        let text = m.render();
        assert!(text.contains("tandem_units_lost_total 1\n"));
        assert!(text.contains("tandem_model_available 0\n"));
        assert!(text.contains("tandem_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("tandem_time_to_first_token_seconds_bucket{le=\"0.05\"} 2\n"));
        assert!(text.contains("tandem_time_to_first_token_seconds_bucket{le=\"30\"} 2\n"));
        assert!(text.contains("tandem_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("tandem_time_to_first_token_seconds_count 3\n"));
        assert!(text.contains("tandem_requests_total{outcome=\"length\"} 1\n"));
        assert!(text.contains("tandem_http_responses_total{route=\"/v1/completions\",code=\"200\"} 1\n"));
        // Every sample line is `name{labels} value` with a numeric value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap_or("");
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
