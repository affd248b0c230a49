//! Op offload for prefill: with a layer split (`--gpu-layers N`, or a budget's fit), the layers
//! held on the CPU prefill there slowly, while the GPU beside it idles. llama.cpp's scheduler
//! copies those layers' weights to the GPU for large batches and multiplies there. Here, where the
//! GPU unit lists [`HOST_WEIGHTS_FEATURE`], the products (`MatMul` nodes) of the CPU-held layers
//! run on the GPU in prefill steps of at least [`offload_rows`] rows, their weights read by the
//! GPU's kernels from host memory ([`Usage::HostWeight`](tandem_backend_api::Usage): not
//! counted against the GPU's budget, held in the host's memory beside the CPU's own copy). Every
//! other node of those layers (norms, rope, attention, GeGLU) stays on the CPU, so their KV
//! caches stay where the placement put them; steps of fewer rows (decode, short chunks) run as
//! the decode placement does.
//!
//! Not yet measured on a GPU: the rows from which it pays are the tuning variable
//! `TANDEM_PREFILL_OFFLOAD_ROWS` (0: off) until they are.

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

/// Moves the prefill products of the layers `placement`'s layer rule keeps off its GPU unit onto
/// that unit, where it lists [`HOST_WEIGHTS_FEATURE`] and runs them, and records them in
/// `assignment.offloaded`. Nothing changes without a `--gpu-layers`-style rule, with
/// [`offload_rows`] 0, or on a unit without the feature.
pub fn offload(assignment: &mut Assignment, graph: &Graph, regions: &[Region], placement: &Placement) {
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
        if !held_elsewhere || !matches!(node.op, Op::MatMul { .. }) || assignment.prefill[i].unit != cpu {
            continue;
        }
        if matches!(backend.supports(&node.op), Support::Yes) {
            assignment.prefill[i].unit = gpu;
            assignment.prefill[i].passed_over.clear();
            assignment.offloaded.push(i);
        }
    }
}

/// The weights the offloaded products of `assignment` read on `unit`, where no other node of that
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
pub fn describe(assignment: &Assignment, names: &[String], read: &dyn Fn(usize) -> String) -> Option<String> {
    let first = *assignment.offloaded.first()?;
    let unit = assignment.prefill[first].unit;
    Some(format!(
        "{} runs {} products of the layers held elsewhere in prefill steps of {} rows or more, reading {} of their weights from host memory per step",
        names.get(unit).map_or("?", String::as_str),
        assignment.offloaded.len(),
        offload_rows(),
        read(unit),
    ))
}
