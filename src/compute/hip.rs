//! The model operations on an AMD GPU, through the host. The CUDA family's model-op kernels
//! (`model_ops.cu`) are NVIDIA-only (warp-synchronous reductions), so on HIP each operation
//! downloads its operands, runs the CPU kernel and uploads the result: the same numbers as
//! the CPU backend, so model code runs unchanged on an AMD GPU, at the host's speed.

use crate::device::{Device, Tensor};
use crate::error::Result;

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
