//! The family on AMD: which GPU targets the portable kernels are built for, the wavefront
//! width of each, and the variants an AMD device requests. Plain data: compiling them is the
//! HIP runtime's (hiprtc), checking them without a GPU is `tests/hip_compile.rs`'s (hipcc and
//! clang).
//!
//! Only the [`PORTABLE_SOURCES`] build for AMD: `reshape_and_cache`, the CUDA-core
//! `paged_attention` (prefill, decode and split-KV decode with its `combine_splits`) and
//! `merge_states`. The tensor-core and `cp.async` kernels are NVIDIA's.

use super::sources::{KernelSource, MERGE_STATES, PAGED_ATTENTION, RESHAPE_AND_CACHE};
use super::variants::{attention_function_name, attention_variant, ATTENTION_MAX_HEAD_SIZE};

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

/// Every module a device with `wave`-wide wavefronts can request: the cache write, the merge,
/// and one attention bucket per `ceil(head_size / wave)` up to
/// [`ATTENTION_MAX_HEAD_SIZE`] (each with the split-KV combine).
pub fn amd_variants(wave: usize) -> Vec<AmdVariant> {
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
        // wave64: dims per lane 1..=4; wave32: 1..=8; plus the cache write and the merge.
        assert_eq!(amd_variants(64).len(), 2 + 4);
        assert_eq!(amd_variants(32).len(), 2 + 8);
        let v = amd_variants(64);
        assert_eq!(v[5].defines, ["-DPA_ONLY_DPL=4"]);
        assert_eq!(v[5].functions, ["paged_attention_dpl4", "combine_splits"]);
    }
}
