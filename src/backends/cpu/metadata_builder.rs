//! The CPU backend's metadata builder: validates cascade requests and cuts the batch into
//! work tiles once per step, so every layer's forward just walks the tiles.

use crate::backend::GraphCaptureSupport;
use crate::error::Result;
use crate::kv_cache::KvCacheSpec;
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CascadePlan, CommonAttentionMetadata,
    DecodePrefillSplit,
};

/// Query rows of one request processed together: they share every key block they load.
pub const TILE_TOKENS: usize = 16;

/// One unit of work: query tokens `q_start..q_end` (batch-global) of request `req`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    /// Request index.
    pub req: usize,
    /// First query token (index into the batch).
    pub q_start: usize,
    /// One past the last query token.
    pub q_end: usize,
}

/// What the CPU kernels consume for one batch.
#[derive(Clone, Debug)]
pub struct CpuAttentionMetadata {
    /// The validated common metadata.
    pub common: CommonAttentionMetadata,
    /// Work tiles covering every query token exactly once.
    pub tiles: Vec<Tile>,
    /// The decode / prefill split (informational: the kernels handle both in one pass).
    pub split: DecodePrefillSplit,
    /// Cascade plan when `common_prefix_len > 0`.
    pub cascade: Option<CascadePlan>,
}

crate::metadata::batch_metadata!(CpuAttentionMetadata);

/// Builds [`CpuAttentionMetadata`].
#[derive(Clone, Debug)]
pub struct CpuMetadataBuilder {
    spec: KvCacheSpec,
}

impl CpuMetadataBuilder {
    /// A builder for one KV-cache group.
    pub fn new(spec: KvCacheSpec) -> Self {
        CpuMetadataBuilder { spec }
    }
}

impl AttentionMetadataBuilder for CpuMetadataBuilder {
    fn graph_capture_support(&self) -> GraphCaptureSupport {
        GraphCaptureSupport::Never
    }

    fn build(
        &self,
        common_prefix_len: usize,
        common: &CommonAttentionMetadata,
        _fast_build: bool,
    ) -> Result<Box<dyn AttentionMetadata>> {
        common.expect_block_size(self.spec.block_size)?;
        let cascade = CascadePlan::for_batch(common, common_prefix_len)?;
        let qsl = common.query_start_loc_cpu();
        let mut tiles = Vec::new();
        for req in 0..common.num_reqs() {
            let (s, e) = (qsl[req] as usize, qsl[req + 1] as usize);
            let mut t = s;
            while t < e {
                let end = (t + TILE_TOKENS).min(e);
                tiles.push(Tile {
                    req,
                    q_start: t,
                    q_end: end,
                });
                t = end;
            }
        }
        Ok(Box::new(CpuAttentionMetadata {
            split: common.split_decodes_and_prefills(1, false, true),
            common: common.clone(),
            tiles,
            cascade,
        }))
    }
}
