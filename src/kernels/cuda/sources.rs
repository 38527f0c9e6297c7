//! The family's sources: every file of `kernels-cuda/`, embedded at build time
//! (`include_str!`, so binaries run without the source tree), with the entry points each
//! defines ([`KernelSource`]), and the one preprocessing step they need before any compiler
//! sees them ([`full_source`]: `common.cuh` pasted in place of its include line, so no
//! include path and no toolkit header is needed — NVRTC 13 ships no `cuda_fp16.h`).

/// One kernel source file of the family (`kernels-cuda/`, or `kernels-hip/` for AMD's own
/// kernels) and the entry points it defines.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// Module name (the file name without `.cu`).
    pub name: &'static str,
    /// The file's text.
    pub source: &'static str,
    /// Its `extern "C"` entry points.
    pub functions: &'static [&'static str],
}

/// `kernels-cuda/common.cuh`, pasted into every source.
pub const COMMON: &str = include_str!("../../../kernels-cuda/common.cuh");

/// `kernels-cuda/portability.cuh` (what differs between NVRTC / nvcc and hiprtc / hipcc /
/// clang: `PA_NVIDIA`, `PA_AMD`, `PA_WAVE`, the shuffles), pasted into `common.cuh`.
pub const PORTABILITY: &str = include_str!("../../../kernels-cuda/portability.cuh");

/// `kernels-cuda/mla_params.cuh` (the MLA decode's parameter blocks and sizes), pasted into
/// the two decode forms.
pub const MLA_PARAMS: &str = include_str!("../../../kernels-cuda/mla_params.cuh");

/// `linear_params.cuh`: the linear layers' parameter block and shared helpers, pasted in
/// place of `#include "linear_params.cuh"`.
pub const LINEAR_PARAMS: &str = include_str!("../../../kernels-cuda/linear_params.cuh");

/// `prefill_tile.cuh`: what the two tensor-core prefill kernels share (a work item's
/// geometry, row reductions, scores with their modifiers and mask), pasted in place of
/// `#include "prefill_tile.cuh"`.
pub const PREFILL_TILE: &str = include_str!("../../../kernels-cuda/prefill_tile.cuh");

/// `wgmma.cuh`: the Hopper prefill kernels' warpgroup tensor-core wrappers and tile steps
/// (descriptors, wgmma products and fences, one tile's softmax), pasted in place of
/// `#include "wgmma.cuh"`.
pub const WGMMA: &str = include_str!("../../../kernels-cuda/wgmma.cuh");

/// `reshape_and_cache.cu`.
pub const RESHAPE_AND_CACHE: KernelSource = KernelSource {
    name: "reshape_and_cache",
    source: include_str!("../../../kernels-cuda/reshape_and_cache.cu"),
    functions: &["reshape_and_cache"],
};

/// `paged_decode_cores.cu`.
pub const PAGED_DECODE_CORES: KernelSource = KernelSource {
    name: "paged_decode_cores",
    source: include_str!("../../../kernels-cuda/paged_decode_cores.cu"),
    functions: &[
        "paged_decode_cores_h4",
        "paged_decode_cores_h8",
        "paged_decode_cores_h16",
    ],
};

/// `paged_attention.cu`.
pub const PAGED_ATTENTION: KernelSource = KernelSource {
    name: "paged_attention",
    source: include_str!("../../../kernels-cuda/paged_attention.cu"),
    functions: &[
        "paged_attention_dpl1",
        "paged_attention_dpl2",
        "paged_attention_dpl3",
        "paged_attention_dpl4",
        "paged_attention_dpl5",
        "paged_attention_dpl6",
        "paged_attention_dpl7",
        "paged_attention_dpl8",
        "combine_splits",
    ],
};

/// `paged_attention_mma.cu` (tensor cores; f16 / bf16, head sizes 64, 96, 128).
pub const PAGED_ATTENTION_MMA: KernelSource = KernelSource {
    name: "paged_attention_mma",
    source: include_str!("../../../kernels-cuda/paged_attention_mma.cu"),
    functions: &[
        "paged_attention_mma_f16_d64",
        "paged_attention_mma_f16_d96",
        "paged_attention_mma_f16_d128",
        "paged_attention_mma_bf16_d64",
        "paged_attention_mma_bf16_d96",
        "paged_attention_mma_bf16_d128",
    ],
};

/// `paged_attention_wgmma_ws.cu`: the Hopper prefill (f16 / bf16, head sizes 64 and 128; a
/// producer warpgroup copying K / V tiles into a ring of stages, two consumer warpgroups on
/// wgmma, mbarriers between them, `setmaxnreg`), for sm_90a.
pub const PAGED_ATTENTION_WGMMA_WS: KernelSource = KernelSource {
    name: "paged_attention_wgmma_ws",
    source: include_str!("../../../kernels-cuda/paged_attention_wgmma_ws.cu"),
    functions: &[
        "paged_attention_wgmma_ws_f16_d64",
        "paged_attention_wgmma_ws_f16_d128",
        "paged_attention_wgmma_ws_bf16_d64",
        "paged_attention_wgmma_ws_bf16_d128",
    ],
};

/// The architecture the Hopper sources are built for: `wgmma` and `setmaxnreg` exist only in
/// the arch-specific `sm_90a` target, whose cubins run on compute capability 9.0 alone.
pub const HOPPER_ARCH: &str = "sm_90a";

/// The sources built for [`HOPPER_ARCH`] only.
pub const HOPPER_SOURCES: [KernelSource; 1] = [PAGED_ATTENTION_WGMMA_WS];

/// `paged_decode.cu` (split-KV decode on tensor cores; f16 / bf16 with a same-dtype, E4M3 or
/// E5M2 cache, head sizes 64, 96, 128).
pub const PAGED_DECODE: KernelSource = KernelSource {
    name: "paged_decode",
    source: include_str!("../../../kernels-cuda/paged_decode.cu"),
    functions: &[
        "paged_decode_f16_d64",
        "paged_decode_f16_d96",
        "paged_decode_f16_d128",
        "paged_decode_f16_e4m3_d64",
        "paged_decode_f16_e4m3_d96",
        "paged_decode_f16_e4m3_d128",
        "paged_decode_f16_e5m2_d64",
        "paged_decode_f16_e5m2_d96",
        "paged_decode_f16_e5m2_d128",
        "paged_decode_bf16_d64",
        "paged_decode_bf16_d96",
        "paged_decode_bf16_d128",
        "paged_decode_bf16_e4m3_d64",
        "paged_decode_bf16_e4m3_d96",
        "paged_decode_bf16_e4m3_d128",
        "paged_decode_bf16_e5m2_d64",
        "paged_decode_bf16_e5m2_d96",
        "paged_decode_bf16_e5m2_d128",
    ],
};

/// `kernels-hip/paged_attention_matrix.hip`: the family's prefill on AMD matrix cores (MFMA
/// on CDNA, WMMA on RDNA3; f16 / bf16, head sizes 64, 96, 128). Built with
/// [`matrix_variant`](super::matrix_variant)'s `-DPA_MC_KIND`; on NVIDIA (NVRTC) the WMMA form
/// runs with its product emulated by warp shuffles, to check the kernel on a GPU here.
pub const PAGED_ATTENTION_MATRIX: KernelSource = KernelSource {
    name: "paged_attention_matrix",
    source: include_str!("../../../kernels-hip/paged_attention_matrix.hip"),
    functions: &[
        "paged_attention_matrix_f16_d64",
        "paged_attention_matrix_f16_d96",
        "paged_attention_matrix_f16_d128",
        "paged_attention_matrix_bf16_d64",
        "paged_attention_matrix_bf16_d96",
        "paged_attention_matrix_bf16_d128",
    ],
};

/// `merge_states.cu`.
pub const MERGE_STATES: KernelSource = KernelSource {
    name: "merge_states",
    source: include_str!("../../../kernels-cuda/merge_states.cu"),
    functions: &["merge_attn_states", "merge_attn_states_vec"],
};

/// `probes.cu` (the benchmark's f32 FMA ceiling).
pub const PROBES: KernelSource = KernelSource {
    name: "probes",
    source: include_str!("../../../kernels-cuda/probes.cu"),
    functions: &["fma_probe"],
};

/// `model_ops.cu`: the model operations' kernels (`crate::compute` on CUDA; compiled like the
/// attention kernels, and checked with them by `tests/cuda_compile.rs`).
pub const MODEL_OPS: KernelSource = KernelSource {
    name: "model_ops",
    source: include_str!("../../../kernels-cuda/model_ops.cu"),
    functions: &[
        "model_gather",
        "model_rms_norm",
        "model_rope",
        "model_silu_mul",
        "model_add",
        "model_argmax",
        "model_sample",
        "model_swiglu",
        "model_rope_split",
    ],
};

/// `model_linear.cu`: the model runner's and the MLA prefill's linear layers (a tiled
/// SGEMM, GEMVs; an optional input RMSNorm, SwiGLU and RoPE-split outputs), for every
/// compiler of the family.
pub const MODEL_LINEAR: KernelSource = KernelSource {
    name: "model_linear",
    source: include_str!("../../../kernels-cuda/model_linear.cu"),
    functions: &[
        "model_linear_tiled",
        "model_linear_gemv1",
        "model_linear_gemv4",
        "model_linear_gemv8",
        "model_linear_gemv16",
        "model_linear_gemv1_norm",
        "model_linear_gemv4_norm",
        "model_linear_gemv8_norm",
        "model_linear_gemv16_norm",
        "model_linear_gemv1_split",
        "model_linear_gemv4_split",
        "model_linear_gemv8_split",
        "model_linear_gemv16_split",
        "model_linear_gemv1_norm_split",
        "model_linear_gemv4_norm_split",
        "model_linear_gemv8_norm_split",
        "model_linear_gemv16_norm_split",
    ],
};

/// `mla_decode.cu`: MLA's latent-space decode on the vector ALUs, for every compiler of the
/// family (f16 / bf16 with a same-dtype or E4M3 cache; 16 rows per CTA), and the split
/// combine both decode forms use.
pub const MLA_DECODE: KernelSource = KernelSource {
    name: "mla_decode",
    source: include_str!("../../../kernels-cuda/mla_decode.cu"),
    functions: &[
        "mla_decode_portable_f16",
        "mla_decode_portable_bf16",
        "mla_decode_portable_f16_e4m3",
        "mla_decode_portable_bf16_e4m3",
        "mla_combine",
    ],
};

/// `mla_decode_mma.cu`: MLA's latent-space decode on NVIDIA's tensor cores (f16 / bf16 with
/// a same-dtype or E4M3 cache; 16, 32 or 64 rows per CTA).
pub const MLA_DECODE_MMA: KernelSource = KernelSource {
    name: "mla_decode_mma",
    source: include_str!("../../../kernels-cuda/mla_decode_mma.cu"),
    functions: &[
        "mla_decode_f16_r1",
        "mla_decode_f16_r2",
        "mla_decode_f16_r4",
        "mla_decode_bf16_r1",
        "mla_decode_bf16_r2",
        "mla_decode_bf16_r4",
        "mla_decode_f16_e4m3_r1",
        "mla_decode_f16_e4m3_r2",
        "mla_decode_f16_e4m3_r4",
        "mla_decode_bf16_e4m3_r1",
        "mla_decode_bf16_e4m3_r2",
        "mla_decode_bf16_e4m3_r4",
    ],
};

/// `mla_cache.cu`: the latent cache's write (`concat_and_cache_mla`) and the prefill's
/// latent gather.
pub const MLA_CACHE: KernelSource = KernelSource {
    name: "mla_cache",
    source: include_str!("../../../kernels-cuda/mla_cache.cu"),
    functions: &["concat_and_cache_mla", "mla_gather_latents"],
};

/// `mla_prefill.cu`: MLA's expanded prefill attention, one key chunk per launch.
pub const MLA_PREFILL: KernelSource = KernelSource {
    name: "mla_prefill",
    source: include_str!("../../../kernels-cuda/mla_prefill.cu"),
    functions: &["mla_prefill_attention"],
};

/// Every source of `kernels-cuda/`, for compile checks (each builds without `-D` options).
pub const ALL_SOURCES: [KernelSource; 13] = [
    RESHAPE_AND_CACHE,
    PAGED_ATTENTION,
    PAGED_ATTENTION_MMA,
    PAGED_DECODE,
    PAGED_DECODE_CORES,
    MERGE_STATES,
    PROBES,
    MODEL_OPS,
    MODEL_LINEAR,
    MLA_DECODE,
    MLA_DECODE_MMA,
    MLA_CACHE,
    MLA_PREFILL,
];

/// The sources that compile for AMD as well (`PA_AMD`): no inline PTX, lane math in
/// `PA_WAVE`. The others (`paged_attention_mma`, `paged_decode`, `paged_decode_cores`,
/// `mla_decode_mma`, `model_ops`, `probes`) use NVIDIA's tensor-core,
/// `cp.async` or warp-synchronous instructions.
pub const PORTABLE_SOURCES: [KernelSource; 7] = [
    RESHAPE_AND_CACHE,
    PAGED_ATTENTION,
    MERGE_STATES,
    MODEL_LINEAR,
    MLA_DECODE,
    MLA_CACHE,
    MLA_PREFILL,
];

/// The source as a compiler of the family takes it: `common.cuh` pasted in place of its
/// include line, `portability.cuh` in place of common's, `mla_params.cuh` in place of its.
pub fn full_source(k: &KernelSource) -> String {
    let common = COMMON.replace("#include \"portability.cuh\"", PORTABILITY);
    k.source
        .replace("#include \"common.cuh\"", &common)
        .replace("#include \"mla_params.cuh\"", MLA_PARAMS)
        .replace("#include \"linear_params.cuh\"", LINEAR_PARAMS)
        .replace("#include \"prefill_tile.cuh\"", PREFILL_TILE)
        .replace("#include \"wgmma.cuh\"", WGMMA)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device's fp8 encoder (`pa_f32_to_fp8` in common.cuh), step for step in f32, must
    /// agree with src/fp8.rs; this checks the algorithm (the H200 run checks the CUDA code).
    fn device_fp8(x: f32, mant: i32, bias: i32, maxv: f32) -> u8 {
        let u = x.to_bits();
        if (u & 0x7fff_ffff) > 0x7f80_0000 {
            return 0x7f;
        }
        let sign = ((u >> 24) & 0x80) as u8;
        let a = f32::from_bits(u & 0x7fff_ffff).min(maxv);
        let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
        let min_normal = 1 - bias;
        let code = if e < min_normal {
            (a * 2f32.powi(mant - min_normal)).round_ties_even() as u32
        } else {
            let steps = (a * 2f32.powi(mant - e)).round_ties_even() as u32;
            (((e + bias) as u32) << mant) + steps - (1u32 << mant)
        };
        sign | code as u8
    }

    #[test]
    fn device_fp8_encoder_matches_the_host_one() {
        use crate::fp8::{encode_e4m3, encode_e5m2, E4M3_TABLE, E5M2_TABLE};
        let mut xs: Vec<f32> = (0..1u32 << 20)
            .map(|i| f32::from_bits(i << 12 | 0x5a5))
            .collect();
        // Exact midpoints between neighbouring codes and their f32 neighbours (the ties).
        for t in [&E4M3_TABLE, &E5M2_TABLE] {
            for w in t.windows(2) {
                if w[0].is_finite() && w[1].is_finite() {
                    let m = (w[0] + w[1]) / 2.0;
                    xs.extend([
                        m,
                        f32::from_bits(m.to_bits() + 1),
                        f32::from_bits(m.to_bits().wrapping_sub(1)),
                    ]);
                    xs.extend([w[0], w[1], -m]);
                }
            }
        }
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            448.0,
            464.0,
            480.0,
            57344.0,
            61440.0,
            1e-45,
        ]);
        for x in xs {
            assert_eq!(
                device_fp8(x, 3, 7, 448.0),
                encode_e4m3(x),
                "e4m3 {x:e} ({:#x})",
                x.to_bits()
            );
            assert_eq!(
                device_fp8(x, 2, 15, 57344.0),
                encode_e5m2(x),
                "e5m2 {x:e} ({:#x})",
                x.to_bits()
            );
        }
    }

    /// `pa_f32_to_bf16` in common.cuh against the `half` crate the host uses.
    #[test]
    fn device_bf16_rounding_matches_half() {
        let dev = |f: f32| -> u16 {
            let u = f.to_bits();
            if (u & 0x7fff_ffff) > 0x7f80_0000 {
                return ((u >> 16) | 0x40) as u16;
            }
            (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
        };
        for i in 0..1u32 << 20 {
            for low in [0u32, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1_8000] {
                let f = f32::from_bits((i << 12) ^ low);
                assert_eq!(
                    dev(f),
                    half::bf16::from_f32(f).to_bits(),
                    "{:#x}",
                    f.to_bits()
                );
            }
        }
    }

    #[test]
    fn sources_paste_the_header() {
        for k in ALL_SOURCES.iter().chain(&HOPPER_SOURCES) {
            let s = full_source(k);
            assert!(
                !s.lines().any(|l| l.trim_start().starts_with("#include")),
                "{}",
                k.name
            );
            assert!(s.contains("POLYATTN_COMMON_CUH"));
            assert!(s.contains("POLYATTN_PORTABILITY_CUH"));
        }
    }
}
