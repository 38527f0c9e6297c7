//! [`MlaParams`]: the sizes of one MLA layer, validated once.

use crate::dtype::CacheDType;
use crate::error::{Error, Result};

/// The sizes of one MLA layer (vLLM's `MLAAttentionImpl` constructor arguments).
#[derive(Clone, Debug, PartialEq)]
pub struct MlaParams {
    /// Query heads `N` (the latent cache has one shared "KV head").
    pub num_heads: usize,
    /// Latent width `Lkv` (512 in DeepSeek-V3).
    pub kv_lora_rank: usize,
    /// Per-head query / key dims without RoPE `P` (128).
    pub qk_nope_head_dim: usize,
    /// RoPE dims `R`, shared by every head's key (64).
    pub qk_rope_head_dim: usize,
    /// Per-head value dims `V` (128).
    pub v_head_dim: usize,
    /// Softmax scale, applied to `q·k` (vLLM: `1 / sqrt(P + R)` unless the model scales it).
    pub scale: f32,
    /// Cache dtype (`Auto`, or fp8 with the layer's scale).
    pub kv_cache_dtype: CacheDType,
}

impl MlaParams {
    /// DeepSeek-V3's sizes with `num_heads` heads (128 in the full model, 16 per GPU at
    /// tensor-parallel 8): `Lkv` 512, `P` 128, `R` 64, `V` 128, scale `1/sqrt(192)`.
    pub fn deepseek_v3(num_heads: usize) -> Self {
        MlaParams {
            num_heads,
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
            scale: 1.0 / (192f32).sqrt(),
            kv_cache_dtype: CacheDType::Auto,
        }
    }

    /// The latent width of one cached token, `Lkv + R` (vLLM's MLA `head_size`: 576).
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// The per-head query / key width of the prefill, `P + R` (192).
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Checks that every size is positive, the scale finite and positive, and the sizes'
    /// products fit the address space.
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [
            ("num_heads", self.num_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
        ] {
            if v == 0 {
                return Err(Error::config(format!("MLA {what} must be positive")));
            }
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(Error::config(format!(
                "MLA scale must be finite and positive, got {}",
                self.scale
            )));
        }
        self.num_heads
            .checked_mul(self.qk_nope_head_dim + self.v_head_dim)
            .and_then(|x| x.checked_mul(self.kv_lora_rank))
            .ok_or_else(|| Error::overflow("MLA kv_b_proj", format!("{self:?}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepseek_sizes() {
        let p = MlaParams::deepseek_v3(16);
        p.validate().unwrap();
        assert_eq!((p.latent_dim(), p.qk_head_dim()), (576, 192));
        let bad = MlaParams {
            v_head_dim: 0,
            ..p.clone()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("v_head_dim"));
        let bad = MlaParams { scale: 0.0, ..p };
        assert!(bad.validate().is_err());
    }
}
