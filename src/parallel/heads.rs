//! Tensor parallelism by heads: a layer's query and KV heads split over ranks, each rank an
//! ordinary attention layer with its share of the heads, its own KV cache, and its slices of
//! the projections around attention (the Q/K/V rows of its heads, the output projection's
//! columns of its heads), whose partial outputs are summed (an all-reduce; on one device an
//! accumulation into the residual stream).
//!
//! GQA groups are kept whole: a rank gets whole KV heads and every query head that reads them.
//! With at least as many KV heads as ranks, the KV heads are split as evenly as possible (ranks
//! may differ by one KV head: unlike vLLM, the count need not divide, so a 3-KV-head model runs
//! on 2 ranks). With fewer KV heads than ranks, each KV head is replicated on
//! `world_size / num_kv_heads` ranks (vLLM's rule, which needs the division to be exact) and
//! its query heads are split among them.

use std::ops::Range;

use crate::attention::AttentionParams;
use crate::error::{Error, Result};

/// One rank's heads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadShard {
    /// The rank.
    pub rank: usize,
    /// Query heads of the unsharded layer this rank computes.
    pub q_heads: Range<usize>,
    /// KV heads of the unsharded layer this rank holds in its cache.
    pub kv_heads: Range<usize>,
}

impl HeadShard {
    /// Query heads on this rank.
    pub fn num_heads(&self) -> usize {
        self.q_heads.len()
    }

    /// KV heads on this rank.
    pub fn num_kv_heads(&self) -> usize {
        self.kv_heads.len()
    }
}

/// How a layer's heads are split over `world_size` ranks (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadSharding {
    shards: Vec<HeadShard>,
}

impl HeadSharding {
    /// Splits `num_heads` query heads over `num_kv_heads` KV heads (a multiple of it) across
    /// `world_size` ranks.
    pub fn new(num_heads: usize, num_kv_heads: usize, world_size: usize) -> Result<Self> {
        if world_size == 0
            || world_size > num_heads
            || num_kv_heads == 0
            || !num_heads.is_multiple_of(num_kv_heads)
        {
            return Err(Error::config(format!(
                "head sharding: {num_heads} query heads over {num_kv_heads} KV heads on \
                 {world_size} ranks (need 1 ..= query-head ranks and KV heads dividing the \
                 query heads)"
            )));
        }
        let group = num_heads / num_kv_heads;
        let mut shards = Vec::with_capacity(world_size);
        if world_size <= num_kv_heads {
            for rank in 0..world_size {
                let kv = rank * num_kv_heads / world_size..(rank + 1) * num_kv_heads / world_size;
                shards.push(HeadShard {
                    rank,
                    q_heads: kv.start * group..kv.end * group,
                    kv_heads: kv,
                });
            }
        } else {
            let copies = world_size / num_kv_heads;
            if !world_size.is_multiple_of(num_kv_heads) || !group.is_multiple_of(copies) {
                return Err(Error::config(format!(
                    "head sharding: {world_size} ranks over {num_kv_heads} KV heads replicate \
                     each KV head on {world_size}/{num_kv_heads} ranks, which needs an exact \
                     division and a group of {group} query heads that splits over the copies"
                )));
            }
            let per = group / copies;
            for rank in 0..world_size {
                let kv = rank / copies;
                let q0 = kv * group + (rank % copies) * per;
                shards.push(HeadShard {
                    rank,
                    q_heads: q0..q0 + per,
                    kv_heads: kv..kv + 1,
                });
            }
        }
        Ok(HeadSharding { shards })
    }

    /// The ranks' shards, rank 0 first.
    pub fn shards(&self) -> &[HeadShard] {
        &self.shards
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.shards.len()
    }

    /// `params` of the unsharded layer as `rank`'s layer: its head counts, and the per-head
    /// ALiBi slopes and sinks of its query heads.
    pub fn params_for(&self, params: &AttentionParams, rank: usize) -> Result<AttentionParams> {
        let s = self
            .shards
            .get(rank)
            .ok_or_else(|| Error::config(format!("head sharding: no rank {rank}")))?;
        let total: usize = self.shards.iter().map(|s| s.num_heads()).sum();
        let kv_total = self
            .shards
            .iter()
            .map(|s| s.kv_heads.end)
            .max()
            .unwrap_or(0);
        if params.num_heads != total || params.num_kv_heads != kv_total {
            return Err(Error::config(format!(
                "head sharding of {total} / {kv_total} heads applied to a layer of {} / {}",
                params.num_heads, params.num_kv_heads
            )));
        }
        let slice = |what: &str, v: &Option<Vec<f32>>| -> Result<Option<Vec<f32>>> {
            v.as_ref()
                .map(|v| {
                    v.get(s.q_heads.clone())
                        .map(<[f32]>::to_vec)
                        .ok_or_else(|| {
                            Error::config(format!(
                                "head sharding: {what} has {} entries for {total} query heads",
                                v.len()
                            ))
                        })
                })
                .transpose()
        };
        Ok(AttentionParams {
            num_heads: s.num_heads(),
            num_kv_heads: s.num_kv_heads(),
            alibi_slopes: slice("alibi_slopes", &params.alibi_slopes)?,
            sinks: slice("sinks", &params.sinks)?,
            ..params.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(s: &HeadSharding) -> Vec<(Range<usize>, Range<usize>)> {
        s.shards()
            .iter()
            .map(|s| (s.q_heads.clone(), s.kv_heads.clone()))
            .collect()
    }

    #[test]
    fn groups_stay_whole() {
        // SmolLM2: 9 query heads over 3 KV heads on 2 ranks: 1 and 2 KV heads.
        let s = HeadSharding::new(9, 3, 2).unwrap();
        assert_eq!(ranges(&s), [(0..3, 0..1), (3..9, 1..3)]);
        // Even split.
        let s = HeadSharding::new(32, 8, 4).unwrap();
        assert_eq!(ranges(&s)[3], (24..32, 6..8));
        // Replicated KV heads: 8 query heads over 2 KV heads on 4 ranks.
        let s = HeadSharding::new(8, 2, 4).unwrap();
        assert_eq!(
            ranges(&s),
            [(0..2, 0..1), (2..4, 0..1), (4..6, 1..2), (6..8, 1..2)]
        );
        // Every query head on exactly one rank, reading its own KV head.
        for (h, k, n) in [(9, 3, 3), (12, 4, 3), (16, 1, 4), (6, 6, 4)] {
            let s = HeadSharding::new(h, k, n).unwrap();
            let mut seen = vec![0; h];
            for sh in s.shards() {
                for q in sh.q_heads.clone() {
                    seen[q] += 1;
                    assert!(sh.kv_heads.contains(&(q / (h / k))));
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{h} {k} {n}");
        }
    }

    #[test]
    fn impossible_splits_are_errors() {
        assert!(HeadSharding::new(8, 3, 2).is_err());
        assert!(HeadSharding::new(8, 2, 3).is_err());
        assert!(HeadSharding::new(2, 1, 4).is_err());
        assert!(HeadSharding::new(8, 2, 0).is_err());
    }

    #[test]
    fn params_follow_the_heads() {
        let mut p = AttentionParams::new(9, 64, 3);
        p.sinks = Some((0..9).map(|i| i as f32).collect());
        let s = HeadSharding::new(9, 3, 2).unwrap();
        let r1 = s.params_for(&p, 1).unwrap();
        assert_eq!((r1.num_heads, r1.num_kv_heads), (6, 2));
        assert_eq!(r1.sinks.unwrap(), [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        assert!(s.params_for(&p, 2).is_err());
        assert!(s.params_for(&AttentionParams::new(8, 64, 2), 0).is_err());
        p.sinks = Some(vec![0.0; 4]);
        assert!(s.params_for(&p, 1).is_err());
        assert!(HeadSharding::new(4, 2, usize::MAX).is_err());
    }
}
