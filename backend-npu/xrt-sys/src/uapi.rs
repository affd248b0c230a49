//! The Linux `amdxdna` accel driver's uAPI and the generic DRM ioctls it relies on, mirrored as
//! `#[repr(C)]` structs and request numbers.
//!
//! Layouts follow `include/uapi/drm/amdxdna_accel.h` (mainline since Linux 6.14; checked against
//! torvalds/linux and amd/xdna-driver, see the crate README) and `include/uapi/drm/drm.h`. Every
//! struct's size and field offsets are pinned by the tests at the bottom of this file against
//! values computed by hand from the C definitions.

#![allow(non_camel_case_types)]

// ---------------------------------------------------------------------------------------------
// <asm-generic/ioctl.h> encoding
// ---------------------------------------------------------------------------------------------

/// Bits of the ioctl number field (`_IOC_NRBITS`).
pub const IOC_NRBITS: u32 = 8;
/// Bits of the ioctl type field (`_IOC_TYPEBITS`).
pub const IOC_TYPEBITS: u32 = 8;
/// Bits of the ioctl size field (`_IOC_SIZEBITS`, asm-generic: x86, arm64, riscv).
pub const IOC_SIZEBITS: u32 = 14;
/// Shift of the number field (`_IOC_NRSHIFT`).
pub const IOC_NRSHIFT: u32 = 0;
/// Shift of the type field (`_IOC_TYPESHIFT`).
pub const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
/// Shift of the size field (`_IOC_SIZESHIFT`).
pub const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
/// Shift of the direction field (`_IOC_DIRSHIFT`).
pub const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
/// Direction: userspace writes the argument (`_IOC_WRITE`).
pub const IOC_WRITE: u32 = 1;
/// Direction: userspace reads the argument back (`_IOC_READ`).
pub const IOC_READ: u32 = 2;

/// `_IOC(dir, type, nr, size)`.
pub const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    (dir << IOC_DIRSHIFT) | ((size as u32) << IOC_SIZESHIFT) | ((ty as u32) << IOC_TYPESHIFT) | (nr as u32)
}

/// `_IOW(type, nr, T)`: userspace passes `T` to the kernel.
pub const fn iow<T>(ty: u8, nr: u8) -> u32 {
    ioc(IOC_WRITE, ty, nr, core::mem::size_of::<T>())
}

/// `_IOWR(type, nr, T)`: userspace passes `T`, the kernel writes it back.
pub const fn iowr<T>(ty: u8, nr: u8) -> u32 {
    ioc(IOC_READ | IOC_WRITE, ty, nr, core::mem::size_of::<T>())
}

/// The size field of an encoded request (`_IOC_SIZE(nr)`).
pub const fn ioc_size(request: u32) -> usize {
    ((request >> IOC_SIZESHIFT) & ((1 << IOC_SIZEBITS) - 1)) as usize
}

// ---------------------------------------------------------------------------------------------
// drm.h
// ---------------------------------------------------------------------------------------------

/// `DRM_IOCTL_BASE`: the ioctl type byte of every DRM request.
pub const DRM_IOCTL_BASE: u8 = b'd';
/// `DRM_COMMAND_BASE`: first driver-specific DRM ioctl number.
pub const DRM_COMMAND_BASE: u8 = 0x40;

/// `DRM_IOW(nr, T)`.
pub const fn drm_iow<T>(nr: u8) -> u32 {
    iow::<T>(DRM_IOCTL_BASE, nr)
}

/// `DRM_IOWR(nr, T)`.
pub const fn drm_iowr<T>(nr: u8) -> u32 {
    iowr::<T>(DRM_IOCTL_BASE, nr)
}

/// `struct drm_gem_close`: argument of `DRM_IOCTL_GEM_CLOSE`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct drm_gem_close {
    /// GEM handle to release.
    pub handle: u32,
    /// Must be zero.
    pub pad: u32,
}

/// `struct drm_syncobj_timeline_wait`: argument of `DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct drm_syncobj_timeline_wait {
    /// User pointer to an array of `count_handles` syncobj handles (`u32`).
    pub handles: u64,
    /// User pointer to an array of `count_handles` timeline points (`u64`).
    pub points: u64,
    /// Absolute `CLOCK_MONOTONIC` deadline in nanoseconds (not a relative timeout).
    pub timeout_nsec: i64,
    /// Number of handles/points.
    pub count_handles: u32,
    /// `DRM_SYNCOBJ_WAIT_FLAGS_*`.
    pub flags: u32,
    /// Returned: index of the first signaled handle (when not waiting for all).
    pub first_signaled: u32,
    /// Must be zero.
    pub pad: u32,
    /// Deadline hint for the backing fences (`DRM_SYNCOBJ_WAIT_FLAGS_WAIT_DEADLINE`), Linux 6.3+.
    pub deadline_nsec: u64,
}

/// `struct drm_syncobj_create`: argument of `DRM_IOCTL_SYNCOBJ_CREATE`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct drm_syncobj_create {
    /// Returned syncobj handle.
    pub handle: u32,
    /// `DRM_SYNCOBJ_CREATE_SIGNALED` or 0.
    pub flags: u32,
}

/// `struct drm_syncobj_destroy`: argument of `DRM_IOCTL_SYNCOBJ_DESTROY`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct drm_syncobj_destroy {
    /// Syncobj handle to release.
    pub handle: u32,
    /// Must be zero.
    pub pad: u32,
}

/// `struct drm_syncobj_handle`: argument of `DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD` and
/// `DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE`, in its original 16-byte form. Kernels from 2025 append a
/// `__u64 point` (used only with the `*_FLAGS_TIMELINE` sync_file flags); the DRM core
/// zero-fills what a shorter argument leaves out, so this form (point 0: the whole syncobj,
/// not a sync_file) means the same on old and new kernels.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct drm_syncobj_handle {
    /// The syncobj handle (in for `HANDLE_TO_FD`, returned by `FD_TO_HANDLE`).
    pub handle: u32,
    /// `DRM_SYNCOBJ_*_FLAGS_*`; 0 shares the syncobj itself.
    pub flags: u32,
    /// The file descriptor (returned by `HANDLE_TO_FD`, in for `FD_TO_HANDLE`).
    pub fd: i32,
    /// Must be zero.
    pub pad: u32,
}

/// `struct drm_syncobj_timeline_array`: argument of `DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL` and
/// `DRM_IOCTL_SYNCOBJ_QUERY`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct drm_syncobj_timeline_array {
    /// User pointer to an array of `count_handles` syncobj handles (`u32`).
    pub handles: u64,
    /// User pointer to an array of `count_handles` points (`u64`): the points to signal, or
    /// where `QUERY` writes each timeline's value.
    pub points: u64,
    /// Number of handles/points.
    pub count_handles: u32,
    /// `DRM_SYNCOBJ_QUERY_FLAGS_LAST_SUBMITTED` for `QUERY`; 0 for `TIMELINE_SIGNAL`.
    pub flags: u32,
}

/// `DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL`.
pub const DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL: u32 = 1 << 0;
/// `DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT`: wait for a fence to be attached to the point first.
pub const DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT: u32 = 1 << 1;
/// `DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE`.
pub const DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE: u32 = 1 << 2;

/// `DRM_IOCTL_SYNCOBJ_CREATE = DRM_IOWR(0xBF, struct drm_syncobj_create)`.
pub const DRM_IOCTL_SYNCOBJ_CREATE: u32 = drm_iowr::<drm_syncobj_create>(0xBF);
/// `DRM_IOCTL_SYNCOBJ_DESTROY = DRM_IOWR(0xC0, struct drm_syncobj_destroy)`.
pub const DRM_IOCTL_SYNCOBJ_DESTROY: u32 = drm_iowr::<drm_syncobj_destroy>(0xC0);
/// `DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD = DRM_IOWR(0xC1, struct drm_syncobj_handle)`.
pub const DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD: u32 = drm_iowr::<drm_syncobj_handle>(0xC1);
/// `DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE = DRM_IOWR(0xC2, struct drm_syncobj_handle)`.
pub const DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE: u32 = drm_iowr::<drm_syncobj_handle>(0xC2);
/// `DRM_IOCTL_SYNCOBJ_QUERY = DRM_IOWR(0xCB, struct drm_syncobj_timeline_array)`.
pub const DRM_IOCTL_SYNCOBJ_QUERY: u32 = drm_iowr::<drm_syncobj_timeline_array>(0xCB);
/// `DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL = DRM_IOWR(0xCD, struct drm_syncobj_timeline_array)`.
pub const DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL: u32 = drm_iowr::<drm_syncobj_timeline_array>(0xCD);
/// `DRM_IOCTL_GEM_CLOSE = DRM_IOW(0x09, struct drm_gem_close)`.
pub const DRM_IOCTL_GEM_CLOSE: u32 = drm_iow::<drm_gem_close>(0x09);
/// `DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT = DRM_IOWR(0xCA, struct drm_syncobj_timeline_wait)`.
pub const DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT: u32 = drm_iowr::<drm_syncobj_timeline_wait>(0xCA);

// ---------------------------------------------------------------------------------------------
// amdxdna_accel.h
// ---------------------------------------------------------------------------------------------

/// `AMDXDNA_INVALID_ADDR` (`~0UL`): "no address" in `amdxdna_drm_get_bo_info`.
pub const AMDXDNA_INVALID_ADDR: u64 = !0;
/// `AMDXDNA_INVALID_CTX_HANDLE`.
pub const AMDXDNA_INVALID_CTX_HANDLE: u32 = 0;
/// `AMDXDNA_INVALID_BO_HANDLE`.
pub const AMDXDNA_INVALID_BO_HANDLE: u32 = 0;

/// `enum amdxdna_drm_ioctl_id`: `DRM_AMDXDNA_CREATE_HWCTX`.
pub const DRM_AMDXDNA_CREATE_HWCTX: u8 = 0;
/// `DRM_AMDXDNA_DESTROY_HWCTX`.
pub const DRM_AMDXDNA_DESTROY_HWCTX: u8 = 1;
/// `DRM_AMDXDNA_CONFIG_HWCTX`.
pub const DRM_AMDXDNA_CONFIG_HWCTX: u8 = 2;
/// `DRM_AMDXDNA_CREATE_BO`.
pub const DRM_AMDXDNA_CREATE_BO: u8 = 3;
/// `DRM_AMDXDNA_GET_BO_INFO`.
pub const DRM_AMDXDNA_GET_BO_INFO: u8 = 4;
/// `DRM_AMDXDNA_SYNC_BO`.
pub const DRM_AMDXDNA_SYNC_BO: u8 = 5;
/// `DRM_AMDXDNA_EXEC_CMD`.
pub const DRM_AMDXDNA_EXEC_CMD: u8 = 6;
/// `DRM_AMDXDNA_GET_INFO`.
pub const DRM_AMDXDNA_GET_INFO: u8 = 7;
/// `DRM_AMDXDNA_SET_STATE`.
pub const DRM_AMDXDNA_SET_STATE: u8 = 8;
/// `DRM_AMDXDNA_GET_ARRAY` (= 10; driver interface 0.1+, not in the first 6.14 header).
pub const DRM_AMDXDNA_GET_ARRAY: u8 = 10;

/// `enum amdxdna_bo_type`: `AMDXDNA_BO_INVALID`.
pub const AMDXDNA_BO_INVALID: u32 = 0;
/// `AMDXDNA_BO_SHMEM` (later also named `AMDXDNA_BO_SHARE`): host memory shared with the NPU.
pub const AMDXDNA_BO_SHMEM: u32 = 1;
/// `AMDXDNA_BO_DEV_HEAP`: the per-process device heap that `AMDXDNA_BO_DEV` BOs are carved from.
pub const AMDXDNA_BO_DEV_HEAP: u32 = 2;
/// `AMDXDNA_BO_DEV`: a buffer inside the device heap.
pub const AMDXDNA_BO_DEV: u32 = 3;
/// `AMDXDNA_BO_CMD`: a command buffer (holds one ERT packet).
pub const AMDXDNA_BO_CMD: u32 = 4;

/// `SYNC_DIRECT_TO_DEVICE`.
pub const SYNC_DIRECT_TO_DEVICE: u32 = 0;
/// `SYNC_DIRECT_FROM_DEVICE`.
pub const SYNC_DIRECT_FROM_DEVICE: u32 = 1;

/// `enum amdxdna_cmd_type`: `AMDXDNA_CMD_SUBMIT_EXEC_BUF`.
pub const AMDXDNA_CMD_SUBMIT_EXEC_BUF: u32 = 0;
/// `AMDXDNA_CMD_SUBMIT_DEPENDENCY`.
pub const AMDXDNA_CMD_SUBMIT_DEPENDENCY: u32 = 1;
/// `AMDXDNA_CMD_SUBMIT_SIGNAL`.
pub const AMDXDNA_CMD_SUBMIT_SIGNAL: u32 = 2;

/// `enum amdxdna_drm_config_hwctx_param`: `DRM_AMDXDNA_HWCTX_CONFIG_CU`.
pub const DRM_AMDXDNA_HWCTX_CONFIG_CU: u32 = 0;
/// `DRM_AMDXDNA_HWCTX_ASSIGN_DBG_BUF`.
pub const DRM_AMDXDNA_HWCTX_ASSIGN_DBG_BUF: u32 = 1;
/// `DRM_AMDXDNA_HWCTX_REMOVE_DBG_BUF`.
pub const DRM_AMDXDNA_HWCTX_REMOVE_DBG_BUF: u32 = 2;

/// `enum amdxdna_drm_get_param`: `DRM_AMDXDNA_QUERY_AIE_STATUS`.
pub const DRM_AMDXDNA_QUERY_AIE_STATUS: u32 = 0;
/// `DRM_AMDXDNA_QUERY_AIE_METADATA`.
pub const DRM_AMDXDNA_QUERY_AIE_METADATA: u32 = 1;
/// `DRM_AMDXDNA_QUERY_AIE_VERSION`.
pub const DRM_AMDXDNA_QUERY_AIE_VERSION: u32 = 2;
/// `DRM_AMDXDNA_QUERY_CLOCK_METADATA`.
pub const DRM_AMDXDNA_QUERY_CLOCK_METADATA: u32 = 3;
/// `DRM_AMDXDNA_QUERY_SENSORS`.
pub const DRM_AMDXDNA_QUERY_SENSORS: u32 = 4;
/// `DRM_AMDXDNA_QUERY_HW_CONTEXTS`.
pub const DRM_AMDXDNA_QUERY_HW_CONTEXTS: u32 = 5;
/// `DRM_AMDXDNA_QUERY_FIRMWARE_VERSION`.
pub const DRM_AMDXDNA_QUERY_FIRMWARE_VERSION: u32 = 8;
/// `DRM_AMDXDNA_GET_POWER_MODE`.
pub const DRM_AMDXDNA_GET_POWER_MODE: u32 = 9;

/// `DRM_AMDXDNA_HW_CONTEXT_ALL`: `amdxdna_drm_get_array` parameter.
pub const DRM_AMDXDNA_HW_CONTEXT_ALL: u32 = 0;

/// `struct amdxdna_qos_info`: QoS hints for a hardware context.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_qos_info {
    /// Giga operations per second.
    pub gops: u32,
    /// Frames per second.
    pub fps: u32,
    /// DMA bandwidth.
    pub dma_bandwidth: u32,
    /// Frame response latency.
    pub latency: u32,
    /// Frame execution time.
    pub frame_exec_time: u32,
    /// Request priority.
    pub priority: u32,
}

/// `struct amdxdna_drm_create_hwctx`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_create_hwctx {
    /// Must be zero.
    pub ext: u64,
    /// Must be zero.
    pub ext_flags: u64,
    /// User pointer to a [`amdxdna_qos_info`].
    pub qos_p: u64,
    /// User-mode queue BO (0 on the kernel-mode-queue NPUs this crate drives).
    pub umq_bo: u32,
    /// Log buffer BO (0: none).
    pub log_buf_bo: u32,
    /// Maximum operations per cycle (the xclbin partition's `operations_per_cycle`).
    pub max_opc: u32,
    /// Number of AIE core tiles the context needs (columns x core rows).
    pub num_tiles: u32,
    /// Size of AIE tile memory (0: driver default).
    pub mem_size: u32,
    /// Returned doorbell offset of the UMQ.
    pub umq_doorbell: u32,
    /// Returned hardware context handle.
    pub handle: u32,
    /// Returned syncobj (timeline) handle signalled as commands complete.
    pub syncobj_handle: u32,
}

/// `struct amdxdna_drm_destroy_hwctx`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_destroy_hwctx {
    /// Hardware context handle.
    pub handle: u32,
    /// Must be zero.
    pub pad: u32,
}

/// `struct amdxdna_cu_config`: one compute unit of a hardware context.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_cu_config {
    /// BO holding the CU's configuration (the PDI image).
    pub cu_bo: u32,
    /// The CU's function (the IP_LAYOUT `m_functional` bits; 0 = DPU).
    pub cu_func: u8,
    /// Must be zero.
    pub pad: [u8; 3],
}

/// `struct amdxdna_hwctx_param_config_cu` header (followed in memory by `num_cus`
/// [`amdxdna_cu_config`]s; see [`ConfigCuOne`]).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_hwctx_param_config_cu {
    /// Number of CU configurations that follow.
    pub num_cus: u16,
    /// Must be zero.
    pub pad: [u16; 3],
}

/// `amdxdna_hwctx_param_config_cu` with exactly one trailing `amdxdna_cu_config`: the buffer
/// `DRM_AMDXDNA_HWCTX_CONFIG_CU` points at for a single-CU context.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ConfigCuOne {
    /// The flexible-array header (`num_cus` = 1).
    pub header: amdxdna_hwctx_param_config_cu,
    /// `cu_configs[0]`.
    pub cu: amdxdna_cu_config,
}

/// `struct amdxdna_drm_config_hwctx`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_config_hwctx {
    /// Hardware context handle.
    pub handle: u32,
    /// `DRM_AMDXDNA_HWCTX_*` parameter type.
    pub param_type: u32,
    /// User pointer to the parameter buffer (or a value).
    pub param_val: u64,
    /// Size of the parameter buffer (at most 4 KiB).
    pub param_val_size: u32,
    /// Must be zero.
    pub pad: u32,
}

/// `struct amdxdna_drm_create_bo`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_create_bo {
    /// Must be zero.
    pub flags: u64,
    /// User VA of the buffer (0: driver allocates).
    pub vaddr: u64,
    /// Size in bytes.
    pub size: u64,
    /// `AMDXDNA_BO_*` type.
    pub type_: u32,
    /// Returned GEM handle.
    pub handle: u32,
}

/// `struct amdxdna_drm_get_bo_info`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_get_bo_info {
    /// Must be zero.
    pub ext: u64,
    /// Must be zero.
    pub ext_flags: u64,
    /// GEM handle.
    pub handle: u32,
    /// Must be zero.
    pub pad: u32,
    /// Returned fake offset to `mmap` the BO at ([`AMDXDNA_INVALID_ADDR`] if not mappable).
    pub map_offset: u64,
    /// Returned user VA of the buffer (0 if it must be mapped).
    pub vaddr: u64,
    /// Returned device address ([`AMDXDNA_INVALID_ADDR`] when the NPU uses the host VA).
    pub xdna_addr: u64,
}

/// `struct amdxdna_drm_sync_bo`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_sync_bo {
    /// GEM handle.
    pub handle: u32,
    /// [`SYNC_DIRECT_TO_DEVICE`] or [`SYNC_DIRECT_FROM_DEVICE`].
    pub direction: u32,
    /// Offset in the BO.
    pub offset: u64,
    /// Bytes to sync.
    pub size: u64,
}

/// `struct amdxdna_drm_exec_cmd`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_exec_cmd {
    /// Must be zero.
    pub ext: u64,
    /// Must be zero.
    pub ext_flags: u64,
    /// Hardware context handle.
    pub hwctx: u32,
    /// `AMDXDNA_CMD_SUBMIT_*`.
    pub type_: u32,
    /// The command BO handle itself when `cmd_count` is 1, else a user pointer to an array.
    pub cmd_handles: u64,
    /// User pointer to `arg_count` BO handles (`u32`) the command uses.
    pub args: u64,
    /// Number of command handles.
    pub cmd_count: u32,
    /// Number of argument BO handles.
    pub arg_count: u32,
    /// Returned sequence number: the timeline point of the context's syncobj to wait on.
    pub seq: u64,
}

/// `struct amdxdna_drm_get_info`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_get_info {
    /// `DRM_AMDXDNA_QUERY_*` parameter.
    pub param: u32,
    /// In: size of the buffer; out: size written.
    pub buffer_size: u32,
    /// User pointer to the result structure.
    pub buffer: u64,
}

/// `struct amdxdna_drm_set_state` (same layout as [`amdxdna_drm_get_info`]).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_set_state {
    /// `DRM_AMDXDNA_SET_*` parameter.
    pub param: u32,
    /// Size of the input.
    pub buffer_size: u32,
    /// User pointer to the input.
    pub buffer: u64,
}

/// `struct amdxdna_drm_get_array`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_get_array {
    /// `DRM_AMDXDNA_HW_CONTEXT_ALL`, ...
    pub param: u32,
    /// In: maximum element size; out: actual element size.
    pub element_size: u32,
    /// In: maximum element count; out: actual count.
    pub num_element: u32,
    /// Must be zero.
    pub pad: u32,
    /// User pointer to the element array.
    pub buffer: u64,
}

/// `struct amdxdna_drm_query_aie_version`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_query_aie_version {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `struct amdxdna_drm_query_aie_tile_metadata`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_query_aie_tile_metadata {
    /// Number of rows of this tile kind.
    pub row_count: u16,
    /// First row of this tile kind.
    pub row_start: u16,
    /// DMA channels per tile.
    pub dma_channel_count: u16,
    /// Locks per tile.
    pub lock_count: u16,
    /// Event registers per tile.
    pub event_reg_count: u16,
    /// Padding.
    pub pad: [u16; 3],
}

/// `struct amdxdna_drm_query_aie_metadata` (`DRM_AMDXDNA_QUERY_AIE_METADATA`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_query_aie_metadata {
    /// Size of a column in bytes.
    pub col_size: u32,
    /// Total columns.
    pub cols: u16,
    /// Total rows.
    pub rows: u16,
    /// AIE hardware version.
    pub version: amdxdna_drm_query_aie_version,
    /// Core tiles.
    pub core: amdxdna_drm_query_aie_tile_metadata,
    /// Memory tiles.
    pub mem: amdxdna_drm_query_aie_tile_metadata,
    /// Shim tiles.
    pub shim: amdxdna_drm_query_aie_tile_metadata,
}

/// `struct amdxdna_drm_query_firmware_version` (`DRM_AMDXDNA_QUERY_FIRMWARE_VERSION`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct amdxdna_drm_query_firmware_version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
    /// Build.
    pub build: u32,
}

/// `DRM_IOCTL_AMDXDNA_CREATE_HWCTX`.
pub const DRM_IOCTL_AMDXDNA_CREATE_HWCTX: u32 =
    drm_iowr::<amdxdna_drm_create_hwctx>(DRM_COMMAND_BASE + DRM_AMDXDNA_CREATE_HWCTX);
/// `DRM_IOCTL_AMDXDNA_DESTROY_HWCTX`.
pub const DRM_IOCTL_AMDXDNA_DESTROY_HWCTX: u32 =
    drm_iowr::<amdxdna_drm_destroy_hwctx>(DRM_COMMAND_BASE + DRM_AMDXDNA_DESTROY_HWCTX);
/// `DRM_IOCTL_AMDXDNA_CONFIG_HWCTX`.
pub const DRM_IOCTL_AMDXDNA_CONFIG_HWCTX: u32 =
    drm_iowr::<amdxdna_drm_config_hwctx>(DRM_COMMAND_BASE + DRM_AMDXDNA_CONFIG_HWCTX);
/// `DRM_IOCTL_AMDXDNA_CREATE_BO`.
pub const DRM_IOCTL_AMDXDNA_CREATE_BO: u32 =
    drm_iowr::<amdxdna_drm_create_bo>(DRM_COMMAND_BASE + DRM_AMDXDNA_CREATE_BO);
/// `DRM_IOCTL_AMDXDNA_GET_BO_INFO`.
pub const DRM_IOCTL_AMDXDNA_GET_BO_INFO: u32 =
    drm_iowr::<amdxdna_drm_get_bo_info>(DRM_COMMAND_BASE + DRM_AMDXDNA_GET_BO_INFO);
/// `DRM_IOCTL_AMDXDNA_SYNC_BO`.
pub const DRM_IOCTL_AMDXDNA_SYNC_BO: u32 =
    drm_iowr::<amdxdna_drm_sync_bo>(DRM_COMMAND_BASE + DRM_AMDXDNA_SYNC_BO);
/// `DRM_IOCTL_AMDXDNA_EXEC_CMD`.
pub const DRM_IOCTL_AMDXDNA_EXEC_CMD: u32 =
    drm_iowr::<amdxdna_drm_exec_cmd>(DRM_COMMAND_BASE + DRM_AMDXDNA_EXEC_CMD);
/// `DRM_IOCTL_AMDXDNA_GET_INFO`.
pub const DRM_IOCTL_AMDXDNA_GET_INFO: u32 =
    drm_iowr::<amdxdna_drm_get_info>(DRM_COMMAND_BASE + DRM_AMDXDNA_GET_INFO);
/// `DRM_IOCTL_AMDXDNA_SET_STATE`.
pub const DRM_IOCTL_AMDXDNA_SET_STATE: u32 =
    drm_iowr::<amdxdna_drm_set_state>(DRM_COMMAND_BASE + DRM_AMDXDNA_SET_STATE);
/// `DRM_IOCTL_AMDXDNA_GET_ARRAY`.
pub const DRM_IOCTL_AMDXDNA_GET_ARRAY: u32 =
    drm_iowr::<amdxdna_drm_get_array>(DRM_COMMAND_BASE + DRM_AMDXDNA_GET_ARRAY);

/// Marks the argument types the ioctl wrapper in `sys` accepts: plain-old-data uAPI structs
/// whose every bit pattern is valid, so the kernel may write any bytes into them.
pub trait IoctlArg: Copy + private::Sealed {}

mod private {
    /// Seals [`super::IoctlArg`] to the structs of this module.
    pub trait Sealed {}
}

macro_rules! ioctl_args {
    ($($t:ty),* $(,)?) => {
        $(impl private::Sealed for $t {} impl IoctlArg for $t {})*
    };
}

ioctl_args!(
    drm_gem_close,
    drm_syncobj_timeline_wait,
    drm_syncobj_create,
    drm_syncobj_destroy,
    drm_syncobj_handle,
    drm_syncobj_timeline_array,
    amdxdna_drm_create_hwctx,
    amdxdna_drm_destroy_hwctx,
    amdxdna_drm_config_hwctx,
    amdxdna_drm_create_bo,
    amdxdna_drm_get_bo_info,
    amdxdna_drm_sync_bo,
    amdxdna_drm_exec_cmd,
    amdxdna_drm_get_info,
    amdxdna_drm_set_state,
    amdxdna_drm_get_array,
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    // _IOC(dir, 'd' = 0x64, nr, size) = dir << 30 | size << 16 | 0x64 << 8 | nr, with
    // dir = 3 for _IOWR and 1 for _IOW; sizes summed by hand from the C structs.
    #[test]
    fn request_numbers_match_the_headers() {
        assert_eq!(DRM_IOCTL_AMDXDNA_CREATE_HWCTX, 0xC038_6440); // 56 bytes, nr 0x40
        assert_eq!(DRM_IOCTL_AMDXDNA_DESTROY_HWCTX, 0xC008_6441); // 8 bytes
        assert_eq!(DRM_IOCTL_AMDXDNA_CONFIG_HWCTX, 0xC018_6442); // 24 bytes
        assert_eq!(DRM_IOCTL_AMDXDNA_CREATE_BO, 0xC020_6443); // 32 bytes
        assert_eq!(DRM_IOCTL_AMDXDNA_GET_BO_INFO, 0xC030_6444); // 48 bytes
        assert_eq!(DRM_IOCTL_AMDXDNA_SYNC_BO, 0xC018_6445); // 24 bytes
        assert_eq!(DRM_IOCTL_AMDXDNA_EXEC_CMD, 0xC038_6446); // 56 bytes
        assert_eq!(DRM_IOCTL_AMDXDNA_GET_INFO, 0xC010_6447); // 16 bytes
        assert_eq!(DRM_IOCTL_AMDXDNA_SET_STATE, 0xC010_6448); // 16 bytes
        assert_eq!(DRM_IOCTL_AMDXDNA_GET_ARRAY, 0xC018_644A); // 24 bytes, nr 0x4a
        assert_eq!(DRM_IOCTL_GEM_CLOSE, 0x4008_6409); // _IOW, 8 bytes, nr 0x09
        assert_eq!(DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT, 0xC030_64CA); // 48 bytes, nr 0xca
        assert_eq!(DRM_IOCTL_SYNCOBJ_CREATE, 0xC008_64BF); // 8 bytes, nr 0xbf
        assert_eq!(DRM_IOCTL_SYNCOBJ_DESTROY, 0xC008_64C0); // 8 bytes, nr 0xc0
        assert_eq!(DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD, 0xC010_64C1); // 16 bytes, nr 0xc1
        assert_eq!(DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE, 0xC010_64C2); // 16 bytes, nr 0xc2
        assert_eq!(DRM_IOCTL_SYNCOBJ_QUERY, 0xC018_64CB); // 24 bytes, nr 0xcb
        assert_eq!(DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL, 0xC018_64CD); // 24 bytes, nr 0xcd
    }

    #[test]
    fn ioc_helpers_decode_what_they_encode() {
        assert_eq!(ioc_size(DRM_IOCTL_AMDXDNA_EXEC_CMD), 56);
        assert_eq!(ioc_size(DRM_IOCTL_GEM_CLOSE), 8);
        assert_eq!(DRM_COMMAND_BASE, 0x40);
        assert_eq!(DRM_IOCTL_BASE, 0x64);
    }

    #[test]
    fn enum_values_match_the_headers() {
        assert_eq!(
            [
                DRM_AMDXDNA_CREATE_HWCTX,
                DRM_AMDXDNA_DESTROY_HWCTX,
                DRM_AMDXDNA_CONFIG_HWCTX,
                DRM_AMDXDNA_CREATE_BO,
                DRM_AMDXDNA_GET_BO_INFO,
                DRM_AMDXDNA_SYNC_BO,
                DRM_AMDXDNA_EXEC_CMD,
                DRM_AMDXDNA_GET_INFO,
                DRM_AMDXDNA_SET_STATE
            ],
            [0, 1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(
            [
                AMDXDNA_BO_INVALID,
                AMDXDNA_BO_SHMEM,
                AMDXDNA_BO_DEV_HEAP,
                AMDXDNA_BO_DEV,
                AMDXDNA_BO_CMD
            ],
            [0, 1, 2, 3, 4]
        );
        assert_eq!(DRM_AMDXDNA_QUERY_FIRMWARE_VERSION, 8);
        assert_eq!(DRM_AMDXDNA_HWCTX_CONFIG_CU, 0);
    }

    #[test]
    fn create_hwctx_layout() {
        assert_eq!(size_of::<amdxdna_drm_create_hwctx>(), 56);
        assert_eq!(offset_of!(amdxdna_drm_create_hwctx, ext), 0);
        assert_eq!(offset_of!(amdxdna_drm_create_hwctx, ext_flags), 8);
        assert_eq!(offset_of!(amdxdna_drm_create_hwctx, qos_p), 16);
        assert_eq!(offset_of!(amdxdna_drm_create_hwctx, umq_bo), 24);
        assert_eq!(offset_of!(amdxdna_drm_create_hwctx, log_buf_bo), 28);
        assert_eq!(offset_of!(amdxdna_drm_create_hwctx, max_opc), 32);
        assert_eq!(offset_of!(amdxdna_drm_create_hwctx, num_tiles), 36);
        assert_eq!(offset_of!(amdxdna_drm_create_hwctx, mem_size), 40);
        assert_eq!(offset_of!(amdxdna_drm_create_hwctx, umq_doorbell), 44);
        assert_eq!(offset_of!(amdxdna_drm_create_hwctx, handle), 48);
        assert_eq!(offset_of!(amdxdna_drm_create_hwctx, syncobj_handle), 52);
        assert_eq!(size_of::<amdxdna_qos_info>(), 24);
        assert_eq!(offset_of!(amdxdna_qos_info, priority), 20);
        assert_eq!(size_of::<amdxdna_drm_destroy_hwctx>(), 8);
    }

    #[test]
    fn config_hwctx_layout() {
        assert_eq!(size_of::<amdxdna_drm_config_hwctx>(), 24);
        assert_eq!(offset_of!(amdxdna_drm_config_hwctx, param_type), 4);
        assert_eq!(offset_of!(amdxdna_drm_config_hwctx, param_val), 8);
        assert_eq!(offset_of!(amdxdna_drm_config_hwctx, param_val_size), 16);
        assert_eq!(offset_of!(amdxdna_drm_config_hwctx, pad), 20);
        assert_eq!(size_of::<amdxdna_cu_config>(), 8);
        assert_eq!(offset_of!(amdxdna_cu_config, cu_func), 4);
        assert_eq!(size_of::<amdxdna_hwctx_param_config_cu>(), 8);
        // The flexible array starts right after the 8-byte header.
        assert_eq!(offset_of!(ConfigCuOne, cu), 8);
        assert_eq!(size_of::<ConfigCuOne>(), 16);
    }

    #[test]
    fn bo_layouts() {
        assert_eq!(size_of::<amdxdna_drm_create_bo>(), 32);
        assert_eq!(offset_of!(amdxdna_drm_create_bo, vaddr), 8);
        assert_eq!(offset_of!(amdxdna_drm_create_bo, size), 16);
        assert_eq!(offset_of!(amdxdna_drm_create_bo, type_), 24);
        assert_eq!(offset_of!(amdxdna_drm_create_bo, handle), 28);

        assert_eq!(size_of::<amdxdna_drm_get_bo_info>(), 48);
        assert_eq!(offset_of!(amdxdna_drm_get_bo_info, handle), 16);
        assert_eq!(offset_of!(amdxdna_drm_get_bo_info, pad), 20);
        assert_eq!(offset_of!(amdxdna_drm_get_bo_info, map_offset), 24);
        assert_eq!(offset_of!(amdxdna_drm_get_bo_info, vaddr), 32);
        assert_eq!(offset_of!(amdxdna_drm_get_bo_info, xdna_addr), 40);

        assert_eq!(size_of::<amdxdna_drm_sync_bo>(), 24);
        assert_eq!(offset_of!(amdxdna_drm_sync_bo, direction), 4);
        assert_eq!(offset_of!(amdxdna_drm_sync_bo, offset), 8);
        assert_eq!(offset_of!(amdxdna_drm_sync_bo, size), 16);
    }

    #[test]
    fn exec_and_info_layouts() {
        assert_eq!(size_of::<amdxdna_drm_exec_cmd>(), 56);
        assert_eq!(offset_of!(amdxdna_drm_exec_cmd, hwctx), 16);
        assert_eq!(offset_of!(amdxdna_drm_exec_cmd, type_), 20);
        assert_eq!(offset_of!(amdxdna_drm_exec_cmd, cmd_handles), 24);
        assert_eq!(offset_of!(amdxdna_drm_exec_cmd, args), 32);
        assert_eq!(offset_of!(amdxdna_drm_exec_cmd, cmd_count), 40);
        assert_eq!(offset_of!(amdxdna_drm_exec_cmd, arg_count), 44);
        assert_eq!(offset_of!(amdxdna_drm_exec_cmd, seq), 48);

        assert_eq!(size_of::<amdxdna_drm_get_info>(), 16);
        assert_eq!(offset_of!(amdxdna_drm_get_info, buffer), 8);
        assert_eq!(size_of::<amdxdna_drm_set_state>(), 16);
        assert_eq!(size_of::<amdxdna_drm_get_array>(), 24);
        assert_eq!(offset_of!(amdxdna_drm_get_array, buffer), 16);

        assert_eq!(size_of::<amdxdna_drm_query_aie_tile_metadata>(), 16);
        assert_eq!(size_of::<amdxdna_drm_query_aie_metadata>(), 64);
        assert_eq!(offset_of!(amdxdna_drm_query_aie_metadata, version), 8);
        assert_eq!(offset_of!(amdxdna_drm_query_aie_metadata, core), 16);
        assert_eq!(offset_of!(amdxdna_drm_query_aie_metadata, mem), 32);
        assert_eq!(offset_of!(amdxdna_drm_query_aie_metadata, shim), 48);
        assert_eq!(size_of::<amdxdna_drm_query_firmware_version>(), 16);
    }

    #[test]
    fn drm_layouts() {
        assert_eq!(size_of::<drm_gem_close>(), 8);
        assert_eq!(size_of::<drm_syncobj_timeline_wait>(), 48);
        assert_eq!(offset_of!(drm_syncobj_timeline_wait, points), 8);
        assert_eq!(offset_of!(drm_syncobj_timeline_wait, timeout_nsec), 16);
        assert_eq!(offset_of!(drm_syncobj_timeline_wait, count_handles), 24);
        assert_eq!(offset_of!(drm_syncobj_timeline_wait, flags), 28);
        assert_eq!(offset_of!(drm_syncobj_timeline_wait, first_signaled), 32);
        assert_eq!(offset_of!(drm_syncobj_timeline_wait, pad), 36);
        assert_eq!(offset_of!(drm_syncobj_timeline_wait, deadline_nsec), 40);
    }

    #[test]
    fn syncobj_layouts() {
        assert_eq!(size_of::<drm_syncobj_create>(), 8);
        assert_eq!(offset_of!(drm_syncobj_create, handle), 0);
        assert_eq!(offset_of!(drm_syncobj_create, flags), 4);
        assert_eq!(size_of::<drm_syncobj_destroy>(), 8);
        assert_eq!(offset_of!(drm_syncobj_destroy, pad), 4);
        assert_eq!(size_of::<drm_syncobj_handle>(), 16);
        assert_eq!(offset_of!(drm_syncobj_handle, handle), 0);
        assert_eq!(offset_of!(drm_syncobj_handle, flags), 4);
        assert_eq!(offset_of!(drm_syncobj_handle, fd), 8);
        assert_eq!(offset_of!(drm_syncobj_handle, pad), 12);
        assert_eq!(size_of::<drm_syncobj_timeline_array>(), 24);
        assert_eq!(offset_of!(drm_syncobj_timeline_array, handles), 0);
        assert_eq!(offset_of!(drm_syncobj_timeline_array, points), 8);
        assert_eq!(offset_of!(drm_syncobj_timeline_array, count_handles), 16);
        assert_eq!(offset_of!(drm_syncobj_timeline_array, flags), 20);
        // The request numbers carry these sizes.
        assert_eq!(ioc_size(DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD), 16);
        assert_eq!(ioc_size(DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL), 24);
        assert_eq!(
            [
                AMDXDNA_CMD_SUBMIT_EXEC_BUF,
                AMDXDNA_CMD_SUBMIT_DEPENDENCY,
                AMDXDNA_CMD_SUBMIT_SIGNAL
            ],
            [0, 1, 2]
        );
        assert_eq!(
            DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL
                | DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT
                | DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE,
            0b111
        );
    }
}
