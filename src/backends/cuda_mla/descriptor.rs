//! The CUDA MLA backend's descriptor.

use crate::attention::{AttentionImpl, AttentionParams, MlaAttentionImpl};
use crate::backend::{
    non_mla_error, AttentionBackend, AttentionType, Availability, BackendCapabilities, BlockSize,
    DeviceCapability, GraphCaptureSupport, HeadSizes, KvLayout,
};
use crate::backends::cuda::CudaBackend;
use crate::device::{CudaDevice, Device, DeviceKind};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::kv_cache::KvCacheSpec;
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
            caps: BackendCapabilities {
                // The kernels are built for DeepSeek's 512 + 64 latent (FlashMLA's 576).
                head_sizes: HeadSizes::List(vec![576]),
                dtypes: vec![DType::F16, DType::Bf16],
                kv_cache_dtypes: vec![
                    CacheDType::Auto,
                    CacheDType::F16,
                    CacheDType::Bf16,
                    CacheDType::Fp8E4m3,
                ],
                // FlashInfer-MLA's sizes (FlashMLA's 64 among them): the decode reads chunks
                // of 32 keys that never cross a block.
                block_sizes: vec![BlockSize::Exact(32), BlockSize::Exact(64)],
                attn_types: vec![AttentionType::Decoder],
                supports_sink: false,
                supports_non_causal: false,
                supports_alibi: false,
                supports_sliding_window: false,
                supports_soft_cap: false,
                supports_cascade: false,
                is_mla: true,
                // cp.async, ldmatrix and bf16 mma.sync.
                min_capability: Some(DeviceCapability { major: 8, minor: 0 }),
                graph_capture: GraphCaptureSupport::Never,
                kv_layout: KvLayout::Nhd,
            },
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

    /// Always the typed error "non-MLA not supported".
    fn make_impl(&self, _params: AttentionParams) -> Result<Box<dyn AttentionImpl>> {
        Err(non_mla_error(self.name()))
    }

    /// Always the typed error "non-MLA not supported" (the latent cache is
    /// [`crate::mla::MlaKvCache`]).
    fn make_builder(&self, _spec: &KvCacheSpec) -> Result<Box<dyn AttentionMetadataBuilder>> {
        Err(non_mla_error(self.name()))
    }

    /// Always "non-MLA not supported" (see [`CudaMlaBackend::mla_kv_cache_shape`]).
    fn kv_cache_shape(
        &self,
        _num_blocks: usize,
        _block_size: usize,
        _num_kv_heads: usize,
        _head_size: usize,
        _cache_dtype: CacheDType,
    ) -> Result<[usize; 5]> {
        Err(non_mla_error(self.name()))
    }

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
