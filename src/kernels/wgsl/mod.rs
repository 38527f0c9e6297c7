//! The WGSL kernel family: every pipeline the wgpu runtime compiles is one of the shaders in
//! `shaders/*.wgsl`, specialised by a generated header. This module generates the modules;
//! compiling them (naga, wgpu, the SPIR-V patch of the coop form), caching and dispatching
//! them is the runtime's (`crate::device::wgpu`), choosing which to run the backend's.
//!
//! **The header** holds the compile-time constants (head size, tile shape, workgroup size)
//! and the typed accessors of every buffer whose element type varies: `<name>_load4(e)`
//! returns the four elements starting at element `e` (a multiple of 4) as `vec4<f32>`, and
//! `<name>_store4(e, v)` (or `(e, v, scale)` for a cache) writes four.
//!
//! **Layout conventions.** f32 buffers are `array<vec4<f32>>`; f16 and bf16 buffers are
//! `array<vec2<u32>>` (two elements per u32, unpacked with integer arithmetic, so no adapter
//! feature is needed); fp8 buffers are `array<u32>` (four elements per u32). Every access
//! therefore touches whole 32-bit words owned by one thread: no two threads ever write halves
//! of the same word. The one exception is the tiled2h prefill form of the attention kernel
//! ([`Tiled2::half`]), which needs `SHADER_F16`: it binds an f16 KV source as
//! `array<vec4<f16>>` (still whole words of one thread) and is the only module that says
//! `enable f16;`. Each kernel's bindings are fixed per kernel ([`Bindings`]), so every
//! variant of a kernel binds the same buffers.
//!
//! **Specialisations** are plain values ([`AttentionShader`], [`DecodeShader`],
//! [`CombineShader`], [`ReshapeShader`], [`MergeShader`], [`ProbeShader`], [`ModelShader`],
//! [`MlaShader`]);
//! each one's `key()` names the compiled pipeline in the runtime's cache and its `source()`
//! is the complete WGSL module.
//!
//! The files, one purpose each:
//!
//! - `sources`: the embedded `shaders/*.wgsl`;
//! - `preprocess`: typed accessors, header constants, [`unroll`] and the coop form's
//!   matrix scalarisation;
//! - [`tiles`]: tile sizing policy ([`choose_tile`], the workgroup-memory formulas, register
//!   blocking, the coop form's shapes and subgroup split);
//! - [`attention`]: the attention, split-KV decode and combine kernels;
//! - [`elementwise`]: the cache write, `merge_attn_states` and the benchmark probes;
//! - [`mla`]: the MLA kernels (latent cache write, latent decode and its split merge, the
//!   expanded prefill's gather and chunked attention);
//! - [`model_ops`]: the model operations' kernels (`crate::compute`);
//! - [`bindings`]: the binding set of each kernel;
//! - [`catalog`](mod@catalog): representative sets of every specialisation, for the translation tests;
//! - [`tuning`]: the family's knobs ([`WgpuTuning`], [`PrefillForm`]).
//!
//! Everything public is re-exported here, so `kernels::wgsl::AttentionShader` and
//! `kernels::wgsl::attention::AttentionShader` name the same item.

pub mod attention;
pub mod bindings;
pub mod catalog;
pub mod elementwise;
pub mod mla;
pub mod model_ops;
mod preprocess;
mod sources;
pub mod tiles;
pub mod tuning;

pub use attention::*;
pub use bindings::*;
pub use catalog::*;
pub use elementwise::*;
pub use mla::*;
pub use model_ops::*;
pub use preprocess::{unroll, CacheChunks};
pub use tiles::*;
pub use tuning::*;
