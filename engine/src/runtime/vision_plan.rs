//! Where the vision tower runs: the order of `[placement] vision` (by default the language
//! model's backend, then the CPU), and, for `engine placement`, each unit's verdict without
//! uploading anything ([`VisionTower::check`]). Loading takes the first unit of the order that
//! is available and builds the tower (`load::attach_images`).

use std::time::Instant;

use tandem_backend_api::{ComputeBackend, DeviceKind};

use super::images::ImagesError;
use super::load_error::LoadError;
use super::placement::{plugin_name, AUTO_ORDER};
use super::placement_report::{VisionCandidate, VisionReport};
use super::plugins::Discovery;
use super::settings::Settings;
use crate::model::vision::VisionTower;
use crate::model::vision_source::VisionSource;

/// The units the tower may run on, in order: `[placement] vision`, else `main` (the language
/// model's backend, by its plugin name) then the CPU.
pub fn vision_order(settings: &Settings, main: &str) -> Vec<String> {
    match &settings.placement.vision {
        Some(list) => list.clone(),
        None => {
            let mut order = vec![plugin_name(main).to_string()];
            if order[0] != "cpu" {
                order.push("cpu".into());
            }
            order
        }
    }
}

/// Checks the tower of `source` against each unit of `order` in turn (created from
/// `discovery` with the settings' options; nothing is uploaded): the first that is available
/// and runs every op of it is the tower's unit. `text_hidden` is the language model's width.
pub fn plan_vision(
    source: &VisionSource,
    order: &[String],
    discovery: &Discovery,
    settings: &Settings,
    text_hidden: usize,
) -> Result<VisionReport, LoadError> {
    let cfg = &source.config;
    let weights = source
        .weights()
        .map_err(|e| LoadError::Images(Box::new(ImagesError::Checkpoint(e))))?;
    let mut unit_name = None;
    let mut weight_bytes = None;
    let mut candidates = Vec::with_capacity(order.len());
    for name in order {
        let verdict = if unit_name.is_some() {
            "not tried (an earlier unit runs the tower)".to_string()
        } else {
            let plugin = plugin_name(name);
            match discovery.create(plugin, &settings.backend_options(plugin)) {
                Err(e) => format!("not available: {e}"),
                Ok(unit) => {
                    let check = VisionTower::check(unit.as_ref(), cfg, text_hidden, weights.as_ref())
                        .map_err(|e| LoadError::Images(Box::new(ImagesError::Model(e))))?;
                    weight_bytes.get_or_insert(check.weight_bytes);
                    if check.refused.is_empty() {
                        unit_name = Some(name.clone());
                        weight_bytes = Some(check.weight_bytes);
                        "runs the tower".to_string()
                    } else {
                        format!("refuses: {}", check.refused.join("; "))
                    }
                }
            }
        };
        candidates.push(VisionCandidate {
            name: name.clone(),
            verdict,
        });
    }
    Ok(VisionReport {
        measured: Vec::new(),
        source: source.origin(),
        layers: cfg.layers,
        hidden: cfg.hidden,
        heads: cfg.heads,
        patches: cfg.patches(),
        tokens_per_image: cfg.tokens_per_image,
        unit: unit_name,
        weight_bytes: weight_bytes.unwrap_or(0),
        candidates,
    })
}

/// What [`measured_order`] found.
pub struct Measured {
    /// The units, fastest first.
    pub order: Vec<String>,
    /// Each unit's time (ms), in that order.
    pub times: Vec<(String, f64)>,
}

/// Encodings timed per unit in [`measured_order`] (after one that compiles and warms up); the
/// fastest counts.
const TIMED_ENCODINGS: usize = 2;

/// Under `--backend auto` without `[placement] vision`: where two or more hardware units of
/// auto's order are available (software renderers left out, as auto's own measurement leaves
/// them), each encodes a blank image through a tower cut to its first encoder layer (patch
/// embedding, one layer, the pool and the projector: the work per layer decides), and the
/// order is theirs, fastest first, with each unit's time in milliseconds. `None` where fewer
/// than two units take part; a unit that cannot build the cut tower is left out.
pub fn measured_order(
    source: &VisionSource,
    discovery: &Discovery,
    settings: &Settings,
    text_hidden: usize,
) -> Result<Option<Measured>, LoadError> {
    let mut units = Vec::new();
    for name in AUTO_ORDER {
        if let Ok(unit) = discovery.create(name, &settings.backend_options(name)) {
            if unit.info().kind != DeviceKind::SoftwareGpu {
                units.push((name.to_string(), unit));
            }
        }
    }
    if units.len() < 2 {
        return Ok(None);
    }
    let times = time_units(source, units, text_hidden)?;
    if times.len() < 2 {
        return Ok(None);
    }
    let order = times.iter().map(|(n, _)| n.clone()).collect();
    Ok(Some(Measured { order, times }))
}

/// Each of `units` (name, backend) encoding a blank image through `source`'s tower cut to its
/// first encoder layer, after one encoding that compiles and warms up: the best of
/// [`TIMED_ENCODINGS`] in milliseconds, fastest first. A unit that cannot build or run the cut
/// tower is left out.
pub fn time_units(
    source: &VisionSource,
    units: Vec<(String, Box<dyn ComputeBackend>)>,
    text_hidden: usize,
) -> Result<Vec<(String, f64)>, LoadError> {
    let mut cut = source.config.clone();
    cut.layers = cut.layers.min(1);
    let weights = source
        .weights()
        .map_err(|e| LoadError::Images(Box::new(ImagesError::Checkpoint(e))))?;
    let pixels = vec![0.0f32; cut.channels * cut.image_size * cut.image_size];
    let mut times = Vec::new();
    for (name, mut unit) in units {
        let Ok(mut tower) = VisionTower::load(unit.as_mut(), &cut, text_hidden, weights.as_ref()) else {
            continue;
        };
        let mut best = f64::INFINITY;
        let mut ok = true;
        for i in 0..=TIMED_ENCODINGS {
            let t = Instant::now();
            if tower.encode(unit.as_mut(), &pixels).is_err() {
                ok = false;
                break;
            }
            if i > 0 {
                best = best.min(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        // A unit that fails to free what it held is dropped whole just after.
        let _ = tower.free(unit.as_mut());
        if ok {
            times.push((name, best));
        }
    }
    times.sort_by(|a, b| a.1.total_cmp(&b.1));
    Ok(times)
}

/// The note that says what [`measured_order`] found.
pub fn measured_note(times: &[(String, f64)]) -> String {
    let each: Vec<String> = times.iter().map(|(n, ms)| format!("{n} {ms:.1} ms")).collect();
    format!(
        "auto measured the vision tower cut to one encoder layer on each unit: {}; it runs on {}",
        each.join(", "),
        times.first().map_or("none", |(n, _)| n.as_str())
    )
}
