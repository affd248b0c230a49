//! Op offload for prefill: with a layer split (`--gpu-layers N`, or a budget's fit), the layers
//! held on the CPU prefill there slowly, while the GPU beside it idles. llama.cpp's scheduler
//! copies those layers' weights to the GPU for large batches and multiplies there. Here, where the
//! GPU unit lists [`HOST_WEIGHTS_FEATURE`], every node of the CPU-held layers (products, norms,
//! rope, GeGLU, residual adds, and attention where the GPU's budget holds a copy of those
//! layers' KV caches) runs on the GPU in prefill steps of at least [`offload_rows`] rows, their
//! weights held in host memory ([`Usage::HostWeight`](tandem_backend_api::Usage): not counted
//! against the GPU's budget, held beside the CPU's own copy; the Vulkan backend copies each into
//! its own memory before the product). Steps of fewer rows (decode, short chunks) run as the
//! decode placement does.
//!
//! With attention moved, the GPU holds a second KV cache of those layers, and the split
//! scheduler's KV hand-off ([`super::split`]) copies a sequence's rows of them to the unit whose
//! phase runs next (the rows a prompt wrote, to the CPU before its first decode step; the rows
//! decode added, back before the next prompt chunk). Without room for those caches, attention
//! stays on the CPU with its cache, and a layer's prefill crosses between the units twice (q, k,
//! v out, the attention's output back).
//!
//! Moving only the products cost more than it saved: on the H200 (4B q4_k, 17 of 34 layers on
//! the GPU, prefill 512) the boundary copies of the products' inputs and outputs took 269 of a
//! step's 477 ms, and the CPU's GeGLU and norms another 39 (bench/results/2026-11-28-split-decode).
//! The threshold is the tuning variable `TANDEM_PREFILL_OFFLOAD_ROWS` (0: off).

use tandem_backend_api::{BufferId, DeviceKind, Graph, Op, Support, HOST_WEIGHTS_FEATURE};

use super::layers::LayerRule;
use super::placement::{Assignment, Candidate, Placement};

/// The weights `op` reads.
fn op_weights(op: &Op) -> Vec<BufferId> {
    op.weights().iter().map(|w| w.buffer).collect()
}
use crate::model::Region;

/// Rows from which a prefill step runs the offloaded products on the GPU (llama.cpp's op
/// offload threshold).
pub const OFFLOAD_ROWS: usize = 32;

/// [`OFFLOAD_ROWS`], or `TANDEM_PREFILL_OFFLOAD_ROWS=n` (0: no offload).
pub fn offload_rows() -> usize {
    std::env::var("TANDEM_PREFILL_OFFLOAD_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(OFFLOAD_ROWS)
}

/// Moves the prefill nodes of the layers `placement`'s layer rule keeps off its GPU unit onto that
/// unit (their attention only with `attention`), where it lists [`HOST_WEIGHTS_FEATURE`] and runs
/// them, and records them in `assignment.offloaded`. Nothing changes without a `--gpu-layers`-style rule, with
/// [`offload_rows`] 0, or on a unit without the feature.
pub fn offload(
    assignment: &mut Assignment,
    graph: &Graph,
    regions: &[Region],
    placement: &Placement,
    attention: bool,
) {
    assignment.offloaded.clear();
    if offload_rows() == 0 {
        return;
    }
    let Some(LayerRule::First { unit, count, rest }) = &placement.spec.layers else {
        return;
    };
    let index = |name: &str| placement.candidates.iter().position(|(n, _)| n == name);
    let (Some(gpu), Some(cpu)) = (index(unit), index(rest)) else {
        return;
    };
    let Candidate::Ready(backend) = &placement.candidates[gpu].1 else {
        return;
    };
    let info = backend.info();
    if info.kind == DeviceKind::Cpu || !info.features.iter().any(|f| f == HOST_WEIGHTS_FEATURE) {
        return;
    }
    for (i, node) in graph.nodes.iter().enumerate() {
        let held_elsewhere = matches!(regions.get(i), Some(Region::Layer(l)) if *l >= *count);
        let moves = match node.op {
            Op::Input { .. } | Op::Output { .. } => false,
            Op::Attention { .. } => attention,
            _ => true,
        };
        if !held_elsewhere || !moves || assignment.prefill[i].unit != cpu {
            continue;
        }
        if matches!(backend.supports(&node.op), Support::Yes) {
            assignment.prefill[i].unit = gpu;
            assignment.prefill[i].passed_over.clear();
            assignment.offloaded.push(i);
        }
    }
}

/// The weights the offloaded nodes of `assignment` read on `unit`, where no other node of that
/// unit reads them: what it holds as host weights.
pub fn host_weights(graph: &Graph, assignment: &Assignment, unit: usize) -> Vec<BufferId> {
    let mut own: Vec<BufferId> = Vec::new();
    for (p, phase) in [&assignment.prefill, &assignment.decode].into_iter().enumerate() {
        for (i, (node, c)) in graph.nodes.iter().zip(phase).enumerate() {
            let offloaded = p == 0 && assignment.offloaded.contains(&i);
            if c.unit == unit && !offloaded {
                own.extend(op_weights(&node.op));
            }
        }
    }
    let mut out: Vec<BufferId> = assignment
        .offloaded
        .iter()
        .filter(|&&i| assignment.prefill[i].unit == unit)
        .flat_map(|&i| op_weights(&graph.nodes[i].op))
        .filter(|b| !own.contains(b))
        .collect();
    out.sort_by_key(|b| b.0);
    out.dedup();
    out
}

/// One line saying what [`offload`] did to `assignment` (`None`: nothing): the unit, the products,
/// the rows from which they run there, and `read` (the size of the weights it reads from host
/// memory, as the caller writes sizes).
pub fn describe(
    assignment: &Assignment,
    graph: &Graph,
    names: &[String],
    read: &dyn Fn(usize) -> String,
) -> Option<String> {
    let first = *assignment.offloaded.first()?;
    let unit = assignment.prefill[first].unit;
    Some(format!(
        "{} runs {} nodes ({} products{}) of the layers held elsewhere in prefill steps of {} rows or more, copying {} of their weights from host memory per step",
        names.get(unit).map_or("?", String::as_str),
        assignment.offloaded.len(),
        count(assignment, graph, |op| matches!(op, Op::MatMul { .. })),
        match count(assignment, graph, |op| matches!(op, Op::Attention { .. })) {
            0 => ", not their attention: no room for their KV caches".to_string(),
            n => format!(", {n} attentions over a copy of their KV caches"),
        },
        offload_rows(),
        read(unit),
    ))
}

/// How many of the offloaded nodes' ops are `what`.
fn count(assignment: &Assignment, graph: &Graph, what: fn(&Op) -> bool) -> usize {
    assignment
        .offloaded
        .iter()
        .filter(|&&i| graph.nodes.get(i).is_some_and(|n| what(&n.op)))
        .count()
}
