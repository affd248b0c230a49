//! The host side of the plugin ABI: opening a library, checking its descriptor, and driving its
//! function table as a `Box<dyn ComputeBackend>`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::abi::*;
use crate::backend::{
    BackendInfo, BackendOptions, ComputeBackend, CostAnswer, CostQuery, MemoryUse, NodeTime, ProgramId,
    Support, Ticket,
};
use crate::boundary::{SharedTimeline, TimelineId, MAX_WAITS};
use crate::error::BackendError;
use crate::graph::{Graph, Op, StepArgs};
use crate::tensor::{BufferId, TensorDesc, Usage};

/// Why a library could not be used as a plugin. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The dynamic loader refused the file.
    #[error("{path}: cannot load the library: {reason}")]
    Load {
        /// The library.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The library has no entry point: it is not a tandem plugin.
    #[error("{path}: not a tandem backend plugin (no symbol `{symbol}`)")]
    NotAPlugin {
        /// The library.
        path: PathBuf,
        /// The missing symbol.
        symbol: &'static str,
    },
    /// The entry point returned null.
    #[error("{path}: the plugin entry point returned no descriptor")]
    NullDescriptor {
        /// The library.
        path: PathBuf,
    },
    /// The descriptor does not start with the magic bytes.
    #[error("{path}: bad plugin magic {found:?}, expected {expected:?}")]
    BadMagic {
        /// The library.
        path: PathBuf,
        /// What the plugin has.
        found: String,
        /// What the host expects.
        expected: String,
    },
    /// The descriptor layout differs.
    #[error("{path}: plugin ABI version {plugin}, this engine speaks ABI version {host}")]
    AbiMismatch {
        /// The library.
        path: PathBuf,
        /// The plugin's ABI version.
        plugin: u32,
        /// The host's ABI version.
        host: u32,
    },
    /// The plugin was built against an incompatible backend-api.
    #[error("{path}: plugin built against tandem-backend-api {plugin}, this engine uses {host} (major and minor must match)")]
    ApiMismatch {
        /// The library.
        path: PathBuf,
        /// The plugin's version.
        plugin: ApiVersion,
        /// The host's version.
        host: ApiVersion,
    },
    /// The name is not valid UTF-8 or is empty.
    #[error("{path}: the plugin's name is not a valid non-empty UTF-8 string")]
    BadName {
        /// The library.
        path: PathBuf,
    },
    /// A plugin directory cannot be read.
    #[error("plugin directory {path}: {reason}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

struct Loaded {
    // Dropped last (see field order in `PluginBackend`): the library must outlive every handle.
    _library: libloading::Library,
    path: PathBuf,
    name: String,
    api_version: ApiVersion,
    vtable: PluginVTable,
}

/// An opened, checked plugin library.
#[derive(Clone)]
pub struct PluginLibrary {
    inner: Arc<Loaded>,
}

impl std::fmt::Debug for PluginLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginLibrary")
            .field("name", &self.inner.name)
            .field("path", &self.inner.path)
            .field("api_version", &self.inner.api_version)
            .finish()
    }
}

impl PluginLibrary {
    /// Opens `path` and checks magic, ABI version and backend-api version, in that order,
    /// before calling anything else in it.
    pub fn open(path: &Path) -> Result<Self, PluginError> {
        let path_buf = path.to_path_buf();
        // SAFETY: loading a library runs its initialisers. tandem only opens files the user
        // placed in plugin directories (never the current directory implicitly); a library
        // there is trusted code, as any executable on the search path is.
        let library = unsafe { libloading::Library::new(path) }.map_err(|e| PluginError::Load {
            path: path_buf.clone(),
            reason: e.to_string(),
        })?;
        // SAFETY: the symbol, if present, is declared by `export_backend!` with exactly the
        // `EntryFn` signature; a library that exports the name with another type is not a
        // tandem plugin and breaks the contract the file name and symbol imply.
        let entry: EntryFn = unsafe {
            match library.get::<EntryFn>(ENTRY_SYMBOL.as_bytes()) {
                Ok(sym) => *sym,
                Err(_) => {
                    return Err(PluginError::NotAPlugin {
                        path: path_buf,
                        symbol: ENTRY_SYMBOL,
                    })
                }
            }
        };
        // SAFETY: calling the entry point runs no user input; it returns a pointer to static data.
        let desc_ptr = unsafe { entry() };
        if desc_ptr.is_null() {
            return Err(PluginError::NullDescriptor { path: path_buf });
        }
        // SAFETY: the magic and the ABI version are the first fields of every ABI version's
        // descriptor, so they can be read before anything else is trusted.
        let (magic, abi) = unsafe {
            let magic = std::ptr::addr_of!((*desc_ptr).magic).read_unaligned();
            let abi = std::ptr::addr_of!((*desc_ptr).abi_version).read_unaligned();
            (magic, abi)
        };
        if magic != PLUGIN_MAGIC {
            return Err(PluginError::BadMagic {
                path: path_buf,
                found: String::from_utf8_lossy(&magic).into_owned(),
                expected: String::from_utf8_lossy(&PLUGIN_MAGIC).into_owned(),
            });
        }
        if abi != ABI_VERSION {
            return Err(PluginError::AbiMismatch {
                path: path_buf,
                plugin: abi,
                host: ABI_VERSION,
            });
        }
        // SAFETY: magic and ABI version match, so the pointer is to a `PluginDescriptor` of
        // this layout, in static memory of the library we keep open.
        let desc = unsafe { &*desc_ptr };
        if !desc.api_version.compatible_with(API_VERSION) {
            return Err(PluginError::ApiMismatch {
                path: path_buf,
                plugin: desc.api_version,
                host: API_VERSION,
            });
        }
        let name = if desc.name.ptr.is_null() || desc.name.len == 0 {
            None
        } else {
            // SAFETY: the descriptor's name points to `len` bytes of static data.
            let bytes = unsafe { std::slice::from_raw_parts(desc.name.ptr, desc.name.len) };
            std::str::from_utf8(bytes).ok().map(str::to_string)
        };
        let name = name.ok_or(PluginError::BadName {
            path: path_buf.clone(),
        })?;
        Ok(PluginLibrary {
            inner: Arc::new(Loaded {
                vtable: desc.vtable,
                api_version: desc.api_version,
                name,
                path: path_buf,
                _library: library,
            }),
        })
    }

    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The backend-api version the plugin was built against.
    pub fn api_version(&self) -> ApiVersion {
        self.inner.api_version
    }

    /// Creates a backend instance (it may fail with `Unavailable` and a reason).
    pub fn create(&self, options: &BackendOptions) -> Result<Box<dyn ComputeBackend>, BackendError> {
        let json = serde_json::to_vec(options).map_err(|e| BackendError::internal(e.to_string()))?;
        let mut handle: Handle = std::ptr::null_mut();
        let mut err = FfiBytes::EMPTY;
        // SAFETY: the pointers are to live locals; the table comes from a checked descriptor.
        let status = unsafe { (self.inner.vtable.create)(json.as_ptr(), json.len(), &mut handle, &mut err) };
        self.check(status, err, "create")?;
        if handle.is_null() {
            return Err(BackendError::internal(format!(
                "{}: create returned a null handle",
                self.inner.path.display()
            )));
        }
        Ok(Box::new(PluginBackend {
            handle,
            library: self.clone(),
        }))
    }

    /// Turns a status and error bytes into a result, giving the bytes back to the plugin.
    fn check(&self, status: i32, err: FfiBytes, call: &str) -> Result<(), BackendError> {
        let bytes = self.take(err);
        match status {
            STATUS_OK => Ok(()),
            STATUS_ERR => Err(serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                BackendError::internal(format!(
                    "{}: undecodable error from {call}: {e}",
                    self.inner.path.display()
                ))
            })),
            other => Err(BackendError::internal(format!(
                "{}: {call} returned unknown status {other}",
                self.inner.path.display()
            ))),
        }
    }

    /// Copies plugin-allocated bytes and frees them in the plugin.
    fn take(&self, bytes: FfiBytes) -> Vec<u8> {
        if bytes.ptr.is_null() {
            return Vec::new();
        }
        // SAFETY: non-null bytes were produced by the plugin for this call: `len` initialised bytes.
        let copy = unsafe { std::slice::from_raw_parts(bytes.ptr, bytes.len) }.to_vec();
        // SAFETY: each `FfiBytes` is handed back exactly once.
        unsafe { (self.inner.vtable.free_bytes)(bytes) };
        copy
    }
}

/// A backend instance living in a plugin, driven through its function table.
pub struct PluginBackend {
    handle: Handle,
    // Declared after `handle` and dropped after it by `Drop` below: keeps the library loaded.
    library: PluginLibrary,
}

// SAFETY: `BackendPlugin: ComputeBackend: Send`, so the instance behind the handle may move to
// another thread; the handle is only used through `&mut self`, never concurrently.
unsafe impl Send for PluginBackend {}

impl Drop for PluginBackend {
    fn drop(&mut self) {
        // SAFETY: the handle came from `create`, is destroyed once, and the library is still
        // loaded (this struct holds a reference to it).
        unsafe { (self.library.inner.vtable.destroy)(self.handle) };
    }
}

impl PluginBackend {
    fn json_call(
        &self,
        call: &str,
        f: impl FnOnce(&PluginVTable, Handle, *mut FfiBytes, *mut FfiBytes) -> i32,
    ) -> Result<Vec<u8>, BackendError> {
        let mut out = FfiBytes::EMPTY;
        let mut err = FfiBytes::EMPTY;
        let status = f(&self.library.inner.vtable, self.handle, &mut out, &mut err);
        let out = self.library.take(out);
        self.library.check(status, err, call)?;
        Ok(out)
    }

    fn unit_call(
        &self,
        call: &str,
        f: impl FnOnce(&PluginVTable, Handle, *mut FfiBytes) -> i32,
    ) -> Result<(), BackendError> {
        let mut err = FfiBytes::EMPTY;
        let status = f(&self.library.inner.vtable, self.handle, &mut err);
        self.library.check(status, err, call)
    }

    fn decode<V: serde::de::DeserializeOwned>(&self, bytes: &[u8], call: &str) -> Result<V, BackendError> {
        serde_json::from_slice(bytes).map_err(|e| {
            BackendError::internal(format!(
                "{}: undecodable reply from {call}: {e}",
                self.library.path().display()
            ))
        })
    }
}

fn encode<V: serde::Serialize>(v: &V) -> Result<Vec<u8>, BackendError> {
    serde_json::to_vec(v).map_err(|e| BackendError::internal(format!("cannot encode an argument: {e}")))
}

/// `args` as pointers and lengths (valid while `args` is).
fn ffi_args(args: &StepArgs<'_>) -> FfiStepArgs {
    FfiStepArgs {
        tokens: args.tokens.as_ptr(),
        n_tokens: args.tokens.len(),
        positions: args.positions.as_ptr(),
        n_positions: args.positions.len(),
        slots: args.slots.as_ptr(),
        n_slots: args.slots.len(),
        select: args.select.as_ptr(),
        n_select: args.select.len(),
    }
}

impl ComputeBackend for PluginBackend {
    fn info(&self) -> BackendInfo {
        // SAFETY: live handle; out/err point to locals.
        let reply = self.json_call("info", |t, h, out, err| unsafe { (t.info)(h, out, err) });
        match reply.and_then(|b| self.decode(&b, "info")) {
            Ok(info) => info,
            Err(e) => BackendInfo {
                name: self.library.name().to_string(),
                device: format!("unknown ({e})"),
                kind: crate::DeviceKind::Cpu,
                memory_bytes: None,
                features: vec![],
                physical_device: None,
                decode_rows: None,
            },
        }
    }

    fn supports(&self, op: &Op) -> Support {
        let reply = encode(op).and_then(|json| {
            // SAFETY: live handle; `json` outlives the call; out/err point to locals.
            self.json_call("supports", |t, h, out, err| unsafe {
                (t.supports)(h, json.as_ptr(), json.len(), out, err)
            })
        });
        match reply.and_then(|b| self.decode(&b, "supports")) {
            Ok(s) => s,
            Err(e) => Support::No {
                reason: e.to_string(),
            },
        }
    }

    fn estimate_decode(&self, query: &CostQuery) -> Option<CostAnswer> {
        let reply = encode(query).and_then(|json| {
            // SAFETY: live handle; `json` outlives the call; out/err point to locals.
            self.json_call("estimate_decode", |t, h, out, err| unsafe {
                (t.estimate_decode)(h, json.as_ptr(), json.len(), out, err)
            })
        });
        // A plugin that fails to answer has no estimate to give: the caller measures instead.
        reply
            .and_then(|b| self.decode::<Option<CostAnswer>>(&b, "estimate_decode"))
            .ok()
            .flatten()
    }

    fn alloc(&mut self, desc: &TensorDesc, usage: Usage) -> Result<BufferId, BackendError> {
        let json = encode(desc)?;
        let mut id = 0u64;
        // SAFETY: live handle; `json` and `id` outlive the call.
        self.unit_call("alloc", |t, h, err| unsafe {
            (t.alloc)(h, json.as_ptr(), json.len(), usage_to_u32(usage), &mut id, err)
        })?;
        Ok(BufferId(id))
    }

    fn write(&mut self, buffer: BufferId, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        // SAFETY: live handle; `data` outlives the call.
        self.unit_call("write", |t, h, err| unsafe {
            (t.write)(h, buffer.0, offset, data.as_ptr(), data.len(), err)
        })
    }

    fn read(&mut self, buffer: BufferId, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        let (ptr, len) = (out.as_mut_ptr(), out.len());
        // SAFETY: live handle; `out` is exclusively borrowed for the call.
        self.unit_call("read", |t, h, err| unsafe {
            (t.read)(h, buffer.0, offset, ptr, len, err)
        })
    }

    fn free(&mut self, buffer: BufferId) -> Result<(), BackendError> {
        // SAFETY: live handle.
        self.unit_call("free", |t, h, err| unsafe { (t.free)(h, buffer.0, err) })
    }

    fn compile(&mut self, graph: &Graph) -> Result<ProgramId, BackendError> {
        let json = encode(graph)?;
        let mut id = 0u64;
        // SAFETY: live handle; `json` and `id` outlive the call.
        self.unit_call("compile", |t, h, err| unsafe {
            (t.compile)(h, json.as_ptr(), json.len(), &mut id, err)
        })?;
        Ok(ProgramId(id))
    }

    fn execute(&mut self, program: ProgramId, args: &StepArgs<'_>) -> Result<Ticket, BackendError> {
        let ffi = ffi_args(args);
        let mut ticket = 0u64;
        // SAFETY: live handle; `ffi` and the slices it points to outlive the call.
        self.unit_call("execute", |t, h, err| unsafe {
            (t.execute)(h, program.0, &ffi, &mut ticket, err)
        })?;
        Ok(Ticket(ticket))
    }

    fn wait(&mut self, ticket: Ticket) -> Result<(), BackendError> {
        // SAFETY: live handle.
        self.unit_call("wait", |t, h, err| unsafe { (t.wait)(h, ticket.0, err) })
    }

    fn release(&mut self, program: ProgramId) -> Result<(), BackendError> {
        // SAFETY: live handle.
        self.unit_call("release", |t, h, err| unsafe { (t.release)(h, program.0, err) })
    }

    fn profile(&mut self, program: ProgramId) -> Result<Vec<NodeTime>, BackendError> {
        // SAFETY: live handle; out/err point to locals.
        let reply = self.json_call("profile", |t, h, out, err| unsafe {
            (t.profile)(h, program.0, out, err)
        })?;
        self.decode(&reply, "profile")
    }

    fn memory(&mut self) -> Result<Option<MemoryUse>, BackendError> {
        // SAFETY: live handle; out/err point to locals.
        let reply = self.json_call("memory", |t, h, out, err| unsafe { (t.memory)(h, out, err) })?;
        self.decode(&reply, "memory")
    }

    fn copy_bandwidth(&mut self) -> Result<Option<f64>, BackendError> {
        // SAFETY: live handle; out/err point to locals.
        let reply = self.json_call("copy_bandwidth", |t, h, out, err| unsafe {
            (t.copy_bandwidth)(h, out, err)
        })?;
        self.decode(&reply, "copy_bandwidth")
    }

    unsafe fn import_host(
        &mut self,
        ptr: *mut u8,
        len: usize,
        desc: &TensorDesc,
    ) -> Result<BufferId, BackendError> {
        let json = encode(desc)?;
        let mut id = 0u64;
        // SAFETY: live handle; `json` and `id` outlive the call; the region's validity is our
        // caller's promise, passed on unchanged.
        self.unit_call("import_host", |t, h, err| unsafe {
            (t.import_host)(h, ptr, len, json.as_ptr(), json.len(), &mut id, err)
        })?;
        Ok(BufferId(id))
    }

    fn export_timeline(&mut self) -> Result<Option<SharedTimeline>, BackendError> {
        // SAFETY: live handle; out/err point to locals.
        let reply = self.json_call("export_timeline", |t, h, out, err| unsafe {
            (t.export_timeline)(h, out, err)
        })?;
        self.decode(&reply, "export_timeline")
    }

    fn import_timeline(&mut self, timeline: &SharedTimeline) -> Result<Option<TimelineId>, BackendError> {
        let json = encode(timeline)?;
        // SAFETY: live handle; `json` outlives the call; out/err point to locals.
        let reply = self.json_call("import_timeline", |t, h, out, err| unsafe {
            (t.import_timeline)(h, json.as_ptr(), json.len(), out, err)
        })?;
        self.decode(&reply, "import_timeline")
    }

    fn execute_after(
        &mut self,
        program: ProgramId,
        args: &StepArgs<'_>,
        waits: &[(TimelineId, Ticket)],
    ) -> Result<Ticket, BackendError> {
        let ffi = ffi_args(args);
        let mut buf = [FfiWait {
            timeline: 0,
            ticket: 0,
        }; MAX_WAITS];
        if waits.len() > buf.len() {
            return Err(BackendError::invalid(format!(
                "execute_after: more than {MAX_WAITS} waits"
            )));
        }
        for (b, (t, k)) in buf.iter_mut().zip(waits) {
            *b = FfiWait {
                timeline: t.0,
                ticket: k.0,
            };
        }
        let mut ticket = 0u64;
        // SAFETY: live handle; `ffi`, the slices it points to and `buf` outlive the call.
        self.unit_call("execute_after", |t, h, err| unsafe {
            (t.execute_after)(h, program.0, &ffi, buf.as_ptr(), waits.len(), &mut ticket, err)
        })?;
        Ok(Ticket(ticket))
    }
}

/// The file name a backend's plugin has on this platform (`libtandem_backend_cpu.so`).
pub fn plugin_file_name(backend: &str) -> String {
    format!(
        "{}tandem_backend_{backend}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// Plugin files in `dir`: names of the form [`plugin_file_name`], sorted. A directory that does
/// not exist or cannot be read is an error naming it.
pub fn plugin_files(dir: &Path) -> Result<Vec<PathBuf>, PluginError> {
    let entries = std::fs::read_dir(dir).map_err(|e| PluginError::Directory {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    let prefix = format!("{}tandem_backend_", std::env::consts::DLL_PREFIX);
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(std::env::consts::DLL_SUFFIX))
        })
        .collect();
    files.sort();
    Ok(files)
}
