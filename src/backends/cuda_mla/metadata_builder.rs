//! The CUDA MLA backend's metadata builder: the decode / prefill split of a batch ordered
//! decodes first (as `CPU_MLA`'s: one query length up to
//! [`MLA_DECODE_MAX_QUERY_LEN`] for the latent decode) and the batch arrays on the GPU.

use crate::backend::GraphCaptureSupport;
use crate::backends::cpu_mla::{mla_batch_split, MLA_DECODE_MAX_QUERY_LEN};
use crate::device::{CudaDevice, Device};
use crate::error::Result;
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CommonAttentionMetadata, DecodePrefillSplit,
    DeviceMetadata,
};

/// What the CUDA MLA kernels consume for one batch.
#[derive(Clone, Debug)]
pub struct CudaMlaMetadata {
    /// The validated common metadata.
    pub common: CommonAttentionMetadata,
    /// Requests `0..num_decodes` run `forward_mqa`, the rest `forward_mha`.
    pub split: DecodePrefillSplit,
    /// Copies of the batch arrays on the GPU, when the batch was described elsewhere.
    uploaded: Option<DeviceMetadata>,
}

impl CudaMlaMetadata {
    /// The batch arrays on the backend's GPU.
    pub fn arrays(&self) -> &DeviceMetadata {
        self.uploaded.as_ref().unwrap_or(self.common.device())
    }
}

crate::metadata::batch_metadata!(CudaMlaMetadata, no_cascade);

/// Builds [`CudaMlaMetadata`].
#[derive(Clone, Debug)]
pub struct CudaMlaMetadataBuilder {
    block_size: usize,
    device: CudaDevice,
}

impl CudaMlaMetadataBuilder {
    /// A builder for latent caches of `block_size` tokens per block on `device`.
    pub fn new(block_size: usize, device: CudaDevice) -> Self {
        CudaMlaMetadataBuilder { block_size, device }
    }

    /// The query lengths the decode kernel takes (vLLM's `query_len_support`): one length
    /// for every decode request of a batch.
    pub fn query_len_support(&self) -> &'static str {
        "UNIFORM"
    }
}

impl AttentionMetadataBuilder for CudaMlaMetadataBuilder {
    fn graph_capture_support(&self) -> GraphCaptureSupport {
        GraphCaptureSupport::Never
    }

    /// [`MLA_DECODE_MAX_QUERY_LEN`]: shorter requests go to the front of the batch.
    fn reorder_batch_threshold(&self) -> Option<usize> {
        Some(MLA_DECODE_MAX_QUERY_LEN)
    }

    fn build(
        &self,
        common_prefix_len: usize,
        common: &CommonAttentionMetadata,
        _fast_build: bool,
    ) -> Result<Box<dyn AttentionMetadata>> {
        let split = mla_batch_split("CUDA_MLA", self.block_size, common_prefix_len, common)?;
        let uploaded = common
            .device()
            .copies_on(&Device::Cuda(self.device.clone()))?;
        Ok(Box::new(CudaMlaMetadata {
            common: common.clone(),
            split,
            uploaded,
        }))
    }
}
