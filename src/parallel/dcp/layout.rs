//! Which rank holds which of a request's tokens: whole blocks, round-robin.

use crate::error::{Error, Result};

/// How a request's tokens are spread over the ranks: whole blocks of `block_size` tokens,
/// round-robin over `world_size` ranks (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DcpLayout {
    world_size: usize,
    block_size: usize,
}

impl DcpLayout {
    /// `world_size` ≥ 1 ranks, `block_size` ≥ 1 tokens per block.
    pub fn new(world_size: usize, block_size: usize) -> Result<Self> {
        if world_size == 0 || block_size == 0 {
            return Err(Error::config(format!(
                "DCP layout: world_size {world_size} and block_size {block_size} must be ≥ 1"
            )));
        }
        // Block ids and positions are i32 in every kernel.
        world_size
            .checked_mul(block_size)
            .filter(|&x| x <= i32::MAX as usize)
            .ok_or_else(|| {
                Error::overflow(
                    "DCP layout",
                    format!("{world_size} ranks × {block_size} tokens per block"),
                )
            })?;
        Ok(DcpLayout {
            world_size,
            block_size,
        })
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Tokens per block (the interleave size).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// How many of a `seq_len`-token sequence's tokens `rank` holds (vLLM's
    /// `get_dcp_local_seq_lens` with interleave = block size); 0 for a rank outside the
    /// layout.
    pub fn local_len(&self, seq_len: usize, rank: usize) -> usize {
        if rank >= self.world_size {
            return 0;
        }
        // `n · b` fits i32 (checked by `new`), and `rank · b < n · b`.
        let (n, b) = (self.world_size, self.block_size);
        let base = seq_len / (b * n) * b;
        let rem = seq_len - base * n;
        base + rem.saturating_sub(rank * b).min(b)
    }

    /// The rank holding global position `pos` and the position's index in that rank's shard.
    pub fn owner(&self, pos: usize) -> (usize, usize) {
        let (n, b) = (self.world_size, self.block_size);
        let block = pos / b;
        (block % n, block / n * b + pos % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_lengths_follow_vllm() {
        // vLLM's get_dcp_local_seq_lens, interleave I = block size, written out.
        let vllm = |seq: usize, n: usize, rank: usize, i: usize| {
            let base = seq / i / n * i;
            let rem = seq - base * n;
            base + (rem as i64 - (rank * i) as i64).clamp(0, i as i64) as usize
        };
        for n in 1..=4 {
            for b in [1, 4, 16] {
                let l = DcpLayout::new(n, b).unwrap();
                for seq in 0..200 {
                    let mut total = 0;
                    for r in 0..n {
                        assert_eq!(l.local_len(seq, r), vllm(seq, n, r, b), "{n} {b} {seq} {r}");
                        total += l.local_len(seq, r);
                    }
                    assert_eq!(total, seq);
                    // The owner of every position, and the positions each rank holds.
                    let mut held = vec![0; n];
                    for pos in 0..seq {
                        let (r, at) = l.owner(pos);
                        assert_eq!(at, held[r], "positions of a rank are dense");
                        held[r] += 1;
                    }
                    for (r, &h) in held.iter().enumerate() {
                        assert_eq!(h, l.local_len(seq, r));
                    }
                }
            }
        }
        assert!(DcpLayout::new(0, 16).is_err());
        assert!(DcpLayout::new(2, 0).is_err());
        assert!(DcpLayout::new(1 << 20, 1 << 20).is_err());
        assert_eq!(DcpLayout::new(2, 4).unwrap().local_len(16, 5), 0);
    }
}
