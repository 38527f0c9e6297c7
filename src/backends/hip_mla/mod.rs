//! The HIP MLA backend (`HIP_MLA`): multi-head latent attention on AMD GPUs with the CUDA
//! kernel family's portable MLA kernels, compiled at run time by hiprtc for the GPU's own
//! target — the AMD counterpart of `CUDA_MLA`, sharing its impl
//! ([`crate::backends::cuda_family_mla`]).
//!
//! Same shape as every backend: [`HipMlaBackend`] (descriptor: `is_mla`, head size 576,
//! block sizes 32 and 64, f16 / bf16 with a same-dtype or E4M3 latent cache),
//! [`HipMlaMetadataBuilder`] (decodes first: requests of one query length up to 128; device
//! copies of the batch arrays), [`HipMlaAttentionImpl`] (`forward_mqa`: the portable latent
//! decode `mla_decode.cu` with split-KV and `mla_combine`; `forward_mha`: the expanded
//! prefill chunk by chunk — latent gather, the `kv_b_proj` GEMM of `model_linear.cu`,
//! `mla_prefill.cu`; `do_kv_cache_update`: `concat_and_cache_mla`) and [`kernels`] (what the
//! shared impl needs of the HIP runtime).
//!
//! **Nothing here has run on AMD hardware**: the machine this was written on has no AMD GPU.
//! The kernels are compile-checked for gfx90a, gfx942, gfx1030 and gfx1100
//! (`tests/hip_compile.rs`); the impl, the launches and the portable decode are the ones
//! `CUDA_MLA` runs (with `POLYATTN_CUDA_MLA_DECODE=portable` for the decode), so they have run
//! through the shared MLA test body on an NVIDIA GPU; only this backend's "unavailable" path
//! has run as `HIP_MLA`. The decode runs on the vector ALUs (no MFMA / WMMA form yet).

mod attention_impl;
mod descriptor;
pub mod kernels;
mod metadata_builder;

pub use attention_impl::HipMlaAttentionImpl;
pub use descriptor::HipMlaBackend;
pub use metadata_builder::{HipMlaMetadata, HipMlaMetadataBuilder};
