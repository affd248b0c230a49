//! The device executor: the attention kernel run on an NPU through `xrt-sys`'s [`NpuDevice`]
//! (the amdxdna driver's uAPI on a real machine; a fake in the tests). Per kernel shape and
//! phase it loads the artefact once (xclbin registered in a hardware context, instruction
//! stream in its buffer); per dispatch it writes the params and q buffers, runs
//! `(params, q, k cache, v cache, out)` and waits with a timeout. KV caches are device buffers
//! for their whole life; the host writes each step's keys and values into them.
//!
//! Timelines (device-side boundaries): the timeline the backend's tickets count on is a DRM
//! timeline syncobj, created on the first export; after each program the executor has the
//! device signal it at the program's ticket once the context that ran last has finished
//! (`AMDXDNA_CMD_SUBMIT_SIGNAL`), or signals it from the host when the program dispatched
//! nothing. Other backends' syncobj fds are imported (`SYNCOBJ_FD_TO_HANDLE`); a program that
//! waits on them waits on the host first (`SYNCOBJ_TIMELINE_WAIT`), because the backend reads
//! and converts the program's inputs on the host before it dispatches and cannot convert
//! inputs it does not have yet, then makes its first dispatch's context wait on the device too
//! (`AMDXDNA_CMD_SUBMIT_DEPENDENCY`), which keeps the order right once the kernels read f32
//! inputs from shared memory themselves.
//!
//! A lost device (a run past its timeout: a hung context; a reset the driver reports; a call
//! the driver refuses with `ENODEV`) answers [`BackendError::DeviceLost`], and from then on every
//! call answers the same error at once: nothing waits on the device again, and the caller (the
//! split scheduler, `engine serve`) makes the backend again or places the model elsewhere.
//!
//! This path has not run on an NPU (none was available); its tests drive it against a fake
//! device whose "kernel" is the emulator, which checks every byte the host hands over, and
//! whose timelines live in memory behind real file descriptors.

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use tandem_backend_api::{BackendError, Ticket, TimelineId};
use xrt_sys::{
    BoHandle, BoKind, ChainedRun, ContextHandle, NpuDevice, TimelineHandle, Xclbin, XrtError,
    MAX_TIMELINE_WAITS,
};

use crate::artefacts::Artefacts;
use crate::contract::{AttnParams, KernelShape, Phase};
use crate::executor::{on_node, Dispatch, DispatchTime, Executor, KvId};

/// A loaded kernel: its hardware context and instruction stream.
struct Loaded {
    ctx: ContextHandle,
    instructions: BoHandle,
    words: u32,
}

/// A staging buffer that grows to the largest dispatch seen.
#[derive(Default)]
struct Staging {
    bo: Option<(BoHandle, usize)>,
}

/// Why the device path takes no op in a placement yet.
pub const STATIC_STREAM: &str =
    "the NPU kernels' prebuilt instruction streams run only the canonical dispatch they were \
     generated for (shaders/npu/CONTRACT.md section 6); generating a stream per dispatch is not built yet, \
     so attention stays on the next backend";

/// The device executor over any [`NpuDevice`].
pub struct DeviceExecutor<D: NpuDevice> {
    /// Whether instruction streams are generated per dispatch (not built: see
    /// [`STATIC_STREAM`]); until then `supports` refuses, and `attention` runs what it is given
    /// (the tests drive it with the canonical dispatch).
    dynamic_streams: bool,
    device: D,
    artefacts: Artefacts,
    timeout: Duration,
    kernels: HashMap<(Phase, KernelShape), Loaded>,
    caches: HashMap<u64, (BoHandle, usize)>,
    params: Staging,
    q: Staging,
    out: Staging,
    next: u64,
    /// The timeline tickets count on, once exported.
    exported: Option<TimelineHandle>,
    /// Other backends' timelines, indexed by [`TimelineId`].
    imported: Vec<TimelineHandle>,
    /// Device waits for the next dispatch ([`Executor::wait_for`]), in a fixed array.
    armed: [(TimelineHandle, u64); MAX_TIMELINE_WAITS],
    armed_len: usize,
    /// The context of the program's last dispatch, until [`Executor::signal`].
    last_ctx: Option<ContextHandle>,
    /// Per position in a chain, its own params, q and out buffers (a chain's commands are all
    /// in flight at once).
    chain_staging: Vec<[Staging; 3]>,
    /// The error the device was lost with ([`XrtError::is_device_lost`]): every later call
    /// answers it at once.
    lost: Option<BackendError>,
}

/// A device error as a backend error naming the call: [`BackendError::DeviceLost`] where the
/// device is gone ([`XrtError::is_device_lost`]).
fn dev(e: XrtError) -> BackendError {
    if e.is_device_lost() {
        return BackendError::DeviceLost {
            device: format!("NPU: {e}"),
        };
    }
    BackendError::internal(format!("NPU: {e}"))
}

impl<D: NpuDevice> DeviceExecutor<D> {
    /// An executor over `device` with kernels from `artefacts`, waiting at most `timeout` per
    /// run.
    pub fn new(device: D, artefacts: Artefacts, timeout: Duration) -> Self {
        DeviceExecutor {
            dynamic_streams: false,
            device,
            artefacts,
            timeout,
            kernels: HashMap::new(),
            caches: HashMap::new(),
            params: Staging::default(),
            q: Staging::default(),
            out: Staging::default(),
            next: 1,
            exported: None,
            imported: Vec::new(),
            armed: [(TimelineHandle(0), 0); MAX_TIMELINE_WAITS],
            armed_len: 0,
            last_ctx: None,
            chain_staging: Vec::new(),
            lost: None,
        }
    }

    /// Runs `call` on the device unless it was lost (then its error, at once), and remembers a
    /// loss `call` meets.
    fn guarded<T>(
        &mut self,
        call: impl FnOnce(&mut Self) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        if let Some(e) = &self.lost {
            return Err(e.clone());
        }
        let result = call(self);
        if let Err(e @ BackendError::DeviceLost { .. }) = &result {
            self.lost = Some(e.clone());
        }
        result
    }

    /// The device.
    pub fn device_ref(&self) -> &D {
        &self.device
    }

    fn kernel(&mut self, phase: Phase, shape: KernelShape, context: usize) -> Result<&Loaded, BackendError> {
        if !self.kernels.contains_key(&(phase, shape)) {
            let (index, entry) =
                self.artefacts
                    .find(phase, shape, context)
                    .ok_or_else(|| BackendError::Unsupported {
                        op: "attention".into(),
                        reason: format!(
                            "no {} kernel for {shape} seeing {context} positions in {} (it has: {})",
                            phase.name(),
                            self.artefacts.dir.display(),
                            self.artefacts.offered()
                        ),
                    })?;
            let name = entry.kernel.clone();
            let files = self
                .artefacts
                .load(index)
                .map_err(|e| BackendError::internal(e.to_string()))?;
            let xclbin = Xclbin::parse(files.xclbin).map_err(|e| {
                let path = self
                    .artefacts
                    .dir
                    .join(&self.artefacts.manifest.kernels[index].xclbin);
                BackendError::internal(format!("{}: {e}", path.display()))
            })?;
            let ctx = self.device.open_context(&xclbin, &name).map_err(dev)?;
            let bytes: Vec<u8> = files.instructions.iter().flat_map(|w| w.to_le_bytes()).collect();
            let instructions = self
                .device
                .alloc(BoKind::Instructions, bytes.len())
                .map_err(dev)?;
            self.device.write(instructions, 0, &bytes).map_err(dev)?;
            self.kernels.insert(
                (phase, shape),
                Loaded {
                    ctx,
                    instructions,
                    words: files.instructions.len() as u32,
                },
            );
        }
        self.kernels
            .get(&(phase, shape))
            .ok_or_else(|| BackendError::internal("kernel vanished"))
    }

    /// `staging`'s buffer, grown to at least `bytes`.
    fn staging(device: &mut D, staging: &mut Staging, bytes: usize) -> Result<BoHandle, BackendError> {
        match staging.bo {
            Some((bo, size)) if size >= bytes => Ok(bo),
            old => {
                if let Some((bo, _)) = old {
                    device.free(bo).map_err(dev)?;
                }
                let size = bytes.next_power_of_two().max(4096);
                let bo = device.alloc(BoKind::Data, size).map_err(dev)?;
                staging.bo = Some((bo, size));
                Ok(bo)
            }
        }
    }

    /// The handle of an imported timeline; an error names an id `import_timeline` never gave.
    fn imported_timeline(&self, id: TimelineId) -> Result<TimelineHandle, BackendError> {
        usize::try_from(id.0)
            .ok()
            .and_then(|i| self.imported.get(i).copied())
            .ok_or_else(|| {
                BackendError::invalid(format!(
                    "timeline {} was not imported by this backend ({} imported)",
                    id.0,
                    self.imported.len()
                ))
            })
    }

    fn cache(&self, kv: KvId) -> Result<(BoHandle, usize), BackendError> {
        self.caches
            .get(&kv.0)
            .copied()
            .ok_or_else(|| BackendError::invalid(format!("unknown NPU cache buffer {}", kv.0)))
    }
}

fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl<D: NpuDevice> Executor for DeviceExecutor<D> {
    fn device(&self) -> String {
        let i = self.device.info();
        format!("AMD NPU {} ({}) at {}", i.generation, i.vbnv, i.node.display())
    }

    fn features(&self) -> Vec<String> {
        let i = self.device.info();
        let mut f = vec![
            // What the engine's `auto` reads to know whether the NPU cost model has figures.
            format!("generation={}", i.generation.name()),
            format!("pci={}", i.pci),
            format!("firmware={}", i.firmware_version.as_deref().unwrap_or("unknown")),
            format!("driver={}", i.driver_version),
            format!("kernel_abi={}", crate::contract::ABI_VERSION),
        ];
        if let Some(x) = &i.xrt_version {
            f.push(format!("xrt={x}"));
        }
        f.push(format!("artefacts={}", self.artefacts.dir.display()));
        f
    }

    fn supports(&self, shape: KernelShape) -> Result<(), String> {
        if !self.dynamic_streams {
            return Err(STATIC_STREAM.into());
        }
        for phase in [Phase::Decode, Phase::Prefill] {
            if self.artefacts.find(phase, shape, 1).is_none() {
                return Err(format!(
                    "no {} kernel for {shape} in {} (it has: {})",
                    phase.name(),
                    self.artefacts.dir.display(),
                    self.artefacts.offered()
                ));
            }
        }
        Ok(())
    }

    fn alloc_kv(&mut self, elems: usize) -> Result<KvId, BackendError> {
        self.guarded(|ex| ex.alloc_kv_now(elems))
    }

    fn free_kv(&mut self, kv: KvId) -> Result<(), BackendError> {
        // Not refused on a lost device: the host still lets go of what it held.
        let (bo, _) = self.cache(kv)?;
        self.caches.remove(&kv.0);
        self.device.free(bo).map_err(dev)
    }

    fn write_kv(&mut self, kv: KvId, at: usize, data: &[u16]) -> Result<(), BackendError> {
        self.guarded(|ex| {
            let (bo, elems) = ex.cache(kv)?;
            crate::executor::span(at, data.len(), elems)?;
            ex.device.write(bo, at * 2, &u16_bytes(data)).map_err(dev)
        })
    }

    fn read_kv(&mut self, kv: KvId, at: usize, out: &mut [u16]) -> Result<(), BackendError> {
        self.guarded(|ex| ex.read_kv_now(kv, at, out))
    }

    fn attention(
        &mut self,
        shape: KernelShape,
        params: &AttnParams,
        q: &[u16],
        k: KvId,
        v: KvId,
        out: &mut [u16],
    ) -> Result<DispatchTime, BackendError> {
        self.guarded(|ex| ex.attention_now(shape, params, q, k, v, out))
    }

    fn bytes_in_use(&self) -> u64 {
        // The single-dispatch buffers and each chain position's own params, q and out.
        let staged: usize = [&self.params, &self.q, &self.out]
            .into_iter()
            .chain(self.chain_staging.iter().flatten())
            .filter_map(|s| s.bo.map(|(_, n)| n))
            .sum();
        self.caches.values().map(|(_, e)| 2 * *e as u64).sum::<u64>() + staged as u64
    }

    /// Each run of consecutive dispatches on one hardware context goes to the device as one
    /// `ERT_CMD_CHAIN` (a step's attention layers share one context), waited for once. A failed
    /// command is reported with its node; a reset loses the device (see the module's notes).
    fn attention_chain(&mut self, chain: &mut [Dispatch]) -> Result<Vec<DispatchTime>, BackendError> {
        self.guarded(|ex| ex.attention_chain_now(chain))
    }

    fn prepare(&mut self, shape: KernelShape, capacity: usize) -> Result<(), BackendError> {
        self.guarded(|ex| {
            for phase in [Phase::Decode, Phase::Prefill] {
                if ex.artefacts.find(phase, shape, capacity.min(1)).is_some() {
                    ex.kernel(phase, shape, 1)?;
                }
            }
            Ok(())
        })
    }

    fn shares_timelines(&self) -> bool {
        true
    }

    fn timeline_device(&self) -> String {
        format!("amdxdna:{}", self.device.info().pci.slot)
    }

    fn export_timeline(&mut self) -> Result<Option<OwnedFd>, BackendError> {
        self.guarded(|ex| {
            let t = match ex.exported {
                Some(t) => t,
                None => {
                    let t = ex.device.create_timeline().map_err(dev)?;
                    ex.exported = Some(t);
                    t
                }
            };
            ex.device.export_timeline(t).map(Some).map_err(dev)
        })
    }

    fn import_timeline(&mut self, fd: BorrowedFd<'_>) -> Result<Option<TimelineId>, BackendError> {
        self.guarded(|ex| {
            let t = ex.device.import_timeline(fd).map_err(dev)?;
            ex.imported.push(t);
            Ok(Some(TimelineId(ex.imported.len() as u64 - 1)))
        })
    }

    fn signal(&mut self, ticket: Ticket) -> Result<(), BackendError> {
        self.guarded(|ex| ex.signal_now(ticket))
    }

    /// Waits on the host until each timeline has reached its ticket (at most the run
    /// timeout), then arms the same waits on the device for the program's first dispatch
    /// ([`NpuDevice::wait_before`] on its context). The host wait comes first because the
    /// backend converts the program's inputs on the host before it dispatches; the device
    /// wait keeps the order once kernels read shared inputs themselves. An empty `waits`
    /// disarms.
    fn wait_for(&mut self, waits: &[(TimelineId, Ticket)]) -> Result<(), BackendError> {
        if waits.is_empty() {
            // Disarming touches no device: it works on a lost one too.
            self.armed_len = 0;
            return Ok(());
        }
        self.guarded(|ex| ex.wait_for_now(waits))
    }
}

/// The device calls behind [`Executor`]'s, run by [`DeviceExecutor::guarded`].
impl<D: NpuDevice> DeviceExecutor<D> {
    fn alloc_kv_now(&mut self, elems: usize) -> Result<KvId, BackendError> {
        let bytes = elems
            .checked_mul(2)
            .ok_or_else(|| BackendError::invalid("KV cache too large"))?;
        // `NpuDevice::alloc` hands out zero-filled buffers, as a cache starts.
        let bo = self.device.alloc(BoKind::Data, bytes).map_err(dev)?;
        let id = self.next;
        self.next += 1;
        self.caches.insert(id, (bo, elems));
        Ok(KvId(id))
    }

    fn read_kv_now(&mut self, kv: KvId, at: usize, out: &mut [u16]) -> Result<(), BackendError> {
        let (bo, elems) = self.cache(kv)?;
        crate::executor::span(at, out.len(), elems)?;
        let mut bytes = vec![0u8; out.len() * 2];
        self.device.read(bo, at * 2, &mut bytes).map_err(dev)?;
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = u16::from_le_bytes([c[0], c[1]]);
        }
        Ok(())
    }

    fn attention_now(
        &mut self,
        shape: KernelShape,
        params: &AttnParams,
        q: &[u16],
        k: KvId,
        v: KvId,
        out: &mut [u16],
    ) -> Result<DispatchTime, BackendError> {
        let start = Instant::now();
        let (kb, _) = self.cache(k)?;
        let (vb, _) = self.cache(v)?;
        let context = (0..params.rows)
            .map(|r| params.positions[r] as usize + 1 - params.lo(r))
            .max()
            .unwrap_or(1);
        let phase = Phase::of_step(&params.row_slots);
        let (ctx, instructions, words) = {
            let k = self.kernel(phase, shape, context)?;
            (k.ctx, k.instructions, k.words)
        };
        let words_bytes: Vec<u8> = params.encode().iter().flat_map(|w| w.to_le_bytes()).collect();
        let pb = Self::staging(&mut self.device, &mut self.params, words_bytes.len())?;
        self.device.write(pb, 0, &words_bytes).map_err(dev)?;
        let qb = Self::staging(&mut self.device, &mut self.q, q.len() * 2)?;
        self.device.write(qb, 0, &u16_bytes(q)).map_err(dev)?;
        let ob = Self::staging(&mut self.device, &mut self.out, out.len() * 2)?;
        if self.armed_len > 0 {
            // The program's first dispatch takes its device waits.
            let (armed, n) = (self.armed, std::mem::take(&mut self.armed_len));
            self.device
                .wait_before(ctx, &armed[..n], self.timeout)
                .map_err(dev)?;
        }
        let run = self
            .device
            .run(ctx, instructions, words, &[pb, qb, kb, vb, ob])
            .map_err(dev)?;
        self.device.wait(run, self.timeout).map_err(dev)?;
        self.last_ctx = Some(ctx);
        let mut bytes = vec![0u8; out.len() * 2];
        self.device.read(ob, 0, &mut bytes).map_err(dev)?;
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = u16::from_le_bytes([c[0], c[1]]);
        }
        Ok(DispatchTime {
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    fn attention_chain_now(&mut self, chain: &mut [Dispatch]) -> Result<Vec<DispatchTime>, BackendError> {
        let start = Instant::now();
        let mut staged = Vec::with_capacity(chain.len());
        for (i, d) in chain.iter().enumerate() {
            let (kb, _) = self.cache(d.k).map_err(|e| on_node(d.node, e))?;
            let (vb, _) = self.cache(d.v).map_err(|e| on_node(d.node, e))?;
            let p = &d.params;
            let context = (0..p.rows)
                .map(|r| p.positions[r] as usize + 1 - p.lo(r))
                .max()
                .unwrap_or(1);
            let loaded = self
                .kernel(Phase::of_step(&p.row_slots), d.shape, context)
                .map_err(|e| on_node(d.node, e))?;
            let (ctx, instructions, words) = (loaded.ctx, loaded.instructions, loaded.words);
            if self.chain_staging.len() <= i {
                self.chain_staging.push(Default::default());
            }
            let [ps, qs, os] = &mut self.chain_staging[i];
            let pw: Vec<u8> = p.encode().iter().flat_map(|w| w.to_le_bytes()).collect();
            let pb = Self::staging(&mut self.device, ps, pw.len())?;
            self.device.write(pb, 0, &pw).map_err(dev)?;
            let qb = Self::staging(&mut self.device, qs, d.q.len() * 2)?;
            self.device.write(qb, 0, &u16_bytes(&d.q)).map_err(dev)?;
            let ob = Self::staging(&mut self.device, os, d.out.len() * 2)?;
            staged.push((ctx, instructions, words, [pb, qb, kb, vb, ob]));
        }
        let mut first = 0;
        while first < staged.len() {
            let ctx = staged[first].0;
            let end = (first..staged.len())
                .find(|&j| staged[j].0 != ctx)
                .unwrap_or(staged.len());
            let runs: Vec<ChainedRun<'_>> = staged[first..end]
                .iter()
                .map(|(_, instructions, words, args)| ChainedRun {
                    instructions: *instructions,
                    words: *words,
                    args,
                })
                .collect();
            if self.armed_len > 0 {
                let (armed, n) = (self.armed, std::mem::take(&mut self.armed_len));
                self.device
                    .wait_before(ctx, &armed[..n], self.timeout)
                    .map_err(dev)?;
            }
            let node_of = |i: u32| {
                chain
                    .get(first + i as usize)
                    .map_or(chain[first].node, |d| d.node)
            };
            let result = self
                .device
                .run_chain(ctx, &runs)
                .and_then(|run| self.device.wait(run, self.timeout));
            match result {
                Ok(()) => {}
                Err(XrtError::ChainCommandFailed { index, count, state }) => {
                    return Err(BackendError::internal(format!(
                        "NPU: attention node {}: command {index} of a chain of {count} finished in state {state}; \
                         the commands after it did not run",
                        node_of(index)
                    )))
                }
                // A reset or a hang among them loses the device (`dev`).
                Err(e) => return Err(on_node(chain[first].node, dev(e))),
            }
            self.last_ctx = Some(ctx);
            first = end;
        }
        let seconds = start.elapsed().as_secs_f64() / chain.len().max(1) as f64;
        let mut times = Vec::with_capacity(chain.len());
        for (d, (_, _, _, args)) in chain.iter_mut().zip(&staged) {
            let mut bytes = vec![0u8; d.out.len() * 2];
            self.device.read(args[4], 0, &mut bytes).map_err(dev)?;
            for (o, c) in d.out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = u16::from_le_bytes([c[0], c[1]]);
            }
            times.push(DispatchTime { seconds });
        }
        Ok(times)
    }

    fn signal_now(&mut self, ticket: Ticket) -> Result<(), BackendError> {
        self.armed_len = 0;
        let ctx = self.last_ctx.take();
        let Some(t) = self.exported else {
            return Ok(());
        };
        match ctx {
            Some(ctx) => self.device.signal_after(ctx, t, ticket.0),
            None => self.device.signal_now(t, ticket.0),
        }
        .map_err(dev)
    }

    fn wait_for_now(&mut self, waits: &[(TimelineId, Ticket)]) -> Result<(), BackendError> {
        self.armed_len = 0;
        if waits.len() > MAX_TIMELINE_WAITS {
            return Err(BackendError::invalid(format!(
                "at most {MAX_TIMELINE_WAITS} timeline waits, not {}",
                waits.len()
            )));
        }
        let mut armed = [(TimelineHandle(0), 0u64); MAX_TIMELINE_WAITS];
        for (slot, (id, ticket)) in armed.iter_mut().zip(waits) {
            let t = self.imported_timeline(*id)?;
            self.device
                .wait_timeline(t, ticket.0, self.timeout)
                .map_err(dev)?;
            *slot = (t, ticket.0);
        }
        self.armed = armed;
        self.armed_len = waits.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use tandem_backend_api::boundary::{DRM_SYNCOBJ_FD, VULKAN_OPAQUE_FD};
    use tandem_backend_api::{
        ComputeBackend, DType, GraphBuilder, KvCacheRef, Op, SharedTimeline, StepArgs, TensorDesc, Usage,
    };
    use xrt_sys::{AxlfBuilder, DeviceInfo, Generation, PciId, RunHandle};

    use super::*;
    use crate::artefacts::tests::write_artefacts;
    use crate::contract::{bf16_round, PARAMS_HEADER_WORDS};
    use crate::emu;

    /// The fakes' "kernel": every timeline (syncobj) by the inode of the file that stands for
    /// it, with its value. Fakes sharing one see each other's timelines through real fds.
    #[derive(Default)]
    struct FakeKernel {
        timelines: HashMap<u64, (File, u64)>,
    }

    type Kernel = Arc<Mutex<FakeKernel>>;

    /// What a fake device was asked to do, in order.
    #[derive(Debug, Clone, PartialEq)]
    enum Event {
        /// `wait_before(ctx, waits)`: (timeline handle, point) pairs.
        WaitBefore { ctx: u32, waits: Vec<(u32, u64)> },
        /// A run (`EXEC_CMD`) on a context.
        Exec { ctx: u32 },
        /// `signal_after(ctx, t, point)`.
        SignalAfter { ctx: u32, timeline: u32, point: u64 },
        /// `signal_now(t, point)`.
        SignalNow { timeline: u32, point: u64 },
        /// `wait_timeline(t, point)` on the host.
        HostWait { timeline: u32, point: u64 },
    }

    /// A device whose kernel is the emulator: it decodes the params buffer as the cores do and
    /// runs the contract's arithmetic over the buffers it was handed. Its timelines live in
    /// its [`FakeKernel`]; a signal after a context's commands applies when they complete (at
    /// `wait`).
    struct FakeNpu {
        info: DeviceInfo,
        bos: HashMap<u32, (BoKind, Vec<u8>)>,
        contexts: Vec<String>,
        runs: Vec<(u32, Vec<u32>)>,
        hang: bool,
        next: u32,
        kernel: Kernel,
        /// Timeline handles of this device to the inode of their timeline.
        handles: HashMap<u32, u64>,
        events: Arc<Mutex<Vec<Event>>>,
        /// Runs not yet waited for, with their context.
        unfinished: HashMap<u64, u32>,
        /// Signals waiting for a context's runs: (context, inode, point).
        pending: Vec<(u32, u64, u64)>,
        /// Submissions and injected faults, shared with the test.
        chains: Arc<Mutex<ChainLog>>,
        /// What `wait` answers for a chain run.
        chain_results: HashMap<u64, XrtError>,
    }

    /// What the fake saw of submissions, and the faults it is told to inject.
    #[derive(Default)]
    struct ChainLog {
        /// `EXEC_CMD`s, single or chained.
        submissions: usize,
        /// Commands per chained submission, in order.
        lengths: Vec<usize>,
        /// Bytes of each chained command's instruction stream, in order.
        stream_bytes: Vec<usize>,
        /// The command index of the next chain that fails.
        fail_at: Option<u32>,
        /// The command index of the next chain during which the device resets.
        reset_at: Option<u32>,
    }

    static FAKE_SYNCOBJS: AtomicU64 = AtomicU64::new(0);

    impl FakeNpu {
        fn new() -> Self {
            FakeNpu {
                info: DeviceInfo {
                    node: PathBuf::from("/dev/accel/accel0"),
                    pci: PciId {
                        slot: "0000:c6:00.1".into(),
                        vendor: 0x1022,
                        device: 0x17f0,
                        revision: 0x10,
                    },
                    generation: Generation::Npu4,
                    driver: Some("amdxdna".into()),
                    vbnv: "RyzenAI-npu4".into(),
                    device_type: Some(0),
                    firmware_version: Some("1.0.0.166".into()),
                    driver_version: "in-tree (Linux 6.14.0)".into(),
                    kernel_release: Some("6.14.0".into()),
                    xrt_version: None,
                },
                bos: HashMap::new(),
                contexts: Vec::new(),
                runs: Vec::new(),
                hang: false,
                next: 1,
                kernel: Kernel::default(),
                handles: HashMap::new(),
                events: Arc::default(),
                unfinished: HashMap::new(),
                pending: Vec::new(),
                chains: Arc::default(),
                chain_results: HashMap::new(),
            }
        }

        /// The emulated kernel over one command's buffers.
        fn execute_one(&mut self, args: &[BoHandle]) -> Result<(), XrtError> {
            let [pb, qb, kb, vb, ob] = args else {
                panic!("{} arguments", args.len())
            };
            let header: Vec<u32> = self.bos[&pb.0].1[..PARAMS_HEADER_WORDS * 4]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let words = PARAMS_HEADER_WORDS + 2 * header[1] as usize;
            let all: Vec<u32> = self.bos[&pb.0].1[..words * 4]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let p = AttnParams::decode(&all).expect("the host wrote valid params");
            let (q, k, v) = (
                self.u16s(*qb, p.q_elems()),
                self.u16s(*kb, p.cache_elems()),
                self.u16s(*vb, p.cache_elems()),
            );
            let mut out = vec![0u16; p.q_elems()];
            emu::attention(&p, &q, &k, &v, &mut out).expect("the kernel runs");
            let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_le_bytes()).collect();
            self.write(*ob, 0, &bytes)?;
            Ok(())
        }

        /// A second device of the same machine: it sees the same timelines.
        fn sharing(kernel: &Kernel) -> Self {
            FakeNpu {
                kernel: kernel.clone(),
                ..FakeNpu::new()
            }
        }

        fn ino(&self, t: TimelineHandle) -> Result<u64, XrtError> {
            self.handles.get(&t.0).copied().ok_or(XrtError::InvalidHandle {
                kind: "timeline",
                handle: t.0.into(),
            })
        }

        fn value_of(&self, ino: u64) -> u64 {
            self.kernel
                .lock()
                .unwrap()
                .timelines
                .get(&ino)
                .map_or(0, |(_, v)| *v)
        }

        fn advance(&self, ino: u64, point: u64) {
            if let Some((_, v)) = self.kernel.lock().unwrap().timelines.get_mut(&ino) {
                *v = (*v).max(point);
            }
        }

        fn log(&self, e: Event) {
            self.events.lock().unwrap().push(e);
        }

        fn handle(&mut self, ino: u64) -> TimelineHandle {
            self.next += 1;
            self.handles.insert(self.next, ino);
            TimelineHandle(self.next)
        }

        fn bo(&mut self, bo: BoHandle) -> Result<&mut Vec<u8>, XrtError> {
            self.bos
                .get_mut(&bo.0)
                .map(|(_, b)| b)
                .ok_or_else(|| XrtError::InvalidArgument(format!("unknown bo {}", bo.0)))
        }

        fn u16s(&self, bo: BoHandle, n: usize) -> Vec<u16> {
            self.bos[&bo.0].1[..n * 2]
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect()
        }
    }

    impl NpuDevice for FakeNpu {
        fn info(&self) -> &DeviceInfo {
            &self.info
        }
        fn open_context(&mut self, xclbin: &Xclbin, kernel: &str) -> Result<ContextHandle, XrtError> {
            assert!(!xclbin.bytes().is_empty());
            self.contexts.push(kernel.to_string());
            Ok(ContextHandle(self.contexts.len() as u32))
        }
        fn close_context(&mut self, _: ContextHandle) -> Result<(), XrtError> {
            Ok(())
        }
        fn alloc(&mut self, kind: BoKind, bytes: usize) -> Result<BoHandle, XrtError> {
            self.next += 1;
            self.bos.insert(self.next, (kind, vec![0; bytes]));
            Ok(BoHandle(self.next))
        }
        fn write(&mut self, bo: BoHandle, offset: usize, data: &[u8]) -> Result<(), XrtError> {
            let b = self.bo(bo)?;
            b[offset..offset + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn read(&mut self, bo: BoHandle, offset: usize, out: &mut [u8]) -> Result<(), XrtError> {
            let b = self.bo(bo)?;
            out.copy_from_slice(&b[offset..offset + out.len()]);
            Ok(())
        }
        fn free(&mut self, bo: BoHandle) -> Result<(), XrtError> {
            self.bos
                .remove(&bo.0)
                .map(|_| ())
                .ok_or(XrtError::InvalidArgument("double free".into()))
        }
        fn run(
            &mut self,
            _: ContextHandle,
            instr: BoHandle,
            words: u32,
            args: &[BoHandle],
        ) -> Result<RunHandle, XrtError> {
            assert_eq!(self.bos[&instr.0].0, BoKind::Instructions);
            let stream: Vec<u32> = self.bos[&instr.0].1[..words as usize * 4]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            self.runs.push((words, stream));
            self.chains.lock().unwrap().submissions += 1;
            let ctx = self.contexts.len() as u32;
            self.log(Event::Exec { ctx });
            self.unfinished.insert(self.runs.len() as u64, ctx);
            if self.hang {
                return Ok(RunHandle(self.runs.len() as u64));
            }
            self.execute_one(args)?;
            Ok(RunHandle(self.runs.len() as u64))
        }
        fn run_chain(
            &mut self,
            ctx: ContextHandle,
            commands: &[xrt_sys::ChainedRun<'_>],
        ) -> Result<RunHandle, XrtError> {
            let (fail, reset) = {
                let mut log = self.chains.lock().unwrap();
                log.submissions += 1;
                log.lengths.push(commands.len());
                (log.fail_at.take(), log.reset_at.take())
            };
            let mut outcome = None;
            for (i, c) in commands.iter().enumerate() {
                let i = i as u32;
                if reset == Some(i) {
                    outcome = Some(XrtError::DeviceReset {
                        what: format!("command {i} of a chain"),
                    });
                    break;
                }
                self.chains
                    .lock()
                    .unwrap()
                    .stream_bytes
                    .push(c.words as usize * 4);
                let stream: Vec<u32> = self.bos[&c.instructions.0].1[..c.words as usize * 4]
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                self.runs.push((c.words, stream));
                if fail == Some(i) {
                    outcome = Some(XrtError::ChainCommandFailed {
                        index: i,
                        count: commands.len() as u32,
                        state: xrt_sys::CommandState::Error,
                    });
                    break;
                }
                self.execute_one(c.args)?;
            }
            let id = self.runs.len() as u64 + 1_000_000;
            self.log(Event::Exec { ctx: ctx.0 });
            self.unfinished.insert(id, ctx.0);
            if let Some(e) = outcome {
                self.chain_results.insert(id, e);
            }
            Ok(RunHandle(id))
        }
        fn wait(&mut self, run: RunHandle, timeout: Duration) -> Result<(), XrtError> {
            if let Some(e) = self.chain_results.remove(&run.0) {
                self.unfinished.remove(&run.0);
                return Err(e);
            }
            if self.hang {
                return Err(XrtError::Timeout {
                    call: "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT",
                    after: timeout,
                });
            }
            // The run completes: signals queued behind its context's runs apply.
            if let Some(ctx) = self.unfinished.remove(&run.0) {
                if !self.unfinished.values().any(|c| *c == ctx) {
                    let (due, rest): (Vec<_>, Vec<_>) =
                        self.pending.drain(..).partition(|(c, _, _)| *c == ctx);
                    self.pending = rest;
                    for (_, ino, point) in due {
                        self.advance(ino, point);
                    }
                }
            }
            Ok(())
        }

        fn create_timeline(&mut self) -> Result<TimelineHandle, XrtError> {
            // A real file descriptor stands for the syncobj: an unlinked temporary file.
            let n = FAKE_SYNCOBJS.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("tandem-fake-syncobj-{}-{n}", std::process::id()));
            let file = File::create(&path).map_err(|e| XrtError::InvalidArgument(e.to_string()))?;
            let _ = std::fs::remove_file(&path);
            let ino = file
                .metadata()
                .map_err(|e| XrtError::InvalidArgument(e.to_string()))?
                .ino();
            self.kernel.lock().unwrap().timelines.insert(ino, (file, 0));
            Ok(self.handle(ino))
        }

        fn export_timeline(&mut self, t: TimelineHandle) -> Result<OwnedFd, XrtError> {
            let ino = self.ino(t)?;
            let k = self.kernel.lock().unwrap();
            let (file, _) = k
                .timelines
                .get(&ino)
                .ok_or_else(|| XrtError::InvalidArgument("timeline vanished".into()))?;
            let dup = file
                .try_clone()
                .map_err(|e| XrtError::InvalidArgument(e.to_string()))?;
            Ok(OwnedFd::from(dup))
        }

        fn import_timeline(&mut self, fd: BorrowedFd<'_>) -> Result<TimelineHandle, XrtError> {
            let file = File::from(
                fd.try_clone_to_owned()
                    .map_err(|e| XrtError::InvalidArgument(e.to_string()))?,
            );
            let ino = file
                .metadata()
                .map_err(|e| XrtError::InvalidArgument(e.to_string()))?
                .ino();
            if !self.kernel.lock().unwrap().timelines.contains_key(&ino) {
                return Err(XrtError::Ioctl {
                    call: "DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE",
                    errno: EINVAL,
                    context: "the fd is not a syncobj".into(),
                });
            }
            Ok(self.handle(ino))
        }

        fn signal_after(
            &mut self,
            ctx: ContextHandle,
            t: TimelineHandle,
            point: u64,
        ) -> Result<(), XrtError> {
            let ino = self.ino(t)?;
            self.log(Event::SignalAfter {
                ctx: ctx.0,
                timeline: t.0,
                point,
            });
            if self.unfinished.values().any(|c| *c == ctx.0) {
                self.pending.push((ctx.0, ino, point));
            } else {
                self.advance(ino, point);
            }
            Ok(())
        }

        fn signal_now(&mut self, t: TimelineHandle, point: u64) -> Result<(), XrtError> {
            let ino = self.ino(t)?;
            self.log(Event::SignalNow { timeline: t.0, point });
            self.advance(ino, point);
            Ok(())
        }

        fn wait_before(
            &mut self,
            ctx: ContextHandle,
            waits: &[(TimelineHandle, u64)],
            _timeout: Duration,
        ) -> Result<(), XrtError> {
            for (t, _) in waits {
                self.ino(*t)?;
            }
            self.log(Event::WaitBefore {
                ctx: ctx.0,
                waits: waits.iter().map(|(t, p)| (t.0, *p)).collect(),
            });
            Ok(())
        }

        fn wait_timeline(
            &mut self,
            t: TimelineHandle,
            point: u64,
            timeout: Duration,
        ) -> Result<(), XrtError> {
            let ino = self.ino(t)?;
            self.log(Event::HostWait { timeline: t.0, point });
            if self.value_of(ino) >= point {
                return Ok(());
            }
            // Nothing else advances a fake timeline while this one waits: the full timeout.
            std::thread::sleep(timeout);
            if self.value_of(ino) >= point {
                return Ok(());
            }
            Err(XrtError::TimelineTimeout {
                timeline: t.0,
                point,
                after: timeout,
            })
        }

        fn timeline_value(&mut self, t: TimelineHandle) -> Result<u64, XrtError> {
            let ino = self.ino(t)?;
            Ok(self.value_of(ino))
        }

        fn destroy_timeline(&mut self, t: TimelineHandle) -> Result<(), XrtError> {
            self.ino(t)?;
            self.handles.remove(&t.0);
            Ok(())
        }
    }

    /// Linux's `EINVAL` (no libc dependency for the tests).
    const EINVAL: i32 = 22;

    const SHAPE: KernelShape = KernelShape {
        head_dim: 16,
        group: 2,
    };

    fn executor(tag: &str) -> DeviceExecutor<FakeNpu> {
        executor_on(tag, FakeNpu::new())
    }

    fn executor_on(tag: &str, device: FakeNpu) -> DeviceExecutor<FakeNpu> {
        let xclbin = AxlfBuilder::mlir_aie("MLIR_AIE", 4, b"pdi").build();
        let dir = write_artefacts(tag, "npu4", SHAPE, &xclbin, &[0xdead_beef, 7, 9]);
        let a = Artefacts::open(&dir, "npu4").unwrap();
        DeviceExecutor::new(device, a, Duration::from_millis(50))
    }

    /// The canonical decode dispatch of the contract's section 6 with a group of 2.
    fn canonical() -> AttnParams {
        AttnParams {
            rows: 4,
            heads: 2,
            kv_heads: 1,
            head_dim: 16,
            capacity: 512,
            window: None,
            scale: 0.25,
            slots: 4,
            positions: (0..4).map(|r| 128 * (r + 1) - 1).collect(),
            row_slots: (0..4).collect(),
        }
    }

    #[test]
    fn a_dispatch_hands_the_device_what_the_contract_says() {
        let mut ex = executor("dispatch");
        let p = canonical();
        let (k, v) = (
            ex.alloc_kv(p.cache_elems()).unwrap(),
            ex.alloc_kv(p.cache_elems()).unwrap(),
        );
        let fill = |n: usize, s: f32| -> Vec<u16> {
            (0..n)
                .map(|i| bf16_round(((i * 37 % 101) as f32 / 50.0 - 1.0) * s))
                .collect()
        };
        let (kc, vc) = (fill(p.cache_elems(), 1.0), fill(p.cache_elems(), 0.5));
        ex.write_kv(k, 0, &kc).unwrap();
        ex.write_kv(v, 0, &vc).unwrap();
        let q = fill(p.q_elems(), 0.7);
        let mut got = vec![0u16; p.q_elems()];
        ex.attention(SHAPE, &p, &q, k, v, &mut got).unwrap();
        // The same dispatch on the emulator directly.
        let mut want = vec![0u16; p.q_elems()];
        emu::attention(&p, &q, &kc, &vc, &mut want).unwrap();
        assert_eq!(got, want);
        // The decode kernel's instruction stream went in as written, and was loaded once.
        ex.attention(SHAPE, &p, &q, k, v, &mut got).unwrap();
        let dev = ex.device_ref();
        assert_eq!(dev.contexts, vec!["MLIR_AIE".to_string()]);
        assert_eq!(dev.runs.len(), 2);
        assert_eq!(dev.runs[0], (3, vec![0xdead_beef, 7, 9]));
        // Reading a cache back gives what was written.
        let mut back = vec![0u16; 32];
        ex.read_kv(k, 100, &mut back).unwrap();
        assert_eq!(back, kc[100..132]);
        assert!(ex
            .write_kv(k, p.cache_elems() - 1, &[1, 2])
            .unwrap_err()
            .to_string()
            .contains("run past"));
    }

    #[test]
    fn a_hung_run_times_out_and_missing_kernels_are_named() {
        let mut ex = executor("hang");
        let p = canonical();
        let (k, v) = (
            ex.alloc_kv(p.cache_elems()).unwrap(),
            ex.alloc_kv(p.cache_elems()).unwrap(),
        );
        let q = vec![0u16; p.q_elems()];
        let mut out = vec![0u16; p.q_elems()];
        let other = KernelShape {
            head_dim: 256,
            group: 4,
        };
        let e = ex
            .attention(other, &p, &q, k, v, &mut out)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no decode kernel for head_dim 256 group 4")
                && e.contains("it has: decode head_dim 16"),
            "{e}"
        );
        ex.device.hang = true;
        let e = ex.attention(SHAPE, &p, &q, k, v, &mut out).unwrap_err();
        assert!(matches!(e, BackendError::DeviceLost { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("timed out after 50ms") && text.contains("SYNCOBJ"),
            "{text}"
        );
        // The device is lost: later calls answer the same error at once, without waiting on it
        // again, even were it to answer now.
        ex.device.hang = false;
        let t = Instant::now();
        assert_eq!(ex.attention(SHAPE, &p, &q, k, v, &mut out).unwrap_err(), e);
        assert_eq!(ex.write_kv(k, 0, &[1]).unwrap_err(), e);
        assert_eq!(ex.alloc_kv(16).unwrap_err(), e);
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
        assert_eq!(ex.device.runs.len(), 1, "nothing more reached the device");
        // Until streams are generated per dispatch, the placement is told no, with the reason.
        assert!(ex.supports(SHAPE).unwrap_err().contains("canonical dispatch"));
        assert!(
            ex.device().contains("npu4")
                && ex
                    .features()
                    .iter()
                    .any(|f| f == "pci=0000:c6:00.1 1022:17f0 rev 10" || f.starts_with("pci="))
        );
        assert!(ex.features().iter().any(|f| f == "generation=npu4"));
    }

    // ----- Timelines (device-side boundaries) through the backend -----

    type DeviceBackend = crate::backend::NpuBackend<crate::Device>;

    /// A backend over a fake device whose kernels run any dispatch (streams "per dispatch"),
    /// and the device's event log.
    fn device_backend(tag: &str, device: FakeNpu) -> (DeviceBackend, Arc<Mutex<Vec<Event>>>) {
        let events = device.events.clone();
        let mut ex = executor_on(tag, device);
        ex.dynamic_streams = true;
        (DeviceBackend::with_executor(Box::new(ex)), events)
    }

    /// The device executor reports its generation, so the backend answers with the cost model
    /// beside a laptop iGPU it knows, and not beside one it does not.
    #[test]
    fn an_npu4_device_answers_the_cost_query() {
        let (b, _) = device_backend("cost", FakeNpu::new());
        let q = crate::estimate::tests::query("AMD Radeon 890M Graphics (RADV GFX1150)");
        let a = b.estimate_decode(&q).expect("npu4 beside an 890M has figures");
        let (alone, beside) = (
            a.estimate("vulkan", false).unwrap(),
            a.estimate("vulkan", true).unwrap(),
        );
        assert!(a.simulated && a.slower_everywhere(beside, alone));
        assert_eq!(a.estimates.len(), 2);
        let q = crate::estimate::tests::query("NVIDIA H100 80GB HBM3");
        assert_eq!(b.estimate_decode(&q), None);
    }

    const POSITIONS: [u32; 4] = [127, 255, 383, 511];
    const SLOTS: [u32; 4] = [0, 1, 2, 3];

    fn args() -> StepArgs<'static> {
        StepArgs {
            tokens: &[0; 4],
            positions: &POSITIONS,
            slots: &SLOTS,
            select: &SLOTS,
        }
    }

    /// The canonical dispatch as a program: q, k, v inputs, attention over a 4-slot cache of
    /// 512 positions, the output written to a buffer. Returns the program and the output.
    fn attention_program(
        b: &mut DeviceBackend,
    ) -> (tandem_backend_api::ProgramId, tandem_backend_api::BufferId) {
        let act = |b: &mut DeviceBackend, cols: usize| {
            let id = b
                .alloc(&TensorDesc::new(DType::F32, [4, cols]), Usage::Activation)
                .unwrap();
            let data: Vec<u8> = (0..4 * cols)
                .flat_map(|i| (((i * 37 % 101) as f32 / 50.0 - 1.0) * 0.5).to_le_bytes())
                .collect();
            b.write(id, 0, &data).unwrap();
            id
        };
        let (qb, kb, vb) = (act(b, 32), act(b, 16), act(b, 16));
        let ob = b
            .alloc(&TensorDesc::new(DType::F32, [4, 32]), Usage::Activation)
            .unwrap();
        let cache = TensorDesc::new(DType::F32, [4, 512, 16]);
        let (kc, vc) = (
            b.alloc(&cache, Usage::KvCache).unwrap(),
            b.alloc(&cache, Usage::KvCache).unwrap(),
        );
        let mut g = GraphBuilder::new("attention", 4, 4);
        let input = |g: &mut GraphBuilder, buffer, cols| {
            g.push1(Op::Input {
                buffer,
                cols,
                selected: false,
            })
        };
        let (q, k, v) = (
            input(&mut g, qb, 32),
            input(&mut g, kb, 16),
            input(&mut g, vb, 16),
        );
        let a = g.push1(Op::Attention {
            q,
            k,
            v,
            cache: KvCacheRef {
                k: kc,
                v: vc,
                dtype: DType::F32,
                slots: 4,
                capacity: 512,
            },
            heads: 2,
            kv_heads: 1,
            head_dim: 16,
            scale: 0.25,
            window: None,
            softcap: None,
            bidirectional_from: None,
        });
        g.push(Op::Output { x: a, buffer: ob });
        (b.compile(&g.finish()).unwrap(), ob)
    }

    /// A program that dispatches nothing: an input copied to an output.
    fn copy_program(b: &mut DeviceBackend) -> tandem_backend_api::ProgramId {
        let desc = TensorDesc::new(DType::F32, [4, 8]);
        let (x, y) = (
            b.alloc(&desc, Usage::Activation).unwrap(),
            b.alloc(&desc, Usage::Activation).unwrap(),
        );
        let mut g = GraphBuilder::new("copy", 4, 4);
        let v = g.push1(Op::Input {
            buffer: x,
            cols: 8,
            selected: false,
        });
        g.push(Op::Output { x: v, buffer: y });
        b.compile(&g.finish()).unwrap()
    }

    /// The value of the only timeline of `kernel`.
    fn only_value(kernel: &Kernel) -> u64 {
        let k = kernel.lock().unwrap();
        assert_eq!(k.timelines.len(), 1, "one timeline");
        k.timelines.values().next().map_or(0, |(_, v)| *v)
    }

    /// Closes an exported timeline's descriptor, as its owner (the caller of export) must.
    fn close(t: SharedTimeline) {
        // SAFETY: `export_timeline` made the caller (this test) the fd's owner; importers took
        // their own duplicates.
        drop(unsafe { OwnedFd::from_raw_fd(t.fd) });
    }

    #[test]
    fn an_exported_timeline_reaches_each_ticket() {
        let device = FakeNpu::new();
        let kernel = device.kernel.clone();
        let (mut a, events) = device_backend("tl-signal", device);
        assert!(a.info().features.iter().any(|f| f == "timeline_export"));
        let copy = copy_program(&mut a);
        // A ticket issued before the export: the timeline starts there.
        assert_eq!(a.execute(copy, &args()).unwrap(), Ticket(1));
        let shared = a.export_timeline().unwrap().expect("the device executor exports");
        assert_eq!(shared.kind, DRM_SYNCOBJ_FD);
        assert_eq!(shared.device, "amdxdna:0000:c6:00.1");
        assert!(shared.fd >= 0);
        close(shared);
        assert_eq!(only_value(&kernel), 1);
        // A program with a dispatch: the device signals after its context's run.
        let (attn, _) = attention_program(&mut a);
        let t = a.execute(attn, &args()).unwrap();
        assert_eq!(t, Ticket(2));
        assert_eq!(only_value(&kernel), 2);
        // A program without one: the host signals.
        assert_eq!(a.execute(copy, &args()).unwrap(), Ticket(3));
        assert_eq!(only_value(&kernel), 3);
        let ev = events.lock().unwrap().clone();
        let Some(Event::SignalNow {
            timeline: h,
            point: 1,
        }) = ev.first().cloned()
        else {
            panic!("{ev:?}")
        };
        assert_eq!(
            ev,
            vec![
                Event::SignalNow {
                    timeline: h,
                    point: 1
                },
                Event::Exec { ctx: 1 },
                Event::SignalAfter {
                    ctx: 1,
                    timeline: h,
                    point: 2
                },
                Event::SignalNow {
                    timeline: h,
                    point: 3
                },
            ]
        );
        // A second export is the same timeline.
        close(a.export_timeline().unwrap().unwrap());
        assert_eq!(only_value(&kernel), 3);
    }

    #[test]
    fn a_signal_after_a_hung_run_never_lands() {
        let device = FakeNpu::new();
        let kernel = device.kernel.clone();
        let mut ex = executor_on("tl-hang", device);
        let fd = ex.export_timeline().unwrap().expect("exports");
        drop(fd);
        let p = canonical();
        let (k, v) = (
            ex.alloc_kv(p.cache_elems()).unwrap(),
            ex.alloc_kv(p.cache_elems()).unwrap(),
        );
        let q = vec![0u16; p.q_elems()];
        let mut out = vec![0u16; p.q_elems()];
        ex.attention(SHAPE, &p, &q, k, v, &mut out).unwrap();
        ex.signal(Ticket(1)).unwrap();
        assert_eq!(only_value(&kernel), 1);
        ex.device.hang = true;
        assert!(ex.attention(SHAPE, &p, &q, k, v, &mut out).is_err());
        // The signal is queued behind the context's unfinished run.
        ex.device
            .signal_after(ContextHandle(1), ex.exported.unwrap(), 2)
            .unwrap();
        assert_eq!(only_value(&kernel), 1);
    }

    #[test]
    fn execute_after_waits_on_imported_timelines_before_the_dispatch() {
        let fa = FakeNpu::new();
        let kernel = fa.kernel.clone();
        let (mut a, _) = device_backend("tl-a", fa);
        let (mut c, _) = device_backend("tl-c", FakeNpu::sharing(&kernel));
        let (mut b, events) = device_backend("tl-b", FakeNpu::sharing(&kernel));
        let (sa, sc) = (
            a.export_timeline().unwrap().unwrap(),
            c.export_timeline().unwrap().unwrap(),
        );
        let ida = b.import_timeline(&sa).unwrap().expect("a syncobj fd imports");
        let idc = b.import_timeline(&sc).unwrap().expect("a syncobj fd imports");
        assert_ne!(ida, idc);
        // The importer holds its own handles: the exporters' fds can close.
        close(sa);
        close(sc);
        let (pa, oa) = attention_program(&mut a);
        let ta = a.execute(pa, &args()).unwrap();
        let copy = copy_program(&mut c);
        c.execute(copy, &args()).unwrap();
        let tc = c.execute(copy, &args()).unwrap();
        assert_eq!((ta, tc), (Ticket(1), Ticket(2)));

        let (pb, ob) = attention_program(&mut b);
        let tb = b.execute_after(pb, &args(), &[(idc, tc), (ida, ta)]).unwrap();
        assert_eq!(tb, Ticket(1));
        let ev = events.lock().unwrap().clone();
        let [Event::HostWait {
            timeline: hc,
            point: 2,
        }, Event::HostWait {
            timeline: ha,
            point: 1,
        }, ..] = ev[..]
        else {
            panic!("{ev:?}")
        };
        assert_ne!(ha, hc);
        // Host waits, then the device dependency on the dispatch's context, then the EXEC_CMD.
        assert_eq!(
            ev,
            vec![
                Event::HostWait {
                    timeline: hc,
                    point: 2
                },
                Event::HostWait {
                    timeline: ha,
                    point: 1
                },
                Event::WaitBefore {
                    ctx: 1,
                    waits: vec![(hc, 2), (ha, 1)]
                },
                Event::Exec { ctx: 1 },
            ]
        );
        // The result is the same as a's, which ran the same program on the same inputs.
        let (mut got, mut want) = (vec![0u8; 4 * 32 * 4], vec![0u8; 4 * 32 * 4]);
        b.read(ob, 0, &mut got).unwrap();
        a.read(oa, 0, &mut want).unwrap();
        assert_eq!(got, want);
        assert!(got.iter().any(|x| *x != 0));
        // The next plain execute carries no stale device waits.
        b.execute(pb, &args()).unwrap();
        let ev = events.lock().unwrap().clone();
        assert_eq!(ev[4..], [Event::Exec { ctx: 1 }]);
    }

    #[test]
    fn foreign_kinds_are_not_imported_and_bad_fds_are_errors() {
        let (mut b, events) = device_backend("tl-foreign", FakeNpu::new());
        // fd -1 would fail a duplication: a foreign kind is refused before the fd is touched.
        let vulkan = SharedTimeline {
            fd: -1,
            kind: VULKAN_OPAQUE_FD.into(),
            device: "00/00".into(),
        };
        assert_eq!(b.import_timeline(&vulkan).unwrap(), None);
        let closed = SharedTimeline {
            fd: -1,
            kind: DRM_SYNCOBJ_FD.into(),
            device: "amdxdna:x".into(),
        };
        let e = b.import_timeline(&closed).unwrap_err().to_string();
        assert!(e.contains("fd -1 is not an open file descriptor"), "{e}");
        // An open fd that is not a syncobj: the driver's refusal, named.
        let null = File::open("/dev/null").unwrap();
        let not_syncobj = SharedTimeline {
            fd: null.as_raw_fd(),
            ..closed
        };
        let e = b.import_timeline(&not_syncobj).unwrap_err().to_string();
        assert!(e.contains("DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE"), "{e}");
        // An id this backend never handed out.
        let copy = copy_program(&mut b);
        let e = b
            .execute_after(copy, &args(), &[(TimelineId(3), Ticket(1))])
            .unwrap_err()
            .to_string();
        assert!(e.contains("timeline 3 was not imported"), "{e}");
        assert!(events.lock().unwrap().is_empty());
    }

    #[test]
    fn a_wait_that_never_completes_times_out_naming_the_timeline_and_point() {
        let fa = FakeNpu::new();
        let kernel = fa.kernel.clone();
        let (mut a, _) = device_backend("tl-never-a", fa);
        let (mut b, events) = device_backend("tl-never-b", FakeNpu::sharing(&kernel));
        let shared = a.export_timeline().unwrap().unwrap();
        let id = b.import_timeline(&shared).unwrap().unwrap();
        close(shared);
        let (pb, _) = attention_program(&mut b);
        let start = Instant::now();
        // a never reaches ticket 5.
        let e = b
            .execute_after(pb, &args(), &[(id, Ticket(5))])
            .unwrap_err()
            .to_string();
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        let ev = events.lock().unwrap().clone();
        let [Event::HostWait {
            timeline: h,
            point: 5,
        }] = ev[..]
        else {
            panic!("{ev:?}")
        };
        assert!(
            e.contains(&format!("timeline {h} for point 5 timed out after 50ms")),
            "{e}"
        );
        // Nothing was dispatched and no ticket issued; the next step runs without the wait.
        assert_eq!(b.execute(pb, &args()).unwrap(), Ticket(1));
        let ev = events.lock().unwrap().clone();
        assert_eq!(ev[1..], [Event::Exec { ctx: 1 }]);
    }

    // ----- One chained submission per step -----

    /// Two attention layers (each with its own caches, the second windowed) over the same q,
    /// k, v inputs, each output written: the NPU's nodes of one step.
    fn two_layer_program(
        b: &mut DeviceBackend,
    ) -> (tandem_backend_api::ProgramId, [tandem_backend_api::BufferId; 2]) {
        let act = |b: &mut DeviceBackend, cols: usize, seed: usize| {
            let id = b
                .alloc(&TensorDesc::new(DType::F32, [4, cols]), Usage::Activation)
                .unwrap();
            let data: Vec<u8> = (0..4 * cols)
                .flat_map(|i| ((((i + seed) * 37 % 101) as f32 / 50.0 - 1.0) * 0.5).to_le_bytes())
                .collect();
            b.write(id, 0, &data).unwrap();
            id
        };
        let (qb, kb, vb) = (act(b, 32, 0), act(b, 16, 5), act(b, 16, 9));
        let mut g = GraphBuilder::new("two layers", 4, 4);
        let input = |g: &mut GraphBuilder, buffer, cols| {
            g.push1(Op::Input {
                buffer,
                cols,
                selected: false,
            })
        };
        let (q, k, v) = (
            input(&mut g, qb, 32),
            input(&mut g, kb, 16),
            input(&mut g, vb, 16),
        );
        let mut outs = Vec::new();
        for window in [None, Some(128)] {
            let cache = TensorDesc::new(DType::F32, [4, 512, 16]);
            let (kc, vc) = (
                b.alloc(&cache, Usage::KvCache).unwrap(),
                b.alloc(&cache, Usage::KvCache).unwrap(),
            );
            let a = g.push1(Op::Attention {
                q,
                k,
                v,
                cache: KvCacheRef {
                    k: kc,
                    v: vc,
                    dtype: DType::F32,
                    slots: 4,
                    capacity: 512,
                },
                heads: 2,
                kv_heads: 1,
                head_dim: 16,
                scale: 0.25,
                window,
                softcap: None,
                bidirectional_from: None,
            });
            let ob = b
                .alloc(&TensorDesc::new(DType::F32, [4, 32]), Usage::Activation)
                .unwrap();
            g.push(Op::Output { x: a, buffer: ob });
            outs.push(ob);
        }
        (b.compile(&g.finish()).unwrap(), [outs[0], outs[1]])
    }

    /// Runs the two-layer program once on `b`; its two outputs.
    fn run_two_layers(b: &mut DeviceBackend) -> Result<[Vec<u8>; 2], BackendError> {
        let (p, outs) = two_layer_program(b);
        b.execute(p, &args())?;
        Ok(outs.map(|o| {
            let mut bytes = vec![0u8; 4 * 32 * 4];
            b.read(o, 0, &mut bytes).unwrap();
            bytes
        }))
    }

    #[test]
    fn a_step_is_one_chained_submission_with_streams_built_at_compile() {
        let fake = FakeNpu::new();
        let log = fake.chains.clone();
        let (mut b, _) = device_backend("chain", fake);
        let (p, outs) = two_layer_program(&mut b);
        // Compiling loaded both phases' kernels: no submission yet, nothing loaded later.
        assert_eq!(log.lock().unwrap().submissions, 0);
        b.execute(p, &args()).unwrap();
        b.execute(p, &args()).unwrap();
        {
            let l = log.lock().unwrap();
            assert_eq!(l.submissions, 2, "one submission per step");
            assert_eq!(l.lengths, [2, 2], "both layers in each chain");
            // The decode kernel's stream, 3 words, per command.
            assert_eq!(l.stream_bytes, [12, 12, 12, 12]);
        }
        // In order and complete: each layer's output is the emulator's.
        let mut emu =
            DeviceBackend::with_executor(Box::new(crate::executor::EmuExecutor::new(&crate::cost::NPU4)));
        let want = run_two_layers(&mut emu).unwrap();
        for (o, w) in outs.iter().zip(&want) {
            let mut got = vec![0u8; w.len()];
            b.read(*o, 0, &mut got).unwrap();
            assert_eq!(&got, w);
        }
        assert_ne!(
            want[0], want[1],
            "the windowed layer differs, so order is checked"
        );
    }

    #[test]
    fn a_chains_staging_buffers_count_in_the_memory_held() {
        let (mut b, _) = device_backend("chain-bytes", FakeNpu::new());
        let (p, _) = two_layer_program(&mut b);
        let before = b.memory().unwrap().unwrap();
        b.execute(p, &args()).unwrap();
        let after = b.memory().unwrap().unwrap();
        // Two chain positions, each with params, q and out buffers of the 4 KiB minimum.
        assert_eq!(after.in_use_bytes - before.in_use_bytes, 2 * 3 * 4096);
        assert_eq!(after.peak_bytes, after.in_use_bytes);
        // A second step reuses them.
        b.execute(p, &args()).unwrap();
        assert_eq!(b.memory().unwrap().unwrap(), after);
    }

    #[test]
    fn a_failed_command_names_its_node_and_a_reset_loses_the_device() {
        let fake = FakeNpu::new();
        let log = fake.chains.clone();
        let (mut b, _) = device_backend("chain-fail", fake);
        let (p, _) = two_layer_program(&mut b);
        log.lock().unwrap().fail_at = Some(1);
        let e = b.execute(p, &args()).unwrap_err().to_string();
        // Nodes 0-2 are the inputs, 3 the first attention, 4 its output, 5 the second.
        assert!(
            e.contains("attention node 5") && e.contains("command 1 of a chain of 2"),
            "{e}"
        );
        // A failed command is the command's: the next step runs.
        let got = b.execute(p, &args());
        assert!(got.is_ok(), "{got:?}");
        let submitted = log.lock().unwrap().submissions;
        log.lock().unwrap().reset_at = Some(0);
        let e = b.execute(p, &args()).unwrap_err();
        assert!(matches!(e, BackendError::DeviceLost { .. }), "{e}");
        assert!(
            e.to_string().contains("attention node 3") && e.to_string().contains("reset"),
            "{e}"
        );
        // A reset loses the device: every later call answers the same error at once, and
        // nothing more is submitted to it.
        assert_eq!(b.execute(p, &args()).unwrap_err(), e);
        let cache = TensorDesc::new(DType::F32, [4, 512, 16]);
        assert_eq!(b.alloc(&cache, Usage::KvCache).unwrap_err(), e);
        assert_eq!(log.lock().unwrap().submissions, submitted + 1);
    }
}
