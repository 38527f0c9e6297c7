//! One attention pass's parameter block (`AttnParams` of the attention kernels) from plain
//! values, for every runtime of the family: each size checked into the kernels' i32 range,
//! the key source (dense encoder K/V or the paged cache) and its dtype and scales.

use crate::dtype::DType;
use crate::error::{Error, Result};

use super::params::AttnParams;
use super::variants::code;

/// The device addresses of one pass (0 for an absent optional buffer).
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnBuffers {
    /// `[T][H][D]` queries.
    pub q: u64,
    /// `[num_reqs][max_blocks_per_req]` i32.
    pub block_table: u64,
    /// `[num_reqs]` i32.
    pub seq_lens: u64,
    /// `[num_reqs + 1]` i32.
    pub query_start_loc: u64,
    /// `[H]` ALiBi slopes, or 0.
    pub alibi: u64,
    /// `[H]` sinks, or 0.
    pub sinks: u64,
    /// The pass's output.
    pub out: u64,
    /// `[H][T]` f32 LSEs, or 0.
    pub lse: u64,
}

/// Where a pass reads its keys and values.
#[derive(Clone, Copy, Debug)]
pub enum AttnKeySource {
    /// Dense `[T][Hkv][D]` keys and values of the query's dtype (encoder self-attention).
    Dense {
        /// Keys.
        key: u64,
        /// Values.
        value: u64,
    },
    /// The paged cache.
    Cache {
        /// The cache buffer.
        cache: u64,
        /// Its storage dtype.
        storage_dtype: DType,
        /// True for the HND layout.
        layout_hnd: bool,
        /// Key dequantisation scale (1.0 unless fp8).
        k_scale: f32,
        /// Value dequantisation scale.
        v_scale: f32,
    },
}

/// The layer's and the pass's sizes and switches.
#[derive(Clone, Copy, Debug)]
pub struct AttnPassShape {
    /// Query heads.
    pub num_heads: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// Head size.
    pub head_size: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// The block table's row stride.
    pub max_blocks_per_req: usize,
    /// Tokens of the batch.
    pub num_tokens: usize,
    /// Sliding window, if any.
    pub sliding_window: Option<usize>,
    /// Softmax scale.
    pub scale: f32,
    /// Logit soft cap, 0 for none.
    pub soft_cap: f32,
    /// Causal mask.
    pub causal: bool,
    /// Sinks join this pass's softmax.
    pub use_sinks: bool,
    /// The query's dtype.
    pub dtype: DType,
    /// The output's dtype (f32 for cascade partials).
    pub out_dtype: DType,
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds the kernels' i32 range")))
}

/// The parameter block of one pass (the split-KV partials and work items are set by the
/// caller, per launch).
pub fn attn_params(b: AttnBuffers, keys: AttnKeySource, s: &AttnPassShape) -> Result<AttnParams> {
    let q_dtype = code(s.dtype)?;
    let mut params = AttnParams {
        q: b.q,
        block_table: b.block_table,
        seq_lens: b.seq_lens,
        query_start_loc: b.query_start_loc,
        alibi: b.alibi,
        sinks: b.sinks,
        out: b.out,
        lse: b.lse,
        q_dtype,
        out_dtype: code(s.out_dtype)?,
        num_heads: i32_of("num_heads", s.num_heads)?,
        num_kv_heads: i32_of("num_kv_heads", s.num_kv_heads)?,
        head_size: i32_of("head_size", s.head_size)?,
        group: i32_of("group", s.group)?,
        block_size: i32_of("block_size", s.block_size)?,
        bt_stride: i32_of("max_blocks_per_req", s.max_blocks_per_req)?,
        num_tokens: i32_of("num_tokens", s.num_tokens)?,
        causal: i32::from(s.causal),
        window: match s.sliding_window {
            Some(w) => i32_of("sliding_window", w)?,
            None => 0,
        },
        use_sinks: i32::from(s.use_sinks),
        scale: s.scale,
        soft_cap: s.soft_cap,
        k_scale: 1.0,
        v_scale: 1.0,
        ..Default::default()
    };
    match keys {
        AttnKeySource::Dense { key, value } => {
            params.k_dense = key;
            params.v_dense = value;
            params.dense = 1;
            params.cache_dtype = q_dtype;
        }
        AttnKeySource::Cache {
            cache,
            storage_dtype,
            layout_hnd,
            k_scale,
            v_scale,
        } => {
            params.cache = cache;
            params.cache_dtype = code(storage_dtype)?;
            params.layout_hnd = i32::from(layout_hnd);
            params.k_scale = k_scale;
            params.v_scale = v_scale;
        }
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> AttnPassShape {
        AttnPassShape {
            num_heads: 32,
            num_kv_heads: 8,
            group: 4,
            head_size: 128,
            block_size: 16,
            max_blocks_per_req: 7,
            num_tokens: 99,
            sliding_window: Some(64),
            scale: 0.125,
            soft_cap: 30.0,
            causal: true,
            use_sinks: true,
            dtype: DType::Bf16,
            out_dtype: DType::F32,
        }
    }

    const B: AttnBuffers = AttnBuffers {
        q: 1,
        block_table: 2,
        seq_lens: 3,
        query_start_loc: 4,
        alibi: 5,
        sinks: 6,
        out: 7,
        lse: 8,
    };

    #[test]
    fn every_field_from_its_source() {
        let keys = AttnKeySource::Cache {
            cache: 9,
            storage_dtype: DType::Fp8E5m2,
            layout_hnd: true,
            k_scale: 0.5,
            v_scale: 2.0,
        };
        let p = attn_params(B, keys, &shape()).unwrap();
        assert_eq!(
            (
                p.q,
                p.block_table,
                p.seq_lens,
                p.query_start_loc,
                p.alibi,
                p.sinks,
                p.out,
                p.lse
            ),
            (1, 2, 3, 4, 5, 6, 7, 8)
        );
        assert_eq!((p.cache, p.k_dense, p.v_dense, p.dense), (9, 0, 0, 0));
        assert_eq!(
            (p.q_dtype, p.out_dtype, p.cache_dtype, p.layout_hnd),
            (2, 0, 4, 1)
        );
        assert_eq!(
            (p.num_heads, p.num_kv_heads, p.group, p.head_size),
            (32, 8, 4, 128)
        );
        assert_eq!((p.block_size, p.bt_stride, p.num_tokens), (16, 7, 99));
        assert_eq!((p.causal, p.window, p.use_sinks), (1, 64, 1));
        assert_eq!(
            (p.scale, p.soft_cap, p.k_scale, p.v_scale),
            (0.125, 30.0, 0.5, 2.0)
        );
        // Set per launch by the caller.
        assert_eq!(
            (p.items, p.part_out, p.part_lse, p.n_part_tokens),
            (0, 0, 0, 0)
        );
    }

    #[test]
    fn dense_keys_take_the_query_dtype_and_unit_scales() {
        let mut s = shape();
        s.sliding_window = None;
        s.causal = false;
        let p = attn_params(B, AttnKeySource::Dense { key: 10, value: 11 }, &s).unwrap();
        assert_eq!((p.k_dense, p.v_dense, p.dense, p.cache), (10, 11, 1, 0));
        assert_eq!((p.cache_dtype, p.k_scale, p.v_scale), (2, 1.0, 1.0));
        assert_eq!((p.window, p.causal), (0, 0));
        s.num_tokens = 1 << 31;
        assert!(attn_params(B, AttnKeySource::Dense { key: 1, value: 1 }, &s).is_err());
    }
}
