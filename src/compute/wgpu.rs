//! wgpu kernels of the model operations (in progress: not yet implemented).

use super::Rope;
use crate::device::{Tensor, WgpuDevice};
use crate::error::{Error, Result};

fn todo(op: &str) -> Error {
    Error::Device {
        backend: "wgpu".into(),
        message: format!("{op} is not implemented on wgpu yet"),
    }
}

pub(super) fn embedding(
    _: &WgpuDevice,
    _: &Tensor,
    _: &Tensor,
    _: usize,
    _: usize,
    _: usize,
) -> Result<Tensor> {
    Err(todo("embedding"))
}
pub(super) fn rms_norm(
    _: &WgpuDevice,
    _: &Tensor,
    _: &Tensor,
    _: f32,
    _: usize,
    _: usize,
) -> Result<Tensor> {
    Err(todo("rms_norm"))
}
pub(super) fn linear(
    _: &WgpuDevice,
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
    _: &WgpuDevice,
    _: &mut Tensor,
    _: &Tensor,
    _: Rope,
    _: usize,
    _: usize,
    _: usize,
) -> Result<()> {
    Err(todo("rope"))
}
pub(super) fn silu_mul(_: &WgpuDevice, _: &Tensor, _: &Tensor) -> Result<Tensor> {
    Err(todo("silu_mul"))
}
pub(super) fn add_assign(_: &WgpuDevice, _: &mut Tensor, _: &Tensor) -> Result<()> {
    Err(todo("add_assign"))
}
