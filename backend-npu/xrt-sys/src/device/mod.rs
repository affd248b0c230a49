//! The device interface the NPU backend codes against ([`NpuDevice`]), its handles, and
//! [`Amdxdna`], the implementation over the amdxdna uAPI.

mod amdxdna;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

pub use amdxdna::{Amdxdna, ExecFormat, DEV_HEAP_SIZE};

use crate::axlf::Xclbin;
use crate::detect::{detect, Detection, DeviceInfo};
use crate::error::XrtError;

/// A buffer object of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BoHandle(pub u32);

/// A hardware context (an xclbin's partition loaded with one kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContextHandle(pub u32);

/// A submitted run, to [`NpuDevice::wait`] on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunHandle(pub u64);

/// A timeline: a DRM timeline syncobj of the device's file (created or imported).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimelineHandle(pub u32);

/// One command of a chained submission: what [`NpuDevice::run`] takes for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainedRun<'a> {
    /// The instruction stream's buffer.
    pub instructions: BoHandle,
    /// Its length in u32 words.
    pub words: u32,
    /// Up to 5 data BOs, in order.
    pub args: &'a [BoHandle],
}

/// The most timelines one [`NpuDevice::wait_before`] takes (fixed arrays: no allocation).
pub const MAX_TIMELINE_WAITS: usize = 8;

/// What a buffer holds, which decides where the driver places it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BoKind {
    /// An instruction stream (XRT's `XCL_BO_FLAGS_CACHEABLE`, group 1): a device BO carved from
    /// the device heap, addressed by its device address.
    Instructions,
    /// Kernel data (XRT's `XCL_BO_FLAGS_HOST_ONLY`, group 3): a shared-memory BO the NPU reaches
    /// through the IOMMU.
    Data,
}

/// An NPU the backend can run kernels on.
pub trait NpuDevice: Send {
    /// What detection found about the device.
    fn info(&self) -> &DeviceInfo;

    /// Registers the xclbin and creates a hardware context that runs `kernel` (an IP_LAYOUT name).
    fn open_context(&mut self, xclbin: &Xclbin, kernel: &str) -> Result<ContextHandle, XrtError>;

    /// Destroys a hardware context (its unfinished runs are dropped with it).
    fn close_context(&mut self, ctx: ContextHandle) -> Result<(), XrtError>;

    /// Allocates a zero-filled buffer of at least `bytes` bytes.
    fn alloc(&mut self, kind: BoKind, bytes: usize) -> Result<BoHandle, XrtError>;

    /// CPU write then sync to the device.
    fn write(&mut self, bo: BoHandle, offset: usize, data: &[u8]) -> Result<(), XrtError>;

    /// Sync from the device then CPU read.
    fn read(&mut self, bo: BoHandle, offset: usize, out: &mut [u8]) -> Result<(), XrtError>;

    /// Releases a buffer (refused while an unfinished run uses it).
    fn free(&mut self, bo: BoHandle) -> Result<(), XrtError>;

    /// Starts `instructions` (`words` u32 words of an instruction stream) with up to 5 data BOs as arguments, in order.
    fn run(
        &mut self,
        ctx: ContextHandle,
        instructions: BoHandle,
        words: u32,
        args: &[BoHandle],
    ) -> Result<RunHandle, XrtError>;

    /// Waits for `run` to finish, at most `timeout`. A chain ([`NpuDevice::run_chain`]) whose
    /// command `i` failed answers [`XrtError::ChainCommandFailed`] with `index: i`.
    fn wait(&mut self, run: RunHandle, timeout: Duration) -> Result<(), XrtError>;

    /// Starts `commands` on `ctx` as one chained submission (`ERT_CMD_CHAIN`: one `EXEC_CMD`
    /// whose packet lists a command BO per entry), run in order; one [`NpuDevice::wait`] covers
    /// them all. Refused by default.
    fn run_chain(&mut self, ctx: ContextHandle, commands: &[ChainedRun<'_>]) -> Result<RunHandle, XrtError> {
        let _ = (ctx, commands);
        Err(XrtError::NotSupported {
            what: "chained submission",
        })
    }

    // Timelines (device-side boundaries). Each has a default that refuses, so a device that
    // does not share timelines need not implement them.

    /// Creates a timeline (a DRM timeline syncobj at 0).
    fn create_timeline(&mut self) -> Result<TimelineHandle, XrtError> {
        Err(XrtError::NotSupported {
            what: "timeline creation",
        })
    }

    /// A new file descriptor for timeline `t` (`DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD`), owned by the
    /// caller, that another DRM device's file can import.
    fn export_timeline(&mut self, t: TimelineHandle) -> Result<OwnedFd, XrtError> {
        let _ = t;
        Err(XrtError::NotSupported {
            what: "timeline export",
        })
    }

    /// Imports the timeline behind `fd` (`DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE`); `fd` stays the
    /// caller's.
    fn import_timeline(&mut self, fd: BorrowedFd<'_>) -> Result<TimelineHandle, XrtError> {
        let _ = fd;
        Err(XrtError::NotSupported {
            what: "timeline import",
        })
    }

    /// The device signals `t` at `point` once the commands submitted to `ctx` before this
    /// call have finished (`EXEC_CMD` of type `AMDXDNA_CMD_SUBMIT_SIGNAL`).
    fn signal_after(&mut self, ctx: ContextHandle, t: TimelineHandle, point: u64) -> Result<(), XrtError> {
        let _ = (ctx, t, point);
        Err(XrtError::NotSupported {
            what: "device-side timeline signal",
        })
    }

    /// Signals `t` at `point` from the host now (`DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL`).
    fn signal_now(&mut self, t: TimelineHandle, point: u64) -> Result<(), XrtError> {
        let _ = (t, point);
        Err(XrtError::NotSupported {
            what: "timeline signal",
        })
    }

    /// The commands submitted to `ctx` after this call start only once every timeline of
    /// `waits` has reached its point, on the device. At most [`MAX_TIMELINE_WAITS`]; waits at
    /// most `timeout` on the host for the points to be *submitted* (not signalled).
    fn wait_before(
        &mut self,
        ctx: ContextHandle,
        waits: &[(TimelineHandle, u64)],
        timeout: Duration,
    ) -> Result<(), XrtError> {
        let _ = (ctx, waits, timeout);
        Err(XrtError::NotSupported {
            what: "device-side timeline wait",
        })
    }

    /// Waits on the host until `t` reaches `point`, at most `timeout`
    /// ([`XrtError::TimelineTimeout`] after it).
    fn wait_timeline(&mut self, t: TimelineHandle, point: u64, timeout: Duration) -> Result<(), XrtError> {
        let _ = (t, point, timeout);
        Err(XrtError::NotSupported {
            what: "timeline wait",
        })
    }

    /// The value `t` has reached (`DRM_IOCTL_SYNCOBJ_QUERY`).
    fn timeline_value(&mut self, t: TimelineHandle) -> Result<u64, XrtError> {
        let _ = t;
        Err(XrtError::NotSupported {
            what: "timeline query",
        })
    }

    /// Releases a timeline handle of this device (exported fds stay valid).
    fn destroy_timeline(&mut self, t: TimelineHandle) -> Result<(), XrtError> {
        let _ = t;
        Err(XrtError::NotSupported {
            what: "timeline destruction",
        })
    }
}

/// A new descriptor, owned by the caller, for the open descriptor `fd` that someone else owns
/// (a `SharedTimeline`'s): what [`NpuDevice::import_timeline`] borrows. An error when `fd` is
/// not open.
pub fn dup_fd(fd: i32) -> Result<OwnedFd, XrtError> {
    crate::sys::dup_raw(fd).map_err(|errno| {
        XrtError::InvalidArgument(format!(
            "fd {fd} is not an open file descriptor ({})",
            std::io::Error::from_raw_os_error(errno)
        ))
    })
}

/// Detects NPUs under `root` (`/` on a real machine) and opens the first that opens.
pub fn open_first(root: &Path) -> Result<Amdxdna, XrtError> {
    let devices = match detect(root) {
        Detection::Found(devices) => devices,
        Detection::Unavailable(why) => return Err(why.into()),
    };
    let mut first_err = None;
    for info in devices {
        match Amdxdna::open(&info) {
            Ok(dev) => return Ok(dev),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Err(first_err.unwrap_or_else(|| XrtError::InvalidArgument("detection found no device".into())))
}
