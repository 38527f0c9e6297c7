//! The metadata of every MLA backend (`CPU_MLA`, `CUDA_MLA`, `WGPU_MLA`): the checks and
//! decode / prefill split of a batch ([`mla_batch_split`]: decodes first, one query length up
//! to [`MLA_DECODE_MAX_QUERY_LEN`], as vLLM's FlashMLA builder with `UNIFORM` query lengths;
//! the latent-space decode is exact for any query length) plus copies of the batch arrays on
//! the backend's device when the batch was described elsewhere. The kernels differ per
//! backend; what a batch must satisfy and how it splits does not.

use crate::backend::GraphCaptureSupport;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CommonAttentionMetadata, DecodePrefillSplit,
    DeviceMetadata,
};

/// The longest query a decode request may have (FlashMLA's reorder threshold).
pub const MLA_DECODE_MAX_QUERY_LEN: usize = 128;

/// The checks every MLA builder makes of a batch (block size, no cascade, causal) and its
/// decode / prefill split: the leading requests of one query length up to
/// [`MLA_DECODE_MAX_QUERY_LEN`] are decodes.
pub fn mla_batch_split(
    backend: &str,
    block_size: usize,
    common_prefix_len: usize,
    common: &CommonAttentionMetadata,
) -> Result<DecodePrefillSplit> {
    common.expect_block_size(block_size)?;
    if common_prefix_len > 0 {
        return Err(Error::config(format!(
            "{backend} runs no cascade attention (common_prefix_len must be 0)"
        )));
    }
    if !common.causal() {
        return Err(Error::config(format!(
            "{backend} runs causal (decoder) batches only"
        )));
    }
    Ok(common.split_decodes_and_prefills(MLA_DECODE_MAX_QUERY_LEN, true, false))
}

/// What an MLA backend's kernels consume for one batch.
#[derive(Clone, Debug)]
pub struct MlaBatchMetadata {
    /// The validated common metadata.
    pub common: CommonAttentionMetadata,
    /// Requests `0..num_decodes` run `forward_mqa`, the rest `forward_mha`.
    pub split: DecodePrefillSplit,
    /// Copies of the batch arrays on the backend's device, when the batch was described
    /// elsewhere.
    uploaded: Option<DeviceMetadata>,
}

impl MlaBatchMetadata {
    /// The batch arrays on the backend's device.
    pub fn arrays(&self) -> &DeviceMetadata {
        self.uploaded.as_ref().unwrap_or(self.common.device())
    }
}

crate::metadata::batch_metadata!(MlaBatchMetadata, no_cascade);

/// Builds [`MlaBatchMetadata`] for one MLA backend.
#[derive(Clone, Debug)]
pub struct MlaBatchBuilder {
    backend: &'static str,
    block_size: usize,
    device: Device,
}

impl MlaBatchBuilder {
    /// A builder of backend `backend` for latent caches of `block_size` tokens per block on
    /// `device`.
    pub fn new(backend: &'static str, block_size: usize, device: Device) -> Self {
        MlaBatchBuilder {
            backend,
            block_size,
            device,
        }
    }

    /// The query lengths the decode kernels take (vLLM's `query_len_support`): one length
    /// for every decode request of a batch.
    pub fn query_len_support(&self) -> &'static str {
        "UNIFORM"
    }
}

impl AttentionMetadataBuilder for MlaBatchBuilder {
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
        let split = mla_batch_split(self.backend, self.block_size, common_prefix_len, common)?;
        let uploaded = common.device().copies_on(&self.device)?;
        Ok(Box::new(MlaBatchMetadata {
            common: common.clone(),
            split,
            uploaded,
        }))
    }
}
