//! The CUDA backend's metadata builder and the work lists its kernels consume.
//!
//! `build` runs once per step: it validates a cascade request, makes sure the metadata arrays
//! (query_start_loc, seq_lens, block_table, slot_mapping) are on this GPU, and keeps the host
//! copies for planning. The attention work list depends on the layer's shape (GQA group,
//! window, mask), which a builder does not know; it is planned on the host the first time a
//! layer of a given shape runs in this step, uploaded once, and reused by every later layer of
//! that shape ([`CudaAttentionMetadata::plan`]).
//!
//! Planning is [`crate::plan`]'s: the CUDA kernels take its [`WorkItem`]s as they are, in
//! the longest-request-first order, with [`SplitRule::TwoPerSm`] for the CUDA-core kernel and
//! [`SplitRule::FillWaves`] for the decode kernel (the split count that fills whole waves
//! of the GPU's concurrent CTA slots). [`CudaPlan`] is a plan with its device copies.
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::GraphCaptureSupport;
use crate::device::{CudaDevice, CudaStorage, Device, Storage, Tensor};
use crate::error::{Error, Result};
use crate::kernels::cuda::AttnParams;
use crate::kv_cache::KvCacheSpec;
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CascadePlan, CommonAttentionMetadata,
    DecodePrefillSplit, DeviceMetadata,
};

#[cfg(doc)]
use crate::plan::WorkItem;
use crate::plan::{plan_graph_work, plan_work, PlanInputs, PlanKey, SplitRule, WorkPlan};

/// A planned work list with its device copies.
#[derive(Debug)]
pub struct CudaPlan {
    /// The host plan.
    pub work: WorkPlan,
    /// `work.items` on the device (shared with the plan's later versions in graph mode).
    pub(crate) items_dev: Option<Arc<CudaStorage>>,
    /// `work.groups` on the device, for the CUDA-core kernel's combine only (the decode
    /// kernel merges its splits in place and gets none).
    pub(crate) groups_dev: Option<Arc<CudaStorage>>,
}

impl CudaPlan {
    /// `base` pointed at this plan's work items for one launch over them; `None` when the
    /// plan has no item (nothing to launch).
    pub(crate) fn item_params(&self, base: &AttnParams) -> Option<AttnParams> {
        let items = self
            .items_dev
            .as_ref()
            .filter(|_| !self.work.items.is_empty())?;
        Some(AttnParams {
            items: items.device_ptr(),
            ..*base
        })
    }

    /// Uploads what the kernels of `key` read.
    fn upload(work: WorkPlan, key: &PlanKey, device: &CudaDevice) -> Result<Self> {
        let items_dev = if work.items.is_empty() {
            None
        } else {
            Some(Arc::new(device.upload_pod(&work.items)?))
        };
        // Only the CUDA-core kernel's combine reads the split groups (the decode kernel,
        // FillWaves, merges its splits in place).
        let groups_dev =
            if !work.groups.is_empty() && !matches!(key.split, SplitRule::FillWaves { .. }) {
                Some(Arc::new(device.upload_pod(&work.groups)?))
            } else {
                None
            };
        Ok(CudaPlan {
            work,
            items_dev,
            groups_dev,
        })
    }
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
    plans: Mutex<HashMap<PlanKey, Arc<CudaPlan>>>,
    /// Every split-KV scratch buffer handed out, the largest last. None is freed while the
    /// builder lives: a graph captured earlier may hold the address of any of them.
    scratch: Mutex<Vec<CudaStorage>>,
    /// Every split-counter buffer handed out (kept alive for the same reason).
    counters: Mutex<Vec<CudaStorage>>,
    /// Bumped by every build; metadata of an older build is stale.
    generation: crate::metadata::GraphGeneration,
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
            generation: Default::default(),
        })
    }

    fn plan_inputs(common: &CommonAttentionMetadata) -> PlanInputs<'_> {
        PlanInputs {
            query_start_loc: common.query_start_loc_cpu(),
            seq_lens: common.seq_lens_cpu(),
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
            let plan = plan_graph_work(Self::plan_inputs(common), key, max_seq);
            let was = &old.work;
            if plan.items.len() != was.items.len()
                || plan.groups.len() != was.groups.len()
                || plan.max_splits != was.max_splits
            {
                return Err(Error::Device {
                    backend: "CUDA".into(),
                    message: format!(
                        "graph work list for {key:?} changed shape ({} -> {} items); this is a \
                         bug in plan_graph_work",
                        was.items.len(),
                        plan.items.len()
                    ),
                });
            }
            if let Some(d) = &old.items_dev {
                device.write_pod(d, 0, &plan.items)?;
            }
            if let Some(d) = &old.groups_dev {
                device.write_pod(d, 0, &plan.groups)?;
            }
            let plan = CudaPlan {
                work: plan,
                items_dev: old.items_dev.clone(),
                groups_dev: old.groups_dev.clone(),
            };
            *old = Arc::new(plan);
        }
        self.generation.advance();
        Ok(())
    }

    /// The plan for `key`: re-planned by the latest build, or planned and uploaded now (not
    /// inside a capture).
    fn plan(
        &self,
        device: &CudaDevice,
        common: &CommonAttentionMetadata,
        key: &PlanKey,
    ) -> Result<Arc<CudaPlan>> {
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
        let work = plan_graph_work(Self::plan_inputs(common), key, max_seq);
        let plan = CudaPlan::upload(work, key, device)?;
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
    plans: Mutex<HashMap<PlanKey, Arc<CudaPlan>>>,
    scratch: Mutex<Option<CudaStorage>>,
    counters: Mutex<Option<CudaStorage>>,
    /// Persistent buffers (graph-capturable metadata), with the build generation this
    /// metadata was made by.
    graph: Option<(Arc<GraphBuffers>, u64)>,
}

crate::metadata::batch_metadata!(CudaAttentionMetadata);

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
        match &self.graph {
            Some((g, generation)) => g.generation.check(*generation, g.shape.num_reqs),
            None => Ok(()),
        }
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
    pub fn plan(&self, key: &PlanKey) -> Result<Arc<CudaPlan>> {
        if let Some((g, _)) = &self.graph {
            return g.plan(&self.device, &self.common, key);
        }
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get(key) {
            return Ok(p.clone());
        }
        let work = plan_work(GraphBuffers::plan_inputs(&self.common), key);
        let plan = CudaPlan::upload(work, key, &self.device)?;
        let plan = Arc::new(plan);
        plans.insert(*key, plan.clone());
        Ok(plan)
    }
}

/// Builds [`CudaAttentionMetadata`].
///
/// Graph capture level: [`GraphCaptureSupport::UniformSingleTokenDecode`]. What is
/// capturable: a forward (`reshape_and_cache` plus attention, every kernel path: the
/// tensor-core decode kernel, the CUDA-core decode kernel for f32 at head size 64, and the
/// general CUDA-core kernel for fp8 caches, other f32 layers and head sizes, with sinks,
/// windows, ALiBi and soft caps) over a batch whose requests all have query
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
        common.expect_block_size(self.spec.block_size)?;
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
        let generation = buffers.generation.current();
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
        common.expect_block_size(self.spec.block_size)?;
        let cascade = CascadePlan::for_batch(common, common_prefix_len)?;
        let uploaded = common
            .device()
            .copies_on(&Device::Cuda(self.device.clone()))?;
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
