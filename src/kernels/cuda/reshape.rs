//! The cache write's launch as plain data, for every runtime of the family: the parameter
//! block of `reshape_and_cache.cu` with the host checks its kernel relies on, and the launch
//! shape (one chunk of tokens per CTA; the kernel's grid-stride loop covers any remainder).

use crate::dtype::DType;
use crate::error::{Error, Result};

use super::params::ReshapeParams;
use super::variants::code;

/// Threads per CTA of `reshape_and_cache` (`RC_THREADS`, its launch bound).
pub const RESHAPE_THREADS: u32 = 256;
/// 8-element vectors per thread a chunk aims for (`RC_ITEMS_PER_THREAD`).
const RESHAPE_ITEMS_PER_THREAD: usize = 8;
/// Most tokens per chunk (`RC_MAX_TOKENS`).
const RESHAPE_MAX_TOKENS: usize = 256;
/// Most CTAs of one launch (each then loops over several chunks).
const RESHAPE_MAX_GRID: usize = 1 << 20;

/// Tokens per chunk (one CTA's work) for `units` 8-element vectors per token: about
/// `RC_ITEMS_PER_THREAD` vectors per thread, 1 to 256 tokens. Mirrors `rc_tokens_per_chunk`.
pub fn reshape_tokens_per_cta(units: usize) -> usize {
    (RESHAPE_THREADS as usize * RESHAPE_ITEMS_PER_THREAD / units.max(1))
        .clamp(1, RESHAPE_MAX_TOKENS)
}

/// The device addresses a cache write reads and writes.
#[derive(Clone, Copy, Debug)]
pub struct ReshapeBuffers {
    /// `[T][Hkv][D]` keys.
    pub key: u64,
    /// `[T][Hkv][D]` values.
    pub value: u64,
    /// The cache.
    pub cache: u64,
    /// `[T]` i64 slots.
    pub slot_mapping: u64,
}

/// The sizes, dtypes and scales of a cache write.
#[derive(Clone, Copy, Debug)]
pub struct ReshapeShape {
    /// Tokens (the slot mapping's length).
    pub num_tokens: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Head size.
    pub head_size: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// The keys' and values' dtype.
    pub dtype: DType,
    /// The cache's storage dtype.
    pub cache_dtype: DType,
    /// True for the HND cache layout.
    pub layout_hnd: bool,
    /// Key scale (1.0 unless the cache is fp8).
    pub k_scale: f32,
    /// Value scale.
    pub v_scale: f32,
}

/// One cache write: its parameter block and launch shape.
#[derive(Clone, Copy, Debug)]
pub struct ReshapeLaunch {
    /// The kernel's parameter block.
    pub params: ReshapeParams,
    /// CTAs.
    pub grid: u32,
    /// Threads per CTA ([`RESHAPE_THREADS`]).
    pub threads: u32,
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds the kernels' i32 range")))
}

/// The launch of a cache write of `s` into `b`, or why the kernel cannot take it: a head
/// size that is not a multiple of 8 (the kernel moves 8-element vectors), a block of more
/// than 2^31 elements (offsets within a block are 32-bit), or a size past i32.
pub fn reshape_launch(b: ReshapeBuffers, s: &ReshapeShape) -> Result<ReshapeLaunch> {
    if !s.head_size.is_multiple_of(8) {
        return Err(Error::config(format!(
            "the cache write needs a head size that is a multiple of 8, got {}",
            s.head_size
        )));
    }
    let per_block = s
        .block_size
        .checked_mul(s.num_kv_heads)
        .and_then(|x| x.checked_mul(s.head_size))
        .ok_or_else(|| Error::config("block_size * num_kv_heads * head_size overflows usize"))?;
    i32_of("block_size * num_kv_heads * head_size", per_block)?;
    let units = s
        .num_kv_heads
        .checked_mul(s.head_size / 8)
        .ok_or_else(|| Error::config("num_kv_heads * head_size overflows usize"))?;
    let params = ReshapeParams {
        key: b.key,
        value: b.value,
        cache: b.cache,
        slot_mapping: b.slot_mapping,
        in_dtype: code(s.dtype)?,
        cache_dtype: code(s.cache_dtype)?,
        layout_hnd: i32::from(s.layout_hnd),
        num_tokens: i32_of("num_tokens", s.num_tokens)?,
        num_kv_heads: i32_of("num_kv_heads", s.num_kv_heads)?,
        head_size: i32_of("head_size", s.head_size)?,
        block_size: i32_of("block_size", s.block_size)?,
        k_scale: s.k_scale,
        v_scale: s.v_scale,
        pad_: 0,
    };
    let chunks = s.num_tokens.div_ceil(reshape_tokens_per_cta(units));
    Ok(ReshapeLaunch {
        params,
        // At most 2^20: fits u32.
        grid: chunks.clamp(1, RESHAPE_MAX_GRID) as u32,
        threads: RESHAPE_THREADS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(head_size: usize, num_tokens: usize) -> ReshapeShape {
        ReshapeShape {
            num_tokens,
            num_kv_heads: 8,
            head_size,
            block_size: 16,
            dtype: DType::Bf16,
            cache_dtype: DType::Fp8E4m3,
            layout_hnd: true,
            k_scale: 0.5,
            v_scale: 2.0,
        }
    }

    const B: ReshapeBuffers = ReshapeBuffers {
        key: 1,
        value: 2,
        cache: 3,
        slot_mapping: 4,
    };

    #[test]
    fn chunks_mirror_the_kernel() {
        assert_eq!(reshape_tokens_per_cta(8 * 128 / 8), 16);
        assert_eq!(reshape_tokens_per_cta(1), 256);
        assert_eq!(reshape_tokens_per_cta(1 << 20), 1);
        assert_eq!(reshape_tokens_per_cta(0), 256);
    }

    #[test]
    fn launch_and_refusals() {
        let l = reshape_launch(B, &shape(128, 4096)).unwrap();
        assert_eq!((l.grid, l.threads), (256, 256));
        assert_eq!((l.params.in_dtype, l.params.cache_dtype), (2, 3));
        assert_eq!((l.params.layout_hnd, l.params.cache), (1, 3));
        assert_eq!(reshape_launch(B, &shape(128, 1)).unwrap().grid, 1);
        let e = reshape_launch(B, &shape(100, 1)).unwrap_err().to_string();
        assert!(e.contains("multiple of 8"), "{e}");
        let mut big = shape(256, 1);
        big.block_size = 1 << 21;
        let e = reshape_launch(B, &big).unwrap_err().to_string();
        assert!(e.contains("i32"), "{e}");
    }
}
