//! What the backends of the WGSL family share — the wgpu backend ([`crate::backends::wgpu`])
//! and the native Vulkan backend ([`crate::backends::vulkan`]): one impl, one metadata
//! builder and one kernel-specialisation policy, generic over the runtime that runs the
//! family's modules ([`WgslRuntime`](crate::device::wgsl::WgslRuntime)), as the CUDA family's
//! backends share `cuda_family`. Each backend's files name these for its runtime.
//!
//! Kernels: `reshape_and_cache` (−1 slots skipped, fp8 packed four per word and bit-exact
//! with `src/fp8.rs`), one paged-attention kernel with online softmax for every batch shape
//! (decode tiles with split-KV partials merged by `combine_splits`, prefill tiles without),
//! and `merge_attn_states` for [`crate::ops::merge_attn_states`]. Everything computes in f32
//! unless the device has f16 shaders; f16, bf16 and fp8 are unpacked from u32 words, so no
//! device feature is required. The subgroup softmax is used when the device has subgroup
//! operations. Prefill tiles take one of four forms ([`PrefillForm`]), the best that can run
//! the layer: cooperative matrix (`shaders/paged_attention_coop.wgsl`: both products on tensor
//! cores, f32 softmax; f16 layers with an f16 cache on devices that offer 16 × 16 × 16
//! f16 / f32 matrices), fused softmax f16 (f16 tiles and packed f16 FMAs, f32 softmax; f16
//! layers on devices with f16 shaders), fused softmax (register-prefetched K/V, softmax fused
//! into the score phase, fewer barriers) and three phase (what every device runs, and the
//! decode tiles). Every knob of the family is a field of [`WgpuTuning`] (docs/TUNING.md).
//!
//! Graph capture ([`graph_metadata`]): on a runtime that captures submissions (Vulkan), the
//! builder's graph mode keeps the metadata in persistent buffers with fixed-layout work
//! lists, so a captured decode forward replays for every later step of its batch shape; the
//! level is `UniformSingleTokenDecode` there and `Never` on wgpu.
//!
//! MLA ([`WgslMlaBackend`], [`WgslMlaAttentionImpl`]): the latent decode `mla_decode.wgsl`
//! with split-KV and `mla_combine.wgsl` (`forward_mqa`), the expanded prefill chunk by chunk
//! — `mla_gather.wgsl`, the `kv_b_proj` GEMM of `model_ops_linear.wgsl`, `mla_prefill.wgsl`
//! (`forward_mha`) — and `mla_cache_write.wgsl` (`do_kv_cache_update`), all in f32, on the
//! GPU MLA builder's metadata ([`crate::backends::mla_batch`]).

mod attention_impl;
pub mod descriptor;
pub mod graph_metadata;
pub mod layer_shaders;
mod metadata_builder;
mod mla_descriptor;
mod mla_impl;
mod mla_recording;
pub mod tuning;

pub use attention_impl::{WgslAttentionImpl, WgslPlanKernels, WgslRecording, MAX_HEAD_SIZE};
pub use descriptor::{
    wgsl_capabilities, wgsl_combination_veto, wgsl_kv_cache_shape, WgslBackend, WgslBackendRuntime,
};
pub use layer_shaders::{merge_attn_states, prefill_tile_fits, tiles_for, LayerShaders};
pub use metadata_builder::{
    plan_graph_lists, plan_lists, Plan, PlanKey, PlanLists, WgslAttentionMetadata,
    WgslMetadataBuilder, WorkList,
};
pub use mla_descriptor::WgslMlaBackend;
pub use mla_impl::WgslMlaAttentionImpl;
pub use tuning::{PrefillForm, WgpuTuning};
