//! A decode batch split over the ranks: each rank's batch description (its blocks, the new
//! tokens it owns, placeholders for the requests it does not reach) and backend metadata.

use super::DcpLayout;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, BatchDescription, CommonAttentionMetadata,
};

/// One rank's block table: row `i` lists request `i`'s blocks on that rank, in the rank's own
/// cache (`[num_reqs, max_blocks_per_req]`, row-major). Entries past what a request holds on
/// the rank are never read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankBlockTable {
    /// `[num_reqs * max_blocks_per_req]` block ids of the rank's cache.
    pub block_table: Vec<i32>,
    /// Row width.
    pub max_blocks_per_req: usize,
}

/// One rank's share of a decode batch.
#[derive(Clone, Debug)]
struct RankBatch {
    /// The rank's batch: every request, those it holds first with their local lengths, the
    /// rest as one-key placeholders.
    desc: BatchDescription,
    /// How many leading requests have keys on this rank.
    holding: usize,
}

/// A decode batch (one new token per request) split over the ranks of a [`DcpLayout`].
#[derive(Clone, Debug)]
pub struct DcpDecodeBatch {
    layout: DcpLayout,
    seq_lens: Vec<usize>,
    ranks: Vec<RankBatch>,
}

impl DcpDecodeBatch {
    /// The batch of `seq_lens` (each ≥ 1, counting the new token) over each rank's block
    /// table. Requests that leave some rank empty (shorter than `(N−1)·block_size + 1`) must
    /// come after every request that rank holds (module docs).
    pub fn new(
        layout: DcpLayout,
        seq_lens: &[usize],
        rank_tables: &[RankBlockTable],
    ) -> Result<Self> {
        let (n, b) = (layout.world_size(), layout.block_size());
        if rank_tables.len() != n {
            return Err(Error::metadata(format!(
                "DCP batch: {} rank block tables for {n} ranks",
                rank_tables.len()
            )));
        }
        let num_reqs = seq_lens.len();
        let rows = i32::try_from(num_reqs)
            .map_err(|_| Error::metadata(format!("DCP batch: {num_reqs} requests exceed i32")))?;
        for (i, &s) in seq_lens.iter().enumerate() {
            if s == 0 || s > i32::MAX as usize {
                return Err(Error::metadata(format!(
                    "DCP batch: request {i} has seq_len {s}; a decode request holds 1..=i32::MAX \
                     tokens (the new one included)"
                )));
            }
        }
        let mut ranks = Vec::with_capacity(n);
        for (r, table) in rank_tables.iter().enumerate() {
            let width = table.max_blocks_per_req;
            let cells = num_reqs.checked_mul(width).ok_or_else(|| {
                Error::overflow("DCP rank block table", format!("{num_reqs} × {width}"))
            })?;
            if table.block_table.len() != cells {
                return Err(Error::metadata(format!(
                    "DCP batch: rank {r}'s block table has {} entries, expected {num_reqs} \
                     requests × {width}",
                    table.block_table.len()
                )));
            }
            let local: Vec<usize> = seq_lens.iter().map(|&s| layout.local_len(s, r)).collect();
            let holding = local.iter().take_while(|&&l| l > 0).count();
            if let Some(j) = (holding..num_reqs).find(|&j| local[j] > 0) {
                return Err(Error::metadata(format!(
                    "DCP batch: request {holding} ({} tokens) has no keys on rank {r} but request \
                     {j} after it ({} tokens) has; list the requests too short to reach every \
                     rank last, longest first",
                    seq_lens[holding], seq_lens[j]
                )));
            }
            // Every request keeps its query row; a placeholder reads one key of block 0.
            let width = width.max(1);
            let mut block_table = vec![0i32; num_reqs * width];
            let mut slot_mapping = vec![-1i64; num_reqs];
            for i in 0..num_reqs {
                let row = &mut block_table[i * width..(i + 1) * width];
                let src =
                    &table.block_table[i * table.max_blocks_per_req..][..table.max_blocks_per_req];
                let need = local[i].div_ceil(b);
                if need > table.max_blocks_per_req {
                    return Err(Error::metadata(format!(
                        "DCP batch: request {i} holds {} tokens ({need} blocks) on rank {r}, \
                         whose block table rows have {} entries",
                        local[i], table.max_blocks_per_req
                    )));
                }
                row[..need].copy_from_slice(&src[..need]);
                let (owner, at) = layout.owner(seq_lens[i] - 1);
                if owner == r {
                    let block = i64::from(src[at / b]);
                    slot_mapping[i] = block * b as i64 + (at % b) as i64;
                }
            }
            let desc = BatchDescription {
                query_start_loc: (0..=rows).collect(),
                seq_lens: local.iter().map(|&l| l.max(1) as i32).collect(),
                block_table,
                max_blocks_per_req: width,
                slot_mapping,
                causal: true,
                block_size: b,
                is_prefilling: None,
            };
            ranks.push(RankBatch { desc, holding });
        }
        Ok(DcpDecodeBatch {
            layout,
            seq_lens: seq_lens.to_vec(),
            ranks,
        })
    }

    /// The same batch described as one cache holds it (`desc`: causal, every query length 1,
    /// block ids of one pool), split so that block `j` of a request lives on rank
    /// `j mod world_size` under the same block id: each rank's cache is as large as the pool,
    /// and a block id is used on the one rank that holds it. A request whose slot is −1 writes
    /// its new token nowhere; `is_prefilling` has no role in a decode batch.
    pub fn from_unsharded(desc: &BatchDescription, world_size: usize) -> Result<Self> {
        let layout = DcpLayout::new(world_size, desc.block_size)?;
        if !desc.causal {
            return Err(Error::metadata(
                "DCP batch: decode context parallelism shards a causal decoder's cache (the \
                 description is non-causal)",
            ));
        }
        let num_reqs = desc.seq_lens.len();
        if desc.query_start_loc.len() != num_reqs + 1
            || desc
                .query_start_loc
                .iter()
                .enumerate()
                .any(|(i, &q)| q != i as i32)
        {
            return Err(Error::metadata(format!(
                "DCP batch: a decode batch has one new token per request (query_start_loc \
                 0, 1, …, {num_reqs}), got {:?}",
                desc.query_start_loc
            )));
        }
        let seq_lens = desc
            .seq_lens
            .iter()
            .map(|&s| usize::try_from(s))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| Error::metadata("DCP batch: negative seq_len"))?;
        let w = desc.max_blocks_per_req;
        let cells = num_reqs
            .checked_mul(w)
            .ok_or_else(|| Error::overflow("block table", format!("{num_reqs} × {w}")))?;
        if desc.block_table.len() != cells {
            return Err(Error::metadata(format!(
                "DCP batch: block table has {} entries, expected {num_reqs} × {w}",
                desc.block_table.len()
            )));
        }
        let width = w.div_ceil(world_size);
        let tables = (0..world_size)
            .map(|r| {
                let mut t = vec![0i32; num_reqs * width];
                for i in 0..num_reqs {
                    for (k, j) in (r..w).step_by(world_size).enumerate() {
                        t[i * width + k] = desc.block_table[i * w + j];
                    }
                }
                RankBlockTable {
                    block_table: t,
                    max_blocks_per_req: width,
                }
            })
            .collect::<Vec<_>>();
        let mut batch = Self::new(layout, &seq_lens, &tables)?;
        // A request whose new token the description does not write (a −1 slot: padding)
        // writes it on no rank.
        for (i, &slot) in desc.slot_mapping.iter().enumerate().take(num_reqs) {
            if slot < 0 {
                for r in &mut batch.ranks {
                    r.desc.slot_mapping[i] = -1;
                }
            }
        }
        Ok(batch)
    }

    /// The layout.
    pub fn layout(&self) -> DcpLayout {
        self.layout
    }

    /// Requests (one new token each).
    pub fn num_reqs(&self) -> usize {
        self.seq_lens.len()
    }

    /// How many leading requests have keys on `rank` (the rest are placeholders there).
    pub fn holding(&self, rank: usize) -> usize {
        self.ranks.get(rank).map_or(0, |r| r.holding)
    }

    /// `rank`'s batch as its cache holds it: every request, the held ones with their local
    /// lengths, the others as one-key placeholders on block 0 whose results are never read.
    pub fn rank_description(&self, rank: usize) -> Option<&BatchDescription> {
        self.ranks.get(rank).map(|r| &r.desc)
    }

    /// Validates each rank's batch on `device` and builds the backend metadata with `builder`
    /// (once per step, shared by every layer): the one-device form.
    pub fn build(
        &self,
        device: &Device,
        builder: &dyn AttentionMetadataBuilder,
    ) -> Result<DcpMetadata> {
        let mut ranks = Vec::with_capacity(self.ranks.len());
        for r in 0..self.ranks.len() {
            // Ranks hold a non-increasing number of requests: the first that holds none ends
            // the list.
            let Some(metadata) = self.build_rank(r, device, builder)? else {
                break;
            };
            ranks.push((self.ranks[r].holding, metadata));
        }
        Ok(DcpMetadata {
            layout: self.layout,
            num_reqs: self.num_reqs(),
            ranks,
        })
    }

    /// Rank `rank`'s metadata on its own `device` with its backend's `builder` (the form with
    /// one device per rank); `None` when the rank holds no key of any request (it runs
    /// nothing).
    pub fn build_rank(
        &self,
        rank: usize,
        device: &Device,
        builder: &dyn AttentionMetadataBuilder,
    ) -> Result<Option<Box<dyn AttentionMetadata>>> {
        let r = self.ranks.get(rank).ok_or_else(|| {
            Error::config(format!(
                "DCP batch of {} ranks has no rank {rank}",
                self.ranks.len()
            ))
        })?;
        if r.holding == 0 {
            return Ok(None);
        }
        let common = CommonAttentionMetadata::new(device, r.desc.clone())
            .map_err(|e| Error::metadata(format!("DCP rank {rank}: {e}")))?;
        Ok(Some(builder.build(0, &common, false)?))
    }
}

/// A [`DcpDecodeBatch`]'s backend metadata: one build per rank that holds any key.
pub struct DcpMetadata {
    layout: DcpLayout,
    pub(super) num_reqs: usize,
    /// (requests held, metadata) of ranks 0, 1, … while they hold any.
    pub(super) ranks: Vec<(usize, Box<dyn AttentionMetadata>)>,
}

impl std::fmt::Debug for DcpMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DcpMetadata")
            .field("layout", &self.layout)
            .field("num_reqs", &self.num_reqs)
            .field(
                "holding",
                &self.ranks.iter().map(|r| r.0).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl DcpMetadata {
    /// The layout.
    pub fn layout(&self) -> DcpLayout {
        self.layout
    }

    /// How many ranks run (the leading ranks that hold a key of some request).
    pub fn active_ranks(&self) -> usize {
        self.ranks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unsharded(seq_lens: &[i32], bs: usize) -> BatchDescription {
        let w = seq_lens
            .iter()
            .map(|&s| (s as usize).div_ceil(bs))
            .max()
            .unwrap_or(0);
        let mut table = vec![0i32; seq_lens.len() * w];
        let mut next = 1;
        let mut slots = Vec::new();
        for (i, &s) in seq_lens.iter().enumerate() {
            for j in 0..(s as usize).div_ceil(bs) {
                table[i * w + j] = next;
                next += 1;
            }
            let last = s as usize - 1;
            slots.push(table[i * w + last / bs] as i64 * bs as i64 + (last % bs) as i64);
        }
        BatchDescription {
            query_start_loc: (0..=seq_lens.len() as i32).collect(),
            seq_lens: seq_lens.to_vec(),
            block_table: table,
            max_blocks_per_req: w,
            slot_mapping: slots,
            causal: true,
            block_size: bs,
            is_prefilling: None,
        }
    }

    #[test]
    fn ranks_get_their_blocks_and_the_new_token() {
        // 4 ranks of 4-token blocks: 37 tokens = blocks 0..9 (the last holds 1 token).
        let desc = unsharded(&[37, 9, 1], 4);
        let b = DcpDecodeBatch::from_unsharded(&desc, 4).unwrap();
        assert_eq!(
            (0..4).map(|r| b.holding(r)).collect::<Vec<_>>(),
            [3, 2, 2, 1]
        );
        // Request 0: blocks 1..=10, rank r gets global blocks r, r+4, r+8.
        let r1 = b.rank_description(1).unwrap();
        assert_eq!(r1.seq_lens, [9, 4, 1]);
        let w = r1.max_blocks_per_req;
        assert_eq!(&r1.block_table[..3], &[2, 6, 10]);
        // Request 1 (9 tokens: blocks 11, 12, 13): rank 1 holds block 12; request 2 is a
        // placeholder on block 0.
        assert_eq!(r1.block_table[w], 12);
        assert_eq!(r1.block_table[2 * w], 0);
        // The new tokens: position 36 is block 9 -> rank 1, local block 2 (global id 10);
        // position 8 is block 2 -> rank 2; position 0 -> rank 0.
        assert_eq!(r1.slot_mapping, [10 * 4, -1, -1]);
        let r2 = b.rank_description(2).unwrap();
        assert_eq!(r2.slot_mapping, [-1, 13 * 4, -1]);
        let r0 = b.rank_description(0).unwrap();
        assert_eq!(r0.slot_mapping, [-1, -1, 14 * 4]);
        assert_eq!(b.rank_description(3).unwrap().seq_lens, [8, 1, 1]);
    }

    #[test]
    fn batches_that_cannot_be_sharded_are_errors() {
        // A short request before a long one leaves rank 1 with a gap.
        let e = DcpDecodeBatch::from_unsharded(&unsharded(&[3, 40], 4), 2).unwrap_err();
        assert!(e.to_string().contains("longest first"), "{e}");
        // A prefill row.
        let mut d = unsharded(&[10, 3], 4);
        d.query_start_loc = vec![0, 2, 3];
        let e = DcpDecodeBatch::from_unsharded(&d, 2).unwrap_err();
        assert!(e.to_string().contains("one new token per request"), "{e}");
        // Tables of the wrong count or size.
        let l = DcpLayout::new(2, 4).unwrap();
        let t = RankBlockTable {
            block_table: vec![1, 2],
            max_blocks_per_req: 1,
        };
        assert!(DcpDecodeBatch::new(l, &[5], std::slice::from_ref(&t)).is_err());
        assert!(DcpDecodeBatch::new(l, &[5], &[t.clone(), t.clone()]).is_err());
        let narrow = RankBlockTable {
            block_table: vec![1],
            max_blocks_per_req: 1,
        };
        // 17 tokens of 4-token blocks: rank 0 holds blocks 0, 2, 4 (3 blocks > 1 entry).
        let e = DcpDecodeBatch::new(l, &[17], &[narrow.clone(), narrow]).unwrap_err();
        assert!(e.to_string().contains("3 blocks"), "{e}");
        assert!(DcpDecodeBatch::new(l, &[0], &[t.clone(), t]).is_err());
    }
}
