//! The CUDA backend's descriptor.

use std::sync::OnceLock;

use crate::attention::{AttentionImpl, AttentionParams};
use crate::backend::{
    AttentionBackend, AttentionType, Availability, BackendCapabilities, BlockSize,
    DeviceCapability, GraphCaptureSupport, HeadSizes, KvLayout,
};
use crate::device::{CudaDevice, Device, DeviceKind};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::kv_cache::KvCacheSpec;
use crate::metadata::AttentionMetadataBuilder;

use super::{CudaAttentionImpl, CudaMetadataBuilder};
use crate::device::cuda::nvrtc_status;

/// The CUDA backend descriptor (name `CUDA`, ranked first).
///
/// Available when the driver library loads, GPU `POLYATTN_CUDA_DEVICE` (default 0) opens and
/// NVRTC loads; the probe runs once per descriptor and never panics.
#[derive(Debug)]
pub struct CudaBackend {
    caps: BackendCapabilities,
    ordinal: usize,
    device: OnceLock<std::result::Result<CudaDevice, String>>,
}

impl CudaBackend {
    /// The descriptor for the GPU named by `POLYATTN_CUDA_DEVICE` (default 0). Touches no
    /// driver until asked.
    pub fn new() -> Self {
        Self::with_ordinal(super::tuning::CudaTuning::get().device)
    }

    /// The descriptor for GPU `ordinal`.
    pub fn with_ordinal(ordinal: usize) -> Self {
        CudaBackend {
            caps: BackendCapabilities {
                // Any multiple of 8 up to 256: the kernel buckets the head size by
                // ceil(D / 32) at compile time and masks the tail lanes.
                head_sizes: HeadSizes::Range {
                    min: 8,
                    max: 256,
                    multiple: 8,
                },
                dtypes: vec![DType::F32, DType::F16, DType::Bf16],
                kv_cache_dtypes: CacheDType::ALL.to_vec(),
                // Key chunks of 16 positions never cross a block (vLLM's FlashAttention rule).
                block_sizes: vec![BlockSize::MultipleOf(16)],
                // Cross-attention needs encoder sequence lengths the metadata does not carry.
                attn_types: vec![
                    AttentionType::Decoder,
                    AttentionType::Encoder,
                    AttentionType::EncoderOnly,
                ],
                supports_sink: true,
                supports_non_causal: true,
                supports_alibi: true,
                supports_sliding_window: true,
                supports_soft_cap: true,
                supports_cascade: true,
                is_mla: false,
                // bf16 `cvt` and the planned cp.async / mma.sync paths need Ampere.
                min_capability: Some(DeviceCapability { major: 8, minor: 0 }),
                // Full CUDA graphs of pure decode batches (every query length 1, a fixed
                // padded batch size), with metadata from build_for_graph_capture: persistent
                // arrays, fixed-layout work lists, persistent split-KV scratch. Prefills, mixed
                // batches and cascade run eagerly. See CudaMetadataBuilder's docs;
                // tests/cuda_gpu.rs graph_* checks that replays are bit-identical to eager
                // forwards (bf16 / f16 / fp8 caches).
                graph_capture: GraphCaptureSupport::UniformSingleTokenDecode,
                // A head's tokens adjacent: a 16-key chunk of one head is one contiguous read.
                kv_layout: KvLayout::Hnd,
            },
            ordinal,
            device: OnceLock::new(),
        }
    }

    fn probe(&self) -> std::result::Result<CudaDevice, String> {
        self.device
            .get_or_init(|| {
                CudaDevice::driver_status()?;
                let dev = CudaDevice::new(self.ordinal).map_err(|e| e.to_string())?;
                nvrtc_status()?;
                Ok(dev)
            })
            .clone()
    }

    /// The opened device, or why it is not available.
    pub fn cuda_device(&self) -> Result<CudaDevice> {
        self.probe().map_err(|message| Error::Device {
            backend: "CUDA".into(),
            message,
        })
    }
}

impl Default for CudaBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl AttentionBackend for CudaBackend {
    fn name(&self) -> &str {
        "CUDA"
    }

    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn priority(&self) -> u32 {
        100
    }

    fn availability(&self) -> Availability {
        match self.probe() {
            Ok(d) => {
                let nvrtc = nvrtc_status()
                    .map(|(a, b)| format!(", NVRTC {a}.{b}"))
                    .unwrap_or_default();
                Availability::Available(format!("{}{nvrtc}", d.description()))
            }
            Err(why) => Availability::Unavailable(why),
        }
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn device(&self) -> Result<Device> {
        Ok(Device::Cuda(self.cuda_device()?))
    }

    fn device_capability(&self) -> Option<DeviceCapability> {
        self.probe().ok().map(|d| {
            let (major, minor) = d.compute_capability();
            DeviceCapability { major, minor }
        })
    }

    fn make_impl(&self, params: AttentionParams) -> Result<Box<dyn AttentionImpl>> {
        self.check_layer(&params)?;
        Ok(Box::new(CudaAttentionImpl::new(
            params,
            self.cuda_device()?,
        )?))
    }

    fn make_builder(&self, spec: &KvCacheSpec) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.check_cache_spec(spec)?;
        Ok(Box::new(CudaMetadataBuilder::new(
            *spec,
            self.cuda_device()?,
        )))
    }
}
