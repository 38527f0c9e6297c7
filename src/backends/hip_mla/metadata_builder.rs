//! The HIP MLA backend's metadata builder: the GPU MLA builder
//! ([`crate::backends::mla_batch`]) on the backend's AMD GPU — `CPU_MLA`'s decode / prefill
//! split (decodes first, one query length up to 128) and device copies of the batch arrays.

use crate::backends::mla_batch::{MlaBatchBuilder, MlaBatchMetadata};
use crate::device::{Device, HipDevice};

/// What the HIP MLA kernels consume for one batch.
pub type HipMlaMetadata = MlaBatchMetadata;

/// Builds [`HipMlaMetadata`].
pub type HipMlaMetadataBuilder = MlaBatchBuilder;

/// The builder for latent caches of `block_size` tokens per block on `device`.
pub fn hip_mla_builder(block_size: usize, device: HipDevice) -> HipMlaMetadataBuilder {
    MlaBatchBuilder::new("HIP_MLA", block_size, Device::Hip(device))
}
