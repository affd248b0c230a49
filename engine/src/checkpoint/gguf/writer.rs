//! A GGUF v3 writer that streams tensor data.
//!
//! A file is: the magic `GGUF`, the version (`u32` 3), the tensor count and metadata count (`u64`
//! each), the metadata (key string, `u32` value type, value), one info record per tensor (name
//! string, `u32` dimension count, `u64` dimensions innermost first, `u32` ggml type, `u64` offset
//! into the data section), zero padding up to the alignment, then the data section: each tensor's
//! bytes at its offset, padded with zeros to the alignment. Strings are a `u64` byte length and
//! UTF-8 bytes without a terminator; everything is little-endian. The alignment is the metadata
//! value `general.alignment` (a `u32` power of two) or 32.
//!
//! [`GgufWriter`] collects the metadata and the tensor infos (names, dimensions and types, so every
//! size and offset is known up front), then [`GgufWriter::write_file`] writes the header and asks a
//! callback for each tensor's bytes in order, through a [`TensorSink`] that checks the count. The
//! model never has to be in memory at once.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use tandem_backend_api::DType;

use super::value::encode_string;
pub use super::value::{GgufArray, GgufValue};

pub use super::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};

/// The format version this writer produces.
pub const GGUF_VERSION: u32 = 3;
/// Tensor names must be shorter than this many bytes (ggml's `GGML_MAX_NAME`, which counts the
/// terminating NUL).
pub const MAX_TENSOR_NAME_BYTES: usize = 64;

const WRITE_BUFFER_BYTES: usize = 1 << 20;

/// ggml's type id for `dtype` (`enum ggml_type`), as GGUF tensor infos store it.
pub const fn ggml_type_id(dtype: DType) -> u32 {
    let table = super::reader::GGML_TYPES;
    let mut i = 0;
    while i < table.len() {
        // `DType` is not const-comparable; its discriminant is.
        if table[i].1 as u32 == dtype as u32 {
            return table[i].0;
        }
        i += 1;
    }
    // Every DType is in the table (a unit test checks it).
    u32::MAX
}

/// What a tensor is: its name, its dimensions (ggml order, innermost first: a `[rows, cols]`
/// row-major matrix has `dims = [cols, rows]`) and its storage type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name, as in `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions, innermost first.
    pub dims: Vec<u64>,
    /// Storage type; the innermost dimension must be a whole number of its blocks.
    pub dtype: DType,
}

impl TensorSpec {
    /// A tensor spec from its parts.
    pub fn new(name: impl Into<String>, dims: &[u64], dtype: DType) -> Self {
        TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            dtype,
        }
    }

    /// The number of elements (the product of the dimensions), or `None` on overflow.
    pub fn elems(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
    }

    /// The number of rows: the product of every dimension but the innermost.
    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Bytes of data, or `None` when the innermost dimension is not a whole number of blocks or
    /// the size overflows.
    pub fn byte_len(&self) -> Option<u64> {
        let inner = *self.dims.first()?;
        let block = self.dtype.block_elems() as u64;
        if !inner.is_multiple_of(block) {
            return None;
        }
        (inner / block)
            .checked_mul(self.dtype.block_bytes() as u64)?
            .checked_mul(
                self.dims
                    .iter()
                    .skip(1)
                    .try_fold(1u64, |n, &d| n.checked_mul(d))?,
            )
    }
}

/// Why a GGUF file could not be described or written.
#[derive(Debug, thiserror::Error)]
pub enum GgufWriteError {
    /// A metadata key was added twice.
    #[error("metadata key {key} is set twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// `general.alignment` is not a `u32` power of two.
    #[error("metadata {ALIGNMENT_KEY} is {value}; expected a u32 power of two")]
    BadAlignment {
        /// The value given, as debug text.
        value: String,
    },
    /// A tensor name was used twice.
    #[error("tensor {name} is added twice")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// A tensor name is empty or too long.
    #[error("tensor name {name:?} is {len} bytes; expected 1 to {} bytes", MAX_TENSOR_NAME_BYTES - 1)]
    TensorName {
        /// The name.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// A tensor's dimensions do not fit its type or ggml's limits.
    #[error("tensor {name} with dims {dims:?} as {dtype}: {detail}")]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// Its dimensions, innermost first.
        dims: Vec<u64>,
        /// Its type.
        dtype: DType,
        /// What is wrong.
        detail: String,
    },
    /// Creating or writing the file failed.
    #[error("cannot write GGUF file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A tensor callback wrote more bytes than the tensor holds.
    #[error("tensor {tensor} in {} holds {expected} bytes; the writer was given {attempted}", path.display())]
    Overrun {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The tensor's size in bytes.
        expected: u64,
        /// Bytes given so far, including the write that was refused.
        attempted: u64,
    },
    /// A tensor callback returned before writing all of the tensor's bytes.
    #[error("tensor {tensor} in {} holds {expected} bytes; the writer was given only {written}", path.display())]
    ShortTensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The tensor's size in bytes.
        expected: u64,
        /// Bytes given.
        written: u64,
    },
}

/// Receives one tensor's bytes, in order, during [`GgufWriter::write_file`]; refuses more than the
/// tensor holds.
pub struct TensorSink<'a> {
    out: &'a mut dyn Write,
    path: &'a Path,
    spec: &'a TensorSpec,
    expected: u64,
    written: u64,
    position: u64,
}

impl TensorSink<'_> {
    /// The tensor being written.
    pub fn spec(&self) -> &TensorSpec {
        self.spec
    }

    /// Appends `bytes` to the tensor's data.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), GgufWriteError> {
        let attempted = self.written + bytes.len() as u64;
        if attempted > self.expected {
            return Err(GgufWriteError::Overrun {
                path: self.path.to_path_buf(),
                tensor: self.spec.name.clone(),
                expected: self.expected,
                attempted,
            });
        }
        self.out.write_all(bytes).map_err(|source| GgufWriteError::Io {
            path: self.path.to_path_buf(),
            source,
        })?;
        self.written = attempted;
        self.position += bytes.len() as u64;
        Ok(())
    }

    /// Bytes of this tensor still to come.
    pub fn remaining(&self) -> u64 {
        self.expected - self.written
    }

    /// Bytes of the file written so far, header included.
    pub fn position(&self) -> u64 {
        self.position
    }
}

/// Describes a GGUF file (metadata and tensor infos), then writes it.
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, GgufValue)>,
    keys: HashSet<String>,
    tensors: Vec<TensorSpec>,
    names: HashSet<String>,
    alignment: Option<u64>,
}

impl GgufWriter {
    /// An empty description: no metadata, no tensors.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata entry; entries are written in the order added. Setting
    /// `general.alignment` (a `u32` power of two) changes the data alignment.
    pub fn add_metadata(
        &mut self,
        key: impl Into<String>,
        value: impl Into<GgufValue>,
    ) -> Result<(), GgufWriteError> {
        let key = key.into();
        let value = value.into();
        if self.keys.contains(&key) {
            return Err(GgufWriteError::DuplicateKey { key });
        }
        if key == ALIGNMENT_KEY {
            match value {
                GgufValue::U32(a) if a.is_power_of_two() => self.alignment = Some(u64::from(a)),
                ref other => {
                    return Err(GgufWriteError::BadAlignment {
                        value: format!("{other:?}"),
                    })
                }
            }
        }
        self.keys.insert(key.clone());
        self.metadata.push((key, value));
        Ok(())
    }

    /// Adds a tensor info; tensors are stored in the order added.
    pub fn add_tensor(&mut self, spec: TensorSpec) -> Result<(), GgufWriteError> {
        let len = spec.name.len();
        if len == 0 || len >= MAX_TENSOR_NAME_BYTES {
            return Err(GgufWriteError::TensorName { name: spec.name, len });
        }
        if self.names.contains(&spec.name) {
            return Err(GgufWriteError::DuplicateTensor { name: spec.name });
        }
        let shape_error = |detail: String| GgufWriteError::TensorShape {
            name: spec.name.clone(),
            dims: spec.dims.clone(),
            dtype: spec.dtype,
            detail,
        };
        if spec.dims.is_empty() || spec.dims.len() > MAX_DIMS {
            return Err(shape_error(format!("expected 1 to {MAX_DIMS} dimensions")));
        }
        if spec.dims.contains(&0) || spec.dims.iter().any(|&d| d > i64::MAX as u64) {
            return Err(shape_error("every dimension must be 1 to 2^63 - 1".into()));
        }
        if !spec.dims[0].is_multiple_of(spec.dtype.block_elems() as u64) {
            return Err(shape_error(format!(
                "the innermost dimension is not a whole number of {}-element blocks",
                spec.dtype.block_elems()
            )));
        }
        match (spec.elems(), spec.byte_len()) {
            (Some(e), Some(b)) if e <= i64::MAX as u64 && b <= i64::MAX as u64 / 2 => {}
            _ => return Err(shape_error("the tensor is too large".into())),
        }
        self.names.insert(spec.name.clone());
        self.tensors.push(spec);
        Ok(())
    }

    /// The data alignment in bytes.
    pub fn alignment(&self) -> u64 {
        self.alignment.unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The tensors added so far, in file order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Each tensor's offset in the data section, in file order, and the data section's length
    /// (every tensor padded to the alignment).
    pub fn data_layout(&self) -> (Vec<u64>, u64) {
        let align = self.alignment();
        let mut offset = 0u64;
        let offsets = self
            .tensors
            .iter()
            .map(|t| {
                let at = offset;
                // add_tensor checked that byte_len exists and is far below u64::MAX.
                offset += padded(t.byte_len().unwrap_or(0), align);
                at
            })
            .collect();
        (offsets, offset)
    }

    /// The header (everything before the data section, padding included).
    fn header(&self) -> Vec<u8> {
        let (offsets, _) = self.data_layout();
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            encode_string(key, &mut out);
            out.extend_from_slice(&value.value_type().id().to_le_bytes());
            value.encode(&mut out);
        }
        for (t, offset) in self.tensors.iter().zip(offsets) {
            encode_string(&t.name, &mut out);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            t.dims
                .iter()
                .for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
            out.extend_from_slice(&ggml_type_id(t.dtype).to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        let len = padded(out.len() as u64, self.alignment()) as usize;
        out.resize(len, 0);
        out
    }

    /// The length of the header (everything before the data section, padding included).
    pub fn header_len(&self) -> u64 {
        self.header().len() as u64
    }

    /// The length of the whole file.
    pub fn file_len(&self) -> u64 {
        self.header_len() + self.data_layout().1
    }

    /// Writes the file at `path` (created or truncated) and returns its length in bytes.
    ///
    /// `fill(i, sink)` is called once per tensor, in file order, and must give tensor `i` exactly
    /// its [`TensorSpec::byte_len`] bytes through [`TensorSink::write`]; the writer adds the padding.
    /// If anything fails, the partial file is removed and the first error returned.
    pub fn write_file<E, F>(&self, path: &Path, fill: F) -> Result<u64, E>
    where
        E: From<GgufWriteError>,
        F: FnMut(usize, &mut TensorSink<'_>) -> Result<(), E>,
    {
        let io_error = |source| GgufWriteError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::create(path).map_err(io_error)?;
        let mut out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
        let result = self.write_to(&mut out, path, fill).and_then(|len| {
            let file = out.into_inner().map_err(|e| io_error(e.into_error()))?;
            file.sync_all().map_err(io_error)?;
            Ok(len)
        });
        if result.is_err() {
            // Best effort: the write error is what the caller needs to see.
            let _ = std::fs::remove_file(path);
        }
        result
    }

    /// Writes the file to `out`, naming `path` in errors; see [`GgufWriter::write_file`].
    /// `out` should be buffered; it is flushed at the end.
    pub fn write_to<E, F>(&self, out: &mut dyn Write, path: &Path, mut fill: F) -> Result<u64, E>
    where
        E: From<GgufWriteError>,
        F: FnMut(usize, &mut TensorSink<'_>) -> Result<(), E>,
    {
        let io_error = |source| GgufWriteError::Io {
            path: path.to_path_buf(),
            source,
        };
        let header = self.header();
        out.write_all(&header).map_err(io_error)?;
        let mut position = header.len() as u64;
        let align = self.alignment();
        let zeros = vec![0u8; align as usize];
        for (i, spec) in self.tensors.iter().enumerate() {
            let expected = spec.byte_len().unwrap_or(0);
            let mut sink = TensorSink {
                out: &mut *out,
                path,
                spec,
                expected,
                written: 0,
                position,
            };
            fill(i, &mut sink)?;
            if sink.written != expected {
                return Err(GgufWriteError::ShortTensor {
                    path: path.to_path_buf(),
                    tensor: spec.name.clone(),
                    expected,
                    written: sink.written,
                }
                .into());
            }
            let end = sink.position;
            let pad = (padded(expected, align) - expected) as usize;
            out.write_all(&zeros[..pad]).map_err(io_error)?;
            position = end + pad as u64;
        }
        out.flush().map_err(io_error)?;
        Ok(position)
    }
}

/// `n` rounded up to a multiple of `align` (a power of two).
fn padded(n: u64, align: u64) -> u64 {
    n.div_ceil(align) * align
}

/// A minimal GGUF reader for tests: parses a whole file from memory, checking the layout.
#[cfg(test)]
pub(crate) mod test_reader {
    use super::super::value::GgufValueType;
    use super::*;

    /// A parsed file.
    pub(crate) struct Parsed {
        pub version: u32,
        pub metadata: Vec<(String, GgufValue)>,
        /// Name, dims, ggml type id, offset in the data section.
        pub tensors: Vec<(String, Vec<u64>, u32, u64)>,
        pub data_start: usize,
    }

    impl Parsed {
        pub(crate) fn get(&self, key: &str) -> Option<&GgufValue> {
            self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
        }
    }

    struct Cursor<'a> {
        bytes: &'a [u8],
        at: usize,
    }

    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
            let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
            let end = end.ok_or_else(|| format!("truncated at byte {} (wanted {n})", self.at))?;
            let s = &self.bytes[self.at..end];
            self.at = end;
            Ok(s)
        }
        fn arr<const N: usize>(&mut self) -> Result<[u8; N], String> {
            let mut a = [0u8; N];
            a.copy_from_slice(self.take(N)?);
            Ok(a)
        }
        fn u32(&mut self) -> Result<u32, String> {
            Ok(u32::from_le_bytes(self.arr()?))
        }
        fn u64(&mut self) -> Result<u64, String> {
            Ok(u64::from_le_bytes(self.arr()?))
        }
        fn string(&mut self) -> Result<String, String> {
            let n = self.u64()? as usize;
            String::from_utf8(self.take(n)?.to_vec()).map_err(|e| e.to_string())
        }
        fn value(&mut self, id: u32) -> Result<GgufValue, String> {
            let ty = GgufValueType::from_id(id).ok_or_else(|| format!("value type {id}"))?;
            Ok(match ty {
                GgufValueType::U8 => GgufValue::U8(self.arr::<1>()?[0]),
                GgufValueType::I8 => GgufValue::I8(i8::from_le_bytes(self.arr()?)),
                GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.arr()?)),
                GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.arr()?)),
                GgufValueType::U32 => GgufValue::U32(self.u32()?),
                GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.arr()?)),
                GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.arr()?)),
                GgufValueType::Bool => match self.arr::<1>()?[0] {
                    b @ (0 | 1) => GgufValue::Bool(b == 1),
                    b => return Err(format!("bool byte {b}")),
                },
                GgufValueType::String => GgufValue::String(self.string()?),
                GgufValueType::Array => GgufValue::Array(self.array()?),
                GgufValueType::U64 => GgufValue::U64(self.u64()?),
                GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.arr()?)),
                GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.arr()?)),
            })
        }
        fn array(&mut self) -> Result<GgufArray, String> {
            let id = self.u32()?;
            let ty = GgufValueType::from_id(id).ok_or_else(|| format!("array element type {id}"))?;
            let n = self.u64()? as usize;
            let items = (0..n).map(|_| self.value(id)).collect::<Result<Vec<_>, _>>()?;
            macro_rules! collect {
                ($variant:ident) => {
                    GgufArray::$variant(
                        items
                            .into_iter()
                            .map(|v| match v {
                                GgufValue::$variant(x) => x,
                                _ => unreachable!("read as the array's element type"),
                            })
                            .collect(),
                    )
                };
            }
            Ok(match ty {
                GgufValueType::U8 => collect!(U8),
                GgufValueType::I8 => collect!(I8),
                GgufValueType::U16 => collect!(U16),
                GgufValueType::I16 => collect!(I16),
                GgufValueType::U32 => collect!(U32),
                GgufValueType::I32 => collect!(I32),
                GgufValueType::F32 => collect!(F32),
                GgufValueType::Bool => collect!(Bool),
                GgufValueType::String => collect!(String),
                GgufValueType::Array => GgufArray::Array(
                    items
                        .into_iter()
                        .map(|v| match v {
                            GgufValue::Array(x) => x,
                            _ => unreachable!("read as the array's element type"),
                        })
                        .collect(),
                ),
                GgufValueType::U64 => collect!(U64),
                GgufValueType::I64 => collect!(I64),
                GgufValueType::F64 => collect!(F64),
            })
        }
    }

    /// Parses `bytes`; checks the magic, the alignment of the data section and of every tensor,
    /// that tensors do not overlap and that the file is long enough.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed, String> {
        let mut c = Cursor { bytes, at: 0 };
        if c.take(4)? != GGUF_MAGIC {
            return Err("bad magic".into());
        }
        let version = c.u32()?;
        let n_tensors = c.u64()?;
        let n_kv = c.u64()?;
        let mut metadata = Vec::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let ty = c.u32()?;
            metadata.push((key, c.value(ty)?));
        }
        let mut tensors = Vec::new();
        for _ in 0..n_tensors {
            let name = c.string()?;
            let n_dims = c.u32()?;
            let dims = (0..n_dims).map(|_| c.u64()).collect::<Result<Vec<_>, _>>()?;
            let ty = c.u32()?;
            let offset = c.u64()?;
            tensors.push((name, dims, ty, offset));
        }
        let align = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            Some((_, GgufValue::U32(a))) => u64::from(*a),
            Some(_) => return Err("bad alignment type".into()),
            None => DEFAULT_ALIGNMENT,
        };
        let data_start = padded(c.at as u64, align) as usize;
        if bytes[c.at..data_start.min(bytes.len())].iter().any(|&b| b != 0) {
            return Err("non-zero header padding".into());
        }
        let mut end = 0u64;
        for (name, dims, ty, offset) in &tensors {
            let dtype = DType::ALL
                .into_iter()
                .find(|&d| ggml_type_id(d) == *ty)
                .ok_or_else(|| format!("{name}: unknown type {ty}"))?;
            let len = TensorSpec::new(name.clone(), dims, dtype)
                .byte_len()
                .ok_or_else(|| format!("{name}: bad dims"))?;
            if offset % align != 0 || *offset < end {
                return Err(format!("{name}: offset {offset} misaligned or overlapping"));
            }
            end = offset + len;
        }
        if (data_start as u64 + end) > bytes.len() as u64 {
            return Err("file shorter than its tensors".into());
        }
        Ok(Parsed {
            version,
            metadata,
            tensors,
            data_start,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::test_reader::parse;
    use super::*;

    fn every_value_type() -> Vec<(&'static str, GgufValue)> {
        vec![
            ("t.u8", GgufValue::U8(200)),
            ("t.i8", GgufValue::I8(-100)),
            ("t.u16", GgufValue::U16(60_000)),
            ("t.i16", GgufValue::I16(-30_000)),
            ("t.u32", GgufValue::U32(4_000_000_000)),
            ("t.i32", GgufValue::I32(-2_000_000_000)),
            ("t.f32", GgufValue::F32(1e-6)),
            ("t.bool", GgufValue::Bool(true)),
            ("t.string", GgufValue::from("gemma3 ▁ü")),
            ("t.u64", GgufValue::U64(u64::MAX - 1)),
            ("t.i64", GgufValue::I64(i64::MIN + 1)),
            ("t.f64", GgufValue::F64(-2.5e300)),
            ("t.a.u8", vec![1u8, 2, 3].into()),
            ("t.a.i8", vec![-1i8, 0, 1].into()),
            ("t.a.u16", vec![1u16, 65_535].into()),
            ("t.a.i16", vec![-1i16, 7].into()),
            ("t.a.u32", vec![7u32].into()),
            ("t.a.i32", vec![3i32, 6, -1].into()),
            ("t.a.f32", vec![-1000.0f32, 0.0, -0.0].into()),
            ("t.a.bool", vec![false, true].into()),
            (
                "t.a.string",
                vec!["<pad>".to_string(), String::new(), "<0x0A>".into()].into(),
            ),
            ("t.a.u64", vec![u64::MAX].into()),
            ("t.a.i64", vec![i64::MIN].into()),
            ("t.a.f64", vec![0.5f64].into()),
            ("t.a.empty", GgufArray::F32(vec![]).into()),
            (
                "t.a.array",
                GgufArray::Array(vec![
                    GgufArray::I32(vec![1, 2]),
                    GgufArray::String(vec!["x".into()]),
                ])
                .into(),
            ),
        ]
    }

    fn tensor_bytes(i: usize, len: u64) -> Vec<u8> {
        (0..len).map(|b| (b as usize * 31 + i * 7 + 1) as u8).collect()
    }

    fn write_sample(alignment: Option<u32>) -> (GgufWriter, Vec<u8>) {
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", "gemma3").unwrap();
        if let Some(a) = alignment {
            w.add_metadata(ALIGNMENT_KEY, a).unwrap();
        }
        for (k, v) in every_value_type() {
            w.add_metadata(k, v).unwrap();
        }
        w.add_tensor(TensorSpec::new("norm", &[3], DType::F32)).unwrap();
        w.add_tensor(TensorSpec::new("q8", &[64, 3], DType::Q8_0))
            .unwrap();
        w.add_tensor(TensorSpec::new("q4k", &[256, 2, 1], DType::Q4K))
            .unwrap();
        w.add_tensor(TensorSpec::new("half", &[5], DType::F16)).unwrap();
        let mut bytes = Vec::new();
        let path = Path::new("memory.gguf");
        let len = w
            .write_to(&mut bytes, path, |i, sink: &mut TensorSink<'_>| {
                let data = tensor_bytes(i, sink.spec().byte_len().unwrap());
                // Two writes, to check that pieces concatenate.
                let (a, b) = data.split_at(data.len() / 3);
                sink.write(a)?;
                sink.write(b)?;
                assert_eq!(sink.remaining(), 0);
                Ok::<(), GgufWriteError>(())
            })
            .unwrap();
        assert_eq!(len, bytes.len() as u64);
        assert_eq!(len, w.file_len());
        (w, bytes)
    }

    #[test]
    fn round_trips_every_value_type_and_tensor_layout() {
        let (w, bytes) = write_sample(None);
        let parsed = parse(&bytes).unwrap();
        assert_eq!(parsed.version, 3);
        assert_eq!(
            parsed.get("general.architecture"),
            Some(&GgufValue::from("gemma3"))
        );
        let expected = every_value_type();
        assert_eq!(parsed.metadata.len(), expected.len() + 1);
        for ((k, v), (ek, ev)) in parsed.metadata[1..].iter().zip(&expected) {
            assert_eq!((k.as_str(), v), (*ek, ev));
        }
        assert_eq!(parsed.data_start as u64, w.header_len());
        assert_eq!(parsed.data_start % 32, 0);
        let (offsets, data_len) = w.data_layout();
        assert_eq!(offsets, vec![0, 32, 32 + 224, 32 + 224 + 288]);
        assert_eq!(data_len, 32 + 224 + 288 + 32);
        let names: Vec<_> = parsed
            .tensors
            .iter()
            .map(|t| (t.0.as_str(), t.1.clone(), t.2))
            .collect();
        assert_eq!(
            names,
            vec![
                ("norm", vec![3], 0),
                ("q8", vec![64, 3], 8),
                ("q4k", vec![256, 2, 1], 12),
                ("half", vec![5], 1),
            ]
        );
        for (i, (_, _, _, offset)) in parsed.tensors.iter().enumerate() {
            let len = w.tensors()[i].byte_len().unwrap();
            let start = parsed.data_start + *offset as usize;
            assert_eq!(
                &bytes[start..start + len as usize],
                tensor_bytes(i, len).as_slice()
            );
            let pad_end = start + padded(len, 32) as usize;
            assert!(bytes[start + len as usize..pad_end].iter().all(|&b| b == 0));
        }
        assert_eq!(bytes.len(), parsed.data_start + data_len as usize);
    }

    #[test]
    fn honours_general_alignment() {
        let (w, bytes) = write_sample(Some(256));
        let parsed = parse(&bytes).unwrap();
        assert_eq!(w.alignment(), 256);
        assert_eq!(parsed.data_start % 256, 0);
        assert_eq!(w.data_layout().0, vec![0, 256, 512, 1024]);
        assert_eq!(bytes.len() % 256, 0);
    }

    #[test]
    fn header_bytes_are_as_specified() {
        let mut w = GgufWriter::new();
        w.add_metadata("k", true).unwrap();
        w.add_tensor(TensorSpec::new("t", &[2, 1], DType::F32)).unwrap();
        let mut bytes = Vec::new();
        w.write_to(&mut bytes, Path::new("m"), |_, s: &mut TensorSink<'_>| {
            s.write(&[1, 0, 0, 0, 2, 0, 0, 0])
        })
        .unwrap();
        let mut expected = b"GGUF".to_vec();
        expected.extend_from_slice(&3u32.to_le_bytes());
        expected.extend_from_slice(&1u64.to_le_bytes()); // tensors
        expected.extend_from_slice(&1u64.to_le_bytes()); // metadata entries
        expected.extend_from_slice(&1u64.to_le_bytes());
        expected.push(b'k');
        expected.extend_from_slice(&7u32.to_le_bytes());
        expected.push(1);
        expected.extend_from_slice(&1u64.to_le_bytes());
        expected.push(b't');
        expected.extend_from_slice(&2u32.to_le_bytes());
        expected.extend_from_slice(&2u64.to_le_bytes());
        expected.extend_from_slice(&1u64.to_le_bytes());
        expected.extend_from_slice(&0u32.to_le_bytes());
        expected.extend_from_slice(&0u64.to_le_bytes());
        expected.resize(96, 0);
        expected.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        expected.resize(128, 0);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn rejects_bad_descriptions() {
        let mut w = GgufWriter::new();
        w.add_metadata("a", 1u32).unwrap();
        assert!(matches!(
            w.add_metadata("a", 2u32),
            Err(GgufWriteError::DuplicateKey { .. })
        ));
        assert!(matches!(
            w.add_metadata(ALIGNMENT_KEY, 48u32),
            Err(GgufWriteError::BadAlignment { .. })
        ));
        assert!(matches!(
            w.add_metadata(ALIGNMENT_KEY, 64u64),
            Err(GgufWriteError::BadAlignment { .. })
        ));
        w.add_tensor(TensorSpec::new("x", &[32], DType::Q8_0)).unwrap();
        assert!(matches!(
            w.add_tensor(TensorSpec::new("x", &[32], DType::Q8_0)),
            Err(GgufWriteError::DuplicateTensor { .. })
        ));
        let long = "n".repeat(64);
        assert!(matches!(
            w.add_tensor(TensorSpec::new(long, &[1], DType::F32)),
            Err(GgufWriteError::TensorName { len: 64, .. })
        ));
        for dims in [
            &[][..],
            &[640, 2],
            &[256, 0],
            &[256, 1, 1, 1, 1],
            &[256, u64::MAX / 2],
        ] {
            let err = w.add_tensor(TensorSpec::new("y", dims, DType::Q4K)).unwrap_err();
            assert!(
                matches!(err, GgufWriteError::TensorShape { .. }),
                "{dims:?}: {err}"
            );
        }
    }

    #[test]
    fn refuses_too_many_or_too_few_bytes() {
        let mut w = GgufWriter::new();
        w.add_tensor(TensorSpec::new("x", &[4], DType::F32)).unwrap();
        let mut out = Vec::new();
        let err = w
            .write_to(&mut out, Path::new("f.gguf"), |_, s: &mut TensorSink<'_>| {
                s.write(&[0; 17])
            })
            .unwrap_err();
        assert!(
            matches!(
                err,
                GgufWriteError::Overrun {
                    expected: 16,
                    attempted: 17,
                    ..
                }
            ),
            "{err}"
        );
        let err = w
            .write_to(
                &mut Vec::new(),
                Path::new("f.gguf"),
                |_, s: &mut TensorSink<'_>| s.write(&[0; 15]),
            )
            .unwrap_err();
        assert!(
            matches!(err, GgufWriteError::ShortTensor { written: 15, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("f.gguf"));
    }

    #[test]
    fn write_file_creates_the_file_and_removes_it_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.gguf");
        let mut w = GgufWriter::new();
        w.add_tensor(TensorSpec::new("x", &[4], DType::F32)).unwrap();
        let len = w
            .write_file(&path, |_, s: &mut TensorSink<'_>| s.write(&[0; 16]))
            .unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
        assert!(parse(&std::fs::read(&path).unwrap()).is_ok());
        let failed: Result<u64, GgufWriteError> =
            w.write_file(&path, |_, s: &mut TensorSink<'_>| s.write(&[0; 8]));
        assert!(failed.is_err());
        assert!(!path.exists());
        let missing = dir.path().join("no/such/dir/x.gguf");
        let err = w
            .write_file(&missing, |_, s: &mut TensorSink<'_>| s.write(&[0; 16]))
            .unwrap_err();
        assert!(matches!(err, GgufWriteError::Io { .. }));
        assert!(err.to_string().contains("no/such/dir/x.gguf"), "{err}");
    }
}

#[cfg(test)]
mod type_id_tests {
    use tandem_backend_api::DType;

    #[test]
    fn every_dtype_has_a_ggml_id_and_round_trips() {
        for d in DType::ALL {
            let id = super::ggml_type_id(d);
            assert_ne!(id, u32::MAX, "{d}");
            assert_eq!(crate::checkpoint::gguf::reader::dtype_from_ggml(id), Some(d));
        }
    }
}
