//! Device-side boundaries between backends (ABI 3): what one backend shares so that another can
//! read its results and wait for them without the host copying or waiting in between.
//!
//! Two mechanisms, each optional (a backend that offers neither still runs split through the
//! host: `wait`, `read`, `write`, `execute`):
//! - **Shared host memory**: the engine allocates a [`HOST_IMPORT_ALIGN`]-aligned region and
//!   every backend on both sides of a boundary imports it as a buffer
//!   ([`ComputeBackend::import_host`](crate::ComputeBackend::import_host)); the producer's
//!   program writes the value there and the consumer's reads it, with no copy between them.
//! - **Shared timelines**: a backend exports its queue's timeline ([`SharedTimeline`], whose
//!   values are the backend's [`Ticket`](crate::Ticket)s), another imports it
//!   ([`TimelineId`]) and submits work that its device starts only once the timeline has
//!   reached a ticket
//!   ([`ComputeBackend::execute_after`](crate::ComputeBackend::execute_after)).

use serde::{Deserialize, Serialize};

/// The alignment of the start and the size of a region passed to
/// [`ComputeBackend::import_host`](crate::ComputeBackend::import_host): 64 KiB, a multiple of
/// every page size and of the import alignment Vulkan drivers ask for.
pub const HOST_IMPORT_ALIGN: usize = 64 << 10;

/// The most timelines one [`ComputeBackend::execute_after`](crate::ComputeBackend::execute_after)
/// waits on (a wait per other unit of a split): the plugin ABI and the backends pass them in
/// fixed arrays of this size, so a step's submission allocates nothing.
pub const MAX_WAITS: usize = 8;

/// Another backend's timeline, imported by this backend (see
/// [`ComputeBackend::import_timeline`](crate::ComputeBackend::import_timeline)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TimelineId(pub u64);

/// A backend's queue timeline as an operating-system handle, for another backend to import.
/// The timeline's value reaches a [`Ticket`](crate::Ticket)'s number when that execution (and
/// everything submitted before it) has finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedTimeline {
    /// The handle: a file descriptor that the caller of `export_timeline` owns and closes. An
    /// importer duplicates it and never closes this one.
    pub fd: i32,
    /// What the handle is: [`VULKAN_OPAQUE_FD`] (`vulkan_opaque_fd`, a Vulkan timeline
    /// semaphore exported with `VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT`) or
    /// [`DRM_SYNCOBJ_FD`] (`drm_syncobj_fd`, a DRM timeline syncobj exported with
    /// `DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD`).
    pub kind: String,
    /// The driver and device the handle belongs to (for Vulkan, `driverUUID` and `deviceUUID`
    /// in hex, joined by `/`): only a backend on the same driver and device can import it.
    pub device: String,
}

/// The handle kind of a Vulkan timeline semaphore exported as an opaque file descriptor.
pub const VULKAN_OPAQUE_FD: &str = "vulkan_opaque_fd";

/// The handle kind of a DRM timeline syncobj exported with `DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD`
/// (the NPU backend's): its points are the exporter's [`Ticket`](crate::Ticket)s. Syncobjs
/// belong to the DRM core, not to a driver: any DRM device's file descriptor can import the fd
/// with `DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE`, so [`SharedTimeline::device`] only says where it came
/// from.
pub const DRM_SYNCOBJ_FD: &str = "drm_syncobj_fd";
