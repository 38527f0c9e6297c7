//! The family on AMD: which GPU targets the portable kernels are built for, the wavefront
//! width of each, and the variants an AMD device requests. Plain data: compiling them is the
//! HIP runtime's (hiprtc), checking them without a GPU is `tests/hip_compile.rs`'s (hipcc and
//! clang).
//!
//! The [`PORTABLE_SOURCES`] build for AMD: `reshape_and_cache`, the CUDA-core
//! `paged_attention` (prefill, decode and split-KV decode with its `combine_splits`),
//! `merge_states`, the linear layers (`model_linear`: the MLA prefill's `kv_b_proj`), and
//! MLA's portable latent decode with its combine (`mla_decode`), latent cache write and
//! gather (`mla_cache`) and expanded prefill (`mla_prefill`). AMD's own prefill, `kernels-hip/paged_attention_matrix.hip`
//! ([`PAGED_ATTENTION_MATRIX`]), runs on the targets with matrix cores ([`MatrixCores`]). The
//! tensor-core and `cp.async` kernels of `kernels-cuda/` are NVIDIA's.

use crate::dtype::DType;

use super::sources::{
    KernelSource, MERGE_STATES, MLA_CACHE, MLA_DECODE, MLA_PREFILL, MODEL_LINEAR, PAGED_ATTENTION,
    PAGED_ATTENTION_MATRIX, RESHAPE_AND_CACHE,
};
use super::variants::{
    attention_function_name, attention_variant, half_function_name, ATTENTION_MAX_HEAD_SIZE,
};

pub use super::sources::PORTABLE_SOURCES;

/// An AMD GPU target the family is built and checked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmdTarget {
    /// The LLVM processor name (`gcnArchName` without its `:sramecc+:xnack-` features).
    pub arch: &'static str,
    /// Threads per wavefront the compiler targets by default (`PA_WAVE`).
    pub wave: usize,
    /// The architecture family and an example card.
    pub family: &'static str,
}

/// The targets every CI run compiles: one of each wavefront width on the data-centre (CDNA)
/// and the consumer (RDNA) line, old and new.
pub const AMD_TARGETS: [AmdTarget; 4] = [
    AmdTarget {
        arch: "gfx90a",
        wave: 64,
        family: "CDNA2 (MI210, MI250X)",
    },
    AmdTarget {
        arch: "gfx942",
        wave: 64,
        family: "CDNA3 (MI300X, MI300A)",
    },
    AmdTarget {
        arch: "gfx1030",
        wave: 32,
        family: "RDNA2 (RX 6800, RX 6900 XT)",
    },
    AmdTarget {
        arch: "gfx1100",
        wave: 32,
        family: "RDNA3 (RX 7900 XTX)",
    },
];

/// The default wavefront width of an LLVM AMDGPU processor (`gfx90a`, or a full
/// `gcnArchName` such as `gfx90a:sramecc+:xnack-`): 64 for GCN and CDNA (`gfx6`–`gfx9`),
/// 32 for RDNA (`gfx10` and later); `None` for a name that is not `gfx<digits + letters>`.
pub fn amd_wave(arch: &str) -> Option<usize> {
    let name = arch.split(':').next()?;
    let id = name.strip_prefix("gfx")?;
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    // gfx9xx / gfx9xy are three characters of major + minor + stepping; gfx10xx and later four.
    Some(if id.len() <= 3 { 64 } else { 32 })
}

/// The matrix instruction an AMD target's prefill tiles use (`-DPA_MC_KIND` of
/// [`PAGED_ATTENTION_MATRIX`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatrixCores {
    /// `v_mfma_f32_16x16x16{f16,bf16_1k}` on 64-lane wavefronts: CDNA2 and CDNA3 (gfx90a,
    /// gfx940–gfx942, gfx950).
    Mfma,
    /// `v_wmma_f32_16x16x16_{f16,bf16}_w32` on 32-lane wavefronts: RDNA3 (gfx1100–gfx1103,
    /// gfx1150, gfx1151). On NVIDIA the same fragment layout is emulated by warp shuffles.
    Wmma,
}

impl MatrixCores {
    /// The wavefront width the instruction's fragment layout is written for.
    pub fn wave(self) -> usize {
        match self {
            MatrixCores::Mfma => 64,
            MatrixCores::Wmma => 32,
        }
    }
}

/// The matrix instruction of an LLVM AMDGPU processor (or a full `gcnArchName`), if the
/// matrix-core prefill is built for it. Why not every target with matrix cores: gfx908's MFMA
/// has no `bf16_1k` form, and RDNA4's (gfx12) WMMA lays its fragments out differently.
pub fn amd_matrix_cores(arch: &str) -> Option<MatrixCores> {
    let name = arch.split(':').next()?;
    match name {
        "gfx90a" | "gfx940" | "gfx941" | "gfx942" | "gfx950" => Some(MatrixCores::Mfma),
        "gfx1100" | "gfx1101" | "gfx1102" | "gfx1103" | "gfx1150" | "gfx1151" => {
            Some(MatrixCores::Wmma)
        }
        _ => None,
    }
}

/// The `-D` option selecting `kind`'s fragment layout in [`PAGED_ATTENTION_MATRIX`].
pub fn matrix_variant(kind: MatrixCores) -> String {
    let code = match kind {
        MatrixCores::Mfma => 1,
        MatrixCores::Wmma => 2,
    };
    format!("-DPA_MC_KIND={code}")
}

/// Query rows per work item of the matrix-core prefill: 16 per wavefront, 4 wavefronts.
pub const MATRIX_ROWS: usize = 64;

/// Threads per workgroup of the matrix-core prefill on `wave`-wide wavefronts.
pub fn matrix_threads(wave: usize) -> u32 {
    (4 * wave) as u32
}

/// Dynamic LDS of the matrix-core prefill at head size `d` (as the kernel lays it out): the
/// Q tile `[64][d+8]`, two K tiles `[32][d+8]`, two transposed V tiles `[d][40]` and the
/// four wavefronts' P tiles `[16][40]`, 16-bit elements.
pub fn matrix_smem_bytes(d: usize) -> u32 {
    let elems = MATRIX_ROWS * (d + 8) + 2 * 32 * (d + 8) + 2 * d * 40 + 4 * 16 * 40;
    (2 * elems) as u32
}

/// The matrix-core prefill's entry point for `dtype` activations (with a cache of the same
/// dtype) at `head_size`, if it has one (f16 / bf16 at 64, 96, 128).
pub fn matrix_function_name(dtype: DType, head_size: usize) -> Option<&'static str> {
    half_function_name(&PAGED_ATTENTION_MATRIX, dtype, head_size)
}

/// One module an AMD device compiles: a source, its `-D` options and the entry points it
/// must define.
#[derive(Clone, Debug)]
pub struct AmdVariant {
    /// The source.
    pub source: KernelSource,
    /// `-D` options selecting the variant.
    pub defines: Vec<String>,
    /// The entry points the module must define.
    pub functions: Vec<&'static str>,
}

/// Every module a device of target `arch` can request: the cache write, the merge, the linear
/// layers, the three MLA modules, one attention bucket per `ceil(head_size / wave)` up to
/// [`ATTENTION_MAX_HEAD_SIZE`] (each with the split-KV combine) and, where the target has
/// [`MatrixCores`], the matrix-core prefill. Empty for a name that is not an AMD target.
pub fn amd_variants(arch: &str) -> Vec<AmdVariant> {
    let Some(wave) = amd_wave(arch) else {
        return Vec::new();
    };
    let mut out = vec![
        AmdVariant {
            source: RESHAPE_AND_CACHE,
            defines: Vec::new(),
            functions: RESHAPE_AND_CACHE.functions.to_vec(),
        },
        AmdVariant {
            source: MERGE_STATES,
            defines: Vec::new(),
            functions: MERGE_STATES.functions.to_vec(),
        },
    ];
    out.extend(
        [MODEL_LINEAR, MLA_DECODE, MLA_CACHE, MLA_PREFILL].map(|source| AmdVariant {
            source,
            defines: Vec::new(),
            functions: source.functions.to_vec(),
        }),
    );
    let mut last = None;
    for head_size in (8..=ATTENTION_MAX_HEAD_SIZE).step_by(8) {
        let Some(name) = attention_function_name(head_size, wave) else {
            continue;
        };
        if last == Some(name) {
            continue;
        }
        last = Some(name);
        out.push(AmdVariant {
            source: PAGED_ATTENTION,
            defines: vec![attention_variant(head_size, wave)],
            functions: vec![name, "combine_splits"],
        });
    }
    if let Some(kind) = amd_matrix_cores(arch) {
        out.push(AmdVariant {
            source: PAGED_ATTENTION_MATRIX,
            defines: vec![matrix_variant(kind)],
            functions: PAGED_ATTENTION_MATRIX.functions.to_vec(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wavefront_widths() {
        for t in AMD_TARGETS {
            assert_eq!(amd_wave(t.arch), Some(t.wave), "{}", t.arch);
        }
        assert_eq!(amd_wave("gfx90a:sramecc+:xnack-"), Some(64));
        assert_eq!(amd_wave("gfx1201"), Some(32));
        assert_eq!(amd_wave("gfx803"), Some(64));
        assert_eq!(amd_wave("sm_90"), None);
        assert_eq!(amd_wave("gfx"), None);
        assert_eq!(amd_wave("gfx9_0"), None);
    }

    #[test]
    fn variants_cover_every_head_size_bucket() {
        // wave64: dims per lane 1..=4; wave32: 1..=8; plus the cache write, the merge and the
        // linear layers and the three MLA modules, and the matrix-core prefill where the
        // target has one.
        assert_eq!(amd_variants("gfx90a").len(), 6 + 4 + 1);
        assert_eq!(amd_variants("gfx942:sramecc+:xnack-").len(), 6 + 4 + 1);
        assert_eq!(amd_variants("gfx1030").len(), 6 + 8);
        assert_eq!(amd_variants("gfx1100").len(), 6 + 8 + 1);
        assert!(amd_variants("sm_90").is_empty());
        let v = amd_variants("gfx90a");
        assert_eq!(v[2].functions[0], "model_linear_tiled");
        assert_eq!(v[3].functions[0], "mla_decode_portable_f16");
        assert_eq!(v[9].defines, ["-DPA_ONLY_DPL=4"]);
        assert_eq!(v[9].functions, ["paged_attention_dpl4", "combine_splits"]);
        assert_eq!(v[10].defines, ["-DPA_MC_KIND=1"]);
        assert_eq!(amd_variants("gfx1100")[14].defines, ["-DPA_MC_KIND=2"]);
    }

    #[test]
    fn matrix_cores_per_target() {
        assert_eq!(
            amd_matrix_cores("gfx942:sramecc+:xnack-"),
            Some(MatrixCores::Mfma)
        );
        assert_eq!(amd_matrix_cores("gfx1100"), Some(MatrixCores::Wmma));
        assert_eq!(amd_matrix_cores("gfx1030"), None);
        assert_eq!(amd_matrix_cores("gfx908"), None);
        assert_eq!(amd_matrix_cores("gfx1201"), None);
        for t in AMD_TARGETS {
            if let Some(k) = amd_matrix_cores(t.arch) {
                assert_eq!(k.wave(), t.wave, "{}", t.arch);
            }
        }
        assert_eq!(
            matrix_function_name(DType::Bf16, 128),
            Some("paged_attention_matrix_bf16_d128")
        );
        assert_eq!(matrix_function_name(DType::F32, 128), None);
        assert_eq!(matrix_function_name(DType::F16, 256), None);
        // The kernel's LDS at d128: 59 KiB, inside the 64 KiB of a workgroup.
        assert_eq!(matrix_smem_bytes(128), 60_416);
        assert!(matrix_smem_bytes(128) <= 64 * 1024);
    }
}
