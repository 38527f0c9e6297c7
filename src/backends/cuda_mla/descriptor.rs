//! The CUDA MLA backend's descriptor.

use crate::attention::MlaAttentionImpl;
use crate::backend::{AttentionBackend, Availability, BackendCapabilities, DeviceCapability};
use crate::backends::cuda::CudaBackend;
use crate::backends::cuda_family_mla::cuda_family_mla_capabilities;
use crate::device::{CudaDevice, Device, DeviceKind};
use crate::error::{Error, Result};
use crate::metadata::AttentionMetadataBuilder;
use crate::mla::{AbsorbedWeights, MlaParams};

use super::metadata_builder::cuda_mla_builder;
use super::CudaMlaAttentionImpl;

/// The CUDA MLA backend descriptor (name `CUDA_MLA`, ranked first among MLA backends).
///
/// Available when the CUDA backend's device is: the driver loads, GPU `POLYATTN_CUDA_DEVICE`
/// (default 0) opens and NVRTC loads.
#[derive(Debug)]
pub struct CudaMlaBackend {
    caps: BackendCapabilities,
    /// The standard CUDA descriptor of the same GPU: its probe (driver, device, NVRTC).
    cuda: CudaBackend,
}

impl CudaMlaBackend {
    /// The descriptor for the GPU named by `POLYATTN_CUDA_DEVICE` (default 0). Touches no
    /// driver until asked.
    pub fn new() -> Self {
        CudaMlaBackend {
            // cp.async, ldmatrix and bf16 mma.sync.
            caps: cuda_family_mla_capabilities(Some(DeviceCapability { major: 8, minor: 0 })),
            cuda: CudaBackend::new(),
        }
    }

    /// The opened device, or why it is not available.
    pub fn cuda_device(&self) -> Result<CudaDevice> {
        self.cuda.cuda_device().map_err(|e| match e {
            Error::Device { message, .. } => Error::Device {
                backend: "CUDA_MLA".into(),
                message,
            },
            other => other,
        })
    }
}

impl Default for CudaMlaBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl AttentionBackend for CudaMlaBackend {
    fn name(&self) -> &str {
        "CUDA_MLA"
    }

    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn priority(&self) -> u32 {
        110
    }

    fn availability(&self) -> Availability {
        self.cuda.availability()
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn device(&self) -> Result<Device> {
        Ok(Device::Cuda(self.cuda_device()?))
    }

    fn device_capability(&self) -> Option<DeviceCapability> {
        self.cuda.device_capability()
    }

    crate::mla_backend_rejects_standard_layers!();

    fn make_mla_impl(
        &self,
        params: MlaParams,
        weights: AbsorbedWeights,
    ) -> Result<Box<dyn MlaAttentionImpl>> {
        self.check_mla_layer(&params, &weights)?;
        Ok(Box::new(CudaMlaAttentionImpl::new(
            params,
            &weights,
            self.cuda_device()?,
        )?))
    }

    /// Block sizes 32 and 64.
    fn make_mla_builder(&self, block_size: usize) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.mla_kv_cache_shape(1, block_size, 576)?;
        Ok(Box::new(cuda_mla_builder(block_size, self.cuda_device()?)))
    }
}
