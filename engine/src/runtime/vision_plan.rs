//! Where the vision tower runs: the order of `[placement] vision` (by default the language
//! model's backend, then the CPU), and, for `engine placement`, each unit's verdict without
//! uploading anything ([`VisionTower::check`]). Loading takes the first unit of the order that
//! is available and builds the tower (`load::attach_images`).

use super::images::ImagesError;
use super::load_error::LoadError;
use super::placement::plugin_name;
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
