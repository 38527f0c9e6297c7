//! The WGSL family's MLA descriptor ([`WgslMlaBackend`], one per runtime: `WGPU_MLA`,
//! `VULKAN_MLA`).

use std::marker::PhantomData;

use crate::attention::MlaAttentionImpl;
use crate::backend::{
    AttentionBackend, Availability, BackendCapabilities, BlockSize, HeadSizes, Reason,
    SelectorConfig,
};
use crate::backends::mla_batch::MlaBatchBuilder;
use crate::device::{Device, DeviceKind};
use crate::dtype::{CacheDType, DType};
use crate::error::Result;
use crate::kernels::wgsl::MlaDecodeShader;
use crate::metadata::AttentionMetadataBuilder;
use crate::mla::{AbsorbedWeights, MlaParams};

use super::{WgslBackendRuntime, WgslMlaAttentionImpl};

/// The MLA descriptor of the WGSL family on runtime `R` (named [`WgslBackendRuntime::MLA_BACKEND`],
/// ranked ten places after the runtime's standard backend: after the native MLA backends on
/// a GPU, after `CPU_MLA` on a CPU implementation).
///
/// What it declares holds on every device (16-bit and fp8 elements are unpacked with
/// integer arithmetic); what depends on the device is checked once it is open: a decode
/// step must fit its workgroup memory, and the latent cache one storage binding (its size
/// depends on the dtype: a typed error naming the binding limit when the kernels bind it).
#[derive(Debug)]
pub struct WgslMlaBackend<R: WgslBackendRuntime> {
    caps: BackendCapabilities,
    runtime: PhantomData<R>,
}

impl<R: WgslBackendRuntime> WgslMlaBackend<R> {
    /// The descriptor (touches no device).
    pub fn new() -> Self {
        WgslMlaBackend {
            runtime: PhantomData,
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

impl<R: WgslBackendRuntime> Default for WgslMlaBackend<R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R: WgslBackendRuntime> AttentionBackend for WgslMlaBackend<R> {
    fn name(&self) -> &str {
        R::MLA_BACKEND
    }

    fn device_kind(&self) -> DeviceKind {
        R::KIND
    }

    /// The runtime's standard rank, ten places later (WGPU_MLA 410 / 1110, VULKAN_MLA
    /// 310 / 1060: on a CPU implementation after `CPU_MLA`, which runs natively on the cores
    /// lavapipe emulates a GPU on).
    fn priority(&self) -> u32 {
        R::rank(10)
    }

    fn availability(&self) -> Availability {
        R::availability()
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn device(&self) -> Result<Device> {
        Ok(R::open()?.device())
    }

    /// Adapter-dependent checks: a latent cache of the configuration's size (when given)
    /// must fit one storage binding (or, where the device binds arrays of buffers to hold it
    /// in chunks, its memory), and a decode step of the latent the workgroup memory.
    fn supports_combination(&self, config: &SelectorConfig) -> Option<Reason> {
        let dev = R::open().ok()?;
        // Devices with binding arrays store a larger cache in chunks of whole blocks, up to
        // their memory (a block is checked against a binding at allocation).
        if let Some(bytes) = config.kv_cache_bytes {
            if let Err(e) = dev.info().check_cache(bytes, 0) {
                return Some(Reason::new("KV cache too large", e.to_string()));
            }
        }
        let limit = dev.info().max_workgroup_storage;
        let block = config.block_size.unwrap_or(16);
        MlaDecodeShader::keys_for(config.head_size as u32, block, limit)
            .is_none()
            .then(|| {
                Reason::new(
                    "head_size not supported",
                    format!(
                        "a decode step of {}-wide latents needs more than this device's \
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
        Ok(Box::new(WgslMlaAttentionImpl::new(
            params,
            &weights,
            R::open()?,
        )?))
    }

    /// Block sizes that are multiples of 16.
    fn make_mla_builder(&self, block_size: usize) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.checked_mla_cache_shape(1, block_size, 576)?;
        Ok(Box::new(MlaBatchBuilder::new(
            R::MLA_BACKEND,
            block_size,
            R::open()?.device(),
        )))
    }
}
