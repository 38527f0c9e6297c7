//! The backends, one folder per device family, each with the same files:
//!
//! - `descriptor.rs` — the [`crate::AttentionBackend`] descriptor (name, capabilities,
//!   availability, KV-cache shape);
//! - `metadata_builder.rs` — the [`crate::AttentionMetadataBuilder`] and the metadata type its
//!   kernels consume;
//! - `attention_impl.rs` — the [`crate::AttentionImpl`]: argument checks, then kernel launches;
//! - `kernels/` — the kernels themselves (CPU), or `kernels.rs`, the backend's thin glue to
//!   its kernel family and runtime (GPU backends).
//!
//! A GPU backend's kernels are a family in [`crate::kernels`] (sources, specialisation,
//! parameter blocks, knobs) run by a runtime in [`crate::device`] (compile, cache, launch);
//! the backend chooses which kernel runs which work, and neither family nor runtime imports
//! anything from here.

pub mod cpu;
pub mod cpu_mla;
pub mod cuda;
pub(crate) mod cuda_family;
pub mod cuda_family_mla;
pub mod cuda_mla;
pub mod hip;
pub mod hip_mla;
pub mod mla_batch;
pub mod vulkan;
pub mod vulkan_mla;
pub mod wgpu;
pub mod wgpu_mla;
pub mod wgsl_family;
