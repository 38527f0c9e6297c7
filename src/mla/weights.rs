//! Weight absorption (vLLM's `MLAAttention.process_weights_after_loading`): `kv_b_proj`
//! split into `W_UK` and `W_UV`, stored the way the decode path uses them, and the two
//! per-head products of the decode path (the query's absorption and the output's
//! up-projection) as plain f32 loops.

use super::params::MlaParams;
use crate::error::{Error, Result};

/// `kv_b_proj` split per head: `w_uk_t` `[N][P][Lkv]` (absorbed into the query) and `w_uv`
/// `[N][Lkv][V]` (the output's up-projection), row-major f32.
#[derive(Clone, Debug, PartialEq)]
pub struct AbsorbedWeights {
    /// `W_UK_T`: `[num_heads][qk_nope_head_dim][kv_lora_rank]`.
    pub w_uk_t: Vec<f32>,
    /// `W_UV`: `[num_heads][kv_lora_rank][v_head_dim]`.
    pub w_uv: Vec<f32>,
    /// The layer's sizes.
    pub params: MlaParams,
}

/// Splits `kv_b_proj` — the linear layer's weight `[N * (P + V), Lkv]` (out × in, as
/// PyTorch stores it: row `n * (P + V) + j` is head `n`'s output `j`, the first `P` of them
/// the key's no-RoPE part, the last `V` the value) — into [`AbsorbedWeights`].
pub fn absorb_kv_b_proj(kv_b_proj: &[f32], p: &MlaParams) -> Result<AbsorbedWeights> {
    p.validate()?;
    let (n, l, pd, v) = (
        p.num_heads,
        p.kv_lora_rank,
        p.qk_nope_head_dim,
        p.v_head_dim,
    );
    let want = n * (pd + v) * l;
    if kv_b_proj.len() != want {
        return Err(Error::config(format!(
            "kv_b_proj has {} elements; [{} x {l}] (num_heads x (qk_nope_head_dim + \
             v_head_dim), kv_lora_rank) needs {want}",
            kv_b_proj.len(),
            n * (pd + v)
        )));
    }
    let row = |h: usize, j: usize| &kv_b_proj[(h * (pd + v) + j) * l..][..l];
    let mut w_uk_t = Vec::with_capacity(n * pd * l);
    let mut w_uv = vec![0.0f32; n * l * v];
    for h in 0..n {
        for j in 0..pd {
            w_uk_t.extend_from_slice(row(h, j));
        }
        for j in 0..v {
            for (c, &w) in row(h, pd + j).iter().enumerate() {
                w_uv[(h * l + c) * v + j] = w;
            }
        }
    }
    Ok(AbsorbedWeights {
        w_uk_t,
        w_uv,
        params: p.clone(),
    })
}

impl AbsorbedWeights {
    /// `kv_b_proj` again, `[N * (P + V)][Lkv]` (row `n * (P + V) + j`: head `n`'s output `j`),
    /// for kernels that expand latents with one GEMM.
    pub fn kv_b_proj(&self) -> Vec<f32> {
        let p = &self.params;
        let (n, l, pd, v) = (
            p.num_heads,
            p.kv_lora_rank,
            p.qk_nope_head_dim,
            p.v_head_dim,
        );
        let mut w = vec![0.0f32; n * (pd + v) * l];
        for h in 0..n {
            for j in 0..pd {
                w[(h * (pd + v) + j) * l..][..l]
                    .copy_from_slice(&self.w_uk_t[(h * pd + j) * l..][..l]);
            }
            for c in 0..l {
                for j in 0..v {
                    w[(h * (pd + v) + pd + j) * l + c] = self.w_uv[(h * l + c) * v + j];
                }
            }
        }
        w
    }

    /// The decode query in latent space: `q` `[B][N][P + R]` (no-RoPE part first) becomes
    /// `[B][N][Lkv + R]` = `[q_nope · W_UK_T | q_pe]`.
    pub fn absorb_query(&self, q: &[f32]) -> Result<Vec<f32>> {
        let p = &self.params;
        let (n, l, pd, r) = (
            p.num_heads,
            p.kv_lora_rank,
            p.qk_nope_head_dim,
            p.qk_rope_head_dim,
        );
        let qk = pd + r;
        if !q.len().is_multiple_of(n * qk) {
            return Err(Error::config(format!(
                "MLA query of {} elements is not [tokens, {n}, {qk}]",
                q.len()
            )));
        }
        let tokens = q.len() / (n * qk);
        let mut out = vec![0.0f32; tokens * n * (l + r)];
        for t in 0..tokens {
            for h in 0..n {
                let src = &q[(t * n + h) * qk..][..qk];
                let dst = &mut out[(t * n + h) * (l + r)..][..l + r];
                for (j, &x) in src[..pd].iter().enumerate() {
                    let w = &self.w_uk_t[(h * pd + j) * l..][..l];
                    for (d, &wv) in dst[..l].iter_mut().zip(w) {
                        *d += x * wv;
                    }
                }
                dst[l..].copy_from_slice(&src[pd..]);
            }
        }
        Ok(out)
    }

    /// The decode output's up-projection: `o` `[B][N][Lkv]` becomes `[B][N][V]` = `o · W_UV`.
    pub fn up_project(&self, o: &[f32]) -> Result<Vec<f32>> {
        let p = &self.params;
        let (n, l, v) = (p.num_heads, p.kv_lora_rank, p.v_head_dim);
        if !o.len().is_multiple_of(n * l) {
            return Err(Error::config(format!(
                "MLA latent output of {} elements is not [tokens, {n}, {l}]",
                o.len()
            )));
        }
        let tokens = o.len() / (n * l);
        let mut out = vec![0.0f32; tokens * n * v];
        for t in 0..tokens {
            for h in 0..n {
                let src = &o[(t * n + h) * l..][..l];
                let dst = &mut out[(t * n + h) * v..][..v];
                for (c, &x) in src.iter().enumerate() {
                    let w = &self.w_uv[(h * l + c) * v..][..v];
                    for (d, &wv) in dst.iter_mut().zip(w) {
                        *d += x * wv;
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> MlaParams {
        MlaParams {
            num_heads: 2,
            kv_lora_rank: 3,
            qk_nope_head_dim: 2,
            qk_rope_head_dim: 1,
            v_head_dim: 2,
            scale: 0.5,
            kv_cache_dtype: crate::dtype::CacheDType::Auto,
        }
    }

    #[test]
    fn split_follows_the_row_layout() {
        let p = small();
        // Rows: head 0 = k0 k1 v0 v1, head 1 = k0 k1 v0 v1; element (row, col) = 10 row + col.
        let w: Vec<f32> = (0..8)
            .flat_map(|r| (0..3).map(move |c| (10 * r + c) as f32))
            .collect();
        let a = absorb_kv_b_proj(&w, &p).unwrap();
        // W_UK_T[h][j][c] = row h*4 + j.
        assert_eq!(&a.w_uk_t[..6], &[0., 1., 2., 10., 11., 12.]);
        assert_eq!(&a.w_uk_t[6..], &[40., 41., 42., 50., 51., 52.]);
        // W_UV[h][c][j] = row h*4 + 2 + j, column c.
        assert_eq!(&a.w_uv[..6], &[20., 30., 21., 31., 22., 32.]);
        assert_eq!(&a.w_uv[6..], &[60., 70., 61., 71., 62., 72.]);
        assert!(absorb_kv_b_proj(&w[1..], &p).is_err());
    }

    #[test]
    fn query_absorption_and_up_projection() {
        let p = small();
        let w: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 2.0).collect();
        let a = absorb_kv_b_proj(&w, &p).unwrap();
        let q = [1.0, -2.0, 0.5, 3.0, 0.25, -1.0];
        let ql = a.absorb_query(&q).unwrap();
        assert_eq!(ql.len(), 2 * 4);
        for h in 0..2 {
            for c in 0..3 {
                let want: f32 = (0..2).map(|j| q[h * 3 + j] * w[(h * 4 + j) * 3 + c]).sum();
                assert!((ql[h * 4 + c] - want).abs() < 1e-6);
            }
            assert_eq!(ql[h * 4 + 3], q[h * 3 + 2]);
        }
        let o = [1.0, 2.0, 3.0, -1.0, 0.5, 0.0];
        let up = a.up_project(&o).unwrap();
        for h in 0..2 {
            for j in 0..2 {
                let want: f32 = (0..3)
                    .map(|c| o[h * 3 + c] * w[(h * 4 + 2 + j) * 3 + c])
                    .sum();
                assert!((up[h * 2 + j] - want).abs() < 1e-6);
            }
        }
        assert!(a.absorb_query(&q[1..]).is_err());
    }
}
