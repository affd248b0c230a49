//! What `--backend auto` needs to know of each backend plugin (available or why not; the device
//! it drives and its kind), learnt without creating devices where this machine was probed
//! before: the facts are cached per machine in `<cache dir>/adapters.json`, beside
//! `calibration.json` and in its style, each plugin's entry under a key of what could change them.
//!
//! **The key** of a plugin's facts is a hash of:
//! - the plugin file: its path, length and modification time (a rebuilt or upgraded plugin);
//! - its `[backend.NAME]` options and every `TANDEM_<NAME>_*` variable (they choose the adapter
//!   and the features it reports);
//! - the driver environment the GPU loaders read: `VK_*`, `MESA_*`, `WGPU_*`, `DRI_PRIME`,
//!   `NODEVICE_SELECT`, `__GLX_*`/`__EGL_*`, `LD_LIBRARY_PATH` and the XDG data and config dirs;
//! - the driver manifests the Vulkan loader and libglvnd find (every file in the standard
//!   `vulkan/icd.d`, `vulkan/implicit_layer.d` and `glvnd/egl_vendor.d` directories: name,
//!   length, modification time) and each Vulkan driver library a manifest names by path (its
//!   length and modification time);
//! - the kernel drivers' versions (`/sys/module/<driver>/version`) and the device nodes present
//!   (`/dev/dri`, `/dev/accel`, `/dev/nvidia*`), and each display or accelerator PCI function's
//!   vendor and device id.
//!
//! That is enough because a backend's facts are a function of the plugin's code, its options,
//! the drivers the loader finds and the devices present: a driver upgrade replaces its library
//! or kernel module (a new length, time or version), a driver installed or removed changes the
//! manifests, and a GPU added, removed or swapped changes the PCI ids or device nodes. All of
//! it is a few dozen `stat`s and small reads, no instance and no device. What it misses (a
//! driver library named without a path and replaced in place with the same length and time)
//! is caught when the chosen backend is created: facts that turn out wrong are replaced, the
//! choice is made again and the cache rewritten.
//!
//! With valid facts, `auto` creates only the backend it chooses, once ([`Adapters::take`] hands
//! over a backend created while learning facts, so none is created twice). A cache that cannot
//! be read as JSON is rebuilt with one note; a missing, stale or unwritable one silently costs
//! a probe.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tandem_backend_api::{BackendInfo, ComputeBackend};

use super::notice::Notice;
use super::plugins::{Discovery, PluginLookupError};
use super::settings::Settings;
use crate::model::files::cache_dir;

/// The cache file's name in the cache directory.
pub const CACHE_FILE: &str = "adapters.json";

/// Entries kept per backend, each under its own key.
const KEYS_PER_BACKEND: usize = 4;

/// What creating a backend found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Facts {
    /// It was created; what it said about itself.
    Available(BackendInfo),
    /// It could not be; why.
    Unavailable(String),
}

impl Facts {
    fn of(created: &Result<Box<dyn ComputeBackend>, PluginLookupError>) -> Facts {
        match created {
            Ok(b) => Facts::Available(b.info()),
            Err(e) => Facts::Unavailable(e.to_string()),
        }
    }

    /// Whether `self` and `other` lead `auto` to the same choice: both unavailable, or both
    /// available on the same device of the same kind (memory and features may vary run to run).
    fn same_choice(&self, other: &Facts) -> bool {
        match (self, other) {
            (Facts::Available(a), Facts::Available(b)) => a.kind == b.kind && a.device == b.device,
            (Facts::Unavailable(_), Facts::Unavailable(_)) => true,
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    /// The backend (plugin) name.
    backend: String,
    /// The key (see the module's documentation), as a hash.
    key: String,
    /// What creating it found.
    facts: Facts,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    entries: Vec<Entry>,
}

/// How facts are learnt: the key of a backend's facts, and creating it.
pub trait Prober {
    /// The key of `name`'s facts, computed without creating anything; `None` where there is
    /// nothing worth caching (no plugin of that name: asking again costs nothing).
    fn key(&mut self, name: &str) -> Option<String>;
    /// Creates the backend `name`.
    fn create(&mut self, name: &str) -> Result<Box<dyn ComputeBackend>, PluginLookupError>;
}

/// A backend [`Adapters::take_as`] created or handed back.
pub enum Taken {
    /// The backend, its facts what the caller was told.
    Same(Box<dyn ComputeBackend>),
    /// The facts the caller chose by were stale: they are replaced (and a created backend kept
    /// for the next [`Adapters::take`]); choose again.
    Changed,
}

/// The facts of this run: cached, or learnt by creating backends, which are kept until taken.
pub struct Adapters<'a> {
    prober: Box<dyn Prober + 'a>,
    /// Where the cache lives (`None`: nothing is cached).
    path: Option<PathBuf>,
    /// The cache as read (`None` until first needed).
    file: Option<CacheFile>,
    /// Facts known this run, with whether they were learnt by creating the backend this run.
    known: Vec<(String, Facts, bool)>,
    /// Backends created and not yet taken.
    pool: Vec<(String, Box<dyn ComputeBackend>)>,
    /// Whether the cache needs writing.
    dirty: bool,
}

impl<'a> Adapters<'a> {
    /// Facts learnt through `prober`, cached in `path`.
    pub fn new(prober: Box<dyn Prober + 'a>, path: Option<PathBuf>) -> Adapters<'a> {
        Adapters {
            prober,
            path,
            file: None,
            known: Vec::new(),
            pool: Vec::new(),
            dirty: false,
        }
    }

    /// The plugins `discovery` found, with their `settings`, cached in the cache directory.
    pub fn for_plugins(discovery: &'a Discovery, settings: &'a Settings) -> Adapters<'a> {
        Adapters::new(
            Box::new(PluginProber::new(discovery, settings)),
            cache_dir().map(|d| d.join(CACHE_FILE)),
        )
    }

    /// The cache, read once; an unreadable one (not JSON, or not this shape) becomes empty, with
    /// one note.
    fn file(&mut self, notices: &mut dyn FnMut(Notice)) -> &mut CacheFile {
        let path = self.path.clone();
        self.file.get_or_insert_with(|| {
            let Some(path) = path else {
                return CacheFile::default();
            };
            let Ok(text) = std::fs::read_to_string(&path) else {
                return CacheFile::default();
            };
            serde_json::from_str(&text).unwrap_or_else(|e| {
                notices(Notice::Note(format!(
                    "the adapter cache {} is unreadable ({e}): the backends are probed again and it is rewritten",
                    path.display()
                )));
                CacheFile::default()
            })
        })
    }

    /// What `name` offers: known this run, else cached under its current key, else learnt by
    /// creating it (the backend is kept for [`Adapters::take`]).
    pub fn facts(&mut self, name: &str, notices: &mut dyn FnMut(Notice)) -> Facts {
        if let Some((_, f, _)) = self.known.iter().find(|(n, _, _)| n == name) {
            return f.clone();
        }
        let key = self.prober.key(name);
        if let Some(key) = &key {
            let cached = self
                .file(notices)
                .entries
                .iter()
                .find(|e| e.backend == name && &e.key == key)
                .map(|e| e.facts.clone());
            if let Some(f) = cached {
                self.known.push((name.to_string(), f.clone(), false));
                return f;
            }
        }
        self.learn(name, key, notices)
    }

    /// Creates `name`, records what that found (and caches it under `key`), keeps the backend.
    fn learn(&mut self, name: &str, key: Option<String>, notices: &mut dyn FnMut(Notice)) -> Facts {
        let created = self.prober.create(name);
        let facts = Facts::of(&created);
        self.record(name, key, facts.clone(), notices);
        if let Ok(b) = created {
            self.pool.push((name.to_string(), b));
        }
        facts
    }

    fn record(&mut self, name: &str, key: Option<String>, facts: Facts, notices: &mut dyn FnMut(Notice)) {
        self.known.retain(|(n, _, _)| n != name);
        self.known.push((name.to_string(), facts.clone(), true));
        if let Some(key) = key {
            let file = self.file(notices);
            file.entries.retain(|e| !(e.backend == name && e.key == key));
            file.entries.push(Entry {
                backend: name.to_string(),
                key,
                facts,
            });
            // A few keys per backend (installations side by side, a driver switched back and
            // forth), the oldest dropped first.
            while file.entries.iter().filter(|e| e.backend == name).count() > KEYS_PER_BACKEND {
                if let Some(i) = file.entries.iter().position(|e| e.backend == name) {
                    file.entries.remove(i);
                }
            }
            self.dirty = true;
        }
    }

    /// The backend `name`: the one created while learning its facts, else a new one.
    pub fn take(&mut self, name: &str) -> Result<Box<dyn ComputeBackend>, PluginLookupError> {
        match self.pool.iter().position(|(n, _)| n == name) {
            Some(i) => Ok(self.pool.swap_remove(i).1),
            None => self.prober.create(name),
        }
    }

    /// The backend `name`, chosen because its facts were `expected`: [`Taken::Changed`] where
    /// creating it tells otherwise (cached facts gone stale), the facts then replaced.
    pub fn take_as(&mut self, name: &str, expected: &Facts, notices: &mut dyn FnMut(Notice)) -> Taken {
        let created = self.take(name);
        let facts = Facts::of(&created);
        if facts.same_choice(expected) {
            if let Ok(b) = created {
                return Taken::Same(b);
            }
        }
        let key = self.prober.key(name);
        self.record(name, key, facts, notices);
        if let Ok(b) = created {
            self.pool.push((name.to_string(), b));
        }
        Taken::Changed
    }

    /// Hands a backend back for a later [`Adapters::take`].
    pub fn give_back(&mut self, name: &str, backend: Box<dyn ComputeBackend>) {
        self.pool.push((name.to_string(), backend));
    }

    /// Writes the cache if anything new was learnt. A cache that cannot be written only costs a
    /// probe next time.
    pub fn save(&mut self) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        let (Some(path), Some(file)) = (&self.path, &self.file) else {
            return;
        };
        let Ok(text) = serde_json::to_string_pretty(file) else {
            return;
        };
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // Written beside it and renamed: a concurrent run reads the old file or the new one.
        let tmp = path.with_extension(format!("json.{}", std::process::id()));
        if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// Facts of the plugins a [`Discovery`] found, keyed as the module's documentation says.
pub struct PluginProber<'a> {
    discovery: &'a Discovery,
    settings: &'a Settings,
    /// The machine's part of every key, computed once.
    machine: Option<String>,
}

impl<'a> PluginProber<'a> {
    /// Probes `discovery`'s plugins with `settings`' options.
    pub fn new(discovery: &'a Discovery, settings: &'a Settings) -> Self {
        PluginProber {
            discovery,
            settings,
            machine: None,
        }
    }
}

impl Prober for PluginProber<'_> {
    fn key(&mut self, name: &str) -> Option<String> {
        let lib = self.discovery.get(name)?;
        let machine = self.machine.get_or_insert_with(machine_fingerprint);
        let mut text = String::new();
        text.push_str(&file_identity(lib.path()));
        text.push('\n');
        text.push_str(&format!("{:?}\n", self.settings.backend_options(name).entries));
        let prefix = format!("TANDEM_{}_", name.to_ascii_uppercase().replace('-', "_"));
        text.push_str(&environment(&|v| v.starts_with(&prefix)));
        text.push_str(machine);
        Some(format!("{:016x}", fnv1a(text.as_bytes())))
    }

    fn create(&mut self, name: &str) -> Result<Box<dyn ComputeBackend>, PluginLookupError> {
        self.discovery.create(name, &self.settings.backend_options(name))
    }
}

/// FNV-1a, 64 bits: a hash that is the same in every build (the standard library's is not
/// promised to be).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `path` with its length and modification time (nanoseconds), or `path -` where it is absent.
fn file_identity(path: &Path) -> String {
    match std::fs::metadata(path) {
        Ok(m) => {
            let mtime = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            format!("{} {} {mtime}", path.display(), m.len())
        }
        Err(_) => format!("{} -", path.display()),
    }
}

/// The environment variables the GPU loaders and drivers read.
fn driver_variable(name: &str) -> bool {
    const PREFIXES: [&str; 5] = ["VK_", "MESA_", "WGPU_", "__GLX_", "__EGL_"];
    const NAMES: [&str; 6] = [
        "DRI_PRIME",
        "NODEVICE_SELECT",
        "LD_LIBRARY_PATH",
        "XDG_DATA_DIRS",
        "XDG_CONFIG_DIRS",
        "XDG_DATA_HOME",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&name)
}

/// `NAME=value` lines of the variables `pick` selects, sorted.
fn environment(pick: &dyn Fn(&str) -> bool) -> String {
    let mut vars: Vec<String> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.to_str()?.to_string();
            pick(&k).then(|| format!("{k}={}\n", v.to_string_lossy()))
        })
        .collect();
    vars.sort();
    vars.concat()
}

/// The directories whose files are driver manifests: the Vulkan loader's (drivers and implicit
/// layers, system and user) and libglvnd's EGL vendors (wgpu's GL fallback).
fn manifest_dirs() -> Vec<PathBuf> {
    let var = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from);
    let mut config: Vec<PathBuf> = vec![PathBuf::from("/etc")];
    let mut data: Vec<PathBuf> = Vec::new();
    if let Some(dirs) = std::env::var_os("XDG_CONFIG_DIRS") {
        config.extend(std::env::split_paths(&dirs));
    } else {
        config.push(PathBuf::from("/etc/xdg"));
    }
    if let Some(h) = var("XDG_CONFIG_HOME").or_else(|| var("HOME").map(|h| h.join(".config"))) {
        config.push(h);
    }
    match std::env::var_os("XDG_DATA_DIRS") {
        Some(dirs) => data.extend(std::env::split_paths(&dirs)),
        None => data.extend(["/usr/local/share", "/usr/share"].map(PathBuf::from)),
    }
    if let Some(h) = var("XDG_DATA_HOME").or_else(|| var("HOME").map(|h| h.join(".local/share"))) {
        data.push(h);
    }
    let mut out = Vec::new();
    for base in config.iter().chain(&data) {
        for sub in ["vulkan/icd.d", "vulkan/implicit_layer.d", "glvnd/egl_vendor.d"] {
            let d = base.join(sub);
            if !out.contains(&d) {
                out.push(d);
            }
        }
    }
    out
}

/// The sorted entries of `dir` (none where it cannot be read).
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The library a Vulkan driver manifest names, where it names one by path.
fn manifest_library(manifest: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(manifest).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    let lib = json.get("ICD")?.get("library_path")?.as_str()?;
    let lib = Path::new(lib);
    if lib.is_absolute() {
        Some(lib.to_path_buf())
    } else if lib.components().count() > 1 {
        Some(manifest.parent()?.join(lib))
    } else {
        None
    }
}

/// The machine's part of every key: driver environment, manifests and their libraries, kernel
/// drivers and devices (see the module's documentation).
fn machine_fingerprint() -> String {
    let mut text = environment(&driver_variable);
    for dir in manifest_dirs() {
        for file in entries(&dir) {
            text.push_str(&file_identity(&file));
            text.push('\n');
            if dir.ends_with("icd.d") {
                if let Some(lib) = manifest_library(&file) {
                    text.push_str(&file_identity(&lib));
                    text.push('\n');
                }
            }
        }
    }
    for module in [
        "nvidia",
        "amdgpu",
        "i915",
        "xe",
        "radeon",
        "nouveau",
        "amdxdna",
        "intel_vpu",
    ] {
        if let Ok(v) = std::fs::read_to_string(format!("/sys/module/{module}/version")) {
            text.push_str(&format!("{module} {}\n", v.trim()));
        }
    }
    for dir in ["/dev/dri", "/dev/accel"] {
        for node in entries(Path::new(dir)) {
            text.push_str(&format!("{}\n", node.display()));
        }
    }
    for node in entries(Path::new("/dev")) {
        if node
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("nvidia"))
        {
            text.push_str(&format!("{}\n", node.display()));
        }
    }
    // Display controllers (class 0x03) and processing accelerators (0x12): vendor and device.
    for dev in entries(Path::new("/sys/bus/pci/devices")) {
        let read = |f: &str| std::fs::read_to_string(dev.join(f)).map(|s| s.trim().to_string());
        let Ok(class) = read("class") else { continue };
        if class.starts_with("0x03") || class.starts_with("0x12") {
            let id = format!(
                "{} {class} {} {}\n",
                dev.display(),
                read("vendor").unwrap_or_default(),
                read("device").unwrap_or_default()
            );
            text.push_str(&id);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::sync::{Arc, Mutex};

    use tandem_backend_api::DeviceKind;

    use super::*;
    use crate::runtime::split::fake::{Fake, Registry};

    /// A machine of fake backends: each name's kind (or `None`: unavailable), the key of its
    /// facts, and a count of the backends created.
    struct Machine {
        backends: Vec<(&'static str, Option<DeviceKind>)>,
        key: String,
        created: Rc<RefCell<Vec<String>>>,
    }

    impl Prober for Machine {
        fn key(&mut self, name: &str) -> Option<String> {
            Some(format!("{name}:{}", self.key))
        }
        fn create(&mut self, name: &str) -> Result<Box<dyn ComputeBackend>, PluginLookupError> {
            self.created.borrow_mut().push(name.to_string());
            match self.backends.iter().find(|(n, _)| *n == name) {
                Some((_, Some(kind))) => {
                    let mut fake = Fake::new(0, &Arc::new(Mutex::new(Registry::default())), false);
                    fake.kind = *kind;
                    Ok(Box::new(fake))
                }
                _ => Err(PluginLookupError::NotFound {
                    name: name.to_string(),
                    found: vec![],
                }),
            }
        }
    }

    fn machine(key: &str, created: &Rc<RefCell<Vec<String>>>) -> Box<Machine> {
        Box::new(Machine {
            backends: vec![
                ("vulkan", Some(DeviceKind::SoftwareGpu)),
                ("wgpu", None),
                ("cpu", Some(DeviceKind::Cpu)),
            ],
            key: key.to_string(),
            created: created.clone(),
        })
    }

    fn kind(f: &Facts) -> Option<DeviceKind> {
        match f {
            Facts::Available(i) => Some(i.kind),
            Facts::Unavailable(_) => None,
        }
    }

    /// Learns every backend's facts, then takes cpu: the `auto` of a machine with lavapipe.
    fn probe_all(a: &mut Adapters, notes: &mut Vec<Notice>) -> Vec<Option<DeviceKind>> {
        let kinds = ["vulkan", "wgpu", "cpu"]
            .iter()
            .map(|n| kind(&a.facts(n, &mut |n| notes.push(n))))
            .collect();
        let cpu = a.facts("cpu", &mut |n| notes.push(n));
        assert!(matches!(
            a.take_as("cpu", &cpu, &mut |n| notes.push(n)),
            Taken::Same(_)
        ));
        a.save();
        kinds
    }

    #[test]
    fn a_valid_cache_creates_only_the_backend_taken_and_a_changed_key_probes_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join(CACHE_FILE);
        let created = Rc::new(RefCell::new(Vec::new()));
        let mut notes = Vec::new();
        let want = vec![Some(DeviceKind::SoftwareGpu), None, Some(DeviceKind::Cpu)];

        // First run: every backend created once (cpu's kept and taken, not created twice).
        let mut a = Adapters::new(machine("k1", &created), Some(path.clone()));
        assert_eq!(probe_all(&mut a, &mut notes), want);
        assert_eq!(*created.borrow(), ["vulkan", "wgpu", "cpu"]);
        assert!(path.exists());

        // Second run, same key: the facts from the cache, only cpu created.
        created.borrow_mut().clear();
        let mut a = Adapters::new(machine("k1", &created), Some(path.clone()));
        assert_eq!(probe_all(&mut a, &mut notes), want);
        assert_eq!(*created.borrow(), ["cpu"]);

        // A changed key (a driver upgraded): probed again.
        created.borrow_mut().clear();
        let mut a = Adapters::new(machine("k2", &created), Some(path.clone()));
        assert_eq!(probe_all(&mut a, &mut notes), want);
        assert_eq!(*created.borrow(), ["vulkan", "wgpu", "cpu"]);
        assert!(notes.is_empty(), "{notes:?}");
    }

    #[test]
    fn a_corrupt_cache_is_rebuilt_with_one_note() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CACHE_FILE);
        std::fs::write(&path, "{ not json").unwrap();
        let created = Rc::new(RefCell::new(Vec::new()));
        let mut notes = Vec::new();
        let mut a = Adapters::new(machine("k", &created), Some(path.clone()));
        probe_all(&mut a, &mut notes);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            matches!(&notes[0], Notice::Note(m) if m.contains("adapter cache") && m.contains(&path.display().to_string())),
            "{notes:?}"
        );
        // Rebuilt: the next run reads it without a note and creates only cpu.
        created.borrow_mut().clear();
        notes.clear();
        let mut a = Adapters::new(machine("k", &created), Some(path));
        probe_all(&mut a, &mut notes);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(*created.borrow(), ["cpu"]);
    }

    #[test]
    fn stale_facts_are_replaced_when_the_backend_says_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CACHE_FILE);
        let created = Rc::new(RefCell::new(Vec::new()));
        let mut notes = Vec::new();
        let mut a = Adapters::new(machine("k", &created), Some(path.clone()));
        probe_all(&mut a, &mut notes);
        // Same key, but vulkan is now a discrete GPU (what the key could not see).
        let mut m = machine("k", &created);
        m.backends[0].1 = Some(DeviceKind::DiscreteGpu);
        created.borrow_mut().clear();
        let mut a = Adapters::new(m, Some(path.clone()));
        let cached = a.facts("vulkan", &mut |n| notes.push(n));
        assert_eq!(kind(&cached), Some(DeviceKind::SoftwareGpu));
        assert!(matches!(
            a.take_as("vulkan", &cached, &mut |n| notes.push(n)),
            Taken::Changed
        ));
        let fresh = a.facts("vulkan", &mut |n| notes.push(n));
        assert_eq!(kind(&fresh), Some(DeviceKind::DiscreteGpu));
        // The backend created to find out is the one taken next: created once.
        assert!(matches!(
            a.take_as("vulkan", &fresh, &mut |n| notes.push(n)),
            Taken::Same(_)
        ));
        assert_eq!(*created.borrow(), ["vulkan"]);
        a.save();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("discrete_gpu"), "{text}");
    }

    #[test]
    fn the_key_hash_is_stable() {
        // FNV-1a's published test vectors: a key written by one build is read by the next.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
