//! Which backend runs the model: `--backend NAME`, or `auto`, the first available of the
//! configured `[placement] default` list (built in: vulkan, wgpu, cpu), degrading along it with
//! the reason. The rules of placement live here; the plugins that provide the backends are in
//! [`super::plugins`].

use tandem_backend_api::{ComputeBackend, DeviceKind, Graph, Support};

use super::adapters::{Adapters, Facts, Taken};
use super::layers::{LayerError, LayerRule, RegionUnits};
use super::notice::Notice;
use super::plugins::{Discovery, PluginLookupError, PluginSearch};
use super::settings::{PhaseLists, Settings};
use super::split::Phase;
use crate::model::{Part, Region};

/// The built-in `auto` order.
pub const AUTO_ORDER: [&str; 3] = ["vulkan", "wgpu", "cpu"];

/// Why no backend could be chosen.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// The one backend named could not be had.
    #[error(transparent)]
    Lookup(#[from] PluginLookupError),
    /// `auto` found none of its candidates; each one's reason, `; `-separated.
    #[error("no backend available: {0}")]
    NoneAvailable(String),
    /// The split could not be made.
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// Finds the plugins, telling `notices` of every file that failed to load.
pub fn discover(search: &PluginSearch, notices: &mut dyn FnMut(Notice)) -> Discovery {
    let discovery = search.discover();
    for p in &discovery.problems {
        notices(Notice::Warning(p.to_string()));
    }
    discovery
}

/// Creates the one backend `name` names (`cpu`, `vulkan`, ..., or `auto`: the first available of
/// the configured `[placement] default` list, else of [`AUTO_ORDER`]) among the plugins found.
/// The reasons `auto` passed a candidate over go to `notices`. `auto` learns what each candidate
/// offers from the adapter cache where it can ([`Adapters`]).
pub fn choose_from(
    discovery: &Discovery,
    settings: &Settings,
    name: &str,
    notices: &mut dyn FnMut(Notice),
) -> Result<Box<dyn ComputeBackend>, PlacementError> {
    let mut adapters = Adapters::for_plugins(discovery, settings);
    let chosen = choose_with(&mut adapters, settings, name, notices);
    adapters.save();
    chosen
}

/// [`choose_from`] with the facts and backends of `adapters`: under `auto`, only the backend
/// chosen is created (or taken, where learning its facts created it), unless the facts it was
/// chosen by prove stale, when the choice is made again with what creating it found.
pub fn choose_with(
    adapters: &mut Adapters,
    settings: &Settings,
    name: &str,
    notices: &mut dyn FnMut(Notice),
) -> Result<Box<dyn ComputeBackend>, PlacementError> {
    // The built-in `auto` order passes over software GPUs (lavapipe, llvmpipe, SwiftShader):
    // they run the GPU kernels on the CPU, slower than the CPU backend itself. A configured
    // `[placement] default` list is taken as written.
    let skip_software = name == "auto" && settings.placement.default.is_none();
    let candidates: Vec<&str> = match name {
        "auto" => settings
            .placement
            .default
            .as_ref()
            .map_or_else(|| AUTO_ORDER.to_vec(), |v| v.iter().map(String::as_str).collect()),
        // A split is placed node by node (`PlacementSpec`), not chosen here.
        n if n.contains('+') => return Err(SpecError::Form(n.to_string()).into()),
        n => {
            let b = adapters.take(n)?;
            if b.info().kind == DeviceKind::SoftwareGpu {
                notices(Notice::Note(software_gpu_note(n, &b.info().device)));
            }
            return Ok(b);
        }
    };
    // Each pass either chooses or replaces a cached fact with one learnt by creating the
    // backend, which is never replaced again: at most one pass per candidate, and one more.
    'choose: for _ in 0..=candidates.len() {
        let mut reasons = Vec::new();
        let mut software = None;
        for c in &candidates {
            let facts = adapters.facts(c, notices);
            match &facts {
                Facts::Unavailable(reason) => reasons.push(reason.clone()),
                Facts::Available(info) if skip_software && info.kind == DeviceKind::SoftwareGpu => {
                    reasons.push(format!("{c} runs on {}, a software GPU", info.device));
                    software.get_or_insert((*c, facts.clone()));
                }
                Facts::Available(_) => {
                    let Taken::Same(b) = adapters.take_as(c, &facts, notices) else {
                        continue 'choose;
                    };
                    if !reasons.is_empty() {
                        notices(Notice::Note(format!(
                            "using the {c} backend ({})",
                            reasons.join("; ")
                        )));
                    }
                    if b.info().kind == DeviceKind::SoftwareGpu {
                        notices(Notice::Note(software_gpu_note(c, &b.info().device)));
                    }
                    return Ok(b);
                }
            }
        }
        if let Some((c, facts)) = software {
            let Taken::Same(b) = adapters.take_as(c, &facts, notices) else {
                continue 'choose;
            };
            notices(Notice::Note(format!(
                "using {} on a software GPU ({})",
                b.info().name,
                reasons.join("; ")
            )));
            return Ok(b);
        }
        return Err(PlacementError::NoneAvailable(reasons.join("; ")));
    }
    Err(PlacementError::NoneAvailable(
        "the backends' facts kept changing while they were created".to_string(),
    ))
}

/// What a software GPU chosen by name is told.
fn software_gpu_note(backend: &str, device: &str) -> String {
    format!(
        "{backend} runs on {device}, a software GPU: the CPU emulating a GPU, which runs tandem's \
         GPU kernels many times slower than --backend cpu does (docs/usage.md's start-up \
         figures compare them)"
    )
}

/// The backend names tandem ships plugins for (others may be found as plugins).
pub const KNOWN_BACKENDS: [&str; 4] = ["cpu", "vulkan", "wgpu", "npu"];

/// Preference lists for the three parts of the model in one phase.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartLists {
    /// Attention.
    pub attention: Vec<String>,
    /// The feed-forward network.
    pub ffn: Vec<String>,
    /// Everything else.
    pub default: Vec<String>,
}

impl PartLists {
    /// The list for `part`.
    pub fn get(&self, part: Part) -> &[String] {
        match part {
            Part::Attention => &self.attention,
            Part::Ffn => &self.ffn,
            Part::Other => &self.default,
        }
    }
}

/// Where each part of the model may run, per phase, in order of preference: what `--backend` and
/// `[placement]` say, before any backend is asked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlacementSpec {
    /// Lists for prefill.
    pub prefill: PartLists,
    /// Lists for decode.
    pub decode: PartLists,
    /// Where the lists came from (`--backend cpu+vulkan`, `the config's [placement]`).
    pub origin: String,
    /// Whole layers per unit (`--gpu-layers`, `[placement.layers]`), tried before each node's
    /// part list (which then only serves ops the layer's unit refuses).
    pub layers: Option<LayerRule>,
}

impl PlacementSpec {
    /// Everything on `name`, as `--backend name` (or `auto`'s choice) places it.
    pub fn single(name: &str, origin: String) -> PlacementSpec {
        let one = vec![name.to_string()];
        let lists = PartLists {
            attention: one.clone(),
            ffn: one.clone(),
            default: one,
        };
        PlacementSpec {
            prefill: lists.clone(),
            decode: lists,
            origin,
            layers: None,
        }
    }
}

/// A second instance of a backend that `A+A` names twice (`vulkan+vulkan`): its own device
/// context, so that every boundary between the two is a real copy.
pub const SECOND_INSTANCE: &str = "#2";

/// The plugin an instance name (`vulkan`, `vulkan#2`, `vulkan#3`) creates.
pub fn plugin_name(instance: &str) -> &str {
    instance.split('#').next().unwrap_or(instance)
}

/// Why a placement could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A name that is no backend.
    #[error("{origin}: unknown backend '{name}' (known: {known})")]
    Unknown {
        /// Where it was written.
        origin: String,
        /// The name.
        name: String,
        /// The names that are backends here.
        known: String,
    },
    /// `a+b+c`, `+b`, `a+`.
    #[error("--backend {0}: expected one backend (cpu, vulkan, ...), auto, or A+B (attention on A, the rest on B)")]
    Form(String),
    /// A backend that `[backend.NAME] strict = true` requires is missing.
    #[error("backend '{name}' is required (strict = true in [backend.{name}]) but unavailable: {reason}")]
    Strict {
        /// The backend.
        name: String,
        /// Why it is unavailable.
        reason: String,
    },
    /// A layer rule the model cannot take.
    #[error(transparent)]
    Layers(#[from] LayerError),
    /// `--gpu-layers` with something it cannot combine with.
    #[error("--gpu-layers {count}: {why}")]
    GpuLayers {
        /// The count asked for.
        count: usize,
        /// Why not.
        why: String,
    },
    /// No backend in a node's list runs it.
    #[error("no backend can run node {node} ({op}, {part} part, {phase}): {reasons}")]
    Unplaceable {
        /// The node's index in the step graph.
        node: usize,
        /// The op's name.
        op: String,
        /// The part's key.
        part: &'static str,
        /// The phase's key.
        phase: &'static str,
        /// Each candidate's reason, `; `-separated.
        reasons: String,
    },
}

impl PlacementSpec {
    /// The split `flag` (`--backend`) and `settings` ask for, or `None` when the whole model runs
    /// on one backend chosen by [`choose_from`]: a single name, or `auto` without part or
    /// phase lists in the config. `known` are the backend names available as plugins here.
    ///
    /// `gpu_layers` (`--gpu-layers N`) takes one backend or `auto` without `[placement]` lists:
    /// the split it asks for is made once the backend is chosen ([`Placement::decide`]).
    pub fn resolve(
        flag: &str,
        settings: &Settings,
        known: &[String],
        gpu_layers: Option<usize>,
    ) -> Result<Option<PlacementSpec>, SpecError> {
        if let Some(count) = gpu_layers {
            let why = if flag.contains('+') {
                Some(format!(
                    "it takes one backend (--backend vulkan), not the split {flag}"
                ))
            } else if flag == "auto" && settings.placement.splits() {
                Some(
                    "the config's [placement] lists already place the model: use one or the other"
                        .to_string(),
                )
            } else {
                None
            };
            if let Some(why) = why {
                return Err(SpecError::GpuLayers { count, why });
            }
        }
        let check = |origin: &str, name: &str| -> Result<(), SpecError> {
            let name = plugin_name(name);
            if KNOWN_BACKENDS.contains(&name) || known.iter().any(|k| k == name) {
                return Ok(());
            }
            let mut all: Vec<String> = KNOWN_BACKENDS.iter().map(|s| s.to_string()).collect();
            for k in known {
                if !all.contains(k) {
                    all.push(k.clone());
                }
            }
            Err(SpecError::Unknown {
                origin: origin.to_string(),
                name: name.to_string(),
                known: all.join(", "),
            })
        };
        if flag != "auto" {
            let origin = format!("--backend {flag}");
            let parts: Vec<&str> = flag.split('+').collect();
            match parts.as_slice() {
                [one] if !one.is_empty() => {
                    check(&origin, one)?;
                    let devices = settings.devices(one);
                    if devices.len() < 2 {
                        return Ok(None);
                    }
                    if let Some(count) = gpu_layers {
                        return Err(SpecError::GpuLayers {
                            count,
                            why: format!(
                                "[backend.{one}] devices names {} devices, over which the layers spread already",
                                devices.len()
                            ),
                        });
                    }
                    // One instance per device, the layers spread over them by their memory.
                    let units: Vec<String> = (0..devices.len())
                        .map(|i| {
                            if i == 0 {
                                one.to_string()
                            } else {
                                format!("{one}#{}", i + 1)
                            }
                        })
                        .collect();
                    let lists = PartLists {
                        attention: units.clone(),
                        ffn: units.clone(),
                        default: units.clone(),
                    };
                    return Ok(Some(PlacementSpec {
                        prefill: lists.clone(),
                        decode: lists,
                        origin: format!("{origin} over [backend.{one}] devices"),
                        layers: Some(LayerRule::Spread { units }),
                    }));
                }
                [a, b] if !a.is_empty() && !b.is_empty() => {
                    check(&origin, a)?;
                    check(&origin, b)?;
                    let attention_unit = if a == b {
                        format!("{a}{SECOND_INSTANCE}")
                    } else {
                        a.to_string()
                    };
                    let lists = PartLists {
                        attention: vec![attention_unit, b.to_string()],
                        ffn: vec![b.to_string()],
                        default: vec![b.to_string()],
                    };
                    return Ok(Some(PlacementSpec {
                        prefill: lists.clone(),
                        decode: lists,
                        origin,
                        layers: None,
                    }));
                }
                _ => return Err(SpecError::Form(flag.to_string())),
            }
        }
        let p = &settings.placement;
        if !p.splits() {
            return Ok(None);
        }
        let origin = "the config's [placement]".to_string();
        // With layer ranges, a node's part list only serves ops its layer's unit refuses: by
        // default the layer units themselves, then the built-in order.
        let builtin: Vec<String> = match &p.layers {
            Some(l) => {
                let mut v: Vec<String> = l.units.iter().map(|(n, _)| n.clone()).collect();
                for n in AUTO_ORDER {
                    if !v.iter().any(|x| x == n) {
                        v.push(n.to_string());
                    }
                }
                v
            }
            None => AUTO_ORDER.iter().map(|s| s.to_string()).collect(),
        };
        let phase_lists = |phase: Option<&PhaseLists>| -> PartLists {
            let pick = |own: Option<&Vec<String>>, shared: Option<&Vec<String>>, fallback: &Vec<String>| {
                own.or(shared).unwrap_or(fallback).clone()
            };
            let default = pick(
                phase.and_then(|t| t.default.as_ref()),
                p.default.as_ref(),
                &builtin,
            );
            PartLists {
                attention: pick(
                    phase.and_then(|t| t.attention.as_ref()),
                    p.attention.as_ref(),
                    &default,
                ),
                ffn: pick(phase.and_then(|t| t.ffn.as_ref()), p.ffn.as_ref(), &default),
                default: default.clone(),
            }
        };
        let spec = PlacementSpec {
            prefill: phase_lists(p.prefill.as_ref()),
            decode: phase_lists(p.decode.as_ref()),
            origin,
            layers: p.layers.clone().map(LayerRule::Ranges),
        };
        for name in spec.names() {
            check(&format!("{} (placement list)", spec.origin), &name)?;
        }
        Ok(Some(spec))
    }

    /// The lists of `phase`.
    pub fn lists(&self, phase: Phase) -> &PartLists {
        match phase {
            Phase::Prefill => &self.prefill,
            Phase::Decode => &self.decode,
        }
    }

    /// Every instance name the layer rule and the lists mention, in order of first mention.
    pub fn names(&self) -> Vec<String> {
        let mut out: Vec<String> = self.layers.as_ref().map(LayerRule::names).unwrap_or_default();
        for phase in Phase::ALL {
            let l = self.lists(phase);
            for n in l.attention.iter().chain(&l.ffn).chain(&l.default) {
                if !out.contains(n) {
                    out.push(n.clone());
                }
            }
        }
        out
    }
}

/// A decided placement: the preference lists, and every unit they name (created, or why it is
/// unavailable). One backend is a placement of one unit ([`Placement::single`]).
pub struct Placement {
    /// The preference lists.
    pub spec: PlacementSpec,
    /// Every unit the lists name, in order of first mention.
    pub candidates: Vec<(String, Candidate)>,
}

impl Placement {
    /// Everything on `backend`, named `name`; `origin` says where the choice came from.
    pub fn single(name: String, backend: Box<dyn ComputeBackend>, origin: String) -> Placement {
        Placement {
            spec: PlacementSpec::single(&name, origin),
            candidates: vec![(name, Candidate::Ready(backend))],
        }
    }

    /// The placement `backend` (a name, `A+B` or `auto` without measurement) and the config's
    /// `[placement]` ask for, with its units created from the plugins found.
    ///
    /// `gpu_layers` (`--gpu-layers N`) puts layers `0..N` on the backend chosen (a GPU) and the
    /// rest on the CPU.
    pub fn decide(
        discovery: &Discovery,
        settings: &Settings,
        backend: &str,
        gpu_layers: Option<usize>,
        notices: &mut dyn FnMut(Notice),
    ) -> Result<Placement, PlacementError> {
        let mut adapters = Adapters::for_plugins(discovery, settings);
        let placement =
            Placement::decide_with(&mut adapters, discovery, settings, backend, gpu_layers, notices);
        adapters.save();
        placement
    }

    /// [`Placement::decide`] with the facts and backends `adapters` holds.
    pub fn decide_with(
        adapters: &mut Adapters,
        discovery: &Discovery,
        settings: &Settings,
        backend: &str,
        gpu_layers: Option<usize>,
        notices: &mut dyn FnMut(Notice),
    ) -> Result<Placement, PlacementError> {
        let known: Vec<String> = discovery.plugins.iter().map(|p| p.name().to_string()).collect();
        match PlacementSpec::resolve(backend, settings, &known, gpu_layers)? {
            None => {
                let b = choose_with(adapters, settings, backend, notices)?;
                let name = b.info().name;
                let single = Placement::single(name, b, format!("--backend {backend}"));
                match gpu_layers {
                    None => Ok(single),
                    Some(count) => single.with_first_layers(count, discovery, settings),
                }
            }
            Some(spec) => {
                let candidates = open_candidates(&spec, discovery, settings)?;
                Ok(Placement { spec, candidates })
            }
        }
    }
}

impl Placement {
    /// This placement of one unit with only its first `count` layers (and the embedding and
    /// head) kept there, the rest on the CPU: `--gpu-layers`, or a budget's fit. An error when
    /// the unit is the CPU itself or no CPU backend is available.
    pub fn with_first_layers(
        mut self,
        count: usize,
        discovery: &Discovery,
        settings: &Settings,
    ) -> Result<Placement, PlacementError> {
        let gpu_err = |why: String| PlacementError::Spec(SpecError::GpuLayers { count, why });
        let Some((name, Candidate::Ready(b))) = self.candidates.first() else {
            return Err(gpu_err("no backend was chosen".into()));
        };
        if self.candidates.len() != 1 || self.spec.layers.is_some() {
            return Err(gpu_err("it takes a placement of one backend".into()));
        }
        if b.info().kind == DeviceKind::Cpu {
            return Err(gpu_err(format!(
                "the backend is {name}, on the CPU already: name a GPU backend (--backend vulkan)"
            )));
        }
        let rest = "cpu".to_string();
        let cpu = discovery
            .create(&rest, &settings.backend_options(&rest))
            .map_err(|e| gpu_err(format!("the other layers need the cpu backend: {e}")))?;
        self.spec.origin = format!("{} --gpu-layers {count}", self.spec.origin);
        self.spec.layers = Some(LayerRule::First {
            unit: name.clone(),
            count,
            rest: rest.clone(),
        });
        self.candidates.push((rest, Candidate::Ready(cpu)));
        Ok(self)
    }

    /// Moves the cut of a [`Placement::with_first_layers`] placement: its first `count` layers on
    /// its first unit (nothing changes on another placement).
    pub fn set_first_layers(&mut self, count: usize) {
        if let Some(LayerRule::First { count: c, .. }) = &mut self.spec.layers {
            *c = count;
        }
    }
}

impl Placement {
    /// This placement without the units `lost` (instance names: units lost while serving): each
    /// becomes unavailable (`why`), its backend dropped, and every part list goes on, past its
    /// end, to the units that remain (in candidate order), so that [`assign`] moves each node
    /// of a lost unit down its list (its layer's unit first) to the next unit that runs it, and
    /// [`fallback_notes`] says where. An error when no unit remains.
    pub fn without(mut self, lost: &[String], why: &str) -> Result<Placement, PlacementError> {
        for (name, c) in &mut self.candidates {
            if lost.contains(name) {
                *c = Candidate::Unavailable(why.to_string());
            }
        }
        let remaining: Vec<String> = self
            .candidates
            .iter()
            .filter(|(_, c)| matches!(c, Candidate::Ready(_)))
            .map(|(n, _)| n.clone())
            .collect();
        if remaining.is_empty() {
            return Err(PlacementError::NoneAvailable(format!(
                "{} ({why}), and the placement ({}) names no other unit",
                lost.join(", "),
                self.spec.origin
            )));
        }
        for lists in [&mut self.spec.prefill, &mut self.spec.decode] {
            for list in [&mut lists.attention, &mut lists.ffn, &mut lists.default] {
                for r in &remaining {
                    if !list.contains(r) {
                        list.push(r.clone());
                    }
                }
            }
        }
        Ok(self)
    }
}

/// How fast a kind of device usually is, for defaults (lower is faster): a discrete GPU, an
/// integrated GPU, an NPU, a software GPU, the CPU.
pub fn speed_rank(kind: DeviceKind) -> u8 {
    match kind {
        DeviceKind::DiscreteGpu => 0,
        DeviceKind::IntegratedGpu => 1,
        DeviceKind::Npu => 2,
        DeviceKind::SoftwareGpu => 3,
        DeviceKind::Cpu => 4,
    }
}

/// A backend the placement could use, or why it cannot.
pub enum Candidate {
    /// Created.
    Ready(Box<dyn ComputeBackend>),
    /// Not available here, and why.
    Unavailable(String),
}

/// Creates every backend `spec` names (one instance per name; `A#2` a second instance of `A`).
/// A missing backend is an error under `[backend.NAME] strict = true`, else a note.
pub fn open_candidates(
    spec: &PlacementSpec,
    discovery: &Discovery,
    settings: &Settings,
) -> Result<Vec<(String, Candidate)>, SpecError> {
    let mut out = Vec::new();
    for name in spec.names() {
        let plugin = plugin_name(&name);
        match discovery.create(plugin, &settings.instance_options(&name)) {
            Ok(b) => out.push((name, Candidate::Ready(b))),
            Err(e) if settings.strict(plugin) => {
                return Err(SpecError::Strict {
                    name: plugin.to_string(),
                    reason: e.to_string(),
                })
            }
            Err(e) => out.push((name, Candidate::Unavailable(e.to_string()))),
        }
    }
    Ok(out)
}

/// A candidate a node did not go to, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PassedOver {
    /// The candidate's instance name.
    pub name: String,
    /// Whether it is unavailable here (else it refused the op).
    pub unavailable: bool,
    /// Its reason.
    pub reason: String,
}

/// Which unit runs one node in one phase, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeChoice {
    /// Index into the candidates (the units).
    pub unit: usize,
    /// Empty when it runs on its first choice; else each earlier candidate and why it was passed
    /// over.
    pub passed_over: Vec<PassedOver>,
}

/// The unit of every node of the step graph, per phase.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Assignment {
    /// Per node, for prefill steps.
    pub prefill: Vec<NodeChoice>,
    /// Per node, for decode steps.
    pub decode: Vec<NodeChoice>,
    /// The nodes whose prefill unit is the GPU of a layer split though their layer is held on
    /// the CPU: products offloaded for prefill steps ([`super::offload`]).
    pub offloaded: Vec<usize>,
}

impl Assignment {
    /// The choices of `phase`.
    pub fn phase(&self, phase: Phase) -> &[NodeChoice] {
        match phase {
            Phase::Prefill => &self.prefill,
            Phase::Decode => &self.decode,
        }
    }

    /// The unit indices of `phase`, node by node.
    pub fn units(&self, phase: Phase) -> Vec<usize> {
        self.phase(phase).iter().map(|c| c.unit).collect()
    }
}

/// The unit of every region under `spec`'s layer rule, for a graph whose nodes' regions are
/// `regions`; `None` without a rule.
pub fn region_units(
    regions: &[Region],
    spec: &PlacementSpec,
    candidates: &[(String, Candidate)],
) -> Result<Option<RegionUnits>, SpecError> {
    let Some(rule) = &spec.layers else {
        return Ok(None);
    };
    let layers = regions
        .iter()
        .filter_map(|r| match r {
            Region::Layer(l) => Some(l + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let rank = |name: &str| match candidates.iter().find(|(n, _)| n == name) {
        Some((_, Candidate::Ready(b))) => speed_rank(b.info().kind),
        _ => u8::MAX,
    };
    let memory = |name: &str| match candidates.iter().find(|(n, _)| n == name) {
        Some((_, Candidate::Ready(b))) => b.info().memory_bytes,
        _ => None,
    };
    Ok(Some(rule.resolve(layers, &rank, &memory)?))
}

/// Places every node of `graph` (whose parts are `parts` and regions `regions`) on the first
/// candidate that is available and `supports` it, in each phase: its region's unit under the
/// spec's layer rule, if any, then its part's list.
pub fn assign(
    graph: &Graph,
    parts: &[Part],
    regions: &[Region],
    spec: &PlacementSpec,
    candidates: &[(String, Candidate)],
) -> Result<Assignment, SpecError> {
    let by_region = region_units(regions, spec, candidates)?;
    let mut per_phase = Vec::new();
    for phase in Phase::ALL {
        let lists = spec.lists(phase);
        let mut choices = Vec::with_capacity(graph.nodes.len());
        for (i, node) in graph.nodes.iter().enumerate() {
            let part = parts.get(i).copied().unwrap_or(Part::Other);
            let mut passed_over = Vec::new();
            let mut chosen = None;
            let layer_unit = match (&by_region, regions.get(i)) {
                (Some(u), Some(&r)) => Some(u.of(r).to_string()),
                _ => None,
            };
            let mut tried: Vec<&String> = Vec::new();
            for name in layer_unit.iter().chain(lists.get(part)) {
                if tried.contains(&name) {
                    continue;
                }
                tried.push(name);
                let Some(unit) = candidates.iter().position(|(n, _)| n == name) else {
                    continue;
                };
                match &candidates[unit].1 {
                    Candidate::Unavailable(reason) => passed_over.push(PassedOver {
                        name: name.clone(),
                        unavailable: true,
                        reason: reason.clone(),
                    }),
                    Candidate::Ready(b) => match b.supports(&node.op) {
                        Support::Yes => {
                            chosen = Some(unit);
                            break;
                        }
                        Support::No { reason } => passed_over.push(PassedOver {
                            name: name.clone(),
                            unavailable: false,
                            reason,
                        }),
                    },
                }
            }
            let Some(unit) = chosen else {
                return Err(SpecError::Unplaceable {
                    node: i,
                    op: node.op.name(),
                    part: part.key(),
                    phase: phase.key(),
                    reasons: passed_over
                        .iter()
                        .map(|p| format!("{}: {}", p.name, p.reason))
                        .collect::<Vec<_>>()
                        .join("; "),
                });
            };
            choices.push(NodeChoice { unit, passed_over });
        }
        per_phase.push(choices);
    }
    let decode = per_phase.pop().unwrap_or_default();
    let prefill = per_phase.pop().unwrap_or_default();
    Ok(Assignment {
        prefill,
        decode,
        offloaded: Vec::new(),
    })
}

/// The notes a placement owes its user: one per backend passed over (unavailable, or refusing
/// an op), naming where that work went instead.
pub fn fallback_notes(
    assignment: &Assignment,
    parts: &[Part],
    graph: &Graph,
    names: &[String],
) -> Vec<String> {
    let mut notes: Vec<String> = Vec::new();
    for phase in Phase::ALL {
        for (i, c) in assignment.phase(phase).iter().enumerate() {
            for p in &c.passed_over {
                let part = parts.get(i).copied().unwrap_or(Part::Other).key();
                let to = names.get(c.unit).map_or("?", String::as_str);
                let (name, reason) = (&p.name, &p.reason);
                let note = if p.unavailable {
                    format!("{name} is unavailable ({reason}); its {part} work runs on {to}")
                } else {
                    format!(
                        "{name} does not run {} ({reason}); it runs on {to}",
                        graph.nodes[i].op.name()
                    )
                };
                if !notes.contains(&note) {
                    notes.push(note);
                }
            }
        }
    }
    notes
}
