//! tandem's Vulkan backend.
//!
//! Not built yet: the plugin loads, and reports itself unavailable with the reason below, so
//! that `engine backends` and the placement can name it.

tandem_backend_api::export_unavailable_backend!(
    VulkanBackend,
    "vulkan",
    "the Vulkan backend is not built yet: its kernels land with the Vulkan issue"
);
