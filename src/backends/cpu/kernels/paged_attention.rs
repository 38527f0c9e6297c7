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
    /// The `n` keys and values (`[n][head_size]` f32 each) of KV head `head` from sequence
    /// position `start`: dequantised into `k` / `v`, or borrowed straight from storage when
    /// it already holds contiguous f32 rows.
    fn load<'s>(
        &'s self,
        head: usize,
        start: usize,
        n: usize,
        k: &'s mut [f32],
        v: &'s mut [f32],
    ) -> (&'s [f32], &'s [f32]);
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

    fn load<'s>(
        &'s self,
        head: usize,
        start: usize,
        n: usize,
        k: &'s mut [f32],
        v: &'s mut [f32],
    ) -> (&'s [f32], &'s [f32]) {
        let bs = self.cache.block_size();
        let d = self.cache.spec().head_size;
        let block = self.blocks[start / bs] as usize;
        let off = start % bs;
        let stride = self.cache.token_stride();
        let (k0, v0) = (
            self.cache.offset(block, 0, off, head),
            self.cache.offset(block, 1, off, head),
        );
        if let (RowsView::F32(data), true) = (self.view, stride == d) {
            // An f32 HND cache already holds this head's rows contiguously: no copy.
            return (&data[k0..k0 + n * d], &data[v0..v0 + n * d]);
        }
        for t in 0..n {
            self.view
                .load(k0 + t * stride, &mut k[t * d..(t + 1) * d], self.k_scale);
            self.view
                .load(v0 + t * stride, &mut v[t * d..(t + 1) * d], self.v_scale);
        }
        (&k[..n * d], &v[..n * d])
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

    fn load<'s>(
        &'s self,
        head: usize,
        start: usize,
        n: usize,
        k: &'s mut [f32],
        v: &'s mut [f32],
    ) -> (&'s [f32], &'s [f32]) {
        let d = self.head_size;
        for t in 0..n {
            let o = ((self.row0 + start + t) * self.num_kv_heads + head) * d;
            self.key.load(o, &mut k[t * d..(t + 1) * d], 1.0);
            self.value.load(o, &mut v[t * d..(t + 1) * d], 1.0);
        }
        (&k[..n * d], &v[..n * d])
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
///
/// Dispatches at run time to a copy of the kernel compiled for AVX2 + FMA when the CPU has
/// them (the crate itself is built for the x86-64 baseline, so binaries run anywhere).
pub fn attend_tile<S: KeySource>(
    src: &S,
    job: &TileJob<'_>,
    mask: &Mask<'_>,
    out: &mut [f32],
    lse: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { attend_tile_avx2(src, job, mask, out, lse) };
        }
        attend_tile_impl::<S, false>(src, job, mask, out, lse)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // aarch64 has FMA in its baseline; elsewhere `mul_add` is still correct.
        attend_tile_impl::<S, { cfg!(target_arch = "aarch64") }>(src, job, mask, out, lse)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_tile_avx2<S: KeySource>(
    src: &S,
    job: &TileJob<'_>,
    mask: &Mask<'_>,
    out: &mut [f32],
    lse: &mut [f32],
) {
    attend_tile_impl::<S, true>(src, job, mask, out, lse)
}

#[inline(always)]
fn attend_tile_impl<S: KeySource, const FMA: bool>(
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
        let (kb, vb) = src.load(job.kv_head, start, n, &mut kbuf, &mut vbuf);
        for (ti, &p) in job.positions.iter().enumerate() {
            let (a, b) = mask.visible(p, job.kv_lo, job.kv_hi);
            let (a, b) = (a.max(start), b.min(end));
            if a >= b {
                continue;
            }
            let keys = &kb[(a - start) * d..(b - start) * d];
            let vals = &vb[(a - start) * d..(b - start) * d];
            let sc = &mut scores[..b - a];
            for h in 0..g {
                let r = ti * g + h;
                let qrow = &job.q[r * d..(r + 1) * d];
                row_scores::<FMA>(qrow, keys, d, sc);
                let mut mx = m[r];
                for (jj, s) in sc.iter_mut().enumerate() {
                    if let Some(c) = mask.soft_cap {
                        *s = c * (*s / c).tanh();
                    }
                    if let Some(al) = mask.alibi {
                        let j = a + jj;
                        *s -= al[head0 + h] * (p as f32 - j as f32).abs();
                    }
                    mx = mx.max(*s);
                }
                let alpha = if m[r] == f32::NEG_INFINITY {
                    0.0
                } else {
                    (m[r] - mx).exp()
                };
                let mut sum = 0.0f32;
                for s in sc.iter_mut() {
                    *s = exp_fast::<FMA>(*s - mx);
                    sum += *s;
                }
                let orow = &mut out[r * d..(r + 1) * d];
                accumulate_pv::<FMA>(orow, alpha, sc, vals, d);
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

/// `a·b + c`, fused when the caller is compiled with FMA (a plain multiply-add otherwise:
/// `mul_add` without hardware FMA would be a slow library call).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `out[j] = q · keys[j]` for every key row (`keys` is `[n][d]`, `d % 8 == 0`).
///
/// Eight keys at a time with eight independent 8-lane accumulators: one SIMD register each
/// with AVX2, so eight FMA chains are in flight and the loop is throughput-, not
/// latency-bound.
#[inline(always)]
fn row_scores<const FMA: bool>(q: &[f32], keys: &[f32], d: usize, out: &mut [f32]) {
    let n = out.len();
    let mut j = 0;
    while j + 8 <= n {
        let mut acc = [[0.0f32; 8]; 8];
        for c in (0..d).step_by(8) {
            let qc = &q[c..c + 8];
            for (kk, a) in acc.iter_mut().enumerate() {
                let kc = &keys[(j + kk) * d + c..(j + kk) * d + c + 8];
                for i in 0..8 {
                    a[i] = madd::<FMA>(qc[i], kc[i], a[i]);
                }
            }
        }
        for (kk, a) in acc.iter().enumerate() {
            out[j + kk] = hsum(a);
        }
        j += 8;
    }
    while j < n {
        out[j] = dot(q, &keys[j * d..(j + 1) * d]);
        j += 1;
    }
}

/// `orow ← alpha·orow + Σ_j p[j]·vals[j]` (`vals` is `[n][d]`, `d % 8 == 0`).
///
/// Walks the head dimension in 64-wide slices kept in eight registers across all keys, so
/// each value element is loaded once and `orow` is read and written once per chunk.
#[inline(always)]
fn accumulate_pv<const FMA: bool>(orow: &mut [f32], alpha: f32, p: &[f32], vals: &[f32], d: usize) {
    let mut c = 0;
    while c < d {
        let w = (d - c).min(64) / 8;
        let mut acc = [[0.0f32; 8]; 8];
        for (k, a) in acc.iter_mut().enumerate().take(w) {
            for i in 0..8 {
                a[i] = orow[c + 8 * k + i] * alpha;
            }
        }
        for (j, &pj) in p.iter().enumerate() {
            let v = &vals[j * d + c..j * d + c + 8 * w];
            for (k, a) in acc.iter_mut().enumerate().take(w) {
                for i in 0..8 {
                    a[i] = madd::<FMA>(pj, v[8 * k + i], a[i]);
                }
            }
        }
        for (k, a) in acc.iter().enumerate().take(w) {
            orow[c + 8 * k..c + 8 * k + 8].copy_from_slice(a);
        }
        c += 8 * w;
    }
}

/// `e^x` for `x ≤ 0` to about 2e-7 relative error, in straight-line arithmetic the compiler
/// vectorises (the library `exp` is a call per element, which costs as much as the dot
/// products of a 16-key chunk).
///
/// `e^x = 2^i · e^f` with `i = round(x·log2 e)` and `f = x − i·ln 2` (Cody–Waite: `ln 2` split
/// in a short high part, exact in the product, and a low correction), `|f| ≤ ½ ln 2`, and `e^f`
/// by its degree-6 Taylor polynomial (truncation error `(½ ln 2)^7 / 7! ≈ 1.2e-7`). Inputs
/// below −87 give `2^-126`-scale values instead of 0: weights that small vanish against the
/// row maximum's 1.
#[inline(always)]
pub fn exp_fast<const FMA: bool>(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4; // 0.693359375: 9 significant bits
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 0.0);
    let i = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let f = madd::<FMA>(i, -LN2_HI, x);
    let f = madd::<FMA>(i, -LN2_LO, f);
    let mut p = 1.0 / 720.0;
    p = madd::<FMA>(p, f, 1.0 / 120.0);
    p = madd::<FMA>(p, f, 1.0 / 24.0);
    p = madd::<FMA>(p, f, 1.0 / 6.0);
    p = madd::<FMA>(p, f, 0.5);
    p = madd::<FMA>(p, f, 1.0);
    p = madd::<FMA>(p, f, 1.0);
    p * f32::from_bits(((i as i32 + 127) as u32) << 23)
}

#[inline(always)]
fn hsum(a: &[f32; 8]) -> f32 {
    (a[0] + a[4]) + (a[1] + a[5]) + (a[2] + a[6]) + (a[3] + a[7])
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
    hsum(&acc) + s
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
        fn load<'s>(
            &'s self,
            _h: usize,
            start: usize,
            n: usize,
            _k: &'s mut [f32],
            _v: &'s mut [f32],
        ) -> (&'s [f32], &'s [f32]) {
            let d = self.d;
            (
                &self.k[start * d..(start + n) * d],
                &self.v[start * d..(start + n) * d],
            )
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
    fn exp_fast_is_accurate() {
        let mut x = 0.0f32;
        while x > -90.0 {
            let b = (x as f64).exp();
            for a in [exp_fast::<false>(x) as f64, exp_fast::<true>(x) as f64] {
                assert!(((a - b) / b).abs() < 3e-7 || b < 1e-37, "{x}: {a} vs {b}");
            }
            x -= 0.0137;
        }
        assert_eq!(exp_fast::<false>(0.0), 1.0);
        assert!(exp_fast::<false>(f32::NEG_INFINITY) < 1e-37);
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
