//! Per-batch attention metadata: vLLM's `CommonAttentionMetadata`, its one validation step,
//! the decode/prefill split helpers, and the [`AttentionMetadataBuilder`] contract.
//!
//! The runner builds one [`CommonAttentionMetadata`] per step; each backend's builder turns it
//! into what its kernels consume. Validation happens here, once, when the metadata is built:
//! kernels then trust every offset, block id and slot, so a bad batch is an [`Error`] on the
//! host and never an out-of-bounds access on a device.

use std::any::Any;
use std::fmt::Debug;

use crate::capability::GraphCaptureSupport;
use crate::device::{Device, Tensor};
use crate::error::{Error, Result};

/// vLLM's `PAD_SLOT_ID`: a slot-mapping entry that writes nothing.
pub const PAD_SLOT_ID: i64 = -1;
/// vLLM's `NULL_BLOCK_ID`: block 0 is reserved and never allocated to a request.
pub const NULL_BLOCK_ID: i32 = 0;

/// The host-side description of a batch, before validation. Field meanings are vLLM's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchDescription {
    /// `[num_reqs + 1]` exclusive prefix sum of query lengths, starting at 0.
    pub query_start_loc: Vec<i32>,
    /// `[num_reqs]` KV length per request after this step (context + new tokens).
    pub seq_lens: Vec<i32>,
    /// `[num_reqs][max_blocks_per_req]` physical block ids, row-major.
    pub block_table: Vec<i32>,
    /// Width of each block-table row.
    pub max_blocks_per_req: usize,
    /// Cache slot of each new token (`block * block_size + offset`), or −1 (PAD_SLOT_ID):
    /// at least `num_tokens` entries; entries past `num_tokens` (a slot mapping padded to a
    /// captured graph's token count) must be −1 and are dropped by validation.
    pub slot_mapping: Vec<i64>,
    /// Causal (decoder) attention.
    pub causal: bool,
    /// Tokens per KV-cache block.
    pub block_size: usize,
    /// Optional `[num_reqs]`: true while a request is still prefilling its prompt.
    pub is_prefilling: Option<Vec<bool>>,
}

/// Copies of the metadata arrays on the backend's device.
#[derive(Clone, Debug)]
pub struct DeviceMetadata {
    /// `[num_reqs + 1]` i32.
    pub query_start_loc: Tensor,
    /// `[num_reqs]` i32.
    pub seq_lens: Tensor,
    /// `[num_reqs, max_blocks_per_req]` i32.
    pub block_table: Tensor,
    /// `[num_tokens]` i64.
    pub slot_mapping: Tensor,
}

impl DeviceMetadata {
    /// `None` when every array already lives on `device`, else copies of them there (a
    /// builder's uploads when the batch was described on another device).
    pub fn copies_on(&self, device: &Device) -> Result<Option<DeviceMetadata>> {
        let arrays = [
            &self.query_start_loc,
            &self.seq_lens,
            &self.block_table,
            &self.slot_mapping,
        ];
        if arrays.iter().all(|t| t.device() == device) {
            return Ok(None);
        }
        Ok(Some(DeviceMetadata {
            query_start_loc: self.query_start_loc.to_device(device)?,
            seq_lens: self.seq_lens.to_device(device)?,
            block_table: self.block_table.to_device(device)?,
            slot_mapping: self.slot_mapping.to_device(device)?,
        }))
    }
}

/// Validated, backend-neutral metadata of one batch (vLLM's `CommonAttentionMetadata`).
///
/// Construct it with [`CommonAttentionMetadata::new`]; the fields are read through accessors
/// so that nothing can change them after validation.
#[derive(Clone, Debug)]
pub struct CommonAttentionMetadata {
    desc: BatchDescription,
    num_reqs: usize,
    num_actual_tokens: usize,
    max_query_len: usize,
    max_seq_len: usize,
    min_cache_blocks: usize,
    /// Shared, not copied, by clones (builders keep a clone in their metadata: cloning the
    /// tensors would copy four arrays on the device every step).
    device: std::sync::Arc<DeviceMetadata>,
}

/// How a reordered batch splits into decodes (first) and prefills (after).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodePrefillSplit {
    /// Requests treated as decodes.
    pub num_decodes: usize,
    /// Requests treated as prefills.
    pub num_prefills: usize,
    /// Tokens of the decode requests.
    pub num_decode_tokens: usize,
    /// Tokens of the prefill requests.
    pub num_prefill_tokens: usize,
}

impl CommonAttentionMetadata {
    /// Validates `desc` and uploads its arrays to `device`.
    ///
    /// Checks: `query_start_loc` starts at 0 and never decreases; one seq_len per request;
    /// each query length ≤ its seq_len; the block table is wide enough for every seq_len;
    /// every block id a request uses is ≥ 0; every slot is −1 or ≥ 0; one slot per token,
    /// then only −1 (padding, dropped here). The cache is not known yet: the metadata
    /// records the fewest blocks a cache needs for every block id and slot it uses
    /// ([`Self::min_cache_blocks`]), and the forward checks the cache against that.
    pub fn new(device: &Device, mut desc: BatchDescription) -> Result<Self> {
        let v = validate(&desc)?;
        let num_reqs = v.num_reqs;
        let num_actual_tokens = *desc.query_start_loc.last().unwrap_or(&0) as usize;
        desc.slot_mapping.truncate(num_actual_tokens);
        let dev = DeviceMetadata {
            query_start_loc: Tensor::from_i32(device, &desc.query_start_loc, &[num_reqs + 1])?,
            seq_lens: Tensor::from_i32(device, &desc.seq_lens, &[num_reqs])?,
            block_table: Tensor::from_i32(
                device,
                &desc.block_table,
                &[num_reqs, desc.max_blocks_per_req],
            )?,
            slot_mapping: Tensor::from_i64(device, &desc.slot_mapping, &[desc.slot_mapping.len()])?,
        };
        Ok(Self::assemble(desc, &v, dev))
    }

    /// The metadata of a validated, truncated description and its device arrays.
    fn assemble(desc: BatchDescription, v: &Validated, dev: DeviceMetadata) -> Self {
        CommonAttentionMetadata {
            num_actual_tokens: *desc.query_start_loc.last().unwrap_or(&0) as usize,
            desc,
            num_reqs: v.num_reqs,
            max_query_len: v.max_query_len,
            max_seq_len: v.max_seq_len,
            min_cache_blocks: v.min_cache_blocks,
            device: std::sync::Arc::new(dev),
        }
    }

    /// [`CommonAttentionMetadata::new`] with the arrays written in place into `arrays` (a
    /// previous batch's, taken back with [`CommonAttentionMetadata::into_device_arrays`])
    /// instead of uploaded anew: the device addresses stay put, so a captured graph that
    /// reads them (a model operation that writes the KV cache through the slot mapping)
    /// sees this batch's values on its next replay. An error when an array lives on another
    /// device or has another shape than this batch needs.
    pub fn new_in(
        device: &Device,
        mut desc: BatchDescription,
        arrays: DeviceMetadata,
    ) -> Result<Self> {
        let v = validate(&desc)?;
        let num_reqs = v.num_reqs;
        let num_actual_tokens = *desc.query_start_loc.last().unwrap_or(&0) as usize;
        desc.slot_mapping.truncate(num_actual_tokens);
        let mut dev = arrays;
        for (what, t, shape) in [
            ("query_start_loc", &dev.query_start_loc, vec![num_reqs + 1]),
            ("seq_lens", &dev.seq_lens, vec![num_reqs]),
            (
                "block_table",
                &dev.block_table,
                vec![num_reqs, desc.max_blocks_per_req],
            ),
            (
                "slot_mapping",
                &dev.slot_mapping,
                vec![desc.slot_mapping.len()],
            ),
        ] {
            if t.device() != device || t.shape() != shape.as_slice() {
                return Err(Error::config(format!(
                    "metadata array {what} {:?} on {} cannot hold this batch's {shape:?} on {}",
                    t.shape(),
                    t.device().kind().as_str(),
                    device.kind().as_str()
                )));
            }
        }
        dev.query_start_loc.write_i32(&desc.query_start_loc)?;
        dev.seq_lens.write_i32(&desc.seq_lens)?;
        dev.block_table.write_i32(&desc.block_table)?;
        dev.slot_mapping.write_i64(&desc.slot_mapping)?;
        Ok(Self::assemble(desc, &v, dev))
    }

    /// The device arrays, for [`CommonAttentionMetadata::new_in`]; `None` while a clone of
    /// this metadata (a backend's built metadata holds one) is alive.
    pub fn into_device_arrays(self) -> Option<DeviceMetadata> {
        std::sync::Arc::try_unwrap(self.device).ok()
    }

    /// Number of requests.
    pub fn num_reqs(&self) -> usize {
        self.num_reqs
    }
    /// Total new tokens in the batch.
    pub fn num_actual_tokens(&self) -> usize {
        self.num_actual_tokens
    }
    /// Longest query.
    pub fn max_query_len(&self) -> usize {
        self.max_query_len
    }
    /// Longest sequence.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }
    /// Host copy of `query_start_loc`.
    pub fn query_start_loc_cpu(&self) -> &[i32] {
        &self.desc.query_start_loc
    }
    /// Host copy of `seq_lens`.
    pub fn seq_lens_cpu(&self) -> &[i32] {
        &self.desc.seq_lens
    }
    /// Host copy of the block table, row-major `[num_reqs][max_blocks_per_req]`.
    pub fn block_table_cpu(&self) -> &[i32] {
        &self.desc.block_table
    }
    /// One request's block-table row.
    pub fn block_table_row(&self, req: usize) -> &[i32] {
        let w = self.desc.max_blocks_per_req;
        &self.desc.block_table[req * w..(req + 1) * w]
    }
    /// Width of a block-table row.
    pub fn max_blocks_per_req(&self) -> usize {
        self.desc.max_blocks_per_req
    }
    /// Host copy of the slot mapping.
    pub fn slot_mapping_cpu(&self) -> &[i64] {
        &self.desc.slot_mapping
    }
    /// Causal attention.
    pub fn causal(&self) -> bool {
        self.desc.causal
    }
    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.desc.block_size
    }
    /// `Ok` when the batch's block size is `block_size`, the KV-cache group's a builder
    /// serves; the error every builder gives otherwise.
    pub fn expect_block_size(&self, block_size: usize) -> Result<()> {
        if self.block_size() != block_size {
            return Err(Error::metadata(format!(
                "batch block size {} differs from the KV-cache group's {block_size}",
                self.block_size()
            )));
        }
        Ok(())
    }
    /// The fewest blocks a KV cache must have for this batch: one more than the largest
    /// block id a request reads or a slot writes (0 when it touches no block).
    pub fn min_cache_blocks(&self) -> usize {
        self.min_cache_blocks
    }
    /// The device copies.
    pub fn device(&self) -> &DeviceMetadata {
        &self.device
    }
    /// The description it was built from.
    pub fn description(&self) -> &BatchDescription {
        &self.desc
    }

    /// Query length of request `i`.
    pub fn query_len(&self, i: usize) -> usize {
        (self.desc.query_start_loc[i + 1] - self.desc.query_start_loc[i]) as usize
    }

    /// vLLM's `naive_query_lens()`.
    pub fn query_lens(&self) -> Vec<usize> {
        (0..self.num_reqs).map(|i| self.query_len(i)).collect()
    }

    /// Tokens already in the cache before this step, per request: `seq_len − query_len`
    /// (vLLM derives it the same way; there is no field).
    pub fn num_computed_tokens(&self) -> Vec<usize> {
        (0..self.num_reqs)
            .map(|i| self.desc.seq_lens[i] as usize - self.query_len(i))
            .collect()
    }

    /// Checks a cascade request (vLLM's rules, §2.3 / §6.4) and returns the shared prefix's
    /// blocks, or `None` for `common_prefix_len == 0`: the prefix must be a whole number of
    /// blocks, already cached for every request (≤ the smallest context, so the prefix pass
    /// needs no mask), and every request's block table must start with the same blocks.
    pub fn cascade_prefix_blocks(&self, common_prefix_len: usize) -> Result<Option<&[i32]>> {
        if common_prefix_len == 0 {
            return Ok(None);
        }
        let bs = self.block_size();
        if !common_prefix_len.is_multiple_of(bs) {
            return Err(Error::metadata(format!(
                "common_prefix_len {common_prefix_len} is not a multiple of the block size {bs}"
            )));
        }
        let min_computed = self.num_computed_tokens().into_iter().min().unwrap_or(0);
        if common_prefix_len > min_computed {
            return Err(Error::metadata(format!(
                "common_prefix_len {common_prefix_len} exceeds the smallest cached context \
                 ({min_computed} tokens): the prefix must already be in the cache for every request"
            )));
        }
        let n = common_prefix_len / bs;
        let first = &self.block_table_row(0)[..n];
        for r in 1..self.num_reqs() {
            if &self.block_table_row(r)[..n] != first {
                return Err(Error::metadata(format!(
                    "common_prefix_len {common_prefix_len}: request {r} does not share the \
                     first {n} blocks of request 0"
                )));
            }
        }
        Ok(Some(first))
    }

    /// vLLM's `split_decodes_and_prefills` for a batch already ordered decodes-first:
    /// requests whose query length is ≤ `decode_threshold` (and that are not still
    /// prefilling, when `is_prefilling` is known and `treat_short_extends_as_decodes` is
    /// false) count as decodes until the first one that is not. With `require_uniform`, the
    /// decode region must have one query length.
    pub fn split_decodes_and_prefills(
        &self,
        decode_threshold: usize,
        require_uniform: bool,
        treat_short_extends_as_decodes: bool,
    ) -> DecodePrefillSplit {
        let lens = self.query_lens();
        let n = self.num_reqs;
        let all_tokens = self.num_actual_tokens;
        if n == 0 {
            return DecodePrefillSplit {
                num_decodes: 0,
                num_prefills: 0,
                num_decode_tokens: 0,
                num_prefill_tokens: 0,
            };
        }
        let is_decode = |i: usize| {
            let short = lens[i] <= decode_threshold;
            let prefilling = !treat_short_extends_as_decodes
                && self.desc.is_prefilling.as_ref().is_some_and(|p| p[i]);
            short && !prefilling
        };
        let boundary = if require_uniform {
            // A uniform (possibly zero-padded) decode region: it ends at the first row whose
            // length differs from row 0's.
            let first = lens[0];
            if first > decode_threshold || !is_decode(0) {
                0
            } else {
                (0..n)
                    .find(|&i| lens[i] != first && lens[i] != 0)
                    .unwrap_or(n)
            }
        } else {
            (0..n).find(|&i| !is_decode(i)).unwrap_or(n)
        };
        let decode_tokens = self.desc.query_start_loc[boundary] as usize;
        DecodePrefillSplit {
            num_decodes: boundary,
            num_prefills: n - boundary,
            num_decode_tokens: decode_tokens,
            num_prefill_tokens: all_tokens - decode_tokens,
        }
    }
}

/// The order vLLM's `reorder_batch_to_split_decodes_and_prefills` puts requests in: four
/// stable regions — decodes (context > 0, query ≤ threshold, done prefilling), short extends
/// (context > 0, query ≤ threshold, still prefilling), long extends (context > 0, query >
/// threshold), prefills (no context). Returns the request indices in their new order; the
/// runner permutes its batch with it before building [`CommonAttentionMetadata`].
pub fn decode_first_order(
    query_lens: &[usize],
    num_computed_tokens: &[usize],
    is_prefilling: Option<&[bool]>,
    decode_threshold: usize,
) -> Vec<usize> {
    let region = |i: usize| {
        let prefilling = is_prefilling.is_some_and(|p| p[i]);
        match (
            num_computed_tokens[i] > 0,
            query_lens[i] <= decode_threshold,
        ) {
            (false, _) => 3,
            (true, false) => 2,
            (true, true) if prefilling => 1,
            (true, true) => 0,
        }
    };
    let mut order: Vec<usize> = (0..query_lens.len()).collect();
    order.sort_by_key(|&i| region(i)); // stable
    order
}

/// What validation learns of a batch.
struct Validated {
    num_reqs: usize,
    max_query_len: usize,
    max_seq_len: usize,
    min_cache_blocks: usize,
}

fn validate(d: &BatchDescription) -> Result<Validated> {
    if d.query_start_loc.is_empty() {
        return Err(Error::metadata(
            "query_start_loc is empty; it needs num_reqs + 1 entries starting at 0",
        ));
    }
    let num_reqs = d.query_start_loc.len() - 1;
    if d.query_start_loc[0] != 0 {
        return Err(Error::metadata(format!(
            "query_start_loc[0] = {}; it must start at 0",
            d.query_start_loc[0]
        )));
    }
    if d.seq_lens.len() != num_reqs {
        return Err(Error::metadata(format!(
            "seq_lens has {} entries for {num_reqs} requests (query_start_loc has {})",
            d.seq_lens.len(),
            d.query_start_loc.len()
        )));
    }
    if d.block_size == 0 {
        return Err(Error::metadata("block_size is 0"));
    }
    let table_len = num_reqs.checked_mul(d.max_blocks_per_req).ok_or_else(|| {
        Error::overflow(
            "block_table",
            format!(
                "num_reqs {num_reqs} × max_blocks_per_req {}",
                d.max_blocks_per_req
            ),
        )
    })?;
    if d.block_table.len() != table_len {
        return Err(Error::metadata(format!(
            "block_table has {} entries; expected num_reqs × max_blocks_per_req = {num_reqs} × {}",
            d.block_table.len(),
            d.max_blocks_per_req
        )));
    }
    if let Some(p) = &d.is_prefilling {
        if p.len() != num_reqs {
            return Err(Error::metadata(format!(
                "is_prefilling has {} entries for {num_reqs} requests",
                p.len()
            )));
        }
    }
    let (mut max_q, mut max_s, mut max_block) = (0usize, 0usize, None::<usize>);
    for i in 0..num_reqs {
        let (a, b) = (d.query_start_loc[i], d.query_start_loc[i + 1]);
        if b < a {
            return Err(Error::metadata(format!(
                "query_start_loc decreases at request {i}: {a} then {b}; it must be monotonic"
            )));
        }
        let q = (b - a) as usize;
        let s = d.seq_lens[i];
        if s < 0 {
            return Err(Error::metadata(format!("seq_lens[{i}] = {s} is negative")));
        }
        let s = s as usize;
        if q > s {
            return Err(Error::metadata(format!(
                "request {i}: query length {q} exceeds its sequence length {s} \
                 (seq_len counts context plus new tokens)"
            )));
        }
        let needed = s.div_ceil(d.block_size);
        if needed > d.max_blocks_per_req {
            return Err(Error::metadata(format!(
                "request {i}: seq_len {s} needs {needed} blocks of {} tokens but the block \
                 table row has {}",
                d.block_size, d.max_blocks_per_req
            )));
        }
        for (j, &b) in d.block_table[i * d.max_blocks_per_req..][..needed]
            .iter()
            .enumerate()
        {
            if b < 0 {
                return Err(Error::metadata(format!(
                    "request {i}: block_table[{i}][{j}] = {b} is negative (block ids are ≥ 0)"
                )));
            }
            max_block = max_block.max(Some(b as usize));
        }
        max_q = max_q.max(q);
        max_s = max_s.max(s);
    }
    let num_tokens = d.query_start_loc[num_reqs] as usize;
    if d.slot_mapping.len() < num_tokens {
        return Err(Error::metadata(format!(
            "slot_mapping has {} entries for {num_tokens} tokens; it needs one per token \
             (-1, PAD_SLOT_ID, for a token that writes nothing)",
            d.slot_mapping.len()
        )));
    }
    if let Some(t) = d.slot_mapping[num_tokens..]
        .iter()
        .position(|&s| s != PAD_SLOT_ID)
    {
        return Err(Error::metadata(format!(
            "slot_mapping[{}] = {} is past the batch's {num_tokens} tokens: padding entries \
             must be -1 (PAD_SLOT_ID)",
            num_tokens + t,
            d.slot_mapping[num_tokens + t]
        )));
    }
    for (t, &s) in d.slot_mapping[..num_tokens].iter().enumerate() {
        if s == PAD_SLOT_ID {
            continue;
        }
        if s < 0 {
            return Err(Error::metadata(format!(
                "slot_mapping[{t}] = {s} is invalid: expected -1 (PAD_SLOT_ID) or a slot ≥ 0"
            )));
        }
        max_block = max_block.max(Some(s as usize / d.block_size));
    }
    // max_block ≤ i64::MAX / 1: adding one cannot wrap a usize.
    let min_cache_blocks = max_block.map_or(0, |b| b + 1);
    Ok(Validated {
        num_reqs,
        max_query_len: max_q,
        max_seq_len: max_s,
        min_cache_blocks,
    })
}

/// A validated shared-prefix (cascade) request: every request's first `prefix_len` keys are
/// the same cached blocks (checked by
/// [`CommonAttentionMetadata::cascade_prefix_blocks`]), so one prefix pass over them serves
/// the whole batch and a suffix pass takes each request's own keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CascadePlan {
    /// Tokens of the shared prefix (a multiple of the block size, cached for every request).
    pub prefix_len: usize,
}

impl CascadePlan {
    /// The plan for `common_prefix_len` (`None` for 0), after vLLM's checks.
    pub fn for_batch(
        common: &CommonAttentionMetadata,
        common_prefix_len: usize,
    ) -> Result<Option<CascadePlan>> {
        Ok(common
            .cascade_prefix_blocks(common_prefix_len)?
            .map(|_| CascadePlan {
                prefix_len: common_prefix_len,
            }))
    }
}

/// What every backend's metadata holds besides its kernels' own arrays: the validated common
/// metadata and the cascade request. The forward driver ([`crate::forward`]) reads these.
pub trait BatchMetadata: AttentionMetadata {
    /// The validated common metadata of the batch.
    fn common(&self) -> &CommonAttentionMetadata;
    /// The cascade request, when the batch was built with `common_prefix_len > 0`.
    fn cascade(&self) -> Option<CascadePlan>;
}

/// Implements [`AttentionMetadata`] and [`BatchMetadata`] for a backend's metadata type from
/// its fields `common: CommonAttentionMetadata` and `cascade: Option<CascadePlan>` (or, with
/// `no_cascade`, for a backend that runs no cascade).
macro_rules! batch_metadata {
    ($t:ty) => {
        $crate::metadata::batch_metadata!(@any $t);
        impl $crate::metadata::BatchMetadata for $t {
            fn common(&self) -> &$crate::metadata::CommonAttentionMetadata {
                &self.common
            }

            fn cascade(&self) -> Option<$crate::metadata::CascadePlan> {
                self.cascade
            }
        }
    };
    ($t:ty, no_cascade) => {
        $crate::metadata::batch_metadata!(@any $t);
        impl $crate::metadata::BatchMetadata for $t {
            fn common(&self) -> &$crate::metadata::CommonAttentionMetadata {
                &self.common
            }

            fn cascade(&self) -> Option<$crate::metadata::CascadePlan> {
                None
            }
        }
    };
    (@any $t:ty) => {
        impl $crate::metadata::AttentionMetadata for $t {
            fn as_any(&self) -> &dyn ::std::any::Any {
                self
            }
        }
    };
}
pub(crate) use batch_metadata;

/// Backend-specific metadata produced by a builder (vLLM's `AttentionMetadata` marker).
pub trait AttentionMetadata: Any + Debug + Send + Sync {
    /// For the impl to downcast to its own type.
    fn as_any(&self) -> &dyn Any;
}

impl dyn AttentionMetadata {
    /// The metadata as the impl's own type `T`, or [`Error::MetadataMismatch`] naming
    /// `impl_name` when another backend's builder made it.
    pub fn downcast<T: AttentionMetadata>(&self, impl_name: &str) -> Result<&T> {
        self.as_any()
            .downcast_ref::<T>()
            .ok_or_else(|| Error::MetadataMismatch {
                impl_name: impl_name.into(),
                got: format!("{self:?}").chars().take(60).collect(),
            })
    }
}

/// Turns [`CommonAttentionMetadata`] into a backend's own metadata, once per step
/// (vLLM's `AttentionMetadataBuilder`).
pub trait AttentionMetadataBuilder: Send + Sync {
    /// Which batches the built metadata may be graph-captured for.
    fn graph_capture_support(&self) -> GraphCaptureSupport;

    /// Query length at or below which a request is treated as a decode and should be moved
    /// to the front of the batch; `None`: no reordering wanted.
    fn reorder_batch_threshold(&self) -> Option<usize> {
        None
    }

    /// Builds the metadata. `common_prefix_len` > 0 asks for cascade attention over that
    /// many shared tokens; `fast_build` trades kernel speed for build speed.
    fn build(
        &self,
        common_prefix_len: usize,
        common: &CommonAttentionMetadata,
        fast_build: bool,
    ) -> Result<Box<dyn AttentionMetadata>>;

    /// Builds metadata for graph capture (default: a plain build without cascade).
    fn build_for_graph_capture(
        &self,
        common: &CommonAttentionMetadata,
    ) -> Result<Box<dyn AttentionMetadata>> {
        self.build(0, common, false)
    }

    /// Whether cascade attention pays off for this batch (vLLM's heuristic hook).
    fn use_cascade_attention(&self, _common_prefix_len: usize, _query_lens: &[usize]) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc() -> BatchDescription {
        // Two requests: a decode (1 new token, 5 total) and a prefill (3 new, 3 total).
        BatchDescription {
            query_start_loc: vec![0, 1, 4],
            seq_lens: vec![5, 3],
            block_table: vec![1, 2, 3, 0],
            max_blocks_per_req: 2,
            slot_mapping: vec![2 * 4, 3 * 4, 3 * 4 + 1, -1],
            causal: true,
            block_size: 4,
            is_prefilling: None,
        }
    }

    #[test]
    fn valid_batch_builds() {
        let m = CommonAttentionMetadata::new(&Device::cpu(), desc()).unwrap();
        assert_eq!(m.num_actual_tokens(), 4);
        assert_eq!(m.max_query_len(), 3);
        assert_eq!(m.max_seq_len(), 5);
        assert_eq!(m.num_computed_tokens(), vec![4, 0]);
        assert_eq!(m.min_cache_blocks(), 4);
        let s = m.split_decodes_and_prefills(1, false, true);
        assert_eq!(
            s,
            DecodePrefillSplit {
                num_decodes: 1,
                num_prefills: 1,
                num_decode_tokens: 1,
                num_prefill_tokens: 3
            }
        );
    }

    #[test]
    fn decode_first_order_is_stable_by_region() {
        // prefill, decode, long extend, decode, short extend
        let q = [5, 1, 9, 1, 1];
        let c = [0, 10, 4, 3, 2];
        let p = [true, false, true, false, true];
        assert_eq!(decode_first_order(&q, &c, Some(&p), 1), vec![1, 3, 4, 2, 0]);
        assert_eq!(decode_first_order(&q, &c, None, 1), vec![1, 3, 4, 2, 0]);
        assert_eq!(decode_first_order(&q, &c, None, 10), vec![1, 2, 3, 4, 0]);
        assert_eq!(
            decode_first_order(&q, &c, Some(&p), 10),
            vec![1, 3, 2, 4, 0]
        );
    }

    #[test]
    fn new_in_rewrites_the_arrays_in_place() {
        let dev = Device::cpu();
        let first = CommonAttentionMetadata::new(&dev, desc()).unwrap();
        // A clone alive (a backend's metadata): the arrays cannot be taken back.
        let held = first.clone();
        assert!(first.into_device_arrays().is_none());
        let arrays = held.into_device_arrays().unwrap();
        let mut next = desc();
        next.seq_lens = vec![6, 4];
        next.slot_mapping = vec![2 * 4 + 1, 3 * 4 + 1, 3 * 4 + 2, 3 * 4 + 3];
        let ptr = arrays.slot_mapping.as_cpu().map(|s| match s {
            crate::device::CpuStorage::I64(v) => v.as_ptr(),
            _ => std::ptr::null(),
        });
        let m = CommonAttentionMetadata::new_in(&dev, next, arrays).unwrap();
        assert_eq!(m.slot_mapping_cpu(), &[9, 13, 14, 15]);
        let slots = match m.device().slot_mapping.as_cpu() {
            Some(crate::device::CpuStorage::I64(v)) => v.clone(),
            other => panic!("slot mapping storage {other:?}"),
        };
        assert_eq!(slots, vec![9, 13, 14, 15]);
        assert_eq!(m.device().seq_lens.to_i32_vec().unwrap(), vec![6, 4]);
        let again = m.device().slot_mapping.as_cpu().map(|s| match s {
            crate::device::CpuStorage::I64(v) => v.as_ptr(),
            _ => std::ptr::null(),
        });
        assert_eq!(ptr, again, "the slot mapping moved");
        // Another batch shape does not fit the arrays: an error, not new buffers.
        let mut wider = desc();
        wider.max_blocks_per_req = 3;
        wider.block_table = vec![1, 2, 0, 3, 0, 0];
        let e = CommonAttentionMetadata::new_in(&dev, wider, m.into_device_arrays().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("block_table"), "{e}");
    }

    fn err(d: BatchDescription) -> String {
        match CommonAttentionMetadata::new(&Device::cpu(), d) {
            Err(Error::Metadata(m)) => m,
            other => panic!("expected a metadata error, got {other:?}"),
        }
    }

    #[test]
    fn each_invariant_has_its_error() {
        let mut d = desc();
        d.block_table[1] = -4;
        assert!(err(d).contains("block_table[0][1] = -4 is negative"));
        let mut d = desc();
        d.slot_mapping[0] = -2;
        assert!(err(d).contains("slot_mapping[0] = -2 is invalid"));
        let mut d = desc();
        d.slot_mapping.extend([-1, 7]);
        assert!(err(d).contains("slot_mapping[5] = 7 is past the batch's 4 tokens"));
        let mut d = desc();
        d.seq_lens[1] = 2;
        assert!(err(d).contains("query length 3 exceeds its sequence length 2"));
        let mut d = desc();
        d.query_start_loc = vec![0, 3, 1];
        d.slot_mapping.truncate(1);
        assert!(err(d).contains("monotonic"));
        let mut d = desc();
        d.seq_lens[0] = 9;
        assert!(err(d).contains("needs 3 blocks"));
        let mut d = desc();
        d.slot_mapping.pop();
        assert!(err(d).contains("slot_mapping has 3 entries for 4 tokens"));
        let mut d = desc();
        d.query_start_loc[0] = 1;
        assert!(err(d).contains("must start at 0"));
    }

    #[test]
    fn the_cache_size_a_batch_needs_comes_from_its_blocks_and_slots() {
        // Unused block-table entries (past a request's seq_len) hold anything and count for
        // nothing; a slot counts for its block.
        let mut d = desc();
        d.block_table[3] = i32::MAX;
        let m = CommonAttentionMetadata::new(&Device::cpu(), d.clone()).unwrap();
        assert_eq!(m.min_cache_blocks(), 4);
        d.slot_mapping[3] = 9 * 4 + 2;
        let m = CommonAttentionMetadata::new(&Device::cpu(), d).unwrap();
        assert_eq!(m.min_cache_blocks(), 10);
    }

    #[test]
    fn a_slot_mapping_padded_with_pad_slots_is_accepted() {
        // A graph-padded step: 4 real tokens, the slot mapping padded to 8 with -1.
        let mut d = desc();
        d.slot_mapping.extend([PAD_SLOT_ID; 4]);
        let m = CommonAttentionMetadata::new(&Device::cpu(), d).unwrap();
        assert_eq!(m.slot_mapping_cpu(), &desc().slot_mapping[..]);
        assert_eq!(m.device().slot_mapping.shape(), &[4]);
    }
}

/// The build generation of one batch shape's persistent graph buffers (the CUDA and Vulkan
/// graph modes): each `build_for_graph_capture` of the shape rewrites the buffers and
/// advances it; metadata remembers the generation it was built at and refuses to run once a
/// later build has rewritten what it reads.
#[derive(Debug, Default)]
pub struct GraphGeneration(std::sync::atomic::AtomicU64);

impl GraphGeneration {
    /// The current generation.
    pub fn current(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Advances the generation after a rewrite; returns the new one.
    pub fn advance(&self) -> u64 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    }

    /// Errors ([`Error::Metadata`], "stale") unless `built` is the current generation;
    /// `num_reqs` names the batch shape.
    pub fn check(&self, built: u64, num_reqs: usize) -> Result<()> {
        if self.current() != built {
            return Err(Error::metadata(format!(
                "stale graph metadata: a later build_for_graph_capture for the same batch \
                 shape ({num_reqs} requests) rewrote its persistent buffers; use the latest \
                 metadata"
            )));
        }
        Ok(())
    }
}
