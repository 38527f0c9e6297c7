//! The Vulkan MLA impl: the WGSL family's ([`WgslMlaAttentionImpl`]) on the Vulkan runtime.

use crate::backends::wgsl_family::WgslMlaAttentionImpl;
use crate::device::VulkanDevice;

/// The Vulkan MLA impl of one layer.
pub type VulkanMlaAttentionImpl = WgslMlaAttentionImpl<VulkanDevice>;
