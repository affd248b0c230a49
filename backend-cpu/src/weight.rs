//! A 2-D weight as the kernels read it: the stored bytes, their format and shape, and rows
//! decoded to f32 on demand. Shared by the reference kernels and the fast ones.

use tandem_backend_api::DType;

use crate::convert::decode_row;

/// A 2-D weight stored as `dtype`: `n` rows of `k` elements.
#[derive(Clone, Copy)]
pub struct WeightView<'a> {
    pub bytes: &'a [u8],
    pub dtype: DType,
    pub n: usize,
    pub k: usize,
}

impl WeightView<'_> {
    fn row_bytes(&self) -> usize {
        // Checked at compile: k is a whole number of blocks.
        self.dtype.row_bytes(self.k).unwrap_or(0)
    }

    /// Row `i` decoded into `out` (`k` elements).
    pub fn decode(&self, i: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        decode_row(self.dtype, &self.bytes[i * rb..(i + 1) * rb], out);
    }

    /// Row `i` as f32 without copying, when stored as f32 and aligned.
    pub(crate) fn f32_row(&self, i: usize) -> Option<&[f32]> {
        if self.dtype != DType::F32 {
            return None;
        }
        let rb = self.row_bytes();
        bytemuck::try_cast_slice(&self.bytes[i * rb..(i + 1) * rb]).ok()
    }
}
