//! The wgpu backend: paged attention in WGSL (`shaders/`), run through wgpu on Vulkan,
//! Metal, DX12 or GL — Mesa's lavapipe in CI, the NVIDIA Vulkan driver on the H200.
//!
//! Same shape as the CPU backend: [`WgpuBackend`] (descriptor), [`WgpuMetadataBuilder`]
//! (per-step metadata and the work plan), [`WgpuAttentionImpl`] (the forward driver's
//! kernels, [`crate::forward::ForwardKernels`]: one command buffer per call), [`kernels`]
//! ([`LayerShaders`], which specialisation of each kernel a layer runs on the adapter, and the
//! `merge_attn_states` op), [`tuning`] (the
//! family's knobs for the device's adapter kind) and [`probes`] (roofline ceilings and a
//! timestamp timer for `polyattn bench`). The kernels themselves are the WGSL family
//! ([`crate::kernels::wgsl`]: sources, specialisation, tile policy, knobs); compiling,
//! caching and dispatching them is the wgpu runtime's ([`crate::device::wgpu`]).
//!
//! Kernels: `reshape_and_cache` (−1 slots skipped, fp8 packed four per word and bit-exact
//! with `src/fp8.rs`), one paged-attention kernel with online softmax for every batch shape
//! (decode tiles with split-KV partials merged by `combine_splits`, prefill tiles without),
//! and `merge_attn_states` for [`crate::ops::merge_attn_states`]. Everything computes in f32;
//! f16, bf16 and fp8 are unpacked from u32 words, so no adapter feature is required. The
//! subgroup softmax is used when the adapter has `SUBGROUP`. Prefill tiles take one of four
//! forms ([`PrefillForm`]), the best that can run the layer: cooperative matrix
//! (`shaders/paged_attention_coop.wgsl`: both products on tensor cores through wgpu's
//! experimental cooperative matrices, f32 softmax, compiled by the runtime's
//! [`coop_spirv`](crate::device::wgpu::coop_spirv) and passed through as SPIR-V; f16 layers with an f16 cache on Vulkan adapters that offer 16 × 16 × 16
//! f16 / f32 matrices), fused softmax f16 (f16 tiles and packed f16 FMAs, f32 softmax; f16
//! layers on `SHADER_F16` adapters: the one path besides the cooperative-matrix form that does
//! not compute in f32), fused softmax (register-prefetched K/V, softmax fused into the score
//! phase, fewer barriers) and three phase (what every adapter runs, and the decode tiles).
//! Every knob of the family is a field of [`WgpuTuning`] (docs/TUNING.md).

mod attention_impl;
mod descriptor;
pub mod kernels;
mod metadata_builder;
pub mod probes;
pub mod tuning;

/// The WGSL family under the name the backend's files give it (`shaders::…`).
use crate::kernels::wgsl as shaders;

pub use attention_impl::{WgpuAttentionImpl, WgpuPlanKernels, WgpuRecording, MAX_HEAD_SIZE};
pub use descriptor::WgpuBackend;
pub(crate) use descriptor::{adapter_availability, adapter_priority};
pub use kernels::{prefill_tile_fits, LayerShaders};
pub use metadata_builder::{Plan, PlanKey, WgpuAttentionMetadata, WgpuMetadataBuilder, WorkList};
pub use tuning::{
    parse_block, parse_tile, PrefillForm, WgpuTuning, GPU_PREFILL_BLOCK_H, GPU_PREFILL_KEYS_H,
    GPU_PREFILL_TILE, GPU_PREFILL_WG_H, PREFILL_TILED2_WORKGROUP,
};
