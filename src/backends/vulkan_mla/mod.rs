//! The Vulkan MLA backend (`VULKAN_MLA`): multi-head latent attention with the WGSL family's
//! MLA kernels as SPIR-V on the native Vulkan runtime — the MLA path on Intel GPUs and any
//! device with a Vulkan driver, ranked above `WGPU_MLA`.
//!
//! Same shape as every backend: [`VulkanMlaBackend`] (descriptor: `is_mla`, head sizes 576
//! and 320, block sizes multiples of 16, f32 / f16 / bf16 with a same-dtype or E4M3 latent
//! cache), [`VulkanMlaMetadataBuilder`] (the GPU MLA builder) and [`VulkanMlaAttentionImpl`].
//! Descriptor, impl and kernels are the WGSL family's MLA
//! ([`crate::backends::wgsl_family`]), the same `WGPU_MLA` runs, named for the Vulkan
//! runtime; each call is one submission, waited on. Everything computes in f32.

mod attention_impl;
mod descriptor;
mod metadata_builder;

pub use attention_impl::VulkanMlaAttentionImpl;
pub use descriptor::VulkanMlaBackend;
pub use metadata_builder::{VulkanMlaMetadata, VulkanMlaMetadataBuilder};
