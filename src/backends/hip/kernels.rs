//! The HIP backend's kernel glue: how the backend launches the CUDA family's portable
//! kernels through the HIP runtime — the module lookup (compiled by hiprtc for the device's
//! target, cached per module and variant), one launch function per kernel (the CUDA-core
//! attention kernel with its split combine, `reshape_and_cache`, `merge_attn_states`) over the planner's work
//! lists (and the matrix-core prefill of `kernels-hip/` on targets with matrix cores), and
//! the host checks they share (device residency, i32 ranges). Launch shapes are
//! the CUDA backend's, with the attention CTA sized by the device's wavefront
//! ([`attention_threads`]).

use crate::attention::AttentionParams;
use crate::device::hip::{compile_cached, HipFunction};
use crate::device::{Device, HipDevice, Storage, Tensor};
use crate::error::{Error, Result};
use crate::kernels::cuda::{
    attention_function_name, attention_smem_bytes, attention_threads, attention_variant,
    full_source, matrix_smem_bytes, matrix_threads, matrix_variant, AttnParams, KernelSource,
    MatrixCores, PAGED_ATTENTION, PAGED_ATTENTION_MATRIX, RESHAPE_AND_CACHE,
};
use crate::kernels::cuda::{merge_launch, MergeBuffers, MergeShape, ReshapeLaunch, MERGE_STATES};

use super::metadata_builder::{HipAttentionMetadata, HipPlan};

pub use crate::kernels::cuda::{KEYS_PER_CHUNK, ROWS_PER_ITEM};
pub use crate::plan::WorkItem;

pub(crate) fn not_here(what: &str) -> Error {
    Error::Device {
        backend: "HIP".into(),
        message: format!(
            "{what} is not on this backend's AMD GPU; create it on the backend's device \
             (backend.device()) or move it with to_device"
        ),
    }
}

pub(crate) fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds the kernels' i32 range")))
}

fn u32_of(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds a HIP launch dimension")))
}

fn overflow(what: &'static str, detail: String) -> Error {
    Error::overflow(what, detail)
}

/// The raw device address of `t`, which must live on `device`.
pub(crate) fn tensor_ptr(device: &HipDevice, t: &Tensor, what: &str) -> Result<u64> {
    match (t.device(), t.storage()) {
        (Device::Hip(d), Storage::Hip(s)) if d == device => Ok(s.device_ptr()),
        _ => Err(not_here(what)),
    }
}

/// The device's wavefront width, as the family's kernels take it.
pub(crate) fn wave(device: &HipDevice) -> Result<usize> {
    usize::try_from(device.wavefront_size())
        .map_err(|_| Error::config("the device's wavefront size does not fit usize"))
}

/// Entry point `name` of source `k` built with `defines`, compiled by hiprtc for the device's
/// target on first use and cached under a key naming the module and the variant.
pub(crate) fn function(
    device: &HipDevice,
    k: &KernelSource,
    defines: &[String],
    name: &str,
) -> Result<HipFunction> {
    let key = if defines.is_empty() {
        k.name.to_string()
    } else {
        format!("{} {}", k.name, defines.join(" "))
    };
    device.function(
        &key,
        || compile_cached(&full_source(k), k.name, device.arch(), defines),
        name,
    )
}

/// Points `params` at the split-KV partials of `plan` in the metadata's scratch buffer:
/// `part_out` `[split][partial token][head][D]` f32, 256-byte aligned, then `part_lse`.
/// False when the plan splits nothing.
fn set_partials(
    params: &mut AttnParams,
    p: &AttentionParams,
    plan: &HipPlan,
    md: &HipAttentionMetadata,
) -> Result<bool> {
    let n_split = plan.work.n_part_tokens;
    if n_split == 0 {
        return Ok(false);
    }
    let planes = plan
        .work
        .max_splits
        .checked_mul(n_split)
        .and_then(|x| x.checked_mul(p.num_heads))
        .ok_or_else(|| overflow("split-KV partials", format!("{n_split} split tokens")))?;
    let out_bytes = planes
        .checked_mul(p.head_size)
        .and_then(|x| x.checked_mul(4))
        .and_then(|x| x.checked_next_multiple_of(256))
        .ok_or_else(|| overflow("split-KV partials", format!("{planes} planes")))?;
    let total = planes
        .checked_mul(4)
        .and_then(|x| x.checked_add(out_bytes))
        .ok_or_else(|| overflow("split-KV partials", format!("{planes} planes")))?;
    let ptr = md.scratch(total)?;
    params.part_out = ptr;
    params.part_lse = ptr
        .checked_add(out_bytes as u64)
        .ok_or_else(|| overflow("split-KV partials", "device address".into()))?;
    params.n_part_tokens = i32_of("split tokens", n_split)?;
    Ok(true)
}

/// Queues the CUDA-core attention kernel over `plan` (and `combine_splits`, when the plan
/// splits): `attention_threads(wave)` threads per CTA, one CTA per work item.
pub(crate) fn launch_attention(
    device: &HipDevice,
    p: &AttentionParams,
    plan: &HipPlan,
    base: &AttnParams,
    md: &HipAttentionMetadata,
) -> Result<()> {
    let Some(mut params) = plan.item_params(base) else {
        return Ok(());
    };
    let (h, d) = (p.num_heads, p.head_size);
    let wave = wave(device)?;
    set_partials(&mut params, p, plan, md)?;
    let name = attention_function_name(d, wave).ok_or_else(|| {
        Error::config(format!(
            "no HIP attention kernel for head size {d} on wave{wave}"
        ))
    })?;
    let variant = [attention_variant(d, wave)];
    let f = function(device, &PAGED_ATTENTION, &variant, name)?;
    let grid = (u32_of("work items", plan.work.items.len())?, 1, 1);
    device.launch(
        &f,
        grid,
        (attention_threads(wave), 1, 1),
        attention_smem_bytes(d),
        &params,
    )?;
    if let Some(list) = &plan.groups_dev {
        let f = function(device, &PAGED_ATTENTION, &variant, "combine_splits")?;
        let grid = (
            u32_of("split groups", plan.work.groups.len())?,
            u32_of("num_heads", h)?,
            1,
        );
        device.launch2(
            &f,
            grid,
            (COMBINE_THREADS, 1, 1),
            0,
            &params,
            &list.device_ptr(),
        )?;
    }
    Ok(())
}

/// Queues the matrix-core prefill `name` of `kind` over `plan` (items of up to
/// `MATRIX_ROWS` rows, never split): `matrix_threads(wave)` threads per workgroup, one per
/// work item.
pub(crate) fn launch_matrix(
    device: &HipDevice,
    p: &AttentionParams,
    plan: &HipPlan,
    base: &AttnParams,
    kind: MatrixCores,
    name: &str,
) -> Result<()> {
    let Some(params) = plan.item_params(base) else {
        return Ok(());
    };
    let wave = wave(device)?;
    if kind.wave() != wave {
        return Err(Error::config(format!(
            "the {kind:?} prefill is laid out for wave{}, the device runs wave{wave}",
            kind.wave()
        )));
    }
    let f = function(
        device,
        &PAGED_ATTENTION_MATRIX,
        &[matrix_variant(kind)],
        name,
    )?;
    let grid = (u32_of("work items", plan.work.items.len())?, 1, 1);
    device.launch(
        &f,
        grid,
        (matrix_threads(wave), 1, 1),
        matrix_smem_bytes(p.head_size),
        &params,
    )
}

/// Threads per CTA of `combine_splits` (as on CUDA; the kernel strides over the head dims).
const COMBINE_THREADS: u32 = 128;

/// Queues `merge_attn_states` over raw buffers whose shapes the caller checked (built by
/// `kernels::cuda::merge_launch`, as on CUDA).
pub(crate) fn launch_merge(device: &HipDevice, b: MergeBuffers, s: &MergeShape) -> Result<()> {
    let Some(l) = merge_launch(b, s)? else {
        return Ok(());
    };
    let f = function(device, &MERGE_STATES, &[], l.function)?;
    device.launch(&f, l.grid, (l.threads, 1, 1), 0, &l.params)
}

/// Queues the cache write `l` (built and checked by `kernels::cuda::reshape_launch`).
pub(crate) fn launch_reshape(device: &HipDevice, l: &ReshapeLaunch) -> Result<()> {
    let f = function(device, &RESHAPE_AND_CACHE, &[], "reshape_and_cache")?;
    device.launch(&f, (l.grid, 1, 1), (l.threads, 1, 1), 0, &l.params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cuda::{amd_variants, AMD_TARGETS, ATTENTION_MAX_HEAD_SIZE};

    #[test]
    fn every_launch_asks_for_a_module_the_amd_checks_compile() {
        for t in AMD_TARGETS {
            let variants = amd_variants(t.arch);
            for d in (8..=ATTENTION_MAX_HEAD_SIZE).step_by(8) {
                let name = attention_function_name(d, t.wave).expect("a bucket");
                let defines = [attention_variant(d, t.wave)];
                assert!(
                    variants
                        .iter()
                        .any(|v| v.source.name == PAGED_ATTENTION.name
                            && v.defines == defines
                            && v.functions.contains(&name)
                            && v.functions.contains(&"combine_splits")),
                    "{} d={d}",
                    t.arch
                );
            }
            assert!(variants
                .iter()
                .any(|v| v.source.name == RESHAPE_AND_CACHE.name && v.defines.is_empty()));
            assert_eq!(attention_threads(t.wave) as usize, 4 * t.wave);
            if let Some(kind) = crate::kernels::cuda::amd_matrix_cores(t.arch) {
                for dtype in [crate::dtype::DType::F16, crate::dtype::DType::Bf16] {
                    for d in [64, 96, 128] {
                        let name = crate::kernels::cuda::matrix_function_name(dtype, d)
                            .expect("a matrix kernel");
                        assert!(
                            variants
                                .iter()
                                .any(|v| v.source.name == PAGED_ATTENTION_MATRIX.name
                                    && v.defines == [matrix_variant(kind)]
                                    && v.functions.contains(&name)),
                            "{} {name}",
                            t.arch
                        );
                    }
                }
            }
        }
    }
}
