//! The CPU MLA backend's metadata builder: the decode / prefill split of a batch ordered
//! decodes first (vLLM's MLA common builder: `SINGLE_ONLY`, reorder threshold 1).

use crate::backend::GraphCaptureSupport;
use crate::error::{Error, Result};
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CommonAttentionMetadata, DecodePrefillSplit,
};

/// What the CPU MLA kernels consume for one batch.
#[derive(Clone, Debug)]
pub struct CpuMlaMetadata {
    /// The validated common metadata.
    pub common: CommonAttentionMetadata,
    /// Requests `0..num_decodes` (query length 1) run `forward_mqa`, the rest `forward_mha`.
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

    /// The query lengths the decode kernel takes (vLLM's `query_len_support`): one token
    /// per decode request.
    pub fn query_len_support(&self) -> &'static str {
        "SINGLE_ONLY"
    }
}

impl AttentionMetadataBuilder for CpuMlaMetadataBuilder {
    fn graph_capture_support(&self) -> GraphCaptureSupport {
        GraphCaptureSupport::Never
    }

    /// 1: decodes (query length 1) go to the front of the batch.
    fn reorder_batch_threshold(&self) -> Option<usize> {
        Some(1)
    }

    fn build(
        &self,
        common_prefix_len: usize,
        common: &CommonAttentionMetadata,
        _fast_build: bool,
    ) -> Result<Box<dyn AttentionMetadata>> {
        common.expect_block_size(self.block_size)?;
        if common_prefix_len > 0 {
            return Err(Error::config(
                "CPU_MLA runs no cascade attention (common_prefix_len must be 0)",
            ));
        }
        if !common.causal() {
            return Err(Error::config("CPU_MLA runs causal (decoder) batches only"));
        }
        let split = common.split_decodes_and_prefills(1, true, false);
        Ok(Box::new(CpuMlaMetadata {
            common: common.clone(),
            split,
        }))
    }
}
