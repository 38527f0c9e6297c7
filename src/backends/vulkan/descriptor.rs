//! The Vulkan backend's descriptor.

use crate::attention::{AttentionImpl, AttentionParams};
use crate::backend::{
    AttentionBackend, Availability, BackendCapabilities, GraphCaptureSupport, Reason,
    SelectorConfig,
};
use crate::backends::wgsl_family::{wgsl_capabilities, wgsl_combination_veto, wgsl_kv_cache_shape};
use crate::device::wgsl::WgslRuntime;
use crate::device::{Device, DeviceKind, VulkanDevice};
use crate::dtype::CacheDType;
use crate::error::{Error, Result};
use crate::kv_cache::KvCacheSpec;
use crate::metadata::AttentionMetadataBuilder;

use super::{VulkanAttentionImpl, VulkanMetadataBuilder};

/// The Vulkan backend descriptor (name `VULKAN`, priority 300: after CUDA and HIP, before
/// wgpu and the CPU on a GPU; after the CPU backend on a CPU implementation such as lavapipe).
///
/// It declares what the WGSL family declares on every device (16-bit and fp8 elements are
/// unpacked with integer arithmetic); what depends on the device is checked once it is open:
/// a tile of the head size must fit the workgroup memory, and a KV cache one storage binding
/// (`maxStorageBufferRange`: 4 GiB − 1 on the H200's driver, 128 MiB on lavapipe).
#[derive(Debug)]
pub struct VulkanBackend {
    caps: BackendCapabilities,
}

impl VulkanBackend {
    /// The descriptor (touches no device).
    pub fn new() -> Self {
        VulkanBackend {
            // Command buffers are recorded per call; none is re-submitted yet.
            caps: wgsl_capabilities(GraphCaptureSupport::Never),
        }
    }
}

impl Default for VulkanBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl AttentionBackend for VulkanBackend {
    fn name(&self) -> &str {
        "VULKAN"
    }

    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Vulkan
    }

    /// 300 on a GPU: after the native CUDA and HIP paths, before wgpu. A CPU implementation
    /// (lavapipe, SwiftShader) emulates a GPU on the cores the CPU backend uses natively, so
    /// it ranks after the CPU backend (1050, before wgpu's software adapter); it stays
    /// selectable by `POLYATTN_BACKEND=vulkan`.
    fn priority(&self) -> u32 {
        match VulkanDevice::global() {
            Ok(d) if d.info().is_cpu => 1050,
            _ => 300,
        }
    }

    fn availability(&self) -> Availability {
        match VulkanDevice::global() {
            Ok(d) => Availability::Available(d.description()),
            Err(Error::Device { message, .. }) => Availability::Unavailable(message),
            Err(e) => Availability::Unavailable(e.to_string()),
        }
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn device(&self) -> Result<Device> {
        Ok(Device::Vulkan(VulkanDevice::global()?))
    }

    /// Device-dependent checks: a tile of this head size must fit the workgroup memory, and
    /// a KV cache of the configuration's size (when given) one storage binding.
    fn supports_combination(&self, config: &SelectorConfig) -> Option<Reason> {
        let dev = VulkanDevice::global().ok()?;
        wgsl_combination_veto(dev.info(), &self.caps, config)
    }

    /// The cache must fit one storage binding of the device.
    fn check_kv_cache(&self, spec: &KvCacheSpec, num_blocks: usize) -> Result<()> {
        let bytes = spec.cache_bytes(num_blocks)?;
        VulkanDevice::global()?
            .info()
            .check_binding(bytes, "the KV cache")
    }

    fn kv_cache_shape(
        &self,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_size: usize,
        cache_dtype: CacheDType,
    ) -> Result<[usize; 5]> {
        let dev = VulkanDevice::global().ok();
        wgsl_kv_cache_shape(
            "VULKAN",
            &self.caps,
            dev.as_ref().map(|d| d.info()),
            num_blocks,
            block_size,
            num_kv_heads,
            head_size,
            cache_dtype,
        )
    }

    fn make_impl(&self, params: AttentionParams) -> Result<Box<dyn AttentionImpl>> {
        self.check_layer(&params)?;
        Ok(Box::new(VulkanAttentionImpl::new(
            VulkanDevice::global()?,
            params,
        )?))
    }

    fn make_builder(&self, spec: &KvCacheSpec) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.check_cache_spec(spec)?;
        Ok(Box::new(VulkanMetadataBuilder::new(
            VulkanDevice::global()?,
            *spec,
        )))
    }
}
