//! Graph mode of the WGSL family's metadata: persistent buffers for runtimes that capture
//! submissions ([`WgslRuntime::CAPTURES`]: the native Vulkan runtime's
//! [`VulkanDevice::capture`](crate::device::VulkanDevice::capture)).
//!
//! A captured forward binds buffers, not their contents, and bakes in its dispatch sizes and
//! parameter words. So, as for CUDA graphs, the builder keeps per batch shape (number of
//! requests, block-table width, causality) device buffers for the block table, the slot
//! mapping and every layer shape's work lists, allocated once and never replaced; each
//! step's build rewrites their contents, and the same graph replays. The lists' lengths must
//! not move with the sequence lengths, so their decode lists take [`plan_graph_lists`]' fixed
//! layout (the split count of the longest context the block table can hold; shorter requests
//! leave surplus splits empty). Every parameter word of a forward then depends on the shape
//! alone (token count, list lengths, partial offsets, block-table width).
//!
//! Only uniform single-token decode batches have a graph mode
//! ([`GraphCaptureSupport::UniformSingleTokenDecode`](crate::backend::GraphCaptureSupport)):
//! a prefill's lists depend on its query lengths.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::device::wgsl::WgslRuntime;
use crate::error::{Error, Result};
use crate::metadata::{CommonAttentionMetadata, GraphGeneration};

use super::metadata_builder::{plan_graph_lists, upload_plan, Plan, PlanKey, PlanLists, WorkList};

/// What a graph's launch shapes depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct GraphShape {
    pub num_reqs: usize,
    pub max_blocks_per_req: usize,
    pub causal: bool,
}

impl GraphShape {
    /// The shape of `common`.
    pub(crate) fn of(common: &CommonAttentionMetadata) -> GraphShape {
        GraphShape {
            num_reqs: common.num_reqs(),
            max_blocks_per_req: common.max_blocks_per_req(),
            causal: common.causal(),
        }
    }
}

/// The persistent buffers of one batch shape.
#[derive(Debug)]
pub(crate) struct GraphBuffers<R: WgslRuntime> {
    pub shape: GraphShape,
    /// `[num_reqs][max_blocks_per_req]` u32 (one word when the table is empty).
    pub block_table: R::Buffer,
    /// `[num_reqs]` i64 as two u32 words each.
    pub slots: R::Buffer,
    /// Every layer shape's plan seen so far, rewritten by each build.
    plans: Mutex<HashMap<PlanKey, Arc<Plan<R>>>>,
    /// Advanced by each build: metadata of an older build is stale.
    pub generation: GraphGeneration,
}

impl<R: WgslRuntime> GraphBuffers<R> {
    /// Buffers for `shape` on `dev`.
    pub(crate) fn new(dev: &R, shape: GraphShape) -> Result<Self> {
        let bt_words = shape
            .num_reqs
            .checked_mul(shape.max_blocks_per_req)
            .ok_or_else(|| Error::metadata("the block table's size overflows"))?
            .max(1);
        let slot_words = shape
            .num_reqs
            .checked_mul(2)
            .ok_or_else(|| Error::metadata("the slot mapping's size overflows"))?
            .max(1);
        Ok(GraphBuffers {
            shape,
            block_table: dev.upload_words("polyattn graph block table", &vec![0; bt_words])?,
            slots: dev.upload_words("polyattn graph slots", &vec![0; slot_words])?,
            plans: Mutex::new(HashMap::new()),
            generation: GraphGeneration::default(),
        })
    }

    fn max_seq_len(&self, common: &CommonAttentionMetadata) -> usize {
        self.shape
            .max_blocks_per_req
            .saturating_mul(common.block_size())
    }

    /// Writes `common`'s block table, slots (`slot_words`) and the lists of every plan seen
    /// so far into the buffers, ordered before whatever is submitted next; returns the new
    /// generation.
    pub(crate) fn update(
        &self,
        dev: &R,
        common: &CommonAttentionMetadata,
        slot_words: &[u32],
    ) -> Result<u64> {
        let bt: Vec<u32> = common.block_table_cpu().iter().map(|&b| b as u32).collect();
        if !bt.is_empty() {
            dev.write_words(&self.block_table, &bt)?;
        }
        dev.write_words(&self.slots, slot_words)?;
        let plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        for (key, plan) in plans.iter() {
            let lists = plan_graph_lists(common, key, self.max_seq_len(common));
            write_plan(dev, plan, &lists)?;
        }
        Ok(self.generation.advance())
    }

    /// The plan for `key` in the persistent buffers: the one kept for that layer shape, or,
    /// the first time, `common`'s lists uploaded into new buffers that later builds rewrite.
    pub(crate) fn plan(
        &self,
        dev: &R,
        common: &CommonAttentionMetadata,
        key: PlanKey,
    ) -> Result<Arc<Plan<R>>> {
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = plans.get(&key) {
            return Ok(p.clone());
        }
        let lists = plan_graph_lists(common, &key, self.max_seq_len(common));
        let plan = Arc::new(upload_plan(dev, &lists)?);
        plans.insert(key, plan.clone());
        Ok(plan)
    }
}

/// Rewrites `plan`'s device lists with `lists` (of the same layout: graph mode's lengths
/// depend on the shape alone).
fn write_plan<R: WgslRuntime>(dev: &R, plan: &Plan<R>, lists: &PlanLists) -> Result<()> {
    fn write<R: WgslRuntime, T: bytemuck::Pod>(
        dev: &R,
        what: &str,
        list: &Option<WorkList<R>>,
        records: &[T],
    ) -> Result<()> {
        match list {
            Some(l) if l.count as usize == records.len() => {
                dev.write_words(&l.buffer, bytemuck::cast_slice(records))
            }
            None if records.is_empty() => Ok(()),
            _ => Err(Error::metadata(format!(
                "graph metadata: the {what} list changed length ({} to {} records) within one \
                 batch shape",
                list.as_ref().map_or(0, |l| l.count),
                records.len()
            ))),
        }
    }
    write(
        dev,
        "split-KV decode",
        &plan.decode_fast,
        &lists.decode_fast.items,
    )?;
    write(dev, "decode", &plan.decode, &lists.decode.items)?;
    write(dev, "prefill", &plan.prefill, &lists.prefill.items)?;
    write(dev, "split group", &plan.combine, &lists.groups())
}
