//! Tensors on the Vulkan device: [`VulkanStorage`] (a shared device-local buffer and its
//! logical size) and the operations [`crate::device::Tensor`] asks of every device: zeros,
//! upload, download, synchronise, describe.

use std::sync::Arc;

use crate::device::CpuStorage;
use crate::dtype::DType;
use crate::error::{Error, Result};

use super::{VulkanBuffer, VulkanDevice};

/// A tensor's elements in a Vulkan storage buffer.
///
/// The buffer is at least 4 bytes and a multiple of 4; `len_bytes` is the logical size.
/// `Clone` copies the buffer on the device.
pub struct VulkanStorage {
    buffer: Arc<VulkanBuffer>,
    bytes: u64,
    device: VulkanDevice,
}

impl VulkanStorage {
    /// The storage buffer.
    pub fn buffer(&self) -> &Arc<VulkanBuffer> {
        &self.buffer
    }

    /// Logical size in bytes (the buffer may be padded).
    pub fn len_bytes(&self) -> u64 {
        self.bytes
    }

    /// The device the buffer lives on.
    pub fn device(&self) -> &VulkanDevice {
        &self.device
    }

    /// A device-side copy.
    pub fn try_clone(&self) -> Result<Self> {
        Ok(VulkanStorage {
            buffer: Arc::new(self.device.duplicate(&self.buffer)?),
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
            .field("device", &self.device.name())
            .finish()
    }
}

impl VulkanDevice {
    /// `len` zeros of `dtype`.
    pub fn tensor_zeros(&self, len: usize, dtype: DType) -> Result<VulkanStorage> {
        let bytes = (len as u64)
            .checked_mul(dtype.size_in_bytes() as u64)
            .ok_or_else(|| Error::overflow("Vulkan tensor", format!("{len} × {dtype}")))?;
        Ok(VulkanStorage {
            buffer: Arc::new(self.zeros(bytes)?),
            bytes,
            device: self.clone(),
        })
    }

    /// Uploads host storage (the elements of `dtype`, little-endian).
    pub fn tensor_upload(&self, host: &CpuStorage, dtype: DType) -> Result<VulkanStorage> {
        let data = host.as_bytes();
        let expected = host.len() * dtype.size_in_bytes();
        if data.len() != expected {
            return Err(Error::DType {
                what: "Vulkan upload",
                got: format!("{} bytes of host storage", data.len()),
                expected: format!("{} elements of {dtype}", host.len()),
            });
        }
        Ok(VulkanStorage {
            buffer: Arc::new(self.upload(data)?),
            bytes: data.len() as u64,
            device: self.clone(),
        })
    }

    /// Downloads to host storage (the copy runs after every earlier submission, so it holds
    /// the last dispatch's results).
    pub fn tensor_download(&self, s: &VulkanStorage, dtype: DType) -> Result<CpuStorage> {
        let bytes = self.download(&s.buffer)?;
        Ok(CpuStorage::from_bytes(&bytes[..s.bytes as usize], dtype))
    }

    /// Waits for every submission so far to finish (dispatches return without waiting).
    pub fn synchronize(&self) -> Result<()> {
        self.wait_idle()
    }

    /// One-line description: device, type, what the kernels may use.
    pub fn description(&self) -> String {
        let w = &self.inner().wgsl;
        let mut extras = Vec::new();
        if w.f16 {
            extras.push("f16".to_string());
        }
        if w.subgroups {
            extras.push(format!(
                "subgroups {}..{}",
                w.subgroup_sizes.0, w.subgroup_sizes.1
            ));
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
            "{} KiB shared, {} MiB per binding",
            w.max_workgroup_storage / 1024,
            w.max_binding_bytes >> 20
        ));
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
