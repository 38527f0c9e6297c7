//! The wgpu backend's descriptor: the WGSL family's ([`WgslBackend`]) on the wgpu runtime,
//! and the adapter rules the wgpu MLA backend's descriptor shares.

use crate::backend::Availability;
use crate::backends::wgsl_family::{WgslBackend, WgslBackendRuntime};
use crate::device::{DeviceKind, WgpuDevice};
use crate::error::{Error, Result};

/// The wgpu backend descriptor (name `WGPU`). It ranks 400 on a hardware adapter: after
/// CUDA, HIP and Vulkan, before the CPU; a software adapter (lavapipe, llvmpipe, WARP:
/// `DeviceType::Cpu`) ranks 1100, after the CPU backend, and stays selectable by
/// `POLYATTN_BACKEND=wgpu`. A KV cache must fit one storage binding (lavapipe 128 MiB, the
/// H200 2 GiB).
pub type WgpuBackend = WgslBackend<WgpuDevice>;

impl WgslBackendRuntime for WgpuDevice {
    const BACKEND: &'static str = "WGPU";
    const KIND: DeviceKind = DeviceKind::Wgpu;
    const PRIORITY: (u32, u32) = (400, 1100);

    fn open() -> Result<Self> {
        WgpuDevice::open()
    }
}

/// `hardware` on a GPU adapter, `software` on a CPU implementation (lavapipe, llvmpipe,
/// WARP), which emulates a GPU on the cores the CPU backends use natively (the wgpu backends'
/// rule).
pub(crate) fn adapter_priority(hardware: u32, software: u32) -> u32 {
    match WgpuDevice::open() {
        Ok(d) if d.adapter_info().device_type == wgpu::DeviceType::Cpu => software,
        _ => hardware,
    }
}

/// Whether the wgpu device opens (its description), or why not.
pub(crate) fn adapter_availability() -> Availability {
    match WgpuDevice::open() {
        Ok(d) => Availability::Available(d.description()),
        Err(Error::Device { message, .. }) => Availability::Unavailable(message),
        Err(e) => Availability::Unavailable(e.to_string()),
    }
}
