//! The host's side of device-side boundaries (`tandem_backend_api::boundary`): regions of host
//! memory that the units on both sides of a boundary import as buffers, and the closing of the
//! timeline handles that units export to each other. The only unsafe code of the scheduler.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr::NonNull;

use tandem_backend_api::{
    BackendError, BufferId, ComputeBackend, SharedTimeline, TensorDesc, HOST_IMPORT_ALIGN,
};

/// Zeroed host memory aligned to [`HOST_IMPORT_ALIGN`], a whole number of those long.
///
/// It has no `Drop`: a region is freed by [`HostRegion::free`] once every backend that
/// imported it has freed its buffer, and one dropped otherwise (a panic mid-build) is leaked,
/// never freed while a device may still use it.
pub struct HostRegion {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the region is plain memory owned by the scheduler, which is used by one thread at a
// time; the backends that imported it are driven by that same thread.
unsafe impl Send for HostRegion {}

impl HostRegion {
    /// A region of at least `bytes` bytes; `None` when the host has no memory for it.
    pub fn new(bytes: usize) -> Option<HostRegion> {
        let len = bytes.max(1).checked_next_multiple_of(HOST_IMPORT_ALIGN)?;
        let layout = Layout::from_size_align(len, HOST_IMPORT_ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(HostRegion { ptr, layout })
    }

    /// Imports the region into `backend` as a buffer for `desc` (`Unsupported` where the
    /// backend cannot: the caller copies through the host instead).
    pub fn import(
        &self,
        backend: &mut dyn ComputeBackend,
        desc: &TensorDesc,
    ) -> Result<BufferId, BackendError> {
        // SAFETY: the pointer is aligned to HOST_IMPORT_ALIGN and the length a multiple of it
        // (`new`); the memory stays allocated until `free`, which the scheduler calls only
        // after every backend has freed the buffers made here (`Scheduled::release`), and the
        // scheduler never reads or writes it through Rust references.
        unsafe { backend.import_host(self.ptr.as_ptr(), self.layout.size(), desc) }
    }

    /// Frees the region. Every buffer imported from it must have been freed.
    pub fn free(self) {
        // SAFETY: allocated in `new` with this layout, freed once (`self` is consumed); the
        // caller has freed every buffer that used it.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Closes the handle of a timeline that `export_timeline` gave (importers took their own).
pub fn close(timeline: SharedTimeline) {
    if timeline.fd >= 0 {
        // SAFETY: `export_timeline`'s contract makes its caller the owner of the descriptor,
        // and nothing else closes it: this takes it once and closes it on drop.
        drop(unsafe { OwnedFd::from_raw_fd(timeline.fd) });
    }
}
