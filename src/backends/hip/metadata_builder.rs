//! The HIP backend's metadata builder and the work lists its kernels consume.
//!
//! As the CUDA backend's eager path: `build` runs once per step, validates a cascade request,
//! makes sure the metadata arrays (query_start_loc, seq_lens, block_table, slot_mapping) are
//! on this GPU and keeps the host copies for planning. The attention work list depends on the
//! layer's shape (GQA group, window, mask); it is planned on the host by
//! [`crate::plan::plan_work`] the first time a layer of a given shape runs in this step,
//! uploaded once and reused by every later layer of that shape ([`HipAttentionMetadata::plan`]).
//! No graph capture: the graph level is [`GraphCaptureSupport::Never`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::GraphCaptureSupport;
use crate::device::{Device, HipDevice, HipStorage};
use crate::error::Result;
use crate::kernels::cuda::AttnParams;
use crate::kv_cache::KvCacheSpec;
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CascadePlan, CommonAttentionMetadata,
    DecodePrefillSplit, DeviceMetadata,
};
use crate::plan::{plan_work, PlanInputs, PlanKey, WorkPlan};

/// A planned work list with its device copies.
#[derive(Debug)]
pub struct HipPlan {
    /// The host plan.
    pub work: WorkPlan,
    /// `work.items` on the device (`None` when there are none).
    pub(crate) items_dev: Option<HipStorage>,
    /// `work.groups` on the device, for `combine_splits` (`None` when nothing is split).
    pub(crate) groups_dev: Option<HipStorage>,
}

impl HipPlan {
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

    /// Uploads what the kernels read.
    fn upload(work: WorkPlan, device: &HipDevice) -> Result<Self> {
        let items_dev = if work.items.is_empty() {
            None
        } else {
            Some(device.upload_pod(&work.items)?)
        };
        let groups_dev = if work.groups.is_empty() {
            None
        } else {
            Some(device.upload_pod(&work.groups)?)
        };
        Ok(HipPlan {
            work,
            items_dev,
            groups_dev,
        })
    }
}

/// What the HIP kernels consume for one batch.
#[derive(Debug)]
pub struct HipAttentionMetadata {
    /// The validated common metadata.
    pub common: CommonAttentionMetadata,
    /// The decode / prefill split (informational: one kernel handles both).
    pub split: DecodePrefillSplit,
    /// Cascade plan when `common_prefix_len > 0` (run as one full pass).
    pub cascade: Option<CascadePlan>,
    /// Copies of the metadata arrays on this GPU, when `common` holds them elsewhere;
    /// `None` when `common`'s own device copies are on this GPU.
    uploaded: Option<DeviceMetadata>,
    pub(crate) device: HipDevice,
    plans: Mutex<HashMap<PlanKey, Arc<HipPlan>>>,
    scratch: Mutex<Option<HipStorage>>,
}

crate::metadata::batch_metadata!(HipAttentionMetadata);

impl HipAttentionMetadata {
    /// The metadata arrays (query_start_loc, seq_lens, block_table, slot_mapping) on this GPU.
    pub fn arrays(&self) -> &DeviceMetadata {
        self.uploaded
            .as_ref()
            .unwrap_or_else(|| self.common.device())
    }

    /// The address of a device buffer of at least `bytes` bytes, kept for the life of this
    /// metadata and shared by every layer that runs with it (split-KV partials): its users
    /// are ordered on the device's one stream. A larger request replaces it.
    pub(crate) fn scratch(&self, bytes: usize) -> Result<u64> {
        let mut s = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
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

    /// The work list for `key`, planned and uploaded on first use in this step.
    pub fn plan(&self, key: &PlanKey) -> Result<Arc<HipPlan>> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get(key) {
            return Ok(p.clone());
        }
        let inputs = PlanInputs {
            query_start_loc: self.common.query_start_loc_cpu(),
            seq_lens: self.common.seq_lens_cpu(),
        };
        let plan = Arc::new(HipPlan::upload(plan_work(inputs, key), &self.device)?);
        plans.insert(*key, plan.clone());
        Ok(plan)
    }
}

/// Builds [`HipAttentionMetadata`]. Graph capture level: [`GraphCaptureSupport::Never`].
#[derive(Clone, Debug)]
pub struct HipMetadataBuilder {
    spec: KvCacheSpec,
    device: HipDevice,
}

impl HipMetadataBuilder {
    /// A builder for one KV-cache group on `device`.
    pub fn new(spec: KvCacheSpec, device: HipDevice) -> Self {
        HipMetadataBuilder { spec, device }
    }
}

impl AttentionMetadataBuilder for HipMetadataBuilder {
    /// `Never`: every forward runs eagerly.
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
        let uploaded = common
            .device()
            .copies_on(&Device::Hip(self.device.clone()))?;
        Ok(Box::new(HipAttentionMetadata {
            split: common.split_decodes_and_prefills(1, false, true),
            common: common.clone(),
            cascade,
            uploaded,
            device: self.device.clone(),
            plans: Mutex::new(HashMap::new()),
            scratch: Mutex::new(None),
        }))
    }
}
