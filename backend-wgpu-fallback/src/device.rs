//! The adapter and device: choice across wgpu's backends (overridable by options), the limits
//! and features read from the adapter, and the error sinks (wgpu's own validation errors, the
//! Vulkan validation layer's messages when asked for, device loss) that every call checks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tandem_backend_api::{BackendError, BackendOptions, DeviceKind, MEMORY_LIMIT};
use tandem_gpu_kit::options::{flag, setting};

use crate::cache_file::{self, Identity, Mode};
use crate::kernels::Variant;

/// Environment variable choosing the adapter (an index into `engine backends`' listing order
/// or a name substring), like the `adapter` option.
pub const ADAPTER_VAR: &str = "TANDEM_WGPU_ADAPTER";
/// Environment variable restricting wgpu's backends (`vulkan,metal,dx12,gl`).
pub const BACKENDS_VAR: &str = "TANDEM_WGPU_BACKENDS";
/// Environment variable turning on the graphics API's validation layer.
pub const VALIDATION_VAR: &str = "TANDEM_WGPU_VALIDATION";
/// Environment variable choosing the kernel variants, like the `features` option.
pub const FEATURES_VAR: &str = "TANDEM_WGPU_FEATURES";
/// The environment variable behind option `precision` (`exact` or `fast`).
pub const PRECISION_VAR: &str = "TANDEM_WGPU_PRECISION";

/// The optional features the kernels may use, by name (`features` option).
pub const FEATURE_NAMES: [&str; 4] = ["subgroups", "f16", "coopmat", "int_dot"];

/// Which kernel variants the options ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureRequest {
    /// Every variant the adapter offers the feature for (the default).
    Auto,
    /// Exactly these (an error where the adapter lacks one); `Variant::PORTABLE` for `portable`.
    Exactly(Variant),
}

/// Parses a `features` value: `auto`, `portable`, or a list of [`FEATURE_NAMES`].
pub fn parse_features(value: &str) -> Result<FeatureRequest, BackendError> {
    let v = value.trim().to_ascii_lowercase();
    match v.as_str() {
        "" | "auto" => return Ok(FeatureRequest::Auto),
        "portable" | "none" => return Ok(FeatureRequest::Exactly(Variant::PORTABLE)),
        _ => {}
    }
    let mut variant = Variant::PORTABLE;
    for name in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match name {
            "subgroups" | "subgroup" => variant.subgroups = true,
            "f16" | "shader_f16" => variant.f16 = true,
            "coopmat" | "cooperative_matrix" => variant.coopmat = true,
            "int_dot" | "dot4" | "packed_4x8_integer_dot_product" => variant.int_dot = true,
            other => {
                return Err(BackendError::invalid(format!(
                    "backend option 'features': unknown feature '{other}' (auto, portable, or a list of {})",
                    FEATURE_NAMES.join(", ")
                )))
            }
        }
    }
    Ok(FeatureRequest::Exactly(variant))
}

/// What the options ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// An adapter index or a name substring.
    pub adapter: Option<String>,
    /// wgpu backends to consider.
    pub backends: wgpu::Backends,
    /// The API's validation layer, any message of which fails the next call.
    pub validation: bool,
    /// Per-node timestamps for `profile` (a timestamp query after every node).
    pub profile: bool,
    /// The kernel variants asked for.
    pub features: FeatureRequest,
    /// Fuse the chains `fuse` finds into one kernel (option `fuse`, on by default).
    pub fuse: bool,
    /// The pipeline cache on disk (option `pipeline_cache`, on by default).
    pub pipeline_cache: Mode,
    /// Option `precision = "fast"` (`TANDEM_WGPU_PRECISION`): `matvec_dot.wgsl` takes its input
    /// at 8 bits, as ggml's q8_1 (docs/precision.md); `"exact"` (the default) at 16.
    pub fast: bool,
}

/// Parses a `backends` list, naming the entry it does not know.
pub fn parse_backends(list: &str) -> Result<wgpu::Backends, BackendError> {
    let mut b = wgpu::Backends::empty();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        b |= match name.to_ascii_lowercase().as_str() {
            "vulkan" => wgpu::Backends::VULKAN,
            "metal" => wgpu::Backends::METAL,
            "dx12" => wgpu::Backends::DX12,
            "gl" | "gles" | "opengl" => wgpu::Backends::GL,
            other => {
                return Err(BackendError::invalid(format!(
                    "backend option 'backends': unknown wgpu backend '{other}' (vulkan, metal, dx12, gl)"
                )))
            }
        };
    }
    if b.is_empty() {
        return Err(BackendError::invalid(
            "backend option 'backends': the list is empty (vulkan, metal, dx12, gl)",
        ));
    }
    Ok(b)
}

impl Request {
    /// Reads `[backend.wgpu]` options, then the environment.
    pub fn from_options(options: &BackendOptions) -> Result<Self, BackendError> {
        let adapter = setting(options, "adapter", ADAPTER_VAR).filter(|s| !s.is_empty());
        let backends = match setting(options, "backends", BACKENDS_VAR) {
            Some(list) => parse_backends(&list)?,
            None => {
                wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12 | wgpu::Backends::GL
            }
        };
        let validation = flag(options, "validation", VALIDATION_VAR, false);
        let profile = flag(options, "profile", "TANDEM_WGPU_PROFILE", false);
        let fuse = flag(options, "fuse", "TANDEM_WGPU_FUSE", true);
        let pipeline_cache = Mode::parse(setting(options, cache_file::OPTION, cache_file::VAR).as_deref());
        let features = match setting(options, "features", FEATURES_VAR) {
            Some(v) => parse_features(&v)?,
            None => FeatureRequest::Auto,
        };
        let fast = tandem_gpu_kit::options::fast_precision(options, PRECISION_VAR)?;
        // `memory_limit` is checked against the adapter's limits by the backend, once they are
        // known; a malformed size is refused here, before any adapter is opened.
        options.bytes(MEMORY_LIMIT)?;
        let known = [
            "adapter",
            "backends",
            "validation",
            "profile",
            "features",
            "fuse",
            "precision",
            cache_file::OPTION,
            MEMORY_LIMIT,
        ];
        for key in options.entries.keys() {
            if !known.contains(&key.as_str()) {
                return Err(BackendError::invalid(format!(
                    "backend option '{key}' is not a wgpu option (adapter, backends, validation, profile, \
                     features, fuse, precision, {}, {MEMORY_LIMIT})",
                    cache_file::OPTION
                )));
            }
        }
        Ok(Request {
            adapter,
            backends,
            validation,
            profile,
            features,
            fuse,
            pipeline_cache,
            fast,
        })
    }
}

/// Messages from the Vulkan validation layer, which wgpu-hal forwards to the `log` crate: this
/// plugin's own copy of it (a cdylib links its own), so the host's logger is untouched.
static LAYER_MESSAGES: OnceLock<Mutex<Vec<String>>> = OnceLock::new();

struct LayerLog;

impl log::Log for LayerLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn && m.target().starts_with("wgpu_hal")
    }
    fn log(&self, r: &log::Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let text = r.args().to_string();
        // The layer's own messages (not wgpu-hal's notes about the environment).
        if text.contains("VALIDATION") || text.contains("VUID") {
            if let Ok(mut v) = LAYER_MESSAGES.get_or_init(Default::default).lock() {
                v.push(text);
            }
        }
    }
    fn flush(&self) {}
}

static LOGGER: LayerLog = LayerLog;

/// The device and what was learnt about it.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub name: String,
    pub kind: DeviceKind,
    pub features: Vec<String>,
    pub limits: wgpu::Limits,
    /// Timestamps inside compute passes are available and were asked for.
    pub timestamps: bool,
    /// The kernel variants the device was opened for.
    pub variant: Variant,
    /// What the pipeline cache on disk is keyed by, where the device was opened with
    /// `PIPELINE_CACHE` (a Vulkan adapter, option `pipeline_cache` not off); `None` elsewhere.
    pub cache_identity: Option<Identity>,
    /// The Vulkan adapter's `hex(deviceUUID)`, as the Vulkan backend names the same device
    /// (`BackendInfo::physical_device`); `None` on other APIs.
    pub physical_device: Option<String>,
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<AtomicBool>,
    lost_reason: Arc<Mutex<String>>,
    validation: bool,
}

fn kind_of(t: wgpu::DeviceType) -> DeviceKind {
    match t {
        wgpu::DeviceType::DiscreteGpu => DeviceKind::DiscreteGpu,
        wgpu::DeviceType::IntegratedGpu => DeviceKind::IntegratedGpu,
        wgpu::DeviceType::Cpu => DeviceKind::SoftwareGpu,
        // A virtual GPU (a VM's) or an unknown kind: memory of its own, as far as we know.
        _ => DeviceKind::DiscreteGpu,
    }
}

/// Preference among adapters: discrete, integrated, virtual, other, software; Vulkan before
/// the other APIs on the same device.
fn rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let t = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let b = match info.backend {
        wgpu::Backend::Vulkan => 0,
        wgpu::Backend::Metal | wgpu::Backend::Dx12 => 1,
        _ => 2,
    };
    (t, b)
}

fn describe(i: usize, info: &wgpu::AdapterInfo) -> String {
    format!("{i}: {} ({:?}, {:?})", info.name, info.backend, info.device_type)
}

impl Gpu {
    /// Chooses an adapter and opens a device on it, or says why none can run tandem's kernels.
    pub fn open(req: &Request) -> Result<Gpu, BackendError> {
        let mut flags = wgpu::InstanceFlags::empty();
        if req.validation {
            // Not DEBUG: its SPIR-V carries an OpSource of WGSL, which older layers (Debian
            // bookworm's 1.3.239) reject as an invalid source language.
            flags |= wgpu::InstanceFlags::VALIDATION;
            // Only the first backend in a process installs the logger; the others share it.
            let _ = log::set_logger(&LOGGER).map(|_| log::set_max_level(log::LevelFilter::Warn));
        }
        // GL only when nothing else is there (or asked for alone): an instance with GL sets up
        // EGL, which is slow and prints to stderr on machines without a display.
        let instance_for = |backends: wgpu::Backends| {
            wgpu::Instance::new(wgpu::InstanceDescriptor {
                backends,
                flags,
                ..wgpu::InstanceDescriptor::new_without_display_handle()
            })
        };
        let native = req.backends - wgpu::Backends::GL;
        let mut adapters = if native.is_empty() {
            Vec::new()
        } else {
            pollster::block_on(instance_for(native).enumerate_adapters(native))
        };
        if adapters.is_empty() && req.backends.contains(wgpu::Backends::GL) {
            adapters =
                pollster::block_on(instance_for(wgpu::Backends::GL).enumerate_adapters(wgpu::Backends::GL));
        }
        if adapters.is_empty() {
            return Err(BackendError::Unavailable {
                reason: format!(
                    "wgpu found no adapter among its backends {:?} (no Vulkan, Metal, DX12 or GL driver)",
                    req.backends
                ),
            });
        }
        let infos: Vec<wgpu::AdapterInfo> = adapters.iter().map(|a| a.get_info()).collect();
        let listing = infos
            .iter()
            .enumerate()
            .map(|(i, a)| describe(i, a))
            .collect::<Vec<_>>()
            .join("; ");
        let chosen = match &req.adapter {
            Some(want) => {
                let by_index = want.parse::<usize>().ok().filter(|i| *i < adapters.len());
                let by_name = || {
                    infos
                        .iter()
                        .position(|a| a.name.to_lowercase().contains(&want.to_lowercase()))
                };
                by_index
                    .or_else(by_name)
                    .ok_or_else(|| BackendError::Unavailable {
                        reason: format!("no wgpu adapter matches adapter = '{want}' (adapters: {listing})"),
                    })?
            }
            None => (0..adapters.len())
                .filter(|&i| compute_capable(&adapters[i]))
                .min_by_key(|&i| rank(&infos[i]))
                .ok_or_else(|| BackendError::Unavailable {
                    reason: format!("no wgpu adapter runs compute shaders (adapters: {listing})"),
                })?,
        };
        let adapter = &adapters[chosen];
        let info = &infos[chosen];
        if !compute_capable(adapter) {
            return Err(BackendError::Unavailable {
                reason: format!(
                    "wgpu adapter {} cannot run compute shaders",
                    describe(chosen, info)
                ),
            });
        }
        let offered = adapter.features();
        let mut wanted = wgpu::Features::empty();
        let timestamps = req.profile
            && offered
                .contains(wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);
        if timestamps {
            wanted |= wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        }
        let coopmat = coopmat_offered(adapter, info);
        let int_dot = int_dot_offered(adapter);
        let variant = match req.features {
            FeatureRequest::Auto => Variant {
                subgroups: offered.contains(wgpu::Features::SUBGROUP),
                f16: offered.contains(wgpu::Features::SHADER_F16),
                coopmat: coopmat.is_ok(),
                // Where the packed dot product is accelerated: emulated, the f32 matvecs win.
                int_dot: int_dot == Ok(true),
            },
            FeatureRequest::Exactly(v) => {
                if v.subgroups && !offered.contains(wgpu::Features::SUBGROUP) {
                    return Err(BackendError::Unavailable {
                        reason: format!(
                            "features = subgroups, but wgpu adapter {} does not offer subgroup operations",
                            describe(chosen, info)
                        ),
                    });
                }
                if v.f16 && !offered.contains(wgpu::Features::SHADER_F16) {
                    return Err(BackendError::Unavailable {
                        reason: format!(
                            "features = f16, but wgpu adapter {} does not offer f16 shaders (SHADER_F16)",
                            describe(chosen, info)
                        ),
                    });
                }
                if let (true, Err(why)) = (v.coopmat, &coopmat) {
                    return Err(BackendError::Unavailable {
                        reason: format!(
                            "features = coopmat, but wgpu adapter {} {why}",
                            describe(chosen, info)
                        ),
                    });
                }
                if let (true, Err(why)) = (v.int_dot, &int_dot) {
                    return Err(BackendError::Unavailable {
                        reason: format!(
                            "features = int_dot, but wgpu adapter {} {why}",
                            describe(chosen, info)
                        ),
                    });
                }
                v
            }
        };
        if variant.subgroups {
            wanted |= wgpu::Features::SUBGROUP;
        }
        if variant.f16 {
            wanted |= wgpu::Features::SHADER_F16;
        }
        if variant.coopmat {
            // The cooperative-matrix matmul also uses f16 and subgroup builtins.
            wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
                | wgpu::Features::SHADER_F16
                | wgpu::Features::SUBGROUP;
        }
        // wgpu's pipeline caches (Vulkan adapters only, where `util::pipeline_cache_key` has a
        // key): asked for unless the option is off.
        let cache_identity = if req.pipeline_cache != Mode::Off
            && offered.contains(wgpu::Features::PIPELINE_CACHE)
            && wgpu::util::pipeline_cache_key(info).is_some()
        {
            vulkan_identity(adapter)
        } else {
            None
        };
        if cache_identity.is_some() {
            wanted |= wgpu::Features::PIPELINE_CACHE;
        }
        let experimental_features = if variant.coopmat {
            // SAFETY: wgpu asks callers of its experimental features to accept that its
            // implementation of them may have bugs; the only one used is cooperative matrices, in
            // the prefill matmuls: matmul_coopmat.wgsl loads and stores them in bounds of its
            // workgroup arrays, matmul_half.wgsl loads whole 16x16 tiles in bounds of a staging
            // buffer padded to its tiles (or of f16 weights whose rows fill them), and
            // `features = portable` or `f16,subgroups` opts out of both.
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        // Everything the adapter offers: the weights need its largest buffers and bindings.
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("tandem"),
            required_features: wanted,
            required_limits: limits.clone(),
            experimental_features,
            ..Default::default()
        }))
        .map_err(|e| BackendError::Unavailable {
            reason: format!(
                "wgpu adapter {}: cannot open a device: {e}",
                describe(chosen, info)
            ),
        })?;
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let lost = Arc::new(AtomicBool::new(false));
        let lost_reason: Arc<Mutex<String>> = Arc::default();
        let (l, r) = (lost.clone(), lost_reason.clone());
        device.set_device_lost_callback(move |reason, message| {
            l.store(true, Ordering::SeqCst);
            if let Ok(mut s) = r.lock() {
                *s = format!("{reason:?}: {message}");
            }
        });
        let limits = device.limits();
        let mut features = vec![
            format!("{:?}", info.backend).to_lowercase(),
            format!("driver {} {}", info.driver, info.driver_info)
                .trim()
                .to_string(),
            format!(
                "max_storage_binding={}MiB",
                limits.max_storage_buffer_binding_size >> 20
            ),
            format!("max_buffer={}MiB", limits.max_buffer_size >> 20),
        ];
        features.push(format!("kernels={}", variant.names().join("+")));
        // The product path prefill takes (see `kernels`): cooperative matrices on f16 tiles,
        // f16 tiles, or f32 tiles.
        let prefill = if variant.coopmat {
            "khr_f16"
        } else if variant.f16 {
            "tiled_f16"
        } else {
            "scalar"
        };
        features.push(format!("prefill={prefill}"));
        if let Ok(fast) = int_dot {
            // Like the Vulkan backend's: whether the device's packed dot product is
            // accelerated, and whether the kernels take it.
            features.push(
                match (variant.int_dot, fast) {
                    (true, true) => "int8_dot",
                    (true, false) => "int8_dot(not accelerated)",
                    (false, true) => "int8_dot(off)",
                    (false, false) => "int8_dot(not accelerated, off)",
                }
                .into(),
            );
        }
        if timestamps {
            features.push("timestamps".into());
        }
        if req.validation {
            features.push("validation".into());
        }
        Ok(Gpu {
            device,
            queue,
            name: info.name.clone(),
            kind: kind_of(info.device_type),
            features,
            limits,
            timestamps,
            variant,
            cache_identity,
            physical_device: vulkan_device_uuid(adapter),
            errors,
            lost,
            lost_reason,
            validation: req.validation,
        })
    }

    /// Fails once the device is lost, wgpu reported a validation error, or (with validation on)
    /// the API's validation layer said anything.
    pub fn check(&self) -> Result<(), BackendError> {
        if self.lost.load(Ordering::SeqCst) {
            let why = self.lost_reason.lock().map(|s| s.clone()).unwrap_or_default();
            return Err(BackendError::DeviceLost {
                device: format!("{} ({why})", self.name),
            });
        }
        if let Some(e) = self.errors.lock().ok().and_then(|v| v.first().cloned()) {
            return Err(BackendError::internal(format!("wgpu on {}: {e}", self.name)));
        }
        if self.validation {
            if let Some(m) = LAYER_MESSAGES
                .get()
                .and_then(|m| m.lock().ok().and_then(|v| v.first().cloned()))
            {
                return Err(BackendError::internal(format!(
                    "validation layer on {}: {m}",
                    self.name
                )));
            }
        }
        Ok(())
    }

    /// Waits for a submission (all work when `None`).
    pub fn wait(&self, index: Option<wgpu::SubmissionIndex>) -> Result<(), BackendError> {
        let poll = match index {
            Some(i) => wgpu::PollType::Wait {
                submission_index: Some(i),
                timeout: None,
            },
            None => wgpu::PollType::wait_indefinitely(),
        };
        self.device.poll(poll).map_err(|e| match e {
            wgpu::PollError::Timeout => BackendError::internal(format!("{}: wait timed out", self.name)),
            e => BackendError::DeviceLost {
                device: format!("{} ({e})", self.name),
            },
        })?;
        self.check()
    }
}

/// Whether the adapter runs `dot4I8Packed` as the device's packed 8-bit dot product, and if so
/// whether that is accelerated (`Ok(accelerated)`), or why not. wgpu lowers it to SPIR-V's
/// OpSDot where the Vulkan device has `shaderIntegerDotProduct` (Vulkan 1.3, or
/// VK_KHR_shader_integer_dot_product) and to shifts and multiplies elsewhere, so only a Vulkan
/// adapter with the feature offers it.
fn int_dot_offered(adapter: &wgpu::Adapter) -> Result<bool, String> {
    use wgpu::hal::api::Vulkan;
    // SAFETY: the guard is only read (the physical device's handle and the instance), never
    // destroyed; it is dropped before this function returns, while `adapter` lives on.
    let Some(hal) = (unsafe { adapter.as_hal::<Vulkan>() }) else {
        return Err(
            "is not a Vulkan adapter (packed dot products come through Vulkan's shaderIntegerDotProduct)"
                .into(),
        );
    };
    let caps = hal.physical_device_capabilities();
    let has_ext = caps.supports_extension(ash::khr::shader_integer_dot_product::NAME);
    if caps.properties().api_version < ash::vk::API_VERSION_1_3 && !has_ext {
        return Err("has neither Vulkan 1.3 nor VK_KHR_shader_integer_dot_product".into());
    }
    let instance = hal.shared_instance().raw_instance();
    let physical = hal.raw_physical_device();
    let mut feat = ash::vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
    let mut f2 = ash::vk::PhysicalDeviceFeatures2::default().push_next(&mut feat);
    let mut prop = ash::vk::PhysicalDeviceShaderIntegerDotProductProperties::default();
    let mut p2 = ash::vk::PhysicalDeviceProperties2::default().push_next(&mut prop);
    // SAFETY: `physical` is the adapter's device of this live instance (wgpu holds both); both
    // chains are valid structures on this frame, defined by Vulkan 1.3 or the extension, which
    // the device was just checked for; wgpu's instance is Vulkan 1.1 or later where it exposes
    // adapters, so the `2` queries are core.
    unsafe {
        instance.get_physical_device_features2(physical, &mut f2);
        instance.get_physical_device_properties2(physical, &mut p2);
    }
    if feat.shader_integer_dot_product != ash::vk::TRUE {
        return Err("does not offer shaderIntegerDotProduct".into());
    }
    Ok(prop.integer_dot_product4x8_bit_packed_signed_accelerated == ash::vk::TRUE)
}

/// The Vulkan adapter's `deviceUUID` in hex (`None` where the adapter is not Vulkan).
fn vulkan_device_uuid(adapter: &wgpu::Adapter) -> Option<String> {
    use wgpu::hal::api::Vulkan;
    // SAFETY: the guard is only read (the physical device's handle and the instance), never
    // destroyed; it is dropped before this function returns, while `adapter` lives on.
    let hal = unsafe { adapter.as_hal::<Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    let physical = hal.raw_physical_device();
    let mut ids = ash::vk::PhysicalDeviceIDProperties::default();
    let mut p2 = ash::vk::PhysicalDeviceProperties2::default().push_next(&mut ids);
    // SAFETY: `physical` is the adapter's device of this live instance (wgpu holds both); the
    // chain is a valid structure on this frame; VkPhysicalDeviceIDProperties and the `2` query
    // are core in Vulkan 1.1, which wgpu's instance is where it exposes adapters.
    unsafe { instance.get_physical_device_properties2(physical, &mut p2) };
    Some(ids.device_uuid.iter().map(|b| format!("{b:02x}")).collect())
}

/// The Vulkan adapter's vendor id, device id, driver version and `pipelineCacheUUID`, which key
/// the pipeline cache's file (`None` where the adapter is not Vulkan).
fn vulkan_identity(adapter: &wgpu::Adapter) -> Option<Identity> {
    use wgpu::hal::api::Vulkan;
    // SAFETY: the guard is only read (the capabilities wgpu-hal queried when it listed the
    // adapter), never destroyed; it is dropped before this function returns.
    let hal = unsafe { adapter.as_hal::<Vulkan>() }?;
    let p = hal.physical_device_capabilities().properties();
    Some(Identity {
        vendor_id: p.vendor_id,
        device_id: p.device_id,
        driver_version: p.driver_version,
        pipeline_cache_uuid: p.pipeline_cache_uuid,
    })
}

/// Workgroup memory of `matmul_coopmat.wgsl`: f16 tiles of 64 and 128 rows of 72, and eight
/// 16x16 f32 slots.
const COOPMAT_WORKGROUP_BYTES: u32 = (64 + 128) * 72 * 2 + 8 * 256 * 4;

/// Whether the adapter runs `matmul_coopmat.wgsl`, or why not: cooperative matrices offering
/// the 16x16x16 f16 x f16 -> f32 configuration, f16 and subgroups, subgroups of exactly 32
/// invocations (its 256 invocations are 8 subgroups, one per 32 x 32 block of the tile), and
/// its workgroup memory.
fn coopmat_offered(adapter: &wgpu::Adapter, info: &wgpu::AdapterInfo) -> Result<(), String> {
    let f = adapter.features();
    if !f.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        return Err("does not offer cooperative matrices (EXPERIMENTAL_COOPERATIVE_MATRIX)".into());
    }
    if !f.contains(wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP) {
        return Err("does not offer f16 shaders and subgroups, which the coopmat kernel needs".into());
    }
    let f16_f32 = adapter.cooperative_matrix_properties().iter().any(|c| {
        (c.m_size, c.n_size, c.k_size) == (16, 16, 16)
            && c.ab_type == wgpu::CooperativeScalarType::F16
            && c.cr_type == wgpu::CooperativeScalarType::F32
    });
    if !f16_f32 {
        return Err("does not list the 16x16x16 f16 x f16 -> f32 cooperative matrix configuration".into());
    }
    if (info.subgroup_min_size, info.subgroup_max_size) != (32, 32) {
        return Err(format!(
            "has subgroups of {} to {} invocations (the coopmat kernel needs exactly 32)",
            info.subgroup_min_size, info.subgroup_max_size
        ));
    }
    let limits = adapter.limits();
    if limits.max_compute_workgroup_storage_size < COOPMAT_WORKGROUP_BYTES
        || limits.max_compute_invocations_per_workgroup < 256
    {
        return Err(format!(
            "offers {} bytes of workgroup memory and {} invocations per workgroup (the coopmat \
             kernel needs {COOPMAT_WORKGROUP_BYTES} and 256)",
            limits.max_compute_workgroup_storage_size, limits.max_compute_invocations_per_workgroup
        ));
    }
    Ok(())
}

fn compute_capable(a: &wgpu::Adapter) -> bool {
    a.get_downlevel_capabilities()
        .flags
        .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_lists_parse_and_name_what_is_wrong() {
        assert_eq!(
            parse_backends("vulkan, gl").unwrap(),
            wgpu::Backends::VULKAN | wgpu::Backends::GL
        );
        let e = parse_backends("vulkan,glide").unwrap_err().to_string();
        assert!(e.contains("'glide'") && e.contains("'backends'"), "{e}");
        assert!(parse_backends(" , ").is_err());
    }

    #[test]
    fn feature_lists_parse_and_name_what_is_wrong() {
        assert_eq!(parse_features("auto").unwrap(), FeatureRequest::Auto);
        assert_eq!(
            parse_features("portable").unwrap(),
            FeatureRequest::Exactly(Variant::PORTABLE)
        );
        assert_eq!(
            parse_features(" Subgroups ").unwrap(),
            FeatureRequest::Exactly(Variant {
                subgroups: true,
                ..Variant::PORTABLE
            })
        );
        assert_eq!(
            parse_features("f16,subgroups").unwrap(),
            FeatureRequest::Exactly(Variant {
                subgroups: true,
                f16: true,
                ..Variant::PORTABLE
            })
        );
        assert_eq!(
            parse_features("int_dot").unwrap(),
            FeatureRequest::Exactly(Variant {
                int_dot: true,
                ..Variant::PORTABLE
            })
        );
        assert_eq!(
            parse_features("coopmat").unwrap(),
            FeatureRequest::Exactly(Variant {
                coopmat: true,
                ..Variant::PORTABLE
            })
        );
        let e = parse_features("subgroups,warp").unwrap_err().to_string();
        assert!(e.contains("'warp'") && e.contains("'features'"), "{e}");
        let mut o = BackendOptions::default();
        o.set("features", "portable");
        assert_eq!(
            Request::from_options(&o).unwrap().features,
            FeatureRequest::Exactly(Variant::PORTABLE)
        );
    }

    #[test]
    fn unknown_options_are_named() {
        let mut o = BackendOptions::default();
        o.set("adaptor", "0");
        let e = Request::from_options(&o).unwrap_err().to_string();
        assert!(e.contains("'adaptor'"), "{e}");
        let mut o = BackendOptions::default();
        o.set("backends", "gl")
            .set("validation", "yes")
            .set(MEMORY_LIMIT, "lots");
        let e = Request::from_options(&o).unwrap_err().to_string();
        assert!(e.contains("'memory_limit'") && e.contains("'lots'"), "{e}");
        o.set(MEMORY_LIMIT, "1GiB");
        let r = Request::from_options(&o).unwrap();
        assert_eq!(r.backends, wgpu::Backends::GL);
        assert!(r.validation);
    }
}
