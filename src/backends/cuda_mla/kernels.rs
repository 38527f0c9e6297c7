//! The CUDA MLA backend's kernel glue: the launches of the family's MLA kernels
//! (`mla_decode_mma.cu` or `mla_decode.cu`, `mla_cache.cu`, `mla_prefill.cu`) and of the
//! `kv_b_proj` GEMM
//! (`model_ops.cu`'s `model_linear_tiled`) through the CUDA runtime, from parameter blocks
//! the impl fills.

use cudarc::driver::LaunchConfig;

use crate::device::CudaDevice;
use crate::error::Result;
use crate::kernels::cuda::{
    LinearParams, MlaCacheParams, MlaCombineParams, MlaDecodeForm, MlaDecodeParams,
    MlaGatherParams, MlaPrefillParams, MLA_CACHE, MLA_CACHE_THREADS, MLA_DECODE, MLA_PREFILL,
    MLA_ROW_WARPS, MODEL_OPS,
};

pub(crate) use crate::backends::cuda::kernels::{i32_of, tensor_ptr};
use crate::device::cuda::{function, launch};

/// Tile of `model_linear_tiled` (64 x 64 outputs per CTA of 256 threads).
const LINEAR_TILE: usize = 64;

/// CTAs of a grid-stride launch over `units` items, 256 threads each (at most 8192 CTAs).
fn stride_ctas(units: usize) -> u32 {
    units.div_ceil(MLA_CACHE_THREADS as usize).clamp(1, 8192) as u32
}

/// Queues the decode kernel of `form` on grid (row tiles, requests, splits).
pub(crate) fn launch_decode(
    device: &CudaDevice,
    form: MlaDecodeForm,
    bf16: bool,
    fp8: bool,
    grid: (u32, u32, u32),
    params: &MlaDecodeParams,
) -> Result<()> {
    let defines = form.defines(bf16, fp8);
    let defines: Vec<&str> = defines.iter().map(String::as_str).collect();
    let f = function(
        device,
        &form.source(),
        &defines,
        &form.function_name(bf16, fp8),
    )?;
    let cfg = LaunchConfig {
        grid_dim: grid,
        block_dim: (form.threads(), 1, 1),
        shared_mem_bytes: form.smem_bytes(fp8),
    };
    launch(device, &f, cfg, params, None)
}

/// Queues the split combine over `rows` (token, head) rows.
pub(crate) fn launch_combine(
    device: &CudaDevice,
    rows: usize,
    params: &MlaCombineParams,
) -> Result<()> {
    let f = function(device, &MLA_DECODE, &[], "mla_combine")?;
    let cfg = LaunchConfig {
        grid_dim: (
            i32_of("MLA combine CTAs", rows.div_ceil(MLA_ROW_WARPS))? as u32,
            1,
            1,
        ),
        block_dim: ((MLA_ROW_WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(device, &f, cfg, params, None)
}

/// Queues `concat_and_cache_mla` over `elements` (tokens x latent width) elements.
pub(crate) fn launch_cache_write(
    device: &CudaDevice,
    elements: usize,
    params: &MlaCacheParams,
) -> Result<()> {
    let f = function(device, &MLA_CACHE, &[], "concat_and_cache_mla")?;
    let cfg = LaunchConfig {
        grid_dim: (stride_ctas(elements), 1, 1),
        block_dim: (MLA_CACHE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(device, &f, cfg, params, None)
}

/// Queues the latent gather of one prefill chunk: `requests` CTA rows, each over its
/// positions (at most `max_rows`) x `latent_dim` elements.
pub(crate) fn launch_gather(
    device: &CudaDevice,
    requests: usize,
    max_rows: usize,
    latent_dim: usize,
    params: &MlaGatherParams,
) -> Result<()> {
    let f = function(device, &MLA_CACHE, &[], "mla_gather_latents")?;
    let cfg = LaunchConfig {
        grid_dim: (
            stride_ctas(max_rows * latent_dim),
            i32_of("MLA prefill requests", requests)? as u32,
            1,
        ),
        block_dim: (MLA_CACHE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(device, &f, cfg, params, None)
}

/// Queues `y [t][n] = x [t][k] · w [n][k]^T` (f32) with the tiled GEMM of `model_ops.cu`.
pub(crate) fn launch_linear(device: &CudaDevice, params: &LinearParams) -> Result<()> {
    let f = function(device, &MODEL_OPS, &[], "model_linear_tiled")?;
    let (t, n) = (params.t as usize, params.n as usize);
    let gy = t.div_ceil(LINEAR_TILE);
    if gy > 65535 {
        return Err(crate::error::Error::config(format!(
            "the MLA prefill chunk of {t} rows exceeds the GEMM's grid"
        )));
    }
    let cfg = LaunchConfig {
        grid_dim: (
            i32_of("GEMM tiles", n.div_ceil(LINEAR_TILE))? as u32,
            gy as u32,
            1,
        ),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(device, &f, cfg, params, None)
}

/// Queues the prefill attention of one chunk: `requests` CTA rows of
/// `ceil(max_rows / 4)` CTAs (one warp per (token, head) row).
pub(crate) fn launch_prefill(
    device: &CudaDevice,
    requests: usize,
    max_rows: usize,
    params: &MlaPrefillParams,
) -> Result<()> {
    let f = function(device, &MLA_PREFILL, &[], "mla_prefill_attention")?;
    let cfg = LaunchConfig {
        grid_dim: (
            i32_of("MLA prefill CTAs", max_rows.div_ceil(MLA_ROW_WARPS))? as u32,
            i32_of("MLA prefill requests", requests)? as u32,
            1,
        ),
        block_dim: ((MLA_ROW_WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(device, &f, cfg, params, None)
}
