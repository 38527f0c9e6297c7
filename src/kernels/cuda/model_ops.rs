//! The model operations' kernels (`model_ops.cu`, used by `crate::compute` on CUDA): their
//! launch-shape constants and parameter blocks, `#[repr(C)]` mirrors of the structs in
//! `model_ops.cu` (sizes asserted here and by `static_assert` there; `bytemuck::Pod`, as
//! every parameter block of the family).

use crate::dtype::DType;

/// Largest token count `linear` runs as a GEMV (the kernel keeps one partial sum per token
/// in registers); more tokens take the tiled kernel.
pub const GEMV_MAX_TOKENS: usize = 16;

/// The GEMV entry point of `model_linear.cu` for `t` ≤ [`GEMV_MAX_TOKENS`] tokens: the
/// narrowest of the 1-, 4-, 8- and 16-token bodies that holds them (each computes every token
/// slot it has), with the input norm (`norm`) or without, one wave per pair of weight rows or
/// four (`split`, see [`gemv_split`]).
pub fn gemv_entry(t: usize, norm: bool, split: bool) -> &'static str {
    const NAMES: [[&str; 4]; 4] = [
        [
            "model_linear_gemv1",
            "model_linear_gemv4",
            "model_linear_gemv8",
            "model_linear_gemv16",
        ],
        [
            "model_linear_gemv1_norm",
            "model_linear_gemv4_norm",
            "model_linear_gemv8_norm",
            "model_linear_gemv16_norm",
        ],
        [
            "model_linear_gemv1_split",
            "model_linear_gemv4_split",
            "model_linear_gemv8_split",
            "model_linear_gemv16_split",
        ],
        [
            "model_linear_gemv1_norm_split",
            "model_linear_gemv4_norm_split",
            "model_linear_gemv8_norm_split",
            "model_linear_gemv16_norm_split",
        ],
    ];
    let width = match t {
        0..=1 => 0,
        2..=4 => 1,
        5..=8 => 2,
        _ => 3,
    };
    NAMES[usize::from(norm) + 2 * usize::from(split)][width]
}

/// Whether a GEMV of `pairs` weight-row pairs splits each pair over four waves: when one wave
/// per pair would leave the GPU's `sms` multiprocessors fewer than [`GEMV_SPLIT_WAVES`] waves
/// each (the loads in flight, not the bandwidth, bound a GEMV of a few MB).
pub fn gemv_split(pairs: usize, sms: usize) -> bool {
    pairs < sms.max(1) * GEMV_SPLIT_WAVES
}

/// Waves per SM below which the GEMV splits its pairs: a projection of a few hundred pairs
/// leaves most SMs with one or two waves, whose loads alone cannot keep the memory busy, while
/// one of a few thousand already fills the GPU and the split's shared-memory step only costs
/// (benches/RESULTS.md has the comparison).
pub const GEMV_SPLIT_WAVES: usize = 4;

/// The build options of `model_linear.cu` for weights of `dtype` (`-DLIN_W`: f32 by default,
/// f16 or bf16 widened as they are loaded); `None` for another dtype.
pub fn linear_weight_options(dtype: DType) -> Option<&'static [&'static str]> {
    match dtype {
        DType::F32 => Some(&[]),
        DType::F16 => Some(&["-DLIN_W=1"]),
        DType::Bf16 => Some(&["-DLIN_W=2"]),
        _ => None,
    }
}

/// What `model_linear.cu` does with its product (`LinearParams::epilogue`, the `LIN_*`
/// codes there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum LinearEpilogue {
    /// `y = p`.
    Store = 0,
    /// `y += p`.
    Accumulate = 1,
    /// `y = silu(p[.., ..I]) · p[.., I..]`.
    SwiGlu = 2,
    /// Split into q / k / v, query and key heads rotated.
    RopeSplit = 3,
}

/// Threads per block of every kernel but the GEMV (`MO_THREADS`).
pub const MODEL_THREADS: u32 = 256;
/// Output tile edge of the tiled linear kernel (`LIN_BM` = `LIN_BN`).
pub const LINEAR_TILE: usize = 64;
/// Threads per block of the argmax and sample kernels (`ARGMAX_THREADS`: a row is a whole
/// vocabulary).
pub const ARGMAX_THREADS: u32 = 1024;
/// Threads per GEMV block (`GEMV_THREADS`); each warp computes one pair of weight rows at a
/// time.
pub const GEMV_THREADS: u32 = 128;

/// `GatherParams` of model_ops.cu (`model_gather`: embedding and gather_rows).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GatherParams {
    /// `[table_rows][h]` f32 rows.
    pub table: u64,
    /// `[num_rows]` i32 row indices.
    pub ids: u64,
    /// `[num_rows][h]` f32 output.
    pub out: u64,
    /// Rows gathered (T).
    pub num_rows: i64,
    /// Rows of the table (an index outside gives a row of zeros).
    pub table_rows: i64,
    /// Row length.
    pub h: i32,
    /// 1: float4 accesses.
    pub vec4: i32,
}

/// `RmsNormParams` of model_ops.cu (`model_rms_norm`).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RmsNormParams {
    /// `[num_rows][h]` f32 input.
    pub x: u64,
    /// `[h]` f32 weight.
    pub weight: u64,
    /// `[num_rows][h]` f32 output.
    pub y: u64,
    /// Rows.
    pub num_rows: i64,
    /// Row length.
    pub h: i32,
    /// Epsilon added to the mean square.
    pub eps: f32,
    /// 1: float4 accesses.
    pub vec4: i32,
    /// Padding.
    pub pad: i32,
}

/// `LinearParams` of model_linear.cu (`model_linear_tiled`, the `model_linear_gemv*` entry
/// points).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LinearParams {
    /// `[t][k]` f32 input.
    pub x: u64,
    /// `[n][k]` f32 weight.
    pub w: u64,
    /// The output (`[t][n]`; `[t][n / 2]` for SwiGLU; `q` for the RoPE split).
    pub y: u64,
    /// The RoPE split's `k`, or the KV cache when it writes the cache (else 0).
    pub y2: u64,
    /// The RoPE split's `v` (else 0).
    pub y3: u64,
    /// `[k]` RMSNorm weight applied to the input rows, or 0 for none.
    pub norm: u64,
    /// The RoPE split's `[t]` i32 positions (else 0).
    pub positions: u64,
    /// Tokens.
    pub t: i32,
    /// Input features.
    pub k: i32,
    /// Weight rows.
    pub n: i32,
    /// 1: float4 accesses.
    pub vec4: i32,
    /// A [`LinearEpilogue`] code.
    pub epilogue: i32,
    /// The norm's epsilon.
    pub eps: f32,
    /// The RoPE split's query heads.
    pub num_heads: i32,
    /// The RoPE split's key / value heads.
    pub num_kv_heads: i32,
    /// The RoPE split's d / 2.
    pub half: i32,
    /// The RoPE split's base θ.
    pub rope_base: f32,
    /// The RoPE split's pairing: 1 = (2i, 2i+1), 0 = (i, i + d/2).
    pub interleaved: i32,
    /// Tokens per cache block when the RoPE split writes the keys and values into the
    /// cache `y2`; 0 when it writes `k` / `v` tensors.
    pub cache_block_size: i32,
    /// Into the cache: the `[t]` i64 slot mapping (−1: not written).
    pub slots: u64,
    /// Into the cache: 1 for the HND layout, 0 for NHD.
    pub cache_hnd: i32,
    /// Padding.
    pub pad: i32,
}

impl LinearParams {
    /// `y [t][n] = x [t][k] · w [n][k]ᵀ` (or `+=` with `accumulate`), no norm.
    #[allow(clippy::too_many_arguments)]
    pub fn product(
        x: u64,
        w: u64,
        y: u64,
        t: i32,
        k: i32,
        n: i32,
        vec4: bool,
        accumulate: bool,
    ) -> Self {
        let epilogue = if accumulate {
            LinearEpilogue::Accumulate
        } else {
            LinearEpilogue::Store
        };
        LinearParams {
            x,
            w,
            y,
            t,
            k,
            n,
            vec4: i32::from(vec4),
            epilogue: epilogue as i32,
            ..bytemuck::Zeroable::zeroed()
        }
    }
}

/// `RopeParams` of model_ops.cu (`model_rope`, in place).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RopeParams {
    /// `[num_tokens][num_heads][2·half]` f32, rotated in place.
    pub x: u64,
    /// `[num_tokens]` i32 positions.
    pub positions: u64,
    /// Tokens.
    pub num_tokens: i64,
    /// Heads.
    pub num_heads: i32,
    /// Half the head size (pairs per head).
    pub half: i32,
    /// Frequency base.
    pub base: f32,
    /// 1: pairs (2i, 2i+1); 0: pairs (i, i + half).
    pub interleaved: i32,
}

/// `EltwiseParams` of model_ops.cu (`model_silu_mul`, `model_add`).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EltwiseParams {
    /// silu_mul: the gate; add: the operand.
    pub a: u64,
    /// silu_mul: the up projection; add: unused.
    pub b: u64,
    /// silu_mul: the result; add: the target (read and written).
    pub out: u64,
    /// Elements.
    pub n: i64,
    /// 1: float4 accesses.
    pub vec4: i32,
    /// Padding.
    pub pad: i32,
}

/// `ArgmaxParams` of model_ops.cu (`model_argmax`).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ArgmaxParams {
    /// Logits `[num_rows, v]` f32.
    pub x: u64,
    /// Result `[num_rows]` i32.
    pub out: u64,
    /// Rows.
    pub num_rows: i64,
    /// Row length (vocabulary).
    pub v: i32,
    /// Padding.
    pub pad: i32,
}

/// `SampleParams` of model_ops.cu (`model_sample`).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SampleParams {
    /// Logits `[num_rows, v]` f32.
    pub x: u64,
    /// Sampling rows `[num_rows, 4]` f32 (temperature, top_p, uniform, unused).
    pub rows: u64,
    /// Result `[num_rows]` i32.
    pub out: u64,
    /// Rows.
    pub num_rows: i64,
    /// Row length (vocabulary).
    pub v: i32,
    /// Padding.
    pub pad: i32,
}

/// `SwigluParams` of model_ops.cu (`model_swiglu`).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SwigluParams {
    /// Fused gate/up projection `[rows, 2 · width]` f32.
    pub gate_up: u64,
    /// Result `[rows, width]` f32.
    pub out: u64,
    /// Rows (tokens).
    pub rows: i64,
    /// Output width (the MLP's intermediate size).
    pub width: i32,
    /// 1: float4 accesses.
    pub vec4: i32,
}

/// `RopeSplitParams` of model_ops.cu (`model_rope_split`).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RopeSplitParams {
    /// Fused projection `[T, H + 2·Hk, d]` f32.
    pub qkv: u64,
    /// `[T]` i32.
    pub positions: u64,
    /// `[T, H, d]` rotated queries.
    pub q: u64,
    /// `[T, Hk, d]` rotated keys.
    pub k: u64,
    /// `[T, Hk, d]` values.
    pub v: u64,
    /// Tokens.
    pub num_tokens: i64,
    /// Query heads H.
    pub num_heads: i32,
    /// Key / value heads Hk.
    pub num_kv_heads: i32,
    /// d / 2.
    pub half: i32,
    /// RoPE base θ.
    pub base: f32,
    /// 1: pairs (2i, 2i+1); 0: (i, i + d/2).
    pub interleaved: i32,
    /// Padding.
    pub pad: i32,
}

const _: () = assert!(std::mem::size_of::<ArgmaxParams>() == 32);
const _: () = assert!(std::mem::size_of::<SampleParams>() == 40);
const _: () = assert!(std::mem::size_of::<SwigluParams>() == 32);
const _: () = assert!(std::mem::size_of::<RopeSplitParams>() == 72);
const _: () = assert!(std::mem::size_of::<GatherParams>() == 48);
const _: () = assert!(std::mem::size_of::<RmsNormParams>() == 48);
const _: () = assert!(std::mem::size_of::<LinearParams>() == 120);
const _: () = assert!(std::mem::size_of::<RopeParams>() == 40);
const _: () = assert!(std::mem::size_of::<EltwiseParams>() == 40);
