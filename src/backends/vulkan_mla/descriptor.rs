//! The Vulkan MLA backend's descriptor: the WGSL family's ([`WgslMlaBackend`]) on the Vulkan
//! runtime, ranked 310 on a GPU and 1060 on a CPU implementation.

use crate::backends::wgsl_family::WgslMlaBackend;
use crate::device::VulkanDevice;

/// The Vulkan MLA backend descriptor (name `VULKAN_MLA`; ranked beside `VULKAN`: after the
/// native CUDA and HIP MLA backends on a GPU, after `CPU_MLA` on lavapipe).
pub type VulkanMlaBackend = WgslMlaBackend<VulkanDevice>;
