//! The model operations around attention — embedding gather, RMSNorm, linear layers, RoPE,
//! SiLU·mul, residual add, row gather — on the device the tensors live on.
//!
//! A model written once against these functions and [`crate::Attention`] runs on every
//! backend: each function validates its arguments here (shapes, dtypes, one device), then
//! dispatches on the [`Device`] to the backend's kernel (`cpu.rs`, `cuda.rs`, `wgsl.rs` (wgpu and Vulkan), one
//! file per device family with the same functions). Activations and weights are f32: the
//! point of these operations is to keep a model's whole step on the attention's device, and
//! f32 everywhere makes greedy decoding agree across backends (only summation order differs).
//!
//! Conventions: a tensor `[T, H]` holds T token rows of H features, row-major; a linear
//! weight is `[N, K]` (out_features, in_features, PyTorch's layout) and `linear` computes
//! `y = x·Wᵀ`. Index tensors (token ids, positions, row indices) are i32.
//!
//! Index bounds: token ids and row indices are data that only the caller knows; the CPU
//! returns an error for one out of range, GPU kernels write zeros for it (they never read
//! outside a buffer, and checking on the host would cost a download per step).

mod cpu;
mod cuda;
mod hip;
mod wgsl;

use crate::device::{Device, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Which coordinates RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)` (GPT-J, Meta's original Llama, GGUF's permuted Q/K).
    Interleaved,
    /// Halves `(i, i + d/2)` (GPT-NeoX, Hugging Face's Llama).
    HalfSplit,
}

/// Rotary position embedding settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Base θ of the frequencies `θ^(-2i/d)`.
    pub base: f32,
    /// Pairing of the coordinates.
    pub style: RopeStyle,
}

fn same_device(what: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.device() != b.device() {
        return Err(Error::Config(format!(
            "{what}: tensors are on different devices ({} and {})",
            a.device().description(),
            b.device().description()
        )));
    }
    Ok(())
}

fn rank2(what: &'static str, t: &Tensor, expected: &str) -> Result<(usize, usize)> {
    match t.shape() {
        [a, b] => Ok((*a, *b)),
        s => Err(Error::shape(what, s, expected)),
    }
}

fn rank1(what: &'static str, t: &Tensor, expected: &str) -> Result<usize> {
    match t.shape() {
        [a] => Ok(*a),
        s => Err(Error::shape(what, s, expected)),
    }
}

/// Rows of `table [V, H]` picked by `ids [T]` (i32): the token embedding. Returns `[T, H]`.
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (v, h) = rank2("embedding table", table, "[vocab, hidden]")?;
    let t = rank1("token ids", ids, "[num_tokens]")?;
    table.expect_dtype("embedding table", DType::F32)?;
    ids.expect_dtype("token ids", DType::I32)?;
    same_device("embedding", table, ids)?;
    match table.device() {
        Device::Cpu(_) => cpu::embedding(table, ids, v, h, t),
        Device::Cuda(d) => cuda::embedding(d, table, ids, v, h, t),
        Device::Hip(_) => hip::via_host2(table, ids, |a, b| cpu::embedding(a, b, v, h, t)),
        Device::Vulkan(d) => wgsl::embedding(d, table, ids, v, h, t),
        Device::Wgpu(d) => wgsl::embedding(d, table, ids, v, h, t),
    }
}

/// RMSNorm over the last axis: `y = x / sqrt(mean(x²) + eps) · weight`, `x [T, H]`,
/// `weight [H]`. Returns `[T, H]`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let (t, h) = rank2("rms_norm input", x, "[num_tokens, hidden]")?;
    weight.expect_shape("rms_norm weight", &[h])?;
    x.expect_dtype("rms_norm input", DType::F32)?;
    weight.expect_dtype("rms_norm weight", DType::F32)?;
    same_device("rms_norm", x, weight)?;
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(Error::Config(format!(
            "rms_norm eps must be finite and >= 0, got {eps}"
        )));
    }
    match x.device() {
        Device::Cpu(_) => cpu::rms_norm(x, weight, eps, t, h),
        Device::Cuda(d) => cuda::rms_norm(d, x, weight, eps, t, h),
        Device::Hip(_) => hip::via_host2(x, weight, |a, b| cpu::rms_norm(a, b, eps, t, h)),
        Device::Vulkan(d) => wgsl::rms_norm(d, x, weight, eps, t, h),
        Device::Wgpu(d) => wgsl::rms_norm(d, x, weight, eps, t, h),
    }
}

/// A linear layer without bias: `y = x·Wᵀ`, `x [T, K]`, `weight [N, K]`. Returns `[T, N]`.
pub fn linear(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let (t, k) = rank2("linear input", x, "[num_tokens, in_features]")?;
    let (n, k2) = rank2("linear weight", weight, "[out_features, in_features]")?;
    if k != k2 {
        return Err(Error::shape(
            "linear weight",
            weight.shape(),
            format!("[out_features, {k}] (in_features of the input)"),
        ));
    }
    x.expect_dtype("linear input", DType::F32)?;
    weight.expect_dtype("linear weight", DType::F32)?;
    same_device("linear", x, weight)?;
    match x.device() {
        Device::Cpu(_) => cpu::linear(x, weight, t, k, n),
        Device::Cuda(d) => cuda::linear(d, x, weight, t, k, n),
        Device::Hip(_) => hip::via_host2(x, weight, |a, b| cpu::linear(a, b, t, k, n)),
        Device::Vulkan(d) => wgsl::linear(d, x, weight, t, k, n),
        Device::Wgpu(d) => wgsl::linear(d, x, weight, t, k, n),
    }
}

/// Rotary position embedding in place: `x [T, heads, head_size]` rotated by the angles of
/// `positions [T]` (i32, >= 0). `head_size` must be even.
pub fn rope(x: &mut Tensor, positions: &Tensor, rope: Rope) -> Result<()> {
    let (t, heads, d) = match x.shape() {
        [a, b, c] => (*a, *b, *c),
        s => {
            return Err(Error::shape(
                "rope input",
                s,
                "[num_tokens, num_heads, head_size]",
            ))
        }
    };
    if d % 2 != 0 {
        return Err(Error::shape("rope input", x.shape(), "an even head_size"));
    }
    positions.expect_shape("rope positions", &[t])?;
    positions.expect_dtype("rope positions", DType::I32)?;
    x.expect_dtype("rope input", DType::F32)?;
    same_device("rope", x, positions)?;
    if !(rope.base > 0.0 && rope.base.is_finite()) {
        return Err(Error::Config(format!(
            "rope base must be finite and > 0, got {}",
            rope.base
        )));
    }
    match x.device().clone() {
        Device::Cpu(_) => cpu::rope(x, positions, rope, t, heads, d),
        Device::Cuda(dev) => cuda::rope(&dev, x, positions, rope, t, heads, d),
        Device::Hip(_) => {
            hip::via_host_in_place(x, positions, |a, p| cpu::rope(a, p, rope, t, heads, d))
        }
        Device::Vulkan(dev) => wgsl::rope(&dev, x, positions, rope, t, heads, d),
        Device::Wgpu(dev) => wgsl::rope(&dev, x, positions, rope, t, heads, d),
    }
}

/// SwiGLU's activation: `silu(gate) · up`, elementwise on two `[T, I]` tensors.
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    rank2("silu_mul gate", gate, "[num_tokens, intermediate]")?;
    up.expect_shape("silu_mul up", gate.shape())?;
    gate.expect_dtype("silu_mul gate", DType::F32)?;
    up.expect_dtype("silu_mul up", DType::F32)?;
    same_device("silu_mul", gate, up)?;
    match gate.device() {
        Device::Cpu(_) => cpu::silu_mul(gate, up),
        Device::Cuda(d) => cuda::silu_mul(d, gate, up),
        Device::Hip(_) => hip::via_host2(gate, up, cpu::silu_mul),
        Device::Vulkan(d) => wgsl::silu_mul(d, gate, up),
        Device::Wgpu(d) => wgsl::silu_mul(d, gate, up),
    }
}

/// `x += y` elementwise (the residual connection); same shape, f32.
pub fn add_assign(x: &mut Tensor, y: &Tensor) -> Result<()> {
    y.expect_shape("add_assign operand", x.shape())?;
    x.expect_dtype("add_assign target", DType::F32)?;
    y.expect_dtype("add_assign operand", DType::F32)?;
    same_device("add_assign", x, y)?;
    match x.device().clone() {
        Device::Cpu(_) => cpu::add_assign(x, y),
        Device::Cuda(d) => cuda::add_assign(&d, x, y),
        Device::Hip(_) => hip::via_host_in_place(x, y, cpu::add_assign),
        Device::Vulkan(d) => wgsl::add_assign(&d, x, y),
        Device::Wgpu(d) => wgsl::add_assign(&d, x, y),
    }
}

/// Rows of `x [T, H]` picked by `rows [R]` (i32): e.g. each request's last token before the
/// output head. Returns `[R, H]`.
pub fn gather_rows(x: &Tensor, rows: &Tensor) -> Result<Tensor> {
    let (t, h) = rank2("gather_rows input", x, "[num_rows, hidden]")?;
    let r = rank1("gather_rows indices", rows, "[num_selected]")?;
    x.expect_dtype("gather_rows input", DType::F32)?;
    rows.expect_dtype("gather_rows indices", DType::I32)?;
    same_device("gather_rows", x, rows)?;
    // The same kernel as the embedding: x plays the table.
    match x.device() {
        Device::Cpu(_) => cpu::embedding(x, rows, t, h, r),
        Device::Cuda(d) => cuda::embedding(d, x, rows, t, h, r),
        Device::Hip(_) => hip::via_host2(x, rows, |a, b| cpu::embedding(a, b, t, h, r)),
        Device::Vulkan(d) => wgsl::embedding(d, x, rows, t, h, r),
        Device::Wgpu(d) => wgsl::embedding(d, x, rows, t, h, r),
    }
}
