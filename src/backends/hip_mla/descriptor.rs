//! The HIP MLA backend's descriptor.

use crate::attention::MlaAttentionImpl;
use crate::backend::{AttentionBackend, Availability, BackendCapabilities};
use crate::backends::cuda_family_mla::cuda_family_mla_capabilities;
use crate::backends::hip::HipBackend;
use crate::device::{Device, DeviceKind, HipDevice};
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
            // The portable kernels need no particular AMD generation.
            caps: cuda_family_mla_capabilities(None),
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
}
