//! The Vulkan instance and device: loading the loader, choosing a device (discrete, then
//! integrated, then virtual, then CPU, unless the caller names one), checking the features the
//! kernels need, the validation layer's messenger, one compute queue and its timeline semaphore.
//!
//! Device-side boundaries (see `tandem_backend_api::boundary`): where the device lists them,
//! `VK_EXT_external_memory_host` (host memory imported as buffers, `memory::Memory::import`) and
//! `VK_KHR_external_semaphore_fd` (the queue's timeline exported as an opaque fd, and other
//! devices' timelines imported to wait on) are enabled.
//!
//! Every `unsafe` block here is a Vulkan call on handles this module created and still owns.

use std::ffi::{c_void, CStr};
use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd};
use std::sync::{Arc, Mutex};

use ash::vk;
use tandem_backend_api::boundary::VULKAN_OPAQUE_FD;
use tandem_backend_api::{BackendError, DeviceKind, SharedTimeline, TimelineId};

use crate::cache_file::Identity;

/// The validation layer's name.
const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// What the caller asked for when creating the backend.
#[derive(Debug, Clone, Default)]
pub struct DeviceRequest {
    /// An index into the loader's device list, or a case-insensitive substring of a name.
    pub device: Option<String>,
    /// Whether to enable the Khronos validation layer.
    pub validation: bool,
    /// Whether cooperative-matrix (tensor core) kernels may be used where the device has them.
    pub coopmat: bool,
    /// Whether the NV cooperative-matrix-2 matmul may be used where the device has it.
    pub coopmat2: bool,
    /// The integer-dot-product decode kernels (`matvec_dot_<fmt>`): `None` where the device
    /// says its packed signed 8-bit dot product is accelerated, `Some(true)` wherever it has
    /// the feature, `Some(false)` never.
    pub int_dot: Option<bool>,
}

/// Validation messages (warnings and errors) collected by the debug messenger.
pub type Messages = Arc<Mutex<Vec<String>>>;

/// Importing host memory as buffers (`VK_EXT_external_memory_host`, enabled).
pub struct HostImport {
    /// `minImportedHostPointerAlignment`: the pointer and size of an import are multiples of it.
    pub alignment: u64,
    /// The extension's entry points.
    pub fns: ash::ext::external_memory_host::Device,
}

/// The timeline semaphores' handle type for sharing between devices.
const OPAQUE_FD: vk::ExternalSemaphoreHandleTypeFlags = vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD;

/// What `open_device` makes.
struct Opened {
    device: ash::Device,
    queue: vk::Queue,
    name: String,
    kind: DeviceKind,
    memory_bytes: u64,
    host_memory_bytes: u64,
    features: Vec<String>,
    coopmat: bool,
    coopmat2: bool,
    int_dot: bool,
    subgroup_32: bool,
    timestamp_period: Option<f64>,
    timeline: vk::Semaphore,
    pool: vk::CommandPool,
    shared: Option<vk::Semaphore>,
    memory_types: Vec<vk::MemoryPropertyFlags>,
    host_import: Option<HostImport>,
    semaphore_fd: Option<ash::khr::external_semaphore_fd::Device>,
    device_id: String,
    physical_device: String,
    identity: Identity,
    creation_feedback: bool,
    pipeline_stats: Option<PipelineStats>,
}

/// Pipeline statistics (`VK_KHR_pipeline_executable_properties`, enabled only where
/// `TANDEM_VULKAN_PIPELINE_STATS` asks and the device has it): what the driver reports of each
/// pipeline whose kernel name contains `filter` (NVIDIA: its register count), printed on stderr
/// as the pipeline is made. For tuning runs.
pub struct PipelineStats {
    /// The kernel names to report: those containing it (`all`: every one).
    pub filter: String,
    /// The extension's entry points.
    pub fns: ash::khr::pipeline_executable_properties::Device,
}

impl PipelineStats {
    /// Whether kernel `name`'s pipelines are reported.
    pub fn wants(&self, name: &str) -> bool {
        self.filter == "all" || name.contains(&self.filter)
    }
}

/// An open device with one compute queue.
pub struct Gpu {
    _entry: ash::Entry,
    pub instance: ash::Instance,
    debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    /// Kept alive while the messenger may write to it (the callback holds a raw pointer).
    pub messages: Messages,
    pub physical: vk::PhysicalDevice,
    pub device: ash::Device,
    pub queue: vk::Queue,
    pub name: String,
    pub kind: DeviceKind,
    pub memory_bytes: u64,
    /// The largest host-visible heap.
    pub host_memory_bytes: u64,
    pub features: Vec<String>,
    /// Whether the cooperative-matrix prefill kernel (`matmul_coopmat_<fmt>`) can run: the
    /// device has VK_KHR_cooperative_matrix with a 16x16x16 f16 x f16 -> f32 subgroup-scope
    /// shape, subgroups of 32, shaderFloat16 and the Vulkan memory model, and the caller did not
    /// turn it off. The extension and features are enabled only then.
    pub coopmat: bool,
    /// Whether the workgroup-scope prefill kernel (`matmul_cm2_<fmt>`) can run: `coopmat`, and
    /// the device has VK_NV_cooperative_matrix2 with workgroup-scope matrices, flexible
    /// dimensions, tensor addressing and block loads, and an f16 x f16 -> f32 workgroup shape
    /// for 256 invocations. Enabled only then.
    pub coopmat2: bool,
    /// Whether the integer-dot-product decode kernels (`matvec_dot_<fmt>`) can run: the
    /// device's `shaderIntegerDotProduct`, enabled.
    pub int_dot: bool,
    /// Whether every pipeline asks for subgroups of 32 (`requiredSubgroupSize`): the device's
    /// default size is another (AMD's drivers report 64) and subgroup size control allows 32 in
    /// compute shaders, so the kernels, written for and measured at 32 lanes (NVIDIA's size),
    /// run as they were measured and the cooperative-matrix kernels can run at all.
    pub subgroup_32: bool,
    /// Nanoseconds per timestamp tick; `None` when the queue has no timestamps.
    pub timestamp_period: Option<f64>,
    /// The queue's timeline: every submission signals the next value.
    pub timeline: vk::Semaphore,
    /// The last value a submission will signal.
    pub submitted: u64,
    /// How long [`Gpu::wait_for`] polls the timeline before it blocks in `vkWaitSemaphores`
    /// (the backend option `wait_spin_us`; zero: it blocks at once).
    pub wait_spin: std::time::Duration,
    pub pool: vk::CommandPool,
    /// The property flags of each memory type, by index.
    pub memory_types: Vec<vk::MemoryPropertyFlags>,
    /// Host memory import, where the device has `VK_EXT_external_memory_host`.
    pub host_import: Option<HostImport>,
    /// `VK_KHR_external_semaphore_fd`'s entry points, where the device can export and import
    /// timeline semaphores as opaque fds (then `shared` exists).
    pub semaphore_fd: Option<ash::khr::external_semaphore_fd::Device>,
    /// The timeline `export_timeline` shares, where the device can: created exportable, and
    /// signalled to the same value as `timeline` by every submission, so its values are the
    /// tickets too. It is a twin rather than `timeline` itself because the validation layer
    /// stops tracking a semaphore once it is exported as an opaque fd (its payload may then
    /// change outside the process's view), and would then never see this queue's submissions
    /// finish: every resubmitted command buffer would be reported still in use.
    shared: Option<vk::Semaphore>,
    /// `hex(driverUUID)/hex(deviceUUID)`: only a device with the same one can import
    /// `timeline` ([`SharedTimeline::device`]).
    pub device_id: String,
    /// `hex(deviceUUID)`: the physical device, as every backend on it names it
    /// (`BackendInfo::physical_device`).
    pub physical_device: String,
    /// Other devices' timelines imported by `import_timeline`, indexed by [`TimelineId`];
    /// destroyed with the device.
    imported: Vec<vk::Semaphore>,
    /// Vendor, device, driver version and `pipelineCacheUUID`: what the on-disk pipeline
    /// cache is keyed and checked by.
    pub identity: Identity,
    /// Whether pipeline creation reports feedback (`VkPipelineCreationFeedbackCreateInfo`):
    /// Vulkan 1.3 on both the instance and the device, or `VK_EXT_pipeline_creation_feedback`
    /// (then enabled).
    pub creation_feedback: bool,
    /// Pipeline statistics for tuning runs, where asked and the device has them.
    pub pipeline_stats: Option<PipelineStats>,
}

/// The most timelines one submission waits on: the contract's.
pub use tandem_backend_api::boundary::MAX_WAITS;

/// A Vulkan error of `what` on `device` as a backend error.
pub fn vk_err(what: &str, device: &str, e: vk::Result) -> BackendError {
    match e {
        vk::Result::ERROR_DEVICE_LOST => BackendError::DeviceLost {
            device: format!("{device} ({what})"),
        },
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
            BackendError::OutOfMemory {
                requested: 0,
                available: 0,
            }
        }
        e => BackendError::internal(format!("{what} on {device}: {e}")),
    }
}

/// Maps a Vulkan error of `what` on `device` to a backend error.
pub fn check(what: &str, device: &str, r: Result<(), vk::Result>) -> Result<(), BackendError> {
    r.map_err(|e| vk_err(what, device, e))
}

/// Maps a Vulkan result to a backend error naming the call and the device.
pub fn map<T>(what: &str, device: &str, r: Result<T, vk::Result>) -> Result<T, BackendError> {
    r.map_err(|e| vk_err(what, device, e))
}

unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    if !severity.intersects(
        vk::DebugUtilsMessageSeverityFlagsEXT::WARNING | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
    ) {
        return vk::FALSE;
    }
    // SAFETY: the loader passes a valid callback-data pointer for the duration of the call;
    // `user` is the `Mutex<Vec<String>>` inside the `Arc` that `Gpu` keeps alive until the
    // messenger is destroyed.
    unsafe {
        let text = if data.is_null() || (*data).p_message.is_null() {
            "(no message)".to_string()
        } else {
            CStr::from_ptr((*data).p_message).to_string_lossy().into_owned()
        };
        let messages = &*(user as *const Mutex<Vec<String>>);
        if let Ok(mut m) = messages.lock() {
            m.push(text);
        }
    }
    vk::FALSE
}

/// The features the kernels need, by name, that `physical` lacks.
fn missing_features(instance: &ash::Instance, physical: vk::PhysicalDevice) -> Vec<&'static str> {
    let mut v11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut f2 = vk::PhysicalDeviceFeatures2::default()
        .push_next(&mut v11)
        .push_next(&mut v12);
    let mut sub = vk::PhysicalDeviceSubgroupProperties::default();
    let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut sub);
    // SAFETY: `physical` came from this instance; the chained structs live on this frame.
    unsafe {
        instance.get_physical_device_features2(physical, &mut f2);
        instance.get_physical_device_properties2(physical, &mut p2);
    }
    let core = f2.features;
    let mut missing = Vec::new();
    if p2.properties.api_version < vk::API_VERSION_1_2 {
        missing.push("Vulkan 1.2");
        return missing;
    }
    let checks: [(bool, &'static str); 10] = [
        (v12.buffer_device_address == vk::TRUE, "bufferDeviceAddress"),
        (v12.timeline_semaphore == vk::TRUE, "timelineSemaphore"),
        (v12.scalar_block_layout == vk::TRUE, "scalarBlockLayout"),
        (
            v12.storage_buffer8_bit_access == vk::TRUE,
            "storageBuffer8BitAccess",
        ),
        (v12.shader_int8 == vk::TRUE, "shaderInt8"),
        (
            v11.storage_buffer16_bit_access == vk::TRUE,
            "storageBuffer16BitAccess",
        ),
        (core.shader_int16 == vk::TRUE, "shaderInt16"),
        (core.shader_int64 == vk::TRUE, "shaderInt64"),
        (
            sub.supported_stages.contains(vk::ShaderStageFlags::COMPUTE),
            "subgroup operations in compute shaders",
        ),
        (
            sub.supported_operations
                .contains(vk::SubgroupFeatureFlags::BASIC | vk::SubgroupFeatureFlags::ARITHMETIC),
            "subgroup arithmetic",
        ),
    ];
    for (ok, name) in checks {
        if !ok {
            missing.push(name);
        }
    }
    missing
}

fn device_name(props: &vk::PhysicalDeviceProperties) -> String {
    props
        .device_name_as_c_str()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "(unnamed device)".into())
}

fn rank(t: vk::PhysicalDeviceType) -> u32 {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => 0,
        vk::PhysicalDeviceType::INTEGRATED_GPU => 1,
        vk::PhysicalDeviceType::VIRTUAL_GPU => 2,
        vk::PhysicalDeviceType::CPU => 3,
        _ => 4,
    }
}

impl Gpu {
    /// Loads the loader, picks a device and opens it.
    pub fn open(req: &DeviceRequest) -> Result<Gpu, BackendError> {
        // SAFETY: loading the system's Vulkan loader runs its initialisers; it is the library
        // every Vulkan program loads, and nothing else in this process expects it absent.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| BackendError::Unavailable {
            reason: format!("no Vulkan loader (libvulkan.so.1): {e}"),
        })?;
        // SAFETY: plain queries of the loader.
        let version = unsafe { entry.try_enumerate_instance_version() }
            .ok()
            .flatten()
            .unwrap_or(vk::API_VERSION_1_0);
        if version < vk::API_VERSION_1_2 {
            return Err(BackendError::Unavailable {
                reason: format!(
                    "the Vulkan loader speaks {}.{}, the backend needs 1.2",
                    vk::api_version_major(version),
                    vk::api_version_minor(version)
                ),
            });
        }
        let mut layers = Vec::new();
        let mut extensions = Vec::new();
        if req.validation {
            // SAFETY: plain query of the loader.
            let available = unsafe { entry.enumerate_instance_layer_properties() }
                .map_err(|e| BackendError::internal(format!("listing Vulkan layers: {e}")))?;
            let found = available
                .iter()
                .any(|l| l.layer_name_as_c_str().is_ok_and(|n| n == VALIDATION_LAYER));
            if !found {
                return Err(BackendError::Unavailable {
                    reason: "Vulkan validation was requested but VK_LAYER_KHRONOS_validation is not \
                             installed (Debian: vulkan-validationlayers)"
                        .into(),
                });
            }
            layers.push(VALIDATION_LAYER.as_ptr());
            extensions.push(ash::ext::debug_utils::NAME.as_ptr());
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"tandem")
            .engine_name(c"tandem")
            .api_version(if version >= vk::API_VERSION_1_3 {
                vk::API_VERSION_1_3
            } else {
                vk::API_VERSION_1_2
            });
        let messages: Messages = Arc::new(Mutex::new(Vec::new()));
        let mut messenger_info = vk::DebugUtilsMessengerCreateInfoEXT::default()
            .message_severity(
                vk::DebugUtilsMessageSeverityFlagsEXT::WARNING | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
            )
            .message_type(
                vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION | vk::DebugUtilsMessageTypeFlagsEXT::GENERAL,
            )
            .pfn_user_callback(Some(on_message))
            .user_data(Arc::as_ptr(&messages) as *mut c_void);
        let mut create = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&extensions);
        if req.validation {
            create = create.push_next(&mut messenger_info);
        }
        // SAFETY: the create info and everything it points to live on this frame.
        let instance =
            unsafe { entry.create_instance(&create, None) }.map_err(|e| BackendError::Unavailable {
                reason: format!("cannot create a Vulkan instance: {e}"),
            })?;
        let debug = if req.validation {
            let du = ash::ext::debug_utils::Instance::new(&entry, &instance);
            // SAFETY: the instance enabled VK_EXT_debug_utils; `messages` outlives the messenger
            // (both are owned by the `Gpu`, and the messenger is destroyed first).
            match unsafe { du.create_debug_utils_messenger(&messenger_info, None) } {
                Ok(m) => Some((du, m)),
                Err(e) => {
                    // SAFETY: nothing was created from the instance yet.
                    unsafe { instance.destroy_instance(None) };
                    return Err(BackendError::internal(format!(
                        "cannot create the debug messenger: {e}"
                    )));
                }
            }
        } else {
            None
        };
        let picked = Self::pick(&instance, req);
        let (physical, props) = match picked {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the messenger and instance are ours and unused from here on.
                unsafe {
                    if let Some((du, m)) = &debug {
                        du.destroy_debug_utils_messenger(*m, None);
                    }
                    instance.destroy_instance(None);
                }
                return Err(e);
            }
        };
        match Self::open_device(&entry, &instance, version, physical, &props, req) {
            Ok(o) => Ok(Gpu {
                _entry: entry,
                instance,
                debug,
                messages,
                physical,
                device: o.device,
                queue: o.queue,
                name: o.name,
                kind: o.kind,
                memory_bytes: o.memory_bytes,
                host_memory_bytes: o.host_memory_bytes,
                features: o.features,
                coopmat: o.coopmat,
                coopmat2: o.coopmat2,
                int_dot: o.int_dot,
                subgroup_32: o.subgroup_32,
                timestamp_period: o.timestamp_period,
                timeline: o.timeline,
                submitted: 0,
                wait_spin: std::time::Duration::ZERO,
                pool: o.pool,
                memory_types: o.memory_types,
                host_import: o.host_import,
                semaphore_fd: o.semaphore_fd,
                shared: o.shared,
                device_id: o.device_id,
                physical_device: o.physical_device,
                imported: Vec::new(),
                identity: o.identity,
                creation_feedback: o.creation_feedback,
                pipeline_stats: o.pipeline_stats,
            }),
            Err(e) => {
                // SAFETY: the messenger and instance are ours and unused from here on.
                unsafe {
                    if let Some((du, m)) = &debug {
                        du.destroy_debug_utils_messenger(*m, None);
                    }
                    instance.destroy_instance(None);
                }
                Err(e)
            }
        }
    }

    /// Chooses the device: the requested one, else the best-ranked suitable one.
    fn pick(
        instance: &ash::Instance,
        req: &DeviceRequest,
    ) -> Result<(vk::PhysicalDevice, vk::PhysicalDeviceProperties), BackendError> {
        // SAFETY: plain query of the instance.
        let physicals =
            unsafe { instance.enumerate_physical_devices() }.map_err(|e| BackendError::Unavailable {
                reason: format!("cannot list Vulkan devices: {e}"),
            })?;
        if physicals.is_empty() {
            return Err(BackendError::Unavailable {
                reason: "the Vulkan loader found no device (no driver installed? Debian: \
                         mesa-vulkan-drivers for lavapipe)"
                    .into(),
            });
        }
        let described: Vec<(vk::PhysicalDevice, vk::PhysicalDeviceProperties, String)> = physicals
            .iter()
            .map(|&p| {
                // SAFETY: `p` came from this instance.
                let props = unsafe { instance.get_physical_device_properties(p) };
                let name = device_name(&props);
                (p, props, name)
            })
            .collect();
        let listing = || {
            described
                .iter()
                .enumerate()
                .map(|(i, (_, _, n))| format!("{i}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if let Some(want) = &req.device {
            let hit = match want.parse::<usize>() {
                Ok(i) => described.get(i),
                Err(_) => described
                    .iter()
                    .find(|(_, _, n)| n.to_lowercase().contains(&want.to_lowercase())),
            };
            let Some((p, props, name)) = hit else {
                return Err(BackendError::Unavailable {
                    reason: format!("no Vulkan device matches '{want}' (devices: {})", listing()),
                });
            };
            let missing = missing_features(instance, *p);
            if !missing.is_empty() {
                return Err(BackendError::Unavailable {
                    reason: format!("Vulkan device '{name}' lacks {}", missing.join(", ")),
                });
            }
            return Ok((*p, *props));
        }
        let mut reasons = Vec::new();
        let mut best: Option<(u32, vk::PhysicalDevice, vk::PhysicalDeviceProperties)> = None;
        for (p, props, name) in &described {
            let missing = missing_features(instance, *p);
            if !missing.is_empty() {
                reasons.push(format!("'{name}' lacks {}", missing.join(", ")));
                continue;
            }
            let r = rank(props.device_type);
            if best.as_ref().is_none_or(|(b, _, _)| r < *b) {
                best = Some((r, *p, *props));
            }
        }
        best.map(|(_, p, props)| (p, props))
            .ok_or_else(|| BackendError::Unavailable {
                reason: format!("no suitable Vulkan device: {}", reasons.join("; ")),
            })
    }

    /// Opens `physical`: its device, queue, timeline and command pool, and what it reports.
    /// `instance_version` is the loader's, which caps the instance's API version.
    fn open_device(
        entry: &ash::Entry,
        instance: &ash::Instance,
        instance_version: u32,
        physical: vk::PhysicalDevice,
        props: &vk::PhysicalDeviceProperties,
        req: &DeviceRequest,
    ) -> Result<Opened, BackendError> {
        let name = device_name(props);
        // SAFETY: plain queries of a device of this instance.
        let (families, mem, exts) = unsafe {
            (
                instance.get_physical_device_queue_family_properties(physical),
                instance.get_physical_device_memory_properties(physical),
                instance
                    .enumerate_device_extension_properties(physical)
                    .unwrap_or_default(),
            )
        };
        let Some(family) = families
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        else {
            return Err(BackendError::Unavailable {
                reason: format!("Vulkan device '{name}' has no compute queue"),
            });
        };
        let timestamp_period = (families[family].timestamp_valid_bits > 0
            && props.limits.timestamp_period > 0.0)
            .then_some(props.limits.timestamp_period as f64);
        let has_ext = |n: &CStr| {
            exts.iter()
                .any(|e| e.extension_name_as_c_str().is_ok_and(|x| x == n))
        };
        let mut v11f = vk::PhysicalDeviceVulkan11Features::default();
        let mut v12f = vk::PhysicalDeviceVulkan12Features::default();
        // Subgroup size control: core in 1.3, else VK_EXT_subgroup_size_control.
        let size_control_ext = props.api_version < vk::API_VERSION_1_3;
        let size_control = !size_control_ext || has_ext(ash::ext::subgroup_size_control::NAME);
        let mut size_f = vk::PhysicalDeviceSubgroupSizeControlFeatures::default();
        let mut size_p = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
        let mut f2 = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut v11f)
            .push_next(&mut v12f);
        if size_control {
            f2 = f2.push_next(&mut size_f);
        }
        let mut sub = vk::PhysicalDeviceSubgroupProperties::default();
        let mut ids = vk::PhysicalDeviceIDProperties::default();
        let mut p2 = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut sub)
            .push_next(&mut ids);
        if size_control {
            p2 = p2.push_next(&mut size_p);
        }
        // SAFETY: as above (VkPhysicalDeviceIDProperties is core 1.1; the device has 1.2; the
        // subgroup size control structures are chained only where the device has them: 1.3 or
        // the extension).
        unsafe {
            instance.get_physical_device_features2(physical, &mut f2);
            instance.get_physical_device_properties2(physical, &mut p2);
        }
        let subgroup_32 = size_control
            && size_f.subgroup_size_control == vk::TRUE
            && wants_subgroup_32(sub.subgroup_size, &size_p);
        let device_id = format!("{}/{}", hex(&ids.driver_uuid), hex(&ids.device_uuid));
        let physical_device = hex(&ids.device_uuid);
        let host_import_alignment = (has_ext(ash::ext::external_memory_host::NAME)
            && host_import_supported(instance, physical))
        .then(|| host_import_alignment(instance, physical))
        .flatten();
        let timeline_fd =
            has_ext(ash::khr::external_semaphore_fd::NAME) && timeline_fd_supported(instance, physical);
        let memory_types: Vec<vk::MemoryPropertyFlags> = mem.memory_types[..mem.memory_type_count as usize]
            .iter()
            .map(|t| t.property_flags)
            .collect();
        let fp16 = v12f.shader_float16 == vk::TRUE;
        let memory_bytes: u64 = mem.memory_heaps[..mem.memory_heap_count as usize]
            .iter()
            .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .max()
            .unwrap_or(0);
        let host_memory_bytes: u64 = mem.memory_types[..mem.memory_type_count as usize]
            .iter()
            .filter(|t| t.property_flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE))
            .map(|t| mem.memory_heaps[t.heap_index as usize].size)
            .max()
            .unwrap_or(0);
        let mut features = vec![
            format!(
                "vulkan {}.{}.{}",
                vk::api_version_major(props.api_version),
                vk::api_version_minor(props.api_version),
                vk::api_version_patch(props.api_version)
            ),
            if subgroup_32 {
                format!("subgroup=32 (required; default {})", sub.subgroup_size)
            } else {
                format!("subgroup={}", sub.subgroup_size)
            },
            "buffer_device_address".into(),
        ];
        if fp16 {
            features.push("fp16".into());
        }
        // Packed 8-bit dot products (`matvec_dot_<fmt>`, through GL_EXT_spirv_intrinsics: the
        // vendored glslang cannot compile GL_EXT_integer_dot_product): the feature, and whether
        // the driver says the signed packed form is accelerated.
        let (has_int_dot, int_dot_fast) = if has_ext(ash::khr::shader_integer_dot_product::NAME)
            || props.api_version >= vk::API_VERSION_1_3
        {
            int_dot_support(instance, physical)
        } else {
            (false, false)
        };
        let int_dot = has_int_dot && req.int_dot.unwrap_or(int_dot_fast);
        if has_int_dot {
            features.push(
                match (int_dot, int_dot_fast) {
                    (true, true) => "int8_dot",
                    (true, false) => "int8_dot(not accelerated)",
                    (false, true) => "int8_dot(off)",
                    (false, false) => "int8_dot(not accelerated, off)",
                }
                .into(),
            );
        }
        // The prefill kernel's shape: 16x16x16, f16 x f16 -> f32, subgroup scope, 32 lanes.
        let coopmat = req.coopmat
            && has_ext(c"VK_KHR_cooperative_matrix")
            && fp16
            && v12f.vulkan_memory_model == vk::TRUE
            && (sub.subgroup_size == 32 || subgroup_32)
            && coopmat_f16_shape(entry, instance, physical);
        if coopmat {
            features.push("cooperative_matrix".into());
        }
        let coopmat2 = coopmat
            && req.coopmat2
            && props.api_version >= vk::API_VERSION_1_3
            && has_ext(c"VK_NV_cooperative_matrix2")
            && coopmat2::supported(entry, instance, physical);
        if coopmat2 {
            features.push("cooperative_matrix2".into());
        }
        // The product path prefill takes: NV cooperative matrix 2 (`matmul_cm2_<fmt>`; q4_k's
        // products on `matmul_khr`, faster there), KHR cooperative matrices on f16 tiles
        // (`matmul_khr_<fmt>`, `matmul_coopmat_<fmt>` below 128 rows), or the scalar tiled
        // kernel (`matmul_tiled_<fmt>`).
        let prefill = if coopmat2 {
            "coopmat2"
        } else if coopmat {
            "khr_f16"
        } else {
            "scalar"
        };
        features.push(format!("prefill={prefill}"));
        // Usage::HostWeight buffers live in host-visible memory, copied into a program's stream
        // buffer before each product that reads them (the engine's prefill op offload).
        features.push(tandem_backend_api::HOST_WEIGHTS_FEATURE.into());
        if has_ext(c"VK_EXT_subgroup_size_control") || props.api_version >= vk::API_VERSION_1_3 {
            features.push("subgroup_size_control".into());
        }
        if timestamp_period.is_some() {
            features.push("timestamps".into());
        }
        if host_import_alignment.is_some() {
            features.push("external_memory_host".into());
        }
        if timeline_fd {
            features.push("timeline_export".into());
        }
        // Pipeline creation feedback (the pipeline cache's hits): core where the instance and
        // the device both speak 1.3 (the instance asks for 1.3 where the loader has it), else
        // the extension, enabled where listed.
        let feedback_ext = has_ext(ash::ext::pipeline_creation_feedback::NAME);
        let feedback_core =
            instance_version >= vk::API_VERSION_1_3 && props.api_version >= vk::API_VERSION_1_3;
        let creation_feedback = feedback_core || feedback_ext;
        let identity = Identity {
            vendor_id: props.vendor_id,
            device_id: props.device_id,
            driver_version: props.driver_version,
            pipeline_cache_uuid: props.pipeline_cache_uuid,
        };
        let kind = match props.device_type {
            vk::PhysicalDeviceType::DISCRETE_GPU => DeviceKind::DiscreteGpu,
            vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceKind::IntegratedGpu,
            _ => DeviceKind::SoftwareGpu,
        };

        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family as u32)
            .queue_priorities(&priorities)];
        let mut en11 = vk::PhysicalDeviceVulkan11Features::default().storage_buffer16_bit_access(true);
        let mut en12 = vk::PhysicalDeviceVulkan12Features::default()
            .buffer_device_address(true)
            .timeline_semaphore(true)
            .scalar_block_layout(true)
            .storage_buffer8_bit_access(true)
            .shader_int8(true)
            .host_query_reset(v12f.host_query_reset == vk::TRUE)
            .shader_float16(coopmat)
            .vulkan_memory_model(coopmat);
        let mut en_coopmat =
            vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
        let mut en_coopmat2 = coopmat2::Features::enabled();
        let mut en_int_dot =
            vk::PhysicalDeviceShaderIntegerDotProductFeatures::default().shader_integer_dot_product(true);
        let mut en_size =
            vk::PhysicalDeviceSubgroupSizeControlFeatures::default().subgroup_size_control(true);
        let mut device_exts = Vec::new();
        if int_dot && props.api_version < vk::API_VERSION_1_3 {
            device_exts.push(ash::khr::shader_integer_dot_product::NAME.as_ptr());
        }
        if coopmat {
            device_exts.push(ash::khr::cooperative_matrix::NAME.as_ptr());
        }
        if subgroup_32 && size_control_ext {
            device_exts.push(ash::ext::subgroup_size_control::NAME.as_ptr());
        }
        if coopmat2 {
            device_exts.push(coopmat2::NAME.as_ptr());
        }
        // Both need VK_KHR_external_memory / VK_KHR_external_semaphore, core since 1.1 (the
        // instance asks for 1.2 or 1.3, and `missing_features` required a 1.2 device).
        if host_import_alignment.is_some() {
            device_exts.push(ash::ext::external_memory_host::NAME.as_ptr());
        }
        if timeline_fd {
            device_exts.push(ash::khr::external_semaphore_fd::NAME.as_ptr());
        }
        if feedback_ext && !feedback_core {
            device_exts.push(ash::ext::pipeline_creation_feedback::NAME.as_ptr());
        }
        // Pipeline statistics only where a tuning run asks for them (the extension's one
        // feature is required of every device that lists it).
        let stats_filter = std::env::var("TANDEM_VULKAN_PIPELINE_STATS")
            .ok()
            .filter(|f| !f.is_empty() && has_ext(ash::khr::pipeline_executable_properties::NAME));
        let mut en_stats = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
            .pipeline_executable_info(true);
        if stats_filter.is_some() {
            device_exts.push(ash::khr::pipeline_executable_properties::NAME.as_ptr());
        }
        let core = vk::PhysicalDeviceFeatures::default()
            .shader_int16(true)
            .shader_int64(true);
        let create = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_features(&core)
            .push_next(&mut en11)
            .push_next(&mut en12)
            .enabled_extension_names(&device_exts);
        let create = if coopmat {
            create.push_next(&mut en_coopmat)
        } else {
            create
        };
        let create = if coopmat2 {
            create.push_next(&mut en_coopmat2)
        } else {
            create
        };
        let create = if int_dot {
            create.push_next(&mut en_int_dot)
        } else {
            create
        };
        let create = if subgroup_32 {
            create.push_next(&mut en_size)
        } else {
            create
        };
        let create = if stats_filter.is_some() {
            create.push_next(&mut en_stats)
        } else {
            create
        };
        // SAFETY: the create info and its chain live on this frame; every feature enabled was
        // checked present by `missing_features` (the cooperative-matrix extension, its feature,
        // shaderFloat16 and vulkanMemoryModel only when `coopmat` found them; the NV
        // cooperative-matrix-2 extension and features only when `coopmat2::supported` did;
        // shaderIntegerDotProduct only when `int_dot_support` found it; subgroupSizeControl
        // (and, below 1.3, its extension) only when `subgroup_32` found it;
        // the external memory host, semaphore fd, pipeline creation feedback and pipeline
        // executable properties extensions only where the device lists them).
        let device = match unsafe { instance.create_device(physical, &create, None) } {
            Ok(d) => d,
            Err(e) => {
                return Err(BackendError::Unavailable {
                    reason: format!("cannot open Vulkan device '{name}': {e}"),
                })
            }
        };
        // SAFETY: the family was created with one queue.
        let queue = unsafe { device.get_device_queue(family as u32, 0) };
        let mut tl = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let sem_info = vk::SemaphoreCreateInfo::default().push_next(&mut tl);
        let pool_info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(family as u32)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: the device is valid; on failure everything created so far is destroyed.
        let made = unsafe {
            device.create_semaphore(&sem_info, None).and_then(|s| {
                device
                    .create_command_pool(&pool_info, None)
                    .map(|p| (s, p))
                    .inspect_err(|_| {
                        device.destroy_semaphore(s, None);
                    })
            })
        };
        let (timeline, pool) = match made {
            Ok(x) => x,
            Err(e) => {
                // SAFETY: the device has no other objects.
                unsafe { device.destroy_device(None) };
                return Err(BackendError::internal(format!(
                    "cannot set up Vulkan device '{name}': {e}"
                )));
            }
        };
        // The exportable twin of `timeline` (see `Gpu::shared`), where VK_KHR_external_semaphore_fd
        // is enabled (`timeline_fd_supported` found OPAQUE_FD timelines exportable).
        let shared = if timeline_fd {
            let mut tl = vk::SemaphoreTypeCreateInfo::default()
                .semaphore_type(vk::SemaphoreType::TIMELINE)
                .initial_value(0);
            let mut export = vk::ExportSemaphoreCreateInfo::default().handle_types(OPAQUE_FD);
            let info = vk::SemaphoreCreateInfo::default()
                .push_next(&mut tl)
                .push_next(&mut export);
            // SAFETY: the device is valid and enabled the extension; the chain lives here.
            match unsafe { device.create_semaphore(&info, None) } {
                Ok(s) => Some(s),
                Err(e) => {
                    // SAFETY: the pool and semaphore are the device's only objects.
                    unsafe {
                        device.destroy_command_pool(pool, None);
                        device.destroy_semaphore(timeline, None);
                        device.destroy_device(None);
                    }
                    return Err(BackendError::internal(format!(
                        "cannot create an exportable timeline on Vulkan device '{name}': {e}"
                    )));
                }
            }
        } else {
            None
        };
        let host_import = host_import_alignment.map(|alignment| HostImport {
            alignment,
            fns: ash::ext::external_memory_host::Device::new(instance, &device),
        });
        let semaphore_fd =
            timeline_fd.then(|| ash::khr::external_semaphore_fd::Device::new(instance, &device));
        let pipeline_stats = stats_filter.map(|filter| PipelineStats {
            filter,
            fns: ash::khr::pipeline_executable_properties::Device::new(instance, &device),
        });
        Ok(Opened {
            pipeline_stats,
            identity,
            creation_feedback,
            shared,
            memory_types,
            host_import,
            semaphore_fd,
            device_id,
            physical_device,
            device,
            host_memory_bytes,
            queue,
            name,
            kind,
            memory_bytes,
            features,
            coopmat,
            coopmat2,
            int_dot,
            subgroup_32,
            timestamp_period,
            timeline,
            pool,
        })
    }

    /// The first validation message received, if any.
    pub fn validation_error(&self) -> Option<String> {
        self.messages.lock().ok().and_then(|m| m.first().cloned())
    }

    /// The timeline value every finished submission has reached.
    pub fn completed(&self) -> Result<u64, BackendError> {
        // SAFETY: the semaphore is ours.
        map("vkGetSemaphoreCounterValue", &self.name, unsafe {
            self.device.get_semaphore_counter_value(self.timeline)
        })
    }

    /// Blocks until the timeline reaches `value`.
    pub fn wait_for(&self, value: u64) -> Result<(), BackendError> {
        if value == 0 || value > self.submitted {
            return Ok(());
        }
        if !self.wait_spin.is_zero() {
            // Poll first: a blocked waiter wakes late after a short submission (see
            // `wait_spin_us` in lib.rs), and the host has nothing else to do meanwhile.
            let start = std::time::Instant::now();
            let mut polls = 0u32;
            loop {
                if self.completed()? >= value {
                    return Ok(());
                }
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(16) && start.elapsed() > self.wait_spin {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        let sems = [self.timeline];
        let vals = [value];
        let info = vk::SemaphoreWaitInfo::default().semaphores(&sems).values(&vals);
        // SAFETY: the semaphore is ours; the value was (or will be) signalled by a submission.
        check("vkWaitSemaphores", &self.name, unsafe {
            self.device.wait_semaphores(&info, u64::MAX)
        })
    }

    /// Submits `cb`, signalling the next timeline value (on `timeline` and `shared`), which it
    /// returns. The device starts it only once each timeline semaphore of `waits` has reached
    /// its value (every stage waits).
    pub fn submit(
        &mut self,
        cb: vk::CommandBuffer,
        waits: &[(vk::Semaphore, u64)],
    ) -> Result<u64, BackendError> {
        let value = self.submitted + 1;
        let cbs = [cb];
        let both_sems = [self.timeline, self.shared.unwrap_or_default()];
        let both_vals = [value, value];
        let n = if self.shared.is_some() { 2 } else { 1 };
        let (sems, vals) = (&both_sems[..n], &both_vals[..n]);
        // Fixed arrays: a step's submission allocates nothing.
        if waits.len() > MAX_WAITS {
            return Err(BackendError::invalid(format!(
                "a submission may wait on at most {MAX_WAITS} timelines, not {}",
                waits.len()
            )));
        }
        let nw = waits.len();
        let mut wait_sems = [vk::Semaphore::null(); MAX_WAITS];
        let mut wait_vals = [0u64; MAX_WAITS];
        for (i, w) in waits.iter().enumerate() {
            (wait_sems[i], wait_vals[i]) = *w;
        }
        let wait_stages = [vk::PipelineStageFlags::ALL_COMMANDS; MAX_WAITS];
        let mut tl = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_vals[..nw])
            .signal_semaphore_values(vals);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&wait_sems[..nw])
            .wait_dst_stage_mask(&wait_stages[..nw])
            .command_buffers(&cbs)
            .signal_semaphores(sems)
            .push_next(&mut tl);
        // SAFETY: `cb` is a recorded command buffer of this device's pool that is not pending
        // (callers wait for its previous submission), the queue is used from this thread,
        // every wait and signal semaphore is a timeline semaphore of this device (ours or
        // imported), with as many values as semaphores, and `value` is above every value this
        // queue signalled before on `timeline` and `shared`.
        check("vkQueueSubmit", &self.name, unsafe {
            self.device.queue_submit(self.queue, &[submit], vk::Fence::null())
        })?;
        self.submitted = value;
        Ok(value)
    }

    /// The queue's timeline (`shared`, whose values are the tickets) as an opaque fd that the
    /// caller owns, with its kind and this device's [`Gpu::device_id`]; `None` where the device
    /// cannot export it.
    pub fn export_timeline(&self) -> Result<Option<SharedTimeline>, BackendError> {
        let (Some(fns), Some(shared)) = (&self.semaphore_fd, self.shared) else {
            return Ok(None);
        };
        let info = vk::SemaphoreGetFdInfoKHR::default()
            .semaphore(shared)
            .handle_type(OPAQUE_FD);
        // SAFETY: `shared` was created with VkExportSemaphoreCreateInfo(OPAQUE_FD), which the
        // device reported exportable; the new fd is the caller's.
        let fd = map("vkGetSemaphoreFdKHR", &self.name, unsafe {
            fns.get_semaphore_fd(&info)
        })?;
        Ok(Some(SharedTimeline {
            fd,
            kind: VULKAN_OPAQUE_FD.into(),
            device: self.device_id.clone(),
        }))
    }

    /// Imports another device's exported timeline (a duplicate of its fd; the caller keeps
    /// `t.fd`) as a timeline semaphore this queue can wait on; `None` where this device cannot
    /// import it (no `VK_KHR_external_semaphore_fd`, another kind, another driver or device).
    pub fn import_timeline(&mut self, t: &SharedTimeline) -> Result<Option<TimelineId>, BackendError> {
        let Some(fns) = &self.semaphore_fd else {
            return Ok(None);
        };
        if t.kind != VULKAN_OPAQUE_FD || t.device != self.device_id {
            return Ok(None);
        }
        if t.fd < 0 {
            return Err(BackendError::invalid(format!(
                "import_timeline: fd {} is not a file descriptor",
                t.fd
            )));
        }
        // SAFETY: `t.fd` is not -1 (checked above) and, by `SharedTimeline`'s contract, an fd
        // its exporter's caller keeps open for this call; the borrow ends with the statement,
        // and a closed fd makes the duplication fail (EBADF), not undefined behaviour.
        let dup = unsafe { BorrowedFd::borrow_raw(t.fd) }
            .try_clone_to_owned()
            .map_err(|e| {
                BackendError::invalid(format!("import_timeline: cannot duplicate fd {}: {e}", t.fd))
            })?;
        let mut ty = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let info = vk::SemaphoreCreateInfo::default().push_next(&mut ty);
        // SAFETY: a valid create info on our device (timelineSemaphore is enabled).
        let sem = map("vkCreateSemaphore", &self.name, unsafe {
            self.device.create_semaphore(&info, None)
        })?;
        let import = vk::ImportSemaphoreFdInfoKHR::default()
            .semaphore(sem)
            .handle_type(OPAQUE_FD)
            .fd(dup.as_raw_fd());
        // SAFETY: `sem` is a new, unused timeline semaphore of this device, like the exported
        // one (same driver and device, checked above); the fd is ours (the duplicate). On
        // success Vulkan owns the fd; on failure it does not, and `dup` closes it.
        match unsafe { fns.import_semaphore_fd(&import) } {
            Ok(()) => {
                let _ = dup.into_raw_fd();
            }
            Err(e) => {
                // SAFETY: the semaphore is ours and unused.
                unsafe { self.device.destroy_semaphore(sem, None) };
                return Err(match e {
                    vk::Result::ERROR_INVALID_EXTERNAL_HANDLE => BackendError::invalid(format!(
                        "import_timeline: fd {} is not a timeline of {}",
                        t.fd, self.name
                    )),
                    e => vk_err("vkImportSemaphoreFdKHR", &self.name, e),
                });
            }
        }
        self.imported.push(sem);
        Ok(Some(TimelineId(self.imported.len() as u64 - 1)))
    }

    /// The semaphore of an imported timeline; an error names an id `import_timeline` never
    /// returned.
    pub fn imported_timeline(&self, id: TimelineId) -> Result<vk::Semaphore, BackendError> {
        usize::try_from(id.0)
            .ok()
            .and_then(|i| self.imported.get(i).copied())
            .ok_or_else(|| {
                BackendError::invalid(format!(
                    "timeline {} was not imported by this backend ({} imported)",
                    id.0,
                    self.imported.len()
                ))
            })
    }
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every buffer's usage: storage, transfer source and destination, with a device address (the
/// feature the device is opened with; `memory` makes every buffer so, and host imports are
/// checked for it here).
pub const BUFFER_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw()
        | vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS.as_raw(),
);

/// Whether `physical` can import host allocations as buffers of [`BUFFER_USAGE`].
fn host_import_supported(instance: &ash::Instance, physical: vk::PhysicalDevice) -> bool {
    let info = vk::PhysicalDeviceExternalBufferInfo::default()
        .usage(BUFFER_USAGE)
        .handle_type(vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT);
    let mut out = vk::ExternalBufferProperties::default();
    // SAFETY: a plain query (core 1.1) of a device of this instance, which lists
    // VK_EXT_external_memory_host; `out` lives on this frame.
    unsafe { instance.get_physical_device_external_buffer_properties(physical, &info, &mut out) };
    out.external_memory_properties
        .external_memory_features
        .contains(vk::ExternalMemoryFeatureFlags::IMPORTABLE)
}

/// `minImportedHostPointerAlignment` of `physical` (which lists VK_EXT_external_memory_host);
/// `None` when it is not a power of two.
fn host_import_alignment(instance: &ash::Instance, physical: vk::PhysicalDevice) -> Option<u64> {
    let mut host = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
    let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut host);
    // SAFETY: a plain query of a device of this instance that has the extension; the chained
    // struct lives on this frame.
    unsafe { instance.get_physical_device_properties2(physical, &mut p2) };
    let a = host.min_imported_host_pointer_alignment;
    a.is_power_of_two().then_some(a)
}

/// Whether `physical` (which lists VK_KHR_external_semaphore_fd) can export and import timeline
/// semaphores as opaque fds.
fn timeline_fd_supported(instance: &ash::Instance, physical: vk::PhysicalDevice) -> bool {
    let mut ty = vk::SemaphoreTypeCreateInfo::default()
        .semaphore_type(vk::SemaphoreType::TIMELINE)
        .initial_value(0);
    let info = vk::PhysicalDeviceExternalSemaphoreInfo::default()
        .handle_type(OPAQUE_FD)
        .push_next(&mut ty);
    let mut out = vk::ExternalSemaphoreProperties::default();
    // SAFETY: a plain query (core 1.1) of a device of this instance; the chain lives here.
    unsafe { instance.get_physical_device_external_semaphore_properties(physical, &info, &mut out) };
    out.external_semaphore_features.contains(
        vk::ExternalSemaphoreFeatureFlags::EXPORTABLE | vk::ExternalSemaphoreFeatureFlags::IMPORTABLE,
    ) && out.compatible_handle_types.contains(OPAQUE_FD)
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: tearing down: every object created from the device has been destroyed by
        // its owner (the backend drops its buffers, programs and pipelines first), so waiting
        // for the device and destroying the pool, semaphore, device, messenger and instance in
        // that order is valid (imported timelines first: the idle queue no longer waits on them).
        unsafe {
            let _ = self.device.device_wait_idle();
            for s in self.imported.drain(..) {
                self.device.destroy_semaphore(s, None);
            }
            self.device.destroy_command_pool(self.pool, None);
            self.device.destroy_semaphore(self.timeline, None);
            if let Some(s) = self.shared.take() {
                self.device.destroy_semaphore(s, None);
            }
            self.device.destroy_device(None);
            if let Some((du, m)) = &self.debug {
                du.destroy_debug_utils_messenger(*m, None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

/// Whether pipelines should ask for subgroups of 32 on a device whose default subgroup size is
/// `default` and whose subgroup size control (enabled) reports `size`: the default is another,
/// and 32 is allowed in compute shaders for workgroups of up to 256 invocations (8 subgroups).
fn wants_subgroup_32(default: u32, size: &vk::PhysicalDeviceSubgroupSizeControlProperties) -> bool {
    default != 32
        && size.min_subgroup_size <= 32
        && size.max_subgroup_size >= 32
        && size.max_compute_workgroup_subgroups >= 8
        && size
            .required_subgroup_size_stages
            .contains(vk::ShaderStageFlags::COMPUTE)
}

/// Whether `physical` reports a 16x16x16 f16 x f16 -> f32 subgroup-scope cooperative-matrix
/// shape (the one `matmul_coopmat.comp` is compiled for), and has the feature.
fn coopmat_f16_shape(entry: &ash::Entry, instance: &ash::Instance, physical: vk::PhysicalDevice) -> bool {
    let mut cm = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut cm);
    // SAFETY: a plain query of a device of this instance, which has the extension.
    unsafe { instance.get_physical_device_features2(physical, &mut f2) };
    if cm.cooperative_matrix != vk::TRUE {
        return false;
    }
    let ext = ash::khr::cooperative_matrix::Instance::new(entry, instance);
    // SAFETY: the device has VK_KHR_cooperative_matrix (checked by the caller); the query
    // writes only into the vector it returns.
    let shapes =
        unsafe { ext.get_physical_device_cooperative_matrix_properties(physical) }.unwrap_or_default();
    shapes.iter().any(|s| {
        s.m_size == 16
            && s.n_size == 16
            && s.k_size == 16
            && s.a_type == vk::ComponentTypeKHR::FLOAT16
            && s.b_type == vk::ComponentTypeKHR::FLOAT16
            && s.c_type == vk::ComponentTypeKHR::FLOAT32
            && s.result_type == vk::ComponentTypeKHR::FLOAT32
            && s.scope == vk::ScopeKHR::SUBGROUP
    })
}

/// VK_NV_cooperative_matrix2, which ash 0.38 (Vulkan 1.3.281) predates: its feature struct and
/// shape query, spelled out from the Vulkan registry.
/// Whether `physical` has `shaderIntegerDotProduct` (the device has Vulkan 1.3 or
/// VK_KHR_shader_integer_dot_product), and whether its signed packed 4x8-bit dot product is
/// accelerated.
fn int_dot_support(instance: &ash::Instance, physical: vk::PhysicalDevice) -> (bool, bool) {
    let mut feat = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
    let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut feat);
    let mut prop = vk::PhysicalDeviceShaderIntegerDotProductProperties::default();
    let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut prop);
    // SAFETY: `physical` came from this instance; both chains are valid structures that live on
    // this frame, and the caller checked the device has Vulkan 1.3 or the extension that
    // defines them.
    unsafe {
        instance.get_physical_device_features2(physical, &mut f2);
        instance.get_physical_device_properties2(physical, &mut p2);
    }
    (
        feat.shader_integer_dot_product == vk::TRUE,
        prop.integer_dot_product4x8_bit_packed_signed_accelerated == vk::TRUE,
    )
}

mod coopmat2 {
    use std::ffi::{c_void, CStr};

    use ash::vk;

    /// The extension's name.
    pub const NAME: &CStr = c"VK_NV_cooperative_matrix2";

    const FEATURES: vk::StructureType = vk::StructureType::from_raw(1_000_593_000);
    const FLEXIBLE_PROPERTIES: vk::StructureType = vk::StructureType::from_raw(1_000_593_001);

    /// VkPhysicalDeviceCooperativeMatrix2FeaturesNV.
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct Features {
        s_type: vk::StructureType,
        p_next: *mut c_void,
        workgroup_scope: vk::Bool32,
        flexible_dimensions: vk::Bool32,
        reductions: vk::Bool32,
        conversions: vk::Bool32,
        per_element_operations: vk::Bool32,
        tensor_addressing: vk::Bool32,
        block_loads: vk::Bool32,
    }

    // SAFETY: `Features` is laid out as the registry's struct, starting with sType and pNext,
    // and the registry lists it as extending both.
    unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for Features {}
    // SAFETY: as above.
    unsafe impl vk::ExtendsDeviceCreateInfo for Features {}

    impl Features {
        fn empty() -> Self {
            Self {
                s_type: FEATURES,
                p_next: std::ptr::null_mut(),
                workgroup_scope: vk::FALSE,
                flexible_dimensions: vk::FALSE,
                reductions: vk::FALSE,
                conversions: vk::FALSE,
                per_element_operations: vk::FALSE,
                tensor_addressing: vk::FALSE,
                block_loads: vk::FALSE,
            }
        }

        /// The features `matmul_cm2.comp` uses.
        pub fn enabled() -> Self {
            Self {
                workgroup_scope: vk::TRUE,
                flexible_dimensions: vk::TRUE,
                tensor_addressing: vk::TRUE,
                block_loads: vk::TRUE,
                ..Self::empty()
            }
        }
    }

    /// VkCooperativeMatrixFlexibleDimensionsPropertiesNV.
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    struct FlexibleShape {
        s_type: vk::StructureType,
        p_next: *mut c_void,
        m_granularity: u32,
        n_granularity: u32,
        k_granularity: u32,
        a_type: vk::ComponentTypeKHR,
        b_type: vk::ComponentTypeKHR,
        c_type: vk::ComponentTypeKHR,
        result_type: vk::ComponentTypeKHR,
        saturating_accumulation: vk::Bool32,
        scope: vk::ScopeKHR,
        workgroup_invocations: u32,
    }

    type GetFlexibleShapes =
        unsafe extern "system" fn(vk::PhysicalDevice, *mut u32, *mut FlexibleShape) -> vk::Result;

    /// Whether `physical` (which lists the extension) has the features `matmul_cm2.comp` uses
    /// and an f16 x f16 -> f32 workgroup-scope shape for 256 invocations whose granularity
    /// divides its tiles (32).
    pub fn supported(entry: &ash::Entry, instance: &ash::Instance, physical: vk::PhysicalDevice) -> bool {
        let mut f = Features::empty();
        let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut f);
        // SAFETY: a plain query of a device of this instance; the chained struct lives here.
        unsafe { instance.get_physical_device_features2(physical, &mut f2) };
        let want = Features::enabled();
        if [
            (f.workgroup_scope, want.workgroup_scope),
            (f.flexible_dimensions, want.flexible_dimensions),
            (f.tensor_addressing, want.tensor_addressing),
            (f.block_loads, want.block_loads),
        ]
        .iter()
        .any(|(have, need)| *need == vk::TRUE && *have != vk::TRUE)
        {
            return false;
        }
        let name = c"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV";
        // SAFETY: the instance is valid and the name is NUL-terminated.
        let Some(raw) = (unsafe { entry.get_instance_proc_addr(instance.handle(), name.as_ptr()) }) else {
            return false;
        };
        // SAFETY: the loader returned this entry point for this name, whose signature the
        // registry gives as `GetFlexibleShapes`.
        let query: GetFlexibleShapes = unsafe { std::mem::transmute(raw) };
        let mut count = 0u32;
        // SAFETY: a count query (null array).
        if unsafe { query(physical, &mut count, std::ptr::null_mut()) } != vk::Result::SUCCESS {
            return false;
        }
        let blank = FlexibleShape {
            s_type: FLEXIBLE_PROPERTIES,
            p_next: std::ptr::null_mut(),
            m_granularity: 0,
            n_granularity: 0,
            k_granularity: 0,
            a_type: vk::ComponentTypeKHR::FLOAT16,
            b_type: vk::ComponentTypeKHR::FLOAT16,
            c_type: vk::ComponentTypeKHR::FLOAT16,
            result_type: vk::ComponentTypeKHR::FLOAT16,
            saturating_accumulation: vk::FALSE,
            scope: vk::ScopeKHR::SUBGROUP,
            workgroup_invocations: 0,
        };
        let mut shapes = vec![blank; count as usize];
        // SAFETY: `shapes` holds `count` initialised structs with sType set; the driver writes
        // at most `count` of them.
        let r = unsafe { query(physical, &mut count, shapes.as_mut_ptr()) };
        if r != vk::Result::SUCCESS && r != vk::Result::INCOMPLETE {
            return false;
        }
        shapes.truncate(count as usize);
        shapes.iter().any(|s| {
            s.scope == vk::ScopeKHR::WORKGROUP
                && s.workgroup_invocations == 256
                && s.a_type == vk::ComponentTypeKHR::FLOAT16
                && s.b_type == vk::ComponentTypeKHR::FLOAT16
                && s.c_type == vk::ComponentTypeKHR::FLOAT32
                && s.result_type == vk::ComponentTypeKHR::FLOAT32
                && [s.m_granularity, s.n_granularity, s.k_granularity]
                    .iter()
                    .all(|g| *g > 0 && 32 % g == 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(
        min: u32,
        max: u32,
        subgroups: u32,
        stages: vk::ShaderStageFlags,
    ) -> vk::PhysicalDeviceSubgroupSizeControlProperties<'static> {
        vk::PhysicalDeviceSubgroupSizeControlProperties::default()
            .min_subgroup_size(min)
            .max_subgroup_size(max)
            .max_compute_workgroup_subgroups(subgroups)
            .required_subgroup_size_stages(stages)
    }

    #[test]
    fn subgroups_of_32_are_asked_for_only_where_the_default_differs_and_32_is_allowed() {
        let compute = vk::ShaderStageFlags::COMPUTE;
        // AMD RDNA (RADV, AMDVLK): default 64, 32 to 64 in compute shaders.
        assert!(wants_subgroup_32(64, &size(32, 64, 16, compute)));
        // NVIDIA: already 32.
        assert!(!wants_subgroup_32(32, &size(32, 32, 32, compute)));
        // lavapipe: 8 only.
        assert!(!wants_subgroup_32(8, &size(8, 8, 128, compute)));
        // 32 allowed, but not for compute shaders, or not for workgroups of 256.
        assert!(!wants_subgroup_32(
            64,
            &size(32, 64, 16, vk::ShaderStageFlags::FRAGMENT)
        ));
        assert!(!wants_subgroup_32(64, &size(32, 64, 4, compute)));
    }
}
