//! tandem's AMD XDNA NPU backend.
//!
//! Not built yet: the plugin loads, and reports itself unavailable with the reason below, so
//! that `engine backends` and the placement can name it.

tandem_backend_api::export_unavailable_backend!(
    NpuBackend,
    "npu",
    "the NPU backend (XRT) is not built yet: it lands with the NPU issue"
);
