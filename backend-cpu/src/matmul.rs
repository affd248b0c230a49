//! `Op::MatMul`'s product, where the backend chooses between its kernels: the fast ones (`fast`:
//! 16-bit quantized activations and integer block dots) where a kernel set is given and covers
//! the weight's format, else the reference loops (`kernels`), with the set's eight-lane dot for
//! float weights.

use crate::fast::KernelSet;
use crate::kernels;
use crate::layout::{scatter, Layout};
use crate::weight::WeightView;

/// [`kernels::matmul`], with `fast` (a kernel set) taking weights of the formats `crate::fast`
/// covers through 16-bit quantized activations and integer block dots (not bit-identical to the
/// reference).
pub fn matmul_with(
    pool: &rayon::ThreadPool,
    x: &[f32],
    rows: usize,
    w: WeightView,
    scratch: &mut [f32],
    outs: &mut [&mut [f32]],
    fast: Option<KernelSet>,
) {
    let layout = product(
        pool,
        None,
        x,
        rows,
        w,
        scratch,
        &mut Default::default(),
        fast,
        true,
        false,
    );
    let mut j0 = 0;
    for out in outs.iter_mut() {
        j0 = scatter(scratch, layout, rows, j0, out);
    }
}

/// The product of `Op::MatMul` into `scratch` (`n * rows`) through `crate::fast` where `fast`
/// (a kernel set) and the weight format allow, else the reference loops (column-major);
/// returns how the product lies. `spin`, where given, takes the matrix-vector products of a
/// few rows instead of `pool`; `gemm` allows the prefill product (see `crate::fast::matmul`).
#[allow(clippy::too_many_arguments)]
pub fn product(
    pool: &rayon::ThreadPool,
    spin: Option<&crate::spin::SpinPool>,
    x: &[f32],
    rows: usize,
    w: WeightView,
    scratch: &mut [f32],
    act: &mut crate::fast::ActScratch,
    fast: Option<KernelSet>,
    gemm: bool,
    int8: bool,
) -> Layout {
    if let Some(set) = fast {
        if let Some(layout) = crate::fast::matmul(pool, spin, set, x, rows, &w, scratch, act, gemm, int8) {
            return layout;
        }
    }
    // Float weights (and formats `fast` does not cover): the reference's single running sum,
    // or with a kernel set eight lanes (summed pairwise at the end) that the CPU's vector
    // units take.
    let dot: fn(&[f32], &[f32]) -> f32 = match fast {
        None => kernels::dot,
        Some(set) => crate::attention::lane_dot(set != KernelSet::Scalar),
    };
    kernels::product_columns(pool, x, rows, w, scratch, dot);
    Layout::Columns
}
