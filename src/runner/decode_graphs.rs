//! Decode steps as captured graphs (vLLM's CUDA-graph mode, on every device that captures:
//! CUDA graphs, the Vulkan runtime's recorded command buffers).
//!
//! A graph bakes in every device address and launch shape of the step it recorded, so what
//! changes between steps must change *inside* buffers that stay put. Per padded batch size B
//! ([`crate::runner::RunnerConfig::graph_capture_sizes`]) this module keeps the step's inputs
//! (token ids, positions, the logits rows `0..B`), its outputs (logits `[B, vocab]` and the
//! greedy token ids `[B]`) and the attention metadata of the builder's graph mode
//! (`AttentionMetadataBuilder::build_for_graph_capture`: the block table, slot mapping and
//! work lists in persistent buffers, rewritten by each build). The batch always has B
//! requests and a block table of a fixed width, so the shape the builder plans for never
//! changes; requests past the real ones are padding: one token at position 0, block row all
//! 0 (the null block), slot −1 (no cache write). Their logits are computed and ignored.
//!
//! The width is a power of two of blocks (at least [`MIN_WIDTH`], at most the longest
//! context's), the smallest that holds every request of the step, and each (B, width) pair
//! has its own graph: the builder's fixed-layout work lists are planned for the longest
//! context the width holds, so a step of short requests does not launch the splits a
//! full-length context would need. Contexts grow through at most log2 of the widths.
//!
//! The first step of a size runs eagerly through [`CausalLm::forward_into`] (that allocates
//! the model's buffers for B tokens, compiles its kernels and *is* this step's result), then
//! the same calls are captured; later steps write the inputs, rewrite the batch's device
//! arrays in place (`CommonAttentionMetadata::new_in`: a model may read them, as the fused
//! Q/K/V projection reads the slot mapping to write the cache), rebuild the metadata and
//! replay. The greedy argmax is part of the graph, so a greedy step downloads B token ids; a
//! step whose requests sample runs [`compute::sample`] on the replayed logits, outside the
//! graph (its rows change every step), and downloads token ids too.

use std::collections::HashMap;

use super::model_runner::{CausalLm, StepBatch};
use crate::compute::{self, SamplingRow};
use crate::device::{Device, DeviceGraph, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, BatchDescription, CommonAttentionMetadata,
};

/// One request of a graph decode step.
pub(super) struct DecodeRow<'a> {
    /// Its newest token (the step's input).
    pub token: i32,
    /// That token's position.
    pub position: i32,
    /// Where its key and value go in the cache.
    pub slot: i64,
    /// Its cache blocks.
    pub blocks: &'a [i32],
}

/// The persistent buffers and the graph of one padded batch size.
struct DecodeGraph {
    input_ids: Tensor,
    positions: Tensor,
    logits_indices: Tensor,
    logits: Tensor,
    tokens: Tensor,
    /// Captured after the size's first (eager) step.
    graph: Option<DeviceGraph>,
    /// The latest build's metadata, whose buffers the graph reads.
    metadata: Option<Box<dyn AttentionMetadata>>,
    /// The latest batch, whose device arrays the graph reads too (a model operation that
    /// writes the KV cache reads the slot mapping): rewritten in place every step.
    common: Option<CommonAttentionMetadata>,
}

/// The narrowest block table a captured step has, in blocks.
pub(super) const MIN_WIDTH: usize = 16;

/// Every captured decode size of a runner.
pub(super) struct DecodeGraphs {
    /// Ascending padded batch sizes.
    sizes: Vec<usize>,
    /// Block-table columns of the widest captured step (the longest context's blocks).
    max_width: usize,
    block_size: usize,
    vocab: usize,
    /// By (padded batch size, block-table width).
    graphs: HashMap<(usize, usize), DecodeGraph>,
    /// Captures so far.
    captures: usize,
}

impl DecodeGraphs {
    /// Graphs for the padded sizes `sizes` (sorted and deduplicated here; zeros dropped).
    pub(super) fn new(
        mut sizes: Vec<usize>,
        max_model_len: usize,
        block_size: usize,
        vocab: usize,
    ) -> Self {
        sizes.retain(|&s| s > 0);
        sizes.sort_unstable();
        sizes.dedup();
        DecodeGraphs {
            sizes,
            max_width: max_model_len.div_ceil(block_size).max(1),
            block_size,
            vocab,
            graphs: HashMap::new(),
            captures: 0,
        }
    }

    /// The padded size a decode step of `n` requests runs at, if one is captured for it.
    pub(super) fn size_for(&self, n: usize) -> Option<usize> {
        self.sizes.iter().copied().find(|&s| s >= n)
    }

    /// Block-table width of a step whose longest request holds `blocks` blocks.
    fn width_for(&self, blocks: usize) -> usize {
        blocks
            .max(MIN_WIDTH)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
            .min(self.max_width)
    }

    /// Graphs captured so far: one per (batch size, width), more where a graph had to be
    /// captured again over new batch arrays (their old ones were still shared).
    pub(super) fn captured(&self) -> usize {
        self.captures
    }

    /// Runs one decode step of `rows` at padded size `size` (from [`DecodeGraphs::size_for`]):
    /// eagerly then captured the first time, replayed after; the token ids of the real rows,
    /// greedy or drawn with `sampling`'s rows (one per real row). `wait` gains the time spent
    /// waiting for the device before the download.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run<M: CausalLm>(
        &mut self,
        size: usize,
        rows: &[DecodeRow<'_>],
        sampling: Option<&[SamplingRow]>,
        model: &M,
        caches: &mut [KvCache],
        builder: &dyn AttentionMetadataBuilder,
        device: &Device,
        wait: &mut std::time::Duration,
    ) -> Result<Vec<i32>> {
        let n = rows.len();
        if n == 0 || n > size {
            return Err(Error::config(format!(
                "a graph decode step of {n} requests at padded size {size}"
            )));
        }
        let longest = rows.iter().map(|r| r.blocks.len()).max().unwrap_or(0);
        let (bs, width) = (self.block_size, self.width_for(longest));
        let mut desc = BatchDescription {
            query_start_loc: (0..=size as i32).collect(),
            causal: true,
            block_size: bs,
            max_blocks_per_req: width,
            block_table: vec![0; size * width],
            ..Default::default()
        };
        let mut ids = vec![0i32; size];
        let mut positions = vec![0i32; size];
        for (r, row) in rows.iter().enumerate() {
            if row.blocks.len() > width {
                return Err(Error::config(format!(
                    "a request holds {} blocks; captured decode steps have at most {width}",
                    row.blocks.len()
                )));
            }
            desc.block_table[r * width..][..row.blocks.len()].copy_from_slice(row.blocks);
            desc.slot_mapping.push(row.slot);
            desc.seq_lens.push(row.position + 1);
            ids[r] = row.token;
            positions[r] = row.position;
        }
        desc.slot_mapping.resize(size, -1);
        desc.seq_lens.resize(size, 1);

        let entry = match self.graphs.entry((size, width)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let rows: Vec<i32> = (0..size as i32).collect();
                e.insert(DecodeGraph {
                    input_ids: Tensor::zeros(device, &[size], DType::I32)?,
                    positions: Tensor::zeros(device, &[size], DType::I32)?,
                    logits_indices: Tensor::from_i32(device, &rows, &[size])?,
                    logits: Tensor::zeros(device, &[size, self.vocab], DType::F32)?,
                    tokens: Tensor::zeros(device, &[size], DType::I32)?,
                    graph: None,
                    metadata: None,
                    common: None,
                })
            }
        };
        // The batch's arrays go into the last step's buffers, which the graph reads (the
        // last build, which holds a clone of them, goes first). Where they cannot be taken
        // back, the graph is captured again over new ones.
        entry.metadata = None;
        let arrays = entry
            .common
            .take()
            .and_then(CommonAttentionMetadata::into_device_arrays);
        let common = match arrays {
            Some(a) => CommonAttentionMetadata::new_in(device, desc, a)?,
            None => {
                entry.graph = None;
                CommonAttentionMetadata::new(device, desc)?
            }
        };
        // A replay checks nothing on the device: every cache must hold the blocks the batch
        // names (the eager step that records a graph checks this too).
        for c in caches.iter() {
            c.check_batch(&common)?;
        }
        let metadata = builder.build_for_graph_capture(&common)?;
        entry.input_ids.write_i32(&ids)?;
        entry.positions.write_i32(&positions)?;
        let DecodeGraph {
            input_ids,
            positions,
            logits_indices,
            logits,
            tokens,
            graph,
            ..
        } = entry;
        match graph {
            Some(g) => g.replay()?,
            None => {
                let mut step = || -> Result<()> {
                    let batch = StepBatch {
                        input_ids,
                        positions,
                        logits_indices,
                        attn_metadata: metadata.as_ref(),
                        common: &common,
                    };
                    model.forward_into(&batch, caches, logits)?;
                    compute::argmax_into(logits, tokens)
                };
                step()?;
                let captured = device.capture(step).map_err(|e| {
                    Error::config(format!(
                        "capturing the decode step of {size} requests failed: {e} (a model \
                         whose forward_into allocates or synchronises cannot be captured; \
                         RunnerConfig::graph_capture_sizes empty runs every step eagerly)"
                    ))
                })?;
                *graph = Some(captured);
                self.captures += 1;
            }
        }
        entry.metadata = Some(metadata);
        entry.common = Some(common);
        if let Some(sampling) = sampling {
            // Padding rows are greedy: their tokens are computed and dropped.
            let mut padded = sampling.to_vec();
            padded.resize(size, SamplingRow::GREEDY);
            let rows = SamplingRow::tensor(device, &padded)?;
            compute::sample_into(&entry.logits, &rows, &mut entry.tokens)?;
        }
        let synced = std::time::Instant::now();
        device.synchronize()?;
        *wait += synced.elapsed();
        let mut t = entry.tokens.to_i32_vec()?;
        t.truncate(n);
        Ok(t)
    }
}
