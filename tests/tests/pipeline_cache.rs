//! The GPU backends' pipeline cache on disk (issue 53: cold start). With `TANDEM_CACHE_DIR` a
//! fresh directory: a first backend compiles a small graph and writes the cache file (before it
//! is dropped); a second one reads it (`pipeline_cache=warm`) and builds the same pipelines from
//! it, every one a cache hit where the driver both keeps pipelines in its cache data and reports
//! creation feedback; a truncated, damaged or foreign file is ignored (`cold`) without an error
//! or a validation message, and replaced; `pipeline_cache = false` reads and writes nothing; a
//! cache directory that cannot be made costs nothing but the cache. The backends run with
//! validation on (any message fails a call).
//!
//! The file is a 32-byte frame (magic `TNDMPLC\0`, version 1, 0, the payload's length and its
//! FNV-1a 64 checksum, little-endian) and the driver's data; the Vulkan backend's data starts
//! with `VkPipelineCacheHeaderVersionOne`. The tests forge files of that format.
//!
//! Without the backend (no Vulkan device) a test says so and passes, except under CI (`CI`
//! set), where lavapipe must be there.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tandem_backend_api::{
    BackendOptions, ComputeBackend, DType, GraphBuilder, Op, StepArgs, TensorDesc, Usage, WeightRef,
};
use tandem_conformance::{discover, options_for};

/// The tests set `TANDEM_CACHE_DIR` for the whole process: one at a time.
static ENV: Mutex<()> = Mutex::new(());

/// A fresh cache directory as `TANDEM_CACHE_DIR`, held (with the lock) until dropped.
struct CacheDir {
    dir: tempfile::TempDir,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl CacheDir {
    fn new() -> CacheDir {
        let lock = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().expect("a temporary directory");
        // Only these tests run in this binary, one at a time (the lock): no other thread reads
        // the environment while it changes.
        std::env::set_var("TANDEM_CACHE_DIR", dir.path());
        std::env::remove_var("TANDEM_PIPELINE_CACHE");
        CacheDir { dir, _lock: lock }
    }

    fn pipelines(&self) -> PathBuf {
        self.dir.path().join("pipelines")
    }

    /// The cache files of `backend` (`vulkan`, `wgpu`), with no temporary file beside them.
    fn files(&self, backend: &str) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(self.pipelines()) else {
            return Vec::new();
        };
        let mut v: Vec<PathBuf> = entries.map(|e| e.expect("a directory entry").path()).collect();
        v.sort();
        for p in &v {
            let name = p.file_name().unwrap().to_string_lossy();
            assert!(!name.ends_with(".tmp"), "a temporary file was left: {name}");
        }
        v.retain(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{backend}-"))
        });
        v
    }

    /// The one cache file of `backend`.
    fn file(&self, backend: &str) -> PathBuf {
        let f = self.files(backend);
        assert_eq!(f.len(), 1, "one {backend} cache file: {f:?}");
        f[0].clone()
    }
}

fn create(name: &str, options: &BackendOptions) -> Option<Box<dyn ComputeBackend>> {
    match discover().create(name, options) {
        Ok(b) => Some(b),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping: the {name} backend is unavailable here: {e}");
            None
        }
        Err(e) => panic!("CI must run the {name} backend (lavapipe): {e}"),
    }
}

/// The value of feature `key=value` in the backend's info.
fn feature(b: &dyn ComputeBackend, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    b.info()
        .features
        .iter()
        .find_map(|f| f.strip_prefix(&prefix).map(str::to_string))
}

fn state(b: &dyn ComputeBackend) -> String {
    feature(b, "pipeline_cache").unwrap_or_else(|| panic!("no pipeline_cache feature: {:?}", b.info()))
}

fn count(b: &dyn ComputeBackend, key: &str) -> Option<u64> {
    feature(b, key).map(|v| v.parse().unwrap_or_else(|_| panic!("{key}={v}")))
}

fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

/// Compiles and runs a small graph (add, softcap, GeGlu, f32 matmul) and checks its output
/// against the host's arithmetic; returns after releasing everything.
fn run_small_graph(b: &mut dyn ComputeBackend) {
    let (rows, k, n) = (2usize, 32usize, 16usize);
    let x: Vec<f32> = (0..rows * k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
    let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.05).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let xd = TensorDesc::new(DType::F32, [rows, k]);
    let wd = TensorDesc::new(DType::F32, [n, k]);
    let od = TensorDesc::new(DType::F32, [rows, n]);
    let xb = b.alloc(&xd, Usage::Activation).expect("input");
    let wb = b.alloc(&wd, Usage::Weight).expect("weight");
    let ob = b.alloc(&od, Usage::Activation).expect("output");
    b.write(xb, 0, &bytes(&x)).unwrap();
    b.write(wb, 0, &bytes(&w)).unwrap();
    let mut g = GraphBuilder::new("pipeline cache probe", rows, 0);
    let xv = g.push1(Op::Input {
        buffer: xb,
        cols: k,
        selected: false,
    });
    let y = g.push1(Op::Add { a: xv, b: xv });
    let z = g.push1(Op::Softcap { x: y, cap: 1.5 });
    let ge = g.push1(Op::GeGlu { gate: z, up: xv });
    let m = g.push1(Op::MatMul {
        x: ge,
        weight: WeightRef {
            buffer: wb,
            desc: wd.clone(),
        },
        splits: vec![n],
    });
    g.push(Op::Output { x: m, buffer: ob });
    let p = b.compile(&g.finish()).expect("compile");
    let zeros = vec![0u32; rows];
    let args = StepArgs {
        tokens: &zeros,
        positions: &zeros,
        slots: &zeros,
        select: &[],
    };
    let t = b.execute(p, &args).expect("execute");
    b.wait(t).expect("wait");
    let mut out = vec![0u8; rows * n * 4];
    b.read(ob, 0, &mut out).unwrap();
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    for r in 0..rows {
        let gated: Vec<f32> = (0..k)
            .map(|c| {
                let v = x[r * k + c];
                gelu(1.5 * (2.0 * v / 1.5).tanh()) * v
            })
            .collect();
        for j in 0..n {
            let want: f32 = (0..k).map(|c| gated[c] * w[j * k + c]).sum();
            let have = got[r * n + j];
            assert!(
                (want - have).abs() <= 1e-3 + 1e-3 * want.abs(),
                "row {r} col {j}: {have} != {want}"
            );
        }
    }
    b.release(p).unwrap();
    for id in [xb, wb, ob] {
        b.free(id).unwrap();
    }
}

/// FNV-1a 64, the frame's checksum.
fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = b"TNDMPLC\0".to_vec();
    f.extend_from_slice(&1u32.to_le_bytes());
    f.extend_from_slice(&0u32.to_le_bytes());
    f.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    f.extend_from_slice(&fnv1a(payload).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// The payload of a cache file, checking its frame.
fn payload(path: &Path) -> Vec<u8> {
    let f = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(f.len() >= 32, "{}: {} bytes", path.display(), f.len());
    assert_eq!(&f[..8], b"TNDMPLC\0", "magic");
    assert_eq!(
        u32::from_le_bytes(f[8..12].try_into().unwrap()),
        1,
        "frame version"
    );
    let len = u64::from_le_bytes(f[16..24].try_into().unwrap());
    let p = f[32..].to_vec();
    assert_eq!(p.len() as u64, len, "payload length");
    assert_eq!(
        fnv1a(&p),
        u64::from_le_bytes(f[24..32].try_into().unwrap()),
        "checksum"
    );
    p
}

/// Checks a Vulkan cache file's payload: a `VkPipelineCacheHeaderVersionOne` whose vendor id,
/// device id and pipelineCacheUUID are those its name carries
/// (`vulkan-<vendor>-<device>-<driver>-<uuid>.bin`). Returns the payload.
fn vulkan_payload(path: &Path) -> Vec<u8> {
    let p = payload(path);
    let name = path.file_stem().unwrap().to_string_lossy().to_string();
    let parts: Vec<&str> = name.split('-').collect();
    assert_eq!(parts.len(), 5, "{name}");
    let hex32 = |s: &str| u32::from_str_radix(s, 16).unwrap_or_else(|_| panic!("{name}: {s}"));
    assert!(
        p.len() >= 32,
        "{name}: {} bytes of data, less than the header",
        p.len()
    );
    let field = |i: usize| u32::from_le_bytes(p[4 * i..4 * i + 4].try_into().unwrap());
    assert_eq!(field(0), 32, "{name}: header length");
    assert_eq!(field(1), 1, "{name}: VK_PIPELINE_CACHE_HEADER_VERSION_ONE");
    assert_eq!(field(2), hex32(parts[1]), "{name}: vendor id");
    assert_eq!(field(3), hex32(parts[2]), "{name}: device id");
    let uuid: String = p[16..32].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(uuid, parts[4], "{name}: pipelineCacheUUID");
    p
}

/// A backend on a damaged or foreign file: starts cold, runs (validation on: the driver was
/// never handed the data, or took it without complaint), and replaces the file with a good one.
fn ignored_then_replaced(
    name: &str,
    path: &Path,
    content: &[u8],
    what: &str,
    good: &dyn Fn(&Path) -> Vec<u8>,
) {
    std::fs::write(path, content).unwrap();
    let mut b = create(name, &options_for(name)).expect("available a moment ago");
    assert_eq!(state(b.as_ref()), "cold", "{name}, {what}: {:?}", b.info());
    run_small_graph(b.as_mut());
    drop(b);
    assert!(!good(path).is_empty(), "{name}, {what}: replaced by a good file");
}

/// The checks both backends share, after the first backend wrote `path` (`good` checks it).
fn damaged_files_are_ignored(name: &str, path: &Path, good: &dyn Fn(&Path) -> Vec<u8>) {
    let whole = std::fs::read(path).unwrap();
    ignored_then_replaced(name, path, &whole[..whole.len() - 1], "truncated by a byte", good);
    ignored_then_replaced(name, path, &whole[..20], "truncated inside the frame", good);
    let mut flipped = whole.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    ignored_then_replaced(name, path, &flipped, "a payload byte changed", good);
    ignored_then_replaced(name, path, b"", "empty", good);
    ignored_then_replaced(name, path, &[0xAB; 4096], "garbage", good);
}

/// `pipeline_cache = false`: nothing read (a good file is there) and nothing written.
fn off_reads_and_writes_nothing(name: &str, path: &Path) {
    let before = std::fs::read(path).unwrap();
    std::fs::remove_file(path).unwrap();
    let mut o = options_for(name);
    o.set("pipeline_cache", "false");
    let mut b = create(name, &o).expect("available a moment ago");
    assert_eq!(state(b.as_ref()), "off");
    run_small_graph(b.as_mut());
    drop(b);
    assert!(
        !path.exists(),
        "{name}: pipeline_cache = false wrote {}",
        path.display()
    );
    // With the file back, still not read.
    std::fs::write(path, &before).unwrap();
    let b = create(name, &o).expect("available a moment ago");
    assert_eq!(state(b.as_ref()), "off");
}

/// A cache directory that cannot be made (a file stands where it would be): a cold start, the
/// run unharmed, no error.
fn unwritable_directory_costs_nothing(name: &str, cache: &CacheDir) {
    std::fs::remove_dir_all(cache.pipelines()).unwrap();
    std::fs::write(cache.pipelines(), b"not a directory").unwrap();
    let mut b = create(name, &options_for(name)).expect("available a moment ago");
    assert_eq!(state(b.as_ref()), "cold");
    run_small_graph(b.as_mut());
    run_small_graph(b.as_mut());
    drop(b);
    assert_eq!(std::fs::read(cache.pipelines()).unwrap(), b"not a directory");
}

#[test]
fn vulkan_builds_its_pipelines_from_the_disk_cache_on_the_second_start() {
    let cache = CacheDir::new();
    let opts = options_for("vulkan");
    let Some(mut first) = create("vulkan", &opts) else {
        return;
    };
    assert_eq!(state(first.as_ref()), "cold", "{:?}", first.info());
    assert!(cache.files("vulkan").is_empty());
    run_small_graph(first.as_mut());
    let built = count(first.as_ref(), "pipelines").expect("pipelines built");
    assert!(built > 0);
    // Written after the compile, while the backend lives (a server stopped by a signal keeps it).
    let path = cache.file("vulkan");
    let data = vulkan_payload(&path);
    drop(first);
    let data = {
        let after = vulkan_payload(&path);
        assert!(after.len() >= data.len());
        after
    };

    let mut second = create("vulkan", &opts).expect("available a moment ago");
    assert_eq!(state(second.as_ref()), "warm", "{:?}", second.info());
    run_small_graph(second.as_mut());
    assert_eq!(
        count(second.as_ref(), "pipelines"),
        Some(built),
        "the same pipelines"
    );
    let hits = count(second.as_ref(), "pipeline_cache_hits");
    match hits {
        // Creation feedback, and a driver that keeps pipelines in its cache data: each of them
        // came from the file.
        Some(h) if data.len() > 32 => assert_eq!(h, built, "{:?}", second.info()),
        // A driver whose cache data is its header alone (lavapipe of Mesa 22) has nothing to
        // hit: the file was read and checked (`warm`) and that is all it can do.
        Some(h) => {
            assert_eq!(h, 0, "hits without any cached pipeline: {:?}", second.info());
            eprintln!(
                "{}: cache data is the 32-byte header only; {built} pipelines rebuilt (no hits possible)",
                second.info().device
            );
        }
        None => eprintln!("{}: no pipeline creation feedback", second.info().device),
    }
    drop(second);
    vulkan_payload(&path);

    // A good frame around a header of another device or version: not handed to the driver.
    let good = &|p: &Path| vulkan_payload(p);
    for (at, what) in [
        (0, "header length"),
        (4, "header version"),
        (8, "vendor id"),
        (12, "device id"),
        (16, "pipelineCacheUUID"),
    ] {
        let mut forged = data.clone();
        forged[at] ^= 0x01;
        ignored_then_replaced("vulkan", &path, &frame(&forged), what, good);
    }
    ignored_then_replaced("vulkan", &path, &frame(&data[..31]), "a short header", good);
    damaged_files_are_ignored("vulkan", &path, good);
    off_reads_and_writes_nothing("vulkan", &path);
    unwritable_directory_costs_nothing("vulkan", &cache);
}

#[test]
fn wgpu_builds_its_pipelines_with_the_disk_cache_on_the_second_start() {
    let cache = CacheDir::new();
    let opts = options_for("wgpu");
    let Some(mut first) = create("wgpu", &opts) else {
        return;
    };
    let s = state(first.as_ref());
    if s == "unsupported" {
        // Not a Vulkan adapter: wgpu has pipeline caches on Vulkan only.
        assert!(
            !first.info().features.iter().any(|f| f == "vulkan"),
            "{:?}",
            first.info()
        );
        return;
    }
    assert_eq!(s, "cold", "{:?}", first.info());
    run_small_graph(first.as_mut());
    let built = count(first.as_ref(), "pipelines").expect("pipelines built");
    assert!(built > 0);
    let path = cache.file("wgpu");
    assert!(!payload(&path).is_empty());
    drop(first);

    let mut second = create("wgpu", &opts).expect("available a moment ago");
    assert_eq!(state(second.as_ref()), "warm", "{:?}", second.info());
    run_small_graph(second.as_mut());
    assert_eq!(
        count(second.as_ref(), "pipelines"),
        Some(built),
        "the same pipelines"
    );
    drop(second);

    let good = &|p: &Path| payload(p);
    damaged_files_are_ignored("wgpu", &path, good);
    off_reads_and_writes_nothing("wgpu", &path);
    unwritable_directory_costs_nothing("wgpu", &cache);
}
