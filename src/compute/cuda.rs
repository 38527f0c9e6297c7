//! CUDA kernels of the model operations (in progress: not yet implemented).

use super::Rope;
use crate::backends::cuda::kernels::KernelSource;
use crate::device::{CudaDevice, Tensor};
use crate::error::{Error, Result};

/// `kernels-cuda/model_ops.cu`: the model operations' kernels (compiled like the attention
/// kernels, and checked with them by `tests/cuda_compile.rs`).
pub const CUDA_MODEL_OPS: KernelSource = KernelSource {
    name: "model_ops",
    source: include_str!("../../kernels-cuda/model_ops.cu"),
    functions: &[],
};

fn todo(op: &str) -> Error {
    Error::Device {
        backend: "cuda".into(),
        message: format!("{op} is not implemented on CUDA yet"),
    }
}

pub(super) fn embedding(
    _: &CudaDevice,
    _: &Tensor,
    _: &Tensor,
    _: usize,
    _: usize,
    _: usize,
) -> Result<Tensor> {
    Err(todo("embedding"))
}
pub(super) fn rms_norm(
    _: &CudaDevice,
    _: &Tensor,
    _: &Tensor,
    _: f32,
    _: usize,
    _: usize,
) -> Result<Tensor> {
    Err(todo("rms_norm"))
}
pub(super) fn linear(
    _: &CudaDevice,
    _: &Tensor,
    _: &Tensor,
    _: usize,
    _: usize,
    _: usize,
) -> Result<Tensor> {
    Err(todo("linear"))
}
#[allow(clippy::too_many_arguments)]
pub(super) fn rope(
    _: &CudaDevice,
    _: &mut Tensor,
    _: &Tensor,
    _: Rope,
    _: usize,
    _: usize,
    _: usize,
) -> Result<()> {
    Err(todo("rope"))
}
pub(super) fn silu_mul(_: &CudaDevice, _: &Tensor, _: &Tensor) -> Result<Tensor> {
    Err(todo("silu_mul"))
}
pub(super) fn add_assign(_: &CudaDevice, _: &mut Tensor, _: &Tensor) -> Result<()> {
    Err(todo("add_assign"))
}
