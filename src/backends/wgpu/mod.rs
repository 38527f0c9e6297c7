//! The wgpu backend: paged attention in WGSL (`shaders/`), run through wgpu on Vulkan,
//! Metal, DX12 or GL — Mesa's lavapipe in CI, the NVIDIA Vulkan driver on the H200.
//!
//! Same shape as the CPU backend: [`WgpuBackend`] (descriptor), [`WgpuMetadataBuilder`]
//! (per-step metadata and the work plan), [`WgpuAttentionImpl`] (argument checks, then one
//! command buffer per call), `kernels` (pipeline cache, bind groups, dispatch), [`coop_spirv`]
//! (the cooperative-matrix shaders' SPIR-V),
//! [`shaders`] (WGSL specialisation) and [`probes`] (roofline ceilings and a timestamp
//! timer for `polyattn bench`).
//!
//! Kernels: `reshape_and_cache` (−1 slots skipped, fp8 packed four per word and bit-exact
//! with `src/fp8.rs`), one paged-attention kernel with online softmax for every batch shape
//! (decode tiles with split-KV partials merged by `combine_splits`, prefill tiles without),
//! and `merge_attn_states` for [`crate::ops::merge_attn_states`]. Everything computes in f32;
//! f16, bf16 and fp8 are unpacked from u32 words, so no adapter feature is required. The
//! subgroup softmax is used when the adapter has `SUBGROUP`. Prefill tiles take the
//! kernel's tiled2 form ([`PrefillKernel`]): register-prefetched K/V, softmax fused into the
//! score phase, fewer barriers (twice the tiled form's speed on the H200); a layer whose
//! tiled2 workgroup memory does not fit the adapter runs the tiled form
//! (`POLYATTN_WGPU_PREFILL=tiled` forces it). f16 layers with an f16 cache on adapters with
//! `SHADER_F16` take its f16 variant tiled2h by default (f16 tiles and packed f16 FMAs, f32
//! softmax; 1.6x tiled2 on the H200): the one path that does not compute in f32
//! (`POLYATTN_WGPU_PREFILL=tiled2` keeps them in f32). Where a Vulkan adapter offers
//! cooperative matrices (16 × 16 × 16 f16 / f32: the H200's driver), those layers run the
//! coop form instead (`shaders/paged_attention_coop.wgsl`: both products on tensor cores,
//! f32 softmax, compiled by [`coop_spirv`] and passed through as SPIR-V; 2× tiled2h on the
//! H200 from 16k tokens; `POLYATTN_WGPU_COOP=0` / `POLYATTN_WGPU_PREFILL_COOP=0` turn it off).

mod attention_impl;
pub mod coop_spirv;
mod descriptor;
pub mod kernels;
mod metadata_builder;
pub mod probes;
pub mod shaders;

pub use attention_impl::{prefill_tile_fits, WgpuAttentionImpl, MAX_HEAD_SIZE};
pub use descriptor::WgpuBackend;
pub use metadata_builder::{
    parse_block, parse_tile, CascadePlan, Plan, PlanKey, PrefillKernel, WgpuAttentionMetadata,
    WgpuMetadataBuilder, WgpuTuning, WorkList, GPU_PREFILL_BLOCK_H, GPU_PREFILL_KEYS_H,
    GPU_PREFILL_TILE, GPU_PREFILL_WG_H, PREFILL_TILED2_WORKGROUP,
};
