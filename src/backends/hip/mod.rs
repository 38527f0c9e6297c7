//! The HIP backend: the CUDA kernel family's portable kernels (`kernels-cuda/`, built with
//! `PA_AMD`, see [`crate::kernels::cuda::amd`]) compiled at run time by hiprtc for the AMD
//! GPU's own target and launched through the HIP runtime ([`crate::device::hip`], loaded
//! dynamically: building needs no ROCm, and a machine without `libamdhip64` or an AMD GPU
//! reports the backend unavailable with the reason instead of failing).
//!
//! Same shape as the CUDA backend: [`HipBackend`] (descriptor), [`HipMetadataBuilder`]
//! (metadata and work lists from [`crate::plan::plan_work`]), [`HipAttentionImpl`] (the
//! forward driver's kernels, [`crate::forward::ForwardKernels`]) and [`kernels`] (one launch
//! function per kernel).
//!
//! What runs on AMD: `reshape_and_cache` (every cache dtype; fp8 e4m3 / e5m2 converted in
//! software) and, for every query-length band (decode and prefill alike), the CUDA-core
//! paged-attention kernel `paged_attention_dpl{ceil(D / wavefront)}` with online softmax
//! (causal and bidirectional, GQA, sliding window, ALiBi, soft cap, sinks, LSE, fp8 KV, head
//! sizes that are multiples of 8 up to 256), split-KV with `combine_splits`, exactly as the
//! CUDA backend's CUDA-core path, with `4 * wavefront` threads per CTA (the wavefront is the
//! device's, 64 on CDNA, 32 on RDNA). On targets with matrix cores
//! ([`crate::kernels::cuda::amd_matrix_cores`]: MFMA on gfx90a / gfx94x / gfx950, WMMA on
//! RDNA3), f16 / bf16 prefills of at least [`MATRIX_MIN_QUERY_LEN`] tokens with a same-dtype
//! cache at head sizes 64, 96 and 128 run on `kernels-hip/paged_attention_matrix.hip`
//! instead ([`HipKernel::Matrix`]). Cascade batches run as one full pass; no graph capture
//! (level `Never`). `merge_attn_states` on HIP tensors runs the family's merge kernel
//! (`crate::ops::merge_attn_states`).
//!
//! **Nothing here has run on AMD hardware**: the machine this was written on has no AMD GPU.
//! The kernels are compile-checked for the AMD targets (`tests/hip_compile.rs`), only the
//! "unavailable" path of this backend has been run, and the matrix-core kernel has run on an
//! NVIDIA GPU in its WMMA layout with the product emulated (`POLYATTN_CUDA_MMA=amd-wmma`).

mod attention_impl;
mod descriptor;
pub mod kernels;
mod metadata_builder;
pub mod probes;

pub use attention_impl::{HipAttentionImpl, HipKernel, MATRIX_MIN_QUERY_LEN};
pub use descriptor::HipBackend;
pub use metadata_builder::{HipAttentionMetadata, HipMetadataBuilder, HipPlan};
