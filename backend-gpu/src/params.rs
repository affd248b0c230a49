//! Parameter words both backends' kernels read the same way, whatever carries them (Vulkan
//! push constants, wgpu uniform slots): the norm kernels' weight format code, rope's inverse
//! frequencies, and a split matmul's output boundaries.

use tandem_backend_api::DType;

/// The weight formats of the norm kernels (`rms_norm`, `norm_add`, `norm_rope`).
pub const NORM_FORMATS: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

/// The norm kernels' weight format code: 0 f32, 1 f16, 2 bf16 (any other format is refused by
/// [`crate::support::op_support`] first).
pub fn norm_format(d: DType) -> u32 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        _ => 2,
    }
}

/// Rope's inverse frequencies for heads of `head_dim`: `1 / theta^(2d / head_dim)` for each of
/// the `head_dim / 2` pairs, which the backends place after the step arguments.
pub fn rope_inv_freq(head_dim: usize, theta: f32) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|d| 1.0 / theta.powf((2 * d) as f32 / head_dim as f32))
        .collect()
}

/// The end column of each of a matmul's first three output splits, of `n` columns in all (the
/// last split ends at `n`; splits past the ones given end there too).
pub fn split_ends(splits: &[usize], n: usize) -> [u32; 3] {
    let mut ends = [n as u32; 3];
    let mut acc = 0usize;
    for (s, width) in splits.iter().take(3).enumerate() {
        acc += width;
        ends[s] = acc as u32;
    }
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_codes_and_split_ends() {
        assert_eq!(NORM_FORMATS.map(norm_format), [0, 1, 2]);
        assert_eq!(split_ends(&[8], 8), [8, 8, 8]);
        assert_eq!(split_ends(&[4, 2, 2], 8), [4, 6, 8]);
        assert_eq!(split_ends(&[1, 1, 1, 5], 8), [1, 2, 3]);
    }

    #[test]
    fn rope_frequencies_fall_from_one() {
        let f = rope_inv_freq(8, 10_000.0);
        assert_eq!(f.len(), 4);
        assert_eq!(f[0], 1.0);
        assert!(f.windows(2).all(|w| w[1] < w[0]));
        assert!((f[2] - 0.01).abs() < 1e-6);
    }
}
