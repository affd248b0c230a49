//! The one definition of every storage format's block: values per block, and the byte layout
//! (offset and size of each field) of ggml's block formats (llama.cpp's `block_q4_0` ...
//! `block_q6_K` in `ggml/src/ggml-common.h`), the floating-point types as blocks of one value.
//!
//! Everything that reads or writes blocks takes its sizes and offsets from here:
//! [`DType::block_elems`](crate::DType::block_elems) and
//! [`DType::block_bytes`](crate::DType::block_bytes), the decoders of [`kit::quant`](crate::kit::quant),
//! the engine's encoders, and the Vulkan kernels, whose build script writes [`BlockLayout::constants`]
//! as `#define`s ahead of `common.glsl`. The WGSL decoders (`shaders/wgsl/formats/`,
//! `shaders/wgsl/dot/`) declare the same constants by hand, and a test checks them against these.
//!
//! A layout's fields follow each other with no gaps, in storage order, and its size is where
//! the last one ends: [`BlockLayout::new`] refuses anything else at compile time.
//!
//! This file names nothing else of the crate: the Vulkan backend's build script compiles it on
//! its own (`#[path]`), so it must stay self-contained.

/// One field of a block: `len` bytes from byte `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// ggml's name of the field (`d`, `m`, `dmin`, `scales`, `hmask`, `qh`, `ql`, `qs`; `v` for
    /// the single value of a floating-point type).
    pub name: &'static str,
    /// Its first byte within the block.
    pub at: usize,
    /// Its size in bytes.
    pub len: usize,
}

impl Field {
    /// The first field of a block.
    pub const fn first(name: &'static str, len: usize) -> Field {
        Field { name, at: 0, len }
    }

    /// The field of `len` bytes right after this one.
    pub const fn then(self, name: &'static str, len: usize) -> Field {
        Field {
            name,
            at: self.end(),
            len,
        }
    }

    /// One past its last byte.
    pub const fn end(self) -> usize {
        self.at + self.len
    }

    /// Its bytes within the block, as a range.
    pub const fn range(self) -> std::ops::Range<usize> {
        self.at..self.end()
    }
}

/// One storage block: `elems` values in `bytes` bytes, made of `fields`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    /// The format's lower-case name, as [`DType::name`](crate::DType::name) prints it.
    pub name: &'static str,
    /// Values per block.
    pub elems: usize,
    /// Bytes per block: the end of the last field.
    pub bytes: usize,
    /// The fields in storage order, with no gaps.
    pub fields: &'static [Field],
}

impl BlockLayout {
    /// A layout of `fields`, which must start at byte 0 and follow each other with no gaps
    /// (checked: a const evaluation that panics fails the build).
    pub const fn new(name: &'static str, elems: usize, fields: &'static [Field]) -> BlockLayout {
        assert!(!fields.is_empty(), "a block has fields");
        let mut at = 0;
        let mut i = 0;
        while i < fields.len() {
            assert!(fields[i].at == at, "fields follow each other with no gaps");
            assert!(fields[i].len > 0, "fields are not empty");
            at = fields[i].end();
            i += 1;
        }
        BlockLayout {
            name,
            elems,
            bytes: at,
            fields,
        }
    }

    /// The field called `name`, if the block has one.
    pub fn field(&self, name: &str) -> Option<Field> {
        self.fields.iter().copied().find(|f| f.name == name)
    }

    /// Whether this is a block of several values (the quantized formats).
    pub const fn is_quantized(&self) -> bool {
        self.elems > 1
    }

    /// The layout as named integer constants, for shaders: `<NAME>_ELEMS`, `<NAME>_BYTES`, and
    /// for each field `<NAME>_<FIELD>`, its byte offset, with the names in upper case
    /// (`Q4_K_ELEMS 256`, `Q4_K_BYTES 144`, `Q4_K_D 0`, `Q4_K_DMIN 2`, `Q4_K_SCALES 4`,
    /// `Q4_K_QS 16`).
    pub fn constants(&self) -> Vec<(String, usize)> {
        let prefix = self.name.to_uppercase();
        let mut out = vec![
            (format!("{prefix}_ELEMS"), self.elems),
            (format!("{prefix}_BYTES"), self.bytes),
        ];
        out.extend(
            self.fields
                .iter()
                .map(|f| (format!("{prefix}_{}", f.name.to_uppercase()), f.at)),
        );
        out
    }
}

/// Every layout, in [`DType::ALL`](crate::DType::ALL)'s order.
pub const ALL: [BlockLayout; 13] = [
    fp32::LAYOUT,
    fp16::LAYOUT,
    bf16::LAYOUT,
    q4_0::LAYOUT,
    q4_1::LAYOUT,
    q5_0::LAYOUT,
    q5_1::LAYOUT,
    q8_0::LAYOUT,
    q2_k::LAYOUT,
    q3_k::LAYOUT,
    q4_k::LAYOUT,
    q5_k::LAYOUT,
    q6_k::LAYOUT,
];

/// `f32`: one IEEE binary32 value (`fp32`: the module may not shadow the primitive type).
pub mod fp32 {
    use super::{BlockLayout, Field};
    /// The value.
    pub const V: Field = Field::first("v", 4);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("f32", 1, &[V]);
}

/// `f16`: one IEEE binary16 value (`fp16`, as `fp32`).
pub mod fp16 {
    use super::{BlockLayout, Field};
    /// The value.
    pub const V: Field = Field::first("v", 2);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("f16", 1, &[V]);
}

/// `bf16`: one bfloat16 value (the upper half of a binary32).
pub mod bf16 {
    use super::{BlockLayout, Field};
    /// The value.
    pub const V: Field = Field::first("v", 2);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("bf16", 1, &[V]);
}

/// `q4_0`: 32 values, `(q - 8) * d`.
pub mod q4_0 {
    use super::{BlockLayout, Field};
    /// The scale (f16).
    pub const D: Field = Field::first("d", 2);
    /// 16 bytes of 4-bit codes: value `j` in the low nibble of byte `j`, value `j + 16` in the
    /// high one.
    pub const QS: Field = D.then("qs", 16);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("q4_0", 32, &[D, QS]);
    /// Values per block.
    pub const ELEMS: usize = LAYOUT.elems;
    /// Bytes per block.
    pub const BYTES: usize = LAYOUT.bytes;
}

/// `q4_1`: 32 values, `q * d + m`.
pub mod q4_1 {
    use super::{BlockLayout, Field};
    /// The scale (f16).
    pub const D: Field = Field::first("d", 2);
    /// The min (f16).
    pub const M: Field = D.then("m", 2);
    /// 16 bytes of 4-bit codes, as `q4_0`'s.
    pub const QS: Field = M.then("qs", 16);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("q4_1", 32, &[D, M, QS]);
    /// Values per block.
    pub const ELEMS: usize = LAYOUT.elems;
    /// Bytes per block.
    pub const BYTES: usize = LAYOUT.bytes;
}

/// `q5_0`: 32 values, `(q - 16) * d`.
pub mod q5_0 {
    use super::{BlockLayout, Field};
    /// The scale (f16).
    pub const D: Field = Field::first("d", 2);
    /// The fifth bits, a little-endian `u32`: bit `j` is bit 4 of value `j`.
    pub const QH: Field = D.then("qh", 4);
    /// 16 bytes of low 4 bits, as `q4_0`'s codes.
    pub const QS: Field = QH.then("qs", 16);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("q5_0", 32, &[D, QH, QS]);
    /// Values per block.
    pub const ELEMS: usize = LAYOUT.elems;
    /// Bytes per block.
    pub const BYTES: usize = LAYOUT.bytes;
}

/// `q5_1`: 32 values, `q * d + m`.
pub mod q5_1 {
    use super::{BlockLayout, Field};
    /// The scale (f16).
    pub const D: Field = Field::first("d", 2);
    /// The min (f16).
    pub const M: Field = D.then("m", 2);
    /// The fifth bits, as `q5_0`'s.
    pub const QH: Field = M.then("qh", 4);
    /// 16 bytes of low 4 bits, as `q4_0`'s codes.
    pub const QS: Field = QH.then("qs", 16);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("q5_1", 32, &[D, M, QH, QS]);
    /// Values per block.
    pub const ELEMS: usize = LAYOUT.elems;
    /// Bytes per block.
    pub const BYTES: usize = LAYOUT.bytes;
}

/// `q8_0`: 32 values, `q * d`.
pub mod q8_0 {
    use super::{BlockLayout, Field};
    /// The scale (f16).
    pub const D: Field = Field::first("d", 2);
    /// 32 signed bytes.
    pub const QS: Field = D.then("qs", 32);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("q8_0", 32, &[D, QS]);
    /// Values per block.
    pub const ELEMS: usize = LAYOUT.elems;
    /// Bytes per block.
    pub const BYTES: usize = LAYOUT.bytes;
}

/// `q2_k`: a super-block of 256 values in 16 sub-blocks of 16, `d * scale * q - dmin * min`.
pub mod q2_k {
    use super::{BlockLayout, Field};
    /// 16 bytes, one per sub-block: the scale in the low nibble, the min in the high one.
    pub const SCALES: Field = Field::first("scales", 16);
    /// 64 bytes of 2-bit codes.
    pub const QS: Field = SCALES.then("qs", 64);
    /// The super-block scale (f16).
    pub const D: Field = QS.then("d", 2);
    /// The super-block scale of the mins (f16).
    pub const DMIN: Field = D.then("dmin", 2);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("q2_k", 256, &[SCALES, QS, D, DMIN]);
    /// Values per block.
    pub const ELEMS: usize = LAYOUT.elems;
    /// Bytes per block.
    pub const BYTES: usize = LAYOUT.bytes;
}

/// `q3_k`: a super-block of 256 values in 16 sub-blocks of 16, `d * scale * q`.
pub mod q3_k {
    use super::{BlockLayout, Field};
    /// 32 bytes of high bits (a clear bit subtracts 4).
    pub const HMASK: Field = Field::first("hmask", 32);
    /// 64 bytes of low 2-bit codes.
    pub const QS: Field = HMASK.then("qs", 64);
    /// 12 bytes packing 16 6-bit scales.
    pub const SCALES: Field = QS.then("scales", 12);
    /// The super-block scale (f16).
    pub const D: Field = SCALES.then("d", 2);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("q3_k", 256, &[HMASK, QS, SCALES, D]);
    /// Values per block.
    pub const ELEMS: usize = LAYOUT.elems;
    /// Bytes per block.
    pub const BYTES: usize = LAYOUT.bytes;
}

/// `q4_k`: a super-block of 256 values in 8 sub-blocks of 32, `d * scale * q - dmin * min`.
pub mod q4_k {
    use super::{BlockLayout, Field};
    /// The super-block scale (f16).
    pub const D: Field = Field::first("d", 2);
    /// The super-block scale of the mins (f16).
    pub const DMIN: Field = D.then("dmin", 2);
    /// 12 bytes packing 8 6-bit scales and 8 6-bit mins.
    pub const SCALES: Field = DMIN.then("scales", 12);
    /// 128 bytes of 4-bit codes: 32 bytes per 64 values, the first 32 in the low nibbles.
    pub const QS: Field = SCALES.then("qs", 128);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("q4_k", 256, &[D, DMIN, SCALES, QS]);
    /// Values per block.
    pub const ELEMS: usize = LAYOUT.elems;
    /// Bytes per block.
    pub const BYTES: usize = LAYOUT.bytes;
}

/// `q5_k`: a super-block of 256 values in 8 sub-blocks of 32, `d * scale * q - dmin * min`.
pub mod q5_k {
    use super::{BlockLayout, Field};
    /// The super-block scale (f16).
    pub const D: Field = Field::first("d", 2);
    /// The super-block scale of the mins (f16).
    pub const DMIN: Field = D.then("dmin", 2);
    /// 12 bytes of scales and mins, as `q4_k`'s.
    pub const SCALES: Field = DMIN.then("scales", 12);
    /// 32 bytes of fifth bits: bit `s` of byte `l` belongs to value `32 s + l`.
    pub const QH: Field = SCALES.then("qh", 32);
    /// 128 bytes of low 4 bits, as `q4_k`'s codes.
    pub const QS: Field = QH.then("qs", 128);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("q5_k", 256, &[D, DMIN, SCALES, QH, QS]);
    /// Values per block.
    pub const ELEMS: usize = LAYOUT.elems;
    /// Bytes per block.
    pub const BYTES: usize = LAYOUT.bytes;
}

/// `q6_k`: a super-block of 256 values in 16 sub-blocks of 16, `d * scale * (q - 32)`.
pub mod q6_k {
    use super::{BlockLayout, Field};
    /// 128 bytes of low 4 bits (64 per half of 128 values).
    pub const QL: Field = Field::first("ql", 128);
    /// 64 bytes of high 2-bit pairs (32 per half).
    pub const QH: Field = QL.then("qh", 64);
    /// 16 signed 8-bit scales, one per sub-block.
    pub const SCALES: Field = QH.then("scales", 16);
    /// The super-block scale (f16).
    pub const D: Field = SCALES.then("d", 2);
    /// The whole block.
    pub const LAYOUT: BlockLayout = BlockLayout::new("q6_k", 256, &[QL, QH, SCALES, D]);
    /// Values per block.
    pub const ELEMS: usize = LAYOUT.elems;
    /// Bytes per block.
    pub const BYTES: usize = LAYOUT.bytes;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's `static_assert`s on its block structs (`ggml-common.h`), written out once more on
    /// purpose: the table above must not drift from them.
    #[test]
    fn sizes_are_ggml_s() {
        let want = [
            ("f32", 1, 4),
            ("f16", 1, 2),
            ("bf16", 1, 2),
            ("q4_0", 32, 18),
            ("q4_1", 32, 20),
            ("q5_0", 32, 22),
            ("q5_1", 32, 24),
            ("q8_0", 32, 34),
            ("q2_k", 256, 84),
            ("q3_k", 256, 110),
            ("q4_k", 256, 144),
            ("q5_k", 256, 176),
            ("q6_k", 256, 210),
        ];
        for (layout, (name, elems, bytes)) in ALL.iter().zip(want) {
            assert_eq!((layout.name, layout.elems, layout.bytes), (name, elems, bytes));
        }
    }

    #[test]
    fn constants_name_every_field() {
        let c = q4_k::LAYOUT.constants();
        let want = [
            ("Q4_K_ELEMS", 256),
            ("Q4_K_BYTES", 144),
            ("Q4_K_D", 0),
            ("Q4_K_DMIN", 2),
            ("Q4_K_SCALES", 4),
            ("Q4_K_QS", 16),
        ];
        assert_eq!(c.len(), want.len());
        for ((name, v), (wn, wv)) in c.iter().zip(want) {
            assert_eq!((name.as_str(), *v), (wn, wv));
        }
        assert_eq!(q6_k::LAYOUT.field("scales"), Some(q6_k::SCALES));
        assert_eq!(q6_k::SCALES.range(), 192..208);
        assert_eq!(q6_k::LAYOUT.field("m"), None);
    }
}
