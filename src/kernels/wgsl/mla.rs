//! The MLA kernels' specialisations ([`MlaShader`]): the latent cache write
//! (`mla_cache_write.wgsl`), the latent-space decode and its split merge (`mla_decode.wgsl`,
//! `mla_combine.wgsl`), and the expanded prefill's latent gather and chunked attention
//! (`mla_gather.wgsl`, `mla_prefill.wgsl`; the `kv_b_proj` expansion between them is the
//! model operations' tiled GEMM, [`super::ModelShader::LinearTiled`]).
//!
//! The decode and prefill kernels share one thread layout: [`MLA_ROWS`] query rows (decode)
//! or tokens (prefill) per workgroup, [`MLA_LANES`] threads per row splitting its vec4
//! columns, and a step of `keys` positions staged in workgroup memory; `keys` is the largest
//! of [`MLA_KEY_STEPS`] whose workgroup memory fits the adapter (and, for the decode, that
//! divides the block size, so a step never crosses a block).

use crate::dtype::DType;

use super::bindings::Bindings;
use super::preprocess::{
    buffer, cache_binding, cache_reader, consts, short, storage_type, Access, CacheChunks,
};
use super::sources::{COMMON, MLA_CACHE_WRITE, MLA_COMBINE, MLA_DECODE, MLA_GATHER, MLA_PREFILL};

/// Threads that share one query row's columns.
pub const MLA_LANES: u32 = 16;

/// Query rows (decode) or tokens (prefill) per workgroup.
pub const MLA_ROWS: u32 = 16;

/// Threads per workgroup of the decode and prefill kernels.
pub const MLA_WORKGROUP: u32 = MLA_ROWS * MLA_LANES;

/// Positions per step the decode and prefill kernels can take, best first.
pub const MLA_KEY_STEPS: [u32; 3] = [8, 4, 2];

/// Threads per workgroup of the cache write, gather and combine kernels.
pub const MLA_ELEMENTWISE_WORKGROUP: u32 = 64;

/// The latent-space decode (`mla_decode.wgsl`) for one layer shape and dtype pairing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MlaDecodeShader {
    /// Elements of a latent, `kv_lora_rank + rope` (a multiple of 4).
    pub latent_dim: u32,
    /// Value elements, `kv_lora_rank` (a multiple of 4, < `latent_dim`).
    pub kv_lora_rank: u32,
    /// Positions per step.
    pub keys: u32,
    /// dtype of the queries and of the output (unless `split`).
    pub q_dtype: DType,
    /// dtype the cache stores.
    pub cache_dtype: DType,
    /// Writes f32 split partials for `mla_combine.wgsl` instead of the output.
    pub split: bool,
}

impl MlaDecodeShader {
    /// Workgroup memory of a step of `keys` positions of `latent_dim`-wide latents.
    pub fn shared_bytes_for(latent_dim: u32, keys: u32) -> u32 {
        (keys * latent_dim / 4) * 16 + MLA_WORKGROUP * keys * 4 + MLA_ROWS * keys * 4
    }

    /// Its workgroup memory.
    pub fn shared_bytes(&self) -> u32 {
        Self::shared_bytes_for(self.latent_dim, self.keys)
    }

    /// The positions per step for `latent_dim` within `limit` bytes of workgroup memory,
    /// dividing `block_size`; `None` when no step fits.
    pub fn keys_for(latent_dim: u32, block_size: u32, limit: u32) -> Option<u32> {
        MLA_KEY_STEPS.into_iter().find(|&k| {
            block_size.is_multiple_of(k) && Self::shared_bytes_for(latent_dim, k) <= limit
        })
    }

    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        self.key_for(CacheChunks::ONE)
    }

    /// The key of [`MlaDecodeShader::source_for`].
    pub fn key_for(&self, cache_chunks: CacheChunks) -> String {
        cache_chunks.key(format!(
            "mla decode d{} l{} k{} q {} kv {}{}",
            self.latent_dim,
            self.kv_lora_rank,
            self.keys,
            short(self.q_dtype),
            short(self.cache_dtype),
            if self.split { " split" } else { "" }
        ))
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        self.source_for(CacheChunks::ONE)
    }

    /// The module for a latent cache bound as `cache_chunks` says.
    pub fn source_for(&self, cache_chunks: CacheChunks) -> String {
        let d4 = self.latent_dim / 4;
        let l4 = self.kv_lora_rank / 4;
        let mut s = format!("// generated: {}\n", self.key_for(cache_chunks));
        s += cache_chunks.enable();
        s += &consts(&[
            ("D4", d4),
            ("L4", l4),
            ("ROWS", MLA_ROWS),
            ("LANES", MLA_LANES),
            ("WG", MLA_WORKGROUP),
            ("KEYS", self.keys),
            ("QV", d4.div_ceil(MLA_LANES)),
            ("VV", l4.div_ceil(MLA_LANES)),
        ]);
        s += &format!("const SPLIT: bool = {};\n", self.split);
        s += &buffer("q", 1, self.q_dtype, Access::Read);
        s += &cache_reader("cache", 2, self.cache_dtype, cache_chunks);
        let out = if self.split { DType::F32 } else { self.q_dtype };
        s += &buffer("out", 5, out, Access::Write);
        s += COMMON;
        s += MLA_DECODE;
        s
    }
}

/// The chunked expanded prefill attention (`mla_prefill.wgsl`) for one layer shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MlaPrefillShader {
    /// Query / key dims without RoPE `P` (a multiple of 4).
    pub qk_nope: u32,
    /// RoPE dims `R` (a multiple of 4).
    pub rope: u32,
    /// Value dims `V` (a multiple of 4).
    pub v_dim: u32,
    /// Positions per step.
    pub keys: u32,
    /// dtype of the queries and the output.
    pub dtype: DType,
}

impl MlaPrefillShader {
    /// Workgroup memory of a step of `keys` positions.
    pub fn shared_bytes_for(qk_nope: u32, rope: u32, v_dim: u32, keys: u32) -> u32 {
        keys * ((qk_nope + rope) / 4 + v_dim / 4) * 16
            + MLA_WORKGROUP * keys * 4
            + MLA_ROWS * keys * 4
    }

    /// The positions per step within `limit` bytes of workgroup memory; `None` when no
    /// step fits.
    pub fn keys_for(qk_nope: u32, rope: u32, v_dim: u32, limit: u32) -> Option<u32> {
        MLA_KEY_STEPS
            .into_iter()
            .find(|&k| Self::shared_bytes_for(qk_nope, rope, v_dim, k) <= limit)
    }

    /// Its workgroup memory.
    pub fn shared_bytes(&self) -> u32 {
        Self::shared_bytes_for(self.qk_nope, self.rope, self.v_dim, self.keys)
    }

    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        format!(
            "mla prefill p{} r{} v{} k{} {}",
            self.qk_nope,
            self.rope,
            self.v_dim,
            self.keys,
            short(self.dtype)
        )
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        let qk4 = (self.qk_nope + self.rope) / 4;
        let (p4, v4, r4) = (self.qk_nope / 4, self.v_dim / 4, self.rope / 4);
        let mut s = format!("// generated: {}\n", self.key());
        s += &consts(&[
            ("QK4", qk4),
            ("P4", p4),
            ("V4", v4),
            ("R4", r4),
            ("KW4", p4 + v4),
            ("TOKS", MLA_ROWS),
            ("LANES", MLA_LANES),
            ("WG", MLA_WORKGROUP),
            ("KEYS", self.keys),
            ("QKV", qk4.div_ceil(MLA_LANES)),
            ("VVP", v4.div_ceil(MLA_LANES)),
        ]);
        s += &buffer("q", 1, self.dtype, Access::Read);
        s += &buffer("out", 6, self.dtype, Access::Write);
        s += COMMON;
        s += MLA_PREFILL;
        s
    }
}

/// One specialisation of the WGSL family's MLA kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MlaShader {
    /// `concat_and_cache_mla` (`mla_cache_write.wgsl`).
    CacheWrite {
        /// dtype of `kv_c` and `k_pe`.
        act_dtype: DType,
        /// dtype the cache stores.
        cache_dtype: DType,
    },
    /// A prefill chunk's latents as f32 rows (`mla_gather.wgsl`).
    Gather {
        /// dtype of the new tokens' `kv_c` and `k_pe`.
        act_dtype: DType,
        /// dtype the cache stores.
        cache_dtype: DType,
    },
    /// The latent-space decode.
    Decode(MlaDecodeShader),
    /// The merge of the decode's split partials (`mla_combine.wgsl`).
    Combine {
        /// Value elements of a row, `kv_lora_rank`.
        kv_lora_rank: u32,
        /// dtype of the output.
        out_dtype: DType,
    },
    /// The expanded prefill attention.
    Prefill(MlaPrefillShader),
}

impl MlaShader {
    /// The binding set of its kernel.
    pub fn bindings(&self) -> Bindings {
        match self {
            MlaShader::CacheWrite { .. } => Bindings::MlaCacheWrite,
            MlaShader::Gather { .. } => Bindings::MlaGather,
            MlaShader::Decode(_) => Bindings::MlaDecode,
            MlaShader::Combine { .. } => Bindings::MlaCombine,
            MlaShader::Prefill(_) => Bindings::MlaPrefill,
        }
    }

    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        self.key_for(CacheChunks::ONE)
    }

    /// The key of [`MlaShader::source_for`].
    pub fn key_for(&self, cache_chunks: CacheChunks) -> String {
        let cache_chunks = self.chunks(cache_chunks);
        let key = match self {
            MlaShader::CacheWrite {
                act_dtype,
                cache_dtype,
            } => format!(
                "mla cache write {} -> {}",
                short(*act_dtype),
                short(*cache_dtype)
            ),
            MlaShader::Gather {
                act_dtype,
                cache_dtype,
            } => format!("mla gather {} / {}", short(*act_dtype), short(*cache_dtype)),
            MlaShader::Decode(d) => return d.key_for(cache_chunks),
            MlaShader::Combine {
                kv_lora_rank,
                out_dtype,
            } => format!("mla combine l{kv_lora_rank} {}", short(*out_dtype)),
            MlaShader::Prefill(p) => p.key(),
        };
        cache_chunks.key(key)
    }

    /// How this kernel binds the latent cache: `cache_chunks` for the kernels that read or
    /// write it, one buffer (unused) for the others.
    fn chunks(&self, cache_chunks: CacheChunks) -> CacheChunks {
        match self {
            MlaShader::CacheWrite { .. } | MlaShader::Gather { .. } | MlaShader::Decode(_) => {
                cache_chunks
            }
            MlaShader::Combine { .. } | MlaShader::Prefill(_) => CacheChunks::ONE,
        }
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        self.source_for(CacheChunks::ONE)
    }

    /// The module with the latent cache bound as `cache_chunks` says (the kernels that do
    /// not touch the cache ignore it).
    pub fn source_for(&self, cache_chunks: CacheChunks) -> String {
        let cache_chunks = self.chunks(cache_chunks);
        let mut s = format!("// generated: {}\n", self.key_for(cache_chunks));
        s += cache_chunks.enable();
        match *self {
            MlaShader::CacheWrite {
                act_dtype,
                cache_dtype,
            } => {
                s += &consts(&[("WG", MLA_ELEMENTWISE_WORKGROUP)]);
                s += &buffer("kv_c", 1, act_dtype, Access::Read);
                s += &buffer("k_pe", 2, act_dtype, Access::Read);
                s += &cache_binding(
                    "cache",
                    4,
                    storage_type(cache_dtype),
                    4,
                    cache_chunks,
                    Some(cache_dtype),
                );
                s += COMMON;
                s += MLA_CACHE_WRITE;
            }
            MlaShader::Gather {
                act_dtype,
                cache_dtype,
            } => {
                s += &consts(&[("WG", MLA_ELEMENTWISE_WORKGROUP)]);
                s += &buffer("kv_c", 1, act_dtype, Access::Read);
                s += &buffer("k_pe", 2, act_dtype, Access::Read);
                s += &cache_reader("cache", 3, cache_dtype, cache_chunks);
                s += COMMON;
                s += MLA_GATHER;
            }
            MlaShader::Decode(d) => return d.source_for(cache_chunks),
            MlaShader::Combine {
                kv_lora_rank,
                out_dtype,
            } => {
                s += &consts(&[("WG", MLA_ELEMENTWISE_WORKGROUP), ("L4", kv_lora_rank / 4)]);
                s += &buffer("part", 1, DType::F32, Access::Read);
                s += &buffer("out", 3, out_dtype, Access::Write);
                s += COMMON;
                s += MLA_COMBINE;
            }
            MlaShader::Prefill(p) => return p.source(),
        }
        s
    }

    /// A representative set for the translation tests: every dtype pairing of the cache
    /// write, the gather, the decode (both outputs) and the combine at DeepSeek's 512 + 64,
    /// the 256 + 64 latent, every step length, and the prefill in every activation dtype.
    pub fn catalog() -> Vec<MlaShader> {
        let acts = [DType::F32, DType::F16, DType::Bf16];
        let mut v = Vec::new();
        for act in acts {
            let caches = [act, DType::Fp8E4m3];
            for cache in caches {
                v.push(MlaShader::CacheWrite {
                    act_dtype: act,
                    cache_dtype: cache,
                });
                v.push(MlaShader::Gather {
                    act_dtype: act,
                    cache_dtype: cache,
                });
                for split in [false, true] {
                    v.push(MlaShader::Decode(MlaDecodeShader {
                        latent_dim: 576,
                        kv_lora_rank: 512,
                        keys: 8,
                        q_dtype: act,
                        cache_dtype: cache,
                        split,
                    }));
                }
            }
            v.push(MlaShader::Combine {
                kv_lora_rank: 512,
                out_dtype: act,
            });
            v.push(MlaShader::Prefill(MlaPrefillShader {
                qk_nope: 128,
                rope: 64,
                v_dim: 128,
                keys: 8,
                dtype: act,
            }));
        }
        for keys in MLA_KEY_STEPS {
            v.push(MlaShader::Decode(MlaDecodeShader {
                latent_dim: 320,
                kv_lora_rank: 256,
                keys,
                q_dtype: DType::Bf16,
                cache_dtype: DType::Bf16,
                split: keys == 4,
            }));
            v.push(MlaShader::Prefill(MlaPrefillShader {
                qk_nope: 64,
                rope: 32,
                v_dim: 64,
                keys,
                dtype: DType::F16,
            }));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_fit_and_divide_the_block() {
        // DeepSeek's latent: 8 positions in 32 KiB (lavapipe) and 48 KiB (the H200).
        assert_eq!(MlaDecodeShader::keys_for(576, 64, 32 * 1024), Some(8));
        assert_eq!(MlaDecodeShader::keys_for(576, 32, 16 * 1024), Some(4));
        assert_eq!(MlaDecodeShader::keys_for(576, 4, 48 * 1024), Some(4));
        assert_eq!(MlaDecodeShader::keys_for(576, 1, 48 * 1024), None);
        assert_eq!(MlaDecodeShader::keys_for(576, 64, 1024), None);
        assert_eq!(MlaPrefillShader::keys_for(128, 64, 128, 16 * 1024), Some(4));
        for s in MlaShader::catalog() {
            if let MlaShader::Decode(d) = s {
                assert!(d.shared_bytes() <= 32 * 1024, "{}", d.key());
            }
        }
    }
}
