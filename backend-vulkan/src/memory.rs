//! Buffers and their memory, suballocated by gpu-allocator: device-local for weights, KV caches
//! and program arenas, host-visible for step arguments, graph inputs/outputs and staging. Every
//! buffer is addressed by the kernels through its device address. Device-local buffers count
//! against the backend's budget (the device-local heap, or the smaller option `memory_limit`):
//! one that would pass it is refused before Vulkan is asked.
//!
//! Host memory the caller allocated can also be imported as a buffer
//! (`VK_EXT_external_memory_host`, [`Memory::import`]): its `vk::DeviceMemory` is ours, not
//! gpu-allocator's, and its bytes stay the caller's.

use ash::vk;
use gpu_allocator::vulkan::{
    Allocation, AllocationCreateDesc, AllocationScheme, Allocator, AllocatorCreateDesc,
};
use gpu_allocator::MemoryLocation;
use tandem_backend_api::BackendError;

use crate::device::{Gpu, BUFFER_USAGE};

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Device-local, reached by the host only through staging copies.
    Device,
    /// Host-visible and coherent, mapped for the buffer's lifetime.
    Host,
}

/// The start of a host region imported as a buffer.
#[derive(Debug, Clone, Copy)]
struct HostPtr(*mut u8);

// SAFETY: the pointer is only dereferenced (in `GpuBuffer::mapped`) through `&mut GpuBuffer`,
// by whichever thread owns the backend; the caller of `import_host` promised that the region
// stays valid and is not accessed through Rust references until the buffer is freed, whatever
// thread the backend has moved to.
unsafe impl Send for HostPtr {}

/// What a buffer's memory is.
enum Backing {
    /// Suballocated by gpu-allocator.
    Allocated(Allocation),
    /// Host memory imported with `VK_EXT_external_memory_host`: the device memory object is
    /// ours (freed with `vkFreeMemory` after the buffer), the `len` bytes at `ptr` the caller's.
    Imported { memory: vk::DeviceMemory, ptr: HostPtr },
}

/// A buffer with its memory and device address.
pub struct GpuBuffer {
    pub buffer: vk::Buffer,
    backing: Option<Backing>,
    pub size: u64,
    pub address: u64,
    pub place: Place,
}

impl GpuBuffer {
    /// The mapped bytes of a host-visible buffer (for an imported one, the imported region).
    pub fn mapped(&mut self) -> Option<&mut [u8]> {
        let size = self.size as usize;
        match self.backing.as_mut()? {
            Backing::Allocated(a) => a.mapped_slice_mut().map(|s| &mut s[..size]),
            // SAFETY: `Memory::import` checked the pointer non-null and made the buffer `size`
            // bytes of it; the caller of `import_host` keeps those bytes valid for reads and
            // writes, and touches them through no Rust reference, until the buffer is freed;
            // the slice borrows `self` mutably, so it is the only one made here at a time.
            Backing::Imported { ptr, .. } => Some(unsafe { std::slice::from_raw_parts_mut(ptr.0, size) }),
        }
    }
}

/// The memory type among `bits` for imported host memory: host-visible and coherent where one
/// is, else any.
fn host_memory_type(gpu: &Gpu, bits: u32) -> Option<u32> {
    let wanted = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
    let types = &gpu.memory_types;
    let allowed = |i: &u32| bits & (1 << i) != 0;
    (0..types.len() as u32)
        .filter(allowed)
        .find(|&i| types[i as usize].contains(wanted))
        .or_else(|| (0..types.len() as u32).find(allowed))
}

/// The allocator and the byte counts `memory()` reports.
pub struct Memory {
    allocator: Option<Allocator>,
    pub in_use: u64,
    pub peak: u64,
    /// The most device-local bytes the backend may hold.
    pub budget: u64,
    /// Device-local bytes held now (part of `in_use`).
    pub device_in_use: u64,
}

fn alloc_err(device: &str, size: u64, e: gpu_allocator::AllocationError) -> BackendError {
    match e {
        gpu_allocator::AllocationError::OutOfMemory => BackendError::OutOfMemory {
            requested: size,
            available: 0,
        },
        e => BackendError::internal(format!("allocating {size} bytes on {device}: {e}")),
    }
}

impl Memory {
    pub fn new(gpu: &Gpu, budget: u64) -> Result<Memory, BackendError> {
        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: gpu.instance.clone(),
            device: gpu.device.clone(),
            physical_device: gpu.physical,
            debug_settings: Default::default(),
            buffer_device_address: true,
            allocation_sizes: Default::default(),
        })
        .map_err(|e| BackendError::internal(format!("memory allocator on {}: {e}", gpu.name)))?;
        Ok(Memory {
            allocator: Some(allocator),
            in_use: 0,
            peak: 0,
            budget,
            device_in_use: 0,
        })
    }

    /// Device-local bytes the budget has left.
    pub fn device_available(&self) -> u64 {
        self.budget.saturating_sub(self.device_in_use)
    }

    /// A buffer of at least `size` bytes (rounded up to 4, at least 4) usable as storage,
    /// transfer source and destination, with a device address. A device-local one past the
    /// budget is `OutOfMemory`.
    pub fn create(
        &mut self,
        gpu: &Gpu,
        size: u64,
        place: Place,
        name: &str,
    ) -> Result<GpuBuffer, BackendError> {
        let size = size.max(4).div_ceil(4).saturating_mul(4);
        if place == Place::Device && size > self.device_available() {
            return Err(BackendError::OutOfMemory {
                requested: size,
                available: self.device_available(),
            });
        }
        let allocator = self
            .allocator
            .as_mut()
            .ok_or_else(|| BackendError::internal("the allocator is gone"))?;
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(BUFFER_USAGE)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid create info on our device.
        let buffer = crate::device::map("vkCreateBuffer", &gpu.name, unsafe {
            gpu.device.create_buffer(&info, None)
        })?;
        // SAFETY: `buffer` was just created on this device.
        let requirements = unsafe { gpu.device.get_buffer_memory_requirements(buffer) };
        let location = match place {
            Place::Device => MemoryLocation::GpuOnly,
            Place::Host => MemoryLocation::GpuToCpu,
        };
        let allocation = match allocator.allocate(&AllocationCreateDesc {
            name,
            requirements,
            location,
            linear: true,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        }) {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: the buffer is unbound and unused.
                unsafe { gpu.device.destroy_buffer(buffer, None) };
                return Err(alloc_err(&gpu.name, size, e));
            }
        };
        // SAFETY: the allocation satisfies the buffer's requirements; neither is in use.
        let bound = unsafe {
            gpu.device
                .bind_buffer_memory(buffer, allocation.memory(), allocation.offset())
        };
        if let Err(e) = bound {
            // SAFETY: as above; the allocation goes back to the allocator.
            unsafe { gpu.device.destroy_buffer(buffer, None) };
            let _ = allocator.free(allocation);
            return Err(crate::device::vk_err("vkBindBufferMemory", &gpu.name, e));
        }
        let addr_info = vk::BufferDeviceAddressInfo::default().buffer(buffer);
        // SAFETY: the buffer has SHADER_DEVICE_ADDRESS usage and bound memory.
        let address = unsafe { gpu.device.get_buffer_device_address(&addr_info) };
        let mut b = GpuBuffer {
            buffer,
            backing: Some(Backing::Allocated(allocation)),
            size,
            address,
            place,
        };
        if place == Place::Host {
            match b.mapped() {
                Some(m) => m.fill(0),
                None => {
                    self.destroy(gpu, b);
                    return Err(BackendError::internal(format!(
                        "host-visible memory on {} is not mapped",
                        gpu.name
                    )));
                }
            }
        }
        self.in_use += size;
        if place == Place::Device {
            self.device_in_use += size;
        }
        self.peak = self.peak.max(self.in_use);
        Ok(b)
    }

    /// Destroys a buffer the device no longer uses.
    pub fn destroy(&mut self, gpu: &Gpu, mut b: GpuBuffer) {
        // SAFETY: callers wait for every submission using the buffer before destroying it.
        unsafe { gpu.device.destroy_buffer(b.buffer, None) };
        match b.backing.take() {
            Some(Backing::Allocated(a)) => {
                if let Some(allocator) = self.allocator.as_mut() {
                    let _ = allocator.free(a);
                }
            }
            // SAFETY: the buffer bound to this memory was destroyed above; nothing else uses it.
            Some(Backing::Imported { memory, .. }) => unsafe { gpu.device.free_memory(memory, None) },
            None => {}
        }
        self.in_use = self.in_use.saturating_sub(b.size);
        if b.place == Place::Device {
            self.device_in_use = self.device_in_use.saturating_sub(b.size);
        }
    }

    /// Imports the caller's host memory `ptr..ptr + len` (`VK_EXT_external_memory_host`) as a
    /// buffer of `len` bytes with the usage and device address of [`Memory::create`]'s, in
    /// place [`Place::Host`] (counted in `in_use`, not against the device budget). The caller
    /// checked that the device imports host memory, that `ptr` is non-null and that `ptr` and
    /// `len` are non-zero multiples of its alignment.
    ///
    /// # Safety
    /// The region must be valid for reads and writes, and not be freed or accessed through Rust
    /// references, until the buffer is destroyed.
    pub unsafe fn import(&mut self, gpu: &Gpu, ptr: *mut u8, len: u64) -> Result<GpuBuffer, BackendError> {
        let Some(host) = gpu.host_import.as_ref() else {
            return Err(BackendError::unsupported(
                "import_host",
                format!("{} lacks VK_EXT_external_memory_host", gpu.name),
            ));
        };
        let handle = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
        let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle);
        let info = vk::BufferCreateInfo::default()
            .size(len)
            .usage(BUFFER_USAGE)
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut external);
        // SAFETY: a valid create info on our device, which enabled VK_EXT_external_memory_host
        // (and has VK_KHR_external_memory, core since 1.1).
        let buffer = crate::device::map("vkCreateBuffer (imported host memory)", &gpu.name, unsafe {
            gpu.device.create_buffer(&info, None)
        })?;
        let destroy_buffer = || {
            // SAFETY: the buffer is ours, unbound or bound to memory freed after it, and unused.
            unsafe { gpu.device.destroy_buffer(buffer, None) }
        };
        // SAFETY: `buffer` was just created on this device.
        let requirements = unsafe { gpu.device.get_buffer_memory_requirements(buffer) };
        let mut host_props = vk::MemoryHostPointerPropertiesEXT::default();
        // SAFETY: the device enabled the extension whose entry point this is; `ptr` is a
        // non-null host pointer aligned as the device asks (checked by the caller), and
        // `host_props` lives on this frame.
        let got = unsafe {
            (host.fns.fp().get_memory_host_pointer_properties_ext)(
                gpu.device.handle(),
                handle,
                ptr as *const std::ffi::c_void,
                &mut host_props,
            )
        }
        .result();
        if let Err(e) = got {
            destroy_buffer();
            return Err(match e {
                vk::Result::ERROR_INVALID_EXTERNAL_HANDLE => BackendError::invalid(format!(
                    "import_host: {} cannot import the host memory at {ptr:p}",
                    gpu.name
                )),
                e => crate::device::vk_err("vkGetMemoryHostPointerPropertiesEXT", &gpu.name, e),
            });
        }
        if requirements.size > len {
            destroy_buffer();
            return Err(BackendError::invalid(format!(
                "import_host: a buffer of {len} bytes needs {} bytes of memory on {}",
                requirements.size, gpu.name
            )));
        }
        let Some(memory_type) =
            host_memory_type(gpu, host_props.memory_type_bits & requirements.memory_type_bits)
        else {
            destroy_buffer();
            return Err(BackendError::unsupported(
                "import_host",
                format!(
                    "{} has no memory type for both imported host memory (types {:#x}) and \
                     buffers (types {:#x})",
                    gpu.name, host_props.memory_type_bits, requirements.memory_type_bits
                ),
            ));
        };
        let mut import = vk::ImportMemoryHostPointerInfoEXT::default()
            .handle_type(handle)
            .host_pointer(ptr as *mut std::ffi::c_void);
        let mut flags = vk::MemoryAllocateFlagsInfo::default().flags(vk::MemoryAllocateFlags::DEVICE_ADDRESS);
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(len)
            .memory_type_index(memory_type)
            .push_next(&mut import)
            .push_next(&mut flags);
        // SAFETY: the chain lives on this frame; the pointer and size are aligned as the
        // device asks, the memory type is one the host pointer allows, and the caller keeps
        // the region valid until the memory is freed (`destroy`).
        let memory = match unsafe { gpu.device.allocate_memory(&alloc, None) } {
            Ok(m) => m,
            Err(e) => {
                destroy_buffer();
                return Err(crate::device::vk_err(
                    &format!("vkAllocateMemory (importing {len} bytes of host memory)"),
                    &gpu.name,
                    e,
                ));
            }
        };
        // SAFETY: the memory is `len` bytes of a type the buffer allows, at offset 0; neither
        // is in use.
        if let Err(e) = unsafe { gpu.device.bind_buffer_memory(buffer, memory, 0) } {
            destroy_buffer();
            // SAFETY: the memory is ours and nothing is bound to it.
            unsafe { gpu.device.free_memory(memory, None) };
            return Err(crate::device::vk_err("vkBindBufferMemory", &gpu.name, e));
        }
        let addr_info = vk::BufferDeviceAddressInfo::default().buffer(buffer);
        // SAFETY: the buffer has SHADER_DEVICE_ADDRESS usage and memory allocated with the
        // DEVICE_ADDRESS flag bound.
        let address = unsafe { gpu.device.get_buffer_device_address(&addr_info) };
        self.in_use += len;
        self.peak = self.peak.max(self.in_use);
        Ok(GpuBuffer {
            buffer,
            backing: Some(Backing::Imported {
                memory,
                ptr: HostPtr(ptr),
            }),
            size: len,
            address,
            place: Place::Host,
        })
    }

    /// Drops the allocator (before the device goes).
    pub fn shut_down(&mut self) {
        self.allocator = None;
    }
}
