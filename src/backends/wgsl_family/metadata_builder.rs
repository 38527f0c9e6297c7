//! The WGSL family's metadata builder (on either runtime, [`WgslRuntime`]), and the work plan
//! its kernels run.
//!
//! `build` runs once per step: it validates the cascade request, resolves the block table
//! and slot mapping to device buffers (removing duplicate slots so that the last write wins,
//! as in a sequential reference), and returns [`WgslAttentionMetadata`]. The work items
//! depend on the layer too (the GQA group size decides how many query rows a token has), so
//! the first layer that runs a step builds them ([`WgslAttentionMetadata::plan`]) and every
//! later layer with the same shape reuses them: one small upload per step, not per layer.
//!
//! **Plan** ([`plan_lists`], with [`crate::plan`]). Requests whose rows (query tokens ×
//! group) fit one decode tile become decode items over their whole key range, split into
//! several partial items (flash-decoding) when the batch alone would not fill the device
//! ([`WgpuTuning`]); the partials are merged by a combine pass. Decode items of at most
//! [`PlanKey::fast_decode_rows`] rows go to their own list, run by the split-KV decode kernel
//! (`paged_decode.wgsl`) when the layer can use it; both decode lists share the partial
//! buffer and the combine pass. Other requests are cut into prefill tiles of up to
//! `prefill_rows` rows with no split. Cascade batches (a shared prefix) run the same plan: the prefix is part of every
//! request's own key range, and since the builder checks that the prefix lies inside every
//! request's cached context, every query sees all of it under the causal mask too — the
//! result equals vLLM's prefix pass + suffix pass + merge, sinks counted once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::backend::GraphCaptureSupport;
use crate::device::wgsl::WgslRuntime;
use crate::device::Tensor;
use crate::error::{Error, Result};
use crate::kv_cache::KvCacheSpec;
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CascadePlan, CommonAttentionMetadata,
    DecodePrefillSplit, PAD_SLOT_ID,
};

use super::graph_metadata::{GraphBuffers, GraphShape};
use super::tuning::WgpuTuning;
use crate::kernels::wgsl::DECODE_MAX_ROWS;
#[cfg(doc)]
use crate::plan::WorkItem;
use crate::plan::{
    plan_graph_work, plan_work, ItemOrder, PlanInputs, PlanKey as PlanKey0, SplitGroup, SplitRule,
    WorkPlan,
};

/// What a plan depends on besides the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlanKey {
    /// Query heads per KV head.
    pub group: u32,
    /// KV heads.
    pub num_kv_heads: u32,
    /// Rows of a decode tile.
    pub decode_rows: u32,
    /// Rows of a prefill tile.
    pub prefill_rows: u32,
    /// Decode items of at most this many rows go to the split-KV decode kernel
    /// (`paged_decode.wgsl`); 0 when it cannot run this layer.
    pub fast_decode_rows: u32,
    /// Keys come from dense K/V inputs (encoder attention), not the cache.
    pub dense: bool,
    /// Sliding window.
    pub window: Option<u32>,
    /// Split policy.
    pub tuning: WgpuTuning,
}

/// A list of work items (or split groups) on the device.
#[derive(Clone, Debug)]
pub struct WorkList<R: WgslRuntime> {
    /// The records ([`WorkItem`] or [`SplitGroup`]).
    pub buffer: R::Buffer,
    /// Number of records.
    pub count: u32,
}

/// The work of one step for one layer shape.
#[derive(Clone, Debug)]
pub struct Plan<R: WgslRuntime> {
    /// Decode items for the split-KV decode kernel (rows ≤ `PlanKey::fast_decode_rows`).
    pub decode_fast: Option<WorkList<R>>,
    /// Most rows of an item in `decode_fast`.
    pub fast_rows: u32,
    /// Items for the decode tile shape.
    pub decode: Option<WorkList<R>>,
    /// Items for the prefill tile shape.
    pub prefill: Option<WorkList<R>>,
    /// Split groups of both decode lists, for the combine pass.
    pub combine: Option<WorkList<R>>,
    /// Partial tokens of the split groups.
    pub n_part_tokens: u32,
    /// Most splits of a group.
    pub max_splits: u32,
}

/// What the WGSL kernels consume for one batch, on runtime `R`.
#[derive(Debug)]
pub struct WgslAttentionMetadata<R: WgslRuntime> {
    /// The validated common metadata.
    pub common: CommonAttentionMetadata,
    /// The decode / prefill split (informational: one pass handles both).
    pub split: DecodePrefillSplit,
    /// The cascade request, when `common_prefix_len > 0`.
    pub cascade: Option<CascadePlan>,
    pub(crate) device: R,
    pub(crate) block_table: R::Buffer,
    pub(crate) slots: R::Buffer,
    plans: Mutex<HashMap<PlanKey, Arc<Plan<R>>>>,
    /// Graph mode: the persistent buffers and the generation of the build that made this.
    graph: Option<(Arc<GraphBuffers<R>>, u64)>,
}

impl<R: WgslRuntime> crate::metadata::AttentionMetadata for WgslAttentionMetadata<R> {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl<R: WgslRuntime> crate::metadata::BatchMetadata for WgslAttentionMetadata<R> {
    fn common(&self) -> &CommonAttentionMetadata {
        &self.common
    }

    fn cascade(&self) -> Option<CascadePlan> {
        self.cascade
    }
}

impl<R: WgslRuntime> WgslAttentionMetadata<R> {
    /// Whether this metadata was built for graph capture
    /// ([`WgslMetadataBuilder::build_graph`]): its kernels read only persistent buffers, so a
    /// forward with it can be captured.
    pub fn is_graph_capturable(&self) -> bool {
        self.graph.is_some()
    }

    /// Errors when this is graph metadata and a later build for the same batch shape has
    /// rewritten the shared buffers (this metadata's host copies no longer match them).
    pub(crate) fn check_current(&self) -> Result<()> {
        match &self.graph {
            Some((g, generation)) => g.generation.check(*generation, g.shape.num_reqs),
            None => Ok(()),
        }
    }

    /// The plan for `key`, built on first use and shared by every later layer (graph
    /// metadata: the fixed-layout plan in the persistent buffers; the impl checks that the
    /// metadata is current before it asks).
    pub fn plan(&self, key: PlanKey) -> Result<Arc<Plan<R>>> {
        if let Some((g, _)) = &self.graph {
            return g.plan(&self.device, &self.common, key);
        }
        let lock = || self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = lock().get(&key) {
            return Ok(p.clone());
        }
        let plan = Arc::new(build_plan(&self.device, &self.common, &key)?);
        Ok(lock().entry(key).or_insert(plan).clone())
    }
}

/// The host side of a plan: the three item lists (the two decode lists share one partial
/// buffer and one combine).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanLists {
    /// Items for the split-KV decode kernel.
    pub decode_fast: WorkPlan,
    /// Items for the decode tile of paged_attention.wgsl.
    pub decode: WorkPlan,
    /// Prefill items (never split).
    pub prefill: WorkPlan,
}

impl PlanLists {
    /// The split groups of both decode lists.
    pub fn groups(&self) -> Vec<SplitGroup> {
        [&self.decode_fast.groups[..], &self.decode.groups[..]].concat()
    }

    /// Partial tokens of both decode lists.
    pub fn n_part_tokens(&self) -> usize {
        self.decode_fast.n_part_tokens + self.decode.n_part_tokens
    }

    /// Most splits of any group.
    pub fn max_splits(&self) -> usize {
        self.decode_fast.max_splits.max(self.decode.max_splits)
    }
}

/// Plans a batch for the WGSL kernels with [`crate::plan`]: requests whose rows (query
/// tokens × group) fit the split-KV decode kernel, those that fit a decode tile, and the
/// rest in prefill tiles. Decode requests split by [`SplitRule::PerRequest`] over both decode
/// lists; items are in the order of each kernel's dispatch ([`ItemOrder`]).
pub fn plan_lists(common: &CommonAttentionMetadata, key: &PlanKey) -> PlanLists {
    plan_lists_by(common, key, plan_work)
}

/// [`plan_lists`] with the split decode lists in [`plan_graph_work`]'s fixed layout for
/// contexts up to `max_seq_len` keys (graph mode: the lists' lengths depend only on the
/// number of requests and the layer, never on the sequence lengths). The prefill list needs
/// no change: unsplit, its layout depends only on the query lengths.
pub fn plan_graph_lists(
    common: &CommonAttentionMetadata,
    key: &PlanKey,
    max_seq_len: usize,
) -> PlanLists {
    plan_lists_by(common, key, |inp, k| plan_graph_work(inp, k, max_seq_len))
}

/// [`plan_lists`] with `decode` planning the two decode lists.
fn plan_lists_by(
    common: &CommonAttentionMetadata,
    key: &PlanKey,
    decode: impl Fn(PlanInputs<'_>, &PlanKey0) -> WorkPlan,
) -> PlanLists {
    let g = key.group.max(1) as usize;
    let inp = PlanInputs {
        query_start_loc: common.query_start_loc_cpu(),
        seq_lens: common.seq_lens_cpu(),
    };
    // Longest query of each decode list (0: the list is empty).
    let dec_max = if key.dense {
        0
    } else {
        key.decode_rows as usize / g
    };
    // Tokens per decode-kernel item. A GQA group wider than the kernel's rows (CPU adapters
    // take 2) but within DECODE_MAX_ROWS still decodes there, one token per item in chunks of
    // its heads; a wider one (MQA 16:1) takes the decode tile.
    let fast_rows = key.fast_decode_rows as usize;
    let fast_tokens = if fast_rows > 0 && g <= DECODE_MAX_ROWS as usize {
        (fast_rows / g).max(1)
    } else {
        0
    };
    let fast_max = fast_tokens.min(dec_max);
    let decode_requests = (0..common.num_reqs())
        .filter(|&r| (1..=dec_max).contains(&common.query_len(r)))
        .count();
    let split = key.tuning.split_rule(decode_requests);
    let base = PlanKey0 {
        dense: key.dense,
        ..PlanKey0::new(
            g,
            key.num_kv_heads as usize,
            common.causal(),
            key.window.map(|w| w as usize),
            1,
        )
    };
    let decode_fast = decode(
        inp,
        &PlanKey0 {
            rows: key.fast_decode_rows.max(1) as usize,
            min_q: 1,
            max_q: fast_max + 1,
            split,
            order: ItemOrder::BatchKvHeadInner,
            ..base
        },
    );
    let mut decode = decode(
        inp,
        &PlanKey0 {
            rows: key.decode_rows.max(1) as usize,
            min_q: fast_max + 1,
            max_q: dec_max + 1,
            split,
            order: ItemOrder::BatchKvHeadOuter,
            ..base
        },
    );
    decode.shift_parts(decode_fast.n_part_tokens);
    let prefill = plan_work(
        inp,
        &PlanKey0 {
            rows: key.prefill_rows.max(1) as usize,
            min_q: dec_max + 1,
            split: SplitRule::Never,
            order: ItemOrder::BatchKvHeadOuter,
            ..base
        },
    );
    PlanLists {
        decode_fast,
        decode,
        prefill,
    }
}

fn build_plan<R: WgslRuntime>(
    dev: &R,
    common: &CommonAttentionMetadata,
    key: &PlanKey,
) -> Result<Plan<R>> {
    upload_plan(dev, &plan_lists(common, key))
}

/// A plan's lists in fresh device buffers.
pub(crate) fn upload_plan<R: WgslRuntime>(dev: &R, lists: &PlanLists) -> Result<Plan<R>> {
    let fast_rows = lists
        .decode_fast
        .items
        .iter()
        .map(|i| (i.q_len * i.head_count) as u32)
        .max()
        .unwrap_or(0);
    fn list<R: WgslRuntime, T: bytemuck::Pod>(
        dev: &R,
        label: &str,
        records: &[T],
    ) -> Result<Option<WorkList<R>>> {
        if records.is_empty() {
            return Ok(None);
        }
        Ok(Some(WorkList {
            buffer: dev.upload_words(label, bytemuck::cast_slice(records))?,
            count: records.len() as u32,
        }))
    }
    let groups = lists.groups();
    Ok(Plan {
        decode_fast: list(
            dev,
            "polyattn split-KV decode items",
            &lists.decode_fast.items,
        )?,
        fast_rows,
        decode: list(dev, "polyattn decode items", &lists.decode.items)?,
        prefill: list(dev, "polyattn prefill items", &lists.prefill.items)?,
        combine: list(dev, "polyattn split groups", &groups)?,
        n_part_tokens: lists.n_part_tokens() as u32,
        max_splits: lists.max_splits() as u32,
    })
}

/// Builds [`WgslAttentionMetadata`] on runtime `R`.
#[derive(Clone, Debug)]
pub struct WgslMetadataBuilder<R: WgslRuntime> {
    spec: KvCacheSpec,
    device: R,
    /// Persistent graph buffers per batch shape, shared by the builder's clones.
    graphs: Arc<Mutex<HashMap<GraphShape, Arc<GraphBuffers<R>>>>>,
}

impl<R: WgslRuntime> WgslMetadataBuilder<R> {
    /// A builder for one KV-cache group on `device`.
    pub fn new(device: R, spec: KvCacheSpec) -> Self {
        WgslMetadataBuilder {
            spec,
            device,
            graphs: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Metadata whose kernels read only persistent device buffers, for a forward that is
    /// captured into a graph or that runs a step of one (see [`super::graph_metadata`]).
    ///
    /// What is capturable: a forward (cache write and attention, every kernel form) over a
    /// batch whose requests all have query length 1, after one eager forward of every layer
    /// with metadata of that batch shape (it plans, uploads and compiles). A replay of a later
    /// step needs the same number of requests, block-table width and causality (pad the
    /// batch with dummy requests of query length 1, seq_len 1, block 0 and slot −1, as vLLM
    /// pads), a new `build_graph` of that step before the replay, and the step's q / k / v
    /// written into the tensors the graph captured. The latest build defines what a replay
    /// computes; older metadata of that shape refuse to run ([`Error::Metadata`], stale).
    ///
    /// Errors: [`Error::Metadata`] when a request's query length is not 1, the batch is
    /// empty or the block size is not the builder's; [`Error::Config`] on a runtime without
    /// captures (wgpu); [`Error::Device`] inside a capture (the build uploads).
    pub fn build_graph(
        &self,
        common: &CommonAttentionMetadata,
    ) -> Result<WgslAttentionMetadata<R>> {
        if !R::CAPTURES {
            return Err(Error::config(format!(
                "the {} runtime cannot capture submissions: its metadata has no graph mode",
                R::NAME
            )));
        }
        common.expect_block_size(self.spec.block_size)?;
        if common.num_reqs() == 0 {
            return Err(Error::metadata(
                "a graph-captured batch needs at least one request",
            ));
        }
        if let Some(r) = (0..common.num_reqs()).find(|&r| common.query_len(r) != 1) {
            return Err(Error::metadata(format!(
                "{} graphs capture only uniform single-token decode batches \
                 (GraphCaptureSupport::UniformSingleTokenDecode): request {r} has query \
                 length {}; run prefills and mixed batches eagerly",
                R::NAME,
                common.query_len(r)
            )));
        }
        let shape = GraphShape::of(common);
        let buffers = {
            let mut graphs = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
            match graphs.get(&shape) {
                Some(b) => b.clone(),
                None => {
                    let b = Arc::new(GraphBuffers::new(&self.device, shape)?);
                    graphs.insert(shape, b.clone());
                    b
                }
            }
        };
        let slots = dedup_slots(common);
        let slots = slots.as_deref().unwrap_or(common.slot_mapping_cpu());
        let generation = buffers.update(&self.device, common, &slot_words(slots))?;
        Ok(WgslAttentionMetadata {
            split: common.split_decodes_and_prefills(1, false, true),
            common: common.clone(),
            cascade: None,
            device: self.device.clone(),
            block_table: buffers.block_table.clone(),
            slots: buffers.slots.clone(),
            plans: Mutex::new(HashMap::new()),
            graph: Some((buffers, generation)),
        })
    }

    /// The device buffer of a metadata tensor, or a fresh upload of its host copy when the
    /// metadata was built on another device.
    fn resolve(&self, t: &Tensor, host: &[u32], label: &str) -> Result<R::Buffer> {
        if t.device() == &self.device.device() {
            if let Ok(b) = self.device.tensor_buffer(t, "metadata") {
                return Ok(b);
            }
        }
        self.device.upload_words(label, host)
    }
}

impl<R: WgslRuntime> AttentionMetadataBuilder for WgslMetadataBuilder<R> {
    /// `UniformSingleTokenDecode` on a runtime that captures (Vulkan), else `Never`; see
    /// [`WgslMetadataBuilder::build_graph`].
    fn graph_capture_support(&self) -> GraphCaptureSupport {
        graph_capture_level::<R>()
    }

    /// [`WgslMetadataBuilder::build_graph`], boxed.
    fn build_for_graph_capture(
        &self,
        common: &CommonAttentionMetadata,
    ) -> Result<Box<dyn AttentionMetadata>> {
        Ok(Box::new(self.build_graph(common)?))
    }

    fn build(
        &self,
        common_prefix_len: usize,
        common: &CommonAttentionMetadata,
        _fast_build: bool,
    ) -> Result<Box<dyn AttentionMetadata>> {
        common.expect_block_size(self.spec.block_size)?;
        let cascade = CascadePlan::for_batch(common, common_prefix_len)?;
        let dm = common.device();
        let bt_host: Vec<u32> = common.block_table_cpu().iter().map(|&b| b as u32).collect();
        let block_table = self.resolve(&dm.block_table, &bt_host, "polyattn block table")?;
        let slots_cpu = common.slot_mapping_cpu();
        let slots = match dedup_slots(common) {
            Some(v) => self
                .device
                .upload_words("polyattn slots", &slot_words(&v))?,
            None => self.resolve(&dm.slot_mapping, &slot_words(slots_cpu), "polyattn slots")?,
        };
        Ok(Box::new(WgslAttentionMetadata {
            split: common.split_decodes_and_prefills(1, false, true),
            common: common.clone(),
            cascade,
            device: self.device.clone(),
            block_table,
            slots,
            plans: Mutex::new(HashMap::new()),
            graph: None,
        }))
    }
}

/// The graph-capture level of the WGSL family on runtime `R`.
pub(crate) fn graph_capture_level<R: WgslRuntime>() -> GraphCaptureSupport {
    if R::CAPTURES {
        GraphCaptureSupport::UniformSingleTokenDecode
    } else {
        GraphCaptureSupport::Never
    }
}

/// `common`'s slot mapping with duplicate slots removed but the last write (a sequential
/// reference's result); `None` when no slot repeats (the usual batch: no copy made).
fn dedup_slots(common: &CommonAttentionMetadata) -> Option<Vec<i64>> {
    let slots = common.slot_mapping_cpu();
    let mut seen = HashSet::new();
    let mut dedup: Option<Vec<i64>> = None;
    for (t, &s) in slots.iter().enumerate().rev() {
        if s != PAD_SLOT_ID && !seen.insert(s) {
            dedup.get_or_insert_with(|| slots.to_vec())[t] = PAD_SLOT_ID;
        }
    }
    dedup
}

/// Slots as the kernels read them: each i64 as two u32 words, low first.
fn slot_words(v: &[i64]) -> Vec<u32> {
    v.iter()
        .flat_map(|&s| [s as u64 as u32, (s as u64 >> 32) as u32])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tuning::PrefillForm;
    use super::*;
    use crate::device::Device;
    use crate::metadata::BatchDescription;

    fn tuning() -> WgpuTuning {
        WgpuTuning {
            split_min_keys: 32,
            target_workgroups: 16,
            max_splits: 8,
            subgroups: false,
            prefill_tiles: true,
            unrolled: false,
            prefill_form: PrefillForm::ThreePhase,
            ..WgpuTuning::defaults(true, false)
        }
    }

    #[test]
    fn plan_splits_long_decodes_and_tiles_prefills() {
        // A decode over 100 keys, a 40-token prefill over 50, block size 16.
        let desc = BatchDescription {
            query_start_loc: vec![0, 1, 41],
            seq_lens: vec![100, 50],
            block_table: (1..=14).collect(),
            max_blocks_per_req: 7,
            slot_mapping: (0..41).map(|i| 16 * 20 + i).collect(),
            causal: true,
            block_size: 16,
            is_prefilling: None,
        };
        let common = CommonAttentionMetadata::new(&Device::cpu(), desc).unwrap();
        let key = PlanKey {
            group: 2,
            num_kv_heads: 2,
            decode_rows: 16,
            prefill_rows: 32,
            fast_decode_rows: 0,
            dense: false,
            window: None,
            tuning: tuning(),
        };
        let lists = plan_lists(&common, &key);
        assert!(lists.decode_fast.items.is_empty());
        // 100 keys, 1 request × 2 KV heads: min(ceil(100/32)=4, ceil(16/2)=8) = 4 splits of
        // 32, listed KV head 0 first.
        let dec = &lists.decode.items;
        assert_eq!(dec.len(), 2 * 4);
        assert_eq!(lists.n_part_tokens(), 1);
        assert_eq!(
            lists.groups(),
            vec![SplitGroup {
                q_start: 0,
                q_len: 1,
                part_tok: 0,
                num_splits: 4
            }]
        );
        let range = |i: usize| (dec[i].kv_head, dec[i].split, dec[i].kv_lo, dec[i].kv_hi);
        assert_eq!(range(0), (0, 0, 0, 32));
        assert_eq!(range(3), (0, 3, 96, 100));
        assert_eq!(range(4), (1, 0, 0, 32));
        assert!(dec
            .iter()
            .all(|i| (i.q_pos, i.head_count, i.num_splits) == (99, 2, 4)));
        // 40 tokens × 2 rows = 80 rows: tiles of 16, 16, 8 tokens, per KV head.
        let pre = &lists.prefill.items;
        let tiles: Vec<(i32, i32, i32, i32)> = pre
            .iter()
            .map(|i| (i.kv_head, i.q_start, i.q_len, i.q_pos))
            .collect();
        assert_eq!(
            tiles,
            vec![
                (0, 1, 16, 10),
                (0, 17, 16, 26),
                (0, 33, 8, 42),
                (1, 1, 16, 10),
                (1, 17, 16, 26),
                (1, 33, 8, 42)
            ]
        );
        assert!(pre
            .iter()
            .all(|i| (i.req, i.kv_lo, i.kv_hi, i.num_splits) == (1, 0, 50, 1)));
    }

    /// The GPU defaults on the decode rows of the H200 benchmark (8 KV heads): workgroups =
    /// requests × 8 × splits, keys per split = sequence / splits.
    #[test]
    fn gpu_defaults_fill_a_large_gpu() {
        let t = WgpuTuning::defaults(false, true);
        // D1.b1s4k: 32 splits of 128 keys, 256 workgroups (was 16 × 256, 128 workgroups).
        assert_eq!(t.splits(4096, 1, 8), 32);
        // D1.b8s4k: 32 × 128, 2048 workgroups.
        assert_eq!(t.splits(4096, 8, 8), 32);
        // D1.b16s16k: 32 × 512, 4096 workgroups; D1.b64s4k: 8 × 512, 4096 workgroups.
        assert_eq!(t.splits(16384, 16, 8), 32);
        assert_eq!(t.splits(4096, 64, 8), 8);
        // D4.b1s32k: 128 × 256, 1024 workgroups; D1.b256s4k: 2 × 2048.
        assert_eq!(t.splits(32768, 1, 8), 128);
        assert_eq!(t.splits(4096, 256, 8), 2);
    }

    #[test]
    fn split_count_respects_every_bound() {
        let t = tuning();
        assert_eq!(t.splits(10, 1, 1), 1);
        assert_eq!(t.splits(1000, 1, 1), 8);
        assert_eq!(t.splits(1000, 8, 2), 1);
    }
}
