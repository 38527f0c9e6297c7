//! CUDA kernels of the model operations: `kernels-cuda/model_ops.cu`, compiled by NVRTC for
//! the device's architecture on first use (the device's module cache and the on-disk cache,
//! as the attention kernels) and launched on the device's one stream, without waiting.
//!
//! * `embedding` / `gather_rows`: `model_gather` (an index out of range gives zeros).
//! * `rms_norm`: `model_rms_norm`, one block per row.
//! * `linear` / `linear_accumulate` / `linear_fused` (`kernels-cuda/model_linear.cu`, all
//!   through `linear_fused`): T ≤ [`GEMV_MAX_TOKENS`] → a GEMV ([`gemv_entry`]: a warp per
//!   pair of weight rows, or four where [`gemv_split`] says so, the loads of a chunk issued
//!   together, shuffle reduction); larger T → `model_linear_tiled` (64×64 shared memory
//!   tiles, 4×4 register blocks). One launch for every form: the input RMSNorm inside the
//!   kernel, the product stored, accumulated, SwiGLU'd or split and rotated on its way out.
//! * `rope`: `model_rope`; `silu_mul`: `model_silu_mul`; `add_assign`: `model_add`.
//! * `swiglu`: `model_swiglu`; `rope_split_qkv`: `model_rope_split` (all three outputs in one
//!   launch).
//! * `argmax`: `model_argmax`, one block of [`ARGMAX_THREADS`] per row; `sample`:
//!   `model_sample`, the same blocks, then the top-p bisection and the draw's scan.
//!
//! Shapes and dtypes were validated by `crate::compute`; this file checks that the tensors
//! live on this device, picks the float4 variants (row length a multiple of 4 and 16-byte
//! aligned addresses) and sizes the grids.

use cudarc::driver::LaunchConfig;

use super::fused_linear::FusedLinear;
use super::{LinearOutput, Rope, RopeStyle};
use crate::capability::KvLayout;
use crate::device::cuda as runtime;
use crate::device::{CudaDevice, Device, Storage, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::cuda::{
    gemv_entry, gemv_split, linear_weight_options, ArgmaxParams, EltwiseParams, GatherParams,
    LinearEpilogue, LinearParams, RmsNormParams, RopeParams, RopeSplitParams, SampleParams,
    SwigluParams, ARGMAX_THREADS, GEMV_MAX_TOKENS, GEMV_THREADS, LINEAR_TILE, MODEL_LINEAR,
    MODEL_OPS, MODEL_THREADS,
};

/// The device address of `t`, which must live on `dev`.
fn ptr(dev: &CudaDevice, t: &Tensor, what: &str) -> Result<u64> {
    match (t.device(), t.storage()) {
        (Device::Cuda(d), Storage::Cuda(s)) if d == dev => Ok(s.device_ptr()),
        _ => Err(Error::Device {
            backend: "cuda".into(),
            message: format!("{what} is not on this CUDA device ({})", dev.description()),
        }),
    }
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds the kernels' i32 range")))
}

/// The vocabulary of the argmax and sampling kernels: each thread strides over a row by the
/// block width in `int` arithmetic, which must not pass `i32::MAX`.
fn vocab_of(v: usize) -> Result<i32> {
    const MAX: usize = 1 << 30;
    if v > MAX {
        return Err(Error::config(format!(
            "a vocabulary of {v} exceeds the CUDA argmax and sampling kernels' {MAX}"
        )));
    }
    i32_of("vocab", v)
}

fn i64_of(what: &str, v: usize) -> Result<i64> {
    i64::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds the kernels' i64 range")))
}

/// Whether `len` elements per row and every address allow float4 accesses.
fn vec4_ok(len: usize, ptrs: &[u64]) -> i32 {
    i32::from(len.is_multiple_of(4) && ptrs.iter().all(|p| p % 16 == 0))
}

/// Launches entry point `name` of model_ops.cu / model_linear.cu with `params`, as a
/// dependent of the kernel before it (every kernel of both files opens with the dependent
/// prologue).
fn launch<P: bytemuck::Pod>(
    dev: &CudaDevice,
    name: &str,
    grid: (u32, u32, u32),
    block: u32,
    params: &P,
) -> Result<()> {
    launch_built(dev, name, &[], grid, block, params)
}

/// [`launch`] of a module built with `options` (`model_linear.cu`'s weight type).
fn launch_built<P: bytemuck::Pod>(
    dev: &CudaDevice,
    name: &str,
    options: &[&str],
    grid: (u32, u32, u32),
    block: u32,
    params: &P,
) -> Result<()> {
    let source = if name.starts_with("model_linear") {
        &MODEL_LINEAR
    } else {
        &MODEL_OPS
    };
    let f = runtime::function(dev, source, options, name)?;
    let cfg = LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    };
    runtime::launch_dependent(dev, &f, cfg, params, None)
}

/// Blocks of [`MODEL_THREADS`] for a grid-stride loop over `units` items: enough to fill the GPU
/// many times over, never more than the items need.
fn stride_blocks(dev: &CudaDevice, units: usize) -> u32 {
    let needed = units.div_ceil(MODEL_THREADS as usize);
    let cap = dev.sm_count() as usize * 32;
    needed.clamp(1, cap) as u32
}

pub(super) fn embedding(
    dev: &CudaDevice,
    table: &Tensor,
    ids: &Tensor,
    v: usize,
    h: usize,
    t: usize,
    out: &mut Tensor,
) -> Result<()> {
    if t == 0 || h == 0 {
        return Ok(());
    }
    let tp = ptr(dev, table, "embedding table / gather_rows input")?;
    let ip = ptr(dev, ids, "indices")?;
    let op = ptr(dev, out, "output")?;
    let vec4 = vec4_ok(h, &[tp, op]);
    let params = GatherParams {
        table: tp,
        ids: ip,
        out: op,
        num_rows: i64_of("rows", t)?,
        table_rows: i64_of("table rows", v)?,
        h: i32_of("hidden", h)?,
        vec4,
    };
    let units = if vec4 == 1 { t * h / 4 } else { t * h };
    launch(
        dev,
        "model_gather",
        (stride_blocks(dev, units), 1, 1),
        MODEL_THREADS,
        &params,
    )
}

pub(super) fn rms_norm(
    dev: &CudaDevice,
    x: &Tensor,
    weight: &Tensor,
    eps: f32,
    t: usize,
    h: usize,
    out: &mut Tensor,
) -> Result<()> {
    if t == 0 || h == 0 {
        return Ok(());
    }
    let xp = ptr(dev, x, "rms_norm input")?;
    let wp = ptr(dev, weight, "rms_norm weight")?;
    let yp = ptr(dev, out, "output")?;
    let params = RmsNormParams {
        x: xp,
        weight: wp,
        y: yp,
        num_rows: i64_of("rows", t)?,
        h: i32_of("hidden", h)?,
        eps,
        vec4: vec4_ok(h, &[xp, wp, yp]),
        pad: 0,
    };
    // One block per row (the kernel also strides over rows, so the grid may be capped).
    let blocks = t.min(i32::MAX as usize) as u32;
    launch(
        dev,
        "model_rms_norm",
        (blocks, 1, 1),
        MODEL_THREADS,
        &params,
    )
}

/// Launches `model_linear.cu`, built for weights of `weight` type, for `params`: a GEMV up to
/// [`GEMV_MAX_TOKENS`] tokens (a warp per pair of weight rows), the tiled kernel above (64
/// rows, or 32 pairs, per tile column).
fn launch_linear(dev: &CudaDevice, params: &LinearParams, weight: DType) -> Result<()> {
    let options = linear_weight_options(weight).ok_or_else(|| Error::DType {
        what: "linear weight",
        got: weight.to_string(),
        expected: "f32, f16 or bf16".into(),
    })?;
    let (t, n) = (params.t as usize, params.n as usize);
    let pairs = params.epilogue == LinearEpilogue::SwiGlu as i32
        || params.epilogue == LinearEpilogue::RopeSplit as i32;
    let units = if pairs { n / 2 } else { n.div_ceil(2) };
    if units == 0 {
        return Ok(());
    }
    if t <= GEMV_MAX_TOKENS {
        // A wave per pair, or four (the kernel strides over pairs past the grid).
        let split = gemv_split(units, dev.sm_count() as usize);
        let per_block = if split { 1 } else { GEMV_THREADS as usize / 32 };
        let blocks = units.div_ceil(per_block).min(i32::MAX as usize) as u32;
        launch_built(
            dev,
            gemv_entry(t, params.norm != 0, split),
            options,
            (blocks, 1, 1),
            GEMV_THREADS,
            params,
        )
    } else {
        let cols = if pairs {
            units.div_ceil(LINEAR_TILE / 2)
        } else {
            n.div_ceil(LINEAR_TILE)
        };
        let gy = t.div_ceil(LINEAR_TILE);
        if gy > 65535 {
            return Err(Error::config(format!(
                "linear of {t} tokens exceeds the tiled kernel's grid ({} tokens at most)",
                65535 * LINEAR_TILE
            )));
        }
        let gx = i32_of("linear tiles", cols)? as u32;
        launch_built(
            dev,
            "model_linear_tiled",
            options,
            (gx, gy as u32, 1),
            MODEL_THREADS,
            params,
        )
    }
}

/// [`super::linear_fused`]: one launch of `model_linear.cu` with the norm and output step.
pub(super) fn linear_fused(
    dev: &CudaDevice,
    a: &FusedLinear<'_>,
    out: LinearOutput<'_>,
) -> Result<()> {
    let xp = ptr(dev, a.x, "linear input")?;
    let wp = ptr(dev, a.w, "linear weight")?;
    let (norm, eps) = match a.norm {
        Some(nm) => (ptr(dev, nm.weight, "rms_norm weight")?, nm.eps),
        None => (0, 0.0),
    };
    let mut params = LinearParams {
        norm,
        eps,
        ..LinearParams::product(
            xp,
            wp,
            0,
            i32_of("tokens", a.t)?,
            i32_of("in_features", a.k)?,
            i32_of("out_features", a.n)?,
            vec4_ok(a.k, &[xp, wp, norm]) == 1,
            false,
        )
    };
    match out {
        LinearOutput::Store(o) => params.y = ptr(dev, o, "linear output")?,
        LinearOutput::Accumulate(o) => {
            params.y = ptr(dev, o, "linear_accumulate target")?;
            params.epilogue = LinearEpilogue::Accumulate as i32;
        }
        LinearOutput::SwiGlu(o) => {
            params.y = ptr(dev, o, "swiglu output")?;
            params.epilogue = LinearEpilogue::SwiGlu as i32;
        }
        LinearOutput::RopeSplitQkv {
            positions,
            rope,
            q,
            k,
            v,
        } => {
            params.y = ptr(dev, q, "q")?;
            params.y2 = ptr(dev, k, "k")?;
            params.y3 = ptr(dev, v, "v")?;
            params.positions = ptr(dev, positions, "positions")?;
            params.epilogue = LinearEpilogue::RopeSplit as i32;
            params.num_heads = i32_of("query heads", q.shape()[1])?;
            params.num_kv_heads = i32_of("kv heads", k.shape()[1])?;
            params.half = i32_of("head_size / 2", q.shape()[2] / 2)?;
            params.rope_base = rope.base;
            params.interleaved = i32::from(rope.style == RopeStyle::Interleaved);
        }
        LinearOutput::RopeSplitQkvCache {
            positions,
            rope,
            q,
            cache,
            batch,
        } => {
            let spec = *cache.spec();
            params.y = ptr(dev, q, "q")?;
            params.y2 = ptr(dev, cache.data(), "KV cache")?;
            params.slots = ptr(dev, &batch.device().slot_mapping, "slot mapping")?;
            params.positions = ptr(dev, positions, "positions")?;
            params.epilogue = LinearEpilogue::RopeSplit as i32;
            params.num_heads = i32_of("query heads", q.shape()[1])?;
            params.num_kv_heads = i32_of("kv heads", spec.num_kv_heads)?;
            params.half = i32_of("head_size / 2", spec.head_size / 2)?;
            params.rope_base = rope.base;
            params.interleaved = i32::from(rope.style == RopeStyle::Interleaved);
            params.cache_block_size = i32_of("cache block size", cache.block_size())?;
            params.cache_hnd = i32::from(cache.layout() == KvLayout::Hnd);
        }
    }
    launch_linear(dev, &params, a.w.dtype())
}

#[allow(clippy::too_many_arguments)]
pub(super) fn rope(
    dev: &CudaDevice,
    x: &mut Tensor,
    positions: &Tensor,
    rope: Rope,
    t: usize,
    heads: usize,
    d: usize,
) -> Result<()> {
    let pairs = t * heads * (d / 2);
    if pairs == 0 {
        return Ok(());
    }
    let params = RopeParams {
        x: ptr(dev, x, "rope input")?,
        positions: ptr(dev, positions, "rope positions")?,
        num_tokens: i64_of("tokens", t)?,
        num_heads: i32_of("heads", heads)?,
        half: i32_of("head_size / 2", d / 2)?,
        base: rope.base,
        interleaved: i32::from(rope.style == RopeStyle::Interleaved),
    };
    launch(
        dev,
        "model_rope",
        (stride_blocks(dev, pairs), 1, 1),
        MODEL_THREADS,
        &params,
    )
}

pub(super) fn silu_mul(
    dev: &CudaDevice,
    gate: &Tensor,
    up: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    let n = gate.numel();
    if n == 0 {
        return Ok(());
    }
    let (a, b, o) = (
        ptr(dev, gate, "silu_mul gate")?,
        ptr(dev, up, "silu_mul up")?,
        ptr(dev, out, "output")?,
    );
    let vec4 = vec4_ok(n, &[a, b, o]);
    let params = EltwiseParams {
        a,
        b,
        out: o,
        n: i64_of("elements", n)?,
        vec4,
        pad: 0,
    };
    let units = if vec4 == 1 { n / 4 } else { n };
    launch(
        dev,
        "model_silu_mul",
        (stride_blocks(dev, units), 1, 1),
        MODEL_THREADS,
        &params,
    )
}

pub(super) fn add_assign(dev: &CudaDevice, x: &mut Tensor, y: &Tensor) -> Result<()> {
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let (a, o) = (
        ptr(dev, y, "add_assign operand")?,
        ptr(dev, x, "add_assign target")?,
    );
    let vec4 = vec4_ok(n, &[a, o]);
    let params = EltwiseParams {
        a,
        b: 0,
        out: o,
        n: i64_of("elements", n)?,
        vec4,
        pad: 0,
    };
    let units = if vec4 == 1 { n / 4 } else { n };
    launch(
        dev,
        "model_add",
        (stride_blocks(dev, units), 1, 1),
        MODEL_THREADS,
        &params,
    )
}

pub(super) fn argmax(
    dev: &CudaDevice,
    logits: &Tensor,
    r: usize,
    v: usize,
    out: &mut Tensor,
) -> Result<()> {
    if r == 0 {
        return Ok(());
    }
    let params = ArgmaxParams {
        x: ptr(dev, logits, "argmax input")?,
        out: ptr(dev, out, "argmax output")?,
        num_rows: i64_of("rows", r)?,
        v: vocab_of(v)?,
        pad: 0,
    };
    launch_per_row(dev, "model_argmax", r, &params)
}

/// The token kernels' launch: one block of [`ARGMAX_THREADS`] per row (each kernel strides
/// over the rows past the grid's limit).
fn launch_per_row<P: bytemuck::Pod>(
    dev: &CudaDevice,
    kernel: &str,
    r: usize,
    params: &P,
) -> Result<()> {
    let blocks = r.min(i32::MAX as usize) as u32;
    launch(dev, kernel, (blocks, 1, 1), ARGMAX_THREADS, params)
}

pub(super) fn sample(
    dev: &CudaDevice,
    logits: &Tensor,
    rows: &Tensor,
    r: usize,
    v: usize,
    out: &mut Tensor,
) -> Result<()> {
    if r == 0 {
        return Ok(());
    }
    let params = SampleParams {
        x: ptr(dev, logits, "sample input")?,
        rows: ptr(dev, rows, "sampling rows")?,
        out: ptr(dev, out, "sample output")?,
        num_rows: i64_of("rows", r)?,
        v: vocab_of(v)?,
        pad: 0,
    };
    launch_per_row(dev, "model_sample", r, &params)
}

pub(super) fn swiglu(
    dev: &CudaDevice,
    gate_up: &Tensor,
    out: &mut Tensor,
    t: usize,
    i: usize,
) -> Result<()> {
    if t * i == 0 {
        return Ok(());
    }
    let (g, o) = (
        ptr(dev, gate_up, "swiglu input")?,
        ptr(dev, out, "swiglu output")?,
    );
    let vec4 = vec4_ok(i, &[g, o]);
    let params = SwigluParams {
        gate_up: g,
        out: o,
        rows: i64_of("rows", t)?,
        width: i32_of("intermediate", i)?,
        vec4,
    };
    // A block per row; the kernel strides over rows past the grid's limit.
    let blocks = t.min(i32::MAX as usize) as u32;
    launch(dev, "model_swiglu", (blocks, 1, 1), MODEL_THREADS, &params)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn rope_split(
    dev: &CudaDevice,
    qkv: &Tensor,
    positions: &Tensor,
    rope: Rope,
    heads: (usize, usize, usize),
    t: usize,
    q: &mut Tensor,
    k: &mut Tensor,
    v: &mut Tensor,
) -> Result<()> {
    let (h, hk, d) = heads;
    let pairs = t * (h + 2 * hk) * (d / 2);
    if pairs == 0 {
        return Ok(());
    }
    let params = RopeSplitParams {
        qkv: ptr(dev, qkv, "rope_split_qkv input")?,
        positions: ptr(dev, positions, "rope positions")?,
        q: ptr(dev, q, "rope_split_qkv q")?,
        k: ptr(dev, k, "rope_split_qkv k")?,
        v: ptr(dev, v, "rope_split_qkv v")?,
        num_tokens: i64_of("tokens", t)?,
        num_heads: i32_of("heads", h)?,
        num_kv_heads: i32_of("kv heads", hk)?,
        half: i32_of("head_size / 2", d / 2)?,
        base: rope.base,
        interleaved: i32::from(rope.style == RopeStyle::Interleaved),
        pad: 0,
    };
    launch(
        dev,
        "model_rope_split",
        (stride_blocks(dev, pairs), 1, 1),
        MODEL_THREADS,
        &params,
    )
}
