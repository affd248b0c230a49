//! tandem's NPU backend, shared by two plugins:
//!
//! - `npu` ([`Npu`]): attention on an AMD Ryzen AI NPU (XDNA "npu1", XDNA2 "npu4" and later)
//!   through the amdxdna driver's uAPI (`xrt-sys`), with kernels built ahead of time from
//!   `shaders/npu/` and checked against their manifest. It has never run on an NPU: none was
//!   available. Without one it loads and says why (no driver, no device, no firmware, busy).
//! - `npu-emu` ([`NpuEmu`]): the same backend with the emulator as its executor: the kernels'
//!   tiled bf16 arithmetic on the CPU ([`emu`]) and timings from the cost model ([`cost`]).
//!
//! Both import the engine's shared host memory at a split's boundaries; `npu` also shares its
//! timeline as a DRM syncobj and waits on other backends' (see [`backend`]). That device-side
//! path has been tested against a fake device only, never on an NPU.
//!
//! Modules, bottom up: [`contract`] (the kernel ABI), [`emu`], [`cost`], [`artefacts`],
//! [`executor`] (the executor trait and the emulator's), [`device`] (the device executor),
//! [`estimate`] (the answer to `ComputeBackend::estimate_decode`, which the engine's `auto`
//! asks), [`backend`] (`ComputeBackend`), [`sim`] (the per-op laptop roofline). [`params`]
//! (every calibrated parameter with its source) and [`calibration`] (the model fitted to
//! published XDNA2 figures and the placements it ranks, which `npu-sim` prints) live in
//! `tandem-npu-model`, pure arithmetic, and are re-exported here.

pub mod artefacts;
pub mod backend;
pub mod contract;
pub mod cost;
pub mod device;
pub mod emu;
pub mod estimate;
pub mod executor;
pub mod sim;

pub use tandem_npu_model::{calibration, params};

use tandem_backend_api::{BackendError, BackendOptions};

use crate::backend::{Flavor, NpuBackend};
use crate::executor::{EmuExecutor, Executor};

/// The `npu-emu` flavour: always the emulator.
pub struct Emulated;

/// The `npu` flavour: the device, or the emulator when `[backend.npu] executor = "emu"`.
pub struct Device;

/// The cost model named by the `generation` option (default `npu4`).
fn model(options: &BackendOptions) -> Result<&'static cost::NpuModel, BackendError> {
    let g = options.get("generation").unwrap_or("npu4");
    cost::model(g).ok_or_else(|| {
        BackendError::invalid(format!(
            "backend option 'generation': '{g}' is not an NPU generation (npu1, npu4, npu5, npu6)"
        ))
    })
}

impl Flavor for Emulated {
    const NAME: &'static str = "npu-emu";

    fn executor(options: &BackendOptions) -> Result<Box<dyn Executor>, BackendError> {
        Ok(Box::new(EmuExecutor::new(model(options)?)))
    }
}

impl Flavor for Device {
    const NAME: &'static str = "npu";

    fn executor(options: &BackendOptions) -> Result<Box<dyn Executor>, BackendError> {
        match options.get("executor") {
            Some("emu") => Ok(Box::new(EmuExecutor::new(model(options)?))),
            Some("device") | None => device_executor(options),
            Some(other) => Err(BackendError::invalid(format!(
                "backend option 'executor': '{other}' is neither 'device' nor 'emu'"
            ))),
        }
    }
}

/// The device executor for `options`: detection under `root` (default `/`; a fake sysfs tree in
/// tests), the artefacts for the device's generation, then the device opened; each missing
/// piece an `Unavailable` error saying what to do.
fn device_executor(options: &BackendOptions) -> Result<Box<dyn Executor>, BackendError> {
    let unavailable = |reason: String| BackendError::Unavailable { reason };
    let root = std::path::PathBuf::from(options.get("root").unwrap_or("/"));
    let info = match xrt_sys::detect::detect(&root) {
        xrt_sys::detect::Detection::Found(mut found) if !found.is_empty() => found.remove(0),
        xrt_sys::detect::Detection::Found(_) => return Err(unavailable("no AMD NPU found".into())),
        xrt_sys::detect::Detection::Unavailable(why) => return Err(unavailable(why.to_string())),
    };
    let generation = info.generation.name();
    let dir = artefacts::locate(options.get("artefacts"), generation).ok_or_else(|| {
        unavailable("no NPU kernel artefacts: set [backend.npu] artefacts or TANDEM_NPU_ARTEFACTS".into())
    })?;
    let found = artefacts::Artefacts::open(&dir, generation).map_err(|e| {
        unavailable(format!(
            "NPU {generation} found ({}), but {e}",
            info.node.display()
        ))
    })?;
    let timeout = match options.parse::<u64>("timeout_ms")? {
        Some(0) => {
            return Err(BackendError::invalid(
                "backend option 'timeout_ms' must be at least 1",
            ))
        }
        Some(ms) => std::time::Duration::from_millis(ms),
        None => executor::DEFAULT_TIMEOUT,
    };
    let device = xrt_sys::device::Amdxdna::open(&info).map_err(|e| unavailable(e.to_string()))?;
    Ok(Box::new(device::DeviceExecutor::new(device, found, timeout)))
}

/// The `npu` backend.
pub type Npu = NpuBackend<Device>;
/// The `npu-emu` backend.
pub type NpuEmu = NpuBackend<Emulated>;
