//! The CPU MLA backend (`CPU_MLA`): multi-head latent attention on the host, the MLA
//! counterpart of the `CPU` backend (vLLM keeps MLA backends apart from the standard ones, as
//! `TRITON_MLA` is from `TRITON_ATTN`).
//!
//! Same shape as every backend: [`CpuMlaBackend`] (descriptor: `is_mla`, head sizes 320 and
//! 576, block sizes multiple of 16, decoder only), [`CpuMlaMetadataBuilder`] (decodes first:
//! requests of one query length up to 128), [`CpuMlaAttentionImpl`] (`forward_mqa` on the
//! decodes with the latent-space kernel `mla_decode`, `forward_mha` on the prefills with the
//! expanded kernel `mla_prefill`, both in `backends::cpu::kernels`). The latent cache is a
//! [`crate::mla::MlaKvCache`], written by [`crate::mla::concat_and_cache_mla`].

mod attention_impl;
mod descriptor;
mod metadata_builder;

pub use attention_impl::CpuMlaAttentionImpl;
pub use descriptor::CpuMlaBackend;
pub use metadata_builder::{CpuMlaMetadata, CpuMlaMetadataBuilder};
