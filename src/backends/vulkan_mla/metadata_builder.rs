//! The Vulkan MLA backend's metadata builder: the GPU MLA builder
//! ([`crate::backends::mla_batch`]) on the backend's Vulkan device.

use crate::backends::mla_batch::{MlaBatchBuilder, MlaBatchMetadata};

/// What the Vulkan MLA kernels consume for one batch.
pub type VulkanMlaMetadata = MlaBatchMetadata;

/// Builds [`VulkanMlaMetadata`].
pub type VulkanMlaMetadataBuilder = MlaBatchBuilder;
