//! Planning a batch into work items: query tiles × KV heads × head chunks × key splits.
//!
//! Each request's query tokens are cut into tiles of `rows / head_count` tokens for every KV
//! head and chunk of its query heads, so that an item holds at most [`PlanKey::rows`]
//! (token, head) rows. A key restricts the plan to requests in a range of query lengths
//! ([`PlanKey::min_q`]..[`PlanKey::max_q`]), so that several kernels split one batch between
//! them. Requests that fit one tile may be split along the keys ([`SplitRule`]); their
//! partials are merged by a combine, or inside the kernel. [`plan_graph_work`] makes the
//! fixed-layout plan of a captured decode step.

use super::split::SplitRule;
use super::work_item::{SplitGroup, WorkItem};

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

/// The order of a plan's items, which is the order a GPU starts them in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ItemOrder {
    /// Requests by their longest item (so a long request's tiles do not start last and
    /// stretch the tail), each request's items together (its tiles share its K/V in cache),
    /// its last query tile first (under a causal mask it sees the most keys), the KV heads
    /// of a tile adjacent. The CUDA kernels' order.
    LongestRequestFirst,
    /// Batch order, tiles first to last, the KV heads of one tile and split adjacent (they
    /// read the same blocks). The WGSL split-KV decode kernel's order.
    BatchKvHeadInner,
    /// Every item of KV head 0 in batch order, then those of KV head 1, … (the order of a
    /// dispatch over items × KV heads). The WGSL tile kernels' order.
    BatchKvHeadOuter,
}

/// What a plan depends on besides the batch. Plain data: plans are cached by it.
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
    /// Most (token, head) rows per item.
    pub rows: usize,
    /// Only requests whose query length is in `min_q..max_q` get items.
    pub min_q: usize,
    /// See `min_q`.
    pub max_q: usize,
    /// When and how much requests split along the keys.
    pub split: SplitRule,
    /// The order of the items.
    pub order: ItemOrder,
}

impl PlanKey {
    /// A key over every request, unsplit, `rows` rows per item, in the CUDA order.
    pub fn new(
        group: usize,
        num_kv_heads: usize,
        causal: bool,
        window: Option<usize>,
        rows: usize,
    ) -> Self {
        PlanKey {
            group,
            num_kv_heads,
            causal,
            window,
            pass: Pass::Full,
            dense: false,
            rows,
            min_q: 0,
            max_q: usize::MAX,
            split: SplitRule::Never,
            order: ItemOrder::LongestRequestFirst,
        }
    }
}

/// The batch-level inputs of a plan, as host slices of validated metadata.
#[derive(Clone, Copy, Debug)]
pub struct PlanInputs<'a> {
    /// `[num_reqs + 1]`.
    pub query_start_loc: &'a [i32],
    /// `[num_reqs]`.
    pub seq_lens: &'a [i32],
}

/// A planned work list (host side).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkPlan {
    /// One entry per workgroup.
    pub items: Vec<WorkItem>,
    /// One entry per split query range.
    pub groups: Vec<SplitGroup>,
    /// Most splits of any group (0 when nothing is split).
    pub max_splits: usize,
    /// Partial-buffer tokens the groups use (`Σ q_len`).
    pub n_part_tokens: usize,
}

impl WorkPlan {
    /// Moves this plan's partials `by` partial tokens up, so that it can share a partial
    /// buffer (and a combine) with a plan of `by` partial tokens planned before it.
    pub fn shift_parts(&mut self, by: usize) {
        let by = by as i32;
        for it in self.items.iter_mut().filter(|i| i.num_splits > 1) {
            it.part_tok += by;
        }
        for g in &mut self.groups {
            g.part_tok += by;
        }
    }
}

/// The group's query heads in chunks of `hc`: `(first head, heads)`.
fn head_chunks(group: usize, hc: usize) -> Vec<(usize, usize)> {
    (0..group)
        .step_by(hc)
        .map(|s| (s, hc.min(group - s)))
        .collect()
}

/// Plans the items of one attention pass (see the module docs). Pure host code; the inputs
/// are validated metadata (offsets monotonic, `query_len ≤ seq_len`).
pub fn plan_work(inp: PlanInputs<'_>, key: &PlanKey) -> WorkPlan {
    let g = key.group.max(1);
    let rows = key.rows.max(1);
    let hc = g.min(rows);
    let tq = (rows / hc).max(1);
    let head_chunks = head_chunks(g, hc);
    let per_tile = key.num_kv_heads * head_chunks.len();
    let num_reqs = inp.seq_lens.len();
    let q_len = |r: usize| (inp.query_start_loc[r + 1] - inp.query_start_loc[r]) as usize;
    let included = |r: usize| (key.min_q..key.max_q).contains(&q_len(r));

    // The request's key range.
    let range = |r: usize| -> (usize, usize) {
        let seq = inp.seq_lens[r] as usize;
        match key.pass {
            Pass::Full if key.dense => (0, q_len(r)),
            Pass::Full => (0, seq),
            Pass::Prefix(p) => (0, p.min(seq)),
            Pass::Suffix(p) => (p.min(seq), seq),
        }
    };
    // Keys any token of a split request sees: from its first token's window start to its
    // last token's position.
    let split_visible = |r: usize| -> (usize, usize) {
        let (lo, hi) = range(r);
        let seq = inp.seq_lens[r] as usize;
        let first = seq - q_len(r);
        let hi = if key.causal { hi.min(seq) } else { hi };
        let lo = match key.window {
            Some(w) => lo.max((first + 1).saturating_sub(w)),
            None => lo,
        };
        (lo, hi.max(lo))
    };
    let splittable = |r: usize| {
        let ql = q_len(r);
        !key.dense
            && key.pass == Pass::Full
            && ql >= 1
            && ql <= tq
            && ql <= key.split.max_query_len()
    };

    let base: usize = (0..num_reqs)
        .filter(|&r| included(r))
        .map(|r| q_len(r).div_ceil(tq) * per_tile)
        .sum();
    let want = key.split.want(base, key.num_kv_heads, |w| {
        (0..num_reqs)
            .filter(|&r| included(r) && q_len(r) > 0)
            .map(|r| {
                let tiles = if splittable(r) {
                    let (vlo, vhi) = split_visible(r);
                    key.split.shape(vhi - vlo, w).0
                } else {
                    q_len(r).div_ceil(tq)
                };
                tiles * per_tile
            })
            .sum()
    });

    let heads_of = |order: ItemOrder| -> Vec<usize> {
        match order {
            ItemOrder::BatchKvHeadOuter => vec![0],
            _ => (0..key.num_kv_heads).collect(),
        }
    };
    let kv_heads = heads_of(key.order);
    let mut plan = WorkPlan::default();
    // Keys each item visits (an estimate of its time), for the request order.
    let mut work: Vec<usize> = Vec::new();
    for r in 0..num_reqs {
        let qs = inp.query_start_loc[r] as usize;
        let ql = q_len(r);
        if ql == 0 || !included(r) {
            continue;
        }
        let seq = inp.seq_lens[r] as usize;
        // Sequence position of the request's first query token.
        let first = if key.dense { 0 } else { seq - ql };
        let (lo, hi) = range(r);
        if splittable(r) && want > 1 {
            let (vlo, vhi) = split_visible(r);
            let (s, chunk) = key.split.shape(vhi - vlo, want);
            if s > 1 {
                let part_tok = plan.n_part_tokens as i32;
                plan.groups.push(SplitGroup {
                    q_start: qs as i32,
                    q_len: ql as i32,
                    part_tok,
                    num_splits: s as i32,
                });
                plan.n_part_tokens += ql;
                plan.max_splits = plan.max_splits.max(s);
                let item = |kv_head: usize, (h0, hn): (usize, usize), i: usize| {
                    let a = vlo + i * chunk;
                    WorkItem {
                        req: r as i32,
                        q_start: qs as i32,
                        q_len: ql as i32,
                        kv_head: kv_head as i32,
                        head_start: h0 as i32,
                        head_count: hn as i32,
                        kv_lo: a as i32,
                        kv_hi: (a + chunk).min(vhi) as i32,
                        split: i as i32,
                        num_splits: s as i32,
                        part_tok,
                        q_pos: first as i32,
                    }
                };
                if key.order == ItemOrder::LongestRequestFirst {
                    for &kv_head in &kv_heads {
                        for &c in &head_chunks {
                            for i in 0..s {
                                let it = item(kv_head, c, i);
                                work.push((it.kv_hi - it.kv_lo) as usize);
                                plan.items.push(it);
                            }
                        }
                    }
                } else {
                    for &c in &head_chunks {
                        for i in 0..s {
                            for &kv_head in &kv_heads {
                                plan.items.push(item(kv_head, c, i));
                            }
                        }
                    }
                }
                continue;
            }
        }
        // Query tiles; the longest-first order lists the last tile first.
        let tiles: Vec<usize> = (qs..qs + ql).step_by(tq).collect();
        let tiles: Vec<usize> = if key.order == ItemOrder::LongestRequestFirst {
            tiles.into_iter().rev().collect()
        } else {
            tiles
        };
        for t in tiles {
            let n = tq.min(qs + ql - t);
            let pos = first + (t - qs);
            // Keys the tile's rows see together: up to its last row's position when causal,
            // from its first row's window start.
            let end = if key.causal { hi.min(pos + n) } else { hi };
            let start = match key.window {
                Some(w) => lo.max((pos + 1).saturating_sub(w)),
                None => lo,
            };
            let keys = end.saturating_sub(start);
            let item = |kv_head: usize, (h0, hn): (usize, usize)| WorkItem {
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
                q_pos: pos as i32,
            };
            if key.order == ItemOrder::LongestRequestFirst {
                for &kv_head in &kv_heads {
                    for &c in &head_chunks {
                        plan.items.push(item(kv_head, c));
                        work.push(keys);
                    }
                }
            } else {
                for &c in &head_chunks {
                    for &kv_head in &kv_heads {
                        plan.items.push(item(kv_head, c));
                    }
                }
            }
        }
    }
    match key.order {
        ItemOrder::LongestRequestFirst => plan.items = longest_request_first(&plan.items, &work),
        ItemOrder::BatchKvHeadInner => {}
        ItemOrder::BatchKvHeadOuter => {
            let one = std::mem::take(&mut plan.items);
            plan.items = (0..key.num_kv_heads)
                .flat_map(|h| {
                    one.iter().map(move |it| WorkItem {
                        kv_head: h as i32,
                        ..*it
                    })
                })
                .collect();
        }
    }
    plan
}

/// Requests in order of their longest item, each request's items kept together in their
/// order. Why not longest-first item by item: a request's items share its K/V in L2, and
/// interleaving every request's tiles was slower on multi-request prefills.
fn longest_request_first(items: &[WorkItem], work: &[usize]) -> Vec<WorkItem> {
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
    runs.into_iter()
        .flat_map(|(_, r)| items[r].iter().copied())
        .collect()
}

/// The fixed-layout work list of a graph-captured decode step.
///
/// Every request must have query length 1 (otherwise this is [`plan_work`] without splits,
/// whose layout also depends only on the query lengths). The number of items, the split
/// groups and `max_splits` depend only on the number of requests, `key` and `max_seq_len`
/// (the longest context the block table can describe), never on the sequence lengths, so
/// the grids a graph captured fit every later step; only the items' key ranges change. The
/// split count is chosen as [`plan_work`] would for requests of `max_seq_len` keys; each
/// request is then split as [`plan_work`] would split it with that target, and its surplus
/// items get an empty key range (`kv_lo == kv_hi`), which the kernels turn into a partial of
/// weight zero (LSE −∞) that the merge skips. Every request is a split group with the fixed
/// split count.
///
/// The price: short requests in a graph launch empty workgroups (cheap: they load the
/// query and exit) and go through the merge even when unsplit.
pub fn plan_graph_work(inp: PlanInputs<'_>, key: &PlanKey, max_seq_len: usize) -> WorkPlan {
    let num_reqs = inp.seq_lens.len();
    let q_len = |r: usize| inp.query_start_loc[r + 1] - inp.query_start_loc[r];
    let splittable = key.split.max_query_len() >= 1 && !key.dense && key.pass == Pass::Full;
    if !splittable || !(0..num_reqs).all(|r| q_len(r) == 1) {
        return plan_work(
            inp,
            &PlanKey {
                split: SplitRule::Never,
                ..*key
            },
        );
    }
    let mut plan = WorkPlan::default();
    if !(key.min_q..key.max_q).contains(&1) {
        return plan;
    }
    let g = key.group.max(1);
    let head_chunks = head_chunks(g, g.min(key.rows.max(1)));
    let per_req = key.num_kv_heads * head_chunks.len();
    // The most keys a single decode token can see.
    let vis_max = key.window.map_or(max_seq_len, |w| w.min(max_seq_len));
    let want = key.split.want(num_reqs * per_req, key.num_kv_heads, |w| {
        num_reqs * per_req * key.split.shape(vis_max, w).0
    });
    // The split count never exceeds its value at the longest context.
    let cap = key.split.count(vis_max, want);
    for r in 0..num_reqs {
        let qs = inp.query_start_loc[r];
        let seq = inp.seq_lens[r].max(0) as usize;
        let pos = seq.saturating_sub(1);
        // Unsplit (cap 1): one item over [0, seq). Split: the token's visible keys, as in
        // plan_work, in `s` real pieces and `cap - s` empty ones.
        let (vlo, vhi, s, chunk, part_tok) = if cap == 1 {
            (0, seq, 1, seq, 0)
        } else {
            let vhi = if key.causal { seq.min(pos + 1) } else { seq };
            let vlo = key.window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let vhi = vhi.max(vlo);
            let (s, chunk) = key.split.shape(vhi - vlo, want);
            let part_tok = plan.n_part_tokens as i32;
            plan.groups.push(SplitGroup {
                q_start: qs,
                q_len: 1,
                part_tok,
                num_splits: cap as i32,
            });
            plan.n_part_tokens += 1;
            plan.max_splits = cap;
            (vlo, vhi, s.min(cap), chunk, part_tok)
        };
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
                        q_pos: pos as i32,
                    });
                }
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::split::{
        DECODE_MAX_SPLITS, DECODE_MIN_KEYS_PER_SPLIT, MAX_SPLITS, SPLIT_ALIGN,
    };
    use super::*;

    const ROWS: usize = 16;

    fn inp<'a>(qsl: &'a [i32], seq: &'a [i32]) -> PlanInputs<'a> {
        PlanInputs {
            query_start_loc: qsl,
            seq_lens: seq,
        }
    }

    /// The CUDA-core kernel's key on a 132-SM GPU.
    fn key(group: usize, kv: usize) -> PlanKey {
        PlanKey {
            split: SplitRule::TwoPerSm { sm_count: 132 },
            ..PlanKey::new(group, kv, true, None, ROWS)
        }
    }

    fn waves(slots: usize) -> SplitRule {
        SplitRule::FillWaves { slots, fixed: None }
    }

    /// How often each (token, query head) is covered by split 0 of an item.
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
    fn tiles_cover_every_row_once_in_every_order() {
        let qsl = [0, 1, 40, 41, 300];
        let seq = [100, 39, 5000, 700];
        for order in [
            ItemOrder::LongestRequestFirst,
            ItemOrder::BatchKvHeadInner,
            ItemOrder::BatchKvHeadOuter,
        ] {
            for (group, kv) in [(1, 4), (4, 2), (8, 1), (32, 1), (6, 3)] {
                let k = PlanKey {
                    order,
                    ..key(group, kv)
                };
                let plan = plan_work(inp(&qsl, &seq), &k);
                assert!(coverage(&plan, &qsl, group * kv, group)
                    .iter()
                    .all(|&c| c == 1));
                for it in &plan.items {
                    let r = it.req as usize;
                    assert!((it.q_len * it.head_count) as usize <= ROWS);
                    assert!(it.head_count as usize <= group.min(ROWS));
                    assert!(it.kv_hi as usize <= seq[r] as usize);
                    assert!(it.head_start + it.head_count <= group as i32);
                    // The position of the item's first token.
                    let ctx = seq[r] - (qsl[r + 1] - qsl[r]);
                    assert_eq!(it.q_pos, ctx + it.q_start - qsl[r]);
                }
            }
        }
    }

    #[test]
    fn kv_head_outer_lists_every_item_of_a_head_together() {
        let qsl = [0, 1, 40];
        let seq = [3000, 60];
        let k = PlanKey {
            order: ItemOrder::BatchKvHeadOuter,
            ..key(4, 3)
        };
        let plan = plan_work(inp(&qsl, &seq), &k);
        let n = plan.items.len() / 3;
        assert_eq!(plan.items.len(), 3 * n);
        for (h, chunk) in plan.items.chunks(n).enumerate() {
            assert!(chunk.iter().all(|i| i.kv_head == h as i32));
            let same: Vec<WorkItem> = chunk
                .iter()
                .map(|i| WorkItem { kv_head: 0, ..*i })
                .collect();
            let first: Vec<WorkItem> = plan.items[..n].to_vec();
            assert_eq!(same, first);
        }
        // Batch order: request 0 (the split decode) first.
        assert_eq!(plan.items[0].req, 0);
    }

    #[test]
    fn a_requests_query_tiles_come_last_first() {
        let qsl = [0, 300];
        let seq = [300];
        let plan = plan_work(inp(&qsl, &seq), &key(4, 2));
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
        // A fresh 300-token prefill and a 500-token chunk after 1500 tokens of context: the
        // chunk's tiles see 1500+ keys, so they all come first (each request's tiles
        // together), and the keys a tile sees never grow along the list.
        let qsl = [0, 300, 800];
        let seq = [300, 2000];
        let plan = plan_work(inp(&qsl, &seq), &key(4, 2));
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
        let short = plan_work(
            inp(&qsl, &seq),
            &PlanKey {
                max_q: 16,
                ..key(4, 2)
            },
        );
        let long = plan_work(
            inp(&qsl, &seq),
            &PlanKey {
                min_q: 16,
                rows: 64,
                split: SplitRule::Never,
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
        let plan = plan_work(inp(&qsl, &seq), &key(4, 8));
        assert_eq!(plan.groups.len(), 1);
        assert_eq!(plan.n_part_tokens, 1);
        let s = plan.groups[0].num_splits as usize;
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
            assert_eq!(w[0].1 % SPLIT_ALIGN as i32, 0);
        }
        // A big batch is not split.
        let qsl: Vec<i32> = (0..=512).collect();
        let seq = vec![10_000; 512];
        let plan = plan_work(inp(&qsl, &seq), &key(4, 8));
        assert!(plan.groups.is_empty());
    }

    #[test]
    fn per_request_splits_cover_multi_token_decodes() {
        // Two decode requests of 1 and 3 tokens (group 4: 4 and 12 rows of one 16-row tile)
        // and a 40-token prefill, which never splits.
        let qsl = [0, 1, 4, 44];
        let seq = [2000, 903, 50];
        let rule = SplitRule::PerRequest {
            min_keys: 64,
            target: 64,
            max_splits: 8,
            requests: 2,
        };
        let k = PlanKey {
            split: rule,
            order: ItemOrder::BatchKvHeadOuter,
            ..PlanKey::new(4, 2, true, Some(700), ROWS)
        };
        let plan = plan_work(inp(&qsl, &seq), &k);
        assert_eq!(plan.groups.len(), 2);
        assert_eq!(
            plan.groups[1],
            SplitGroup {
                q_start: 1,
                q_len: 3,
                part_tok: 1,
                num_splits: plan.groups[1].num_splits
            }
        );
        assert_eq!(plan.n_part_tokens, 4);
        // Request 1's splits cover its first token's window start to its end.
        let mut r1: Vec<(i32, i32)> = plan
            .items
            .iter()
            .filter(|i| i.req == 1 && i.kv_head == 0)
            .map(|i| (i.kv_lo, i.kv_hi))
            .collect();
        r1.sort();
        assert_eq!(r1.first().unwrap().0, 900 + 1 - 700);
        assert_eq!(r1.last().unwrap().1, 903);
        assert!(plan
            .items
            .iter()
            .filter(|i| i.req == 2)
            .all(|i| i.num_splits == 1));
        assert_eq!(coverage(&plan, &qsl, 8, 4), vec![1; 44 * 8]);

        // A second list sharing the partials moves up by the first's tokens.
        let mut second = plan.clone();
        second.shift_parts(4);
        assert_eq!(second.groups[0].part_tok, 4);
        assert!(second
            .items
            .iter()
            .all(|i| i.num_splits == 1 || i.part_tok >= 4));
    }

    #[test]
    fn decode_splits_fill_whole_waves() {
        let decode_key = |slots: usize| PlanKey {
            max_q: 2,
            split: waves(slots),
            ..key(4, 8)
        };
        // One 32k request: 8 KV heads x splits near the 264 slots, each split >= 128 keys.
        let plan = plan_work(inp(&[0, 1], &[32_768]), &decode_key(264));
        let s = plan.groups[0].num_splits as usize;
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
        assert!(plan.groups.is_empty() || plan.groups[0].num_splits <= 2);
        // Wave efficiency: the chosen split count fills at least 90% of its waves.
        for (b, slots) in [(1usize, 264usize), (8, 264), (16, 264), (64, 264), (3, 132)] {
            let qsl: Vec<i32> = (0..=b as i32).collect();
            let seq = vec![4096; b];
            let plan = plan_work(inp(&qsl, &seq), &decode_key(slots));
            let n = plan.items.len();
            let eff = n as f64 / (n.div_ceil(slots) * slots) as f64;
            assert!(eff >= 0.9, "b{b}: {n} CTAs on {slots} slots");
            assert_eq!(
                coverage(&plan, &qsl, 32, 4),
                vec![1; b * 32],
                "b{b} coverage"
            );
        }
        // A fixed count overrides the wave rule.
        let plan = plan_work(
            inp(&[0, 1], &[32_768]),
            &PlanKey {
                split: SplitRule::FillWaves {
                    slots: 264,
                    fixed: Some(3),
                },
                ..decode_key(264)
            },
        );
        assert_eq!(plan.groups[0].num_splits, 3);
    }

    /// The graph plan's shape is a function of (batch size, key, max_seq_len) only; its real
    /// items cover each (token, head)'s visible keys exactly once, in 16-aligned contiguous
    /// pieces; surplus items are empty.
    #[test]
    fn graph_plans_have_a_fixed_layout() {
        let max_seq = 4096;
        let mut rng = crate::rng::Rng::new(7);
        for (rule, window) in [
            (waves(264), None),
            (SplitRule::TwoPerSm { sm_count: 132 }, None),
            (waves(264), Some(700)),
            (SplitRule::TwoPerSm { sm_count: 132 }, Some(300)),
        ] {
            for b in [1usize, 3, 8, 64] {
                let k = PlanKey {
                    split: rule,
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
                    let plan = plan_graph_work(inp(&qsl, &seq), &k, max_seq);
                    let shape = (plan.items.len(), plan.groups.len(), plan.max_splits);
                    assert_eq!(*first.get_or_insert(shape), shape, "b{b} {rule:?}");
                    assert!(plan.max_splits <= DECODE_MAX_SPLITS);
                    for (i, e) in plan.groups.iter().enumerate() {
                        let i = i as i32;
                        let splits = plan.max_splits as i32;
                        assert_eq!(
                            *e,
                            SplitGroup {
                                q_start: i,
                                q_len: 1,
                                part_tok: i,
                                num_splits: splits
                            }
                        );
                    }
                    // Per (token, kv head, head chunk): the non-empty ranges tile the visible
                    // keys.
                    let mut ranges: HashMap<(i32, i32, i32), Vec<(i32, i32)>> = HashMap::new();
                    for it in &plan.items {
                        assert_eq!(it.q_len, 1);
                        assert_eq!(it.q_pos, seq[it.req as usize] - 1);
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
                            assert_eq!((w[0].1 - lo) % SPLIT_ALIGN as i32, 0);
                        }
                    }
                }
            }
        }
        // A prefill falls back to an unsplit plan_work layout.
        let plan = plan_graph_work(inp(&[0, 1, 5], &[3000, 9]), &key(4, 8), 4096);
        assert!(plan.groups.is_empty());
        assert!(plan.items.iter().all(|i| i.num_splits == 1));
    }

    #[test]
    fn windows_limit_the_split_range() {
        let mut k = key(4, 1);
        k.window = Some(1000);
        let plan = plan_work(inp(&[0, 1], &[10_000]), &k);
        let lo = plan.items.iter().map(|i| i.kv_lo).min().unwrap();
        let hi = plan.items.iter().map(|i| i.kv_hi).max().unwrap();
        assert_eq!((lo, hi), (9_000, 10_000));
    }
}
