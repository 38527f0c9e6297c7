//! Decode context parallelism for an MLA layer (vLLM's DCP as DeepSeek models run it): the
//! latent cache sharded over the ranks as [`super::DcpLayout`] says, each rank running the
//! latent-space decode (`forward_mqa`) over its shard, the partial results — latent outputs
//! `[B, N, kv_lora_rank]` with their LSEs — combined as the standard layer's are. The
//! up-projection (W_UV) follows on the combined output, as without DCP.

use super::{combine, DcpMetadata, Partial};
use crate::attention::{AttentionLayer, MlaAttentionImpl};
use crate::device::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::mla::MlaKvCache;

/// An MLA decode batch over latent caches sharded across `caches` (one per rank of the
/// metadata's layout, all on the query's device; the metadata built with the backend's MLA
/// builder): each rank writes the new latents it owns (`kv_c [B, kv_lora_rank]`,
/// `k_pe [B, rope_dim]`, both or neither) and attends over its shard with the absorbed query
/// `q [B, N, kv_lora_rank + rope_dim]`; the combined latent output goes to
/// `output [B, N, kv_lora_rank]` and, when given, the LSE to `output_lse [N, B]` (natural
/// log).
#[allow(clippy::too_many_arguments)]
pub fn forward_mqa_decode(
    imp: &dyn MlaAttentionImpl,
    layer: &AttentionLayer,
    new_latents: Option<(&Tensor, &Tensor)>,
    q: &Tensor,
    caches: &mut [MlaKvCache],
    metadata: &DcpMetadata,
    output: &mut Tensor,
    mut output_lse: Option<&mut Tensor>,
) -> Result<()> {
    let n = metadata.layout().world_size();
    if caches.len() != n {
        return Err(Error::config(format!(
            "DCP MLA decode: {} latent caches for {n} ranks",
            caches.len()
        )));
    }
    let t = metadata.num_reqs;
    let &[qt, heads, _] = q.shape() else {
        return Err(Error::shape(
            "q",
            q.shape(),
            "[num_reqs, num_heads, kv_lora_rank + rope_dim]",
        ));
    };
    if qt != t {
        return Err(Error::shape("q", q.shape(), format!("[{t} requests, …]")));
    }
    if t == 0 {
        return Ok(());
    }
    let active = &metadata.ranks;
    for (r, (_, md)) in active.iter().enumerate() {
        if let Some((kv_c, k_pe)) = new_latents {
            imp.do_kv_cache_update(layer, kv_c, k_pe, &mut caches[r], md.as_ref())?;
        }
    }
    if active.len() == 1 {
        return imp.forward_mqa(
            layer,
            q,
            &caches[0],
            active[0].1.as_ref(),
            output,
            output_lse.as_deref_mut(),
        );
    }
    let device = q.device().clone();
    let mut partials = Vec::with_capacity(active.len());
    for (r, (holding, md)) in active.iter().enumerate() {
        let mut out = Tensor::zeros(&device, output.shape(), output.dtype())?;
        let mut lse = Tensor::zeros(&device, &[heads, t], DType::F32)?;
        imp.forward_mqa(layer, q, &caches[r], md.as_ref(), &mut out, Some(&mut lse))?;
        partials.push(Partial {
            output: out,
            lse,
            holding: *holding,
        });
    }
    combine(&partials, output, output_lse)
}
