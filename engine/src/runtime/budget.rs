//! Memory budgets: each unit may hold what its backend says it may use
//! ([`tandem_backend_api::BackendInfo::memory_bytes`]: the device's memory, or less under
//! `[backend.NAME] memory_limit`). [`fit`] checks a planned placement against them before
//! anything is uploaded; under `--backend auto`, a model that does not fit its one unit is split
//! by layers, as many on that unit as fit, the rest on the CPU. A model that fits nowhere is an
//! error naming the sizes, never an allocation failure halfway through a load.

use super::layers::LayerRule;
pub use super::load_error::BudgetError;
use super::load_error::LoadError;
use super::notice::Notice;
use super::placement::{region_units, Candidate};
use super::placement_report::{gib, UnitReport};
use super::planned::Planned;
use super::plugins::Discovery;
use super::settings::Settings;

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

fn budget_source(settings: &Settings, unit: &str) -> String {
    settings
        .memory_limit_source(unit)
        .unwrap_or_else(|| "the device's memory".to_string())
}

fn over(u: &UnitReport, settings: &Settings, hint: String) -> BudgetError {
    let mut source_of_budget = budget_source(settings, u.budget_unit());
    if !u.shares_device_with.is_empty() {
        source_of_budget.push_str(&format!(
            ", shared with {} on the same device, which need {} with it",
            u.shares_device_with.join(", "),
            gib(u.device_need_bytes)
        ));
    }
    BudgetError {
        unit: u.name.clone(),
        need: u.need_bytes(),
        weights: u.weight_bytes,
        kv_cache: u.kv_cache_bytes,
        activations: u.activation_bytes,
        budget: u.budget_bytes.unwrap_or(0),
        source_of_budget,
        hint,
    }
}

/// The first unit of `planned` over its budget, if any.
fn first_over(planned: &Planned) -> Option<UnitReport> {
    planned.report().units.into_iter().find(UnitReport::over_budget)
}

/// Checks `planned` against every unit's budget. When the placement is one unit that the model
/// does not fit and `may_split` (`--backend auto`), splits it by layers instead: the most
/// layers that fit stay there, the rest go to the CPU, and `notices` hears how and why.
pub fn fit(
    planned: Planned,
    discovery: &Discovery,
    settings: &Settings,
    may_split: bool,
    notices: &mut dyn FnMut(Notice),
) -> Result<Planned, LoadError> {
    let Some(whole) = first_over(&planned) else {
        return Ok(planned);
    };
    let single = planned.placement.candidates.len() == 1 && planned.placement.spec.layers.is_none();
    let layers = planned.model.layers.len();
    if !single {
        let hint = match &planned.placement.spec.layers {
            Some(LayerRule::First { count, .. }) => {
                format!("lower --gpu-layers ({count} now), raise the budget or shorten --context")
            }
            Some(LayerRule::Spread { .. }) => {
                "name fewer devices, raise their budgets or shorten --context".to_string()
            }
            Some(LayerRule::Ranges(_)) => {
                "move layers off it in [placement.layers], raise the budget or shorten --context".to_string()
            }
            None => "raise the budget, shorten --context, or place by layers (--gpu-layers N)".to_string(),
        };
        return Err(over(&whole, settings, hint).into());
    }
    let is_cpu = matches!(
        planned.placement.candidates.first(),
        Some((_, Candidate::Ready(b))) if b.info().kind == tandem_backend_api::DeviceKind::Cpu
    );
    if is_cpu {
        return Err(over(&whole, settings, "raise the budget or shorten --context".into()).into());
    }
    let origin = planned.placement.spec.origin.clone();
    let (mut planned, best) = most_first_layers(planned, discovery, settings)?;
    let count = match best {
        Some(n) if n > 0 => n,
        _ => {
            let hint = "it cannot hold even the embedding, the output head and one layer: raise the budget, or run --backend cpu".to_string();
            return Err(over(&whole, settings, hint).into());
        }
    };
    if !may_split {
        let hint = format!(
            "--gpu-layers {count} keeps {count} of {layers} layers there and runs the rest on the CPU (--backend auto does that by itself)"
        );
        return Err(over(&whole, settings, hint).into());
    }
    planned = planned.with_gpu_layers(count)?;
    planned.placement.spec.origin = format!(
        "{origin}, fit to {}'s memory like --gpu-layers {count}",
        whole.name
    );
    if let Some(u) = first_over(&planned) {
        let hint = format!(
            "with {count} of {layers} layers on {} the rest do not fit there",
            whole.name
        );
        return Err(over(&u, settings, hint).into());
    }
    let placed = region_units(
        &planned.regions,
        &planned.placement.spec,
        &planned.placement.candidates,
    )?
    .map(|u| u.describe())
    .unwrap_or_default();
    notices(Notice::Note(format!(
        "{origin}: the model needs {} on {} whole, which may use {} ({}); {count} of {layers} layers fit there, like --gpu-layers {count}: {placed}",
        gib(whole.need_bytes()),
        whole.name,
        gib(whole.budget_bytes.unwrap_or(0)),
        budget_source(settings, whole.budget_unit()),
    )));
    Ok(planned)
}

/// `planned` (a placement of one unit that is not the CPU) split by layers with the most first
/// layers that fit the unit's budget, the rest on the CPU, and that count (`None`: not even
/// the embedding, the head and one layer fit). The rest may still be over the CPU's budget.
pub fn most_first_layers(
    planned: Planned,
    discovery: &Discovery,
    settings: &Settings,
) -> Result<(Planned, Option<usize>), LoadError> {
    let layers = planned.model.layers.len();
    let Planned {
        placement,
        model,
        graph,
        parts,
        regions,
        ..
    } = planned;
    let split = placement.with_first_layers(layers, discovery, settings)?;
    let mut planned = Planned::place(split, model, graph, parts, regions)?;
    // A binary search: more layers never need less.
    let (mut lo, mut hi) = (0usize, layers);
    let mut best: Option<usize> = None;
    while lo <= hi {
        let mid = (lo + hi) / 2;
        planned = planned.with_gpu_layers(mid)?;
        if planned.report().units.first().is_some_and(|u| !u.over_budget()) {
            best = Some(mid);
            lo = mid + 1;
        } else if mid == 0 {
            break;
        } else {
            hi = mid - 1;
        }
    }
    Ok((planned, best))
}

/// How much of `planned` (one unit, not split) its unit holds: the whole model, its first
/// layers with the rest on the CPU (the rest within the CPU's budget), or nothing.
pub fn fit_of(planned: Planned, discovery: &Discovery, settings: &Settings) -> Result<Fit, LoadError> {
    if first_over(&planned).is_none() {
        return Ok(Fit::Whole);
    }
    let on_cpu = matches!(
        planned.placement.candidates.first(),
        Some((_, Candidate::Ready(b))) if b.info().kind == tandem_backend_api::DeviceKind::Cpu
    );
    if on_cpu {
        return Ok(Fit::Nothing);
    }
    let (planned, best) = most_first_layers(planned, discovery, settings)?;
    Ok(match best {
        Some(n) if n > 0 => match planned.with_gpu_layers(n) {
            Ok(p) if first_over(&p).is_none() => Fit::FirstLayers(n),
            _ => Fit::Nothing,
        },
        _ => Fit::Nothing,
    })
}
