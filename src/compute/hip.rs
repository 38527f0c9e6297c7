//! The model operations on an AMD GPU, through the host. The CUDA family's model-op kernels
//! (`model_ops.cu`) are NVIDIA-only (warp-synchronous reductions), so on HIP each operation
//! downloads its operands, runs the CPU kernel and uploads the result: the same numbers as
//! the CPU backend, so model code runs unchanged on an AMD GPU, at the host's speed.

use super::cpu;
use super::fused_linear::FusedLinear;
use super::{InputNorm, LinearOutput};
use crate::device::{Device, Tensor};
use crate::error::{Error, Result};

/// `t` in host memory.
pub(super) fn host(t: &Tensor) -> Result<Tensor> {
    t.to_device(&Device::cpu())
}

/// Runs `op` on host copies of `a` and `b` into a host tensor of `out`'s shape, then
/// replaces `out` with the result on its device.
pub(super) fn via_host(
    a: &Tensor,
    b: &Tensor,
    out: &mut Tensor,
    op: impl FnOnce(&Tensor, &Tensor, &mut Tensor) -> Result<()>,
) -> Result<()> {
    let mut host_out = Tensor::zeros(&Device::cpu(), out.shape(), out.dtype())?;
    op(&host(a)?, &host(b)?, &mut host_out)?;
    *out = host_out.to_device(out.device())?;
    Ok(())
}

/// Runs the in-place `op` on a host copy of `x` (and of `y`), then replaces `x` with the
/// result on its device.
pub(super) fn via_host_in_place(
    x: &mut Tensor,
    y: &Tensor,
    op: impl FnOnce(&mut Tensor, &Tensor) -> Result<()>,
) -> Result<()> {
    let mut hx = host(x)?;
    op(&mut hx, &host(y)?)?;
    *x = hx.to_device(x.device())?;
    Ok(())
}

/// [`super::linear_fused`] through the host: every operand copied down, the CPU's form run,
/// the outputs copied back.
pub(super) fn linear_fused(a: &FusedLinear<'_>, out: LinearOutput<'_>) -> Result<()> {
    let (x, w) = (host(a.x)?, host(a.w)?);
    let norm_weight = a.norm.map(|nm| host(nm.weight)).transpose()?;
    let norm = a
        .norm
        .zip(norm_weight.as_ref())
        .map(|(nm, weight)| InputNorm {
            weight,
            eps: nm.eps,
        });
    let on_host = FusedLinear {
        x: &x,
        w: &w,
        norm,
        ..*a
    };
    let back = |h: Tensor, o: &mut Tensor| -> Result<()> {
        *o = h.to_device(o.device())?;
        Ok(())
    };
    // One output tensor: run the same form into its host copy.
    let single = |o: &mut Tensor, form: fn(&mut Tensor) -> LinearOutput<'_>| -> Result<()> {
        let mut h = host(o)?;
        cpu::linear_fused(&on_host, form(&mut h))?;
        back(h, o)
    };
    match out {
        LinearOutput::Store(o) => single(o, |h| LinearOutput::Store(h)),
        LinearOutput::Accumulate(o) => single(o, |h| LinearOutput::Accumulate(h)),
        LinearOutput::SwiGlu(o) => single(o, |h| LinearOutput::SwiGlu(h)),
        LinearOutput::RopeSplitQkv {
            positions,
            rope,
            q,
            k,
            v,
        } => {
            let (mut hq, mut hk, mut hv) = (host(q)?, host(k)?, host(v)?);
            cpu::linear_fused(
                &on_host,
                LinearOutput::RopeSplitQkv {
                    positions: &host(positions)?,
                    rope,
                    q: &mut hq,
                    k: &mut hk,
                    v: &mut hv,
                },
            )?;
            back(hq, q)?;
            back(hk, k)?;
            back(hv, v)
        }
        // `fuses_cache_write` is false on HIP, so validation refuses this form first.
        LinearOutput::RopeSplitQkvCache { .. } => Err(Error::config(
            "the Q/K/V projection cannot write a KV cache on HIP (its model operations run \
             through the host); split into keys and values and write them through the \
             attention layer",
        )),
    }
}
