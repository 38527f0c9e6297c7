//! A linear layer with the work around it folded in: an RMSNorm of its input rows before the
//! product, and what becomes of the product after it (stored, added into a residual stream,
//! SwiGLU of a fused gate/up projection, the split and RoPE of a fused Q/K/V projection,
//! with or without the new keys and values written straight into a paged KV cache).
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
use crate::kv_cache::KvCache;
use crate::metadata::CommonAttentionMetadata;

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
    /// [`LinearOutput::RopeSplitQkv`] with the key and value heads written straight into
    /// their paged-cache slots, `batch`'s slot mapping (token `t` to slot
    /// `slot_mapping[t]`; −1 writes nothing), as the attention layer's own cache write
    /// (`AttentionImpl::do_kv_cache_update`) stores them; the layer's attention then runs
    /// with no key or value (`forward(q, None, None, …)`). Why: at decode sizes the cache
    /// write is a launch of its own for a few hundred bytes; here it is the projection's
    /// epilogue. [`fuses_cache_write`] says which caches take it: f32 storage in one buffer,
    /// on the CPU, the WGSL family's runtimes and CUDA (opt-in). Duplicate slots in one batch race
    /// (which token's row lands is unspecified, as in vLLM's kernel; the WGSL family's
    /// attention-layer write keeps the last token's instead).
    RopeSplitQkvCache {
        /// `[T]` i32 positions of the tokens.
        positions: &'a Tensor,
        /// The rotation.
        rope: Rope,
        /// Rotated query heads `[T, H, d]`.
        q: &'a mut Tensor,
        /// The layer's cache (`Hk` heads of size `d`, f32 storage).
        cache: &'a mut KvCache,
        /// The step's batch: its slot mapping (on the input's device) says where each
        /// token's key and value go; its host copy is checked against the cache. A
        /// captured step reads the mapping's device buffer on every replay, so the caller
        /// keeps that buffer in place between steps (the runner's graph steps do).
        batch: &'a CommonAttentionMetadata,
    },
}

/// Whether [`linear_fused`] can write a Q/K/V projection's keys and values straight into
/// `cache` ([`LinearOutput::RopeSplitQkvCache`]): its storage is f32 (the linear kernels
/// compute in f32; a cache of another dtype goes through the attention layer's write, which
/// converts and scales), it is stored in one buffer, and its device's family has the fused
/// epilogue (CPU, CUDA, Vulkan, wgpu; not HIP, whose model operations run through the host).
pub fn fuses_cache_write(cache: &KvCache) -> bool {
    cache.spec().storage_dtype() == DType::F32
        && match cache.data().device() {
            Device::Cpu(_) | Device::Cuda(_) => true,
            Device::Hip(_) => false,
            Device::Vulkan(d) => wgsl::binds_whole(d, cache.data()),
            Device::Wgpu(d) => wgsl::binds_whole(d, cache.data()),
        }
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
    for (what, o) in [("rope_split_qkv k", k), ("rope_split_qkv v", v)] {
        o.expect_dtype(what, DType::F32)?;
        same_device(what, like, o)?;
    }
    k.expect_shape("rope_split_qkv k", &[t, hk, d])?;
    v.expect_shape("rope_split_qkv v", &[t, hk, d])?;
    query_and_rope_checks(like, positions, rope, q, t, d)?;
    Ok((t, (h, hk, d)))
}

/// The checks every Q/K/V split shares: an even head size, the query f32 on `like`'s
/// device, `positions [T]` i32 there too, a finite positive rotation base.
fn query_and_rope_checks(
    like: &Tensor,
    positions: &Tensor,
    rope: Rope,
    q: &Tensor,
    t: usize,
    d: usize,
) -> Result<()> {
    if !d.is_multiple_of(2) {
        return Err(Error::shape(
            "rope_split_qkv q",
            q.shape(),
            "an even head_size",
        ));
    }
    q.expect_dtype("rope_split_qkv q", DType::F32)?;
    same_device("rope_split_qkv q", like, q)?;
    positions.expect_shape("rope positions", &[t])?;
    positions.expect_dtype("rope positions", DType::I32)?;
    same_device("rope_split_qkv", like, positions)?;
    if !(rope.base > 0.0 && rope.base.is_finite()) {
        return Err(Error::Config(format!(
            "rope base must be finite and > 0, got {}",
            rope.base
        )));
    }
    Ok(())
}

/// Checks that a Q/K/V weight `[N, K]` has `(H + 2·Hk)·d` rows and that the query holds the
/// input's `T` tokens.
fn check_qkv_rows(
    weight: &Tensor,
    (t, k, n): (usize, usize, usize),
    tq: usize,
    (h, hk, d): QkvHeads,
) -> Result<()> {
    if tq != t || (h + 2 * hk) * d != n {
        return Err(Error::shape(
            "linear weight",
            weight.shape(),
            format!(
                "[(H + 2·Hk)·d = {}, {k}] for {h} query heads and {hk} KV heads of size {d}, \
                 with the query's {tq} tokens = the input's {t}",
                (h + 2 * hk) * d
            ),
        ));
    }
    Ok(())
}

/// Checks of a Q/K/V split whose keys and values go into `cache` through `batch`'s slot
/// mapping (the query `q [T, H, d]`, the cache's heads and storage, the batch against the
/// cache); returns `(T, (H, Hk, d))`.
fn rope_cache_dims(
    like: &Tensor,
    positions: &Tensor,
    rope: Rope,
    q: &Tensor,
    cache: &KvCache,
    batch: &CommonAttentionMetadata,
) -> Result<(usize, QkvHeads)> {
    let spec = *cache.spec();
    let (hk, d) = (spec.num_kv_heads, spec.head_size);
    let (t, h) = match q.shape() {
        [a, b, c] if *c == d => (*a, *b),
        s => {
            return Err(Error::shape(
                "rope_split_qkv q",
                s,
                format!("[num_tokens, num_heads, {d}] (the cache's head size)"),
            ))
        }
    };
    query_and_rope_checks(like, positions, rope, q, t, d)?;
    if !fuses_cache_write(cache) {
        return Err(Error::config(format!(
            "the Q/K/V projection cannot write this cache itself (storage {}, on {}): it \
             needs f32 storage in one buffer on a CPU, CUDA, Vulkan or wgpu device; write \
             the keys and values through the attention layer instead",
            spec.storage_dtype(),
            cache.data().device().kind().as_str()
        )));
    }
    same_device("the KV cache", like, cache.data())?;
    let slots = &batch.device().slot_mapping;
    same_device("the batch's slot mapping", like, slots)?;
    if batch.slot_mapping_cpu().len() != t {
        return Err(Error::config(format!(
            "the batch's slot mapping has {} entries for the projection's {t} tokens",
            batch.slot_mapping_cpu().len()
        )));
    }
    cache.check_batch(batch)?;
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
/// [`LinearOutput::RopeSplitQkv`] and [`LinearOutput::RopeSplitQkvCache`], and `K = 0` (no
/// product to write); for the cache form also a cache [`fuses_cache_write`] refuses, a
/// batch whose slot mapping has another token count or whose block size differs from the
/// cache's, and a batch naming more blocks than the cache holds. A refused call writes
/// nothing.
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
            let (tq, heads) = rope_split_dims(x, positions, *rope, q, kt, v)?;
            check_qkv_rows(weight, (t, k, n), tq, heads)?;
        }
        LinearOutput::RopeSplitQkvCache {
            positions,
            rope,
            q,
            cache,
            batch,
        } => {
            let (tq, heads) = rope_cache_dims(x, positions, *rope, q, cache, batch)?;
            check_qkv_rows(weight, (t, k, n), tq, heads)?;
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
