//! Decode context parallelism (DCP): a request's KV cache spread over `N` ranks, each rank
//! attending over its shard and returning output and LSE, the partial results combined with
//! `merge_attn_states`' LSE weighting (vLLM's DCP, §4.1 of the reference).
//!
//! **Layout.** Whole blocks, round-robin: block `j` of a request lives on rank `j mod N` as
//! that rank's local block `j div N` (vLLM's interleaved layout with the interleave size equal
//! to the block size; [`DcpLayout::local_len`] is vLLM's `get_dcp_local_seq_lens`). Why
//! interleaved: as a request decodes, its new blocks go to each rank in turn, so every rank's
//! share and cache grow evenly (a contiguous split would put every new token on the last rank);
//! and why whole blocks: a rank's shard is then an ordinary paged cache with an ordinary block
//! table, so every backend's decode kernel runs on it unchanged.
//!
//! **A rank's batch.** Decode only (query length 1: a rank's keys are not a contiguous range
//! of positions, so the causal rule of a longer query cannot be applied locally). Every rank
//! gets every request's query; request `i`'s new token is written by the rank that owns its
//! position. Rank 0 holds every non-empty request (it owns each request's first block); a
//! request shorter than `r · block_size + 1` tokens has no key on rank `r`. Such a request
//! runs on rank `r` as a one-key placeholder whose result the combine never reads, which is
//! why the batch must list **requests that leave a rank empty last** (in order of decreasing
//! length): then the requests rank `r` holds are its first `holding` rows, and the combine's
//! merge copies the other rows from the ranks before it (`prefill_tokens_with_context` of
//! [`merge_attn_states`](crate::ops::merge_attn_states)) without reading rank `r`'s. A batch
//! in another order is a typed error naming the request.
//!
//! **Combine.** Rank 0's partial result merged with rank 1's, the result with rank 2's, … in
//! f32 per merge, the output stored in the activation dtype after each. The LSE base is read
//! from the impl ([`AttentionImpl::lse_base_on_e`]) and a base-2 LSE is rescaled to natural
//! log before any merge, so a wrong base cannot silently skew the denominators.
//!
//! **Not sharded.** Sliding windows and ALiBi need a key's absolute position, which a rank's
//! local index does not give; attention sinks would be counted once per rank. Such layers
//! are refused.

use std::f32::consts::LN_2;

use crate::attention::{AttentionImpl, AttentionLayer};
use crate::capability::AttentionType;
use crate::device::{Device, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, BatchDescription, CommonAttentionMetadata,
};

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
    /// `get_dcp_local_seq_lens` with interleave = block size).
    pub fn local_len(&self, seq_len: usize, rank: usize) -> usize {
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
        let (n, b) = (layout.world_size, layout.block_size);
        if rank_tables.len() != n {
            return Err(Error::metadata(format!(
                "DCP batch: {} rank block tables for {n} ranks",
                rank_tables.len()
            )));
        }
        let num_reqs = seq_lens.len();
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
                query_start_loc: (0..=num_reqs as i32).collect(),
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

    /// The same batch described as one cache holds it (`desc`: every query length 1, block ids
    /// of one pool), split so that block `j` of a request lives on rank `j mod world_size`
    /// under the same block id: each rank's cache is as large as the pool, and a block id is
    /// used on the one rank that holds it.
    pub fn from_unsharded(desc: &BatchDescription, world_size: usize) -> Result<Self> {
        let layout = DcpLayout::new(world_size, desc.block_size)?;
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
        Self::new(layout, &seq_lens, &tables)
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
    num_reqs: usize,
    /// (requests held, metadata) of ranks 0, 1, … while they hold any.
    ranks: Vec<(usize, Box<dyn AttentionMetadata>)>,
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

/// The vLLM check that an impl can take part in DCP, and the layer features a shard cannot
/// honour.
pub fn check_impl(imp: &dyn AttentionImpl) -> Result<()> {
    if !imp.can_return_lse_for_decode() || !imp.supports_dcp() {
        return Err(Error::config(
            "Decode Context Parallelism (DCP) requires attention implementations to return the \
             softmax LSE during decode, but this impl does not. Try a different backend by \
             setting POLYATTN_BACKEND or disable DCP.",
        ));
    }
    let p = imp.params();
    let refuse = |what: &str| {
        Err(Error::config(format!(
            "decode context parallelism: {what}, so the layer cannot be sharded"
        )))
    };
    if p.attn_type != AttentionType::Decoder {
        return refuse("only decoder self-attention has a sharded KV cache");
    }
    if p.sliding_window.is_some() {
        return refuse("a sliding window needs each key's absolute position");
    }
    if p.alibi_slopes.is_some() {
        return refuse("ALiBi needs each key's absolute position");
    }
    if p.sinks.is_some() {
        return refuse("attention sinks would be counted once per rank");
    }
    Ok(())
}

/// Attention of a decode batch whose KV cache is sharded over `caches` (one per rank of the
/// metadata's layout, all on the query's device): each rank writes the new tokens it owns and
/// attends over its shard, and the partial results are combined into `output` and, when
/// given, `output_lse` (`[num_heads, num_reqs]`, natural log whatever the impl's base).
///
/// `query` / `output` are `[num_reqs, num_heads, head_size]`, `key` / `value`
/// `[num_reqs, num_kv_heads, head_size]` (absent when the layer reads another layer's cache).
#[allow(clippy::too_many_arguments)]
pub fn forward_decode(
    imp: &dyn AttentionImpl,
    layer: &AttentionLayer,
    query: &Tensor,
    key: Option<&Tensor>,
    value: Option<&Tensor>,
    caches: &mut [KvCache],
    metadata: &DcpMetadata,
    output: &mut Tensor,
    mut output_lse: Option<&mut Tensor>,
) -> Result<()> {
    check_impl(imp)?;
    let n = metadata.layout.world_size;
    if caches.len() != n {
        return Err(Error::config(format!(
            "DCP forward: {} caches for {n} ranks",
            caches.len()
        )));
    }
    let t = metadata.num_reqs;
    let p = imp.params();
    if query.shape().first() != Some(&t) {
        return Err(Error::shape(
            "query",
            query.shape(),
            format!("[{t} requests, {}, {}]", p.num_heads, p.head_size),
        ));
    }
    if let Some(l) = output_lse.as_deref() {
        l.expect_shape("output_lse", &[p.num_heads, t])?;
        l.expect_dtype("output_lse", DType::F32)?;
    }
    if t == 0 {
        return Ok(());
    }
    let active = &metadata.ranks;
    if active.len() == 1 {
        // Rank 0 alone holds keys: its result is the answer.
        imp.forward_with_lse(
            layer,
            query,
            key,
            value,
            &mut caches[0],
            active[0].1.as_ref(),
            output,
            output_lse.as_deref_mut(),
        )?;
        if let Some(l) = output_lse {
            to_natural_log(imp, l)?;
        }
        return Ok(());
    }
    let device = query.device().clone();
    let mut partials = Vec::with_capacity(active.len());
    for (r, (holding, md)) in active.iter().enumerate() {
        let mut out = Tensor::zeros(&device, query.shape(), query.dtype())?;
        let mut lse = Tensor::zeros(&device, &[p.num_heads, t], DType::F32)?;
        imp.forward_with_lse(
            layer,
            query,
            key,
            value,
            &mut caches[r],
            md.as_ref(),
            &mut out,
            Some(&mut lse),
        )?;
        to_natural_log(imp, &mut lse)?;
        partials.push(Partial {
            output: out,
            lse,
            holding: *holding,
        });
    }
    combine(&partials, output, output_lse)
}

/// One rank's partial result: `output [T, H, D]` and `lse [H, T]` (natural log), of which the
/// first `holding` tokens attended over keys of that rank.
#[derive(Debug)]
pub struct Partial {
    /// `[T, num_heads, head_size]`.
    pub output: Tensor,
    /// `[num_heads, T]` f32, natural log.
    pub lse: Tensor,
    /// Leading tokens with keys on the rank (the rest are never read).
    pub holding: usize,
}

/// Combines the partial results of ranks 0, 1, … (rank 0 first, holding every token; later
/// ranks holding a non-increasing number of leading tokens) into `output` and `output_lse`:
/// the multi-rank combine after the partials have been gathered.
pub fn combine(
    partials: &[Partial],
    output: &mut Tensor,
    output_lse: Option<&mut Tensor>,
) -> Result<()> {
    let Some(first) = partials.first() else {
        return Err(Error::config("DCP combine: no partial results"));
    };
    let t = first.output.shape().first().copied().unwrap_or(0);
    if first.holding != t {
        return Err(Error::config(format!(
            "DCP combine: rank 0 holds {} of {t} tokens; it holds every request's first block",
            first.holding
        )));
    }
    for w in partials.windows(2) {
        if w[1].holding > w[0].holding {
            return Err(Error::config(
                "DCP combine: later ranks hold no more leading tokens than earlier ones",
            ));
        }
    }
    if partials.len() == 1 {
        output.copy_from(&first.output)?;
        if let Some(l) = output_lse {
            l.copy_from(&first.lse)?;
        }
        return Ok(());
    }
    let device = first.output.device().clone();
    let shape = first.output.shape().to_vec();
    let dtype = first.output.dtype();
    // Two accumulators in turn; the last merge writes the caller's tensors.
    let mut acc: Option<(Tensor, Tensor)> = None;
    let mut spare: Option<(Tensor, Tensor)> = None;
    let last = partials.len() - 1;
    let mut output_lse = output_lse;
    for (i, part) in partials.iter().enumerate().skip(1) {
        let (acc_out, acc_lse) = match &acc {
            Some((o, l)) => (o, l),
            None => (&first.output, &first.lse),
        };
        if i == last {
            return crate::ops::merge_attn_states(
                output,
                &part.output,
                &part.lse,
                acc_out,
                acc_lse,
                output_lse.take(),
                Some(part.holding),
            );
        }
        let (mut o, mut l) = match spare.take() {
            Some(pair) => pair,
            None => (
                Tensor::zeros(&device, &shape, dtype)?,
                Tensor::zeros(&device, &[shape[1], t], DType::F32)?,
            ),
        };
        crate::ops::merge_attn_states(
            &mut o,
            &part.output,
            &part.lse,
            acc_out,
            acc_lse,
            Some(&mut l),
            Some(part.holding),
        )?;
        spare = acc.replace((o, l));
    }
    unreachable!("the loop returns at the last partial")
}

/// One rank of a decode batch whose ranks run on separate CUDA devices of one process:
/// its impl, inputs and cache on its device, and its metadata from
/// [`DcpDecodeBatch::build_rank`] (`None` for a rank that holds no key).
pub struct DcpRank<'a> {
    /// The rank's impl (a layer built on the rank's backend).
    pub imp: &'a dyn AttentionImpl,
    /// `[num_reqs, num_heads, head_size]`, every request's query.
    pub query: &'a Tensor,
    /// `[num_reqs, num_kv_heads, head_size]` new keys (absent for a layer reading another's
    /// cache).
    pub key: Option<&'a Tensor>,
    /// New values, as `key`.
    pub value: Option<&'a Tensor>,
    /// The rank's shard of the cache.
    pub cache: &'a mut KvCache,
    /// The rank's metadata.
    pub metadata: Option<&'a dyn AttentionMetadata>,
    /// `[num_reqs, num_heads, head_size]`: the combined result, written on every rank.
    pub output: &'a mut Tensor,
}

/// [`forward_decode`] with one rank per CUDA device: every rank attends over its shard on its
/// own device, the partial results (output and natural-log LSE) are all-gathered through
/// NCCL, and each device combines them, so every rank ends with the whole result (what a
/// tensor-parallel layer above needs).
pub fn forward_decode_across(
    comms: &mut crate::device::cuda::NcclComms,
    layer: &AttentionLayer,
    batch: &DcpDecodeBatch,
    ranks: &mut [DcpRank<'_>],
) -> Result<()> {
    let n = batch.layout.world_size;
    if ranks.len() != n || comms.world_size() != n {
        return Err(Error::config(format!(
            "DCP across devices: {} ranks and {} NCCL ranks for a layout of {n}",
            ranks.len(),
            comms.world_size()
        )));
    }
    let t = batch.num_reqs();
    let active = (0..n).take_while(|&r| batch.holding(r) > 0).count();
    let mut partials: Vec<(Tensor, Tensor)> = Vec::with_capacity(active);
    for (r, rank) in ranks.iter_mut().enumerate() {
        check_impl(rank.imp)?;
        let p = rank.imp.params();
        if rank.query.shape().first() != Some(&t) {
            return Err(Error::shape(
                "query",
                rank.query.shape(),
                format!("[{t} requests, {}, {}]", p.num_heads, p.head_size),
            ));
        }
        if r >= active {
            // Holds no key: it still writes nothing and receives the others' parts.
            continue;
        }
        let md = rank.metadata.ok_or_else(|| {
            Error::config(format!(
                "DCP rank {r} holds keys of {} requests but was given no metadata",
                batch.holding(r)
            ))
        })?;
        let device = rank.query.device().clone();
        let mut out = Tensor::zeros(&device, rank.query.shape(), rank.query.dtype())?;
        let mut lse = Tensor::zeros(&device, &[p.num_heads, t], DType::F32)?;
        rank.imp.forward_with_lse(
            layer,
            rank.query,
            rank.key,
            rank.value,
            rank.cache,
            md,
            &mut out,
            Some(&mut lse),
        )?;
        to_natural_log(rank.imp, &mut lse)?;
        partials.push((out, lse));
    }
    if partials.is_empty() {
        return Ok(());
    }
    // Receive buffers: on each device, one output and one LSE per active rank.
    let mut outs: Vec<Vec<Tensor>> = Vec::with_capacity(n);
    let mut lses: Vec<Vec<Tensor>> = Vec::with_capacity(n);
    for rank in ranks.iter() {
        let device = rank.query.device().clone();
        let mut o = Vec::with_capacity(n);
        let mut l = Vec::with_capacity(n);
        for (po, pl) in &partials {
            o.push(Tensor::zeros(&device, po.shape(), po.dtype())?);
            l.push(Tensor::zeros(&device, pl.shape(), DType::F32)?);
        }
        outs.push(o);
        lses.push(l);
    }
    // Ranks past the active ones send nothing; every device receives.
    gather_active(comms, &partials, &mut outs, &mut lses)?;
    for (d, rank) in ranks.iter_mut().enumerate() {
        let parts: Vec<Partial> = outs[d]
            .drain(..)
            .zip(lses[d].drain(..))
            .enumerate()
            .map(|(r, (output, lse))| Partial {
                output,
                lse,
                holding: batch.holding(r),
            })
            .collect();
        combine(&parts, rank.output, None)?;
    }
    Ok(())
}

/// Broadcasts each active rank's partial (output, LSE) to every device.
fn gather_active(
    comms: &mut crate::device::cuda::NcclComms,
    partials: &[(Tensor, Tensor)],
    outs: &mut [Vec<Tensor>],
    lses: &mut [Vec<Tensor>],
) -> Result<()> {
    let roots: Vec<(usize, &Tensor)> = partials.iter().map(|p| &p.0).enumerate().collect();
    comms.broadcast_parts(&roots, outs)?;
    let roots: Vec<(usize, &Tensor)> = partials.iter().map(|p| &p.1).enumerate().collect();
    comms.broadcast_parts(&roots, lses)
}

/// Rescales an impl's LSE to natural log when the impl reports base 2 (`log2 Σ exp`):
/// `ln x = log2 x · ln 2`. A small host round trip (one value per head and token), taken only
/// for impls that declare base 2; the built-in impls are base e.
fn to_natural_log(imp: &dyn AttentionImpl, lse: &mut Tensor) -> Result<()> {
    if imp.lse_base_on_e() {
        return Ok(());
    }
    let v: Vec<f32> = lse.to_f32_vec()?.into_iter().map(|x| x * LN_2).collect();
    let shape = lse.shape().to_vec();
    *lse = Tensor::from_f32(lse.device(), &v, &shape, DType::F32)?;
    Ok(())
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
    }

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
