//! The device interface the NPU backend codes against ([`NpuDevice`]), its handles, and
//! [`Amdxdna`], the implementation over the amdxdna uAPI.

mod amdxdna;

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

    /// Waits for `run` to finish, at most `timeout`.
    fn wait(&mut self, run: RunHandle, timeout: Duration) -> Result<(), XrtError>;
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
