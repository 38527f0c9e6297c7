//! The CPU MLA backend's descriptor.

use crate::attention::MlaAttentionImpl;
use crate::backend::{AttentionBackend, Availability, BackendCapabilities, BlockSize, HeadSizes};
use crate::device::{Device, DeviceKind};
use crate::dtype::{CacheDType, DType};
use crate::error::Result;
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
            caps: BackendCapabilities::mla(
                // vLLM's MLA common head sizes: kv_lora_rank + rope (512 + 64, 256 + 64).
                HeadSizes::List(vec![320, 576]),
                vec![DType::F32, DType::F16, DType::Bf16],
                // TRITON_MLA's list (`fp8` is E4M3).
                vec![
                    CacheDType::Auto,
                    CacheDType::F16,
                    CacheDType::Bf16,
                    CacheDType::Fp8E4m3,
                ],
                vec![BlockSize::MultipleOf(16)],
                None,
            ),
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

    crate::mla_backend_rejects_standard_layers!();

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
}
