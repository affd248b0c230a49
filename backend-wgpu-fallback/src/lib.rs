//! tandem's portable wgpu backend
