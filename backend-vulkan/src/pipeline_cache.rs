//! The device's `VkPipelineCache`, seeded from a file at creation and written back (merged with
//! what other processes wrote meanwhile) after each compile that built pipelines and when the
//! backend is dropped (issue 53: `engine serve` spent 31 s building pipelines at start). Where
//! the file lives, its frame and its checks are in `cache_file`.
//!
//! It also counts: pipelines built, the time `vkCreateComputePipelines` took, and, where the
//! device reports creation feedback (`VkPipelineCreationFeedbackCreateInfo`, core in 1.3), how
//! many of them were hits of the application's pipeline cache
//! (`VK_PIPELINE_CREATION_FEEDBACK_APPLICATION_PIPELINE_CACHE_HIT_BIT`). `info().features`
//! carries them (`pipeline_cache=cold|warm|off`, `pipelines=N`, `pipeline_cache_hits=M`,
//! `pipelines_ms=T`), and option `pipeline_cache = "log"` prints them on stderr.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ash::vk;
use tandem_backend_api::BackendError;

use crate::cache_file::{self, Mode, Read};
use crate::device::{map, Gpu};

/// What the file gave at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The option is off: no cache at all.
    Off,
    /// No usable file (none yet, unreadable, damaged, or of another device or driver): the
    /// cache started empty.
    Cold,
    /// Seeded from the file.
    Warm,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Off => "off",
            State::Cold => "cold",
            State::Warm => "warm",
        }
    }
}

/// The counters, to tell what one compile added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Pipelines created.
    pub built: u64,
    /// Of those, the ones the driver reported as hits of the pipeline cache.
    pub hits: u64,
    /// Time spent in `vkCreateComputePipelines`.
    pub time: Duration,
}

/// The device's pipeline cache and its file.
pub struct PipelineCache {
    /// The cache every pipeline is created with (null where the option is off).
    pub handle: vk::PipelineCache,
    mode: Mode,
    /// The file, where there is a cache directory.
    path: Option<PathBuf>,
    state: State,
    /// Bytes of driver data read from the file at creation.
    read_bytes: usize,
    /// Checksum of the payload the file held when this backend last read or wrote it: another
    /// value there means another process wrote it since, and it is merged in before writing.
    on_disk: Option<u64>,
    /// The file's length and modification time then: while they stay, the file is not read
    /// again before a write.
    seen: Option<(u64, Option<SystemTime>)>,
    /// Pipelines built since the last write that were not cache hits (every pipeline, where
    /// the device gives no feedback): a warm start whose pipelines all came from the file
    /// writes nothing.
    unsaved: u64,
    /// Bytes last written.
    written: usize,
    /// A write failed: no more tries (the note was made).
    unwritable: bool,
    /// Whether every pipeline so far came with valid creation feedback (the hit count means
    /// something only then).
    feedback: bool,
    pub counts: Counts,
}

impl PipelineCache {
    /// The cache for `gpu`: seeded from its file where `mode` is not off and the file is there
    /// and passes every check; else empty (a damaged or foreign file gets one note on stderr).
    pub fn open(gpu: &Gpu, mode: Mode) -> Result<PipelineCache, BackendError> {
        let mut c = PipelineCache {
            handle: vk::PipelineCache::null(),
            mode,
            path: None,
            state: State::Off,
            read_bytes: 0,
            on_disk: None,
            seen: None,
            unsaved: 0,
            written: 0,
            unwritable: false,
            feedback: gpu.creation_feedback,
            counts: Counts::default(),
        };
        if mode == Mode::Off {
            return Ok(c);
        }
        c.state = State::Cold;
        c.path = cache_file::dir().map(|d| d.join(gpu.identity.file_name("vulkan")));
        let mut why_cold = match &c.path {
            None => "no cache directory: TANDEM_CACHE_DIR, XDG_CACHE_HOME and HOME are unset".to_string(),
            Some(_) => "no file yet".to_string(),
        };
        if let Some(path) = &c.path {
            match cache_file::read(path, |d| cache_file::check_vulkan_header(d, &gpu.identity)) {
                Read::Missing => {}
                Read::Ignored(why) => {
                    cache_file::note_once(&format!(
                        "vulkan pipeline cache {}: not used ({why}); starting empty",
                        path.display()
                    ));
                    why_cold = why;
                }
                Read::Payload(data) => match create(gpu, &data) {
                    Ok(h) => {
                        c.handle = h;
                        c.state = State::Warm;
                        c.read_bytes = data.len();
                        c.on_disk = Some(cache_file::checksum(&data));
                        c.seen = stat(path);
                    }
                    Err(e) => {
                        // The header matched, yet the driver refused the data: start empty.
                        cache_file::note_once(&format!(
                            "vulkan pipeline cache {}: the driver refused it ({e}); starting empty",
                            path.display()
                        ));
                        why_cold = format!("the driver refused it: {e}");
                    }
                },
            }
        }
        if c.handle == vk::PipelineCache::null() {
            c.handle = map("vkCreatePipelineCache", &gpu.name, create(gpu, &[]))?;
        }
        if mode == Mode::Log {
            let path = c
                .path
                .as_ref()
                .map_or("(no file)".into(), |p| p.display().to_string());
            match c.state {
                State::Warm => eprintln!("vulkan: pipeline cache {path}: warm, {} bytes read", c.read_bytes),
                _ => eprintln!("vulkan: pipeline cache {path}: cold ({why_cold})"),
            }
        }
        Ok(c)
    }

    /// Whether the cache was seeded from its file (its pipelines then come quickly).
    pub fn warm(&self) -> bool {
        matches!(self.state, State::Warm)
    }

    /// Whether option `pipeline_cache = "log"` asks for lines on stderr.
    pub fn logging(&self) -> bool {
        self.mode == Mode::Log
    }

    /// Counts one pipeline created in `time`, with the driver's feedback where asked for.
    pub fn record(&mut self, time: Duration, feedback: Option<vk::PipelineCreationFeedback>) {
        self.counts.built += 1;
        self.counts.time += time;
        let hit = match feedback {
            Some(f) if f.flags.contains(vk::PipelineCreationFeedbackFlags::VALID) => f
                .flags
                .contains(vk::PipelineCreationFeedbackFlags::APPLICATION_PIPELINE_CACHE_HIT),
            _ => {
                self.feedback = false;
                false
            }
        };
        if hit {
            self.counts.hits += 1;
        } else {
            self.unsaved += 1;
        }
    }

    /// After a compile that began at `before`: writes the file where pipelines the file lacked
    /// were built since the last write, and with option `log` says what the compile built.
    pub fn compiled(&mut self, gpu: &Gpu, what: &str, before: Counts) {
        let now = self.counts;
        if now.built == before.built {
            return;
        }
        self.save(gpu);
        if self.mode == Mode::Log {
            let hits = if self.feedback {
                format!(", {} of them cache hits", now.hits - before.hits)
            } else {
                String::new()
            };
            eprintln!(
                "vulkan: compile {what}: built {} pipelines{hits} in {} ms ({} so far)",
                now.built - before.built,
                (now.time - before.time).as_millis(),
                now.built
            );
        }
    }

    /// Writes the cache's data to the file, merged with the file's where another process wrote
    /// it since, if pipelines that were not cache hits were built since the last write. Never
    /// fails: a directory that cannot be written gets one note, and no more tries.
    pub fn save(&mut self, gpu: &Gpu) {
        if self.handle == vk::PipelineCache::null() || self.unwritable || self.unsaved == 0 {
            return;
        }
        let Some(path) = self.path.clone() else {
            return;
        };
        // What another process wrote since (the file changed): merged in, after the same
        // checks as at creation.
        let changed = stat(&path).is_some_and(|now| Some(now) != self.seen);
        if let Some(Read::Payload(theirs)) =
            changed.then(|| cache_file::read(&path, |d| cache_file::check_vulkan_header(d, &gpu.identity)))
        {
            if Some(cache_file::checksum(&theirs)) != self.on_disk {
                if let Ok(other) = create(gpu, &theirs) {
                    // SAFETY: both caches are ours and alive; `other` is not the destination;
                    // no other call uses `handle` meanwhile (the backend is `&mut`).
                    let _ = unsafe { gpu.device.merge_pipeline_caches(self.handle, &[other]) };
                    // SAFETY: created above and used by nothing else.
                    unsafe { gpu.device.destroy_pipeline_cache(other, None) };
                }
            }
        }
        // SAFETY: the cache is ours and no pipeline is being created with it meanwhile.
        let data = match unsafe { gpu.device.get_pipeline_cache_data(self.handle) } {
            Ok(d) => d,
            Err(e) => {
                cache_file::note_once(&format!(
                    "vulkan pipeline cache: the driver gave no data ({e}); it is not written"
                ));
                self.unwritable = true;
                return;
            }
        };
        match cache_file::write(&path, &data) {
            Ok(()) => {
                self.on_disk = Some(cache_file::checksum(&data));
                self.seen = stat(&path);
                self.unsaved = 0;
                self.written = data.len();
            }
            Err(e) => {
                cache_file::note_once(&format!(
                    "vulkan pipeline cache {}: cannot write it ({e}); pipelines will be built \
                     again next time",
                    path.display()
                ));
                self.unwritable = true;
            }
        }
    }

    /// What `info().features` says: `pipeline_cache=<state>`, and once pipelines were built
    /// `pipelines=N`, `pipeline_cache_hits=M` (where the device reports creation feedback) and
    /// `pipelines_ms=T`.
    pub fn features(&self) -> Vec<String> {
        let mut f = vec![format!("pipeline_cache={}", self.state.name())];
        if self.counts.built > 0 {
            f.push(format!("pipelines={}", self.counts.built));
            if self.feedback {
                f.push(format!("pipeline_cache_hits={}", self.counts.hits));
            }
            f.push(format!("pipelines_ms={}", self.counts.time.as_millis()));
        }
        f
    }

    /// Writes the file (see [`PipelineCache::save`]), says what this backend built with option
    /// `log`, and destroys the cache (the device must be idle).
    pub fn destroy(&mut self, gpu: &Gpu) {
        self.save(gpu);
        if self.mode == Mode::Log {
            let hits = if self.feedback {
                format!(", {} cache hits", self.counts.hits)
            } else {
                String::new()
            };
            let file = match (&self.path, self.written) {
                (Some(p), n) if n > 0 => format!("; wrote {n} bytes to {}", p.display()),
                _ => String::new(),
            };
            eprintln!(
                "vulkan: pipeline cache {}: {} pipelines built{hits} in {} ms{file}",
                self.state.name(),
                self.counts.built,
                self.counts.time.as_millis()
            );
        }
        if self.handle != vk::PipelineCache::null() {
            // SAFETY: the device is idle; every pipeline created with the cache is independent of
            // it once created.
            unsafe { gpu.device.destroy_pipeline_cache(self.handle, None) };
            self.handle = vk::PipelineCache::null();
        }
    }
}

/// The file's length and modification time, where it is there.
fn stat(path: &Path) -> Option<(u64, Option<SystemTime>)> {
    std::fs::metadata(path).ok().map(|m| (m.len(), m.modified().ok()))
}

/// A pipeline cache on `gpu` seeded with `data` (checked by `cache_file` first, or empty).
fn create(gpu: &Gpu, data: &[u8]) -> Result<vk::PipelineCache, vk::Result> {
    let info = vk::PipelineCacheCreateInfo::default().initial_data(data);
    // SAFETY: a valid create info on our device; `data` is empty or passed the frame's checksum
    // and the VkPipelineCacheHeaderVersionOne checks against this device.
    unsafe { gpu.device.create_pipeline_cache(&info, None) }
}
