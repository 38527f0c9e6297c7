//! Captured submissions: Vulkan's counterpart of a CUDA graph.
//!
//! [`VulkanDevice::capture`] runs a closure in capture mode on the calling thread: every
//! WGSL-family submission it makes on this device ([`WgslRuntime::submit`] and
//! `submit_one`: a layer's forward, a cache write, a merge) is kept — its pipelines, the
//! buffers it binds and a copy of its parameter words — instead of run. When the closure
//! returns, the kept dispatches are recorded, in order with a barrier between consecutive
//! ones, into one command buffer of a [`VulkanGraph`], which [`VulkanGraph::replay`] submits
//! any number of times.
//!
//! What a replay reads: the buffers themselves (not their contents at capture), so a step's
//! new inputs are written into the captured tensors and its metadata into the persistent
//! buffers the builder's graph mode keeps; the parameter words as they were at capture (the
//! graph owns a copy, so later eager forwards of the same layers do not change it). What a
//! capture refuses, on the capturing thread: any other submission (uploads, downloads, fills,
//! timestamps, one-off dispatches of [`VulkanDevice::run`]), since a graph cannot hold host
//! work — allocate, upload and compile before capture (run the step once eagerly first).
//! Other threads keep using the device normally.
//!
//! [`WgslRuntime::submit`]: crate::device::wgsl::WgslRuntime::submit

use std::cell::RefCell;
use std::sync::Arc;

use crate::device::wgsl::Slot;
use crate::error::{Error, Result};

use super::pipeline::Recorded;
use super::{ComputePipeline, Step, VulkanBuffer, VulkanDevice};

/// One dispatch kept by a capture: its pipeline, parameter words, bound buffers and
/// workgroups.
pub(crate) struct Kept {
    pub(crate) pipeline: Arc<ComputePipeline>,
    pub(crate) words: Slot,
    pub(crate) buffers: Vec<(u32, Arc<VulkanBuffer>)>,
    pub(crate) groups: (u32, u32, u32),
}

/// The capture of the calling thread: which device (its `Inner`'s address) and what it kept.
struct Capture {
    device: usize,
    kept: Vec<Kept>,
}

thread_local! {
    static CAPTURE: RefCell<Option<Capture>> = const { RefCell::new(None) };
}

/// Dispatches captured once and replayed ([`VulkanDevice::capture`]). It owns what its
/// command buffer binds (pipelines, buffers, parameter copies), so nothing it reads is freed
/// while it exists.
pub struct VulkanGraph {
    // Field order is drop order: the command buffer and descriptor sets go before what they
    // reference.
    recorded: Recorded,
    _params: Vec<VulkanBuffer>,
    _kept: Vec<Kept>,
    device: VulkanDevice,
}

impl std::fmt::Debug for VulkanGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanGraph")
            .field("dispatches", &self._kept.len())
            .finish()
    }
}

impl VulkanGraph {
    /// Number of dispatches the graph runs.
    pub fn len(&self) -> usize {
        self._kept.len()
    }

    /// Whether the graph runs no dispatch (its closure submitted nothing).
    pub fn is_empty(&self) -> bool {
        self._kept.is_empty()
    }

    /// Submits the captured dispatches, once the graph's previous replay has finished, and
    /// returns without waiting for them (a download, `synchronize` or the next replay
    /// waits). Errors inside a capture of the same device.
    pub fn replay(&self) -> Result<()> {
        if self.device.is_capturing() {
            return Err(self.device.capture_error("replaying a Vulkan graph"));
        }
        self.recorded.submit().map(|_| ())
    }
}

impl VulkanDevice {
    fn key(&self) -> usize {
        Arc::as_ptr(self.inner_arc()) as usize
    }

    /// Whether the calling thread is inside [`VulkanDevice::capture`] of this device.
    pub fn is_capturing(&self) -> bool {
        CAPTURE.with(|c| c.borrow().as_ref().is_some_and(|c| c.device == self.key()))
    }

    /// The error for `what`, attempted inside a capture.
    pub(crate) fn capture_error(&self, what: &str) -> Error {
        Error::Device {
            backend: "VULKAN".into(),
            message: format!(
                "{what} inside a Vulkan graph capture: a captured region may only submit the \
                 WGSL family's dispatches on buffers that already exist; allocate, upload and \
                 compile before capture (run the step once eagerly first)"
            ),
        }
    }

    /// Keeps the dispatches of one submission when this thread captures this device; returns
    /// whether it did (the caller then runs nothing).
    pub(crate) fn keep_if_capturing(&self, dispatches: impl Iterator<Item = Kept>) -> bool {
        let key = self.key();
        CAPTURE.with(|c| match c.borrow_mut().as_mut() {
            Some(cap) if cap.device == key => {
                cap.kept.extend(dispatches);
                true
            }
            _ => false,
        })
    }

    /// Runs `f` in capture mode (see the module docs) and returns the graph of the dispatches
    /// it submitted on this device; nothing runs during the capture. Errors: a capture of
    /// this device already running on this thread (nested), a capture of another device on
    /// this thread, `f`'s own error (the capture is then dropped), or a host operation inside
    /// the capture (the error `f` sees).
    pub fn capture(&self, f: impl FnOnce() -> Result<()>) -> Result<VulkanGraph> {
        let nested = CAPTURE.with(|c| c.borrow().is_some());
        if nested {
            return Err(Error::Device {
                backend: "VULKAN".into(),
                message: "VulkanDevice::capture called inside a capture on the same thread \
                          (nested captures are not supported)"
                    .into(),
            });
        }
        CAPTURE.with(|c| {
            *c.borrow_mut() = Some(Capture {
                device: self.key(),
                kept: Vec::new(),
            })
        });
        // Leaves capture mode however `f` ends (an error or a panic).
        struct Leave;
        impl Drop for Leave {
            fn drop(&mut self) {
                CAPTURE.with(|c| c.borrow_mut().take());
            }
        }
        let leave = Leave;
        let result = f();
        let kept = CAPTURE
            .with(|c| c.borrow_mut().take())
            .map(|c| c.kept)
            .unwrap_or_default();
        drop(leave);
        result?;
        let params = kept
            .iter()
            .map(|k| {
                let slot = self.mapped_param_slot()?;
                self.write_param_slot(&slot, &k.words)?;
                Ok(slot)
            })
            .collect::<Result<Vec<_>>>()?;
        let steps: Vec<Step<'_>> = kept
            .iter()
            .zip(&params)
            .map(|(k, p)| {
                let buffers =
                    std::iter::once((0, p)).chain(k.buffers.iter().map(|(n, b)| (*n, &**b)));
                Step::declared(&k.pipeline, buffers, k.groups)
            })
            .collect();
        let recorded = if steps.is_empty() {
            Recorded::empty(self)
        } else {
            self.record_with(&steps, false)?.into_recorded()
        };
        drop(steps);
        Ok(VulkanGraph {
            recorded,
            _params: params,
            _kept: kept,
            device: self.clone(),
        })
    }
}
