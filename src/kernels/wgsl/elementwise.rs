//! The element-wise kernels' specialisations: [`ReshapeShader`] (`reshape_and_cache.wgsl`,
//! the cache write), [`MergeShader`] (`merge_attn_states.wgsl`) and [`ProbeShader`] (the
//! benchmark's copy and FMA ceilings). They take their sizes at run time, so one module per
//! dtype pairing serves every layer.

use crate::dtype::DType;

use super::preprocess::{buffer, cache_binding, consts, short, storage_type, Access, CacheChunks};
use super::sources::{COMMON, MERGE_ATTN_STATES, PROBE_COPY, PROBE_FMA, RESHAPE_AND_CACHE};

/// Threads per workgroup of the element-wise kernels (reshape, merge, combine).
pub const ELEMENTWISE_WORKGROUP: u32 = 64;

/// One specialisation of `reshape_and_cache.wgsl` (the head size is a run-time parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReshapeShader {
    /// dtype of the new keys and values.
    pub act_dtype: DType,
    /// dtype the cache stores.
    pub cache_dtype: DType,
}

impl ReshapeShader {
    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        self.key_for(CacheChunks::ONE)
    }

    /// The key of [`ReshapeShader::source_for`].
    pub fn key_for(&self, cache_chunks: CacheChunks) -> String {
        cache_chunks.key(format!(
            "reshape {} -> {}",
            short(self.act_dtype),
            short(self.cache_dtype)
        ))
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        self.source_for(CacheChunks::ONE)
    }

    /// The module for a cache bound as `cache_chunks` says.
    pub fn source_for(&self, cache_chunks: CacheChunks) -> String {
        let mut s = format!("// generated: {}\n", self.key_for(cache_chunks));
        s += cache_chunks.enable();
        s += &consts(&[("WG", ELEMENTWISE_WORKGROUP)]);
        s += &buffer("key", 1, self.act_dtype, Access::Read);
        s += &buffer("value", 2, self.act_dtype, Access::Read);
        s += &cache_binding(
            "cache",
            4,
            storage_type(self.cache_dtype),
            4,
            cache_chunks,
            Some(self.cache_dtype),
        );
        s += COMMON;
        s += RESHAPE_AND_CACHE;
        s
    }
}

/// One specialisation of `merge_attn_states.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MergeShader {
    /// dtype of the partial and merged outputs.
    pub dtype: DType,
}

impl MergeShader {
    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        format!("merge {}", short(self.dtype))
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        let mut s = format!("// generated: {}\n", self.key());
        s += &consts(&[("WG", ELEMENTWISE_WORKGROUP)]);
        s += &buffer("po", 1, self.dtype, Access::Read);
        s += &buffer("so", 3, self.dtype, Access::Read);
        s += &buffer("out", 5, self.dtype, Access::Write);
        s += COMMON;
        s += MERGE_ATTN_STATES;
        s
    }
}

/// The ceiling probes of `polyattn bench` (`probe_copy.wgsl`, `probe_fma.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeShader {
    /// A vec4 buffer copy (bandwidth).
    Copy,
    /// An f32 FMA loop (compute).
    Fma,
}

impl ProbeShader {
    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        match self {
            ProbeShader::Copy => "probe copy".into(),
            ProbeShader::Fma => "probe fma".into(),
        }
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        let body = match self {
            ProbeShader::Copy => PROBE_COPY,
            ProbeShader::Fma => PROBE_FMA,
        };
        format!("// generated: {}\n{COMMON}{body}", self.key())
    }
}
