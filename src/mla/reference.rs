//! The f64 reference of MLA attention in its expanded form — every head's keys and values
//! up-projected from the latents, then ordinary causal attention — which the latent-space
//! decode (absorbed query, MQA over the 576-wide latents, `W_UV` up-projection) must equal.

use super::params::MlaParams;

/// Attention of one request's `q_len` query tokens (the last `q_len` of its `seq_len`
/// positions, causal) over its `seq_len` latents, in f64 and the expanded form:
/// `q` `[q_len][N][P + R]`, `latents` `[seq_len][Lkv + R]` (`[kv_c | k_pe]`), `kv_b_proj`
/// `[N * (P + V)][Lkv]` (see [`super::absorb_kv_b_proj`]). Returns `(out [q_len][N][V],
/// lse [N][q_len])`, the LSE natural-log (`-inf` for a row that sees no key).
pub fn mla_attention(
    p: &MlaParams,
    q: &[f64],
    latents: &[f64],
    kv_b_proj: &[f64],
    q_len: usize,
    seq_len: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (n, l, pd, r, v) = (
        p.num_heads,
        p.kv_lora_rank,
        p.qk_nope_head_dim,
        p.qk_rope_head_dim,
        p.v_head_dim,
    );
    let dim = l + r;
    // Per head: keys [seq][P + R] and values [seq][V].
    let mut out = vec![0.0f64; q_len * n * v];
    let mut lse = vec![f64::NEG_INFINITY; n * q_len];
    let w = |h: usize, j: usize| &kv_b_proj[(h * (pd + v) + j) * l..][..l];
    for h in 0..n {
        let mut keys = vec![0.0f64; seq_len * (pd + r)];
        let mut values = vec![0.0f64; seq_len * v];
        for s in 0..seq_len {
            let lat = &latents[s * dim..][..dim];
            for j in 0..pd {
                keys[s * (pd + r) + j] = dot(w(h, j), &lat[..l]);
            }
            keys[s * (pd + r) + pd..][..r].copy_from_slice(&lat[l..]);
            for j in 0..v {
                values[s * v + j] = dot(w(h, pd + j), &lat[..l]);
            }
        }
        for i in 0..q_len {
            let pos = seq_len - q_len + i;
            let qi = &q[(i * n + h) * (pd + r)..][..pd + r];
            let scores: Vec<f64> = (0..=pos)
                .map(|s| p.scale as f64 * dot(qi, &keys[s * (pd + r)..][..pd + r]))
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            let o = &mut out[(i * n + h) * v..][..v];
            for (s, &es) in e.iter().enumerate() {
                for (d, &vv) in o.iter_mut().zip(&values[s * v..][..v]) {
                    *d += es / sum * vv;
                }
            }
            lse[h * q_len + i] = m + sum.ln();
        }
    }
    (out, lse)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
