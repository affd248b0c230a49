//! The backend side of the plugin ABI: generic `extern "C"` glue that `export_backend!`
//! instantiates for one backend type. Every function catches panics; after a panic the
//! instance refuses further calls (its state may be broken) but can still be destroyed.

use std::panic::{catch_unwind, AssertUnwindSafe};

use serde::de::DeserializeOwned;

use super::abi::*;
use crate::backend::{BackendOptions, BackendPlugin, CostQuery, ProgramId, Ticket};
use crate::boundary::{SharedTimeline, TimelineId, MAX_WAITS};
use crate::error::BackendError;
use crate::graph::{Graph, Op, StepArgs};
use crate::tensor::{BufferId, TensorDesc};

/// One backend instance behind a [`Handle`].
struct Instance<T> {
    backend: T,
    /// The call that panicked, once one has.
    poisoned: Option<&'static str>,
}

/// Builds the descriptor for `T`; `export_backend!` stores it in a static.
pub const fn descriptor<T: BackendPlugin>() -> PluginDescriptor {
    PluginDescriptor {
        magic: PLUGIN_MAGIC,
        abi_version: ABI_VERSION,
        api_version: API_VERSION,
        name: FfiStr::from_static(T::NAME),
        vtable: PluginVTable {
            create: create::<T>,
            destroy: destroy::<T>,
            info: info::<T>,
            supports: supports::<T>,
            alloc: alloc::<T>,
            write: write::<T>,
            read: read::<T>,
            free: free::<T>,
            compile: compile::<T>,
            execute: execute::<T>,
            wait: wait::<T>,
            release: release::<T>,
            profile: profile::<T>,
            memory: memory::<T>,
            copy_bandwidth: copy_bandwidth::<T>,
            import_host: import_host::<T>,
            export_timeline: export_timeline::<T>,
            import_timeline: import_timeline::<T>,
            execute_after: execute_after::<T>,
            estimate_decode: estimate_decode::<T>,
            free_bytes,
        },
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

fn into_ffi(v: Vec<u8>) -> FfiBytes {
    let mut v = std::mem::ManuallyDrop::new(v);
    FfiBytes {
        ptr: v.as_mut_ptr(),
        len: v.len(),
        cap: v.capacity(),
    }
}

unsafe extern "C" fn free_bytes(bytes: FfiBytes) {
    if !bytes.ptr.is_null() {
        // SAFETY: `bytes` came from `into_ffi`, i.e. from a `Vec<u8>` of this allocator with
        // exactly this pointer, length and capacity, and the host returns each one once.
        drop(unsafe { Vec::from_raw_parts(bytes.ptr, bytes.len, bytes.cap) });
    }
}

/// Borrows `len` bytes at `ptr` (which may be null or dangling when `len` is 0).
///
/// # Safety
/// When `len > 0`, `ptr` must be valid for reads of `len` bytes for the returned lifetime.
unsafe fn bytes_in<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if len == 0 || ptr.is_null() {
        &[]
    } else {
        // SAFETY: guaranteed by the caller (the host passes a live slice).
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

/// # Safety
/// As [`bytes_in`], for `u32` elements.
unsafe fn u32s_in<'a>(ptr: *const u32, len: usize) -> &'a [u32] {
    if len == 0 || ptr.is_null() {
        &[]
    } else {
        // SAFETY: guaranteed by the caller (the host passes a live slice).
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

fn json_in<V: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<V, BackendError> {
    serde_json::from_slice(bytes)
        .map_err(|e| BackendError::invalid(format!("malformed {what} passed to the plugin: {e}")))
}

fn json_out<V: serde::Serialize>(v: &V) -> Result<Vec<u8>, BackendError> {
    serde_json::to_vec(v).map_err(|e| BackendError::internal(format!("cannot encode a reply: {e}")))
}

/// Stores `e` in `err` (when non-null) and returns [`STATUS_ERR`].
///
/// # Safety
/// `err` is null or valid for a write.
unsafe fn fail(err: *mut FfiBytes, e: &BackendError) -> i32 {
    if !err.is_null() {
        let bytes = serde_json::to_vec(e)
            .unwrap_or_else(|_| b"{\"kind\":\"internal\",\"message\":\"unencodable error\"}".to_vec());
        // SAFETY: the caller guarantees `err` is valid for a write.
        unsafe { err.write(into_ffi(bytes)) };
    }
    STATUS_ERR
}

/// Runs `f` on the instance behind `handle`, catching panics and poisoning the instance when
/// one happens, then reports the result through `err`; `done` stores a success value.
///
/// # Safety
/// `handle` is null or a live handle from `create::<T>`, not used concurrently; `err` is null
/// or valid for a write.
unsafe fn call<T: BackendPlugin, R>(
    handle: Handle,
    name: &'static str,
    err: *mut FfiBytes,
    f: impl FnOnce(&mut T) -> Result<R, BackendError>,
    done: impl FnOnce(R),
) -> i32 {
    if handle.is_null() {
        // SAFETY: forwarded from the caller.
        return unsafe {
            fail(
                err,
                &BackendError::invalid(format!("{name}: null backend handle")),
            )
        };
    }
    // SAFETY: a non-null handle is a `Box<Instance<T>>` from `create::<T>` that the host has
    // not destroyed and does not share between threads during a call.
    let inst = unsafe { &mut *(handle as *mut Instance<T>) };
    let result = match inst.poisoned {
        Some(earlier) => Err(BackendError::internal(format!(
            "{name}: the backend is unusable after a panic in {earlier}"
        ))),
        None => match catch_unwind(AssertUnwindSafe(|| f(&mut inst.backend))) {
            Ok(r) => r,
            Err(payload) => {
                inst.poisoned = Some(name);
                Err(BackendError::Panicked {
                    call: name.to_string(),
                    message: panic_message(payload),
                })
            }
        },
    };
    match result {
        Ok(r) => match catch_unwind(AssertUnwindSafe(|| done(r))) {
            Ok(()) => STATUS_OK,
            // SAFETY: forwarded from the caller.
            Err(_) => unsafe {
                fail(
                    err,
                    &BackendError::internal(format!("{name}: panic while returning")),
                )
            },
        },
        // SAFETY: forwarded from the caller.
        Err(e) => unsafe { fail(err, &e) },
    }
}

unsafe extern "C" fn create<T: BackendPlugin>(
    options_json: *const u8,
    options_len: usize,
    out: *mut Handle,
    err: *mut FfiBytes,
) -> i32 {
    // SAFETY: the host passes a live slice of `options_len` bytes.
    let bytes = unsafe { bytes_in(options_json, options_len) };
    let result = catch_unwind(AssertUnwindSafe(|| {
        let options: BackendOptions = json_in(bytes, "backend options")?;
        T::create(&options)
    }))
    .unwrap_or_else(|p| {
        Err(BackendError::Panicked {
            call: "create".into(),
            message: panic_message(p),
        })
    });
    match result {
        Ok(backend) if !out.is_null() => {
            let handle = Box::into_raw(Box::new(Instance {
                backend,
                poisoned: None,
            })) as Handle;
            // SAFETY: `out` is non-null and the host passes it valid for a write.
            unsafe { out.write(handle) };
            STATUS_OK
        }
        // SAFETY: `err` is null or valid for a write, as the host promises.
        Ok(_) => unsafe { fail(err, &BackendError::invalid("create: null out-pointer")) },
        // SAFETY: as above.
        Err(e) => unsafe { fail(err, &e) },
    }
}

unsafe extern "C" fn destroy<T: BackendPlugin>(handle: Handle) {
    if handle.is_null() {
        return;
    }
    // SAFETY: a non-null handle is a `Box<Instance<T>>` from `create::<T>`, destroyed once.
    let boxed = unsafe { Box::from_raw(handle as *mut Instance<T>) };
    // A panicking destructor must not unwind into the host; the instance is gone either way.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(boxed)));
}

unsafe extern "C" fn info<T: BackendPlugin>(handle: Handle, out: *mut FfiBytes, err: *mut FfiBytes) -> i32 {
    // SAFETY: handle/err validity is the host's promise; `out` is valid for a write.
    unsafe {
        call::<T, _>(
            handle,
            "info",
            err,
            |b| json_out(&b.info()),
            |v| out.write(into_ffi(v)),
        )
    }
}

unsafe extern "C" fn supports<T: BackendPlugin>(
    handle: Handle,
    op_json: *const u8,
    op_len: usize,
    out: *mut FfiBytes,
    err: *mut FfiBytes,
) -> i32 {
    // SAFETY: the host passes a live slice of `op_len` bytes.
    let bytes = unsafe { bytes_in(op_json, op_len) };
    // SAFETY: handle/err/out validity is the host's promise.
    unsafe {
        call::<T, _>(
            handle,
            "supports",
            err,
            |b| {
                let op: Op = json_in(bytes, "op")?;
                json_out(&b.supports(&op))
            },
            |v| out.write(into_ffi(v)),
        )
    }
}

unsafe extern "C" fn alloc<T: BackendPlugin>(
    handle: Handle,
    desc_json: *const u8,
    desc_len: usize,
    usage: u32,
    out_id: *mut u64,
    err: *mut FfiBytes,
) -> i32 {
    // SAFETY: the host passes a live slice of `desc_len` bytes.
    let bytes = unsafe { bytes_in(desc_json, desc_len) };
    // SAFETY: handle/err/out_id validity is the host's promise.
    unsafe {
        call::<T, _>(
            handle,
            "alloc",
            err,
            |b| {
                let desc: TensorDesc = json_in(bytes, "tensor description")?;
                let usage = usage_from_u32(usage)
                    .ok_or_else(|| BackendError::invalid(format!("unknown usage code {usage}")))?;
                b.alloc(&desc, usage)
            },
            |id| out_id.write(id.0),
        )
    }
}

unsafe extern "C" fn write<T: BackendPlugin>(
    handle: Handle,
    buffer: u64,
    offset: u64,
    data: *const u8,
    len: usize,
    err: *mut FfiBytes,
) -> i32 {
    // SAFETY: the host passes a live slice of `len` bytes.
    let data = unsafe { bytes_in(data, len) };
    // SAFETY: handle/err validity is the host's promise.
    unsafe {
        call::<T, _>(
            handle,
            "write",
            err,
            |b| b.write(BufferId(buffer), offset, data),
            |()| (),
        )
    }
}

unsafe extern "C" fn read<T: BackendPlugin>(
    handle: Handle,
    buffer: u64,
    offset: u64,
    out: *mut u8,
    len: usize,
    err: *mut FfiBytes,
) -> i32 {
    let out: &mut [u8] = if len == 0 || out.is_null() {
        &mut []
    } else {
        // SAFETY: the host passes a live, exclusive slice of `len` bytes.
        unsafe { std::slice::from_raw_parts_mut(out, len) }
    };
    // SAFETY: handle/err validity is the host's promise.
    unsafe {
        call::<T, _>(
            handle,
            "read",
            err,
            |b| b.read(BufferId(buffer), offset, out),
            |()| (),
        )
    }
}

unsafe extern "C" fn free<T: BackendPlugin>(handle: Handle, buffer: u64, err: *mut FfiBytes) -> i32 {
    // SAFETY: handle/err validity is the host's promise.
    unsafe { call::<T, _>(handle, "free", err, |b| b.free(BufferId(buffer)), |()| ()) }
}

unsafe extern "C" fn compile<T: BackendPlugin>(
    handle: Handle,
    graph_json: *const u8,
    graph_len: usize,
    out_id: *mut u64,
    err: *mut FfiBytes,
) -> i32 {
    // SAFETY: the host passes a live slice of `graph_len` bytes.
    let bytes = unsafe { bytes_in(graph_json, graph_len) };
    // SAFETY: handle/err/out_id validity is the host's promise.
    unsafe {
        call::<T, _>(
            handle,
            "compile",
            err,
            |b| {
                let graph: Graph = json_in(bytes, "graph")?;
                b.compile(&graph)
            },
            |id| out_id.write(id.0),
        )
    }
}

/// The step arguments behind `args`.
///
/// # Safety
/// `args` is non-null and points to a live `FfiStepArgs` whose arrays the host keeps alive for
/// the returned lifetime.
unsafe fn step_in<'a>(args: *const FfiStepArgs) -> StepArgs<'a> {
    // SAFETY: guaranteed by the caller.
    unsafe {
        let a = &*args;
        StepArgs {
            tokens: u32s_in(a.tokens, a.n_tokens),
            positions: u32s_in(a.positions, a.n_positions),
            slots: u32s_in(a.slots, a.n_slots),
            select: u32s_in(a.select, a.n_select),
        }
    }
}

unsafe extern "C" fn execute<T: BackendPlugin>(
    handle: Handle,
    program: u64,
    args: *const FfiStepArgs,
    out_ticket: *mut u64,
    err: *mut FfiBytes,
) -> i32 {
    if args.is_null() {
        // SAFETY: `err` is null or valid for a write.
        return unsafe { fail(err, &BackendError::invalid("execute: null step arguments")) };
    }
    // SAFETY: non-null `args`, kept alive by the host for the call.
    let step = unsafe { step_in(args) };
    // SAFETY: handle/err/out_ticket validity is the host's promise.
    unsafe {
        call::<T, _>(
            handle,
            "execute",
            err,
            |b| b.execute(ProgramId(program), &step),
            |t| out_ticket.write(t.0),
        )
    }
}

unsafe extern "C" fn wait<T: BackendPlugin>(handle: Handle, ticket: u64, err: *mut FfiBytes) -> i32 {
    // SAFETY: handle/err validity is the host's promise.
    unsafe { call::<T, _>(handle, "wait", err, |b| b.wait(Ticket(ticket)), |()| ()) }
}

unsafe extern "C" fn release<T: BackendPlugin>(handle: Handle, program: u64, err: *mut FfiBytes) -> i32 {
    // SAFETY: handle/err validity is the host's promise.
    unsafe { call::<T, _>(handle, "release", err, |b| b.release(ProgramId(program)), |()| ()) }
}

unsafe extern "C" fn profile<T: BackendPlugin>(
    handle: Handle,
    program: u64,
    out: *mut FfiBytes,
    err: *mut FfiBytes,
) -> i32 {
    // SAFETY: handle/err validity is the host's promise; `out` is valid for a write.
    unsafe {
        call::<T, _>(
            handle,
            "profile",
            err,
            |b| json_out(&b.profile(ProgramId(program))?),
            |v| out.write(into_ffi(v)),
        )
    }
}

unsafe extern "C" fn memory<T: BackendPlugin>(handle: Handle, out: *mut FfiBytes, err: *mut FfiBytes) -> i32 {
    // SAFETY: handle/err validity is the host's promise; `out` is valid for a write.
    unsafe {
        call::<T, _>(
            handle,
            "memory",
            err,
            |b| json_out(&b.memory()?),
            |v| out.write(into_ffi(v)),
        )
    }
}

unsafe extern "C" fn copy_bandwidth<T: BackendPlugin>(
    handle: Handle,
    out: *mut FfiBytes,
    err: *mut FfiBytes,
) -> i32 {
    // SAFETY: handle/err validity is the host's promise; `out` is valid for a write.
    unsafe {
        call::<T, _>(
            handle,
            "copy_bandwidth",
            err,
            |b| json_out(&b.copy_bandwidth()?),
            |v| out.write(into_ffi(v)),
        )
    }
}

unsafe extern "C" fn import_host<T: BackendPlugin>(
    handle: Handle,
    ptr: *mut u8,
    len: usize,
    desc_json: *const u8,
    desc_len: usize,
    out_id: *mut u64,
    err: *mut FfiBytes,
) -> i32 {
    // SAFETY: the host passes a live slice of `desc_len` bytes.
    let bytes = unsafe { bytes_in(desc_json, desc_len) };
    // SAFETY: handle/err/out_id validity is the host's promise; the region's is the promise of
    // `ComputeBackend::import_host`, which the host made to call this.
    unsafe {
        call::<T, _>(
            handle,
            "import_host",
            err,
            |b| {
                let desc: TensorDesc = json_in(bytes, "tensor description")?;
                b.import_host(ptr, len, &desc)
            },
            |id| out_id.write(id.0),
        )
    }
}

unsafe extern "C" fn export_timeline<T: BackendPlugin>(
    handle: Handle,
    out: *mut FfiBytes,
    err: *mut FfiBytes,
) -> i32 {
    // SAFETY: handle/err validity is the host's promise; `out` is valid for a write.
    unsafe {
        call::<T, _>(
            handle,
            "export_timeline",
            err,
            |b| json_out(&b.export_timeline()?),
            |v| out.write(into_ffi(v)),
        )
    }
}

unsafe extern "C" fn import_timeline<T: BackendPlugin>(
    handle: Handle,
    timeline_json: *const u8,
    timeline_len: usize,
    out: *mut FfiBytes,
    err: *mut FfiBytes,
) -> i32 {
    // SAFETY: the host passes a live slice of `timeline_len` bytes.
    let bytes = unsafe { bytes_in(timeline_json, timeline_len) };
    // SAFETY: handle/err/out validity is the host's promise.
    unsafe {
        call::<T, _>(
            handle,
            "import_timeline",
            err,
            |b| {
                let t: SharedTimeline = json_in(bytes, "shared timeline")?;
                json_out(&b.import_timeline(&t)?)
            },
            |v| out.write(into_ffi(v)),
        )
    }
}

unsafe extern "C" fn execute_after<T: BackendPlugin>(
    handle: Handle,
    program: u64,
    args: *const FfiStepArgs,
    waits: *const FfiWait,
    n_waits: usize,
    out_ticket: *mut u64,
    err: *mut FfiBytes,
) -> i32 {
    if args.is_null() || (waits.is_null() && n_waits > 0) {
        // SAFETY: `err` is null or valid for a write.
        return unsafe { fail(err, &BackendError::invalid("execute_after: null arguments")) };
    }
    // SAFETY: non-null `args`, kept alive by the host for the call.
    let step = unsafe { step_in(args) };
    let waits: &[FfiWait] = if n_waits == 0 {
        &[]
    } else {
        // SAFETY: the host passes a live array of `n_waits` waits.
        unsafe { std::slice::from_raw_parts(waits, n_waits) }
    };
    // At most a handful of waits (one per other unit): a small fixed array, no allocation.
    let mut pairs = [(TimelineId(0), Ticket(0)); MAX_WAITS];
    if waits.len() > pairs.len() {
        // SAFETY: `err` is null or valid for a write.
        return unsafe {
            fail(
                err,
                &BackendError::invalid(format!("execute_after: more than {MAX_WAITS} waits")),
            )
        };
    }
    for (p, w) in pairs.iter_mut().zip(waits) {
        *p = (TimelineId(w.timeline), Ticket(w.ticket));
    }
    let pairs = &pairs[..waits.len()];
    // SAFETY: handle/err/out_ticket validity is the host's promise.
    unsafe {
        call::<T, _>(
            handle,
            "execute_after",
            err,
            |b| b.execute_after(ProgramId(program), &step, pairs),
            |t| out_ticket.write(t.0),
        )
    }
}

unsafe extern "C" fn estimate_decode<T: BackendPlugin>(
    handle: Handle,
    query_json: *const u8,
    query_len: usize,
    out: *mut FfiBytes,
    err: *mut FfiBytes,
) -> i32 {
    // SAFETY: the host passes a live slice of `query_len` bytes.
    let bytes = unsafe { bytes_in(query_json, query_len) };
    // SAFETY: handle/err/out validity is the host's promise.
    unsafe {
        call::<T, _>(
            handle,
            "estimate_decode",
            err,
            |b| {
                let q: CostQuery = json_in(bytes, "cost query")?;
                json_out(&b.estimate_decode(&q))
            },
            |v| out.write(into_ffi(v)),
        )
    }
}

/// Exports a [`crate::BackendPlugin`] from a `cdylib`: writes the entry point
/// `tandem_backend_plugin` returning a static descriptor for the type.
///
/// ```ignore
/// tandem_backend_api::export_backend!(CpuBackend);
/// ```
#[macro_export]
macro_rules! export_backend {
    ($backend:ty) => {
        /// The tandem plugin entry point.
        #[no_mangle]
        pub extern "C" fn tandem_backend_plugin() -> *const $crate::plugin::abi::PluginDescriptor {
            static DESCRIPTOR: $crate::plugin::abi::PluginDescriptor =
                $crate::plugin::export::descriptor::<$backend>();
            &DESCRIPTOR
        }
    };
}

/// Exports a plugin for a backend that cannot run in this build: `create` always answers
/// `Unavailable` with `reason`, so `engine backends` lists it and says why.
///
/// ```ignore
/// tandem_backend_api::export_unavailable_backend!(VulkanBackend, "vulkan", "not built yet");
/// ```
#[macro_export]
macro_rules! export_unavailable_backend {
    ($ty:ident, $name:literal, $reason:expr) => {
        /// A backend that reports itself unavailable.
        pub struct $ty(());

        impl $crate::ComputeBackend for $ty {
            fn info(&self) -> $crate::BackendInfo {
                $crate::BackendInfo {
                    name: $name.to_string(),
                    device: "none".to_string(),
                    kind: $crate::DeviceKind::Cpu,
                    memory_bytes: None,
                    features: vec![],
                    physical_device: None,
                    decode_rows: None,
                }
            }
            fn supports(&self, _op: &$crate::Op) -> $crate::Support {
                $crate::Support::No {
                    reason: $reason.to_string(),
                }
            }
            fn alloc(
                &mut self,
                _: &$crate::TensorDesc,
                _: $crate::Usage,
            ) -> Result<$crate::BufferId, $crate::BackendError> {
                Err(Self::unavailable())
            }
            fn write(&mut self, _: $crate::BufferId, _: u64, _: &[u8]) -> Result<(), $crate::BackendError> {
                Err(Self::unavailable())
            }
            fn read(
                &mut self,
                _: $crate::BufferId,
                _: u64,
                _: &mut [u8],
            ) -> Result<(), $crate::BackendError> {
                Err(Self::unavailable())
            }
            fn free(&mut self, _: $crate::BufferId) -> Result<(), $crate::BackendError> {
                Err(Self::unavailable())
            }
            fn compile(&mut self, _: &$crate::Graph) -> Result<$crate::ProgramId, $crate::BackendError> {
                Err(Self::unavailable())
            }
            fn execute(
                &mut self,
                _: $crate::ProgramId,
                _: &$crate::StepArgs<'_>,
            ) -> Result<$crate::Ticket, $crate::BackendError> {
                Err(Self::unavailable())
            }
            fn wait(&mut self, _: $crate::Ticket) -> Result<(), $crate::BackendError> {
                Err(Self::unavailable())
            }
            fn release(&mut self, _: $crate::ProgramId) -> Result<(), $crate::BackendError> {
                Err(Self::unavailable())
            }
        }

        impl $ty {
            fn unavailable() -> $crate::BackendError {
                $crate::BackendError::Unavailable {
                    reason: $reason.to_string(),
                }
            }
        }

        impl $crate::BackendPlugin for $ty {
            const NAME: &'static str = $name;
            fn create(_: &$crate::BackendOptions) -> Result<Self, $crate::BackendError> {
                Err(Self::unavailable())
            }
        }

        $crate::export_backend!($ty);
    };
}
