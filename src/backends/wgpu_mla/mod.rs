//! The wgpu MLA backend (`WGPU_MLA`): multi-head latent attention with the WGSL family's MLA
//! kernels through wgpu (Vulkan, Metal, DX12, GL), the portable counterpart of `CUDA_MLA`.
//!
//! Same shape as every backend: [`WgpuMlaBackend`] (descriptor: `is_mla`, head sizes 576 and
//! 320, block sizes multiples of 16, f32 / f16 / bf16 with a same-dtype or E4M3 latent
//! cache), [`WgpuMlaMetadataBuilder`] (the GPU MLA builder: decodes first, one query length
//! up to 128; the batch arrays on the device) and [`WgpuMlaAttentionImpl`]. Descriptor, impl
//! and kernels are the WGSL family's MLA ([`crate::backends::wgsl_family`]: `WgslMlaBackend`,
//! `WgslMlaAttentionImpl`), the same the native Vulkan runtime's `VULKAN_MLA` runs, named for
//! the wgpu runtime. Everything computes in f32 on every adapter; no adapter feature is
//! required.

mod attention_impl;
mod descriptor;
mod metadata_builder;

pub use attention_impl::WgpuMlaAttentionImpl;
pub use descriptor::WgpuMlaBackend;
pub use metadata_builder::{WgpuMlaMetadata, WgpuMlaMetadataBuilder};
