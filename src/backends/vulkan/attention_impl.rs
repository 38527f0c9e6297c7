//! The Vulkan impl: the WGSL family's impl ([`WgslAttentionImpl`]) on the native Vulkan
//! runtime. Per layer it owns host-visible parameter slots (written in place, only where they
//! differ from the last call's), the layer constants and a split-KV scratch buffer that grows
//! to the largest batch seen; a call records its dispatches into one command buffer with a
//! barrier between consecutive ones, submits it and waits.

use crate::backends::wgsl_family::WgslAttentionImpl;
use crate::device::VulkanDevice;

/// The Vulkan attention impl of one layer.
pub type VulkanAttentionImpl = WgslAttentionImpl<VulkanDevice>;
