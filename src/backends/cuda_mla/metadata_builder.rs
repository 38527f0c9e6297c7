//! The CUDA MLA backend's metadata builder: the GPU MLA builder
//! ([`crate::backends::mla_batch`]) on the backend's GPU — `CPU_MLA`'s decode / prefill
//! split (decodes first, one query length up to 128) and device copies of the batch arrays.

use crate::backends::mla_batch::{MlaBatchBuilder, MlaBatchMetadata};
use crate::device::{CudaDevice, Device};

/// What the CUDA MLA kernels consume for one batch.
pub type CudaMlaMetadata = MlaBatchMetadata;

/// Builds [`CudaMlaMetadata`].
pub type CudaMlaMetadataBuilder = MlaBatchBuilder;

/// The builder for latent caches of `block_size` tokens per block on `device`.
pub fn cuda_mla_builder(block_size: usize, device: CudaDevice) -> CudaMlaMetadataBuilder {
    MlaBatchBuilder::new("CUDA_MLA", block_size, Device::Cuda(device))
}
