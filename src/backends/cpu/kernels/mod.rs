//! CPU kernels. Each file opens with its algorithm, the layout it expects and the bounds it
//! relies on; all bounds are established by metadata validation and the impl's argument
//! checks, so the loops index without further checks beyond Rust's own.

pub mod convert;
pub mod merge_states;
pub mod mla_decode;
pub mod mla_latents;
pub mod mla_prefill;
pub mod paged_attention;
pub mod reshape_and_cache;
