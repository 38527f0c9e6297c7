//! The CPU MLA impl: `forward_mqa` runs the batch's decodes (requests `0..num_decodes`, one
//! query length, causal within the request) in latent space, `forward_mha` its prefills in expanded form; both check
//! every tensor's shape, dtype and device first and write their outputs in the activation
//! dtype.

use crate::attention::{AttentionLayer, MlaAttentionImpl};
use crate::backends::cpu::kernels::convert::store;
use crate::backends::cpu::kernels::mla_decode::mla_decode;
use crate::backends::cpu::kernels::mla_prefill::mla_prefill;
use crate::device::{DeviceKind, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::metadata::AttentionMetadata;
use crate::mla::{concat_and_cache_mla, AbsorbedWeights, MlaKvCache, MlaParams};

use super::CpuMlaMetadata;

/// The CPU MLA impl of one layer.
#[derive(Debug)]
pub struct CpuMlaAttentionImpl {
    params: MlaParams,
    weights: AbsorbedWeights,
}

impl CpuMlaAttentionImpl {
    /// The impl for `params` with its absorbed `kv_b_proj` (checked by the descriptor).
    pub fn new(params: MlaParams, weights: AbsorbedWeights) -> Self {
        CpuMlaAttentionImpl { params, weights }
    }

    fn check_cache(&self, cache: &MlaKvCache) -> Result<()> {
        if cache.latent_dim() != self.params.latent_dim() {
            return Err(Error::config(format!(
                "CPU_MLA: the cache holds {}-wide latents, the layer's are {}",
                cache.latent_dim(),
                self.params.latent_dim()
            )));
        }
        if cache.data().device().kind() != DeviceKind::Cpu {
            return Err(Error::Device {
                backend: "CPU_MLA".into(),
                message: "the latent cache is not on the CPU".into(),
            });
        }
        Ok(())
    }
}

/// Checks `t` is a CPU tensor of `shape` and an activation dtype (`dtype` when given).
fn expect(t: &Tensor, what: &'static str, shape: &[usize], dtype: Option<DType>) -> Result<()> {
    t.expect_shape(what, shape)?;
    if let Some(d) = dtype {
        t.expect_dtype(what, d)?;
    } else if !t.dtype().is_activation() {
        return Err(Error::DType {
            what,
            got: t.dtype().to_string(),
            expected: "f32, f16 or bf16".into(),
        });
    }
    if t.device().kind() != DeviceKind::Cpu {
        return Err(Error::Device {
            backend: "CPU_MLA".into(),
            message: format!("{what} is not on the CPU"),
        });
    }
    Ok(())
}

/// Writes `values` into `out` (checked to be a CPU tensor of that many elements).
fn write(out: &mut Tensor, values: &[f32]) -> Result<()> {
    let dtype = out.dtype();
    let Some(storage) = out.as_cpu_mut() else {
        return Err(Error::Device {
            backend: "CPU_MLA".into(),
            message: "an output is not on the CPU".into(),
        });
    };
    store(storage, dtype, 0, values, 1.0);
    Ok(())
}

impl MlaAttentionImpl for CpuMlaAttentionImpl {
    fn do_kv_cache_update(
        &self,
        layer: &AttentionLayer,
        kv_c: &Tensor,
        k_pe: &Tensor,
        kv_cache: &mut MlaKvCache,
        metadata: &dyn AttentionMetadata,
    ) -> Result<()> {
        let md = metadata.downcast::<CpuMlaMetadata>("CpuMlaAttentionImpl")?;
        self.check_cache(kv_cache)?;
        let slots = md.common.slot_mapping_cpu();
        let rows = |t: &Tensor| t.shape().first().copied();
        if rows(kv_c) != Some(slots.len()) || rows(k_pe) != Some(slots.len()) {
            return Err(Error::config(format!(
                "do_kv_cache_update: the batch has {} new tokens; kv_c is {:?} and k_pe {:?}",
                slots.len(),
                kv_c.shape(),
                k_pe.shape()
            )));
        }
        concat_and_cache_mla(kv_c, k_pe, kv_cache, slots, layer.k_scale)
    }

    fn forward_mqa(
        &self,
        layer: &AttentionLayer,
        q: &Tensor,
        kv_cache: &MlaKvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
        lse: Option<&mut Tensor>,
    ) -> Result<()> {
        let md = metadata.downcast::<CpuMlaMetadata>("CpuMlaAttentionImpl")?;
        self.check_cache(kv_cache)?;
        kv_cache.dequant_scale(layer.k_scale)?;
        let p = &self.params;
        let b = md.split.num_decode_tokens;
        expect(q, "q", &[b, p.num_heads, p.latent_dim()], None)?;
        expect(
            output,
            "output",
            &[b, p.num_heads, p.kv_lora_rank],
            Some(q.dtype()),
        )?;
        if let Some(l) = lse.as_deref() {
            expect(l, "lse", &[p.num_heads, b], Some(DType::F32))?;
        }
        let (out, l) = mla_decode(
            &q.to_f32_vec()?,
            p.num_heads,
            p.kv_lora_rank,
            p.scale,
            layer.k_scale,
            kv_cache,
            &md.common,
            0..md.split.num_decodes,
        )?;
        write(output, &out)?;
        if let Some(t) = lse {
            write(t, &l)?;
        }
        Ok(())
    }

    fn forward_mha(
        &self,
        layer: &AttentionLayer,
        q: &Tensor,
        kv_c_normed: &Tensor,
        k_pe: &Tensor,
        kv_cache: &MlaKvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
    ) -> Result<()> {
        let md = metadata.downcast::<CpuMlaMetadata>("CpuMlaAttentionImpl")?;
        self.check_cache(kv_cache)?;
        kv_cache.dequant_scale(layer.k_scale)?;
        let p = &self.params;
        let t = md.split.num_prefill_tokens;
        let (l, r) = (p.kv_lora_rank, p.qk_rope_head_dim);
        expect(q, "q", &[t, p.num_heads, p.qk_head_dim()], None)?;
        expect(kv_c_normed, "kv_c_normed", &[t, l], Some(q.dtype()))?;
        expect(k_pe, "k_pe", &[t, r], Some(q.dtype()))?;
        expect(
            output,
            "output",
            &[t, p.num_heads, p.v_head_dim],
            Some(q.dtype()),
        )?;
        let (c, pe) = (kv_c_normed.to_f32_vec()?, k_pe.to_f32_vec()?);
        let mut latents = Vec::with_capacity(t * (l + r));
        for i in 0..t {
            latents.extend_from_slice(&c[i * l..][..l]);
            latents.extend_from_slice(&pe[i * r..][..r]);
        }
        let reqs = md.split.num_decodes..md.common.num_reqs();
        let (out, _) = mla_prefill(
            &q.to_f32_vec()?,
            &latents,
            &self.weights,
            layer.k_scale,
            kv_cache,
            &md.common,
            reqs,
        )?;
        write(output, &out)
    }
}
