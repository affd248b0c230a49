//! `engine bench`: prefill and decode speed per batch size, time to first token, per-token
//! latency, peak memory, and the achieved fractions of the copy bandwidth and matrix-product
//! peak that the same run measures. `--report DIR RESULT.json...` renders saved results.
//! The JSON follows `docs/bench-schema.json` (`tandem-bench/1`).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context as _};
use serde_json::json;
use tandem_backend_api::{
    ComputeBackend, DType, DeviceKind, GraphBuilder, Op, StepArgs, TensorDesc, Usage, WeightRef,
};
use tandem_engine::bench::report::{OpTime, StepProfile};

use super::load::{load, ModelArgs};
use crate::Context;

/// Flags of `engine bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Benchmark a random-weight model of a real shape instead (gemma3-270m, gemma3-1b, ...).
    #[arg(long, conflicts_with = "report")]
    synthetic: Option<String>,
    /// Storage type of the synthetic model's matrices (f16, bf16, q8_0, q4_k).
    #[arg(long, default_value = "q4_k")]
    dtype: String,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens generated per sequence.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Batch sizes (sequences decoded together), comma-separated.
    #[arg(long, default_value = "1")]
    batch: String,
    /// Timed repetitions per batch size (after one warm-up).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Print the JSON result (otherwise a table).
    #[arg(long)]
    json: bool,
    /// Also write the JSON result to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Render saved results instead: `engine bench --report DIR A.json B.json ...`.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Result files for `--report`.
    results: Vec<PathBuf>,
}

fn stats(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let median = if v.is_empty() { 0.0 } else { v[v.len() / 2] };
    json!({ "median": median, "min": v.first().copied().unwrap_or(0.0), "max": v.last().copied().unwrap_or(0.0) })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Peak resident set size of this process (Linux `VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Host copy bandwidth: the best of several copies of a 1 GiB buffer, counting bytes read and
/// written.
fn copy_bandwidth() -> f64 {
    let n = 1usize << 30;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::MAX;
    for _ in 0..4 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    2.0 * n as f64 / best
}

/// Weight bytes of `[n, k]` in `dtype` with small, varied values (no NaN/inf): f32, f16 or
/// q8_0 blocks (an f16 scale, then 32 signed bytes).
fn peak_weight_bytes(dtype: DType, n: usize, k: usize) -> Vec<u8> {
    let value = |i: usize| ((i % 7) as f32 - 3.0) * 0.01;
    match dtype {
        DType::F16 => (0..n * k)
            .flat_map(|i| half::f16::from_f32(value(i)).to_le_bytes())
            .collect(),
        DType::Q8_0 => (0..n * k / 32)
            .flat_map(|b| {
                let mut block = half::f16::from_f32(0.001).to_le_bytes().to_vec();
                block.extend((0..32).map(|i| (((b + i) % 15) as i8 - 7) as u8));
                block
            })
            .collect(),
        _ => (0..n * k).flat_map(|i| value(i).to_le_bytes()).collect(),
    }
}

/// The backend's best rate on a large matrix product, run through the trait: the best of f32,
/// f16 and q8_0 weights, so that it is the peak of the kernels the backend actually has (a
/// GPU's tensor-core path, a CPU's integer dots). GPUs get a product large enough to fill them.
fn peak_flops(backend: &mut dyn ComputeBackend) -> anyhow::Result<(f64, String)> {
    let info = backend.info();
    let (m, k, n) = match info.kind {
        DeviceKind::DiscreteGpu | DeviceKind::IntegratedGpu => (2048usize, 4096usize, 4096usize),
        _ => (256, 2048, 2048),
    };
    let x = backend.alloc(&TensorDesc::new(DType::F32, [m, k]), Usage::Activation)?;
    let y = backend.alloc(&TensorDesc::new(DType::F32, [m, n]), Usage::Activation)?;
    let xs: Vec<u8> = (0..m * k)
        .flat_map(|i| (((i % 11) as f32 - 5.0) * 0.1).to_le_bytes())
        .collect();
    backend.write(x, 0, &xs)?;
    let zeros = vec![0u32; m];
    let args = StepArgs {
        tokens: &zeros,
        positions: &zeros,
        slots: &zeros,
        select: &[],
    };
    let mut best: Option<(f64, DType)> = None;
    for dtype in [DType::F32, DType::F16, DType::Q8_0] {
        let wdesc = TensorDesc::new(dtype, [n, k]);
        let op = |w| Op::MatMul {
            x: tandem_backend_api::ValueId(0),
            weight: WeightRef {
                buffer: w,
                desc: wdesc.clone(),
            },
            splits: vec![n],
        };
        if !backend
            .supports(&op(tandem_backend_api::BufferId::UNBOUND))
            .is_yes()
        {
            continue;
        }
        let w = backend.alloc(&wdesc, Usage::Weight)?;
        backend.write(w, 0, &peak_weight_bytes(dtype, n, k))?;
        let mut g = GraphBuilder::new("peak matmul", m, 0);
        let xv = g.push1(Op::Input {
            buffer: x,
            cols: k,
            selected: false,
        });
        let yv = g.push1(Op::MatMul {
            x: xv,
            weight: WeightRef {
                buffer: w,
                desc: wdesc.clone(),
            },
            splits: vec![n],
        });
        g.push(Op::Output { x: yv, buffer: y });
        let p = backend.compile(&g.finish())?;
        let mut fastest = f64::MAX;
        for _ in 0..4 {
            let t = Instant::now();
            let ticket = backend.execute(p, &args)?;
            backend.wait(ticket)?;
            fastest = fastest.min(t.elapsed().as_secs_f64());
        }
        backend.release(p)?;
        backend.free(w)?;
        let rate = 2.0 * (m * k * n) as f64 / fastest;
        if best.is_none_or(|(b, _)| rate > b) {
            best = Some((rate, dtype));
        }
    }
    for b in [x, y] {
        backend.free(b)?;
    }
    let Some((rate, dtype)) = best else {
        bail!(
            "the {} backend supports no f32, f16 or q8_0 matmul to measure its peak",
            info.name
        )
    };
    Ok((
        rate,
        format!(
            "{} backend matmul {m}x{k}x{n}, best of f32/f16/q8_0 weights: {dtype}",
            info.name
        ),
    ))
}

/// Runs the command.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    if let Some(dir) = &args.report {
        if args.results.is_empty() {
            bail!("--report DIR needs result files: engine bench --report DIR A.json B.json");
        }
        let results = args
            .results
            .iter()
            .map(|p| tandem_engine::bench::report::load_result(p))
            .collect::<Result<Vec<_>, _>>()?;
        let files = tandem_engine::bench::report::write_report(&results, dir)?;
        for f in [&files.markdown, &files.tokens_per_s_svg, &files.roofline_svg] {
            println!("wrote {}", f.display());
        }
        return Ok(());
    }
    let batches: Vec<usize> = args
        .batch
        .split(',')
        .map(|b| b.trim().parse::<usize>().ok().filter(|&b| b > 0))
        .collect::<Option<_>>()
        .with_context(|| format!("--batch: '{}' is not a list of positive sizes", args.batch))?;
    if args.prompt_tokens == 0 || args.gen_tokens < 2 || args.repeat == 0 {
        bail!("--prompt-tokens and --repeat must be at least 1, --gen-tokens at least 2");
    }
    let mut model_args = args.model.clone();
    let (model_name, source, synthetic) = match &args.synthetic {
        Some(shape) => {
            let shape_v: tandem_engine::checkpoint::synth::SynthShape = shape.parse()?;
            let dtype: tandem_engine::checkpoint::synth::SynthDtype = args.dtype.parse()?;
            let dir = tandem_engine::model::files::cache_dir()
                .unwrap_or_else(std::env::temp_dir)
                .join("synthetic");
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join(format!("{shape}-{dtype}.gguf"));
            if !path.exists() {
                eprintln!("writing {}", path.display());
                tandem_engine::checkpoint::synth::write_synthetic_gguf(
                    shape_v,
                    dtype,
                    &path,
                    0,
                    &mut |_, _| {},
                )?;
            }
            model_args.model = Some(path.clone());
            (shape.clone(), format!("synthetic:{shape}"), true)
        }
        None => {
            let name = model_args
                .model
                .as_ref()
                .and_then(|p| p.file_stem())
                .map_or_else(|| "gemma3-270m".to_string(), |s| s.to_string_lossy().into_owned());
            (
                name,
                model_args
                    .model
                    .as_ref()
                    .map_or("default".into(), |p| p.display().to_string()),
                false,
            )
        }
    };
    model_args.context = Some(args.prompt_tokens + args.gen_tokens + 1);
    model_args.chunk = model_args.chunk.max(1);
    let bar = std::io::stderr().is_terminal().then(|| {
        let total = batches
            .iter()
            .map(|b| (args.repeat as u64 + 1) * (*b as u64) * (args.gen_tokens as u64 - 1))
            .sum();
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("bench {bar:40} {pos}/{len} tokens {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });

    let mut runs = Vec::new();
    let mut header = None;
    let mut flops_peak = None;
    let mut copy_bw: Option<(f64, String)> = None;
    for &batch in &batches {
        let mut loaded = load(ctx, &model_args, batch)?;
        if flops_peak.is_none() {
            // Measured on the backend itself, through the trait (its own memory and threads).
            let mut probe = super::load::backend(ctx, &model_args.backend)?;
            flops_peak = Some(peak_flops(probe.as_mut())?);
        }
        let (peak, peak_src) = flops_peak.clone().unwrap_or((0.0, String::new()));
        let cfg = loaded.session.model().config.clone();
        let weight_bytes = loaded.session.model().weight_bytes;
        let info = loaded.session.backend().info();
        let vocab = cfg.vocab_size as u32;
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next_token = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % (vocab as u64 - 3)) as u32 + 3
        };
        let (mut prefill, mut decode, mut ttft, mut lat) = (vec![], vec![], vec![], vec![]);
        let (mut prefill_profile, mut decode_profile) = (vec![], vec![]);
        for rep in 0..=args.repeat {
            let prompts: Vec<Vec<u32>> = (0..batch)
                .map(|_| (0..args.prompt_tokens).map(|_| next_token()).collect())
                .collect();
            for s in 0..batch {
                loaded.session.reset(s);
            }
            let t0 = Instant::now();
            let mut first = None;
            for (s, p) in prompts.iter().enumerate() {
                loaded.session.prefill(s as u32, p, false)?;
                first.get_or_insert(t0.elapsed().as_secs_f64());
            }
            let prefill_s = t0.elapsed().as_secs_f64();
            if rep == args.repeat {
                prefill_profile = loaded.session.profile_last_step()?;
            }
            let slots: Vec<u32> = (0..batch as u32).collect();
            // The first generated token comes from the prefill's logits; the rest are decode steps.
            let mut steps = Vec::with_capacity(args.gen_tokens);
            let t1 = Instant::now();
            for _ in 1..args.gen_tokens {
                let toks: Vec<u32> = (0..batch).map(|_| next_token()).collect();
                let ts = Instant::now();
                loaded.session.step(&toks, &slots, &slots)?;
                steps.push(ts.elapsed().as_secs_f64() * 1e3);
                if let Some(b) = &bar {
                    b.inc(batch as u64);
                }
            }
            let decode_s = t1.elapsed().as_secs_f64();
            if rep == args.repeat {
                decode_profile = loaded.session.profile_last_step()?;
            }
            if rep == 0 {
                continue; // warm-up
            }
            prefill.push((batch * args.prompt_tokens) as f64 / prefill_s);
            decode.push((batch * (args.gen_tokens - 1)) as f64 / decode_s);
            ttft.push(first.unwrap_or(prefill_s) * 1e3);
            lat.extend(steps);
        }
        lat.sort_by(|a, b| a.total_cmp(b));
        // Bytes a decode step reads: every weight once, plus the keys and values each row
        // attends to, at the middle of generation.
        let mid = args.prompt_tokens + args.gen_tokens / 2;
        let kv_row = (cfg.num_key_value_heads * cfg.head_dim * 4 * 2) as u64;
        let kv_bytes: u64 = cfg
            .layer_types
            .iter()
            .map(|t| match t {
                tandem_engine::checkpoint::config::LayerType::Full => mid as u64,
                tandem_engine::checkpoint::config::LayerType::Sliding => mid.min(cfg.sliding_window) as u64,
            })
            .sum::<u64>()
            * kv_row
            * batch as u64;
        let step_bytes = weight_bytes + kv_bytes;
        let (h, i, l) = (
            cfg.hidden_size as f64,
            cfg.intermediate_size as f64,
            cfg.num_hidden_layers as f64,
        );
        let qkvo = h * (cfg.num_attention_heads * cfg.head_dim) as f64 * 2.0
            + h * (cfg.num_key_value_heads * cfg.head_dim) as f64 * 2.0;
        let matmul_params = l * (qkvo + 3.0 * h * i);
        let prefill_flops = 2.0 * matmul_params * args.prompt_tokens as f64 + 2.0 * h * cfg.vocab_size as f64;
        let med = |v: &Vec<f64>| {
            let mut s = v.clone();
            s.sort_by(|a, b| a.total_cmp(b));
            s.get(s.len() / 2).copied().unwrap_or(0.0)
        };
        let prefill_rate = med(&prefill) / args.prompt_tokens as f64; // sequences per second
        let device_memory = loaded.session.backend_mut().memory()?.map(|m| m.peak_bytes);
        let profile = (!prefill_profile.is_empty() || !decode_profile.is_empty()).then(|| {
            let by_op = |p: &[tandem_backend_api::NodeTime]| {
                OpTime::by_op(p.iter().map(|n| (n.op.as_str(), n.seconds)))
            };
            StepProfile {
                prefill: by_op(&prefill_profile),
                decode: by_op(&decode_profile),
            }
        });
        if copy_bw.is_none() {
            copy_bw = Some(match loaded.session.backend_mut().copy_bandwidth()? {
                Some(bw) => (bw, format!("{} device-to-device copy (read + write)", info.name)),
                None => (0.0, String::new()),
            });
        }
        let mut run = json!({
            "batch": batch,
            "prefill_tokens_per_s": stats(prefill.clone()),
            "decode_tokens_per_s": stats(decode),
            "ttft_ms": stats(ttft),
            "token_latency_ms": { "p50": percentile(&lat, 0.5), "p90": percentile(&lat, 0.9), "p99": percentile(&lat, 0.99) },
            "decode_bytes_per_step": step_bytes,
            "decode_bandwidth_fraction": 0.0, // filled in once the copy bandwidth is measured
            "prefill_flops_fraction": if peak > 0.0 { prefill_flops * prefill_rate / peak } else { 0.0 },
            "peak_rss_bytes": peak_rss().unwrap_or(0),
            "device_memory_bytes": device_memory,
        });
        if let Some(p) = profile {
            run["profile"] = serde_json::to_value(p)?;
        }
        runs.push(run);
        header.get_or_insert((info, cfg, weight_bytes, peak, peak_src));
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let Some((info, cfg, weight_bytes, peak, peak_src)) = header else {
        bail!("no batch sizes to run")
    };
    // The backend's own device copy where it has memory of its own; else a host copy, measured
    // after the runs so that its 2 GiB of buffers stay out of their peak RSS.
    let (copy_bw, copy_src) = match copy_bw {
        Some((bw, src)) if bw > 0.0 => (bw, src),
        _ => (copy_bandwidth(), "host memcpy 1 GiB (read + write)".to_string()),
    };
    for r in &mut runs {
        let bytes = r["decode_bytes_per_step"].as_f64().unwrap_or(0.0);
        let step_ms = r["token_latency_ms"]["p50"].as_f64().unwrap_or(0.0);
        r["decode_bandwidth_fraction"] = json!(if step_ms > 0.0 {
            bytes / (step_ms / 1e3) / copy_bw
        } else {
            0.0
        });
    }
    let params = cfg.vocab_size as u64 * cfg.hidden_size as u64
        + cfg.num_hidden_layers as u64
            * ((cfg.hidden_size * cfg.num_attention_heads * cfg.head_dim * 2
                + cfg.hidden_size * cfg.num_key_value_heads * cfg.head_dim * 2
                + 3 * cfg.hidden_size * cfg.intermediate_size) as u64);
    let doc = json!({
        "schema": "tandem-bench/1",
        "tool": "tandem",
        "date": now_rfc3339(),
        "machine": {
            "host": std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_default(),
            "cpu": cpu_name(),
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "os": std::env::consts::OS,
            "gpu": matches!(info.kind, DeviceKind::DiscreteGpu | DeviceKind::IntegratedGpu | DeviceKind::SoftwareGpu)
                .then(|| info.device.clone()),
        },
        "backend": { "name": info.name, "device": info.device, "kind": info.kind },
        "model": { "name": model_name, "source": source, "dtype": if synthetic { args.dtype.clone() } else { "gguf".into() },
                   "params": params, "weight_bytes": weight_bytes, "synthetic": synthetic },
        "settings": { "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "repeat": args.repeat,
                      "warmup": 1, "batch": batches },
        "limits": { "copy_bandwidth_bytes_per_s": copy_bw, "copy_bandwidth_source": copy_src,
                    "peak_flops": peak, "peak_flops_source": peak_src },
        "runs": runs,
    });
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    let mut o = std::io::stdout().lock();
    if args.json {
        writeln!(o, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        writeln!(
            o,
            "{} on {} ({}), copy {:.1} GB/s, matmul peak {:.1} GFLOP/s",
            doc["model"]["name"],
            doc["backend"]["name"],
            doc["backend"]["device"],
            copy_bw / 1e9,
            peak / 1e9
        )?;
        writeln!(
            o,
            "batch  prefill tok/s  decode tok/s  ttft ms  p50 ms  p99 ms  bw frac  flop frac"
        )?;
        for r in doc["runs"].as_array().into_iter().flatten() {
            writeln!(
                o,
                "{:>5}  {:>13.1}  {:>12.1}  {:>7.1}  {:>6.1}  {:>6.1}  {:>7.3}  {:>9.3}",
                r["batch"],
                r["prefill_tokens_per_s"]["median"].as_f64().unwrap_or(0.0),
                r["decode_tokens_per_s"]["median"].as_f64().unwrap_or(0.0),
                r["ttft_ms"]["median"].as_f64().unwrap_or(0.0),
                r["token_latency_ms"]["p50"].as_f64().unwrap_or(0.0),
                r["token_latency_ms"]["p99"].as_f64().unwrap_or(0.0),
                r["decode_bandwidth_fraction"].as_f64().unwrap_or(0.0),
                r["prefill_flops_fraction"].as_f64().unwrap_or(0.0)
            )?;
            if let Some(p) = r.get("profile") {
                for step in ["prefill", "decode"] {
                    let ops: Vec<String> = p[step]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .take(5)
                        .map(|o| {
                            format!(
                                "{} {:.3} ms",
                                o["op"].as_str().unwrap_or("?"),
                                o["seconds"].as_f64().unwrap_or(0.0) * 1e3
                            )
                        })
                        .collect();
                    writeln!(o, "       {step} device time: {}", ops.join(", "))?;
                }
            }
        }
    }
    Ok(())
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The current UTC time as RFC 3339, without a date crate.
fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}
