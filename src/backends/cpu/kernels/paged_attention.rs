//! Paged attention for one tile of query rows against one KV head, with online softmax.
//!
//! Algorithm (FlashAttention's, on the CPU): the rows of a tile are `tokens × g` query heads
//! that share one KV head (GQA). Keys and values are streamed one chunk at a time (a cache
//! block, or up to [`DENSE_CHUNK`] rows of a dense K/V tensor), dequantised once into f32
//! scratch, and reused by every row of the tile. For each row and chunk:
//! `s_j = (q·scale)·k_j`, then the soft cap `c·tanh(s/c)`, then the ALiBi bias
//! `−slope·|q_pos − j|` (FlashAttention's form, `slope·(j − q_pos)` under a causal mask),
//! then the mask; the running max `m`, denominator `l` and accumulator
//! `acc` are rescaled by `exp(m_old − m_new)`. A sink starts the row at `m = sink, l = 1`, so it
//! joins the denominator and adds no value. At the end `out = acc / l` and
//! `lse = m + ln l` (natural log; `−inf` for a row that saw no key and no sink, whose output
//! is 0).
//!
//! Visibility of key `j` for a query at absolute position `p` inside `[kv_lo, kv_hi)`:
//! causal `j ≤ p`; decoder window W `p − j < W`; bidirectional window `|p − j| < W`.
//!
//! Layout: query rows `[rows][head_size]` f32, row `i·g + h` for token `i` of the tile and
//! head `h` of the group; outputs the same. Bounds relied on: `head_size % 8 == 0` (the
//! descriptor only admits such sizes), and every key position handed to a [`KeySource`] lies
//! in the validated sequence (block ids checked by the metadata validation).

use crate::kv_cache::KvCache;

use super::convert::RowsView;

/// Dense K/V rows loaded per chunk (encoder attention without a cache).
pub const DENSE_CHUNK: usize = 64;

/// Keys and values of one sequence.
pub trait KeySource: Sync {
    /// Tokens per chunk; loads never cross a chunk boundary.
    fn chunk(&self) -> usize;
    /// Loads `n` keys and values of KV head `head` starting at sequence position `start`
    /// into `k` and `v` (`[n][head_size]`), dequantised to f32.
    fn load(&self, head: usize, start: usize, n: usize, k: &mut [f32], v: &mut [f32]);
}

/// A sequence stored in the paged cache, found through its block-table row.
pub struct PagedSource<'a> {
    /// The cache (for offsets).
    pub cache: &'a KvCache,
    /// Its storage as f32-loadable rows.
    pub view: RowsView<'a>,
    /// The sequence's block ids, in order.
    pub blocks: &'a [i32],
    /// fp8 key scale (1.0 otherwise).
    pub k_scale: f32,
    /// fp8 value scale.
    pub v_scale: f32,
}

impl KeySource for PagedSource<'_> {
    fn chunk(&self) -> usize {
        self.cache.block_size()
    }

    fn load(&self, head: usize, start: usize, n: usize, k: &mut [f32], v: &mut [f32]) {
        let bs = self.cache.block_size();
        let d = self.cache.spec().head_size;
        let block = self.blocks[start / bs] as usize;
        let off = start % bs;
        let stride = self.cache.token_stride();
        let (k0, v0) = (
            self.cache.offset(block, 0, off, head),
            self.cache.offset(block, 1, off, head),
        );
        for t in 0..n {
            self.view
                .load(k0 + t * stride, &mut k[t * d..(t + 1) * d], self.k_scale);
            self.view
                .load(v0 + t * stride, &mut v[t * d..(t + 1) * d], self.v_scale);
        }
    }
}

/// A sequence given as dense `[tokens, num_kv_heads, head_size]` key and value tensors.
pub struct DenseSource<'a> {
    /// Keys.
    pub key: RowsView<'a>,
    /// Values.
    pub value: RowsView<'a>,
    /// First row of this sequence in the tensors.
    pub row0: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Head size.
    pub head_size: usize,
}

impl KeySource for DenseSource<'_> {
    fn chunk(&self) -> usize {
        DENSE_CHUNK
    }

    fn load(&self, head: usize, start: usize, n: usize, k: &mut [f32], v: &mut [f32]) {
        let d = self.head_size;
        for t in 0..n {
            let o = ((self.row0 + start + t) * self.num_kv_heads + head) * d;
            self.key.load(o, &mut k[t * d..(t + 1) * d], 1.0);
            self.value.load(o, &mut v[t * d..(t + 1) * d], 1.0);
        }
    }
}

/// Per-layer score modifiers and masking rules.
#[derive(Clone, Copy, Debug)]
pub struct Mask<'a> {
    /// Keys after the query are hidden.
    pub causal: bool,
    /// Sliding window W (see the module docs for its two forms).
    pub window: Option<usize>,
    /// Logit soft cap.
    pub soft_cap: Option<f32>,
    /// ALiBi slope per query head of the layer.
    pub alibi: Option<&'a [f32]>,
    /// Sink logit per query head of the layer.
    pub sinks: Option<&'a [f32]>,
}

impl Mask<'_> {
    /// The visible key range of a query at position `p` within `[lo, hi)`.
    #[inline]
    fn visible(&self, p: usize, lo: usize, hi: usize) -> (usize, usize) {
        let mut lo = lo;
        let mut hi = hi;
        if self.causal {
            hi = hi.min(p + 1);
        }
        if let Some(w) = self.window {
            lo = lo.max((p + 1).saturating_sub(w));
            if !self.causal {
                hi = hi.min(p + w);
            }
        }
        (lo, hi.max(lo))
    }
}

/// One tile's job: which rows, which keys, where the results go.
pub struct TileJob<'a> {
    /// The KV head the rows share.
    pub kv_head: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// Head size.
    pub head_size: usize,
    /// Scaled query rows `[tokens·group][head_size]`.
    pub q: &'a [f32],
    /// Absolute sequence position of each token of the tile.
    pub positions: &'a [usize],
    /// Keys considered: `[kv_lo, kv_hi)` of the sequence.
    pub kv_lo: usize,
    /// One past the last key considered.
    pub kv_hi: usize,
}

/// Runs one tile, writing `out` (`[rows][head_size]`) and `lse` (`[rows]`).
pub fn attend_tile<S: KeySource>(
    src: &S,
    job: &TileJob<'_>,
    mask: &Mask<'_>,
    out: &mut [f32],
    lse: &mut [f32],
) {
    let d = job.head_size;
    let g = job.group;
    let rows = job.positions.len() * g;
    let head0 = job.kv_head * g;
    let chunk = src.chunk();

    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0.0f32; rows];
    out[..rows * d].fill(0.0);
    if let Some(sinks) = mask.sinks {
        for r in 0..rows {
            m[r] = sinks[head0 + r % g];
            l[r] = 1.0;
        }
    }

    // The union of the rows' visible ranges bounds the chunks worth loading.
    let (mut span_lo, mut span_hi) = (usize::MAX, 0usize);
    for &p in job.positions {
        let (a, b) = mask.visible(p, job.kv_lo, job.kv_hi);
        if a < b {
            span_lo = span_lo.min(a);
            span_hi = span_hi.max(b);
        }
    }
    let mut kbuf = vec![0.0f32; chunk * d];
    let mut vbuf = vec![0.0f32; chunk * d];
    let mut scores = vec![0.0f32; chunk];

    let mut c0 = if span_lo < span_hi {
        span_lo - span_lo % chunk
    } else {
        span_hi
    };
    while c0 < span_hi {
        let start = c0.max(span_lo);
        let end = (c0 + chunk).min(span_hi);
        let n = end - start;
        src.load(job.kv_head, start, n, &mut kbuf, &mut vbuf);
        for (ti, &p) in job.positions.iter().enumerate() {
            let (a, b) = mask.visible(p, job.kv_lo, job.kv_hi);
            let (a, b) = (a.max(start), b.min(end));
            if a >= b {
                continue;
            }
            for h in 0..g {
                let r = ti * g + h;
                let qrow = &job.q[r * d..(r + 1) * d];
                let mut mx = m[r];
                for j in a..b {
                    let kr = &kbuf[(j - start) * d..(j - start + 1) * d];
                    let mut s = dot(qrow, kr);
                    if let Some(c) = mask.soft_cap {
                        s = c * (s / c).tanh();
                    }
                    if let Some(al) = mask.alibi {
                        s -= al[head0 + h] * (p as f32 - j as f32).abs();
                    }
                    scores[j - a] = s;
                    mx = mx.max(s);
                }
                let alpha = if m[r] == f32::NEG_INFINITY {
                    0.0
                } else {
                    (m[r] - mx).exp()
                };
                let orow = &mut out[r * d..(r + 1) * d];
                if alpha != 1.0 {
                    orow.iter_mut().for_each(|x| *x *= alpha);
                }
                let mut sum = 0.0f32;
                for j in a..b {
                    let pj = (scores[j - a] - mx).exp();
                    sum += pj;
                    axpy(orow, pj, &vbuf[(j - start) * d..(j - start + 1) * d]);
                }
                l[r] = l[r] * alpha + sum;
                m[r] = mx;
            }
        }
        c0 += chunk;
    }

    for r in 0..rows {
        if l[r] > 0.0 {
            let inv = 1.0 / l[r];
            out[r * d..(r + 1) * d].iter_mut().for_each(|x| *x *= inv);
            lse[r] = m[r] + l[r].ln();
        } else {
            lse[r] = f32::NEG_INFINITY;
        }
    }
}

/// Dot product with eight independent accumulators (vectorises to one or two SIMD
/// registers; `a.len() % 8 == 0`).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = 0.0;
    for (x, y) in a
        .chunks_exact(8)
        .remainder()
        .iter()
        .zip(b.chunks_exact(8).remainder())
    {
        s += x * y;
    }
    (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]) + s
}

/// `y += a·x`.
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Vecs {
        k: Vec<f32>,
        v: Vec<f32>,
        d: usize,
        chunk: usize,
    }
    impl KeySource for Vecs {
        fn chunk(&self) -> usize {
            self.chunk
        }
        fn load(&self, _h: usize, start: usize, n: usize, k: &mut [f32], v: &mut [f32]) {
            let d = self.d;
            k[..n * d].copy_from_slice(&self.k[start * d..(start + n) * d]);
            v[..n * d].copy_from_slice(&self.v[start * d..(start + n) * d]);
        }
    }

    #[test]
    fn one_row_matches_a_direct_softmax() {
        let d = 8;
        let n = 11;
        let k: Vec<f32> = (0..n * d)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let v: Vec<f32> = (0..n * d)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let q: Vec<f32> = (0..d).map(|i| (i as f32 - 3.5) / 4.0).collect();
        let src = Vecs {
            k: k.clone(),
            v: v.clone(),
            d,
            chunk: 4,
        };
        let mut out = vec![0.0; d];
        let mut lse = vec![0.0; 1];
        let job = TileJob {
            kv_head: 0,
            group: 1,
            head_size: d,
            q: &q,
            positions: &[n - 1],
            kv_lo: 0,
            kv_hi: n,
        };
        let mask = Mask {
            causal: true,
            window: None,
            soft_cap: None,
            alibi: None,
            sinks: None,
        };
        attend_tile(&src, &job, &mask, &mut out, &mut lse);
        let s: Vec<f64> = (0..n)
            .map(|j| (0..d).map(|i| q[i] as f64 * k[j * d + i] as f64).sum())
            .collect();
        let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
        for i in 0..d {
            let want: f64 = (0..n)
                .map(|j| (s[j] - mx).exp() / z * v[j * d + i] as f64)
                .sum();
            assert!(
                (out[i] as f64 - want).abs() < 1e-5,
                "{i}: {} vs {want}",
                out[i]
            );
        }
        assert!((lse[0] as f64 - (mx + z.ln())).abs() < 1e-5);
    }

    #[test]
    fn windows_clip_both_ways() {
        let m = Mask {
            causal: true,
            window: Some(3),
            soft_cap: None,
            alibi: None,
            sinks: None,
        };
        assert_eq!(m.visible(5, 0, 10), (3, 6));
        let m = Mask { causal: false, ..m };
        assert_eq!(m.visible(5, 0, 10), (3, 8));
        assert_eq!(m.visible(0, 0, 10), (0, 3));
    }
}
