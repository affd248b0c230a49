//! wgpu's `PipelineCache` kept on disk (issue 53: cold start), where the adapter has one (a
//! Vulkan adapter: `Features::PIPELINE_CACHE`, `util::pipeline_cache_key`): seeded from its
//! file at creation, written back after each compile that built pipelines and when the backend
//! is dropped. The directory, the file's name (vendor, device, driver version and
//! `pipelineCacheUUID`, read through wgpu-hal), its frame and checksum and the atomic write are
//! the Vulkan backend's (`cache_file`, included by path). wgpu checks its own header inside
//! the payload (adapter, driver version, length) and, asked to fall back, starts empty on a
//! mismatch. wgpu has no merge: the last process to write the file wins.

use std::path::PathBuf;
use std::time::Duration;

use crate::cache_file::{self, Identity, Mode, Read};

/// What the cache is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The option is off.
    Off,
    /// The adapter has no pipeline cache (not Vulkan).
    Unsupported,
    /// No usable file: started empty.
    Cold,
    /// Seeded from the file.
    Warm,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Off => "off",
            State::Unsupported => "unsupported",
            State::Cold => "cold",
            State::Warm => "warm",
        }
    }
}

/// The cache and its file.
pub struct DiskCache {
    /// The cache pipelines are created with (`None`: off or unsupported).
    pub cache: Option<wgpu::PipelineCache>,
    mode: Mode,
    path: Option<PathBuf>,
    state: State,
    /// Pipelines built when the file was last written.
    saved: u64,
    /// Bytes last written.
    written: usize,
    /// A write failed: no more tries (the note was made).
    unwritable: bool,
}

impl DiskCache {
    /// The cache on `device`, keyed by `identity` (`None` where the device was opened without
    /// `PIPELINE_CACHE`), seeded from its file where there is a good one.
    pub fn open(device: &wgpu::Device, identity: Option<Identity>, mode: Mode) -> DiskCache {
        let mut c = DiskCache {
            cache: None,
            mode,
            path: None,
            state: if mode == Mode::Off {
                State::Off
            } else {
                State::Unsupported
            },
            saved: 0,
            written: 0,
            unwritable: false,
        };
        let Some(identity) = identity.filter(|_| mode != Mode::Off) else {
            return c;
        };
        c.state = State::Cold;
        c.path = cache_file::dir().map(|d| d.join(identity.file_name("wgpu")));
        let mut seed = None;
        let mut why_cold = match &c.path {
            None => "no cache directory: TANDEM_CACHE_DIR, XDG_CACHE_HOME and HOME are unset".to_string(),
            Some(_) => "no file yet".to_string(),
        };
        if let Some(path) = &c.path {
            match cache_file::read(path, |_| Ok(())) {
                Read::Missing => {}
                Read::Ignored(why) => {
                    cache_file::note_once(&format!(
                        "wgpu pipeline cache {}: not used ({why}); starting empty",
                        path.display()
                    ));
                    why_cold = why;
                }
                Read::Payload(p) => seed = Some(p),
            }
        }
        if let Some(data) = &seed {
            match create(device, Some(data)) {
                Ok(cache) => {
                    c.cache = Some(cache);
                    c.state = State::Warm;
                }
                Err(e) => {
                    cache_file::note_once(&format!(
                        "wgpu pipeline cache: wgpu refused the file ({e}); starting empty"
                    ));
                    why_cold = format!("wgpu refused it: {e}");
                }
            }
        }
        if c.cache.is_none() {
            c.cache = create(device, None).ok();
        }
        if mode == Mode::Log {
            let path = c
                .path
                .as_ref()
                .map_or("(no file)".into(), |p| p.display().to_string());
            match (c.state, &seed) {
                (State::Warm, Some(d)) => {
                    eprintln!("wgpu: pipeline cache {path}: warm, {} bytes read", d.len())
                }
                _ => eprintln!("wgpu: pipeline cache {path}: cold ({why_cold})"),
            }
        }
        c
    }

    /// After a compile that began with `before` pipelines built (and `before_time` spent on
    /// them): writes the file where pipelines were built since the last write, and with option
    /// `log` says what the compile built.
    pub fn compiled(&mut self, what: &str, built: u64, time: Duration, before: (u64, Duration)) {
        if built == before.0 {
            return;
        }
        self.save(built);
        if self.mode == Mode::Log {
            eprintln!(
                "wgpu: compile {what}: built {} pipelines in {} ms ({built} so far)",
                built - before.0,
                (time - before.1).as_millis()
            );
        }
    }

    /// Writes the cache's data if pipelines were built since the last write (`built` now).
    /// Never fails: a directory that cannot be written gets one note, and no more tries.
    pub fn save(&mut self, built: u64) {
        if self.unwritable || built == self.saved {
            return;
        }
        let (Some(cache), Some(path)) = (&self.cache, &self.path) else {
            return;
        };
        let Some(data) = cache.get_data() else {
            return;
        };
        match cache_file::write(path, &data) {
            Ok(()) => {
                self.saved = built;
                self.written = data.len();
            }
            Err(e) => {
                cache_file::note_once(&format!(
                    "wgpu pipeline cache {}: cannot write it ({e}); pipelines will be built again \
                     next time",
                    path.display()
                ));
                self.unwritable = true;
            }
        }
    }

    /// `pipeline_cache=<state>`, and once pipelines were built `pipelines=N` and
    /// `pipelines_ms=T` (wgpu reports no cache hits).
    pub fn features(&self, built: u64, time: Duration) -> Vec<String> {
        let mut f = vec![format!("pipeline_cache={}", self.state.name())];
        if built > 0 {
            f.push(format!("pipelines={built}"));
            f.push(format!("pipelines_ms={}", time.as_millis()));
        }
        f
    }

    /// Writes the file (see [`DiskCache::save`]) and with option `log` says what this backend
    /// built.
    pub fn finish(&mut self, built: u64, time: Duration) {
        self.save(built);
        if self.mode == Mode::Log {
            let file = match (&self.path, self.written) {
                (Some(p), n) if n > 0 => format!("; wrote {n} bytes to {}", p.display()),
                _ => String::new(),
            };
            eprintln!(
                "wgpu: pipeline cache {}: {built} pipelines built in {} ms{file}",
                self.state.name(),
                time.as_millis()
            );
        }
    }
}

/// A pipeline cache on `device` seeded with `data`, or wgpu's error (caught in an error scope,
/// so it never reaches the device's error sink).
fn create(device: &wgpu::Device, data: Option<&[u8]>) -> Result<wgpu::PipelineCache, String> {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    // SAFETY: `data` is what `PipelineCache::get_data` returned on an adapter of the same
    // vendor, device, driver version and pipelineCacheUUID (the file's name), behind a frame
    // whose length and checksum matched; wgpu checks its own header in it again, and with
    // `fallback` starts empty where that does not match.
    let cache = unsafe {
        device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
            label: Some("tandem"),
            data,
            fallback: true,
        })
    };
    match pollster::block_on(scope.pop()) {
        None => Ok(cache),
        Some(e) => Err(e.to_string()),
    }
}
