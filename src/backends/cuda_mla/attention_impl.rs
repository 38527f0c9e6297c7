//! The CUDA MLA impl: the family's MLA impl ([`crate::backends::cuda_family_mla`]) on the
//! CUDA runtime (`super::kernels` says how it allocates, resolves tensors and launches).

use crate::backends::cuda_family_mla::CudaFamilyMlaImpl;
use crate::device::CudaDevice;

/// The CUDA MLA impl of one layer: `forward_mqa` (the tensor-core latent decode, or the
/// portable one under `POLYATTN_CUDA_MLA_DECODE=portable`), `forward_mha` (the expanded
/// prefill, chunk by chunk), `do_kv_cache_update` (`concat_and_cache_mla`).
pub type CudaMlaAttentionImpl = CudaFamilyMlaImpl<CudaDevice>;
