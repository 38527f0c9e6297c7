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
use crate::error::Result;
use crate::kv_cache::KvCacheSpec;
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CascadePlan, CommonAttentionMetadata,
    DecodePrefillSplit, PAD_SLOT_ID,
};

use super::tuning::WgpuTuning;
use crate::kernels::wgsl::DECODE_MAX_ROWS;
#[cfg(doc)]
use crate::plan::WorkItem;
use crate::plan::{
    plan_work, ItemOrder, PlanInputs, PlanKey as PlanKey0, SplitGroup, SplitRule, WorkPlan,
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
    /// The plan for `key`, built on first use and shared by every later layer.
    pub fn plan(&self, key: PlanKey) -> Result<Arc<Plan<R>>> {
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
    let decode_fast = plan_work(
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
    let mut decode = plan_work(
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
    let lists = plan_lists(common, key);
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
}

impl<R: WgslRuntime> WgslMetadataBuilder<R> {
    /// A builder for one KV-cache group on `device`.
    pub fn new(device: R, spec: KvCacheSpec) -> Self {
        WgslMetadataBuilder { spec, device }
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
    fn graph_capture_support(&self) -> GraphCaptureSupport {
        GraphCaptureSupport::Never
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
        // Duplicate slots: keep the last write (a sequential reference's result).
        let slots_cpu = common.slot_mapping_cpu();
        let mut seen = HashSet::new();
        let mut dedup: Option<Vec<i64>> = None;
        for (t, &s) in slots_cpu.iter().enumerate().rev() {
            if s != PAD_SLOT_ID && !seen.insert(s) {
                dedup.get_or_insert_with(|| slots_cpu.to_vec())[t] = PAD_SLOT_ID;
            }
        }
        let slot_words = |v: &[i64]| -> Vec<u32> {
            v.iter()
                .flat_map(|&s| [s as u64 as u32, (s as u64 >> 32) as u32])
                .collect()
        };
        let slots = match dedup {
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
        }))
    }
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
