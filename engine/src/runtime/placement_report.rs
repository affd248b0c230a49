//! What a placement costs and why it is what it is: for every node of the step graph, the unit
//! that runs it in each phase and why; the weight bytes each unit holds (and the weights held
//! twice); the activation bytes crossing units per token; the KV-cache hand-off per sequence.
//! The byte counts are the ones the scheduler's copies move. This is the data (serialised for
//! `engine placement --json`); the command line renders it as text (`tandem_cli::report::placement`).

use std::collections::BTreeSet;

use serde::Serialize;
use tandem_backend_api::kit::plan::value_slots_at;
use tandem_backend_api::{BufferId, DeviceKind, Graph, Op, RowCount, Usage, ValueShape};

use super::placement::{Assignment, Candidate, NodeChoice, PlacementSpec};
use super::split::plan::SplitPlan;
use super::split::{attention_units, Phase};
use crate::model::{Gemma3Model, Part};

/// One unit the placement considered.
#[derive(Debug, Clone, Serialize)]
pub struct UnitReport {
    /// Instance name.
    pub name: String,
    /// Its device, when available.
    pub device: Option<String>,
    /// Why it is unavailable, when it is.
    pub unavailable: Option<String>,
    /// Nodes it runs (prefill, decode).
    pub nodes: (usize, usize),
    /// Weight bytes uploaded to it.
    pub weight_bytes: u64,
    /// KV-cache bytes allocated on it.
    pub kv_cache_bytes: u64,
    /// An estimate of its activation memory (see [`activation_estimate`]): 0 when it runs
    /// nothing.
    pub activation_bytes: u64,
    /// The most it may hold ([`tandem_backend_api::BackendInfo::memory_bytes`]: the device's
    /// memory, or `[backend.NAME] memory_limit`), when the backend says; where other units of
    /// the placement drive the same physical device, the smallest of their budgets.
    pub budget_bytes: Option<u64>,
    /// The other units of the placement on the same physical device
    /// ([`tandem_backend_api::BackendInfo::physical_device`]), which share its budget.
    pub shares_device_with: Vec<String>,
    /// What it and the units it shares its device with need together (its own need where it
    /// shares with none): what [`UnitReport::over_budget`] holds against the budget.
    pub device_need_bytes: u64,
    /// The unit whose budget it is held to, where that is another unit on its device (whose
    /// budget is smaller); `None`: its own.
    pub budget_of: Option<String>,
    /// Weights it reads from host memory ([`tandem_backend_api::Usage::HostWeight`]: the
    /// prefill op offload's), held in the host's memory and not counted in its need.
    pub host_weight_bytes: u64,
    /// Whether what it holds is the host's memory (the CPU backend), counted in the process's
    /// resident set.
    pub host: bool,
}

impl UnitReport {
    /// Weights, KV caches and activations together.
    pub fn need_bytes(&self) -> u64 {
        self.weight_bytes + self.kv_cache_bytes + self.activation_bytes
    }

    /// The unit whose budget it is held to: its own name, or [`UnitReport::budget_of`].
    pub fn budget_unit(&self) -> &str {
        self.budget_of.as_deref().unwrap_or(&self.name)
    }

    /// Whether it runs nodes and it, with the units it shares its device with, needs more than
    /// its budget.
    pub fn over_budget(&self) -> bool {
        self.nodes != (0, 0) && self.budget_bytes.is_some_and(|b| self.device_need_bytes > b)
    }
}

/// `units` with the budgets of those on one physical device (`physical[u]`, `None`: unknown)
/// shared: each such unit's budget becomes the smallest of theirs, its need for the budget
/// check what all of them that run nodes need together, and each names the others.
pub fn share_devices(mut units: Vec<UnitReport>, physical: &[Option<String>]) -> Vec<UnitReport> {
    let needs: Vec<u64> = units
        .iter()
        .map(|u| if u.nodes == (0, 0) { 0 } else { u.need_bytes() })
        .collect();
    let budgets: Vec<Option<u64>> = units.iter().map(|u| u.budget_bytes).collect();
    let names: Vec<String> = units.iter().map(|u| u.name.clone()).collect();
    for (u, unit) in units.iter_mut().enumerate() {
        unit.device_need_bytes = unit.need_bytes();
        let Some(Some(device)) = physical.get(u) else {
            continue;
        };
        let mates: Vec<usize> = (0..names.len())
            .filter(|&v| v != u && physical.get(v).is_some_and(|d| d.as_ref() == Some(device)))
            .collect();
        if mates.is_empty() {
            continue;
        }
        unit.shares_device_with = mates.iter().map(|&v| names[v].clone()).collect();
        unit.device_need_bytes += mates.iter().map(|&v| needs[v]).sum::<u64>();
        for &v in &mates {
            let smaller = match (unit.budget_bytes, budgets[v]) {
                (Some(a), Some(b)) => b < a,
                (a, b) => a.is_none() && b.is_some(),
            };
            if smaller {
                unit.budget_bytes = budgets[v];
                unit.budget_of = Some(names[v].clone());
            }
        }
    }
    units
}

/// Bytes kept free on a device unit beyond the estimate, for staging and the driver's own use.
pub const DEVICE_RESERVE_BYTES: u64 = 64 << 20;

/// An estimate of the activation memory a unit needs to run `nodes` of `graph` (with value
/// shapes `shapes`) at `rows` rows per step and `selected` kept rows: the values at their widest
/// live set, placed as a CPU backend stores them (reusable slots,
/// [`tandem_backend_api::kit::plan::value_slots`]: the same planner, so for the CPU this is what
/// it allocates), plus on a host unit the product scratch its matmuls write through (the largest
/// product), and on a device unit [`DEVICE_RESERVE_BYTES`] (GPU backends plan an arena of the
/// same values, with their own alignment, and staging).
pub fn activation_estimate(
    graph: &Graph,
    shapes: &[ValueShape],
    nodes: impl Iterator<Item = usize>,
    rows: usize,
    selected: usize,
    device: bool,
) -> u64 {
    let mut on = vec![false; graph.nodes.len()];
    let mut product = 0usize;
    for i in nodes {
        on[i] = true;
        if let Op::MatMul { x, weight, .. } = &graph.nodes[i].op {
            let r = match shapes.get(x.0 as usize).map(|s| s.rows) {
                Some(RowCount::Selected) => selected,
                _ => rows,
            };
            product = product.max(weight.desc.shape[0] * r);
        }
    }
    if !on.contains(&true) {
        return 0;
    }
    let slots = value_slots_at(graph, shapes, rows, selected, |i| on[i]);
    let values = slots.elements() as u64 * 4;
    values
        + if device {
            DEVICE_RESERVE_BYTES
        } else {
            product as u64 * 4
        }
}

/// Where one node runs in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct Where {
    /// The unit's instance name.
    pub unit: String,
    /// Why not an earlier candidate (empty: its first choice).
    pub why: String,
}

/// One node of the step graph.
#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    /// Its index in the step graph.
    pub index: usize,
    /// The op's name (`matmul(q4_k)`).
    pub op: String,
    /// The part of the model it belongs to.
    pub part: Part,
    /// Where it runs for prefill.
    pub prefill: Where,
    /// Where it runs for decode.
    pub decode: Where,
}

/// A weight uploaded to more than one unit.
#[derive(Debug, Clone, Serialize)]
pub struct SharedWeight {
    /// Its stored names.
    pub name: String,
    /// Bytes per copy.
    pub bytes: u64,
    /// The units holding it.
    pub units: Vec<String>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct PlacementReport {
    /// Where the preference lists came from.
    pub origin: String,
    /// The candidates, available or not.
    pub units: Vec<UnitReport>,
    /// Every node.
    pub nodes: Vec<NodeReport>,
    /// Weights held by two units or more.
    pub shared_weights: Vec<SharedWeight>,
    /// What runs where under a layer rule (`vulkan: layers 0-12, embedding, head; cpu: layers
    /// 13-25`); `None` without one.
    pub layers: Option<String>,
    /// Programs per step (prefill, decode).
    pub programs_per_step: (usize, usize),
    /// Activation bytes copied between units through the host per decode token.
    pub decode_bytes_per_token: u64,
    /// Rows per prefill step the next figure assumes.
    pub prefill_chunk: usize,
    /// Activation bytes copied between units per prompt token, at that chunk.
    pub prefill_bytes_per_token: f64,
    /// Layers whose attention runs on different units in prefill and decode.
    pub kv_handoff_layers: usize,
    /// KV-cache bytes handed from the prefill unit to the decode unit per prompt token (each
    /// sliding-window layer stops growing at its ring's capacity), once per sequence.
    pub kv_handoff_bytes_per_token: u64,
    /// The process's peak resident memory when the report was made, before any weight is
    /// uploaded (the program, the checkpoint's metadata and vocabulary, the backends' threads),
    /// measured (Linux `VmHWM`); `None` where the OS does not say.
    pub process_bytes: Option<u64>,
    /// The prefill op offload, where one applies ([`crate::runtime::offload`]): which unit runs
    /// how many products of layers held elsewhere, from how many rows, reading how many bytes of
    /// weights from host memory per prompt chunk.
    pub offload: Option<String>,
    /// The vision tower's unit and each candidate's verdict, where images were asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionReport>,
}

impl PlacementReport {
    /// The process's peak resident memory once loaded and stepping prompt chunks of
    /// [`PlacementReport::prefill_chunk`] rows: [`PlacementReport::process_bytes`] plus what the
    /// host units (the CPU backend) need. What `[backend.cpu] memory_limit` bounds is the
    /// units' share; `None` where the process's own is unknown, or where no host unit runs
    /// nodes (a GPU's driver then holds host memory of its own that is not estimated).
    pub fn host_peak_bytes(&self) -> Option<u64> {
        if !self.units.iter().any(|u| u.host && u.nodes != (0, 0)) {
            return None;
        }
        let units: u64 = self
            .units
            .iter()
            .filter(|u| u.host && u.nodes != (0, 0))
            .map(UnitReport::need_bytes)
            .sum();
        // Weights device units read from host memory are the host's too.
        let host_weights: u64 = self.units.iter().map(|u| u.host_weight_bytes).sum();
        self.process_bytes.map(|p| p + units + host_weights)
    }
}

/// The planned tensors `op` reads or writes (weights and KV caches).
pub fn op_tensors(op: &Op) -> Vec<BufferId> {
    match op {
        Op::Attention { cache, .. } => vec![cache.k, cache.v],
        _ => op.weights().iter().map(|w| w.buffer).collect(),
    }
}

/// The planned tensors the nodes placed on `unit` (in either phase) need there.
pub fn unit_tensors(graph: &Graph, assignment: &Assignment, unit: usize) -> Vec<BufferId> {
    let mut out = BTreeSet::new();
    for phase in Phase::ALL {
        for (node, choice) in graph.nodes.iter().zip(assignment.phase(phase)) {
            if choice.unit == unit {
                out.extend(op_tensors(&node.op));
            }
        }
    }
    out.into_iter().collect()
}

impl PlacementReport {
    /// The report of `assignment` of `graph` (the model's step graph, with `parts`) over
    /// `candidates`, for prefill steps of `chunk` rows.
    pub fn new(
        model: &Gemma3Model,
        spec: &PlacementSpec,
        candidates: &[(String, Candidate)],
        graph: &Graph,
        parts: &[Part],
        assignment: &Assignment,
        chunk: usize,
    ) -> PlacementReport {
        let names: Vec<String> = candidates.iter().map(|(n, _)| n.clone()).collect();
        let tensor_bytes = |id: BufferId, usage: Usage| {
            model
                .tensors()
                .iter()
                .find(|t| t.id == id && t.usage == usage)
                .map_or(0, |t| t.bytes())
        };
        let held: Vec<Vec<BufferId>> = (0..candidates.len())
            .map(|u| unit_tensors(graph, assignment, u))
            .collect();
        let host: Vec<Vec<BufferId>> = (0..candidates.len())
            .map(|u| super::offload::host_weights(graph, assignment, u))
            .collect();
        let shapes = graph.infer_shapes().unwrap_or_default();
        let selected = model.cache_shape.slots.max(1);
        let units = candidates
            .iter()
            .enumerate()
            .map(|(u, (name, c))| {
                let count = |phase| assignment.phase(phase).iter().filter(|c| c.unit == u).count();
                let info = match c {
                    Candidate::Ready(b) => Some(b.info()),
                    Candidate::Unavailable(_) => None,
                };
                let runs = (0..graph.nodes.len())
                    .filter(|&i| assignment.prefill[i].unit == u || assignment.decode[i].unit == u);
                let device = info.as_ref().is_some_and(|i| i.kind != DeviceKind::Cpu);
                let c_is_host = info.as_ref().is_some_and(|i| i.kind == DeviceKind::Cpu);
                UnitReport {
                    name: name.clone(),
                    device: match c {
                        Candidate::Ready(b) => Some(b.info().device),
                        Candidate::Unavailable(_) => None,
                    },
                    unavailable: match c {
                        Candidate::Ready(_) => None,
                        Candidate::Unavailable(r) => Some(r.clone()),
                    },
                    nodes: (count(Phase::Prefill), count(Phase::Decode)),
                    weight_bytes: held[u]
                        .iter()
                        .filter(|id| !host[u].contains(id))
                        .map(|&id| tensor_bytes(id, Usage::Weight))
                        .sum(),
                    host_weight_bytes: host[u].iter().map(|&id| tensor_bytes(id, Usage::Weight)).sum(),
                    kv_cache_bytes: held[u].iter().map(|&id| tensor_bytes(id, Usage::KvCache)).sum(),
                    activation_bytes: activation_estimate(
                        graph,
                        &shapes,
                        runs,
                        chunk.max(1),
                        selected,
                        device,
                    ),
                    budget_bytes: info.and_then(|i| i.memory_bytes),
                    shares_device_with: Vec::new(),
                    device_need_bytes: 0,
                    budget_of: None,
                    host: c_is_host,
                }
            })
            .collect();
        let physical: Vec<Option<String>> = candidates
            .iter()
            .map(|(_, c)| match c {
                Candidate::Ready(b) => b.info().physical_device,
                Candidate::Unavailable(_) => None,
            })
            .collect();
        let units = share_devices(units, &physical);
        let shared_weights = model
            .tensors()
            .iter()
            .filter(|t| t.usage == Usage::Weight)
            .filter_map(|t| {
                let on: Vec<String> = held
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| h.contains(&t.id))
                    .map(|(u, _)| names[u].clone())
                    .collect();
                (on.len() > 1).then(|| SharedWeight {
                    name: t.label.clone(),
                    bytes: t.bytes(),
                    units: on,
                })
            })
            .collect();
        let why = |c: &NodeChoice| Where {
            unit: names[c.unit].clone(),
            why: c
                .passed_over
                .iter()
                .map(|p| {
                    if p.unavailable {
                        format!("{} unavailable: {}", p.name, p.reason)
                    } else {
                        format!("{} does not run it: {}", p.name, p.reason)
                    }
                })
                .collect::<Vec<_>>()
                .join("; "),
        };
        let nodes = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeReport {
                index: i,
                op: n.op.name(),
                part: parts.get(i).copied().unwrap_or(Part::Other),
                prefill: why(&assignment.prefill[i]),
                decode: why(&assignment.decode[i]),
            })
            .collect();
        // The graph's structure does not depend on its row count: one split per phase serves
        // every step shape.
        let split = |phase| SplitPlan::new(graph, &assignment.units(phase), &shapes);
        let (prefill, decode) = (split(Phase::Prefill), split(Phase::Decode));
        let chunk = chunk.max(1);
        let row = model.kv_row_bytes() as u64;
        let (ap, ad) = (
            attention_units(graph, &assignment.units(Phase::Prefill)),
            attention_units(graph, &assignment.units(Phase::Decode)),
        );
        let handoff_layers = ap.iter().zip(&ad).filter(|(a, b)| a != b).count();
        PlacementReport {
            origin: spec.origin.clone(),
            units,
            nodes,
            shared_weights,
            layers: None,
            programs_per_step: (prefill.segments.len(), decode.segments.len()),
            decode_bytes_per_token: decode.host_bytes(1, 1),
            prefill_chunk: chunk,
            prefill_bytes_per_token: prefill.host_bytes(chunk, 1) as f64 / chunk as f64,
            kv_handoff_layers: handoff_layers,
            kv_handoff_bytes_per_token: 2 * row * handoff_layers as u64,
            process_bytes: super::environment::process_peak_bytes(),
            offload: super::offload::describe(assignment, graph, &names, &|u| {
                gib(host[u].iter().map(|&id| tensor_bytes(id, Usage::Weight)).sum())
            }),
            vision: None,
        }
    }

    /// Whether more than one unit runs nodes.
    pub fn is_split(&self) -> bool {
        self.units.iter().filter(|u| u.nodes != (0, 0)).count() > 1
    }

    /// One line naming where each part runs (`attention on cpu, ffn on vulkan, default on vulkan`),
    /// per phase when the phases differ.
    pub fn summary(&self) -> String {
        let phase_line = |pick: fn(&NodeReport) -> &Where| {
            [Part::Attention, Part::Ffn, Part::Other]
                .into_iter()
                .map(|part| {
                    let mut on: Vec<&str> = Vec::new();
                    for n in self.nodes.iter().filter(|n| n.part == part) {
                        let u = pick(n).unit.as_str();
                        if !on.contains(&u) {
                            on.push(u);
                        }
                    }
                    format!("{} on {}", part.key(), on.join("+"))
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (p, d) = (phase_line(|n| &n.prefill), phase_line(|n| &n.decode));
        if p == d {
            d
        } else {
            format!("prefill: {p}; decode: {d}")
        }
    }
}

/// `1.25 GiB`, `300.0 MiB`, `64.0 KiB`, `0 B`.
pub fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else if bytes > 0 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        "0 B".to_string()
    }
}

/// One unit of the order and what placement makes of it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VisionCandidate {
    /// The name in the order.
    pub name: String,
    /// `runs the tower`, `not available: ...`, `refuses: OP: why; ...`, or `not tried` (an
    /// earlier unit runs it).
    pub verdict: String,
}

/// The vision tower in `engine placement`'s report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VisionReport {
    /// Where its weights are.
    pub source: String,
    /// Encoder layers.
    pub layers: usize,
    /// Width of the encoder.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Patches an image makes (the rows of its bidirectional attention).
    pub patches: usize,
    /// Soft tokens an image gives the language model.
    pub tokens_per_image: usize,
    /// The unit that runs it; `None` where none of the order does (loading then fails).
    pub unit: Option<String>,
    /// Bytes of its weights on that unit (on the first unit checked where none runs it).
    pub weight_bytes: u64,
    /// The order, each with its verdict.
    pub candidates: Vec<VisionCandidate>,
    /// Where `auto` ordered the units by measurement: each unit's time (ms) for a blank image
    /// through the tower cut to one encoder layer, fastest first; empty otherwise.
    pub measured: Vec<(String, f64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(name: &str, runs: bool, need_mib: u64, budget_mib: Option<u64>) -> UnitReport {
        UnitReport {
            name: name.into(),
            device: Some("gpu".into()),
            unavailable: None,
            nodes: if runs { (1, 1) } else { (0, 0) },
            weight_bytes: need_mib << 20,
            kv_cache_bytes: 0,
            activation_bytes: 0,
            budget_bytes: budget_mib.map(|b| b << 20),
            shares_device_with: Vec::new(),
            device_need_bytes: 0,
            budget_of: None,
            host_weight_bytes: 0,
            host: false,
        }
    }

    #[test]
    fn units_on_one_device_share_its_budget() {
        let units = vec![
            unit("vulkan", true, 60, Some(100)),
            unit("wgpu", true, 60, Some(1000)),
            unit("cpu", true, 500, None),
            unit("vulkan#2", false, 0, None),
        ];
        let gpu = Some("uuid0".to_string());
        let shared = share_devices(units, &[gpu.clone(), gpu.clone(), None, gpu]);
        // Each GPU unit: the smaller budget, both needs (the idle instance adds nothing).
        for u in &shared[..2] {
            assert_eq!(u.budget_bytes, Some(100 << 20), "{}", u.name);
            assert_eq!(u.device_need_bytes, 120 << 20, "{}", u.name);
            assert!(u.over_budget(), "{}", u.name);
        }
        assert_eq!(shared[0].shares_device_with, vec!["wgpu", "vulkan#2"]);
        // vulkan's own budget is the smaller; wgpu is held to vulkan's.
        assert_eq!(shared[0].budget_of, None);
        assert_eq!(shared[1].budget_of.as_deref(), Some("vulkan"));
        // The CPU shares nothing and fits (no budget).
        assert!(shared[2].shares_device_with.is_empty());
        assert_eq!(shared[2].device_need_bytes, 500 << 20);
        assert!(!shared[2].over_budget());
        // Apart, each fits its own budget.
        let apart = share_devices(
            vec![
                unit("vulkan", true, 60, Some(100)),
                unit("wgpu", true, 60, Some(1000)),
            ],
            &[Some("a".into()), Some("b".into())],
        );
        assert!(apart
            .iter()
            .all(|u| !u.over_budget() && u.shares_device_with.is_empty()));
    }
}
