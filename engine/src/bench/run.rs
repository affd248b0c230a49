//! The measuring loop of `engine bench`: for each batch size, load the model with KV caches for
//! that many sequences, warm up once, then time prefill and decode over `repeat` rounds of random
//! prompts and tokens; per-op device time from the last round; the limits from [`super::limits`].
//! The result is a [`BenchResult`], the `tandem-bench/1` document (`docs/bench-schema.json`)
//! that the command line serialises.

use std::path::Path;
use std::time::Instant;

use tandem_backend_api::{BackendInfo, DeviceKind};

use super::error::BenchError;
use super::limits::{host_copy_bandwidth, peak_flops, HOST_COPY_SOURCE};
use super::machine::{cpu_name, now_rfc3339, peak_rss};
use super::results::{
    BackendDesc, BatchRun, BenchResult, BenchSettings, Limits, Machine, ModelDesc, OpTime, Percentiles,
    Spread, StepProfile, UnitHostTime, SCHEMA_ID,
};
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
    /// The verification cost curve up to this many rows (0: none), in a session of its own
    /// after the batch sizes ([`super::verify::curve`]).
    pub verify_rows: usize,
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

/// The median ([`super::results::median`]), minimum and maximum.
fn stats(mut v: Vec<f64>) -> Spread {
    v.sort_by(|a, b| a.total_cmp(b));
    Spread {
        median: super::results::median_of_sorted(&v),
        min: v.first().copied().unwrap_or(0.0),
        max: v.last().copied().unwrap_or(0.0),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The 50th, 90th and 99th percentiles of `sorted`.
fn percentiles(sorted: &[f64]) -> Percentiles {
    Percentiles {
        p50: percentile(sorted, 0.5),
        p90: percentile(sorted, 0.9),
        p99: percentile(sorted, 0.99),
    }
}

/// A count as the document's integer type.
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// This machine, with the GPU named where the backend that computed the logits is one.
fn this_machine(info: &BackendInfo) -> Machine {
    Machine {
        host: std::fs::read_to_string("/etc/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        cpu: cpu_name(),
        cores: count(std::thread::available_parallelism().map_or(1, |n| n.get())),
        os: std::env::consts::OS.to_string(),
        gpu: matches!(
            info.kind,
            DeviceKind::DiscreteGpu | DeviceKind::IntegratedGpu | DeviceKind::SoftwareGpu
        )
        .then(|| info.device.clone()),
    }
}

/// The backend of the unit that computed the logits; when the model ran on more than one unit
/// (`units`), the placement that split it (`--backend`, `--gpu-layers`) and the units too.
fn backend_desc(
    info: &BackendInfo,
    units: Option<Vec<String>>,
    backend: &str,
    gpu_layers: Option<usize>,
) -> BackendDesc {
    let units = units.filter(|u| u.len() > 1);
    BackendDesc {
        name: info.name.clone(),
        device: info.device.clone(),
        placement: units.as_ref().map(|_| match gpu_layers {
            Some(n) => format!("{backend} --gpu-layers {n}"),
            None => backend.to_string(),
        }),
        units,
        kind: info.kind,
        precision: precision(info),
    }
}

/// The arithmetic a unit runs, where its features name it (`precision=fast`).
fn precision(info: &BackendInfo) -> Option<String> {
    info.features
        .iter()
        .find_map(|f| f.strip_prefix("precision="))
        .map(str::to_string)
}

/// Sets each run's decode bandwidth fraction: its bytes per step over its median step time,
/// against the copy bandwidth `copy_bw`.
fn set_bandwidth_fractions(runs: &mut [BatchRun], copy_bw: f64) {
    for r in runs {
        let step_ms = r.token_latency_ms.p50;
        r.decode_bandwidth_fraction = if step_ms > 0.0 {
            r.decode_bytes_per_step as f64 / (step_ms / 1e3) / copy_bw
        } else {
            0.0
        };
    }
}

/// Runs the benchmark `options` describes on the plugins `search` finds, and returns the
/// `tandem-bench/1` result.
/// Where the synthetic model of `shape` and `dtype` is kept (written by [`run`] when absent):
/// `synthetic/SHAPE-DTYPE.gguf` in the cache directory.
pub fn synthetic_path(shape: &str, dtype: SynthDtype) -> std::path::PathBuf {
    cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("synthetic")
        .join(format!("{shape}-{dtype}.gguf"))
}

pub fn run(
    search: &PluginSearch,
    settings: &Settings,
    options: &BenchOptions,
    events: &mut dyn FnMut(BenchEvent<'_>),
) -> Result<BenchResult, BenchError> {
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
            let path = synthetic_path(shape, dtype);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|source| BenchError::Io {
                    path: dir.to_path_buf(),
                    source,
                })?;
            }
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
    model_args.context = Some(args.prompt_tokens + args.gen_tokens.max(args.verify_rows) + 1);
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
        let mut split_host_ms = None;
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
            // Host time per unit of a split: counted from here over this repeat's decode steps.
            let _ = loaded.session.take_host_times();
            let t1 = Instant::now();
            for _ in 1..args.gen_tokens {
                let toks: Vec<u32> = (0..batch).map(|_| next_token()).collect();
                let ts = Instant::now();
                loaded.session.step(Step::decode(&toks, &slots, &slots))?;
                steps.push(ts.elapsed().as_secs_f64() * 1e3);
                events(BenchEvent::Tokens(batch as u64));
            }
            let decode_s = t1.elapsed().as_secs_f64();
            let host = loaded.session.take_host_times();
            if rep == args.repeat && host.len() > 1 && !steps.is_empty() {
                let per = 1e3 / steps.len() as f64;
                split_host_ms = Some(
                    host.into_iter()
                        .map(|(unit, t)| UnitHostTime {
                            unit,
                            execute: t.execute.as_secs_f64() * per,
                            wait: t.wait.as_secs_f64() * per,
                            copy: t.copy.as_secs_f64() * per,
                        })
                        .collect(),
                );
            }
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
        runs.push(BatchRun {
            batch: count(batch),
            prefill_tokens_per_s: stats(prefill.clone()),
            decode_tokens_per_s: stats(decode),
            ttft_ms: stats(ttft),
            token_latency_ms: percentiles(&lat),
            decode_bytes_per_step: step_bytes,
            decode_bandwidth_fraction: 0.0, // set once the copy bandwidth is measured
            prefill_flops_fraction: if peak > 0.0 {
                prefill_flops * prefill_rate / peak
            } else {
                0.0
            },
            peak_rss_bytes: peak_rss().unwrap_or(0),
            device_memory_bytes: device_memory,
            profile,
            split_host_ms,
        });
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
    let verify_curve = match args.verify_rows {
        0 => None,
        rows => {
            let shared = std::cell::RefCell::new(&mut *events);
            let mut loaded = load(
                search,
                settings,
                &model_args,
                1,
                &mut |n| (shared.borrow_mut())(BenchEvent::Notice(n)),
                &mut |done, total| (shared.borrow_mut())(BenchEvent::Loading { done, total }),
            )?;
            events(BenchEvent::Loaded);
            let vocab = loaded.session.vocab() as u64;
            let mut rng = 0x2545_F491_4F6C_DD1Du64;
            let mut token = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % (vocab - 3)) as u32 + 3
            };
            let prompt: Vec<u32> = (0..args.prompt_tokens).map(|_| token()).collect();
            Some(super::verify::curve(
                &mut loaded.session,
                &prompt,
                rows,
                args.repeat,
                &mut token,
            )?)
        }
    };
    let (copy_bw, copy_src) = match copy_bw {
        Some((bw, src)) if bw > 0.0 => (bw, src),
        _ => (host_copy_bandwidth(), HOST_COPY_SOURCE.to_string()),
    };
    set_bandwidth_fractions(&mut runs, copy_bw);
    let params = cfg.vocab_size as u64 * cfg.hidden_size as u64
        + cfg.num_hidden_layers as u64
            * ((cfg.hidden_size * cfg.num_attention_heads * cfg.head_dim * 2
                + cfg.hidden_size * cfg.num_key_value_heads * cfg.head_dim * 2
                + 3 * cfg.hidden_size * cfg.intermediate_size) as u64);
    Ok(BenchResult {
        schema: SCHEMA_ID.to_string(),
        tool: "tandem".to_string(),
        date: now_rfc3339(),
        machine: this_machine(&info),
        backend: backend_desc(&info, units, &args.model.backend, args.model.gpu_layers),
        model: ModelDesc {
            name: model_name,
            source,
            dtype: if synthetic {
                args.dtype.clone()
            } else {
                "gguf".into()
            },
            params,
            weight_bytes,
            synthetic,
        },
        settings: BenchSettings {
            prompt_tokens: count(args.prompt_tokens),
            gen_tokens: count(args.gen_tokens),
            repeat: count(args.repeat),
            warmup: 1,
            batch: batches.iter().map(|&b| count(b)).collect(),
            kv_cache: Some(kv_cache),
        },
        limits: Limits {
            copy_bandwidth_bytes_per_s: copy_bw,
            copy_bandwidth_source: copy_src,
            peak_flops: peak,
            peak_flops_source: peak_src,
        },
        runs,
        verify_curve,
        speculation: None,
        image: None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        let two = stats(vec![50.0, 45.0]);
        assert_eq!((two.median, two.min, two.max), (47.5, 45.0, 50.0));
        assert_eq!(stats(vec![3.0, 1.0, 2.0]).median, 2.0);
        assert_eq!(stats(vec![4.0, 1.0, 3.0, 2.0]).median, 2.5);
        assert_eq!(stats(Vec::new()).median, 0.0);
    }

    /// One batch size's measurements, as the loop in [`run`] gathers them.
    struct Measured {
        batch: usize,
        prefill: Vec<f64>,
        decode: Vec<f64>,
        ttft: Vec<f64>,
        latency: Vec<f64>,
        step_bytes: u64,
        flops_fraction: f64,
        rss: u64,
        device_memory: Option<u64>,
        profile: Option<StepProfile>,
    }

    /// Everything else the document holds.
    struct Header {
        info: BackendInfo,
        units: Option<Vec<String>>,
        backend: String,
        gpu_layers: Option<usize>,
        copy_bw: f64,
    }

    const DATE: &str = "2026-11-22T22:00:00Z";

    /// The document as `run` built it with `json!` before it filled [`BenchResult`]: the
    /// expressions are the old ones, so that the typed document is compared with what was
    /// written before, field for field, `null` for `null` and absent for absent.
    fn untyped(h: &Header, measured: &[Measured]) -> Value {
        fn stats(mut v: Vec<f64>) -> Value {
            v.sort_by(|a, b| a.total_cmp(b));
            let median = crate::bench::results::median_of_sorted(&v);
            json!({ "median": median, "min": v.first().copied().unwrap_or(0.0), "max": v.last().copied().unwrap_or(0.0) })
        }
        let info = &h.info;
        let mut runs = Vec::new();
        for m in measured {
            let mut lat = m.latency.clone();
            lat.sort_by(|a, b| a.total_cmp(b));
            let mut run = json!({
                "batch": m.batch,
                "prefill_tokens_per_s": stats(m.prefill.clone()),
                "decode_tokens_per_s": stats(m.decode.clone()),
                "ttft_ms": stats(m.ttft.clone()),
                "token_latency_ms": { "p50": percentile(&lat, 0.5), "p90": percentile(&lat, 0.9), "p99": percentile(&lat, 0.99) },
                "decode_bytes_per_step": m.step_bytes,
                "decode_bandwidth_fraction": 0.0,
                "prefill_flops_fraction": m.flops_fraction,
                "peak_rss_bytes": m.rss,
                "device_memory_bytes": m.device_memory,
            });
            if let Some(p) = &m.profile {
                run["profile"] = serde_json::to_value(p).expect("a profile serialises");
            }
            runs.push(run);
        }
        for r in &mut runs {
            let bytes = r["decode_bytes_per_step"].as_f64().unwrap_or(0.0);
            let step_ms = r["token_latency_ms"]["p50"].as_f64().unwrap_or(0.0);
            r["decode_bandwidth_fraction"] = json!(if step_ms > 0.0 {
                bytes / (step_ms / 1e3) / h.copy_bw
            } else {
                0.0
            });
        }
        let mut backend_doc = json!({ "name": info.name, "device": info.device, "kind": info.kind });
        if let Some(p) = precision(info) {
            backend_doc["precision"] = json!(p);
        }
        if let Some(units) = h.units.clone().filter(|u| u.len() > 1) {
            backend_doc["placement"] = json!(match h.gpu_layers {
                Some(n) => format!("{} --gpu-layers {n}", h.backend),
                None => h.backend.clone(),
            });
            backend_doc["units"] = json!(units);
        }
        let batches: Vec<usize> = measured.iter().map(|m| m.batch).collect();
        json!({
            "schema": "tandem-bench/1",
            "tool": "tandem",
            "date": DATE,
            "machine": {
                "host": std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_default(),
                "cpu": cpu_name(),
                "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
                "os": std::env::consts::OS,
                "gpu": matches!(info.kind, DeviceKind::DiscreteGpu | DeviceKind::IntegratedGpu | DeviceKind::SoftwareGpu)
                    .then(|| info.device.clone()),
            },
            "backend": backend_doc,
            "model": { "name": "tiny", "source": "synthetic:tiny", "dtype": "q8_0",
                       "params": 1245184u64, "weight_bytes": 2_000_000u64, "synthetic": true },
            "settings": { "prompt_tokens": 8usize, "gen_tokens": 4usize, "repeat": 2usize,
                          "warmup": 1, "batch": batches, "kv_cache": "f32" },
            "limits": { "copy_bandwidth_bytes_per_s": h.copy_bw, "copy_bandwidth_source": "host memcpy 1 GiB (read + write)",
                        "peak_flops": 6.5e10, "peak_flops_source": "cpu backend matmul" },
            "runs": runs,
        })
    }

    /// The same document as `run` now fills it.
    fn typed(h: &Header, measured: &[Measured]) -> BenchResult {
        let mut runs: Vec<BatchRun> = measured
            .iter()
            .map(|m| {
                let mut lat = m.latency.clone();
                lat.sort_by(|a, b| a.total_cmp(b));
                BatchRun {
                    batch: count(m.batch),
                    prefill_tokens_per_s: stats(m.prefill.clone()),
                    decode_tokens_per_s: stats(m.decode.clone()),
                    ttft_ms: stats(m.ttft.clone()),
                    token_latency_ms: percentiles(&lat),
                    decode_bytes_per_step: m.step_bytes,
                    decode_bandwidth_fraction: 0.0,
                    prefill_flops_fraction: m.flops_fraction,
                    peak_rss_bytes: m.rss,
                    device_memory_bytes: m.device_memory,
                    profile: m.profile.clone(),
                    split_host_ms: None,
                }
            })
            .collect();
        set_bandwidth_fractions(&mut runs, h.copy_bw);
        BenchResult {
            schema: SCHEMA_ID.to_string(),
            tool: "tandem".to_string(),
            date: DATE.to_string(),
            machine: this_machine(&h.info),
            backend: backend_desc(&h.info, h.units.clone(), &h.backend, h.gpu_layers),
            model: ModelDesc {
                name: "tiny".into(),
                source: "synthetic:tiny".into(),
                dtype: "q8_0".into(),
                params: 1245184,
                weight_bytes: 2_000_000,
                synthetic: true,
            },
            settings: BenchSettings {
                prompt_tokens: 8,
                gen_tokens: 4,
                repeat: 2,
                warmup: 1,
                batch: measured.iter().map(|m| count(m.batch)).collect(),
                kv_cache: Some("f32".into()),
            },
            limits: Limits {
                copy_bandwidth_bytes_per_s: h.copy_bw,
                copy_bandwidth_source: "host memcpy 1 GiB (read + write)".into(),
                peak_flops: 6.5e10,
                peak_flops_source: "cpu backend matmul".into(),
            },
            runs,
            verify_curve: None,
            speculation: None,
            image: None,
        }
    }

    fn info(name: &str, kind: DeviceKind) -> BackendInfo {
        BackendInfo {
            name: name.into(),
            device: format!("{name} device"),
            kind,
            memory_bytes: None,
            features: vec![],
            physical_device: None,
            decode_rows: None,
        }
    }

    fn measured(batch: usize, device_memory: Option<u64>, profile: bool) -> Measured {
        let scale = batch as f64;
        Measured {
            batch,
            prefill: vec![700.0 * scale, 741.5 * scale, 690.25 * scale],
            decode: vec![2892.0 * scale, 2800.5 * scale],
            ttft: vec![10.8, 11.25],
            latency: vec![0.31, 0.29, 0.4, 0.35, 0.3, 0.28],
            step_bytes: 2_500_000 * batch as u64,
            flops_fraction: 0.027 * scale,
            rss: 400 << 20,
            device_memory,
            profile: profile.then(|| StepProfile {
                prefill: OpTime::by_op([("matmul(q8_0)", 0.01), ("rope", 0.0001), ("matmul(q8_0)", 0.002)]),
                decode: OpTime::by_op([("attention(kv f32)", 0.00008), ("matmul(q8_0)", 0.0002)]),
            }),
        }
    }

    /// The typed document serialises to exactly what the untyped one was: one backend and a
    /// CPU (no GPU, no device memory, no profile), a split placement with a GPU unit, a
    /// profile and device memory, and a `--gpu-layers` split.
    #[test]
    fn the_typed_result_is_the_document_json_wrote() {
        let cases = [
            (
                Header {
                    info: info("cpu", DeviceKind::Cpu),
                    units: Some(vec!["cpu".into()]),
                    backend: "cpu".into(),
                    gpu_layers: None,
                    copy_bw: 1.5e10,
                },
                vec![measured(1, None, false), measured(2, None, true)],
            ),
            (
                Header {
                    info: info("vulkan", DeviceKind::DiscreteGpu),
                    units: Some(vec!["vulkan".into(), "cpu".into()]),
                    backend: "vulkan+cpu".into(),
                    gpu_layers: None,
                    copy_bw: 4.0e11,
                },
                vec![measured(1, Some(1 << 30), true)],
            ),
            (
                Header {
                    info: info("wgpu", DeviceKind::IntegratedGpu),
                    units: Some(vec!["cpu".into(), "wgpu".into()]),
                    backend: "auto".into(),
                    gpu_layers: Some(3),
                    copy_bw: 3.0e10,
                },
                vec![measured(4, Some(0), false)],
            ),
        ];
        for (header, runs) in &cases {
            let result = typed(header, runs);
            let written = serde_json::to_value(&result).expect("a result serialises");
            assert_eq!(written, untyped(header, runs), "{}", header.backend);
            let text = serde_json::to_string_pretty(&result).expect("a result serialises");
            // Read back as the report reads it (exact figures: serde_json's float parsing may
            // miss the last bit of a 17-digit one).
            let back: BenchResult = serde_json::from_str(&text).expect("and reads back");
            assert_eq!(
                (&back.backend, &back.settings),
                (&result.backend, &result.settings)
            );
        }
    }

    #[test]
    fn a_single_unit_names_no_placement() {
        let one = backend_desc(
            &info("cpu", DeviceKind::Cpu),
            Some(vec!["cpu".into()]),
            "cpu",
            None,
        );
        assert_eq!((one.placement, one.units), (None, None));
        let split = backend_desc(
            &info("vulkan", DeviceKind::DiscreteGpu),
            Some(vec!["vulkan".into(), "cpu".into()]),
            "vulkan",
            Some(12),
        );
        assert_eq!(split.placement.as_deref(), Some("vulkan --gpu-layers 12"));
        assert_eq!(split.units, Some(vec!["vulkan".to_string(), "cpu".to_string()]));
    }
}
