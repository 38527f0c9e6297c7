//! The backends, one folder per device family, each with the same files:
//!
//! - `descriptor.rs` — the [`crate::AttentionBackend`] descriptor (name, capabilities,
//!   availability, KV-cache shape);
//! - `metadata_builder.rs` — the [`crate::AttentionMetadataBuilder`] and the metadata type its
//!   kernels consume;
//! - `attention_impl.rs` — the [`crate::AttentionImpl`]: argument checks, then kernel launches;
//! - `kernels/` — the kernels themselves (CPU) or the glue that compiles and launches them
//!   (GPU backends: `kernels-cuda/`, `kernels-hip/`, `shaders/`).

pub mod cpu;
pub mod cuda;
pub mod wgpu;
