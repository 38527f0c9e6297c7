//! The model operations around attention — embedding gather, RMSNorm, linear layers (and
//! ones that add into their output), RoPE (and the split of a fused Q/K/V projection with
//! it), SiLU·mul (and SwiGLU over a fused gate/up projection), residual add, row gather,
//! greedy argmax — on the device the tensors live on.
//!
//! A model written once against these functions and [`crate::Attention`] runs on every
//! backend: each function validates its arguments here (shapes, dtypes, one device), then
//! dispatches on the [`Device`] to the backend's kernel (`cpu.rs`, `cuda.rs`, `wgsl.rs` (wgpu and Vulkan), one
//! file per device family with the same functions).
//!
//! Every operation that produces a tensor has two forms: `op(..) -> Tensor` allocates its
//! result, `op_into(.., out)` writes into a tensor the caller owns (every element of it:
//! what `out` held before never shows through). The `_into` forms allocate nothing on the
//! device, so a step built from them can be captured as a graph ([`Device::capture`]) and
//! replayed with the same buffers. Activations and weights are f32: the
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

pub(crate) mod cpu;
mod cuda;
mod fused_linear;
mod hip;
mod wgsl;

pub use fused_linear::{fuses_cache_write, linear_fused, InputNorm, LinearOutput};

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

/// `out` must be an f32 tensor of `shape` on `like`'s device.
fn check_out(what: &'static str, out: &Tensor, shape: &[usize], like: &Tensor) -> Result<()> {
    out.expect_shape(what, shape)?;
    out.expect_dtype(what, DType::F32)?;
    same_device(what, like, out)
}

/// A zeroed f32 result of `shape` on `like`'s device, for the allocating forms.
fn output(like: &Tensor, shape: &[usize]) -> Result<Tensor> {
    Tensor::zeros(like.device(), shape, DType::F32)
}

/// Checks of a gather (`embedding`, `gather_rows`): `(rows of the table, row width, picks)`.
fn gather_dims(
    table_what: &'static str,
    table: &Tensor,
    ids_what: &'static str,
    ids: &Tensor,
) -> Result<(usize, usize, usize)> {
    let (v, h) = rank2(table_what, table, "[rows, hidden]")?;
    let t = rank1(ids_what, ids, "[num_selected]")?;
    table.expect_dtype(table_what, DType::F32)?;
    ids.expect_dtype(ids_what, DType::I32)?;
    same_device(table_what, table, ids)?;
    Ok((v, h, t))
}

/// Rows of `table` picked by `ids` into `out`; the kernel both gathers share.
fn gather_into(table: &Tensor, ids: &Tensor, out: &mut Tensor, v: usize, h: usize) -> Result<()> {
    let t = ids.numel();
    check_out("gather output", out, &[t, h], table)?;
    match table.device() {
        Device::Cpu(_) => cpu::embedding(table, ids, v, h, t, out),
        Device::Cuda(d) => cuda::embedding(d, table, ids, v, h, t, out),
        Device::Hip(_) => {
            hip::via_host(table, ids, out, |a, b, o| cpu::embedding(a, b, v, h, t, o))
        }
        Device::Vulkan(d) => wgsl::embedding(d, table, ids, v, h, t, out),
        Device::Wgpu(d) => wgsl::embedding(d, table, ids, v, h, t, out),
    }
}

/// Rows of `table [V, H]` picked by `ids [T]` (i32): the token embedding. Returns `[T, H]`.
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (_, h, t) = gather_dims("embedding table", table, "token ids", ids)?;
    let mut out = output(table, &[t, h])?;
    embedding_into(table, ids, &mut out)?;
    Ok(out)
}

/// [`embedding`] into `out [T, H]`.
pub fn embedding_into(table: &Tensor, ids: &Tensor, out: &mut Tensor) -> Result<()> {
    let (v, h, _) = gather_dims("embedding table", table, "token ids", ids)?;
    gather_into(table, ids, out, v, h)
}

/// Rows of `x [T, H]` picked by `rows [R]` (i32): e.g. each request's last token before the
/// output head. Returns `[R, H]`.
pub fn gather_rows(x: &Tensor, rows: &Tensor) -> Result<Tensor> {
    let (_, h, r) = gather_dims("gather_rows input", x, "gather_rows indices", rows)?;
    let mut out = output(x, &[r, h])?;
    gather_rows_into(x, rows, &mut out)?;
    Ok(out)
}

/// [`gather_rows`] into `out [R, H]`.
pub fn gather_rows_into(x: &Tensor, rows: &Tensor, out: &mut Tensor) -> Result<()> {
    // The same kernel as the embedding: x plays the table.
    let (t, h, _) = gather_dims("gather_rows input", x, "gather_rows indices", rows)?;
    gather_into(x, rows, out, t, h)
}

fn rms_norm_dims(x: &Tensor, weight: &Tensor, eps: f32) -> Result<(usize, usize)> {
    let (t, h) = rank2("rms_norm input", x, "[num_tokens, hidden]")?;
    x.expect_dtype("rms_norm input", DType::F32)?;
    fused_linear::norm_check(x, weight, eps, h)?;
    Ok((t, h))
}

/// RMSNorm over the last axis: `y = x / sqrt(mean(x²) + eps) · weight`, `x [T, H]`,
/// `weight [H]`. Returns `[T, H]`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let (t, h) = rms_norm_dims(x, weight, eps)?;
    let mut out = output(x, &[t, h])?;
    rms_norm_into(x, weight, eps, &mut out)?;
    Ok(out)
}

/// [`rms_norm`] into `out [T, H]`.
pub fn rms_norm_into(x: &Tensor, weight: &Tensor, eps: f32, out: &mut Tensor) -> Result<()> {
    let (t, h) = rms_norm_dims(x, weight, eps)?;
    check_out("rms_norm output", out, &[t, h], x)?;
    match x.device() {
        Device::Cpu(_) => cpu::rms_norm(x, weight, eps, t, h, out),
        Device::Cuda(d) => cuda::rms_norm(d, x, weight, eps, t, h, out),
        Device::Hip(_) => {
            hip::via_host(x, weight, out, |a, b, o| cpu::rms_norm(a, b, eps, t, h, o))
        }
        Device::Vulkan(d) => wgsl::rms_norm(d, x, weight, eps, t, h, out),
        Device::Wgpu(d) => wgsl::rms_norm(d, x, weight, eps, t, h, out),
    }
}

/// Checks of a linear layer's input `[T, K]` and weight `[N, K]`: `(T, K, N)`.
fn linear_dims(x: &Tensor, weight: &Tensor) -> Result<(usize, usize, usize)> {
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
    let wd = weight.dtype();
    if !matches!(wd, DType::F32 | DType::F16 | DType::Bf16) {
        return Err(Error::DType {
            what: "linear weight",
            got: wd.to_string(),
            expected: "f32, f16 or bf16".into(),
        });
    }
    same_device("linear", x, weight)?;
    Ok((t, k, n))
}

/// A linear layer without bias: `y = x·Wᵀ`, `x [T, K]`, `weight [N, K]`. Returns `[T, N]`
/// (zeros when K = 0).
pub fn linear(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let (t, k, n) = linear_dims(x, weight)?;
    let mut out = output(x, &[t, n])?;
    if k > 0 {
        linear_into(x, weight, &mut out)?;
    }
    Ok(out)
}

/// [`linear`] into `out [T, N]`. K = 0 is an error here (there is no product to write; the
/// allocating form returns zeros).
pub fn linear_into(x: &Tensor, weight: &Tensor, out: &mut Tensor) -> Result<()> {
    let (t, k, n) = linear_dims(x, weight)?;
    check_out("linear output", out, &[t, n], x)?;
    if k == 0 {
        return Err(Error::config(
            "linear_into with in_features 0: the output would be all zeros; use linear",
        ));
    }
    linear_dispatch(x, weight, out, t, k, n, false)
}

/// `y += x·Wᵀ`: a linear layer whose result adds into `y [T, N]` (the output projections of
/// a residual block, without a separate add).
pub fn linear_accumulate(x: &Tensor, weight: &Tensor, y: &mut Tensor) -> Result<()> {
    let (t, k, n) = linear_dims(x, weight)?;
    check_out("linear_accumulate target", y, &[t, n], x)?;
    if k == 0 {
        return Ok(());
    }
    linear_dispatch(x, weight, y, t, k, n, true)
}

fn linear_dispatch(
    x: &Tensor,
    weight: &Tensor,
    out: &mut Tensor,
    t: usize,
    k: usize,
    n: usize,
    acc: bool,
) -> Result<()> {
    let args = fused_linear::FusedLinear {
        x,
        w: weight,
        norm: None,
        t,
        k,
        n,
    };
    let out = if acc {
        LinearOutput::Accumulate(out)
    } else {
        LinearOutput::Store(out)
    };
    fused_linear::dispatch(&args, out)
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

fn silu_mul_check(gate: &Tensor, up: &Tensor) -> Result<()> {
    rank2("silu_mul gate", gate, "[num_tokens, intermediate]")?;
    up.expect_shape("silu_mul up", gate.shape())?;
    gate.expect_dtype("silu_mul gate", DType::F32)?;
    up.expect_dtype("silu_mul up", DType::F32)?;
    same_device("silu_mul", gate, up)
}

/// SwiGLU's activation: `silu(gate) · up`, elementwise on two `[T, I]` tensors.
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    silu_mul_check(gate, up)?;
    let mut out = output(gate, gate.shape())?;
    silu_mul_into(gate, up, &mut out)?;
    Ok(out)
}

/// [`silu_mul`] into `out [T, I]`.
pub fn silu_mul_into(gate: &Tensor, up: &Tensor, out: &mut Tensor) -> Result<()> {
    silu_mul_check(gate, up)?;
    check_out("silu_mul output", out, gate.shape(), gate)?;
    match gate.device() {
        Device::Cpu(_) => cpu::silu_mul(gate, up, out),
        Device::Cuda(d) => cuda::silu_mul(d, gate, up, out),
        Device::Hip(_) => hip::via_host(gate, up, out, cpu::silu_mul),
        Device::Vulkan(d) => wgsl::silu_mul(d, gate, up, out),
        Device::Wgpu(d) => wgsl::silu_mul(d, gate, up, out),
    }
}

/// SwiGLU over a fused gate/up projection: `out[t, i] = silu(gate_up[t, i]) · gate_up[t, I + i]`,
/// `gate_up [T, 2I]` (the gate and up projections as one linear layer whose weight stacks
/// the gate's rows on the up's) → `out [T, I]`. The same numbers as [`silu_mul`] of the
/// halves.
pub fn swiglu_into(gate_up: &Tensor, out: &mut Tensor) -> Result<()> {
    let (t, w) = rank2("swiglu input", gate_up, "[num_tokens, 2 * intermediate]")?;
    if w % 2 != 0 {
        return Err(Error::shape(
            "swiglu input",
            gate_up.shape(),
            "an even width (gate and up halves)",
        ));
    }
    gate_up.expect_dtype("swiglu input", DType::F32)?;
    let i = w / 2;
    check_out("swiglu output", out, &[t, i], gate_up)?;
    match gate_up.device() {
        Device::Cpu(_) => cpu::swiglu(gate_up, out, i),
        Device::Cuda(d) => cuda::swiglu(d, gate_up, out, t, i),
        Device::Hip(_) => {
            let mut host_out = hip::host(out)?;
            cpu::swiglu(&hip::host(gate_up)?, &mut host_out, i)?;
            *out = host_out.to_device(gate_up.device())?;
            Ok(())
        }
        Device::Vulkan(d) => wgsl::swiglu(d, gate_up, out, t, i),
        Device::Wgpu(d) => wgsl::swiglu(d, gate_up, out, t, i),
    }
}

/// Splits a fused Q/K/V projection and applies RoPE: `qkv [T, (H + 2·Hk)·d]` (each token's
/// H query heads, then Hk key heads, then Hk value heads: the output of one linear layer
/// whose weight stacks W_q, W_k, W_v) into `q [T, H, d]` and `k [T, Hk, d]`, rotated by the
/// angles of `positions [T]` exactly as [`rope`] rotates them, and `v [T, Hk, d]`, copied.
pub fn rope_split_qkv_into(
    qkv: &Tensor,
    positions: &Tensor,
    rope: Rope,
    q: &mut Tensor,
    k: &mut Tensor,
    v: &mut Tensor,
) -> Result<()> {
    let (t, (h, hk, d)) = fused_linear::rope_split_dims(qkv, positions, rope, q, k, v)?;
    qkv.expect_shape("rope_split_qkv input", &[t, (h + 2 * hk) * d])?;
    qkv.expect_dtype("rope_split_qkv input", DType::F32)?;
    let heads = (h, hk, d);
    match qkv.device() {
        Device::Cpu(_) => cpu::rope_split(qkv, positions, rope, heads, t, q, k, v),
        Device::Cuda(dev) => cuda::rope_split(dev, qkv, positions, rope, heads, t, q, k, v),
        Device::Hip(_) => {
            let cpu = Device::cpu();
            let (mut hq, mut hkt, mut hv) = (
                Tensor::zeros(&cpu, q.shape(), DType::F32)?,
                Tensor::zeros(&cpu, k.shape(), DType::F32)?,
                Tensor::zeros(&cpu, v.shape(), DType::F32)?,
            );
            let (hqkv, hp) = (hip::host(qkv)?, hip::host(positions)?);
            cpu::rope_split(&hqkv, &hp, rope, heads, t, &mut hq, &mut hkt, &mut hv)?;
            *q = hq.to_device(qkv.device())?;
            *k = hkt.to_device(qkv.device())?;
            *v = hv.to_device(qkv.device())?;
            Ok(())
        }
        Device::Vulkan(dev) => wgsl::rope_split(dev, qkv, positions, rope, heads, t, q, k, v),
        Device::Wgpu(dev) => wgsl::rope_split(dev, qkv, positions, rope, heads, t, q, k, v),
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

fn argmax_dims(logits: &Tensor) -> Result<(usize, usize)> {
    logits_dims("argmax input", logits)
}

/// `[R, V]` of a logits tensor (f32, rows of 1..=i32::MAX elements); `what` names it.
fn logits_dims(what: &'static str, logits: &Tensor) -> Result<(usize, usize)> {
    let (r, v) = rank2(what, logits, "[num_rows, vocab]")?;
    logits.expect_dtype(what, DType::F32)?;
    if v == 0 || v > i32::MAX as usize {
        return Err(Error::shape(
            what,
            logits.shape(),
            "rows of 1..=i32::MAX elements",
        ));
    }
    Ok((r, v))
}

/// Greedy sampling on the device: the index of each row's largest element, `logits [R, V]`
/// → `[R]` i32. The lowest index wins among equal maxima, NaN never wins, and a row with no
/// element above −∞ gives 0: the host sampler's rule (`runner::argmax`), so host and device
/// agree on every input.
pub fn argmax(logits: &Tensor) -> Result<Tensor> {
    let (r, _) = argmax_dims(logits)?;
    let mut out = Tensor::zeros(logits.device(), &[r], DType::I32)?;
    argmax_into(logits, &mut out)?;
    Ok(out)
}

/// [`argmax`] into `out [R]` (i32).
pub fn argmax_into(logits: &Tensor, out: &mut Tensor) -> Result<()> {
    let (r, v) = argmax_dims(logits)?;
    out.expect_shape("argmax output", &[r])?;
    out.expect_dtype("argmax output", DType::I32)?;
    same_device("argmax", logits, out)?;
    match logits.device() {
        Device::Cpu(_) => cpu::argmax(logits, r, v, out),
        Device::Cuda(d) => cuda::argmax(d, logits, r, v, out),
        Device::Hip(_) => {
            let mut host_out = Tensor::zeros(&Device::cpu(), &[r], DType::I32)?;
            cpu::argmax(&hip::host(logits)?, r, v, &mut host_out)?;
            *out = host_out.to_device(logits.device())?;
            Ok(())
        }
        Device::Vulkan(d) => wgsl::tokens(d, logits, None, (r, v), out),
        Device::Wgpu(d) => wgsl::tokens(d, logits, None, (r, v), out),
    }
}

/// One row's sampling parameters for [`sample`]: a request's temperature and top-p with the
/// uniform draw its random stream gives this step. On the device a row is four f32 words
/// `(temperature, top_p, uniform, 0)` ([`SamplingRow::words`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingRow {
    /// Softmax temperature; not above 0 (or NaN) means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 or more (or NaN) keeps every token, 0 or less keeps only
    /// the largest logits.
    pub top_p: f32,
    /// The draw, in [0, 1); values outside are clamped to it, NaN counts as 0.
    pub uniform: f32,
}

impl SamplingRow {
    /// A greedy row (no draw).
    pub const GREEDY: SamplingRow = SamplingRow {
        temperature: 0.0,
        top_p: 1.0,
        uniform: 0.0,
    };

    /// The rows as the `[R, 4]` f32 words [`sample`] reads.
    pub fn words(rows: &[SamplingRow]) -> Vec<f32> {
        rows.iter()
            .flat_map(|r| [r.temperature, r.top_p, r.uniform, 0.0])
            .collect()
    }

    /// The rows as an `[R, 4]` f32 tensor on `device`.
    pub fn tensor(device: &Device, rows: &[SamplingRow]) -> Result<Tensor> {
        Tensor::from_f32(device, &Self::words(rows), &[rows.len(), 4], DType::F32)
    }
}

/// Temperature / top-p sampling on the device: one token per row of `logits [R, V]` (f32),
/// drawn with that row of `rows [R, 4]` (f32, [`SamplingRow::words`]), → `[R]` i32. The step
/// downloads token ids, not logits.
///
/// The rule, the same on every device (`compute::cpu::sample_row` states it exactly, in
/// f64): greedy ([`argmax`]'s rule) when the temperature is not above 0 or the row has no
/// finite maximum; otherwise `p = exp((x − max) / T)`, the nucleus keeps every `p` at or
/// above the largest threshold whose kept mass reaches `top_p · Σp` (ties at the threshold
/// all kept), and the token is the first kept index, in index order, whose running kept mass
/// exceeds `uniform · (kept mass)`. Devices sum in f32, so a draw within rounding of a
/// boundary between two tokens (or of the nucleus threshold) may fall on either side;
/// anywhere else every device picks the reference's token.
pub fn sample(logits: &Tensor, rows: &Tensor) -> Result<Tensor> {
    let (r, _) = logits_dims("sample input", logits)?;
    let mut out = Tensor::zeros(logits.device(), &[r], DType::I32)?;
    sample_into(logits, rows, &mut out)?;
    Ok(out)
}

/// [`sample`] into `out [R]` (i32).
pub fn sample_into(logits: &Tensor, rows: &Tensor, out: &mut Tensor) -> Result<()> {
    let (r, v) = logits_dims("sample input", logits)?;
    rows.expect_shape("sampling rows", &[r, 4])?;
    rows.expect_dtype("sampling rows", DType::F32)?;
    out.expect_shape("sample output", &[r])?;
    out.expect_dtype("sample output", DType::I32)?;
    same_device("sample", logits, out)?;
    same_device("sample", logits, rows)?;
    match logits.device() {
        Device::Cpu(_) => cpu::sample(logits, &sampling_rows(rows)?, v, out),
        Device::Cuda(d) => cuda::sample(d, logits, rows, r, v, out),
        Device::Hip(_) => {
            let mut host_out = Tensor::zeros(&Device::cpu(), &[r], DType::I32)?;
            let host_rows = sampling_rows(&hip::host(rows)?)?;
            cpu::sample(&hip::host(logits)?, &host_rows, v, &mut host_out)?;
            *out = host_out.to_device(logits.device())?;
            Ok(())
        }
        Device::Vulkan(d) => wgsl::tokens(d, logits, Some(rows), (r, v), out),
        Device::Wgpu(d) => wgsl::tokens(d, logits, Some(rows), (r, v), out),
    }
}

/// A host `[R, 4]` rows tensor as [`SamplingRow`]s.
fn sampling_rows(rows: &Tensor) -> Result<Vec<SamplingRow>> {
    Ok(rows
        .to_f32_vec()?
        .chunks_exact(4)
        .map(|w| SamplingRow {
            temperature: w[0],
            top_p: w[1],
            uniform: w[2],
        })
        .collect())
}
