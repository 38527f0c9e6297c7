//! `polyattn::ops::merge_attn_states` on every available backend's device against the f64
//! reference merge, as vLLM's `test_merge_attn_states.py` does: about 10% `+inf` in each LSE
//! (an empty side), never at the same position in both, with and without
//! `prefill_tokens_with_context`, per-dtype tolerances.

#[macro_use]
mod common;

use common::{ensure, for_each_case, CaseInfo, Outcome};
use polyattn::reference;
use polyattn::testing::{Rng, Tolerance};
use polyattn::{ops, BackendRef, DType, Tensor};

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    num_tokens: usize,
    num_heads: usize,
    head_size: usize,
    prefill_tokens_with_context: Option<usize>,
    with_output_lse: bool,
    seed: u64,
}

impl Case {
    fn info(&self) -> CaseInfo {
        CaseInfo::plain(format!(
            "{} T{} H{} D{} prefill_tokens_with_context {:?} lse {} (seed {})",
            self.dtype,
            self.num_tokens,
            self.num_heads,
            self.head_size,
            self.prefill_tokens_with_context,
            self.with_output_lse,
            self.seed
        ))
    }
}

fn cases() -> Vec<Case> {
    let mut rng = Rng::new(4242);
    let mut out = Vec::new();
    // Head sizes that are multiples of 8 (the CUDA vector kernel) and one that is not (20:
    // the CUDA kernel that strides element by element).
    let shapes: [(usize, usize, usize); 6] = [
        (1, 4, 32),
        (39, 8, 64),
        (64, 4, 128),
        (17, 6, 48),
        (100, 2, 256),
        (33, 4, 20),
    ];
    let mut seed = 1u64;
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for &(t, h, d) in &shapes {
            let ptwc = match rng.below(3) {
                0 => None,
                1 => Some(t / 2),
                _ => Some(t.saturating_sub(1)),
            };
            out.push(Case {
                dtype,
                num_tokens: t,
                num_heads: h,
                head_size: d,
                prefill_tokens_with_context: ptwc,
                with_output_lse: !seed.is_multiple_of(4),
                seed,
            });
            seed += 1;
        }
    }
    out
}

fn run_case(backend: &BackendRef, c: &Case) -> Outcome {
    run_case_poisoned(backend, c, false)
}

/// One merge; with `poison_empty`, the output row of every empty side (LSE +inf) holds NaN /
/// ±inf on the device (the reference merges the clean rows): an empty side must not be read.
fn run_case_poisoned(backend: &BackendRef, c: &Case, poison_empty: bool) -> Outcome {
    let device = backend.device()?;
    let (t, h, d) = (c.num_tokens, c.num_heads, c.head_size);
    let mut rng = Rng::new(c.seed);
    let upload =
        |data: &[f32], shape: &[usize], dtype: DType| Tensor::from_f32(&device, data, shape, dtype);
    let prefix = upload(&rng.normals(t * h * d), &[t, h, d], c.dtype)?;
    let suffix = upload(&rng.normals(t * h * d), &[t, h, d], c.dtype)?;
    // LSEs: N(0, 3²) with ~10% +inf on each side, never both.
    let (mut lp, mut ls) = (vec![0.0f32; h * t], vec![0.0f32; h * t]);
    let mut infs = (0, 0);
    for i in 0..h * t {
        lp[i] = 3.0 * rng.normal();
        ls[i] = 3.0 * rng.normal();
        match rng.below(10) {
            0 => {
                lp[i] = f32::INFINITY;
                infs.0 += 1;
            }
            1 => {
                ls[i] = f32::INFINITY;
                infs.1 += 1;
            }
            _ => {}
        }
    }
    let prefix_lse = upload(&lp, &[h, t], DType::F32)?;
    let suffix_lse = upload(&ls, &[h, t], DType::F32)?;
    // What the reference merges: the rows as the device holds them before any poison.
    let (ref_prefix, ref_suffix) = (prefix.to_f32_vec()?, suffix.to_f32_vec()?);
    let (prefix, suffix) = if poison_empty {
        let poisons = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        // Tokens from prefill_tokens_with_context on copy the suffix verbatim: not poisoned.
        let merged = c.prefill_tokens_with_context.unwrap_or(t).min(t);
        let poisoned = |rows: &[f32], l: &[f32]| -> Vec<f32> {
            let mut v = rows.to_vec();
            for tok in 0..merged {
                for head in 0..h {
                    if l[head * t + tok] == f32::INFINITY {
                        let row = (tok * h + head) * d;
                        for (i, x) in v[row..row + d].iter_mut().enumerate() {
                            *x = poisons[(row + i) % 3];
                        }
                    }
                }
            }
            v
        };
        (
            upload(&poisoned(&ref_prefix, &lp), &[t, h, d], c.dtype)?,
            upload(&poisoned(&ref_suffix, &ls), &[t, h, d], c.dtype)?,
        )
    } else {
        (prefix, suffix)
    };
    const SENTINEL: f32 = 7.5;
    let mut output = upload(&vec![SENTINEL; t * h * d], &[t, h, d], c.dtype)?;
    let mut output_lse = upload(&vec![SENTINEL; h * t], &[h, t], DType::F32)?;

    ops::merge_attn_states(
        &mut output,
        &prefix,
        &prefix_lse,
        &suffix,
        &suffix_lse,
        c.with_output_lse.then_some(&mut output_lse),
        c.prefill_tokens_with_context,
    )?;
    device.synchronize()?;

    // The reference merges exactly what the device holds (inputs rounded to the dtype).
    let want = reference::merge_attn_states(
        &ref_prefix,
        &lp,
        &ref_suffix,
        &ls,
        t,
        h,
        d,
        c.prefill_tokens_with_context,
    )?;
    let got = output.to_f32_vec()?;
    let cmp = reference::compare(&got, &want.out, Tolerance::for_dtype(c.dtype));
    ensure(cmp.pass, || {
        format!(
            "output {cmp} (+inf LSEs: {} prefix, {} suffix)",
            infs.0, infs.1
        )
    })?;
    let got_lse = output_lse.to_f32_vec()?;
    if c.with_output_lse {
        let cmp = reference::compare(&got_lse, &want.lse, Tolerance::for_dtype(DType::F32));
        ensure(cmp.pass, || format!("output_lse {cmp}"))?;
    } else {
        ensure(got_lse.iter().all(|&x| x == SENTINEL), || {
            "output_lse was not asked for but was written".into()
        })?;
    }
    // The +inf entries must have been exercised, in both inputs, in the merged region.
    let merged = c.prefill_tokens_with_context.unwrap_or(t).min(t);
    let in_merged = |l: &[f32]| (0..h * t).any(|i| i % t < merged && l[i] == f32::INFINITY);
    ensure(t * h < 20 || (in_merged(&lp) && in_merged(&ls)), || {
        "the case has no +inf LSE in the merged region; it tests nothing of the rule".into()
    })
}

#[test]
fn merge_matches_reference() {
    for_each_case("merge_attn_states", &cases(), Case::info, run_case);
}

#[test]
fn an_empty_side_is_never_read() {
    // NaN / ±inf in the output rows of empty sides (as a kernel that wrote nothing there
    // would leave them) must not reach the merged output: excluded by selection, not by a
    // zero weight.
    for_each_case(
        "merge_attn_states_poisoned_empty",
        &cases(),
        Case::info,
        |b, c| run_case_poisoned(b, c, true),
    );
}

#[test]
fn plus_inf_means_empty_side() {
    // A hand-made case, pinned: prefix empty → suffix verbatim; suffix empty → prefix; equal
    // LSEs → average.
    common::for_each_backend("merge_attn_states_by_hand", |backend| {
        let device = backend.device()?;
        let (t, h, d) = (3, 1, 8);
        let op: Vec<f32> = (0..t * h * d).map(|i| i as f32).collect();
        let os: Vec<f32> = (0..t * h * d).map(|i| -(i as f32) - 1.0).collect();
        let lp = [f32::INFINITY, 0.25, 1.0];
        let ls = [2.0, f32::INFINITY, 1.0];
        let up = |x: &[f32], s: &[usize]| Tensor::from_f32(&device, x, s, DType::F32);
        let mut out = up(&vec![0.0; t * h * d], &[t, h, d])?;
        let mut lse = up(&[0.0; 3], &[h, t])?;
        ops::merge_attn_states(
            &mut out,
            &up(&op, &[t, h, d])?,
            &up(&lp, &[h, t])?,
            &up(&os, &[t, h, d])?,
            &up(&ls, &[h, t])?,
            Some(&mut lse),
            None,
        )?;
        let out = out.to_f32_vec()?;
        let lse = lse.to_f32_vec()?;
        ensure(out[..d] == os[..d], || format!("token 0: {:?}", &out[..d]))?;
        ensure(out[d..2 * d] == op[d..2 * d], || {
            format!("token 1: {:?}", &out[d..2 * d])
        })?;
        let avg: Vec<f32> = (2 * d..3 * d).map(|i| (op[i] + os[i]) / 2.0).collect();
        ensure(
            out[2 * d..]
                .iter()
                .zip(&avg)
                .all(|(a, b)| (a - b).abs() < 1e-6),
            || format!("token 2: {:?} vs {avg:?}", &out[2 * d..]),
        )?;
        ensure(
            lse[0] == 2.0 && lse[1] == 0.25 && (lse[2] - (1.0 + 2f32.ln())).abs() < 1e-6,
            || format!("lse {lse:?}"),
        )
    });
}

#[test]
fn shape_and_dtype_errors_are_typed() {
    common::for_each_backend("merge_attn_states_errors", |backend| {
        let device = backend.device()?;
        let z = |s: &[usize], dt| Tensor::zeros(&device, s, dt);
        let o = z(&[4, 2, 32], DType::F16)?;
        let l = z(&[2, 4], DType::F32)?;
        let mut out = z(&[4, 2, 32], DType::F16)?;
        let wrong_lse = z(&[4, 2], DType::F32)?;
        let r = ops::merge_attn_states(&mut out, &o, &wrong_lse, &o, &l, None, None);
        ensure(matches!(r, Err(polyattn::Error::Shape { .. })), || {
            format!("transposed LSE: {r:?}")
        })?;
        let mut out32 = z(&[4, 2, 32], DType::F32)?;
        let r = ops::merge_attn_states(&mut out32, &o, &l, &o, &l, None, None);
        ensure(matches!(r, Err(polyattn::Error::DType { .. })), || {
            format!("f32 output for f16 inputs: {r:?}")
        })?;
        let lse16 = z(&[2, 4], DType::F16)?;
        let r = ops::merge_attn_states(&mut out, &o, &lse16, &o, &l, None, None);
        ensure(matches!(r, Err(polyattn::Error::DType { .. })), || {
            format!("f16 LSE: {r:?}")
        })
    });
}
