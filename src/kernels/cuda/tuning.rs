//! [`CudaTuning`]: every environment knob of the CUDA kernel family, parsed once by
//! [`CudaTuning::from_env`] (docs/TUNING.md lists them with the other families'). The CUDA
//! backend reads them (which kernel runs a request, the planner's split count, the GPU it
//! opens); the family only names them and their ranges.

use std::sync::OnceLock;

use super::shapes::{MmaShape, DECODE_MAX_SPLITS, MMA_SHAPES};

use crate::kernels::tuning_env::{self, Env};

/// Picks the CUDA backend's prefill kernel: `auto`, `0` / `1` (the CUDA-core kernel / the
/// `mma.sync` tensor-core kernel) or `amd-wmma`; see [`CudaTuning::mma`].
pub const MMA_ENV: &str = "POLYATTN_CUDA_MMA";
/// Forces the query rows per CTA of the tensor-core prefill kernel; see
/// [`CudaTuning::mma_shape`].
pub const MMA_ROWS_ENV: &str = "POLYATTN_CUDA_MMA_ROWS";
/// Forces the warps per CTA of the tensor-core prefill kernel; see [`CudaTuning::mma_shape`].
pub const MMA_WARPS_ENV: &str = "POLYATTN_CUDA_MMA_WARPS";
/// Forces the keys per online-softmax step of the tensor-core prefill kernel; see
/// [`CudaTuning::mma_subk`].
pub const MMA_SUBK_ENV: &str = "POLYATTN_CUDA_MMA_SUBK";
/// Turns the decode kernels off (`0`) or on (`1`); see [`CudaTuning::decode`].
pub const DECODE_ENV: &str = "POLYATTN_CUDA_DECODE";
/// Forces the split count of every decode token; see [`CudaTuning::decode_splits`].
pub const DECODE_SPLITS_ENV: &str = "POLYATTN_CUDA_DECODE_SPLITS";
/// Picks the GPU ordinal; see [`CudaTuning::device`].
pub const CUDA_DEVICE_ENV: &str = "POLYATTN_CUDA_DEVICE";
/// [`CudaTuning::mla_prefill_chunk`].
pub const MLA_PREFILL_CHUNK_ENV: &str = "POLYATTN_CUDA_MLA_PREFILL_CHUNK";
/// Picks the MLA decode kernel (`mma` / `portable`); see [`CudaTuning::mla_decode`].
pub const MLA_DECODE_ENV: &str = "POLYATTN_CUDA_MLA_DECODE";
/// Turns dependent launches off (`0`) or on (`1`); see [`CudaTuning::dependent_launch`].
pub const DEPENDENT_LAUNCH_ENV: &str = "POLYATTN_CUDA_DEPENDENT_LAUNCH";

/// Which kernel runs `CUDA_MLA`'s latent decode ([`CudaTuning::mla_decode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaDecodeKernel {
    /// `mla_decode_mma.cu` on the tensor cores (`mma`, the default).
    TensorCores,
    /// `mla_decode.cu`, the portable form the HIP backend's MLA decode compiles (`portable`):
    /// slower; it exists so that the AMD decode's tiling, masks and softmax run through the
    /// shared test bodies on an NVIDIA GPU.
    Portable,
}

/// Which kernel runs the CUDA backend's prefill band ([`CudaTuning::mma`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaKernel {
    /// The fastest kernel the device and layer have (`auto`, the default): the Hopper kernel
    /// (`paged_attention_wgmma_ws.cu`: wgmma, built for sm_90a) on compute capability 9.0 where
    /// it has the head size (64, 128), else the `mma.sync` tensor-core kernel.
    Auto,
    /// The CUDA-core kernel (`paged_attention.cu`), as for short queries (`0`).
    CudaCores,
    /// The `mma.sync` tensor-core kernel (`paged_attention_mma.cu`; `1`) on every GPU from
    /// sm_80, Hopper included: the A/B of the Hopper kernel, and its fallback.
    TensorCores,
    /// The HIP backend's matrix-core prefill (`kernels-hip/paged_attention_matrix.hip`) in its
    /// RDNA3 WMMA form, the matrix product emulated by warp shuffles (`amd-wmma`). Many times
    /// slower than either kernel above; it exists so that the AMD kernel's tiling, masks,
    /// softmax and stores run through the shared test bodies on an NVIDIA GPU.
    AmdWmmaEmulated,
}

/// The knobs of the CUDA kernel family. [`CudaTuning::default`] is what runs when no
/// variable is set; [`CudaTuning::get`] is the process's tuning, read from the environment
/// once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaTuning {
    /// The kernel of prefill requests of at least the backend's `MMA_MIN_QUERY_LEN` (16)
    /// query tokens (f16 / bf16 with a same-dtype cache, head size 64 / 96 / 128, sm_80+).
    /// [`MMA_ENV`]: `auto` / `0` / `1` / `amd-wmma`; default [`MmaKernel::Auto`].
    pub mma: MmaKernel,
    /// The CTA shape of the tensor-core prefill kernel, one of [`MMA_SHAPES`]; `None`
    /// (the default) chooses per batch (the backend's `mma_shape_for`). [`MMA_ROWS_ENV`] (64,
    /// 128 or 256) and [`MMA_WARPS_ENV`] (4 or 8); a row count alone takes the fewest warps
    /// that hold it (4 up to 128 rows, 8 for 256), a warp count alone 64 rows.
    pub mma_shape: Option<MmaShape>,
    /// Keys per online-softmax step of the tensor-core prefill kernel (`-DPA_MMA_SUBK`):
    /// 32 or 64. `None` (the default): 64, except 32 in the soft cap / ALiBi build with two
    /// m16 tiles per warp, where 64 keys spill registers. [`MMA_SUBK_ENV`].
    pub mma_subk: Option<u32>,
    /// Run single-token decodes on the decode kernels: f16 / bf16 activations with a
    /// same-dtype or fp8 cache, head size 64 / 96 / 128, sm_80+, on the tensor-core split-KV
    /// decode kernel (`paged_decode.cu`); f32 activations and cache at head size 64 without
    /// soft cap, ALiBi or sinks on the CUDA-core decode kernel (`paged_decode_cores.cu`). Off,
    /// they run on the general CUDA-core split-KV
    /// kernel. [`DECODE_ENV`]: `0` / `1`; default on.
    pub decode: bool,
    /// Splits asked of every splittable decode token on the decode kernel (1 to
    /// [`DECODE_MAX_SPLITS`], still capped by the fewest keys per split); `None` (the
    /// default): the wave-filling rule of the planner. [`DECODE_SPLITS_ENV`].
    pub decode_splits: Option<usize>,
    /// The GPU ordinal the backend opens. [`CUDA_DEVICE_ENV`]: a non-negative integer;
    /// default 0.
    pub device: usize,
    /// Key positions per chunk of the MLA prefill (`CUDA_MLA`'s `forward_mha`; a multiple of
    /// 32); `None` (the default): the most whose expanded workspace fits 256 MiB.
    /// [`MLA_PREFILL_CHUNK_ENV`]; small values run long contexts as many chunks (the chunk
    /// continuation is tested that way).
    pub mla_prefill_chunk: Option<usize>,
    /// The kernel of `CUDA_MLA`'s latent decode. [`MLA_DECODE_ENV`]: `mma` / `portable`;
    /// default [`MlaDecodeKernel::TensorCores`].
    pub mla_decode: MlaDecodeKernel,
    /// On sm_90 and newer, launch the model operations, the cache write and the CUDA-core
    /// attention kernels as programmatic dependents of the kernel before them (each starts
    /// launching while that one runs and waits for it in its first instruction), which hides
    /// most of a small kernel's launch latency in a decode step of many. [`DEPENDENT_LAUNCH_ENV`]:
    /// `0` / `1`; default on.
    pub dependent_launch: bool,
}

impl Default for CudaTuning {
    fn default() -> Self {
        CudaTuning {
            mma: MmaKernel::Auto,
            mma_shape: None,
            mma_subk: None,
            decode: true,
            decode_splits: None,
            device: 0,
            mla_prefill_chunk: None,
            mla_decode: MlaDecodeKernel::TensorCores,
            dependent_launch: true,
        }
    }
}

impl CudaTuning {
    /// The process's tuning: [`CudaTuning::from_env`], read on first use.
    pub fn get() -> &'static CudaTuning {
        static TUNING: OnceLock<CudaTuning> = OnceLock::new();
        TUNING.get_or_init(CudaTuning::from_env)
    }

    /// The defaults with every variable that is set applied; a value that does not parse
    /// keeps its default and is warned about (`tracing`).
    pub fn from_env() -> Self {
        Self::from_lookup(&tuning_env::process_env)
    }

    /// [`CudaTuning::from_env`] with the variables read through `lookup`.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Self {
        let env = Env::new(lookup);
        let d = CudaTuning::default();
        CudaTuning {
            mma: env.get(
                MMA_ENV,
                "auto, 0, 1 (or off / on) or amd-wmma",
                d.mma,
                "auto",
                |v| match v.trim().to_ascii_lowercase().as_str() {
                    "auto" => Some(MmaKernel::Auto),
                    "amd-wmma" => Some(MmaKernel::AmdWmmaEmulated),
                    other => tuning_env::parse_switch(other).map(|on| {
                        if on {
                            MmaKernel::TensorCores
                        } else {
                            MmaKernel::CudaCores
                        }
                    }),
                },
            ),
            mma_shape: mma_shape(&env),
            mma_subk: env.one_of(MMA_SUBK_ENV, &[32, 64], "chosen per build"),
            decode: env.switch(DECODE_ENV, d.decode),
            dependent_launch: env.switch(DEPENDENT_LAUNCH_ENV, d.dependent_launch),
            decode_splits: env.get(
                DECODE_SPLITS_ENV,
                &format!("an integer from 1 to {DECODE_MAX_SPLITS}"),
                None,
                "the wave rule",
                |v| {
                    let n = v.parse::<usize>().ok()?;
                    (1..=DECODE_MAX_SPLITS).contains(&n).then_some(Some(n))
                },
            ),
            device: env.int_in(CUDA_DEVICE_ENV, 0..=usize::MAX, d.device),
            mla_prefill_chunk: env.get(
                MLA_PREFILL_CHUNK_ENV,
                "a positive multiple of 32",
                None,
                "the workspace rule",
                |v| {
                    let n = v.parse::<usize>().ok()?;
                    (n > 0 && n % 32 == 0).then_some(Some(n))
                },
            ),
            mla_decode: env.get(
                MLA_DECODE_ENV,
                "mma or portable",
                d.mla_decode,
                "mma",
                |v| match v.trim().to_ascii_lowercase().as_str() {
                    "mma" => Some(MlaDecodeKernel::TensorCores),
                    "portable" => Some(MlaDecodeKernel::Portable),
                    _ => None,
                },
            ),
        }
    }

    /// The `-DPA_MMA_SUBK` option [`CudaTuning::mma_subk`] asks for, if any.
    pub fn mma_subk_define(&self) -> Option<&'static str> {
        match self.mma_subk {
            Some(32) => Some("-DPA_MMA_SUBK=32"),
            Some(64) => Some("-DPA_MMA_SUBK=64"),
            _ => None,
        }
    }
}

/// [`CudaTuning::mma_shape`] from its two variables.
fn mma_shape(env: &Env) -> Option<MmaShape> {
    let rows_v = env.raw(MMA_ROWS_ENV);
    let warps_v = env.raw(MMA_WARPS_ENV);
    if rows_v.is_none() && warps_v.is_none() {
        return None;
    }
    let parse = |v: &Option<String>| v.as_deref().map(|v| v.trim().parse::<usize>().ok());
    let rows = parse(&rows_v).unwrap_or(Some(64));
    let warps = parse(&warps_v).unwrap_or(match rows {
        Some(r) if r > 128 => Some(8),
        _ => Some(4),
    });
    match (rows, warps) {
        (Some(rows), Some(warps)) if MMA_SHAPES.contains(&MmaShape { rows, warps }) => {
            Some(MmaShape { rows, warps })
        }
        _ => {
            let shapes: Vec<String> = MMA_SHAPES
                .iter()
                .map(|s| format!("{} rows on {} warps", s.rows, s.warps))
                .collect();
            tracing::warn!(
                "{MMA_ROWS_ENV}={} / {MMA_WARPS_ENV}={} is not one of {}; using the default \
                 (chosen per batch)",
                rows_v.as_deref().unwrap_or("(unset)"),
                warps_v.as_deref().unwrap_or("(unset)"),
                shapes.join(", ")
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuning(pairs: &[(&str, &str)]) -> CudaTuning {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CudaTuning::from_lookup(&move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn defaults_without_variables() {
        assert_eq!(tuning(&[]), CudaTuning::default());
        assert_eq!(CudaTuning::default().mma_subk_define(), None);
    }

    #[test]
    fn every_knob_parses() {
        let t = tuning(&[
            (MMA_ENV, "0"),
            (MMA_ROWS_ENV, "128"),
            (MMA_WARPS_ENV, "8"),
            (MMA_SUBK_ENV, "32"),
            (DECODE_ENV, "off"),
            (DECODE_SPLITS_ENV, "12"),
            (CUDA_DEVICE_ENV, "3"),
            (MLA_PREFILL_CHUNK_ENV, "64"),
            (MLA_DECODE_ENV, "portable"),
            (DEPENDENT_LAUNCH_ENV, "0"),
        ]);
        assert_eq!(
            t,
            CudaTuning {
                mma: MmaKernel::CudaCores,
                mma_shape: Some(MmaShape {
                    rows: 128,
                    warps: 8
                }),
                mma_subk: Some(32),
                decode: false,
                decode_splits: Some(12),
                device: 3,
                mla_prefill_chunk: Some(64),
                mla_decode: MlaDecodeKernel::Portable,
                dependent_launch: false,
            }
        );
        assert_eq!(t.mma_subk_define(), Some("-DPA_MMA_SUBK=32"));
        // A row count alone takes the fewest warps that hold it.
        let s = |rows| tuning(&[(MMA_ROWS_ENV, rows)]).mma_shape;
        assert_eq!(
            s("256"),
            Some(MmaShape {
                rows: 256,
                warps: 8
            })
        );
        assert_eq!(
            s("128"),
            Some(MmaShape {
                rows: 128,
                warps: 4
            })
        );
    }

    #[test]
    fn rejected_values_keep_the_defaults() {
        let t = tuning(&[
            (MMA_ENV, "maybe"),
            (MMA_ROWS_ENV, "96"),
            (MMA_SUBK_ENV, "48"),
            (DECODE_SPLITS_ENV, "0"),
            (CUDA_DEVICE_ENV, "-1"),
            (MLA_DECODE_ENV, "fast"),
        ]);
        assert_eq!(t, CudaTuning::default());
        assert_eq!(tuning(&[(DECODE_SPLITS_ENV, "129")]).decode_splits, None);
        assert_eq!(tuning(&[(MMA_WARPS_ENV, "x")]).mma_shape, None);
    }

    #[test]
    fn the_prefill_kernel_choice() {
        let k = |v| tuning(&[(MMA_ENV, v)]).mma;
        assert_eq!(k("on"), MmaKernel::TensorCores);
        assert_eq!(k("auto"), MmaKernel::Auto);
        assert_eq!(k(" AUTO "), MmaKernel::Auto);
        assert_eq!(k("0"), MmaKernel::CudaCores);
        assert_eq!(k("AMD-WMMA"), MmaKernel::AmdWmmaEmulated);
        assert_eq!(k("amd"), MmaKernel::Auto);
    }
}
