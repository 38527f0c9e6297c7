//! The wgpu backend's descriptor.

use crate::attention::{AttentionImpl, AttentionParams};
use crate::backend::{
    AttentionBackend, Availability, BackendCapabilities, GraphCaptureSupport, Reason,
    SelectorConfig,
};
use crate::device::{Device, DeviceKind, WgpuDevice};
use crate::dtype::CacheDType;
use crate::error::{Error, Result};
use crate::kv_cache::KvCacheSpec;
use crate::metadata::AttentionMetadataBuilder;

use super::{WgpuAttentionImpl, WgpuMetadataBuilder};
use crate::backends::wgsl_family::{wgsl_capabilities, wgsl_combination_veto, wgsl_kv_cache_shape};

/// The wgpu backend descriptor (name `WGPU`, priority 400: after CUDA, HIP and Vulkan, before
/// the CPU).
///
/// What it declares holds on every adapter: 16-bit and fp8 elements are packed into u32
/// words and converted with integer arithmetic, so f16 and bf16 need no adapter feature.
/// What depends on the adapter is checked once it is open: the head size must leave a tile
/// that fits the adapter's workgroup memory, and a KV cache must fit one storage binding
/// (lavapipe 128 MiB, the H200 2 GiB; larger caches are an error, not split).
#[derive(Debug)]
pub struct WgpuBackend {
    caps: BackendCapabilities,
}

impl WgpuBackend {
    /// The descriptor (touches no device).
    pub fn new() -> Self {
        WgpuBackend {
            // wgpu has no re-submittable command buffers.
            caps: wgsl_capabilities(GraphCaptureSupport::Never),
        }
    }
}

/// `hardware` on a GPU adapter, `software` on a CPU implementation (lavapipe, llvmpipe,
/// WARP), which emulates a GPU on the cores the CPU backends use natively (the wgpu backends'
/// rule).
pub(crate) fn adapter_priority(hardware: u32, software: u32) -> u32 {
    match WgpuDevice::open() {
        Ok(d) if d.adapter_info().device_type == wgpu::DeviceType::Cpu => software,
        _ => hardware,
    }
}

/// Whether the wgpu device opens (its description), or why not.
pub(crate) fn adapter_availability() -> Availability {
    match WgpuDevice::open() {
        Ok(d) => Availability::Available(d.description()),
        Err(Error::Device { message, .. }) => Availability::Unavailable(message),
        Err(e) => Availability::Unavailable(e.to_string()),
    }
}

impl Default for WgpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl AttentionBackend for WgpuBackend {
    fn name(&self) -> &str {
        "WGPU"
    }

    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Wgpu
    }

    /// 400 for a hardware adapter: after the native paths, before the CPU. A software
    /// adapter (lavapipe, llvmpipe, WARP: `DeviceType::Cpu`) emulates a GPU on the same
    /// cores the CPU backend uses natively, so it ranks after the CPU backend (1100); it
    /// stays selectable by `POLYATTN_BACKEND=wgpu`.
    fn priority(&self) -> u32 {
        adapter_priority(400, 1100)
    }

    fn availability(&self) -> Availability {
        adapter_availability()
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn device(&self) -> Result<Device> {
        Ok(Device::Wgpu(WgpuDevice::open()?))
    }

    /// Adapter-dependent checks: a tile of this head size must fit the workgroup memory, and
    /// a KV cache of the configuration's size (when given) one storage binding.
    fn supports_combination(&self, config: &SelectorConfig) -> Option<Reason> {
        let dev = WgpuDevice::open().ok()?;
        wgsl_combination_veto(dev.wgsl_info(), &self.caps, config)
    }

    /// The cache must fit one storage binding of the adapter.
    fn check_kv_cache(&self, spec: &KvCacheSpec, num_blocks: usize) -> Result<()> {
        let bytes = spec.cache_bytes(num_blocks)?;
        WgpuDevice::open()?
            .wgsl_info()
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
        let dev = WgpuDevice::open().ok();
        wgsl_kv_cache_shape(
            "WGPU",
            &self.caps,
            dev.as_ref().map(|d| d.wgsl_info()),
            num_blocks,
            block_size,
            num_kv_heads,
            head_size,
            cache_dtype,
        )
    }

    fn make_impl(&self, params: AttentionParams) -> Result<Box<dyn AttentionImpl>> {
        self.check_layer(&params)?;
        Ok(Box::new(WgpuAttentionImpl::new(
            WgpuDevice::open()?,
            params,
        )?))
    }

    fn make_builder(&self, spec: &KvCacheSpec) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.check_cache_spec(spec)?;
        Ok(Box::new(WgpuMetadataBuilder::new(
            WgpuDevice::open()?,
            *spec,
        )))
    }
}
