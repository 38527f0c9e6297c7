//! The CUDA backend's kernel glue: how the backend launches the CUDA family through the CUDA
//! runtime — the tensor-core prefill kernel's CTA shape per batch, one launch function per
//! kernel (decode, CUDA-core attention and its split combine, the tensor-core prefills on
//! `mma.sync` and on Hopper's wgmma,
//! `reshape_and_cache`, `merge_attn_states`) over the planner's work lists, and the host
//! checks they share (device residency, i32 ranges). Under the names the backend's files use:
//! the planner's work item ([`WorkItem`], read by `paged_attention.cu`), the family's
//! work-item shape and the runtime's compile and launch.

use cudarc::driver::{CudaFunction, LaunchConfig};

use crate::attention::AttentionParams;
use crate::device::{CudaDevice, Device, Storage, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::cuda::{
    attention_function_name, attention_smem_bytes, attention_variant, decode_cores_smem_bytes,
    decode_cores_variant, decode_smem_bytes, matrix_smem_bytes, matrix_threads, matrix_variant,
    mma_smem_bytes, mma_variant, AttnParams, MatrixCores, MergeBuffers, MergeShape, MmaShape,
    ATTN_THREADS, DECODE_THREADS, MERGE_STATES, NVIDIA_WARP, PAGED_ATTENTION,
    PAGED_ATTENTION_MATRIX, PAGED_ATTENTION_MMA, PAGED_DECODE_CORES, RESHAPE_AND_CACHE,
};
use crate::kernels::cuda::{merge_launch, ReshapeLaunch};
use crate::kernels::cuda::{
    wgmma_smem_bytes, wgmma_variant, HOPPER_ARCH, PAGED_ATTENTION_WGMMA_WS, WGMMA_THREADS,
};

use super::metadata_builder::{CudaAttentionMetadata, CudaPlan};
use super::tuning::CudaTuning;

pub use crate::kernels::cuda::{KEYS_PER_CHUNK, ROWS_PER_ITEM};
pub use crate::plan::WorkItem;

pub(crate) use crate::device::cuda::{function, function_for, launch, launch_dependent};

/// The tensor-core prefill kernel's CTA shape for small prefill batches: 64 rows on 4 warps
/// (one m16 tile per warp; about 185 registers).
pub const MMA_SHAPE_SMALL: MmaShape = MmaShape { rows: 64, warps: 4 };

/// The tensor-core prefill kernel's CTA shape for large prefill batches: 128 rows on 4 warps
/// (two m16 tiles per warp share every K/V fragment, which halves the shared-memory traffic
/// per FLOP; 255 registers, 32-key softmax steps).
pub const MMA_SHAPE_LARGE: MmaShape = MmaShape {
    rows: 128,
    warps: 4,
};

/// [`MMA_SHAPE_LARGE`] is used when its plan has at least this many CTAs per SM (two full
/// waves at its two resident CTAs per SM); below that, half as many rows per CTA balance the
/// causal tiles' unequal lengths better (a 1k-token prefill, 256 large CTAs on a 132-SM GPU,
/// runs faster on 64 rows; from 4k tokens 128 rows win; benches/RESULTS.md).
pub const MMA_LARGE_MIN_CTAS_PER_SM: usize = 4;

/// The tensor-core prefill kernel's CTA shape for the requests of `query_start_loc` with at
/// least `min_q` query tokens: the forced one, else [`MMA_SHAPE_LARGE`] when its plan would
/// have [`MMA_LARGE_MIN_CTAS_PER_SM`] CTAs per SM, else [`MMA_SHAPE_SMALL`]. Host arithmetic
/// only (the same count [`plan_work`](crate::plan::plan_work) makes).
pub fn mma_shape_for(
    query_start_loc: &[i32],
    min_q: usize,
    group: usize,
    num_kv_heads: usize,
    sm_count: usize,
) -> MmaShape {
    if let Some(s) = CudaTuning::get().mma_shape {
        return s;
    }
    let g = group.max(1);
    let hc = g.min(MMA_SHAPE_LARGE.rows);
    let tq = (MMA_SHAPE_LARGE.rows / hc).max(1);
    let per_tile = num_kv_heads * g.div_ceil(hc);
    let ctas: usize = query_start_loc
        .windows(2)
        .map(|w| (w[1] - w[0]).max(0) as usize)
        .filter(|&q| q >= min_q)
        .map(|q| q.div_ceil(tq) * per_tile)
        .sum();
    if ctas >= MMA_LARGE_MIN_CTAS_PER_SM * sm_count.max(1) {
        MMA_SHAPE_LARGE
    } else {
        MMA_SHAPE_SMALL
    }
}

pub(crate) fn not_here(what: &str) -> Error {
    Error::Device {
        backend: "CUDA".into(),
        message: format!(
            "{what} is not on this backend's CUDA device; create it on the backend's device \
             (backend.device()) or move it with to_device"
        ),
    }
}

pub(crate) fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds the kernels' i32 range")))
}

/// The raw device address of `t`, which must live on `device`.
pub(crate) fn tensor_ptr(device: &CudaDevice, t: &Tensor, what: &str) -> Result<u64> {
    match (t.device(), t.storage()) {
        (Device::Cuda(d), Storage::Cuda(s)) if d == device => Ok(s.device_ptr()),
        _ => Err(not_here(what)),
    }
}

/// Points `params` at the split-KV partials of `plan` in the metadata's scratch buffer
/// (reused, and persistent for graph metadata, so a captured launch never allocates):
/// `part_out` `[split][partial token][head][D]` f32, 256-byte aligned, then `part_lse`.
/// False when the plan splits nothing.
fn set_partials(
    params: &mut AttnParams,
    p: &AttentionParams,
    plan: &CudaPlan,
    md: &CudaAttentionMetadata,
) -> Result<bool> {
    let n_split = plan.work.n_part_tokens;
    if n_split == 0 {
        return Ok(false);
    }
    let planes = plan.work.max_splits * n_split * p.num_heads;
    let out_bytes = (planes * p.head_size * 4).div_ceil(256) * 256;
    let ptr = md.scratch(out_bytes + planes * 4)?;
    params.part_out = ptr;
    params.part_lse = ptr + out_bytes as u64;
    params.n_part_tokens = i32_of("split tokens", n_split)?;
    Ok(true)
}

/// Queues the decode kernel over `plan` (items of one token and up to 16 heads; split
/// tokens are merged inside it by their last CTA). Partials live in the metadata's
/// scratch buffer, the arrival counters in its split counters.
pub(crate) fn launch_decode(
    device: &CudaDevice,
    p: &AttentionParams,
    plan: &CudaPlan,
    base: &AttnParams,
    md: &CudaAttentionMetadata,
    f: &CudaFunction,
    cache_dtype: DType,
) -> Result<()> {
    let Some(mut params) = plan.item_params(base) else {
        return Ok(());
    };
    let d = p.head_size;
    if set_partials(&mut params, p, plan, md)? {
        let n_split = plan.work.n_part_tokens;
        params.split_counters = md.split_counters(n_split * p.num_heads)?;
    }
    let cfg = LaunchConfig {
        grid_dim: (plan.work.items.len() as u32, 1, 1),
        block_dim: (DECODE_THREADS, 1, 1),
        shared_mem_bytes: decode_smem_bytes(d, cache_dtype),
    };
    launch(device, f, cfg, &params, None)
}

/// Queues the tensor-core kernel over `plan` (items of up to 64 rows, never split).
pub(crate) fn launch_mma(
    device: &CudaDevice,
    p: &AttentionParams,
    plan: &CudaPlan,
    base: &AttnParams,
    name: &str,
    dtype: DType,
    shape: MmaShape,
) -> Result<()> {
    let Some(params) = plan.item_params(base) else {
        return Ok(());
    };
    // Soft cap and ALiBi live in a separate build (the plain one is the hot path).
    let plain = p.soft_cap().is_none() && p.alibi_slopes.is_none();
    let variant = mma_variant(dtype, p.head_size, shape, plain);
    let mut opts: Vec<&str> = variant.iter().map(String::as_str).collect();
    opts.extend(CudaTuning::get().mma_subk_define());
    let f = function(device, &PAGED_ATTENTION_MMA, &opts, name)?;
    let cfg = LaunchConfig {
        grid_dim: (plan.work.items.len() as u32, 1, 1),
        block_dim: (shape.threads(), 1, 1),
        shared_mem_bytes: mma_smem_bytes(p.head_size, shape.rows),
    };
    launch(device, &f, cfg, &params, None)
}

/// Queues the Hopper prefill kernel over `plan` (items of up to
/// [`WGMMA_ROWS`](crate::kernels::cuda::WGMMA_ROWS) rows, never split; `name` is its entry
/// point), built for [`HOPPER_ARCH`]; the caller checked that the device is compute
/// capability 9.0.
pub(crate) fn launch_wgmma(
    device: &CudaDevice,
    p: &AttentionParams,
    plan: &CudaPlan,
    base: &AttnParams,
    name: &str,
    dtype: DType,
) -> Result<()> {
    let Some(params) = plan.item_params(base) else {
        return Ok(());
    };
    let plain = p.soft_cap().is_none() && p.alibi_slopes.is_none();
    let d = p.head_size;
    let variant = wgmma_variant(dtype, d, plain);
    let opts: Vec<&str> = variant.iter().map(String::as_str).collect();
    let f = function_for(device, &PAGED_ATTENTION_WGMMA_WS, HOPPER_ARCH, &opts, name)?;
    let cfg = LaunchConfig {
        grid_dim: (plan.work.items.len() as u32, 1, 1),
        block_dim: (WGMMA_THREADS, 1, 1),
        shared_mem_bytes: wgmma_smem_bytes(d),
    };
    launch(device, &f, cfg, &params, None)
}

/// Queues the HIP family's matrix-core prefill in its WMMA form, the product emulated by
/// warp shuffles (`kernels-hip/paged_attention_matrix.hip`), over `plan` (items of up to 64
/// rows, never split).
pub(crate) fn launch_amd_matrix(
    device: &CudaDevice,
    p: &AttentionParams,
    plan: &CudaPlan,
    base: &AttnParams,
    name: &str,
) -> Result<()> {
    let Some(params) = plan.item_params(base) else {
        return Ok(());
    };
    let variant = matrix_variant(MatrixCores::Wmma);
    let f = function(device, &PAGED_ATTENTION_MATRIX, &[&variant], name)?;
    let cfg = LaunchConfig {
        grid_dim: (plan.work.items.len() as u32, 1, 1),
        block_dim: (matrix_threads(NVIDIA_WARP), 1, 1),
        shared_mem_bytes: matrix_smem_bytes(p.head_size),
    };
    launch(device, &f, cfg, &params, None)
}

/// Queues the attention kernel over `plan` (and the split combine, when the plan splits).
/// Partials live in the metadata's scratch buffer (reused, and persistent for graph
/// metadata, so a captured launch never allocates).
pub(crate) fn launch_attention(
    device: &CudaDevice,
    p: &AttentionParams,
    plan: &CudaPlan,
    base: &AttnParams,
    md: &CudaAttentionMetadata,
) -> Result<()> {
    let Some(mut params) = plan.item_params(base) else {
        return Ok(());
    };
    let (h, d) = (p.num_heads, p.head_size);
    set_partials(&mut params, p, plan, md)?;
    let name = attention_function_name(d, NVIDIA_WARP)
        .ok_or_else(|| Error::config(format!("no CUDA attention kernel for head size {d}")))?;
    let variant = attention_variant(d, NVIDIA_WARP);
    let f = function(device, &PAGED_ATTENTION, &[&variant], name)?;
    let cfg = LaunchConfig {
        grid_dim: (plan.work.items.len() as u32, 1, 1),
        block_dim: (ATTN_THREADS, 1, 1),
        shared_mem_bytes: attention_smem_bytes(d),
    };
    launch_dependent(device, &f, cfg, &params, None)?;
    if let Some(list) = &plan.groups_dev {
        let f = function(device, &PAGED_ATTENTION, &[&variant], "combine_splits")?;
        let cfg = LaunchConfig {
            grid_dim: (plan.work.groups.len() as u32, h as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        launch_dependent(device, &f, cfg, &params, Some(list.device_ptr()))?;
    }
    Ok(())
}

/// Queues the CUDA-core decode kernel (`paged_decode_cores.cu`) over `plan`'s items (every
/// one a single query token; [`CudaKernel::DecodeCores`](super::attention_impl::CudaKernel)
/// takes only those), then `combine_splits` for its split tokens.
pub(crate) fn launch_decode_cores(
    device: &CudaDevice,
    p: &AttentionParams,
    plan: &CudaPlan,
    base: &AttnParams,
    md: &CudaAttentionMetadata,
) -> Result<()> {
    let Some(mut params) = plan.item_params(base) else {
        return Ok(());
    };
    // The kernel reads none of these (the band that launches it excludes them).
    debug_assert!(plan.work.items.iter().all(|it| it.q_len == 1));
    debug_assert!(base.dense == 0 && base.alibi == 0 && base.use_sinks == 0);
    debug_assert!(base.soft_cap == 0.0);
    set_partials(&mut params, p, plan, md)?;
    let most = plan
        .work
        .items
        .iter()
        .map(|it| it.head_count)
        .max()
        .unwrap_or(1);
    let (heads, define, name) = decode_cores_variant(most.max(1) as usize).ok_or_else(|| {
        Error::config(format!(
            "the CUDA-core decode kernel holds 16 heads per work item, the plan has {most}"
        ))
    })?;
    let f = function(device, &PAGED_DECODE_CORES, &[&define], &name)?;
    let cfg = LaunchConfig {
        grid_dim: (plan.work.items.len() as u32, 1, 1),
        block_dim: (ATTN_THREADS, 1, 1),
        shared_mem_bytes: decode_cores_smem_bytes(heads),
    };
    launch_dependent(device, &f, cfg, &params, None)?;
    if let Some(list) = &plan.groups_dev {
        let variant = attention_variant(p.head_size, NVIDIA_WARP);
        let f = function(device, &PAGED_ATTENTION, &[&variant], "combine_splits")?;
        let cfg = LaunchConfig {
            grid_dim: (plan.work.groups.len() as u32, p.num_heads as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        launch_dependent(device, &f, cfg, &params, Some(list.device_ptr()))?;
    }
    Ok(())
}

/// Queues `merge_attn_states` over raw buffers whose shapes the caller checked (built by
/// `kernels::cuda::merge_launch`).
pub(crate) fn launch_merge(device: &CudaDevice, b: MergeBuffers, s: &MergeShape) -> Result<()> {
    let Some(l) = merge_launch(b, s)? else {
        return Ok(());
    };
    let cfg = LaunchConfig {
        grid_dim: l.grid,
        block_dim: (l.threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = function(device, &MERGE_STATES, &[], l.function)?;
    launch(device, &f, cfg, &l.params, None)
}

/// Queues the cache write `l` (built and checked by `kernels::cuda::reshape_launch`).
pub(crate) fn launch_reshape(device: &CudaDevice, l: &ReshapeLaunch) -> Result<()> {
    let f = function(device, &RESHAPE_AND_CACHE, &[], "reshape_and_cache")?;
    let cfg = LaunchConfig {
        grid_dim: (l.grid, 1, 1),
        block_dim: (l.threads, 1, 1),
        shared_mem_bytes: 0,
    };
    launch_dependent(device, &f, cfg, &l.params, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cuda::MMA_SHAPES;

    #[test]
    fn cta_shape_follows_the_prefill_size() {
        // Without POLYATTN_CUDA_MMA_ROWS / _WARPS (tests run with them unset).
        if CudaTuning::get().mma_shape.is_some() {
            eprintln!("skipped: a CTA shape is forced by the environment");
            return;
        }
        // Llama-3-8B heads (32 / 8): a 128-row CTA holds 32 tokens of one KV head's 4 heads.
        let (group, kv, sms) = (4, 8, 132);
        // 1 x 1k tokens: 32 tiles x 8 heads = 256 CTAs < 4 x 132.
        assert_eq!(
            mma_shape_for(&[0, 1024], 16, group, kv, sms),
            MMA_SHAPE_SMALL
        );
        // 1 x 4k: 1024 CTAs.
        assert_eq!(
            mma_shape_for(&[0, 4096], 16, group, kv, sms),
            MMA_SHAPE_LARGE
        );
        // Requests below min_q (decodes) do not count.
        let many_decodes: Vec<i32> = (0..=4096).collect();
        assert_eq!(
            mma_shape_for(&many_decodes, 16, group, kv, sms),
            MMA_SHAPE_SMALL
        );
        // The boundary: exactly 4 CTAs per SM.
        let tokens = (4 * sms / kv * 32) as i32;
        assert_eq!(
            mma_shape_for(&[0, tokens], 16, group, kv, sms),
            MMA_SHAPE_LARGE
        );
        assert_eq!(
            mma_shape_for(&[0, tokens - 32], 16, group, kv, sms),
            MMA_SHAPE_SMALL
        );
        for shape in [MMA_SHAPE_SMALL, MMA_SHAPE_LARGE] {
            assert!(MMA_SHAPES.contains(&shape));
        }
    }
}
