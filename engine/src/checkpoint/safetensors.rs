//! Memory-mapped safetensors checkpoints: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`.
//!
//! The format of one file: a little-endian `u64` header length `n`, `n` bytes of JSON mapping each
//! tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the byte
//! after the header; a `__metadata__` entry is ignored), then the raw little-endian data. The header
//! is parsed and checked here, so a damaged or truncated file is a typed [`SafetensorsError`] naming
//! the file and tensor, never a panic. Tensors of dtypes other than F32/F16/BF16 may exist in a file
//! (a vision tower's buffers, say); they fail only when asked for with [`SafetensorsCheckpoint::get`].

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use memmap2::Mmap;
use serde_json::Value;

/// The single-file checkpoint name Hugging Face uses.
pub const SINGLE_FILE_NAME: &str = "model.safetensors";
/// The shard index name Hugging Face uses.
pub const INDEX_FILE_NAME: &str = "model.safetensors.index.json";
/// Headers larger than this are rejected as corrupt (real headers are a few MB at most).
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// The element types the engine reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StDtype {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (the top half of a binary32).
    BF16,
}

impl StDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            StDtype::F32 => 4,
            StDtype::F16 | StDtype::BF16 => 2,
        }
    }

    /// The name safetensors headers use ("F32", "F16", "BF16").
    pub fn name(self) -> &'static str {
        match self {
            StDtype::F32 => "F32",
            StDtype::F16 => "F16",
            StDtype::BF16 => "BF16",
        }
    }
}

impl std::fmt::Display for StDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor of a checkpoint, borrowed from its memory map.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// The tensor's name in the checkpoint.
    pub name: &'a str,
    /// Element type of `data`.
    pub dtype: StDtype,
    /// Dimensions, outermost first (row-major).
    pub shape: &'a [usize],
    /// Raw little-endian elements; `data.len() == numel() * dtype.size()`. Not necessarily aligned.
    pub data: &'a [u8],
    /// The file the tensor lives in.
    pub file: &'a Path,
}

impl TensorRef<'_> {
    /// Number of elements (the product of `shape`; 1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements widened to f32; exact for every dtype (f16 and bf16 are subsets of f32).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.dtype {
            StDtype::F32 => match bytemuck::try_cast_slice::<u8, f32>(self.data) {
                Ok(v) if cfg!(target_endian = "little") => v.to_vec(),
                _ => self
                    .data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            },
            StDtype::F16 => match bytemuck::try_cast_slice::<u8, half::f16>(self.data) {
                Ok(v) if cfg!(target_endian = "little") => half::slice::HalfFloatSliceExt::to_f32_vec(v),
                _ => self
                    .data
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
            },
            StDtype::BF16 => match bytemuck::try_cast_slice::<u8, half::bf16>(self.data) {
                Ok(v) if cfg!(target_endian = "little") => half::slice::HalfFloatSliceExt::to_f32_vec(v),
                _ => self
                    .data
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
            },
        }
    }

    /// Checks the tensor's shape; the error names the file, the tensor and both shapes.
    pub fn expect_shape(&self, shape: &[usize]) -> Result<(), SafetensorsError> {
        if self.shape == shape {
            return Ok(());
        }
        Err(SafetensorsError::ShapeMismatch {
            path: self.file.to_path_buf(),
            tensor: self.name.to_string(),
            expected: shape.to_vec(),
            found: self.shape.to_vec(),
        })
    }

    /// Checks the tensor's dtype; the error names the file, the tensor and both dtypes.
    pub fn expect_dtype(&self, dtype: StDtype) -> Result<(), SafetensorsError> {
        if self.dtype == dtype {
            return Ok(());
        }
        Err(SafetensorsError::DtypeMismatch {
            path: self.file.to_path_buf(),
            tensor: self.name.to_string(),
            expected: dtype,
            found: self.dtype,
        })
    }
}

/// Why a checkpoint could not be opened, or a tensor not read from it.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    /// A file could not be opened, measured or mapped.
    #[error("cannot read checkpoint file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The directory holds neither checkpoint layout.
    #[error(
        "checkpoint directory {} has neither {SINGLE_FILE_NAME} nor {INDEX_FILE_NAME}",
        dir.display()
    )]
    NoCheckpoint {
        /// The directory.
        dir: PathBuf,
    },
    /// `open_files` was given no files.
    #[error("no safetensors files given to open")]
    NoFiles,
    /// The file cannot even hold the 8-byte header length.
    #[error("safetensors file {} is {len} bytes long; expected at least 8 (the header length)", path.display())]
    TooShort {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
    },
    /// The header length is implausibly large.
    #[error(
        "safetensors file {} declares a {header_len}-byte header; expected at most {MAX_HEADER_BYTES} \
         (the file is corrupt or not safetensors)",
        path.display()
    )]
    HeaderTooLarge {
        /// The file.
        path: PathBuf,
        /// The declared header length.
        header_len: u64,
    },
    /// The header runs past the end of the file.
    #[error(
        "safetensors file {} declares a {header_len}-byte header but is only {file_len} bytes long \
         (truncated or not safetensors)",
        path.display()
    )]
    HeaderPastEnd {
        /// The file.
        path: PathBuf,
        /// The declared header length.
        header_len: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The header is not UTF-8 JSON, or not an object.
    #[error("safetensors file {} has a header that is not a JSON object: {detail}", path.display())]
    HeaderNotJson {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A header entry lacks a field or has one of the wrong type.
    #[error("tensor {tensor} in {} has a malformed header entry: {detail}", path.display())]
    BadEntry {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        detail: String,
    },
    /// `data_offsets` has begin > end.
    #[error(
        "tensor {tensor} in {} has data_offsets [{begin}, {end}] out of order; expected begin <= end",
        path.display()
    )]
    OffsetsOutOfOrder {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Start of the data, relative to the end of the header.
        begin: u64,
        /// End of the data (exclusive), relative to the end of the header.
        end: u64,
    },
    /// `data_offsets` points past the end of the file.
    #[error(
        "tensor {tensor} in {} has data_offsets ending at {end} but the file holds only {data_len} \
         data bytes after its header (the file is truncated)",
        path.display()
    )]
    DataPastEnd {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// End of the data (exclusive), relative to the end of the header.
        end: u64,
        /// Bytes after the header.
        data_len: u64,
    },
    /// Two tensors' data ranges overlap.
    #[error(
        "tensor {tensor} in {} has data_offsets [{begin}, {end}] overlapping those of tensor {other}",
        path.display()
    )]
    Overlap {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The tensor it overlaps.
        other: String,
        /// Start of the data.
        begin: u64,
        /// End of the data (exclusive).
        end: u64,
    },
    /// The data length does not match dtype size times the shape's product.
    #[error(
        "tensor {tensor} in {} has {found} data bytes; expected {expected} ({dtype} x shape {shape:?})",
        path.display()
    )]
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype named in the header.
        dtype: String,
        /// The shape named in the header.
        shape: Vec<usize>,
        /// Bytes the dtype and shape call for (saturated at u64::MAX on overflow).
        expected: u64,
        /// Bytes `data_offsets` spans.
        found: u64,
    },
    /// The tensor's dtype is not one the engine reads.
    #[error("tensor {tensor} in {} has dtype {dtype}; expected F32, F16 or BF16", path.display())]
    UnsupportedDtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype named in the header.
        dtype: String,
    },
    /// The index file is unreadable JSON or lacks a proper `weight_map`.
    #[error("shard index {} is malformed: {detail}", path.display())]
    BadIndex {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A shard named by the index does not exist.
    #[error("shard {} listed in index {} is missing: {source}", shard.display(), index.display())]
    ShardMissing {
        /// The index file.
        index: PathBuf,
        /// The shard's path.
        shard: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The index says a tensor is in a shard that does not hold it.
    #[error(
        "tensor {tensor} is listed in index {} as being in {} but that shard does not contain it",
        index.display(),
        shard.display()
    )]
    MissingInShard {
        /// The index file.
        index: PathBuf,
        /// The shard the index names.
        shard: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// Two files hold a tensor of the same name.
    #[error("tensor {tensor} appears in both {} and {}", first.display(), second.display())]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
        /// The first file holding it.
        first: PathBuf,
        /// The second file holding it.
        second: PathBuf,
    },
    /// A tensor the caller asked for is not in the checkpoint.
    #[error("tensor {tensor} is not in the checkpoint at {}", dir.display())]
    MissingTensor {
        /// The tensor.
        tensor: String,
        /// The checkpoint's directory.
        dir: PathBuf,
    },
    /// A tensor has a shape other than the one the model needs.
    #[error("tensor {tensor} in {} has shape {found:?}; expected {expected:?}", path.display())]
    ShapeMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The shape the model needs.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor has a dtype other than the one the caller needs.
    #[error("tensor {tensor} in {} has dtype {found}; expected {expected}", path.display())]
    DtypeMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype the caller needs.
        expected: StDtype,
        /// The dtype in the file.
        found: StDtype,
    },
}

/// A tensor's dtype as the header names it.
#[derive(Debug, Clone)]
enum EntryDtype {
    Supported(StDtype),
    Other(String),
}

/// Where one tensor lives.
#[derive(Debug, Clone)]
struct Entry {
    shard: usize,
    dtype: EntryDtype,
    shape: Vec<usize>,
    /// Absolute byte range in the shard's map.
    start: usize,
    end: usize,
}

/// One mapped file.
struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

/// A checkpoint's tensors, memory-mapped from one or more safetensors files.
pub struct SafetensorsCheckpoint {
    /// The directory (for `open_files`, the first file's directory), for messages.
    source: PathBuf,
    shards: Vec<Shard>,
    tensors: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for SafetensorsCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsCheckpoint")
            .field("source", &self.source)
            .field("files", &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl SafetensorsCheckpoint {
    /// Opens a Hugging Face model directory: `model.safetensors` if present (transformers looks
    /// for it first), else `model.safetensors.index.json` and the shards it lists.
    pub fn open_dir(dir: &Path) -> Result<Self, SafetensorsError> {
        let single = dir.join(SINGLE_FILE_NAME);
        if single.is_file() {
            let mut ckpt = Self::open_files(&[single])?;
            ckpt.source = dir.to_path_buf();
            return Ok(ckpt);
        }
        let index = dir.join(INDEX_FILE_NAME);
        if index.is_file() {
            return Self::open_index(dir, &index);
        }
        Err(SafetensorsError::NoCheckpoint {
            dir: dir.to_path_buf(),
        })
    }

    /// Opens the given safetensors files as one checkpoint; a name in two files is an error.
    pub fn open_files(files: &[PathBuf]) -> Result<Self, SafetensorsError> {
        let first = files.first().ok_or(SafetensorsError::NoFiles)?;
        let source = first
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let mut ckpt = SafetensorsCheckpoint {
            source,
            shards: Vec::new(),
            tensors: BTreeMap::new(),
        };
        for path in files {
            let file = File::open(path).map_err(|source| SafetensorsError::Io {
                path: path.clone(),
                source,
            })?;
            ckpt.add_shard(path, &file)?;
        }
        Ok(ckpt)
    }

    fn open_index(dir: &Path, index: &Path) -> Result<Self, SafetensorsError> {
        let bad = |detail: String| SafetensorsError::BadIndex {
            path: index.to_path_buf(),
            detail,
        };
        let text = std::fs::read_to_string(index).map_err(|source| SafetensorsError::Io {
            path: index.to_path_buf(),
            source,
        })?;
        let root: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let weight_map = root
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("expected an object field `weight_map`".to_string()))?;

        // Shards in first-mention order, and which shard each listed tensor should be in.
        let mut shard_names: Vec<&str> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::new();
        let mut listed: Vec<(&str, &str)> = Vec::with_capacity(weight_map.len());
        for (tensor, shard) in weight_map {
            let shard = shard.as_str().ok_or_else(|| {
                bad(format!(
                    "weight_map entry for tensor {tensor} is not a file name string"
                ))
            })?;
            if !is_plain_relative(shard) {
                return Err(bad(format!(
                    "weight_map entry for tensor {tensor} names {shard:?}; expected a file name \
                     inside {}",
                    dir.display()
                )));
            }
            if seen.insert(shard) {
                shard_names.push(shard);
            }
            listed.push((tensor, shard));
        }

        let mut ckpt = SafetensorsCheckpoint {
            source: dir.to_path_buf(),
            shards: Vec::new(),
            tensors: BTreeMap::new(),
        };
        for name in &shard_names {
            let path = dir.join(name);
            let file = File::open(&path).map_err(|source| SafetensorsError::ShardMissing {
                index: index.to_path_buf(),
                shard: path.clone(),
                source,
            })?;
            ckpt.add_shard(&path, &file)?;
        }
        for (tensor, shard) in listed {
            let expected = dir.join(shard);
            let found_in = ckpt
                .tensors
                .get(tensor)
                .map(|e| ckpt.shards[e.shard].path.as_path());
            if found_in != Some(expected.as_path()) {
                return Err(SafetensorsError::MissingInShard {
                    index: index.to_path_buf(),
                    shard: expected,
                    tensor: tensor.to_string(),
                });
            }
        }
        Ok(ckpt)
    }

    /// Maps one file, checks its header and adds its tensors.
    fn add_shard(&mut self, path: &Path, file: &File) -> Result<(), SafetensorsError> {
        let io = |source| SafetensorsError::Io {
            path: path.to_path_buf(),
            source,
        };
        let len = file.metadata().map_err(io)?.len();
        if len < 8 {
            return Err(SafetensorsError::TooShort {
                path: path.to_path_buf(),
                len,
            });
        }
        let mmap = map_file(file).map_err(io)?;
        let shard_index = self.shards.len();
        let entries = parse_header(path, &mmap)?;
        for (name, _) in &entries {
            if let Some(prev) = self.tensors.get(name) {
                return Err(SafetensorsError::DuplicateTensor {
                    tensor: name.clone(),
                    first: self.shards[prev.shard].path.clone(),
                    second: path.to_path_buf(),
                });
            }
        }
        for (name, mut entry) in entries {
            entry.shard = shard_index;
            self.tensors.insert(name, entry);
        }
        self.shards.push(Shard {
            path: path.to_path_buf(),
            mmap,
        });
        Ok(())
    }

    /// Every tensor name, in sorted order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the checkpoint holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// True when a tensor of this name exists (whatever its dtype).
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The checkpoint's directory (for `open_files`, the first file's directory).
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The mapped files, in the order they were opened.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// A tensor by name; fails if it is missing or its dtype is not F32, F16 or BF16.
    pub fn get(&self, name: &str) -> Result<TensorRef<'_>, SafetensorsError> {
        let (key, entry) =
            self.tensors
                .get_key_value(name)
                .ok_or_else(|| SafetensorsError::MissingTensor {
                    tensor: name.to_string(),
                    dir: self.source.clone(),
                })?;
        let shard = &self.shards[entry.shard];
        let dtype = match &entry.dtype {
            EntryDtype::Supported(d) => *d,
            EntryDtype::Other(d) => {
                return Err(SafetensorsError::UnsupportedDtype {
                    path: shard.path.clone(),
                    tensor: name.to_string(),
                    dtype: d.clone(),
                })
            }
        };
        Ok(TensorRef {
            name: key,
            dtype,
            shape: &entry.shape,
            // In bounds: parse_header checked start <= end <= the map's length.
            data: &shard.mmap[entry.start..entry.end],
            file: &shard.path,
        })
    }

    /// Gives back the mapped pages under `data` (a tensor's bytes from one of the shards) once
    /// the caller has copied them ([`crate::checkpoint::source::WeightSource::release`]).
    pub fn release(&self, data: &[u8]) {
        for shard in &self.shards {
            crate::checkpoint::pages::release(&shard.mmap, data);
        }
    }

    /// A tensor by name, checked to have `shape`.
    pub fn get_with_shape(&self, name: &str, shape: &[usize]) -> Result<TensorRef<'_>, SafetensorsError> {
        let t = self.get(name)?;
        t.expect_shape(shape)?;
        Ok(t)
    }

    /// Total bytes of tensor data (all tensors, all dtypes; headers excluded).
    pub fn total_bytes(&self) -> u64 {
        self.tensors.values().map(|e| (e.end - e.start) as u64).sum()
    }
}

/// Maps a whole file read-only.
fn map_file(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: `Mmap::map` is unsafe because the mapping aliases the file: if another process
    // truncates or rewrites the file while it is mapped, reads through the map may change under us
    // or fault (SIGBUS). Checkpoint files are treated as immutable while a model is loaded; that is
    // the assumption here, as in every mmap-based loader (candle, safetensors, llama.cpp). Every
    // offset read through the map is bounds-checked against the map's length first.
    unsafe { Mmap::map(file) }
}

/// True for a path made only of normal components (no root, no `..`), as shard names must be.
fn is_plain_relative(name: &str) -> bool {
    let p = Path::new(name);
    !name.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)))
}

/// Bytes per element of every dtype safetensors defines, to check data lengths; None for
/// sub-byte or unknown dtypes, whose lengths are not checked.
fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

/// Parses and checks the header of a mapped safetensors file; entries come back with `shard` 0.
fn parse_header(path: &Path, bytes: &[u8]) -> Result<Vec<(String, Entry)>, SafetensorsError> {
    let file_len = bytes.len() as u64;
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(bytes.get(..8).ok_or(SafetensorsError::TooShort {
        path: path.to_path_buf(),
        len: file_len,
    })?);
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES {
        return Err(SafetensorsError::HeaderTooLarge {
            path: path.to_path_buf(),
            header_len,
        });
    }
    // header_len <= 100 MB, so neither the sum nor the casts below can overflow.
    let data_start = 8 + header_len;
    if data_start > file_len {
        return Err(SafetensorsError::HeaderPastEnd {
            path: path.to_path_buf(),
            header_len,
            file_len,
        });
    }
    let data_len = file_len - data_start;
    let header_bytes = &bytes[8..data_start as usize];
    let not_json = |detail: String| SafetensorsError::HeaderNotJson {
        path: path.to_path_buf(),
        detail,
    };
    let header_text = std::str::from_utf8(header_bytes).map_err(|e| not_json(format!("not UTF-8: {e}")))?;
    let header: Value = serde_json::from_str(header_text).map_err(|e| not_json(e.to_string()))?;
    let map = match header {
        Value::Object(map) => map,
        other => return Err(not_json(format!("found {other}"))),
    };

    let mut entries: Vec<(String, Entry)> = Vec::with_capacity(map.len());
    for (name, value) in map {
        if name == "__metadata__" {
            continue;
        }
        let bad = |detail: String| SafetensorsError::BadEntry {
            path: path.to_path_buf(),
            tensor: name.clone(),
            detail,
        };
        let obj = value
            .as_object()
            .ok_or_else(|| bad(format!("expected an object, found {value}")))?;
        let dtype = obj
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("expected a string field `dtype`".to_string()))?;
        let shape = obj
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("expected a list field `shape`".to_string()))?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| bad("`shape` must hold non-negative integers".to_string()))?;
        let offsets = obj
            .get("data_offsets")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 2)
            .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
            .ok_or_else(|| bad("expected `data_offsets` as two non-negative integers".to_string()))?;
        let (begin, end) = offsets;
        if begin > end {
            return Err(SafetensorsError::OffsetsOutOfOrder {
                path: path.to_path_buf(),
                tensor: name,
                begin,
                end,
            });
        }
        if end > data_len {
            return Err(SafetensorsError::DataPastEnd {
                path: path.to_path_buf(),
                tensor: name,
                end,
                data_len,
            });
        }
        let numel = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        if let Some(size) = dtype_size(dtype) {
            let expected = numel.and_then(|n| n.checked_mul(size));
            if expected != Some(end - begin) {
                return Err(SafetensorsError::SizeMismatch {
                    path: path.to_path_buf(),
                    tensor: name,
                    dtype: dtype.to_string(),
                    shape,
                    expected: expected.unwrap_or(u64::MAX),
                    found: end - begin,
                });
            }
        }
        let dtype = match dtype {
            "F32" => EntryDtype::Supported(StDtype::F32),
            "F16" => EntryDtype::Supported(StDtype::F16),
            "BF16" => EntryDtype::Supported(StDtype::BF16),
            other => EntryDtype::Other(other.to_string()),
        };
        entries.push((
            name,
            Entry {
                shard: 0,
                dtype,
                shape,
                // end <= data_len and data_start + data_len == file_len, which fits in usize
                // because the file is mapped.
                start: (data_start + begin) as usize,
                end: (data_start + end) as usize,
            },
        ));
    }

    // No two tensors may share bytes (empty tensors share nothing).
    let mut by_offset: Vec<&(String, Entry)> = entries.iter().filter(|(_, e)| e.end > e.start).collect();
    by_offset.sort_by_key(|(_, e)| (e.start, e.end));
    for pair in by_offset.windows(2) {
        let (prev_name, prev) = pair[0];
        let (name, e) = pair[1];
        if e.start < prev.end {
            return Err(SafetensorsError::Overlap {
                path: path.to_path_buf(),
                tensor: name.clone(),
                other: prev_name.clone(),
                begin: (e.start as u64) - data_start,
                end: (e.end as u64) - data_start,
            });
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// Writes a safetensors file from a raw header and data.
    fn write_raw(path: &Path, header: &str, data: &[u8]) {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(data);
        std::fs::write(path, bytes).unwrap();
    }

    /// Writes a well-formed safetensors file of (name, dtype, shape, bytes) tensors.
    fn write_st(path: &Path, tensors: &[(&str, &str, &[usize], Vec<u8>)]) {
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        let mut data = Vec::new();
        for (name, dtype, shape, bytes) in tensors {
            let begin = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
            );
        }
        write_raw(path, &Value::Object(header).to_string(), &data);
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn f16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect()
    }
    fn bf16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| bf16::from_f32(*x).to_le_bytes()).collect()
    }

    fn open_err(path: &Path) -> String {
        match SafetensorsCheckpoint::open_files(&[path.to_path_buf()]) {
            Ok(c) => panic!("expected an error, got {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn assert_names(msg: &str, file: &Path, tensor: Option<&str>) {
        assert!(msg.contains(&file.display().to_string()), "no file in: {msg}");
        if let Some(t) = tensor {
            assert!(msg.contains(t), "no tensor {t} in: {msg}");
        }
    }

    #[test]
    fn reads_f32_f16_bf16_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SINGLE_FILE_NAME);
        let vals = [1.0f32, -2.5, 0.15625, 65504.0, -0.0, 3.0e-5];
        write_st(
            &path,
            &[
                ("a.f32", "F32", &[2, 3], f32_bytes(&vals)),
                ("b.f16", "F16", &[6], f16_bytes(&vals)),
                ("c.bf16", "BF16", &[3, 2], bf16_bytes(&vals)),
            ],
        );
        let ckpt = SafetensorsCheckpoint::open_dir(dir.path()).unwrap();
        assert_eq!(ckpt.names().collect::<Vec<_>>(), ["a.f32", "b.f16", "c.bf16"]);
        assert_eq!(ckpt.len(), 3);
        assert_eq!(ckpt.total_bytes(), 24 + 12 + 12);

        let a = ckpt.get("a.f32").unwrap();
        assert_eq!((a.dtype, a.shape, a.numel()), (StDtype::F32, &[2usize, 3][..], 6));
        assert_eq!(a.to_f32(), vals);
        assert_eq!(a.file, path.as_path());

        let b = ckpt.get("b.f16").unwrap();
        let want: Vec<f32> = vals.iter().map(|x| f16::from_f32(*x).to_f32()).collect();
        assert_eq!(b.dtype, StDtype::F16);
        assert_eq!(b.to_f32(), want);

        let c = ckpt.get("c.bf16").unwrap();
        let want: Vec<f32> = vals.iter().map(|x| bf16::from_f32(*x).to_f32()).collect();
        assert_eq!(c.dtype, StDtype::BF16);
        assert_eq!(c.to_f32(), want);
        assert!(c.expect_shape(&[3, 2]).is_ok());
        assert!(c.expect_dtype(StDtype::BF16).is_ok());
    }

    #[test]
    fn reads_unaligned_data() {
        // A 1-byte tensor first puts the next tensors at odd offsets.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("odd.safetensors");
        let vals = [1.5f32, -7.25, 1.0e10];
        write_st(
            &path,
            &[
                ("0.pad", "U8", &[1], vec![9]),
                ("1.f32", "F32", &[3], f32_bytes(&vals)),
                ("2.bf16", "BF16", &[3], bf16_bytes(&vals)),
                ("3.f16", "F16", &[2], f16_bytes(&vals[..2])),
            ],
        );
        let ckpt = SafetensorsCheckpoint::open_files(&[path]).unwrap();
        assert_eq!(ckpt.get("1.f32").unwrap().to_f32(), vals);
        let want: Vec<f32> = vals.iter().map(|x| bf16::from_f32(*x).to_f32()).collect();
        assert_eq!(ckpt.get("2.bf16").unwrap().to_f32(), want);
        assert_eq!(ckpt.get("3.f16").unwrap().to_f32(), [1.5, -7.25]);
    }

    #[test]
    fn sharded_dir_with_index() {
        let dir = tempfile::tempdir().unwrap();
        let s1 = "model-00001-of-00002.safetensors";
        let s2 = "model-00002-of-00002.safetensors";
        write_st(
            &dir.path().join(s1),
            &[(
                "model.embed_tokens.weight",
                "BF16",
                &[4, 2],
                bf16_bytes(&[1.0; 8]),
            )],
        );
        write_st(
            &dir.path().join(s2),
            &[
                ("model.norm.weight", "F32", &[2], f32_bytes(&[0.5, 0.25])),
                ("scalar", "F32", &[], f32_bytes(&[3.0])),
            ],
        );
        let index = serde_json::json!({
            "metadata": {"total_size": 32},
            "weight_map": {
                "model.embed_tokens.weight": s1,
                "model.norm.weight": s2,
                "scalar": s2
            }
        });
        std::fs::write(dir.path().join(INDEX_FILE_NAME), index.to_string()).unwrap();
        let ckpt = SafetensorsCheckpoint::open_dir(dir.path()).unwrap();
        assert_eq!(ckpt.len(), 3);
        assert_eq!(ckpt.files().count(), 2);
        assert_eq!(ckpt.source(), dir.path());
        let norm = ckpt.get_with_shape("model.norm.weight", &[2]).unwrap();
        assert_eq!(norm.to_f32(), [0.5, 0.25]);
        assert_eq!(norm.file, dir.path().join(s2).as_path());
        let scalar = ckpt.get("scalar").unwrap();
        assert_eq!((scalar.numel(), scalar.to_f32()), (1, vec![3.0]));
        assert_eq!(ckpt.get("model.embed_tokens.weight").unwrap().to_f32(), [1.0; 8]);
        assert!(ckpt.contains("model.norm.weight"));
    }

    #[test]
    fn metadata_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let header = r#"{"__metadata__": {"format": "pt", "weird": "x"},
            "t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}"#;
        write_raw(&path, header, &f32_bytes(&[2.0]));
        let ckpt = SafetensorsCheckpoint::open_files(&[path]).unwrap();
        assert_eq!(ckpt.names().collect::<Vec<_>>(), ["t"]);
    }

    #[test]
    fn error_file_too_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short.safetensors");
        std::fs::write(&path, [1u8, 2, 3]).unwrap();
        let msg = open_err(&path);
        assert_names(&msg, &path, None);
        assert!(msg.contains("3 bytes"), "{msg}");
        std::fs::write(&path, []).unwrap();
        assert_names(&open_err(&path), &path, None);
    }

    #[test]
    fn error_header_past_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.safetensors");
        let mut bytes = 1000u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        std::fs::write(&path, bytes).unwrap();
        let msg = open_err(&path);
        assert_names(&msg, &path, None);
        assert!(msg.contains("1000-byte header"), "{msg}");
    }

    #[test]
    fn error_header_absurd() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.safetensors");
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        std::fs::write(&path, bytes).unwrap();
        let msg = open_err(&path);
        assert_names(&msg, &path, None);
        assert!(msg.contains("at most"), "{msg}");
    }

    #[test]
    fn error_header_not_json() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.safetensors");
        write_raw(&path, "{not json", &[]);
        assert_names(&open_err(&path), &path, None);
        write_raw(&path, "[1, 2]", &[]);
        assert_names(&open_err(&path), &path, None);
        let mut bytes = 2u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0xff, 0xfe]);
        std::fs::write(&path, bytes).unwrap();
        assert!(open_err(&path).contains("UTF-8"));
    }

    #[test]
    fn error_malformed_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.safetensors");
        write_raw(&path, r#"{"w": {"shape": [1], "data_offsets": [0, 4]}}"#, &[0; 4]);
        let msg = open_err(&path);
        assert_names(&msg, &path, Some("tensor w"));
        assert!(msg.contains("dtype"), "{msg}");
        write_raw(
            &path,
            r#"{"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}"#,
            &[0; 4],
        );
        assert_names(&open_err(&path), &path, Some("tensor w"));
        write_raw(
            &path,
            r#"{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}"#,
            &[0; 4],
        );
        assert_names(&open_err(&path), &path, Some("tensor w"));
    }

    #[test]
    fn error_offsets_out_of_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.safetensors");
        write_raw(
            &path,
            r#"{"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}"#,
            &[0; 4],
        );
        let msg = open_err(&path);
        assert_names(&msg, &path, Some("tensor w"));
        assert!(msg.contains("out of order"), "{msg}");
    }

    #[test]
    fn error_data_past_end_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        write_st(&path, &[("w", "F32", &[4], f32_bytes(&[1.0; 4]))]);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let msg = open_err(&path);
        assert_names(&msg, &path, Some("tensor w"));
        assert!(msg.contains("truncated"), "{msg}");
    }

    #[test]
    fn error_overlapping_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ov.safetensors");
        write_raw(
            &path,
            r#"{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}"#,
            &[0; 12],
        );
        let msg = open_err(&path);
        assert_names(&msg, &path, Some("tensor b"));
        assert!(msg.contains("overlapping") && msg.contains("tensor a"), "{msg}");
    }

    #[test]
    fn error_size_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.safetensors");
        write_raw(
            &path,
            r#"{"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}}"#,
            &[0; 8],
        );
        let msg = open_err(&path);
        assert_names(&msg, &path, Some("tensor w"));
        assert!(
            msg.contains("expected 12") && msg.contains("8 data bytes"),
            "{msg}"
        );
        // A shape whose product overflows is a mismatch, not a panic.
        write_raw(
            &path,
            r#"{"w": {"dtype": "F32", "shape": [18446744073709551615, 4], "data_offsets": [0, 8]}}"#,
            &[0; 8],
        );
        assert_names(&open_err(&path), &path, Some("tensor w"));
    }

    #[test]
    fn error_unsupported_dtype_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i.safetensors");
        write_st(
            &path,
            &[
                ("ids", "I64", &[2], vec![0; 16]),
                ("w", "F32", &[1], f32_bytes(&[1.0])),
            ],
        );
        // Opening succeeds (other tensors stay usable); asking for it fails.
        let ckpt = SafetensorsCheckpoint::open_files(std::slice::from_ref(&path)).unwrap();
        assert!(ckpt.get("w").is_ok());
        let msg = ckpt.get("ids").unwrap_err().to_string();
        assert_eq!(
            msg,
            format!(
                "tensor ids in {} has dtype I64; expected F32, F16 or BF16",
                path.display()
            )
        );
    }

    #[test]
    fn error_index_tensor_missing_in_shard() {
        let dir = tempfile::tempdir().unwrap();
        let shard = "model-00001-of-00001.safetensors";
        write_st(&dir.path().join(shard), &[("a", "F32", &[1], f32_bytes(&[1.0]))]);
        let index = serde_json::json!({"metadata": {}, "weight_map": {"a": shard, "b": shard}});
        std::fs::write(dir.path().join(INDEX_FILE_NAME), index.to_string()).unwrap();
        let msg = SafetensorsCheckpoint::open_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert_names(&msg, &dir.path().join(shard), Some("tensor b"));
        assert!(msg.contains(INDEX_FILE_NAME), "{msg}");
    }

    #[test]
    fn error_index_shard_file_missing() {
        let dir = tempfile::tempdir().unwrap();
        let index = serde_json::json!({"weight_map": {"a": "model-00002-of-00002.safetensors"}});
        std::fs::write(dir.path().join(INDEX_FILE_NAME), index.to_string()).unwrap();
        let msg = SafetensorsCheckpoint::open_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert_names(&msg, &dir.path().join("model-00002-of-00002.safetensors"), None);
        assert!(msg.contains("missing") && msg.contains(INDEX_FILE_NAME), "{msg}");
    }

    #[test]
    fn error_index_malformed() {
        let dir = tempfile::tempdir().unwrap();
        let index_path = dir.path().join(INDEX_FILE_NAME);
        std::fs::write(&index_path, r#"{"metadata": {}}"#).unwrap();
        let msg = SafetensorsCheckpoint::open_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert_names(&msg, &index_path, None);
        assert!(msg.contains("weight_map"), "{msg}");
        std::fs::write(&index_path, r#"{"weight_map": {"a": "../../etc/passwd"}}"#).unwrap();
        let msg = SafetensorsCheckpoint::open_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert_names(&msg, &index_path, Some("tensor a"));
    }

    #[test]
    fn error_duplicate_across_shards() {
        let dir = tempfile::tempdir().unwrap();
        let p1 = dir.path().join("one.safetensors");
        let p2 = dir.path().join("two.safetensors");
        write_st(&p1, &[("w", "F32", &[1], f32_bytes(&[1.0]))]);
        write_st(&p2, &[("w", "F32", &[1], f32_bytes(&[2.0]))]);
        let msg = SafetensorsCheckpoint::open_files(&[p1.clone(), p2.clone()])
            .unwrap_err()
            .to_string();
        assert_names(&msg, &p1, Some("tensor w"));
        assert_names(&msg, &p2, None);
    }

    #[test]
    fn error_missing_tensor_names_directory() {
        let dir = tempfile::tempdir().unwrap();
        write_st(
            &dir.path().join(SINGLE_FILE_NAME),
            &[("w", "F32", &[1], f32_bytes(&[1.0]))],
        );
        let ckpt = SafetensorsCheckpoint::open_dir(dir.path()).unwrap();
        let msg = ckpt.get("model.norm.weight").unwrap_err().to_string();
        assert_names(&msg, dir.path(), Some("model.norm.weight"));
    }

    #[test]
    fn error_shape_and_dtype_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SINGLE_FILE_NAME);
        write_st(&path, &[("w", "F16", &[2, 2], f16_bytes(&[1.0; 4]))]);
        let ckpt = SafetensorsCheckpoint::open_dir(dir.path()).unwrap();
        let msg = ckpt.get_with_shape("w", &[4, 1]).unwrap_err().to_string();
        assert_names(&msg, &path, Some("tensor w"));
        assert!(msg.contains("[2, 2]") && msg.contains("[4, 1]"), "{msg}");
        let msg = ckpt
            .get("w")
            .unwrap()
            .expect_dtype(StDtype::BF16)
            .unwrap_err()
            .to_string();
        assert_names(&msg, &path, Some("tensor w"));
        assert!(msg.contains("F16") && msg.contains("BF16"), "{msg}");
    }

    #[test]
    fn error_no_checkpoint_in_dir() {
        let dir = tempfile::tempdir().unwrap();
        let msg = SafetensorsCheckpoint::open_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert_names(&msg, dir.path(), None);
        assert!(matches!(
            SafetensorsCheckpoint::open_files(&[]),
            Err(SafetensorsError::NoFiles)
        ));
        let missing = dir.path().join("nope.safetensors");
        assert_names(&open_err(&missing), &missing, None);
    }
}
