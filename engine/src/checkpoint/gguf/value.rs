//! GGUF metadata values, written once for reading and writing: the value types with their GGUF
//! ids, names and smallest encodings ([`GgufValueType`]), the values ([`GgufValue`],
//! [`GgufArray`]) and how they are encoded. [`super::reader`] decodes them (checking every count
//! against the bytes left); [`super::writer`] encodes them.
//!
//! A value is encoded little-endian with no padding: numbers in their width, a `bool` as one byte
//! 0 or 1, a string as a `u64` byte length and UTF-8 bytes without a terminator, an array as a
//! `u32` element type, a `u64` length and the elements.

use std::fmt;

/// The type of a metadata value, with its GGUF id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    /// `u8` (id 0).
    U8,
    /// `i8` (id 1).
    I8,
    /// `u16` (id 2).
    U16,
    /// `i16` (id 3).
    I16,
    /// `u32` (id 4).
    U32,
    /// `i32` (id 5).
    I32,
    /// `f32` (id 6).
    F32,
    /// `bool`, one byte 0 or 1 (id 7).
    Bool,
    /// A UTF-8 string (id 8).
    String,
    /// An array of values of one type (id 9).
    Array,
    /// `u64` (id 10).
    U64,
    /// `i64` (id 11).
    I64,
    /// `f64` (id 12).
    F64,
}

impl GgufValueType {
    /// The type with GGUF id `id`, if there is one.
    pub const fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::U8,
            1 => Self::I8,
            2 => Self::U16,
            3 => Self::I16,
            4 => Self::U32,
            5 => Self::I32,
            6 => Self::F32,
            7 => Self::Bool,
            8 => Self::String,
            9 => Self::Array,
            10 => Self::U64,
            11 => Self::I64,
            12 => Self::F64,
            _ => return None,
        })
    }

    /// The GGUF id of this type.
    pub const fn id(self) -> u32 {
        match self {
            Self::U8 => 0,
            Self::I8 => 1,
            Self::U16 => 2,
            Self::I16 => 3,
            Self::U32 => 4,
            Self::I32 => 5,
            Self::F32 => 6,
            Self::Bool => 7,
            Self::String => 8,
            Self::Array => 9,
            Self::U64 => 10,
            Self::I64 => 11,
            Self::F64 => 12,
        }
    }

    /// The lower-case name used in messages (`u32`, `string`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::U8 => "u8",
            Self::I8 => "i8",
            Self::U16 => "u16",
            Self::I16 => "i16",
            Self::U32 => "u32",
            Self::I32 => "i32",
            Self::F32 => "f32",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Array => "array",
            Self::U64 => "u64",
            Self::I64 => "i64",
            Self::F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type takes in a file (an empty string or array for
    /// those).
    pub(crate) const fn min_encoded_len(self) -> u64 {
        match self {
            Self::U8 | Self::I8 | Self::Bool => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 | Self::String => 8,
            Self::Array => 4 + 8,
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// A `u8`.
    U8(u8),
    /// An `i8`.
    I8(i8),
    /// A `u16`.
    U16(u16),
    /// An `i16`.
    I16(i16),
    /// A `u32`.
    U32(u32),
    /// An `i32`.
    I32(i32),
    /// An `f32`.
    F32(f32),
    /// A `bool`.
    Bool(bool),
    /// A string.
    String(String),
    /// An array.
    Array(GgufArray),
    /// A `u64`.
    U64(u64),
    /// An `i64`.
    I64(i64),
    /// An `f64`.
    F64(f64),
}

impl GgufValue {
    /// The value's type.
    pub fn value_type(&self) -> GgufValueType {
        match self {
            Self::U8(_) => GgufValueType::U8,
            Self::I8(_) => GgufValueType::I8,
            Self::U16(_) => GgufValueType::U16,
            Self::I16(_) => GgufValueType::I16,
            Self::U32(_) => GgufValueType::U32,
            Self::I32(_) => GgufValueType::I32,
            Self::F32(_) => GgufValueType::F32,
            Self::Bool(_) => GgufValueType::Bool,
            Self::String(_) => GgufValueType::String,
            Self::Array(_) => GgufValueType::Array,
            Self::U64(_) => GgufValueType::U64,
            Self::I64(_) => GgufValueType::I64,
            Self::F64(_) => GgufValueType::F64,
        }
    }

    /// The type as messages name it: `u32`, `string`, `array of f32`, `array of array of u8`.
    pub fn type_description(&self) -> String {
        match self {
            Self::Array(a) => a.type_description(),
            other => other.value_type().name().to_owned(),
        }
    }
}

/// A metadata array: elements of one type, stored unboxed.
///
/// Arrays of arrays follow the GGUF specification (each element a full array with its own element
/// type and count); gguf-py reads them, ggml's C reader does not.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements.
    String(Vec<String>),
    /// Array elements (each may have its own element type).
    Array(Vec<GgufArray>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl GgufArray {
    /// The type of the elements.
    pub fn element_type(&self) -> GgufValueType {
        match self {
            Self::U8(_) => GgufValueType::U8,
            Self::I8(_) => GgufValueType::I8,
            Self::U16(_) => GgufValueType::U16,
            Self::I16(_) => GgufValueType::I16,
            Self::U32(_) => GgufValueType::U32,
            Self::I32(_) => GgufValueType::I32,
            Self::F32(_) => GgufValueType::F32,
            Self::Bool(_) => GgufValueType::Bool,
            Self::String(_) => GgufValueType::String,
            Self::Array(_) => GgufValueType::Array,
            Self::U64(_) => GgufValueType::U64,
            Self::I64(_) => GgufValueType::I64,
            Self::F64(_) => GgufValueType::F64,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Self::U8(v) => v.len(),
            Self::I8(v) => v.len(),
            Self::U16(v) => v.len(),
            Self::I16(v) => v.len(),
            Self::U32(v) => v.len(),
            Self::I32(v) => v.len(),
            Self::F32(v) => v.len(),
            Self::Bool(v) => v.len(),
            Self::String(v) => v.len(),
            Self::Array(v) => v.len(),
            Self::U64(v) => v.len(),
            Self::I64(v) => v.len(),
            Self::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `array of <element type>`, as messages name it (the inner arrays of an array of arrays
    /// are described by the first one).
    pub fn type_description(&self) -> String {
        match self {
            Self::Array(inner) => match inner.first() {
                Some(first) => format!("array of {}", first.type_description()),
                None => "array of array".to_owned(),
            },
            other => format!("array of {}", other.element_type()),
        }
    }
}

macro_rules! meta_from {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl From<$t> for GgufValue {
            fn from(v: $t) -> Self {
                GgufValue::$variant(v)
            }
        }
        impl From<Vec<$t>> for GgufValue {
            fn from(v: Vec<$t>) -> Self {
                GgufValue::Array(GgufArray::$variant(v))
            }
        }
    )*};
}

meta_from!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32, bool => Bool,
    String => String, u64 => U64, i64 => I64, f64 => F64,
);

impl From<&str> for GgufValue {
    fn from(v: &str) -> Self {
        GgufValue::String(v.to_owned())
    }
}

impl From<GgufArray> for GgufValue {
    fn from(v: GgufArray) -> Self {
        GgufValue::Array(v)
    }
}

impl GgufValue {
    /// Appends the value's encoding (not its type id) to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::U8(v) => out.push(*v),
            Self::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::Bool(v) => out.push(u8::from(*v)),
            Self::String(v) => encode_string(v, out),
            Self::Array(v) => v.encode(out),
            Self::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
}

impl GgufArray {
    /// Appends the array's encoding to `out`: element type, count, elements.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.element_type().id().to_le_bytes());
        out.extend_from_slice(&(self.len() as u64).to_le_bytes());
        fn each<T: Copy>(out: &mut Vec<u8>, items: &[T], f: impl Fn(T, &mut Vec<u8>)) {
            items.iter().for_each(|&v| f(v, out));
        }
        match self {
            Self::U8(v) => out.extend_from_slice(v),
            Self::I8(v) => each(out, v, |x, o| o.extend_from_slice(&x.to_le_bytes())),
            Self::U16(v) => each(out, v, |x, o| o.extend_from_slice(&x.to_le_bytes())),
            Self::I16(v) => each(out, v, |x, o| o.extend_from_slice(&x.to_le_bytes())),
            Self::U32(v) => each(out, v, |x, o| o.extend_from_slice(&x.to_le_bytes())),
            Self::I32(v) => each(out, v, |x, o| o.extend_from_slice(&x.to_le_bytes())),
            Self::F32(v) => each(out, v, |x, o| o.extend_from_slice(&x.to_le_bytes())),
            Self::Bool(v) => each(out, v, |x, o| o.push(u8::from(x))),
            Self::String(v) => v.iter().for_each(|s| encode_string(s, out)),
            Self::Array(v) => v.iter().for_each(|a| a.encode(out)),
            Self::U64(v) => each(out, v, |x, o| o.extend_from_slice(&x.to_le_bytes())),
            Self::I64(v) => each(out, v, |x, o| o.extend_from_slice(&x.to_le_bytes())),
            Self::F64(v) => each(out, v, |x, o| o.extend_from_slice(&x.to_le_bytes())),
        }
    }
}

/// Appends a string's encoding to `out`: its `u64` byte length, then its bytes.
pub(crate) fn encode_string(s: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}
