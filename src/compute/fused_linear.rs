//! A linear layer with the work around it folded in: an RMSNorm of its input rows before the
//! product, and what becomes of the product after it (stored, added into a residual stream,
//! SwiGLU of a fused gate/up projection, the split and RoPE of a fused Q/K/V projection).
//!
//! Why: a decoder layer's small operations (two RMSNorms, SwiGLU, the Q/K/V split) each cost
//! a launch, and at decode sizes a launch costs more than its work. [`linear_fused`] makes
//! `RMSNorm → linear → SwiGLU` and `RMSNorm → linear → split + RoPE` one launch each on the
//! GPUs, so a Llama layer is the two fused projections, attention, and two projections that
//! add into the residual stream.
//!
//! The numbers are those of the separate operations up to rounding: the GPU kernels scale
//! each input element by the row's `1 / sqrt(mean(x²) + eps)` and the norm weight as
//! [`super::rms_norm`] does, but sum the squares in their own order.

use super::{check_out, cpu, cuda, hip, linear_dims, same_device, wgsl, Rope};
use crate::device::{Device, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// An RMSNorm applied to a linear layer's input rows inside the layer:
/// `x / sqrt(mean(x²) + eps) · weight`, with `weight [in_features]`.
#[derive(Clone, Copy, Debug)]
pub struct InputNorm<'a> {
    /// The norm's weight `[in_features]`, f32.
    pub weight: &'a Tensor,
    /// Added to the mean square; finite and ≥ 0.
    pub eps: f32,
}

/// Where a fused linear layer's product `p = x·Wᵀ` (`[T, N]`) goes.
#[derive(Debug)]
pub enum LinearOutput<'a> {
    /// `out [T, N] = p`.
    Store(&'a mut Tensor),
    /// `out [T, N] += p` (an output projection added into the residual stream).
    Accumulate(&'a mut Tensor),
    /// `out [T, I] = silu(p[:, ..I]) · p[:, I..]`: the weight stacks a gate projection's `I`
    /// rows on an up projection's (`N = 2I`), as [`super::swiglu_into`] reads them.
    SwiGlu(&'a mut Tensor),
    /// `p` is a fused Q/K/V projection (`N = (H + 2·Hk)·d`), split and rotated into `q [T, H,
    /// d]`, `k [T, Hk, d]` and `v [T, Hk, d]` as [`super::rope_split_qkv_into`] does.
    RopeSplitQkv {
        /// `[T]` i32 positions of the tokens.
        positions: &'a Tensor,
        /// The rotation.
        rope: Rope,
        /// Rotated query heads.
        q: &'a mut Tensor,
        /// Rotated key heads.
        k: &'a mut Tensor,
        /// Value heads (copied).
        v: &'a mut Tensor,
    },
}

/// The validated operands of a fused linear layer, for the device families.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FusedLinear<'a> {
    /// `[T, K]` input rows.
    pub x: &'a Tensor,
    /// `[N, K]` weight.
    pub w: &'a Tensor,
    /// The input norm, if any.
    pub norm: Option<InputNorm<'a>>,
    /// Tokens, in features, weight rows.
    pub t: usize,
    pub k: usize,
    pub n: usize,
}

/// Head counts and size of a Q/K/V split: `(H, Hk, d)`.
pub(crate) type QkvHeads = (usize, usize, usize);

/// Checks of a Q/K/V split into `q [T, H, d]`, `k`, `v [T, Hk, d]` with `positions [T]`, all
/// on `like`'s device; returns `(T, (H, Hk, d))`.
pub(super) fn rope_split_dims(
    like: &Tensor,
    positions: &Tensor,
    rope: Rope,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<(usize, QkvHeads)> {
    let (t, h, d) = match q.shape() {
        [a, b, c] => (*a, *b, *c),
        s => {
            return Err(Error::shape(
                "rope_split_qkv q",
                s,
                "[num_tokens, num_heads, head_size]",
            ))
        }
    };
    let hk = match k.shape() {
        [_, b, _] => *b,
        s => {
            return Err(Error::shape(
                "rope_split_qkv k",
                s,
                "[num_tokens, num_kv_heads, head_size]",
            ))
        }
    };
    if d % 2 != 0 {
        return Err(Error::shape(
            "rope_split_qkv q",
            q.shape(),
            "an even head_size",
        ));
    }
    for (what, o) in [
        ("rope_split_qkv q", q),
        ("rope_split_qkv k", k),
        ("rope_split_qkv v", v),
    ] {
        o.expect_dtype(what, DType::F32)?;
        same_device(what, like, o)?;
    }
    k.expect_shape("rope_split_qkv k", &[t, hk, d])?;
    v.expect_shape("rope_split_qkv v", &[t, hk, d])?;
    positions.expect_shape("rope positions", &[t])?;
    positions.expect_dtype("rope positions", DType::I32)?;
    same_device("rope_split_qkv", like, positions)?;
    if !(rope.base > 0.0 && rope.base.is_finite()) {
        return Err(Error::Config(format!(
            "rope base must be finite and > 0, got {}",
            rope.base
        )));
    }
    Ok((t, (h, hk, d)))
}

/// Checks of an RMSNorm weight `[h]` and its epsilon against `x`.
pub(super) fn norm_check(x: &Tensor, weight: &Tensor, eps: f32, h: usize) -> Result<()> {
    weight.expect_shape("rms_norm weight", &[h])?;
    weight.expect_dtype("rms_norm weight", DType::F32)?;
    same_device("rms_norm", x, weight)?;
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(Error::Config(format!(
            "rms_norm eps must be finite and >= 0, got {eps}"
        )));
    }
    Ok(())
}

/// A linear layer `p = x·Wᵀ` (`x [T, K]` f32, `weight [N, K]` f32, or f16 / bf16 widened to
/// f32 as it is read), its input rows first
/// RMS-normed where `norm` is given, its product written as `out` says. On the GPUs each
/// form is one launch; it allocates nothing, so a step built from it can be captured.
///
/// Errors: the shapes, dtypes and devices of every operand as the separate operations check
/// them, `N` odd for [`LinearOutput::SwiGlu`], `N ≠ (H + 2·Hk)·d` for
/// [`LinearOutput::RopeSplitQkv`], and `K = 0` (no product to write).
pub fn linear_fused(
    x: &Tensor,
    norm: Option<InputNorm<'_>>,
    weight: &Tensor,
    out: LinearOutput<'_>,
) -> Result<()> {
    let (t, k, n) = linear_dims(x, weight)?;
    if k == 0 {
        return Err(Error::config(
            "a fused linear layer with in_features 0: there is no product to write",
        ));
    }
    if let Some(nm) = norm {
        norm_check(x, nm.weight, nm.eps, k)?;
    }
    match &out {
        LinearOutput::Store(o) => check_out("linear output", o, &[t, n], x)?,
        LinearOutput::Accumulate(o) => check_out("linear_accumulate target", o, &[t, n], x)?,
        LinearOutput::SwiGlu(o) => {
            if n % 2 != 0 {
                return Err(Error::shape(
                    "linear weight",
                    weight.shape(),
                    "an even number of rows (gate rows, then up rows) for SwiGLU",
                ));
            }
            check_out("swiglu output", o, &[t, n / 2], x)?;
        }
        LinearOutput::RopeSplitQkv {
            positions,
            rope,
            q,
            k: kt,
            v,
        } => {
            let (tq, (h, hk, d)) = rope_split_dims(x, positions, *rope, q, kt, v)?;
            if tq != t || (h + 2 * hk) * d != n {
                return Err(Error::shape(
                    "linear weight",
                    weight.shape(),
                    format!(
                        "[(H + 2·Hk)·d = {}, {k}] for q {:?} and k {:?}, with q's {tq} tokens = \
                         the input's {t}",
                        (h + 2 * hk) * d,
                        q.shape(),
                        kt.shape()
                    ),
                ));
            }
        }
    }
    dispatch(
        &FusedLinear {
            x,
            w: weight,
            norm,
            t,
            k,
            n,
        },
        out,
    )
}

/// Runs validated operands on their device's family (`linear`, `linear_accumulate` and
/// `linear_fused` all come here).
pub(super) fn dispatch(args: &FusedLinear<'_>, out: LinearOutput<'_>) -> Result<()> {
    if args.t == 0 || args.n == 0 {
        return Ok(());
    }
    match args.x.device() {
        Device::Cpu(_) => cpu::linear_fused(args, out),
        Device::Cuda(d) => cuda::linear_fused(d, args, out),
        Device::Hip(_) => hip::linear_fused(args, out),
        Device::Vulkan(d) => wgsl::linear_fused(d, args, out),
        Device::Wgpu(d) => wgsl::linear_fused(d, args, out),
    }
}
