//! The wgpu MLA backend's metadata builder: the GPU MLA builder
//! ([`crate::backends::mla_batch`]) on the backend's wgpu device — `CPU_MLA`'s decode /
//! prefill split (decodes first, one query length up to 128) and device copies of the
//! batch arrays.

use crate::backends::mla_batch::{MlaBatchBuilder, MlaBatchMetadata};

/// What the wgpu MLA kernels consume for one batch.
pub type WgpuMlaMetadata = MlaBatchMetadata;

/// Builds [`WgpuMlaMetadata`].
pub type WgpuMlaMetadataBuilder = MlaBatchBuilder;
