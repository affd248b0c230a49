//! Fuzzing the two checkpoint header parsers, `tandem_engine::checkpoint::gguf` and
//! `tandem_engine::checkpoint::safetensors`.
//!
//! Seeds come from `tests/fuzz-corpus/{gguf,safetensors}/` (small valid files and some invalid
//! ones; `gen_corpus.py` there rewrites them). Each case picks a seed, mutates it (byte flips,
//! truncation, insertions, large numbers written over the fields of a GGUF header or at random
//! offsets, a new safetensors header length, edits of a safetensors JSON header), writes it to a
//! file, opens it and reads every tensor. Whatever the bytes, the parser must answer `Ok` or an
//! error that names the file, never panic, and finish at once without allocating out of
//! proportion to the file: counts and lengths are checked against the file's size before
//! anything is allocated from them. A counting global allocator measures that.
//!
//! Failures proptest finds are saved in `tests/proptest-regressions/fuzz_parsers.txt` and
//! replayed first on every run; that file is committed as the corpus of found failures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use serde_json::{json, Value};
use tandem_engine::checkpoint::gguf::GgufFile;
use tandem_engine::checkpoint::safetensors::SafetensorsCheckpoint;

/// Cases per fuzz test; the two together stay within a few seconds in a debug build. The
/// environment variable `PROPTEST_CASES` sets another number, for a longer hunt.
const CASES: u32 = 10_000;
/// Longest one case may take to open and read a file of a few kilobytes.
const MAX_CASE_TIME: Duration = Duration::from_secs(3);
/// Most bytes a parse may hold live beyond `ALLOC_PER_FILE_BYTE` per byte of the file.
const ALLOC_SLACK: usize = 1 << 20;
/// Bytes a parse may hold live per byte of the file: decoded f32 values of a 2-bit format are
/// about 12 per byte, JSON values about 32 per byte of header text.
const ALLOC_PER_FILE_BYTE: usize = 64;
/// Any single allocation larger than this while a parse is measured is refused (and the test
/// binary aborts), so a count taken on trust fails loudly instead of exhausting memory.
const ALLOC_REFUSE_BYTES: usize = 1 << 30;

/// Files of the corpus that are valid and must open; every other file must be refused.
const VALID_SEEDS: &[&str] = &[
    "gguf/tiny.gguf",
    "gguf/empty-v2.gguf",
    "gguf/every-type.gguf",
    "gguf/align-8.gguf",
    "gguf/one-empty-tensor.gguf",
    "safetensors/three-dtypes.safetensors",
    "safetensors/empty.safetensors",
    "safetensors/other-dtypes.safetensors",
];

/// What the refusal of each invalid corpus file must say.
const INVALID_SEEDS: &[(&str, &str)] = &[
    ("gguf/bad-magic.gguf", "expected the magic \"GGUF\""),
    ("gguf/version-1.gguf", "has version 1; expected 2 or 3"),
    ("gguf/big-endian.gguf", "big-endian"),
    ("gguf/truncated.gguf", "truncated or corrupt"),
    ("gguf/header-only-5-bytes.gguf", "ends inside the header"),
    (
        "gguf/tensor-count-overflow.gguf",
        "tensor infos, which cannot fit",
    ),
    (
        "gguf/string-past-end.gguf",
        "ends inside the value of metadata key `general.architecture`",
    ),
    ("gguf/unknown-ggml-type.gguf", "tensor `t` has ggml type id 99"),
    (
        "gguf/array-too-deep.gguf",
        "metadata key `deep` nests arrays more than 8 deep",
    ),
    (
        "gguf/misaligned-offset.gguf",
        "tensor `t` has data offset 4, not a multiple of the alignment 32",
    ),
    (
        "gguf/empty-dims-overflow.gguf",
        "tensor `t` has dimensions [0, 8589934592, 8589934592]",
    ),
    ("safetensors/too-short.safetensors", "expected at least 8"),
    ("safetensors/header-too-large.safetensors", "expected at most"),
    (
        "safetensors/header-past-end.safetensors",
        "but is only 72 bytes long",
    ),
    ("safetensors/not-json.safetensors", "not a JSON object"),
    ("safetensors/not-an-object.safetensors", "not a JSON object"),
    ("safetensors/overlap.safetensors", "overlapping those of tensor a"),
    (
        "safetensors/size-mismatch.safetensors",
        "has 8 data bytes; expected 12",
    ),
    ("safetensors/offsets-out-of-order.safetensors", "out of order"),
    (
        "safetensors/data-past-end.safetensors",
        "the file holds only 8 data bytes",
    ),
    ("safetensors/huge-shape.safetensors", "tensor a in"),
    (
        "safetensors/bad-entries.safetensors",
        "expected a string field `dtype`",
    ),
];

// ---------------------------------------------------------------------------------------------
// Measuring allocations.

/// The system allocator, counting the bytes the current thread holds while a parse is measured.
struct Counting;

thread_local! {
    static MEASURING: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// Records `delta` bytes allocated (or freed, when negative) by this thread; false when the
/// allocation must be refused.
fn note_allocation(delta: isize, request: usize) -> bool {
    MEASURING
        .try_with(|measuring| {
            if !measuring.get() {
                return true;
            }
            if request > ALLOC_REFUSE_BYTES {
                return false;
            }
            let live = LIVE.get().saturating_add(delta);
            LIVE.set(live);
            PEAK.set(PEAK.get().max(live));
            true
        })
        .unwrap_or(true)
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the `GlobalAlloc`
// contract; the only additions are thread-local counters (const-initialised `Cell`s, which never
// allocate) and returning null for a refused request, which the contract allows.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !note_allocation(layout.size() as isize, layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !note_allocation(layout.size() as isize, layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `alloc_zeroed` is passed on unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_allocation(-(layout.size() as isize), 0);
        // SAFETY: `ptr` came from `System` through this allocator, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !note_allocation(new_size as isize - layout.size() as isize, new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `realloc` is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Stops measuring when dropped, also when the measured code panics.
struct Measuring;

impl Drop for Measuring {
    fn drop(&mut self) {
        MEASURING.set(false);
    }
}

/// Runs `f`, returning its result and the most bytes it held live at once.
fn measured<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LIVE.set(0);
    PEAK.set(0);
    MEASURING.set(true);
    let guard = Measuring;
    let result = f();
    drop(guard);
    (result, PEAK.get().max(0) as usize)
}

// ---------------------------------------------------------------------------------------------
// Opening a file and reading everything in it.

/// An error message must name the file it is about.
fn check_message(path: &Path, message: &str) {
    let shown = path.display().to_string();
    assert!(
        message.contains(&shown),
        "the error does not name the file {shown}: {message}"
    );
}

/// Opens `path` as GGUF and reads every value and tensor: the number of tensors, or the error
/// message. Panics when anything misbehaves.
fn read_gguf(path: &Path) -> Result<usize, String> {
    let file = match GgufFile::open(path) {
        Ok(file) => file,
        Err(e) => {
            let message = e.to_string();
            check_message(path, &message);
            return Err(message);
        }
    };
    for value in file.metadata().values() {
        assert!(!value.type_description().is_empty());
    }
    for info in file.tensors() {
        let tensor = file
            .tensor(info.name())
            .unwrap_or_else(|e| panic!("tensor `{}` is listed but cannot be had: {e}", info.name()));
        assert_eq!(tensor.bytes.len(), info.byte_size(), "tensor `{}`", info.name());
        assert_eq!(tensor.desc.numel(), info.numel(), "tensor `{}`", info.name());
        let values = tensor
            .to_f32()
            .unwrap_or_else(|e| panic!("tensor `{}` opened but does not decode: {e}", info.name()));
        assert_eq!(values.len(), info.numel(), "tensor `{}`", info.name());
    }
    if file.tensors().iter().all(|t| t.name() != "no such tensor") {
        let e = file
            .tensor("no such tensor")
            .expect_err("a tensor that is not there");
        check_message(path, &e.to_string());
    }
    Ok(file.tensors().len())
}

/// Opens `path` as a one-file safetensors checkpoint and reads every tensor: the number of
/// tensors, or the error message. Panics when anything misbehaves.
fn read_safetensors(path: &Path) -> Result<usize, String> {
    let ckpt = match SafetensorsCheckpoint::open_files(&[path.to_path_buf()]) {
        Ok(ckpt) => ckpt,
        Err(e) => {
            let message = e.to_string();
            check_message(path, &message);
            return Err(message);
        }
    };
    let names: Vec<String> = ckpt.names().map(str::to_owned).collect();
    assert_eq!(names.len(), ckpt.len());
    for name in &names {
        match ckpt.get(name) {
            Ok(t) => {
                assert_eq!(t.data.len(), t.numel() * t.dtype.size(), "tensor {name}");
                assert_eq!(t.to_f32().len(), t.numel(), "tensor {name}");
            }
            // Only tensors of dtypes the engine does not read are refused.
            Err(e) => {
                let message = e.to_string();
                check_message(path, &message);
                assert!(
                    message.contains("expected F32, F16 or BF16"),
                    "tensor {name}: {message}"
                );
            }
        }
    }
    ckpt.total_bytes();
    Ok(names.len())
}

/// Which parser a case feeds.
#[derive(Debug, Clone, Copy)]
enum Format {
    Gguf,
    Safetensors,
}

/// Writes `bytes` to a fresh file, reads it with `format`'s parser, and checks that the parser
/// neither panicked nor took long nor allocated out of proportion to the file.
fn run_case(seed: &str, format: Format, bytes: &[u8]) -> Result<(), TestCaseError> {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(bytes).expect("write temp file");
    file.flush().expect("flush temp file");
    let path = file.path().to_path_buf();
    let start = Instant::now();
    let (outcome, peak) = measured(|| {
        catch_unwind(AssertUnwindSafe(|| match format {
            Format::Gguf => read_gguf(&path),
            Format::Safetensors => read_safetensors(&path),
        }))
    });
    let elapsed = start.elapsed();
    let context = || format!("seed {seed}, mutated to {} bytes", bytes.len());
    if let Err(panic) = outcome {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic without a message");
        return Err(TestCaseError::fail(format!("{}: {message}", context())));
    }
    prop_assert!(elapsed < MAX_CASE_TIME, "{}: took {elapsed:?}", context());
    let allowed = ALLOC_PER_FILE_BYTE * bytes.len() + ALLOC_SLACK;
    prop_assert!(
        peak <= allowed,
        "{}: held {peak} bytes at once; at most {allowed} expected",
        context()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The corpus.

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus")
}

/// Every seed of one format: its name (`gguf/tiny.gguf`) and bytes, in name order.
fn seeds(format: Format) -> &'static [(String, Vec<u8>)] {
    static GGUF: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    static SAFETENSORS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    let (cell, dir) = match format {
        Format::Gguf => (&GGUF, "gguf"),
        Format::Safetensors => (&SAFETENSORS, "safetensors"),
    };
    cell.get_or_init(|| {
        let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus_dir().join(dir))
            .unwrap_or_else(|e| panic!("corpus directory {dir}: {e}"))
            .map(|entry| {
                let path = entry.expect("corpus entry").path();
                let name = format!("{dir}/{}", path.file_name().expect("file name").to_string_lossy());
                (name, std::fs::read(&path).expect("read corpus file"))
            })
            .collect();
        out.sort();
        assert!(!out.is_empty(), "no seeds in {dir}");
        out
    })
}

/// Which seed a case starts from: three times in four a valid one, whose mutations get further
/// into the parser than those of a file that is already broken.
#[derive(Debug, Clone)]
struct SeedChoice {
    valid_only: bool,
    index: Index,
}

fn seed_choice() -> impl Strategy<Value = SeedChoice> {
    (prop::bool::weighted(0.75), any::<Index>())
        .prop_map(|(valid_only, index)| SeedChoice { valid_only, index })
}

impl SeedChoice {
    fn pick(&self, format: Format) -> &'static (String, Vec<u8>) {
        let all = seeds(format);
        if !self.valid_only {
            return self.index.get(all);
        }
        let valid: Vec<&(String, Vec<u8>)> = all
            .iter()
            .filter(|(name, _)| VALID_SEEDS.contains(&name.as_str()))
            .collect();
        let picked: &&'static (String, Vec<u8>) = self.index.get(&valid);
        picked
    }
}

fn proptest_config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CASES),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/proptest-regressions/fuzz_parsers.txt"
        )))),
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Mutations.

/// Numbers worth writing over counts, lengths, dimensions, offsets and type ids.
fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => select(vec![
            0,
            1,
            2,
            3,
            4,
            8,
            9,
            12,
            13,
            30,
            31,
            32,
            64,
            99,
            255,
            256,
            4096,
            u64::from(u32::MAX),
            1 << 32,
            1 << 33,
            1 << 40,
            1 << 62,
            i64::MAX as u64,
            1 << 63,
            u64::MAX - 1,
            u64::MAX,
        ]),
        1 => (0u32..64).prop_map(|s| 1u64 << s),
        1 => 0u64..4096,
        1 => any::<u64>(),
    ]
}

/// An edit of any file's bytes.
#[derive(Debug, Clone)]
enum ByteEdit {
    /// XOR one byte with a nonzero mask.
    Flip { at: Index, mask: u8 },
    /// Cut the file short.
    Truncate { at: Index },
    /// Write a little-endian `u64` (extending the file if it runs past the end).
    PutU64 { at: Index, value: u64 },
    /// Write a little-endian `u32`.
    PutU32 { at: Index, value: u32 },
    /// Insert bytes.
    Insert { at: Index, bytes: Vec<u8> },
    /// Remove up to `len` bytes.
    Remove { at: Index, len: usize },
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        3 => (any::<Index>(), 1u8..=255).prop_map(|(at, mask)| ByteEdit::Flip { at, mask }),
        1 => any::<Index>().prop_map(|at| ByteEdit::Truncate { at }),
        2 => (any::<Index>(), interesting_u64()).prop_map(|(at, value)| ByteEdit::PutU64 { at, value }),
        1 => (any::<Index>(), interesting_u64()).prop_map(|(at, v)| ByteEdit::PutU32 { at, value: v as u32 }),
        1 => (any::<Index>(), vec(any::<u8>(), 1..16)).prop_map(|(at, bytes)| ByteEdit::Insert { at, bytes }),
        1 => (any::<Index>(), 1usize..64).prop_map(|(at, len)| ByteEdit::Remove { at, len }),
    ]
}

/// Writes `value` at `at`, growing `bytes` if it runs past the end.
fn put(bytes: &mut Vec<u8>, at: usize, value: &[u8]) {
    if bytes.len() < at + value.len() {
        bytes.resize(at + value.len(), 0);
    }
    bytes[at..at + value.len()].copy_from_slice(value);
}

impl ByteEdit {
    fn apply(&self, bytes: &mut Vec<u8>) {
        let len = bytes.len();
        match self {
            ByteEdit::Flip { at, mask } => {
                if len > 0 {
                    bytes[at.index(len)] ^= mask;
                }
            }
            ByteEdit::Truncate { at } => bytes.truncate(at.index(len + 1)),
            ByteEdit::PutU64 { at, value } => put(bytes, at.index(len + 1), &value.to_le_bytes()),
            ByteEdit::PutU32 { at, value } => put(bytes, at.index(len + 1), &value.to_le_bytes()),
            ByteEdit::Insert { at, bytes: new } => {
                let at = at.index(len + 1);
                bytes.splice(at..at, new.iter().copied());
            }
            ByteEdit::Remove { at, len: n } => {
                let at = at.index(len + 1);
                bytes.drain(at..(at + n).min(len));
            }
        }
    }
}

/// The positions and widths of the numbers in a GGUF file (version, counts, string lengths,
/// value types, scalar values, array types and lengths, dimension counts, dimensions, tensor
/// types and offsets), as far as the file can be walked.
fn gguf_fields(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut walk = GgufWalk {
        bytes,
        pos: 0,
        fields: Vec::new(),
    };
    walk.file();
    walk.fields
}

/// A forgiving walk over a GGUF file that stops at the first thing it cannot follow.
struct GgufWalk<'a> {
    bytes: &'a [u8],
    pos: usize,
    fields: Vec<(usize, usize)>,
}

impl GgufWalk<'_> {
    fn number(&mut self, width: usize) -> Option<u64> {
        let raw = self.bytes.get(self.pos..self.pos.checked_add(width)?)?;
        let mut le = [0u8; 8];
        le[..width].copy_from_slice(raw);
        self.fields.push((self.pos, width));
        self.pos += width;
        Some(u64::from_le_bytes(le))
    }

    fn skip(&mut self, n: u64) -> Option<()> {
        let n = usize::try_from(n).ok()?;
        if n > self.bytes.len() - self.pos {
            return None;
        }
        self.pos += n;
        Some(())
    }

    fn string(&mut self) -> Option<()> {
        let len = self.number(8)?;
        self.skip(len)
    }

    fn value(&mut self, type_id: u64, depth: usize) -> Option<()> {
        match type_id {
            0 | 1 | 7 => self.number(1).map(drop),
            2 | 3 => self.number(2).map(drop),
            4..=6 => self.number(4).map(drop),
            10..=12 => self.number(8).map(drop),
            8 => self.string(),
            9 if depth < 8 => {
                let element_type = self.number(4)?;
                let n = self.number(8)?;
                for _ in 0..n {
                    self.value(element_type, depth + 1)?;
                }
                Some(())
            }
            _ => None,
        }
    }

    fn file(&mut self) -> Option<()> {
        self.skip(4)?;
        self.number(4)?;
        let n_tensors = self.number(8)?;
        let n_metadata = self.number(8)?;
        for _ in 0..n_metadata {
            self.string()?;
            let type_id = self.number(4)?;
            self.value(type_id, 0)?;
        }
        for _ in 0..n_tensors {
            self.string()?;
            let n_dims = self.number(4)?;
            if n_dims > 4 {
                return None;
            }
            for _ in 0..n_dims {
                self.number(8)?;
            }
            self.number(4)?;
            self.number(8)?;
        }
        Some(())
    }
}

/// An edit of a GGUF file.
#[derive(Debug, Clone)]
enum GgufEdit {
    Bytes(ByteEdit),
    /// Overwrite consecutive numbers of those [`gguf_fields`] finds, each at its own width,
    /// from the one `first` picks.
    Fields {
        first: Index,
        values: Vec<u64>,
    },
    /// Add a small amount to one of those numbers (wrapping at its width): off-by-one counts,
    /// lengths and offsets.
    Nudge {
        which: Index,
        delta: i8,
    },
}

fn gguf_edit() -> impl Strategy<Value = GgufEdit> {
    prop_oneof![
        1 => byte_edit().prop_map(GgufEdit::Bytes),
        1 => (any::<Index>(), vec(interesting_u64(), 1..4))
            .prop_map(|(first, values)| GgufEdit::Fields { first, values }),
        1 => (any::<Index>(), -8i8..=8).prop_map(|(which, delta)| GgufEdit::Nudge { which, delta }),
    ]
}

impl GgufEdit {
    fn apply(&self, bytes: &mut Vec<u8>) {
        match self {
            GgufEdit::Bytes(edit) => edit.apply(bytes),
            GgufEdit::Fields { first, values } => {
                let fields = gguf_fields(bytes);
                if fields.is_empty() {
                    return;
                }
                let first = first.index(fields.len());
                for (&(at, width), value) in fields[first..].iter().zip(values) {
                    bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
                }
            }
            GgufEdit::Nudge { which, delta } => {
                let fields = gguf_fields(bytes);
                if fields.is_empty() {
                    return;
                }
                let (at, width) = *which.get(&fields);
                let mut le = [0u8; 8];
                le[..width].copy_from_slice(&bytes[at..at + width]);
                let value = u64::from_le_bytes(le).wrapping_add_signed(i64::from(*delta));
                bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
            }
        }
    }
}

/// A change to one entry of a safetensors JSON header.
#[derive(Debug, Clone)]
enum EntryEdit {
    Dtype(Value),
    Shape(Value),
    Offsets(Value),
    /// Remove a field.
    Remove(&'static str),
    /// Replace the whole entry.
    Replace(Value),
    /// Add copies of the entry under new names.
    Copy(usize),
}

fn json_u64() -> impl Strategy<Value = Value> {
    interesting_u64().prop_map(Value::from)
}

fn odd_json() -> impl Strategy<Value = Value> {
    select(vec![
        json!(null),
        json!(-1),
        json!(1.5),
        json!(1e30),
        json!("3"),
        json!(true),
        json!([]),
        json!([-1, 4]),
        json!([[2]]),
        json!({"a": 1}),
    ])
}

fn entry_edit() -> impl Strategy<Value = EntryEdit> {
    let dtype = prop_oneof![
        3 => select(vec![
            "F32", "F16", "BF16", "I64", "U8", "I8", "BOOL", "F8_E4M3", "F8_E8M0", "I16", "U32",
            "F64", "F4", "Q4_K", "", "f32",
        ])
        .prop_map(Value::from),
        1 => "[A-Z0-9_]{0,12}".prop_map(Value::from),
        1 => odd_json(),
    ];
    let shape = prop_oneof![
        3 => vec(json_u64(), 0..5).prop_map(Value::Array),
        2 => vec(0u64..8, 0..4).prop_map(|v| json!(v)),
        1 => odd_json(),
    ];
    let offsets = prop_oneof![
        2 => (json_u64(), json_u64()).prop_map(|(a, b)| json!([a, b])),
        2 => (0u64..300, 0u64..300).prop_map(|(a, b)| json!([a, b])),
        1 => vec(json_u64(), 0..4).prop_map(Value::Array),
        1 => odd_json(),
    ];
    prop_oneof![
        3 => dtype.prop_map(EntryEdit::Dtype),
        3 => shape.prop_map(EntryEdit::Shape),
        3 => offsets.prop_map(EntryEdit::Offsets),
        1 => select(vec!["dtype", "shape", "data_offsets"]).prop_map(EntryEdit::Remove),
        1 => odd_json().prop_map(EntryEdit::Replace),
        1 => prop_oneof![1usize..4, Just(2000usize)].prop_map(EntryEdit::Copy),
    ]
}

/// An edit of a safetensors file.
#[derive(Debug, Clone)]
enum SafetensorsEdit {
    Bytes(ByteEdit),
    /// Overwrite the header length.
    HeaderLen(u64),
    /// Add a small amount to the header length.
    NudgeHeaderLen(i8),
    /// Change one entry of the header (chosen among its keys) and rewrite the header with a
    /// length that matches it.
    Entry {
        which: Index,
        edit: EntryEdit,
    },
}

fn safetensors_edit() -> impl Strategy<Value = SafetensorsEdit> {
    prop_oneof![
        2 => byte_edit().prop_map(SafetensorsEdit::Bytes),
        1 => interesting_u64().prop_map(SafetensorsEdit::HeaderLen),
        1 => (-8i8..=8).prop_map(SafetensorsEdit::NudgeHeaderLen),
        8 => (any::<Index>(), entry_edit()).prop_map(|(which, edit)| SafetensorsEdit::Entry { which, edit }),
    ]
}

/// A safetensors file's header, parsed, and the bytes after it; None when it cannot be split.
fn split_safetensors(bytes: &[u8]) -> Option<(serde_json::Map<String, Value>, &[u8])> {
    let len = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header = bytes.get(8..8usize.checked_add(len)?)?;
    match serde_json::from_slice(header).ok()? {
        Value::Object(map) => Some((map, &bytes[8 + len..])),
        _ => None,
    }
}

impl SafetensorsEdit {
    fn apply(&self, bytes: &mut Vec<u8>) {
        match self {
            SafetensorsEdit::Bytes(edit) => edit.apply(bytes),
            SafetensorsEdit::HeaderLen(value) => put(bytes, 0, &value.to_le_bytes()),
            SafetensorsEdit::NudgeHeaderLen(delta) => {
                let mut le = [0u8; 8];
                let n = bytes.len().min(8);
                le[..n].copy_from_slice(&bytes[..n]);
                let value = u64::from_le_bytes(le).wrapping_add_signed(i64::from(*delta));
                put(bytes, 0, &value.to_le_bytes());
            }
            SafetensorsEdit::Entry { which, edit } => {
                let Some((mut header, data)) = split_safetensors(bytes) else {
                    return;
                };
                let names: Vec<String> = header.keys().cloned().collect();
                let name = if names.is_empty() {
                    "x".to_owned()
                } else {
                    which.get(&names).clone()
                };
                let entry = header.entry(name.clone()).or_insert_with(|| json!({}));
                match edit {
                    EntryEdit::Dtype(v) | EntryEdit::Shape(v) | EntryEdit::Offsets(v) => {
                        let field = match edit {
                            EntryEdit::Dtype(_) => "dtype",
                            EntryEdit::Shape(_) => "shape",
                            _ => "data_offsets",
                        };
                        if let Some(obj) = entry.as_object_mut() {
                            obj.insert(field.to_owned(), v.clone());
                        }
                    }
                    EntryEdit::Remove(field) => {
                        if let Some(obj) = entry.as_object_mut() {
                            obj.remove(*field);
                        }
                    }
                    EntryEdit::Replace(v) => *entry = v.clone(),
                    EntryEdit::Copy(n) => {
                        let copy = entry.clone();
                        for i in 0..*n {
                            header.insert(format!("{name}.copy{i}"), copy.clone());
                        }
                    }
                }
                let text = serde_json::to_vec(&header).expect("header JSON");
                let mut out = (text.len() as u64).to_le_bytes().to_vec();
                out.extend_from_slice(&text);
                out.extend_from_slice(data);
                *bytes = out;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The tests.

/// Every corpus file through both parsers: valid seeds open with their own parser and every
/// other file is refused with the message listed for it.
#[test]
fn every_corpus_file_opens_or_is_refused_by_both_parsers() {
    let mut seen = Vec::new();
    for format in [Format::Gguf, Format::Safetensors] {
        for (name, bytes) in seeds(format) {
            seen.push(name.clone());
            let mut file = tempfile::NamedTempFile::new().expect("temp file");
            file.write_all(bytes).expect("write temp file");
            let (gguf, _) = measured(|| read_gguf(file.path()));
            let (safetensors, _) = measured(|| read_safetensors(file.path()));
            let (own, other) = match format {
                Format::Gguf => (gguf, safetensors),
                Format::Safetensors => (safetensors, gguf),
            };
            assert!(other.is_err(), "{name} opened with the other format's parser");
            if VALID_SEEDS.contains(&name.as_str()) {
                own.unwrap_or_else(|e| panic!("{name} is a valid seed but is refused: {e}"));
                continue;
            }
            let expected = INVALID_SEEDS
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("corpus file {name} is listed neither as valid nor as invalid"))
                .1;
            match own {
                Ok(n) => panic!("{name} should be refused but opened with {n} tensors"),
                Err(e) => assert!(e.contains(expected), "{name}: expected {expected:?} in: {e}"),
            }
        }
    }
    for listed in VALID_SEEDS.iter().chain(INVALID_SEEDS.iter().map(|(n, _)| n)) {
        assert!(
            seen.iter().any(|s| s == listed),
            "{listed} is listed but not in the corpus"
        );
    }
}

/// The allocation meter the fuzz tests rely on sees what a parse allocates.
#[test]
fn the_allocation_meter_sees_allocations() {
    let (v, peak) = measured(|| vec![1u8; 1 << 20]);
    assert!(peak >= 1 << 20, "{peak}");
    drop(v);
    let ((), peak) = measured(|| drop(vec![1u8; 1 << 10]));
    assert!(peak >= 1 << 10, "{peak}");
}

/// The field walk the GGUF mutations rely on reaches the end of every valid GGUF seed.
#[test]
fn the_gguf_field_walk_follows_every_valid_seed() {
    for (name, bytes) in seeds(Format::Gguf) {
        if !VALID_SEEDS.contains(&name.as_str()) {
            continue;
        }
        let mut walk = GgufWalk {
            bytes,
            pos: 0,
            fields: Vec::new(),
        };
        assert!(walk.file().is_some(), "{name}: the walk stopped at {}", walk.pos);
        assert!(walk.fields.len() >= 3, "{name}");
    }
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn mutated_gguf_files_open_or_fail_cleanly(
        seed in seed_choice(),
        edits in vec(gguf_edit(), 1..5),
    ) {
        let (name, bytes) = seed.pick(Format::Gguf);
        let mut bytes = bytes.clone();
        for edit in &edits {
            edit.apply(&mut bytes);
        }
        run_case(name, Format::Gguf, &bytes)?;
    }

    #[test]
    fn mutated_safetensors_files_open_or_fail_cleanly(
        seed in seed_choice(),
        edits in vec(safetensors_edit(), 1..5),
    ) {
        let (name, bytes) = seed.pick(Format::Safetensors);
        let mut bytes = bytes.clone();
        for edit in &edits {
            edit.apply(&mut bytes);
        }
        run_case(name, Format::Safetensors, &bytes)?;
    }
}
