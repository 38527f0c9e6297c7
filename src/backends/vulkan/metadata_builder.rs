//! The Vulkan backend's metadata builder: the WGSL family's ([`WgslMetadataBuilder`]: device
//! copies of the block table and slot mapping, the work plan built by the first layer of a
//! step and shared by the rest) on Vulkan buffers.

use crate::backends::wgsl_family::{WgslAttentionMetadata, WgslMetadataBuilder};
use crate::device::VulkanDevice;

/// What the Vulkan kernels consume for one batch.
pub type VulkanAttentionMetadata = WgslAttentionMetadata<VulkanDevice>;

/// Builds [`VulkanAttentionMetadata`].
pub type VulkanMetadataBuilder = WgslMetadataBuilder<VulkanDevice>;
