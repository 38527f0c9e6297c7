//! The Vulkan runtime as a [`WgslRuntime`]: pipelines compiled once per device and key
//! (the driver's pipeline cache saved after each new one, since the process's device is
//! never dropped), parameter slots in host-visible uniform buffers written in place (a block
//! is rewritten only after the last submission that read it has finished), and a
//! submission's dispatches recorded into one command buffer with a barrier between
//! consecutive ones, submitted without waiting ([`super::queue`]).
//!
//! Inside a capture ([`VulkanDevice::capture`]) `submit` and `submit_one` keep their
//! dispatches for the graph instead of running them.
//!
//! The module's bindings are reflected from its IR, not taken from the kernel's
//! [`Bindings`] set: a buffer given for a binding the module does not declare is left out
//! ([`Step::declared`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::device::wgsl::{
    whole_rows, Dispatch, LoopBounding, Slot, WgslDeviceInfo, WgslRuntime, PARAM_SLOT_BYTES,
};
use crate::device::{Device, Storage, Tensor};
use crate::error::{Error, Result};
use crate::kernels::wgsl::Bindings;

use super::graph::Kept;
use super::queue::Keep;
use super::{ComputePipeline, Step, VulkanBuffer, VulkanDevice};

/// Distinct placeholder buffers per device.
const PLACEHOLDERS: usize = 4;

/// One-off parameter blocks per device, used in turn: a block is rewritten only once the
/// submission that read it has finished, so consecutive one-off dispatches need not wait
/// for each other.
const ONEOFF_BLOCKS: usize = 32;

/// What a device keeps for its WGSL-family users.
pub(crate) struct Caches {
    pipelines: Mutex<HashMap<String, Arc<ComputePipeline>>>,
    placeholders: OnceLock<Vec<Arc<VulkanBuffer>>>,
    /// The one-off blocks and the index of the next one.
    oneoff: Mutex<(Vec<VulkanParams>, usize)>,
}

impl Caches {
    pub(crate) fn new() -> Arc<Caches> {
        Arc::new(Caches {
            pipelines: Mutex::new(HashMap::new()),
            placeholders: OnceLock::new(),
            oneoff: Mutex::new((Vec::new(), 0)),
        })
    }
}

/// Parameter slots: one host-visible 256-byte uniform buffer each, what each holds, and the
/// serial of the last submission that read them (a slot is rewritten only after it).
#[derive(Debug)]
pub struct VulkanParams {
    slots: Vec<Arc<VulkanBuffer>>,
    written: Mutex<Vec<Option<Slot>>>,
    last_use: std::sync::atomic::AtomicU64,
}

fn device_error(message: String) -> Error {
    Error::Device {
        backend: "VULKAN".into(),
        message,
    }
}

impl VulkanDevice {
    /// The Vulkan storage of `t`, which must live on this device.
    fn storage_of<'t>(
        &self,
        t: &'t Tensor,
        what: &'static str,
    ) -> Result<&'t crate::device::VulkanStorage> {
        let s = match t.storage() {
            Storage::Vulkan(s) => s,
            _ => {
                return Err(device_error(format!(
                    "{what} lives on {}, not on the Vulkan device; create it with the \
                     backend's device or move it with Tensor::to_device",
                    t.device().kind().as_str()
                )))
            }
        };
        if s.device() != self {
            return Err(device_error(format!(
                "{what} lives on another Vulkan device"
            )));
        }
        Ok(s)
    }

    /// Number of pipelines compiled for the WGSL family's users so far.
    pub fn pipeline_count(&self) -> usize {
        self.caches
            .pipelines
            .lock()
            .map(|p| p.len())
            .unwrap_or_default()
    }

    fn write_slots(&self, params: &VulkanParams, slots: &[Slot]) -> Result<()> {
        if slots.len() > params.slots.len() {
            return Err(Error::config(format!(
                "{} parameter slots written to a block of {}",
                slots.len(),
                params.slots.len()
            )));
        }
        let mut written = params.written.lock().unwrap_or_else(|p| p.into_inner());
        let changed = |i: usize, slot: &Slot| written[i].as_ref() != Some(slot);
        if slots.iter().enumerate().any(|(i, s)| changed(i, s)) {
            // The submission that last read the block must be done before it is rewritten.
            self.wait_for(params.last_use.load(std::sync::atomic::Ordering::SeqCst))?;
        }
        for (i, slot) in slots.iter().enumerate() {
            if written[i].as_ref() != Some(slot) {
                self.write_mapped(&params.slots[i], bytemuck::cast_slice(slot))?;
                written[i] = Some(*slot);
            }
        }
        Ok(())
    }

    /// Keeps `dispatches` in this thread's capture of this device, with the words each one's
    /// slot holds after `slots` are written (see [`VulkanDevice::capture`]); false when not
    /// capturing.
    fn keep(
        &self,
        params: &VulkanParams,
        slots: &[Slot],
        dispatches: &[Dispatch<Self>],
    ) -> Result<bool> {
        if !self.is_capturing() {
            return Ok(false);
        }
        let written = params.written.lock().unwrap_or_else(|p| p.into_inner());
        let words = dispatches
            .iter()
            .map(|d| {
                slots
                    .get(d.slot)
                    .copied()
                    .or_else(|| written.get(d.slot).copied().flatten())
                    .ok_or_else(|| {
                        Error::config(format!(
                            "parameter slot {} of a block of {} was never written",
                            d.slot,
                            params.slots.len()
                        ))
                    })
            })
            .collect::<Result<Vec<Slot>>>()?;
        Ok(
            self.keep_if_capturing(dispatches.iter().zip(words).map(|(d, words)| Kept {
                pipeline: d.pipeline.clone(),
                words,
                buffers: d.buffers.clone(),
                groups: d.groups,
            })),
        )
    }

    /// Submits `dispatches` without waiting, keeping their buffers, parameter slots and
    /// pipelines alive until they finish, and marks `params` as read by the submission.
    fn run_dispatches(&self, params: &VulkanParams, dispatches: &[Dispatch<Self>]) -> Result<()> {
        let mut steps = Vec::with_capacity(dispatches.len());
        let mut keep = Keep::default();
        for d in dispatches {
            let slot = params.slots.get(d.slot).ok_or_else(|| {
                Error::config(format!(
                    "parameter slot {} of a block of {}",
                    d.slot,
                    params.slots.len()
                ))
            })?;
            let buffers =
                std::iter::once((0, &**slot)).chain(d.buffers.iter().map(|(n, b)| (*n, &**b)));
            steps.push(Step::declared(&d.pipeline, buffers, d.groups));
            keep.buffers.push(slot.clone());
            keep.buffers
                .extend(d.buffers.iter().map(|(_, b)| b.clone()));
            keep.pipelines.push(d.pipeline.clone());
        }
        let serial = self.run_kept(&steps, keep)?;
        params
            .last_use
            .fetch_max(serial, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

impl WgslRuntime for VulkanDevice {
    type Buffer = Arc<VulkanBuffer>;
    type Pipeline = Arc<ComputePipeline>;
    type Params = VulkanParams;

    const NAME: &'static str = "VULKAN";
    const CAPTURES: bool = true;

    fn info(&self) -> &WgslDeviceInfo {
        &self.inner().wgsl
    }

    fn is_capturing(&self) -> bool {
        VulkanDevice::is_capturing(self)
    }

    fn device(&self) -> Device {
        Device::Vulkan(self.clone())
    }

    fn pipeline(
        &self,
        key: &str,
        source: &dyn Fn() -> String,
        _: Bindings,
        subgroups: bool,
        loops: LoopBounding,
    ) -> Result<Arc<ComputePipeline>> {
        if subgroups && !self.info().subgroups {
            return Err(device_error(format!(
                "{key} needs subgroup operations, which this device lacks"
            )));
        }
        let lock = || {
            self.caches
                .pipelines
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        };
        if let Some(p) = lock().get(key) {
            return Ok(p.clone());
        }
        // Compiled outside the lock, so threads compiling different pipelines do not wait on
        // each other.
        // The pipeline knobs of the WGSL family's runtimes (`PipelineTuning`): the same for
        // both, so an A/B of a knob means the same on wgpu and Vulkan.
        let knobs = crate::device::wgpu::PipelineTuning::get();
        let loops = if knobs.loop_bounding {
            LoopBounding::Forced
        } else {
            loops
        };
        let started = knobs.log_pipelines.then(std::time::Instant::now);
        let p = Arc::new(self.pipeline_with(key, &source(), loops)?);
        if let Some(t) = started {
            eprintln!(
                "polyattn vulkan: compiled pipeline `{key}` in {:.0} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        self.save_pipeline_cache();
        Ok(lock().entry(key.to_string()).or_insert(p).clone())
    }

    fn tensor_buffer(&self, t: &Tensor, what: &'static str) -> Result<Arc<VulkanBuffer>> {
        let s = self.storage_of(t, what)?;
        let Some(b) = s.single() else {
            return Err(device_error(format!(
                "{what} is stored in {} chunks (a tensor of {} bytes, larger than one buffer); \
                 this kernel binds one buffer",
                s.chunks().len(),
                s.len_bytes()
            )));
        };
        self.info().check_binding(b.len_bytes(), what)?;
        Ok(b.clone())
    }

    fn tensor_chunks(
        &self,
        t: &Tensor,
        row_bytes: u64,
        what: &'static str,
    ) -> Result<(Vec<Arc<VulkanBuffer>>, u32)> {
        let s = self.storage_of(t, what)?;
        if s.single().is_some() {
            let b = self.tensor_buffer(t, what)?;
            return Ok((vec![b], whole_rows(s.len_bytes(), row_bytes)));
        }
        if row_bytes == 0 || s.chunk_bytes() % row_bytes != 0 {
            return Err(device_error(format!(
                "{what} is stored in chunks of {} bytes, not whole rows of {row_bytes}",
                s.chunk_bytes()
            )));
        }
        for b in s.chunks() {
            self.info().check_binding(b.len_bytes(), what)?;
        }
        Ok((s.chunks().to_vec(), whole_rows(s.chunk_bytes(), row_bytes)))
    }

    fn buffer_bytes(buffer: &Arc<VulkanBuffer>) -> u64 {
        buffer.len_bytes()
    }

    fn upload_words(&self, _: &str, words: &[u32]) -> Result<Arc<VulkanBuffer>> {
        Ok(Arc::new(self.upload(bytemuck::cast_slice(words))?))
    }

    fn write_words(&self, buffer: &Arc<VulkanBuffer>, words: &[u32]) -> Result<()> {
        self.write(buffer, 0, bytemuck::cast_slice(words))
    }

    fn scratch(&self, _: &str, bytes: u64) -> Result<Arc<VulkanBuffer>> {
        Ok(Arc::new(self.zeros(bytes)?))
    }

    fn placeholder(&self, slot: usize) -> Result<Arc<VulkanBuffer>> {
        if let Some(made) = self.caches.placeholders.get() {
            return Ok(made[slot % PLACEHOLDERS].clone());
        }
        let made = (0..PLACEHOLDERS)
            .map(|_| self.zeros(256).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.caches.placeholders.get_or_init(|| made)[slot % PLACEHOLDERS].clone())
    }

    fn params(&self, slots: usize) -> Result<VulkanParams> {
        Ok(VulkanParams {
            slots: (0..slots)
                .map(|_| self.mapped_buffer(PARAM_SLOT_BYTES).map(Arc::new))
                .collect::<Result<_>>()?,
            written: Mutex::new(vec![None; slots]),
            last_use: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn submit(
        &self,
        params: &VulkanParams,
        slots: &[Slot],
        dispatches: &[Dispatch<Self>],
    ) -> Result<()> {
        if dispatches.is_empty() || self.keep(params, slots, dispatches)? {
            return Ok(());
        }
        self.write_slots(params, slots)?;
        self.run_dispatches(params, dispatches)
    }

    fn submit_one(&self, words: Slot, dispatch: Dispatch<Self>) -> Result<()> {
        if self.keep_if_capturing(std::iter::once(Kept {
            pipeline: dispatch.pipeline.clone(),
            words,
            buffers: dispatch.buffers.clone(),
            groups: dispatch.groups,
        })) {
            return Ok(());
        }
        let mut guard = self.caches.oneoff.lock().unwrap_or_else(|p| p.into_inner());
        let (blocks, next) = &mut *guard;
        if blocks.len() < ONEOFF_BLOCKS {
            blocks.push(self.params(1)?);
        }
        let i = *next % blocks.len();
        *next = (i + 1) % ONEOFF_BLOCKS;
        let params = &blocks[i];
        self.write_slots(params, &[words])?;
        self.run_dispatches(params, std::slice::from_ref(&dispatch))
    }
}
