//! The markdown report, and the number formats the charts share with it.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use tandem_engine::bench::results::{BenchResult, Spread};

use super::series_label;

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
                cell(&series_label(r)),
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
                        cell(&series_label(r)),
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
            cell(&series_label(r)),
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
pub(super) fn axis_number(x: f64) -> String {
    if x.is_finite() && (x - x.round()).abs() < 1e-9 {
        format!("{x:.0}")
    } else {
        number(x)
    }
}

/// A measurement with as many digits as it deserves.
pub(super) fn number(x: f64) -> String {
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

pub(super) fn percent(f: f64) -> String {
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
