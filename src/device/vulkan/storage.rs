//! Tensors on the Vulkan device: [`VulkanStorage`] (device-local buffers and the logical
//! size) and the operations [`crate::device::Tensor`] asks of every device: zeros, upload,
//! download, write, copy, synchronise, describe.
//!
//! A tensor larger than one buffer may hold ([`VulkanDevice::max_chunk_bytes`]: one
//! binding's range and one allocation) is stored in chunks of whole outermost rows (a KV
//! cache: whole blocks) where the device binds arrays of storage buffers; a kernel written
//! for it binds the chunks as one binding array ([`crate::device::wgsl::WgslRuntime::tensor_chunks`]),
//! every other kernel refuses it with a typed error.

use std::sync::Arc;

use crate::device::CpuStorage;
use crate::dtype::DType;
use crate::error::{Error, Result};

use super::{VulkanBuffer, VulkanDevice};

/// A tensor's elements in Vulkan storage buffers: one buffer, or chunks of
/// [`VulkanStorage::chunk_bytes`] each (the last may be shorter).
///
/// Each buffer is at least 4 bytes and a multiple of 4; `len_bytes` is the logical size.
/// `Clone` copies the buffers on the device.
pub struct VulkanStorage {
    buffers: Vec<Arc<VulkanBuffer>>,
    chunk_bytes: u64,
    bytes: u64,
    device: VulkanDevice,
}

impl VulkanStorage {
    /// The storage buffer of a tensor held in one buffer; `None` for a chunked one.
    pub fn single(&self) -> Option<&Arc<VulkanBuffer>> {
        match self.buffers.as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }

    /// The buffers in order: one, or the chunks.
    pub fn chunks(&self) -> &[Arc<VulkanBuffer>] {
        &self.buffers
    }

    /// Logical bytes of every chunk but the last (the whole size when there is one buffer).
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// Logical size in bytes (the buffers may be padded).
    pub fn len_bytes(&self) -> u64 {
        self.bytes
    }

    /// The device the buffers live on.
    pub fn device(&self) -> &VulkanDevice {
        &self.device
    }

    /// The logical byte range `(start, len)` of chunk `i`.
    fn chunk_range(&self, i: usize) -> (u64, u64) {
        let start = i as u64 * self.chunk_bytes;
        (start, self.chunk_bytes.min(self.bytes - start))
    }

    /// A device-side copy.
    pub fn try_clone(&self) -> Result<Self> {
        let buffers = self
            .buffers
            .iter()
            .map(|b| Ok(Arc::new(self.device.duplicate(b)?)))
            .collect::<Result<_>>()?;
        Ok(VulkanStorage {
            buffers,
            chunk_bytes: self.chunk_bytes,
            bytes: self.bytes,
            device: self.device.clone(),
        })
    }
}

impl Clone for VulkanStorage {
    /// A device-side copy ([`VulkanStorage::try_clone`]); `Clone` cannot return its
    /// allocation failure.
    fn clone(&self) -> Self {
        match self.try_clone() {
            Ok(s) => s,
            Err(e) => panic!("VulkanStorage::clone failed: {e}"),
        }
    }
}

impl std::fmt::Debug for VulkanStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanStorage")
            .field("bytes", &self.bytes)
            .field("chunks", &self.buffers.len())
            .field("device", &self.device.name())
            .finish()
    }
}

impl VulkanDevice {
    /// Bytes per chunk of a tensor of `bytes` bytes in `rows` outermost rows: `bytes` itself
    /// (one buffer) when it fits one ([`VulkanDevice::max_chunk_bytes`]) or when its rows
    /// cannot be chunked (they do not divide it evenly, a row is larger than a chunk or not
    /// whole 4-byte words: such a tensor stays one buffer, which only kernels that bind no
    /// more than one binding's range can use); else the most whole rows one buffer holds.
    /// Errors for a tensor larger than the device's memory, or one that would need more
    /// chunks than a kernel may bind.
    fn chunk_plan(&self, bytes: u64, rows: usize) -> Result<u64> {
        let info = &self.inner().wgsl;
        let too_large = |why: String| Error::Device {
            backend: "VULKAN".into(),
            message: format!("a tensor of {bytes} bytes {why} ({})", self.name()),
        };
        if bytes > info.memory_bytes {
            return Err(too_large(format!(
                "is larger than the device's {} bytes of memory",
                info.memory_bytes
            )));
        }
        let max = self.max_chunk_bytes();
        let rows = rows as u64;
        if bytes <= max || !info.binding_arrays || rows == 0 || !bytes.is_multiple_of(rows) {
            return Ok(bytes);
        }
        let row = bytes / rows;
        if row > max || !row.is_multiple_of(4) {
            return Ok(bytes);
        }
        let chunk = max / row * row;
        let chunks = bytes.div_ceil(chunk);
        if chunks > u64::from(info.max_chunks) {
            return Err(too_large(format!(
                "needs {chunks} chunks of {chunk} bytes, more than the {} a kernel may bind",
                info.max_chunks
            )));
        }
        Ok(chunk)
    }

    fn chunk_lens(bytes: u64, chunk: u64) -> impl Iterator<Item = u64> {
        let n = bytes.div_ceil(chunk.max(1)).max(1);
        (0..n).map(move |i| chunk.min(bytes - (i * chunk).min(bytes)))
    }

    /// `len` zeros of `dtype` in `rows` outermost rows (chunked as [`VulkanStorage`] says).
    pub fn tensor_zeros(&self, len: usize, dtype: DType, rows: usize) -> Result<VulkanStorage> {
        let bytes = (len as u64)
            .checked_mul(dtype.size_in_bytes() as u64)
            .ok_or_else(|| Error::overflow("Vulkan tensor", format!("{len} × {dtype}")))?;
        let chunk_bytes = self.chunk_plan(bytes, rows)?;
        let buffers = Self::chunk_lens(bytes, chunk_bytes)
            .map(|n| Ok(Arc::new(self.zeros(n)?)))
            .collect::<Result<_>>()?;
        Ok(VulkanStorage {
            buffers,
            chunk_bytes,
            bytes,
            device: self.clone(),
        })
    }

    /// Uploads host storage (the elements of `dtype`, little-endian) in `rows` outermost
    /// rows.
    pub fn tensor_upload(
        &self,
        host: &CpuStorage,
        dtype: DType,
        rows: usize,
    ) -> Result<VulkanStorage> {
        let data = host.as_bytes();
        let expected = host.len() * dtype.size_in_bytes();
        if data.len() != expected {
            return Err(Error::DType {
                what: "Vulkan upload",
                got: format!("{} bytes of host storage", data.len()),
                expected: format!("{} elements of {dtype}", host.len()),
            });
        }
        let bytes = data.len() as u64;
        let chunk_bytes = self.chunk_plan(bytes, rows)?;
        let chunk = chunk_bytes.max(1) as usize;
        let buffers = if data.is_empty() {
            vec![Arc::new(self.upload(data)?)]
        } else {
            data.chunks(chunk)
                .map(|c| Ok(Arc::new(self.upload(c)?)))
                .collect::<Result<_>>()?
        };
        Ok(VulkanStorage {
            buffers,
            chunk_bytes,
            bytes,
            device: self.clone(),
        })
    }

    /// Downloads to host storage (the copy runs after every earlier submission, so it holds
    /// the last dispatch's results).
    pub fn tensor_download(&self, s: &VulkanStorage, dtype: DType) -> Result<CpuStorage> {
        let mut bytes = Vec::with_capacity(s.bytes as usize);
        for (i, b) in s.buffers.iter().enumerate() {
            let (_, len) = s.chunk_range(i);
            bytes.extend_from_slice(&self.download(b)?[..len as usize]);
        }
        Ok(CpuStorage::from_bytes(&bytes, dtype))
    }

    /// Overwrites the whole tensor with `data` (exactly its bytes), chunk by chunk.
    pub fn tensor_write(&self, s: &VulkanStorage, data: &[u8]) -> Result<()> {
        if data.len() as u64 != s.bytes {
            return Err(Error::config(format!(
                "a write of {} bytes into a tensor of {}",
                data.len(),
                s.bytes
            )));
        }
        for (i, b) in s.buffers.iter().enumerate() {
            let (start, len) = s.chunk_range(i);
            self.write(b, 0, &data[start as usize..(start + len) as usize])?;
        }
        Ok(())
    }

    /// Copies `src` into `dst` (the same size and chunking) on the queue.
    pub fn tensor_copy(&self, src: &VulkanStorage, dst: &VulkanStorage) -> Result<()> {
        if src.bytes != dst.bytes || src.chunk_bytes != dst.chunk_bytes {
            return Err(Error::config(format!(
                "a copy of a {}-byte tensor in chunks of {} into a {}-byte one in chunks of {}",
                src.bytes, src.chunk_bytes, dst.bytes, dst.chunk_bytes
            )));
        }
        for (s, d) in src.buffers.iter().zip(&dst.buffers) {
            self.copy(s, d)?;
        }
        Ok(())
    }

    /// Waits for every submission so far to finish (dispatches return without waiting).
    pub fn synchronize(&self) -> Result<()> {
        self.wait_idle()
    }

    /// The subgroup size every pipeline of this device requires (`subgroupSizeControl`), or
    /// `None` where the driver picks one within the device's range.
    pub fn required_subgroup_size(&self) -> Option<u32> {
        self.inner().required_subgroup_size.map(|(n, _)| n)
    }

    /// One-line description: device, type, what the kernels may use.
    pub fn description(&self) -> String {
        let w = &self.inner().wgsl;
        let mut extras = Vec::new();
        if w.f16 {
            extras.push("f16".to_string());
        }
        if w.subgroups {
            let (min, max) = self.inner().device_subgroup_sizes;
            extras.push(match self.required_subgroup_size() {
                Some(n) if min < max => format!("subgroups of {n} (required, of {min}..{max})"),
                Some(n) => format!("subgroups of {n} (required)"),
                None => format!("subgroups {min}..{max}"),
            });
        }
        if w.coop {
            extras.push(
                if w.coop_bf16 {
                    "coop matrices f16 / bf16"
                } else {
                    "coop matrices f16"
                }
                .to_string(),
            );
        }
        extras.push(format!(
            "{} KiB shared, {} MiB per binding, larger caches in chunks of {} MiB ({})",
            w.max_workgroup_storage / 1024,
            w.max_binding_bytes >> 20,
            self.max_chunk_bytes() >> 20,
            if w.binding_array_any_index {
                "indexed"
            } else {
                "switch"
            }
        ));
        if self.inner().push.is_some() {
            extras.push("push descriptors".into());
        }
        if self.validation_enabled() {
            extras.push("validation".into());
        }
        format!(
            "vulkan: {} ({}; {})",
            self.name(),
            if w.is_cpu {
                "CPU implementation"
            } else {
                "GPU"
            },
            extras.join(", ")
        )
    }
}
