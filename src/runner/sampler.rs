//! Choosing the next token from a row of logits: greedy, or temperature with top-p, from the
//! request's own seeded random stream.

use super::request::SamplingParams;
use crate::rng::Rng;

/// Index of the largest logit (the lowest index among equal maxima; NaN never wins).
/// The same rule as the device kernels of [`crate::compute::argmax`].
pub fn argmax(logits: &[f32]) -> u32 {
    crate::compute::cpu::argmax_row(logits)
}

/// Samples a token: greedy when `params.temperature == 0`, else softmax(logits / T) cut to
/// the top-p nucleus, drawn with `rng`.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut Rng) -> u32 {
    if params.temperature == 0.0 || logits.len() <= 1 {
        return argmax(logits);
    }
    let inv_t = 1.0 / params.temperature as f64;
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut probs: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let p = if v.is_nan() {
                0.0
            } else {
                ((v as f64 - max) * inv_t).exp()
            };
            (i as u32, p)
        })
        .collect();
    let total: f64 = probs.iter().map(|p| p.1).sum();
    if !(total > 0.0 && total.is_finite()) {
        return argmax(logits);
    }
    // Nucleus: most likely first, keep until the mass reaches top_p.
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut kept = 0.0;
    let mut n = 0;
    for &(_, p) in &probs {
        kept += p;
        n += 1;
        if kept / total >= params.top_p as f64 {
            break;
        }
    }
    let mut u = rng.uniform() * kept;
    for &(id, p) in &probs[..n] {
        if u < p {
            return id;
        }
        u -= p;
    }
    probs[n - 1].0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
        let mut rng = Rng::new(1);
        assert_eq!(
            sample(&[0.0, 2.0, 1.0], &SamplingParams::greedy(1), &mut rng),
            1
        );
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.5 keeps only token 0.
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            ..Default::default()
        };
        let mut rng = Rng::new(7);
        assert!((0..200).all(|_| sample(&logits, &params, &mut rng) == 0));
        // top_p 1: every token shows up, in roughly the right proportions.
        let params = SamplingParams {
            top_p: 1.0,
            ..params
        };
        let mut counts = [0usize; 4];
        for _ in 0..20000 {
            counts[sample(&logits, &params, &mut rng) as usize] += 1;
        }
        let p0 = counts[0] as f64 / 20000.0;
        assert!((p0 - 0.6439).abs() < 0.02, "{counts:?}");
        assert!(counts[3] > 300, "{counts:?}");
    }

    #[test]
    fn temperature_sharpens() {
        let logits = [1.0f32, 0.0];
        let cold = SamplingParams {
            temperature: 0.05,
            ..Default::default()
        };
        let mut rng = Rng::new(3);
        assert!((0..500).all(|_| sample(&logits, &cold, &mut rng) == 0));
    }
}
