//! Matmul kernel choices both backends make by the same rule: where decode ends, the q4_k
//! decode matvec's shape, and the integer-dot-product matvec's rows and columns per workgroup
//! and quantised input. Which kernel a node takes past these rules (prefill kernels,
//! cooperative matrices, the float matvecs) each backend decides itself.

use crate::launch::div_up;

/// Steps of fewer input rows are decode: a matmul over them takes a matrix-vector kernel (the
/// Vulkan backend keeps its float and q4_k ones up to 64 rows), and prefill's kernels start
/// here.
pub const DECODE_ROWS: usize = 16;

/// Workgroups the integer-dot-product matvec aims for when choosing its weight rows per
/// workgroup ([`dot_columns`]).
pub const DOT_MIN_GROUPS: usize = 1024;

/// The q4_k decode matvec's shape (the Vulkan backend's `matvec_q4k`, the wgpu backend's
/// `matvec_q4k_rows`) for `n` output columns of `blocks` q4_k super-blocks each: (NR, W). A
/// workgroup of W lane groups of 32 covers 4 NR columns; the W groups split each row's blocks.
/// - NR (columns per lane group, sharing each load of the input): 1 below 2048 columns (1B's
///   1152 rows still make 288 workgroups), 2 below 16384, else 4.
/// - W: the fewest block trips per invocation with W <= 8 that keep >= 90% of the invocations
///   busy (10 blocks: W = 5, two trips; 27: W = 7, four trips; 40: W = 8, five).
pub fn q4k_matvec_shape(n: usize, blocks: usize) -> (usize, usize) {
    let nr = if n < 2048 {
        1
    } else if n < 16384 {
        2
    } else {
        4
    };
    let b = blocks.max(1);
    let w = (1..=b)
        .map(|t| (b.div_ceil(t), t))
        .find(|&(w, t)| w <= 8 && 10 * b >= 9 * w * t)
        .map_or(1, |(w, _)| w);
    (nr, w)
}

/// The integer-dot-product matvec's input rows per workgroup (R) for `rows` input rows: the
/// rows themselves up to 2, else 4 up to 4, else 8.
pub fn dot_rows(rows: usize) -> usize {
    match rows {
        0..=2 => rows.max(1),
        3..=4 => 4,
        _ => 8,
    }
}

/// The integer-dot-product matvec's weight rows per workgroup for `n` of them over `slices`
/// slices of input rows: the most of 4, 2 and 1, up to `most`, that leave at least
/// [`DOT_MIN_GROUPS`] workgroups (1 where none does). Each backend says how many its kernel
/// takes at the R it runs (`most`).
pub fn dot_columns(n: usize, slices: usize, most: usize) -> usize {
    if most >= 4 && div_up(n, 4) as usize * slices >= DOT_MIN_GROUPS {
        4
    } else if most >= 2 && div_up(n, 2) as usize * slices >= DOT_MIN_GROUPS {
        2
    } else {
        1
    }
}

/// Bytes of the integer-dot-product matvec's quantised input of `rows` x `k`: 80 per 32
/// elements at 16 bits (`wide`: two byte planes), 48 at 8.
pub fn dot_input_bytes(rows: usize, k: usize, wide: bool) -> u64 {
    (rows * (k / 32) * if wide { 80 } else { 48 }) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4k_matvec_shapes_keep_invocations_busy() {
        // (rows, blocks) -> (NR, W): Gemma 3 4B (k = 2048, 2560, 10240), 1B's and 27B's FFN down.
        assert_eq!(q4k_matvec_shape(2560, 8), (2, 8));
        assert_eq!(q4k_matvec_shape(4096, 10), (2, 5));
        assert_eq!(q4k_matvec_shape(20480, 10), (4, 5));
        assert_eq!(q4k_matvec_shape(2560, 40), (2, 8));
        assert_eq!(q4k_matvec_shape(1152, 27), (1, 7));
        assert_eq!(q4k_matvec_shape(5376, 84), (2, 8));
        assert_eq!(q4k_matvec_shape(37, 1), (1, 1));
        assert_eq!(q4k_matvec_shape(37, 9), (1, 5));
        for b in 1..200 {
            let (_, w) = q4k_matvec_shape(1, b);
            let t = b.div_ceil(w);
            assert!((1..=8).contains(&w) && 10 * b >= 9 * w * t, "{b} blocks: {w}");
        }
    }

    #[test]
    fn dot_shapes_keep_a_thousand_workgroups_where_they_can() {
        assert_eq!([1, 2, 3, 4, 5, 8, 15].map(dot_rows), [1, 2, 4, 4, 8, 8, 8]);
        // One row of 1B's 1152 columns: one column per workgroup.
        assert_eq!(dot_columns(1152, 1, 4), 1);
        // 4B's 2560 columns: two at one row; at 8 rows (one slice) as many as allowed.
        assert_eq!(dot_columns(2560, 1, 4), 2);
        assert_eq!(dot_columns(8192, 1, 4), 4);
        assert_eq!(dot_columns(8192, 1, 2), 2);
        assert_eq!(dot_columns(8192, 1, 1), 1);
        assert_eq!(dot_input_bytes(2, 64, true), 2 * 2 * 80);
        assert_eq!(dot_input_bytes(2, 64, false), 2 * 2 * 48);
    }
}
