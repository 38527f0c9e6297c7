//! The CPU MLA backend's metadata builder: the MLA builder ([`crate::backends::mla_batch`])
//! on the host — decodes first (one query length up to
//! [`crate::backends::mla_batch::MLA_DECODE_MAX_QUERY_LEN`] runs the latent-space decode),
//! the rest the expanded prefill.

use crate::backends::mla_batch::{MlaBatchBuilder, MlaBatchMetadata};
use crate::device::Device;

/// What the CPU MLA kernels consume for one batch.
pub type CpuMlaMetadata = MlaBatchMetadata;

/// Builds [`CpuMlaMetadata`].
pub type CpuMlaMetadataBuilder = MlaBatchBuilder;

/// The builder for latent caches of `block_size` tokens per block.
pub fn cpu_mla_builder(block_size: usize) -> CpuMlaMetadataBuilder {
    MlaBatchBuilder::new("CPU_MLA", block_size, Device::cpu())
}
