//! tandem's runtime interface to AMD Ryzen AI NPUs (XDNA / XDNA2) through the Linux `amdxdna`
//! accel driver's uAPI, in pure Rust: no XRT, no C++ toolchain, nothing to install to build or
//! start.
//!
//! * [`uapi`]: the driver's ioctl structs and request numbers, mirrored from the kernel headers.
//! * [`axlf`]: a bounds-checked xclbin parser ([`Xclbin`]) and [`AxlfBuilder`] for tests.
//! * [`ert`]: the ERT command packets that start an NPU kernel.
//! * [`mod@detect`]: finding an NPU in sysfs and explaining why none is usable.
//! * [`device`]: the [`NpuDevice`] trait the backend codes against and [`Amdxdna`], its
//!   implementation over the ioctls (all `unsafe` lives in the private `sys` module).
//!
//! # What has and has not run on hardware
//!
//! **Nothing in this crate has run on an NPU.** It was written on machines without one. What
//! is tested here runs without hardware: the uAPI layouts and request numbers (against values
//! computed by hand from the headers), the xclbin parser (synthetic files, truncation at every
//! length, corrupted fields), the ERT packet encodings (byte for byte), detection over fake
//! sysfs trees, and the open path's errors on paths that are not NPU nodes. The ioctl sequence
//! in [`Amdxdna`] (heap, context, PDI binding, BOs, `EXEC_CMD`, syncobj wait) follows XRT's
//! amdxdna shim and a Rust implementation reported working on a Strix NPU (taconite), but here
//! it has only been compiled. So have the timeline calls (DRM syncobjs shared as fds, the
//! driver's signal and dependency commands): the backend tests them against a fake device.
//! See the crate's README for sources and open questions.

#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod axlf;
pub mod detect;
pub mod device;
mod error;
pub mod ert;
mod sys;
pub mod uapi;

pub use axlf::{AxlfBuilder, AxlfError, Xclbin};
pub use detect::{detect, Detection, DeviceInfo, Generation, PciId, Unavailable};
pub use device::{
    dup_fd, open_first, Amdxdna, BoHandle, BoKind, ChainedRun, ContextHandle, ExecFormat, NpuDevice,
    RunHandle, TimelineHandle, MAX_TIMELINE_WAITS,
};
pub use error::XrtError;
pub use ert::CommandState;
