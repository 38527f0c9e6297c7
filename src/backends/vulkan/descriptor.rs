//! The Vulkan backend's descriptor: the WGSL family's ([`WgslBackend`]) on the Vulkan
//! runtime.

use crate::backends::wgsl_family::{WgslBackend, WgslBackendRuntime};
use crate::device::{DeviceKind, VulkanDevice};
use crate::error::Result;

/// The Vulkan backend descriptor (name `VULKAN`). It ranks 300 on a GPU: after the native
/// CUDA and HIP paths, before wgpu; on a CPU implementation (lavapipe, SwiftShader) 1050,
/// after the CPU backend and before wgpu's software adapter; `POLYATTN_BACKEND=vulkan` picks
/// it anywhere. A KV cache larger than one buffer (`maxStorageBufferRange` and one
/// allocation: about 4 GiB on the H200's driver, 128 MiB on lavapipe) is stored in chunks of
/// whole blocks and bound as one binding array; it must fit the device's memory.
pub type VulkanBackend = WgslBackend<VulkanDevice>;

impl WgslBackendRuntime for VulkanDevice {
    const BACKEND: &'static str = "VULKAN";
    const MLA_BACKEND: &'static str = "VULKAN_MLA";
    const KIND: DeviceKind = DeviceKind::Vulkan;
    const PRIORITY: (u32, u32) = (300, 1050);

    fn open() -> Result<Self> {
        VulkanDevice::global()
    }
}
