//! The geometry of one `Op::Attention` and of its KV caches, shared by the reference kernels
//! (`kernels::kv_append`, `kernels::attend`) and the fast attention (`attention`).

use tandem_backend_api::DType;

/// The geometry of one `Op::Attention`.
#[derive(Clone, Copy)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub capacity: usize,
    pub scale: f32,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
    pub cache_dtype: DType,
}

impl AttentionShape {
    pub(crate) fn kv_cols(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    pub(crate) fn elem(&self) -> usize {
        self.cache_dtype.block_bytes()
    }

    /// Byte offset of (slot, position) in a cache buffer.
    pub(crate) fn at(&self, slot: u32, pos: u32) -> usize {
        ((slot as usize * self.capacity) + (pos as usize % self.capacity)) * self.kv_cols() * self.elem()
    }
}
