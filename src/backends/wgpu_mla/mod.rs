//! The wgpu MLA backend (`WGPU_MLA`): multi-head latent attention with the WGSL family's MLA
//! kernels through wgpu (Vulkan, Metal, DX12, GL), the portable counterpart of `CUDA_MLA`.
//!
//! Same shape as every backend: [`WgpuMlaBackend`] (descriptor: `is_mla`, head sizes 576 and
//! 320, block sizes multiples of 16, f32 / f16 / bf16 with a same-dtype or E4M3 latent
//! cache), [`WgpuMlaMetadataBuilder`] (the GPU MLA builder: decodes first, one query length
//! up to 128; the batch arrays on the device), [`WgpuMlaAttentionImpl`] (`forward_mqa`: the
//! latent decode `mla_decode.wgsl` with split-KV and `mla_combine.wgsl`; `forward_mha`: the
//! expanded prefill chunk by chunk — `mla_gather.wgsl`, the `kv_b_proj` GEMM of
//! `model_ops_linear.wgsl`, `mla_prefill.wgsl`; `do_kv_cache_update`:
//! `mla_cache_write.wgsl`) and [`kernels`] (recording their dispatches). Everything computes
//! in f32 on every adapter; no adapter feature is required.

mod attention_impl;
mod descriptor;
pub mod kernels;
mod metadata_builder;

pub use attention_impl::WgpuMlaAttentionImpl;
pub use descriptor::WgpuMlaBackend;
pub use metadata_builder::{WgpuMlaMetadata, WgpuMlaMetadataBuilder};
