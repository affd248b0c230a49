//! The `npu` backend plugin: attention on an AMD Ryzen AI NPU (XDNA, XDNA2) through the amdxdna
//! driver. Everything is in `tandem-npu`; this crate only exports it. Without an NPU (every
//! machine tandem has been tested on), the plugin loads and says why the device is unavailable.

tandem_backend_api::export_backend!(tandem_npu::Npu);
