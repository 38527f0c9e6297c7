//! The wgpu backend's metadata builder, and the work plan its kernels run.
//!
//! `build` runs once per step: it validates the cascade request, resolves the block table
//! and slot mapping to device buffers (removing duplicate slots so that the last write wins,
//! as in a sequential reference), and returns [`WgpuAttentionMetadata`]. The work items
//! depend on the layer too (the GQA group size decides how many query rows a token has), so
//! the first layer that runs a step builds them ([`WgpuAttentionMetadata::plan`]) and every
//! later layer with the same shape reuses them: one small upload per step, not per layer.
//!
//! **Plan.** Requests whose rows (query tokens × group) fit one decode tile become decode
//! items over their whole key range, split into several partial items (flash-decoding) when
//! the batch alone would not fill the device ([`WgpuTuning`]); the partials are merged by a
//! combine pass. Decode items of at most [`PlanKey::fast_decode_rows`] rows go to their own
//! list, run by the split-KV decode kernel (`paged_decode.wgsl`) when the layer can use it;
//! both decode lists share the partial slots and the combine pass. Other requests are cut
//! into prefill tiles of up to `prefill_rows` rows with no split. Cascade batches (a shared prefix) run the same plan: the prefix is part of every
//! request's own key range, and since the builder checks that the prefix lies inside every
//! request's cached context, every query sees all of it under the causal mask too — the
//! result equals vLLM's prefix pass + suffix pass + merge, sinks counted once.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::backend::GraphCaptureSupport;
use crate::device::{Storage, Tensor, WgpuDevice};
use crate::error::{Error, Result};
use crate::kv_cache::KvCacheSpec;
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CommonAttentionMetadata, DecodePrefillSplit,
    PAD_SLOT_ID,
};

use super::kernels::upload_words;
use super::tuning::WgpuTuning;

/// u32 words per work item (see `shaders/paged_attention.wgsl`).
pub const ITEM_WORDS: usize = 8;
/// Partial-slot value of an item that writes the output directly.
pub const DIRECT_SLOT: u32 = 0x7fff_ffff;
/// Item flag: this item adds the sink logit to its rows.
pub const SINK_FLAG: u32 = 1 << 31;

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

/// A list of work items (or combine groups) on the device.
#[derive(Clone, Debug)]
pub struct WorkList {
    /// The u32 words.
    pub buffer: wgpu::Buffer,
    /// Number of entries.
    pub count: u32,
}

/// The work of one step for one layer shape.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Decode items for the split-KV decode kernel (rows ≤ `PlanKey::fast_decode_rows`).
    pub decode_fast: Option<WorkList>,
    /// Most rows of an item in `decode_fast`.
    pub fast_rows: u32,
    /// Items for the decode tile shape.
    pub decode: Option<WorkList>,
    /// Items for the prefill tile shape.
    pub prefill: Option<WorkList>,
    /// Combine groups: first token, tokens, first partial slot, splits.
    pub combine: Option<WorkList>,
    /// Partial slots the decode items write.
    pub partial_slots: u32,
}

/// Shared-prefix (cascade) request, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CascadePlan {
    /// Tokens of the shared prefix (a multiple of the block size).
    pub prefix_len: usize,
}

/// What the wgpu kernels consume for one batch.
#[derive(Debug)]
pub struct WgpuAttentionMetadata {
    /// The validated common metadata.
    pub common: CommonAttentionMetadata,
    /// The decode / prefill split (informational: one pass handles both).
    pub split: DecodePrefillSplit,
    /// The cascade request, when `common_prefix_len > 0`.
    pub cascade: Option<CascadePlan>,
    pub(crate) device: WgpuDevice,
    pub(crate) block_table: wgpu::Buffer,
    pub(crate) slots: wgpu::Buffer,
    plans: Mutex<HashMap<PlanKey, Arc<Plan>>>,
}

impl AttentionMetadata for WgpuAttentionMetadata {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl WgpuAttentionMetadata {
    /// The plan for `key`, built on first use and shared by every later layer.
    pub fn plan(&self, key: PlanKey) -> Result<Arc<Plan>> {
        let lock = || self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = lock().get(&key) {
            return Ok(p.clone());
        }
        let plan = Arc::new(build_plan(&self.device, &self.common, &key)?);
        Ok(lock().entry(key).or_insert(plan).clone())
    }
}

/// The host side of a plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanWords {
    /// Decode items for the split-KV decode kernel.
    pub decode_fast: Vec<u32>,
    /// Decode items for the decode tile of paged_attention.wgsl.
    pub decode: Vec<u32>,
    /// Prefill items.
    pub prefill: Vec<u32>,
    /// Combine groups (first token, tokens, first partial slot, splits).
    pub groups: Vec<u32>,
    /// Partial slots the decode items write.
    pub slots: u32,
}

/// The host side of a plan: item words, combine-group words, partial slots.
pub fn plan_words(common: &CommonAttentionMetadata, key: &PlanKey) -> PlanWords {
    let qsl = common.query_start_loc_cpu();
    let seq_lens = common.seq_lens_cpu();
    let width = common.max_blocks_per_req() as u32;
    let g = key.group;
    let (mut fast, mut dec, mut pre, mut groups) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut slots = 0u32;
    let is_decode = |q: u32| !key.dense && q > 0 && q * g <= key.decode_rows;
    let n_dec = (0..common.num_reqs())
        .filter(|&r| is_decode(common.query_len(r) as u32))
        .count() as u32;
    for r in 0..common.num_reqs() {
        let q = common.query_len(r) as u32;
        if q == 0 {
            continue;
        }
        let tok = qsl[r] as u32;
        let s = seq_lens[r] as u32;
        let rows = q * g;
        if is_decode(q) {
            let dec = if rows <= key.fast_decode_rows {
                &mut fast
            } else {
                &mut dec
            };
            let ctx = s - q;
            let lo = key.window.map_or(0, |w| (ctx + 1).saturating_sub(w));
            let keys = s - lo;
            let splits = key.tuning.splits(keys, n_dec, key.num_kv_heads);
            if splits <= 1 {
                dec.extend([
                    tok,
                    0,
                    rows,
                    ctx,
                    0,
                    s,
                    r as u32 * width,
                    DIRECT_SLOT | SINK_FLAG,
                ]);
            } else {
                let chunk = keys.div_ceil(splits).div_ceil(16) * 16;
                let n = keys.div_ceil(chunk);
                for i in 0..n {
                    let a = lo + i * chunk;
                    let b = (a + chunk).min(s);
                    let flag = if i == 0 { SINK_FLAG } else { 0 };
                    dec.extend([
                        tok,
                        0,
                        rows,
                        ctx,
                        a,
                        b,
                        r as u32 * width,
                        (slots + i) | flag,
                    ]);
                }
                groups.extend([tok, q, slots, n]);
                slots += n;
            }
        } else {
            let (ctx, hi, kv_row) = if key.dense {
                (0, q, tok)
            } else {
                (s - q, s, r as u32 * width)
            };
            let mut row = 0;
            while row < rows {
                let n = key.prefill_rows.min(rows - row);
                pre.extend([tok, row, n, ctx, 0, hi, kv_row, DIRECT_SLOT | SINK_FLAG]);
                row += n;
            }
        }
    }
    PlanWords {
        decode_fast: fast,
        decode: dec,
        prefill: pre,
        groups,
        slots,
    }
}

fn build_plan(dev: &WgpuDevice, common: &CommonAttentionMetadata, key: &PlanKey) -> Result<Plan> {
    let w = plan_words(common, key);
    let fast_rows = w
        .decode_fast
        .chunks(ITEM_WORDS)
        .map(|c| c[2])
        .max()
        .unwrap_or(0);
    let list = |label: &str, words: Vec<u32>, stride: usize| -> Result<Option<WorkList>> {
        if words.is_empty() {
            return Ok(None);
        }
        Ok(Some(WorkList {
            buffer: upload_words(dev, label, &words)?,
            count: (words.len() / stride) as u32,
        }))
    };
    Ok(Plan {
        decode_fast: list("polyattn split-KV decode items", w.decode_fast, ITEM_WORDS)?,
        fast_rows,
        decode: list("polyattn decode items", w.decode, ITEM_WORDS)?,
        prefill: list("polyattn prefill items", w.prefill, ITEM_WORDS)?,
        combine: list("polyattn combine groups", w.groups, 4)?,
        partial_slots: w.slots,
    })
}

/// Builds [`WgpuAttentionMetadata`].
#[derive(Clone, Debug)]
pub struct WgpuMetadataBuilder {
    spec: KvCacheSpec,
    device: WgpuDevice,
}

impl WgpuMetadataBuilder {
    /// A builder for one KV-cache group on `device`.
    pub fn new(device: WgpuDevice, spec: KvCacheSpec) -> Self {
        WgpuMetadataBuilder { spec, device }
    }

    /// The device buffer of a metadata tensor, or a fresh upload of its host copy when the
    /// metadata was built on another device.
    fn resolve(&self, t: &Tensor, host: &[u32], label: &str) -> Result<wgpu::Buffer> {
        match t.storage() {
            Storage::Wgpu(s) if s.device() == &self.device => Ok(s.buffer().clone()),
            _ => upload_words(&self.device, label, host),
        }
    }
}

impl AttentionMetadataBuilder for WgpuMetadataBuilder {
    fn graph_capture_support(&self) -> GraphCaptureSupport {
        GraphCaptureSupport::Never
    }

    fn build(
        &self,
        common_prefix_len: usize,
        common: &CommonAttentionMetadata,
        _fast_build: bool,
    ) -> Result<Box<dyn AttentionMetadata>> {
        if common.block_size() != self.spec.block_size {
            return Err(Error::metadata(format!(
                "batch block size {} differs from the KV-cache group's {}",
                common.block_size(),
                self.spec.block_size
            )));
        }
        let cascade = common
            .cascade_prefix_blocks(common_prefix_len)?
            .map(|_| CascadePlan {
                prefix_len: common_prefix_len,
            });
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
            Some(v) => upload_words(&self.device, "polyattn slots", &slot_words(&v))?,
            None => self.resolve(&dm.slot_mapping, &slot_words(slots_cpu), "polyattn slots")?,
        };
        Ok(Box::new(WgpuAttentionMetadata {
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
        let PlanWords {
            decode_fast,
            decode: dec,
            prefill: pre,
            groups,
            slots,
        } = plan_words(&common, &key);
        assert!(decode_fast.is_empty());
        // 100 keys, 1 request × 2 heads: min(ceil(100/32)=4, ceil(16/2)=8) = 4 splits of 32.
        assert_eq!(dec.len() / ITEM_WORDS, 4);
        assert_eq!(slots, 4);
        assert_eq!(groups, vec![0, 1, 0, 4]);
        assert_eq!(&dec[..8], &[0, 0, 2, 99, 0, 32, 0, SINK_FLAG]);
        assert_eq!(&dec[24..32], &[0, 0, 2, 99, 96, 100, 0, 3]);
        // 40 tokens × 2 rows = 80 rows: tiles of 32, 32, 16.
        let rows: Vec<u32> = pre.chunks(8).map(|c| c[2]).collect();
        assert_eq!(rows, vec![32, 32, 16]);
        assert_eq!(
            &pre[..8],
            &[1, 0, 32, 10, 0, 50, 7, DIRECT_SLOT | SINK_FLAG]
        );
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
