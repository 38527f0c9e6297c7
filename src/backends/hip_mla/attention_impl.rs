//! The HIP MLA impl: the family's MLA impl ([`crate::backends::cuda_family_mla`]) on the
//! HIP runtime (`super::kernels` says how it allocates, resolves tensors and launches).

use crate::backends::cuda_family_mla::CudaFamilyMlaImpl;
use crate::device::HipDevice;

/// The HIP MLA impl of one layer: `forward_mqa` (the portable latent decode), `forward_mha`
/// (the expanded prefill, chunk by chunk), `do_kv_cache_update` (`concat_and_cache_mla`).
pub type HipMlaAttentionImpl = CudaFamilyMlaImpl<HipDevice>;
