//! The CPU MLA impl: `forward_mqa` runs the batch's decodes (requests `0..num_decodes`, one
//! query length, causal within the request) in latent space, `forward_mha` its prefills in expanded form; both check
//! every tensor's shape, dtype and device first and write their outputs in the activation
//! dtype.

use crate::attention::{AttentionLayer, MlaAttentionImpl};
use crate::backends::cpu::kernels::convert::store;
use crate::backends::cpu::kernels::mla_decode::mla_decode;
use crate::backends::cpu::kernels::mla_prefill::mla_prefill;
use crate::device::{DeviceKind, Tensor};
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

    /// The cache on the host (its shape is `MlaParams::check_*`'s).
    fn check_cache(&self, cache: &MlaKvCache) -> Result<()> {
        if cache.data().device().kind() != DeviceKind::Cpu {
            return Err(Error::Device {
                backend: "CPU_MLA".into(),
                message: "the latent cache is not on the CPU".into(),
            });
        }
        Ok(())
    }
}

/// Checks that every tensor of `ts` lives on the host.
fn on_host(ts: &[(&Tensor, &str)]) -> Result<()> {
    match ts
        .iter()
        .find(|(t, _)| t.device().kind() != DeviceKind::Cpu)
    {
        Some((_, what)) => Err(Error::Device {
            backend: "CPU_MLA".into(),
            message: format!("{what} is not on the CPU"),
        }),
        None => Ok(()),
    }
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
        let slots = md.common.slot_mapping_cpu();
        self.params
            .check_cache_update(slots.len(), kv_c, k_pe, kv_cache)?;
        self.check_cache(kv_cache)?;
        on_host(&[(kv_c, "kv_c"), (k_pe, "k_pe")])?;
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
        p.check_mqa(b, q, kv_cache, output, lse.as_deref())?;
        on_host(&[(q, "q"), (output, "output")])?;
        if let Some(l) = lse.as_deref() {
            on_host(&[(l, "lse")])?;
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
        p.check_mha(t, q, kv_c_normed, k_pe, kv_cache, output)?;
        on_host(&[
            (q, "q"),
            (kv_c_normed, "kv_c_normed"),
            (k_pe, "k_pe"),
            (output, "output"),
        ])?;
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
