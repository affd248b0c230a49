//! The one load path: a model placed on its units ([`Planned`]: every node of the step graph on a
//! unit, every tensor described under a planned id), then uploaded (each unit gets the tensors its
//! nodes read) into a [`Session`]. A single backend is the ordinary case: a placement of one unit.
//!
//! The placement is decided before this (`runtime::load`: discovery, settings, calibration); this
//! module takes it as given.

use std::collections::HashMap;
use std::path::PathBuf;

use tandem_backend_api::{BufferId, DType, Graph};

pub use super::load_error::LoadError;
use super::notice::Notice;
use super::placement::{assign, fallback_notes, region_units, Assignment, Candidate, Placement};
use super::placement_report::{unit_tensors, PlacementReport};
use super::session::Session;
use super::split::{Phase, SplitScheduler, Unit};
use crate::checkpoint::config::Gemma3Config;
use crate::checkpoint::source::WeightSource;
use crate::checkpoint::tuning::Verdict;
use crate::model::files::{open_model, ModelFiles};
use crate::model::vision_source::VisionSource;
use crate::model::{CacheShape, Gemma3Model, LoadProgress, Part, Region};
use crate::tokenizer::Tokenizer;

/// What to load and how to size it.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// A GGUF file or a Hugging Face model directory; `None`: the cached default model.
    pub model: Option<PathBuf>,
    /// The placement: `cpu`, `vulkan`, `wgpu`, `npu`, `A+B`, or `auto`.
    pub backend: String,
    /// Longest sequence (prompt + generated) in tokens; `None`: the model's, at most 4096.
    pub context: Option<usize>,
    /// Most prompt tokens processed in one step.
    pub chunk: usize,
    /// The KV caches' element type.
    pub kv_cache: KvCacheType,
    /// `--gpu-layers N`: layers `0..N` on the backend chosen, the rest on the CPU.
    pub gpu_layers: Option<usize>,
    /// Images a session holds at once (`--max-images`); 0: no image input, no vision tower
    /// loaded.
    pub images: usize,
    /// llama.cpp's mmproj GGUF holding the vision tower (`--mmproj`), for a GGUF model.
    pub mmproj: Option<PathBuf>,
}

/// The KV caches' element type.
///
/// f32 by default: on the H100 (Vulkan, q4_k, `engine bench --prompt-tokens 512 --gen-tokens
/// 128`) f16 caches did not speed anything up (4B decode 206.0 -> 204.2 tok/s, prefill 5,854 ->
/// 5,689; 1B decode 326.4 -> 329.6), while f32 keeps the CPU reference exact. f16 halves the
/// caches' memory, for long contexts on small devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheType {
    /// 32-bit floats.
    #[default]
    F32,
    /// 16-bit floats.
    F16,
}

impl KvCacheType {
    /// The element type.
    pub fn dtype(self) -> DType {
        match self {
            KvCacheType::F32 => DType::F32,
            KvCacheType::F16 => DType::F16,
        }
    }
}

impl std::str::FromStr for KvCacheType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f32" => Ok(KvCacheType::F32),
            "f16" => Ok(KvCacheType::F16),
            other => Err(format!("the KV cache type must be f32 or f16, not '{other}'")),
        }
    }
}

/// A loaded model with its tokenizer.
pub struct Loaded {
    /// The session.
    pub session: Session,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// Whether the model's metadata says it is made for chat ([`crate::checkpoint::tuning`]).
    pub tuning: Verdict,
    /// The model's default sampling: its `generation_config.json`, else tandem's defaults
    /// ([`super::sampler::sampling_defaults`]). Callers apply the user's settings over it.
    pub sampling: crate::runtime::sampler::SamplerConfig,
    /// The vision tower, where images were asked for ([`ModelOptions::images`]).
    pub images: Option<super::images::Images>,
    /// Where the vision tower was found (kept to load it on a unit after the model).
    pub vision: Option<VisionSource>,
}

/// The caches' sizes and element type for `options`, with `slots` sequences, for a model of
/// `max_positions`.
pub fn cache_shape(
    options: &ModelOptions,
    max_positions: usize,
    slots: usize,
) -> Result<CacheShape, LoadError> {
    let context = options.context.unwrap_or(max_positions.min(4096));
    if context == 0 || options.chunk == 0 {
        return Err(LoadError::ZeroSize);
    }
    Ok(CacheShape {
        slots,
        context,
        max_step_rows: options.chunk.min(context),
        dtype: options.kv_cache.dtype(),
    })
}

/// A model placed on units, before any weight is uploaded: what `engine placement` reports and
/// what [`Planned::load`] uploads.
pub struct Planned {
    /// The placement: the preference lists and every unit they name.
    pub placement: Placement,
    /// The model, planned ids only.
    pub model: Gemma3Model,
    /// The step graph of one row, the one every step shape's nodes are placed by (position by
    /// position: see [`super::split`]).
    pub graph: Graph,
    /// The part of each node of `graph`.
    pub parts: Vec<Part>,
    /// The region (embedding, layer, head) of each node of `graph`.
    pub regions: Vec<Region>,
    /// The unit of every node, per phase (indices into `placement.candidates`).
    pub assignment: Assignment,
    /// Where the vision tower runs, where images were asked for and [`crate::plan`] checked it.
    pub vision: Option<super::placement_report::VisionReport>,
}

impl Planned {
    /// Plans `config`'s model (its tensors checked in `weights`, not read) with caches of
    /// `shape`, and places every node of its step graph by `placement`.
    pub fn new(
        placement: Placement,
        config: Gemma3Config,
        weights: &dyn WeightSource,
        shape: CacheShape,
        image_rows: usize,
    ) -> Result<Planned, LoadError> {
        let mut model = Gemma3Model::plan(config, weights, shape)?;
        model.add_image_rows(image_rows);
        let (graph, parts, regions) = model.step_graph_parts(1, 1, BufferId::UNBOUND);
        Planned::place(placement, model, graph, parts, regions)
    }

    /// Places every node of `graph` (the model's one-row step graph, with its nodes' `parts` and
    /// `regions`) by `placement`.
    pub fn place(
        placement: Placement,
        model: Gemma3Model,
        graph: Graph,
        parts: Vec<Part>,
        regions: Vec<Region>,
    ) -> Result<Planned, LoadError> {
        let plain = assign(&graph, &parts, &regions, &placement.spec, &placement.candidates)?;
        // The prefill op offload with the held layers' attention where the GPU has room for a
        // copy of their KV caches, else without it.
        let mut assignment = plain.clone();
        super::offload::offload(&mut assignment, &graph, &regions, &placement, true);
        let over = |a: &Assignment| {
            let chunk = model.cache_shape.max_step_rows;
            let report = PlacementReport::new(
                &model,
                &placement.spec,
                &placement.candidates,
                &graph,
                &parts,
                a,
                chunk,
            );
            report.units.iter().any(|u| u.over_budget())
        };
        if !assignment.offloaded.is_empty() && over(&assignment) && !over(&plain) {
            assignment = plain;
            super::offload::offload(&mut assignment, &graph, &regions, &placement, false);
        }
        Ok(Planned {
            placement,
            model,
            graph,
            parts,
            regions,
            assignment,
            vision: None,
        })
    }

    /// This plan, placed again with its first `count` layers on its first unit (a placement made
    /// by [`Placement::with_first_layers`]).
    pub fn with_gpu_layers(mut self, count: usize) -> Result<Planned, LoadError> {
        self.placement.set_first_layers(count);
        Planned::place(self.placement, self.model, self.graph, self.parts, self.regions)
    }

    /// The placement report, for prefill steps of the cache's step size.
    pub fn report(&self) -> PlacementReport {
        let mut report = PlacementReport::new(
            &self.model,
            &self.placement.spec,
            &self.placement.candidates,
            &self.graph,
            &self.parts,
            &self.assignment,
            self.model.cache_shape.max_step_rows,
        );
        report.layers = region_units(&self.regions, &self.placement.spec, &self.placement.candidates)
            .ok()
            .flatten()
            .map(|u| u.describe());
        report.vision = self.vision.clone();
        report
    }

    /// Uploads to each unit that runs nodes the tensors its nodes read (once), from `weights`
    /// (at `path`, for messages), and returns the session over those units. `notices` hears of
    /// every unit passed over and of a split; `progress` of every uploaded byte.
    pub fn load(
        self,
        weights: &dyn WeightSource,
        path: &std::path::Path,
        notices: &mut dyn FnMut(Notice),
        progress: &mut dyn LoadProgress,
    ) -> Result<Session, LoadError> {
        let names: Vec<String> = self.placement.candidates.iter().map(|(n, _)| n.clone()).collect();
        for note in fallback_notes(&self.assignment, &self.parts, &self.graph, &names) {
            notices(Notice::Note(note));
        }
        let report = self.report();
        if report.is_split() {
            let what = report.layers.clone().unwrap_or_else(|| report.summary());
            notices(Notice::Note(format!(
                "placement ({}): {what}",
                self.placement.spec.origin
            )));
        }
        if let Some(o) = &report.offload {
            notices(Notice::Note(format!("prefill offload: {o}")));
        }
        let Planned {
            placement,
            model,
            graph,
            assignment,
            ..
        } = self;
        // The units that run nodes, in candidate order; the rest are dropped.
        let mut index: HashMap<usize, usize> = HashMap::new();
        let mut units: Vec<Unit> = Vec::new();
        let mut held: Vec<Vec<BufferId>> = Vec::new();
        let mut host: Vec<Vec<BufferId>> = Vec::new();
        for (i, (name, c)) in placement.candidates.into_iter().enumerate() {
            let runs = assignment
                .prefill
                .iter()
                .chain(&assignment.decode)
                .any(|c| c.unit == i);
            if let (true, Candidate::Ready(backend)) = (runs, c) {
                index.insert(i, units.len());
                units.push(Unit {
                    name,
                    backend,
                    map: HashMap::new(),
                });
                held.push(unit_tensors(&graph, &assignment, i));
                host.push(super::offload::host_weights(&graph, &assignment, i));
            }
        }
        // Every node's unit among those, per phase (a node's candidate always runs nodes).
        let per_node = Phase::ALL.map(|phase| {
            assignment
                .units(phase)
                .iter()
                .map(|u| index.get(u).copied().unwrap_or(0))
                .collect::<Vec<_>>()
        });
        let bytes_of = |ids: &[BufferId]| -> u64 {
            model
                .tensors()
                .iter()
                .filter(|t| ids.contains(&t.id) && !t.parts.is_empty())
                .map(|t| t.bytes())
                .sum()
        };
        let total: u64 = held.iter().map(|h| bytes_of(h)).sum();
        let mut done = 0;
        for ((unit, ids), host) in units.iter_mut().zip(&held).zip(&host) {
            unit.map = model
                .upload(
                    ids,
                    host,
                    weights,
                    unit.backend.as_mut(),
                    &mut done,
                    total,
                    progress,
                )
                .map_err(|source| LoadError::Upload {
                    path: path.to_path_buf(),
                    source: Box::new(source),
                })?;
        }
        let mut scheduler = SplitScheduler::new(units, per_node, &graph, &model)?;
        if !assignment.offloaded.is_empty() {
            scheduler.set_min_prefill_rows(super::offload::offload_rows());
        }
        Ok(Session::new(scheduler, model))
    }
}

/// Opens `options.model` and places it by `placement` with caches for `slots` sequences; returns
/// the plan with the model's files (their weights not yet read).
pub fn plan_placed(
    placement: Placement,
    options: &ModelOptions,
    slots: usize,
) -> Result<(Planned, ModelFiles), LoadError> {
    let mut files = open_model(options.model.as_deref())?;
    let shape = cache_shape(options, files.config.max_position_embeddings, slots)?;
    // With images asked for, the vision tower is found first: its tokens per image size the
    // model's image table.
    let rows = if options.images > 0 {
        let source = VisionSource::find(&files.path, options.mmproj.as_deref())?;
        let rows = source.rows(options.images);
        files.vision = Some(source);
        rows
    } else {
        0
    };
    let planned = Planned::new(
        placement,
        files.config.clone(),
        files.weights.as_ref(),
        shape,
        rows,
    )?;
    Ok((planned, files))
}

/// Uploads `planned` from `files` and sets the session's micro-batches.
pub fn load_planned(
    planned: Planned,
    files: ModelFiles,
    micro_batches: usize,
    notices: &mut dyn FnMut(Notice),
    progress: &mut dyn LoadProgress,
) -> Result<Loaded, LoadError> {
    let mut session = planned.load(files.weights.as_ref(), &files.path, notices, progress)?;
    session.set_micro_batches(micro_batches);
    Ok(Loaded {
        session,
        tokenizer: files.tokenizer,
        tuning: files.tuning,
        sampling: super::sampler::sampling_defaults(files.generation.as_ref()),
        images: None,
        vision: files.vision,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_cache_is_f32_by_default_and_names_the_value_when_wrong() {
        assert_eq!(KvCacheType::default().dtype(), DType::F32);
        assert_eq!(
            "f16".parse::<KvCacheType>().map(KvCacheType::dtype),
            Ok(DType::F16)
        );
        assert_eq!("f32".parse::<KvCacheType>(), Ok(KvCacheType::F32));
        let e = "bf16".parse::<KvCacheType>().unwrap_err();
        assert!(e.contains("f32 or f16") && e.contains("bf16"), "{e}");
    }
}
