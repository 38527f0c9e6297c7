//! `polyattn::compute` (the model operations around attention) on every available backend's
//! device against f64 references written here, on random inputs, with the f32 tolerance.
//! One body per operation, stamped over backends and shapes by `for_each_case`.

#[macro_use]
mod common;

use common::{ensure, fail, for_each_case, CaseInfo, Outcome};
use polyattn::compute::{self, Rope, RopeStyle};
use polyattn::device::CpuStorage;
use polyattn::reference;
use polyattn::testing::{Rng, Tolerance};
use polyattn::{
    BackendRef, BatchDescription, CacheDType, CommonAttentionMetadata, DType, KvCache, KvCacheSpec,
    KvLayout, Tensor,
};

fn tol() -> Tolerance {
    Tolerance::for_dtype(DType::F32)
}

fn check(what: &str, got: &Tensor, want: &[f64]) -> Outcome {
    let got = got.to_f32_vec()?;
    ensure(got.len() == want.len(), || {
        format!("{what}: {} elements, want {}", got.len(), want.len())
    })?;
    let cmp = reference::compare(&got, want, tol());
    ensure(cmp.pass, || format!("{what}: {cmp}"))
}

/// (tokens, in_features, out_features): decode and prefill row counts, the example models'
/// widths (32, 128, 341, 576, 1536) and sizes that are not multiples of any tile.
/// T = 16 and T = 17 sit either side of the GPU kernels' GEMV / tiled switch, 4 / 5 and 8 / 9
/// either side of the GEMV's accumulator widths, with K a multiple of 4 (vector loads) and
/// not; N = 600 000 at T = 1 needs 75 000 GEMV workgroups
/// of 8 features on wgpu, more than one dispatch dimension holds (65 535). On CUDA (sm_80+),
/// 2 ≤ T ≤ 16 with K a multiple of 32 runs the tensor-core form: K = 32 and 64 leave some of
/// its warps without features, and T = 6 at K = 100 keeps the vector GEMV covered.
const LINEAR_SHAPES: &[(usize, usize, usize)] = &[
    (1, 128, 64),
    (1, 576, 1536),
    (2, 32, 5),
    (3, 96, 1),
    (3, 341, 128),
    (4, 576, 100),
    (4, 35, 67),
    (5, 576, 100),
    (5, 35, 67),
    (7, 33, 5),
    (8, 576, 100),
    (6, 100, 67),
    (9, 35, 67),
    (12, 64, 67),
    (16, 576, 100),
    (16, 35, 67),
    (17, 128, 1024),
    (17, 35, 67),
    (64, 576, 192),
    (65, 64, 65),
    (130, 96, 257),
    (1, 8, 600_000),
];

#[test]
fn linear_matches_reference() {
    for_each_case(
        "compute::linear",
        LINEAR_SHAPES,
        |&(t, k, n)| CaseInfo::plain(format!("T{t} K{k} N{n}")),
        |b: &BackendRef, &(t, k, n)| {
            let dev = b.device()?;
            let mut rng = Rng::new((t * 1000 + k * 7 + n) as u64);
            let x = rng.normals(t * k);
            let s = 1.0 / (k as f32).sqrt();
            let w: Vec<f32> = rng.normals(n * k).iter().map(|v| v * s).collect();
            let xt = Tensor::from_f32(&dev, &x, &[t, k], DType::F32)?;
            let wt = Tensor::from_f32(&dev, &w, &[n, k], DType::F32)?;
            let y = compute::linear(&xt, &wt)?;
            ensure(y.shape() == [t, n], || format!("shape {:?}", y.shape()))?;
            let mut want = vec![0.0f64; t * n];
            for i in 0..t {
                for j in 0..n {
                    want[i * n + j] = (0..k)
                        .map(|c| x[i * k + c] as f64 * w[j * k + c] as f64)
                        .sum();
                }
            }
            check("linear", &y, &want)
        },
    );
}

#[test]
fn rms_norm_matches_reference() {
    // (4, 75): rows that are not a multiple of 4 (scalar loads); (70 000, 8): one workgroup
    // per row, more than one dispatch dimension holds on wgpu.
    let shapes: &[(usize, usize)] = &[
        (1, 128),
        (5, 576),
        (33, 100),
        (64, 4096),
        (4, 75),
        (70_000, 8),
    ];
    for_each_case(
        "compute::rms_norm",
        shapes,
        |&(t, h)| CaseInfo::plain(format!("T{t} H{h}")),
        |b, &(t, h)| {
            let dev = b.device()?;
            let mut rng = Rng::new((t * 31 + h) as u64);
            let x: Vec<f32> = rng.normals(t * h).iter().map(|v| 3.0 * v + 0.5).collect();
            let w = rng.normals(h);
            let eps = 1e-5f32;
            let y = compute::rms_norm(
                &Tensor::from_f32(&dev, &x, &[t, h], DType::F32)?,
                &Tensor::from_f32(&dev, &w, &[h], DType::F32)?,
                eps,
            )?;
            let mut want = vec![0.0f64; t * h];
            for i in 0..t {
                let row = &x[i * h..(i + 1) * h];
                let ms = row.iter().map(|&a| (a as f64).powi(2)).sum::<f64>() / h as f64;
                let inv = 1.0 / (ms + eps as f64).sqrt();
                for j in 0..h {
                    want[i * h + j] = row[j] as f64 * inv * w[j] as f64;
                }
            }
            check("rms_norm", &y, &want)
        },
    );
}

#[test]
fn rope_matches_reference() {
    // (tokens, heads, head_size, style, base)
    let cases: &[(usize, usize, usize, RopeStyle, f32)] = &[
        (1, 4, 32, RopeStyle::Interleaved, 10000.0),
        (9, 9, 64, RopeStyle::Interleaved, 100000.0),
        (9, 3, 64, RopeStyle::HalfSplit, 100000.0),
        (40, 2, 128, RopeStyle::HalfSplit, 500000.0),
        (3, 5, 6, RopeStyle::Interleaved, 10.0),
    ];
    for_each_case(
        "compute::rope",
        cases,
        |&(t, h, d, s, base)| CaseInfo::plain(format!("T{t} H{h} D{d} {s:?} base {base}")),
        |b, &(t, h, d, style, base)| {
            let dev = b.device()?;
            let mut rng = Rng::new((t * 131 + h * 7 + d) as u64);
            let x = rng.normals(t * h * d);
            // Positions out of order and up to a few thousand, as a mixed batch has them.
            let pos: Vec<i32> = (0..t).map(|_| rng.below(5000) as i32).collect();
            let mut xt = Tensor::from_f32(&dev, &x, &[t, h, d], DType::F32)?;
            let pt = Tensor::from_i32(&dev, &pos, &[t])?;
            compute::rope(&mut xt, &pt, Rope { base, style })?;
            let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let half = d / 2;
            for (i, &ps) in pos.iter().enumerate() {
                for hh in 0..h {
                    let o = (i * h + hh) * d;
                    for p in 0..half {
                        let a = ps as f64 * (base as f64).powf(-2.0 * p as f64 / d as f64);
                        let (c, s) = (a.cos(), a.sin());
                        let (ia, ib) = match style {
                            RopeStyle::Interleaved => (2 * p, 2 * p + 1),
                            RopeStyle::HalfSplit => (p, p + half),
                        };
                        let (x0, x1) = (x[o + ia] as f64, x[o + ib] as f64);
                        want[o + ia] = x0 * c - x1 * s;
                        want[o + ib] = x0 * s + x1 * c;
                    }
                }
            }
            // Angles of positions in the thousands carry ~1e-4 rad of f32 rounding on a GPU
            // (sin/cos of a rounded product): compare with a tolerance that allows it.
            let got = xt.to_f32_vec()?;
            let cmp = reference::compare(
                &got,
                &want,
                Tolerance {
                    atol: 2e-3,
                    rtol: 1e-3,
                },
            );
            ensure(cmp.pass, || format!("rope: {cmp}"))
        },
    );
}

#[test]
fn elementwise_ops_match_reference() {
    let shapes: &[(usize, usize)] = &[(1, 341), (7, 1536), (64, 100)];
    for_each_case(
        "compute::silu_mul + add_assign",
        shapes,
        |&(t, n)| CaseInfo::plain(format!("T{t} N{n}")),
        |b, &(t, n)| {
            let dev = b.device()?;
            let mut rng = Rng::new((t * 17 + n) as u64);
            let g: Vec<f32> = rng.normals(t * n).iter().map(|v| 4.0 * v).collect();
            let u = rng.normals(t * n);
            let gt = Tensor::from_f32(&dev, &g, &[t, n], DType::F32)?;
            let ut = Tensor::from_f32(&dev, &u, &[t, n], DType::F32)?;
            let y = compute::silu_mul(&gt, &ut)?;
            let want: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&a, &b)| a as f64 / (1.0 + (-(a as f64)).exp()) * b as f64)
                .collect();
            check("silu_mul", &y, &want)?;
            let mut acc = Tensor::from_f32(&dev, &u, &[t, n], DType::F32)?;
            compute::add_assign(&mut acc, &gt)?;
            let want: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&a, &b)| a as f64 + b as f64)
                .collect();
            check("add_assign", &acc, &want)
        },
    );
}

#[test]
fn embedding_and_gather_rows_pick_rows() {
    let shapes: &[(usize, usize, usize)] =
        &[(1024, 128, 5), (49, 576, 1), (300, 64, 33), (50, 30, 9)];
    for_each_case(
        "compute::embedding + gather_rows",
        shapes,
        |&(v, h, t)| CaseInfo::plain(format!("V{v} H{h} T{t}")),
        |b, &(v, h, t)| {
            let dev = b.device()?;
            let mut rng = Rng::new((v + h + t) as u64);
            let table = rng.normals(v * h);
            let ids: Vec<i32> = (0..t).map(|_| rng.below(v) as i32).collect();
            let tt = Tensor::from_f32(&dev, &table, &[v, h], DType::F32)?;
            let it = Tensor::from_i32(&dev, &ids, &[t])?;
            let e = compute::embedding(&tt, &it)?;
            let want: Vec<f64> = ids
                .iter()
                .flat_map(|&i| {
                    table[i as usize * h..(i as usize + 1) * h]
                        .iter()
                        .map(|&x| x as f64)
                })
                .collect();
            check("embedding", &e, &want)?;
            // gather_rows on the embedded rows: reversed order, with a repeat.
            let rows: Vec<i32> = (0..t as i32).rev().chain(std::iter::once(0)).collect();
            let g = compute::gather_rows(&e, &Tensor::from_i32(&dev, &rows, &[rows.len()])?)?;
            let want: Vec<f64> = rows
                .iter()
                .flat_map(|&r| want[r as usize * h..(r as usize + 1) * h].to_vec())
                .collect();
            check("gather_rows", &g, &want)
        },
    );
}

/// SmolLM2-135M's tied embedding: a 49152×576 f32 table is 113 MB, which must fit one
/// storage binding on wgpu (lavapipe allows 128 MiB); the last row is the one most likely
/// to be cut off by a wrong binding size.
#[test]
fn embedding_of_a_smollm2_sized_table() {
    const V: usize = 49152;
    const H: usize = 576;
    for_each_case(
        "compute::embedding (113 MB table)",
        &[()],
        |_| CaseInfo::plain(format!("V{V} H{H}")),
        |b, _| {
            let dev = b.device()?;
            // A cheap fill that differs per row and column.
            let value = |r: usize, c: usize| ((r * 7 + c * 13) % 1009) as f32 - 504.0;
            let table: Vec<f32> = (0..V * H).map(|i| value(i / H, i % H)).collect();
            let ids = [V as i32 - 1, 0, 12345, V as i32 - 2];
            let tt = Tensor::from_f32(&dev, &table, &[V, H], DType::F32)?;
            drop(table);
            let e = compute::embedding(&tt, &Tensor::from_i32(&dev, &ids, &[ids.len()])?)?;
            let want: Vec<f64> = ids
                .iter()
                .flat_map(|&r| (0..H).map(move |c| value(r as usize, c) as f64))
                .collect();
            check("embedding", &e, &want)
        },
    );
}

/// Token ids and row indices out of range: the CPU returns an error, GPU kernels write a
/// row of zeros (and never read outside the table).
#[test]
fn out_of_range_indices_are_an_error_or_zeros() {
    for_each_case(
        "compute::embedding out of range",
        &[(37usize, 12usize), (37, 10)],
        |&(v, h)| CaseInfo::plain(format!("V{v} H{h}")),
        |b, &(v, h)| {
            let dev = b.device()?;
            let table: Vec<f32> = (0..v * h).map(|i| i as f32 + 1.0).collect();
            let tt = Tensor::from_f32(&dev, &table, &[v, h], DType::F32)?;
            let ids = [3, -1, v as i32, i32::MAX, i32::MIN, v as i32 - 1];
            let r = compute::embedding(&tt, &Tensor::from_i32(&dev, &ids, &[ids.len()])?);
            if matches!(dev, polyattn::Device::Cpu(_)) {
                let e = r.err().map(|e| e.to_string()).unwrap_or_default();
                return ensure(e.contains("out of range"), || {
                    format!("CPU: want an out-of-range error, got {e:?}")
                });
            }
            let want: Vec<f64> = ids
                .iter()
                .flat_map(|&id| {
                    (0..h).map(move |c| {
                        if id >= 0 && (id as usize) < v {
                            (id as usize * h + c) as f64 + 1.0
                        } else {
                            0.0
                        }
                    })
                })
                .collect();
            check("embedding", &r?, &want)
        },
    );
}

/// Rows of logits with what greedy sampling must get right: ties (the lowest index wins),
/// NaN (never wins), ±inf, rows of only −∞ or only NaN (0), a maximum in the last column,
/// and widths around the kernels' 256-thread stride (1, 255, 256, 257, SmolLM2's 49152).
/// (70 000 rows × 3): one workgroup per row, more than one dispatch dimension holds on wgpu.
#[test]
fn argmax_follows_the_host_rule() {
    let shapes: &[(usize, usize)] = &[
        (1, 1),
        (9, 255),
        (9, 256),
        (9, 257),
        (4, 49152),
        (70_000, 3),
    ];
    for_each_case(
        "compute::argmax",
        shapes,
        |&(r, v)| CaseInfo::plain(format!("R{r} V{v}")),
        |b, &(r, v)| {
            let dev = b.device()?;
            let mut rng = Rng::new((r * 131 + v) as u64);
            let mut x = rng.normals(r * v);
            for (row, xs) in x.chunks_mut(v).enumerate() {
                let c = |k: usize| (row * 7 + k * 13) % v;
                match row % 9 {
                    // A tie at two columns: the lower one wins.
                    1 => {
                        let (a, bb) = (c(1), c(2));
                        xs[a] = 9.0;
                        xs[bb] = 9.0;
                    }
                    // NaN everywhere but one column.
                    2 => {
                        xs.iter_mut().for_each(|e| *e = f32::NAN);
                        xs[c(3)] = -1.0;
                    }
                    3 => xs.iter_mut().for_each(|e| *e = f32::NEG_INFINITY),
                    4 => xs.iter_mut().for_each(|e| *e = f32::NAN),
                    5 => xs[v - 1] = 50.0,
                    6 => {
                        xs[c(4)] = f32::INFINITY;
                        xs[c(5)] = f32::NAN;
                    }
                    // −∞ and NaN only.
                    7 => xs.iter_mut().enumerate().for_each(|(k, e)| {
                        *e = if k % 2 == 0 {
                            f32::NAN
                        } else {
                            f32::NEG_INFINITY
                        }
                    }),
                    _ => {}
                }
            }
            let t = Tensor::from_f32(&dev, &x, &[r, v], DType::F32)?;
            let got = compute::argmax(&t)?.to_i32_vec()?;
            let want: Vec<i32> = x
                .chunks(v)
                .map(|row| polyattn::runner::argmax(row) as i32)
                .collect();
            match (0..r).find(|&i| got[i] != want[i]) {
                None => Ok(()),
                Some(i) => Err(fail(format!(
                    "row {i} (kind {}): argmax {} on the device, {} on the host",
                    i % 9,
                    got[i],
                    want[i]
                ))),
            }
        },
    );
}

/// The sampling rule in f64, written here from its statement in `compute::sample`'s docs:
/// the token, and whether moving the nucleus goal or the draw by `eps` (relative) changes
/// it — where f32 sums may go either way.
fn reference_sample(row: &[f32], s: &compute::SamplingRow, eps: f64) -> (i32, bool) {
    let finite_max = row
        .iter()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if s.temperature.is_nan() || s.temperature <= 0.0 || !finite_max.is_finite() {
        return (polyattn::runner::argmax(row) as i32, false);
    }
    let m = f64::from(finite_max);
    let p: Vec<f64> = row
        .iter()
        .map(|&x| {
            if x > f32::NEG_INFINITY {
                ((f64::from(x) - m) / f64::from(s.temperature)).exp()
            } else {
                0.0
            }
        })
        .collect();
    let total: f64 = p.iter().sum();
    let mut sorted = p.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let u = f64::from(if s.uniform >= 0.0 {
        s.uniform.min(1.0)
    } else {
        0.0
    });
    // The token for the goal and the draw scaled by (1 + dg) and (1 + dt).
    let pick = |dg: f64, dt: f64| -> i32 {
        let mut threshold = 0.0;
        if s.top_p < 1.0 {
            // The largest value whose mass of p ≥ it reaches the goal.
            let goal = f64::from(s.top_p) * total * (1.0 + dg);
            let mut mass = 0.0;
            threshold = sorted[0];
            for &q in &sorted {
                threshold = q;
                mass += q;
                if mass >= goal {
                    break;
                }
            }
        }
        let kept = |q: f64| q >= threshold && q > 0.0;
        let mass: f64 = p.iter().copied().filter(|&q| kept(q)).sum();
        let target = u * mass * (1.0 + dt);
        let mut acc = 0.0;
        let mut last = 0;
        for (i, &q) in p.iter().enumerate().filter(|&(_, &q)| kept(q)) {
            acc += q;
            last = i as i32;
            if acc > target {
                return last;
            }
        }
        last
    };
    let want = pick(0.0, 0.0);
    let ambiguous = [-eps, 0.0, eps]
        .iter()
        .flat_map(|&dg| [-eps, 0.0, eps].map(|dt| (dg, dt)))
        .any(|(dg, dt)| pick(dg, dt) != want);
    (want, ambiguous)
}

/// `compute::sample` against the rule in f64 on random logits at several temperatures and
/// top-p values (0: only the largest logits; 1: everything), random draws, and rows the
/// rule sends elsewhere: temperature 0 / negative / NaN (greedy), logits with NaN and −∞
/// entries, a +∞ logit or only −∞ (greedy), a draw of NaN, below 0 or 1 and above (clamped).
/// Draws within 1e-4 of a boundary (of the running mass or the nucleus threshold) are not
/// compared; most are. Widths: one, around the kernels' thread counts, and SmolLM2's.
#[test]
fn sample_follows_the_rule() {
    let shapes: &[(usize, usize)] = &[(6, 1), (40, 255), (40, 1025), (24, 49152)];
    for_each_case(
        "compute::sample",
        shapes,
        |&(r, v)| CaseInfo::plain(format!("R{r} V{v}")),
        |b, &(r, v)| {
            let dev = b.device()?;
            let mut rng = Rng::new((r * 17 + v) as u64);
            let mut x = rng.normals(r * v);
            let mut rows = Vec::with_capacity(r);
            for (i, xs) in x.chunks_mut(v).enumerate() {
                let scale = [1.0f32, 3.0, 8.0][i % 3];
                xs.iter_mut().for_each(|e| *e *= scale);
                let mut row = compute::SamplingRow {
                    temperature: [0.7f32, 1.0, 1.6][i % 3],
                    top_p: [0.9f32, 1.0, 0.5, 0.0, 0.99][i % 5],
                    uniform: rng.uniform() as f32,
                };
                match i % 13 {
                    1 => row.temperature = 0.0,
                    2 => row.temperature = -1.0,
                    3 => row.temperature = f32::NAN,
                    4 => {
                        xs.iter_mut().step_by(3).for_each(|e| *e = f32::NAN);
                        xs.iter_mut()
                            .skip(1)
                            .step_by(5)
                            .for_each(|e| *e = f32::NEG_INFINITY);
                        if let Some(e) = xs.iter_mut().find(|e| e.is_finite()) {
                            *e = 20.0;
                        }
                    }
                    5 => xs[v / 2] = f32::INFINITY,
                    6 => xs.iter_mut().for_each(|e| *e = f32::NEG_INFINITY),
                    7 => row.uniform = f32::NAN,
                    8 => row.uniform = -0.5,
                    9 => row.uniform = 1.0,
                    10 => row.uniform = 3.0,
                    _ => {}
                }
                rows.push(row);
            }
            let t = Tensor::from_f32(&dev, &x, &[r, v], DType::F32)?;
            let st = compute::SamplingRow::tensor(&dev, &rows)?;
            let got = compute::sample(&t, &st)?.to_i32_vec()?;
            let mut compared = 0;
            for (i, (xs, s)) in x.chunks(v).zip(&rows).enumerate() {
                let (want, ambiguous) = reference_sample(xs, s, 1e-4);
                if ambiguous {
                    continue;
                }
                compared += 1;
                ensure(got[i] == want, || {
                    format!(
                        "row {i} ({s:?}): sampled {} on the device, {want} by the rule",
                        got[i]
                    )
                })?;
            }
            ensure(compared * 4 >= r * 3, || {
                format!("only {compared} of {r} rows were far enough from a boundary to compare")
            })
        },
    );
}

/// `compute::sample` draws the nucleus distribution: N rows of the same logits with
/// stratified draws (k + ½) / N pick each kept token q_i·N times (±2), where q is the
/// softmax renormalised over the nucleus, computed here independently of any sampler, and
/// never a token outside it.
#[test]
fn sample_draws_the_nucleus_distribution() {
    let cases: &[(usize, f32, f32)] = &[(64, 1.0, 0.8), (300, 0.5, 0.95), (300, 2.0, 1.0)];
    for_each_case(
        "compute::sample distribution",
        cases,
        |&(v, t, p)| CaseInfo::plain(format!("V{v} T{t} top_p {p}")),
        |b, &(v, temperature, top_p)| {
            let dev = b.device()?;
            let n = 2000;
            let logits = Rng::new(v as u64).normals(v);
            let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let p: Vec<f64> = logits
                .iter()
                .map(|&x| ((f64::from(x) - f64::from(m)) / f64::from(temperature)).exp())
                .collect();
            let total: f64 = p.iter().sum();
            let mut order: Vec<usize> = (0..v).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
            let mut nucleus = vec![false; v];
            let mut mass = 0.0;
            for &i in &order {
                nucleus[i] = true;
                mass += p[i];
                if mass >= f64::from(top_p) * total {
                    break;
                }
            }
            let x: Vec<f32> = (0..n).flat_map(|_| logits.iter().copied()).collect();
            let rows: Vec<compute::SamplingRow> = (0..n)
                .map(|k| compute::SamplingRow {
                    temperature,
                    top_p,
                    uniform: ((k as f64 + 0.5) / n as f64) as f32,
                })
                .collect();
            let t = Tensor::from_f32(&dev, &x, &[n, v], DType::F32)?;
            let got = compute::sample(&t, &compute::SamplingRow::tensor(&dev, &rows)?)?;
            let mut counts = vec![0usize; v];
            for &g in &got.to_i32_vec()? {
                ensure(g >= 0 && (g as usize) < v && nucleus[g as usize], || {
                    format!("sampled token {g}, outside the nucleus")
                })?;
                counts[g as usize] += 1;
            }
            for i in (0..v).filter(|&i| nucleus[i]) {
                let want = p[i] / mass * n as f64;
                ensure((counts[i] as f64 - want).abs() <= 2.0, || {
                    format!("token {i} drawn {} times of {n}, want {want:.1}", counts[i])
                })?;
            }
            Ok(())
        },
    );
}

/// The `_into` forms write every element of their output: an output full of NaN before the
/// call holds exactly what the allocating form returns after it.
#[test]
fn into_forms_overwrite_their_output() {
    for_each_case(
        "compute::*_into",
        &[(5usize, 96usize), (1, 576)],
        |&(t, h)| CaseInfo::plain(format!("T{t} H{h}")),
        |b, &(t, h)| {
            let dev = b.device()?;
            let mut rng = Rng::new((t * 5 + h) as u64);
            let f = |rng: &mut Rng, shape: &[usize]| {
                Tensor::from_f32(
                    &dev,
                    &rng.normals(shape.iter().product()),
                    shape,
                    DType::F32,
                )
            };
            let nan = |shape: &[usize]| {
                Tensor::from_f32(
                    &dev,
                    &vec![f32::NAN; shape.iter().product()],
                    shape,
                    DType::F32,
                )
            };
            let same = |what: &str, a: &Tensor, b: &Tensor| -> Outcome {
                let (a, b) = (a.to_f32_vec()?, b.to_f32_vec()?);
                ensure(
                    a.iter()
                        .map(|x| x.to_bits())
                        .eq(b.iter().map(|x| x.to_bits())),
                    || format!("{what}: the _into form differs from the allocating form"),
                )
            };
            let x = f(&mut rng, &[t, h])?;
            let w = f(&mut rng, &[h])?;
            let wl = f(&mut rng, &[40, h])?;
            let ids = Tensor::from_i32(&dev, &(0..t as i32).rev().collect::<Vec<_>>(), &[t])?;

            let mut out = nan(&[t, h])?;
            compute::rms_norm_into(&x, &w, 1e-5, &mut out)?;
            same("rms_norm", &out, &compute::rms_norm(&x, &w, 1e-5)?)?;
            let mut out = nan(&[t, 40])?;
            compute::linear_into(&x, &wl, &mut out)?;
            same("linear", &out, &compute::linear(&x, &wl)?)?;
            let up = f(&mut rng, &[t, h])?;
            let mut out = nan(&[t, h])?;
            compute::silu_mul_into(&x, &up, &mut out)?;
            same("silu_mul", &out, &compute::silu_mul(&x, &up)?)?;
            let mut out = nan(&[t, h])?;
            compute::embedding_into(&x, &ids, &mut out)?;
            same("embedding", &out, &compute::embedding(&x, &ids)?)?;
            let mut out = nan(&[t, h])?;
            compute::gather_rows_into(&x, &ids, &mut out)?;
            same("gather_rows", &out, &compute::gather_rows(&x, &ids)?)?;
            let mut out = Tensor::from_i32(&dev, &vec![-7; t], &[t])?;
            compute::argmax_into(&x, &mut out)?;
            ensure(
                out.to_i32_vec()? == compute::argmax(&x)?.to_i32_vec()?,
                || "argmax: the _into form differs from the allocating form".into(),
            )?;
            let rows: Vec<compute::SamplingRow> = (0..t)
                .map(|i| compute::SamplingRow {
                    temperature: 1.0,
                    top_p: 0.9,
                    uniform: (i as f32 + 0.5) / t as f32,
                })
                .collect();
            let rows = compute::SamplingRow::tensor(&dev, &rows)?;
            let mut out = Tensor::from_i32(&dev, &vec![-7; t], &[t])?;
            compute::sample_into(&x, &rows, &mut out)?;
            ensure(
                out.to_i32_vec()? == compute::sample(&x, &rows)?.to_i32_vec()?,
                || "sample: the _into form differs from the allocating form".into(),
            )?;
            // A wrong output shape is a typed error, never a partial write.
            let mut bad = nan(&[t + 1, h])?;
            ensure(
                compute::rms_norm_into(&x, &w, 1e-5, &mut bad).is_err(),
                || "rms_norm_into accepted an output of the wrong shape".into(),
            )
        },
    );
}

/// The fused forms a model uses to launch fewer kernels compute exactly what their parts
/// compute: `linear_accumulate` = `add_assign` of `linear` (T on both sides of every GEMV /
/// tiled switch), `swiglu_into` of a stacked gate/up row = `silu_mul` of the halves, and
/// `rope_split_qkv_into` = copies of the heads rotated in place by `rope` (both pairings,
/// SmolLM2's 9 / 3 heads of 64 and a GQA-free 4 / 4 of 32).
#[test]
fn fused_ops_equal_their_parts() {
    let cases: &[(usize, usize, usize, usize, usize)] = &[
        // (tokens, query heads, kv heads, head size, intermediate)
        (1, 9, 3, 64, 96),
        (5, 4, 4, 32, 37),
        (16, 9, 3, 64, 96),
        (17, 4, 4, 32, 37),
    ];
    for_each_case(
        "compute fused ops",
        cases,
        |&(t, h, hk, d, i)| CaseInfo::plain(format!("T{t} H{h}/{hk} d{d} I{i}")),
        |b, &(t, h, hk, d, i)| {
            let dev = b.device()?;
            let mut rng = Rng::new((t * 7 + h * 3 + i) as u64);
            let same = |what: &str, a: &Tensor, b: &Tensor| -> Outcome {
                let (a, b) = (a.to_f32_vec()?, b.to_f32_vec()?);
                ensure(
                    a.len() == b.len()
                        && a.iter()
                            .map(|x| x.to_bits())
                            .eq(b.iter().map(|x| x.to_bits())),
                    || format!("{what}: the fused form differs from its parts"),
                )
            };
            let up = |rng: &mut Rng, shape: &[usize]| {
                Tensor::from_f32(
                    &dev,
                    &rng.normals(shape.iter().product()),
                    shape,
                    DType::F32,
                )
            };

            // linear_accumulate
            let k = 96;
            let x = up(&mut rng, &[t, k])?;
            let w = up(&mut rng, &[40, k])?;
            let mut y = up(&mut rng, &[t, 40])?;
            let mut want = y.clone();
            compute::add_assign(&mut want, &compute::linear(&x, &w)?)?;
            compute::linear_accumulate(&x, &w, &mut y)?;
            same("linear_accumulate", &y, &want)?;

            // swiglu_into
            let g = rng.normals(t * i);
            let u = rng.normals(t * i);
            let gu: Vec<f32> = (0..t)
                .flat_map(|r| g[r * i..(r + 1) * i].iter().chain(&u[r * i..(r + 1) * i]))
                .copied()
                .collect();
            let gut = Tensor::from_f32(&dev, &gu, &[t, 2 * i], DType::F32)?;
            let mut out = Tensor::from_f32(&dev, &vec![f32::NAN; t * i], &[t, i], DType::F32)?;
            compute::swiglu_into(&gut, &mut out)?;
            let want = compute::silu_mul(
                &Tensor::from_f32(&dev, &g, &[t, i], DType::F32)?,
                &Tensor::from_f32(&dev, &u, &[t, i], DType::F32)?,
            )?;
            same("swiglu_into", &out, &want)?;

            // rope_split_qkv_into
            let row = (h + 2 * hk) * d;
            let qkv = rng.normals(t * row);
            let qkvt = Tensor::from_f32(&dev, &qkv, &[t, row], DType::F32)?;
            let pos: Vec<i32> = (0..t).map(|j| (j * 37 + 1000 * (t % 3)) as i32).collect();
            let post = Tensor::from_i32(&dev, &pos, &[t])?;
            let part = |first: usize, heads: usize| -> Vec<f32> {
                (0..t)
                    .flat_map(|r| qkv[r * row + first * d..][..heads * d].to_vec())
                    .collect()
            };
            for style in [RopeStyle::Interleaved, RopeStyle::HalfSplit] {
                let rope = Rope {
                    base: 10000.0,
                    style,
                };
                let nan = |heads: usize| {
                    Tensor::from_f32(
                        &dev,
                        &vec![f32::NAN; t * heads * d],
                        &[t, heads, d],
                        DType::F32,
                    )
                };
                let (mut q, mut kk, mut v) = (nan(h)?, nan(hk)?, nan(hk)?);
                compute::rope_split_qkv_into(&qkvt, &post, rope, &mut q, &mut kk, &mut v)?;
                let mut wq = Tensor::from_f32(&dev, &part(0, h), &[t, h, d], DType::F32)?;
                let mut wk = Tensor::from_f32(&dev, &part(h, hk), &[t, hk, d], DType::F32)?;
                let wv = Tensor::from_f32(&dev, &part(h + hk, hk), &[t, hk, d], DType::F32)?;
                compute::rope(&mut wq, &post, rope)?;
                compute::rope(&mut wk, &post, rope)?;
                same("rope_split_qkv q", &q, &wq)?;
                same("rope_split_qkv k", &kk, &wk)?;
                same("rope_split_qkv v", &v, &wv)?;
            }
            Ok(())
        },
    );
}

/// (tokens, in_features, query heads, kv heads, head size, intermediate) of
/// `linear_fused_matches_reference`: T either side of the GPU kernels' GEMV widths (4 / 5,
/// 8 / 9, 16 / 17) and well into the tiled form; K = SmolLM2's 576 (vector loads) and odd
/// widths (scalar loads); head layouts of SmolLM2 (9 / 3 of 64) and small GQA ones.
/// (T, K, H, Hk, d, I): tokens, in features, head layout, MLP width.
type FusedShape = (usize, usize, usize, usize, usize, usize);

const FUSED_SHAPES: &[FusedShape] = &[
    (1, 576, 9, 3, 64, 1536),
    (4, 35, 4, 2, 8, 37),
    (5, 576, 9, 3, 64, 96),
    (8, 35, 4, 2, 8, 37),
    (9, 576, 4, 4, 32, 40),
    (16, 35, 9, 3, 64, 37),
    (17, 576, 9, 3, 64, 96),
    (64, 35, 4, 2, 8, 37),
    (130, 96, 2, 1, 16, 200),
];

/// `x / sqrt(mean(x²) + eps) · g` per row, in f64, or `x` itself without a norm.
fn normed_rows(x: &[f32], g: Option<(&[f32], f32)>, t: usize, k: usize) -> Vec<f64> {
    let mut h: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    if let Some((g, eps)) = g {
        for row in h.chunks_mut(k).take(t) {
            let ms = row.iter().map(|a| a * a).sum::<f64>() / k as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            for (v, &gi) in row.iter_mut().zip(g) {
                *v *= inv * gi as f64;
            }
        }
    }
    h
}

/// Heads `first..first + count` of each token's row of `p [T, heads · d]` (a Q/K/V
/// projection, `heads` = H + 2·Hk), rotated by the token's position with base 10000 in
/// `style`'s pairing where given, in f64: `[T, count, d]`.
fn rotated_heads(
    p: &[f64],
    pos: &[i32],
    (heads, d): (usize, usize),
    (first, count): (usize, usize),
    style: Option<RopeStyle>,
) -> Vec<f64> {
    let (row, half) = (heads * d, d / 2);
    let mut out = Vec::with_capacity(pos.len() * count * d);
    for (r, &ps) in pos.iter().enumerate() {
        for hh in first..first + count {
            let src = &p[r * row + hh * d..][..d];
            let mut dst = src.to_vec();
            if let Some(style) = style {
                for pi in 0..half {
                    let a = ps as f64 * 10000f64.powf(-2.0 * pi as f64 / d as f64);
                    let (ia, ib) = match style {
                        RopeStyle::Interleaved => (2 * pi, 2 * pi + 1),
                        RopeStyle::HalfSplit => (pi, pi + half),
                    };
                    dst[ia] = src[ia] * a.cos() - src[ib] * a.sin();
                    dst[ib] = src[ia] * a.sin() + src[ib] * a.cos();
                }
            }
            out.extend(dst);
        }
    }
    out
}

/// The tolerance of rotated heads: angles of positions in the thousands carry ~1e-4 rad of
/// f32 rounding on a GPU (rope_matches_reference's tolerance).
const ROTATED: Tolerance = Tolerance {
    atol: 2e-3,
    rtol: 1e-3,
};

/// `h [T, K] · w [N, K]ᵀ` in f64.
fn product(h: &[f64], w: &[f32], t: usize, k: usize, n: usize) -> Vec<f64> {
    let mut p = vec![0.0f64; t * n];
    for i in 0..t {
        for j in 0..n {
            p[i * n + j] = (0..k).map(|c| h[i * k + c] * w[j * k + c] as f64).sum();
        }
    }
    p
}

/// `compute::linear_fused` with f16 and bf16 weights (widened as they are read): stored,
/// accumulated and SwiGLU forms, with and without the input norm, against the f64 product of
/// the rounded weights, at every shape of the f32 test (T either side of 4-token passes and
/// of the GEMV / tiled switch, K not a multiple of 8 nor of 4), on every device.
#[test]
fn linear_with_16_bit_weights_matches_reference() {
    let cases: Vec<(DType, FusedShape)> = [DType::F16, DType::Bf16]
        .into_iter()
        .flat_map(|dt| FUSED_SHAPES.iter().map(move |&s| (dt, s)))
        .collect();
    for_each_case(
        "compute::linear_fused 16-bit weights",
        &cases,
        |&(dt, (t, k, _, _, _, i))| CaseInfo::plain(format!("{dt} weights T{t} K{k} I{i}")),
        |b, &(dt, (t, k, _, _, _, i))| {
            let dev = b.device()?;
            let mut rng = Rng::new((t * 7919 + k * 31 + i) as u64);
            let f32t = |v: &[f32], shape: &[usize]| Tensor::from_f32(&dev, v, shape, DType::F32);
            let x: Vec<f32> = rng.normals(t * k).iter().map(|v| 3.0 * v + 0.5).collect();
            let g: Vec<f32> = rng.normals(k).iter().map(|v| 1.0 + 0.5 * v).collect();
            let (xt, gt) = (f32t(&x, &[t, k])?, f32t(&g, &[k])?);
            let n = 2 * i;
            let s = 1.0 / (k as f32).sqrt();
            let w: Vec<f32> = rng.normals(n * k).iter().map(|v| v * s).collect();
            let wt = Tensor::from_f32(&dev, &w, &[n, k], dt)?;
            // The weights as the tensor holds them.
            let wr = wt.to_f32_vec()?;
            ensure(wr != w, || format!("{dt} rounding changed no weight"))?;
            for with_norm in [false, true] {
                let norm = with_norm.then_some(compute::InputNorm {
                    weight: &gt,
                    eps: 1e-5,
                });
                let hx = normed_rows(&x, with_norm.then_some((g.as_slice(), 1e-5)), t, k);
                let p = product(&hx, &wr, t, k, n);
                let mut out = f32t(&vec![f32::NAN; t * n], &[t, n])?;
                compute::linear_fused(&xt, norm, &wt, compute::LinearOutput::Store(&mut out))?;
                check(&format!("{dt} store norm {with_norm}"), &out, &p)?;
                let y0 = rng.normals(t * n);
                let mut y = f32t(&y0, &[t, n])?;
                compute::linear_fused(&xt, norm, &wt, compute::LinearOutput::Accumulate(&mut y))?;
                let want: Vec<f64> = p.iter().zip(&y0).map(|(p, &y)| p + y as f64).collect();
                check(&format!("{dt} accumulate norm {with_norm}"), &y, &want)?;
                let mut out = f32t(&vec![f32::NAN; t * i], &[t, i])?;
                compute::linear_fused(&xt, norm, &wt, compute::LinearOutput::SwiGlu(&mut out))?;
                let want: Vec<f64> = (0..t * i)
                    .map(|e| {
                        let (r, c) = (e / i, e % i);
                        let (gv, uv) = (p[r * n + c], p[r * n + i + c]);
                        gv / (1.0 + (-gv).exp()) * uv
                    })
                    .collect();
                check(&format!("{dt} swiglu norm {with_norm}"), &out, &want)?;
                // An odd number of rows (and, at odd K, an odd element count: the last weight
                // is the low half of the buffer's last word; the CPU's row pairs end on a
                // single row).
                let no = 2 * i + 1;
                let wo: Vec<f32> = rng.normals(no * k).iter().map(|v| v * s).collect();
                let wo = Tensor::from_f32(&dev, &wo, &[no, k], dt)?;
                let want = product(&hx, &wo.to_f32_vec()?, t, k, no);
                let mut out = f32t(&vec![f32::NAN; t * no], &[t, no])?;
                compute::linear_fused(&xt, norm, &wo, compute::LinearOutput::Store(&mut out))?;
                check(&format!("{dt} odd rows norm {with_norm}"), &out, &want)?;
            }
            Ok(())
        },
    );
}

/// Every f16 and bf16 bit pattern through `compute::linear` as the weight of a one-hot input
/// (K = 1, the scalar loads; K = 4 with the pattern in column 0, the vector loads): the
/// product is the weight itself, so each device must widen zeros, subnormals, normals,
/// ±inf and NaN as `half` does (any NaN matches any NaN; ±0 match each other, as the
/// accumulation starts from +0). bf16 subnormals are left out: a device may flush them in the
/// multiply.
#[test]
fn every_16_bit_weight_pattern_widens_as_half_does() {
    common::for_each_backend("compute::linear 16-bit patterns", |b| {
        let dev = b.device()?;
        for dt in [DType::F16, DType::Bf16] {
            let bits: Vec<u16> = (0..=u16::MAX)
                .filter(|&h| dt == DType::F16 || h & 0x7f80 != 0 || h & 0x7f == 0)
                .collect();
            let n = bits.len();
            let want: Vec<f32> = bits
                .iter()
                .map(|&h| match dt {
                    DType::F16 => half::f16::from_bits(h).to_f32(),
                    _ => half::bf16::from_bits(h).to_f32(),
                })
                .collect();
            for k in [1usize, 4] {
                let mut cells = vec![0u16; n * k];
                for (j, &h) in bits.iter().enumerate() {
                    cells[j * k] = h;
                }
                let storage = match dt {
                    DType::F16 => {
                        CpuStorage::F16(cells.iter().map(|&h| half::f16::from_bits(h)).collect())
                    }
                    _ => {
                        CpuStorage::Bf16(cells.iter().map(|&h| half::bf16::from_bits(h)).collect())
                    }
                };
                let w = Tensor::from_cpu_storage(&dev, storage, &[n, k], dt)?;
                let mut x = vec![0.0f32; k];
                x[0] = 1.0;
                let xt = Tensor::from_f32(&dev, &x, &[1, k], DType::F32)?;
                let got = compute::linear(&xt, &w)?.to_f32_vec()?;
                for (j, (&g, &e)) in got.iter().zip(&want).enumerate() {
                    let same = (g.is_nan() && e.is_nan()) || g == e;
                    ensure(same, || {
                        format!(
                            "{dt} K{k}: bits {:#06x} widened to {g:e}, want {e:e}",
                            bits[j]
                        )
                    })?;
                }
            }
        }
        Ok(())
    });
}

/// `compute::linear_fused` in every output form, with and without the input norm, against
/// f64 references of the separate operations; every output starts as NaN, so an element
/// left unwritten fails.
#[test]
fn linear_fused_matches_reference() {
    for_each_case(
        "compute::linear_fused",
        FUSED_SHAPES,
        |&(t, k, h, hk, d, i)| CaseInfo::plain(format!("T{t} K{k} H{h}/{hk} d{d} I{i}")),
        |b, &(t, k, h, hk, d, i)| {
            let dev = b.device()?;
            let mut rng = Rng::new((t * 1009 + k * 13 + i) as u64);
            let tensor = |v: &[f32], shape: &[usize]| Tensor::from_f32(&dev, v, shape, DType::F32);
            let nan = |shape: &[usize]| tensor(&vec![f32::NAN; shape.iter().product()], shape);
            let weight = |rng: &mut Rng, n: usize| -> Vec<f32> {
                let s = 1.0 / (k as f32).sqrt();
                rng.normals(n * k).iter().map(|v| v * s).collect()
            };
            let x: Vec<f32> = rng.normals(t * k).iter().map(|v| 3.0 * v + 0.5).collect();
            let g: Vec<f32> = rng.normals(k).iter().map(|v| 1.0 + 0.5 * v).collect();
            let (xt, gt) = (tensor(&x, &[t, k])?, tensor(&g, &[k])?);
            let eps = 1e-5f32;
            let pos: Vec<i32> = (0..t).map(|_| rng.below(3000) as i32).collect();
            let post = Tensor::from_i32(&dev, &pos, &[t])?;
            for with_norm in [false, true] {
                let norm = with_norm.then_some(compute::InputNorm { weight: &gt, eps });
                let hx = normed_rows(&x, with_norm.then_some((g.as_slice(), eps)), t, k);
                let label = if with_norm { "norm + " } else { "" };

                // Store, into an odd width.
                let n = 67;
                let w = weight(&mut rng, n);
                let mut out = nan(&[t, n])?;
                compute::linear_fused(
                    &xt,
                    norm,
                    &tensor(&w, &[n, k])?,
                    compute::LinearOutput::Store(&mut out),
                )?;
                check(&format!("{label}linear"), &out, &product(&hx, &w, t, k, n))?;

                // Accumulate onto random values.
                let y0 = rng.normals(t * n);
                let mut y = tensor(&y0, &[t, n])?;
                compute::linear_fused(
                    &xt,
                    norm,
                    &tensor(&w, &[n, k])?,
                    compute::LinearOutput::Accumulate(&mut y),
                )?;
                let want: Vec<f64> = product(&hx, &w, t, k, n)
                    .iter()
                    .zip(&y0)
                    .map(|(p, &y)| p + y as f64)
                    .collect();
                check(&format!("{label}linear accumulate"), &y, &want)?;

                // SwiGLU of a stacked gate / up weight.
                let w = weight(&mut rng, 2 * i);
                let mut out = nan(&[t, i])?;
                compute::linear_fused(
                    &xt,
                    norm,
                    &tensor(&w, &[2 * i, k])?,
                    compute::LinearOutput::SwiGlu(&mut out),
                )?;
                let p = product(&hx, &w, t, k, 2 * i);
                let want: Vec<f64> = (0..t * i)
                    .map(|e| {
                        let (r, c) = (e / i, e % i);
                        let (gv, uv) = (p[r * 2 * i + c], p[r * 2 * i + i + c]);
                        gv / (1.0 + (-gv).exp()) * uv
                    })
                    .collect();
                check(&format!("{label}swiglu"), &out, &want)?;

                // The split of a fused Q/K/V projection, rotated, in both pairings.
                let row = (h + 2 * hk) * d;
                let w = weight(&mut rng, row);
                let wt = tensor(&w, &[row, k])?;
                let p = product(&hx, &w, t, k, row);
                for style in [RopeStyle::Interleaved, RopeStyle::HalfSplit] {
                    let rope = Rope {
                        base: 10000.0,
                        style,
                    };
                    let (mut q, mut kk, mut v) =
                        (nan(&[t, h, d])?, nan(&[t, hk, d])?, nan(&[t, hk, d])?);
                    compute::linear_fused(
                        &xt,
                        norm,
                        &wt,
                        compute::LinearOutput::RopeSplitQkv {
                            positions: &post,
                            rope,
                            q: &mut q,
                            k: &mut kk,
                            v: &mut v,
                        },
                    )?;
                    let heads = |first: usize, count: usize, rotate: bool| {
                        rotated_heads(
                            &p,
                            &pos,
                            (h + 2 * hk, d),
                            (first, count),
                            rotate.then_some(style),
                        )
                    };
                    for (what, got, want, tolerance) in [
                        ("q", &q, heads(0, h, true), ROTATED),
                        ("k", &kk, heads(h, hk, true), ROTATED),
                        ("v", &v, heads(h + hk, hk, false), tol()),
                    ] {
                        let cmp = reference::compare(&got.to_f32_vec()?, &want, tolerance);
                        ensure(cmp.pass, || {
                            format!("{label}rope split {style:?} {what}: {cmp}")
                        })?;
                    }
                }
            }
            Ok(())
        },
    );
}

/// (tokens, in features, query heads, kv heads, head size, block size) of
/// `linear_into_the_cache_writes_the_slots`: decode and prefill token counts either side of
/// the GPU GEMV / tiled switch, SmolLM2's heads (9 / 3 of 64) and small GQA ones, blocks of
/// 1 to 32 tokens.
const CACHE_SHAPES: &[(usize, usize, usize, usize, usize, usize)] = &[
    (1, 576, 9, 3, 64, 16),
    (5, 576, 9, 3, 64, 16),
    (8, 35, 4, 2, 8, 4),
    (16, 35, 9, 3, 64, 32),
    (17, 576, 9, 3, 64, 16),
    (130, 96, 2, 1, 16, 1),
];

/// `compute::linear_fused` with the keys and values written into a KV cache
/// (`LinearOutput::RopeSplitQkvCache`), normed input, both pairings, both layouts: the
/// query as the f64 reference rotates it; each token's key (rotated) and value rows in its
/// slot; every other element of the cache, NaN before, still NaN (a token with slot −1 and
/// the slots no token names are not written). A device whose family cannot write the cache
/// (`fuses_cache_write` false) must refuse with an error.
#[test]
fn linear_into_the_cache_writes_the_slots() {
    for_each_case(
        "compute::linear_fused into the KV cache",
        CACHE_SHAPES,
        |&(t, k, h, hk, d, bs)| CaseInfo::plain(format!("T{t} K{k} H{h}/{hk} d{d} bs{bs}")),
        |b, &(t, k, h, hk, d, bs)| {
            let dev = b.device()?;
            let mut rng = Rng::new((t * 7919 + k * 31 + bs) as u64);
            let tensor = |v: &[f32], shape: &[usize]| Tensor::from_f32(&dev, v, shape, DType::F32);
            let row = (h + 2 * hk) * d;
            let x: Vec<f32> = rng.normals(t * k).iter().map(|v| 2.0 * v - 0.25).collect();
            let g: Vec<f32> = rng.normals(k).iter().map(|v| 1.0 + 0.5 * v).collect();
            let s = 1.0 / (k as f32).sqrt();
            let w: Vec<f32> = rng.normals(row * k).iter().map(|v| v * s).collect();
            let (xt, gt, wt) = (
                tensor(&x, &[t, k])?,
                tensor(&g, &[k])?,
                tensor(&w, &[row, k])?,
            );
            let eps = 1e-5f32;
            let p = product(&normed_rows(&x, Some((&g, eps)), t, k), &w, t, k, row);
            let pos: Vec<i32> = (0..t).map(|_| rng.below(3000) as i32).collect();
            let post = Tensor::from_i32(&dev, &pos, &[t])?;
            // Distinct slots in a shuffled order over two blocks more than the tokens need;
            // the middle token (of two or more) writes nothing.
            let num_blocks = t.div_ceil(bs) + 2;
            let mut free: Vec<i64> = (0..(num_blocks * bs) as i64).collect();
            let mut slots = Vec::with_capacity(t);
            for _ in 0..t {
                slots.push(free.swap_remove(rng.below(free.len())));
            }
            if t > 1 {
                slots[t / 2] = -1;
            }
            let batch = CommonAttentionMetadata::new(
                &dev,
                BatchDescription {
                    query_start_loc: (0..=t as i32).collect(),
                    seq_lens: vec![1; t],
                    block_table: slots
                        .iter()
                        .map(|&s| (s.max(0) as usize / bs) as i32)
                        .collect(),
                    max_blocks_per_req: 1,
                    slot_mapping: slots.clone(),
                    causal: true,
                    block_size: bs,
                    is_prefilling: None,
                },
            )?;
            let spec = KvCacheSpec {
                block_size: bs,
                num_kv_heads: hk,
                head_size: d,
                dtype: DType::F32,
                cache_dtype: CacheDType::Auto,
            };
            for layout in [KvLayout::Nhd, KvLayout::Hnd] {
                for style in [RopeStyle::Interleaved, RopeStyle::HalfSplit] {
                    let label = format!("{layout:?} {style:?}");
                    let mut cache = KvCache::with_layout(&dev, spec, num_blocks, layout)?;
                    let shape = cache.data().shape().to_vec();
                    *cache.data_mut() = tensor(&vec![f32::NAN; shape.iter().product()], &shape)?;
                    let fuses = compute::fuses_cache_write(&cache);
                    let mut q = tensor(&vec![f32::NAN; t * h * d], &[t, h, d])?;
                    let done = compute::linear_fused(
                        &xt,
                        Some(compute::InputNorm { weight: &gt, eps }),
                        &wt,
                        compute::LinearOutput::RopeSplitQkvCache {
                            positions: &post,
                            rope: Rope {
                                base: 10000.0,
                                style,
                            },
                            q: &mut q,
                            cache: &mut cache,
                            batch: &batch,
                        },
                    );
                    if !fuses {
                        ensure(done.is_err(), || {
                            format!("{label}: a cache the device cannot write was accepted")
                        })?;
                        continue;
                    }
                    done?;
                    let want_q = rotated_heads(&p, &pos, (h + 2 * hk, d), (0, h), Some(style));
                    let cmp = reference::compare(&q.to_f32_vec()?, &want_q, ROTATED);
                    ensure(cmp.pass, || format!("{label} q: {cmp}"))?;
                    let keys = rotated_heads(&p, &pos, (h + 2 * hk, d), (h, hk), Some(style));
                    let values = rotated_heads(&p, &pos, (h + 2 * hk, d), (h + hk, hk), None);
                    // The split into k / v tensors (what the attention layer's write copies
                    // into the cache): the cache rows must be its rows bit for bit.
                    let nan = |n: usize| tensor(&vec![f32::NAN; t * n * d], &[t, n, d]);
                    let (mut q2, mut k2, mut v2) = (nan(h)?, nan(hk)?, nan(hk)?);
                    compute::linear_fused(
                        &xt,
                        Some(compute::InputNorm { weight: &gt, eps }),
                        &wt,
                        compute::LinearOutput::RopeSplitQkv {
                            positions: &post,
                            rope: Rope {
                                base: 10000.0,
                                style,
                            },
                            q: &mut q2,
                            k: &mut k2,
                            v: &mut v2,
                        },
                    )?;
                    let bits = |t: &Tensor| -> polyattn::Result<Vec<u32>> {
                        Ok(t.to_f32_vec()?.iter().map(|v| v.to_bits()).collect())
                    };
                    let (split_k, split_v) = (bits(&k2)?, bits(&v2)?);
                    let host = cache.to_device(&polyattn::Device::cpu())?;
                    let data = host.data().to_f32_vec()?;
                    let mut written = vec![false; data.len()];
                    for (tok, &slot) in slots.iter().enumerate() {
                        let Ok(slot) = usize::try_from(slot) else {
                            continue;
                        };
                        for head in 0..hk {
                            let from = (tok * hk + head) * d;
                            for (kv, want, tolerance) in [(0, &keys, ROTATED), (1, &values, tol())]
                            {
                                let at = host.offset(slot / bs, kv, slot % bs, head);
                                let cmp = reference::compare(
                                    &data[at..at + d],
                                    &want[from..from + d],
                                    tolerance,
                                );
                                ensure(cmp.pass, || {
                                    format!("{label} token {tok} head {head} kv {kv}: {cmp}")
                                })?;
                                let split = if kv == 0 { &split_k } else { &split_v };
                                let same = data[at..at + d]
                                    .iter()
                                    .zip(&split[from..from + d])
                                    .all(|(a, b)| a.to_bits() == *b);
                                ensure(same, || {
                                    format!(
                                        "{label} token {tok} head {head} kv {kv}: not the \
                                         split's bits"
                                    )
                                })?;
                                written[at..at + d].iter_mut().for_each(|w| *w = true);
                            }
                        }
                    }
                    let stray = data
                        .iter()
                        .zip(&written)
                        .position(|(v, &w)| !w && !v.is_nan());
                    ensure(stray.is_none(), || {
                        format!("{label}: cache element {stray:?} no token owns was written")
                    })?;
                }
            }
            Ok(())
        },
    );
}

#[test]
fn bad_arguments_are_typed_errors() {
    let dev = polyattn::Device::cpu();
    let x = Tensor::from_f32(&dev, &[1.0; 12], &[3, 4], DType::F32).unwrap();
    let w = Tensor::from_f32(&dev, &[1.0; 10], &[2, 5], DType::F32).unwrap();
    let e = compute::linear(&x, &w).unwrap_err().to_string();
    assert!(e.contains("in_features"), "{e}");
    let wi = Tensor::from_i32(&dev, &[1; 8], &[2, 4]).unwrap();
    let e = compute::linear(&x, &wi).unwrap_err().to_string();
    assert!(e.contains("dtype i32"), "{e}");
    // 16-bit weights are taken on the CPU.
    let wh = Tensor::from_f32(&dev, &[1.0; 8], &[2, 4], DType::F16).unwrap();
    assert_eq!(
        compute::linear(&x, &wh).unwrap().to_f32_vec().unwrap(),
        [4.0; 6]
    );
    let g = Tensor::from_f32(&dev, &[1.0; 4], &[4], DType::F32).unwrap();
    assert!(compute::rms_norm(&x, &g, -1.0).is_err());
    let ids = Tensor::from_i32(&dev, &[0, 3], &[2]).unwrap();
    let e = compute::embedding(&x, &ids).unwrap_err().to_string();
    assert!(e.contains("out of range"), "{e}");
    let mut q = Tensor::from_f32(&dev, &[1.0; 15], &[1, 3, 5], DType::F32).unwrap();
    let p = Tensor::from_i32(&dev, &[0], &[1]).unwrap();
    let rope = Rope {
        base: 10000.0,
        style: RopeStyle::Interleaved,
    };
    let e = compute::rope(&mut q, &p, rope).unwrap_err().to_string();
    assert!(e.contains("even head_size"), "{e}");
    let e = x.clone().reshape(&[5, 2]).unwrap_err().to_string();
    assert!(e.contains("10 elements"), "{e}");

    // linear_fused: an odd gate/up weight, a Q/K/V weight of the wrong height, a norm
    // weight of the wrong width; nothing is written.
    let w3 = Tensor::from_f32(&dev, &[1.0; 12], &[3, 4], DType::F32).unwrap();
    let mut o = Tensor::from_f32(&dev, &[7.0; 3], &[3, 1], DType::F32).unwrap();
    let e = compute::linear_fused(&x, None, &w3, compute::LinearOutput::SwiGlu(&mut o))
        .unwrap_err()
        .to_string();
    assert!(e.contains("even number of rows"), "{e}");
    let (mut qh, mut kh, mut vh) = (
        Tensor::from_f32(&dev, &[0.0; 6], &[3, 1, 2], DType::F32).unwrap(),
        Tensor::from_f32(&dev, &[0.0; 6], &[3, 1, 2], DType::F32).unwrap(),
        Tensor::from_f32(&dev, &[0.0; 6], &[3, 1, 2], DType::F32).unwrap(),
    );
    let p3 = Tensor::from_i32(&dev, &[0, 1, 2], &[3]).unwrap();
    let e = compute::linear_fused(
        &x,
        None,
        &w3,
        compute::LinearOutput::RopeSplitQkv {
            positions: &p3,
            rope,
            q: &mut qh,
            k: &mut kh,
            v: &mut vh,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("(H + 2·Hk)·d = 6"), "{e}");
    let g5 = Tensor::from_f32(&dev, &[1.0; 5], &[5], DType::F32).unwrap();
    let mut o2 = Tensor::from_f32(&dev, &[7.0; 9], &[3, 3], DType::F32).unwrap();
    let norm = Some(compute::InputNorm {
        weight: &g5,
        eps: 1e-5,
    });
    let e = compute::linear_fused(&x, norm, &w3, compute::LinearOutput::Store(&mut o2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rms_norm weight"), "{e}");
    assert_eq!(o2.to_f32_vec().unwrap(), vec![7.0; 9]);

    // Into the cache: x [3, 4] through a [6, 4] Q/K/V weight is 1 query head and 1 KV head
    // of size 2. A cache of 16-bit storage, a batch of another token count, block size or
    // more blocks than the cache holds: errors, and the cache untouched.
    let w6 = Tensor::from_f32(&dev, &[0.5; 24], &[6, 4], DType::F32).unwrap();
    let batch = |slots: Vec<i64>, block_size: usize| {
        let t = slots.len();
        CommonAttentionMetadata::new(
            &dev,
            BatchDescription {
                query_start_loc: (0..=t as i32).collect(),
                seq_lens: vec![1; t],
                block_table: slots
                    .iter()
                    .map(|&s| (s.max(0) as usize / block_size) as i32)
                    .collect(),
                max_blocks_per_req: 1,
                slot_mapping: slots,
                causal: true,
                block_size,
                is_prefilling: None,
            },
        )
        .unwrap()
    };
    let cache = |cache_dtype| {
        let spec = KvCacheSpec {
            block_size: 2,
            num_kv_heads: 1,
            head_size: 2,
            dtype: DType::F32,
            cache_dtype,
        };
        KvCache::with_layout(&dev, spec, 2, KvLayout::Nhd).unwrap()
    };
    let into = |cache: &mut KvCache, batch: &CommonAttentionMetadata| {
        let mut q = Tensor::from_f32(&dev, &[0.0; 6], &[3, 1, 2], DType::F32).unwrap();
        compute::linear_fused(
            &x,
            None,
            &w6,
            compute::LinearOutput::RopeSplitQkvCache {
                positions: &p3,
                rope,
                q: &mut q,
                cache,
                batch,
            },
        )
        .map_err(|e| e.to_string())
    };
    let mut c16 = cache(CacheDType::F16);
    let e = into(&mut c16, &batch(vec![0, 1, 2], 2)).unwrap_err();
    assert!(
        e.contains("storage f16") && e.contains("attention layer"),
        "{e}"
    );
    let mut c = cache(CacheDType::Auto);
    for (b, want) in [
        (
            batch(vec![0, 1], 2),
            "2 entries for the projection's 3 tokens",
        ),
        (batch(vec![0, 1, 2], 1), "blocks of 2 tokens"),
        (batch(vec![0, 1, 5], 2), "block 2"),
    ] {
        let e = into(&mut c, &b).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
    assert_eq!(c.data().to_f32_vec().unwrap(), vec![0.0; 16]);
    into(&mut c, &batch(vec![3, -1, 0], 2)).unwrap();
    let written = c.data().to_f32_vec().unwrap();
    assert_eq!(
        written.iter().filter(|v| **v != 0.0).count(),
        8,
        "{written:?}"
    );
}
