//! [`MlaParams`]: the sizes of one MLA layer, validated once.

use crate::device::Tensor;
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};

use super::MlaKvCache;

/// `t` of `shape` and dtype `dtype` (an activation dtype when `None`).
fn expect(t: &Tensor, what: &'static str, shape: &[usize], dtype: Option<DType>) -> Result<()> {
    t.expect_shape(what, shape)?;
    match dtype {
        Some(d) => t.expect_dtype(what, d),
        None if !t.dtype().is_activation() => Err(Error::DType {
            what,
            got: t.dtype().to_string(),
            expected: "f32, f16 or bf16".into(),
        }),
        None => Ok(()),
    }
}

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

/// The argument checks every MLA impl makes before its kernels run (vLLM's MLA shapes):
/// shapes, dtypes, and the cache's latent width. Where the tensors live is the backend's to
/// check.
impl MlaParams {
    fn check_cache(&self, cache: &MlaKvCache) -> Result<()> {
        if cache.latent_dim() != self.latent_dim() {
            return Err(Error::config(format!(
                "the cache holds {}-wide latents, the layer's are {} (kv_lora_rank {} + rope {})",
                cache.latent_dim(),
                self.latent_dim(),
                self.kv_lora_rank,
                self.qk_rope_head_dim
            )));
        }
        Ok(())
    }

    /// `do_kv_cache_update` for `t` new tokens: `kv_c [t, kv_lora_rank]` of an activation
    /// dtype, `k_pe [t, rope]` of the same dtype, a cache of this layer's latent width.
    pub fn check_cache_update(
        &self,
        t: usize,
        kv_c: &Tensor,
        k_pe: &Tensor,
        cache: &MlaKvCache,
    ) -> Result<()> {
        self.check_cache(cache)?;
        expect(kv_c, "kv_c", &[t, self.kv_lora_rank], None)?;
        expect(
            k_pe,
            "k_pe",
            &[t, self.qk_rope_head_dim],
            Some(kv_c.dtype()),
        )
    }

    /// `forward_mqa` for `b` decode tokens: `q [b, N, latent]` of an activation dtype,
    /// `output [b, N, kv_lora_rank]` of the same dtype, `lse [N, b]` f32, a cache of this
    /// layer's latent width.
    pub fn check_mqa(
        &self,
        b: usize,
        q: &Tensor,
        cache: &MlaKvCache,
        output: &Tensor,
        lse: Option<&Tensor>,
    ) -> Result<()> {
        let n = self.num_heads;
        self.check_cache(cache)?;
        expect(q, "q", &[b, n, self.latent_dim()], None)?;
        expect(
            output,
            "output",
            &[b, n, self.kv_lora_rank],
            Some(q.dtype()),
        )?;
        match lse {
            Some(l) => expect(l, "lse", &[n, b], Some(DType::F32)),
            None => Ok(()),
        }
    }

    /// `forward_mha` for `t` prefill tokens: `q [t, N, qk_nope + rope]` of an activation
    /// dtype, `kv_c_normed [t, kv_lora_rank]`, `k_pe [t, rope]` and `output [t, N, v_dim]` of
    /// the same dtype, a cache of this layer's latent width.
    pub fn check_mha(
        &self,
        t: usize,
        q: &Tensor,
        kv_c_normed: &Tensor,
        k_pe: &Tensor,
        cache: &MlaKvCache,
        output: &Tensor,
    ) -> Result<()> {
        let (n, act) = (self.num_heads, q.dtype());
        self.check_cache(cache)?;
        expect(q, "q", &[t, n, self.qk_head_dim()], None)?;
        expect(
            kv_c_normed,
            "kv_c_normed",
            &[t, self.kv_lora_rank],
            Some(act),
        )?;
        expect(k_pe, "k_pe", &[t, self.qk_rope_head_dim], Some(act))?;
        expect(output, "output", &[t, n, self.v_head_dim], Some(act))
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
