//! Pipeline caches on disk, for both GPU backends (issue 53: cold start). The wgpu backend
//! includes this file by path (`#[path]`), so it stays self-contained: std only, no graphics
//! API, nothing from either crate.
//!
//! - Where: `$TANDEM_CACHE_DIR/pipelines/`, else `$XDG_CACHE_HOME/tandem/pipelines/`, else
//!   `$HOME/.cache/tandem/pipelines/` (tandem's cache directory, as the model cache finds it);
//!   no directory (none of the three set) means no file.
//! - Which file: one per backend and device, named by the device's vendor id, device id, driver
//!   version and `pipelineCacheUUID` ([`Identity::file_name`]), so another GPU or a driver
//!   update never reads a stale file.
//! - The file: a 32-byte frame ([`frame`]: magic, version, the payload's length and FNV-1a
//!   checksum), then the driver's data (`vkGetPipelineCacheData`, or wgpu's
//!   `PipelineCache::get_data`). A truncated or damaged file fails the checksum and is ignored;
//!   the Vulkan backend also checks the payload's `VkPipelineCacheHeaderVersionOne`
//!   ([`check_vulkan_header`]) before the driver sees a byte.
//! - Writes go to a temporary file in the same directory, renamed over the file: a reader sees
//!   the old file or the new one, never half of one. A directory that cannot be made or
//!   written costs the cache, never the run.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The backend option turning the cache off (`false`), on (`true`, the default) or on with a
/// line on stderr per compile that built pipelines and at the end (`log`).
pub const OPTION: &str = "pipeline_cache";
/// The environment variable read where the option is not set.
pub const VAR: &str = "TANDEM_PIPELINE_CACHE";
/// tandem's cache directory, where set (the engine's model cache reads it too).
pub const DIR_VAR: &str = "TANDEM_CACHE_DIR";

/// The frame's magic: the first 8 bytes of every file.
pub const MAGIC: [u8; 8] = *b"TNDMPLC\0";
/// The frame's version.
pub const FRAME_VERSION: u32 = 1;
/// Bytes of the frame before the payload.
pub const FRAME_BYTES: usize = 32;
/// Files past this size are not read (a cache of a few hundred pipelines is megabytes).
pub const MAX_FILE_BYTES: u64 = 1 << 30;
/// Bytes of `VkPipelineCacheHeaderVersionOne`.
pub const VULKAN_HEADER_BYTES: usize = 32;

/// What the option asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No cache: pipelines are built as before, nothing is read or written.
    Off,
    /// The cache, silently (the default).
    On,
    /// The cache, with a line on stderr per compile that built pipelines and at the end.
    Log,
}

impl Mode {
    /// The option's value (`None`: neither the option nor the variable is set): `log` (any
    /// case), else a yes (`1`, `true`, `yes`, `on`) is on, anything else off; on where unset.
    pub fn parse(value: Option<&str>) -> Mode {
        match value.map(|v| v.to_ascii_lowercase()) {
            None => Mode::On,
            Some(v) if v == "log" => Mode::Log,
            Some(v) if matches!(v.as_str(), "1" | "true" | "yes" | "on") => Mode::On,
            Some(_) => Mode::Off,
        }
    }
}

/// The device's identity as Vulkan reports it (`VkPhysicalDeviceProperties`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub vendor_id: u32,
    pub device_id: u32,
    pub driver_version: u32,
    pub pipeline_cache_uuid: [u8; 16],
}

impl Identity {
    /// `<backend>-<vendor>-<device>-<driver version>-<pipelineCacheUUID>.bin`, in lower-case
    /// hex (8 digits each, then 32).
    pub fn file_name(&self, backend: &str) -> String {
        let uuid: String = self
            .pipeline_cache_uuid
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!(
            "{backend}-{:08x}-{:08x}-{:08x}-{uuid}.bin",
            self.vendor_id, self.device_id, self.driver_version
        )
    }
}

/// The cache directory from `var` (the environment, or a stand-in in tests):
/// `$TANDEM_CACHE_DIR/pipelines`, else `$XDG_CACHE_HOME/tandem/pipelines`, else
/// `$HOME/.cache/tandem/pipelines`; empty values count as unset.
pub fn dir_from(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = set(DIR_VAR) {
        return Some(d.join("pipelines"));
    }
    if let Some(d) = set("XDG_CACHE_HOME") {
        return Some(d.join("tandem").join("pipelines"));
    }
    set("HOME").map(|h| h.join(".cache").join("tandem").join("pipelines"))
}

/// [`dir_from`] the process's environment.
pub fn dir() -> Option<PathBuf> {
    dir_from(|name| std::env::var_os(name))
}

/// FNV-1a, 64 bits.
pub fn checksum(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The file's bytes for `payload`: magic (8 bytes), frame version (u32), 0 (u32), the payload's
/// length (u64) and checksum (u64), all little-endian, then the payload.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_BYTES + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FRAME_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// The payload of a file's bytes, or why they are not one [`frame`] made.
pub fn unframe(file: &[u8]) -> Result<&[u8], String> {
    if file.len() < FRAME_BYTES {
        return Err(format!("{} bytes, shorter than the frame", file.len()));
    }
    if file[..8] != MAGIC {
        return Err("not a tandem pipeline cache (wrong magic)".into());
    }
    let (version, reserved) = (u32_at(file, 8), u32_at(file, 12));
    if (version, reserved) != (FRAME_VERSION, 0) {
        return Err(format!(
            "frame version {version} ({reserved}), expected {FRAME_VERSION} (0)"
        ));
    }
    let len = u64_at(file, 16);
    let payload = &file[FRAME_BYTES..];
    if payload.len() as u64 != len {
        return Err(format!(
            "truncated or extended: {} payload bytes, the frame says {len}",
            payload.len()
        ));
    }
    if checksum(payload) != u64_at(file, 24) {
        return Err("checksum mismatch".into());
    }
    Ok(payload)
}

/// Checks `data` (a `vkGetPipelineCacheData` result) against the device before a driver is
/// handed it: a `VkPipelineCacheHeaderVersionOne` (all fields little-endian, as the spec
/// defines them) of 32 bytes, header version 1 (`VK_PIPELINE_CACHE_HEADER_VERSION_ONE`), and
/// the device's vendor id, device id and `pipelineCacheUUID`.
pub fn check_vulkan_header(data: &[u8], id: &Identity) -> Result<(), String> {
    if data.len() < VULKAN_HEADER_BYTES {
        return Err(format!(
            "{} bytes, shorter than VkPipelineCacheHeaderVersionOne",
            data.len()
        ));
    }
    let (size, version) = (u32_at(data, 0), u32_at(data, 4));
    if size as usize != VULKAN_HEADER_BYTES {
        return Err(format!("header length {size}, expected {VULKAN_HEADER_BYTES}"));
    }
    if version != 1 {
        return Err(format!("header version {version}, expected 1"));
    }
    let (vendor, device) = (u32_at(data, 8), u32_at(data, 12));
    if (vendor, device) != (id.vendor_id, id.device_id) {
        return Err(format!(
            "made on vendor {vendor:#x} device {device:#x}, this is vendor {:#x} device {:#x}",
            id.vendor_id, id.device_id
        ));
    }
    if data[16..32] != id.pipeline_cache_uuid {
        return Err("made by a driver of another pipelineCacheUUID".into());
    }
    Ok(())
}

/// What reading a cache file found.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// No file (or no directory): a cold start, nothing to say.
    Missing,
    /// A file that is not usable, and why: a cold start, worth one note.
    Ignored(String),
    /// The checked payload.
    Payload(Vec<u8>),
}

/// Reads `path` and checks its frame, then the payload with `check`.
pub fn read(path: &Path, check: impl Fn(&[u8]) -> Result<(), String>) -> Read {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Read::Missing,
        Err(e) => return Read::Ignored(format!("cannot open it: {e}")),
    };
    match file.metadata() {
        Ok(m) if m.len() > MAX_FILE_BYTES => {
            return Read::Ignored(format!("{} bytes, more than the {MAX_FILE_BYTES} read", m.len()))
        }
        Ok(_) => {}
        Err(e) => return Read::Ignored(format!("cannot read it: {e}")),
    }
    let mut bytes = Vec::new();
    if let Err(e) = std::io::Read::read_to_end(&mut &file, &mut bytes) {
        return Read::Ignored(format!("cannot read it: {e}"));
    }
    match unframe(&bytes).and_then(|p| check(p).map(|()| p)) {
        Ok(p) => Read::Payload(p.to_vec()),
        Err(why) => Read::Ignored(why),
    }
}

/// Writes `payload`, framed, to `path` through a temporary file in the same directory renamed
/// over it (made with the directory where missing). Concurrent writers each rename a whole
/// file: the last one wins.
pub fn write(path: &Path, payload: &[u8]) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("the cache file has no directory"))?;
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("cache");
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = std::fs::File::create(&tmp).and_then(|mut f| f.write_all(&frame(payload)));
    let renamed = written.and_then(|()| std::fs::rename(&tmp, path));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed
}

/// Prints `text` on stderr as a note, the first time this is called in the process (per
/// backend plugin: each links its own copy), so that a cache that cannot be used says so once.
pub fn note_once(text: &str) {
    static NOTED: AtomicBool = AtomicBool::new(false);
    if !NOTED.swap(true, Ordering::Relaxed) {
        eprintln!("note: {text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity {
            vendor_id: 0x10de,
            device_id: 0x2330,
            driver_version: 0x8a3a_0000,
            pipeline_cache_uuid: [7; 16],
        }
    }

    /// A valid `VkPipelineCacheHeaderVersionOne` for `id`, then `extra` bytes of data.
    fn vulkan_data(id: &Identity, extra: usize) -> Vec<u8> {
        let mut d = Vec::new();
        for v in [32u32, 1, id.vendor_id, id.device_id] {
            d.extend_from_slice(&v.to_le_bytes());
        }
        d.extend_from_slice(&id.pipeline_cache_uuid);
        d.extend((0..extra).map(|i| i as u8));
        d
    }

    #[test]
    fn the_directory_follows_tandem_then_xdg_then_home() {
        fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            move |name| {
                pairs
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        }
        let all = [(DIR_VAR, "/t"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")];
        assert_eq!(dir_from(env(&all)), Some(PathBuf::from("/t/pipelines")));
        assert_eq!(
            dir_from(env(&[(DIR_VAR, ""), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/tandem/pipelines"))
        );
        assert_eq!(
            dir_from(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/tandem/pipelines"))
        );
        assert_eq!(dir_from(env(&[])), None);
    }

    #[test]
    fn file_names_carry_vendor_device_driver_and_uuid() {
        let a = id();
        assert_eq!(
            a.file_name("vulkan"),
            "vulkan-000010de-00002330-8a3a0000-07070707070707070707070707070707.bin"
        );
        let mut b = a;
        b.driver_version += 1;
        assert_ne!(a.file_name("vulkan"), b.file_name("vulkan"));
        b = a;
        b.pipeline_cache_uuid[15] = 8;
        assert_ne!(a.file_name("vulkan"), b.file_name("vulkan"));
        assert_ne!(a.file_name("vulkan"), a.file_name("wgpu"));
    }

    #[test]
    fn the_option_reads_off_on_and_log() {
        assert_eq!(Mode::parse(None), Mode::On);
        for v in ["1", "true", "ON", "yes"] {
            assert_eq!(Mode::parse(Some(v)), Mode::On, "{v}");
        }
        for v in ["0", "false", "off", "no", ""] {
            assert_eq!(Mode::parse(Some(v)), Mode::Off, "{v}");
        }
        assert_eq!(Mode::parse(Some("Log")), Mode::Log);
    }

    #[test]
    fn frames_round_trip_and_every_damage_is_caught() {
        let payload = vulkan_data(&id(), 100);
        let file = frame(&payload);
        assert_eq!(file.len(), FRAME_BYTES + payload.len());
        assert_eq!(unframe(&file).unwrap(), &payload[..]);
        assert_eq!(unframe(&frame(&[])).unwrap(), &[] as &[u8]);
        // Truncated anywhere, extended, one bit flipped anywhere: refused.
        for cut in [0, 7, FRAME_BYTES - 1, FRAME_BYTES, file.len() - 1] {
            assert!(unframe(&file[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = file.clone();
        longer.push(0);
        assert!(unframe(&longer).is_err());
        for at in 0..file.len() {
            let mut bad = file.clone();
            bad[at] ^= 0x10;
            assert!(unframe(&bad).is_err(), "bit flipped at {at}");
        }
    }

    #[test]
    fn vulkan_headers_of_another_device_or_version_are_refused() {
        let me = id();
        assert_eq!(check_vulkan_header(&vulkan_data(&me, 0), &me), Ok(()));
        assert_eq!(check_vulkan_header(&vulkan_data(&me, 64), &me), Ok(()));
        assert!(check_vulkan_header(&vulkan_data(&me, 0)[..31], &me).is_err());
        // Field by field: length, version, vendor, device, uuid.
        for (at, what) in [
            (0, "length"),
            (4, "version"),
            (8, "vendor"),
            (12, "device"),
            (16, "uuid"),
            (31, "uuid"),
        ] {
            let mut d = vulkan_data(&me, 8);
            d[at] ^= 1;
            assert!(check_vulkan_header(&d, &me).is_err(), "{what}");
        }
        // A driver update keeps the header (only the file name tells it).
        let mut updated = me;
        updated.driver_version += 1;
        assert_eq!(check_vulkan_header(&vulkan_data(&me, 0), &updated), Ok(()));
    }

    #[test]
    fn files_are_written_whole_and_read_back_checked() {
        let dir = std::env::temp_dir().join(format!("tandem-cache-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("deeper").join("vulkan-x.bin");
        assert_eq!(read(&path, |_| Ok(())), Read::Missing);
        let me = id();
        let data = vulkan_data(&me, 10);
        write(&path, &data).expect("a writable directory");
        assert_eq!(
            read(&path, |d| check_vulkan_header(d, &me)),
            Read::Payload(data.clone())
        );
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [OsString::from("vulkan-x.bin")]);
        // The payload's check runs after the frame's.
        let mut other = me;
        other.device_id += 1;
        assert!(matches!(
            read(&path, |d| check_vulkan_header(d, &other)),
            Read::Ignored(_)
        ));
        // A truncated file.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert!(matches!(read(&path, |_| Ok(())), Read::Ignored(_)));
        // A directory where the file should be made: an error to the caller, nothing more.
        let blocked = dir.join("file-not-dir");
        std::fs::write(&blocked, b"x").unwrap();
        assert!(write(&blocked.join("vulkan-x.bin"), &data).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
