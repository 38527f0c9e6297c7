//! The paged KV cache: its spec, the cache tensor with its layout, and the block pool.
//!
//! Logical shape (vLLM's FlashAttention / Triton shape): `(num_blocks, 2, block_size,
//! num_kv_heads, head_size)`, index 0 of the second dim holding keys and 1 values. The
//! physical order follows the backend's [`KvLayout`]: NHD keeps a token's heads together, HND a
//! head's tokens together (what a CPU or GPU kernel that walks one head wants). Slot `s` is
//! token `s % block_size` of block `s / block_size`.
//!
//! The cache knows nothing of backends: [`KvCache::with_layout`] allocates one on a device in
//! a given layout, and `KvCache::new`, which applies a backend's shape rules and layout, is
//! implemented next to the descriptor in [`crate::backend`].

use crate::capability::KvLayout;
use crate::device::{Device, Tensor};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::metadata::{CommonAttentionMetadata, NULL_BLOCK_ID};

/// What one layer's KV cache holds (vLLM's `AttentionSpec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvCacheSpec {
    /// Tokens per block.
    pub block_size: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Head size.
    pub head_size: usize,
    /// Activation dtype of the layer.
    pub dtype: DType,
    /// Cache dtype (`Auto` = activation dtype).
    pub cache_dtype: CacheDType,
}

impl KvCacheSpec {
    /// The element type stored in the cache.
    pub fn storage_dtype(&self) -> DType {
        self.cache_dtype.storage_dtype(self.dtype)
    }

    /// Bytes of one block (keys and values); [`Error::Overflow`] for a spec too large to
    /// address.
    pub fn page_size_bytes(&self) -> Result<usize> {
        [
            self.block_size,
            self.num_kv_heads,
            self.head_size,
            self.storage_dtype().size_in_bytes(),
        ]
        .iter()
        .try_fold(2usize, |acc, &x| acc.checked_mul(x))
        .ok_or_else(|| Error::overflow("KV cache page", format!("2 × {self:?}")))
    }

    /// Bytes of a cache of `num_blocks` blocks; [`Error::Overflow`] when it does not fit a
    /// `u64`.
    pub fn cache_bytes(&self, num_blocks: usize) -> Result<u64> {
        let page = self.page_size_bytes()? as u64;
        page.checked_mul(num_blocks as u64).ok_or_else(|| {
            Error::overflow("KV cache", format!("{num_blocks} blocks of {page} bytes"))
        })
    }
}

/// One layer's paged KV cache on a device.
#[derive(Clone, Debug)]
pub struct KvCache {
    spec: KvCacheSpec,
    num_blocks: usize,
    layout: KvLayout,
    data: Tensor,
}

impl KvCache {
    /// Allocates a zeroed cache with an explicit layout.
    pub fn with_layout(
        device: &Device,
        spec: KvCacheSpec,
        num_blocks: usize,
        layout: KvLayout,
    ) -> Result<Self> {
        if spec.block_size == 0 || spec.num_kv_heads == 0 || spec.head_size == 0 {
            return Err(Error::config(format!(
                "KV cache spec needs positive block_size, num_kv_heads and head_size, got {spec:?}"
            )));
        }
        if !spec.dtype.is_activation() {
            return Err(Error::DType {
                what: "KV cache activation dtype",
                got: spec.dtype.to_string(),
                expected: "f32, f16 or bf16".into(),
            });
        }
        // Block ids are i32 in block tables and slots i64 in slot mappings: a cache must be
        // addressable by both (its element count is checked by `Tensor::zeros`).
        if num_blocks == 0 || num_blocks > i32::MAX as usize {
            return Err(Error::config(format!(
                "a KV cache needs 1..={} blocks (block ids are i32), got {num_blocks}",
                i32::MAX
            )));
        }
        if num_blocks
            .checked_mul(spec.block_size)
            .is_none_or(|slots| slots > i64::MAX as usize)
        {
            return Err(Error::overflow(
                "KV cache slots",
                format!("{num_blocks} blocks × {} tokens", spec.block_size),
            ));
        }
        let shape = Self::physical_shape_of(&spec, num_blocks, layout);
        let data = Tensor::zeros(device, &shape, spec.storage_dtype())?;
        Ok(KvCache {
            spec,
            num_blocks,
            layout,
            data,
        })
    }

    fn physical_shape_of(spec: &KvCacheSpec, num_blocks: usize, layout: KvLayout) -> [usize; 5] {
        let (bs, h, d) = (spec.block_size, spec.num_kv_heads, spec.head_size);
        match layout {
            KvLayout::Nhd => [num_blocks, 2, bs, h, d],
            KvLayout::Hnd => [num_blocks, 2, h, bs, d],
        }
    }

    /// A copy of this cache on `device` (same layout and contents).
    pub fn to_device(&self, device: &Device) -> Result<KvCache> {
        Ok(KvCache {
            spec: self.spec,
            num_blocks: self.num_blocks,
            layout: self.layout,
            data: self.data.to_device(device)?,
        })
    }

    /// The spec.
    pub fn spec(&self) -> &KvCacheSpec {
        &self.spec
    }
    /// Blocks in the cache.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.spec.block_size
    }
    /// Memory order.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }
    /// Logical shape `(num_blocks, 2, block_size, num_kv_heads, head_size)`.
    pub fn logical_shape(&self) -> [usize; 5] {
        let s = &self.spec;
        [
            self.num_blocks,
            2,
            s.block_size,
            s.num_kv_heads,
            s.head_size,
        ]
    }
    /// The cache tensor in physical order.
    pub fn data(&self) -> &Tensor {
        &self.data
    }
    /// The cache tensor, mutable (for kernels).
    pub fn data_mut(&mut self) -> &mut Tensor {
        &mut self.data
    }

    /// Element offset of `(block, kv, token, head, 0)` in the physical buffer; the head's
    /// `head_size` elements follow contiguously in either layout.
    #[inline]
    pub fn offset(&self, block: usize, kv: usize, token: usize, head: usize) -> usize {
        let s = &self.spec;
        let (bs, h, d) = (s.block_size, s.num_kv_heads, s.head_size);
        let base = (block * 2 + kv) * bs * h * d;
        match self.layout {
            KvLayout::Nhd => base + (token * h + head) * d,
            KvLayout::Hnd => base + (head * bs + token) * d,
        }
    }

    /// Checks that `batch` was built for this cache's block size and names no block past its
    /// last (block table or slot mapping): what every write or read of the cache through the
    /// batch relies on.
    pub fn check_batch(&self, batch: &CommonAttentionMetadata) -> Result<()> {
        if self.block_size() != batch.block_size() {
            return Err(Error::config(format!(
                "KV cache has blocks of {} tokens; the batch's metadata was built for blocks of {}",
                self.block_size(),
                batch.block_size()
            )));
        }
        if self.num_blocks < batch.min_cache_blocks() {
            return Err(Error::metadata(format!(
                "the batch uses block {} (block table or slot mapping) but the KV cache has {} \
                 blocks (ids 0..{})",
                batch.min_cache_blocks() - 1,
                self.num_blocks,
                self.num_blocks
            )));
        }
        Ok(())
    }

    /// Elements between two consecutive tokens of one head inside a block.
    #[inline]
    pub fn token_stride(&self) -> usize {
        match self.layout {
            KvLayout::Nhd => self.spec.num_kv_heads * self.spec.head_size,
            KvLayout::Hnd => self.spec.head_size,
        }
    }

    /// Reads the keys (`kv = 0`) or values (`kv = 1`) of slots `0..len` of a sequence whose
    /// blocks are `blocks`, dequantised to f32 with `scale`: `[len][num_kv_heads][head_size]`.
    /// A host-side helper for references and debugging, not a kernel.
    pub fn gather_f32(
        &self,
        blocks: &[i32],
        len: usize,
        kv: usize,
        scale: f32,
    ) -> Result<Vec<f32>> {
        let all = self.data.to_f32_vec()?;
        let s = &self.spec;
        let (h, d) = (s.num_kv_heads, s.head_size);
        let mut out = Vec::with_capacity(len * h * d);
        let scale = if s.cache_dtype.is_fp8() { scale } else { 1.0 };
        for t in 0..len {
            let b = *blocks.get(t / s.block_size).ok_or_else(|| {
                Error::metadata(format!(
                    "gather_f32: {len} tokens need more than {} blocks",
                    blocks.len()
                ))
            })?;
            if b < 0 || b as usize >= self.num_blocks {
                return Err(Error::metadata(format!(
                    "gather_f32: block {b} out of range"
                )));
            }
            for head in 0..h {
                let o = self.offset(b as usize, kv, t % s.block_size, head);
                out.extend(all[o..o + d].iter().map(|&x| x * scale));
            }
        }
        Ok(out)
    }
}

/// Free-list allocator of cache blocks. Block 0 is the null block (vLLM's `NULL_BLOCK_ID`)
/// and is never handed out, so a zero in a block table always means "no block".
#[derive(Clone, Debug)]
pub struct BlockPool {
    num_blocks: usize,
    free: Vec<i32>,
}

impl BlockPool {
    /// A pool over blocks `1..num_blocks` (at least 2 blocks: the null block and one more).
    pub fn new(num_blocks: usize) -> Result<Self> {
        if num_blocks < 2 || num_blocks > i32::MAX as usize {
            return Err(Error::config(format!(
                "a block pool needs 2..={} blocks (block 0 is reserved), got {num_blocks}",
                i32::MAX
            )));
        }
        // Pop from the end: hand out low ids first.
        let free = (1..num_blocks as i32).rev().collect();
        Ok(BlockPool { num_blocks, free })
    }

    /// Blocks in the pool, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks free now.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Takes `n` blocks, or fails without taking any.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<i32>> {
        if n > self.free.len() {
            return Err(Error::config(format!(
                "KV cache out of blocks: {n} requested, {} free of {}",
                self.free.len(),
                self.num_blocks - 1
            )));
        }
        let at = self.free.len() - n;
        let mut taken = self.free.split_off(at);
        taken.reverse();
        Ok(taken)
    }

    /// Returns blocks to the pool. Returning the null block, an id out of range, or a block
    /// that is already free is an error (a double free would corrupt two requests).
    pub fn free(&mut self, blocks: &[i32]) -> Result<()> {
        for &b in blocks {
            if b == NULL_BLOCK_ID || b < 0 || b as usize >= self.num_blocks {
                return Err(Error::config(format!(
                    "cannot free block {b}: valid ids are 1..{}",
                    self.num_blocks
                )));
            }
            if self.free.contains(&b) {
                return Err(Error::config(format!("block {b} freed twice")));
            }
        }
        self.free.extend(blocks.iter().rev());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_never_hands_out_the_null_block() {
        let mut p = BlockPool::new(4).unwrap();
        let got = p.allocate(3).unwrap();
        assert_eq!(got, vec![1, 2, 3]);
        assert!(p.allocate(1).is_err());
        p.free(&got[..1]).unwrap();
        assert!(p.free(&[1]).unwrap_err().to_string().contains("twice"));
        assert!(p.free(&[0]).is_err());
        assert_eq!(p.allocate(1).unwrap(), vec![1]);
    }

    #[test]
    fn offsets_follow_the_layout() {
        let spec = KvCacheSpec {
            block_size: 4,
            num_kv_heads: 2,
            head_size: 8,
            dtype: DType::F32,
            cache_dtype: CacheDType::Auto,
        };
        let dev = Device::cpu();
        let nhd = KvCache::with_layout(&dev, spec, 3, KvLayout::Nhd).unwrap();
        let hnd = KvCache::with_layout(&dev, spec, 3, KvLayout::Hnd).unwrap();
        assert_eq!(nhd.offset(1, 1, 2, 1), (3 * 4 * 2 + 2 * 2 + 1) * 8);
        assert_eq!(hnd.offset(1, 1, 2, 1), (3 * 4 * 2 + 4 + 2) * 8);
        assert_eq!(nhd.data().shape(), &[3, 2, 4, 2, 8]);
        assert_eq!(hnd.data().shape(), &[3, 2, 2, 4, 8]);
        assert_eq!(spec.page_size_bytes().unwrap(), 2 * 4 * 2 * 8 * 4);
    }

    #[test]
    fn caches_too_large_to_address_are_errors() {
        let spec = KvCacheSpec {
            block_size: 16,
            num_kv_heads: 8,
            head_size: 128,
            dtype: DType::F16,
            cache_dtype: CacheDType::Auto,
        };
        let dev = Device::cpu();
        for (blocks, what) in [(1usize << 60, "i32"), (0, "1..=")] {
            let err = KvCache::with_layout(&dev, spec, blocks, KvLayout::Nhd).unwrap_err();
            assert!(err.to_string().contains(what), "{blocks}: {err}");
        }
        // Fits i32 block ids, but 2 × 16 × 8 × 2^56-wide heads wrap the element count.
        let wide = KvCacheSpec {
            head_size: 1 << 56,
            ..spec
        };
        let err = KvCache::with_layout(&dev, wide, 4096, KvLayout::Hnd).unwrap_err();
        assert!(matches!(err, Error::Overflow { .. }), "{err}");
        assert!(matches!(
            wide.page_size_bytes().unwrap_err(),
            Error::Overflow { .. }
        ));
    }
}
