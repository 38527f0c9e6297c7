//! The wgpu MLA backend's descriptor.

use crate::attention::MlaAttentionImpl;
use crate::backend::{
    AttentionBackend, Availability, BackendCapabilities, BlockSize, HeadSizes, Reason,
    SelectorConfig,
};
use crate::device::wgpu::check_binding;
use crate::device::{Device, DeviceKind, WgpuDevice};
use crate::dtype::{CacheDType, DType};
use crate::error::Result;
use crate::kernels::wgsl::MlaDecodeShader;
use crate::metadata::AttentionMetadataBuilder;
use crate::mla::{AbsorbedWeights, MlaParams};

use crate::backends::wgpu::{adapter_availability, adapter_priority};

use super::metadata_builder::wgpu_mla_builder;
use super::WgpuMlaAttentionImpl;

/// The wgpu MLA backend descriptor (name `WGPU_MLA`; ranked beside `WGPU`: after the native
/// MLA backends on a hardware adapter, after `CPU_MLA` on a software one).
///
/// What it declares holds on every adapter (16-bit and fp8 elements are unpacked with
/// integer arithmetic); what depends on the adapter is checked once it is open: a decode
/// step must fit its workgroup memory, and the latent cache one storage binding (its size
/// depends on the dtype: a typed error naming the binding limit when the kernels bind it).
#[derive(Debug)]
pub struct WgpuMlaBackend {
    caps: BackendCapabilities,
}

impl WgpuMlaBackend {
    /// The descriptor (touches no device).
    pub fn new() -> Self {
        WgpuMlaBackend {
            caps: BackendCapabilities::mla(
                // vLLM's MLA head sizes: kv_lora_rank + rope (512 + 64, 256 + 64).
                HeadSizes::List(vec![320, 576]),
                vec![DType::F32, DType::F16, DType::Bf16],
                vec![
                    CacheDType::Auto,
                    CacheDType::F16,
                    CacheDType::Bf16,
                    CacheDType::Fp8E4m3,
                ],
                // A decode step (8 positions where the workgroup memory allows) never
                // crosses a block.
                vec![BlockSize::MultipleOf(16)],
                None,
            ),
        }
    }
}

impl Default for WgpuMlaBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl AttentionBackend for WgpuMlaBackend {
    fn name(&self) -> &str {
        "WGPU_MLA"
    }

    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Wgpu
    }

    /// `WGPU`'s rule, ten places later: 410 on a hardware adapter, 1110 on a software one
    /// (after `CPU_MLA`, which runs natively on the cores lavapipe emulates a GPU on).
    fn priority(&self) -> u32 {
        adapter_priority(410, 1110)
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

    /// Adapter-dependent checks: a latent cache of the configuration's size (when given)
    /// must fit one storage binding, and a decode step of the latent the workgroup memory.
    fn supports_combination(&self, config: &SelectorConfig) -> Option<Reason> {
        let dev = WgpuDevice::open().ok()?;
        if let Some(bytes) = config.kv_cache_bytes {
            if let Err(e) = check_binding(&dev, bytes, "the latent cache") {
                return Some(Reason::new("KV cache too large", e.to_string()));
            }
        }
        let limit = dev.limits().max_compute_workgroup_storage_size;
        let block = config.block_size.unwrap_or(16);
        MlaDecodeShader::keys_for(config.head_size as u32, block, limit)
            .is_none()
            .then(|| {
                Reason::new(
                    "head_size not supported",
                    format!(
                        "a decode step of {}-wide latents needs more than this adapter's \
                         {limit} bytes of workgroup memory",
                        config.head_size
                    ),
                )
            })
    }

    crate::mla_backend_rejects_standard_layers!();

    fn make_mla_impl(
        &self,
        params: MlaParams,
        weights: AbsorbedWeights,
    ) -> Result<Box<dyn MlaAttentionImpl>> {
        self.check_mla_layer(&params, &weights)?;
        Ok(Box::new(WgpuMlaAttentionImpl::new(
            params,
            &weights,
            WgpuDevice::open()?,
        )?))
    }

    /// Block sizes that are multiples of 16.
    fn make_mla_builder(&self, block_size: usize) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.checked_mla_cache_shape(1, block_size, 576)?;
        Ok(Box::new(wgpu_mla_builder(block_size, WgpuDevice::open()?)))
    }
}
