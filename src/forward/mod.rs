//! The forward driver: what every backend's `forward` and `do_kv_cache_update` do, written
//! once, over a narrow kernel trait each backend implements ([`ForwardKernels`]).
//!
//! The driver owns every rule that does not depend on a device and every error it gives:
//!
//! 1. **Arguments.** The metadata is the backend's own ([`ForwardKernels::metadata`]); the
//!    query and output (and output LSE) have the batch's shapes and one dtype
//!    ([`AttentionParams::check_query_output`]); `encoder_decoder` layers and cascade
//!    batches of layers with ALiBi, a sliding window or encoder attention are refused.
//! 2. **Key source.** Encoder self-attention reads K/V from the `key` / `value` inputs and
//!    never touches the cache; every other layer writes the new keys into the cache first
//!    (when given; both or neither) and then reads the cache, whose spec must match the layer.
//! 3. **Passes.** Without cascade one pass covers every key of every request. With cascade
//!    (and a backend that runs it, [`ForwardKernels::runs_cascade`]) a prefix pass takes
//!    every token against the shared blocks — no mask, with sinks — a suffix pass takes each
//!    request's own keys after the prefix — causal, without sinks — and their partial
//!    outputs are merged by LSE into the output (vLLM's `cascade_attention`). A backend that
//!    does not run cascade gives the same result with one full pass.
//! 4. **Decode / prefill split.** Within a pass, requests go to the backend's kernels by
//!    query length: the backend lists its [`Band`]s (each kernel and the shortest query it
//!    takes) and the driver hands each kernel the requests of its band.
//!
//! The kernels of one call are recorded into one [`ForwardKernels::Recording`] (a command
//! buffer, a stream's launches or host buffers) and submitted by
//! [`ForwardKernels::finish`], so a backend that submits work in batches still submits once
//! per call. Nothing here waits for a device.

mod driver;

pub use driver::{forward, update_kv_cache};

use crate::attention::{AttentionLayer, AttentionParams};
use crate::device::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::metadata::{AttentionMetadata, BatchMetadata};
use crate::plan::{Pass, PlanKey, SplitRule};

/// Where the keys and values of a forward come from.
#[derive(Clone, Copy, Debug)]
pub enum Keys<'a> {
    /// Dense `[num_tokens, num_kv_heads, head_size]` inputs (encoder self-attention: each
    /// request's keys are its own query rows).
    Dense {
        /// Keys.
        key: &'a Tensor,
        /// Values.
        value: &'a Tensor,
    },
    /// The paged KV cache, already holding this step's keys.
    Cache(&'a KvCache),
}

impl Keys<'_> {
    /// True for dense K/V inputs.
    pub fn is_dense(&self) -> bool {
        matches!(self, Keys::Dense { .. })
    }
}

/// The tensors of one forward, checked by the driver.
#[derive(Debug)]
pub struct ForwardIo<'a> {
    /// The layer (its fp8 scales).
    pub layer: &'a AttentionLayer,
    /// `[num_tokens, num_heads, head_size]`.
    pub query: &'a Tensor,
    /// The keys and values.
    pub keys: Keys<'a>,
    /// `[num_tokens, num_heads, head_size]`, the query's dtype.
    pub output: &'a mut Tensor,
    /// `[num_heads, num_tokens]` f32 natural-log LSEs, when asked for.
    pub output_lse: Option<&'a mut Tensor>,
    /// The activation dtype (query, output and cache's activation dtype).
    pub dtype: DType,
    /// Tokens of the batch (`num_actual_tokens`).
    pub num_tokens: usize,
}

/// Where a pass writes its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// The output (and the output LSE, when asked for).
    Output,
    /// The cascade prefix pass's partial: f32 rows `[num_tokens, num_heads, head_size]` and
    /// LSEs `[num_heads, num_tokens]`, held by the recording until the merge.
    Prefix,
    /// The cascade suffix pass's partial (as [`Target::Prefix`]).
    Suffix,
}

/// One pass over the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PassSpec {
    /// The key range (all keys, or the cascade prefix or suffix).
    pub pass: Pass,
    /// Causal mask (the batch's, never for encoder attention or the cascade prefix).
    pub causal: bool,
    /// The layer's sinks take part (never in the cascade suffix).
    pub sinks: bool,
    /// Where the rows go.
    pub target: Target,
}

/// A kernel of a backend and the shortest query it takes: the requests whose query length is
/// at least `min_q` and below the next band's `min_q` go to `kernel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Band<K> {
    /// Shortest query length of the band (the first band's is 0).
    pub min_q: usize,
    /// The kernel.
    pub kernel: K,
}

/// One kernel launch of a pass: the kernel, the pass and the query lengths it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttendJob<K> {
    /// The pass.
    pub spec: PassSpec,
    /// The kernel of the band.
    pub kernel: K,
    /// Requests with `min_q <= query_len < max_q`.
    pub min_q: usize,
    /// See `min_q` (`usize::MAX` for the last band).
    pub max_q: usize,
}

impl<K> AttendJob<K> {
    /// The planner's key for this job of layer `p`: its pass, causality and query-length
    /// band, with `rows` query rows per work item, keys split by `split`, from the dense
    /// keys when `dense`.
    pub fn plan_key(
        &self,
        p: &AttentionParams,
        dense: bool,
        rows: usize,
        split: SplitRule,
    ) -> PlanKey {
        PlanKey {
            pass: self.spec.pass,
            dense,
            split,
            min_q: self.min_q,
            max_q: self.max_q,
            ..PlanKey::new(
                p.num_queries_per_kv(),
                p.num_kv_heads,
                self.spec.causal,
                p.sliding_window,
                rows,
            )
        }
    }
}

/// What a backend implements for the driver: its metadata, its cache rules, and its kernels
/// recorded into one submission per call. Every method but `finish` only records work.
pub trait ForwardKernels {
    /// The backend's metadata.
    type Metadata: BatchMetadata;
    /// The kernels a band can name.
    type Kernel: Copy + std::fmt::Debug;
    /// The work of one call, as recorded so far.
    type Recording;

    /// The backend's name in errors ("CPU", "CUDA", "wgpu").
    const BACKEND: &'static str;

    /// The layer's parameters.
    fn params(&self) -> &AttentionParams;

    /// The metadata as the backend's own, usable here (its device, not stale, capturable
    /// inside a graph capture).
    fn metadata<'m>(&self, metadata: &'m dyn AttentionMetadata) -> Result<&'m Self::Metadata>;

    /// The backend's own rules for a cache the layer reads or writes, beyond the layer's
    /// ([`AttentionParams::check_kv_cache`], which the driver applies): its memory on this
    /// device, block sizes the kernels take.
    fn check_cache(&self, cache: &KvCache, md: &Self::Metadata) -> Result<()>;

    /// Whether the backend runs cascade batches as a prefix pass, a suffix pass and a merge;
    /// otherwise the driver runs them as one full pass (same result).
    fn runs_cascade(&self) -> bool;

    /// The kernels of `spec` for this batch, by query length (sorted by `min_q`, the first
    /// band from 0).
    fn bands(
        &self,
        md: &Self::Metadata,
        io: &ForwardIo<'_>,
        spec: &PassSpec,
    ) -> Result<Vec<Band<Self::Kernel>>>;

    /// An empty recording for a call over `md`.
    fn begin(&self, md: &Self::Metadata) -> Result<Self::Recording>;

    /// Records the write of `key` / `value` (checked: `[slots, num_kv_heads, head_size]`
    /// of the cache's activation dtype) into the cache slots of `md`.
    fn write_cache(
        &self,
        rec: &mut Self::Recording,
        md: &Self::Metadata,
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        cache: &mut KvCache,
    ) -> Result<()>;

    /// Records one kernel of a pass over the batch of `md` (at least one token).
    fn attend(
        &self,
        rec: &mut Self::Recording,
        md: &Self::Metadata,
        io: &mut ForwardIo<'_>,
        job: &AttendJob<Self::Kernel>,
    ) -> Result<()>;

    /// Records the merge of the [`Target::Prefix`] and [`Target::Suffix`] partials into the
    /// output (and output LSE).
    fn merge(
        &self,
        rec: &mut Self::Recording,
        md: &Self::Metadata,
        io: &mut ForwardIo<'_>,
    ) -> Result<()>;

    /// Submits the recording; `io` is the forward's tensors (`None` for a cache update).
    fn finish(&self, rec: Self::Recording, io: Option<&mut ForwardIo<'_>>) -> Result<()>;
}
