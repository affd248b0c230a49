//! Storage data types: floating point and llama.cpp's block-quantized formats.

use serde::{Deserialize, Serialize};

use crate::block::{self, BlockLayout};

/// How the elements of a tensor are stored.
///
/// Activations inside a graph are always `F32`; weights and the KV cache may use any type a
/// backend supports. Block-quantized types store `block_elems()` elements in `block_bytes()`
/// bytes, blocks running along the last (innermost) dimension, with the same bit layout as
/// ggml (llama.cpp), so GGUF tensors can be uploaded as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (the upper half of a binary32).
    Bf16,
    /// 32 elements: f16 scale, 32 x 4-bit values (offset 8).
    Q4_0,
    /// 32 elements: f16 scale and min, 32 x 4-bit values.
    Q4_1,
    /// 32 elements: f16 scale, 32 x 5-bit values (offset 16).
    Q5_0,
    /// 32 elements: f16 scale and min, 32 x 5-bit values.
    Q5_1,
    /// 32 elements: f16 scale, 32 x int8.
    Q8_0,
    /// 256-element super-block, 2-bit values with 4-bit scales and mins.
    Q2K,
    /// 256-element super-block, 3-bit values with 6-bit scales.
    Q3K,
    /// 256-element super-block, 4-bit values with 6-bit scales and mins.
    Q4K,
    /// 256-element super-block, 5-bit values with 6-bit scales and mins.
    Q5K,
    /// 256-element super-block, 6-bit values with 8-bit scales.
    Q6K,
}

impl DType {
    /// Every data type, in declaration order.
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F16,
        DType::Bf16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ];

    /// The storage block's layout: values, bytes and fields ([`crate::block`], the one
    /// definition).
    pub const fn layout(self) -> BlockLayout {
        match self {
            DType::F32 => block::fp32::LAYOUT,
            DType::F16 => block::fp16::LAYOUT,
            DType::Bf16 => block::bf16::LAYOUT,
            DType::Q4_0 => block::q4_0::LAYOUT,
            DType::Q4_1 => block::q4_1::LAYOUT,
            DType::Q5_0 => block::q5_0::LAYOUT,
            DType::Q5_1 => block::q5_1::LAYOUT,
            DType::Q8_0 => block::q8_0::LAYOUT,
            DType::Q2K => block::q2_k::LAYOUT,
            DType::Q3K => block::q3_k::LAYOUT,
            DType::Q4K => block::q4_k::LAYOUT,
            DType::Q5K => block::q5_k::LAYOUT,
            DType::Q6K => block::q6_k::LAYOUT,
        }
    }

    /// Elements per storage block (1 for the floating-point types).
    pub const fn block_elems(self) -> usize {
        self.layout().elems
    }

    /// Bytes per storage block.
    pub const fn block_bytes(self) -> usize {
        self.layout().bytes
    }

    /// Whether this is a block-quantized type.
    pub const fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// The lower-case name used in configs, messages and JSON (`f32`, `q4_k`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q2K => "q2_k",
            DType::Q3K => "q3_k",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
        }
    }

    /// Parses a name as printed by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes needed for one row of `elems` elements, or `None` when `elems` is not a whole
    /// number of blocks.
    pub const fn row_bytes(self, elems: usize) -> Option<usize> {
        if !elems.is_multiple_of(self.block_elems()) {
            return None;
        }
        Some(elems / self.block_elems() * self.block_bytes())
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_name("q4_km"), None);
    }

    #[test]
    fn row_bytes_follow_ggml_block_sizes() {
        assert_eq!(DType::F32.row_bytes(3), Some(12));
        assert_eq!(DType::Bf16.row_bytes(5), Some(10));
        assert_eq!(DType::Q8_0.row_bytes(64), Some(68));
        assert_eq!(DType::Q8_0.row_bytes(48), None);
        assert_eq!(DType::Q4K.row_bytes(640), None);
        assert_eq!(DType::Q4K.row_bytes(512), Some(288));
        assert_eq!(DType::Q6K.row_bytes(256), Some(210));
        assert!(DType::Q5_1.is_quantized());
        assert!(!DType::F16.is_quantized());
    }

    #[test]
    fn layouts_are_the_block_table_in_order() {
        for (d, layout) in DType::ALL.into_iter().zip(block::ALL) {
            assert_eq!(d.layout(), layout, "{d}");
            assert_eq!(layout.name, d.name());
            assert_eq!(layout.is_quantized(), d.is_quantized(), "{d}");
        }
    }
}
