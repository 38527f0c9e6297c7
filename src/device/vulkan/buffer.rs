//! Device-local storage buffers and their transfers: [`VulkanBuffer`] (a `VkBuffer` with its
//! `gpu-allocator` allocation), uploads and downloads through a host-visible staging buffer
//! and a copy on the queue (see the module docs of [`super`] for why).

use ash::vk;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};
use gpu_allocator::MemoryLocation;

use crate::error::{Error, Result};

use std::sync::Arc;

use super::{vk_error, Inner, VulkanDevice};

/// A buffer of the device, freed when dropped.
pub struct VulkanBuffer {
    device: Arc<Inner>,
    buffer: vk::Buffer,
    allocation: Option<Allocation>,
    len: u64,
}

impl std::fmt::Debug for VulkanBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanBuffer")
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for VulkanBuffer {
    fn drop(&mut self) {
        // SAFETY: the buffer was created on this device; a pending submission that binds it
        // holds it (`queue::Keep`), and every other one was waited on, so the device no
        // longer reads or writes it.
        unsafe { self.device.device.destroy_buffer(self.buffer, None) };
        if let (Some(a), Ok(mut alloc)) = (self.allocation.take(), self.device.allocator.lock()) {
            if let Some(alloc) = alloc.as_mut() {
                let _ = alloc.free(a);
            }
        }
    }
}

impl VulkanBuffer {
    /// Its size in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.len
    }

    pub(crate) fn raw(&self) -> vk::Buffer {
        self.buffer
    }
}

fn alloc_error(e: impl std::fmt::Display) -> Error {
    Error::Device {
        backend: "VULKAN".into(),
        message: format!("gpu-allocator: {e}"),
    }
}

impl VulkanDevice {
    /// A buffer of `bytes` bytes (at least 4) at `location`, usable as a storage, uniform,
    /// copy source and copy destination buffer.
    fn buffer_at(&self, bytes: u64, location: MemoryLocation, name: &str) -> Result<VulkanBuffer> {
        let len = bytes.max(4).next_multiple_of(4);
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::UNIFORM_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let info = vk::BufferCreateInfo::default()
            .size(len)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let d = self.raw();
        // SAFETY: a valid device and create info.
        let buffer =
            unsafe { d.create_buffer(&info, None) }.map_err(|e| vk_error("vkCreateBuffer", e))?;
        // SAFETY: `buffer` was just created on this device.
        let requirements = unsafe { d.get_buffer_memory_requirements(buffer) };
        let allocation = {
            let mut guard = self
                .inner()
                .allocator
                .lock()
                .map_err(|_| alloc_error("the allocator lock is poisoned"))?;
            let allocator = guard
                .as_mut()
                .ok_or_else(|| alloc_error("the device is closing"))?;
            allocator.allocate(&AllocationCreateDesc {
                name,
                requirements,
                location,
                linear: true,
                allocation_scheme: AllocationScheme::GpuAllocatorManaged,
            })
        };
        let allocation = match allocation {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: the buffer is unused and has no memory bound.
                unsafe { d.destroy_buffer(buffer, None) };
                return Err(alloc_error(e));
            }
        };
        // SAFETY: the allocation satisfies the buffer's requirements (gpu-allocator's
        // contract) and is bound once.
        if let Err(e) =
            unsafe { d.bind_buffer_memory(buffer, allocation.memory(), allocation.offset()) }
        {
            // SAFETY: as above.
            unsafe { d.destroy_buffer(buffer, None) };
            if let Ok(mut g) = self.inner().allocator.lock() {
                if let Some(a) = g.as_mut() {
                    let _ = a.free(allocation);
                }
            }
            return Err(vk_error("vkBindBufferMemory", e));
        }
        Ok(VulkanBuffer {
            device: self.inner_arc().clone(),
            buffer,
            allocation: Some(allocation),
            len,
        })
    }

    /// A device-local buffer of `bytes` bytes, zeroed.
    pub fn zeros(&self, bytes: u64) -> Result<VulkanBuffer> {
        let b = self.buffer_at(bytes, MemoryLocation::GpuOnly, "polyattn buffer")?;
        let (raw, len) = (b.raw(), b.len);
        self.submit_and_wait(|cmd| {
            // SAFETY: `cmd` is recording; the buffer is a transfer destination of `len` bytes.
            unsafe { self.raw().cmd_fill_buffer(cmd, raw, 0, len, 0) };
        })?;
        Ok(b)
    }

    /// A device-local buffer holding `data`.
    pub fn upload(&self, data: &[u8]) -> Result<VulkanBuffer> {
        let b = self.buffer_at(
            data.len() as u64,
            MemoryLocation::GpuOnly,
            "polyattn buffer",
        )?;
        self.write(&b, 0, data)?;
        Ok(b)
    }

    /// A host-visible buffer of `bytes` bytes that [`VulkanDevice::write_mapped`] fills
    /// without a transfer (small, often rewritten buffers: parameter slots).
    pub(crate) fn mapped_buffer(&self, bytes: u64) -> Result<VulkanBuffer> {
        self.buffer_at(bytes, MemoryLocation::CpuToGpu, "polyattn parameters")
    }

    /// Writes `data` at the start of a host-visible buffer made by
    /// [`VulkanDevice::mapped_buffer`]. The caller makes sure no pending submission reads it
    /// (the parameter blocks wait for the last submission that read them); the next
    /// submission sees the write.
    pub(crate) fn write_mapped(&self, dst: &VulkanBuffer, data: &[u8]) -> Result<()> {
        if data.len() as u64 > dst.len {
            return Err(Error::config(format!(
                "a write of {} bytes does not fit a {}-byte buffer",
                data.len(),
                dst.len
            )));
        }
        let mapped = dst
            .allocation
            .as_ref()
            .and_then(|a| a.mapped_ptr())
            .ok_or_else(|| alloc_error("the parameter buffer is not host-mapped"))?;
        // SAFETY: the mapping covers `dst.len` bytes, at least `data.len()`; no submission
        // reads it now (the caller's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), mapped.as_ptr() as *mut u8, data.len())
        };
        Ok(())
    }

    /// One host-visible uniform parameter slot, for code that records its own steps (the
    /// benchmark probes); [`VulkanDevice::write_param_slot`] fills it.
    pub fn mapped_param_slot(&self) -> Result<VulkanBuffer> {
        self.mapped_buffer(crate::device::wgsl::PARAM_SLOT_BYTES)
    }

    /// Writes a parameter slot made by [`VulkanDevice::mapped_param_slot`] (no submission
    /// of this device that reads it may be pending: the probes that use it wait for each).
    pub fn write_param_slot(
        &self,
        slot: &VulkanBuffer,
        words: &crate::device::wgsl::Slot,
    ) -> Result<()> {
        self.write_mapped(slot, bytemuck::cast_slice(words))
    }

    /// A device-local copy of `src`.
    pub fn duplicate(&self, src: &VulkanBuffer) -> Result<VulkanBuffer> {
        let dst = self.buffer_at(src.len, MemoryLocation::GpuOnly, "polyattn buffer")?;
        let region = vk::BufferCopy::default().size(src.len);
        self.submit_and_wait(|cmd| {
            // SAFETY: both buffers live across the wait; the region is inside both.
            unsafe {
                self.raw()
                    .cmd_copy_buffer(cmd, src.raw(), dst.raw(), &[region])
            };
        })?;
        Ok(dst)
    }

    /// Copies `src` into the start of `dst` (at least as large) on the queue, ordered after
    /// every earlier submission.
    pub fn copy(&self, src: &VulkanBuffer, dst: &VulkanBuffer) -> Result<()> {
        if dst.len < src.len {
            return Err(Error::config(format!(
                "a copy of {} bytes into a buffer of {}",
                src.len, dst.len
            )));
        }
        if src.len == 0 {
            return Ok(());
        }
        let region = vk::BufferCopy::default().size(src.len);
        self.submit_and_wait(|cmd| {
            // SAFETY: both buffers live across the wait; the region is inside both.
            unsafe {
                self.raw()
                    .cmd_copy_buffer(cmd, src.raw(), dst.raw(), &[region])
            };
        })
    }

    /// Copies `data` into `dst` at byte `offset` (a multiple of 4).
    pub fn write(&self, dst: &VulkanBuffer, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset.checked_add(data.len() as u64);
        if !offset.is_multiple_of(4) || end.is_none_or(|e| e > dst.len) {
            return Err(Error::config(format!(
                "a write of {} bytes at offset {offset} does not fit a {}-byte buffer at a \
                 4-byte boundary",
                data.len(),
                dst.len
            )));
        }
        let staging = self.buffer_at(
            data.len() as u64,
            MemoryLocation::CpuToGpu,
            "polyattn staging",
        )?;
        let mapped = staging
            .allocation
            .as_ref()
            .and_then(|a| a.mapped_ptr())
            .ok_or_else(|| alloc_error("the staging buffer is not host-mapped"))?;
        // SAFETY: the mapping covers at least `data.len()` bytes and nothing else uses it.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), mapped.as_ptr() as *mut u8, data.len())
        };
        let region = vk::BufferCopy::default()
            .src_offset(0)
            .dst_offset(offset)
            .size(data.len() as u64);
        self.submit_and_wait(|cmd| {
            // SAFETY: both buffers live across the wait; the region is inside both.
            unsafe {
                self.raw()
                    .cmd_copy_buffer(cmd, staging.raw(), dst.raw(), &[region])
            };
        })
    }

    /// The contents of `src`.
    pub fn download(&self, src: &VulkanBuffer) -> Result<Vec<u8>> {
        let staging = self.buffer_at(src.len, MemoryLocation::GpuToCpu, "polyattn readback")?;
        let region = vk::BufferCopy::default().size(src.len);
        self.submit_and_wait(|cmd| {
            // SAFETY: both buffers live across the wait; the region is inside both. The
            // barrier makes the copy's writes visible to the host read below.
            unsafe {
                self.raw()
                    .cmd_copy_buffer(cmd, src.raw(), staging.raw(), &[region]);
                let barrier = vk::MemoryBarrier::default()
                    .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                    .dst_access_mask(vk::AccessFlags::HOST_READ);
                self.raw().cmd_pipeline_barrier(
                    cmd,
                    vk::PipelineStageFlags::TRANSFER,
                    vk::PipelineStageFlags::HOST,
                    vk::DependencyFlags::empty(),
                    &[barrier],
                    &[],
                    &[],
                );
            }
        })?;
        let alloc = staging
            .allocation
            .as_ref()
            .ok_or_else(|| alloc_error("the readback buffer has no memory"))?;
        let mapped = alloc
            .mapped_slice()
            .ok_or_else(|| alloc_error("the readback buffer is not host-mapped"))?;
        Ok(mapped[..src.len as usize].to_vec())
    }
}
