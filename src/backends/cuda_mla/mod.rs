//! The CUDA MLA backend (`CUDA_MLA`): multi-head latent attention on NVIDIA GPUs with the
//! CUDA family's MLA kernels, the GPU counterpart of `CPU_MLA` (vLLM's FlashMLA /
//! FlashInfer-MLA slot).
//!
//! Same shape as every backend: [`CudaMlaBackend`] (descriptor: `is_mla`, head size 576,
//! block sizes 32 and 64, f16 / bf16 with a same-dtype or E4M3 latent cache, compute
//! capability 8.0+), [`CudaMlaMetadataBuilder`] (decodes first: requests of one query length
//! up to 128; device copies of the batch arrays), [`CudaMlaAttentionImpl`] (the CUDA family's
//! MLA impl, shared with `HIP_MLA`: `forward_mqa`, the tensor-core latent decode
//! `mla_decode_mma.cu` with split-KV and `mla_combine` — or the portable `mla_decode.cu`
//! under `POLYATTN_CUDA_MLA_DECODE=portable`; `forward_mha`, the expanded prefill chunk by
//! chunk — latent gather, the `kv_b_proj` GEMM of `model_linear.cu`, `mla_prefill.cu`;
//! `do_kv_cache_update`, `concat_and_cache_mla`) and [`kernels`] (what that impl needs of the
//! CUDA runtime).

mod attention_impl;
mod descriptor;
pub mod kernels;
mod metadata_builder;

pub use attention_impl::CudaMlaAttentionImpl;
pub use descriptor::CudaMlaBackend;
pub use metadata_builder::{CudaMlaMetadata, CudaMlaMetadataBuilder};
