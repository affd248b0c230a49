//! Loading a model as the user asked: the placement is decided first ([`decide`]: the plugins
//! found, `--backend` and the config's `[placement]`, and for `auto` on a machine with several
//! hardware backends, measurement by [`super::calibrate`]), then the one load path
//! ([`super::planned`]) places and uploads the model. What `engine run`, `chat`, `serve`,
//! `placement` and `bench` share.

use tandem_backend_api::{ComputeBackend, DeviceKind};

use super::adapters::{Adapters, Facts, Taken};
use super::fitted::{load_fitted, plan_fitted};
use super::images::{Images, ImagesError};
pub use super::load_error::LoadError;
use super::notice::Notice;
use super::placement::{discover, Candidate, Placement, AUTO_ORDER};
use super::placement_report::gib;
use super::planned::plan_placed;
pub use super::planned::{KvCacheType, Loaded, ModelOptions, Planned};
use super::plugins::{Discovery, PluginSearch};
use super::settings::Settings;
use super::{budget, calibrate};
use crate::model::files::cache_dir;
use crate::model::files::ModelFiles;
use crate::model::LoadProgress;

/// The placement `options.backend` and `settings` ask for, its units created: `auto` replaced
/// by the placement that measured fastest where it may measure ([`measured_auto`], fitting the
/// model with KV caches for `slots` sequences); returns the options as resolved.
pub fn decide(
    discovery: &Discovery,
    settings: &Settings,
    options: &ModelOptions,
    slots: usize,
    notices: &mut dyn FnMut(Notice),
) -> Result<(ModelOptions, Placement), LoadError> {
    // One set of facts for both: what measuring learns (and the backends it created) is what
    // the choice uses, so no backend is created twice.
    let mut adapters = Adapters::for_plugins(discovery, settings);
    let measured = measured_auto(&mut adapters, discovery, settings, options, slots, notices);
    let options = match measured {
        Ok(m) => m.unwrap_or_else(|| options.clone()),
        Err(e) => {
            adapters.save();
            return Err(e);
        }
    };
    let placement = Placement::decide_with(
        &mut adapters,
        discovery,
        settings,
        &options.backend,
        options.gpu_layers,
        notices,
    );
    adapters.save();
    Ok((options, placement?))
}

/// Decides the placement, plans the model on it and checks every unit's memory budget
/// ([`budget::fit`]: under plain `auto`, a model too large for its unit is split by layers).
fn plan_files(
    search: &PluginSearch,
    settings: &Settings,
    options: &ModelOptions,
    slots: usize,
    notices: &mut dyn FnMut(Notice),
) -> Result<(Planned, ModelFiles, Discovery), LoadError> {
    let discovery = discover(search, notices);
    let (resolved, placement) = decide(&discovery, settings, options, slots, notices)?;
    let may_split = plain_auto(settings, options);
    let (planned, files) = plan_fitted(
        placement, &resolved, &discovery, settings, may_split, slots, notices,
    )?;
    Ok((planned, files, discovery))
}

/// Loads the vision tower found for `loaded` (where images were asked for) on a unit of its own:
/// the first of `[placement] vision` that is available and runs the tower's ops, by default the
/// language model's backend, then the CPU. A backend passed over is said in a note.
fn attach_images(
    loaded: &mut Loaded,
    discovery: &Discovery,
    settings: &Settings,
    auto: bool,
    notices: &mut dyn FnMut(Notice),
) -> Result<(), LoadError> {
    let Some(source) = loaded.vision.take() else {
        return Ok(());
    };
    let hidden = loaded.session.model().config.hidden_size;
    let main = loaded.session.backend().info().name;
    let order = vision_units(&source, discovery, settings, auto, &main, hidden, notices)?.order;
    let mut why = Vec::new();
    let mut found = None;
    for name in &order {
        let plugin = super::placement::plugin_name(name);
        let unit = match discovery.create(plugin, &settings.backend_options(plugin)) {
            Ok(u) => u,
            Err(e) => {
                why.push(format!("{name}: {e}"));
                continue;
            }
        };
        match Images::open(&source, unit, name, &loaded.session, hidden, &loaded.tokenizer) {
            Ok(images) => {
                found = Some(images);
                break;
            }
            // The tower's ops on a backend without their kernels: the next one.
            Err(ImagesError::Model(e)) => why.push(format!("{name}: {e}")),
            Err(e) => return Err(LoadError::Images(Box::new(e))),
        }
    }
    let Some(images) = found else {
        return Err(LoadError::Images(Box::new(ImagesError::Unit(why.join("; ")))));
    };
    for w in &why {
        notices(Notice::Note(format!("the vision tower passed over {w}")));
    }
    loaded.images = Some(images);
    loaded.vision = Some(source);
    Ok(())
}

/// The units the vision tower of `source` may run on, in order, and auto's measurement where it
/// made one (said in a note; `times` empty otherwise): under plain `auto` without `[placement] vision`, the hardware
/// units measured fastest first ([`super::vision_plan::measured_order`]), else
/// [`super::vision_plan::vision_order`] after `main`, the language model's unit.
fn vision_units(
    source: &crate::model::vision_source::VisionSource,
    discovery: &Discovery,
    settings: &Settings,
    auto: bool,
    main: &str,
    hidden: usize,
    notices: &mut dyn FnMut(Notice),
) -> Result<super::vision_plan::Measured, LoadError> {
    use super::vision_plan::{measured_note, measured_order, vision_order, Measured};
    if auto && settings.placement.vision.is_none() {
        if let Some(m) = measured_order(source, discovery, settings, hidden)? {
            notices(Notice::Note(measured_note(&m.times)));
            return Ok(m);
        }
    }
    Ok(Measured {
        order: vision_order(settings, main),
        times: Vec::new(),
    })
}

/// `--backend auto` with neither `[placement]` lists nor `--gpu-layers`: what may split a model
/// by layers to fit it.
fn plain_auto(settings: &Settings, options: &ModelOptions) -> bool {
    options.backend == "auto" && options.gpu_layers.is_none() && !settings.placement.splits()
}

/// Places `options.model` on the units `options.backend` and `settings` name, without uploading:
/// every node of the step graph on the first unit of its list that is available and runs it,
/// within every unit's memory budget.
pub fn plan(
    search: &PluginSearch,
    settings: &Settings,
    options: &ModelOptions,
    slots: usize,
    notices: &mut dyn FnMut(Notice),
) -> Result<Planned, LoadError> {
    let (mut planned, files, discovery) = plan_files(search, settings, options, slots, notices)?;
    // The vision tower, where images were asked for: each unit of its order checked, nothing
    // uploaded.
    if let Some(source) = &files.vision {
        let main = planned
            .assignment
            .decode
            .last()
            .and_then(|c| planned.placement.candidates.get(c.unit))
            .map(|(name, _)| name.clone())
            .unwrap_or_default();
        let hidden = files.config.hidden_size;
        let auto = plain_auto(settings, options);
        let units = vision_units(source, &discovery, settings, auto, &main, hidden, notices)?;
        let mut report = super::vision_plan::plan_vision(source, &units.order, &discovery, settings, hidden)?;
        report.measured = units.times;
        planned.vision = Some(report);
    }
    Ok(planned)
}

/// Loads `options.model` onto the units `options.backend` and `settings` name (one backend, or
/// a split), with KV caches for `slots` sequences; `progress` hears of every uploaded tensor,
/// `notices` of backends passed over and of a split.
pub fn load(
    search: &PluginSearch,
    settings: &Settings,
    options: &ModelOptions,
    slots: usize,
    notices: &mut dyn FnMut(Notice),
    progress: &mut dyn LoadProgress,
) -> Result<Loaded, LoadError> {
    let (planned, files, discovery) = plan_files(search, settings, options, slots, notices)?;
    let mut loaded = load_fitted(planned, files, settings, notices, progress)?;
    attach_images(
        &mut loaded,
        &discovery,
        settings,
        plain_auto(settings, options),
        notices,
    )?;
    Ok(loaded)
}

/// Loads `options.model` again as [`load`] does, without the units `lost` (instance names of
/// units lost while serving; `why`: the reason each is unavailable, for the notes): the
/// placement decided as before, but without measuring (`auto` on one unit takes the first
/// available of its order that is not lost), then those units made unavailable so that their
/// nodes go to the units that remain ([`Placement::without`]; `notices` hears where), then the
/// one load path ([`plan_fitted`], [`load_fitted`]). An error when no unit remains or the model
/// does not fit what does.
#[allow(clippy::too_many_arguments)]
pub fn load_without(
    search: &PluginSearch,
    settings: &Settings,
    options: &ModelOptions,
    slots: usize,
    lost: &[String],
    why: &str,
    notices: &mut dyn FnMut(Notice),
    progress: &mut dyn LoadProgress,
) -> Result<Loaded, LoadError> {
    let discovery = discover(search, notices);
    // `auto` on one unit chooses again among the units of its order that are not lost.
    let mut settings_left;
    let mut settings = settings;
    if options.backend == "auto" && !settings.placement.splits() {
        settings_left = settings.clone();
        let order: Vec<String> = match &settings.placement.default {
            Some(list) => list.clone(),
            None => AUTO_ORDER.iter().map(|s| s.to_string()).collect(),
        };
        let left: Vec<String> = order.into_iter().filter(|n| !lost.contains(n)).collect();
        if !left.is_empty() {
            settings_left.placement.default = Some(left);
            settings = &settings_left;
        }
    }
    let mut adapters = Adapters::for_plugins(&discovery, settings);
    let placement = Placement::decide_with(
        &mut adapters,
        &discovery,
        settings,
        &options.backend,
        options.gpu_layers,
        notices,
    );
    adapters.save();
    let placement = placement?.without(lost, why)?;
    let may_split = plain_auto(settings, options);
    let (planned, files) = plan_fitted(
        placement, options, &discovery, settings, may_split, slots, notices,
    )?;
    let mut loaded = load_fitted(planned, files, settings, notices, progress)?;
    // The tower follows the language model's unit (or `[placement] vision`): auto does not
    // measure again, which would create the lost units.
    attach_images(&mut loaded, &discovery, settings, false, notices)?;
    Ok(loaded)
}

/// For `auto` without `[placement]` lists, when two or more hardware backends are available:
/// `options` with the placement that measured fastest (see [`super::calibrate`]), saying so in
/// a note. An NPU (the `npu` plugin) adds `npu+X` for each of them, and the NPU backend's cost
/// estimates (`ComputeBackend::estimate_decode`) choose which of the placements it has figures
/// for are measured ([`calibrate::select`]). When the model does not fit the fastest unit
/// whole, the candidates are the layer splits that fit (each GPU with as many layers as it holds, the rest on the CPU) and each unit
/// the model fits whole. `None` otherwise: auto's first-available rule stands (and
/// [`budget::fit`] splits a model too large for it).
fn measured_auto(
    adapters: &mut Adapters,
    discovery: &Discovery,
    settings: &Settings,
    options: &ModelOptions,
    slots: usize,
    notices: &mut dyn FnMut(Notice),
) -> Result<Option<ModelOptions>, LoadError> {
    let p = &settings.placement;
    if !plain_auto(settings, options) || p.default.is_some() {
        return Ok(None);
    }
    // The hardware units, from their facts (cached, or learnt by creating them); each is created
    // only where it is measured, the facts checked as it is.
    let mut hardware = Vec::new();
    for name in AUTO_ORDER {
        let facts = adapters.facts(name, notices);
        if let Facts::Available(info) = &facts {
            if info.kind != DeviceKind::SoftwareGpu {
                hardware.push((name, facts));
            }
        }
    }
    if hardware.len() < 2 {
        return Ok(None);
    }
    let mut units: Vec<(String, Box<dyn ComputeBackend>)> = Vec::new();
    let mut devices = Vec::new();
    let mut infos = Vec::new();
    for (name, facts) in hardware {
        let Taken::Same(b) = adapters.take_as(name, &facts, notices) else {
            // Stale facts, now replaced by what creating it found: decide again on those (the
            // units created so far kept for it).
            for (n, b) in units {
                adapters.give_back(&n, b);
            }
            return measured_auto(adapters, discovery, settings, options, slots, notices);
        };
        let info = b.info();
        devices.push(format!("{name}={}", info.device));
        infos.push(calibrate::Unit {
            name: name.to_string(),
            info,
        });
        units.push((name.to_string(), b));
    }
    // An NPU runs attention beside the other units: it adds `npu+X` candidates.
    let npu_facts = match adapters.facts(calibrate::NPU, notices) {
        Facts::Available(info) if info.kind == DeviceKind::Npu => Some(Facts::Available(info)),
        _ => None,
    };
    if let Some(Facts::Available(info)) = &npu_facts {
        devices.push(format!("{}={}", calibrate::NPU, info.device));
        infos.push(calibrate::Unit {
            name: calibrate::NPU.to_string(),
            info: info.clone(),
        });
    }
    let names: Vec<String> = units.iter().map(|(n, _)| n.clone()).collect();
    let mut fits = Vec::with_capacity(units.len());
    let mut too_large = None;
    let mut shape = None;
    let mut units = units.into_iter().enumerate();
    while let Some((i, (name, b))) = units.next() {
        let one = Placement::single(name.clone(), b, "--backend auto".to_string());
        let (planned, _) = plan_placed(one, options, slots)?;
        if i == 0 {
            shape = Some(calibrate::shape_of(&planned.model.config));
            too_large = planned.report().units.into_iter().find(|u| u.over_budget());
            if too_large.is_none() {
                // Every unit created so far is handed back: the one chosen is not created again.
                for (n, c) in planned.placement.candidates {
                    if let Candidate::Ready(b) = c {
                        adapters.give_back(&n, b);
                    }
                }
                for (_, (n, b)) in units.by_ref() {
                    adapters.give_back(&n, b);
                }
                break;
            }
        }
        fits.push((name, budget::fit_of(planned, discovery, settings)?));
    }
    let candidates = match (&too_large, shape) {
        (None, Some(shape)) => {
            let mut c = calibrate::candidates(&names);
            if infos.iter().any(|u| u.name == calibrate::NPU) {
                c.extend(calibrate::npu_candidates(&names));
            }
            // The NPU backend's own cost estimates, where it has any (created only here).
            let answer = match &npu_facts {
                Some(facts) => match adapters.take_as(calibrate::NPU, facts, notices) {
                    Taken::Same(b) => {
                        let q = calibrate::query(&infos, shape, calibrate::DECODE_CONTEXT);
                        let answer = b.estimate_decode(&q);
                        adapters.give_back(calibrate::NPU, b);
                        answer
                    }
                    // Stale facts, now replaced: decide again on those.
                    Taken::Changed => {
                        return measured_auto(adapters, discovery, settings, options, slots, notices)
                    }
                },
                None => None,
            };
            let chosen = calibrate::select(c, &infos, answer.as_ref());
            if let Some(note) = chosen.note {
                notices(Notice::Note(note));
            }
            chosen.measure
        }
        (None, None) => calibrate::candidates(&names),
        (Some(u), _) => {
            let c = calibrate::layer_candidates(&fits);
            let why = format!(
                "the model does not fit {} whole ({} needed, {} allowed)",
                u.name,
                gib(u.need_bytes()),
                gib(u.budget_bytes.unwrap_or(0))
            );
            if c.len() < 2 {
                notices(Notice::Note(format!(
                    "auto does not calibrate: {why}, and only one placement fits"
                )));
                return Ok(None);
            }
            notices(Notice::Note(format!("auto measures layer splits: {why}")));
            c
        }
    };
    let model = match &options.model {
        Some(m) => m.clone(),
        None => crate::model::files::default_model()?,
    };
    let key = calibrate::key(&model, &devices, &candidates);
    let cache = cache_dir().map(|d| d.join("calibration.json"));
    let (c, from_cache) = calibrate::calibrate(
        discovery,
        settings,
        options,
        &candidates,
        &key,
        cache.as_deref(),
        notices,
    )?;
    notices(Notice::Note(calibrate::describe(
        &c,
        cache.as_ref().filter(|_| from_cache),
    )));
    Ok(Some(ModelOptions {
        backend: c.choice.placement,
        gpu_layers: c.choice.gpu_layers,
        ..options.clone()
    }))
}
