//! CPU kernels of the model operations: rayon over rows (or output features for `linear`),
//! f32 throughout. `linear` runs an AVX2+FMA build of its inner loop when the CPU has it
//! (checked at run time, as the CPU attention kernel does).

use rayon::prelude::*;

use super::fused_linear::FusedLinear;
use super::{LinearOutput, Rope, RopeStyle};
use crate::device::{CpuStorage, Device, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};

fn f32s(t: &Tensor) -> &[f32] {
    match t.as_cpu() {
        Some(CpuStorage::F32(v)) => v,
        _ => unreachable!("validated: f32 tensor on the CPU"),
    }
}

fn f32s_mut(t: &mut Tensor) -> &mut [f32] {
    match t.as_cpu_mut() {
        Some(CpuStorage::F32(v)) => v,
        _ => unreachable!("validated: f32 tensor on the CPU"),
    }
}

fn i32s(t: &Tensor) -> &[i32] {
    match t.as_cpu() {
        Some(CpuStorage::I32(v)) => v,
        _ => unreachable!("validated: i32 tensor on the CPU"),
    }
}

fn i32s_mut(t: &mut Tensor) -> &mut [i32] {
    match t.as_cpu_mut() {
        Some(CpuStorage::I32(v)) => v,
        _ => unreachable!("validated: i32 tensor on the CPU"),
    }
}

pub(super) fn embedding(
    table_t: &Tensor,
    ids: &Tensor,
    v: usize,
    h: usize,
    t: usize,
    out: &mut Tensor,
) -> Result<()> {
    let table = f32s(table_t);
    let ids = i32s(ids);
    if let Some((i, &id)) = ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id < 0 || id as usize >= v)
    {
        return Err(Error::Config(format!(
            "index {id} at position {i} is out of range for a table of {v} rows"
        )));
    }
    let out = &mut f32s_mut(out)[..t * h];
    for (row, &id) in out.chunks_exact_mut(h.max(1)).zip(ids) {
        let id = id as usize;
        row.copy_from_slice(&table[id * h..(id + 1) * h]);
    }
    Ok(())
}

pub(super) fn rms_norm(
    x_t: &Tensor,
    w: &Tensor,
    eps: f32,
    t: usize,
    h: usize,
    out: &mut Tensor,
) -> Result<()> {
    let (x, w) = (f32s(x_t), f32s(w));
    let out = &mut f32s_mut(out)[..t * h];
    if h > 0 {
        out.par_chunks_mut(h)
            .zip(x.par_chunks(h))
            .for_each(|(o, xr)| norm_row(xr, w, eps, o));
    }
    Ok(())
}

/// One row of RMSNorm: `o = x / sqrt(mean(x²) + eps) · w` (the mean square in f64).
fn norm_row(xr: &[f32], w: &[f32], eps: f32, o: &mut [f32]) {
    let ms = xr.iter().map(|&a| a as f64 * a as f64).sum::<f64>() / xr.len() as f64;
    let inv = (1.0 / (ms + eps as f64).sqrt()) as f32;
    for ((oi, &xi), &wi) in o.iter_mut().zip(xr).zip(w) {
        *oi = xi * inv * wi;
    }
}

/// Dot product with four independent 8-wide accumulators (vectorises to four FMA chains:
/// one chain would hold a core to one FMA per latency, about the DRAM rate of a decode GEMV).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [[0.0f32; 8]; 4];
    let (ca, cb) = (a.chunks_exact(32), b.chunks_exact(32));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for (k, acc) in acc.iter_mut().enumerate() {
            for i in 0..8 {
                acc[i] = x[8 * k + i].mul_add(y[8 * k + i], acc[i]);
            }
        }
    }
    let (ca, cb) = (ra.chunks_exact(8), rb.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[0][i] = x[i].mul_add(y[i], acc[0][i]);
        }
    }
    let mut s = 0.0f32;
    for (x, y) in ra.iter().zip(rb) {
        s = x.mul_add(*y, s);
    }
    let v: [f32; 8] = std::array::from_fn(|i| (acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i]));
    ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])) + s
}

/// Weight rows a GEMV asks the cache for ahead of the row it multiplies. Why: a decode step
/// streams every weight once, and the hardware prefetcher alone, restarting at every
/// 2–6 KB row, kept a 2-core x86 VM at about 0.55× of its read bandwidth; requesting the
/// lines of the row four ahead (9–25 KB at the model's widths) brought it to about 0.9×
/// (1 and 2 rows ahead gain less, 8 lose again).
const PREFETCH_ROWS: usize = 4;

/// Asks the cache for the lines of `row` (a hint: no fault, no effect on results).
#[inline(always)]
fn prefetch_row(row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for line in row.chunks(16) {
            // SAFETY: prefetch is a hint on an address inside `row`; it reads nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// Columns `[n0, n0 + cols.len() / t)` of `y = x·Wᵀ`, written transposed into `cols`
/// (`cols[j * t + i] = y[i][n0 + j]`), so that each weight row is read once for all tokens.
#[inline(always)]
fn linear_block(x: &[f32], w: &[f32], k: usize, t: usize, n0: usize, cols: &mut [f32]) {
    for (j, col) in cols.chunks_exact_mut(t).enumerate() {
        let ahead = n0 + j + PREFETCH_ROWS;
        if let Some(r) = w.get(ahead * k..(ahead + 1) * k) {
            prefetch_row(r);
        }
        let wr = &w[(n0 + j) * k..(n0 + j + 1) * k];
        for (i, c) in col.iter_mut().enumerate() {
            *c = dot(&x[i * k..(i + 1) * k], wr);
        }
    }
}

/// The product's inner loops on x86-64 with AVX2 and FMA, written with intrinsics. Why: the
/// portable loops above compile to 128-bit lanes with shuffles and accumulator spills to the
/// stack, which held a decode GEMV well under the DRAM rate.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// The sum of the 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// `Σ a[i]·b[i]` over the shorter length: four 8-wide accumulators (four FMA chains).
    #[target_feature(enable = "avx2,fma")]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY (every load below): `i + 8 ≤ n` before each 8-wide load of a and b.
        while i + 32 <= n {
            for (c, acc) in acc.iter_mut().enumerate() {
                let (x, y) = unsafe {
                    (
                        _mm256_loadu_ps(pa.add(i + 8 * c)),
                        _mm256_loadu_ps(pb.add(i + 8 * c)),
                    )
                };
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
            i += 32;
        }
        while i + 8 <= n {
            let (x, y) = unsafe { (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i))) };
            acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum(v);
        for (x, y) in a[i..n].iter().zip(&b[i..n]) {
            s = x.mul_add(*y, s);
        }
        s
    }

    /// The dot products of one weight row `w` with four token rows (each at least as long):
    /// every weight vector is loaded once for the four, two accumulators per token (eight
    /// FMA chains).
    #[target_feature(enable = "avx2,fma")]
    fn dot4(x: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
        let n = x.iter().map(|r| r.len()).fold(w.len(), usize::min);
        let pw = w.as_ptr();
        let px = x.map(|r| r.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        let mut i = 0;
        // SAFETY (every load below): `i + 16 ≤ n` (`i + 8 ≤ n` in the tail loop) before the
        // loads of w and of each token row, all at least `n` long.
        while i + 16 <= n {
            let (w0, w1) = unsafe { (_mm256_loadu_ps(pw.add(i)), _mm256_loadu_ps(pw.add(i + 8))) };
            for (acc, p) in acc.iter_mut().zip(px) {
                let (x0, x1) =
                    unsafe { (_mm256_loadu_ps(p.add(i)), _mm256_loadu_ps(p.add(i + 8))) };
                acc[0] = _mm256_fmadd_ps(x0, w0, acc[0]);
                acc[1] = _mm256_fmadd_ps(x1, w1, acc[1]);
            }
            i += 16;
        }
        while i + 8 <= n {
            let w0 = unsafe { _mm256_loadu_ps(pw.add(i)) };
            for (acc, p) in acc.iter_mut().zip(px) {
                acc[0] = _mm256_fmadd_ps(unsafe { _mm256_loadu_ps(p.add(i)) }, w0, acc[0]);
            }
            i += 8;
        }
        let mut out = [0.0f32; 4];
        for ((o, acc), r) in out.iter_mut().zip(acc).zip(x) {
            let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
            for (a, b) in r[i..n].iter().zip(&w[i..n]) {
                s = a.mul_add(*b, s);
            }
            *o = s;
        }
        out
    }

    /// [`super::linear_block`] with the loops above: four tokens per pass over a weight row.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn linear_block(
        x: &[f32],
        w: &[f32],
        k: usize,
        t: usize,
        n0: usize,
        cols: &mut [f32],
    ) {
        for (j, col) in cols.chunks_exact_mut(t).enumerate() {
            let ahead = n0 + j + super::PREFETCH_ROWS;
            if let Some(r) = w.get(ahead * k..(ahead + 1) * k) {
                super::prefetch_row(r);
            }
            let wr = &w[(n0 + j) * k..(n0 + j + 1) * k];
            let row = |i: usize| &x[i * k..(i + 1) * k];
            let mut i = 0;
            while i + 4 <= t {
                let d = dot4([row(i), row(i + 1), row(i + 2), row(i + 3)], wr);
                col[i..i + 4].copy_from_slice(&d);
                i += 4;
            }
            for (c, r) in col[i..].iter_mut().zip(i..t) {
                *c = dot(row(r), wr);
            }
        }
    }
}

fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `y = x·Wᵀ` transposed: `[N][T]` (`yt[j * t + i] = y[i][j]`), so that each weight row is
/// read once for all tokens. Output features in blocks of 16, one rayon task each.
fn product_t(x: &[f32], w: &[f32], t: usize, k: usize, n: usize) -> Vec<f32> {
    const BLOCK: usize = 16;
    let mut yt = vec![0.0f32; n * t];
    let avx2 = has_avx2_fma();
    yt.par_chunks_mut(BLOCK * t)
        .enumerate()
        .for_each(|(b, cols)| {
            let n0 = b * BLOCK;
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                unsafe { avx2::linear_block(x, w, k, t, n0, cols) };
                return;
            }
            let _ = avx2;
            linear_block(x, w, k, t, n0, cols);
        });
    yt
}

/// Writes (or adds) the transposed product `yt [N][T]` into `y [T][N]`.
fn store_t(yt: &[f32], t: usize, n: usize, y: &mut [f32], accumulate: bool) {
    for (j, col) in yt.chunks_exact(t).enumerate() {
        for (i, &c) in col.iter().enumerate() {
            if accumulate {
                y[i * n + j] += c;
            } else {
                y[i * n + j] = c;
            }
        }
    }
}

/// [`super::linear_fused`] on the CPU: the norm, the product and the output step one after
/// the other (the host has no launches to save; the numbers are the separate operations').
pub(super) fn linear_fused(a: &FusedLinear<'_>, out: LinearOutput<'_>) -> Result<()> {
    let (t, k, n) = (a.t, a.k, a.n);
    let normed;
    let x: &[f32] = match a.norm {
        Some(nm) => {
            let w = f32s(nm.weight);
            let mut h = vec![0.0f32; t * k];
            h.par_chunks_mut(k)
                .zip(f32s(a.x).par_chunks(k))
                .for_each(|(o, xr)| norm_row(xr, w, nm.eps, o));
            normed = h;
            &normed
        }
        None => &f32s(a.x)[..t * k],
    };
    let yt = product_t(x, f32s(a.w), t, k, n);
    match out {
        LinearOutput::Store(o) => store_t(&yt, t, n, f32s_mut(o), false),
        LinearOutput::Accumulate(o) => store_t(&yt, t, n, f32s_mut(o), true),
        LinearOutput::SwiGlu(o) => {
            let i = n / 2;
            let o = f32s_mut(o);
            for r in 0..t {
                for c in 0..i {
                    o[r * i + c] = silu(yt[c * t + r]) * yt[(i + c) * t + r];
                }
            }
        }
        LinearOutput::RopeSplitQkv {
            positions,
            rope,
            q,
            k: kt,
            v,
        } => {
            let mut p = Tensor::zeros(&Device::cpu(), &[t, n], DType::F32)?;
            store_t(&yt, t, n, f32s_mut(&mut p), false);
            let heads = (q.shape()[1], kt.shape()[1], q.shape()[2]);
            rope_split(&p, positions, rope, heads, t, q, kt, v)?;
        }
    }
    Ok(())
}

/// `(cos, sin)` of position `pos` for pair `i` of a head of size `d`.
#[inline]
pub(crate) fn rope_angle(pos: i32, i: usize, d: usize, base: f32) -> (f32, f32) {
    // In f64 so that long positions keep their precision; the GPU kernels do the same in f32
    // with the frequency computed the same way, which agrees to ~1e-6 for positions < 2^16.
    let inv_freq = (base as f64).powf(-2.0 * i as f64 / d as f64);
    let a = pos as f64 * inv_freq;
    (a.cos() as f32, a.sin() as f32)
}

pub(super) fn rope(
    x: &mut Tensor,
    positions: &Tensor,
    rope: Rope,
    t: usize,
    heads: usize,
    d: usize,
) -> Result<()> {
    let pos = i32s(positions).to_vec();
    if let Some((i, &p)) = pos.iter().enumerate().find(|(_, &p)| p < 0) {
        return Err(Error::Config(format!(
            "rope position {p} at token {i} is negative"
        )));
    }
    let half = d / 2;
    let data = f32s_mut(x);
    if t * heads * d == 0 {
        return Ok(());
    }
    data.par_chunks_mut(heads * d)
        .zip(pos.par_iter())
        .for_each(|(tok, &p)| {
            let angles: Vec<(f32, f32)> =
                (0..half).map(|i| rope_angle(p, i, d, rope.base)).collect();
            for head in tok.chunks_exact_mut(d) {
                for (i, &(c, s)) in angles.iter().enumerate() {
                    let (a, b) = match rope.style {
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                        RopeStyle::HalfSplit => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * c - x1 * s;
                    head[b] = x0 * s + x1 * c;
                }
            }
        });
    Ok(())
}

#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub(super) fn silu_mul(gate: &Tensor, up: &Tensor, out: &mut Tensor) -> Result<()> {
    f32s_mut(out)
        .par_iter_mut()
        .zip(f32s(gate).par_iter().zip(f32s(up).par_iter()))
        .for_each(|(o, (&g, &u))| *o = silu(g) * u);
    Ok(())
}

pub(super) fn swiglu(gate_up: &Tensor, out: &mut Tensor, i: usize) -> Result<()> {
    if i == 0 {
        return Ok(());
    }
    f32s_mut(out)
        .par_chunks_mut(i)
        .zip(f32s(gate_up).par_chunks(2 * i))
        .for_each(|(o, gu)| {
            let (g, u) = gu.split_at(i);
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = silu(g) * u;
            }
        });
    Ok(())
}

/// Query and key heads of `qkv` rotated into `q` / `k` (the arithmetic of [`rope`]), value
/// heads copied into `v`.
#[allow(clippy::too_many_arguments)]
pub(super) fn rope_split(
    qkv: &Tensor,
    positions: &Tensor,
    rope_cfg: Rope,
    (h, hk, d): (usize, usize, usize),
    t: usize,
    q: &mut Tensor,
    k: &mut Tensor,
    v: &mut Tensor,
) -> Result<()> {
    let src = f32s(qkv);
    let row = (h + 2 * hk) * d;
    for (dst, first, heads) in [(&mut *q, 0, h), (&mut *k, h, hk), (&mut *v, h + hk, hk)] {
        let out = f32s_mut(dst);
        for tok in 0..t {
            let from = &src[tok * row + first * d..][..heads * d];
            out[tok * heads * d..][..heads * d].copy_from_slice(from);
        }
    }
    rope(q, positions, rope_cfg, t, h, d)?;
    rope(k, positions, rope_cfg, t, hk, d)
}

pub(super) fn add_assign(x: &mut Tensor, y: &Tensor) -> Result<()> {
    let y = f32s(y);
    f32s_mut(x)
        .par_iter_mut()
        .zip(y.par_iter())
        .for_each(|(a, &b)| *a += b);
    Ok(())
}

pub(super) fn argmax(logits: &Tensor, r: usize, v: usize, out: &mut Tensor) -> Result<()> {
    let x = f32s(logits);
    i32s_mut(out)
        .par_iter_mut()
        .zip(x.par_chunks(v).take(r))
        .for_each(|(o, row)| *o = argmax_row(row) as i32);
    Ok(())
}

/// Index of the largest element of `row` (the lowest index among equal maxima; NaN never
/// wins; 0 when nothing exceeds −∞): the one greedy rule of the host sampler and of every
/// device's argmax kernel.
pub(crate) fn argmax_row(row: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}
