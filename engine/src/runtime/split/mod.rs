//! The split scheduler: runs a model's step graph on the units a placement chose, one unit or
//! several. One backend is simply a split of one unit. It sees the model only through
//! [`StepModel`] (Gemma 3 is one: `crate::model::Gemma3Model`): the step graph of each shape
//! and the logits' width. The KV caches it hands between units are those the graph's attention
//! nodes name.
//!
//! How to use it:
//! 1. Place the step graph of one row ([`StepModel::step_graph_parts`]`(1, 1, UNBOUND)`, with
//!    each node's part and region): a unit index per node position, per [`Phase`]
//!    (`runtime::placement::assign`).
//! 2. Give each [`Unit`] the planned tensors its nodes read (for Gemma, `Gemma3Model::upload`
//!    fills [`Unit::map`]), then [`SplitScheduler::new`] with the units, the placement and that
//!    graph.
//! 3. Call [`SplitScheduler::run`] for every step. The first step of each shape (phase, rows,
//!    selected rows, micro-batches) builds the model's step graph for that shape once, splits it
//!    where the unit changes ([`plan::SplitPlan`]), allocates the boundary buffers and compiles
//!    one program per segment ([`program::Scheduled`]); every later step of that shape replays
//!    them, copying boundary values between units and handing KV caches over ([`kv`]) as needed.
//!
//! **What ties the placement to the graph**: node positions. A step graph of any shape has the
//! same nodes in the same order as the one-row graph the placement was made on (only row counts
//! differ), so node `i` of every shape runs where node `i` of that graph was placed. The scheduler
//! checks it when it builds a shape (same node count, same op at every position) and refuses a
//! graph that differs.
//!
//! **Boundaries**: where both units allow it, a value crossing between units lives in host
//! memory both imported (no copy); with [`BoundaryMode::Device`] the consumer's device also
//! waits for the producer's ticket (no host wait); elsewhere the host waits and copies
//! ([`program`]). [`BoundaryMode::Host`] forces the host path everywhere.
//!
//! **Micro-batches**: a decode step of several sequences on a split that changes unit within a
//! decode step may be cut into up to [`MAX_MICRO_BATCHES`] pieces, pipelined so that one unit
//! works on one piece while another unit works on the next
//! ([`SplitScheduler::set_micro_batches`]). So may a prompt step whose placement changes unit
//! (layers across two GPUs): its rows, consecutive positions of one sequence, in pieces that
//! each unit runs in order, so a piece's attention finds the earlier pieces' keys and values
//! in the unit's cache ([`SplitScheduler::set_prefill_micro_batches`]).

#[cfg(test)]
pub(crate) mod fake;
mod kv;
pub mod plan;
pub mod program;
mod shared;

use std::collections::HashMap;

use tandem_backend_api::{
    BackendError, BufferId, ComputeBackend, Graph, Node, NodeTime, Op, StepArgs, Support, TimelineId, ValueId,
};

use self::kv::KvHandoff;
pub use self::program::HostTimes;
use self::program::{Boundaries, BoundaryCounts, Scheduled};
use crate::model::StepModel;

/// The two phases of generation, which may run on different units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Prompt processing (several rows of one sequence per step).
    Prefill,
    /// Generation (one row per sequence per step).
    Decode,
}

impl Phase {
    /// Both, prefill first.
    pub const ALL: [Phase; 2] = [Phase::Prefill, Phase::Decode];

    /// Its name in `[placement.NAME]`.
    pub fn key(self) -> &'static str {
        match self {
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }

    /// 0 for prefill, 1 for decode: its index in per-phase arrays.
    pub fn index(self) -> usize {
        match self {
            Phase::Prefill => 0,
            Phase::Decode => 1,
        }
    }
}

/// One compute unit: a backend, and where it holds the model's planned tensors.
pub struct Unit {
    /// Its instance name (`cpu`, `vulkan`, `vulkan#2`).
    pub name: String,
    /// The backend.
    pub backend: Box<dyn ComputeBackend>,
    /// Planned id -> this backend's buffer, for every tensor the unit's nodes read.
    pub map: HashMap<BufferId, BufferId>,
}

impl Unit {
    /// This unit's buffer for the planned tensor `b`, which `op` reads.
    fn bind(&self, b: BufferId, op: &Op) -> Result<BufferId, ScheduleError> {
        self.map.get(&b).copied().ok_or_else(|| ScheduleError {
            context: format!("binding {} on {}", op.name(), self.name),
            error: BackendError::invalid(format!("the unit holds no buffer for planned tensor {}", b.0)),
            unit: Some(self.name.as_str().into()),
        })
    }
}

/// A backend failure while building or running a step.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {error}")]
pub struct ScheduleError {
    /// What was being done, naming the unit.
    pub context: String,
    /// The backend's error.
    pub error: BackendError,
    /// The instance name of the unit whose call failed, where one unit's did (`None`: the
    /// graph, the placement, or a hand-over between two units). Boxed: a step's error stays
    /// small.
    pub unit: Option<Box<str>>,
}

impl ScheduleError {
    /// The unit that can no longer run anything, where this error says one is gone: its
    /// device was lost ([`BackendError::DeviceLost`]), or its plugin panicked and refuses every
    /// later call ([`BackendError::Panicked`]).
    pub fn lost_unit(&self) -> Option<&str> {
        match self.error {
            BackendError::DeviceLost { .. } | BackendError::Panicked { .. } => self.unit.as_deref(),
            _ => None,
        }
    }
}

fn err(context: impl Into<String>) -> impl FnOnce(BackendError) -> ScheduleError {
    let context = context.into();
    move |error| ScheduleError {
        context,
        error,
        unit: None,
    }
}

/// [`err`] for a call of one unit's backend, which the error names.
fn unit_err(context: String, unit: &str) -> impl FnOnce(BackendError) -> ScheduleError + '_ {
    move |error| ScheduleError {
        context,
        error,
        unit: Some(unit.into()),
    }
}

/// [`unit_err`] with the context `"{what} {unit}"` formatted only on failure: a step allocates
/// nothing.
fn step_err<'a>(what: &'a str, unit: &'a str) -> impl FnOnce(BackendError) -> ScheduleError + 'a {
    move |error| ScheduleError {
        context: format!("{what} {unit}"),
        error,
        unit: Some(unit.into()),
    }
}

fn invalid(context: &str, message: String) -> ScheduleError {
    ScheduleError {
        context: context.to_string(),
        error: BackendError::invalid(message),
        unit: None,
    }
}

/// The most micro-batches [`SplitScheduler::set_micro_batches`] takes.
pub const MAX_MICRO_BATCHES: usize = 4;

/// How values cross between units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundaryMode {
    /// Shared host memory and device waits where both units allow them, the host elsewhere.
    /// On the H100, a Vulkan queue waiting on another `VkDevice`'s timeline measured slower
    /// than the host waiting and submitting (bench/results/2026-11-25-h100-boundaries), so it
    /// is not the default.
    Device,
    /// Shared host memory where both units allow it (no copy), the host waiting for the
    /// producer before it submits the consumer. The default: it measured best on the H100.
    #[default]
    Shared,
    /// Always through the host: wait for the producer, copy, then submit the consumer.
    Host,
}

impl BoundaryMode {
    /// Its name in `[placement] boundaries`.
    pub fn key(self) -> &'static str {
        match self {
            BoundaryMode::Device => "device",
            BoundaryMode::Shared => "shared",
            BoundaryMode::Host => "host",
        }
    }
}

/// One step shape: what a compiled set of programs serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct StepKey {
    phase: Phase,
    rows: usize,
    selected: usize,
    micro_batches: usize,
    /// 0: the step writes the logits; else each selected row's best `top_k` ([`Op::TopK`]).
    top_k: usize,
}

/// `graph` (whose last node is the `Output` of the logits) writing each row's best `k` logits
/// and their ids instead: an [`Op::TopK`] node between the logits and the `Output`.
fn with_top_k(mut graph: Graph, k: usize) -> Result<Graph, ScheduleError> {
    let context = "adding the logits' top-k";
    let Some(last) = graph.nodes.pop() else {
        return Err(invalid(context, "the graph is empty".into()));
    };
    let Op::Output { x, buffer } = last.op else {
        return Err(invalid(
            context,
            format!("its last node is {}, not the output", last.op.name()),
        ));
    };
    let best = ValueId(graph.value_count() as u32);
    graph.nodes.push(Node {
        op: Op::TopK { x, k },
        outputs: vec![best],
    });
    graph.nodes.push(Node {
        op: Op::Output { x: best, buffer },
        outputs: vec![],
    });
    Ok(graph)
}

/// Step shapes whose programs are kept at most. Every distinct row count is a shape, and a
/// server's steps (decode rows of any number of slots, plus a prompt chunk of any length) make
/// many; each program holds its activations in device memory. A released shape is built again
/// when it next runs, which on the H100 can cost far more than a step. On `engine serve
/// --parallel 64` under 64 clients, 1B q4_k gave 482 tok/s with 64 shapes kept and 2,774 with
/// 512, but 4B with 512 on a fresh machine gave 499. First builds, which are faster where the
/// driver's pipeline cache is warm, confound the comparison
/// (`bench/results/2026-11-26-serve-vs-llama-server/`).
pub const MAX_SHAPES: usize = 512;

/// [`MAX_SHAPES`], or `TANDEM_STEP_SHAPES=n` (at least 1), for tuning runs.
fn max_shapes() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("TANDEM_STEP_SHAPES")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| *n >= 1)
            .unwrap_or(MAX_SHAPES)
    })
}

/// The units, the placement of every node per phase, and the programs compiled so far.
pub struct SplitScheduler {
    units: Vec<Unit>,
    /// Per phase (prefill, decode), the unit of every node, by node position.
    placement: [Vec<usize>; 2],
    /// The op of every node position of the graph the placement was made on.
    ops: Vec<String>,
    kv: Option<KvHandoff>,
    programs: HashMap<StepKey, Vec<Scheduled>>,
    /// When each built shape last ran (a step counter): the least recently run is released
    /// when [`MAX_SHAPES`] are built and another is needed.
    used: HashMap<StepKey, u64>,
    steps: u64,
    /// Step shapes built so far (released ones counted), and the time their building took.
    builds: (u64, std::time::Duration),
    micro_batches: usize,
    /// Micro-batches of a prompt step ([`SplitScheduler::set_prefill_micro_batches`]).
    prefill_micro_batches: usize,
    /// The fewest rows a prompt step's piece has.
    prefill_piece_rows: usize,
    /// `0, 1, 2, ...`: the select rows of a micro-batch (grown, never shrunk).
    iota: Vec<u32>,
    last: Option<StepKey>,
    /// Prefill steps of fewer rows run with the decode placement (the prefill op offload's
    /// threshold; 0: every prefill step takes the prefill placement).
    min_prefill_rows: usize,
    mode: BoundaryMode,
    /// `timelines[consumer][producer]`: the producer's timeline imported by the consumer, once
    /// asked (on the first build with device boundaries).
    timelines: Option<Vec<Vec<Option<TimelineId>>>>,
}

/// The unit of each layer's attention node, in layer order, given the unit of every node of
/// `graph`: where that layer's KV cache is written.
pub fn attention_units(graph: &Graph, units: &[usize]) -> Vec<usize> {
    graph
        .nodes
        .iter()
        .zip(units)
        .filter(|(n, _)| matches!(n.op, Op::Attention { .. }))
        .map(|(_, &u)| u)
        .collect()
}

impl SplitScheduler {
    /// A scheduler over `units`, running node `i` of every step of phase `p` on unit
    /// `placement[p.index()][i]`, where `graph` is the step graph the placement was made on
    /// (its attention nodes name the KV caches handed between phases' units). `model` is the
    /// model every [`SplitScheduler::run`] is given; nothing of it is kept.
    pub fn new(
        units: Vec<Unit>,
        placement: [Vec<usize>; 2],
        graph: &Graph,
        _model: &dyn StepModel,
    ) -> Result<SplitScheduler, ScheduleError> {
        let context = "checking the placement";
        if units.is_empty() {
            return Err(invalid(context, "no unit".into()));
        }
        for (phase, p) in Phase::ALL.iter().zip(&placement) {
            if p.len() != graph.nodes.len() {
                return Err(invalid(
                    context,
                    format!(
                        "{} places {} nodes of a {}-node graph",
                        phase.key(),
                        p.len(),
                        graph.nodes.len()
                    ),
                ));
            }
            if let Some(&u) = p.iter().find(|&&u| u >= units.len()) {
                return Err(invalid(
                    context,
                    format!("{} names unit {u} of {}", phase.key(), units.len()),
                ));
            }
        }
        let kv = KvHandoff::new(graph, [0, 1].map(|ph| attention_units(graph, &placement[ph])));
        Ok(SplitScheduler {
            units,
            ops: graph.nodes.iter().map(|n| n.op.name()).collect(),
            placement,
            kv,
            programs: HashMap::new(),
            used: HashMap::new(),
            steps: 0,
            builds: (0, std::time::Duration::ZERO),
            micro_batches: 1,
            prefill_micro_batches: 1,
            prefill_piece_rows: 1,
            iota: Vec::new(),
            last: None,
            min_prefill_rows: 0,
            mode: BoundaryMode::default(),
            timelines: None,
        })
    }

    /// Sets how values cross between units (programs built so far are released and rebuilt on
    /// the next step).
    pub fn set_boundaries(&mut self, mode: BoundaryMode) {
        if mode != self.mode {
            self.mode = mode;
            for p in self.programs.values_mut().flatten() {
                p.release(&mut self.units);
            }
            self.programs.clear();
            self.used.clear();
            self.last = None;
        }
    }

    /// Step shapes whose programs are built now (at most [`MAX_SHAPES`], or
    /// `TANDEM_STEP_SHAPES`).
    pub fn shapes_built(&self) -> usize {
        self.programs.len()
    }

    /// Step shapes built so far, released ones counted (a shape built again counts again), and
    /// the time building them took: what a step that met a new shape waited.
    pub fn builds(&self) -> (u64, std::time::Duration) {
        self.builds
    }

    /// How values cross between units.
    pub fn boundaries(&self) -> BoundaryMode {
        self.mode
    }

    /// What the last step's boundaries did (all zero on one unit or before a step).
    pub fn boundary_counts(&self) -> BoundaryCounts {
        let Some(s) = self.last.and_then(|k| self.programs.get(&k)) else {
            return BoundaryCounts::default();
        };
        s.iter().fold(BoundaryCounts::default(), |a, p| {
            let c = p.boundary_counts();
            BoundaryCounts {
                shared_values: a.shared_values + c.shared_values,
                copied_values: a.copied_values + c.copied_values,
                device_waits: a.device_waits + c.device_waits,
                host_waits: a.host_waits + c.host_waits,
            }
        })
    }

    /// Every unit's timeline imported by every other unit that can wait on it (asked once).
    fn share_timelines(&mut self) -> Result<(), ScheduleError> {
        if self.timelines.is_some() {
            return Ok(());
        }
        let n = self.units.len();
        let mut t = vec![vec![None; n]; n];
        for p in 0..n {
            let unit = &mut self.units[p];
            let exported = unit.backend.export_timeline().map_err(unit_err(
                format!("exporting the timeline of {}", unit.name),
                &unit.name,
            ))?;
            let Some(shared) = exported else { continue };
            let mut result = Ok(());
            for (c, row) in t.iter_mut().enumerate().filter(|(c, _)| *c != p) {
                match self.units[c].backend.import_timeline(&shared) {
                    Ok(id) => row[p] = id,
                    Err(e) => {
                        result = Err(ScheduleError {
                            context: format!(
                                "importing the timeline of {} into {}",
                                self.units[p].name, self.units[c].name
                            ),
                            error: e,
                            unit: Some(self.units[c].name.as_str().into()),
                        });
                        break;
                    }
                }
            }
            shared::close(shared);
            result?;
        }
        self.timelines = Some(t);
        Ok(())
    }

    /// Sets how many micro-batches a split decode step of several sequences (every row
    /// selected) is cut into, at most [`MAX_MICRO_BATCHES`]: while one unit runs a part of one
    /// micro-batch, the other unit runs the next part of another. 1 (the default) runs each step
    /// whole.
    pub fn set_micro_batches(&mut self, n: usize) {
        self.micro_batches = n.clamp(1, MAX_MICRO_BATCHES);
    }

    /// Sets how many micro-batches a prompt step is cut into, at most [`MAX_MICRO_BATCHES`],
    /// where its placement changes unit (a layer split whose prompt steps are not offloaded to
    /// one unit, as layers across two GPUs): while the second unit runs its layers of piece j,
    /// the first runs its layers of piece j + 1. Each piece is a step of its own rows (its
    /// attention reads the earlier pieces' keys and values, which the same unit wrote before
    /// it); only the last piece's selected row gives logits. Taken only where the step selects
    /// its last row alone or every row, and holds no image rows (an image's rows attend to each
    /// other and stay in one step). Each piece has at least `min_rows` rows (fewer pieces where
    /// the step is short). 1 (the default) runs each step whole.
    pub fn set_prefill_micro_batches(&mut self, n: usize, min_rows: usize) {
        self.prefill_micro_batches = n.clamp(1, MAX_MICRO_BATCHES);
        self.prefill_piece_rows = min_rows.max(1);
    }

    /// Whether a prompt step of `rows` rows runs on more than one unit (so that
    /// [`SplitScheduler::set_prefill_micro_batches`] applies to it).
    pub fn prompt_changes_unit(&self, rows: usize) -> bool {
        self.changes_unit(self.phase_key(self.runs_as(Phase::Prefill, rows)))
    }

    /// The phase whose placement a step of `phase` with `rows` rows takes: prefill steps of
    /// fewer than [`SplitScheduler::set_min_prefill_rows`]'s rows take the decode placement.
    fn runs_as(&self, phase: Phase, rows: usize) -> Phase {
        if phase == Phase::Prefill && rows < self.min_prefill_rows {
            Phase::Decode
        } else {
            phase
        }
    }

    /// Whether the placement of `phase` puts the step's nodes on more than one unit.
    fn changes_unit(&self, phase: Phase) -> bool {
        self.placement[phase.index()].windows(2).any(|w| w[0] != w[1])
    }

    /// Prefill steps of fewer than `rows` rows run with the decode placement: where the prefill
    /// placement differs only to offload products to another unit ([`crate::runtime::offload`]),
    /// which pays from some rows on. The KV caches go where the placement that runs puts them.
    pub fn set_min_prefill_rows(&mut self, rows: usize) {
        self.min_prefill_rows = rows;
    }

    /// The units, in unit order.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// Writes `data` at byte `offset` of the planned tensor `id` on every unit holding it (a
    /// table the host rewrites between steps: images' soft tokens). Between steps only.
    pub fn write_planned(&mut self, id: BufferId, offset: u64, data: &[u8]) -> Result<usize, ScheduleError> {
        let mut written = 0;
        for unit in &mut self.units {
            if let Some(&b) = unit.map.get(&id) {
                unit.backend
                    .write(b, offset, data)
                    .map_err(|error| ScheduleError {
                        context: format!("writing planned tensor {} on {}", id.0, unit.name),
                        error,
                        unit: Some(unit.name.as_str().into()),
                    })?;
                written += 1;
            }
        }
        Ok(written)
    }

    /// The unit of the last node of a decode step: where the logits are computed.
    pub fn main_unit(&self) -> usize {
        self.placement[1].last().copied().unwrap_or(0)
    }

    /// The backend that computes the logits.
    pub fn main_backend(&mut self) -> &mut dyn ComputeBackend {
        let u = self.main_unit();
        self.units[u].backend.as_mut()
    }

    /// Micro-batches the last step ran in (1: whole; 0: no step yet).
    pub fn last_step_micro_batches(&self) -> usize {
        self.last.map_or(0, |k| k.micro_batches)
    }

    /// Where the host's time went per unit (in unit order, with the unit's name) since the last
    /// call, over every step shape run: see [`HostTimes`]. The figures start again from zero.
    pub fn take_host_times(&mut self) -> Vec<(String, HostTimes)> {
        let mut sum = vec![HostTimes::default(); self.units.len()];
        for s in self.programs.values_mut().flatten() {
            s.take_times(&mut sum);
        }
        self.units.iter().map(|u| u.name.clone()).zip(sum).collect()
    }

    /// Bytes moved between units so far: boundary values through the host, and KV caches
    /// handed from one phase's unit to the other's.
    pub fn moved_bytes(&self) -> (u64, u64) {
        (
            self.programs.values().flatten().map(Scheduled::moved_bytes).sum(),
            self.kv.as_ref().map_or(0, |k| k.moved),
        )
    }

    /// Per-node device time of the last step, where the backends measure it (empty otherwise).
    pub fn profile_last_step(&mut self) -> Result<Vec<NodeTime>, ScheduleError> {
        match self.last.and_then(|k| self.programs.get(&k)?.first()) {
            Some(p) => p.profile(&mut self.units),
            None => Ok(Vec::new()),
        }
    }

    /// The phase whose placement a step runs with: decode when both phases place alike (one
    /// set of programs serves both).
    fn phase_key(&self, phase: Phase) -> Phase {
        if self.placement[0] != self.placement[1] {
            phase
        } else {
            Phase::Decode
        }
    }

    /// The micro-batches a step of `tokens` selecting `select` runs as: their row bounds.
    /// `phase` is the placement the step runs with, `prompt` whether it is a prompt step (of one
    /// sequence's consecutive positions); image rows carry ids from `vocab` on
    /// (`Op::Attention::bidirectional_from`).
    fn micro_bounds(
        &self,
        phase: Phase,
        prompt: bool,
        tokens: &[u32],
        vocab: usize,
        select: &[u32],
    ) -> ([usize; MAX_MICRO_BATCHES + 1], usize) {
        let rows = tokens.len();
        let mut bounds = [0; MAX_MICRO_BATCHES + 1];
        let all_rows = select.len() == rows && select.iter().enumerate().all(|(i, &r)| r as usize == i);
        let last_only = select.len() == 1 && select[0] as usize + 1 == rows;
        let m = if !self.changes_unit(phase) {
            1
        } else if prompt {
            let pieces = self.prefill_micro_batches.min(rows / self.prefill_piece_rows);
            if pieces > 1 && (all_rows || last_only) && !tokens.iter().any(|&t| t as usize >= vocab) {
                pieces
            } else {
                1
            }
        } else if phase == Phase::Decode && all_rows {
            self.micro_batches.min(rows)
        } else {
            1
        };
        for (j, b) in bounds.iter_mut().enumerate().take(m + 1) {
            *b = rows * j / m;
        }
        (bounds, m)
    }

    /// Releases the programs of the shape that ran least recently; false when none is built.
    fn release_least_recent(&mut self) -> bool {
        let Some(old) = self.used.iter().min_by_key(|(_, &t)| t).map(|(k, _)| *k) else {
            return false;
        };
        self.used.remove(&old);
        if let Some(schedules) = self.programs.remove(&old) {
            for mut s in schedules {
                s.release(&mut self.units);
            }
        }
        if self.last == Some(old) {
            self.last = None;
        }
        true
    }

    /// Builds (once per shape) the programs of `key`, one per micro-batch: at the cap, or
    /// where a unit runs out of memory for them, after releasing the shapes that ran least
    /// recently (a unit's memory holds as many shapes as fit, however many the cap allows).
    fn programs_for(
        &mut self,
        model: &dyn StepModel,
        key: StepKey,
        bounds: &[usize],
    ) -> Result<(), ScheduleError> {
        if self.programs.contains_key(&key) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        while self.programs.len() >= max_shapes() && self.release_least_recent() {}
        let schedules = loop {
            match self.build(model, key, bounds) {
                Ok(s) => break s,
                Err(e)
                    if matches!(e.error, BackendError::OutOfMemory { .. }) && self.release_least_recent() => {
                }
                Err(e) => return Err(e),
            }
        };
        self.programs.insert(key, schedules);
        self.builds.0 += 1;
        self.builds.1 += started.elapsed();
        Ok(())
    }

    /// The programs of `key`, one per micro-batch, built.
    fn build(
        &mut self,
        model: &dyn StepModel,
        key: StepKey,
        bounds: &[usize],
    ) -> Result<Vec<Scheduled>, ScheduleError> {
        if self.mode == BoundaryMode::Device && self.units.len() > 1 {
            self.share_timelines()?;
        }
        let boundaries = match (&self.mode, &self.timelines) {
            (BoundaryMode::Device, Some(t)) => Boundaries {
                share_memory: true,
                timelines: t,
            },
            (BoundaryMode::Device, None) | (BoundaryMode::Shared, _) => Boundaries {
                share_memory: true,
                timelines: &[],
            },
            (BoundaryMode::Host, _) => Boundaries::HOST,
        };
        // What a step writes per selected row: the logits, or the best `top_k` and their ids
        // (the `TopK` node placed with the `Output`).
        let width = if key.top_k > 0 {
            2 * key.top_k
        } else {
            model.vocab_size()
        };
        let mut placement = self.placement[key.phase.index()].clone();
        if key.top_k > 0 {
            let out = placement.last().copied().unwrap_or(0);
            placement.insert(placement.len().saturating_sub(1), out);
        }
        let mut graphs: Vec<((usize, usize), Graph)> = Vec::new();
        let mut schedules = Vec::new();
        for w in bounds.windows(2) {
            // A micro-batch selects all its rows, or (a prompt step selecting its last row) its
            // last row; a whole step selects `selected`.
            let shape = match (bounds.len() > 2, key.selected == key.rows) {
                (true, true) => (w[1] - w[0], w[1] - w[0]),
                (true, false) => (w[1] - w[0], 1),
                (false, _) => (key.rows, key.selected),
            };
            let built = self
                .graph_index(model, &mut graphs, shape, key.top_k)
                .and_then(|i| {
                    Scheduled::build(&mut self.units, &graphs[i].1, &placement, width, &boundaries)
                });
            match built {
                Ok(s) => schedules.push(s),
                Err(e) => {
                    for mut s in schedules {
                        s.release(&mut self.units);
                    }
                    return Err(e);
                }
            }
        }
        Ok(schedules)
    }

    /// The index in `graphs` of the step graph of `shape` (rows, selected rows), built and checked
    /// against the placement the first time (and given its `TopK` node when `top_k > 0`).
    fn graph_index(
        &self,
        model: &dyn StepModel,
        graphs: &mut Vec<((usize, usize), Graph)>,
        shape: (usize, usize),
        top_k: usize,
    ) -> Result<usize, ScheduleError> {
        if let Some(i) = graphs.iter().position(|(s, _)| *s == shape) {
            return Ok(i);
        }
        let mut graph = model.step_graph(shape.0, shape.1, BufferId::UNBOUND);
        self.check_positions(&graph)?;
        if top_k > 0 {
            graph = with_top_k(graph, top_k)?;
        }
        graphs.push((shape, graph));
        Ok(graphs.len() - 1)
    }

    /// Whether the units that write a step's output (in either phase) can also rank its
    /// logits ([`Op::TopK`] of `k`), so that [`SplitScheduler::run`] may be asked for the best
    /// `k` of each row instead of the logits.
    pub fn supports_top_k(&self, k: usize) -> bool {
        let op = Op::TopK { x: ValueId(0), k };
        self.placement.iter().all(|p| {
            p.last()
                .and_then(|&u| self.units.get(u))
                .is_some_and(|u| matches!(u.backend.supports(&op), Support::Yes))
        })
    }

    /// Checks that `graph` has the node positions the placement was made on.
    fn check_positions(&self, graph: &Graph) -> Result<(), ScheduleError> {
        let context = format!("placing {}", graph.name);
        if graph.nodes.len() != self.ops.len() {
            return Err(invalid(
                &context,
                format!(
                    "{} nodes where the placement has {}",
                    graph.nodes.len(),
                    self.ops.len()
                ),
            ));
        }
        for (i, (node, op)) in graph.nodes.iter().zip(&self.ops).enumerate() {
            let name = node.op.name();
            if name != *op {
                return Err(invalid(
                    &context,
                    format!("node {i} is {name} where the placement has {op}"),
                ));
            }
        }
        Ok(())
    }

    /// Runs one step of `phase` on `model`'s graph: `args` (rows of `slots`, whose sequences held
    /// `lengths[slot]` tokens before it), writing the logits of the selected rows to `logits`
    /// (`selected * vocab` little-endian f32), or with `top_k > 0` each selected row's best
    /// `top_k` logits then their ids ([`Op::TopK`]: `selected * 2 top_k`; where
    /// [`SplitScheduler::supports_top_k`] says so).
    pub fn run(
        &mut self,
        model: &dyn StepModel,
        phase: Phase,
        args: &StepArgs<'_>,
        lengths: &[usize],
        top_k: usize,
        logits: &mut [u8],
    ) -> Result<(), ScheduleError> {
        let (rows, selected) = (args.tokens.len(), args.select.len());
        let vocab = if top_k > 0 { 2 * top_k } else { model.vocab_size() };
        let phase = self.runs_as(phase, rows);
        let prompt = phase == Phase::Prefill;
        let phase = self.phase_key(phase);
        let (bounds, m) = self.micro_bounds(phase, prompt, args.tokens, model.vocab_size(), args.select);
        let key = StepKey {
            phase,
            rows,
            selected,
            micro_batches: m,
            top_k,
        };
        let bounds = &bounds[..=m];
        self.programs_for(model, key, bounds)?;
        self.steps += 1;
        self.used.insert(key, self.steps);
        if let Some(kv) = self.kv.as_mut() {
            kv.hand_over(phase, &mut self.units, args.slots, lengths)?;
        }
        if self.iota.len() < rows {
            self.iota.extend(self.iota.len() as u32..rows as u32);
        }
        let Some(schedules) = self.programs.get_mut(&key) else {
            return Err(invalid("running a step", "its programs were not built".into()));
        };
        let units = &mut self.units;
        let iota = &self.iota;
        // Whether each micro-batch selects its last row alone (else all its rows).
        let last_row = selected != rows;
        // The step arguments of micro-batch `j` (of the whole step when there is one).
        let part = |j: usize| {
            if m == 1 {
                return *args;
            }
            let (a, b) = (bounds[j], bounds[j + 1]);
            StepArgs {
                tokens: &args.tokens[a..b],
                positions: &args.positions[a..b],
                slots: &args.slots[a..b],
                select: if last_row {
                    &iota[b - a - 1..b - a]
                } else {
                    &iota[..b - a]
                },
            }
        };
        if m == 1 {
            schedules[0].run(units, args)?;
        } else {
            // Every micro-batch's first part is queued at once; then each micro-batch in turn is
            // carried through its parts, a part submitted as soon as its inputs are in place, and
            // only the last parts are waited for at the end. A unit whose `execute` runs the work
            // before returning (the CPU) thus works on micro-batch j while the device units run
            // what they were given of micro-batches j - 1 (their later parts) and j + 1 (their
            // first parts): nothing waits for a whole part of every micro-batch to finish.
            let parts = schedules[0].len();
            for (j, s) in schedules.iter_mut().enumerate().take(m) {
                s.submit(0, units, &part(j))?;
            }
            for (j, s) in schedules.iter_mut().enumerate().take(m) {
                for i in 0..parts - 1 {
                    s.finish(i, units)?;
                    s.submit(i + 1, units, &part(j))?;
                }
            }
            for s in schedules.iter_mut().take(m) {
                s.settle(units)?;
            }
        }
        self.last = Some(key);
        for (j, s) in schedules.iter().enumerate() {
            let (a, b) = match (m, last_row) {
                (1, _) => (0, selected),
                // Only the last piece's row is the step's; the others' logits are not read.
                (_, true) if j + 1 < m => continue,
                (_, true) => (0, 1),
                _ => (bounds[j], bounds[j + 1]),
            };
            s.read_logits(units, &mut logits[a * vocab * 4..b * vocab * 4])?;
        }
        Ok(())
    }
}

impl Drop for SplitScheduler {
    fn drop(&mut self) {
        for p in self.programs.values_mut().flatten() {
            p.release(&mut self.units);
        }
    }
}
