//! The kernel families: each GPU language's kernels as sources plus everything that describes
//! them without running them — preprocessing and specialisation, the variants a build
//! selects, the parameter blocks the kernels read, tile and launch-shape policy, and the
//! family's tuning knobs.
//!
//! A family knows nothing of the runtime that compiles and launches it (`crate::device`) nor
//! of the backends that plan work for it (`crate::backends`): it depends only on the plain
//! contracts below it (dtypes, errors), and it names no runtime crate (no `cudarc`, `wgpu` or
//! `naga` type). So one family can serve several runtimes — the CUDA C++ family is plain text
//! and `-D` options that NVRTC compiles and hiprtc could — and the `layering` test in
//! `lib.rs` checks both rules.
//!
//! - [`cuda`]: the CUDA C++ kernels of `kernels-cuda/` (compiled by the CUDA runtime in
//!   `crate::device::cuda`);
//! - [`wgsl`]: the WGSL kernels of `shaders/` and their generator (compiled by the wgpu
//!   runtime in `crate::device::wgpu`);
//! - `tuning_env`: the one parser of every tuning variable, shared by the families'
//!   `Tuning::from_env` and the runtimes' knobs.

pub mod cuda;
pub(crate) mod tuning_env;
pub mod wgsl;
