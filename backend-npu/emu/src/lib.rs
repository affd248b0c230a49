//! The `npu-emu` backend plugin: tandem's NPU backend with its emulated executor, which runs the
//! NPU attention kernel's tiled arithmetic on the CPU and reports timings from the NPU cost
//! model. Everything is in `tandem-npu`; this crate only exports it under its own name.

tandem_backend_api::export_backend!(tandem_npu::NpuEmu);
