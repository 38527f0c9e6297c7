//! The HIP MLA backend's descriptor.

use crate::attention::MlaAttentionImpl;
use crate::backend::{AttentionBackend, Availability, BackendCapabilities, BlockSize, HeadSizes};
use crate::backends::hip::HipBackend;
use crate::device::{Device, DeviceKind, HipDevice};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::metadata::AttentionMetadataBuilder;
use crate::mla::{AbsorbedWeights, MlaParams};

use super::metadata_builder::hip_mla_builder;
use super::HipMlaAttentionImpl;

/// The HIP MLA backend descriptor (name `HIP_MLA`, ranked after `CUDA_MLA` and before the
/// wgpu and CPU MLA backends).
///
/// Available when the HIP backend's device is: `libamdhip64` loads, AMD GPU 0 opens, its
/// target is one the kernel family knows and its wavefront is the one the family builds for
/// it.
#[derive(Debug)]
pub struct HipMlaBackend {
    caps: BackendCapabilities,
    /// The standard HIP descriptor of the same GPU: its probe (runtime, device, target).
    hip: HipBackend,
}

impl HipMlaBackend {
    /// The descriptor for AMD GPU 0. Touches no runtime until asked.
    pub fn new() -> Self {
        HipMlaBackend {
            caps: BackendCapabilities::mla(
                // The kernels are built for DeepSeek's 512 + 64 latent (FlashMLA's 576).
                HeadSizes::List(vec![576]),
                vec![DType::F16, DType::Bf16],
                vec![
                    CacheDType::Auto,
                    CacheDType::F16,
                    CacheDType::Bf16,
                    CacheDType::Fp8E4m3,
                ],
                // The decode reads chunks of 32 keys that never cross a block (as CUDA_MLA).
                vec![BlockSize::Exact(32), BlockSize::Exact(64)],
                // The portable kernels need no particular AMD generation.
                None,
            ),
            hip: HipBackend::new(),
        }
    }

    /// The opened device, or why it is not available.
    pub fn hip_device(&self) -> Result<HipDevice> {
        self.hip.hip_device().map_err(|e| match e {
            Error::Device { message, .. } => Error::Device {
                backend: "HIP_MLA".into(),
                message,
            },
            other => other,
        })
    }
}

impl Default for HipMlaBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl AttentionBackend for HipMlaBackend {
    fn name(&self) -> &str {
        "HIP_MLA"
    }

    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Hip
    }

    fn priority(&self) -> u32 {
        210
    }

    fn availability(&self) -> Availability {
        self.hip.availability()
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn device(&self) -> Result<Device> {
        Ok(Device::Hip(self.hip_device()?))
    }

    crate::mla_backend_rejects_standard_layers!();

    fn make_mla_impl(
        &self,
        params: MlaParams,
        weights: AbsorbedWeights,
    ) -> Result<Box<dyn MlaAttentionImpl>> {
        self.check_mla_layer(&params, &weights)?;
        Ok(Box::new(HipMlaAttentionImpl::new(
            params,
            &weights,
            self.hip_device()?,
        )?))
    }

    /// Block sizes 32 and 64.
    fn make_mla_builder(&self, block_size: usize) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.mla_kv_cache_shape(1, block_size, 576)?;
        Ok(Box::new(hip_mla_builder(block_size, self.hip_device()?)))
    }

    /// Block sizes 32 and 64, head size 576.
    fn mla_kv_cache_shape(
        &self,
        num_blocks: usize,
        block_size: usize,
        head_size: usize,
    ) -> Result<[usize; 3]> {
        self.checked_mla_cache_shape(num_blocks, block_size, head_size)
    }
}
