//! Where the NPU backend's attention dispatches go: the device (through `xrt-sys`, see
//! [`crate::device`]) or the emulator (here). Both hold the KV caches in bf16, the kernels' type,
//! and take one dispatch per attention op per step with the ABI's arguments.
//!
//! Timelines (device-side boundaries, see `tandem_backend_api::boundary`) are optional: an
//! executor may export the timeline its backend's tickets count on, import other backends'
//! timelines, and make its next dispatch wait on them. The emulator does none of it (host
//! memory only); the device executor does it with DRM syncobjs, tested against a fake device
//! only.

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use tandem_backend_api::{BackendError, Ticket, TimelineId};

use crate::contract::{AttnParams, KernelShape};
use crate::cost::{self, NpuModel};
use crate::emu;

/// A KV cache buffer held by an executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvId(pub u64);

/// What a dispatch cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DispatchTime {
    /// Seconds: measured on a device, modelled by [`crate::cost`] on the emulator.
    pub seconds: f64,
}

/// One attention dispatch of a step, with the graph node it runs: what a chained submission
/// carries per command.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    /// The graph node (for errors).
    pub node: usize,
    /// The kernel shape.
    pub shape: KernelShape,
    /// The dispatch's parameters.
    pub params: AttnParams,
    /// bf16 `[rows, heads, head_dim]`.
    pub q: Vec<u16>,
    /// The K cache.
    pub k: KvId,
    /// The V cache.
    pub v: KvId,
    /// bf16 `[rows, heads, head_dim]`, written by the dispatch.
    pub out: Vec<u16>,
}

/// An executor of the attention kernel.
pub trait Executor: Send {
    /// The device as users would name it.
    fn device(&self) -> String;
    /// Facts for `engine backends`.
    fn features(&self) -> Vec<String>;
    /// Whether a kernel of `shape` can run here (artefacts built for it, on a device).
    fn supports(&self, shape: KernelShape) -> Result<(), String>;
    /// A zeroed bf16 cache buffer of `elems` elements.
    fn alloc_kv(&mut self, elems: usize) -> Result<KvId, BackendError>;
    /// Releases a cache buffer.
    fn free_kv(&mut self, kv: KvId) -> Result<(), BackendError>;
    /// Writes bf16 elements at element offset `at`.
    fn write_kv(&mut self, kv: KvId, at: usize, data: &[u16]) -> Result<(), BackendError>;
    /// Reads bf16 elements at element offset `at`.
    fn read_kv(&mut self, kv: KvId, at: usize, out: &mut [u16]) -> Result<(), BackendError>;
    /// One dispatch: `q` and `out` bf16 `[rows, heads, head_dim]`, the step's keys and values
    /// already in `k` and `v`.
    fn attention(
        &mut self,
        shape: KernelShape,
        params: &AttnParams,
        q: &[u16],
        k: KvId,
        v: KvId,
        out: &mut [u16],
    ) -> Result<DispatchTime, BackendError>;
    /// Bytes held in cache buffers and staging now.
    fn bytes_in_use(&self) -> u64;

    /// A step's dispatches, in order, as one submission where the executor can chain them
    /// (the device: one `ERT_CMD_CHAIN` per hardware context); each `out` filled. An error
    /// names the node whose dispatch failed. By default, one [`Executor::attention`] each.
    fn attention_chain(&mut self, chain: &mut [Dispatch]) -> Result<Vec<DispatchTime>, BackendError> {
        let mut times = Vec::with_capacity(chain.len());
        for d in chain.iter_mut() {
            let t = self
                .attention(d.shape, &d.params, &d.q, d.k, d.v, &mut d.out)
                .map_err(|e| on_node(d.node, e))?;
            times.push(t);
        }
        Ok(times)
    }

    /// Loads at compile time what a program's dispatches of `shape` over caches of `capacity`
    /// positions need (the device: each phase's xclbin context and instruction stream), so a
    /// step builds nothing. Nothing by default.
    fn prepare(&mut self, shape: KernelShape, capacity: usize) -> Result<(), BackendError> {
        let _ = (shape, capacity);
        Ok(())
    }

    /// Whether [`Executor::export_timeline`] and [`Executor::import_timeline`] can work here.
    fn shares_timelines(&self) -> bool {
        false
    }

    /// Where an exported timeline comes from, for `SharedTimeline::device`.
    fn timeline_device(&self) -> String {
        self.device()
    }

    /// A new file descriptor (the caller's) for the timeline that [`Executor::signal`]
    /// advances, made on the first call; `None` where the executor has none to share.
    fn export_timeline(&mut self) -> Result<Option<OwnedFd>, BackendError> {
        Ok(None)
    }

    /// Imports another backend's timeline from `fd` (which stays the caller's); `None` where
    /// the executor cannot wait on one.
    fn import_timeline(&mut self, fd: BorrowedFd<'_>) -> Result<Option<TimelineId>, BackendError> {
        let _ = fd;
        Ok(None)
    }

    /// Ends a program's execution: signals the exported timeline (if one was exported) at
    /// `ticket`, and drops the waits of [`Executor::wait_for`] that no dispatch took.
    fn signal(&mut self, ticket: Ticket) -> Result<(), BackendError> {
        let _ = ticket;
        Ok(())
    }

    /// Makes the next program wait until every imported timeline of `waits` has reached its
    /// ticket. Refuses any wait by default: nothing was imported.
    fn wait_for(&mut self, waits: &[(TimelineId, Ticket)]) -> Result<(), BackendError> {
        match waits.first() {
            None => Ok(()),
            Some((id, _)) => Err(BackendError::invalid(format!(
                "timeline {} was not imported by this backend (it imports none)",
                id.0
            ))),
        }
    }
}

/// `e` with the graph node it happened at.
pub fn on_node(node: usize, e: BackendError) -> BackendError {
    match e {
        BackendError::DeviceLost { device } => BackendError::DeviceLost {
            device: format!("{device} (attention node {node})"),
        },
        BackendError::Internal { message } => {
            BackendError::internal(format!("attention node {node}: {message}"))
        }
        other => other,
    }
}

/// The emulator as an executor: host memory, [`emu::attention`], timings from the cost model.
pub struct EmuExecutor {
    model: &'static NpuModel,
    caches: HashMap<u64, Vec<u16>>,
    next: u64,
}

impl EmuExecutor {
    /// An emulator whose timings model `model`.
    pub fn new(model: &'static NpuModel) -> Self {
        EmuExecutor {
            model,
            caches: HashMap::new(),
            next: 1,
        }
    }

    fn cache(&self, kv: KvId) -> Result<&Vec<u16>, BackendError> {
        self.caches
            .get(&kv.0)
            .ok_or_else(|| BackendError::invalid(format!("unknown NPU cache buffer {}", kv.0)))
    }
}

/// The range `at..at + len` of a buffer of `size` elements (or bytes), or an error naming both.
pub fn span(at: usize, len: usize, size: usize) -> Result<std::ops::Range<usize>, BackendError> {
    match at.checked_add(len) {
        Some(end) if end <= size => Ok(at..end),
        _ => Err(BackendError::invalid(format!(
            "{len} elements at {at} run past the buffer's {size}"
        ))),
    }
}

impl Executor for EmuExecutor {
    fn device(&self) -> String {
        format!(
            "emulated {} NPU ({}): the kernels' arithmetic on the CPU, simulated timings",
            self.model.generation, self.model.parts
        )
    }

    fn features(&self) -> Vec<String> {
        vec![
            "emulated".into(),
            format!("simulated_timing={}", self.model.generation),
            "bf16".into(),
            format!("kernel_abi={}", crate::contract::ABI_VERSION),
        ]
    }

    fn supports(&self, _shape: KernelShape) -> Result<(), String> {
        Ok(())
    }

    fn alloc_kv(&mut self, elems: usize) -> Result<KvId, BackendError> {
        let id = self.next;
        self.next += 1;
        self.caches.insert(id, vec![0; elems]);
        Ok(KvId(id))
    }

    fn free_kv(&mut self, kv: KvId) -> Result<(), BackendError> {
        self.caches
            .remove(&kv.0)
            .map(|_| ())
            .ok_or_else(|| BackendError::invalid(format!("unknown NPU cache buffer {}", kv.0)))
    }

    fn write_kv(&mut self, kv: KvId, at: usize, data: &[u16]) -> Result<(), BackendError> {
        let c = self
            .caches
            .get_mut(&kv.0)
            .ok_or_else(|| BackendError::invalid(format!("unknown NPU cache buffer {}", kv.0)))?;
        let r = span(at, data.len(), c.len())?;
        c[r].copy_from_slice(data);
        Ok(())
    }

    fn read_kv(&mut self, kv: KvId, at: usize, out: &mut [u16]) -> Result<(), BackendError> {
        let c = self.cache(kv)?;
        let r = span(at, out.len(), c.len())?;
        out.copy_from_slice(&c[r]);
        Ok(())
    }

    fn attention(
        &mut self,
        _shape: KernelShape,
        params: &AttnParams,
        q: &[u16],
        k: KvId,
        v: KvId,
        out: &mut [u16],
    ) -> Result<DispatchTime, BackendError> {
        let (kc, vc) = (self.cache(k)?, self.cache(v)?);
        emu::attention(params, q, kc, vc, out).map_err(|e| BackendError::invalid(e.to_string()))?;
        Ok(DispatchTime {
            seconds: cost::dispatch(self.model, params).seconds,
        })
    }

    fn bytes_in_use(&self) -> u64 {
        self.caches.values().map(|c| 2 * c.len() as u64).sum()
    }
}

/// The default limit on one device run.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
