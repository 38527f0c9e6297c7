//! The CUDA backend: CUDA C++ kernels from `kernels-cuda/`, compiled at run time by NVRTC for
//! the GPU's own architecture and launched through the CUDA driver API (cudarc, loaded
//! dynamically: building needs no CUDA, and a machine without a driver or NVRTC reports the
//! backend unavailable with the reason instead of failing).
//!
//! Same shape as the CPU backend: [`CudaBackend`] (descriptor), [`CudaMetadataBuilder`]
//! (metadata and work lists), [`CudaAttentionImpl`] (the forward driver's kernels,
//! [`crate::forward::ForwardKernels`]: which kernel takes each query-length band, queued on
//! the stream) and [`kernels`] (one launch function per kernel, the CTA-shape policy, the work
//! items). The kernels are the
//! CUDA family ([`crate::kernels::cuda`]: sources, variants, parameter blocks, launch shapes,
//! [`CudaTuning`]); compiling and launching them is the CUDA runtime's
//! ([`crate::device::cuda`]).
//!
//! What runs: `reshape_and_cache` (every cache dtype, fp8 bit-identical to [`crate::fp8`]);
//! one paged-attention kernel for mixed decode / prefill / chunked-prefill batches on CUDA
//! cores with online softmax (causal and bidirectional, GQA, sliding window, ALiBi, soft cap,
//! sinks, LSE, fp8 KV, head sizes that are multiples of 8 up to 256); split-KV with a
//! combine kernel; `merge_attn_states`; cascade as prefix pass + suffix pass + merge.
//! A tensor-core prefill kernel (mma.sync m16n8k16 through inline PTX, ldmatrix, cp.async;
//! f16 / bf16 with a same-dtype cache, head sizes 64 / 96 / 128; 64- or 128-row CTAs chosen
//! per batch; layers without soft cap and ALiBi get their own build, whose register budget
//! fits 64-key softmax steps at 128 rows) takes the requests with at least [`MMA_MIN_QUERY_LEN`] query tokens unless
//! `POLYATTN_CUDA_MMA=0`; a tensor-core split-KV decode kernel takes the single-token
//! requests, its splits merged inside it by each token's last CTA (no combine launch). Both
//! are on by default since they have passed the shared suite on hardware.
//!
//! On compute capability 9.0 (H100 / H200) the prefill band runs on the Hopper kernel instead
//! (`paged_attention_wgmma_ws.cu`: wgmma built for sm_90a, head sizes 64 and 128; a producer
//! warpgroup gathering K / V tiles into a ring of stages, two consumer warpgroups, mbarriers
//! between them); [`prefill_choice`] is the rule list that falls back to `mma.sync` and to
//! CUDA cores, and `polyattn info` prints it. Single-token decodes of f32 layers at head size
//! 64 run on a CUDA-core decode kernel (`paged_decode_cores.cu`).
//!
//! CUDA graphs: level `UniformSingleTokenDecode`. A forward over a batch of single-token
//! decodes, with metadata from `build_for_graph_capture` ([`CudaMetadataBuilder::build_graph`]),
//! can be recorded with [`crate::device::CudaDevice::capture`] and replayed for later steps
//! after the builder has rewritten the persistent buffers; see [`CudaMetadataBuilder`].

mod attention_impl;
mod descriptor;
pub mod kernels;
mod metadata_builder;
pub mod probes;

/// The CUDA family's knobs under the name the backend's files give them (`tuning::…`).
use crate::kernels::cuda::tuning;

// The planner caps a decode token's splits where the decode kernel's merge does.
const _: () = assert!(crate::plan::DECODE_MAX_SPLITS == crate::kernels::cuda::DECODE_MAX_SPLITS);

pub use attention_impl::{
    prefill_choice, CudaAttentionImpl, CudaKernel, CudaRecording, PrefillChoice, PrefillRule,
    MMA_MIN_QUERY_LEN,
};
pub use descriptor::CudaBackend;
pub use metadata_builder::{CudaAttentionMetadata, CudaMetadataBuilder, CudaPlan};
pub use tuning::{
    CudaTuning, CUDA_DEVICE_ENV, DECODE_ENV, DECODE_SPLITS_ENV, MMA_ENV, MMA_ROWS_ENV,
    MMA_SUBK_ENV, MMA_WARPS_ENV,
};
