//! `merge_attn_states`: combines two partial attention results over disjoint key sets.
//!
//! Per (token t, head h), with natural-log LSEs (vLLM §6.2): an LSE of `+inf` is read as
//! `−inf` (FA2 reports empty sequences as `+inf`), `m = max(lse_p, lse_s)`,
//! `a = exp(lse_p − m)`, `b = exp(lse_s − m)`, `out = o_p·a/(a+b) + o_s·b/(a+b)`,
//! `out_lse = ln(a+b) + m`. Tokens at or after `prefill_tokens_with_context` copy the suffix.
//! Both sides empty (`−inf` twice) gives NaN in vLLM; here it gives output 0 and LSE `−inf`,
//! the value of attention over no keys, so an empty merge cannot poison later merges. A side
//! of weight 0 is not read at all, so NaN / inf in an empty side's row cannot reach the output.
//!
//! Layout: outputs `[T][H][D]` f32 rows, LSEs `[H][T]`.

/// Merges one (token, head) row; returns the merged LSE.
#[inline]
pub fn merge_row(out: &mut [f32], o_p: &[f32], lse_p: f32, o_s: &[f32], lse_s: f32) -> f32 {
    let fix = |x: f32| {
        if x == f32::INFINITY {
            f32::NEG_INFINITY
        } else {
            x
        }
    };
    let (lp, ls) = (fix(lse_p), fix(lse_s));
    let m = lp.max(ls);
    if m == f32::NEG_INFINITY {
        out.fill(0.0);
        return f32::NEG_INFINITY;
    }
    let a = (lp - m).exp();
    let b = (ls - m).exp();
    let z = a + b;
    let (wa, wb) = (a / z, b / z);
    // A side of weight 0 (empty, or underflowed) is not read: its row may hold anything,
    // and 0 · inf would be NaN.
    if wa == 0.0 {
        for (o, &s) in out.iter_mut().zip(o_s) {
            *o = s * wb;
        }
    } else if wb == 0.0 {
        for (o, &p) in out.iter_mut().zip(o_p) {
            *o = p * wa;
        }
    } else {
        for ((o, &p), &s) in out.iter_mut().zip(o_p).zip(o_s) {
            *o = p * wa + s * wb;
        }
    }
    z.ln() + m
}

/// Merges `[T][H][D]` partial outputs with `[H][T]` LSEs into `out` / `out_lse`.
#[allow(clippy::too_many_arguments)]
pub fn merge_states(
    out: &mut [f32],
    mut out_lse: Option<&mut [f32]>,
    o_p: &[f32],
    lse_p: &[f32],
    o_s: &[f32],
    lse_s: &[f32],
    num_tokens: usize,
    num_heads: usize,
    head_size: usize,
    prefill_tokens_with_context: Option<usize>,
) {
    let d = head_size;
    for t in 0..num_tokens {
        for h in 0..num_heads {
            let row = (t * num_heads + h) * d;
            let li = h * num_tokens + t;
            let lse = if prefill_tokens_with_context.is_some_and(|n| t >= n) {
                out[row..row + d].copy_from_slice(&o_s[row..row + d]);
                lse_s[li]
            } else {
                merge_row(
                    &mut out[row..row + d],
                    &o_p[row..row + d],
                    lse_p[li],
                    &o_s[row..row + d],
                    lse_s[li],
                )
            };
            if let Some(ol) = out_lse.as_deref_mut() {
                ol[li] = lse;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plus_inf_counts_as_empty() {
        let mut out = [0.0; 2];
        let l = merge_row(&mut out, &[1.0, 2.0], f32::INFINITY, &[3.0, 4.0], 0.5);
        assert_eq!(out, [3.0, 4.0]);
        assert_eq!(l, 0.5);
        let l = merge_row(
            &mut out,
            &[1.0, 2.0],
            f32::NEG_INFINITY,
            &[3.0, 4.0],
            f32::INFINITY,
        );
        assert_eq!((out, l), ([0.0, 0.0], f32::NEG_INFINITY));
    }

    #[test]
    fn an_empty_side_is_not_read() {
        let mut out = [0.0; 2];
        let l = merge_row(
            &mut out,
            &[f32::NAN, f32::INFINITY],
            f32::INFINITY,
            &[3.0, 4.0],
            0.5,
        );
        assert_eq!((out, l), ([3.0, 4.0], 0.5));
        let l = merge_row(
            &mut out,
            &[1.0, 2.0],
            0.5,
            &[f32::NEG_INFINITY, f32::NAN],
            f32::NEG_INFINITY,
        );
        assert_eq!((out, l), ([1.0, 2.0], 0.5));
        // A weight that underflows to 0 drops its side too.
        let l = merge_row(
            &mut out,
            &[f32::NAN, f32::INFINITY],
            -200.0,
            &[3.0, 4.0],
            0.0,
        );
        assert_eq!((out, l), ([3.0, 4.0], 0.0));
    }

    #[test]
    fn equal_lses_average() {
        let mut out = [0.0; 2];
        let l = merge_row(&mut out, &[1.0, 2.0], 0.0, &[3.0, 4.0], 0.0);
        assert_eq!(out, [2.0, 3.0]);
        assert!((l - 2f32.ln()).abs() < 1e-7);
    }
}
