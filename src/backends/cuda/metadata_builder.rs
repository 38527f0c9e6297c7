//! The CUDA backend's metadata builder and the work lists its kernels consume.
//!
//! `build` runs once per step: it validates a cascade request, makes sure the metadata arrays
//! (query_start_loc, seq_lens, block_table, slot_mapping) are on this GPU, and keeps the host
//! copies for planning. The attention work list depends on the layer's shape (GQA group,
//! window, mask), which a builder does not know; it is planned on the host the first time a
//! layer of a given shape runs in this step, uploaded once, and reused by every later layer of
//! that shape ([`CudaAttentionMetadata::plan`]).
//!
//! Planning ([`plan_work`]): each request's query tokens are cut into tiles of
//! `rows / heads` tokens, for every KV head and chunk of its query heads, so that a CTA holds
//! at most `rows` (token, head) rows (16 for the CUDA-core kernel, 64 for the tensor-core
//! one); a key can restrict the plan to requests in a range of query lengths, so that the two
//! kernels split one batch. Single-token (decode) requests are split along
//! the keys (flash-decoding) when the batch has too few CTAs to fill the GPU: each split
//! writes an f32 partial and its LSE, and `combine_splits` merges them. For the decode kernel
//! (`PlanKey::slots` > 0) the split count is chosen so that the CTAs fill whole waves of the
//! GPU's concurrent CTA slots ([`decode_split_target`]).
//!
//! CUDA graphs ([`CudaMetadataBuilder::build_graph`], the builder's `build_for_graph_capture`):
//! a captured decode step bakes into the graph every device address its kernels read and every
//! launch shape (grid sizes, token counts, split counts). vLLM's answer, copied here, is
//! persistent buffers: the builder keeps, per padded batch shape, device buffers for the
//! metadata arrays, the work lists and the split-KV partials, allocated once and never moved;
//! each step's build rewrites their *contents* (asynchronous uploads on the device's stream,
//! outside the graph) and the same graph is replayed. For the launch shapes to stay valid the
//! work list has a fixed layout ([`plan_graph_work`]): the split count is chosen for the longest
//! context the block table can hold, and shorter requests leave their surplus splits empty.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::GraphCaptureSupport;
use crate::device::{CudaDevice, CudaStorage, Device, Storage, Tensor};
use crate::error::{Error, Result};
use crate::kv_cache::KvCacheSpec;
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CommonAttentionMetadata, DecodePrefillSplit,
    DeviceMetadata,
};

use super::kernels::{WorkItem, KEYS_PER_CHUNK, ROWS_PER_ITEM};

/// Most key splits of one decode token.
pub const MAX_SPLITS: usize = 32;
/// Fewest keys worth a split of their own.
pub const MIN_KEYS_PER_SPLIT: usize = 256;
/// Most key splits of one decode token on the decode kernel.
pub const DECODE_MAX_SPLITS: usize = 128;
/// Fewest keys per split on the decode kernel (two 16-key chunks per warp).
pub const DECODE_MIN_KEYS_PER_SPLIT: usize = 128;
/// Wave efficiency (CTAs / (waves x slots)) the decode split count aims for.
const DECODE_WAVE_EFFICIENCY: f64 = 0.95;

/// Shared-prefix (cascade) attention plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CascadePlan {
    /// Tokens of the shared prefix (a multiple of the block size, already cached for every
    /// request).
    pub prefix_len: usize,
}

/// Which keys a pass attends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    /// All of a request's keys `[0, seq_len)` (dense encoder K/V: `[0, query_len)`).
    Full,
    /// Cascade prefix: keys `[0, prefix_len)`.
    Prefix(usize),
    /// Cascade suffix: keys `[prefix_len, seq_len)`.
    Suffix(usize),
}

/// What a work list depends on besides the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlanKey {
    /// Query heads per KV head.
    pub group: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Causal mask.
    pub causal: bool,
    /// Sliding window.
    pub window: Option<usize>,
    /// Key range.
    pub pass: Pass,
    /// Keys from dense K/V (encoder) rather than the cache.
    pub dense: bool,
    /// Decode tokens may be split along the keys.
    pub allow_split: bool,
    /// Most (token, head) rows per work item: 16 for the CUDA-core kernel, 64 for the
    /// tensor-core one.
    pub rows: usize,
    /// Only requests whose query length is in `min_q..max_q` get work items.
    pub min_q: usize,
    /// See `min_q`.
    pub max_q: usize,
    /// CTAs the GPU runs at once for the kernel (SMs x CTAs per SM). Non-zero selects the
    /// decode kernel's split rule (`decode_split_target`, `DECODE_MAX_SPLITS`,
    /// `DECODE_MIN_KEYS_PER_SPLIT`); 0 the CUDA-core kernel's (2 CTAs per SM,
    /// [`MAX_SPLITS`], [`MIN_KEYS_PER_SPLIT`]).
    pub slots: usize,
}

impl PlanKey {
    /// A key for the CUDA-core kernel over every request.
    pub fn new(group: usize, num_kv_heads: usize, causal: bool, window: Option<usize>) -> Self {
        PlanKey {
            group,
            num_kv_heads,
            causal,
            window,
            pass: Pass::Full,
            dense: false,
            allow_split: false,
            rows: ROWS_PER_ITEM,
            min_q: 0,
            max_q: usize::MAX,
            slots: 0,
        }
    }
}

/// Splits of a decode token with `len` visible keys when `want` are wanted: `(splits,
/// keys per split)`, keys per split a multiple of the chunk size; `(1, len)` when unsplit.
fn split_shape(len: usize, want: usize, max_splits: usize, min_keys: usize) -> (usize, usize) {
    let s = want.min(max_splits).min(len / min_keys.max(1));
    if s <= 1 {
        return (1, len);
    }
    let chunk = len.div_ceil(s).div_ceil(KEYS_PER_CHUNK) * KEYS_PER_CHUNK;
    (len.div_ceil(chunk), chunk)
}

/// The split count to ask of every splittable decode token so that `ctas(want)` CTAs fill
/// whole waves of `slots`: the smallest `want` in `1..=max` whose wave efficiency
/// (CTAs / (waves x slots)) reaches 0.95, else the most efficient one.
pub fn decode_split_target(slots: usize, max: usize, ctas: impl Fn(usize) -> usize) -> usize {
    let slots = slots.max(1);
    let eff = |n: usize| {
        if n == 0 {
            return 0.0;
        }
        n as f64 / (n.div_ceil(slots) * slots) as f64
    };
    let mut best = (1, eff(ctas(1)));
    for want in 1..=max.max(1) {
        let e = eff(ctas(want));
        if e >= DECODE_WAVE_EFFICIENCY {
            return want;
        }
        if e > best.1 + 1e-9 {
            best = (want, e);
        }
    }
    best.0
}

/// A planned work list, on the host and uploaded.
#[derive(Debug)]
pub struct WorkPlan {
    /// One entry per CTA.
    pub items: Vec<WorkItem>,
    /// `(token, part_tok, num_splits, 0)` per split decode token.
    pub split_tokens: Vec<[i32; 4]>,
    /// Most splits of any token (0 when nothing is split).
    pub max_splits: usize,
    /// `items` on the device (shared with the plan's later versions in graph mode).
    pub(crate) items_dev: Option<Arc<CudaStorage>>,
    /// `split_tokens` on the device, for the CUDA-core kernel's combine only (the decode
    /// kernel merges its splits in place and gets none).
    pub(crate) split_dev: Option<Arc<CudaStorage>>,
}

/// The batch-level inputs of [`plan_work`], as host slices.
#[derive(Clone, Copy, Debug)]
pub struct PlanInputs<'a> {
    /// `[num_reqs + 1]`.
    pub query_start_loc: &'a [i32],
    /// `[num_reqs]`.
    pub seq_lens: &'a [i32],
    /// Streaming multiprocessors of the GPU (split heuristic).
    pub sm_count: usize,
}

/// Plans the CTAs of one attention pass (see the module docs). Pure host code.
pub fn plan_work(inp: PlanInputs<'_>, key: &PlanKey) -> WorkPlan {
    let g = key.group.max(1);
    let rows = key.rows.max(1);
    let hc = g.min(rows);
    let tq = (rows / hc).max(1);
    let head_chunks: Vec<(usize, usize)> = (0..g).step_by(hc).map(|s| (s, hc.min(g - s))).collect();
    let ctas_per_tile = key.num_kv_heads * head_chunks.len();
    let num_reqs = inp.seq_lens.len();
    let q_len = |r: usize| (inp.query_start_loc[r + 1] - inp.query_start_loc[r]) as usize;
    let included = |r: usize| (key.min_q..key.max_q).contains(&q_len(r));

    // Key range and visible range of a single decode token, per request.
    let range = |r: usize| -> (usize, usize) {
        let seq = inp.seq_lens[r] as usize;
        let ql = (inp.query_start_loc[r + 1] - inp.query_start_loc[r]) as usize;
        match key.pass {
            Pass::Full if key.dense => (0, ql),
            Pass::Full => (0, seq),
            Pass::Prefix(p) => (0, p.min(seq)),
            Pass::Suffix(p) => (p.min(seq), seq),
        }
    };
    let decode_visible = |r: usize| -> (usize, usize) {
        let (lo, hi) = range(r);
        let pos = inp.seq_lens[r] as usize - 1;
        let hi = if key.causal { hi.min(pos + 1) } else { hi };
        let lo = match key.window {
            Some(w) => lo.max((pos + 1).saturating_sub(w)),
            None => lo,
        };
        (lo, hi.max(lo))
    };
    let splittable = |r: usize| {
        key.allow_split
            && !key.dense
            && key.pass == Pass::Full
            && inp.query_start_loc[r + 1] - inp.query_start_loc[r] == 1
    };

    let (max_split, min_keys) = if key.slots > 0 {
        (DECODE_MAX_SPLITS, DECODE_MIN_KEYS_PER_SPLIT)
    } else {
        (MAX_SPLITS, MIN_KEYS_PER_SPLIT)
    };
    let want = if key.slots > 0 {
        // CTAs of the whole plan when every splittable token asks for `w` splits.
        let ctas = |w: usize| -> usize {
            (0..num_reqs)
                .filter(|&r| included(r) && q_len(r) > 0)
                .map(|r| {
                    let tiles = if splittable(r) {
                        let (vlo, vhi) = decode_visible(r);
                        split_shape(vhi - vlo, w, max_split, min_keys).0
                    } else {
                        q_len(r).div_ceil(tq)
                    };
                    tiles * ctas_per_tile
                })
                .sum()
        };
        super::tuning::CudaTuning::get()
            .decode_splits
            .unwrap_or_else(|| decode_split_target(key.slots, max_split, ctas))
    } else {
        // CTAs without splitting decide how much splitting is worth it.
        let base_ctas: usize = (0..num_reqs)
            .filter(|&r| included(r))
            .map(|r| q_len(r).div_ceil(tq) * ctas_per_tile)
            .sum();
        let target = 2 * inp.sm_count.max(1);
        if base_ctas == 0 {
            1
        } else {
            target.div_ceil(base_ctas)
        }
    };

    let mut items = Vec::new();
    // Keys each item visits (an estimate of its time), for the request order below.
    let mut work: Vec<usize> = Vec::new();
    let mut split_tokens = Vec::new();
    let mut max_splits = 0usize;
    for r in 0..num_reqs {
        let qs = inp.query_start_loc[r] as usize;
        let ql = (inp.query_start_loc[r + 1] as usize).saturating_sub(qs);
        if ql == 0 || !included(r) {
            continue;
        }
        let (lo, hi) = range(r);
        let mut pushed = false;
        if splittable(r) && want > 1 {
            let (vlo, vhi) = decode_visible(r);
            let (s, chunk) = split_shape(vhi - vlo, want, max_split, min_keys);
            if s > 1 {
                let part_tok = split_tokens.len() as i32;
                split_tokens.push([qs as i32, part_tok, s as i32, 0]);
                max_splits = max_splits.max(s);
                for kv_head in 0..key.num_kv_heads {
                    for &(h0, hn) in &head_chunks {
                        for i in 0..s {
                            let a = vlo + i * chunk;
                            items.push(WorkItem {
                                req: r as i32,
                                q_start: qs as i32,
                                q_len: 1,
                                kv_head: kv_head as i32,
                                head_start: h0 as i32,
                                head_count: hn as i32,
                                kv_lo: a as i32,
                                kv_hi: (a + chunk).min(vhi) as i32,
                                split: i as i32,
                                num_splits: s as i32,
                                part_tok,
                                pad_: 0,
                            });
                            work.push((a + chunk).min(vhi) - a);
                        }
                    }
                }
                pushed = true;
            }
        }
        if pushed {
            continue;
        }
        // Last query tile first: under a causal mask it sees the most keys (the kernels do not
        // depend on the order; requests are ordered longest first below).
        let ctx = (inp.seq_lens[r] as usize).saturating_sub(ql);
        for t in (qs..qs + ql).step_by(tq).rev() {
            let n = tq.min(qs + ql - t);
            // Keys the tile's rows see together: up to its last row's position when causal,
            // from its first row's window start.
            let end = if key.causal {
                hi.min(ctx + (t - qs) + n)
            } else {
                hi
            };
            let start = match key.window {
                Some(w) => lo.max((ctx + (t - qs) + 1).saturating_sub(w)),
                None => lo,
            };
            let keys = end.saturating_sub(start);
            for kv_head in 0..key.num_kv_heads {
                for &(h0, hn) in &head_chunks {
                    items.push(WorkItem {
                        req: r as i32,
                        q_start: t as i32,
                        q_len: n as i32,
                        kv_head: kv_head as i32,
                        head_start: h0 as i32,
                        head_count: hn as i32,
                        kv_lo: lo as i32,
                        kv_hi: hi as i32,
                        split: 0,
                        num_splits: 1,
                        part_tok: 0,
                        pad_: 0,
                    });
                    work.push(keys);
                }
            }
        }
    }
    // Requests in order of their longest item (the GPU starts CTAs in grid order, so a long
    // request's tiles do not start last and stretch the tail), each request's items kept
    // together (last query tile first). Why not longest-first item by item: CTAs of one
    // request share its K/V in L2, and interleaving all requests' tiles measured slower
    // on multi-request prefills (P2.b8s4k).
    let mut runs: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    for (i, it) in items.iter().enumerate() {
        match runs.last_mut() {
            Some((w, r)) if items[r.start].req == it.req => {
                *w = (*w).max(work[i]);
                r.end = i + 1;
            }
            _ => runs.push((work[i], i..i + 1)),
        }
    }
    runs.sort_by_key(|(w, _)| std::cmp::Reverse(*w));
    let items = runs
        .into_iter()
        .flat_map(|(_, r)| items[r].iter().copied())
        .collect();
    WorkPlan {
        items,
        split_tokens,
        max_splits,
        items_dev: None,
        split_dev: None,
    }
}

/// The fixed-layout work list of a graph-captured decode step ([`CudaMetadataBuilder::build_graph`]).
///
/// Every request must have query length 1 (otherwise this is [`plan_work`] without splits,
/// whose layout also depends only on the query lengths). The number of items, the split list
/// and `max_splits` depend only on the number of requests, `key`, `sm_count` and
/// `max_seq_len` (the longest context the block table can describe), never on the sequence
/// lengths, so the grids a graph captured fit every later step; only the items' key ranges
/// change. The split target is chosen as [`plan_work`] would for requests of `max_seq_len`
/// keys (for the decode kernel: filling whole waves); each request is then split as
/// [`plan_work`] would split it with that target, and its surplus items get an empty key range
/// (`kv_lo == kv_hi`), which the kernels turn into a partial of weight zero (LSE −∞) that the
/// combine skips. Every split request is in the split list, with the fixed split count.
///
/// The price: short requests in a graph launch empty CTAs (cheap: they load the query and
/// exit) and go through the combine even when unsplit.
pub fn plan_graph_work(inp: PlanInputs<'_>, key: &PlanKey, max_seq_len: usize) -> WorkPlan {
    let num_reqs = inp.seq_lens.len();
    let q_len = |r: usize| inp.query_start_loc[r + 1] - inp.query_start_loc[r];
    let splittable = key.allow_split && !key.dense && key.pass == Pass::Full;
    if !splittable || !(0..num_reqs).all(|r| q_len(r) == 1) {
        return plan_work(
            inp,
            &PlanKey {
                allow_split: false,
                ..*key
            },
        );
    }
    let mut plan = WorkPlan {
        items: Vec::new(),
        split_tokens: Vec::new(),
        max_splits: 0,
        items_dev: None,
        split_dev: None,
    };
    if !(key.min_q..key.max_q).contains(&1) {
        return plan;
    }
    let g = key.group.max(1);
    let hc = g.min(key.rows.max(1));
    let head_chunks: Vec<(usize, usize)> = (0..g).step_by(hc).map(|s| (s, hc.min(g - s))).collect();
    let ctas_per_req = key.num_kv_heads * head_chunks.len();
    let (max_split, min_keys) = if key.slots > 0 {
        (DECODE_MAX_SPLITS, DECODE_MIN_KEYS_PER_SPLIT)
    } else {
        (MAX_SPLITS, MIN_KEYS_PER_SPLIT)
    };
    // The most keys a single decode token can see.
    let vis_max = key.window.map_or(max_seq_len, |w| w.min(max_seq_len));
    let want = if key.slots > 0 {
        super::tuning::CudaTuning::get()
            .decode_splits
            .unwrap_or_else(|| {
                decode_split_target(key.slots, max_split, |w| {
                    num_reqs * ctas_per_req * split_shape(vis_max, w, max_split, min_keys).0
                })
            })
    } else {
        let base = num_reqs * ctas_per_req;
        if base == 0 {
            1
        } else {
            (2 * inp.sm_count.max(1)).div_ceil(base)
        }
    };
    // split_shape's count never exceeds its first bound, which grows with the length.
    let cap = want.min(max_split).min(vis_max / min_keys.max(1)).max(1);
    for r in 0..num_reqs {
        let qs = inp.query_start_loc[r];
        let seq = inp.seq_lens[r].max(0) as usize;
        if cap == 1 {
            for kv_head in 0..key.num_kv_heads {
                for &(h0, hn) in &head_chunks {
                    plan.items.push(WorkItem {
                        req: r as i32,
                        q_start: qs,
                        q_len: 1,
                        kv_head: kv_head as i32,
                        head_start: h0 as i32,
                        head_count: hn as i32,
                        kv_lo: 0,
                        kv_hi: seq as i32,
                        split: 0,
                        num_splits: 1,
                        part_tok: 0,
                        pad_: 0,
                    });
                }
            }
            continue;
        }
        // The token's visible keys, as in plan_work.
        let pos = seq.saturating_sub(1);
        let vhi = if key.causal { seq.min(pos + 1) } else { seq };
        let vlo = key.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let vhi = vhi.max(vlo);
        let (s, chunk) = split_shape(vhi - vlo, want, max_split, min_keys);
        let s = s.min(cap);
        let part_tok = plan.split_tokens.len() as i32;
        plan.split_tokens.push([qs, part_tok, cap as i32, 0]);
        for kv_head in 0..key.num_kv_heads {
            for &(h0, hn) in &head_chunks {
                for i in 0..cap {
                    let (a, b) = if i < s {
                        (vlo + i * chunk, (vlo + (i + 1) * chunk).min(vhi))
                    } else {
                        (vhi, vhi)
                    };
                    plan.items.push(WorkItem {
                        req: r as i32,
                        q_start: qs,
                        q_len: 1,
                        kv_head: kv_head as i32,
                        head_start: h0 as i32,
                        head_count: hn as i32,
                        kv_lo: a as i32,
                        kv_hi: b as i32,
                        split: i as i32,
                        num_splits: cap as i32,
                        part_tok,
                        pad_: 0,
                    });
                }
            }
        }
        plan.max_splits = cap;
    }
    plan
}

/// Which graph buffers a batch uses: everything a captured launch bakes in besides the
/// layer's own shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct GraphShape {
    num_reqs: usize,
    max_blocks_per_req: usize,
    causal: bool,
}

/// The persistent device buffers of one padded batch shape (module docs). Shared by every
/// metadata built for that shape; the latest build defines their contents.
#[derive(Debug)]
struct GraphBuffers {
    shape: GraphShape,
    /// query_start_loc, seq_lens, block_table, slot_mapping at fixed addresses.
    arrays: DeviceMetadata,
    /// Fixed-layout plans per layer shape, re-planned into the same buffers by every build.
    plans: Mutex<HashMap<PlanKey, Arc<WorkPlan>>>,
    /// Every split-KV scratch buffer handed out, the largest last. None is freed while the
    /// builder lives: a graph captured earlier may hold the address of any of them.
    scratch: Mutex<Vec<CudaStorage>>,
    /// Every split-counter buffer handed out (kept alive for the same reason).
    counters: Mutex<Vec<CudaStorage>>,
    /// Bumped by every build; metadata of an older build is stale.
    generation: std::sync::atomic::AtomicU64,
}

fn cuda_storage<'a>(t: &'a Tensor, what: &str) -> Result<&'a CudaStorage> {
    match t.storage() {
        Storage::Cuda(s) => Ok(s),
        _ => Err(Error::Device {
            backend: "CUDA".into(),
            message: format!("graph buffer {what} is not CUDA memory"),
        }),
    }
}

impl GraphBuffers {
    fn new(device: &CudaDevice, shape: GraphShape) -> Result<Self> {
        let dev = Device::Cuda(device.clone());
        let n = shape.num_reqs;
        Ok(GraphBuffers {
            shape,
            arrays: DeviceMetadata {
                query_start_loc: Tensor::from_i32(&dev, &vec![0; n + 1], &[n + 1])?,
                seq_lens: Tensor::from_i32(&dev, &vec![0; n], &[n])?,
                block_table: Tensor::from_i32(
                    &dev,
                    &vec![0; n * shape.max_blocks_per_req],
                    &[n, shape.max_blocks_per_req],
                )?,
                slot_mapping: Tensor::from_i64(&dev, &vec![-1; n], &[n])?,
            },
            plans: Mutex::new(HashMap::new()),
            scratch: Mutex::new(Vec::new()),
            counters: Mutex::new(Vec::new()),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn plan_inputs<'a>(common: &'a CommonAttentionMetadata, device: &CudaDevice) -> PlanInputs<'a> {
        PlanInputs {
            query_start_loc: common.query_start_loc_cpu(),
            seq_lens: common.seq_lens_cpu(),
            sm_count: device.sm_count() as usize,
        }
    }

    /// Writes `common`'s arrays and re-plans every known layer shape into the same buffers.
    fn update(&self, device: &CudaDevice, common: &CommonAttentionMetadata) -> Result<()> {
        let a = &self.arrays;
        device.write_pod(
            cuda_storage(&a.query_start_loc, "query_start_loc")?,
            0,
            common.query_start_loc_cpu(),
        )?;
        device.write_pod(
            cuda_storage(&a.seq_lens, "seq_lens")?,
            0,
            common.seq_lens_cpu(),
        )?;
        device.write_pod(
            cuda_storage(&a.block_table, "block_table")?,
            0,
            common.block_table_cpu(),
        )?;
        device.write_pod(
            cuda_storage(&a.slot_mapping, "slot_mapping")?,
            0,
            common.slot_mapping_cpu(),
        )?;
        let max_seq = common.max_blocks_per_req() * common.block_size();
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        for (key, old) in plans.iter_mut() {
            let mut plan = plan_graph_work(Self::plan_inputs(common, device), key, max_seq);
            if plan.items.len() != old.items.len()
                || plan.split_tokens.len() != old.split_tokens.len()
                || plan.max_splits != old.max_splits
            {
                return Err(Error::Device {
                    backend: "CUDA".into(),
                    message: format!(
                        "graph work list for {key:?} changed shape ({} -> {} items); this is a \
                         bug in plan_graph_work",
                        old.items.len(),
                        plan.items.len()
                    ),
                });
            }
            if let Some(d) = &old.items_dev {
                device.write_pod(d, 0, &plan.items)?;
            }
            if let Some(d) = &old.split_dev {
                device.write_pod(d, 0, &plan.split_tokens)?;
            }
            plan.items_dev = old.items_dev.clone();
            plan.split_dev = old.split_dev.clone();
            *old = Arc::new(plan);
        }
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// The plan for `key`: re-planned by the latest build, or planned and uploaded now (not
    /// inside a capture).
    fn plan(
        &self,
        device: &CudaDevice,
        common: &CommonAttentionMetadata,
        key: &PlanKey,
    ) -> Result<Arc<WorkPlan>> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get(key) {
            return Ok(p.clone());
        }
        if device.is_capturing() {
            return Err(device.capture_error(&format!(
                "the first forward of a layer shape ({} query heads per KV head, {} KV heads, \
                 window {:?}) with this graph metadata (its work list must be planned and \
                 uploaded first)",
                key.group, key.num_kv_heads, key.window
            )));
        }
        let max_seq = common.max_blocks_per_req() * common.block_size();
        let mut plan = plan_graph_work(Self::plan_inputs(common, device), key, max_seq);
        if !plan.items.is_empty() {
            plan.items_dev = Some(Arc::new(device.upload_pod(&plan.items)?));
        }
        // Only the CUDA-core kernel's combine reads the split list (the decode kernel,
        // `slots > 0`, merges its splits in place).
        if !plan.split_tokens.is_empty() && key.slots == 0 {
            plan.split_dev = Some(Arc::new(device.upload_pod(&plan.split_tokens)?));
        }
        let plan = Arc::new(plan);
        plans.insert(*key, plan.clone());
        Ok(plan)
    }

    /// A buffer of at least `bytes` bytes from `list` (zeroed when allocated); grows only
    /// outside a capture, and keeps the smaller ones alive.
    fn grown(
        list: &Mutex<Vec<CudaStorage>>,
        device: &CudaDevice,
        bytes: usize,
        what: &str,
    ) -> Result<u64> {
        let mut s = list.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = s.last() {
            if b.len_bytes() >= bytes {
                return Ok(b.device_ptr());
            }
        }
        if device.is_capturing() {
            return Err(device.capture_error(&format!(
                "growing the {what} to {bytes} bytes (run every layer once eagerly with this \
                 graph metadata before capturing)"
            )));
        }
        let b = device.zeros_bytes(bytes)?;
        let ptr = b.device_ptr();
        s.push(b);
        Ok(ptr)
    }
}

/// What the CUDA kernels consume for one batch.
#[derive(Debug)]
pub struct CudaAttentionMetadata {
    /// The validated common metadata.
    pub common: CommonAttentionMetadata,
    /// The decode / prefill split (informational: one kernel handles both).
    pub split: DecodePrefillSplit,
    /// Cascade plan when `common_prefix_len > 0`.
    pub cascade: Option<CascadePlan>,
    /// Copies of the metadata arrays on this GPU, when `common` holds them elsewhere (built
    /// for another device); `None` when `common`'s own device copies are on this GPU.
    uploaded: Option<DeviceMetadata>,
    pub(crate) device: CudaDevice,
    plans: Mutex<HashMap<PlanKey, Arc<WorkPlan>>>,
    scratch: Mutex<Option<CudaStorage>>,
    counters: Mutex<Option<CudaStorage>>,
    /// Persistent buffers (graph-capturable metadata), with the build generation this
    /// metadata was made by.
    graph: Option<(Arc<GraphBuffers>, u64)>,
}

impl AttentionMetadata for CudaAttentionMetadata {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl CudaAttentionMetadata {
    /// The metadata arrays (query_start_loc, seq_lens, block_table, slot_mapping) on this GPU
    /// (for graph metadata, the persistent buffers).
    pub fn arrays(&self) -> &DeviceMetadata {
        if let Some((g, _)) = &self.graph {
            return &g.arrays;
        }
        self.uploaded
            .as_ref()
            .unwrap_or_else(|| self.common.device())
    }

    /// Whether this metadata was built for graph capture ([`CudaMetadataBuilder::build_graph`]):
    /// its kernels read only persistent buffers, so a forward with it can be captured.
    pub fn is_graph_capturable(&self) -> bool {
        self.graph.is_some()
    }

    /// Errors when this is graph metadata and a later build for the same batch shape has
    /// rewritten the shared buffers (this metadata's host copies no longer match them).
    pub(crate) fn check_current(&self) -> Result<()> {
        if let Some((g, generation)) = &self.graph {
            if g.generation.load(std::sync::atomic::Ordering::SeqCst) != *generation {
                return Err(Error::metadata(format!(
                    "stale graph metadata: a later build_for_graph_capture for the same batch \
                     shape ({} requests) rewrote its persistent buffers; use the latest metadata",
                    g.shape.num_reqs
                )));
            }
        }
        Ok(())
    }

    /// The address of a device buffer of at least `bytes` bytes, kept for the life of this
    /// metadata and shared by every layer that runs with it (split-KV partials): its users
    /// are ordered on the device's one stream, so a layer's kernels never overlap the
    /// previous layer's. Its contents are whatever the last user left (zeros when new); a
    /// larger request replaces it (the old buffer's free is stream-ordered too).
    pub(crate) fn scratch(&self, bytes: usize) -> Result<u64> {
        if let Some((g, _)) = &self.graph {
            return GraphBuffers::grown(&g.scratch, &self.device, bytes, "split-KV scratch");
        }
        self.grown(&self.scratch, bytes)
    }

    /// The decode kernel's split arrival counters: at least `n` i32, all zero between
    /// launches (zeroed when allocated; every launch leaves them zero). Not shared with the
    /// scratch, which other kernels of a step overwrite.
    pub(crate) fn split_counters(&self, n: usize) -> Result<u64> {
        let bytes = n.max(1) * 4;
        if let Some((g, _)) = &self.graph {
            return GraphBuffers::grown(&g.counters, &self.device, bytes, "split counters");
        }
        self.grown(&self.counters, bytes)
    }

    /// A zeroed buffer of at least `bytes` in `slot`, replaced by a larger one when needed.
    fn grown(&self, slot: &Mutex<Option<CudaStorage>>, bytes: usize) -> Result<u64> {
        let mut s = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = s.as_ref() {
            if b.len_bytes() >= bytes {
                return Ok(b.device_ptr());
            }
        }
        let b = self.device.zeros_bytes(bytes)?;
        let ptr = b.device_ptr();
        *s = Some(b);
        Ok(ptr)
    }

    /// The work list for `key`, planned and uploaded on first use in this step (graph
    /// metadata: the fixed-layout plan of [`plan_graph_work`] in the persistent buffers).
    pub fn plan(&self, key: &PlanKey) -> Result<Arc<WorkPlan>> {
        if let Some((g, _)) = &self.graph {
            return g.plan(&self.device, &self.common, key);
        }
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get(key) {
            return Ok(p.clone());
        }
        let mut plan = plan_work(
            PlanInputs {
                query_start_loc: self.common.query_start_loc_cpu(),
                seq_lens: self.common.seq_lens_cpu(),
                sm_count: self.device.sm_count() as usize,
            },
            key,
        );
        if !plan.items.is_empty() {
            plan.items_dev = Some(Arc::new(self.device.upload_pod(&plan.items)?));
        }
        // Only the CUDA-core kernel's combine reads the split list (see above).
        if !plan.split_tokens.is_empty() && key.slots == 0 {
            plan.split_dev = Some(Arc::new(self.device.upload_pod(&plan.split_tokens)?));
        }
        let plan = Arc::new(plan);
        plans.insert(*key, plan.clone());
        Ok(plan)
    }
}

/// Builds [`CudaAttentionMetadata`].
///
/// Graph capture level: [`GraphCaptureSupport::UniformSingleTokenDecode`]. What is
/// capturable: a forward (`reshape_and_cache` plus attention, every kernel path: the
/// tensor-core decode kernel, and the CUDA-core kernel for fp8 caches, f32 and other head
/// sizes, with sinks, windows, ALiBi and soft caps) over a batch whose requests all have query
/// length 1, with metadata from [`CudaMetadataBuilder::build_graph`] (the trait's
/// `build_for_graph_capture`), after one eager forward of every layer with metadata of that
/// batch shape (it plans, uploads and compiles). Not capturable: prefills and mixed batches
/// (their work lists depend on the query lengths), cascade, metadata from `build`. A replay
/// of a later step needs: the same number of requests, block-table width and causality (pad
/// the batch with dummy requests of query length 1, seq_len 1, block 0 and slot −1, as vLLM
/// pads), a new `build_graph` of that step before the replay, and the step's q / k / v
/// written into the tensors the graph captured.
#[derive(Clone, Debug)]
pub struct CudaMetadataBuilder {
    spec: KvCacheSpec,
    device: CudaDevice,
    /// Persistent graph buffers per batch shape, shared by the builder's clones.
    graphs: Arc<Mutex<HashMap<GraphShape, Arc<GraphBuffers>>>>,
}

impl CudaMetadataBuilder {
    /// A builder for one KV-cache group on `device`.
    pub fn new(spec: KvCacheSpec, device: CudaDevice) -> Self {
        CudaMetadataBuilder {
            spec,
            device,
            graphs: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn check_block_size(&self, common: &CommonAttentionMetadata) -> Result<()> {
        if common.block_size() != self.spec.block_size {
            return Err(Error::metadata(format!(
                "batch block size {} differs from the KV-cache group's {}",
                common.block_size(),
                self.spec.block_size
            )));
        }
        Ok(())
    }

    /// Metadata whose kernels read only persistent device buffers, for a forward that is
    /// captured into a CUDA graph or that runs a step of one (see the type docs for what is
    /// capturable).
    ///
    /// The first call for a batch shape (number of requests, block-table width, causality)
    /// allocates its buffers; every call writes `common`'s arrays and the work lists of every
    /// layer shape seen so far into them with asynchronous uploads on the device's stream,
    /// ordered before whatever is queued next (a replay). The buffers are shared by all
    /// metadata of that shape: the latest build defines what a replay computes, and older
    /// metadata of that shape refuse to run ([`Error::Metadata`], stale).
    ///
    /// Errors: [`Error::Metadata`] when a request's query length is not 1 (the graph level is
    /// `UniformSingleTokenDecode`) or the block size is not the builder's; [`Error::Device`]
    /// inside a capture (updates happen between replays).
    pub fn build_graph(&self, common: &CommonAttentionMetadata) -> Result<CudaAttentionMetadata> {
        self.check_block_size(common)?;
        if common.num_reqs() == 0 {
            return Err(Error::metadata(
                "a graph-captured batch needs at least one request",
            ));
        }
        if let Some(r) = (0..common.num_reqs()).find(|&r| common.query_len(r) != 1) {
            return Err(Error::metadata(format!(
                "CUDA graphs capture only uniform single-token decode batches \
                 (GraphCaptureSupport::UniformSingleTokenDecode): request {r} has query \
                 length {}; run prefills and mixed batches eagerly",
                common.query_len(r)
            )));
        }
        if self.device.is_capturing() {
            return Err(self
                .device
                .capture_error("building graph metadata (it uploads the step's arrays)"));
        }
        let shape = GraphShape {
            num_reqs: common.num_reqs(),
            max_blocks_per_req: common.max_blocks_per_req(),
            causal: common.causal(),
        };
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
        buffers.update(&self.device, common)?;
        let generation = buffers.generation.load(std::sync::atomic::Ordering::SeqCst);
        Ok(CudaAttentionMetadata {
            split: common.split_decodes_and_prefills(1, false, true),
            common: common.clone(),
            cascade: None,
            uploaded: None,
            device: self.device.clone(),
            plans: Mutex::new(HashMap::new()),
            scratch: Mutex::new(None),
            counters: Mutex::new(None),
            graph: Some((buffers, generation)),
        })
    }

    /// `None` when `common`'s device copies are on this GPU, else copies uploaded here.
    fn uploaded(&self, common: &CommonAttentionMetadata) -> Result<Option<DeviceMetadata>> {
        let d = common.device();
        let on_this_gpu = [&d.query_start_loc, &d.seq_lens, &d.block_table, &d.slot_mapping]
            .iter()
            .all(|t| {
                matches!((t.device(), t.storage()), (Device::Cuda(g), Storage::Cuda(_)) if *g == self.device)
            });
        if on_this_gpu {
            return Ok(None);
        }
        let here = Device::Cuda(self.device.clone());
        Ok(Some(DeviceMetadata {
            query_start_loc: d.query_start_loc.to_device(&here)?,
            seq_lens: d.seq_lens.to_device(&here)?,
            block_table: d.block_table.to_device(&here)?,
            slot_mapping: d.slot_mapping.to_device(&here)?,
        }))
    }
}

impl AttentionMetadataBuilder for CudaMetadataBuilder {
    /// `UniformSingleTokenDecode`: see the type docs.
    fn graph_capture_support(&self) -> GraphCaptureSupport {
        GraphCaptureSupport::UniformSingleTokenDecode
    }

    fn build(
        &self,
        common_prefix_len: usize,
        common: &CommonAttentionMetadata,
        _fast_build: bool,
    ) -> Result<Box<dyn AttentionMetadata>> {
        self.check_block_size(common)?;
        let cascade = common
            .cascade_prefix_blocks(common_prefix_len)?
            .map(|_| CascadePlan {
                prefix_len: common_prefix_len,
            });
        let uploaded = self.uploaded(common)?;
        Ok(Box::new(CudaAttentionMetadata {
            split: common.split_decodes_and_prefills(1, false, true),
            common: common.clone(),
            cascade,
            uploaded,
            device: self.device.clone(),
            plans: Mutex::new(HashMap::new()),
            scratch: Mutex::new(None),
            counters: Mutex::new(None),
            graph: None,
        }))
    }

    /// [`CudaMetadataBuilder::build_graph`], boxed.
    fn build_for_graph_capture(
        &self,
        common: &CommonAttentionMetadata,
    ) -> Result<Box<dyn AttentionMetadata>> {
        Ok(Box::new(self.build_graph(common)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`plan_work`] on a 132-SM GPU.
    fn plan_for(qsl: &[i32], seq: &[i32], key: &PlanKey) -> WorkPlan {
        plan_work(
            PlanInputs {
                query_start_loc: qsl,
                seq_lens: seq,
                sm_count: 132,
            },
            key,
        )
    }

    fn key(group: usize, kv: usize) -> PlanKey {
        PlanKey {
            allow_split: true,
            ..PlanKey::new(group, kv, true, None)
        }
    }

    /// Every (token, query head) is covered exactly once, by unsplit items or by all splits.
    fn coverage(plan: &WorkPlan, qsl: &[i32], heads: usize, group: usize) -> Vec<usize> {
        let t = *qsl.last().unwrap() as usize;
        let mut seen = vec![0usize; t * heads];
        for it in &plan.items {
            if it.split != 0 {
                continue;
            }
            for tok in it.q_start..it.q_start + it.q_len {
                for h in it.head_start..it.head_start + it.head_count {
                    let head = it.kv_head as usize * group + h as usize;
                    seen[tok as usize * heads + head] += 1;
                }
            }
        }
        seen
    }

    #[test]
    fn tiles_cover_every_row_once() {
        let qsl = [0, 1, 40, 41, 300];
        let seq = [100, 39, 5000, 700];
        for (group, kv) in [(1, 4), (4, 2), (8, 1), (32, 1), (6, 3)] {
            let plan = plan_for(&qsl, &seq, &key(group, kv));
            assert!(coverage(&plan, &qsl, group * kv, group)
                .iter()
                .all(|&c| c == 1));
            for it in &plan.items {
                assert!((it.q_len * it.head_count) as usize <= ROWS_PER_ITEM);
                assert!(it.head_count as usize <= group.min(ROWS_PER_ITEM));
                assert!(it.kv_hi as usize <= seq[it.req as usize] as usize);
                assert!(it.head_start + it.head_count <= group as i32);
            }
        }
    }

    #[test]
    fn a_requests_query_tiles_come_last_first() {
        // One 300-token causal prefill: its tiles must be listed from the last query tokens
        // (the most keys) to the first, every KV head of a tile together.
        let qsl = [0, 300];
        let seq = [300];
        let plan = plan_for(&qsl, &seq, &key(4, 2));
        let starts: Vec<i32> = plan.items.iter().map(|it| it.q_start).collect();
        assert!(!starts.is_empty());
        assert!(
            starts.windows(2).all(|w| w[0] >= w[1]),
            "query tiles not in descending order: {starts:?}"
        );
        assert_eq!(*starts.last().unwrap(), 0);
    }

    #[test]
    fn requests_are_listed_longest_first() {
        // Two causal prefills, a fresh 300-token one and a 500-token chunk after 1500 tokens
        // of context: the chunk's tiles see 1500+ keys, so they all come before the fresh
        // request's (each request's tiles together), and the keys a tile sees never grow
        // along the list.
        let qsl = [0, 300, 800];
        let seq = [300, 2000];
        let plan = plan_for(&qsl, &seq, &key(4, 2));
        let keys: Vec<i32> = plan
            .items
            .iter()
            .map(|it| {
                let r = it.req as usize;
                let ctx = seq[r] - (qsl[r + 1] - qsl[r]);
                let last = ctx + it.q_start - qsl[r] + it.q_len;
                last.min(it.kv_hi) - it.kv_lo
            })
            .collect();
        assert!(
            keys.windows(2).all(|w| w[0] >= w[1]),
            "not longest first: {keys:?}"
        );
        let first_fresh = plan.items.iter().position(|it| it.req == 0).unwrap();
        assert!(plan.items[first_fresh..].iter().all(|it| it.req == 0));
    }

    #[test]
    fn query_length_ranges_partition_the_batch() {
        let qsl = [0, 1, 40, 41, 300];
        let seq = [100, 39, 5000, 700];
        let inp = PlanInputs {
            query_start_loc: &qsl,
            seq_lens: &seq,
            sm_count: 132,
        };
        let short = plan_work(
            inp,
            &PlanKey {
                max_q: 16,
                ..key(4, 2)
            },
        );
        let long = plan_work(
            inp,
            &PlanKey {
                min_q: 16,
                rows: 64,
                allow_split: false,
                ..key(4, 2)
            },
        );
        let mut seen = coverage(&short, &qsl, 8, 4);
        for (a, b) in seen.iter_mut().zip(coverage(&long, &qsl, 8, 4)) {
            *a += b;
        }
        assert!(seen.iter().all(|&c| c == 1));
        assert!(long
            .items
            .iter()
            .all(|i| i.q_len * i.head_count <= 64 && i.q_len > 1));
        assert!(short.items.iter().all(|i| i.q_len == 1));
    }

    #[test]
    fn long_decodes_split_into_aligned_contiguous_ranges() {
        let qsl = [0, 1];
        let seq = [10_000];
        let plan = plan_for(&qsl, &seq, &key(4, 8));
        assert_eq!(plan.split_tokens.len(), 1);
        let s = plan.split_tokens[0][2] as usize;
        assert!(s > 1 && s <= MAX_SPLITS);
        let mut ranges: Vec<(i32, i32)> = plan
            .items
            .iter()
            .filter(|i| i.kv_head == 0)
            .map(|i| (i.kv_lo, i.kv_hi))
            .collect();
        ranges.sort();
        assert_eq!(ranges.first().unwrap().0, 0);
        assert_eq!(ranges.last().unwrap().1, 10_000);
        for w in ranges.windows(2) {
            assert_eq!(w[0].1, w[1].0);
            assert_eq!(w[0].1 % KEYS_PER_CHUNK as i32, 0);
        }
        // A big batch is not split.
        let qsl: Vec<i32> = (0..=512).collect();
        let seq = vec![10_000; 512];
        let plan = plan_for(&qsl, &seq, &key(4, 8));
        assert!(plan.split_tokens.is_empty());
    }

    #[test]
    fn decode_splits_fill_whole_waves() {
        let decode_key = |slots: usize| PlanKey {
            rows: 16,
            max_q: 2,
            slots,
            ..key(4, 8)
        };
        let inp = |qsl: &'static [i32], seq: &'static [i32]| PlanInputs {
            query_start_loc: qsl,
            seq_lens: seq,
            sm_count: 132,
        };
        // One 32k request: 8 KV heads x splits near the 264 slots, each split >= 128 keys.
        let plan = plan_work(inp(&[0, 1], &[32_768]), &decode_key(264));
        let s = plan.split_tokens[0][2] as usize;
        assert!(
            plan.items.len() >= 238 && plan.items.len() <= 264,
            "{}",
            plan.items.len()
        );
        assert!(s <= DECODE_MAX_SPLITS);
        assert!(plan
            .items
            .iter()
            .all(|i| i.kv_hi - i.kv_lo >= DECODE_MIN_KEYS_PER_SPLIT as i32 && i.q_len == 1));
        // Short contexts are not cut below the minimum.
        let plan = plan_work(inp(&[0, 1], &[300]), &decode_key(264));
        assert!(plan.split_tokens.is_empty() || plan.split_tokens[0][2] <= 2);
        // Wave efficiency: the chosen split count fills at least 90% of its waves.
        for (b, slots) in [(1usize, 264usize), (8, 264), (16, 264), (64, 264), (3, 132)] {
            let qsl: Vec<i32> = (0..=b as i32).collect();
            let seq = vec![4096; b];
            let plan = plan_for(&qsl, &seq, &decode_key(slots));
            let n = plan.items.len();
            let eff = n as f64 / (n.div_ceil(slots) * slots) as f64;
            assert!(eff >= 0.9, "b{b}: {n} CTAs on {slots} slots");
            assert_eq!(
                coverage(&plan, &qsl, 32, 4),
                vec![1; b * 32],
                "b{b} coverage"
            );
        }
        assert_eq!(decode_split_target(264, 128, |w| 512 * w), 1);
        assert_eq!(decode_split_target(264, 128, |w| 64 * w), 4);
    }

    /// The graph plan's shape is a function of (batch size, key, max_seq_len) only; its real
    /// items cover each (token, head)'s visible keys exactly once, in 16-aligned contiguous
    /// pieces; surplus items are empty.
    #[test]
    fn graph_plans_have_a_fixed_layout() {
        let max_seq = 4096;
        let mut rng = crate::testing::Rng::new(7);
        for (slots, window) in [
            (264usize, None),
            (0, None),
            (264, Some(700)),
            (0, Some(300)),
        ] {
            for b in [1usize, 3, 8, 64] {
                let k = PlanKey {
                    rows: 16,
                    slots,
                    window,
                    ..key(4, 8)
                };
                let qsl: Vec<i32> = (0..=b as i32).collect();
                let mut first: Option<(usize, usize, usize)> = None;
                for step in 0..6 {
                    let seq: Vec<i32> = (0..b)
                        .map(|_| match step {
                            0 => 1,
                            1 => max_seq as i32,
                            _ => 1 + rng.below(max_seq) as i32,
                        })
                        .collect();
                    let inp = PlanInputs {
                        query_start_loc: &qsl,
                        seq_lens: &seq,
                        sm_count: 132,
                    };
                    let plan = plan_graph_work(inp, &k, max_seq);
                    let shape = (plan.items.len(), plan.split_tokens.len(), plan.max_splits);
                    assert_eq!(*first.get_or_insert(shape), shape, "b{b} slots {slots}");
                    assert!(plan.max_splits <= DECODE_MAX_SPLITS);
                    for (i, e) in plan.split_tokens.iter().enumerate() {
                        assert_eq!(*e, [i as i32, i as i32, plan.max_splits as i32, 0]);
                    }
                    // Per (token, kv head, head chunk): the non-empty ranges tile the visible
                    // keys.
                    let mut ranges: HashMap<(i32, i32, i32), Vec<(i32, i32)>> = HashMap::new();
                    for it in &plan.items {
                        assert_eq!(it.q_len, 1);
                        assert!(it.kv_lo <= it.kv_hi && it.kv_hi <= seq[it.req as usize]);
                        if plan.max_splits > 0 {
                            assert_eq!(it.num_splits as usize, plan.max_splits);
                            assert_eq!(it.part_tok, it.req);
                        }
                        ranges
                            .entry((it.req, it.kv_head, it.head_start))
                            .or_default()
                            .push((it.kv_lo, it.kv_hi));
                    }
                    assert_eq!(ranges.len(), b * 8);
                    for ((r, _, _), mut v) in ranges {
                        let s = seq[r as usize];
                        let lo = window.map_or(0, |w| (s - w as i32).max(0));
                        v.retain(|&(a, z)| a < z);
                        v.sort();
                        if plan.max_splits == 0 {
                            assert_eq!(v, vec![(0, s)]);
                            continue;
                        }
                        assert_eq!(v.first().unwrap().0, lo);
                        assert_eq!(v.last().unwrap().1, s);
                        for w in v.windows(2) {
                            assert_eq!(w[0].1, w[1].0);
                            assert_eq!((w[0].1 - lo) % KEYS_PER_CHUNK as i32, 0);
                        }
                    }
                }
            }
        }
        // A prefill falls back to an unsplit plan_work layout.
        let qsl = [0, 1, 5];
        let seq = [3000, 9];
        let inp = PlanInputs {
            query_start_loc: &qsl,
            seq_lens: &seq,
            sm_count: 132,
        };
        let plan = plan_graph_work(inp, &key(4, 8), 4096);
        assert!(plan.split_tokens.is_empty());
        assert!(plan.items.iter().all(|i| i.num_splits == 1));
    }

    #[test]
    fn windows_limit_the_split_range() {
        let qsl = [0, 1];
        let seq = [10_000];
        let mut k = key(4, 1);
        k.window = Some(1000);
        let plan = plan_for(&qsl, &seq, &k);
        let lo = plan.items.iter().map(|i| i.kv_lo).min().unwrap();
        let hi = plan.items.iter().map(|i| i.kv_hi).max().unwrap();
        assert_eq!((lo, hi), (9_000, 10_000));
    }
}
