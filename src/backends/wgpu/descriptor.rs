//! The wgpu backend's descriptor: the WGSL family's ([`WgslBackend`]) on the wgpu runtime.

use crate::backends::wgsl_family::{WgslBackend, WgslBackendRuntime};
use crate::device::{DeviceKind, WgpuDevice};
use crate::error::Result;

/// The wgpu backend descriptor (name `WGPU`). It ranks 400 on a hardware adapter: after
/// CUDA, HIP and Vulkan, before the CPU; a software adapter (lavapipe, llvmpipe, WARP:
/// `DeviceType::Cpu`) ranks 1100, after the CPU backend, and stays selectable by
/// `POLYATTN_BACKEND=wgpu`. A KV cache must fit one storage binding (lavapipe 128 MiB, the
/// H200 2 GiB).
pub type WgpuBackend = WgslBackend<WgpuDevice>;

impl WgslBackendRuntime for WgpuDevice {
    const BACKEND: &'static str = "WGPU";
    const MLA_BACKEND: &'static str = "WGPU_MLA";
    const KIND: DeviceKind = DeviceKind::Wgpu;
    const PRIORITY: (u32, u32) = (400, 1100);

    fn open() -> Result<Self> {
        WgpuDevice::open()
    }
}
