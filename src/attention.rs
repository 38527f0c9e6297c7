//! The impl contracts ([`AttentionImpl`], [`MlaAttentionImpl`]), their constructor parameters
//! ([`AttentionParams`]) and the per-layer state ([`AttentionLayer`]). The model-facing layer
//! object, which also selects a backend, is [`crate::layer::Attention`].
//!
//! vLLM constructs one impl per layer with the layer's hyper-parameters, then calls
//! `forward(layer, query, key, value, kv_cache, attn_metadata, output)` every step. polyattn
//! keeps that shape. One difference, on purpose: `forward` also writes the new keys and values
//! into the cache (vLLM's `forward_includes_kv_cache_update = True` behaviour), so model code
//! makes one call per layer; `do_kv_cache_update` stays available on its own.

use crate::capability::AttentionType;
use crate::device::Tensor;
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::metadata::AttentionMetadata;
use crate::mla::MlaKvCache;

/// The hyper-parameters an impl is constructed with (vLLM's `AttentionImpl.__init__`).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub num_heads: usize,
    /// Head size of queries, keys and values.
    pub head_size: usize,
    /// Logit scale, usually `head_size^-0.5`.
    pub scale: f32,
    /// KV heads; `num_heads` must be a multiple (GQA; MQA when 1).
    pub num_kv_heads: usize,
    /// ALiBi slope per query head: bias `−slope · |q_pos − j|` on the scaled logits (equal to
    /// `slope · (j − q_pos)` for the keys a causal query sees; symmetric when non-causal, as
    /// in FlashAttention).
    pub alibi_slopes: Option<Vec<f32>>,
    /// Sliding window W: a query sees the W most recent keys, itself included.
    pub sliding_window: Option<usize>,
    /// KV-cache dtype.
    pub kv_cache_dtype: CacheDType,
    /// Logit soft cap c: `s ← c·tanh(s/c)` on the scaled logits; `None` or 0 disables.
    pub logits_soft_cap: Option<f32>,
    /// Attention type.
    pub attn_type: AttentionType,
    /// Per-head sink logits: they join the softmax denominator and contribute no value.
    pub sinks: Option<Vec<f32>>,
}

impl AttentionParams {
    /// Plain decoder attention with `scale = head_size^-0.5` and an `auto` cache.
    pub fn new(num_heads: usize, head_size: usize, num_kv_heads: usize) -> Self {
        AttentionParams {
            num_heads,
            head_size,
            scale: 1.0 / (head_size as f32).sqrt(),
            num_kv_heads,
            alibi_slopes: None,
            sliding_window: None,
            kv_cache_dtype: CacheDType::Auto,
            logits_soft_cap: None,
            attn_type: AttentionType::Decoder,
            sinks: None,
        }
    }

    /// Query heads per KV head.
    pub fn num_queries_per_kv(&self) -> usize {
        self.num_heads / self.num_kv_heads.max(1)
    }

    /// The soft cap if enabled (vLLM maps `None` and 0 to "off").
    pub fn soft_cap(&self) -> Option<f32> {
        self.logits_soft_cap.filter(|&c| c > 0.0)
    }

    /// Checks the parameters among themselves (backend support is checked by the selector).
    pub fn validate(&self) -> Result<()> {
        if self.num_heads == 0 || self.num_kv_heads == 0 || self.head_size == 0 {
            return Err(Error::config(format!(
                "num_heads ({}), num_kv_heads ({}) and head_size ({}) must all be positive",
                self.num_heads, self.num_kv_heads, self.head_size
            )));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(Error::config(format!(
                "num_heads {} is not a multiple of num_kv_heads {} (GQA needs whole groups)",
                self.num_heads, self.num_kv_heads
            )));
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(Error::config(format!(
                "scale {} must be finite and positive",
                self.scale
            )));
        }
        if let Some(a) = &self.alibi_slopes {
            if a.len() != self.num_heads {
                return Err(Error::config(format!(
                    "alibi_slopes has {} entries; expected one per query head ({})",
                    a.len(),
                    self.num_heads
                )));
            }
        }
        if let Some(s) = &self.sinks {
            if s.len() != self.num_heads {
                return Err(Error::config(format!(
                    "sinks has {} entries; expected one per query head ({})",
                    s.len(),
                    self.num_heads
                )));
            }
        }
        if self.sliding_window == Some(0) {
            return Err(Error::config(
                "sliding_window 0 would hide every key; use None for no window",
            ));
        }
        if let Some(c) = self.logits_soft_cap {
            if !c.is_finite() || c < 0.0 {
                return Err(Error::config(format!(
                    "logits_soft_cap {c} must be finite and ≥ 0"
                )));
            }
        }
        Ok(())
    }
}

impl AttentionParams {
    /// The argument checks every impl's `forward` makes first, in one place: `query` is
    /// `[≥num_tokens, num_heads, head_size]` of an activation dtype, `output` has the query's
    /// shape and dtype, `output_lse` (if any) is `[num_heads, num_tokens]` f32. Returns the
    /// activation dtype.
    pub fn check_query_output(
        &self,
        query: &Tensor,
        output: &Tensor,
        output_lse: Option<&Tensor>,
        num_tokens: usize,
    ) -> Result<crate::DType> {
        let dtype = query.dtype();
        if !dtype.is_activation() {
            return Err(Error::DType {
                what: "query",
                got: dtype.to_string(),
                expected: "f32, f16 or bf16".into(),
            });
        }
        let qs = query.shape();
        if qs.len() != 3 || qs[0] < num_tokens || qs[1] != self.num_heads || qs[2] != self.head_size
        {
            return Err(Error::shape(
                "query",
                qs,
                format!(
                    "[≥{num_tokens} tokens, {} heads, {}]",
                    self.num_heads, self.head_size
                ),
            ));
        }
        output.expect_shape("output", qs)?;
        output.expect_dtype("output", dtype)?;
        if let Some(t) = output_lse {
            t.expect_shape("output_lse", &[self.num_heads, num_tokens])?;
            t.expect_dtype("output_lse", crate::DType::F32)?;
        }
        Ok(dtype)
    }

    /// Checks that `cache` fits this layer and the batch: same KV heads and head size, the
    /// storage dtype `kv_cache_dtype` gives for `dtype` activations, the batch's block size,
    /// and at least the `num_blocks` the batch's block ids were validated against.
    pub fn check_kv_cache(
        &self,
        cache: &KvCache,
        dtype: crate::DType,
        common: &crate::CommonAttentionMetadata,
    ) -> Result<()> {
        let spec = cache.spec();
        if spec.dtype != dtype {
            return Err(Error::DType {
                what: "query",
                got: dtype.to_string(),
                expected: format!(
                    "{} (the activation dtype the KV cache was built for)",
                    spec.dtype
                ),
            });
        }
        if spec.num_kv_heads != self.num_kv_heads || spec.head_size != self.head_size {
            return Err(Error::config(format!(
                "KV cache holds {} heads of size {}, the layer needs {} of size {}",
                spec.num_kv_heads, spec.head_size, self.num_kv_heads, self.head_size
            )));
        }
        let want = self.kv_cache_dtype.storage_dtype(dtype);
        if spec.storage_dtype() != want {
            return Err(Error::DType {
                what: "kv_cache",
                got: spec.storage_dtype().to_string(),
                expected: format!(
                    "{want} (kv_cache_dtype {} with {dtype} activations)",
                    self.kv_cache_dtype
                ),
            });
        }
        cache.check_batch(common)
    }

    /// Checks the inputs of a KV-cache update (`do_kv_cache_update`) and returns their dtype:
    /// key and value must both be `[≥rows, num_kv_heads, head_size]` of the activation dtype
    /// `cache` was built for (whatever it stores: an f16 or fp8 cache still takes the layer's
    /// activations, so a key of another dtype is an error naming the key, not the cache).
    pub fn check_kv_update(
        &self,
        key: &Tensor,
        value: &Tensor,
        rows: usize,
        cache: &KvCache,
    ) -> Result<DType> {
        let dtype = cache.spec().dtype;
        for (what, t) in [("key", key), ("value", value)] {
            if t.dtype() != dtype {
                return Err(Error::DType {
                    what,
                    got: t.dtype().to_string(),
                    expected: format!(
                        "{dtype} (the layer's activation dtype, which the KV cache was built for)"
                    ),
                });
            }
        }
        self.check_kv_input("key", key, rows, dtype)?;
        self.check_kv_input("value", value, rows, dtype)?;
        Ok(dtype)
    }

    /// Checks a key or value input: `[≥rows, num_kv_heads, head_size]` of `dtype`.
    pub fn check_kv_input(
        &self,
        what: &'static str,
        t: &Tensor,
        rows: usize,
        dtype: crate::DType,
    ) -> Result<()> {
        let s = t.shape();
        if s.len() != 3 || s[0] < rows || s[1] != self.num_kv_heads || s[2] != self.head_size {
            return Err(Error::shape(
                what,
                s,
                format!("[≥{rows}, {}, {}]", self.num_kv_heads, self.head_size),
            ));
        }
        t.expect_dtype(what, dtype)
    }
}

/// The per-layer state vLLM passes as `layer`: its name and the fp8 KV scales.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionLayer {
    /// Unique layer name ("model.layers.3.self_attn").
    pub name: String,
    /// fp8 key scale: stored `k / k_scale`, loaded `q · k_scale`. 1.0 when unquantised.
    pub k_scale: f32,
    /// fp8 value scale.
    pub v_scale: f32,
}

impl AttentionLayer {
    /// A layer with unit scales.
    pub fn new(name: impl Into<String>) -> Self {
        AttentionLayer {
            name: name.into(),
            k_scale: 1.0,
            v_scale: 1.0,
        }
    }

    /// Sets the fp8 scales (must be finite and positive).
    pub fn with_scales(mut self, k_scale: f32, v_scale: f32) -> Result<Self> {
        for (n, s) in [("k_scale", k_scale), ("v_scale", v_scale)] {
            if !(s.is_finite() && s > 0.0) {
                return Err(Error::config(format!(
                    "{n} {s} must be finite and positive"
                )));
            }
        }
        self.k_scale = k_scale;
        self.v_scale = v_scale;
        Ok(self)
    }
}

/// One layer's attention kernels on one backend (vLLM's `AttentionImpl`).
///
/// Shapes: `query [num_tokens, num_heads, head_size]`; `key`, `value`
/// `[num_tokens, num_kv_heads, head_size]` (absent when the layer reuses another layer's
/// cache); `output [num_tokens, num_heads, head_size]` preallocated in the query's dtype;
/// `output_lse [num_heads, num_tokens]` f32, natural log. Tensors may be longer than the
/// batch's `num_actual_tokens` (graph padding): only the first `num_actual_tokens` rows are
/// read and written.
pub trait AttentionImpl: Send + Sync {
    /// The parameters it was built with.
    fn params(&self) -> &AttentionParams;

    /// True if `forward_with_lse` can return the LSE for decode batches (needed by DCP).
    fn can_return_lse_for_decode(&self) -> bool;

    /// True when the LSE is `ln Σ exp`, false for `log2 Σ exp`.
    fn lse_base_on_e(&self) -> bool {
        true
    }

    /// Decode context parallelism support.
    fn supports_dcp(&self) -> bool {
        false
    }

    /// Prefill context parallelism support (no vLLM 0.25.1 impl has it).
    fn supports_pcp(&self) -> bool {
        false
    }

    /// Writes `key` / `value` rows into the cache at the batch's slot mapping (−1 skipped).
    fn do_kv_cache_update(
        &self,
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
    ) -> Result<()>;

    /// Attention for one batch, writing `output` and, when given, `output_lse`.
    /// For decoder layers it first writes `key` / `value` into the cache.
    #[allow(clippy::too_many_arguments)]
    fn forward_with_lse(
        &self,
        layer: &AttentionLayer,
        query: &Tensor,
        key: Option<&Tensor>,
        value: Option<&Tensor>,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
        output_lse: Option<&mut Tensor>,
    ) -> Result<()>;

    /// Attention for one batch (vLLM's `forward`), writing `output`.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        layer: &AttentionLayer,
        query: &Tensor,
        key: Option<&Tensor>,
        value: Option<&Tensor>,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
    ) -> Result<()> {
        self.forward_with_lse(layer, query, key, value, kv_cache, metadata, output, None)
    }
}

/// MLA (multi-head latent attention) kernels (vLLM's `MLAAttentionImpl`): decode runs as MQA
/// on the latent cache ([`MlaKvCache`]) with absorbed weights, prefill as MHA. There is no
/// plain `forward`.
///
/// No built-in backend implements it yet (the CPU kernels exist:
/// `backends::cpu::kernels::mla_decode` and `mla_prefill`, checked against
/// [`crate::mla::reference`]); the contract is fixed here so that MLA backends and plugins
/// plug into the same registry and selector (`use_mla` in
/// [`SelectorConfig`](crate::backend::SelectorConfig)).
pub trait MlaAttentionImpl: Send + Sync {
    /// Writes the batch's new latents into the cache (vLLM's `concat_and_cache_mla`):
    /// `kv_c [T, kv_lora_rank]` and `k_pe [T, rope_dim]` at the metadata's slot mapping (−1
    /// skipped; fp8 caches store `x / k_scale`), on the cache's device.
    fn do_kv_cache_update(
        &self,
        layer: &AttentionLayer,
        kv_c: &Tensor,
        k_pe: &Tensor,
        kv_cache: &mut MlaKvCache,
        metadata: &dyn AttentionMetadata,
    ) -> Result<()>;

    /// Decode: `q [B, N, kv_lora_rank + rope_dim]` against the latent cache
    /// `[blocks, block_size, kv_lora_rank + rope_dim]`; writes `output [B, N, kv_lora_rank]`
    /// and, when given, `lse [N, B]`.
    fn forward_mqa(
        &self,
        layer: &AttentionLayer,
        q: &Tensor,
        kv_cache: &MlaKvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
        lse: Option<&mut Tensor>,
    ) -> Result<()>;

    /// Prefill: causal MHA over up-projected keys and values; writes `output [T, N, v_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn forward_mha(
        &self,
        layer: &AttentionLayer,
        q: &Tensor,
        kv_c_normed: &Tensor,
        k_pe: &Tensor,
        kv_cache: &MlaKvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
    ) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_validation_names_the_problem() {
        let mut p = AttentionParams::new(6, 64, 4);
        assert!(p
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not a multiple"));
        p.num_kv_heads = 2;
        p.validate().unwrap();
        p.sinks = Some(vec![0.0; 5]);
        assert!(p
            .validate()
            .unwrap_err()
            .to_string()
            .contains("one per query head (6)"));
        p.sinks = None;
        p.sliding_window = Some(0);
        assert!(p.validate().is_err());
    }

    #[test]
    fn layer_scales_must_be_positive() {
        assert!(AttentionLayer::new("l").with_scales(0.0, 1.0).is_err());
        assert!(AttentionLayer::new("l").with_scales(0.5, f32::NAN).is_err());
        assert_eq!(
            AttentionLayer::new("l")
                .with_scales(0.5, 0.25)
                .unwrap()
                .v_scale,
            0.25
        );
    }
}
