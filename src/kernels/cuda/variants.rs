//! The variants a build selects: the `-D` options that build one bucket of a kernel
//! (`PA_ONLY_DPL`, `PA_MMA_*`, `PD_*`, see each `.cu` file), the entry point of each variant,
//! and the element-type codes the kernels read (`PA_F32` … in `common.cuh`). Plain strings and
//! integers, the same for any compiler of the family (NVRTC, hiprtc).

use crate::dtype::DType;
use crate::error::{Error, Result};

use super::shapes::{wgmma_stages, MmaShape, WGMMA_KEYS};
use super::sources::{
    KernelSource, PAGED_ATTENTION, PAGED_ATTENTION_MMA, PAGED_ATTENTION_WGMMA_WS, PAGED_DECODE,
};

/// The element-type code of `dtype` as the kernels read it (`PA_F32` ... in `common.cuh`);
/// `None` for integer dtypes.
pub fn dtype_code(dtype: DType) -> Option<i32> {
    Some(match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Bf16 => 2,
        DType::Fp8E4m3 => 3,
        DType::Fp8E5m2 => 4,
        DType::I32 | DType::I64 => return None,
    })
}

/// [`dtype_code`], or the error an operand of an integer dtype gets.
pub(crate) fn code(dtype: DType) -> Result<i32> {
    dtype_code(dtype).ok_or_else(|| Error::DType {
        what: "cuda kernel operand",
        got: dtype.to_string(),
        expected: "f32, f16, bf16, fp8_e4m3 or fp8_e5m2".into(),
    })
}

/// The most head size of the CUDA-core attention kernel (`paged_attention.cu`).
pub const ATTENTION_MAX_HEAD_SIZE: usize = 256;

/// The `-D` option that builds only the attention bucket of `head_size` on a device whose
/// warps / wavefronts are `wave` wide (`PA_ONLY_DPL` = ceil(head_size / wave), see
/// paged_attention.cu).
pub fn attention_variant(head_size: usize, wave: usize) -> String {
    format!("-DPA_ONLY_DPL={}", head_size.div_ceil(wave.max(1)))
}

/// The `-D` options that build only the tensor-core variant for `dtype`, `head_size`,
/// `shape` (`PA_MMA_MT` = rows / (16 warps) m16 tiles per warp, `PA_MMA_WARPS`) and the
/// layer's modifiers (`PA_MMA_PLAIN`: `plain` = no soft cap and no ALiBi; the plain build
/// has its own register allocation, which fits 64-key softmax steps at two m-tiles); see
/// paged_attention_mma.cu.
pub fn mma_variant(dtype: DType, head_size: usize, shape: MmaShape, plain: bool) -> [String; 5] {
    [
        format!("-DPA_MMA_D={head_size}"),
        format!("-DPA_MMA_BF16={}", i32::from(dtype == DType::Bf16)),
        format!("-DPA_MMA_MT={}", shape.tiles_per_warp()),
        format!("-DPA_MMA_WARPS={}", shape.warps),
        format!("-DPA_MMA_PLAIN={}", i32::from(plain)),
    ]
}

/// The `-D` options that build only the Hopper prefill variant for `dtype`, `head_size` and
/// the layer's modifiers (`PA_WS_PLAIN`, as [`mma_variant`]), with its tile (`PA_WS_KEYS`,
/// [`WGMMA_KEYS`]) and K / V stages (`PA_WS_STAGES`, [`wgmma_stages`]); see
/// paged_attention_wgmma_ws.cu.
pub fn wgmma_variant(dtype: DType, head_size: usize, plain: bool) -> [String; 5] {
    [
        format!("-DPA_WS_D={head_size}"),
        format!("-DPA_WS_BF16={}", i32::from(dtype == DType::Bf16)),
        format!("-DPA_WS_KEYS={WGMMA_KEYS}"),
        format!("-DPA_WS_STAGES={}", wgmma_stages(head_size)),
        format!("-DPA_WS_PLAIN={}", i32::from(plain)),
    ]
}

/// The Hopper prefill entry point for `dtype` (f16 / bf16) and `head_size` (64, 128).
pub fn wgmma_function_name(dtype: DType, head_size: usize) -> Option<&'static str> {
    half_function_name(&PAGED_ATTENTION_WGMMA_WS, dtype, head_size)
}

/// The entry point `{source}_{f16|bf16}_d{head_size}` of a tensor-core source whose entry
/// points are named by dtype and head size, where `source` defines it.
pub(crate) fn half_function_name(
    source: &KernelSource,
    dtype: DType,
    head_size: usize,
) -> Option<&'static str> {
    let t = match dtype {
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
        _ => return None,
    };
    let want = format!("{}_{t}_d{head_size}", source.name);
    source.functions.iter().find(|f| **f == want).copied()
}

/// The decode kernel's code for a cache dtype (`PD_KV`): 0 for a cache of the activation
/// dtype, 1 for E4M3, 2 for E5M2.
fn decode_kv_code(cache_dtype: DType) -> u32 {
    match cache_dtype {
        DType::Fp8E4m3 => 1,
        DType::Fp8E5m2 => 2,
        _ => 0,
    }
}

/// The `-D` options that build only the decode variant for `dtype`, `cache_dtype` and
/// `head_size` (see paged_decode.cu).
pub fn decode_variant(dtype: DType, cache_dtype: DType, head_size: usize) -> [String; 3] {
    [
        format!("-DPD_D={head_size}"),
        format!("-DPD_BF16={}", i32::from(dtype == DType::Bf16)),
        format!("-DPD_KV={}", decode_kv_code(cache_dtype)),
    ]
}

/// The attention entry point for `head_size` on a device whose warps / wavefronts are `wave`
/// wide (`paged_attention_dpl{ceil(D/wave)}`); `None` past [`ATTENTION_MAX_HEAD_SIZE`] (the
/// buckets a compile builds, see `PA_WANT_DPL`).
pub fn attention_function_name(head_size: usize, wave: usize) -> Option<&'static str> {
    if head_size > ATTENTION_MAX_HEAD_SIZE || !matches!(wave, 32 | 64) {
        return None;
    }
    let dpl = head_size.div_ceil(wave);
    PAGED_ATTENTION
        .functions
        .get(dpl.checked_sub(1)?)
        .copied()
        .filter(|n| n.starts_with("paged_attention_dpl"))
}

/// The tensor-core entry point for `dtype` (f16 / bf16) and `head_size` (64, 96, 128).
pub fn mma_function_name(dtype: DType, head_size: usize) -> Option<&'static str> {
    half_function_name(&PAGED_ATTENTION_MMA, dtype, head_size)
}

/// The decode entry point for `dtype` (f16 / bf16), `cache_dtype` (`dtype`, E4M3 or E5M2)
/// and `head_size` (64, 96, 128).
pub fn decode_function_name(
    dtype: DType,
    cache_dtype: DType,
    head_size: usize,
) -> Option<&'static str> {
    let t = match dtype {
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
        _ => return None,
    };
    let kv = match cache_dtype {
        c if c == dtype => "",
        DType::Fp8E4m3 => "_e4m3",
        DType::Fp8E5m2 => "_e5m2",
        _ => return None,
    };
    let want = format!("paged_decode_{t}{kv}_d{head_size}");
    PAGED_DECODE.functions.iter().find(|f| **f == want).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_and_variants() {
        assert_eq!(
            attention_function_name(128, 32),
            Some("paged_attention_dpl4")
        );
        assert_eq!(
            attention_function_name(256, 32),
            Some("paged_attention_dpl8")
        );
        assert_eq!(attention_function_name(264, 32), None);
        // A 64-wide wavefront (AMD CDNA) holds two dims per lane where a warp holds four.
        assert_eq!(
            attention_function_name(128, 64),
            Some("paged_attention_dpl2")
        );
        assert_eq!(
            attention_function_name(200, 64),
            Some("paged_attention_dpl4")
        );
        assert_eq!(attention_function_name(264, 64), None);
        assert_eq!(attention_function_name(128, 48), None);
        assert_eq!(attention_variant(200, 64), "-DPA_ONLY_DPL=4");
        assert_eq!(attention_variant(200, 32), "-DPA_ONLY_DPL=7");
        assert_eq!(
            decode_function_name(DType::Bf16, DType::Bf16, 128),
            Some("paged_decode_bf16_d128")
        );
        assert_eq!(
            decode_function_name(DType::F16, DType::Fp8E5m2, 96),
            Some("paged_decode_f16_e5m2_d96")
        );
        assert_eq!(
            decode_variant(DType::Bf16, DType::Fp8E4m3, 64),
            ["-DPD_D=64", "-DPD_BF16=1", "-DPD_KV=1"]
        );
        assert_eq!(decode_function_name(DType::F16, DType::Bf16, 128), None);
        assert_eq!(decode_function_name(DType::F32, DType::F32, 128), None);
        assert_eq!(decode_function_name(DType::F16, DType::F16, 256), None);
        assert_eq!(
            wgmma_function_name(DType::Bf16, 128),
            Some("paged_attention_wgmma_ws_bf16_d128")
        );
        assert_eq!(wgmma_function_name(DType::F16, 96), None);
        assert_eq!(wgmma_function_name(DType::F32, 128), None);
        assert_eq!(
            wgmma_variant(DType::Bf16, 128, false),
            [
                "-DPA_WS_D=128",
                "-DPA_WS_BF16=1",
                "-DPA_WS_KEYS=128",
                "-DPA_WS_STAGES=2",
                "-DPA_WS_PLAIN=0"
            ]
        );
        assert_eq!(
            wgmma_variant(DType::F16, 64, true),
            [
                "-DPA_WS_D=64",
                "-DPA_WS_BF16=0",
                "-DPA_WS_KEYS=128",
                "-DPA_WS_STAGES=4",
                "-DPA_WS_PLAIN=1"
            ]
        );
    }
}
