//! Row counts of values, which the buffer checks ([`super::buffers`]) and top-k's scratch
//! ([`super::top_k`]) read. The GPU backends' planning (the value arena, workgroups, attention
//! splits) lives in their own kit, `tandem-gpu-kit` (folder `backend-gpu`).

use crate::graph::{Graph, RowCount, ValueShape};

/// The number of rows a value of `shape` has in `graph`.
pub fn value_rows(graph: &Graph, shape: &ValueShape) -> usize {
    match shape.rows {
        RowCount::Step => graph.rows,
        RowCount::Selected => graph.selected_rows,
    }
}
