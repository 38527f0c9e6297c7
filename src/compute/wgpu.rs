//! wgpu kernels of the model operations: `shaders/model_ops_*.wgsl`, specialised by
//! [`ModelShader`], compiled once per device (the device's pipeline cache) and launched one
//! dispatch per call, submitted without waiting (a later download or synchronize waits).
//!
//! * `embedding` / `gather_rows`: one thread per output element (vec4 when H % 4 == 0); an
//!   index out of range gives a row of zeros.
//! * `rms_norm`: one workgroup per row, tree reduction in workgroup memory.
//! * `linear`: T ≤ [`GEMV_MAX_TOKENS`] runs the GEMV kernel (a group of 32 threads per output
//!   feature, coalesced weight reads, every weight element read once for all T tokens);
//!   larger T the tiled GEMM (64×64 output tiles, 4×4 outputs per thread).
//! * `rope`: one thread per (token, head, pair), angles in f32.
//! * `silu_mul`, `add_assign`: one thread per element (vec4 when the count allows).
//!
//! Every tensor must fit one storage binding (`device::wgpu::check_binding`: lavapipe allows
//! 128 MiB, enough for SmolLM2's 49152×576 f32 embedding table); a larger one is an error
//! naming the tensor, never a partial result. Dispatches of more than 65535 workgroups are
//! spread over x and z (`device::wgpu::grid`).

use std::sync::{Mutex, OnceLock};

use super::{Rope, RopeStyle};
use crate::device::wgpu::{
    bind_group, check_binding, dispatch, grid, pipeline, storage, whole, ParamBlock, Words,
};
use crate::device::{Device, Tensor, WgpuDevice};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::wgsl::{
    Bindings, ModelShader, GEMV_FEATURES_PER_GROUP, GEMV_MAX_TOKENS, LINEAR_TILE, MODEL_WORKGROUP,
};

/// `v` as a u32 kernel parameter, or an error naming it.
fn u32_of(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds the wgpu kernels' u32 range")))
}

/// A zeroed f32 output tensor of `shape` on `dev`, checked to fit one storage binding.
fn output(dev: &WgpuDevice, shape: &[usize], what: &str) -> Result<Tensor> {
    let bytes = shape.iter().product::<usize>() as u64 * 4;
    check_binding(dev, bytes, what)?;
    Tensor::zeros(&Device::Wgpu(dev.clone()), shape, DType::F32)
}

/// The buffer of `t` (checked to live on `dev` and to fit one binding).
fn buffer(dev: &WgpuDevice, t: &Tensor, what: &'static str) -> Result<wgpu::Buffer> {
    Ok(storage(dev, t, what)?.buffer().clone())
}

/// Records and submits one dispatch of `shader`: `words` as its parameters (binding 0),
/// `bufs` at bindings 1, 2 (read) and 3 (read-write), `groups` workgroups.
fn run(
    dev: &WgpuDevice,
    shader: ModelShader,
    words: Words,
    bufs: [&wgpu::Buffer; 3],
    groups: (u32, u32, u32),
) -> Result<()> {
    let pipe = pipeline(
        dev,
        &shader.key(),
        || shader.source(),
        Bindings::Model,
        false,
    )?;
    // One parameter slot per process (there is one wgpu device), reused by every call; the
    // lock spans write and submit, so a call's dispatch sees its own parameters (queued
    // buffer writes land before the next submission).
    static PARAMS: OnceLock<Mutex<(WgpuDevice, ParamBlock)>> = OnceLock::new();
    let mut guard = PARAMS
        .get_or_init(|| Mutex::new((dev.clone(), ParamBlock::new(dev, 1))))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if guard.0 != *dev {
        *guard = (dev.clone(), ParamBlock::new(dev, 1));
    }
    let params = &guard.1;
    params.write(dev, &[words.w]);
    let group = bind_group(
        dev,
        &pipe,
        vec![
            (0, params.binding(0)),
            (1, whole(bufs[0])),
            (2, whole(bufs[1])),
            (3, whole(bufs[2])),
        ],
    );
    let mut enc = dev
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("polyattn model op"),
        });
    dispatch(&mut enc, &pipe, &group, groups);
    dev.queue().submit([enc.finish()]);
    Ok(())
}

/// Workgroups for `threads` threads of [`MODEL_WORKGROUP`], spread over x and z.
fn flat(dev: &WgpuDevice, threads: usize) -> Result<(u32, u32, u32)> {
    let (x, z) = grid(dev, (threads as u64).div_ceil(MODEL_WORKGROUP as u64))?;
    Ok((x, 1, z))
}

pub(super) fn embedding(
    dev: &WgpuDevice,
    table: &Tensor,
    ids: &Tensor,
    v: usize,
    h: usize,
    t: usize,
) -> Result<Tensor> {
    let out = output(dev, &[t, h], "embedding / gather_rows output")?;
    if t == 0 || h == 0 {
        return Ok(out);
    }
    let tb = buffer(dev, table, "embedding table / gather_rows input")?;
    let ib = buffer(dev, ids, "indices")?;
    let ob = buffer(dev, &out, "embedding / gather_rows output")?;
    let vec4 = h % 4 == 0;
    let hv = if vec4 { h / 4 } else { h };
    let words = Words::new()
        .u(u32_of("rows", t)?)
        .u(u32_of("hidden", hv)?)
        .u(u32_of("table rows", v)?);
    run(
        dev,
        ModelShader::Gather { vec4 },
        words,
        [&tb, &ib, &ob],
        flat(dev, t * hv)?,
    )?;
    Ok(out)
}

pub(super) fn rms_norm(
    dev: &WgpuDevice,
    x: &Tensor,
    weight: &Tensor,
    eps: f32,
    t: usize,
    h: usize,
) -> Result<Tensor> {
    let out = output(dev, &[t, h], "rms_norm output")?;
    if t == 0 || h == 0 {
        return Ok(out);
    }
    let xb = buffer(dev, x, "rms_norm input")?;
    let wb = buffer(dev, weight, "rms_norm weight")?;
    let ob = buffer(dev, &out, "rms_norm output")?;
    let vec4 = h % 4 == 0;
    let hv = if vec4 { h / 4 } else { h };
    let words = Words::new()
        .u(u32_of("rows", t)?)
        .u(u32_of("hidden", hv)?)
        .u(u32_of("hidden", h)?)
        .f(eps);
    let (gx, gz) = grid(dev, t as u64)?;
    run(
        dev,
        ModelShader::RmsNorm { vec4 },
        words,
        [&xb, &wb, &ob],
        (gx, 1, gz),
    )?;
    Ok(out)
}

pub(super) fn linear(
    dev: &WgpuDevice,
    x: &Tensor,
    weight: &Tensor,
    t: usize,
    k: usize,
    n: usize,
) -> Result<Tensor> {
    let out = output(dev, &[t, n], "linear output")?;
    if t == 0 || n == 0 || k == 0 {
        return Ok(out);
    }
    let xb = buffer(dev, x, "linear input")?;
    let wb = buffer(dev, weight, "linear weight")?;
    let ob = buffer(dev, &out, "linear output")?;
    let vec4 = k % 4 == 0;
    let kv = if vec4 { k / 4 } else { k };
    let words = Words::new()
        .u(u32_of("tokens", t)?)
        .u(u32_of("out_features", n)?)
        .u(u32_of("in_features", kv)?);
    if t <= GEMV_MAX_TOKENS {
        let (gx, gz) = grid(dev, n.div_ceil(GEMV_FEATURES_PER_GROUP as usize) as u64)?;
        run(
            dev,
            ModelShader::LinearGemv { vec4 },
            words,
            [&xb, &wb, &ob],
            (gx, 1, gz),
        )?;
    } else {
        let tile = LINEAR_TILE as usize;
        let (gx, gy) = (n.div_ceil(tile), t.div_ceil(tile));
        let max = dev.limits().max_compute_workgroups_per_dimension as usize;
        if gx > max || gy > max {
            return Err(Error::config(format!(
                "linear of {t} tokens × {n} features needs {gx}×{gy} tiles, more than this \
                 adapter's dispatch limit ({max} per dimension)"
            )));
        }
        run(
            dev,
            ModelShader::LinearTiled { vec4 },
            words,
            [&xb, &wb, &ob],
            (gx as u32, gy as u32, 1),
        )?;
    }
    Ok(out)
}

pub(super) fn rope(
    dev: &WgpuDevice,
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
    let xb = buffer(dev, x, "rope input")?;
    let pb = buffer(dev, positions, "rope positions")?;
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
        [&pb, dev.dummy_buffer(0), &xb],
        flat(dev, pairs)?,
    )
}

/// Elements per thread and the thread count of an element-wise op over `numel` elements.
fn elementwise_units(numel: usize) -> (bool, usize) {
    let vec4 = numel % 4 == 0;
    (vec4, if vec4 { numel / 4 } else { numel })
}

pub(super) fn silu_mul(dev: &WgpuDevice, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let out = output(dev, gate.shape(), "silu_mul output")?;
    let (vec4, units) = elementwise_units(gate.numel());
    if units == 0 {
        return Ok(out);
    }
    let gb = buffer(dev, gate, "silu_mul gate")?;
    let ub = buffer(dev, up, "silu_mul up")?;
    let ob = buffer(dev, &out, "silu_mul output")?;
    let words = Words::new().u(u32_of("elements", units)?);
    run(
        dev,
        ModelShader::SiluMul { vec4 },
        words,
        [&gb, &ub, &ob],
        flat(dev, units)?,
    )?;
    Ok(out)
}

pub(super) fn add_assign(dev: &WgpuDevice, x: &mut Tensor, y: &Tensor) -> Result<()> {
    let (vec4, units) = elementwise_units(x.numel());
    if units == 0 {
        return Ok(());
    }
    let xb = buffer(dev, x, "add_assign target")?;
    let yb = buffer(dev, y, "add_assign operand")?;
    let words = Words::new().u(u32_of("elements", units)?);
    run(
        dev,
        ModelShader::Add { vec4 },
        words,
        [&yb, dev.dummy_buffer(0), &xb],
        flat(dev, units)?,
    )
}
