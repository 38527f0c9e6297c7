//! CPU kernels of the model operations: rayon over rows (or output features for `linear`),
//! f32 throughout. `linear` runs an AVX-512 or AVX2+FMA build of its inner loop when the CPU
//! has it (checked at run time, as the CPU attention kernel does).

use rayon::prelude::*;

use super::fused_linear::FusedLinear;
use super::{LinearOutput, Rope, RopeStyle};
use crate::device::{CpuStorage, Device, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;

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
/// streams every weight once, and the hardware prefetcher alone restarts at every row (2–6 KB
/// at a small model's widths), leaving the memory idle between rows; four rows (9–25 KB) keep
/// enough lines in flight without evicting what is still to be read (the measurements, nearer
/// and farther distances included, are in `benches/RESULTS.md`, "the CPU GEMV at the memory's
/// rate").
const PREFETCH_ROWS: usize = 4;

/// Asks the cache for the lines of `row` (a hint: no fault, no effect on results).
#[inline(always)]
fn prefetch_row<T>(row: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for line in row.chunks((64 / std::mem::size_of::<T>().max(1)).max(1)) {
            // SAFETY: prefetch is a hint on an address inside `row`; it reads nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
        }
        // A row that does not start on a line boundary ends in one more line.
        if let Some(last) = row.last() {
            // SAFETY: as above.
            unsafe { _mm_prefetch::<_MM_HINT_T0>((last as *const T).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// A weight element type the CPU product reads (f32, or f16 / bf16 weights widened to f32
/// as they are read, so a step streams half the bytes).
trait WeightElem: Copy + Send + Sync {
    /// `row` as f32: itself for f32, else widened into `buf` (`row.len()` long).
    fn row_f32<'a>(row: &'a [Self], buf: &'a mut [f32]) -> &'a [f32];
}

impl WeightElem for f32 {
    fn row_f32<'a>(row: &'a [f32], _: &'a mut [f32]) -> &'a [f32] {
        row
    }
}

macro_rules! widened_weight {
    ($t:ty) => {
        impl WeightElem for $t {
            fn row_f32<'a>(row: &'a [$t], buf: &'a mut [f32]) -> &'a [f32] {
                for (o, w) in buf.iter_mut().zip(row) {
                    *o = w.to_f32();
                }
                &buf[..row.len()]
            }
        }
    };
}
widened_weight!(half::f16);
widened_weight!(half::bf16);

/// Columns `[n0, n0 + cols.len() / t)` of `y = x·Wᵀ`, written transposed into `cols`
/// (`cols[j * t + i] = y[i][n0 + j]`), so that each weight row is read once for all tokens.
fn linear_block<T: WeightElem>(
    x: &[f32],
    w: &[T],
    k: usize,
    t: usize,
    n0: usize,
    cols: &mut [f32],
) {
    let mut buf = vec![0.0f32; if std::mem::size_of::<T>() == 4 { 0 } else { k }];
    for (j, col) in cols.chunks_exact_mut(t).enumerate() {
        let ahead = n0 + j + PREFETCH_ROWS;
        if let Some(r) = w.get(ahead * k..(ahead + 1) * k) {
            prefetch_row(r);
        }
        let wr = T::row_f32(&w[(n0 + j) * k..(n0 + j + 1) * k], &mut buf);
        for (i, c) in col.iter_mut().enumerate() {
            *c = dot(&x[i * k..(i + 1) * k], wr);
        }
    }
}

/// The product's inner loops on x86-64, written with intrinsics: AVX-512 where the CPU has it
/// (16 lanes, four weight rows a pass), else AVX2 with FMA (8 lanes, two rows a pass; F16C as
/// well for f16 weights); one module per weight type. Why: the portable loops above compile to
/// 128-bit lanes with shuffles and accumulator spills to the stack, which held a decode GEMV
/// well under the DRAM rate; and a step of several tokens is bound by the multiply-adds, which
/// 16 lanes do in half the instructions of 8.
///
/// Every (weight row, token) dot product runs the same sequence of operations (one
/// accumulator of the vector's lanes, the lane sum, a scalar tail) whatever rows and tokens it
/// is computed with, so a request's result does not depend on its row in the batch or on the
/// batch's size (on one CPU: the AVX-512 and AVX2 sums differ in their last bits).
#[cfg(target_arch = "x86_64")]
mod simd_loops {
    use std::arch::x86_64::*;

    /// The sum of the 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// The sum of the 16 lanes.
    #[target_feature(enable = "avx512f")]
    unsafe fn hsum512(v: __m512) -> f32 {
        _mm512_reduce_add_ps(v)
    }

    /// The loops for weights of type `$t` under the target features `$feat`, on vectors
    /// `$v` of `$lanes` f32 lanes (`$zero`, `$load` of f32 lanes, `$fma`, `$hsum`), `$nr`
    /// weight rows a pass: `$load_w` reads `$lanes` weights at pointer `$p` as f32 lanes,
    /// `$one` widens the weight `$w`.
    macro_rules! weight_loops {
        (
            $m:ident, $t:ty, $feat:literal,
            [$v:ty, $lanes:literal, $nr:literal, $zero:ident, $load:ident, $fma:ident, $hsum:ident],
            |$p:ident| $load_w:expr, |$w:ident| $one:expr
        ) => {
            pub(super) mod $m {
                use super::*;

                /// The dot products of `NR` weight rows with `NT` token rows (all at least
                /// `n` long): every weight vector is loaded once for the `NT` tokens and every
                /// token vector once for the `NR` rows, one accumulator per (row, token).
                /// `ahead`: rows the L2 cache is asked for as the loop goes, the same offset
                /// as the weights it reads (null: none). Why in the loop: a burst of a row's
                /// prefetches filled the core's line-fill buffers and stalled it (the
                /// samples of a profile sat on the prefetches), where one line per step keeps
                /// the memory busy under the multiply-adds; why L2: it was as fast or faster
                /// at one and at eight tokens (`benches/RESULTS.md`).
                ///
                /// # Safety
                /// The CPU has the features `$feat`; every row holds at least `n` elements.
                #[target_feature(enable = $feat)]
                unsafe fn dots<const NR: usize, const NT: usize>(
                    w: [&[$t]; NR],
                    x: [&[f32]; NT],
                    n: usize,
                    ahead: [*const $t; NR],
                ) -> [[f32; NT]; NR] {
                    debug_assert!(w.iter().all(|r| r.len() >= n) && x.iter().all(|r| r.len() >= n));
                    let pw = w.map(|r| r.as_ptr());
                    let px = x.map(|r| r.as_ptr());
                    let mut acc: [[$v; NT]; NR] = [[$zero(); NT]; NR];
                    let mut i = 0;
                    // Every load below: `i + $lanes ≤ n` before it, and every row holds n.
                    while i + $lanes <= n {
                        for q in ahead {
                            if !q.is_null() {
                                // A hint: it reads nothing and cannot fault.
                                _mm_prefetch::<_MM_HINT_T1>(q.wrapping_add(i).cast());
                            }
                        }
                        let mut xv: [$v; NT] = [$zero(); NT];
                        for (v, p) in xv.iter_mut().zip(px) {
                            *v = $load(p.add(i));
                        }
                        for (acc, p) in acc.iter_mut().zip(pw) {
                            let $p = p.add(i);
                            let wv = $load_w;
                            for (a, v) in acc.iter_mut().zip(xv) {
                                *a = $fma(v, wv, *a);
                            }
                        }
                        i += $lanes;
                    }
                    let mut out = [[0.0f32; NT]; NR];
                    for ((o, acc), wr) in out.iter_mut().zip(acc).zip(w) {
                        for ((o, a), xr) in o.iter_mut().zip(acc).zip(x) {
                            let mut s = $hsum(a);
                            for (xe, &$w) in xr[i..n].iter().zip(&wr[i..n]) {
                                s = xe.mul_add($one, s);
                            }
                            *o = s;
                        }
                    }
                    out
                }

                /// The tokens of one block of weight rows, `NR` rows at a time; the first
                /// pass over the rows asks the cache for `ahead`.
                ///
                /// # Safety
                /// As [`dots`].
                #[target_feature(enable = $feat)]
                unsafe fn rows<const NR: usize>(
                    x: &[f32],
                    w: [&[$t]; NR],
                    k: usize,
                    t: usize,
                    mut cols: [&mut [f32]; NR],
                    mut ahead: [*const $t; NR],
                ) {
                    let row = |i: usize| &x[i * k..(i + 1) * k];
                    let mut i = 0;
                    while i + 4 <= t {
                        let d = dots(w, [row(i), row(i + 1), row(i + 2), row(i + 3)], k, ahead);
                        ahead = [std::ptr::null(); NR];
                        for (c, d) in cols.iter_mut().zip(d) {
                            c[i..i + 4].copy_from_slice(&d);
                        }
                        i += 4;
                    }
                    while i < t {
                        let d = dots(w, [row(i)], k, ahead);
                        ahead = [std::ptr::null(); NR];
                        for (c, d) in cols.iter_mut().zip(d) {
                            c[i] = d[0];
                        }
                        i += 1;
                    }
                }

                /// [`super::super::linear_block`] with the loops above: `$nr` weight rows and
                /// four tokens per pass. Every (row, token) product runs the same sequence
                /// whatever rows and tokens it is computed with.
                ///
                /// # Safety
                /// The CPU has the features `$feat`.
                #[target_feature(enable = $feat)]
                pub(in super::super) unsafe fn linear_block(
                    x: &[f32],
                    w: &[$t],
                    k: usize,
                    t: usize,
                    n0: usize,
                    cols: &mut [f32],
                ) {
                    let wrow = |j: usize| &w[(n0 + j) * k..(n0 + j + 1) * k];
                    // The row PREFETCH_ROWS after row j, if the matrix has it.
                    let ahead = |j: usize| {
                        let a = n0 + j + super::super::PREFETCH_ROWS;
                        w.get(a * k..(a + 1) * k)
                            .map_or(std::ptr::null(), |r| r.as_ptr())
                    };
                    let mut groups = cols.chunks_exact_mut($nr * t);
                    let mut j = 0;
                    for group in &mut groups {
                        let mut it = group.chunks_exact_mut(t);
                        let cs: [&mut [f32]; $nr] =
                            std::array::from_fn(|_| it.next().unwrap_or_default());
                        let a = std::array::from_fn(|r| ahead(j + r));
                        rows(x, std::array::from_fn(|r| wrow(j + r)), k, t, cs, a);
                        j += $nr;
                    }
                    for last in groups.into_remainder().chunks_exact_mut(t) {
                        rows(x, [wrow(j)], k, t, [last], [ahead(j)]);
                        j += 1;
                    }
                }
            }
        };
    }

    /// The three weight types' loops of one vector level: `$v` vectors of `$lanes` f32 lanes,
    /// `$nr` rows a pass, and each type's load of `$lanes` weights as f32 lanes.
    macro_rules! level {
        (
            $vec:tt, f32: ($f32m:ident, $f32feat:literal, |$pf:ident| $f32load:expr),
            bf16: ($bf16m:ident, $bf16feat:literal, |$pb:ident| $bf16load:expr),
            f16: ($f16m:ident, $f16feat:literal, |$ph:ident| $f16load:expr)
        ) => {
            weight_loops!($f32m, f32, $f32feat, $vec, |$pf| $f32load, |w| w);
            weight_loops!($bf16m, half::bf16, $bf16feat, $vec, |$pb| $bf16load, |w| {
                f32::from(w)
            });
            weight_loops!($f16m, half::f16, $f16feat, $vec, |$ph| $f16load, |w| {
                f32::from(w)
            });
        };
    }

    // bf16 is the high half of an f32: widen the 16-bit lanes and shift them up.
    level!(
        [__m256, 8, 2, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_fmadd_ps, hsum256],
        f32: (f32w, "avx2,fma", |p| _mm256_loadu_ps(p)),
        bf16: (bf16w, "avx2,fma", |p| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()))
        ))),
        f16: (f16w, "avx2,fma,f16c", |p| _mm256_cvtph_ps(_mm_loadu_si128(p.cast())))
    );
    level!(
        [__m512, 16, 4, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_fmadd_ps, hsum512],
        f32: (f32w512, "avx512f", |p| _mm512_loadu_ps(p)),
        bf16: (bf16w512, "avx512f", |p| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()))
        ))),
        f16: (f16w512, "avx512f", |p| _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())))
    );
}

/// Which SIMD loops this CPU runs (checked once at run time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Simd {
    /// The portable loops.
    None,
    /// AVX2 with FMA; `f16c`: F16C as well, for f16 weights.
    Avx2 { f16c: bool },
    /// AVX-512 Foundation (which converts f16 itself).
    Avx512,
}

impl Simd {
    /// The block function of this level: `wide` (AVX-512), `narrow` (AVX2, where
    /// `narrow_runs`), else none (the portable loops).
    #[cfg(target_arch = "x86_64")]
    fn pick<T>(
        self,
        wide: BlockFn<T>,
        narrow: BlockFn<T>,
        narrow_runs: bool,
    ) -> Option<BlockFn<T>> {
        match self {
            Simd::Avx512 => Some(wide),
            Simd::Avx2 { .. } if narrow_runs => Some(narrow),
            _ => None,
        }
    }
}

fn simd() -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            return Simd::Avx512;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Simd::Avx2 {
                f16c: std::is_x86_feature_detected!("f16c"),
            };
        }
    }
    Simd::None
}

/// A block function: the columns of one rayon task (see [`linear_block`]).
type BlockFn<T> = unsafe fn(&[f32], &[T], usize, usize, usize, &mut [f32]);

/// A weight matrix as the host holds it.
#[derive(Clone, Copy)]
enum Weights<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
    Bf16(&'a [half::bf16]),
}

fn weights(t: &Tensor) -> Weights<'_> {
    match t.as_cpu() {
        Some(CpuStorage::F32(v)) => Weights::F32(v),
        Some(CpuStorage::F16(v)) => Weights::F16(v),
        Some(CpuStorage::Bf16(v)) => Weights::Bf16(v),
        _ => unreachable!("validated: an f32 / f16 / bf16 weight on the CPU"),
    }
}

/// `y = x·Wᵀ` transposed: `[N][T]` (`yt[j * t + i] = y[i][j]`), so that each weight row is
/// read once for all tokens. Output features in blocks of 16, one rayon task each.
fn product_t(x: &[f32], w: Weights<'_>, t: usize, k: usize, n: usize) -> Vec<f32> {
    let level = simd();
    #[cfg(target_arch = "x86_64")]
    {
        use simd_loops as l;
        // The AVX2 f16 loops need F16C as well; AVX-512 converts f16 itself.
        let f16c = matches!(level, Simd::Avx2 { f16c: true });
        match w {
            Weights::F32(w) => {
                let f = level.pick(l::f32w512::linear_block, l::f32w::linear_block, true);
                product_t_of(x, w, t, k, n, f)
            }
            Weights::Bf16(w) => {
                let f = level.pick(l::bf16w512::linear_block, l::bf16w::linear_block, true);
                product_t_of(x, w, t, k, n, f)
            }
            Weights::F16(w) => {
                let f = level.pick(l::f16w512::linear_block, l::f16w::linear_block, f16c);
                product_t_of(x, w, t, k, n, f)
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        match w {
            Weights::F32(w) => product_t_of(x, w, t, k, n, None),
            Weights::Bf16(w) => product_t_of(x, w, t, k, n, None),
            Weights::F16(w) => product_t_of(x, w, t, k, n, None),
        }
    }
}

/// [`product_t`] for weights of type `T`, with the SIMD block function `fast` where the CPU
/// has its features.
fn product_t_of<T: WeightElem>(
    x: &[f32],
    w: &[T],
    t: usize,
    k: usize,
    n: usize,
    fast: Option<BlockFn<T>>,
) -> Vec<f32> {
    const BLOCK: usize = 16;
    let mut yt = vec![0.0f32; n * t];
    yt.par_chunks_mut(BLOCK * t)
        .enumerate()
        .for_each(|(b, cols)| match fast {
            // SAFETY: `fast` is given only when the CPU has its target features.
            Some(f) => unsafe { f(x, w, k, t, b * BLOCK, cols) },
            None => linear_block(x, w, k, t, b * BLOCK, cols),
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
    let yt = product_t(x, weights(a.w), t, k, n);
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
        LinearOutput::RopeSplitQkvCache {
            positions,
            rope,
            q,
            cache,
            batch,
        } => {
            let mut p = Tensor::zeros(&Device::cpu(), &[t, n], DType::F32)?;
            store_t(&yt, t, n, f32s_mut(&mut p), false);
            let (h, d) = (q.shape()[1], q.shape()[2]);
            let hk = cache.spec().num_kv_heads;
            let mut kt = Tensor::zeros(&Device::cpu(), &[t, hk, d], DType::F32)?;
            let mut v = Tensor::zeros(&Device::cpu(), &[t, hk, d], DType::F32)?;
            rope_split(&p, positions, rope, (h, hk, d), t, q, &mut kt, &mut v)?;
            write_cache(cache, batch.slot_mapping_cpu(), &kt, &v);
        }
    }
    Ok(())
}

/// Rows `[T, Hk, d]` of keys and values into their cache slots (`slots[t] < 0`: skipped);
/// every slot was checked against the cache's blocks.
fn write_cache(cache: &mut KvCache, slots: &[i64], k: &Tensor, v: &Tensor) {
    let (hk, d, bs) = (
        cache.spec().num_kv_heads,
        cache.spec().head_size,
        cache.block_size(),
    );
    let offsets: Vec<Option<(usize, usize)>> = slots
        .iter()
        .map(|&s| {
            let s = usize::try_from(s).ok()?;
            Some((s / bs, s % bs))
        })
        .collect();
    let mut at = Vec::with_capacity(slots.len() * hk * 2);
    for (tok, o) in offsets.iter().enumerate() {
        if let Some((block, off)) = *o {
            for head in 0..hk {
                let row = (tok * hk + head) * d;
                at.push((cache.offset(block, 0, off, head), k, row));
                at.push((cache.offset(block, 1, off, head), v, row));
            }
        }
    }
    let data = f32s_mut(cache.data_mut());
    for (dst, src, row) in at {
        data[dst..dst + d].copy_from_slice(&f32s(src)[row..row + d]);
    }
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

pub(super) fn sample(
    logits: &Tensor,
    rows: &[super::SamplingRow],
    v: usize,
    out: &mut Tensor,
) -> Result<()> {
    let x = f32s(logits);
    i32s_mut(out)
        .par_iter_mut()
        .zip(x.par_chunks(v))
        .zip(rows.par_iter())
        .for_each(|((o, row), s)| *o = sample_row(row, s) as i32);
    Ok(())
}

/// The sampling rule of [`super::sample`] for one row, in f64: the reference every device's
/// kernel is checked against, and the host sampler itself.
///
/// Greedy ([`argmax_row`]) when the temperature is not above 0 or the row's largest non-NaN
/// element is not finite. Otherwise `p_i = exp((x_i − m) / T)` (0 for NaN and −∞), the
/// nucleus keeps every `p_i ≥ t` for the largest `t` whose kept mass reaches
/// `top_p · Σ p` (all of them when `top_p ≥ 1` or NaN; ties at `t` are all kept), and the
/// token is the first kept index, in index order, whose running kept mass exceeds
/// `uniform · (kept mass)` (the last kept index if rounding leaves none).
pub(crate) fn sample_row(row: &[f32], s: &super::SamplingRow) -> u32 {
    let m = row
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if s.temperature.is_nan() || s.temperature <= 0.0 || !m.is_finite() {
        return argmax_row(row);
    }
    let (m, t) = (f64::from(m), f64::from(s.temperature));
    let p: Vec<f64> = row
        .iter()
        .map(|&x| {
            if x > f32::NEG_INFINITY {
                ((f64::from(x) - m) / t).exp()
            } else {
                0.0
            }
        })
        .collect();
    let total: f64 = p.iter().sum();
    let threshold = if s.top_p < 1.0 {
        let goal = f64::from(s.top_p) * total;
        let mut sorted = p.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let mut mass = 0.0;
        let mut t = sorted[0];
        for &q in &sorted {
            t = q;
            mass += q;
            if mass >= goal {
                break;
            }
        }
        t
    } else {
        0.0
    };
    let kept = |q: f64| q >= threshold && q > 0.0;
    let mass: f64 = p.iter().copied().filter(|&q| kept(q)).sum();
    let u = if s.uniform >= 0.0 {
        s.uniform.min(1.0)
    } else {
        0.0
    };
    let target = f64::from(u) * mass;
    let mut acc = 0.0;
    let mut last = 0;
    for (i, &q) in p.iter().enumerate() {
        if kept(q) {
            acc += q;
            last = i;
            if acc > target {
                return i as u32;
            }
        }
    }
    last as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// One block of columns, through `f` or the portable loops.
    fn block<T: WeightElem>(
        f: Option<BlockFn<T>>,
        x: &[f32],
        w: &[T],
        k: usize,
        t: usize,
        n: usize,
    ) -> Vec<f32> {
        let mut cols = vec![f32::NAN; n * t];
        match f {
            // SAFETY: `forms` lists a SIMD function only where the CPU has its features.
            Some(f) => unsafe { f(x, w, k, t, 0, &mut cols) },
            None => linear_block(x, w, k, t, 0, &mut cols),
        }
        cols
    }

    /// Each loop form (`None`: the portable one) against the f64 product, at widths with and
    /// without a scalar tail, row counts that leave a remainder of every size and 1 to 9
    /// tokens; and a token's result is bit for bit the same alone and at any row of a batch.
    fn products_match<T: WeightElem>(
        forms: &[(&str, Option<BlockFn<T>>)],
        to_w: impl Fn(f32) -> T,
        w_f64: impl Fn(T) -> f64,
    ) {
        let mut rng = Rng::new(7);
        let mut r = move || (rng.uniform() * 2.0 - 1.0) as f32;
        for &(name, f) in forms {
            for (k, n) in [(64, 16), (37, 7), (576, 13), (96, 5)] {
                let w: Vec<T> = (0..n * k).map(|_| to_w(r())).collect();
                for t in 1..=9 {
                    let x: Vec<f32> = (0..t * k).map(|_| r()).collect();
                    let got = block(f, &x, &w, k, t, n);
                    for i in 0..t {
                        let alone = block(f, &x[i * k..(i + 1) * k], &w, k, 1, n);
                        for j in 0..n {
                            let want: f64 = (0..k)
                                .map(|c| f64::from(x[i * k + c]) * w_f64(w[j * k + c]))
                                .sum();
                            let g = f64::from(got[j * t + i]);
                            assert!(
                                (g - want).abs() <= 1e-5 * k as f64,
                                "{name}: k {k} n {n} t {t}: row {j} token {i}: {g} vs {want}"
                            );
                            assert_eq!(
                                alone[j].to_bits(),
                                got[j * t + i].to_bits(),
                                "{name}: k {k} t {t}: token {i} differs alone and in the batch"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The forms of one weight type this CPU runs, each SIMD one named and listed only where
    /// the CPU has its features (a missing one says that it skipped).
    fn forms<T>(
        simd: &[(&'static str, bool, BlockFn<T>)],
    ) -> Vec<(&'static str, Option<BlockFn<T>>)> {
        let mut out = vec![("portable", None)];
        for &(name, runs, f) in simd {
            if runs {
                out.push((name, Some(f)));
            } else {
                eprintln!("SKIP the {name} product: this CPU lacks its features");
            }
        }
        out
    }

    #[test]
    fn every_loop_form_matches_the_f64_product() {
        #[cfg(target_arch = "x86_64")]
        let (f32s, bf16s, f16s) = {
            use simd_loops as l;
            let avx2 =
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
            let f16c = avx2 && std::is_x86_feature_detected!("f16c");
            let avx512 = std::is_x86_feature_detected!("avx512f");
            (
                forms::<f32>(&[
                    ("avx2", avx2, l::f32w::linear_block),
                    ("avx512", avx512, l::f32w512::linear_block),
                ]),
                forms::<half::bf16>(&[
                    ("avx2", avx2, l::bf16w::linear_block),
                    ("avx512", avx512, l::bf16w512::linear_block),
                ]),
                forms::<half::f16>(&[
                    ("avx2", f16c, l::f16w::linear_block),
                    ("avx512", avx512, l::f16w512::linear_block),
                ]),
            )
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (f32s, bf16s, f16s) = (
            forms::<f32>(&[]),
            forms::<half::bf16>(&[]),
            forms::<half::f16>(&[]),
        );
        products_match(&f32s, |v| v, f64::from);
        products_match(&bf16s, half::bf16::from_f32, |w| f64::from(w.to_f32()));
        products_match(&f16s, half::f16::from_f32, |w| f64::from(w.to_f32()));
    }
}
