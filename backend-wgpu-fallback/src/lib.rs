//! tandem's portable wgpu backend.
//!
//! Not built yet: the plugin loads, and reports itself unavailable with the reason below, so
//! that `engine backends` and the placement can name it.

tandem_backend_api::export_unavailable_backend!(
    WgpuBackend,
    "wgpu",
    "the wgpu fallback backend is not built yet: it lands with the wgpu issue"
);
