//! The native Vulkan backend: the WGSL family's paged attention (`shaders/`) translated to
//! SPIR-V by naga and run through the native Vulkan runtime ([`crate::device::vulkan`]: ash,
//! the loader opened at run time) — the path for Intel GPUs and any device with a Vulkan
//! driver, ranked above wgpu; wgpu stays the path for Metal, DX12 and GL. Mesa's lavapipe runs
//! it in CI under the Khronos validation layer.
//!
//! Same shape as every backend: [`VulkanBackend`] (descriptor), [`VulkanMetadataBuilder`]
//! (per-step metadata and the work plan), [`VulkanAttentionImpl`] (the forward driver's
//! kernels: one submission per call) and [`probes`] (roofline ceilings and a timestamp timer
//! for `polyattn bench`). The impl, builder and kernel choice are the WGSL family's
//! ([`crate::backends::wgsl_family`]), the same code the wgpu backend runs, named for the
//! Vulkan runtime: the same specialisations, parameter blocks and dispatch order, on a device
//! whose subgroup sizes, f16 support and limits the runtime reads from Vulkan itself.

mod attention_impl;
mod descriptor;
mod metadata_builder;
pub mod probes;

pub use attention_impl::VulkanAttentionImpl;
pub use descriptor::VulkanBackend;
pub use metadata_builder::{VulkanAttentionMetadata, VulkanMetadataBuilder};
