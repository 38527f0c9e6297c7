//! What the two backends of the CUDA kernel family (CUDA, HIP) build the same way from the
//! forward driver's view of a call: one attention pass's parameter block and the cache
//! write's launch. Each backend passes how it resolves a tensor to a device address on its
//! GPU (`ptr`, which errs for a tensor elsewhere) and launches the result itself.

use crate::attention::{AttentionLayer, AttentionParams};
use crate::backend::KvLayout;
use crate::device::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::forward::{ForwardIo, Keys, PassSpec};
use crate::kernels::cuda::{
    attn_params, reshape_launch, AttnBuffers, AttnKeySource, AttnParams, AttnPassShape,
    ReshapeBuffers, ReshapeLaunch, ReshapeShape,
};
use crate::kv_cache::KvCache;
use crate::metadata::{CommonAttentionMetadata, DeviceMetadata};

/// The layer's k / v dequantisation scales: the layer's own for an fp8 cache, else 1.
pub(crate) fn cache_scales(p: &AttentionParams, layer: &AttentionLayer) -> (f32, f32) {
    if p.kv_cache_dtype.is_fp8() {
        (layer.k_scale, layer.v_scale)
    } else {
        (1.0, 1.0)
    }
}

/// Where a pass writes: output and LSE addresses (LSE 0: none) and the output's dtype.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PassTarget {
    pub out: u64,
    pub lse: u64,
    pub out_dtype: DType,
}

/// The call's output and output LSE (0 when not asked for), in the activation dtype.
pub(crate) fn output_target(
    ptr: impl Fn(&Tensor, &str) -> Result<u64>,
    io: &ForwardIo<'_>,
) -> Result<PassTarget> {
    Ok(PassTarget {
        out: ptr(io.output, "output")?,
        lse: match io.output_lse.as_deref() {
            Some(t) => ptr(t, "output_lse")?,
            None => 0,
        },
        out_dtype: io.dtype,
    })
}

/// The batch-side inputs of a pass besides the call's tensors.
pub(crate) struct PassBatch<'a> {
    pub common: &'a CommonAttentionMetadata,
    /// The metadata arrays on the backend's GPU.
    pub arrays: &'a DeviceMetadata,
    /// Device addresses of the layer's ALiBi slopes and sinks (0: none).
    pub alibi: u64,
    pub sinks: u64,
}

/// One pass's parameter block: the batch, the key source (dense keys or the cache), the
/// target.
pub(crate) fn pass_params(
    ptr: impl Fn(&Tensor, &str) -> Result<u64>,
    p: &AttentionParams,
    batch: &PassBatch<'_>,
    io: &ForwardIo<'_>,
    spec: &PassSpec,
    target: PassTarget,
) -> Result<AttnParams> {
    let arrays = batch.arrays;
    let buffers = AttnBuffers {
        q: ptr(io.query, "query")?,
        block_table: ptr(&arrays.block_table, "block_table")?,
        seq_lens: ptr(&arrays.seq_lens, "seq_lens")?,
        query_start_loc: ptr(&arrays.query_start_loc, "query_start_loc")?,
        alibi: batch.alibi,
        sinks: batch.sinks,
        out: target.out,
        lse: target.lse,
    };
    let keys = match io.keys {
        Keys::Dense { key, value } => AttnKeySource::Dense {
            key: ptr(key, "key")?,
            value: ptr(value, "value")?,
        },
        Keys::Cache(cache) => {
            let (k_scale, v_scale) = cache_scales(p, io.layer);
            AttnKeySource::Cache {
                cache: ptr(cache.data(), "the KV cache")?,
                storage_dtype: cache.spec().storage_dtype(),
                layout_hnd: cache.layout() == KvLayout::Hnd,
                k_scale,
                v_scale,
            }
        }
    };
    let shape = AttnPassShape {
        num_heads: p.num_heads,
        num_kv_heads: p.num_kv_heads,
        group: p.num_queries_per_kv(),
        head_size: p.head_size,
        block_size: batch.common.block_size(),
        max_blocks_per_req: batch.common.max_blocks_per_req(),
        num_tokens: io.num_tokens,
        sliding_window: p.sliding_window,
        scale: p.scale,
        soft_cap: p.soft_cap().unwrap_or(0.0),
        causal: spec.causal,
        use_sinks: batch.sinks != 0 && spec.sinks,
        dtype: io.dtype,
        out_dtype: target.out_dtype,
    };
    attn_params(buffers, keys, &shape)
}

/// The cache write of a call's new `key` / `value` into `kv_cache`, or `None` when the batch
/// has no token (every address is still resolved, so a tensor on another device errs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn cache_write(
    ptr: impl Fn(&Tensor, &str) -> Result<u64>,
    p: &AttentionParams,
    common: &CommonAttentionMetadata,
    arrays: &DeviceMetadata,
    layer: &AttentionLayer,
    key: &Tensor,
    value: &Tensor,
    kv_cache: &KvCache,
) -> Result<Option<ReshapeLaunch>> {
    let n = common.slot_mapping_cpu().len();
    let k = ptr(key, "key")?;
    let v = ptr(value, "value")?;
    let cache = ptr(kv_cache.data(), "the KV cache")?;
    if n == 0 {
        return Ok(None);
    }
    let slot_mapping = ptr(&arrays.slot_mapping, "slot_mapping")?;
    let (k_scale, v_scale) = cache_scales(p, layer);
    reshape_launch(
        ReshapeBuffers {
            key: k,
            value: v,
            cache,
            slot_mapping,
        },
        &ReshapeShape {
            num_tokens: n,
            num_kv_heads: p.num_kv_heads,
            head_size: p.head_size,
            block_size: kv_cache.block_size(),
            dtype: kv_cache.spec().dtype,
            cache_dtype: kv_cache.spec().storage_dtype(),
            layout_hnd: kv_cache.layout() == KvLayout::Hnd,
            k_scale,
            v_scale,
        },
    )
    .map(Some)
}
