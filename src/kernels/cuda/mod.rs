//! The CUDA C++ kernel family: the kernels of `kernels-cuda/` and everything that describes
//! them without compiling or launching them. Compiling (NVRTC, the module cache, the on-disk
//! cubin cache) and launching are the CUDA runtime's (`crate::device::cuda`); which kernel
//! runs which request is the CUDA backend's.
//!
//! Nothing here names a `cudarc` type: a source is text plus the `-D` options of a variant,
//! a parameter block is plain `#[repr(C)]` bytes, so the HIP runtime compiles the same
//! family with hiprtc. `portability.cuh` holds what differs between the compilers
//! (`PA_NVIDIA` / `PA_AMD`, the warp / wavefront width `PA_WAVE`, shuffles, launch bounds).
//!
//! **Conventions of the family.** Every source includes `common.cuh` (which includes
//! `portability.cuh`), which [`full_source`] pastes in place of its include line (no include path, no toolkit header).
//! Element types travel as integer codes ([`dtype_code`]: `PA_F32` … in `common.cuh`), so one
//! build serves every dtype of a kernel; the variants a build selects are `-D` options
//! ([`attention_variant`], [`mma_variant`], [`decode_variant`]), each with its entry point
//! name. Every kernel takes one parameter block by value, whose `#[repr(C)]` mirror lives
//! here with its size asserted on both sides ([`params`], [`model_ops`]).
//!
//! The files, one purpose each:
//!
//! - [`sources`]: the embedded sources and their entry points ([`KernelSource`]);
//! - [`variants`]: `-D` options, entry-point names, dtype codes;
//! - [`shapes`]: threads, rows and keys per CTA, tensor-core CTA shapes, shared memory;
//! - [`params`]: the attention kernels' parameter blocks;
//! - [`attn_pass`]: one attention pass's parameter block from plain values, for every
//!   runtime;
//! - [`reshape`]: the cache write's parameter block, checks and launch shape, for every
//!   runtime;
//! - [`merge`]: the LSE merge's parameter block, entry point and launch shape, for every
//!   runtime;
//! - [`mla`]: the MLA kernels' parameter blocks, the decode's CTA shapes, shared memory and
//!   split policy;
//! - [`model_ops`]: the model operations' launch constants and parameter blocks;
//! - [`tuning`]: the family's knobs ([`CudaTuning`]);
//! - [`amd`]: the AMD targets, their wavefront widths and the variants an AMD device
//!   requests (the portable sources, `PA_AMD` in `portability.cuh`).
//!
//! Everything public is re-exported here, so `kernels::cuda::AttnParams` and
//! `kernels::cuda::params::AttnParams` name the same item.

pub mod amd;
pub mod attn_pass;
pub mod merge;
pub mod mla;
pub mod model_ops;
pub mod params;
pub mod reshape;
pub mod shapes;
pub mod sources;
pub mod tuning;
pub mod variants;

pub use amd::*;
pub use attn_pass::*;
pub use merge::*;
pub use mla::*;
pub use model_ops::*;
pub use params::*;
pub use reshape::*;
pub use shapes::*;
pub use sources::*;
pub use tuning::*;
pub use variants::*;
