//! When a decode token's keys are split over several workgroups (flash-decoding), and into
//! how many pieces.
//!
//! A batch of few decode tokens gives a GPU too few workgroups to fill it; splitting each
//! token's visible keys into `s` contiguous ranges multiplies them by `s`, at the price of a
//! partial per split and a merge. Each kernel that splits has its own rule for `s`
//! ([`SplitRule`]); what they share is the shape of a split ([`SplitRule::shape`]): ranges of
//! a whole number of [`SPLIT_ALIGN`] keys, the last one shorter.

/// Split ranges start at multiples of this many keys past the first visible key (the key
/// chunk of every kernel that splits).
pub const SPLIT_ALIGN: usize = 16;
/// Most key splits of one decode token on the CUDA-core kernel ([`SplitRule::TwoPerSm`]).
pub const MAX_SPLITS: usize = 32;
/// Fewest keys worth a split of their own on the CUDA-core kernel.
pub const MIN_KEYS_PER_SPLIT: usize = 256;
/// Most key splits of one decode token on the CUDA decode kernel ([`SplitRule::FillWaves`]).
pub const DECODE_MAX_SPLITS: usize = 128;
/// Fewest keys per split on the CUDA decode kernel (two 16-key chunks per warp).
pub const DECODE_MIN_KEYS_PER_SPLIT: usize = 128;
/// Wave efficiency (workgroups / (waves × slots)) [`SplitRule::FillWaves`] aims for.
const WAVE_EFFICIENCY: f64 = 0.95;

/// How many splits a splittable decode token gets. Plain data: it is part of a plan's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SplitRule {
    /// No token is split.
    Never,
    /// Single-token requests split until the plan has about two workgroups per
    /// multiprocessor: at most [`MAX_SPLITS`], at least [`MIN_KEYS_PER_SPLIT`] keys each
    /// (the CUDA-core kernel, two CTAs per SM).
    TwoPerSm {
        /// Multiprocessors of the GPU.
        sm_count: usize,
    },
    /// Single-token requests split so that the plan's workgroups fill whole waves of `slots`
    /// (the workgroups the GPU runs at once): the smallest count whose wave efficiency
    /// reaches 95 %, at most [`DECODE_MAX_SPLITS`], at least [`DECODE_MIN_KEYS_PER_SPLIT`]
    /// keys each (the CUDA decode kernel).
    FillWaves {
        /// Workgroups the GPU runs at once (multiprocessors × workgroups per multiprocessor).
        slots: usize,
        /// A fixed split count instead of the wave rule (a tuning override).
        fixed: Option<usize>,
    },
    /// Every request of the plan that fits one tile splits by its own length:
    /// `min(⌈keys / min_keys⌉, ⌈target / (requests × KV heads)⌉, max_splits)` (the WGSL
    /// kernels, whose occupancy is not known to the host).
    PerRequest {
        /// Fewest keys per split.
        min_keys: usize,
        /// Workgroups the splits aim for over the whole batch.
        target: usize,
        /// Most splits of one request.
        max_splits: usize,
        /// Splittable requests of the batch (over every list that shares the rule).
        requests: usize,
    },
}

impl SplitRule {
    /// The longest query a split group may have: 1 for the CUDA rules (single-token decodes),
    /// unbounded for [`SplitRule::PerRequest`] (any request that fits one tile), 0 for
    /// [`SplitRule::Never`].
    pub fn max_query_len(&self) -> usize {
        match self {
            SplitRule::Never => 0,
            SplitRule::TwoPerSm { .. } | SplitRule::FillWaves { .. } => 1,
            SplitRule::PerRequest { .. } => usize::MAX,
        }
    }

    /// Splits before alignment for a token with `len` visible keys when `want` are wanted.
    pub fn count(&self, len: usize, want: usize) -> usize {
        match *self {
            SplitRule::Never => 1,
            SplitRule::TwoPerSm { .. } => want.min(MAX_SPLITS).min(len / MIN_KEYS_PER_SPLIT),
            SplitRule::FillWaves { .. } => want
                .min(DECODE_MAX_SPLITS)
                .min(len / DECODE_MIN_KEYS_PER_SPLIT),
            SplitRule::PerRequest {
                min_keys,
                max_splits,
                ..
            } => len.div_ceil(min_keys.max(1)).min(want).min(max_splits),
        }
        .max(1)
    }

    /// `(splits, keys per split)` of a token with `len` visible keys when `want` are wanted:
    /// keys per split a multiple of [`SPLIT_ALIGN`], the last split shorter; `(1, len)` when
    /// unsplit.
    pub fn shape(&self, len: usize, want: usize) -> (usize, usize) {
        let s = self.count(len, want);
        if s <= 1 {
            return (1, len);
        }
        let chunk = len.div_ceil(s).div_ceil(SPLIT_ALIGN) * SPLIT_ALIGN;
        (len.div_ceil(chunk), chunk)
    }

    /// The split count to ask of every splittable token, given the plan's workgroups when
    /// each asks for `w` (`workgroups(w)`) and when none splits (`base`).
    pub fn want(&self, base: usize, kv_heads: usize, workgroups: impl Fn(usize) -> usize) -> usize {
        match *self {
            SplitRule::Never => 1,
            SplitRule::TwoPerSm { sm_count } => {
                if base == 0 {
                    1
                } else {
                    (2 * sm_count.max(1)).div_ceil(base)
                }
            }
            SplitRule::FillWaves { slots, fixed } => {
                fixed.unwrap_or_else(|| fill_waves_target(slots, DECODE_MAX_SPLITS, workgroups))
            }
            SplitRule::PerRequest {
                target, requests, ..
            } => target
                .div_ceil(requests.saturating_mul(kv_heads).max(1))
                .max(1),
        }
    }
}

/// The split count to ask of every splittable decode token so that `workgroups(want)` fill
/// whole waves of `slots`: the smallest `want` in `1..=max` whose wave efficiency
/// (workgroups / (waves × slots)) reaches 95 %, else the most efficient one.
pub fn fill_waves_target(slots: usize, max: usize, workgroups: impl Fn(usize) -> usize) -> usize {
    let slots = slots.max(1);
    let eff = |n: usize| {
        if n == 0 {
            return 0.0;
        }
        n as f64 / (n.div_ceil(slots) * slots) as f64
    };
    let mut best = (1, eff(workgroups(1)));
    for want in 1..=max.max(1) {
        let e = eff(workgroups(want));
        if e >= WAVE_EFFICIENCY {
            return want;
        }
        if e > best.1 + 1e-9 {
            best = (want, e);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_are_aligned_and_cover_the_keys() {
        let rules = [
            SplitRule::TwoPerSm { sm_count: 132 },
            SplitRule::FillWaves {
                slots: 264,
                fixed: None,
            },
            SplitRule::PerRequest {
                min_keys: 32,
                target: 64,
                max_splits: 8,
                requests: 1,
            },
        ];
        for rule in rules {
            for len in [1usize, 15, 16, 17, 255, 256, 257, 1000, 4096, 100_000] {
                for want in [1usize, 2, 3, 7, 64, 200] {
                    let (s, chunk) = rule.shape(len, want);
                    assert!(s >= 1 && s <= want.max(1), "{rule:?} {len} {want}");
                    if s == 1 {
                        continue;
                    }
                    assert_eq!(chunk % SPLIT_ALIGN, 0);
                    assert!((s - 1) * chunk < len && s * chunk >= len);
                }
            }
        }
        assert_eq!(SplitRule::Never.shape(5000, 8), (1, 5000));
    }

    #[test]
    fn the_wave_target_fills_whole_waves() {
        assert_eq!(fill_waves_target(264, 128, |w| 512 * w), 1);
        assert_eq!(fill_waves_target(264, 128, |w| 64 * w), 4);
    }

    #[test]
    fn per_request_splits_follow_length_and_occupancy() {
        let rule = SplitRule::PerRequest {
            min_keys: 32,
            target: 64,
            max_splits: 8,
            requests: 2,
        };
        // 64 workgroups over 2 requests x 4 KV heads: 8 each.
        let want = rule.want(0, 4, |_| 0);
        assert_eq!(want, 8);
        assert_eq!(rule.count(100, want), 4);
        assert_eq!(rule.count(10_000, want), 8);
        assert_eq!(rule.count(20, want), 1);
    }
}
