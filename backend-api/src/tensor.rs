//! Tensor descriptions and buffer handles.

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::BackendError;

/// The shape and storage type of a tensor. Shapes are row-major; the last dimension is the
/// innermost one, along which quantization blocks run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorDesc {
    /// Storage type of the elements.
    pub dtype: DType,
    /// Dimensions, outermost first. A scalar has an empty shape.
    pub shape: Vec<usize>,
}

impl TensorDesc {
    /// A description of `dtype` elements in `shape`.
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        TensorDesc {
            dtype,
            shape: shape.into(),
        }
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The number of bytes the tensor occupies, or an error when the innermost dimension is not
    /// a whole number of quantization blocks or the size overflows.
    pub fn byte_size(&self) -> Result<u64, BackendError> {
        let inner = self.shape.last().copied().unwrap_or(1);
        let row = self.dtype.row_bytes(inner).ok_or_else(|| {
            BackendError::invalid(format!(
                "tensor of shape {:?} in {}: the last dimension {inner} is not a multiple of the \
                 block size {}",
                self.shape,
                self.dtype,
                self.dtype.block_elems()
            ))
        })?;
        let outer: Option<usize> = self
            .shape
            .iter()
            .rev()
            .skip(1)
            .try_fold(1usize, |acc, &d| acc.checked_mul(d));
        outer
            .and_then(|o| o.checked_mul(row))
            .map(|b| b as u64)
            .ok_or_else(|| BackendError::invalid(format!("tensor of shape {:?} is too large", self.shape)))
    }
}

impl std::fmt::Display for TensorDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:?}", self.dtype, self.shape)
    }
}

/// A buffer owned by one backend. Ids are only meaningful to the backend that issued them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufferId(pub u64);

impl BufferId {
    /// A placeholder for ops built only to ask [`crate::ComputeBackend::supports`] before any
    /// buffer exists. Compiling a graph that names it fails.
    pub const UNBOUND: BufferId = BufferId(u64::MAX);
}

/// What a buffer is for; backends choose memory (device-local, host-visible) by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Usage {
    /// Model weights: written once after allocation, read by programs.
    Weight,
    /// A KV cache: written and read by programs, rarely by the host.
    KvCache,
    /// Activations crossing a program boundary: graph inputs and outputs the host (or the
    /// scheduler, between backends) reads and writes every step.
    Activation,
    /// Model weights a device reads from host memory rather than its own (the products of layers
    /// held on another unit, run here for prefill steps: the scheduler's op offload). Asked only
    /// of backends listing [`crate::HOST_WEIGHTS_FEATURE`] among their features, which place
    /// them in host memory outside the device's budget; another backend treats them as
    /// [`Usage::Weight`].
    HostWeight,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(TensorDesc::new(DType::F32, [2, 3]).byte_size().unwrap(), 24);
        assert_eq!(TensorDesc::new(DType::Q8_0, [3, 64]).byte_size().unwrap(), 3 * 68);
        assert_eq!(TensorDesc::new(DType::F16, Vec::new()).byte_size().unwrap(), 2);
        let err = TensorDesc::new(DType::Q4K, [4, 100]).byte_size().unwrap_err();
        assert!(
            err.to_string().contains("not a multiple of the block size 256"),
            "{err}"
        );
        let huge = TensorDesc::new(DType::F32, [usize::MAX, 2, 2]);
        assert!(huge.byte_size().is_err());
    }
}
