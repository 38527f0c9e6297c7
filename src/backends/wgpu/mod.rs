//! The wgpu backend: the WGSL family's paged attention (`shaders/`) run through wgpu on
//! Vulkan, Metal, DX12 or GL — Mesa's lavapipe in CI, the NVIDIA Vulkan driver on the H200.
//! Where a native Vulkan driver exists the VULKAN backend ranks above it; this is the path
//! for Metal, DX12 and GL.
//!
//! Same shape as every backend: [`WgpuBackend`] (descriptor), [`WgpuMetadataBuilder`]
//! (per-step metadata and the work plan), [`WgpuAttentionImpl`] (the forward driver's
//! kernels: one command buffer per call, submitted without waiting) and [`probes`] (roofline ceilings and a timestamp
//! timer for `polyattn bench`). The impl, builder and kernel choice are the WGSL family's
//! ([`crate::backends::wgsl_family`], generic over the runtime) named for the wgpu runtime
//! ([`crate::device::wgpu`]); the kernels themselves are [`crate::kernels::wgsl`]. On wgpu the
//! cooperative-matrix prefill form compiles through the runtime's
//! [`coop_spirv`](crate::device::coop_spirv) and is passed through as SPIR-V (Vulkan
//! adapters that offer 16 × 16 × 16 f16 / f32 matrices).

mod attention_impl;
mod descriptor;
mod metadata_builder;
pub mod probes;

pub use crate::backends::wgsl_family::tuning::{
    parse_block, parse_tile, PrefillForm, WgpuTuning, GPU_PREFILL_BLOCK_H, GPU_PREFILL_KEYS_H,
    GPU_PREFILL_TILE, GPU_PREFILL_WG_H, PREFILL_TILED2_WORKGROUP,
};
pub use crate::backends::wgsl_family::{prefill_tile_fits, LayerShaders, PlanKey, MAX_HEAD_SIZE};
pub use attention_impl::{WgpuAttentionImpl, WgpuPlanKernels, WgpuRecording};
pub use descriptor::WgpuBackend;
pub use metadata_builder::{Plan, WgpuAttentionMetadata, WgpuMetadataBuilder, WorkList};
