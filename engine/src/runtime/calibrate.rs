//! `--backend auto` by measurement: when several hardware backends are available, every placement
//! they allow runs a short prefill and a few decode steps on the model, and the fastest decode
//! wins. The placements are each backend alone and each `A+B` when the model fits the fastest
//! unit whole; when it does not, each unit alone where the model fits it and each GPU with as
//! many layers as fit it, the rest on the CPU ([`Choice::gpu_layers`], see `runtime::load`).
//! The figures are cached per model file, devices and candidates in the cache directory
//! (`calibration.json`), so only the first run pays for them.
//!
//! With an NPU present, each `npu+X` (attention on the NPU, the rest on X) is a candidate too,
//! and [`select`] ranks by the NPU backend's own cost estimates
//! (`ComputeBackend::estimate_decode`, asked with [`query`]) which of the placements it has
//! figures for are worth measuring: the estimates choose what to measure, the measurement
//! still chooses the placement.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tandem_backend_api::{
    BackendInfo, CostAnswer, CostQuery, DeviceKind, ModelShape, PeerUnit, PlacementEstimate,
};

use crate::checkpoint::config::Gemma3Config;

pub use super::budget::Fit;
use super::fitted::{load_fitted, plan_fitted};
use super::load_error::LoadError;
use super::notice::Notice;
use super::placement::Placement;
use super::planned::ModelOptions;
use super::plugins::Discovery;
use super::session::{Session, SessionError, Step};
use super::settings::Settings;

/// Prompt tokens of the measured prefill.
const PREFILL_TOKENS: usize = 64;
/// Decode steps measured (after as many warm-up steps as it takes to compile).
const DECODE_STEPS: usize = 16;
/// The positions the measured decode steps reach: the context [`query`] asks the NPU backend's
/// cost model about.
pub const DECODE_CONTEXT: usize = PREFILL_TOKENS + DECODE_STEPS;

/// A candidate placement: what `--backend` and `--gpu-layers` would say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    /// The placement (`vulkan`, `cpu+vulkan`).
    pub placement: String,
    /// Layers `0..N` on the placement's one backend, the rest on the CPU (`--gpu-layers N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_layers: Option<usize>,
}

impl Choice {
    /// The whole model on `placement`.
    pub fn whole(placement: impl Into<String>) -> Choice {
        Choice {
            placement: placement.into(),
            gpu_layers: None,
        }
    }

    /// Layers `0..count` on `backend`, the rest on the CPU.
    pub fn first_layers(backend: impl Into<String>, count: usize) -> Choice {
        Choice {
            placement: backend.into(),
            gpu_layers: Some(count),
        }
    }
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.gpu_layers {
            None => write!(f, "{}", self.placement),
            Some(n) => write!(f, "{} --gpu-layers {n}", self.placement),
        }
    }
}

/// One candidate's measured figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// The placement measured.
    #[serde(flatten)]
    pub choice: Choice,
    /// Decode tokens per second (median step of one sequence).
    pub decode_tokens_per_s: f64,
    /// Prefill tokens per second (one prompt).
    pub prefill_tokens_per_s: f64,
}

/// The outcome of a calibration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// What identifies the model, devices and candidates it was measured for.
    pub key: String,
    /// The fastest decode.
    pub choice: Choice,
    /// Every candidate, in the order measured.
    pub figures: Vec<Measured>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    entries: Vec<Calibration>,
}

/// Every placement `backends` allow: each alone, then each `A+B` of two different ones.
pub fn candidates(backends: &[String]) -> Vec<Choice> {
    let mut out: Vec<Choice> = backends.iter().map(Choice::whole).collect();
    for a in backends {
        for b in backends {
            if a != b {
                out.push(Choice::whole(format!("{a}+{b}")));
            }
        }
    }
    out
}

/// The candidates for a model that does not fit the fastest unit whole: each unit (in auto's
/// order) alone where the model fits it, and each other than the CPU with as many layers as fit
/// it, the rest on the CPU. A unit that holds nothing is no candidate.
pub fn layer_candidates(units: &[(String, Fit)]) -> Vec<Choice> {
    units
        .iter()
        .filter_map(|(name, fit)| match fit {
            Fit::Whole => Some(Choice::whole(name.clone())),
            Fit::FirstLayers(n) if *n > 0 => Some(Choice::first_layers(name.clone(), *n)),
            _ => None,
        })
        .collect()
}

/// The NPU plugin's name.
pub const NPU: &str = "npu";

/// At most this many of the placements the NPU backend's estimates rank are measured: the best
/// and the runner-up, when the runner-up is not slower at every end of their uncertainty.
pub const MODEL_RANKED_MEASURED: usize = 2;

/// The candidates an NPU adds: attention on it, the rest on each of `backends` (tandem's NPU
/// kernels are attention only, so the NPU alone is no candidate).
pub fn npu_candidates(backends: &[String]) -> Vec<Choice> {
    backends
        .iter()
        .map(|b| Choice::whole(format!("{NPU}+{b}")))
        .collect()
}

/// A unit `auto` found: its backend name and what the backend says about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    /// The backend name (`vulkan`, `npu`).
    pub name: String,
    /// Its device and kind.
    pub info: BackendInfo,
}

/// Which candidates `auto` measures.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// The candidates to measure, in their original order.
    pub measure: Vec<Choice>,
    /// The candidates the cost model ranked out (slower than the best at every end of its
    /// uncertainty, or past [`MODEL_RANKED_MEASURED`]).
    pub skipped: Vec<Choice>,
    /// What to tell the user, when an NPU is present.
    pub note: Option<String>,
}

/// A Gemma 3 model's shape as a backend's cost model sees it: its layer counts and widths, with
/// the sliding window of its local layers (the model takes five local layers in every six).
pub fn shape_of(c: &Gemma3Config) -> ModelShape {
    ModelShape {
        hidden: c.hidden_size,
        intermediate: c.intermediate_size,
        layers: c.num_hidden_layers,
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        window: c.sliding_window,
        vocab: c.vocab_size,
    }
}

/// What `auto` asks the NPU backend ([`tandem_backend_api::ComputeBackend::estimate_decode`]):
/// one sequence's decode of a model of `shape` at `context` positions, on every other unit of
/// `units` alone and with attention on the NPU.
pub fn query(units: &[Unit], shape: ModelShape, context: usize) -> CostQuery {
    CostQuery {
        model: shape,
        context,
        peers: units
            .iter()
            .filter(|u| u.info.kind != DeviceKind::Npu)
            .map(|u| PeerUnit {
                name: u.name.clone(),
                kind: u.info.kind,
                device: u.info.device.clone(),
            })
            .collect(),
    }
}

/// Which of `candidates` to measure on `units`, given the NPU backend's `answer` to [`query`].
/// Without an NPU among `units`: all of them. With one, the placements the answer estimates
/// (for the NPU backend's cost model: each iGPU it knows alone, and `npu+` that iGPU, on an
/// XDNA2 NPU) are ranked; of those, the fastest is measured, and the next only when it is not
/// slower at every end of the answer's uncertainty ([`CostAnswer::slower_everywhere`]),
/// [`MODEL_RANKED_MEASURED`] at most. Candidates the answer has no estimate for (the CPU,
/// another GPU, a layer split) are measured. Without an answer (no figures for the NPU or for
/// any unit beside it), every candidate is measured.
pub fn select(candidates: Vec<Choice>, units: &[Unit], answer: Option<&CostAnswer>) -> Selection {
    let Some(npu) = units.iter().find(|u| u.info.kind == DeviceKind::Npu) else {
        return Selection {
            measure: candidates,
            skipped: Vec::new(),
            note: None,
        };
    };
    let Some(answer) = answer else {
        let gpus: Vec<&str> = units
            .iter()
            .filter(|u| u.info.kind != DeviceKind::Npu && u.info.kind != DeviceKind::Cpu)
            .map(|u| u.info.device.as_str())
            .collect();
        let beside = if gpus.is_empty() {
            "on a machine without a GPU".to_string()
        } else {
            format!("beside {}", gpus.join(", "))
        };
        return Selection {
            note: Some(format!(
                "auto measures all {} candidates: the NPU cost model has no figures for {} {beside}",
                candidates.len(),
                npu.info.device
            )),
            measure: candidates,
            skipped: Vec::new(),
        };
    };
    // A whole-model placement's estimate: `npu+X` is attention on the NPU beside peer X.
    let estimate = |c: &Choice| -> Option<&PlacementEstimate> {
        if c.gpu_layers.is_some() {
            return None;
        }
        let p = c.placement.as_str();
        match p.strip_prefix(NPU).and_then(|rest| rest.strip_prefix('+')) {
            Some(rest) => answer.estimate(rest, true),
            None => answer.estimate(p, false),
        }
    };
    let mut ranked: Vec<(&Choice, &PlacementEstimate)> = candidates
        .iter()
        .filter_map(|c| Some((c, estimate(c)?)))
        .collect();
    ranked.sort_by(|a, b| b.1.tokens_per_s.total_cmp(&a.1.tokens_per_s));
    let mut kept = Vec::new();
    let mut skipped = Vec::new();
    let mut why = Vec::new();
    if let Some(&(best, best_e)) = ranked.first() {
        for &(c, e) in &ranked {
            let beaten = answer.slower_everywhere(e, best_e);
            if beaten || kept.len() >= MODEL_RANKED_MEASURED {
                why.push(format!(
                    "{c} at {:.0} decode tok/s ({:.0}-{:.0}) against {best}'s {:.0} ({:.0}-{:.0})",
                    e.tokens_per_s, e.low, e.high, best_e.tokens_per_s, best_e.low, best_e.high
                ));
                skipped.push(c.clone());
            } else {
                kept.push(c.clone());
            }
        }
    }
    let measure: Vec<Choice> = candidates.into_iter().filter(|c| !skipped.contains(c)).collect();
    let note = format!(
        "auto measures {} of {} candidates: the NPU cost model ({}{}) ranks {}{}",
        measure.len(),
        measure.len() + skipped.len(),
        if answer.simulated { "SIMULATED, " } else { "" },
        answer.basis,
        kept.iter().map(Choice::to_string).collect::<Vec<_>>().join(", "),
        if why.is_empty() {
            String::new()
        } else {
            format!(" first and leaves out {}", why.join("; "))
        }
    );
    Selection {
        measure,
        skipped,
        note: Some(note),
    }
}

/// The cache key: the model file's path, length and modification time, the devices, the
/// candidates.
pub fn key(model: &Path, devices: &[String], candidates: &[Choice]) -> String {
    let meta = std::fs::metadata(model).ok();
    let len = meta.as_ref().map_or(0, |m| m.len());
    let mtime = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    format!(
        "{}|{len}|{mtime}|{}|{}",
        model.display(),
        devices.join(","),
        candidates
            .iter()
            .map(Choice::to_string)
            .collect::<Vec<_>>()
            .join(",")
    )
}

/// The cached calibration for `key` in `cache`, if any.
pub fn cached(cache: &Path, key: &str) -> Option<Calibration> {
    let text = std::fs::read_to_string(cache).ok()?;
    let file: CacheFile = serde_json::from_str(&text).ok()?;
    file.entries.into_iter().find(|e| e.key == key)
}

/// Adds (or replaces) `calibration` in `cache`. A cache that cannot be written only costs a
/// new calibration next time.
fn store(cache: &Path, calibration: &Calibration) {
    let mut file: CacheFile = std::fs::read_to_string(cache)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    file.entries.retain(|e| e.key != calibration.key);
    file.entries.push(calibration.clone());
    if let Some(dir) = cache.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Ok(text) = serde_json::to_string_pretty(&file) {
        let _ = std::fs::write(cache, text);
    }
}

/// Measures one placement of `options.model`.
fn measure(
    discovery: &Discovery,
    settings: &Settings,
    options: &ModelOptions,
    choice: &Choice,
) -> Result<Measured, LoadError> {
    let opts = ModelOptions {
        backend: choice.placement.clone(),
        gpu_layers: choice.gpu_layers,
        context: Some(PREFILL_TOKENS + 2 * DECODE_STEPS + 8),
        chunk: PREFILL_TOKENS,
        ..options.clone()
    };
    let chosen = Placement::decide(
        discovery,
        settings,
        &choice.placement,
        choice.gpu_layers,
        &mut |_| {},
    )?;
    // The load path `runtime::load` takes once `auto` has chosen (calibration only runs under
    // plain `auto`, where a model too large for its unit may be split): budgets fitted,
    // micro-batches and boundaries as configured.
    let (planned, files) = plan_fitted(chosen, &opts, discovery, settings, true, 1, &mut |_| {})?;
    let mut loaded = load_fitted(planned, files, settings, &mut |_| {}, &mut |_: u64, _: u64| {})?;
    let s = &mut loaded.session;
    let vocab = s.vocab() as u32;
    let prompt: Vec<u32> = (0..PREFILL_TOKENS as u32)
        .map(|i| (3 + i * 7919) % vocab.max(1))
        .collect();
    let run = |s: &mut Session| -> Result<(f64, f64), LoadError> {
        s.reset(0);
        let t = Instant::now();
        s.prefill(0, &prompt, false).map_err(session_err)?;
        let prefill = t.elapsed().as_secs_f64();
        let mut steps = Vec::with_capacity(DECODE_STEPS);
        for i in 0..DECODE_STEPS as u32 {
            let t = Instant::now();
            s.step(Step::decode(&[(3 + i) % vocab.max(1)], &[0], &[0]))
                .map_err(session_err)?;
            steps.push(t.elapsed().as_secs_f64());
        }
        steps.sort_by(f64::total_cmp);
        Ok((prefill, steps[steps.len() / 2]))
    };
    run(s)?; // warm-up: compiles every program
    let (prefill, step) = run(s)?;
    Ok(Measured {
        choice: choice.clone(),
        decode_tokens_per_s: 1.0 / step.max(1e-9),
        prefill_tokens_per_s: PREFILL_TOKENS as f64 / prefill.max(1e-9),
    })
}

fn session_err(e: SessionError) -> LoadError {
    LoadError::Calibration(e.to_string())
}

/// Measures every placement in `candidates` on `options.model` (or takes the figures cached in
/// `cache` under `key`) and returns them with the fastest decode's placement. A candidate that
/// fails to load or run is left out with a note.
pub fn calibrate(
    discovery: &Discovery,
    settings: &Settings,
    options: &ModelOptions,
    candidates: &[Choice],
    key: &str,
    cache: Option<&Path>,
    notices: &mut dyn FnMut(Notice),
) -> Result<(Calibration, bool), LoadError> {
    calibrate_with(candidates, key, cache, notices, &mut |c| {
        measure(discovery, settings, options, c)
    })
}

/// [`calibrate`] with `measure` in place of loading and running each candidate.
pub fn calibrate_with(
    candidates: &[Choice],
    key: &str,
    cache: Option<&Path>,
    notices: &mut dyn FnMut(Notice),
    measure: &mut dyn FnMut(&Choice) -> Result<Measured, LoadError>,
) -> Result<(Calibration, bool), LoadError> {
    if let Some(c) = cache.and_then(|p| cached(p, key)) {
        return Ok((c, true));
    }
    let mut figures = Vec::new();
    for (i, c) in candidates.iter().enumerate() {
        notices(Notice::Progress(measuring_line(c, i, candidates.len())));
        match measure(c) {
            Ok(m) => figures.push(m),
            Err(e) => notices(Notice::Note(format!("calibration: {c} left out: {e}"))),
        }
    }
    let best = figures
        .iter()
        .max_by(|a, b| a.decode_tokens_per_s.total_cmp(&b.decode_tokens_per_s))
        .ok_or_else(|| LoadError::Calibration("no candidate placement ran".into()))?;
    let calibration = Calibration {
        key: key.to_string(),
        choice: best.choice.clone(),
        figures: figures.clone(),
    };
    if let Some(p) = cache {
        store(p, &calibration);
    }
    Ok((calibration, false))
}

/// The progress line before candidate `index` (from 0) of `count` is measured.
pub fn measuring_line(c: &Choice, index: usize, count: usize) -> String {
    format!(
        "auto: measuring {c} ({} of {count}: a {PREFILL_TOKENS}-token prefill and {DECODE_STEPS} decode steps, twice)",
        index + 1
    )
}

/// The line `auto` prints: the choice and the figures behind it.
pub fn describe(c: &Calibration, from_cache: Option<&PathBuf>) -> String {
    let figures: Vec<String> = c
        .figures
        .iter()
        .map(|m| {
            format!(
                "{} {:.1} decode / {:.1} prefill tok/s",
                m.choice, m.decode_tokens_per_s, m.prefill_tokens_per_s
            )
        })
        .collect();
    let source = match from_cache {
        Some(p) => format!("measured earlier, cached in {}", p.display()),
        None => {
            format!("measured now: a {PREFILL_TOKENS}-token prefill and {DECODE_STEPS} decode steps each")
        }
    };
    format!(
        "auto chose {} by measurement ({source}): {}",
        c.choice,
        figures.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_each_alone_then_each_pair() {
        let c = candidates(&["vulkan".into(), "cpu".into()]);
        let c: Vec<String> = c.iter().map(Choice::to_string).collect();
        assert_eq!(c, ["vulkan", "cpu", "vulkan+cpu", "cpu+vulkan"]);
        assert_eq!(candidates(&["cpu".into()]), [Choice::whole("cpu")]);
    }

    fn unit(name: &str, kind: DeviceKind, device: &str, features: &[&str]) -> Unit {
        Unit {
            name: name.into(),
            info: BackendInfo {
                name: name.into(),
                device: device.into(),
                kind,
                memory_bytes: None,
                features: features.iter().map(|f| f.to_string()).collect(),
                physical_device: None,
                decode_rows: None,
            },
        }
    }

    /// A Ryzen AI laptop as `auto` sees it: an iGPU through Vulkan, the CPU and a fake XDNA2 NPU
    /// (the `npu` plugin's device executor reports `generation=npu4`).
    fn laptop(npu_features: &[&str], gpu: &str) -> Vec<Unit> {
        vec![
            unit("vulkan", DeviceKind::IntegratedGpu, gpu, &[]),
            unit("cpu", DeviceKind::Cpu, "host", &[]),
            unit(
                NPU,
                DeviceKind::Npu,
                "AMD NPU npu4 (RyzenAI-npu4) at /dev/accel/accel0",
                npu_features,
            ),
        ]
    }

    fn all_candidates() -> Vec<Choice> {
        let names = ["vulkan".to_string(), "cpu".to_string()];
        let mut c = candidates(&names);
        c.extend(npu_candidates(&names));
        c
    }

    fn names(c: &[Choice]) -> Vec<String> {
        c.iter().map(Choice::to_string).collect()
    }

    /// A peer's estimate: `own_s` on the NPU, `peer_s` on the peer, the bounds at +-10% / +-25%.
    fn estimate(peer: &str, attention_here: bool, own_s: f64, peer_s: f64) -> PlacementEstimate {
        let t = |n: f64, g: f64| own_s * n + peer_s * g;
        PlacementEstimate {
            peer: peer.into(),
            attention_here,
            tokens_per_s: 1.0 / t(1.0, 1.0),
            low: 1.0 / t(1.1, 1.25),
            high: 1.0 / t(0.9, 0.75),
            own_s,
            peer_s,
        }
    }

    /// An answer like the NPU backend's for Gemma 3 1B on Strix: each of `peers` alone at
    /// 10 ms a token, and with attention on the NPU at 4 ms there and 9 ms on the peer (a
    /// dispatch and two hand-offs per layer): slower at every end of +-10% / +-25%.
    fn answer(peers: &[&str]) -> CostAnswer {
        CostAnswer {
            estimates: peers
                .iter()
                .flat_map(|p| [estimate(p, false, 0.0, 0.010), estimate(p, true, 0.004, 0.009)])
                .collect(),
            own_uncertainty: 0.1,
            peer_uncertainty: 0.25,
            simulated: true,
            basis: "calibrated against FastFlowLM's published XDNA2 figures; Strix (Ryzen AI 9 HX 370, \
                    Radeon 890M); NPU +-10%, iGPU +-25%"
                .into(),
        }
    }

    #[test]
    fn the_query_names_every_unit_beside_the_npu() {
        let units = laptop(&["generation=npu4"], "AMD Radeon 890M Graphics (RADV GFX1150)");
        let shape = ModelShape {
            hidden: 1152,
            intermediate: 6912,
            layers: 26,
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            window: 512,
            vocab: 262_144,
        };
        let q = query(&units, shape, DECODE_CONTEXT);
        assert_eq!((q.model, q.context), (shape, DECODE_CONTEXT));
        let peers: Vec<(&str, DeviceKind, &str)> = q
            .peers
            .iter()
            .map(|p| (p.name.as_str(), p.kind, p.device.as_str()))
            .collect();
        assert_eq!(
            peers,
            [
                (
                    "vulkan",
                    DeviceKind::IntegratedGpu,
                    "AMD Radeon 890M Graphics (RADV GFX1150)"
                ),
                ("cpu", DeviceKind::Cpu, "host"),
            ]
        );
    }

    #[test]
    fn with_an_npu_its_estimates_choose_what_is_measured() {
        let units = laptop(&["generation=npu4"], "AMD Radeon 890M Graphics (RADV GFX1150)");
        let a = answer(&["vulkan"]);
        let s = select(all_candidates(), &units, Some(&a));
        // The answer ranks vulkan and npu+vulkan; npu+vulkan pays a dispatch and two hand-offs
        // per layer and is slower at every end of the uncertainty. The CPU has no figures.
        assert_eq!(
            names(&s.measure),
            ["vulkan", "cpu", "vulkan+cpu", "cpu+vulkan", "npu+cpu"]
        );
        assert_eq!(names(&s.skipped), ["npu+vulkan"]);
        let note = s.note.unwrap();
        assert!(note.starts_with("auto measures 5 of 6 candidates"), "{note}");
        assert!(
            note.contains(&format!(
                "the NPU cost model (SIMULATED, {}) ranks vulkan first",
                a.basis
            )),
            "{note}"
        );
        assert!(
            note.contains("leaves out npu+vulkan at 77 decode tok/s (64-97) against vulkan's 100 (80-133)"),
            "{note}"
        );
        // What calibration then measures is exactly the selection, and it still decides.
        let mut measured = Vec::new();
        let mut steps = Vec::new();
        let (c, cached) = calibrate_with(&s.measure, "k", None, &mut |n| steps.push(n), &mut |c| {
            measured.push(c.to_string());
            Ok(Measured {
                choice: c.clone(),
                decode_tokens_per_s: if c.placement == "npu+cpu" { 9.0 } else { 1.0 },
                prefill_tokens_per_s: 1.0,
            })
        })
        .unwrap();
        assert!(!cached);
        assert_eq!(measured, names(&s.measure));
        assert_eq!(c.choice, Choice::whole("npu+cpu"));
        // A progress line before each candidate, counting them.
        let lines: Vec<String> = steps
            .iter()
            .map(|n| match n {
                Notice::Progress(m) => m.clone(),
                other => panic!("not a progress step: {other}"),
            })
            .collect();
        assert_eq!(lines.len(), 5);
        assert!(
            lines[0].starts_with("auto: measuring vulkan (1 of 5: "),
            "{lines:?}"
        );
        assert!(
            lines[4].starts_with("auto: measuring npu+cpu (5 of 5: "),
            "{lines:?}"
        );
    }

    #[test]
    fn without_an_answer_every_candidate_is_measured() {
        // What the NPU backend gives no answer for: a GPU its model does not know, an XDNA
        // (npu1) NPU, the emulator behind the `npu` name (no generation, no NPU timings).
        let cases = [
            laptop(&["generation=npu4"], "NVIDIA H100 80GB HBM3"),
            laptop(&["generation=npu1"], "AMD Radeon 780M"),
            laptop(&["emulated", "simulated_timing=npu4"], "AMD Radeon 890M Graphics"),
        ];
        for units in &cases {
            let s = select(all_candidates(), units, None);
            assert_eq!(s.measure, all_candidates());
            assert!(s.skipped.is_empty());
            let note = s.note.unwrap();
            assert!(note.starts_with("auto measures all 6 candidates"), "{note}");
            assert!(
                note.contains(&units[2].info.device) && note.contains(&units[0].info.device),
                "{note}"
            );
        }
        // An NPU and the CPU only.
        let units = [cases[0][1].clone(), cases[0][2].clone()];
        let c = candidates(&["cpu".into()]);
        let note = select(c, &units, None).note.unwrap();
        assert!(note.ends_with("on a machine without a GPU"), "{note}");
        // No NPU: unchanged, nothing said (an answer, had there been one, is not read).
        let units = &cases[0][..2];
        let c = candidates(&["vulkan".into(), "cpu".into()]);
        let s = select(c.clone(), units, Some(&answer(&["vulkan"])));
        assert_eq!((s.measure, s.skipped, s.note), (c, vec![], None));
    }

    #[test]
    fn two_backends_on_one_known_igpu_are_both_measured_and_capped() {
        let mut units = laptop(&["generation=npu6"], "AMD Radeon 860M");
        units.push(unit(
            "wgpu",
            DeviceKind::IntegratedGpu,
            "AMD Radeon 860M (Vulkan)",
            &[],
        ));
        let names_ = ["vulkan".to_string(), "wgpu".to_string()];
        let mut c = candidates(&names_);
        c.extend(npu_candidates(&names_));
        let s = select(c.clone(), &units, Some(&answer(&["vulkan", "wgpu"])));
        // vulkan and wgpu tie; both npu+ placements are behind them.
        assert_eq!(
            names(&s.measure),
            ["vulkan", "wgpu", "vulkan+wgpu", "wgpu+vulkan"]
        );
        assert_eq!(names(&s.skipped), ["npu+vulkan", "npu+wgpu"]);
        // Where attention on the NPU is close behind (not slower everywhere), only the cap of
        // two leaves it out.
        let mut close = answer(&["vulkan", "wgpu"]);
        for e in close.estimates.iter_mut().filter(|e| e.attention_here) {
            *e = estimate(&e.peer, true, 0.002, 0.0085);
        }
        let s = select(c, &units, Some(&close));
        assert_eq!(names(&s.skipped), ["npu+vulkan", "npu+wgpu"]);
        let e = close.estimate("vulkan", true).unwrap();
        let best = close.estimate("vulkan", false).unwrap();
        assert!(!close.slower_everywhere(e, best));
    }

    #[test]
    fn layer_candidates_keep_what_fits() {
        let units = [
            ("vulkan".to_string(), Fit::FirstLayers(20)),
            ("wgpu".to_string(), Fit::Nothing),
            ("npu".to_string(), Fit::FirstLayers(0)),
            ("cpu".to_string(), Fit::Whole),
        ];
        let c = layer_candidates(&units);
        assert_eq!(c, [Choice::first_layers("vulkan", 20), Choice::whole("cpu")]);
        assert_eq!(c[0].to_string(), "vulkan --gpu-layers 20");
        assert!(layer_candidates(&[("cpu".into(), Fit::Nothing)]).is_empty());
    }

    #[test]
    fn a_measured_layer_split_keeps_its_count_through_the_cache() {
        let m = Measured {
            choice: Choice::first_layers("vulkan", 7),
            decode_tokens_per_s: 1.5,
            prefill_tokens_per_s: 2.5,
        };
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.contains("\"gpu_layers\":7"), "{text}");
        assert_eq!(serde_json::from_str::<Measured>(&text).unwrap(), m);
        let whole = serde_json::to_string(&Measured {
            choice: Choice::whole("cpu"),
            ..m
        })
        .unwrap();
        assert!(!whole.contains("gpu_layers"), "{whole}");
    }

    #[test]
    fn the_cache_keeps_one_entry_per_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/calibration.json");
        let m = |p: &str, d| Measured {
            choice: Choice::whole(p),
            decode_tokens_per_s: d,
            prefill_tokens_per_s: 1.0,
        };
        let a = Calibration {
            key: "a".into(),
            choice: Choice::whole("cpu"),
            figures: vec![m("cpu", 2.0)],
        };
        store(&p, &a);
        let b = Calibration {
            key: "a".into(),
            choice: Choice::whole("vulkan"),
            figures: vec![m("vulkan", 3.0)],
        };
        store(&p, &b);
        assert_eq!(cached(&p, "a"), Some(b));
        assert_eq!(cached(&p, "other"), None);
        std::fs::write(&p, "not json").unwrap();
        assert_eq!(cached(&p, "a"), None, "a broken cache is no cache");
    }
}
