//! [`Amdxdna`]: [`NpuDevice`] over the amdxdna driver's ioctls, following the sequence XRT's
//! amdxdna shim (amd/xdna-driver `src/shim`) issues:
//!
//! * open: the accel node, a 64 MiB `DEV_HEAP` BO mapped at a 64 MiB-aligned address
//!   (`heap_page_size` in the shim; the firmware needs the alignment);
//! * per kernel: `CREATE_HWCTX` sized to the partition (columns x core rows, the partition's
//!   ops/cycle), the PDI in a `DEV` BO from the heap, `CONFIG_HWCTX(CONFIG_CU)` binding it;
//! * per buffer: instruction streams in `DEV` BOs (XRT's cacheable BOs), data in `SHMEM` BOs
//!   mapped into the process (the NPU reaches them by host address when the driver reports no
//!   device address), synced with `SYNC_BO`;
//! * per run: an ERT packet in a `CMD` BO, `EXEC_CMD`, then `SYNCOBJ_TIMELINE_WAIT` on the
//!   context's syncobj at the returned sequence number with an absolute `CLOCK_MONOTONIC`
//!   deadline, then the state the driver wrote into the packet header;
//! * timelines shared with other devices (device-side boundaries): DRM timeline syncobjs made
//!   with `SYNCOBJ_CREATE`, shared as fds with `SYNCOBJ_HANDLE_TO_FD` / `SYNCOBJ_FD_TO_HANDLE`;
//!   the device signals one after a context's commands with an `EXEC_CMD` of type
//!   `AMDXDNA_CMD_SUBMIT_SIGNAL`, and makes a context's next commands wait with
//!   `SYNCOBJ_TIMELINE_WAIT(WAIT_AVAILABLE)` then an `EXEC_CMD` of type
//!   `AMDXDNA_CMD_SUBMIT_DEPENDENCY` (the shim's `submit_wait_syncobjs`/`submit_signal_syncobj`);
//!   the host signals with `SYNCOBJ_TIMELINE_SIGNAL`, waits with `SYNCOBJ_TIMELINE_WAIT` and
//!   reads a value with `SYNCOBJ_QUERY`. None of this has run on an NPU; the dependency and
//!   signal command types are in the driver's uAPI header, but whether a given kernel's driver
//!   accepts them has not been checked on hardware (an `EINVAL` would name the call).

use std::collections::HashMap;
use std::fs::{self, File};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::time::Duration;

use super::{
    BoHandle, BoKind, ChainedRun, ContextHandle, NpuDevice, RunHandle, TimelineHandle, MAX_TIMELINE_WAITS,
};
use crate::axlf::{AxlfError, Xclbin};
use crate::detect::DeviceInfo;
use crate::error::XrtError;
use crate::ert::{self, CommandState};
use crate::sys::{self, Mapping};
use crate::uapi::*;

/// Size of the device heap (one `heap_page_size` of the shim), also its mapping alignment.
pub const DEV_HEAP_SIZE: usize = 64 << 20;
const CMD_BO_SIZE: usize = 4096;
const PAGE: usize = 4096;

/// Which ERT packet starts a kernel (see [`crate::ert`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecFormat {
    /// `ERT_START_CU` with the `MLIR_AIE` register map: what XRT sends for an xclbin kernel.
    #[default]
    StartCu,
    /// `ERT_START_NPU` with `ert_npu_data` (instruction buffer address and byte size).
    StartNpu,
}

/// Where the CPU reaches a BO.
#[derive(Debug)]
enum Host {
    /// Its own mapping (SHMEM and CMD BOs).
    Mapped(Mapping),
    /// Inside the device heap's mapping, at this offset (DEV BOs).
    Heap { offset: usize },
}

#[derive(Debug)]
struct Bo {
    handle: u32,
    kind: BoKind,
    /// Bytes the caller asked for (bounds of write/read).
    size: usize,
    host: Host,
    /// The address the NPU uses.
    dev_addr: u64,
}

#[derive(Debug)]
struct Heap {
    handle: u32,
    map: Mapping,
    dev_addr: u64,
}

#[derive(Debug)]
struct Context {
    handle: u32,
    syncobj: u32,
    pdi: Bo,
}

#[derive(Debug)]
struct CmdBo {
    handle: u32,
    map: Mapping,
}

#[derive(Debug)]
struct Run {
    ctx: u32,
    seq: u64,
    /// The submitted packet: a start packet, or a chain of `chained`.
    cmd: CmdBo,
    /// A chain's commands, in order (empty for a single run).
    chained: Vec<CmdBo>,
    uses: Vec<u32>,
}

impl Run {
    /// The command BOs' handles: the packet's, then a chain's commands'.
    fn handles(&self) -> Vec<u32> {
        std::iter::once(self.cmd.handle)
            .chain(self.chained.iter().map(|c| c.handle))
            .collect()
    }
}

/// An NPU opened through its amdxdna accel node. Dropping it releases runs, contexts,
/// buffers, the heap and the node, in that order.
#[derive(Debug)]
pub struct Amdxdna {
    info: DeviceInfo,
    exec_format: ExecFormat,
    core_rows: u32,
    next_run: u64,
    runs: HashMap<u64, Run>,
    idle_cmds: Vec<CmdBo>,
    contexts: HashMap<u32, Context>,
    bos: HashMap<u32, Bo>,
    /// Syncobjs this file holds (created or imported), destroyed on drop.
    timelines: Vec<u32>,
    heap: Option<Heap>,
    file: File,
}

fn ioctl_err(call: &'static str, errno: i32, context: impl Into<String>) -> XrtError {
    XrtError::Ioctl {
        call,
        errno,
        context: context.into(),
    }
}

/// What the packet header of run `run` says once its fence has signalled (`count` chained
/// commands, the failing one at `error_index`): `Ok` when it completed. A command the driver's
/// timeout handler caught (the hardware context hung: the scheduler stopped it, destroyed the
/// firmware context and restarted it; newer kernels mark the command `TIMEOUT`, the firmware
/// `NORESPONSE` where it could not reset), one whose context was destroyed under it (`ABORT`:
/// the mailbox channel closed with no response), and one the fence signalled without its state
/// ever leaving the host's (`NEW` ... `SUBMITTED`: older kernels drop a timed-out job's state)
/// are a reset: [`XrtError::DeviceReset`]. Any other state is the command's own failure.
pub(crate) fn finished(run: u64, state: CommandState, error_index: u32, count: u32) -> Result<(), XrtError> {
    match state {
        CommandState::Completed => Ok(()),
        CommandState::Timeout | CommandState::NoResponse | CommandState::Abort => {
            Err(XrtError::DeviceReset {
                what: format!("run {run} (its command finished in state {state})"),
            })
        }
        state if !state.is_final() => Err(XrtError::DeviceReset {
            what: format!("run {run} (its fence signalled with the command still in state {state})"),
        }),
        state if count > 0 => Err(XrtError::ChainCommandFailed {
            index: error_index,
            count,
            state,
        }),
        state => Err(XrtError::CommandFailed { state }),
    }
}

impl Amdxdna {
    /// Opens `info.node` (`O_RDWR | O_CLOEXEC`), queries the array shape and sets up the
    /// device heap. Takes the [`DeviceInfo`] by value or by reference.
    pub fn open(info: impl std::borrow::Borrow<DeviceInfo>) -> Result<Self, XrtError> {
        let info = info.borrow();
        let path = info.node.clone();
        let meta = fs::metadata(&path).map_err(|source| XrtError::Open {
            path: path.clone(),
            source,
        })?;
        if !meta.file_type().is_char_device() {
            return Err(XrtError::NotADevice { path });
        }
        let file = sys::open_rdwr_cloexec(&path).map_err(|source| match source.raw_os_error() {
            Some(libc::EBUSY) => XrtError::Busy { path: path.clone() },
            Some(libc::EACCES) | Some(libc::EPERM) => XrtError::Permission { path: path.clone() },
            _ => XrtError::Open {
                path: path.clone(),
                source,
            },
        })?;
        let core_rows = info.generation.rows();
        let mut dev = Self {
            info: info.clone(),
            exec_format: ExecFormat::default(),
            core_rows,
            next_run: 1,
            runs: HashMap::new(),
            idle_cmds: Vec::new(),
            contexts: HashMap::new(),
            bos: HashMap::new(),
            timelines: Vec::new(),
            heap: None,
            file,
        };
        if let Ok(meta) = dev.aie_metadata() {
            if meta.core.row_count > 0 {
                dev.core_rows = u32::from(meta.core.row_count);
            }
        }
        dev.heap = Some(dev.create_heap()?);
        Ok(dev)
    }

    /// The packet format runs use.
    pub fn exec_format(&self) -> ExecFormat {
        self.exec_format
    }

    /// Chooses the packet format runs use.
    pub fn set_exec_format(&mut self, format: ExecFormat) {
        self.exec_format = format;
    }

    /// Core-tile rows per column (from the driver's AIE metadata, else the generation's).
    pub fn core_rows(&self) -> u32 {
        self.core_rows
    }

    /// `DRM_AMDXDNA_QUERY_AIE_METADATA`: the array's shape as the firmware reports it.
    pub fn aie_metadata(&self) -> Result<amdxdna_drm_query_aie_metadata, XrtError> {
        let mut meta = amdxdna_drm_query_aie_metadata::default();
        let mut gi = amdxdna_drm_get_info {
            param: DRM_AMDXDNA_QUERY_AIE_METADATA,
            buffer_size: std::mem::size_of::<amdxdna_drm_query_aie_metadata>() as u32,
            buffer: &mut meta as *mut amdxdna_drm_query_aie_metadata as u64,
        };
        sys::ioctl(self.fd(), DRM_IOCTL_AMDXDNA_GET_INFO, &mut gi)
            .map_err(|e| ioctl_err("DRM_IOCTL_AMDXDNA_GET_INFO", e, "querying AIE metadata"))?;
        Ok(meta)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    fn gem_close(&self, handle: u32) {
        let mut arg = drm_gem_close { handle, pad: 0 };
        let _ = sys::ioctl(self.fd(), DRM_IOCTL_GEM_CLOSE, &mut arg);
    }

    /// `CREATE_BO` + `GET_BO_INFO`; closes the BO if the second fails.
    fn create_bo(
        &self,
        type_: u32,
        size: usize,
        what: &str,
    ) -> Result<(u32, amdxdna_drm_get_bo_info), XrtError> {
        let mut cb = amdxdna_drm_create_bo {
            size: size as u64,
            type_,
            ..Default::default()
        };
        sys::ioctl(self.fd(), DRM_IOCTL_AMDXDNA_CREATE_BO, &mut cb).map_err(|e| {
            ioctl_err(
                "DRM_IOCTL_AMDXDNA_CREATE_BO",
                e,
                format!("creating {what} ({size} bytes)"),
            )
        })?;
        let mut bi = amdxdna_drm_get_bo_info {
            handle: cb.handle,
            ..Default::default()
        };
        if let Err(e) = sys::ioctl(self.fd(), DRM_IOCTL_AMDXDNA_GET_BO_INFO, &mut bi) {
            self.gem_close(cb.handle);
            return Err(ioctl_err(
                "DRM_IOCTL_AMDXDNA_GET_BO_INFO",
                e,
                format!("querying {what}"),
            ));
        }
        Ok((cb.handle, bi))
    }

    fn create_heap(&self) -> Result<Heap, XrtError> {
        let (handle, bi) = self.create_bo(AMDXDNA_BO_DEV_HEAP, DEV_HEAP_SIZE, "the device heap")?;
        if bi.map_offset == AMDXDNA_INVALID_ADDR {
            self.gem_close(handle);
            return Err(XrtError::InvalidArgument(
                "the driver gave the device heap no mmap offset".into(),
            ));
        }
        match Mapping::shared_aligned(self.fd(), bi.map_offset, DEV_HEAP_SIZE, DEV_HEAP_SIZE) {
            Ok(map) => Ok(Heap {
                handle,
                map,
                dev_addr: bi.xdna_addr,
            }),
            Err(errno) => {
                self.gem_close(handle);
                Err(XrtError::Mmap {
                    what: "the device heap",
                    len: DEV_HEAP_SIZE,
                    errno,
                })
            }
        }
    }

    fn heap(&self) -> Result<&Heap, XrtError> {
        self.heap
            .as_ref()
            .ok_or_else(|| XrtError::InvalidArgument("the device heap is not set up".into()))
    }

    fn sync(&self, handle: u32, direction: u32, offset: usize, len: usize) -> Result<(), XrtError> {
        let mut s = amdxdna_drm_sync_bo {
            handle,
            direction,
            offset: offset as u64,
            size: len as u64,
        };
        sys::ioctl(self.fd(), DRM_IOCTL_AMDXDNA_SYNC_BO, &mut s).map_err(|e| {
            let dir = if direction == SYNC_DIRECT_TO_DEVICE {
                "to"
            } else {
                "from"
            };
            ioctl_err(
                "DRM_IOCTL_AMDXDNA_SYNC_BO",
                e,
                format!("syncing BO {handle} {dir} the device"),
            )
        })
    }

    /// Syncs `[offset, offset+len)` of `bo`: through the heap BO for a heap-resident BO.
    fn sync_bo(&self, bo: &Bo, direction: u32, offset: usize, len: usize) -> Result<(), XrtError> {
        match &bo.host {
            Host::Mapped(_) => self.sync(bo.handle, direction, offset, len),
            Host::Heap { offset: base } => {
                let heap = self.heap()?.handle;
                self.sync(heap, direction, base + offset, len)
            }
        }
    }

    fn host_write(&mut self, handle: u32, offset: usize, data: &[u8]) -> Result<(), XrtError> {
        let bo = self.bos.get_mut(&handle).ok_or(XrtError::InvalidHandle {
            kind: "buffer",
            handle: handle.into(),
        })?;
        let ok = match &mut bo.host {
            Host::Mapped(map) => map.write(offset, data),
            Host::Heap { offset: base } => match self.heap.as_mut() {
                Some(heap) => heap.map.write(*base + offset, data),
                None => false,
            },
        };
        ok.then_some(()).ok_or(XrtError::OutOfBounds {
            bo: handle,
            offset,
            len: data.len(),
            size: bo.size,
        })
    }

    fn host_read(&self, bo: &Bo, offset: usize, out: &mut [u8]) -> Result<(), XrtError> {
        let ok = match &bo.host {
            Host::Mapped(map) => map.read(offset, out),
            Host::Heap { offset: base } => self.heap()?.map.read(base + offset, out),
        };
        ok.then_some(()).ok_or(XrtError::OutOfBounds {
            bo: bo.handle,
            offset,
            len: out.len(),
            size: bo.size,
        })
    }

    /// A `DEV` BO carved from the heap, zero-filled.
    fn alloc_dev(&mut self, bytes: usize, kind: BoKind, what: &str) -> Result<Bo, XrtError> {
        let alloc = round_up(bytes)?;
        let (handle, bi) = self.create_bo(AMDXDNA_BO_DEV, alloc, what)?;
        let heap = self.heap()?;
        let offset = bi.xdna_addr.checked_sub(heap.dev_addr).map(|o| o as usize);
        let Some(offset) = offset.filter(|o| o.checked_add(alloc).is_some_and(|end| end <= heap.map.len()))
        else {
            self.gem_close(handle);
            return Err(XrtError::InvalidArgument(format!(
                "the driver placed {what} at device address {:#x}, outside the heap at {:#x}",
                bi.xdna_addr, heap.dev_addr
            )));
        };
        let bo = Bo {
            handle,
            kind,
            size: bytes,
            host: Host::Heap { offset },
            dev_addr: bi.xdna_addr,
        };
        let zeros = vec![0u8; alloc];
        let zeroed = self.heap.as_mut().is_some_and(|h| h.map.write(offset, &zeros));
        if !zeroed {
            self.gem_close(handle);
            return Err(XrtError::OutOfBounds {
                bo: handle,
                offset,
                len: alloc,
                size: alloc,
            });
        }
        Ok(bo)
    }

    /// A `SHMEM` BO mapped into the process.
    fn alloc_shmem(&self, bytes: usize) -> Result<Bo, XrtError> {
        let alloc = round_up(bytes)?;
        let (handle, bi) = self.create_bo(AMDXDNA_BO_SHMEM, alloc, "a data buffer")?;
        let map = match Mapping::shared(self.fd(), bi.map_offset, alloc) {
            Ok(map) => map,
            Err(errno) => {
                self.gem_close(handle);
                return Err(XrtError::Mmap {
                    what: "a data buffer",
                    len: alloc,
                    errno,
                });
            }
        };
        // No device address: the NPU uses the host address (shared virtual addressing).
        let dev_addr = if bi.xdna_addr == AMDXDNA_INVALID_ADDR {
            map.addr()
        } else {
            bi.xdna_addr
        };
        Ok(Bo {
            handle,
            kind: BoKind::Data,
            size: bytes,
            host: Host::Mapped(map),
            dev_addr,
        })
    }

    /// A command BO holding the start packet of one run (`ERT_START_CU` or `ERT_START_NPU`),
    /// its buffers added to `uses`.
    fn start_packet(
        &mut self,
        instructions: BoHandle,
        words: u32,
        args: &[BoHandle],
        uses: &mut Vec<u32>,
    ) -> Result<CmdBo, XrtError> {
        let instr = self.bo(instructions)?;
        if instr.kind != BoKind::Instructions {
            return Err(XrtError::InvalidArgument(format!(
                "buffer {} is not an instruction buffer",
                instructions.0
            )));
        }
        let bytes = words as usize * 4;
        if words == 0 || bytes > instr.size {
            return Err(XrtError::InvalidArgument(format!(
                "{words} instruction words do not fit instruction buffer {} of {} bytes",
                instructions.0, instr.size
            )));
        }
        if args.len() > ert::MAX_BO_ARGS {
            return Err(XrtError::InvalidArgument(format!(
                "{} buffer arguments; an NPU kernel takes at most {}",
                args.len(),
                ert::MAX_BO_ARGS
            )));
        }
        let instr_addr = instr.dev_addr;
        let mut addrs = Vec::with_capacity(args.len());
        if !uses.contains(&instructions.0) {
            uses.push(instructions.0);
        }
        for a in args {
            let b = self.bo(*a)?;
            if b.kind != BoKind::Data {
                return Err(XrtError::InvalidArgument(format!(
                    "argument buffer {} is not a data buffer",
                    a.0
                )));
            }
            addrs.push(b.dev_addr);
            if !uses.contains(&a.0) {
                uses.push(a.0);
            }
        }
        let packet = match self.exec_format {
            ExecFormat::StartCu => ert::start_cu_mlir_aie(0, instr_addr, words, &addrs),
            ExecFormat::StartNpu => ert::start_npu(0, instr_addr, bytes as u32, &addrs),
        }
        .map_err(|e| XrtError::InvalidArgument(e.to_string()))?;

        let mut cmd = self.command_bo()?;
        if !cmd.map.write(0, &ert::to_bytes(&packet)) {
            self.idle_cmds.push(cmd);
            return Err(XrtError::InvalidArgument(
                "the command packet does not fit its buffer".into(),
            ));
        }
        Ok(cmd)
    }

    /// Submits `cmd` (a start packet, or a chain listing `chained`) to `hwctx` and records the
    /// run.
    fn exec(
        &mut self,
        ctx: ContextHandle,
        hwctx: u32,
        cmd: CmdBo,
        mut chained: Vec<CmdBo>,
        uses: Vec<u32>,
    ) -> Result<RunHandle, XrtError> {
        let mut exec = amdxdna_drm_exec_cmd {
            hwctx,
            type_: AMDXDNA_CMD_SUBMIT_EXEC_BUF,
            cmd_handles: u64::from(cmd.handle),
            args: uses.as_ptr() as u64,
            cmd_count: 1,
            arg_count: uses.len() as u32,
            ..Default::default()
        };
        if let Err(e) = sys::ioctl(self.fd(), DRM_IOCTL_AMDXDNA_EXEC_CMD, &mut exec) {
            self.idle_cmds.push(cmd);
            self.idle_cmds.append(&mut chained);
            return Err(ioctl_err(
                "DRM_IOCTL_AMDXDNA_EXEC_CMD",
                e,
                format!("submitting to context {hwctx}"),
            ));
        }
        let id = self.next_run;
        self.next_run += 1;
        self.runs.insert(
            id,
            Run {
                ctx: ctx.0,
                seq: exec.seq,
                cmd,
                chained,
                uses,
            },
        );
        Ok(RunHandle(id))
    }

    fn command_bo(&mut self) -> Result<CmdBo, XrtError> {
        if let Some(cmd) = self.idle_cmds.pop() {
            return Ok(cmd);
        }
        let (handle, bi) = self.create_bo(AMDXDNA_BO_CMD, CMD_BO_SIZE, "a command buffer")?;
        match Mapping::shared(self.fd(), bi.map_offset, CMD_BO_SIZE) {
            Ok(map) => Ok(CmdBo { handle, map }),
            Err(errno) => {
                self.gem_close(handle);
                Err(XrtError::Mmap {
                    what: "a command buffer",
                    len: CMD_BO_SIZE,
                    errno,
                })
            }
        }
    }

    fn release_bo(&self, bo: Bo) {
        let handle = bo.handle;
        drop(bo); // unmaps first
        self.gem_close(handle);
    }

    fn destroy_context(&self, ctx: Context) -> Result<(), XrtError> {
        let mut d = amdxdna_drm_destroy_hwctx {
            handle: ctx.handle,
            pad: 0,
        };
        let r = sys::ioctl(self.fd(), DRM_IOCTL_AMDXDNA_DESTROY_HWCTX, &mut d).map_err(|e| {
            ioctl_err(
                "DRM_IOCTL_AMDXDNA_DESTROY_HWCTX",
                e,
                format!("destroying context {}", ctx.handle),
            )
        });
        self.release_bo(ctx.pdi);
        r
    }

    /// `DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT` on `handles` at `points` (the same length) with `flags`,
    /// for at most `timeout`; the errno where it fails (`ETIME` when the deadline passed).
    fn timeline_wait(
        &self,
        handles: &[u32],
        points: &[u64],
        flags: u32,
        timeout: Duration,
    ) -> Result<(), i32> {
        let budget = i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX);
        let mut w = drm_syncobj_timeline_wait {
            handles: handles.as_ptr() as u64,
            points: points.as_ptr() as u64,
            // An absolute CLOCK_MONOTONIC deadline (a relative value would already be past).
            timeout_nsec: sys::monotonic_ns().saturating_add(budget),
            count_handles: handles.len().min(points.len()) as u32,
            flags,
            ..Default::default()
        };
        sys::ioctl(self.fd(), DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT, &mut w)
    }

    fn bo(&self, handle: BoHandle) -> Result<&Bo, XrtError> {
        self.bos.get(&handle.0).ok_or(XrtError::InvalidHandle {
            kind: "buffer",
            handle: handle.0.into(),
        })
    }

    fn hwctx(&self, ctx: ContextHandle) -> Result<u32, XrtError> {
        self.contexts
            .get(&ctx.0)
            .map(|c| c.handle)
            .ok_or(XrtError::InvalidHandle {
                kind: "context",
                handle: ctx.0.into(),
            })
    }

    fn timeline(&self, t: TimelineHandle) -> Result<u32, XrtError> {
        self.timelines
            .contains(&t.0)
            .then_some(t.0)
            .ok_or(XrtError::InvalidHandle {
                kind: "timeline",
                handle: t.0.into(),
            })
    }

    fn syncobj_destroy(&self, handle: u32) -> Result<(), i32> {
        let mut d = drm_syncobj_destroy { handle, pad: 0 };
        sys::ioctl(self.fd(), DRM_IOCTL_SYNCOBJ_DESTROY, &mut d)
    }
}

fn round_up(bytes: usize) -> Result<usize, XrtError> {
    if bytes == 0 {
        return Err(XrtError::InvalidArgument("a buffer of 0 bytes".into()));
    }
    bytes
        .checked_add(PAGE - 1)
        .map(|n| n / PAGE * PAGE)
        .ok_or_else(|| XrtError::InvalidArgument(format!("a buffer of {bytes} bytes")))
}

impl NpuDevice for Amdxdna {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn open_context(&mut self, xclbin: &Xclbin, kernel: &str) -> Result<ContextHandle, XrtError> {
        let ip = xclbin.kernel(kernel).ok_or_else(|| XrtError::KernelNotFound {
            kernel: kernel.into(),
            available: xclbin.kernel_names(),
        })?;
        let part = xclbin
            .aie_partition()
            .ok_or(AxlfError::MissingSection("AIE_PARTITION"))?;
        let pdi = xclbin.pdi_for(ip).map_err(|reason| XrtError::NoPdi {
            kernel: kernel.into(),
            reason,
        })?;
        let image = xclbin.pdi_image(pdi);
        if image.is_empty() {
            return Err(XrtError::NoPdi {
                kernel: kernel.into(),
                reason: "its PDI image is empty".into(),
            });
        }
        let columns = u32::from(part.column_width);
        if columns == 0 || columns > self.info.generation.columns() {
            return Err(XrtError::InvalidArgument(format!(
                "the xclbin's partition is {columns} columns wide; this {} has {}",
                self.info.generation.name(),
                self.info.generation.columns()
            )));
        }
        let max_opc = if part.ops_per_cycle != 0 {
            part.ops_per_cycle
        } else {
            self.info.generation.ops_per_cycle_per_column() * columns
        };

        let qos = amdxdna_qos_info::default();
        let mut c = amdxdna_drm_create_hwctx {
            qos_p: &qos as *const amdxdna_qos_info as u64,
            max_opc,
            num_tiles: columns * self.core_rows,
            ..Default::default()
        };
        sys::ioctl(self.fd(), DRM_IOCTL_AMDXDNA_CREATE_HWCTX, &mut c).map_err(|e| {
            ioctl_err(
                "DRM_IOCTL_AMDXDNA_CREATE_HWCTX",
                e,
                format!("creating a {columns}-column context"),
            )
        })?;
        let destroy = |dev: &Self| {
            let mut d = amdxdna_drm_destroy_hwctx {
                handle: c.handle,
                pad: 0,
            };
            let _ = sys::ioctl(dev.fd(), DRM_IOCTL_AMDXDNA_DESTROY_HWCTX, &mut d);
        };

        let mut pdi_bo = match self.alloc_dev(image.len(), BoKind::Instructions, "the PDI") {
            Ok(bo) => bo,
            Err(e) => {
                destroy(self);
                return Err(e);
            }
        };
        let written = match (&pdi_bo.host, self.heap.as_mut()) {
            (Host::Heap { offset }, Some(heap)) => heap.map.write(*offset, image),
            _ => false,
        };
        let synced = if written {
            self.sync_bo(&pdi_bo, SYNC_DIRECT_TO_DEVICE, 0, image.len())
        } else {
            Err(XrtError::OutOfBounds {
                bo: pdi_bo.handle,
                offset: 0,
                len: image.len(),
                size: pdi_bo.size,
            })
        };
        if let Err(e) = synced {
            destroy(self);
            self.release_bo(pdi_bo);
            return Err(e);
        }
        pdi_bo.size = image.len();

        let mut cfg = ConfigCuOne {
            header: amdxdna_hwctx_param_config_cu {
                num_cus: 1,
                pad: [0; 3],
            },
            cu: amdxdna_cu_config {
                cu_bo: pdi_bo.handle,
                cu_func: ip.functional(),
                pad: [0; 3],
            },
        };
        let mut config = amdxdna_drm_config_hwctx {
            handle: c.handle,
            param_type: DRM_AMDXDNA_HWCTX_CONFIG_CU,
            param_val: &mut cfg as *mut ConfigCuOne as u64,
            param_val_size: std::mem::size_of::<ConfigCuOne>() as u32,
            pad: 0,
        };
        if let Err(e) = sys::ioctl(self.fd(), DRM_IOCTL_AMDXDNA_CONFIG_HWCTX, &mut config) {
            destroy(self);
            self.release_bo(pdi_bo);
            return Err(ioctl_err(
                "DRM_IOCTL_AMDXDNA_CONFIG_HWCTX",
                e,
                format!("binding the PDI of {kernel:?}"),
            ));
        }
        self.contexts.insert(
            c.handle,
            Context {
                handle: c.handle,
                syncobj: c.syncobj_handle,
                pdi: pdi_bo,
            },
        );
        Ok(ContextHandle(c.handle))
    }

    fn close_context(&mut self, ctx: ContextHandle) -> Result<(), XrtError> {
        let context = self.contexts.remove(&ctx.0).ok_or(XrtError::InvalidHandle {
            kind: "context",
            handle: ctx.0.into(),
        })?;
        let dead: Vec<u64> = self
            .runs
            .iter()
            .filter(|(_, r)| r.ctx == ctx.0)
            .map(|(id, _)| *id)
            .collect();
        let result = self.destroy_context(context);
        for id in dead {
            if let Some(run) = self.runs.remove(&id) {
                let handles = run.handles();
                drop(run);
                for handle in handles {
                    self.gem_close(handle);
                }
            }
        }
        result
    }

    fn alloc(&mut self, kind: BoKind, bytes: usize) -> Result<BoHandle, XrtError> {
        let bo = match kind {
            BoKind::Instructions => self.alloc_dev(bytes, kind, "an instruction buffer")?,
            BoKind::Data => self.alloc_shmem(bytes)?,
        };
        // Flush the (zeroed) lines so stale cache contents never reach the device.
        if let Err(e) = self.sync_bo(&bo, SYNC_DIRECT_TO_DEVICE, 0, bo.size) {
            self.release_bo(bo);
            return Err(e);
        }
        let handle = bo.handle;
        self.bos.insert(handle, bo);
        Ok(BoHandle(handle))
    }

    fn write(&mut self, bo: BoHandle, offset: usize, data: &[u8]) -> Result<(), XrtError> {
        let size = self.bo(bo)?.size;
        if offset.checked_add(data.len()).is_none_or(|end| end > size) {
            return Err(XrtError::OutOfBounds {
                bo: bo.0,
                offset,
                len: data.len(),
                size,
            });
        }
        if data.is_empty() {
            return Ok(());
        }
        self.host_write(bo.0, offset, data)?;
        self.sync_bo(self.bo(bo)?, SYNC_DIRECT_TO_DEVICE, offset, data.len())
    }

    fn read(&mut self, bo: BoHandle, offset: usize, out: &mut [u8]) -> Result<(), XrtError> {
        let b = self.bo(bo)?;
        if offset.checked_add(out.len()).is_none_or(|end| end > b.size) {
            return Err(XrtError::OutOfBounds {
                bo: bo.0,
                offset,
                len: out.len(),
                size: b.size,
            });
        }
        if out.is_empty() {
            return Ok(());
        }
        self.sync_bo(b, SYNC_DIRECT_FROM_DEVICE, offset, out.len())?;
        self.host_read(b, offset, out)
    }

    fn free(&mut self, bo: BoHandle) -> Result<(), XrtError> {
        self.bo(bo)?;
        if let Some((id, _)) = self.runs.iter().find(|(_, r)| r.uses.contains(&bo.0)) {
            return Err(XrtError::InvalidArgument(format!(
                "buffer {} is in use by unfinished run {id}",
                bo.0
            )));
        }
        if let Some(b) = self.bos.remove(&bo.0) {
            self.release_bo(b);
        }
        Ok(())
    }

    fn run(
        &mut self,
        ctx: ContextHandle,
        instructions: BoHandle,
        words: u32,
        args: &[BoHandle],
    ) -> Result<RunHandle, XrtError> {
        let hwctx = self.hwctx(ctx)?;
        let mut uses = Vec::new();
        let cmd = self.start_packet(instructions, words, args, &mut uses)?;
        // One command BO per EXEC_CMD; a step's several commands go through `run_chain`.
        self.exec(ctx, hwctx, cmd, Vec::new(), uses)
    }

    fn run_chain(&mut self, ctx: ContextHandle, commands: &[ChainedRun<'_>]) -> Result<RunHandle, XrtError> {
        let hwctx = self.hwctx(ctx)?;
        if commands.is_empty() {
            return Err(XrtError::InvalidArgument("an empty chain".into()));
        }
        let mut uses = Vec::new();
        let mut chained: Vec<CmdBo> = Vec::with_capacity(commands.len());
        for c in commands {
            match self.start_packet(c.instructions, c.words, c.args, &mut uses) {
                Ok(cmd) => chained.push(cmd),
                Err(e) => {
                    self.idle_cmds.append(&mut chained);
                    return Err(e);
                }
            }
        }
        let handles: Vec<u32> = chained.iter().map(|c| c.handle).collect();
        let packet = match ert::cmd_chain(&handles) {
            Ok(p) => p,
            Err(e) => {
                self.idle_cmds.append(&mut chained);
                return Err(XrtError::InvalidArgument(e.to_string()));
            }
        };
        let mut chain = match self.command_bo() {
            Ok(c) => c,
            Err(e) => {
                self.idle_cmds.append(&mut chained);
                return Err(e);
            }
        };
        if !chain.map.write(0, &ert::to_bytes(&packet)) {
            self.idle_cmds.push(chain);
            self.idle_cmds.append(&mut chained);
            return Err(XrtError::InvalidArgument(
                "the chain packet does not fit its command buffer".into(),
            ));
        }
        // The chained command BOs travel as arguments too, so the driver holds them.
        uses.extend(handles);
        self.exec(ctx, hwctx, chain, chained, uses)
    }

    fn wait(&mut self, run: RunHandle, timeout: Duration) -> Result<(), XrtError> {
        let r = self.runs.get(&run.0).ok_or(XrtError::InvalidHandle {
            kind: "run",
            handle: run.0,
        })?;
        let ctx = self.contexts.get(&r.ctx).ok_or(XrtError::InvalidHandle {
            kind: "context",
            handle: r.ctx.into(),
        })?;
        let (syncobj, point) = (ctx.syncobj, r.seq);
        match self.timeline_wait(
            &[syncobj],
            &[point],
            DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT,
            timeout,
        ) {
            Ok(()) => {}
            // The firmware may still hold the command: keep its buffer; wait may be retried.
            Err(libc::ETIME) => {
                return Err(XrtError::Timeout {
                    call: "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT",
                    after: timeout,
                })
            }
            Err(e) => {
                return Err(ioctl_err(
                    "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT",
                    e,
                    format!("waiting for run {}", run.0),
                ))
            }
        }
        let Some(done) = self.runs.remove(&run.0) else {
            return Err(XrtError::InvalidHandle {
                kind: "run",
                handle: run.0,
            });
        };
        let header = done.cmd.map.read_u32_volatile(0).unwrap_or(0);
        // A chain's `error_index` (word 3) names the command that failed.
        let error_index = done.cmd.map.read_u32_volatile(12).unwrap_or(0);
        let count = done.chained.len() as u32;
        self.idle_cmds.push(done.cmd);
        self.idle_cmds.extend(done.chained);
        finished(run.0, CommandState::from_header(header), error_index, count)
    }

    fn create_timeline(&mut self) -> Result<TimelineHandle, XrtError> {
        let mut c = drm_syncobj_create::default();
        sys::ioctl(self.fd(), DRM_IOCTL_SYNCOBJ_CREATE, &mut c)
            .map_err(|e| ioctl_err("DRM_IOCTL_SYNCOBJ_CREATE", e, "creating a timeline"))?;
        self.timelines.push(c.handle);
        Ok(TimelineHandle(c.handle))
    }

    fn export_timeline(&mut self, t: TimelineHandle) -> Result<OwnedFd, XrtError> {
        let mut h = drm_syncobj_handle {
            handle: self.timeline(t)?,
            fd: -1,
            ..Default::default()
        };
        sys::ioctl(self.fd(), DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD, &mut h).map_err(|e| {
            ioctl_err(
                "DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD",
                e,
                format!("exporting timeline {}", t.0),
            )
        })?;
        sys::owned_from_kernel(h.fd).ok_or_else(|| {
            XrtError::InvalidArgument(format!(
                "DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD returned fd {} for timeline {}",
                h.fd, t.0
            ))
        })
    }

    fn import_timeline(&mut self, fd: BorrowedFd<'_>) -> Result<TimelineHandle, XrtError> {
        let mut h = drm_syncobj_handle {
            fd: fd.as_raw_fd(),
            ..Default::default()
        };
        sys::ioctl(self.fd(), DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE, &mut h).map_err(|e| {
            ioctl_err(
                "DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE",
                e,
                format!("importing fd {} as a timeline", fd.as_raw_fd()),
            )
        })?;
        self.timelines.push(h.handle);
        Ok(TimelineHandle(h.handle))
    }

    fn signal_after(&mut self, ctx: ContextHandle, t: TimelineHandle, point: u64) -> Result<(), XrtError> {
        let hwctx = self.hwctx(ctx)?;
        let mut exec = amdxdna_drm_exec_cmd {
            hwctx,
            type_: AMDXDNA_CMD_SUBMIT_SIGNAL,
            // One syncobj and one point: the values themselves, not pointers.
            cmd_handles: u64::from(self.timeline(t)?),
            args: point,
            cmd_count: 1,
            arg_count: 1,
            ..Default::default()
        };
        sys::ioctl(self.fd(), DRM_IOCTL_AMDXDNA_EXEC_CMD, &mut exec).map_err(|e| {
            ioctl_err(
                "DRM_IOCTL_AMDXDNA_EXEC_CMD",
                e,
                format!(
                    "AMDXDNA_CMD_SUBMIT_SIGNAL of timeline {} at {point} on context {hwctx}",
                    t.0
                ),
            )
        })
    }

    fn signal_now(&mut self, t: TimelineHandle, point: u64) -> Result<(), XrtError> {
        let handle = self.timeline(t)?;
        let mut a = drm_syncobj_timeline_array {
            handles: &handle as *const u32 as u64,
            points: &point as *const u64 as u64,
            count_handles: 1,
            flags: 0,
        };
        sys::ioctl(self.fd(), DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL, &mut a).map_err(|e| {
            ioctl_err(
                "DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL",
                e,
                format!("signalling timeline {} at {point}", t.0),
            )
        })
    }

    fn wait_before(
        &mut self,
        ctx: ContextHandle,
        waits: &[(TimelineHandle, u64)],
        timeout: Duration,
    ) -> Result<(), XrtError> {
        if waits.is_empty() {
            return Ok(());
        }
        if waits.len() > MAX_TIMELINE_WAITS {
            return Err(XrtError::InvalidArgument(format!(
                "{} timeline waits; at most {MAX_TIMELINE_WAITS}",
                waits.len()
            )));
        }
        let hwctx = self.hwctx(ctx)?;
        // Fixed arrays: no allocation per submission.
        let mut handles = [0u32; MAX_TIMELINE_WAITS];
        let mut points = [0u64; MAX_TIMELINE_WAITS];
        for (i, (t, p)) in waits.iter().enumerate() {
            handles[i] = self.timeline(*t)?;
            points[i] = *p;
        }
        let n = waits.len() as u32;
        // The driver takes a dependency only on points that have a fence: wait (on the host)
        // until every point is submitted, not signalled.
        let flags = DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL
            | DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT
            | DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE;
        match self.timeline_wait(&handles[..waits.len()], &points[..waits.len()], flags, timeout) {
            Ok(()) => {}
            Err(e) => {
                let pairs: Vec<String> = waits
                    .iter()
                    .map(|(t, p)| format!("timeline {} point {p}", t.0))
                    .collect();
                return Err(ioctl_err(
                    "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT",
                    e,
                    format!(
                        "waiting at most {timeout:?} for {} to be submitted",
                        pairs.join(", ")
                    ),
                ));
            }
        }
        let mut exec = amdxdna_drm_exec_cmd {
            hwctx,
            type_: AMDXDNA_CMD_SUBMIT_DEPENDENCY,
            cmd_handles: handles.as_ptr() as u64,
            args: points.as_ptr() as u64,
            cmd_count: n,
            arg_count: n,
            ..Default::default()
        };
        sys::ioctl(self.fd(), DRM_IOCTL_AMDXDNA_EXEC_CMD, &mut exec).map_err(|e| {
            ioctl_err(
                "DRM_IOCTL_AMDXDNA_EXEC_CMD",
                e,
                format!("AMDXDNA_CMD_SUBMIT_DEPENDENCY on {n} timelines for context {hwctx}"),
            )
        })
    }

    fn wait_timeline(&mut self, t: TimelineHandle, point: u64, timeout: Duration) -> Result<(), XrtError> {
        let handle = self.timeline(t)?;
        match self.timeline_wait(
            &[handle],
            &[point],
            DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT,
            timeout,
        ) {
            Ok(()) => Ok(()),
            Err(libc::ETIME) => Err(XrtError::TimelineTimeout {
                timeline: t.0,
                point,
                after: timeout,
            }),
            Err(e) => Err(ioctl_err(
                "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT",
                e,
                format!("waiting for timeline {} to reach {point}", t.0),
            )),
        }
    }

    fn timeline_value(&mut self, t: TimelineHandle) -> Result<u64, XrtError> {
        let handle = self.timeline(t)?;
        let mut value = 0u64;
        let mut q = drm_syncobj_timeline_array {
            handles: &handle as *const u32 as u64,
            points: &mut value as *mut u64 as u64,
            count_handles: 1,
            flags: 0,
        };
        sys::ioctl(self.fd(), DRM_IOCTL_SYNCOBJ_QUERY, &mut q)
            .map_err(|e| ioctl_err("DRM_IOCTL_SYNCOBJ_QUERY", e, format!("reading timeline {}", t.0)))?;
        Ok(value)
    }

    fn destroy_timeline(&mut self, t: TimelineHandle) -> Result<(), XrtError> {
        let handle = self.timeline(t)?;
        self.timelines.retain(|h| *h != handle);
        self.syncobj_destroy(handle).map_err(|e| {
            ioctl_err(
                "DRM_IOCTL_SYNCOBJ_DESTROY",
                e,
                format!("destroying timeline {handle}"),
            )
        })
    }
}

impl Drop for Amdxdna {
    fn drop(&mut self) {
        let runs: Vec<Run> = self.runs.drain().map(|(_, r)| r).collect();
        for run in runs {
            let handles = run.handles();
            drop(run);
            for handle in handles {
                self.gem_close(handle);
            }
        }
        let idle: Vec<CmdBo> = self.idle_cmds.drain(..).collect();
        for cmd in idle {
            let handle = cmd.handle;
            drop(cmd);
            self.gem_close(handle);
        }
        let contexts: Vec<Context> = self.contexts.drain().map(|(_, c)| c).collect();
        for ctx in contexts {
            let _ = self.destroy_context(ctx);
        }
        for handle in std::mem::take(&mut self.timelines) {
            let _ = self.syncobj_destroy(handle);
        }
        let bos: Vec<Bo> = self.bos.drain().map(|(_, b)| b).collect();
        for bo in bos {
            self.release_bo(bo);
        }
        if let Some(heap) = self.heap.take() {
            let handle = heap.handle;
            drop(heap);
            self.gem_close(handle);
        }
        // `file` closes when the struct's fields drop, after this.
    }
}

#[cfg(test)]
mod tests;
