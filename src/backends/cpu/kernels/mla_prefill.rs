//! MLA prefill in expanded form (vLLM's `forward_mha`): the latents become per-head keys and
//! values, then causal MHA with qk width `P + R` and value width `V`.
//!
//! Request `i` with `q_len` new tokens and `ctx = seq_len - q_len` cached ones: positions
//! `[0, ctx)` come from the latent cache through the block table (fp8 times `k_scale`),
//! positions `[ctx, seq_len)` from the new tokens' own latents `[kv_c | k_pe]` (as vLLM's
//! prefill uses `kv_c_normed` and `k_pe` directly). Head `h`'s key at position `s` is
//! `[W_UK_T[h] · kv_c[s] | k_pe[s]]` and its value `kv_c[s] · W_UV[h]`; new token `j` (position
//! `ctx + j`) attends causally to positions `0..=ctx + j`, softmax in f32 (two passes). Output
//! `[T][N][V]`, LSE `[N][T]` (natural log). Bounds relied on: validated metadata, `q`
//! `T × N × (P + R)` and `new_latents` `T × (Lkv + R)` elements.

use rayon::prelude::*;

use std::ops::Range;

use crate::error::{Error, Result};
use crate::metadata::CommonAttentionMetadata;
use crate::mla::{AbsorbedWeights, MlaKvCache};

use super::mla_latents::{dot, LatentReader};

/// Output `[T][N][V]` and LSE `[N][T]` of the prefill of the tokens of requests `reqs` of
/// `md` (`T` of them; `q` and `new_latents` from the first; see the module docs).
pub fn mla_prefill(
    q: &[f32],
    new_latents: &[f32],
    weights: &AbsorbedWeights,
    k_scale: f32,
    cache: &MlaKvCache,
    md: &CommonAttentionMetadata,
    reqs: Range<usize>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let p = &weights.params;
    let (n, l, pd, r, v) = (
        p.num_heads,
        p.kv_lora_rank,
        p.qk_nope_head_dim,
        p.qk_rope_head_dim,
        p.v_head_dim,
    );
    let (dim, qk) = (l + r, pd + r);
    let qsl = md.query_start_loc_cpu();
    let first = qsl[reqs.start] as usize;
    let tokens = qsl[reqs.end] as usize - first;
    if q.len() != tokens * n * qk || new_latents.len() != tokens * dim || cache.latent_dim() != dim
    {
        return Err(Error::config(format!(
            "mla_prefill: {tokens} tokens need q of {} and latents of {} elements and a \
             {dim}-wide cache; got {}, {} and {}",
            tokens * n * qk,
            tokens * dim,
            q.len(),
            new_latents.len(),
            cache.latent_dim()
        )));
    }
    // A CPU cache is read in place; another device's is copied to the host once.
    let copy;
    let storage = match cache.data().as_cpu() {
        Some(s) => s,
        None => {
            copy = cache.data().to_host()?;
            &copy
        }
    };
    let reader = LatentReader::new(storage, cache, k_scale)?;
    let seq_lens = md.seq_lens_cpu();
    let mut out = vec![0.0f32; tokens * n * v];
    let mut lse = vec![f32::NEG_INFINITY; n * tokens];
    for i in reqs {
        let (a, b) = (qsl[i] as usize - first, qsl[i + 1] as usize - first);
        let s_len = seq_lens[i] as usize;
        let ctx = s_len - (b - a);
        let blocks = md.block_table_row(i);
        let mut latents = vec![0.0f32; s_len * dim];
        for (s, dst) in latents.chunks_exact_mut(dim).enumerate() {
            if s < ctx {
                reader.load(blocks, s, dst);
            } else {
                dst.copy_from_slice(&new_latents[(a + s - ctx) * dim..][..dim]);
            }
        }
        // Per head: (out [q_len][V], lse [q_len]).
        let heads: Vec<(Vec<f32>, Vec<f32>)> = (0..n)
            .into_par_iter()
            .map(|h| {
                let mut keys = vec![0.0f32; s_len * qk];
                let mut values = vec![0.0f32; s_len * v];
                for (s, lat) in latents.chunks_exact(dim).enumerate() {
                    let k = &mut keys[s * qk..][..qk];
                    for (j, kj) in k[..pd].iter_mut().enumerate() {
                        let w = &weights.w_uk_t[(h * pd + j) * l..][..l];
                        *kj = dot(w, &lat[..l]);
                    }
                    k[pd..].copy_from_slice(&lat[l..]);
                    let vs = &mut values[s * v..][..v];
                    for (c, &x) in lat[..l].iter().enumerate() {
                        let w = &weights.w_uv[(h * l + c) * v..][..v];
                        for (d, &wv) in vs.iter_mut().zip(w) {
                            *d += x * wv;
                        }
                    }
                }
                let mut o = vec![0.0f32; (b - a) * v];
                let mut ls = vec![f32::NEG_INFINITY; b - a];
                let mut scores = vec![0.0f32; s_len];
                for j in 0..b - a {
                    let visible = ctx + j + 1;
                    let qh = &q[((a + j) * n + h) * qk..][..qk];
                    let mut m = f32::NEG_INFINITY;
                    for (sc, k) in scores[..visible].iter_mut().zip(keys.chunks_exact(qk)) {
                        *sc = p.scale * dot(qh, k);
                        m = m.max(*sc);
                    }
                    let oj = &mut o[j * v..][..v];
                    let mut sum = 0.0f32;
                    for (sc, vv) in scores[..visible].iter().zip(values.chunks_exact(v)) {
                        let e = (sc - m).exp();
                        sum += e;
                        for (d, &x) in oj.iter_mut().zip(vv) {
                            *d += e * x;
                        }
                    }
                    oj.iter_mut().for_each(|d| *d /= sum);
                    ls[j] = m + sum.ln();
                }
                (o, ls)
            })
            .collect();
        for (h, (o, ls)) in heads.into_iter().enumerate() {
            for j in 0..b - a {
                out[((a + j) * n + h) * v..][..v].copy_from_slice(&o[j * v..][..v]);
                lse[h * tokens + a + j] = ls[j];
            }
        }
    }
    Ok((out, lse))
}
