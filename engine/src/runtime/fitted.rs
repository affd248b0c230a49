//! A decided placement made real, the same way for every caller: the model planned on it
//! ([`super::planned`]), fitted to every unit's memory budget ([`budget::fit`]), uploaded, and
//! its scheduler set as the config says (micro-batches, boundaries). `runtime::load` runs it
//! after deciding the placement, and `auto`'s calibration runs it for every candidate, so what
//! `auto` measures is what it then runs.

use super::budget;
use super::layers::LayerRule;
use super::load_error::LoadError;
use super::notice::Notice;
use super::placement::Placement;
use super::planned::{load_planned, plan_placed, Loaded, ModelOptions, Planned};
use super::plugins::Discovery;
use super::settings::Settings;
use crate::model::files::ModelFiles;
use crate::model::LoadProgress;

/// `options.model` planned on `placement` with caches for `slots` sequences and checked against
/// every unit's budget ([`budget::fit`]; `may_split`: a model too large for its one unit is split
/// by layers); returns the plan with the model's files (their weights not yet read).
pub fn plan_fitted(
    placement: Placement,
    options: &ModelOptions,
    discovery: &Discovery,
    settings: &Settings,
    may_split: bool,
    slots: usize,
    notices: &mut dyn FnMut(Notice),
) -> Result<(Planned, ModelFiles), LoadError> {
    let (planned, files) = plan_placed(placement, options, slots)?;
    let planned = budget::fit(planned, discovery, settings, may_split, notices)?;
    Ok((planned, files))
}

/// Pieces of a prompt step where the layers are spread over devices and `[placement]
/// prefill_micro_batches` is not set. 27B q4_k over two H200s, prefill 512 (`bench/two-gpus.sh`,
/// bench/results/2026-11-29-two-gpus-pieces): 2,286 tok/s whole, 2,804 in 2 pieces, 2,925 in 4.
const SPREAD_PIECES: usize = 4;

/// The fewest rows of a piece under [`SPREAD_PIECES`]: a short prompt is cut into fewer pieces
/// (or none), whose products would otherwise read every weight once per piece of a few rows.
const SPREAD_PIECE_ROWS: usize = 64;

/// Uploads `planned` from `files` and sets its scheduler from `settings`: the micro-batches and
/// how values cross between units (`[placement] micro_batches`, `prefill_micro_batches`,
/// `boundaries`).
pub fn load_fitted(
    planned: Planned,
    files: ModelFiles,
    settings: &Settings,
    notices: &mut dyn FnMut(Notice),
    progress: &mut dyn LoadProgress,
) -> Result<Loaded, LoadError> {
    let micro_batches = settings.placement.micro_batches.unwrap_or(1);
    let spread = matches!(planned.placement.spec.layers, Some(LayerRule::Spread { .. }));
    let mut loaded = load_planned(planned, files, micro_batches, notices, progress)?;
    loaded
        .session
        .set_boundaries(settings.placement.boundaries.unwrap_or_default());
    let asked = settings.placement.prefill_micro_batches;
    match asked {
        Some(n) => loaded.session.set_prefill_micro_batches(n, 1),
        // Layers spread over devices (`[backend.NAME] devices`): prompt steps in up to
        // SPREAD_PIECES pieces of at least SPREAD_PIECE_ROWS rows.
        None if spread => loaded
            .session
            .set_prefill_micro_batches(SPREAD_PIECES, SPREAD_PIECE_ROWS),
        None => {}
    }
    let rows = loaded.session.chunk();
    if let Some(pieces) = asked.filter(|&n| n > 1 && !loaded.session.prompt_changes_unit(rows)) {
        notices(Notice::Note(format!(
            "[placement] prefill_micro_batches = {pieces} does nothing here: a prompt step of {rows} rows runs on one unit"
        )));
    }
    Ok(loaded)
}
