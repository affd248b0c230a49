//! How a matmul's product lies in its scratch ([`Layout`]: column-major from the reference loops
//! and the fast matrix-vector products, row-major panels from the prefill product) and its copy
//! into the row-major outputs ([`scatter`]). Plain data shared by the reference kernels
//! (`kernels`), the fast ones (`fast`) and the row-parallel copy (`par::scatter`).

/// How a matmul's product lies in its scratch (`n` columns, one per weight row, by `rows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Column-major: row `r` of column `j` at `j * rows + r`.
    Columns,
    /// Panels of `width` columns side by side, each row-major: panel `c` (columns
    /// `c * width..`, the last one narrower where `n` is not a multiple of `width`) starts at
    /// `c * width * rows` and holds row `r` at `r * its_width`.
    Panels {
        /// Columns per panel.
        width: usize,
        /// Columns in all.
        n: usize,
    },
}

impl Layout {
    /// Copies row `r`'s values of columns `j0..j0 + out.len()` into `out` (row by row, the
    /// writes are contiguous; column-major reads stay within a few cache lines per column from
    /// one row to the next).
    pub fn copy_row(self, scratch: &[f32], rows: usize, r: usize, j0: usize, out: &mut [f32]) {
        match self {
            Layout::Columns => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = scratch[(j0 + i) * rows + r];
                }
            }
            Layout::Panels { width, n } => {
                let (mut j, mut o) = (j0, 0);
                while o < out.len() {
                    let start = j / width * width;
                    let wc = width.min(n - start);
                    let take = (start + wc - j).min(out.len() - o);
                    let at = start * rows + r * wc + (j - start);
                    out[o..o + take].copy_from_slice(&scratch[at..at + take]);
                    j += take;
                    o += take;
                }
            }
        }
    }
}

/// Copies columns `j0..j0 + out.len() / rows` of the product in `scratch` (laid out as
/// `layout` says) into the row-major `out`; returns the next column.
pub fn scatter(scratch: &[f32], layout: Layout, rows: usize, j0: usize, out: &mut [f32]) -> usize {
    let cols = out.len() / rows.max(1);
    if cols == 0 {
        return j0;
    }
    for (r, orow) in out.chunks_exact_mut(cols).enumerate() {
        layout.copy_row(scratch, rows, r, j0, orow);
    }
    j0 + cols
}
