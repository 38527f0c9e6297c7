//! # polyattn
//!
//! One attention layer for Rust inference engines, with native kernels for every GPU API and
//! the CPU: the Rust counterpart of vLLM's `AttentionBackend` layer (v0.25.1).
//!
//! The layers, top to bottom (see `ARCHITECTURE.md` in the repository):
//!
//! - **model code** holds one [`Attention`] per model layer and calls its `forward`; the
//!   operations around attention (embedding, RMSNorm, linear, RoPE, SiLU·mul, residual add)
//!   run on the same device through [`compute`], and [`runner::ModelRunner`] drives a model
//!   ([`runner::CausalLm`]) with a paged KV cache and continuous batching
//!   (`examples/generate` is a complete Llama);
//! - the **abstraction**: backend descriptors ([`AttentionBackend`]), per-batch metadata
//!   ([`CommonAttentionMetadata`] → [`AttentionMetadataBuilder`]), impls ([`AttentionImpl`],
//!   [`MlaAttentionImpl`]), the [`registry`] and the [`selector`];
//! - **backends** in [`backends`], one folder per device family, all of the same shape;
//! - **devices** in [`device`]: [`Device`] and [`Tensor`];
//! - the f64 [`reference`](mod@reference) every backend is tested against.
//!
//! ```
//! use polyattn::*;
//!
//! // Pick a backend for a Llama-style layer (POLYATTN_BACKEND=cpu forces one).
//! let config = SelectorConfig::new(128, DType::F32, CacheDType::Auto);
//! let backend = selector::get_attn_backend(&config)?;
//! println!("running on {}", backend.name());
//! # Ok::<(), polyattn::Error>(())
//! ```

#![warn(missing_docs)]

pub mod attention;
pub mod backend;
pub mod backends;
pub mod bench;
pub mod compute;
pub mod device;
pub mod dtype;
pub mod error;
pub mod fp8;
pub mod kv_cache;
pub mod metadata;
pub mod ops;
pub mod reference;
pub mod registry;
pub mod runner;
pub mod selector;
pub mod testing;

/// The README's code blocks, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub use attention::{Attention, AttentionImpl, AttentionLayer, AttentionParams, MlaAttentionImpl};
pub use backend::{
    AttentionBackend, AttentionType, Availability, BackendCapabilities, BackendRef, BlockSize,
    DeviceCapability, GraphCaptureSupport, HeadSizes, KvLayout, Reason, SelectorConfig,
};
pub use device::{Device, DeviceKind, Tensor};
pub use dtype::{CacheDType, DType};
pub use error::{Error, Result};
pub use kv_cache::{BlockPool, KvCache, KvCacheSpec};
pub use metadata::{
    AttentionMetadata, AttentionMetadataBuilder, BatchDescription, CommonAttentionMetadata,
    DecodePrefillSplit, PAD_SLOT_ID,
};
