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

/// `a · b` with eight partial sums, so the compiler can keep them in one vector register
/// (a single running sum is a dependency chain it may not reorder).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}
