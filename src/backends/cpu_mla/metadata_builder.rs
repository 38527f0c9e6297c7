//! The CPU MLA backend's metadata builder: the decode / prefill split of a batch ordered
//! decodes first (as vLLM's FlashMLA builder: `UNIFORM` query lengths up to
//! [`MLA_DECODE_MAX_QUERY_LEN`] run the latent-space decode, which is exact for any query
//! length; the rest the expanded prefill).

use crate::backend::GraphCaptureSupport;
use crate::error::{Error, Result};
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CommonAttentionMetadata, DecodePrefillSplit,
};

/// The longest query a decode request may have (FlashMLA's reorder threshold).
pub const MLA_DECODE_MAX_QUERY_LEN: usize = 128;

/// What the CPU MLA kernels consume for one batch.
#[derive(Clone, Debug)]
pub struct CpuMlaMetadata {
    /// The validated common metadata.
    pub common: CommonAttentionMetadata,
    /// Requests `0..num_decodes` (one query length, at most [`MLA_DECODE_MAX_QUERY_LEN`]) run
    /// `forward_mqa`, the rest `forward_mha`.
    pub split: DecodePrefillSplit,
}

crate::metadata::batch_metadata!(CpuMlaMetadata, no_cascade);

/// Builds [`CpuMlaMetadata`].
#[derive(Clone, Debug)]
pub struct CpuMlaMetadataBuilder {
    block_size: usize,
}

impl CpuMlaMetadataBuilder {
    /// A builder for latent caches of `block_size` tokens per block.
    pub fn new(block_size: usize) -> Self {
        CpuMlaMetadataBuilder { block_size }
    }

    /// The query lengths the decode kernel takes (vLLM's `query_len_support`): one length
    /// for every decode request of a batch.
    pub fn query_len_support(&self) -> &'static str {
        "UNIFORM"
    }
}

impl AttentionMetadataBuilder for CpuMlaMetadataBuilder {
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
        let split = mla_batch_split("CPU_MLA", self.block_size, common_prefix_len, common)?;
        Ok(Box::new(CpuMlaMetadata {
            common: common.clone(),
            split,
        }))
    }
}

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
