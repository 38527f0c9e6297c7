//! Choosing the next token from a row of logits: greedy, or temperature with top-p, from the
//! request's own seeded random stream.

use super::request::SamplingParams;
use crate::compute::SamplingRow;
use crate::rng::Rng;

/// Index of the largest logit (the lowest index among equal maxima; NaN never wins).
/// The same rule as the device kernels of [`crate::compute::argmax`].
pub fn argmax(logits: &[f32]) -> u32 {
    crate::compute::cpu::argmax_row(logits)
}

/// The row a request samples with this step: its temperature and top-p, and a uniform draw
/// from its random stream (taken only when it samples: greedy requests draw nothing).
pub fn sampling_row(params: &SamplingParams, rng: &mut Rng) -> SamplingRow {
    if params.temperature > 0.0 {
        SamplingRow {
            temperature: params.temperature,
            top_p: params.top_p,
            uniform: rng.uniform() as f32,
        }
    } else {
        SamplingRow::GREEDY
    }
}

/// Samples a token on the host: greedy when `params.temperature == 0`, else softmax(logits /
/// T) cut to the top-p nucleus, drawn with `rng` — exactly [`crate::compute::sample`]'s
/// rule (the devices' kernels follow it in f32), so a request samples the same way wherever
/// its logits live.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut Rng) -> u32 {
    crate::compute::cpu::sample_row(logits, &sampling_row(params, rng))
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
