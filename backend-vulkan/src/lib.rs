//! tandem's Vulkan backend
