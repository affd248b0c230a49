//! The crate's error type.

use std::path::PathBuf;
use std::time::Duration;

use crate::axlf::AxlfError;
use crate::detect::Unavailable;
use crate::ert::CommandState;

/// Everything that can go wrong talking to the NPU. Each variant names the call or the path
/// involved so the message alone tells a user what failed.
#[derive(Debug, thiserror::Error)]
pub enum XrtError {
    /// No usable NPU (from detection).
    #[error("no usable NPU: {0}")]
    Unavailable(#[from] Unavailable),

    /// The accel node could not be opened (missing, ...).
    #[error("cannot open NPU node {}: {source}", path.display())]
    Open {
        /// The node path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The path exists but is not a character device (so it is not an accel node).
    #[error("{} is not a character device; an NPU node is /dev/accel/accelN", path.display())]
    NotADevice {
        /// The path that was given.
        path: PathBuf,
    },

    /// The node refused a second opener (`EBUSY`).
    #[error(
        "NPU node {} is busy (EBUSY): another process holds it exclusively; close it and retry",
        path.display()
    )]
    Busy {
        /// The node path.
        path: PathBuf,
    },

    /// Not allowed to open the node (`EACCES`/`EPERM`).
    #[error(
        "permission denied opening NPU node {}: add your user to the group owning it \
         (usually `render`) or install a udev rule granting access",
        path.display()
    )]
    Permission {
        /// The node path.
        path: PathBuf,
    },

    /// An ioctl failed.
    #[error("{call} failed: {} (errno {errno}){}", std::io::Error::from_raw_os_error(*errno),
        if context.is_empty() { String::new() } else { format!(" while {context}") })]
    Ioctl {
        /// The request's name, e.g. `DRM_IOCTL_AMDXDNA_CREATE_BO`.
        call: &'static str,
        /// The `errno` it returned.
        errno: i32,
        /// What the call was for (may be empty).
        context: String,
    },

    /// `mmap` of a buffer failed.
    #[error("mmap of {what} ({len} bytes) failed: {}", std::io::Error::from_raw_os_error(*errno))]
    Mmap {
        /// Which buffer.
        what: &'static str,
        /// Length asked for.
        len: usize,
        /// The `errno`.
        errno: i32,
    },

    /// A wait ran past its deadline.
    #[error("{call} timed out after {after:?}: the command has not completed")]
    Timeout {
        /// The waiting call.
        call: &'static str,
        /// The timeout that was given.
        after: Duration,
    },

    /// A host wait on a timeline (syncobj) ran past its deadline.
    #[error(
        "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT on timeline {timeline} for point {point} timed out after \
         {after:?}: the point was not reached"
    )]
    TimelineTimeout {
        /// The syncobj handle.
        timeline: u32,
        /// The point waited for.
        point: u64,
        /// The timeout that was given.
        after: Duration,
    },

    /// The device (or this implementation of it) does not offer the call.
    #[error("{what} is not supported by this device")]
    NotSupported {
        /// What was asked for, e.g. `timeline export`.
        what: &'static str,
    },

    /// The command finished in a state other than `COMPLETED`.
    #[error("the NPU command finished in state {state}")]
    CommandFailed {
        /// The state read back from the command packet header.
        state: CommandState,
    },

    /// A command of a chained submission finished in a state other than `COMPLETED`; the
    /// commands before it completed, the ones after it did not run.
    #[error("command {index} of a chain of {count} finished in state {state}")]
    ChainCommandFailed {
        /// The failing command's index in the chain (the driver's `error_index`).
        index: u32,
        /// Commands in the chain.
        count: u32,
        /// The chain's state read back from its packet header.
        state: CommandState,
    },

    /// The device was reset (or lost its context) while a submission was in flight: the
    /// context must be created again before anything else runs on it.
    #[error("the NPU was reset while {what} was in flight")]
    DeviceReset {
        /// What was in flight.
        what: String,
    },

    /// The xclbin could not be parsed or lacks what the path needs.
    #[error("xclbin: {0}")]
    Axlf(#[from] AxlfError),

    /// The kernel asked for is not in the xclbin's IP_LAYOUT.
    #[error("kernel {kernel:?} is not in the xclbin (IP_LAYOUT has: {available:?})")]
    KernelNotFound {
        /// The name asked for.
        kernel: String,
        /// The names that exist.
        available: Vec<String>,
    },

    /// The xclbin has several PDIs and none is tied to the kernel.
    #[error("cannot choose a PDI for kernel {kernel:?}: {reason}")]
    NoPdi {
        /// The kernel name.
        kernel: String,
        /// Why.
        reason: String,
    },

    /// A handle this device did not hand out (or already released).
    #[error("unknown {kind} handle {handle}")]
    InvalidHandle {
        /// "buffer", "context" or "run".
        kind: &'static str,
        /// The raw handle.
        handle: u64,
    },

    /// A byte range outside a buffer.
    #[error("range [{offset}, {offset}+{len}) is outside buffer {bo} of {size} bytes")]
    OutOfBounds {
        /// The BO handle.
        bo: u32,
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// The buffer's size.
        size: usize,
    },

    /// An argument the call cannot accept.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl XrtError {
    /// Whether the device (or its hardware context) is gone for this process: a run that did
    /// not finish in time (a hung context), a reset the driver reported, or a call the driver
    /// refuses with `ENODEV` (the device was removed or its driver unbound). Nothing submitted
    /// to it can be trusted after that; the backend must be made again.
    pub fn is_device_lost(&self) -> bool {
        match self {
            XrtError::Timeout { .. } | XrtError::DeviceReset { .. } => true,
            XrtError::Ioctl { errno, .. } => *errno == libc::ENODEV,
            _ => false,
        }
    }
}
