//! Continuous batching (vLLM's scheduler, reduced to what one model on one device needs):
//! every step takes the running requests' next tokens (decodes first), then admits waiting
//! prompts — whole, or a chunk of them (chunked prefill) — up to a token budget, allocating
//! KV-cache blocks as it goes. When the cache runs out of blocks for a running request, the
//! newest running request is preempted: its blocks are freed and it waits to be recomputed
//! from its prompt and the tokens it has produced so far (vLLM's recompute preemption).

use std::collections::VecDeque;

use super::request::{RequestId, SamplingParams};
use crate::error::Result;
use crate::kv_cache::BlockPool;
use crate::rng::Rng;

/// One request's state between steps.
#[derive(Debug)]
pub(crate) struct Sequence {
    pub id: RequestId,
    /// Prompt followed by the tokens generated so far.
    pub tokens: Vec<u32>,
    /// Tokens whose keys and values are in the cache.
    pub num_computed: usize,
    /// Cache blocks, in order (block i holds positions `i*block_size ..`).
    pub blocks: Vec<i32>,
    pub params: SamplingParams,
    pub rng: Rng,
    pub generated: usize,
}

impl Sequence {
    pub fn new(id: RequestId, prompt: Vec<u32>, params: SamplingParams) -> Self {
        let rng = Rng::new(params.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Sequence {
            id,
            tokens: prompt,
            num_computed: 0,
            blocks: Vec::new(),
            params,
            rng,
            generated: 0,
        }
    }
}

/// One request's share of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scheduled {
    /// Index into the running list.
    pub index: usize,
    /// New tokens this step (positions `num_computed .. num_computed + num_tokens`).
    pub num_tokens: usize,
}

/// Waiting and running requests, and the block pool they share.
#[derive(Debug)]
pub(crate) struct Scheduler {
    pub waiting: VecDeque<Sequence>,
    pub running: Vec<Sequence>,
    pub pool: BlockPool,
    pub block_size: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Requests preempted so far (for statistics).
    pub preemptions: usize,
}

impl Scheduler {
    /// Blocks `seq` needs to hold `len` tokens, beyond those it has.
    fn blocks_needed(&self, seq: &Sequence, len: usize) -> usize {
        len.div_ceil(self.block_size)
            .saturating_sub(seq.blocks.len())
    }

    fn grow(&mut self, index: usize, len: usize) -> bool {
        let need = self.blocks_needed(&self.running[index], len);
        if need == 0 {
            return true;
        }
        match self.pool.allocate(need) {
            Ok(b) => {
                self.running[index].blocks.extend(b);
                true
            }
            Err(_) => false,
        }
    }

    fn preempt_last(&mut self) -> Result<()> {
        let Some(mut seq) = self.running.pop() else {
            return Ok(());
        };
        self.pool.free(&seq.blocks)?;
        seq.blocks.clear();
        seq.num_computed = 0;
        self.waiting.push_front(seq);
        self.preemptions += 1;
        Ok(())
    }

    /// Picks this step's tokens. Decodes (one new token) come first in the returned order, as
    /// the backends' `reorder_batch_threshold` asks; then continuing and new prefills.
    pub fn schedule(&mut self) -> Result<Vec<Scheduled>> {
        let mut budget = self.max_num_batched_tokens;
        let mut out: Vec<Scheduled> = Vec::new();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            let take = (seq.tokens.len() - seq.num_computed).min(budget);
            let len = seq.num_computed + take;
            if self.grow(i, len) {
                out.push(Scheduled {
                    index: i,
                    num_tokens: take,
                });
                budget -= take;
                i += 1;
                continue;
            }
            // Out of blocks: free the newest running request and retry this one.
            if self.running.len() - 1 == i {
                // This request is itself the newest: it waits.
                self.preempt_last()?;
                break;
            }
            self.preempt_last()?;
        }
        // Admit waiting prompts while there is budget, room and cache.
        while budget > 0 && self.running.len() < self.max_num_seqs {
            let Some(seq) = self.waiting.pop_front() else {
                break;
            };
            let take = (seq.tokens.len() - seq.num_computed).min(budget);
            self.running.push(seq);
            let index = self.running.len() - 1;
            if !self.grow(index, take) {
                if let Some(seq) = self.running.pop() {
                    self.waiting.push_front(seq);
                }
                break;
            }
            out.push(Scheduled {
                index,
                num_tokens: take,
            });
            budget -= take;
        }
        out.sort_by_key(|s| (s.num_tokens != 1, s.index));
        Ok(out)
    }

    /// Removes finished requests (by running index) and frees their blocks.
    pub fn finish(&mut self, mut indices: Vec<usize>) -> Result<()> {
        indices.sort_unstable();
        for &i in indices.iter().rev() {
            let seq = self.running.remove(i);
            self.pool.free(&seq.blocks)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(blocks: usize, seqs: usize, budget: usize) -> Scheduler {
        Scheduler {
            waiting: VecDeque::new(),
            running: Vec::new(),
            pool: BlockPool::new(blocks).unwrap(),
            block_size: 4,
            max_num_seqs: seqs,
            max_num_batched_tokens: budget,
            preemptions: 0,
        }
    }

    fn add(s: &mut Scheduler, id: u64, len: usize) {
        s.waiting
            .push_back(Sequence::new(id, vec![1; len], SamplingParams::greedy(8)));
    }

    #[test]
    fn chunks_prompts_to_the_budget_and_puts_decodes_first() {
        let mut s = sched(64, 8, 10);
        add(&mut s, 0, 6);
        add(&mut s, 1, 9);
        let step = s.schedule().unwrap();
        // Prompt 0 whole (6), then 4 tokens of prompt 1.
        assert_eq!(
            step,
            vec![
                Scheduled {
                    index: 0,
                    num_tokens: 6
                },
                Scheduled {
                    index: 1,
                    num_tokens: 4
                }
            ]
        );
        s.running[0].num_computed = 6;
        s.running[0].tokens.push(5);
        s.running[1].num_computed = 4;
        let step = s.schedule().unwrap();
        // The decode of request 0 first, then the rest of prompt 1.
        assert_eq!(
            step,
            vec![
                Scheduled {
                    index: 0,
                    num_tokens: 1
                },
                Scheduled {
                    index: 1,
                    num_tokens: 5
                }
            ]
        );
        assert_eq!(s.running[0].blocks.len(), 2);
        assert_eq!(s.running[1].blocks.len(), 3);
    }

    #[test]
    fn out_of_blocks_preempts_the_newest() {
        // 4 usable blocks of 4 tokens.
        let mut s = sched(5, 8, 100);
        add(&mut s, 0, 8);
        add(&mut s, 1, 8);
        s.schedule().unwrap();
        assert_eq!(s.pool.num_free(), 0);
        for seq in &mut s.running {
            seq.num_computed = 8;
            seq.tokens.push(2);
        }
        // Both need a third block; none is free: request 1 is preempted, 0 continues.
        let step = s.schedule().unwrap();
        assert_eq!(
            step,
            vec![Scheduled {
                index: 0,
                num_tokens: 1
            }]
        );
        assert_eq!(s.preemptions, 1);
        assert_eq!(s.waiting.front().unwrap().id, 1);
        assert_eq!(s.waiting.front().unwrap().num_computed, 0);
        assert_eq!(s.waiting.front().unwrap().tokens.len(), 9);
        s.finish(vec![0]).unwrap();
        assert_eq!(s.pool.num_free(), 4);
    }

    #[test]
    fn respects_max_num_seqs() {
        let mut s = sched(64, 2, 100);
        for id in 0..3 {
            add(&mut s, id, 3);
        }
        assert_eq!(s.schedule().unwrap().len(), 2);
        assert_eq!(s.waiting.len(), 1);
    }
}
