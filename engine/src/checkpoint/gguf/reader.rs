//! GGUF files (versions 2 and 3, little-endian), memory-mapped.
//!
//! A file is: the magic `GGUF`, the version (`u32`), the tensor count and the metadata count
//! (`u64` each), the metadata entries (key string, `u32` value type, value), one info record per
//! tensor (name string, `u32` dimension count, `u64` dimensions innermost first, `u32` ggml type,
//! `u64` offset into the data section), zero padding up to the alignment, then the data section.
//! Strings are a `u64` byte length and UTF-8 bytes; arrays are a `u32` element type, a `u64`
//! length and the elements. The alignment is the metadata value `general.alignment` (a `u32`
//! power of two) or 32. Version 3 only added big-endian files, which tandem does not read; for
//! little-endian files versions 2 and 3 are the same.
//!
//! [`GgufFile::open`] parses and checks everything up front: every count and length against the
//! bytes that remain (nothing is allocated from an untrusted count before that), every tensor's
//! type, shape, alignment and extent. A damaged file is a [`GgufError`] naming the file and the
//! key or tensor involved, never a panic. Tensor data stays in the map; [`GgufFile::tensor`] hands
//! out slices of it.

use std::collections::{btree_map, BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use tandem_backend_api::kit::quant::{dequantize_row, QuantError};
use tandem_backend_api::{DType, TensorDesc};

pub use super::value::{GgufArray, GgufValue, GgufValueType};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// The alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most this many dimensions (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays may nest this deep (the outermost array is level 1); deeper nesting is
/// refused rather than recursed into.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Smallest encodings, for checking counts against the bytes left: a metadata entry is a key
/// length (8), a value type (4) and at least one byte of value; a tensor info is a name length
/// (8), a dimension count (4), a type (4) and an offset (8).
const MIN_METADATA_ENTRY_BYTES: u64 = 8 + 4 + 1;
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// The storage type of ggml type id `id` (`enum ggml_type`), for the types tandem reads.
pub const fn dtype_from_ggml(id: u32) -> Option<DType> {
    let mut i = 0;
    while i < GGML_TYPES.len() {
        if GGML_TYPES[i].0 == id {
            return Some(GGML_TYPES[i].1);
        }
        i += 1;
    }
    None
}

/// ggml's type ids of the storage types tandem reads and writes (ggml.h's `ggml_type`), the one
/// table both the reader and the writer use.
pub const GGML_TYPES: [(u32, DType); 13] = [
    (0, DType::F32),
    (1, DType::F16),
    (2, DType::Q4_0),
    (3, DType::Q4_1),
    (6, DType::Q5_0),
    (7, DType::Q5_1),
    (8, DType::Q8_0),
    (10, DType::Q2K),
    (11, DType::Q3K),
    (12, DType::Q4K),
    (13, DType::Q5K),
    (14, DType::Q6K),
    (30, DType::Bf16),
];

/// ggml's name for type id `id`, for messages about types tandem does not read.
fn ggml_type_name(id: u32) -> &'static str {
    match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        4 | 5 => "a type ggml removed",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "not a ggml type tandem knows",
    }
}

/// Why a GGUF file could not be read, or a value or tensor could not be had from it.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read GGUF file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with `GGUF`.
    #[error(
        "{} is not a GGUF file: it starts with bytes {found:02x?}; expected the magic \"GGUF\"",
        path.display()
    )]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// Its first four bytes.
        found: [u8; 4],
    },
    /// The version is not 2 or 3.
    #[error(
        "GGUF file {} has version {version}; expected 2 or 3{}",
        path.display(),
        version_hint(*version)
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version read (little-endian).
        version: u32,
    },
    /// The file ends in the middle of something.
    #[error(
        "GGUF file {} ends inside {part}: {needed} bytes needed at offset {offset}, but the file \
         is {file_len} bytes long (truncated or corrupt)",
        path.display()
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What was being read (`the header`, `the value of metadata key ...`).
        part: String,
        /// Where it was being read.
        offset: u64,
        /// Bytes it needed.
        needed: u64,
        /// The file's length.
        file_len: u64,
    },
    /// A count (of tensors, metadata entries or array elements) cannot fit in the file.
    #[error(
        "GGUF file {} declares {count} {what}, which cannot fit in the {remaining} bytes left at \
         offset {offset} (each takes at least {min_bytes} bytes; the file is corrupt)",
        path.display()
    )]
    CountTooLarge {
        /// The file.
        path: PathBuf,
        /// What is counted (`tensor infos`, `elements in the array of metadata key ...`).
        what: String,
        /// The count read.
        count: u64,
        /// The fewest bytes one of them takes.
        min_bytes: u64,
        /// Where the counted items start.
        offset: u64,
        /// Bytes from there to the end of the file.
        remaining: u64,
    },
    /// A key, string value or tensor name is not UTF-8.
    #[error("GGUF file {}: {part} is not valid UTF-8", path.display())]
    InvalidUtf8 {
        /// The file.
        path: PathBuf,
        /// The string (`the value of metadata key ...`).
        part: String,
    },
    /// A metadata value (or array element) has a type id outside 0..=12.
    #[error(
        "GGUF file {}: metadata key `{key}` has value type id {type_id}; expected 0 to 12",
        path.display()
    )]
    UnknownValueType {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The type id read.
        type_id: u32,
    },
    /// A boolean is a byte other than 0 or 1.
    #[error(
        "GGUF file {}: metadata key `{key}` holds the bool byte {byte}; expected 0 or 1",
        path.display()
    )]
    InvalidBool {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The byte read.
        byte: u8,
    },
    /// Arrays of arrays nest deeper than [`MAX_ARRAY_DEPTH`].
    #[error(
        "GGUF file {}: metadata key `{key}` nests arrays more than {MAX_ARRAY_DEPTH} deep",
        path.display()
    )]
    ArrayTooDeep {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
    /// A metadata key appears twice.
    #[error("GGUF file {}: metadata key `{key}` appears twice", path.display())]
    DuplicateKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
    /// `general.alignment` is not a `u32` power of two.
    #[error(
        "GGUF file {}: `{ALIGNMENT_KEY}` is {found}; expected a u32 power of two",
        path.display()
    )]
    BadAlignment {
        /// The file.
        path: PathBuf,
        /// What it is instead (a value, or a type).
        found: String,
    },
    /// A tensor name appears twice.
    #[error("GGUF file {}: tensor `{tensor}` appears twice", path.display())]
    DuplicateTensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// A tensor has more than [`MAX_DIMS`] dimensions.
    #[error(
        "GGUF file {}: tensor `{tensor}` has {n_dims} dimensions; expected at most {MAX_DIMS}",
        path.display()
    )]
    TooManyDims {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dimension count read.
        n_dims: u32,
    },
    /// A tensor's ggml type is unknown or not one tandem reads.
    #[error(
        "GGUF file {}: tensor `{tensor}` has ggml type id {type_id} ({}); tandem reads f32 (0), \
         f16 (1), q4_0 (2), q4_1 (3), q5_0 (6), q5_1 (7), q8_0 (8), q2_k to q6_k (10 to 14) and \
         bf16 (30)",
        path.display(),
        ggml_type_name(*type_id)
    )]
    UnsupportedType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The type id read.
        type_id: u32,
    },
    /// A tensor's innermost dimension is not a whole number of blocks.
    #[error(
        "GGUF file {}: tensor `{tensor}` of type {dtype} has innermost dimension {inner}, which is \
         not a multiple of its block size {block}",
        path.display()
    )]
    PartialBlock {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its type.
        dtype: DType,
        /// Its innermost dimension (`ne[0]`).
        inner: u64,
        /// Elements per block of `dtype`.
        block: usize,
    },
    /// A tensor's dimensions overflow (in elements or bytes).
    #[error(
        "GGUF file {}: tensor `{tensor}` has dimensions {dims:?} (innermost first), too large to \
         address",
        path.display()
    )]
    TensorTooLarge {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dimensions as read, innermost first.
        dims: Vec<u64>,
    },
    /// A tensor's offset is not a multiple of the alignment.
    #[error(
        "GGUF file {}: tensor `{tensor}` has data offset {offset}, not a multiple of the alignment \
         {alignment}",
        path.display()
    )]
    MisalignedOffset {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its offset into the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's data runs past the end of the file.
    #[error(
        "GGUF file {}: tensor `{tensor}` needs {size} bytes at file offset {start}, past the end of \
         the file ({file_len} bytes; truncated or corrupt)",
        path.display()
    )]
    TensorPastEnd {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Where its data starts in the file (saturated if that overflows).
        start: u64,
        /// Its size in bytes.
        size: u64,
        /// The file's length.
        file_len: u64,
    },
    /// No tensor has this name.
    #[error("GGUF file {} has no tensor `{name}`", path.display())]
    TensorNotFound {
        /// The file.
        path: PathBuf,
        /// The name asked for.
        name: String,
    },
    /// No metadata value has this key.
    #[error("GGUF file {} has no metadata key `{key}`", path.display())]
    MissingKey {
        /// The file.
        path: PathBuf,
        /// The key asked for.
        key: String,
    },
    /// A metadata value has another type than the one asked for.
    #[error(
        "GGUF file {}: metadata key `{key}` is {found}; expected {expected}",
        path.display()
    )]
    WrongType {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The type asked for.
        expected: &'static str,
        /// The type found.
        found: String,
    },
    /// A tensor's data could not be decoded.
    #[error("GGUF file {}: cannot decode tensor `{tensor}`: {source}", path.display())]
    Decode {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Why.
        #[source]
        source: QuantError,
    },
}

/// A hint for versions that are 2 or 3 read big-endian, or GGUF v1.
fn version_hint(version: u32) -> &'static str {
    match version {
        1 => " (GGUF v1 is obsolete; convert the file again with a current llama.cpp)",
        v if matches!(v.swap_bytes(), 2 | 3) => {
            " (this looks like a big-endian GGUF file, which tandem does not read)"
        }
        _ => "",
    }
}

/// One tensor's record, checked against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    name: String,
    dims: Vec<usize>,
    dtype: DType,
    offset: u64,
    /// Where the data starts in the file.
    start: usize,
    byte_size: usize,
}

impl GgufTensorInfo {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dimensions in ggml order: `dims()[0]` (`ne[0]`) is the innermost, along which
    /// quantization blocks run.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The dimensions row-major, outermost first (the reverse of [`GgufTensorInfo::dims`]).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }

    /// The storage type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The row-major description: [`GgufTensorInfo::dtype`] and [`GgufTensorInfo::shape`].
    pub fn desc(&self) -> TensorDesc {
        TensorDesc::new(self.dtype, self.shape())
    }

    /// The number of elements (1 for a tensor without dimensions).
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// The offset of the data from the start of the data section, as the file states it.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The size of the data in bytes.
    pub fn byte_size(&self) -> usize {
        self.byte_size
    }
}

/// A tensor's data in the map, with its row-major description.
#[derive(Debug, Clone)]
pub struct GgufTensor<'a> {
    /// The tensor's record.
    pub info: &'a GgufTensorInfo,
    /// Its type and row-major shape (the last dimension innermost).
    pub desc: TensorDesc,
    /// Its bytes, exactly `info.byte_size()` of them, in ggml layout. They start at a multiple
    /// of the file's alignment from the start of the file (and the map is page-aligned), so with
    /// the default alignment of 32 they are aligned for any element type.
    pub bytes: &'a [u8],
    path: &'a Path,
}

impl GgufTensor<'_> {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// The values decoded to `f32` (ggml's reference dequantization), row-major.
    pub fn to_f32(&self) -> Result<Vec<f32>, GgufError> {
        let mut out = vec![0.0; self.desc.numel()];
        dequantize_row(self.desc.dtype, self.bytes, &mut out).map_err(|source| GgufError::Decode {
            path: self.path.to_path_buf(),
            tensor: self.info.name.clone(),
            source,
        })?;
        Ok(out)
    }
}

/// An open GGUF file: its metadata and tensor records, parsed and checked, and the map that
/// holds the tensor data.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

/// Getters for metadata scalars of one type.
macro_rules! scalar_getters {
    ($($name:ident: $variant:ident => $ty:ty, $type_name:literal;)*) => {$(
        #[doc = concat!("The `", $type_name, "` value of `key`; an error names the key when it is \
                         missing or of another type.")]
        pub fn $name(&self, key: &str) -> Result<$ty, GgufError> {
            match self.require(key)? {
                GgufValue::$variant(v) => Ok(*v),
                other => Err(self.wrong_type(key, $type_name, other)),
            }
        }
    )*};
}

/// Getters for metadata arrays of one element type.
macro_rules! array_getters {
    ($($name:ident: $variant:ident => $ty:ty, $type_name:literal;)*) => {$(
        #[doc = concat!("The elements of the `", $type_name, "` value of `key`; an error names the \
                         key when it is missing or of another type.")]
        pub fn $name(&self, key: &str) -> Result<&[$ty], GgufError> {
            match self.require(key)? {
                GgufValue::Array(GgufArray::$variant(v)) => Ok(v),
                other => Err(self.wrong_type(key, $type_name, other)),
            }
        }
    )*};
}

impl GgufFile {
    /// Maps `path` and parses and checks its header, metadata and tensor records.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let map = map_file(&file).map_err(io)?;
        let parsed = parse(path, &map)?;
        let by_name = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            by_name,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version, 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata value by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// The tensor records, in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`: its record, row-major description and bytes.
    pub fn tensor(&self, name: &str) -> Result<GgufTensor<'_>, GgufError> {
        let info = self
            .by_name
            .get(name)
            .and_then(|&i| self.tensors.get(i))
            .ok_or_else(|| GgufError::TensorNotFound {
                path: self.path.clone(),
                name: name.to_owned(),
            })?;
        // Checked against the map's length when the file was opened; `get` keeps even a broken
        // invariant from panicking.
        let bytes = info
            .start
            .checked_add(info.byte_size)
            .and_then(|end| self.map.get(info.start..end))
            .ok_or_else(|| GgufError::TensorPastEnd {
                path: self.path.clone(),
                tensor: info.name.clone(),
                start: info.start as u64,
                size: info.byte_size as u64,
                file_len: self.map.len() as u64,
            })?;
        Ok(GgufTensor {
            info,
            desc: info.desc(),
            bytes,
            path: &self.path,
        })
    }

    /// The data alignment: `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Gives back the mapped pages under `data` (a tensor's bytes from this file) once the
    /// caller has copied them ([`crate::checkpoint::source::WeightSource::release`]).
    pub fn release(&self, data: &[u8]) {
        crate::checkpoint::pages::release(&self.map, data);
    }

    /// Where the data section starts in the file (tensor offsets count from here).
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// The string value of `key`; an error names the key when it is missing or of another type.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            GgufValue::String(s) => Ok(s),
            other => Err(self.wrong_type(key, "string", other)),
        }
    }

    scalar_getters! {
        get_u8: U8 => u8, "u8";
        get_i8: I8 => i8, "i8";
        get_u16: U16 => u16, "u16";
        get_i16: I16 => i16, "i16";
        get_u32: U32 => u32, "u32";
        get_i32: I32 => i32, "i32";
        get_f32: F32 => f32, "f32";
        get_bool: Bool => bool, "bool";
        get_u64: U64 => u64, "u64";
        get_i64: I64 => i64, "i64";
        get_f64: F64 => f64, "f64";
    }

    /// The array value of `key`, of any element type; an error names the key when it is missing
    /// or not an array.
    pub fn get_array(&self, key: &str) -> Result<&GgufArray, GgufError> {
        match self.require(key)? {
            GgufValue::Array(a) => Ok(a),
            other => Err(self.wrong_type(key, "array", other)),
        }
    }

    array_getters! {
        get_u8_array: U8 => u8, "array of u8";
        get_i8_array: I8 => i8, "array of i8";
        get_u16_array: U16 => u16, "array of u16";
        get_i16_array: I16 => i16, "array of i16";
        get_u32_array: U32 => u32, "array of u32";
        get_i32_array: I32 => i32, "array of i32";
        get_f32_array: F32 => f32, "array of f32";
        get_bool_array: Bool => bool, "array of bool";
        get_str_array: String => String, "array of string";
        get_u64_array: U64 => u64, "array of u64";
        get_i64_array: I64 => i64, "array of i64";
        get_f64_array: F64 => f64, "array of f64";
    }

    fn require(&self, key: &str) -> Result<&GgufValue, GgufError> {
        self.metadata.get(key).ok_or_else(|| GgufError::MissingKey {
            path: self.path.clone(),
            key: key.to_owned(),
        })
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &GgufValue) -> GgufError {
        GgufError::WrongType {
            path: self.path.clone(),
            key: key.to_owned(),
            expected,
            found: found.type_description(),
        }
    }
}

/// Maps a whole file read-only.
fn map_file(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: `Mmap::map` is unsafe because the mapping aliases the file: if another process
    // truncates or rewrites the file while it is mapped, reads through the map may change under us
    // or fault (SIGBUS). Model files are treated as immutable while loaded; that is the assumption
    // here, as in every mmap-based loader (candle, safetensors, llama.cpp). Every offset read
    // through the map is bounds-checked against the map's length first.
    unsafe { Mmap::map(file) }
}

/// What [`parse`] finds.
struct Parsed {
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    alignment: u64,
    data_start: u64,
}

/// Which part of the file is being read, for messages.
enum Part<'k> {
    Header,
    Key(usize),
    Value(&'k str),
    TensorName(usize),
    TensorInfo(&'k str),
}

impl fmt::Display for Part<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Header => f.write_str("the header"),
            Part::Key(i) => write!(f, "the key of metadata entry {i}"),
            Part::Value(key) => write!(f, "the value of metadata key `{key}`"),
            Part::TensorName(i) => write!(f, "the name of tensor info {i}"),
            Part::TensorInfo(name) => write!(f, "the info of tensor `{name}`"),
        }
    }
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, part: &Part<'_>) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                part: part.to_string(),
                offset: self.pos as u64,
                needed: n,
                file_len: self.bytes.len() as u64,
            });
        }
        // `n` fits: it is at most the remaining length of a slice.
        let end = self.pos + n as usize;
        let taken = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(taken)
    }

    fn fixed<const N: usize>(&mut self, part: &Part<'_>) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, part)?);
        Ok(out)
    }

    /// `n` numbers of `N` bytes each, decoded by `decode`. `n` must have passed
    /// [`Reader::count`] with at least `N` bytes per item, so `n * N` cannot overflow.
    fn numbers<const N: usize, T>(
        &mut self,
        n: usize,
        part: &Part<'_>,
        decode: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        let bytes = self.take((n * N) as u64, part)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut raw = [0u8; N];
                raw.copy_from_slice(c);
                decode(raw)
            })
            .collect())
    }

    fn u32(&mut self, part: &Part<'_>) -> Result<u32, GgufError> {
        self.fixed(part).map(u32::from_le_bytes)
    }

    fn u64(&mut self, part: &Part<'_>) -> Result<u64, GgufError> {
        self.fixed(part).map(u64::from_le_bytes)
    }

    fn string(&mut self, part: &Part<'_>) -> Result<String, GgufError> {
        let len = self.u64(part)?;
        let bytes = self.take(len, part)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                path: self.path.to_path_buf(),
                part: part.to_string(),
            }),
        }
    }

    /// Checks that `count` items of at least `min_bytes` each fit in the rest of the file, and
    /// returns the count as a `usize` that is safe to allocate for.
    fn count(&self, count: u64, min_bytes: u64, what: impl FnOnce() -> String) -> Result<usize, GgufError> {
        let remaining = self.remaining();
        match count.checked_mul(min_bytes) {
            Some(total) if total <= remaining => Ok(count as usize),
            _ => Err(GgufError::CountTooLarge {
                path: self.path.to_path_buf(),
                what: what(),
                count,
                min_bytes,
                offset: self.pos as u64,
                remaining,
            }),
        }
    }

    fn value(&mut self, ty: GgufValueType, key: &str) -> Result<GgufValue, GgufError> {
        let part = Part::Value(key);
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(u8::from_le_bytes(self.fixed(&part)?)),
            GgufValueType::I8 => GgufValue::I8(i8::from_le_bytes(self.fixed(&part)?)),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.fixed(&part)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.fixed(&part)?)),
            GgufValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.fixed(&part)?)),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.fixed(&part)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.fixed(&part)?)),
            GgufValueType::Bool => {
                let [byte] = self.fixed(&part)?;
                GgufValue::Bool(self.bool(byte, key)?)
            }
            GgufValueType::String => GgufValue::String(self.string(&part)?),
            GgufValueType::Array => GgufValue::Array(self.array(key, 1)?),
            GgufValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.fixed(&part)?)),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.fixed(&part)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.fixed(&part)?)),
        })
    }

    fn bool(&self, byte: u8, key: &str) -> Result<bool, GgufError> {
        match byte {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(GgufError::InvalidBool {
                path: self.path.to_path_buf(),
                key: key.to_owned(),
                byte,
            }),
        }
    }

    /// An array at nesting level `depth` (1 for a metadata value that is an array).
    fn array(&mut self, key: &str, depth: usize) -> Result<GgufArray, GgufError> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::ArrayTooDeep {
                path: self.path.to_path_buf(),
                key: key.to_owned(),
            });
        }
        let part = Part::Value(key);
        let type_id = self.u32(&part)?;
        let ty = GgufValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            path: self.path.to_path_buf(),
            key: key.to_owned(),
            type_id,
        })?;
        let len = self.u64(&part)?;
        let n = self.count(len, ty.min_encoded_len(), || {
            format!("{ty} elements in the array of metadata key `{key}`")
        })?;
        Ok(match ty {
            GgufValueType::U8 => GgufArray::U8(self.take(n as u64, &part)?.to_vec()),
            GgufValueType::I8 => GgufArray::I8(self.numbers(n, &part, i8::from_le_bytes)?),
            GgufValueType::U16 => GgufArray::U16(self.numbers(n, &part, u16::from_le_bytes)?),
            GgufValueType::I16 => GgufArray::I16(self.numbers(n, &part, i16::from_le_bytes)?),
            GgufValueType::U32 => GgufArray::U32(self.numbers(n, &part, u32::from_le_bytes)?),
            GgufValueType::I32 => GgufArray::I32(self.numbers(n, &part, i32::from_le_bytes)?),
            GgufValueType::F32 => GgufArray::F32(self.numbers(n, &part, f32::from_le_bytes)?),
            GgufValueType::U64 => GgufArray::U64(self.numbers(n, &part, u64::from_le_bytes)?),
            GgufValueType::I64 => GgufArray::I64(self.numbers(n, &part, i64::from_le_bytes)?),
            GgufValueType::F64 => GgufArray::F64(self.numbers(n, &part, f64::from_le_bytes)?),
            GgufValueType::Bool => {
                let bytes = self.take(n as u64, &part)?;
                GgufArray::Bool(
                    bytes
                        .iter()
                        .map(|&b| self.bool(b, key))
                        .collect::<Result<_, _>>()?,
                )
            }
            GgufValueType::String => {
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(self.string(&part)?);
                }
                GgufArray::String(out)
            }
            GgufValueType::Array => {
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(self.array(key, depth + 1)?);
                }
                GgufArray::Array(out)
            }
        })
    }
}

/// A tensor record as read, before it is checked.
struct RawTensorInfo {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    offset: u64,
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed, GgufError> {
    let mut r = Reader { path, bytes, pos: 0 };

    let magic: [u8; 4] = r.fixed(&Part::Header)?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic {
            path: path.to_path_buf(),
            found: magic,
        });
    }
    let version = r.u32(&Part::Header)?;
    if !matches!(version, 2 | 3) {
        return Err(GgufError::UnsupportedVersion {
            path: path.to_path_buf(),
            version,
        });
    }
    let n_tensors = r.u64(&Part::Header)?;
    let n_metadata = r.u64(&Part::Header)?;
    let n_tensors = r.count(n_tensors, MIN_TENSOR_INFO_BYTES, || "tensor infos".to_owned())?;
    let n_metadata = r.count(n_metadata, MIN_METADATA_ENTRY_BYTES, || {
        "metadata entries".to_owned()
    })?;

    let mut metadata = BTreeMap::new();
    for i in 0..n_metadata {
        let key = r.string(&Part::Key(i))?;
        let type_id = r.u32(&Part::Value(&key))?;
        let ty = GgufValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            path: path.to_path_buf(),
            key: key.clone(),
            type_id,
        })?;
        let value = r.value(ty, &key)?;
        match metadata.entry(key) {
            btree_map::Entry::Vacant(slot) => {
                slot.insert(value);
            }
            btree_map::Entry::Occupied(slot) => {
                return Err(GgufError::DuplicateKey {
                    path: path.to_path_buf(),
                    key: slot.key().clone(),
                })
            }
        }
    }
    let alignment = match metadata.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(GgufValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(GgufValue::U32(a)) => {
            return Err(GgufError::BadAlignment {
                path: path.to_path_buf(),
                found: a.to_string(),
            })
        }
        Some(other) => {
            return Err(GgufError::BadAlignment {
                path: path.to_path_buf(),
                found: format!("of type {}", other.type_description()),
            })
        }
    };

    let mut raw = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = r.string(&Part::TensorName(i))?;
        let part = Part::TensorInfo(&name);
        let n_dims = r.u32(&part)?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                path: path.to_path_buf(),
                tensor: name,
                n_dims,
            });
        }
        let dims = (0..n_dims).map(|_| r.u64(&part)).collect::<Result<Vec<_>, _>>()?;
        let type_id = r.u32(&part)?;
        let offset = r.u64(&part)?;
        raw.push(RawTensorInfo {
            name,
            dims,
            type_id,
            offset,
        });
    }

    // The header ends at `r.pos` (at most the file length); rounding it up cannot overflow.
    let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    let mut tensors = Vec::with_capacity(raw.len());
    let mut seen = HashSet::with_capacity(raw.len());
    for t in &raw {
        if !seen.insert(t.name.as_str()) {
            return Err(GgufError::DuplicateTensor {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
            });
        }
        tensors.push(check_tensor(path, t, alignment, data_start, file_len)?);
    }

    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
    })
}

/// Checks a tensor record's type, dimensions, alignment and extent.
fn check_tensor(
    path: &Path,
    t: &RawTensorInfo,
    alignment: u64,
    data_start: u64,
    file_len: u64,
) -> Result<GgufTensorInfo, GgufError> {
    let dtype = dtype_from_ggml(t.type_id).ok_or_else(|| GgufError::UnsupportedType {
        path: path.to_path_buf(),
        tensor: t.name.clone(),
        type_id: t.type_id,
    })?;
    let too_large = || GgufError::TensorTooLarge {
        path: path.to_path_buf(),
        tensor: t.name.clone(),
        dims: t.dims.clone(),
    };
    // ggml stores dimensions as `int64_t`.
    if t.dims.iter().any(|&d| d > i64::MAX as u64) {
        return Err(too_large());
    }
    let inner = t.dims.first().copied().unwrap_or(1);
    let block = dtype.block_elems();
    if !inner.is_multiple_of(block as u64) {
        return Err(GgufError::PartialBlock {
            path: path.to_path_buf(),
            tensor: t.name.clone(),
            dtype,
            inner,
            block,
        });
    }
    // The nonzero dimensions must multiply without overflow even when a zero one makes the
    // element count 0: a product taken in another order (`TensorDesc::numel` multiplies
    // outermost first) would otherwise overflow before it reaches the zero.
    let nonzero = t
        .dims
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(too_large)?;
    let numel = if t.dims.contains(&0) { 0 } else { nonzero };
    let byte_size = (numel / block as u64)
        .checked_mul(dtype.block_bytes() as u64)
        .ok_or_else(too_large)?;
    if !t.offset.is_multiple_of(alignment) {
        return Err(GgufError::MisalignedOffset {
            path: path.to_path_buf(),
            tensor: t.name.clone(),
            offset: t.offset,
            alignment,
        });
    }
    let start = data_start.saturating_add(t.offset);
    let past_end = || GgufError::TensorPastEnd {
        path: path.to_path_buf(),
        tensor: t.name.clone(),
        start,
        size: byte_size,
        file_len,
    };
    match start.checked_add(byte_size) {
        Some(end) if end <= file_len => {}
        _ => return Err(past_end()),
    }
    // Every quantity below is at most the file length, which fits in `usize`, or the element
    // count, which is at most 256 / 84 times the byte size.
    let dims = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| too_large())?;
    usize::try_from(nonzero).map_err(|_| too_large())?;
    Ok(GgufTensorInfo {
        name: t.name.clone(),
        dims,
        dtype,
        offset: t.offset,
        start: usize::try_from(start).map_err(|_| past_end())?,
        byte_size: usize::try_from(byte_size).map_err(|_| past_end())?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::value::encode_string;
    use super::*;

    /// A minimal GGUF writer for tests: metadata and tensors (raw bytes under any type id and
    /// dimensions), laid out as llama.cpp does; `build` also reports where each tensor's type
    /// and offset fields are, so tests can corrupt them.
    struct Builder {
        version: u32,
        alignment: u64,
        metadata: Vec<(String, GgufValue)>,
        tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    }

    struct Built {
        bytes: Vec<u8>,
        /// Per tensor: the position of its type id field (the offset field follows it).
        type_at: Vec<usize>,
        data_start: usize,
    }

    impl Builder {
        fn new(version: u32) -> Self {
            Builder {
                version,
                alignment: DEFAULT_ALIGNMENT,
                metadata: Vec::new(),
                tensors: Vec::new(),
            }
        }

        fn meta(mut self, key: &str, value: GgufValue) -> Self {
            match value {
                GgufValue::U32(a) if key == ALIGNMENT_KEY && a.is_power_of_two() => {
                    self.alignment = u64::from(a)
                }
                _ => {}
            }
            self.metadata.push((key.to_owned(), value));
            self
        }

        fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
            self.tensors.push((name.to_owned(), dims.to_vec(), type_id, data));
            self
        }

        fn build(&self) -> Built {
            let mut b = Vec::new();
            b.extend_from_slice(b"GGUF");
            b.extend_from_slice(&self.version.to_le_bytes());
            b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
            b.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
            for (key, value) in &self.metadata {
                encode_string(key, &mut b);
                b.extend_from_slice(&value.value_type().id().to_le_bytes());
                value.encode(&mut b);
            }
            let mut offset = 0u64;
            let mut type_at = Vec::new();
            for (name, dims, type_id, data) in &self.tensors {
                encode_string(name, &mut b);
                b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
                for d in dims {
                    b.extend_from_slice(&d.to_le_bytes());
                }
                type_at.push(b.len());
                b.extend_from_slice(&type_id.to_le_bytes());
                b.extend_from_slice(&offset.to_le_bytes());
                offset += (data.len() as u64).div_ceil(self.alignment) * self.alignment;
            }
            pad(&mut b, self.alignment);
            let data_start = b.len();
            for (_, _, _, data) in &self.tensors {
                b.extend_from_slice(data);
                pad(&mut b, self.alignment);
            }
            Built {
                bytes: b,
                type_at,
                data_start,
            }
        }
    }

    fn pad(b: &mut Vec<u8>, alignment: u64) {
        while !(b.len() as u64).is_multiple_of(alignment) {
            b.push(0);
        }
    }

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// One q8_0 block: scale 0.5, values -16..16.
    fn q8_0_block() -> Vec<u8> {
        let mut b = half::f16::from_f32(0.5).to_bits().to_le_bytes().to_vec();
        b.extend((-16i8..16).map(|q| q as u8));
        b
    }

    fn every_value() -> Vec<(&'static str, GgufValue)> {
        vec![
            ("general.architecture", GgufValue::String("gemma3".into())),
            ("t.u8", GgufValue::U8(200)),
            ("t.i8", GgufValue::I8(-100)),
            ("t.u16", GgufValue::U16(60000)),
            ("t.i16", GgufValue::I16(-30000)),
            ("t.u32", GgufValue::U32(4_000_000_000)),
            ("t.i32", GgufValue::I32(-2_000_000_000)),
            ("t.f32", GgufValue::F32(1e-6)),
            ("t.bool", GgufValue::Bool(true)),
            ("t.false", GgufValue::Bool(false)),
            ("t.string", GgufValue::String("héllo ▁wörld".into())),
            ("t.empty", GgufValue::String(String::new())),
            ("t.u64", GgufValue::U64(u64::MAX)),
            ("t.i64", GgufValue::I64(i64::MIN)),
            ("t.f64", GgufValue::F64(-2.5e300)),
            ("t.a.u8", GgufValue::Array(GgufArray::U8(vec![1, 2, 255]))),
            ("t.a.i8", GgufValue::Array(GgufArray::I8(vec![-1, 2]))),
            ("t.a.u16", GgufValue::Array(GgufArray::U16(vec![1, 65535]))),
            ("t.a.i16", GgufValue::Array(GgufArray::I16(vec![-7]))),
            ("t.a.u32", GgufValue::Array(GgufArray::U32(vec![3, 4]))),
            ("t.a.i32", GgufValue::Array(GgufArray::I32(vec![-3, 4, 5]))),
            ("t.a.f32", GgufValue::Array(GgufArray::F32(vec![0.5, -1.25]))),
            (
                "t.a.bool",
                GgufValue::Array(GgufArray::Bool(vec![true, false, true])),
            ),
            (
                "t.a.string",
                GgufValue::Array(GgufArray::String(vec!["<pad>".into(), "".into(), "▁a".into()])),
            ),
            ("t.a.u64", GgufValue::Array(GgufArray::U64(vec![1 << 40]))),
            ("t.a.i64", GgufValue::Array(GgufArray::I64(vec![-(1 << 40)]))),
            ("t.a.f64", GgufValue::Array(GgufArray::F64(vec![1.0 / 3.0]))),
            ("t.a.empty", GgufValue::Array(GgufArray::F32(vec![]))),
            (
                "t.a.nested",
                GgufValue::Array(GgufArray::Array(vec![
                    GgufArray::U8(vec![1]),
                    GgufArray::String(vec!["x".into()]),
                    GgufArray::Array(vec![GgufArray::I32(vec![-1, -2])]),
                    GgufArray::Array(vec![]),
                ])),
            ),
        ]
    }

    /// A file with every value type and tensors of several types and shapes.
    fn sample(version: u32) -> Builder {
        let mut b = Builder::new(version);
        for (key, value) in every_value() {
            b = b.meta(key, value);
        }
        let q4k = include_bytes!("../../../../backend-api/tests/data/quant/q4_k.blocks");
        b.tensor(
            "token_embd.weight",
            &[3, 2],
            0,
            f32_bytes(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
        )
        .tensor("norm.weight", &[3], 1, vec![0x00, 0x3C, 0x00, 0xC0, 0x00, 0x00])
        .tensor("blk.0.q8", &[32, 2], 8, [q8_0_block(), q8_0_block()].concat())
        .tensor("blk.0.q4k", &[256, 2], 12, q4k.to_vec())
        .tensor("bf16.scalar", &[], 30, vec![0xC0, 0x3F])
    }

    fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn open_bytes(bytes: &[u8]) -> Result<GgufFile, GgufError> {
        let dir = tempfile::tempdir().unwrap();
        GgufFile::open(&write(&dir, "t.gguf", bytes))
    }

    fn err_of(bytes: &[u8]) -> GgufError {
        open_bytes(bytes).expect_err("the file should be refused")
    }

    #[test]
    fn reads_every_value_type_and_tensor_in_v2_and_v3() {
        for version in [2, 3] {
            let built = sample(version).build();
            let f = open_bytes(&built.bytes).unwrap();
            assert_eq!(f.version(), version);
            assert_eq!(f.alignment(), 32);
            assert_eq!(f.data_start(), built.data_start as u64);
            let expected: BTreeMap<String, GgufValue> = every_value()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            assert_eq!(f.metadata(), &expected);

            let names: Vec<&str> = f.tensors().iter().map(|t| t.name()).collect();
            assert_eq!(
                names,
                [
                    "token_embd.weight",
                    "norm.weight",
                    "blk.0.q8",
                    "blk.0.q4k",
                    "bf16.scalar"
                ]
            );

            let t = f.tensor("token_embd.weight").unwrap();
            assert_eq!(t.info.dims(), [3, 2]);
            assert_eq!(t.desc, TensorDesc::new(DType::F32, [2, 3]));
            assert_eq!(t.bytes, f32_bytes(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]).as_slice());
            assert_eq!(t.to_f32().unwrap(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
            assert_eq!(t.bytes.as_ptr() as usize % 32, 0);

            let t = f.tensor("norm.weight").unwrap();
            assert_eq!(t.desc, TensorDesc::new(DType::F16, [3]));
            assert_eq!(t.to_f32().unwrap(), [1.0, -2.0, 0.0]);

            let t = f.tensor("blk.0.q8").unwrap();
            assert_eq!(t.desc, TensorDesc::new(DType::Q8_0, [2, 32]));
            assert_eq!(t.info.byte_size(), 68);
            let values = t.to_f32().unwrap();
            assert_eq!(values[0], -8.0);
            assert_eq!(values[63], 7.5);

            let t = f.tensor("blk.0.q4k").unwrap();
            assert_eq!(t.desc, TensorDesc::new(DType::Q4K, [2, 256]));
            assert_eq!(t.info.offset() % 32, 0);
            let expected = include_bytes!("../../../../backend-api/tests/data/quant/q4_k.f32");
            let got: Vec<u8> = t.to_f32().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(got, expected);

            let t = f.tensor("bf16.scalar").unwrap();
            assert_eq!(t.desc, TensorDesc::new(DType::Bf16, Vec::new()));
            assert_eq!(t.to_f32().unwrap(), [1.5]);
        }
    }

    #[test]
    fn typed_getters_name_the_key_and_the_types() {
        let f = open_bytes(&sample(3).build().bytes).unwrap();
        assert_eq!(f.get_str("general.architecture").unwrap(), "gemma3");
        assert_eq!(f.get_u8("t.u8").unwrap(), 200);
        assert_eq!(f.get_i8("t.i8").unwrap(), -100);
        assert_eq!(f.get_u16("t.u16").unwrap(), 60000);
        assert_eq!(f.get_i16("t.i16").unwrap(), -30000);
        assert_eq!(f.get_u32("t.u32").unwrap(), 4_000_000_000);
        assert_eq!(f.get_i32("t.i32").unwrap(), -2_000_000_000);
        assert_eq!(f.get_f32("t.f32").unwrap(), 1e-6);
        assert!(f.get_bool("t.bool").unwrap());
        assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX);
        assert_eq!(f.get_i64("t.i64").unwrap(), i64::MIN);
        assert_eq!(f.get_f64("t.f64").unwrap(), -2.5e300);
        assert_eq!(f.get_str_array("t.a.string").unwrap(), ["<pad>", "", "▁a"]);
        assert_eq!(f.get_f32_array("t.a.f32").unwrap(), [0.5, -1.25]);
        assert_eq!(f.get_i32_array("t.a.i32").unwrap(), [-3, 4, 5]);
        assert_eq!(f.get_u8_array("t.a.u8").unwrap(), [1, 2, 255]);
        assert_eq!(f.get_bool_array("t.a.bool").unwrap(), [true, false, true]);
        assert!(f.get_f32_array("t.a.empty").unwrap().is_empty());
        assert_eq!(f.get_array("t.a.nested").unwrap().len(), 4);

        let err = f.get_u32("t.i32").unwrap_err();
        assert!(matches!(err, GgufError::WrongType { .. }));
        let msg = err.to_string();
        assert!(msg.contains("`t.i32` is i32; expected u32"), "{msg}");
        let msg = f.get_str_array("t.a.f32").unwrap_err().to_string();
        assert!(
            msg.contains("`t.a.f32` is array of f32; expected array of string"),
            "{msg}"
        );
        let msg = f.get_f32("t.a.nested").unwrap_err().to_string();
        assert!(msg.contains("is array of array of u8; expected f32"), "{msg}");
        let msg = f.get_str("gemma3.context_length").unwrap_err().to_string();
        assert!(
            msg.contains("has no metadata key `gemma3.context_length`"),
            "{msg}"
        );
        let msg = f.tensor("output.weight").unwrap_err().to_string();
        assert!(msg.contains("has no tensor `output.weight`"), "{msg}");
    }

    #[test]
    fn reads_a_file_written_by_the_python_gguf_package() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf/tiny.gguf");
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.get_str("general.architecture").unwrap(), "gemma3");
        assert_eq!(f.get_u32("gemma3.block_count").unwrap(), 2);
        assert_eq!(
            f.get_f32("gemma3.attention.layer_norm_rms_epsilon").unwrap(),
            1e-6
        );
        assert!(f.get_bool("tiny.flag").unwrap());
        assert_eq!(f.get_i32("tiny.negative").unwrap(), -7);
        assert_eq!(f.get_u64("tiny.big").unwrap(), 1 << 40);
        assert_eq!(f.get_f64("tiny.pi").unwrap(), std::f64::consts::PI);
        assert_eq!(f.get_str("tiny.unicode").unwrap(), "Gemma é中");
        assert_eq!(
            f.get_str_array("tokenizer.ggml.tokens").unwrap(),
            ["<pad>", "<eos>", "<bos>", "▁hi"]
        );
        assert_eq!(
            f.get_f32_array("tokenizer.ggml.scores").unwrap(),
            [0.0, -1.5, 2.25]
        );
        assert_eq!(f.get_i32_array("tiny.ints").unwrap(), [1, -2, 3]);

        let shapes: Vec<(&str, Vec<usize>, DType)> = f
            .tensors()
            .iter()
            .map(|t| (t.name(), t.shape(), t.dtype()))
            .collect();
        assert_eq!(
            shapes,
            [
                ("token_embd.weight", vec![2, 3], DType::F32),
                ("output_norm.weight", vec![4], DType::F16),
                ("blk.0.ffn_up.weight", vec![3, 32], DType::Q8_0),
                ("blk.0.ffn_down.weight", vec![2, 256], DType::Q4K),
            ]
        );
        for t in f.tensors() {
            assert_eq!(t.offset() % 64, 0, "{}", t.name());
        }
        let embd = f.tensor("token_embd.weight").unwrap().to_f32().unwrap();
        assert_eq!(embd, [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]);
        let norm = f.tensor("output_norm.weight").unwrap().to_f32().unwrap();
        assert_eq!(norm, [1.0, -0.5, 65504.0, 0.0]);
        for (name, blocks, values) in [
            (
                "blk.0.ffn_up.weight",
                &include_bytes!("../../../../backend-api/tests/data/quant/q8_0.blocks")[..],
                &include_bytes!("../../../../backend-api/tests/data/quant/q8_0.f32")[..],
            ),
            (
                "blk.0.ffn_down.weight",
                &include_bytes!("../../../../backend-api/tests/data/quant/q4_k.blocks")[..],
                &include_bytes!("../../../../backend-api/tests/data/quant/q4_k.f32")[..],
            ),
        ] {
            let t = f.tensor(name).unwrap();
            assert_eq!(t.bytes, blocks, "{name}");
            let got: Vec<u8> = t.to_f32().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(got, values, "{name}");
        }
    }

    #[test]
    fn custom_alignment_is_honoured_and_checked() {
        let built = Builder::new(3)
            .meta(ALIGNMENT_KEY, GgufValue::U32(256))
            .tensor("a", &[3], 0, f32_bytes(&[1.0, 2.0, 3.0]))
            .tensor("b", &[1], 0, f32_bytes(&[4.0]))
            .build();
        let f = open_bytes(&built.bytes).unwrap();
        assert_eq!(f.alignment(), 256);
        assert_eq!(f.data_start() % 256, 0);
        assert_eq!(f.tensors()[1].offset(), 256);
        assert_eq!(f.tensor("b").unwrap().to_f32().unwrap(), [4.0]);

        for (value, found) in [
            (GgufValue::U32(0), "is 0;"),
            (GgufValue::U32(48), "is 48;"),
            (GgufValue::U64(64), "is of type u64;"),
        ] {
            let bytes = Builder::new(3).meta(ALIGNMENT_KEY, value).build().bytes;
            let err = err_of(&bytes);
            assert!(matches!(err, GgufError::BadAlignment { .. }), "{err}");
            assert!(err.to_string().contains(found), "{err}");
        }
    }

    #[test]
    fn bad_magic_is_refused() {
        let mut bytes = sample(3).build().bytes;
        bytes[..4].copy_from_slice(b"GGML");
        let err = err_of(&bytes);
        assert!(
            matches!(err, GgufError::BadMagic { found, .. } if &found == b"GGML"),
            "{err}"
        );
        assert!(err.to_string().contains("is not a GGUF file"), "{err}");
        assert!(err.to_string().contains("t.gguf"), "{err}");
        assert!(matches!(
            err_of(b"{\"safetensors\": 1}"),
            GgufError::BadMagic { .. }
        ));
    }

    #[test]
    fn unknown_versions_are_refused() {
        for version in [0u32, 1, 4, 0x0300_0000] {
            let bytes = Builder::new(version).build().bytes;
            let err = err_of(&bytes);
            assert!(
                matches!(err, GgufError::UnsupportedVersion { version: v, .. } if v == version),
                "{err}"
            );
            assert!(err.to_string().contains("expected 2 or 3"), "{err}");
        }
        let msg = err_of(&Builder::new(0x0300_0000).build().bytes).to_string();
        assert!(msg.contains("big-endian"), "{msg}");
    }

    #[test]
    fn truncation_anywhere_is_an_error_naming_the_part() {
        // Metadata only, so that cuts inside the first entry leave room for the declared count.
        let small = Builder::new(3)
            .meta("general.architecture", GgufValue::String("gemma3".into()))
            .build()
            .bytes;
        let built = sample(3).build();
        let first_type = built.type_at[0];
        // The key runs from 32 to 52, the value's length from 56 to 64.
        let cases: [(&[u8], usize, &str); 6] = [
            (&small, 0, "the header"),
            (&small, 10, "the header"),
            (&small, 40, "the key of metadata entry 0"),
            (&small, 59, "the value of metadata key `general.architecture`"),
            (
                &built.bytes,
                first_type + 2,
                "the info of tensor `token_embd.weight`",
            ),
            (
                &built.bytes,
                built.bytes.len() - 40,
                "tensor `blk.0.q4k` needs 288 bytes",
            ),
        ];
        for (bytes, len, part) in cases {
            let err = err_of(&bytes[..len]);
            let msg = err.to_string();
            assert!(msg.contains(part), "cut at {len}: {msg}");
            assert!(msg.contains("truncated"), "{msg}");
            assert!(
                matches!(err, GgufError::Truncated { .. } | GgufError::TensorPastEnd { .. }),
                "{msg}"
            );
        }
        // Cut before the declared entries could fit, the counts themselves are refused.
        let err = err_of(&built.bytes[..100]);
        assert!(matches!(err, GgufError::CountTooLarge { .. }), "{err}");
    }

    #[test]
    fn data_past_the_end_is_refused_even_when_the_header_is_whole() {
        let built = Builder::new(2).tensor("w", &[8], 0, f32_bytes(&[1.0; 8])).build();
        let err = err_of(&built.bytes[..built.data_start + 16]);
        assert!(
            matches!(&err, GgufError::TensorPastEnd { tensor, size: 32, .. } if tensor == "w"),
            "{err}"
        );
    }

    #[test]
    fn unsupported_tensor_types_name_the_tensor_and_the_id() {
        for (id, name) in [(16u32, "IQ2_XXS"), (9, "Q8_1"), (99, "not a ggml type")] {
            let built = sample(3).build();
            let mut bytes = built.bytes.clone();
            let at = built.type_at[2];
            bytes[at..at + 4].copy_from_slice(&id.to_le_bytes());
            let err = err_of(&bytes);
            assert!(
                matches!(&err, GgufError::UnsupportedType { tensor, type_id, .. }
                    if tensor == "blk.0.q8" && *type_id == id),
                "{err}"
            );
            let msg = err.to_string();
            assert!(msg.contains(&format!("ggml type id {id} ({name}")), "{msg}");
        }
    }

    #[test]
    fn counts_and_lengths_beyond_the_file_are_refused_before_allocating() {
        let built = sample(3).build();
        let header_counts = |tensors: u64, kvs: u64| {
            let mut b = built.bytes.clone();
            b[8..16].copy_from_slice(&tensors.to_le_bytes());
            b[16..24].copy_from_slice(&kvs.to_le_bytes());
            b
        };
        for (bytes, what) in [
            (header_counts(u64::MAX, 29), "tensor infos"),
            (header_counts(1 << 60, 29), "tensor infos"),
            (header_counts(5, u64::MAX), "metadata entries"),
            (header_counts(5, 1 << 62), "metadata entries"),
        ] {
            let err = err_of(&bytes);
            assert!(matches!(err, GgufError::CountTooLarge { .. }), "{err}");
            assert!(err.to_string().contains(what), "{err}");
        }

        // A string length past the end of the file: the first key's length.
        let mut bytes = built.bytes.clone();
        bytes[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        let err = err_of(&bytes);
        assert!(
            matches!(&err, GgufError::Truncated { needed, .. } if *needed == u64::MAX),
            "{err}"
        );

        // Array lengths: too many for the file, and an element count whose byte size overflows.
        for len in [1u64 << 20, u64::MAX / 2, u64::MAX] {
            let mut b = Vec::new();
            b.extend_from_slice(b"GGUF");
            b.extend_from_slice(&3u32.to_le_bytes());
            b.extend_from_slice(&0u64.to_le_bytes());
            b.extend_from_slice(&1u64.to_le_bytes());
            encode_string("tokenizer.ggml.scores", &mut b);
            b.extend_from_slice(&GgufValueType::Array.id().to_le_bytes());
            b.extend_from_slice(&GgufValueType::F32.id().to_le_bytes());
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(&[0; 64]);
            let err = err_of(&b);
            assert!(
                matches!(err, GgufError::CountTooLarge { count, .. } if count == len),
                "{err}"
            );
            let msg = err.to_string();
            assert!(
                msg.contains("f32 elements in the array of metadata key `tokenizer.ggml.scores`"),
                "{msg}"
            );
        }
    }

    #[test]
    fn partial_blocks_and_oversized_dims_are_refused() {
        let bytes = Builder::new(3)
            .tensor("blk.0.attn_q.weight", &[48, 1], 8, vec![0; 34 * 2])
            .build()
            .bytes;
        let err = err_of(&bytes);
        assert!(
            matches!(
                err,
                GgufError::PartialBlock {
                    inner: 48,
                    block: 32,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("`blk.0.attn_q.weight` of type q8_0"),
            "{err}"
        );

        let bytes = Builder::new(3)
            .tensor("huge", &[1 << 32, 1 << 32, 1 << 32], 0, vec![0; 4])
            .build()
            .bytes;
        assert!(matches!(err_of(&bytes), GgufError::TensorTooLarge { .. }));
        let bytes = Builder::new(3)
            .tensor("neg", &[u64::MAX], 0, vec![0; 4])
            .build()
            .bytes;
        assert!(matches!(err_of(&bytes), GgufError::TensorTooLarge { .. }));
        let bytes = Builder::new(3)
            .tensor("five", &[1, 1, 1, 1, 1], 0, vec![0; 4])
            .build()
            .bytes;
        assert!(matches!(err_of(&bytes), GgufError::TooManyDims { n_dims: 5, .. }));
    }

    #[test]
    fn misaligned_offsets_are_refused() {
        let built = sample(3).build();
        let mut bytes = built.bytes.clone();
        let at = built.type_at[1] + 4;
        bytes[at..at + 8].copy_from_slice(&36u64.to_le_bytes());
        let err = err_of(&bytes);
        assert!(
            matches!(&err, GgufError::MisalignedOffset { tensor, offset: 36, alignment: 32, .. }
                if tensor == "norm.weight"),
            "{err}"
        );
        let mut bytes = built.bytes.clone();
        bytes[at..at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
        assert!(matches!(err_of(&bytes), GgufError::TensorPastEnd { .. }));
    }

    #[test]
    fn malformed_metadata_is_refused() {
        let dup = Builder::new(3)
            .meta("a", GgufValue::U8(1))
            .meta("a", GgufValue::U8(2))
            .build()
            .bytes;
        assert!(matches!(err_of(&dup), GgufError::DuplicateKey { key, .. } if key == "a"));

        let dup = Builder::new(3)
            .tensor("w", &[1], 0, vec![0; 4])
            .tensor("w", &[1], 0, vec![0; 4])
            .build()
            .bytes;
        assert!(matches!(err_of(&dup), GgufError::DuplicateTensor { tensor, .. } if tensor == "w"));

        let mut bad_bool = Builder::new(3).meta("flag", GgufValue::Bool(true)).build().bytes;
        bad_bool[24 + 8 + 4 + 4] = 2;
        assert!(matches!(
            err_of(&bad_bool),
            GgufError::InvalidBool { byte: 2, .. }
        ));

        let mut bad_type = Builder::new(3).meta("k", GgufValue::U8(1)).build().bytes;
        bad_type[24 + 8 + 1..24 + 8 + 1 + 4].copy_from_slice(&13u32.to_le_bytes());
        let err = err_of(&bad_type);
        assert!(
            matches!(&err, GgufError::UnknownValueType { key, type_id: 13, .. } if key == "k"),
            "{err}"
        );

        let mut bad_utf8 = Builder::new(3)
            .meta("k", GgufValue::String("ab".into()))
            .build()
            .bytes;
        bad_utf8[24 + 8 + 1 + 4 + 8] = 0xFF;
        let err = err_of(&bad_utf8);
        assert!(
            err.to_string()
                .contains("the value of metadata key `k` is not valid UTF-8"),
            "{err}"
        );

        let mut deep = GgufArray::U8(vec![7]);
        for _ in 0..MAX_ARRAY_DEPTH - 1 {
            deep = GgufArray::Array(vec![deep]);
        }
        let ok = Builder::new(3)
            .meta("deep", GgufValue::Array(deep.clone()))
            .build()
            .bytes;
        assert_eq!(open_bytes(&ok).unwrap().get_array("deep").unwrap(), &deep);
        let too_deep = Builder::new(3)
            .meta("deep", GgufValue::Array(GgufArray::Array(vec![deep])))
            .build()
            .bytes;
        assert!(matches!(err_of(&too_deep), GgufError::ArrayTooDeep { key, .. } if key == "deep"));
    }

    #[test]
    fn empty_and_tiny_files_are_errors() {
        for bytes in [&b""[..], b"GG", b"GGUF", b"GGUF\x03\x00\x00\x00"] {
            assert!(matches!(err_of(bytes), GgufError::Truncated { .. }));
        }
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.gguf");
        let err = GgufFile::open(&missing).unwrap_err();
        assert!(matches!(err, GgufError::Io { .. }));
        assert!(err.to_string().contains("missing.gguf"), "{err}");
    }

    /// Opens `bytes` and reads and decodes every tensor; any outcome but a panic is fine.
    /// Returns whether the file opened.
    fn open_and_read_everything(path: &Path, bytes: &[u8]) -> bool {
        std::fs::write(path, bytes).unwrap();
        let Ok(f) = GgufFile::open(path) else {
            return false;
        };
        for info in f.tensors() {
            if let Ok(t) = f.tensor(info.name()) {
                let _ = t.to_f32();
            }
        }
        for key in f.metadata().keys() {
            let _ = f.get_str(key);
            let _ = f.get_u32(key);
        }
        true
    }

    #[test]
    fn truncated_and_corrupted_files_never_panic() {
        let base = Builder::new(3)
            .meta("general.architecture", GgufValue::String("gemma3".into()))
            .meta("gemma3.block_count", GgufValue::U32(2))
            .meta(
                "tokenizer.ggml.tokens",
                GgufValue::Array(GgufArray::String(vec!["<pad>".into(), "a".into()])),
            )
            .meta(
                "tokenizer.ggml.scores",
                GgufValue::Array(GgufArray::F32(vec![0.5, 1.0])),
            )
            .meta(
                "t.nested",
                GgufValue::Array(GgufArray::Array(vec![GgufArray::Bool(vec![true])])),
            )
            .tensor("a", &[4, 2], 0, f32_bytes(&[1.0; 8]))
            .tensor("b", &[32], 8, q8_0_block())
            .tensor("c", &[256], 14, vec![0x11; 210])
            .tensor("d", &[2], 1, vec![0x00, 0x3C, 0x00, 0x40])
            .build()
            .bytes;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fuzz.gguf");
        assert!(open_and_read_everything(&path, &base));

        // Every truncation (the file is under 1 KiB).
        assert!(base.len() < 1024, "{}", base.len());
        for len in 0..base.len() {
            open_and_read_everything(&path, &base[..len]);
        }
        // Single-byte corruptions at pseudo-random positions (a fixed xorshift sequence), with
        // values biased towards the interesting ones.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut opened, mut refused) = (0, 0);
        for _ in 0..2000 - base.len() / 2 {
            let r = next();
            let at = (r % base.len() as u64) as usize;
            let value = match (r >> 32) % 4 {
                0 => 0xFF,
                1 => 0x00,
                2 => 0x80,
                _ => (r >> 40) as u8,
            };
            let mut bytes = base.clone();
            bytes[at] = value;
            if open_and_read_everything(&path, &bytes) {
                opened += 1;
            } else {
                refused += 1;
            }
        }
        // Both outcomes occur: corrupt tensor data still opens, a corrupt header does not.
        assert!(
            opened > 100 && refused > 100,
            "{opened} opened, {refused} refused"
        );
    }
}
