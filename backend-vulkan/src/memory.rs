//! Buffers and their memory, suballocated by gpu-allocator: device-local for weights, KV caches
//! and program arenas, host-visible for step arguments, graph inputs/outputs and staging. Every
//! buffer is addressed by the kernels through its device address. Device-local buffers count
//! against the backend's budget (the device-local heap, or the smaller option `memory_limit`):
//! one that would pass it is refused before Vulkan is asked.

use ash::vk;
use gpu_allocator::vulkan::{
    Allocation, AllocationCreateDesc, AllocationScheme, Allocator, AllocatorCreateDesc,
};
use gpu_allocator::MemoryLocation;
use tandem_backend_api::BackendError;

use crate::device::Gpu;

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Device-local, reached by the host only through staging copies.
    Device,
    /// Host-visible and coherent, mapped for the buffer's lifetime.
    Host,
}

/// A buffer with its memory and device address.
pub struct GpuBuffer {
    pub buffer: vk::Buffer,
    allocation: Option<Allocation>,
    pub size: u64,
    pub address: u64,
    pub place: Place,
}

impl GpuBuffer {
    /// The mapped bytes of a host-visible buffer.
    pub fn mapped(&mut self) -> Option<&mut [u8]> {
        let size = self.size as usize;
        self.allocation
            .as_mut()
            .and_then(|a| a.mapped_slice_mut())
            .map(|s| &mut s[..size])
    }
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
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST
                    | vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS,
            )
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
            allocation: Some(allocation),
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
        if let (Some(a), Some(allocator)) = (b.allocation.take(), self.allocator.as_mut()) {
            let _ = allocator.free(a);
        }
        self.in_use = self.in_use.saturating_sub(b.size);
        if b.place == Place::Device {
            self.device_in_use = self.device_in_use.saturating_sub(b.size);
        }
    }

    /// Drops the allocator (before the device goes).
    pub fn shut_down(&mut self) {
        self.allocator = None;
    }
}
