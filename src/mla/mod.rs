//! Multi-head latent attention (DeepSeek-V2 / V3; vLLM's `MLAAttention`): the layer's sizes
//! ([`MlaParams`]), the weight absorption that lets decode run in latent space
//! ([`absorb_kv_b_proj`]), the latent KV cache and its write ([`MlaKvCache`],
//! [`concat_and_cache_mla`]), and the f64 reference of both paths ([`mod@reference`]).
//!
//! The cache holds one `kv_lora_rank + qk_rope_head_dim`-wide latent per token
//! (`[kv_c | k_pe]`, 512 + 64 = 576 in DeepSeek-V3), shape `[num_blocks, block_size, 576]`.
//! Decode (`forward_mqa`) is MQA in latent space: the query's no-RoPE part is multiplied by
//! `W_UK` (absorbed), giving a 576-wide query against the cached latents; the values are the
//! first `kv_lora_rank` dims; the output `[B, N, kv_lora_rank]` is up-projected by `W_UV`.
//! Prefill (`forward_mha`) expands the latents to per-head keys (`qk_nope + rope` = 192) and
//! values (`v_head_dim` = 128) and runs causal MHA.

pub mod cache;
pub mod params;
pub mod reference;
pub mod weights;

pub use cache::{concat_and_cache_mla, MlaKvCache};
pub use params::MlaParams;
pub use weights::{absorb_kv_b_proj, AbsorbedWeights};
