//! MLA decode in latent space (vLLM's `forward_mqa`): every query head attends over the
//! request's cached latents as one shared key / value head (MQA).
//!
//! Query token `t` of request `i` (at sequence position `seq_len - query_len + j` for its
//! `j`-th query token, causal) and head `h`: `q[t][h]` is the absorbed `[q_nope·W_UK_T |
//! q_pe]` query of `latent_dim` elements; scores `scale · q·latent[s]` over the visible
//! positions `s` (two passes: max, then exponentials, in f32); the output is the softmax
//! average of the latents' first `kv_lora_rank` elements, `[T][N][kv_lora_rank]`, and the
//! LSE `[N][T]` (natural log). Latents are read through the block table; fp8 caches are
//! multiplied by `k_scale`. Bounds relied on: the metadata was validated against the cache
//! (block ids, seq_lens ≤ blocks × block_size), `q` holds `T × N × latent_dim` elements.

use rayon::prelude::*;

use std::ops::Range;

use crate::error::{Error, Result};
use crate::metadata::CommonAttentionMetadata;
use crate::mla::MlaKvCache;

use super::mla_latents::{dot, LatentReader};

/// Output `[T][N][kv_lora_rank]` and LSE `[N][T]` of the query tokens of requests `reqs` of
/// `md` (`T` of them, `q` `[T][N][latent_dim]` from the first; see the module docs).
#[allow(clippy::too_many_arguments)]
pub fn mla_decode(
    q: &[f32],
    num_heads: usize,
    kv_lora_rank: usize,
    scale: f32,
    k_scale: f32,
    cache: &MlaKvCache,
    md: &CommonAttentionMetadata,
    reqs: Range<usize>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let dim = cache.latent_dim();
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
    let qsl = md.query_start_loc_cpu();
    let seq_lens = md.seq_lens_cpu();
    let first = qsl[reqs.start] as usize;
    let tokens = qsl[reqs.end] as usize - first;
    if q.len() != tokens * num_heads * dim || kv_lora_rank > dim {
        return Err(Error::config(format!(
            "mla_decode: {tokens} tokens x {num_heads} heads need a query of {} elements \
             and kv_lora_rank <= {dim}; got {} and {kv_lora_rank}",
            tokens * num_heads * dim,
            q.len()
        )));
    }
    // Per token: (its request's block-table row, the number of positions it sees).
    let mut owner = Vec::with_capacity(tokens);
    for i in reqs {
        let (a, b) = (qsl[i] as usize, qsl[i + 1] as usize);
        let ctx = seq_lens[i] as usize - (b - a);
        for j in 0..b - a {
            owner.push((i, ctx + j + 1));
        }
    }
    let per_token: Vec<(Vec<f32>, Vec<f32>)> = owner
        .par_iter()
        .enumerate()
        .map(|(t, &(req, visible))| {
            let blocks = md.block_table_row(req);
            let mut latents = vec![0.0f32; visible * dim];
            for (s, dst) in latents.chunks_exact_mut(dim).enumerate() {
                reader.load(blocks, s, dst);
            }
            let mut out = vec![0.0f32; num_heads * kv_lora_rank];
            let mut lse = vec![f32::NEG_INFINITY; num_heads];
            let mut scores = vec![0.0f32; visible];
            for h in 0..num_heads {
                let qh = &q[(t * num_heads + h) * dim..][..dim];
                let mut m = f32::NEG_INFINITY;
                for (sc, lat) in scores.iter_mut().zip(latents.chunks_exact(dim)) {
                    *sc = scale * dot(qh, lat);
                    m = m.max(*sc);
                }
                if visible == 0 {
                    continue;
                }
                let mut sum = 0.0f32;
                let o = &mut out[h * kv_lora_rank..][..kv_lora_rank];
                for (sc, lat) in scores.iter().zip(latents.chunks_exact(dim)) {
                    let e = (sc - m).exp();
                    sum += e;
                    for (d, &x) in o.iter_mut().zip(&lat[..kv_lora_rank]) {
                        *d += e * x;
                    }
                }
                o.iter_mut().for_each(|d| *d /= sum);
                lse[h] = m + sum.ln();
            }
            (out, lse)
        })
        .collect();
    let mut out = Vec::with_capacity(tokens * num_heads * kv_lora_rank);
    let mut lse = vec![0.0f32; num_heads * tokens];
    for (t, (o, l)) in per_token.into_iter().enumerate() {
        out.extend_from_slice(&o);
        for (h, &x) in l.iter().enumerate() {
            lse[h * tokens + t] = x;
        }
    }
    Ok((out, lse))
}
