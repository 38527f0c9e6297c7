//! The CPU MLA backend's descriptor.

use crate::attention::{AttentionImpl, AttentionParams, MlaAttentionImpl};
use crate::backend::non_mla_error;
use crate::backend::{
    AttentionBackend, AttentionType, Availability, BackendCapabilities, BlockSize,
    GraphCaptureSupport, HeadSizes, KvLayout,
};
use crate::device::{Device, DeviceKind};
use crate::dtype::{CacheDType, DType};
use crate::error::Result;
use crate::kv_cache::KvCacheSpec;
use crate::metadata::AttentionMetadataBuilder;
use crate::mla::{AbsorbedWeights, MlaParams};

use super::metadata_builder::cpu_mla_builder;
use super::CpuMlaAttentionImpl;

/// The CPU MLA backend descriptor (name `CPU_MLA`, ranked after `CPU`).
#[derive(Debug)]
pub struct CpuMlaBackend {
    caps: BackendCapabilities,
}

impl CpuMlaBackend {
    /// The descriptor.
    pub fn new() -> Self {
        CpuMlaBackend {
            caps: BackendCapabilities {
                // vLLM's MLA common head sizes: kv_lora_rank + rope (512 + 64, 256 + 64).
                head_sizes: HeadSizes::List(vec![320, 576]),
                dtypes: vec![DType::F32, DType::F16, DType::Bf16],
                // TRITON_MLA's list (`fp8` is E4M3).
                kv_cache_dtypes: vec![
                    CacheDType::Auto,
                    CacheDType::F16,
                    CacheDType::Bf16,
                    CacheDType::Fp8E4m3,
                ],
                block_sizes: vec![BlockSize::MultipleOf(16)],
                attn_types: vec![AttentionType::Decoder],
                supports_sink: false,
                supports_non_causal: false,
                supports_alibi: false,
                supports_sliding_window: false,
                supports_soft_cap: false,
                supports_cascade: false,
                is_mla: true,
                min_capability: None,
                graph_capture: GraphCaptureSupport::Never,
                kv_layout: KvLayout::Nhd,
            },
        }
    }
}

impl Default for CpuMlaBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl AttentionBackend for CpuMlaBackend {
    fn name(&self) -> &str {
        "CPU_MLA"
    }

    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn priority(&self) -> u32 {
        1010
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

    /// Always the typed error "non-MLA not supported": a standard layer's `forward` does not
    /// run on an MLA backend.
    fn make_impl(&self, _params: AttentionParams) -> Result<Box<dyn AttentionImpl>> {
        Err(non_mla_error(self.name()))
    }

    /// The standard KV cache has no MLA form: the latent cache is
    /// [`crate::mla::MlaKvCache`]. Always the typed error "non-MLA not supported".
    fn make_builder(&self, _spec: &KvCacheSpec) -> Result<Box<dyn AttentionMetadataBuilder>> {
        Err(non_mla_error(self.name()))
    }

    /// The standard `(num_blocks, 2, block_size, heads, head_size)` shape does not apply:
    /// always "non-MLA not supported" (see [`CpuMlaBackend::mla_kv_cache_shape`]).
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
        Ok(Box::new(CpuMlaAttentionImpl::new(params, weights)))
    }

    /// Block sizes that are multiples of 16.
    fn make_mla_builder(&self, block_size: usize) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.mla_kv_cache_shape(1, block_size, 576)?;
        Ok(Box::new(cpu_mla_builder(block_size)))
    }

    /// Block sizes that are multiples of 16, head sizes 320 and 576.
    fn mla_kv_cache_shape(
        &self,
        num_blocks: usize,
        block_size: usize,
        head_size: usize,
    ) -> Result<[usize; 3]> {
        self.checked_mla_cache_shape(num_blocks, block_size, head_size)
    }
}
