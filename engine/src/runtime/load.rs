//! Loading a model onto the chosen backend as a [`Session`] with its tokenizer, and generating
//! text from it: what `engine run`, `chat`, `logits` and `bench` (and a server) share.

use std::io::Write;
use std::path::PathBuf;

use std::collections::HashMap;

use tandem_backend_api::{BufferId, DType, Graph};

use tandem_backend_api::DeviceKind;

use super::calibrate;
use super::notice::Notice;
use super::placement::{
    assign, choose_from, discover, fallback_notes, open_candidates, Assignment, Candidate, Phase,
    PlacementError, PlacementSpec, SpecError, AUTO_ORDER,
};
use super::placement_report::{unit_tensors, PlacementReport};
use super::plugins::{Discovery, PluginSearch};
use super::sampler::Sampler;
use super::schedule::Unit;
use super::session::{GenerationStats, Session, SessionError};
use super::settings::Settings;
use crate::checkpoint::source::WeightSource;
use crate::model::files::{cache_dir, open_model};
use crate::model::{CacheShape, Gemma3Model, LoadProgress, ModelError, Part};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// What to load and how to size it.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// A GGUF file or a Hugging Face model directory; `None`: the cached default model.
    pub model: Option<PathBuf>,
    /// The backend: `cpu`, `vulkan`, `wgpu`, `npu`, or `auto` (see [`choose_backend`]).
    pub backend: String,
    /// Longest sequence (prompt + generated) in tokens; `None`: the model's, at most 4096.
    pub context: Option<usize>,
    /// Most prompt tokens processed in one step.
    pub chunk: usize,
    /// The KV caches' element type.
    pub kv_cache: KvCacheType,
}

/// The KV caches' element type (`--kv-cache`).
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
            other => Err(format!("--kv-cache must be f32 or f16, not '{other}'")),
        }
    }
}

/// Why a model could not be loaded onto a backend.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No backend.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The model's files are unusable.
    #[error(transparent)]
    Model(Box<ModelError>),
    /// A zero context or chunk.
    #[error("--context and --chunk must be at least 1")]
    ZeroSize,
    /// `auto` could not measure any placement.
    #[error("calibrating --backend auto: {0}")]
    Calibration(String),
    /// The weights could not be uploaded.
    #[error("loading {}", path.display())]
    Upload {
        /// The model file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<ModelError>,
    },
}

impl From<SpecError> for LoadError {
    fn from(e: SpecError) -> Self {
        LoadError::Placement(e.into())
    }
}

impl From<ModelError> for LoadError {
    fn from(e: ModelError) -> Self {
        LoadError::Model(Box::new(e))
    }
}

/// Why generation stopped early.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The session failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A generated id could not be decoded.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The output could not be written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A loaded model with its tokenizer.
pub struct Loaded {
    /// The session.
    pub session: Session,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
}

/// A model placed on units, before any weight is uploaded: what `engine placement` reports and
/// what [`load`] uploads.
pub struct Planned {
    /// The preference lists.
    pub spec: PlacementSpec,
    /// Every backend the lists name, created or with the reason it is unavailable.
    pub candidates: Vec<(String, Candidate)>,
    /// The model, planned ids only.
    pub model: Gemma3Model,
    /// Its weights.
    pub weights: Box<dyn WeightSource>,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// The model file or directory.
    pub path: PathBuf,
    /// The step graph's structure (one row), and the part of each node.
    pub graph: Graph,
    /// The part of each node of `graph`.
    pub parts: Vec<Part>,
    /// The unit of every node, per phase (indices into `candidates`).
    pub assignment: Assignment,
}

impl Planned {
    /// The placement report, for prefill steps of `options.chunk` rows.
    pub fn report(&self) -> PlacementReport {
        PlacementReport::new(
            &self.model,
            &self.spec,
            &self.candidates,
            &self.graph,
            &self.parts,
            &self.assignment,
            self.model.cache_shape.max_step_rows,
        )
    }
}

/// The caches' sizes and element type.
fn cache_shape(options: &ModelOptions, max_positions: usize, slots: usize) -> Result<CacheShape, LoadError> {
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

/// Places `options.model` on the units `options.backend` and `settings` name, without uploading:
/// every node of the step graph on the first unit of its list that is available and runs it.
pub fn plan(
    search: &PluginSearch,
    settings: &Settings,
    options: &ModelOptions,
    slots: usize,
    notices: &mut dyn FnMut(Notice),
) -> Result<Planned, LoadError> {
    let (options, units) = choose_units(search, settings, options, notices)?;
    let (spec, candidates) = match units {
        Units::Split(spec, candidates) => (spec, candidates),
        Units::Whole(backend) => {
            let name = backend.info().name;
            let spec = PlacementSpec::single(&name, format!("--backend {}", options.backend));
            (spec, vec![(name, Candidate::Ready(backend))])
        }
    };
    plan_on(spec, candidates, &options, slots)
}

/// What `--backend` (after `auto`'s measurement) and the config ask for.
enum Units {
    /// The whole model on one backend.
    Whole(Box<dyn tandem_backend_api::ComputeBackend>),
    /// A split: the preference lists and every backend they name.
    Split(PlacementSpec, Vec<(String, Candidate)>),
}

/// Finds the plugins, lets `auto` measure where it may, and creates the backends the placement
/// needs; returns the options as resolved (`auto` replaced by its measured choice).
fn choose_units(
    search: &PluginSearch,
    settings: &Settings,
    options: &ModelOptions,
    notices: &mut dyn FnMut(Notice),
) -> Result<(ModelOptions, Units), LoadError> {
    let discovery = discover(search, notices);
    let options =
        measured_auto(&discovery, search, settings, options, notices)?.unwrap_or_else(|| options.clone());
    let units = match PlacementSpec::resolve(&options.backend, settings, &plugin_names(&discovery))? {
        None => Units::Whole(choose_from(&discovery, settings, &options.backend, notices)?),
        Some(spec) => {
            let candidates = open_candidates(&spec, &discovery, settings)?;
            Units::Split(spec, candidates)
        }
    };
    Ok((options, units))
}

/// For `--backend auto` without `[placement]` lists, when two or more hardware backends are
/// available: `options` with the placement that measured fastest (see [`super::calibrate`]),
/// saying so in a note. `None` otherwise: auto's first-available rule stands.
fn measured_auto(
    discovery: &Discovery,
    search: &PluginSearch,
    settings: &Settings,
    options: &ModelOptions,
    notices: &mut dyn FnMut(Notice),
) -> Result<Option<ModelOptions>, LoadError> {
    let p = &settings.placement;
    if options.backend != "auto" || p.default.is_some() || p.splits() {
        return Ok(None);
    }
    let mut names = Vec::new();
    let mut devices = Vec::new();
    for name in AUTO_ORDER {
        if let Ok(b) = discovery.create(name, &settings.backend_options(name)) {
            let info = b.info();
            if info.kind != DeviceKind::SoftwareGpu {
                names.push(name.to_string());
                devices.push(format!("{name}={}", info.device));
            }
        }
    }
    if names.len() < 2 {
        return Ok(None);
    }
    let model = match &options.model {
        Some(m) => m.clone(),
        None => crate::model::files::default_model()?,
    };
    let candidates = calibrate::candidates(&names);
    let key = calibrate::key(&model, &devices, &candidates);
    let cache = cache_dir().map(|d| d.join("calibration.json"));
    let (c, from_cache) = calibrate::calibrate(
        search,
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
        backend: c.choice,
        ..options.clone()
    }))
}

fn plugin_names(discovery: &Discovery) -> Vec<String> {
    discovery.plugins.iter().map(|p| p.name().to_string()).collect()
}

fn plan_on(
    spec: PlacementSpec,
    candidates: Vec<(String, Candidate)>,
    options: &ModelOptions,
    slots: usize,
) -> Result<Planned, LoadError> {
    let files = open_model(options.model.as_deref())?;
    let shape = cache_shape(options, files.config.max_position_embeddings, slots)?;
    let model = Gemma3Model::plan(files.config, files.weights.as_ref(), shape)?;
    let (graph, parts) = model.step_graph_parts(1, 1, BufferId::UNBOUND);
    let assignment = assign(&graph, &parts, &spec, &candidates)?;
    Ok(Planned {
        spec,
        candidates,
        model,
        weights: files.weights,
        tokenizer: files.tokenizer,
        path: files.path,
        graph,
        parts,
        assignment,
    })
}

/// Loads `options.model` onto the backend `options.backend` names (or splits it across the
/// units `A+B` or the config's `[placement]` lists name), with KV caches for `slots` sequences;
/// `progress` hears of every uploaded tensor, `notices` of backends passed over and of a split.
pub fn load(
    search: &PluginSearch,
    settings: &Settings,
    options: &ModelOptions,
    slots: usize,
    notices: &mut dyn FnMut(Notice),
    progress: &mut dyn LoadProgress,
) -> Result<Loaded, LoadError> {
    let (options, units) = choose_units(search, settings, options, notices)?;
    match units {
        Units::Whole(backend) => load_whole(backend, &options, slots, progress),
        Units::Split(spec, candidates) => {
            let planned = plan_on(spec, candidates, &options, slots)?;
            let mut loaded = load_split(planned, notices, progress)?;
            loaded
                .session
                .set_micro_batches(settings.placement.micro_batches.unwrap_or(1));
            Ok(loaded)
        }
    }
}

/// The whole model on one backend.
fn load_whole(
    mut backend: Box<dyn tandem_backend_api::ComputeBackend>,
    options: &ModelOptions,
    slots: usize,
    progress: &mut dyn LoadProgress,
) -> Result<Loaded, LoadError> {
    let files = open_model(options.model.as_deref())?;
    let (config, weights, tokenizer) = (files.config, files.weights, files.tokenizer);
    let shape = cache_shape(options, config.max_position_embeddings, slots)?;
    let model =
        Gemma3Model::load(config, weights.as_ref(), backend.as_mut(), shape, progress).map_err(|source| {
            LoadError::Upload {
                path: files.path.clone(),
                source: Box::new(source),
            }
        })?;
    Ok(Loaded {
        session: Session::new(backend, model),
        tokenizer,
    })
}

/// A planned model on the units its nodes use: each unit gets the weights and caches of its
/// nodes, once.
fn load_split(
    planned: Planned,
    notices: &mut dyn FnMut(Notice),
    progress: &mut dyn LoadProgress,
) -> Result<Loaded, LoadError> {
    let names: Vec<String> = planned.candidates.iter().map(|(n, _)| n.clone()).collect();
    for note in fallback_notes(&planned.assignment, &planned.parts, &planned.graph, &names) {
        notices(Notice::Note(note));
    }
    let report = planned.report();
    if report.is_split() {
        notices(Notice::Note(format!(
            "placement ({}): {}",
            planned.spec.origin,
            report.summary()
        )));
    }
    let Planned {
        candidates,
        model,
        weights,
        tokenizer,
        path,
        graph,
        assignment,
        ..
    } = planned;
    // The units that run nodes, in candidate order; the rest are dropped.
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut units: Vec<Unit> = Vec::new();
    let mut held: Vec<Vec<BufferId>> = Vec::new();
    for (i, (name, c)) in candidates.into_iter().enumerate() {
        let tensors = unit_tensors(&graph, &assignment, i);
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
            held.push(tensors);
        }
    }
    // Every node's unit among those, per phase (a node's candidate always runs nodes).
    let placement = [Phase::Prefill, Phase::Decode].map(|phase| {
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
    for (unit, ids) in units.iter_mut().zip(&held) {
        unit.map = model
            .upload(
                ids,
                weights.as_ref(),
                unit.backend.as_mut(),
                &mut done,
                total,
                progress,
            )
            .map_err(|source| LoadError::Upload {
                path: path.clone(),
                source: Box::new(source),
            })?;
    }
    Ok(Loaded {
        session: Session::split(units, model, placement),
        tokenizer,
    })
}

impl Loaded {
    /// Generates after `prompt` (continuing slot 0's cached sequence when `keep`), writing the
    /// decoded text to `out` as it completes, then a newline; returns the new ids and the timing.
    pub fn stream(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        sampler: &mut Sampler,
        keep: bool,
        out: &mut dyn Write,
    ) -> Result<(Vec<u32>, GenerationStats), GenerateError> {
        let Loaded { session, tokenizer } = self;
        let stop = tokenizer.stop_ids().to_vec();
        let mut dec = tokenizer.stream_decoder(true);
        let (mut ids, mut failure) = (Vec::new(), None);
        let stats = session.generate(prompt, max_new, sampler, &stop, keep, |t| {
            ids.push(t);
            let piece = match dec.push(t) {
                Ok(piece) => piece,
                Err(e) => {
                    failure.get_or_insert(GenerateError::from(e));
                    None
                }
            };
            if let Some(text) = piece {
                if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                    failure.get_or_insert(e.into());
                }
            }
            Ok(())
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        if let Some(text) = dec.finish()? {
            out.write_all(text.as_bytes())?;
        }
        writeln!(out)?;
        Ok((ids, stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_cache_is_f32_by_default_and_names_the_flag_when_wrong() {
        assert_eq!(KvCacheType::default().dtype(), DType::F32);
        assert_eq!(
            "f16".parse::<KvCacheType>().map(KvCacheType::dtype),
            Ok(DType::F16)
        );
        assert_eq!("f32".parse::<KvCacheType>(), Ok(KvCacheType::F32));
        let e = "bf16".parse::<KvCacheType>().unwrap_err();
        assert!(e.contains("--kv-cache") && e.contains("bf16"), "{e}");
    }
}
