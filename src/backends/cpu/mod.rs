//! The CPU backend: paged attention in plain Rust, multithreaded with rayon, with inner loops
//! written so the compiler vectorises them (fixed-width accumulators over the head dimension).
//!
//! It runs everywhere and supports every feature of the contract (mixed batches, chunked
//! prefill, sliding window, ALiBi, soft cap, sinks, LSE, cascade, fp8 KV), so it is both the
//! last resort of the selector and the baseline the GPU backends are compared with.

mod attention_impl;
mod descriptor;
pub mod kernels;
mod metadata_builder;

pub use attention_impl::CpuAttentionImpl;
pub use descriptor::CpuBackend;
pub use metadata_builder::{CpuAttentionMetadata, CpuMetadataBuilder};
