//! `--backend auto` by measurement: when several hardware backends are available, every placement
//! they allow runs a short prefill and a few decode steps on the model, and the fastest decode
//! wins. The placements are each backend alone and each `A+B` when the model fits the fastest
//! unit whole; when it does not, each unit alone where the model fits it and each GPU with as
//! many layers as fit it, the rest on the CPU ([`Choice::gpu_layers`], see `runtime::load`).
//! The figures are cached per model file, devices and candidates in the cache directory
//! (`calibration.json`), so only the first run pays for them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::notice::Notice;
use super::placement::Placement;
use super::planned::{load_placed, LoadError, ModelOptions};
use super::plugins::Discovery;
use super::session::{Session, SessionError};
use super::settings::Settings;

/// Prompt tokens of the measured prefill.
const PREFILL_TOKENS: usize = 64;
/// Decode steps measured (after as many warm-up steps as it takes to compile).
const DECODE_STEPS: usize = 16;

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

/// How much of a model one unit holds within its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// All of it.
    Whole,
    /// Its first `n` layers (with the embedding and the head), the rest going to the CPU.
    FirstLayers(usize),
    /// Not even one layer.
    Nothing,
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
    let mut loaded = load_placed(chosen, &opts, 1, 1, &mut |_| {}, &mut |_: u64, _: u64| {})?;
    let s = &mut loaded.session;
    let vocab = s.model().config.vocab_size as u32;
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
            s.step(&[(3 + i) % vocab.max(1)], &[0], &[0])
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
    if let Some(c) = cache.and_then(|p| cached(p, key)) {
        return Ok((c, true));
    }
    let mut figures = Vec::new();
    for c in candidates {
        match measure(discovery, settings, options, c) {
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
