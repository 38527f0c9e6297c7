//! Reading an MLA request's cached latents through its block-table row, as f32 (fp8 times
//! the layer's `k_scale`), for the MLA kernels (`mla_decode`, `mla_prefill`).

use crate::device::CpuStorage;
use crate::error::Result;
use crate::mla::MlaKvCache;

use super::convert::RowsView;

/// A host view of a latent cache's elements.
pub struct LatentReader<'a> {
    rows: RowsView<'a>,
    cache: &'a MlaKvCache,
    scale: f32,
}

impl<'a> LatentReader<'a> {
    /// Reads `cache` through `storage` (its host copy); fp8 latents are multiplied by
    /// `k_scale`, others read as stored.
    pub fn new(storage: &'a CpuStorage, cache: &'a MlaKvCache, k_scale: f32) -> Result<Self> {
        Ok(LatentReader {
            rows: RowsView::new(storage, cache.storage_dtype())?,
            cache,
            scale: if cache.cache_dtype().is_fp8() {
                k_scale
            } else {
                1.0
            },
        })
    }

    /// Loads position `s` of the request whose block-table row is `blocks` into `dst`
    /// (`latent_dim` elements). The block id was validated by the metadata.
    pub fn load(&self, blocks: &[i32], s: usize, dst: &mut [f32]) {
        let bs = self.cache.block_size();
        let o = self.cache.offset(blocks[s / bs] as usize, s % bs);
        self.rows.load(o, dst, self.scale);
    }
}
