//! The C-level layout shared by plugins and the host. Changing anything here means bumping
//! [`ABI_VERSION`].

use std::ffi::c_void;

/// The first eight bytes of every descriptor.
pub const PLUGIN_MAGIC: [u8; 8] = *b"TANDEMBK";

/// The version of this C layout (descriptor and function table). 4 added
/// [`PluginVTable::estimate_decode`].
pub const ABI_VERSION: u32 = 4;

/// The symbol every plugin exports: `extern "C" fn() -> *const PluginDescriptor`.
pub const ENTRY_SYMBOL: &str = "tandem_backend_plugin";

/// The entry point's type.
pub type EntryFn = unsafe extern "C" fn() -> *const PluginDescriptor;

/// The backend-api version a plugin was built against (semver).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl ApiVersion {
    /// Whether a plugin built against `self` can be driven by a host built against `host`:
    /// same major and minor (0.x crates change their API in minor releases), any patch.
    pub fn compatible_with(self, host: ApiVersion) -> bool {
        self.major == host.major && self.minor == host.minor
    }
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The version of this crate, which every plugin embeds in its descriptor.
pub const API_VERSION: ApiVersion = ApiVersion {
    major: parse_u32(env!("CARGO_PKG_VERSION_MAJOR")),
    minor: parse_u32(env!("CARGO_PKG_VERSION_MINOR")),
    patch: parse_u32(env!("CARGO_PKG_VERSION_PATCH")),
};

const fn parse_u32(s: &str) -> u32 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut v = 0u32;
    while i < b.len() {
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    v
}

/// A borrowed UTF-8 string with static lifetime inside the plugin.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FfiStr {
    /// Start of the bytes.
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

impl FfiStr {
    /// Wraps a static string.
    pub const fn from_static(s: &'static str) -> Self {
        FfiStr {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }
}

/// Bytes allocated by the plugin and handed to the host, which copies them and gives them back
/// with [`PluginVTable::free_bytes`].
#[repr(C)]
#[derive(Debug)]
pub struct FfiBytes {
    /// Start of the allocation (null when empty).
    pub ptr: *mut u8,
    /// Bytes used.
    pub len: usize,
    /// Bytes allocated.
    pub cap: usize,
}

impl FfiBytes {
    /// An empty value for out-parameters.
    pub const EMPTY: FfiBytes = FfiBytes {
        ptr: std::ptr::null_mut(),
        len: 0,
        cap: 0,
    };
}

/// Step arguments as pointers and lengths.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FfiStepArgs {
    /// Token ids.
    pub tokens: *const u32,
    /// Number of token ids.
    pub n_tokens: usize,
    /// Positions.
    pub positions: *const u32,
    /// Number of positions.
    pub n_positions: usize,
    /// KV-cache slots.
    pub slots: *const u32,
    /// Number of slots.
    pub n_slots: usize,
    /// Selected rows.
    pub select: *const u32,
    /// Number of selected rows.
    pub n_select: usize,
}

/// One wait of `execute_after`: an imported timeline and the ticket it must reach.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FfiWait {
    /// The imported timeline's id.
    pub timeline: u64,
    /// The ticket (timeline value) to wait for.
    pub ticket: u64,
}

/// Status returned by every table function: success.
pub const STATUS_OK: i32 = 0;
/// Status returned by every table function: failure; the error is in the `err` out-parameter
/// as a JSON-encoded `BackendError`.
pub const STATUS_ERR: i32 = 1;

/// Opaque backend instance owned by the plugin.
pub type Handle = *mut c_void;

/// The function table. Every function taking `err` fills it (JSON `BackendError`) when it
/// returns [`STATUS_ERR`]. Structured inputs (`*_json`) are UTF-8 JSON of the backend-api
/// types; structured outputs go to `out` as JSON.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PluginVTable {
    /// Creates an instance from JSON `BackendOptions`.
    pub create: unsafe extern "C" fn(
        options_json: *const u8,
        options_len: usize,
        out: *mut Handle,
        err: *mut FfiBytes,
    ) -> i32,
    /// Destroys an instance.
    pub destroy: unsafe extern "C" fn(handle: Handle),
    /// Writes JSON `BackendInfo` to `out`.
    pub info: unsafe extern "C" fn(handle: Handle, out: *mut FfiBytes, err: *mut FfiBytes) -> i32,
    /// Reads a JSON `Op`, writes a JSON `Support`.
    pub supports: unsafe extern "C" fn(
        handle: Handle,
        op_json: *const u8,
        op_len: usize,
        out: *mut FfiBytes,
        err: *mut FfiBytes,
    ) -> i32,
    /// Reads a JSON `TensorDesc` and a `Usage` (0 weight, 1 kv cache, 2 activation).
    pub alloc: unsafe extern "C" fn(
        handle: Handle,
        desc_json: *const u8,
        desc_len: usize,
        usage: u32,
        out_id: *mut u64,
        err: *mut FfiBytes,
    ) -> i32,
    /// Copies `len` bytes from `data` into a buffer.
    pub write: unsafe extern "C" fn(
        handle: Handle,
        buffer: u64,
        offset: u64,
        data: *const u8,
        len: usize,
        err: *mut FfiBytes,
    ) -> i32,
    /// Copies `len` bytes from a buffer into `out`.
    pub read: unsafe extern "C" fn(
        handle: Handle,
        buffer: u64,
        offset: u64,
        out: *mut u8,
        len: usize,
        err: *mut FfiBytes,
    ) -> i32,
    /// Frees a buffer.
    pub free: unsafe extern "C" fn(handle: Handle, buffer: u64, err: *mut FfiBytes) -> i32,
    /// Compiles a JSON `Graph`.
    pub compile: unsafe extern "C" fn(
        handle: Handle,
        graph_json: *const u8,
        graph_len: usize,
        out_id: *mut u64,
        err: *mut FfiBytes,
    ) -> i32,
    /// Executes a program.
    pub execute: unsafe extern "C" fn(
        handle: Handle,
        program: u64,
        args: *const FfiStepArgs,
        out_ticket: *mut u64,
        err: *mut FfiBytes,
    ) -> i32,
    /// Waits for a ticket.
    pub wait: unsafe extern "C" fn(handle: Handle, ticket: u64, err: *mut FfiBytes) -> i32,
    /// Releases a program.
    pub release: unsafe extern "C" fn(handle: Handle, program: u64, err: *mut FfiBytes) -> i32,
    /// Writes the JSON `Vec<NodeTime>` of a program's last finished execution to `out`.
    pub profile:
        unsafe extern "C" fn(handle: Handle, program: u64, out: *mut FfiBytes, err: *mut FfiBytes) -> i32,
    /// Writes the JSON `Option<MemoryUse>` to `out`.
    pub memory: unsafe extern "C" fn(handle: Handle, out: *mut FfiBytes, err: *mut FfiBytes) -> i32,
    /// Measures a device copy; writes the JSON `Option<f64>` (bytes per second) to `out`.
    pub copy_bandwidth: unsafe extern "C" fn(handle: Handle, out: *mut FfiBytes, err: *mut FfiBytes) -> i32,
    /// Makes host memory a buffer for a JSON `TensorDesc` (ABI 3).
    pub import_host: unsafe extern "C" fn(
        handle: Handle,
        ptr: *mut u8,
        len: usize,
        desc_json: *const u8,
        desc_len: usize,
        out_id: *mut u64,
        err: *mut FfiBytes,
    ) -> i32,
    /// Writes the JSON `Option<SharedTimeline>` to `out` (ABI 3).
    pub export_timeline: unsafe extern "C" fn(handle: Handle, out: *mut FfiBytes, err: *mut FfiBytes) -> i32,
    /// Reads a JSON `SharedTimeline`, writes the JSON `Option<TimelineId>` (ABI 3).
    pub import_timeline: unsafe extern "C" fn(
        handle: Handle,
        timeline_json: *const u8,
        timeline_len: usize,
        out: *mut FfiBytes,
        err: *mut FfiBytes,
    ) -> i32,
    /// Executes a program once `n_waits` timelines have reached their tickets (ABI 3).
    pub execute_after: unsafe extern "C" fn(
        handle: Handle,
        program: u64,
        args: *const FfiStepArgs,
        waits: *const FfiWait,
        n_waits: usize,
        out_ticket: *mut u64,
        err: *mut FfiBytes,
    ) -> i32,
    /// Reads a JSON `CostQuery`, writes the JSON `Option<CostAnswer>` (ABI 4).
    pub estimate_decode: unsafe extern "C" fn(
        handle: Handle,
        query_json: *const u8,
        query_len: usize,
        out: *mut FfiBytes,
        err: *mut FfiBytes,
    ) -> i32,
    /// Gives back bytes the plugin allocated.
    pub free_bytes: unsafe extern "C" fn(bytes: FfiBytes),
}

/// What the entry point returns. The host reads `magic` and `abi_version` first and nothing
/// else when they do not match.
#[repr(C)]
#[derive(Debug)]
pub struct PluginDescriptor {
    /// [`PLUGIN_MAGIC`].
    pub magic: [u8; 8],
    /// [`ABI_VERSION`] of the plugin.
    pub abi_version: u32,
    /// [`API_VERSION`] of the plugin.
    pub api_version: ApiVersion,
    /// The backend's name.
    pub name: FfiStr,
    /// The function table.
    pub vtable: PluginVTable,
}

// SAFETY: a descriptor is immutable static data: `name` points to a `&'static str` and the
// table holds plain function pointers, so sharing it between threads is sound.
unsafe impl Sync for PluginDescriptor {}

/// Usage as passed through the table.
pub fn usage_to_u32(u: crate::Usage) -> u32 {
    match u {
        crate::Usage::Weight => 0,
        crate::Usage::KvCache => 1,
        crate::Usage::Activation => 2,
        crate::Usage::HostWeight => 3,
    }
}

/// The inverse of [`usage_to_u32`].
pub fn usage_from_u32(v: u32) -> Option<crate::Usage> {
    match v {
        0 => Some(crate::Usage::Weight),
        1 => Some(crate::Usage::KvCache),
        2 => Some(crate::Usage::Activation),
        3 => Some(crate::Usage::HostWeight),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_version_is_the_crate_version() {
        assert_eq!(API_VERSION.to_string(), env!("CARGO_PKG_VERSION"));
        let other = ApiVersion {
            patch: API_VERSION.patch + 1,
            ..API_VERSION
        };
        assert!(other.compatible_with(API_VERSION));
        let newer = ApiVersion {
            minor: API_VERSION.minor + 1,
            ..API_VERSION
        };
        assert!(!newer.compatible_with(API_VERSION));
    }

    #[test]
    fn usage_codes_round_trip() {
        for u in [
            crate::Usage::Weight,
            crate::Usage::KvCache,
            crate::Usage::Activation,
            crate::Usage::HostWeight,
        ] {
            assert_eq!(usage_from_u32(usage_to_u32(u)), Some(u));
        }
        assert_eq!(usage_from_u32(9), None);
    }
}
