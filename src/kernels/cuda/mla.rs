//! The MLA kernels of the family as plain data: the parameter blocks of `mla_params.cuh`,
//! `mla_cache.cu` and `mla_prefill.cu` (sizes asserted against the C++ side), the decode's
//! two forms ([`MlaDecodeForm`]: NVIDIA's tensor cores, or the portable kernel every
//! compiler of the family builds) with their entry points, CTA shapes and shared memory, and
//! the split-KV policy.

use crate::error::{Error, Result};

use super::sources::{KernelSource, MLA_DECODE, MLA_DECODE_MMA};

/// The latent width the CUDA MLA kernels are built for (`kv_lora_rank` 512 + rope 64).
pub const MLA_LATENT_DIM: usize = 576;
/// The value width (`kv_lora_rank`) of the decode kernel.
pub const MLA_VALUE_DIM: usize = 512;
/// Keys per chunk of the decode kernel; block sizes must be multiples of it.
pub const MLA_KEYS: usize = 32;
/// Shared-memory stages of the decode kernel.
pub const MLA_STAGES: usize = 2;
/// The most splits of one decode launch (`mla_combine` holds two LSEs per lane).
pub const MLA_MAX_SPLITS: usize = 64;
/// Warps (rows) per CTA of `mla_combine` and `mla_prefill_attention`.
pub const MLA_ROW_WARPS: usize = 4;
/// The widest query-key and value dims of `mla_prefill_attention` (8 per lane).
pub const MLA_PREFILL_MAX_DIM: usize = 256;
/// Threads per CTA of the grid-stride kernels of `mla_cache.cu`.
pub const MLA_CACHE_THREADS: u32 = 256;

/// `MlaDecodeParams` of `mla_params.cuh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MlaDecodeParams {
    /// `[T][H][576]` absorbed queries.
    pub q: u64,
    /// `[blocks][block_size][576]` latent cache.
    pub cache: u64,
    /// `[T][H][512]` output.
    pub out: u64,
    /// `[H][T]` f32 LSE, or 0.
    pub lse: u64,
    /// `[splits][T * H][512]` f32 partial outputs (split launches).
    pub part_out: u64,
    /// `[splits][T * H]` f32 partial LSEs.
    pub part_lse: u64,
    /// `[reqs + 1]` i32.
    pub query_start_loc: u64,
    /// `[reqs]` i32.
    pub seq_lens: u64,
    /// `[reqs][bt_stride]` i32.
    pub block_table: u64,
    /// Softmax scale (fp8 caches: times `k_scale`).
    pub scale: f32,
    /// Output factor (fp8: `k_scale`, else 1).
    pub v_scale: f32,
    /// Query heads.
    pub num_heads: i32,
    /// Query tokens of the launch.
    pub num_tokens: i32,
    /// Cache block size.
    pub block_size: i32,
    /// Block-table row width.
    pub bt_stride: i32,
    /// Splits of every request's key range.
    pub num_splits: i32,
    /// Padding.
    pub pad: i32,
}

/// `MlaCombineParams` of `mla_params.cuh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MlaCombineParams {
    /// `[splits][T * H][512]` f32.
    pub part_out: u64,
    /// `[splits][T * H]` f32.
    pub part_lse: u64,
    /// `[T][H][512]` output.
    pub out: u64,
    /// `[H][T]` f32 LSE, or 0.
    pub lse: u64,
    /// Query heads.
    pub num_heads: i32,
    /// Query tokens.
    pub num_tokens: i32,
    /// Splits.
    pub num_splits: i32,
    /// Output dtype code.
    pub out_dtype: i32,
}

/// `MlaCacheParams` of `mla_cache.cu` (`concat_and_cache_mla`).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MlaCacheParams {
    /// `[T][kv_lora_rank]`.
    pub kv_c: u64,
    /// `[T][rope]`.
    pub k_pe: u64,
    /// `[blocks][block_size][kv_lora_rank + rope]`.
    pub cache: u64,
    /// `[T]` i64 slots (−1: skipped).
    pub slot_mapping: u64,
    /// fp8: the divisor of every stored value, else 1.
    pub scale: f32,
    /// Tokens.
    pub num_tokens: i32,
    /// Latent dims without RoPE.
    pub kv_lora_rank: i32,
    /// RoPE dims.
    pub rope_dim: i32,
    /// Input dtype code.
    pub act_dtype: i32,
    /// Cache dtype code.
    pub cache_dtype: i32,
    /// Cache block size.
    pub block_size: i32,
    /// Padding.
    pub pad: i32,
}

/// `MlaGatherParams` of `mla_cache.cu` (`mla_gather_latents`).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MlaGatherParams {
    /// `[Tp][kv_lora_rank]` new tokens' latents.
    pub kv_c: u64,
    /// `[Tp][rope]`.
    pub k_pe: u64,
    /// The latent cache.
    pub cache: u64,
    /// `[rows][kv_lora_rank]` f32 out.
    pub kvc: u64,
    /// `[rows][rope]` f32 out.
    pub pe: u64,
    /// `[reqs + 1]` i32.
    pub query_start_loc: u64,
    /// `[reqs]` i32.
    pub seq_lens: u64,
    /// `[reqs][bt_stride]` i32.
    pub block_table: u64,
    /// `[n + 1]` i32 first row of each prefill request.
    pub starts: u64,
    /// fp8: the factor of every cached value, else 1.
    pub k_scale: f32,
    /// The first prefill request.
    pub first_req: i32,
    /// `query_start_loc[first_req]`.
    pub q_base: i32,
    /// The chunk's first position.
    pub chunk_lo: i32,
    /// Positions per chunk.
    pub chunk: i32,
    /// Latent dims without RoPE.
    pub kv_lora_rank: i32,
    /// RoPE dims.
    pub rope_dim: i32,
    /// Input dtype code.
    pub act_dtype: i32,
    /// Cache dtype code.
    pub cache_dtype: i32,
    /// Cache block size.
    pub block_size: i32,
    /// Block-table row width.
    pub bt_stride: i32,
    /// Padding.
    pub pad: i32,
}

/// `MlaPrefillParams` of `mla_prefill.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MlaPrefillParams {
    /// `[Tp][H][qk]` queries.
    pub q: u64,
    /// `[rows][H][qk_nope + v]` f32 expanded latents.
    pub kvx: u64,
    /// `[rows][rope]` f32.
    pub pe: u64,
    /// `[Tp][H][v]` f32 running output.
    pub acc: u64,
    /// `[Tp][H][2]` f32 running max and denominator.
    pub ml: u64,
    /// `[Tp][H][v]` output.
    pub out: u64,
    /// `[reqs + 1]` i32.
    pub query_start_loc: u64,
    /// `[reqs]` i32.
    pub seq_lens: u64,
    /// `[n + 1]` i32.
    pub starts: u64,
    /// Softmax scale.
    pub scale: f32,
    /// Query heads.
    pub num_heads: i32,
    /// The first prefill request.
    pub first_req: i32,
    /// `query_start_loc[first_req]`.
    pub q_base: i32,
    /// The chunk's first position.
    pub chunk_lo: i32,
    /// Positions per chunk.
    pub chunk: i32,
    /// Query / key dims without RoPE.
    pub qk_nope: i32,
    /// RoPE dims.
    pub rope_dim: i32,
    /// Value dims.
    pub v_dim: i32,
    /// Activation dtype code.
    pub act_dtype: i32,
    /// 1 on the first chunk.
    pub first: i32,
    /// 1 on the last chunk.
    pub last: i32,
}

const _: () = assert!(std::mem::size_of::<MlaDecodeParams>() == 104);
const _: () = assert!(std::mem::size_of::<MlaCombineParams>() == 48);
const _: () = assert!(std::mem::size_of::<MlaCacheParams>() == 64);
const _: () = assert!(std::mem::size_of::<MlaGatherParams>() == 120);
const _: () = assert!(std::mem::size_of::<MlaPrefillParams>() == 120);

/// The decode kernel's CTA shape: `row_groups` (1, 2 or 4) groups of 16 rows, each on
/// [`MLA_GROUP_WARPS`] warps that share its score dims and value columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaDecodeShape {
    /// Groups of 16 rows (1, 2 or 4).
    pub row_groups: usize,
}

/// Warps per 16-row group of the tensor-core decode (`MLA_GROUP_WARPS` of
/// `mla_decode_mma.cu`).
pub const MLA_GROUP_WARPS: usize = 2;

impl MlaDecodeShape {
    /// The smallest shape that holds `rows_per_request` rows (`q_len * heads`) in one CTA,
    /// else the largest (64 rows, several CTAs per request).
    pub fn for_rows(rows_per_request: usize) -> Self {
        let row_groups = match rows_per_request.div_ceil(16) {
            0 | 1 => 1,
            2 => 2,
            _ => 4,
        };
        MlaDecodeShape { row_groups }
    }

    /// Rows per CTA.
    pub fn rows(self) -> usize {
        16 * self.row_groups
    }

    /// Threads per CTA.
    pub fn threads(self) -> u32 {
        (32 * MLA_GROUP_WARPS * self.row_groups) as u32
    }

    /// Dynamic shared memory: Q, the stages (fp8: raw, then one converted tile), the score
    /// exchange (the layout in `mla_decode_mma.cu`'s header).
    pub fn smem_bytes(self, fp8: bool) -> u32 {
        let s = MLA_LATENT_DIM + 8;
        let q = self.rows() * s * 2;
        let stage = if fp8 {
            MLA_KEYS * (MLA_LATENT_DIM + 16)
        } else {
            MLA_KEYS * s * 2
        };
        let conv = if fp8 { MLA_KEYS * s * 2 } else { 0 };
        let exchange = MLA_GROUP_WARPS * self.row_groups * 16 * 32 * 4;
        (q + MLA_STAGES * stage + conv + exchange) as u32
    }

    /// The entry point for a bf16 (else f16) query and an E4M3 (else same-dtype) cache.
    pub fn function_name(self, bf16: bool, fp8: bool) -> String {
        format!(
            "mla_decode_{}{}_r{}",
            if bf16 { "bf16" } else { "f16" },
            if fp8 { "_e4m3" } else { "" },
            self.row_groups
        )
    }
}

/// Query rows per CTA of the portable decode (`mla_decode.cu`).
pub const MLA_PORTABLE_ROWS: usize = 16;
/// Threads per CTA of the portable decode (16 per row).
pub const MLA_PORTABLE_THREADS: u32 = 256;

/// Which of the family's two MLA decode kernels runs a launch, and in which shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaDecodeForm {
    /// `mla_decode_mma.cu`: `mma.sync`, `ldmatrix` and `cp.async` (NVIDIA, sm_80 and newer),
    /// 16, 32 or 64 rows per CTA.
    TensorCores(MlaDecodeShape),
    /// `mla_decode.cu`: f32 arithmetic on the vector ALUs, no fixed warp width (every
    /// compiler of the family: NVRTC, hiprtc), 16 rows per CTA in at most 58 KB of shared
    /// memory (inside AMD's 64 KB of LDS per workgroup).
    Portable,
}

impl MlaDecodeForm {
    /// The source that defines the form's entry points.
    pub fn source(self) -> KernelSource {
        match self {
            MlaDecodeForm::TensorCores(_) => MLA_DECODE_MMA,
            MlaDecodeForm::Portable => MLA_DECODE,
        }
    }

    /// The `-D` options that build only the variant a launch needs (none: the portable
    /// module builds its four small variants together).
    pub fn defines(self, bf16: bool, fp8: bool) -> Vec<String> {
        match self {
            MlaDecodeForm::TensorCores(shape) => vec![
                format!("-DMLA_RG={}", shape.row_groups),
                format!("-DMLA_BF16={}", bf16 as i32),
                format!("-DMLA_KV={}", fp8 as i32),
            ],
            MlaDecodeForm::Portable => Vec::new(),
        }
    }

    /// Rows per CTA.
    pub fn rows(self) -> usize {
        match self {
            MlaDecodeForm::TensorCores(shape) => shape.rows(),
            MlaDecodeForm::Portable => MLA_PORTABLE_ROWS,
        }
    }

    /// Threads per CTA.
    pub fn threads(self) -> u32 {
        match self {
            MlaDecodeForm::TensorCores(shape) => shape.threads(),
            MlaDecodeForm::Portable => MLA_PORTABLE_THREADS,
        }
    }

    /// Dynamic shared memory per CTA.
    pub fn smem_bytes(self, fp8: bool) -> u32 {
        match self {
            MlaDecodeForm::TensorCores(shape) => shape.smem_bytes(fp8),
            MlaDecodeForm::Portable => {
                let row = if fp8 {
                    MLA_LATENT_DIM + 16
                } else {
                    (MLA_LATENT_DIM + 8) * 2
                };
                let q = MLA_PORTABLE_ROWS * (MLA_LATENT_DIM + 8) * 2;
                let p = MLA_PORTABLE_ROWS * MLA_KEYS * 4;
                (q + MLA_KEYS * row + p) as u32
            }
        }
    }

    /// The entry point for a bf16 (else f16) query and an E4M3 (else same-dtype) cache.
    pub fn function_name(self, bf16: bool, fp8: bool) -> String {
        match self {
            MlaDecodeForm::TensorCores(shape) => shape.function_name(bf16, fp8),
            MlaDecodeForm::Portable => format!(
                "mla_decode_portable_{}{}",
                if bf16 { "bf16" } else { "f16" },
                if fp8 { "_e4m3" } else { "" }
            ),
        }
    }

    /// CTAs resident on one SM / CU of `shared_bytes` usable shared memory (NVIDIA's 227 KiB,
    /// AMD's 64 KiB), as the split rule counts them.
    pub fn resident(self, fp8: bool, shared_bytes: usize) -> usize {
        (shared_bytes / self.smem_bytes(fp8) as usize).max(1)
    }
}

/// Usable shared memory per SM of the NVIDIA GPUs the tensor-core decode targets (sm_80+).
pub const NVIDIA_SHARED_PER_SM: usize = 227 * 1024;

/// Splits of every request's key range for a decode launch of `ctas` CTAs per split on
/// `sm_count` SMs with `resident_per_sm` CTAs resident on each.
///
/// Every CTA of a launch does about the same work, so a launch runs in whole waves of
/// resident CTAs: 1.1 waves take as long as 2. The rule (FlashDecoding's) takes the
/// fewest splits whose wave efficiency (`waves / ceil(waves)`) is within 0.85 of the best
/// any split count reaches, among split counts that keep at least two chunks of keys per
/// split of the longest request and at most [`MLA_MAX_SPLITS`] (fewer splits write fewer
/// partials for the combine); a launch that cannot fill one wave takes the most.
pub fn mla_num_splits(
    ctas: usize,
    resident_per_sm: usize,
    sm_count: usize,
    max_seq: usize,
) -> usize {
    let slots = (sm_count.max(1) * resident_per_sm.max(1)) as f64;
    let ctas = ctas.max(1);
    let cap = max_seq.div_ceil(2 * MLA_KEYS).clamp(1, MLA_MAX_SPLITS);
    let efficiency = |n: usize| {
        let waves = (ctas * n) as f64 / slots;
        waves / waves.ceil()
    };
    if (ctas * cap) as f64 <= slots {
        return cap; // not one full wave even at the most splits: all the parallelism there is
    }
    let best = (1..=cap).map(efficiency).fold(0.0, f64::max);
    (1..=cap)
        .find(|&n| efficiency(n) >= 0.85 * best)
        .unwrap_or(1)
}

/// Checks that `block_size` suits the decode kernel (a multiple of [`MLA_KEYS`]).
pub fn check_mla_block_size(block_size: usize) -> Result<()> {
    if block_size == 0 || !block_size.is_multiple_of(MLA_KEYS) {
        return Err(Error::config(format!(
            "the CUDA MLA decode reads keys in chunks of {MLA_KEYS} that must not cross a \
             cache block: block size {block_size} is not a multiple of {MLA_KEYS}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_shapes_fit_the_gpu() {
        assert_eq!(MlaDecodeShape::for_rows(16).rows(), 16);
        assert_eq!(MlaDecodeShape::for_rows(32).rows(), 32);
        assert_eq!(MlaDecodeShape::for_rows(33).rows(), 64);
        assert_eq!(MlaDecodeShape::for_rows(128).rows(), 64);
        assert_eq!(MlaDecodeShape::for_rows(128).threads(), 256);
        let forms =
            [1, 2, 4].map(|row_groups| MlaDecodeForm::TensorCores(MlaDecodeShape { row_groups }));
        for form in forms.into_iter().chain([MlaDecodeForm::Portable]) {
            for fp8 in [false, true] {
                assert!(
                    form.smem_bytes(fp8) as usize <= NVIDIA_SHARED_PER_SM,
                    "{form:?} {fp8}"
                );
            }
            // Every form the host can ask for is an entry point of its source.
            for bf16 in [false, true] {
                for fp8 in [false, true] {
                    let name = form.function_name(bf16, fp8);
                    assert!(form.source().functions.contains(&name.as_str()), "{name}");
                }
            }
        }
        // The portable form fits one AMD workgroup's 64 KiB of LDS.
        assert_eq!(MlaDecodeForm::Portable.smem_bytes(false), 58_112);
        assert!(MlaDecodeForm::Portable.smem_bytes(true) <= 64 * 1024);
        assert_eq!(MlaDecodeForm::Portable.resident(false, 64 * 1024), 1);
        assert_eq!(
            MlaDecodeShape { row_groups: 4 }.function_name(true, true),
            "mla_decode_bf16_e4m3_r4"
        );
        assert!(check_mla_block_size(64).is_ok());
        assert!(check_mla_block_size(16).is_err());
    }

    #[test]
    fn splits_fill_whole_waves() {
        // Short contexts: one chunk pair per split at most.
        assert_eq!(mla_num_splits(2, 1, 132, 64), 1);
        // 128 one-tile requests at two CTAs per SM (264 slots): 2 splits fill 0.97 of one
        // wave, where 5 (2.4 waves in 3) would fill 0.81.
        assert_eq!(mla_num_splits(128, 2, 132, 32768), 2);
        // 64 requests: 4 splits, 0.97 of one wave.
        assert_eq!(mla_num_splits(64, 2, 132, 4096), 4);
        // 32 CTAs at one per SM: 4 splits (128 of 132 slots).
        assert_eq!(mla_num_splits(32, 1, 132, 1024), 4);
        // One CTA on a long context: as many splits as waves allow, at most 64.
        assert_eq!(mla_num_splits(1, 1, 132, 1 << 20), MLA_MAX_SPLITS);
        // Whatever the inputs, a count within 1..=64 that keeps two chunks per split.
        for ctas in [1, 3, 17, 100, 1000, 5000] {
            for seq in [1, 63, 64, 65, 1000, 100_000] {
                let n = mla_num_splits(ctas, 2, 132, seq);
                assert!((1..=MLA_MAX_SPLITS).contains(&n));
                assert!(n <= seq.div_ceil(2 * MLA_KEYS).max(1), "{ctas} {seq} {n}");
            }
        }
    }
}
