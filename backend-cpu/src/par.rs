//! Row-parallel elementwise work: the ops besides matmul and attention (norms, rope, GeGLU,
//! residual adds, the product's transposition into rows) on every pool thread where a step is
//! large enough to pay for the hand-off (prefill), inline on the calling thread where it is not
//! (a decode step's single rows). Each row is computed by the same code either way, so results
//! are bit-identical.

use rayon::prelude::*;

use crate::layout::Layout;

/// The fewest values an op must write before it is split across threads.
const MIN_PARALLEL: usize = 1 << 15;

/// Values per parallel task at the least.
const MIN_TASK: usize = 1 << 13;

/// Runs `f(first_row, rows)` over `out` in whole rows of `row_len` values: inline when `out` is
/// small, else in tasks of several rows on `pool`.
pub fn rows<F>(pool: &rayon::ThreadPool, out: &mut [f32], row_len: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    if row_len == 0 || out.is_empty() {
        return;
    }
    let n_rows = out.len() / row_len;
    if out.len() < MIN_PARALLEL || n_rows < 2 {
        f(0, out);
        return;
    }
    let per_task = MIN_TASK
        .div_ceil(row_len)
        .max(n_rows.div_ceil(pool.current_num_threads() * 4));
    pool.install(|| {
        out.par_chunks_mut(per_task * row_len)
            .enumerate()
            .for_each(|(t, chunk)| f(t * per_task, chunk))
    });
}

/// [`crate::layout::scatter`] with the output's rows split across `pool` where it is large.
pub fn scatter(
    pool: &rayon::ThreadPool,
    scratch: &[f32],
    layout: Layout,
    n_rows: usize,
    j0: usize,
    out: &mut [f32],
) -> usize {
    let cols = out.len() / n_rows.max(1);
    if cols == 0 {
        return j0;
    }
    rows(pool, out, cols, |first, chunk| {
        for (i, orow) in chunk.chunks_exact_mut(cols).enumerate() {
            layout.copy_row(scratch, n_rows, first + i, j0, orow);
        }
    });
    j0 + cols
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_visited_once_with_its_index() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        for (n_rows, row_len) in [(1usize, 7usize), (5, 3), (4099, 17), (70_000, 1)] {
            let mut out = vec![0f32; n_rows * row_len];
            rows(&pool, &mut out, row_len, |first, chunk| {
                for (i, row) in chunk.chunks_exact_mut(row_len).enumerate() {
                    for v in row.iter_mut() {
                        *v += (first + i) as f32 + 1.0;
                    }
                }
            });
            for (i, row) in out.chunks_exact(row_len).enumerate() {
                assert!(
                    row.iter().all(|&v| v == i as f32 + 1.0),
                    "rows {n_rows}x{row_len}: row {i}"
                );
            }
        }
    }
}
