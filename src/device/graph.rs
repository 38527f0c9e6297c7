//! Captured graphs on whichever device has them: one closed enum over the runtimes that
//! capture ([`CudaGraph`] on CUDA, [`VulkanGraph`] on the native Vulkan runtime), so model
//! code captures and replays a decode step the same way on either ([`Device::capture`]).
//! The CPU, HIP and wgpu devices have no graphs (their backends declare
//! `GraphCaptureSupport::Never`).

use super::{CudaGraph, Device, VulkanGraph};
use crate::error::{Error, Result};

/// A captured graph of one device's work, replayed with [`DeviceGraph::replay`].
#[derive(Debug)]
pub enum DeviceGraph {
    /// A CUDA graph ([`crate::device::CudaDevice::capture`]).
    Cuda(CudaGraph),
    /// A recorded Vulkan command buffer ([`crate::device::VulkanDevice::capture`]).
    Vulkan(VulkanGraph),
}

impl DeviceGraph {
    /// Runs the captured work again (CUDA: queued on the stream; Vulkan: submitted and
    /// waited on).
    pub fn replay(&self) -> Result<()> {
        match self {
            DeviceGraph::Cuda(g) => g.replay(),
            DeviceGraph::Vulkan(g) => g.replay(),
        }
    }
}

impl Device {
    /// Whether this device captures graphs ([`Device::capture`]).
    pub fn has_graphs(&self) -> bool {
        matches!(self, Device::Cuda(_) | Device::Vulkan(_))
    }

    /// Captures the work `f` submits to this device into a graph (see
    /// [`crate::device::CudaDevice::capture`] and [`crate::device::VulkanDevice::capture`]
    /// for what each may capture); nothing runs during the capture. Errors on a device
    /// without graphs, and with the runtime's error for what cannot be captured.
    pub fn capture(&self, f: impl FnOnce() -> Result<()>) -> Result<DeviceGraph> {
        match self {
            Device::Cuda(d) => d.capture(f).map(DeviceGraph::Cuda),
            Device::Vulkan(d) => d.capture(f).map(DeviceGraph::Vulkan),
            other => Err(Error::config(format!(
                "the {} device has no graph capture (its backends declare \
                 GraphCaptureSupport::Never); run the step eagerly",
                other.kind().as_str()
            ))),
        }
    }
}
