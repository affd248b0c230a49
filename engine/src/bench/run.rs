//! The measuring loop of `engine bench`: for each batch size, load the model with KV caches for
//! that many sequences, warm up once, then time prefill and decode over `repeat` rounds of random
//! prompts and tokens; per-op device time from the last round; the limits from [`super::limits`].
//! The result is a `tandem-bench/1` JSON document (`docs/bench-schema.json`).

use std::path::Path;
use std::time::Instant;

use serde_json::json;
use tandem_backend_api::DeviceKind;

use super::error::BenchError;
use super::limits::{host_copy_bandwidth, peak_flops};
use super::machine::{cpu_name, now_rfc3339, peak_rss};
use super::results::{OpTime, StepProfile};
use crate::checkpoint::config::LayerType;
use crate::checkpoint::synth::{write_synthetic_gguf, SynthDtype, SynthShape};
use crate::model::files::cache_dir;
use crate::runtime::load::{load, ModelOptions};
use crate::runtime::notice::Notice;
use crate::runtime::placement::{choose_from, discover, plugin_name};
use crate::runtime::plugins::PluginSearch;
use crate::runtime::session::Step;
use crate::runtime::settings::Settings;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The model and backend (context and chunk: the context is set to fit the run).
    pub model: ModelOptions,
    /// A random-weight model of this real shape instead (`gemma3-1b`, ...).
    pub synthetic: Option<String>,
    /// Storage type of the synthetic model's matrices (`f16`, `bf16`, `q8_0`, `q4_k`).
    pub dtype: String,
    /// Prompt tokens per sequence.
    pub prompt_tokens: usize,
    /// Tokens generated per sequence (the first from the prefill's logits).
    pub gen_tokens: usize,
    /// Batch sizes, each measured with its own session.
    pub batches: Vec<usize>,
    /// Timed repetitions per batch size, after one warm-up.
    pub repeat: usize,
}

impl BenchOptions {
    /// Decode tokens the whole run generates (warm-up included), for a progress bar.
    pub fn total_decode_tokens(&self) -> u64 {
        self.batches
            .iter()
            .map(|b| (self.repeat as u64 + 1) * (*b as u64) * (self.gen_tokens as u64).saturating_sub(1))
            .sum()
    }
}

/// What happens during a run, for a progress display.
#[derive(Debug)]
pub enum BenchEvent<'a> {
    /// A warning or note from choosing the backend.
    Notice(Notice),
    /// The synthetic model is being written to this file (once; it is reused after).
    WritingSynthetic(&'a Path),
    /// `done` of `total` weight bytes uploaded.
    Loading {
        /// Bytes uploaded.
        done: u64,
        /// Bytes in all.
        total: u64,
    },
    /// The model is loaded.
    Loaded,
    /// This many more decode tokens were generated.
    Tokens(u64),
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

/// Runs the benchmark `options` describes on the plugins `search` finds, and returns the
/// `tandem-bench/1` document.
pub fn run(
    search: &PluginSearch,
    settings: &Settings,
    options: &BenchOptions,
    events: &mut dyn FnMut(BenchEvent<'_>),
) -> Result<serde_json::Value, BenchError> {
    let args = options;
    if args.prompt_tokens == 0 || args.gen_tokens < 2 || args.repeat == 0 {
        return Err(BenchError::Options(
            "prompt_tokens and repeat must be at least 1, gen_tokens at least 2".into(),
        ));
    }
    let batches = &args.batches;
    let mut model_args = args.model.clone();
    let (model_name, source, synthetic) = match &args.synthetic {
        Some(shape) => {
            let shape_v: SynthShape = shape.parse()?;
            let dtype: SynthDtype = args.dtype.parse()?;
            let dir = cache_dir().unwrap_or_else(std::env::temp_dir).join("synthetic");
            std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
                path: dir.clone(),
                source,
            })?;
            let path = dir.join(format!("{shape}-{dtype}.gguf"));
            if !path.exists() {
                events(BenchEvent::WritingSynthetic(&path));
                write_synthetic_gguf(shape_v, dtype, &path, 0, &mut |_, _| {})?;
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

    let mut runs = Vec::new();
    let mut header = None;
    let mut units: Option<Vec<String>> = None;
    let mut flops_peak = None;
    // The KV caches' element type the sessions got (`--kv-cache`, resolved).
    let mut kv_cache = String::new();
    let mut copy_bw: Option<(f64, String)> = None;
    for &batch in batches {
        // Notices and progress come through two callbacks that take turns, never nested.
        let shared = std::cell::RefCell::new(&mut *events);
        let mut loaded = load(
            search,
            settings,
            &model_args,
            batch,
            &mut |n| (shared.borrow_mut())(BenchEvent::Notice(n)),
            &mut |done, total| (shared.borrow_mut())(BenchEvent::Loading { done, total }),
        )?;
        events(BenchEvent::Loaded);
        if flops_peak.is_none() {
            // Measured on the backend itself, through the trait (its own memory and threads).
            // The unit that computes the logits, as the session chose it (one unit unless split).
            let name = loaded.session.backend().info().name;
            let mut notice = |n| events(BenchEvent::Notice(n));
            let discovery = discover(search, &mut notice);
            let mut probe = choose_from(&discovery, settings, plugin_name(&name), &mut notice)?;
            flops_peak = Some(peak_flops(probe.as_mut())?);
        }
        let (peak, peak_src) = flops_peak.clone().unwrap_or((0.0, String::new()));
        let cfg = loaded.session.model().config.clone();
        let weight_bytes = loaded.session.model().weight_bytes;
        kv_cache = loaded.session.model().cache_shape.dtype.to_string();
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
                loaded.session.step(Step::decode(&toks, &slots, &slots))?;
                steps.push(ts.elapsed().as_secs_f64() * 1e3);
                events(BenchEvent::Tokens(batch as u64));
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
                LayerType::Full => mid as u64,
                LayerType::Sliding => mid.min(cfg.sliding_window) as u64,
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
        units.get_or_insert_with(|| {
            loaded
                .session
                .unit_names()
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>()
        });
        header.get_or_insert((info, cfg, weight_bytes, peak, peak_src));
    }
    let Some((info, cfg, weight_bytes, peak, peak_src)) = header else {
        return Err(BenchError::Options("no batch sizes to run".into()));
    };
    // The backend's own device copy where it has memory of its own; else a host copy, measured
    // after the runs so that its 2 GiB of buffers stay out of their peak RSS.
    let (copy_bw, copy_src) = match copy_bw {
        Some((bw, src)) if bw > 0.0 => (bw, src),
        _ => (
            host_copy_bandwidth(),
            "host memcpy 1 GiB (read + write)".to_string(),
        ),
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
    let mut backend_doc = json!({ "name": info.name, "device": info.device, "kind": info.kind });
    if let Some(units) = units.filter(|u| u.len() > 1) {
        backend_doc["placement"] = json!(match args.model.gpu_layers {
            Some(n) => format!("{} --gpu-layers {n}", args.model.backend),
            None => args.model.backend.clone(),
        });
        backend_doc["units"] = json!(units);
    }
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
        "backend": backend_doc,
        "model": { "name": model_name, "source": source, "dtype": if synthetic { args.dtype.clone() } else { "gguf".into() },
                   "params": params, "weight_bytes": weight_bytes, "synthetic": synthetic },
        "settings": { "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "repeat": args.repeat,
                      "warmup": 1, "batch": batches, "kv_cache": kv_cache },
        "limits": { "copy_bandwidth_bytes_per_s": copy_bw, "copy_bandwidth_source": copy_src,
                    "peak_flops": peak, "peak_flops_source": peak_src },
        "runs": runs,
    });
    Ok(doc)
}
