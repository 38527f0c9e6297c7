//! The CPU backend's descriptor.

use crate::attention::{AttentionImpl, AttentionParams};
use crate::backend::{
    AttentionBackend, AttentionType, Availability, BackendCapabilities, BlockSize,
    GraphCaptureSupport, HeadSizes, KvLayout,
};
use crate::device::{Device, DeviceKind};
use crate::dtype::{CacheDType, DType};
use crate::error::Result;
use crate::kv_cache::KvCacheSpec;
use crate::metadata::AttentionMetadataBuilder;

use super::{CpuAttentionImpl, CpuMetadataBuilder};

/// The CPU backend descriptor (name `CPU`, ranked last).
#[derive(Debug)]
pub struct CpuBackend {
    caps: BackendCapabilities,
}

impl CpuBackend {
    /// The descriptor.
    pub fn new() -> Self {
        CpuBackend {
            caps: BackendCapabilities {
                // The kernels walk the head dimension in chunks of 8.
                head_sizes: HeadSizes::Range {
                    min: 32,
                    max: 256,
                    multiple: 8,
                },
                dtypes: vec![DType::F32, DType::F16, DType::Bf16],
                kv_cache_dtypes: CacheDType::ALL.to_vec(),
                // vLLM's CPU_ATTN rule.
                block_sizes: vec![BlockSize::MultipleOf(16)],
                // Cross-attention needs encoder sequence lengths in the metadata, which the
                // contract does not carry yet.
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
                min_capability: None,
                // Nothing to capture on a CPU (vLLM's CPU_ATTN: NEVER).
                graph_capture: GraphCaptureSupport::Never,
                // A head's tokens adjacent: the kernels stream one head at a time.
                kv_layout: KvLayout::Hnd,
            },
        }
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl AttentionBackend for CpuBackend {
    fn name(&self) -> &str {
        "CPU"
    }

    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn priority(&self) -> u32 {
        1000
    }

    fn availability(&self) -> Availability {
        Availability::Available(Device::cpu().description())
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn device(&self) -> Result<Device> {
        Ok(Device::cpu())
    }

    fn make_impl(&self, params: AttentionParams) -> Result<Box<dyn AttentionImpl>> {
        self.check_layer(&params)?;
        Ok(Box::new(CpuAttentionImpl::new(params)))
    }

    fn make_builder(&self, spec: &KvCacheSpec) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.check_cache_spec(spec)?;
        Ok(Box::new(CpuMetadataBuilder::new(*spec)))
    }
}
