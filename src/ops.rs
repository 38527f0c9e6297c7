//! Standalone attention operations, dispatched on the device their tensors live on:
//! [`merge_attn_states`] (vLLM's LSE merge of two partial results).

use crate::backends::cpu::kernels::merge_states;
use crate::backends::{cuda::kernels as cuda, hip::kernels as hip};
use crate::device::{CpuStorage, Device, Storage, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::cuda::{MergeBuffers, MergeShape};

/// Merges two partial attention results over disjoint key sets (vLLM's `merge_attn_states`).
///
/// `output`, `prefix_output`, `suffix_output`: `[T, H, D]` of one activation dtype;
/// `prefix_lse`, `suffix_lse`, `output_lse`: `[H, T]` f32, natural log. An LSE of `+inf`
/// counts as an empty side. Tokens at or after `prefill_tokens_with_context` copy the suffix.
/// The merge is computed in f32.
#[allow(clippy::too_many_arguments)]
pub fn merge_attn_states(
    output: &mut Tensor,
    prefix_output: &Tensor,
    prefix_lse: &Tensor,
    suffix_output: &Tensor,
    suffix_lse: &Tensor,
    output_lse: Option<&mut Tensor>,
    prefill_tokens_with_context: Option<usize>,
) -> Result<()> {
    let s = prefix_output.shape().to_vec();
    if s.len() != 3 {
        return Err(Error::shape(
            "prefix_output",
            &s,
            "[num_tokens, num_heads, head_size]",
        ));
    }
    let (t, h, d) = (s[0], s[1], s[2]);
    let dtype = prefix_output.dtype();
    if !dtype.is_activation() {
        return Err(Error::DType {
            what: "prefix_output",
            got: dtype.to_string(),
            expected: "f32, f16 or bf16".into(),
        });
    }
    suffix_output.expect_shape("suffix_output", &s)?;
    suffix_output.expect_dtype("suffix_output", dtype)?;
    output.expect_shape("output", &s)?;
    output.expect_dtype("output", dtype)?;
    for (what, l) in [("prefix_lse", prefix_lse), ("suffix_lse", suffix_lse)] {
        l.expect_shape(what, &[h, t])?;
        l.expect_dtype(what, DType::F32)?;
    }
    if let Some(l) = output_lse.as_deref() {
        l.expect_shape("output_lse", &[h, t])?;
        l.expect_dtype("output_lse", DType::F32)?;
    }
    match output.storage() {
        Storage::Cpu(_) => {
            let o_p = prefix_output.to_f32_vec()?;
            let o_s = suffix_output.to_f32_vec()?;
            let l_p = prefix_lse.to_f32_vec()?;
            let l_s = suffix_lse.to_f32_vec()?;
            let mut out = vec![0.0f32; t * h * d];
            let mut lse = vec![0.0f32; h * t];
            merge_states::merge_states(
                &mut out,
                Some(&mut lse),
                &o_p,
                &l_p,
                &o_s,
                &l_s,
                t,
                h,
                d,
                prefill_tokens_with_context,
            );
            let storage = output.as_cpu_mut().ok_or_else(|| Error::Device {
                backend: "cpu".into(),
                message: "merge_attn_states: the output is not on the CPU".into(),
            })?;
            crate::backends::cpu::kernels::convert::store(storage, dtype, 0, &out, 1.0);
            if let Some(l) = output_lse {
                if let Some(CpuStorage::F32(v)) = l.as_cpu_mut() {
                    v.copy_from_slice(&lse);
                }
            }
            Ok(())
        }
        Storage::Cuda(_) => {
            let Device::Cuda(dev) = output.device() else {
                return Err(not_on_one_device("CUDA"));
            };
            let dev = dev.clone();
            let (b, shape) = merge_plan(
                |t, what| cuda::tensor_ptr(&dev, t, what),
                output,
                [prefix_output, prefix_lse, suffix_output, suffix_lse],
                output_lse.as_deref(),
                prefill_tokens_with_context,
            )?;
            cuda::launch_merge(&dev, b, &shape)
        }
        Storage::Hip(_) => {
            let Device::Hip(dev) = output.device() else {
                return Err(not_on_one_device("HIP"));
            };
            let dev = dev.clone();
            let (b, shape) = merge_plan(
                |t, what| hip::tensor_ptr(&dev, t, what),
                output,
                [prefix_output, prefix_lse, suffix_output, suffix_lse],
                output_lse.as_deref(),
                prefill_tokens_with_context,
            )?;
            hip::launch_merge(&dev, b, &shape)
        }
        Storage::Wgpu(_) | Storage::Vulkan(_) => {
            let inputs = (prefix_output, prefix_lse, suffix_output, suffix_lse);
            let tokens = prefill_tokens_with_context;
            match output.device().clone() {
                Device::Wgpu(d) => merge_wgsl(&d, output, inputs, output_lse, tokens),
                Device::Vulkan(d) => merge_wgsl(&d, output, inputs, output_lse, tokens),
                _ => Err(not_on_one_device("WGSL")),
            }
        }
    }
}

/// `merge_attn_states` through the WGSL family on either of its runtimes.
fn merge_wgsl<R: crate::device::wgsl::WgslRuntime>(
    dev: &R,
    output: &mut Tensor,
    (po, pl, so, sl): (&Tensor, &Tensor, &Tensor, &Tensor),
    output_lse: Option<&mut Tensor>,
    prefill_tokens_with_context: Option<usize>,
) -> Result<()> {
    crate::backends::wgsl_family::merge_attn_states(
        dev,
        output,
        po,
        pl,
        so,
        sl,
        output_lse,
        prefill_tokens_with_context,
    )
}

/// The error for an output whose storage and device disagree (not produced by this crate's
/// tensors; kept as an error rather than a panic).
fn not_on_one_device(backend: &str) -> Error {
    Error::Device {
        backend: backend.into(),
        message: "merge_attn_states: the output's storage and device disagree".into(),
    }
}

/// The device buffers of a merge on a GPU whose tensors `ptr` resolves (erring for one on
/// another device), and its shape. `inputs`: prefix output, prefix LSE, suffix output, suffix
/// LSE (shapes and dtypes checked by [`merge_attn_states`]).
fn merge_plan(
    ptr: impl Fn(&Tensor, &str) -> Result<u64>,
    output: &Tensor,
    inputs: [&Tensor; 4],
    output_lse: Option<&Tensor>,
    prefill_tokens_with_context: Option<usize>,
) -> Result<(MergeBuffers, MergeShape)> {
    let [prefix_output, prefix_lse, suffix_output, suffix_lse] = inputs;
    let buffers = MergeBuffers {
        prefix_out: ptr(prefix_output, "prefix_output")?,
        prefix_lse: ptr(prefix_lse, "prefix_lse")?,
        suffix_out: ptr(suffix_output, "suffix_output")?,
        suffix_lse: ptr(suffix_lse, "suffix_lse")?,
        out: ptr(output, "output")?,
        out_lse: match output_lse {
            Some(l) => ptr(l, "output_lse")?,
            None => 0,
        },
    };
    let shape = MergeShape::of(
        prefix_output.shape(),
        prefix_output.dtype(),
        output.dtype(),
        prefill_tokens_with_context,
    )?;
    Ok((buffers, shape))
}
