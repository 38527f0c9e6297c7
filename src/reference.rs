//! The f64 reference every backend is tested against: dense attention, computed the obvious
//! way, one query row at a time.
//!
//! Nothing here is fast or clever, on purpose. For one query token at absolute position
//! `p = seq_len − query_len + i` and query head `h` (KV head `h / (H / Hkv)`):
//!
//! 1. `s_j = (q · k_j) · scale` for every key `j` of the sequence, in f64;
//! 2. the soft cap, if set: `s_j ← c · tanh(s_j / c)`;
//! 3. the ALiBi bias, if set: `s_j ← s_j − slope_h · |p − j|` (FlashAttention's form;
//!    `slope_h · (j − p)` for visible causal keys);
//! 4. the mask: key `j` is visible iff (`j ≤ p` or the attention is not causal) and
//!    (`|p − j| < W` or there is no window). For causal attention this is vLLM's decoder
//!    window `p − j < W`; for encoder and non-causal attention its symmetric window;
//! 5. a dense softmax over the visible keys plus, when the layer has sinks, one extra logit
//!    `sink_h` that joins the denominator and carries no value;
//! 6. `out = Σ_j softmax_j · v_j` and `lse = ln(Σ_j exp s_j + exp sink_h)` (natural log). A
//!    row that sees no key and has no sink gets output 0 and LSE `−inf`.
//!
//! [`attend`] does this for one request on plain slices (so it can be checked by hand);
//! [`attention`] does it for every request of a [`RandomBatch`], from the host copies of the
//! keys and values *as the cache stores them*. [`merge_attn_states`] is the f64 version of
//! vLLM's LSE merge and [`compare`] checks a backend's f32 results against any of these.

use crate::capability::AttentionType;
use crate::error::{Error, Result};
use crate::testing::{RandomBatch, Tolerance};

/// The layer parameters the reference needs, independent of any backend type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RefParams<'a> {
    /// Query heads (H).
    pub num_heads: usize,
    /// KV heads (Hkv); `num_heads` must be a multiple.
    pub num_kv_heads: usize,
    /// Head size (D).
    pub head_size: usize,
    /// Logit scale.
    pub scale: f64,
    /// Keys after the query's position are hidden.
    pub causal: bool,
    /// Sliding window W: a query sees keys with `|p − j| < W` (and `j ≤ p` when causal).
    pub sliding_window: Option<usize>,
    /// Logit soft cap c (`None` or ≤ 0: off).
    pub soft_cap: Option<f64>,
    /// ALiBi slope per query head.
    pub alibi_slopes: Option<&'a [f32]>,
    /// Sink logit per query head.
    pub sinks: Option<&'a [f32]>,
}

impl<'a> RefParams<'a> {
    /// Plain causal attention with `scale = head_size^-0.5` and no optional feature.
    pub fn new(num_heads: usize, num_kv_heads: usize, head_size: usize) -> Self {
        RefParams {
            num_heads,
            num_kv_heads,
            head_size,
            scale: 1.0 / (head_size as f64).sqrt(),
            causal: true,
            sliding_window: None,
            soft_cap: None,
            alibi_slopes: None,
            sinks: None,
        }
    }

    fn check(&self) -> Result<()> {
        let (h, hkv, d) = (self.num_heads, self.num_kv_heads, self.head_size);
        if h == 0 || hkv == 0 || d == 0 || h % hkv != 0 {
            return Err(Error::Config(format!(
                "reference: need num_heads ({h}) a positive multiple of num_kv_heads ({hkv}) \
                 and head_size ({d}) > 0"
            )));
        }
        for (what, v) in [("alibi_slopes", self.alibi_slopes), ("sinks", self.sinks)] {
            if let Some(v) = v {
                if v.len() != h {
                    return Err(Error::Config(format!(
                        "reference: {what} has {} entries for {h} heads",
                        v.len()
                    )));
                }
            }
        }
        if self.sliding_window == Some(0) {
            return Err(Error::Config("reference: sliding window 0".into()));
        }
        Ok(())
    }

    /// Whether a query at position `p` sees the key at position `j`.
    pub fn visible(&self, p: usize, j: usize) -> bool {
        let causal_ok = !self.causal || j <= p;
        let window_ok = self.sliding_window.is_none_or(|w| p.abs_diff(j) < w);
        causal_ok && window_ok
    }
}

/// Reference results: `out [T][H][D]` and `lse [H][T]` (natural log), both f64.
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceOutput {
    /// Query tokens (T).
    pub num_tokens: usize,
    /// Query heads (H).
    pub num_heads: usize,
    /// Head size (D).
    pub head_size: usize,
    /// Outputs, `[T][H][D]` row-major.
    pub out: Vec<f64>,
    /// Log-sum-exp of the logits (sink included), `[H][T]` row-major.
    pub lse: Vec<f64>,
}

/// Attention of one request, on plain slices.
///
/// `query` is `[Lq][H][D]`, `keys` and `values` are `[S][Hkv][D]` (all `S = seq_len` keys of
/// the sequence, context first); query token `i` sits at position `S − Lq + i`. Returns
/// `out [Lq][H][D]` and `lse [H][Lq]`.
pub fn attend(
    params: &RefParams<'_>,
    query: &[f32],
    keys: &[f32],
    values: &[f32],
) -> Result<ReferenceOutput> {
    params.check()?;
    let (h, hkv, d) = (params.num_heads, params.num_kv_heads, params.head_size);
    if !query.len().is_multiple_of(h * d)
        || !keys.len().is_multiple_of(hkv * d)
        || keys.len() != values.len()
    {
        return Err(Error::Config(format!(
            "reference: query has {} elements (rows of {}), keys {} and values {} (rows of {})",
            query.len(),
            h * d,
            keys.len(),
            values.len(),
            hkv * d
        )));
    }
    let lq = query.len() / (h * d);
    let s = keys.len() / (hkv * d);
    if lq > s {
        return Err(Error::Config(format!(
            "reference: {lq} query tokens but only {s} keys"
        )));
    }
    let group = h / hkv;
    let mut out = vec![0.0f64; lq * h * d];
    let mut lse = vec![0.0f64; h * lq];
    let mut logits: Vec<f64> = Vec::with_capacity(s + 1);
    for i in 0..lq {
        let p = s - lq + i;
        for head in 0..h {
            let kvh = head / group;
            let q = &query[(i * h + head) * d..][..d];
            // (key index, logit) of every visible key.
            let mut visible: Vec<(usize, f64)> = Vec::with_capacity(s);
            for j in 0..s {
                if !params.visible(p, j) {
                    continue;
                }
                let k = &keys[(j * hkv + kvh) * d..][..d];
                let mut sc = q
                    .iter()
                    .zip(k)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * params.scale;
                if let Some(c) = params.soft_cap.filter(|&c| c > 0.0) {
                    sc = c * (sc / c).tanh();
                }
                if let Some(slopes) = params.alibi_slopes {
                    sc -= slopes[head] as f64 * (p as f64 - j as f64).abs();
                }
                visible.push((j, sc));
            }
            logits.clear();
            logits.extend(visible.iter().map(|&(_, sc)| sc));
            if let Some(sinks) = params.sinks {
                logits.push(sinks[head] as f64);
            }
            let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let orow = &mut out[(i * h + head) * d..][..d];
            if m == f64::NEG_INFINITY {
                lse[head * lq + i] = f64::NEG_INFINITY;
                continue;
            }
            let z: f64 = logits.iter().map(|&x| (x - m).exp()).sum();
            for &(j, sc) in &visible {
                let w = (sc - m).exp() / z;
                let v = &values[(j * hkv + kvh) * d..][..d];
                for (o, &x) in orow.iter_mut().zip(v) {
                    *o += w * x as f64;
                }
            }
            lse[head * lq + i] = m + z.ln();
        }
    }
    Ok(ReferenceOutput {
        num_tokens: lq,
        num_heads: h,
        head_size: d,
        out,
        lse,
    })
}

/// The reference for a whole [`RandomBatch`]: `out [T][H][D]`, `lse [H][T]` over the batch's
/// `T` new tokens.
///
/// Decoder layers read every request's keys and values from the batch's host copies (as the
/// cache stores them, fp8 rounding included) and are causal when the batch metadata says so.
/// Encoder and encoder-only layers are bidirectional and read keys and values straight from
/// the batch's `key` / `value` tensors, as encoder attention does (no cache round trip).
pub fn attention(batch: &RandomBatch) -> Result<ReferenceOutput> {
    let p = &batch.case.params;
    if p.attn_type == AttentionType::EncoderDecoder {
        return Err(Error::Config(
            "reference: encoder_decoder attention is not modelled".into(),
        ));
    }
    let encoder = p.attn_type.is_encoder();
    let params = RefParams {
        num_heads: p.num_heads,
        num_kv_heads: p.num_kv_heads,
        head_size: p.head_size,
        scale: p.scale as f64,
        causal: batch.desc.causal && !encoder,
        sliding_window: p.sliding_window,
        soft_cap: p.soft_cap().map(f64::from),
        alibi_slopes: p.alibi_slopes.as_deref(),
        sinks: p.sinks.as_deref(),
    };
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_size);
    let t_all = batch.spec.num_tokens();
    let (enc_k, enc_v) = if encoder {
        (batch.key.to_f32_vec()?, batch.value.to_f32_vec()?)
    } else {
        (Vec::new(), Vec::new())
    };
    let mut out = vec![0.0f64; t_all * h * d];
    let mut lse = vec![0.0f64; h * t_all];
    let mut t0 = 0usize;
    for (r, &(q_len, s_len)) in batch.spec.requests.iter().enumerate() {
        let q = &batch.host_query[t0 * h * d..(t0 + q_len) * h * d];
        let (k, v) = if encoder {
            (
                &enc_k[t0 * hkv * d..(t0 + q_len) * hkv * d],
                &enc_v[t0 * hkv * d..(t0 + q_len) * hkv * d],
            )
        } else {
            (&batch.host_keys[r][..], &batch.host_values[r][..])
        };
        debug_assert_eq!(k.len(), if encoder { q_len } else { s_len } * hkv * d);
        let one = attend(&params, q, k, v)?;
        out[t0 * h * d..(t0 + q_len) * h * d].copy_from_slice(&one.out);
        for head in 0..h {
            lse[head * t_all + t0..][..q_len]
                .copy_from_slice(&one.lse[head * q_len..(head + 1) * q_len]);
        }
        t0 += q_len;
    }
    Ok(ReferenceOutput {
        num_tokens: t_all,
        num_heads: h,
        head_size: d,
        out,
        lse,
    })
}

/// vLLM's `merge_attn_states` (§6.2) in f64: combines two partial results over disjoint key
/// sets.
///
/// Outputs are `[T][H][D]`, LSEs `[H][T]` (natural log). Per (token, head): an LSE of `+inf`
/// is read as `−inf` (an empty side); `m = max(lse_p, lse_s)`, `a = exp(lse_p − m)`,
/// `b = exp(lse_s − m)`, `out = (a·o_p + b·o_s) / (a + b)`, `lse = m + ln(a + b)`. Tokens at or
/// after `prefill_tokens_with_context` copy the suffix (`out = o_s`, `lse = lse_s`, verbatim).
/// Both sides empty gives output 0 and LSE `−inf` (polyattn's rule; vLLM produces NaN there).
#[allow(clippy::too_many_arguments)]
pub fn merge_attn_states(
    prefix_output: &[f32],
    prefix_lse: &[f32],
    suffix_output: &[f32],
    suffix_lse: &[f32],
    num_tokens: usize,
    num_heads: usize,
    head_size: usize,
    prefill_tokens_with_context: Option<usize>,
) -> Result<ReferenceOutput> {
    let (t, h, d) = (num_tokens, num_heads, head_size);
    if prefix_output.len() != t * h * d
        || suffix_output.len() != t * h * d
        || prefix_lse.len() != h * t
        || suffix_lse.len() != h * t
    {
        return Err(Error::Config(format!(
            "reference merge: outputs need {} elements ([{t}][{h}][{d}]) and LSEs {} ([{h}][{t}])",
            t * h * d,
            h * t
        )));
    }
    let empty_if_plus_inf = |x: f32| {
        if x == f32::INFINITY {
            f64::NEG_INFINITY
        } else {
            x as f64
        }
    };
    let mut out = vec![0.0f64; t * h * d];
    let mut lse = vec![0.0f64; h * t];
    for tok in 0..t {
        for head in 0..h {
            let row = (tok * h + head) * d;
            let li = head * t + tok;
            let o = &mut out[row..row + d];
            let (op, os) = (&prefix_output[row..row + d], &suffix_output[row..row + d]);
            if prefill_tokens_with_context.is_some_and(|n| tok >= n) {
                for (x, &s) in o.iter_mut().zip(os) {
                    *x = s as f64;
                }
                lse[li] = suffix_lse[li] as f64;
                continue;
            }
            let (lp, ls) = (
                empty_if_plus_inf(prefix_lse[li]),
                empty_if_plus_inf(suffix_lse[li]),
            );
            let m = lp.max(ls);
            if m == f64::NEG_INFINITY {
                lse[li] = f64::NEG_INFINITY;
                continue;
            }
            let (a, b) = ((lp - m).exp(), (ls - m).exp());
            for ((x, &p), &s) in o.iter_mut().zip(op).zip(os) {
                *x = (a * p as f64 + b * s as f64) / (a + b);
            }
            lse[li] = m + (a + b).ln();
        }
    }
    Ok(ReferenceOutput {
        num_tokens: t,
        num_heads: h,
        head_size: d,
        out,
        lse,
    })
}

/// The outcome of [`compare`].
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Comparison {
    /// Elements compared.
    pub len: usize,
    /// Largest `|got − want|` over finite pairs (infinite if an infinity or NaN mismatched).
    pub max_abs: f64,
    /// Largest `|got − want| / |want|` over finite pairs with `want ≠ 0`.
    pub max_rel: f64,
    /// The element furthest outside (or closest to the edge of) the tolerance:
    /// largest `|got − want| / (atol + rtol·|want|)`; `None` when there are no elements.
    pub worst_index: Option<usize>,
    /// `got` at `worst_index`.
    pub worst_got: f64,
    /// `want` at `worst_index`.
    pub worst_want: f64,
    /// The tolerance used.
    pub tol: Tolerance,
    /// True when the lengths agree and every element is within tolerance.
    pub pass: bool,
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} over {} elements: max_abs {:.3e}, max_rel {:.3e} (atol {:.1e}, rtol {:.1e})",
            if self.pass { "PASS" } else { "FAIL" },
            self.len,
            self.max_abs,
            self.max_rel,
            self.tol.atol,
            self.tol.rtol
        )?;
        if let Some(i) = self.worst_index {
            write!(
                f,
                "; worst [{i}]: got {} want {}",
                self.worst_got, self.worst_want
            )?;
        }
        Ok(())
    }
}

/// Compares a backend's results with the reference: `|got − want| ≤ atol + rtol·|want|` for
/// every element. Equal infinities match; a NaN on either side never does; different lengths
/// fail.
pub fn compare(got: &[f32], want: &[f64], tol: Tolerance) -> Comparison {
    let mut c = Comparison {
        len: got.len().min(want.len()),
        max_abs: 0.0,
        max_rel: 0.0,
        worst_index: None,
        worst_got: 0.0,
        worst_want: 0.0,
        tol,
        pass: got.len() == want.len(),
    };
    let mut worst = f64::NEG_INFINITY;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        let (excess, ok) = if g.is_nan() || w.is_nan() {
            (f64::INFINITY, false)
        } else if g.is_infinite() || w.is_infinite() {
            if g == w {
                (0.0, true)
            } else {
                (f64::INFINITY, false)
            }
        } else {
            let diff = (g - w).abs();
            c.max_abs = c.max_abs.max(diff);
            if w != 0.0 {
                c.max_rel = c.max_rel.max(diff / w.abs());
            }
            let bound = tol.atol + tol.rtol * w.abs();
            (diff / bound, diff <= bound)
        };
        if !ok {
            c.pass = false;
            if excess.is_infinite() {
                c.max_abs = f64::INFINITY;
            }
        }
        if excess > worst {
            worst = excess;
            c.worst_index = Some(i);
            c.worst_got = g;
            c.worst_want = w;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: f64 = std::f64::consts::E;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12 * (1.0 + b.abs())
    }

    fn assert_all_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(close(g, w), "[{i}]: {g} vs {w} (all: {got:?} vs {want:?})");
        }
    }

    /// Two tokens, one head, D = 2, scale 1:
    /// q0 = (1, 0), q1 = (0, 1); k0 = (1, 0), k1 = (0, 2); v0 = (1, 2), v1 = (3, 4).
    /// Logits: q0·k0 = 1, q0·k1 = 0, q1·k0 = 0, q1·k1 = 2.
    const Q: [f32; 4] = [1.0, 0.0, 0.0, 1.0];
    const K: [f32; 4] = [1.0, 0.0, 0.0, 2.0];
    const V: [f32; 4] = [1.0, 2.0, 3.0, 4.0];

    fn p1() -> RefParams<'static> {
        RefParams {
            scale: 1.0,
            ..RefParams::new(1, 1, 2)
        }
    }

    /// Softmax-weighted value rows for logits (0, 2) over (v0, v1).
    fn mix(w0: f64, w1: f64) -> [f64; 2] {
        [w0 * 1.0 + w1 * 3.0, w0 * 2.0 + w1 * 4.0]
    }

    #[test]
    fn causal_prefill_by_hand() {
        let r = attend(&p1(), &Q, &K, &V).unwrap();
        // Token 0 (p = 0) sees only k0: out = v0, lse = 1.
        // Token 1 (p = 1) sees logits (0, 2): weights 1/(1+e²), e²/(1+e²).
        let z = 1.0 + E * E;
        let t1 = mix(1.0 / z, E * E / z);
        assert_all_close(&r.out, &[1.0, 2.0, t1[0], t1[1]]);
        assert_all_close(&r.lse, &[1.0, z.ln()]);
    }

    #[test]
    fn non_causal_sees_the_future() {
        let p = RefParams {
            causal: false,
            ..p1()
        };
        let r = attend(&p, &Q, &K, &V).unwrap();
        // Token 0 now sees logits (1, 0).
        let z = E + 1.0;
        let t0 = mix(E / z, 1.0 / z);
        assert_all_close(&r.out[..2], &t0);
        assert!(close(r.lse[0], z.ln()));
    }

    #[test]
    fn decode_query_sits_at_the_end() {
        // One query token (q1) against both keys: position 1, sees both.
        let r = attend(&p1(), &Q[2..], &K, &V).unwrap();
        let z = 1.0 + E * E;
        assert_all_close(&r.out, &mix(1.0 / z, E * E / z));
        assert_all_close(&r.lse, &[z.ln()]);
    }

    #[test]
    fn window_of_one_sees_only_itself() {
        let p = RefParams {
            sliding_window: Some(1),
            ..p1()
        };
        let r = attend(&p, &Q, &K, &V).unwrap();
        assert_all_close(&r.out, &[1.0, 2.0, 3.0, 4.0]);
        assert_all_close(&r.lse, &[1.0, 2.0]);
        // Symmetric when not causal: still only itself with W = 1 ...
        let r = attend(&RefParams { causal: false, ..p }, &Q, &K, &V).unwrap();
        assert_all_close(&r.lse, &[1.0, 2.0]);
        // ... and both neighbours with W = 2.
        let p = RefParams {
            causal: false,
            sliding_window: Some(2),
            ..p1()
        };
        assert!(p.visible(0, 1) && p.visible(1, 0) && !p.visible(0, 2));
        let causal = RefParams { causal: true, ..p };
        assert!(!causal.visible(0, 1) && causal.visible(1, 0) && !causal.visible(2, 0));
    }

    #[test]
    fn sink_joins_the_denominator_only() {
        let sinks = [0.0f32];
        let p = RefParams {
            sinks: Some(&sinks),
            ..p1()
        };
        let r = attend(&p, &Q, &K, &V).unwrap();
        // Token 0: logits (1) + sink 0: weight e/(e+1) on v0, lse ln(e+1).
        let z0 = E + 1.0;
        assert_all_close(&r.out[..2], &[E / z0, 2.0 * E / z0]);
        // Token 1: logits (0, 2) + sink 0: denominator 2 + e².
        let z1 = 2.0 + E * E;
        assert_all_close(&r.out[2..], &mix(1.0 / z1, E * E / z1));
        assert_all_close(&r.lse, &[z0.ln(), z1.ln()]);
    }

    #[test]
    fn soft_cap_then_alibi() {
        let slopes = [0.5f32];
        let p = RefParams {
            soft_cap: Some(1.0),
            alibi_slopes: Some(&slopes),
            ..p1()
        };
        let r = attend(&p, &Q, &K, &V).unwrap();
        // Token 0: tanh(1), bias 0.
        assert!(close(r.lse[0], 1f64.tanh()));
        // Token 1: key 0: tanh(0) − 0.5 = −0.5; key 1: tanh(2) + 0.
        let (a, b) = (-0.5f64, 2f64.tanh());
        let z = a.exp() + b.exp();
        assert_all_close(&r.out[2..], &mix(a.exp() / z, b.exp() / z));
        assert!(close(r.lse[1], z.ln()));
        // A cap of 0 is off.
        let off = attend(
            &RefParams {
                soft_cap: Some(0.0),
                ..p1()
            },
            &Q,
            &K,
            &V,
        )
        .unwrap();
        assert_eq!(off, attend(&p1(), &Q, &K, &V).unwrap());
    }

    #[test]
    fn gqa_maps_query_heads_to_kv_heads() {
        // Two query heads, identical queries; one KV head (MQA) vs two KV heads.
        let q = [1.0f32, 0.0, 1.0, 0.0];
        let k1 = [2.0f32, 0.0];
        let v1 = [5.0f32, 6.0];
        let p = RefParams {
            scale: 1.0,
            ..RefParams::new(2, 1, 2)
        };
        let r = attend(&p, &q, &k1, &v1).unwrap();
        assert_all_close(&r.out, &[5.0, 6.0, 5.0, 6.0]);
        assert_all_close(&r.lse, &[2.0, 2.0]);
        let k2 = [2.0f32, 0.0, 3.0, 0.0];
        let v2 = [5.0f32, 6.0, 7.0, 8.0];
        let p = RefParams {
            scale: 1.0,
            ..RefParams::new(2, 2, 2)
        };
        let r = attend(&p, &q, &k2, &v2).unwrap();
        assert_all_close(&r.out, &[5.0, 6.0, 7.0, 8.0]);
        assert_all_close(&r.lse, &[2.0, 3.0]);
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(attend(&p1(), &Q[..3], &K, &V).is_err());
        assert!(attend(&p1(), &Q, &K[..2], &V).is_err());
        let sinks = [0.0f32; 2];
        let p = RefParams {
            sinks: Some(&sinks),
            ..p1()
        };
        assert!(attend(&p, &Q, &K, &V).is_err());
        assert!(attend(&RefParams::new(3, 2, 2), &[0.0; 6], &[0.0; 4], &[0.0; 4]).is_err());
    }

    #[test]
    fn merge_by_hand() {
        // T = 2 tokens, H = 1, D = 2. Token 0: equal LSEs → average, lse + ln 2.
        // Token 1: prefix empty (+inf) → suffix verbatim.
        let op = [1.0f32, 2.0, 10.0, 20.0];
        let os = [3.0f32, 4.0, 30.0, 40.0];
        let lp = [0.5f32, f32::INFINITY];
        let ls = [0.5f32, -1.0];
        let r = merge_attn_states(&op, &lp, &os, &ls, 2, 1, 2, None).unwrap();
        assert_all_close(&r.out, &[2.0, 3.0, 30.0, 40.0]);
        assert_all_close(&r.lse, &[0.5 + 2f64.ln(), -1.0]);
        // Unequal: weights e^0 : e^-1.
        let r = merge_attn_states(&op[..2], &[0.0], &os[..2], &[-1.0], 1, 1, 2, None).unwrap();
        let (a, b) = (1.0, (-1f64).exp());
        assert_all_close(
            &r.out,
            &[(a + 3.0 * b) / (a + b), (2.0 * a + 4.0 * b) / (a + b)],
        );
        assert_all_close(&r.lse, &[(a + b).ln()]);
        // Both empty: 0 and −inf.
        let r = merge_attn_states(
            &op[..2],
            &[f32::INFINITY],
            &os[..2],
            &[f32::NEG_INFINITY],
            1,
            1,
            2,
            None,
        )
        .unwrap();
        assert_eq!(r.out, vec![0.0, 0.0]);
        assert_eq!(r.lse, vec![f64::NEG_INFINITY]);
    }

    #[test]
    fn merge_copies_suffix_after_prefill_tokens_with_context() {
        let op = [1.0f32, 2.0, 10.0, 20.0];
        let os = [3.0f32, 4.0, 30.0, 40.0];
        // Token 1 has a finite, larger prefix LSE, but is past the boundary: suffix verbatim.
        let lp = [0.5f32, 9.0];
        let ls = [0.5f32, f32::INFINITY];
        let r = merge_attn_states(&op, &lp, &os, &ls, 2, 1, 2, Some(1)).unwrap();
        assert_all_close(&r.out, &[2.0, 3.0, 30.0, 40.0]);
        assert_eq!(r.lse[1], f64::INFINITY);
        assert!(merge_attn_states(&op, &lp, &os, &ls[..1], 2, 1, 2, None).is_err());
    }

    #[test]
    fn compare_reports_the_worst_element() {
        let tol = Tolerance {
            atol: 0.1,
            rtol: 0.0,
        };
        let c = compare(&[1.0, 2.05, 3.0], &[1.0, 2.0, 3.0], tol);
        assert!(c.pass, "{c}");
        assert_eq!(c.worst_index, Some(1));
        assert!((c.max_abs - 0.05).abs() < 1e-6);
        let c = compare(&[1.0, 2.05, 3.5], &[1.0, 2.0, 3.0], tol);
        assert!(!c.pass);
        assert_eq!(c.worst_index, Some(2));
        assert!((c.max_rel - 0.5 / 3.0).abs() < 1e-6);
        assert!(c.to_string().starts_with("FAIL"), "{c}");
        // Relative part.
        let rel = Tolerance {
            atol: 0.0,
            rtol: 0.01,
        };
        assert!(compare(&[100.5], &[100.0], rel).pass);
        assert!(!compare(&[1.5], &[1.0], rel).pass);
    }

    #[test]
    fn compare_handles_non_finite_and_lengths() {
        let tol = Tolerance {
            atol: 1.0,
            rtol: 1.0,
        };
        assert!(compare(&[f32::NEG_INFINITY], &[f64::NEG_INFINITY], tol).pass);
        assert!(!compare(&[f32::INFINITY], &[f64::NEG_INFINITY], tol).pass);
        assert!(!compare(&[f32::NAN], &[1.0], tol).pass);
        assert!(!compare(&[1.0], &[f64::NAN], tol).pass);
        assert!(!compare(&[0.0], &[f64::INFINITY], tol).pass);
        assert!(!compare(&[1.0, 2.0], &[1.0], tol).pass);
        let empty = compare(&[], &[], tol);
        assert!(empty.pass && empty.worst_index.is_none());
    }
}
