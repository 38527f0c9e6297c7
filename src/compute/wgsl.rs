//! The WGSL family's model operations on either of its runtimes (wgpu, native Vulkan:
//! [`WgslRuntime`]): `shaders/model_ops_*.wgsl`, specialised by [`ModelShader`], compiled
//! once per device (the runtime's pipeline cache) and launched one dispatch per call.
//!
//! * `embedding` / `gather_rows`: one thread per output element (vec4 when H % 4 == 0); an
//!   index out of range gives a row of zeros.
//! * `rms_norm`: one workgroup per row, tree reduction in workgroup memory.
//! * `linear_fused`, and `linear` / `linear_accumulate` as its plain form: one dispatch per
//!   call. T ≤ [`GEMV_MAX_TOKENS`] runs the GEMV kernel (a group of 32 threads per output
//!   unit, coalesced weight reads, every weight element read once for all T tokens); larger
//!   T the tiled GEMM (64×64 output tiles, 4×4 outputs per thread). Folded in
//!   ([`LinearFusion`]): an RMSNorm of the input rows (each workgroup first sums its rows'
//!   squares, then scales x by `inv · g` as it reads it), and the output step: stored, added
//!   (`accumulate`), or one of the pair forms, whose unit is two weight rows combined by the
//!   epilogue (SwiGLU's gate and up rows; a rotated pair of a fused Q/K/V projection,
//!   written into q, k or v).
//! * `rope`: one thread per (token, head, pair), angles in f32.
//! * `silu_mul`, `add_assign`: one thread per element (vec4 when the count allows).
//! * `swiglu`: one thread per output element (vec4 when the width allows); `rope_split_qkv`:
//!   one dispatch per output (q, k rotated; v copied), one thread per (token, head, pair).
//! * `argmax`: one workgroup per row, tree reduction of (value, index) candidates;
//!   `sample`: the same kernel with SAMPLING, then per row the total, a 30-step bisection
//!   for the top-p threshold and a scan of contiguous column ranges for the draw
//!   (`model_ops_sample.wgsl`).
//!
//! Every tensor must fit one storage binding ([`WgslDeviceInfo::check_binding`]: lavapipe
//! allows 128 MiB, enough for SmolLM2's 49152×576 f32 embedding table); a larger one is an
//! error naming the tensor, never a partial result. Dispatches of more than the device's
//! per-dimension limit are spread over x and z ([`WgslDeviceInfo::grid`]).

use super::fused_linear::FusedLinear;
use super::{LinearOutput, Rope, RopeStyle};
use crate::capability::KvLayout;
#[cfg(doc)]
use crate::device::wgsl::WgslDeviceInfo;
use crate::device::wgsl::{Dispatch, LoopBounding, WgslRuntime, Words};
use crate::device::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::wgsl::{
    LinearEpilogue, LinearFusion, LinearWeights, ModelShader, GEMV_FEATURES_PER_GROUP,
    GEMV_MAX_TOKENS, LINEAR_TILE, MODEL_WORKGROUP,
};

/// `v` as a u32 kernel parameter, or an error naming it.
fn u32_of(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds the WGSL kernels' u32 range")))
}

/// Submits one dispatch of `shader`: `words` as its parameters (binding 0), `bufs` at
/// bindings 1, 2 (read) and 3 (read-write), `groups` workgroups.
fn run<R: WgslRuntime>(
    dev: &R,
    shader: ModelShader,
    words: Words,
    bufs: [R::Buffer; 3],
    groups: (u32, u32, u32),
) -> Result<()> {
    let [a, b, c] = bufs;
    dispatch(dev, shader, words, vec![(1, a), (2, b), (3, c)], groups)
}

/// Submits one dispatch of `shader` with `words` as its parameters (binding 0), `buffers`
/// at their bindings (every storage binding of the shader's set) and `groups` workgroups.
fn dispatch<R: WgslRuntime>(
    dev: &R,
    shader: ModelShader,
    words: Words,
    buffers: Vec<(u32, R::Buffer)>,
    groups: (u32, u32, u32),
) -> Result<()> {
    let pipeline = dev.pipeline(
        &shader.key(),
        &|| shader.source(),
        shader.bindings(),
        false,
        LoopBounding::Forced,
    )?;
    dev.submit_one(
        words.w,
        Dispatch {
            pipeline,
            slot: 0,
            buffers,
            groups,
        },
    )
}

/// Workgroups for `threads` threads of [`MODEL_WORKGROUP`], spread over x and z.
fn flat<R: WgslRuntime>(dev: &R, threads: usize) -> Result<(u32, u32, u32)> {
    let (x, z) = dev
        .info()
        .grid((threads as u64).div_ceil(MODEL_WORKGROUP as u64))?;
    Ok((x, 1, z))
}

pub(super) fn embedding<R: WgslRuntime>(
    dev: &R,
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
    let tb = dev.tensor_buffer(table, "embedding table / gather_rows input")?;
    let ib = dev.tensor_buffer(ids, "indices")?;
    let ob = dev.tensor_buffer(out, "embedding / gather_rows output")?;
    let vec4 = h.is_multiple_of(4);
    let hv = if vec4 { h / 4 } else { h };
    let words = Words::new()
        .u(u32_of("rows", t)?)
        .u(u32_of("hidden", hv)?)
        .u(u32_of("table rows", v)?);
    run(
        dev,
        ModelShader::Gather { vec4 },
        words,
        [tb, ib, ob],
        flat(dev, t * hv)?,
    )
}

pub(super) fn rms_norm<R: WgslRuntime>(
    dev: &R,
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
    let xb = dev.tensor_buffer(x, "rms_norm input")?;
    let wb = dev.tensor_buffer(weight, "rms_norm weight")?;
    let ob = dev.tensor_buffer(out, "rms_norm output")?;
    let vec4 = h.is_multiple_of(4);
    let hv = if vec4 { h / 4 } else { h };
    let words = Words::new()
        .u(u32_of("rows", t)?)
        .u(u32_of("hidden", hv)?)
        .u(u32_of("hidden", h)?)
        .f(eps);
    let (gx, gz) = dev.info().grid(t as u64)?;
    run(
        dev,
        ModelShader::RmsNorm { vec4 },
        words,
        [xb, wb, ob],
        (gx, 1, gz),
    )
}

/// `linear` / `linear_accumulate`: the plain form of [`linear_fused`]'s kernels.
#[allow(clippy::too_many_arguments)]
pub(super) fn rope<R: WgslRuntime>(
    dev: &R,
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
    let xb = dev.tensor_buffer(x, "rope input")?;
    let pb = dev.tensor_buffer(positions, "rope positions")?;
    let words = Words::new()
        .u(u32_of("tokens", t)?)
        .u(u32_of("heads", heads)?)
        .u(u32_of("head_size / 2", d / 2)?)
        .f(rope.base);
    let shader = ModelShader::Rope {
        interleaved: rope.style == RopeStyle::Interleaved,
    };
    run(
        dev,
        shader,
        words,
        [pb, dev.placeholder(0)?, xb],
        flat(dev, pairs)?,
    )
}

/// Elements per thread and the thread count of an element-wise op over `numel` elements.
fn elementwise_units(numel: usize) -> (bool, usize) {
    let vec4 = numel.is_multiple_of(4);
    (vec4, if vec4 { numel / 4 } else { numel })
}

pub(super) fn silu_mul<R: WgslRuntime>(
    dev: &R,
    gate: &Tensor,
    up: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    let (vec4, units) = elementwise_units(gate.numel());
    if units == 0 {
        return Ok(());
    }
    let gb = dev.tensor_buffer(gate, "silu_mul gate")?;
    let ub = dev.tensor_buffer(up, "silu_mul up")?;
    let ob = dev.tensor_buffer(out, "silu_mul output")?;
    let words = Words::new().u(u32_of("elements", units)?);
    run(
        dev,
        ModelShader::SiluMul { vec4 },
        words,
        [gb, ub, ob],
        flat(dev, units)?,
    )
}

pub(super) fn add_assign<R: WgslRuntime>(dev: &R, x: &mut Tensor, y: &Tensor) -> Result<()> {
    let (vec4, units) = elementwise_units(x.numel());
    if units == 0 {
        return Ok(());
    }
    let xb = dev.tensor_buffer(x, "add_assign target")?;
    let yb = dev.tensor_buffer(y, "add_assign operand")?;
    let words = Words::new().u(u32_of("elements", units)?);
    run(
        dev,
        ModelShader::Add { vec4 },
        words,
        [yb, dev.placeholder(0)?, xb],
        flat(dev, units)?,
    )
}

/// The token of each row of `logits [r, v]` into `out`: the argmax, or with `rows` the
/// sampling kernel (one module, `model_ops_sample.wgsl`, with or without SAMPLING).
pub(super) fn tokens<R: WgslRuntime>(
    dev: &R,
    logits: &Tensor,
    rows: Option<&Tensor>,
    (r, v): (usize, usize),
    out: &mut Tensor,
) -> Result<()> {
    if r == 0 {
        return Ok(());
    }
    let (shader, rows) = match rows {
        Some(t) => (ModelShader::Sample, dev.tensor_buffer(t, "sampling rows")?),
        None => (ModelShader::Argmax, dev.placeholder(0)?),
    };
    let xb = dev.tensor_buffer(logits, "logits")?;
    let ob = dev.tensor_buffer(out, "token ids")?;
    let words = Words::new().u(u32_of("rows", r)?).u(u32_of("vocab", v)?);
    let (gx, gz) = dev.info().grid(r as u64)?;
    run(dev, shader, words, [xb, rows, ob], (gx, 1, gz))
}

pub(super) fn swiglu<R: WgslRuntime>(
    dev: &R,
    gate_up: &Tensor,
    out: &mut Tensor,
    t: usize,
    i: usize,
) -> Result<()> {
    let vec4 = i.is_multiple_of(4);
    let wv = if vec4 { i / 4 } else { i };
    let units = t * wv;
    if units == 0 {
        return Ok(());
    }
    let gb = dev.tensor_buffer(gate_up, "swiglu input")?;
    let ob = dev.tensor_buffer(out, "swiglu output")?;
    let words = Words::new()
        .u(u32_of("elements", units)?)
        .u(u32_of("intermediate", wv)?);
    run(
        dev,
        ModelShader::Swiglu { vec4 },
        words,
        [gb, dev.placeholder(0)?, ob],
        flat(dev, units)?,
    )
}

/// Three dispatches of `model_ops_rope_split.wgsl`, one per output (a binding set holds one
/// writable buffer).
#[allow(clippy::too_many_arguments)]
pub(super) fn rope_split<R: WgslRuntime>(
    dev: &R,
    qkv: &Tensor,
    positions: &Tensor,
    rope: Rope,
    (h, hk, d): (usize, usize, usize),
    t: usize,
    q: &mut Tensor,
    k: &mut Tensor,
    v: &mut Tensor,
) -> Result<()> {
    if t * d == 0 {
        return Ok(());
    }
    let qb = dev.tensor_buffer(qkv, "rope_split_qkv input")?;
    let pb = dev.tensor_buffer(positions, "rope positions")?;
    let interleaved = rope.style == RopeStyle::Interleaved;
    for (out, first, heads, rotate, what) in [
        (&*q, 0, h, true, "rope_split_qkv q"),
        (&*k, h, hk, true, "rope_split_qkv k"),
        (&*v, h + hk, hk, false, "rope_split_qkv v"),
    ] {
        let pairs = t * heads * (d / 2);
        if pairs == 0 {
            continue;
        }
        let ob = dev.tensor_buffer(out, what)?;
        let words = Words::new()
            .u(u32_of("tokens", t)?)
            .u(u32_of("heads", heads)?)
            .u(u32_of("head_size / 2", d / 2)?)
            .f(rope.base)
            .u(u32_of("first head", first)?)
            .u(u32_of("heads per row", h + 2 * hk)?);
        run(
            dev,
            ModelShader::RopeSplit {
                interleaved,
                rotate,
            },
            words,
            [qb.clone(), pb.clone(), ob],
            flat(dev, pairs)?,
        )?;
    }
    Ok(())
}

/// Whether `t` is stored in one buffer that a kernel can bind whole (a tensor larger than
/// one binding is stored in chunks on the Vulkan runtime, which only the attention kernels
/// bind).
pub(super) fn binds_whole<R: WgslRuntime>(dev: &R, t: &Tensor) -> bool {
    dev.tensor_buffer(t, "tensor").is_ok()
}

/// [`super::linear_fused`]: one dispatch of the GEMV (T ≤ [`GEMV_MAX_TOKENS`]) or of the
/// tiled GEMM with the input norm and output step folded in ([`LinearFusion`]).
pub(super) fn linear_fused<R: WgslRuntime>(
    dev: &R,
    a: &FusedLinear<'_>,
    out: LinearOutput<'_>,
) -> Result<()> {
    let (t, k, n) = (a.t, a.k, a.n);
    if t == 0 || n == 0 || k == 0 {
        return Ok(());
    }
    let mut buffers = vec![
        (1, dev.tensor_buffer(a.x, "linear input")?),
        (2, dev.tensor_buffer(a.w, "linear weight")?),
    ];
    if let Some(nm) = a.norm {
        buffers.push((4, dev.tensor_buffer(nm.weight, "rms_norm weight")?));
    }
    // Whether the plain form adds, and the RoPE split's parameters (d / 2, H, Hk, base,
    // interleaved); zero where the form has none.
    let mut accumulate = false;
    let mut rope_words = (0, 0, 0, 0.0, false);
    // The cache form's block size and layout (1: HND).
    let mut cache_words = (0, 0);
    let epilogue = match out {
        LinearOutput::Store(o) => {
            buffers.push((3, dev.tensor_buffer(o, "linear output")?));
            LinearEpilogue::Plain
        }
        LinearOutput::Accumulate(o) => {
            buffers.push((3, dev.tensor_buffer(o, "linear_accumulate target")?));
            accumulate = true;
            LinearEpilogue::Plain
        }
        LinearOutput::SwiGlu(o) => {
            buffers.push((3, dev.tensor_buffer(o, "swiglu output")?));
            LinearEpilogue::SwiGlu
        }
        LinearOutput::RopeSplitQkv {
            positions,
            rope,
            q,
            k: kt,
            v,
        } => {
            let (h, hk, d) = (q.shape()[1], kt.shape()[1], q.shape()[2]);
            buffers.extend([
                (3, dev.tensor_buffer(q, "rope_split_qkv q")?),
                (5, dev.tensor_buffer(positions, "rope positions")?),
                (6, dev.tensor_buffer(kt, "rope_split_qkv k")?),
                (7, dev.tensor_buffer(v, "rope_split_qkv v")?),
            ]);
            rope_words = (
                u32_of("head_size / 2", d / 2)?,
                u32_of("heads", h)?,
                u32_of("kv heads", hk)?,
                rope.base,
                rope.style == RopeStyle::Interleaved,
            );
            LinearEpilogue::RopeSplit
        }
        LinearOutput::RopeSplitQkvCache {
            positions,
            rope,
            q,
            cache,
            batch,
        } => {
            let spec = *cache.spec();
            buffers.extend([
                (3, dev.tensor_buffer(q, "rope_split_qkv q")?),
                (5, dev.tensor_buffer(positions, "rope positions")?),
                (6, dev.tensor_buffer(cache.data(), "KV cache")?),
                (
                    7,
                    dev.tensor_buffer(&batch.device().slot_mapping, "slot mapping")?,
                ),
            ]);
            rope_words = (
                u32_of("head_size / 2", spec.head_size / 2)?,
                u32_of("heads", q.shape()[1])?,
                u32_of("kv heads", spec.num_kv_heads)?,
                rope.base,
                rope.style == RopeStyle::Interleaved,
            );
            cache_words = (
                u32_of("cache block size", cache.block_size())?,
                u32::from(cache.layout() == KvLayout::Hnd),
            );
            LinearEpilogue::RopeSplitCache
        }
    };
    let fusion = LinearFusion {
        norm: a.norm.is_some(),
        epilogue,
        weights: match a.w.dtype() {
            DType::F32 => LinearWeights::F32,
            DType::F16 => LinearWeights::F16,
            DType::Bf16 => LinearWeights::Bf16,
            other => {
                return Err(Error::DType {
                    what: "linear weight",
                    got: other.to_string(),
                    expected: "f32, f16 or bf16".into(),
                })
            }
        },
    };
    if !fusion.is_plain() {
        // The set's every binding is bound: a placeholder (one per binding) where this form
        // declares none.
        for (slot, binding) in [4, 5, 6, 7].into_iter().enumerate() {
            if !buffers.iter().any(|(b, _)| *b == binding) {
                buffers.push((binding, dev.placeholder(slot)?));
            }
        }
    }
    let vec4 = k % 4 == 0;
    let kv = if vec4 { k / 4 } else { k };
    let (half, h, hk, base, interleaved) = rope_words;
    // model_ops_linear_out.wgsl's Params, in order.
    let words = Words::new()
        .u(u32_of("tokens", t)?)
        .u(u32_of("out_features", n)?)
        .u(u32_of("in_features", kv)?)
        .u(u32::from(accumulate))
        .f(a.norm.map_or(0.0, |nm| nm.eps))
        .u(half)
        .u(h)
        .u(hk)
        .f(base)
        .u(u32::from(interleaved))
        .u(cache_words.0)
        .u(cache_words.1);
    let units = fusion.units(n);
    let groups = if t <= GEMV_MAX_TOKENS {
        let (gx, gz) = dev
            .info()
            .grid(units.div_ceil(GEMV_FEATURES_PER_GROUP as usize) as u64)?;
        (gx, 1, gz)
    } else {
        let (gx, gy) = (
            units.div_ceil(fusion.tile_units() as usize),
            t.div_ceil(LINEAR_TILE as usize),
        );
        let max = dev.info().max_workgroups_per_dim as usize;
        if gx > max || gy > max {
            return Err(Error::config(format!(
                "linear of {t} tokens × {n} features needs {gx}×{gy} tiles, more than this \
                 device's dispatch limit ({max} per dimension)"
            )));
        }
        (gx as u32, gy as u32, 1)
    };
    dispatch(
        dev,
        ModelShader::linear(vec4, t, fusion),
        words,
        buffers,
        groups,
    )
}
