//! The CUDA impl: the forward driver's kernels (`crate::forward`) queued on the device's
//! stream — `reshape_and_cache`, the paged-attention kernels over the planner's work lists,
//! `combine_splits` for the CUDA-core kernel's split tokens (the tensor-core decode kernel
//! merges its own splits) and `merge_attn_states` for cascade. A full pass over the cache
//! goes by query length ([`CudaKernel`]): decodes to the tensor-core decode kernel when the
//! layer allows it (`paged_decode.cu`), long queries to the tensor-core prefill kernel, the
//! rest to the CUDA-core kernel. Nothing waits for the GPU; the caller synchronises (a
//! download does).

use std::sync::OnceLock;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::LaunchConfig;

use crate::attention::{AttentionImpl, AttentionLayer, AttentionParams};
use crate::backend::KvLayout;
use crate::device::{CudaDevice, CudaStorage, Device, Storage, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::forward::{self, AttendJob, Band, ForwardIo, ForwardKernels, Keys, PassSpec, Target};
use crate::kv_cache::KvCache;
use crate::metadata::AttentionMetadata;

use super::kernels;
use super::metadata_builder::{CudaAttentionMetadata, CudaPlan};
use super::tuning::CudaTuning;
use crate::kernels::cuda::{
    attention_function_name, attention_smem_bytes, attention_variant, code, decode_function_name,
    decode_smem_bytes, decode_variant, mma_function_name, mma_smem_bytes, mma_variant, AttnParams,
    MergeParams, MmaShape, ReshapeParams, ATTN_THREADS, DECODE_ROWS_PER_ITEM, DECODE_THREADS,
    MERGE_STATES, PAGED_ATTENTION, PAGED_ATTENTION_MMA, PAGED_DECODE, RESHAPE_AND_CACHE,
    ROWS_PER_ITEM,
};
use crate::plan::{Pass, PlanKey, SplitRule};

/// Requests with at least this many query tokens go to the tensor-core kernel when it is on.
pub const MMA_MIN_QUERY_LEN: usize = 16;

/// The tensor-core prefill kernel's CTA shape for small prefill batches: 64 rows on 4 warps
/// (one m16 tile per warp; about 185 registers).
pub const MMA_SHAPE_SMALL: MmaShape = MmaShape { rows: 64, warps: 4 };

/// The tensor-core prefill kernel's CTA shape for large prefill batches: 128 rows on 4 warps
/// (two m16 tiles per warp share every K/V fragment, which halves the shared-memory traffic
/// per FLOP; 255 registers, 32-key softmax steps).
pub const MMA_SHAPE_LARGE: MmaShape = MmaShape {
    rows: 128,
    warps: 4,
};

/// [`MMA_SHAPE_LARGE`] is used when its plan has at least this many CTAs per SM (two full
/// waves at its two resident CTAs per SM); below that, half as many rows per CTA balance the
/// causal tiles' unequal lengths better (a 1k-token prefill, 256 large CTAs on a 132-SM GPU,
/// runs faster on 64 rows; from 4k tokens 128 rows win; benches/RESULTS.md).
pub const MMA_LARGE_MIN_CTAS_PER_SM: usize = 4;

/// The tensor-core prefill kernel's CTA shape for the requests of `query_start_loc` with at
/// least `min_q` query tokens: the forced one, else [`MMA_SHAPE_LARGE`] when its plan would
/// have [`MMA_LARGE_MIN_CTAS_PER_SM`] CTAs per SM, else [`MMA_SHAPE_SMALL`]. Host arithmetic
/// only (the same count [`plan_work`](crate::plan::plan_work) makes).
pub fn mma_shape_for(
    query_start_loc: &[i32],
    min_q: usize,
    group: usize,
    num_kv_heads: usize,
    sm_count: usize,
) -> MmaShape {
    if let Some(s) = CudaTuning::get().mma_shape {
        return s;
    }
    let g = group.max(1);
    let hc = g.min(MMA_SHAPE_LARGE.rows);
    let tq = (MMA_SHAPE_LARGE.rows / hc).max(1);
    let per_tile = num_kv_heads * g.div_ceil(hc);
    let ctas: usize = query_start_loc
        .windows(2)
        .map(|w| (w[1] - w[0]).max(0) as usize)
        .filter(|&q| q >= min_q)
        .map(|q| q.div_ceil(tq) * per_tile)
        .sum();
    if ctas >= MMA_LARGE_MIN_CTAS_PER_SM * sm_count.max(1) {
        MMA_SHAPE_LARGE
    } else {
        MMA_SHAPE_SMALL
    }
}

/// The CUDA attention impl of one layer.
#[derive(Debug)]
pub struct CudaAttentionImpl {
    params: AttentionParams,
    device: CudaDevice,
    alibi: Option<CudaStorage>,
    sinks: Option<CudaStorage>,
    /// Decode CTAs the GPU runs at once (SMs x CTAs per SM), measured on first use, for a
    /// 16-bit cache [0] and an fp8 cache [1] (their shared memory, hence occupancy, differ).
    decode_slots: [OnceLock<usize>; 2],
}

fn not_here(what: &str) -> Error {
    Error::Device {
        backend: "CUDA".into(),
        message: format!(
            "{what} is not on this backend's CUDA device; create it on the backend's device \
             (backend.device()) or move it with to_device"
        ),
    }
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds the kernels' i32 range")))
}

/// The raw device address of `t`, which must live on `device`.
pub(crate) fn tensor_ptr(device: &CudaDevice, t: &Tensor, what: &str) -> Result<u64> {
    match (t.device(), t.storage()) {
        (Device::Cuda(d), Storage::Cuda(s)) if d == device => Ok(s.device_ptr()),
        _ => Err(not_here(what)),
    }
}

impl CudaAttentionImpl {
    /// Builds the impl on `device` (parameters already validated by the descriptor); uploads
    /// the ALiBi slopes and sinks once.
    pub fn new(params: AttentionParams, device: CudaDevice) -> Result<Self> {
        if attention_function_name(params.head_size).is_none() {
            return Err(Error::config(format!(
                "the CUDA kernels support head sizes up to 256, got {}",
                params.head_size
            )));
        }
        let alibi = match &params.alibi_slopes {
            Some(a) => Some(device.upload_pod(a)?),
            None => None,
        };
        let sinks = match &params.sinks {
            Some(s) => Some(device.upload_pod(s)?),
            None => None,
        };
        Ok(CudaAttentionImpl {
            params,
            device,
            alibi,
            sinks,
            decode_slots: [OnceLock::new(), OnceLock::new()],
        })
    }

    fn scales(&self, layer: &AttentionLayer) -> (f32, f32) {
        if self.params.kv_cache_dtype.is_fp8() {
            (layer.k_scale, layer.v_scale)
        } else {
            (1.0, 1.0)
        }
    }

    /// The tensor-core kernel for this layer and batch, when enabled and applicable: f16 /
    /// bf16 activations with a cache of the same dtype, a supported head size, sm_80+.
    fn mma_kernel(&self, dtype: DType, cache_dtype: DType) -> Option<&'static str> {
        if !CudaTuning::get().mma
            || dtype != cache_dtype
            || self.device.compute_capability() < (8, 0)
        {
            return None;
        }
        mma_function_name(dtype, self.params.head_size)
    }

    /// The decode kernel for this layer, when enabled and applicable: f16 / bf16 activations
    /// with a cache of the same dtype or an fp8 cache (converted to 16 bits in shared memory,
    /// its scales folded into the scores and the output), head size 64, 96 or 128, sm_80+.
    fn decode_kernel(&self, dtype: DType, cache_dtype: DType) -> Option<&'static str> {
        let cache_ok = cache_dtype == dtype || cache_dtype.is_fp8();
        if !CudaTuning::get().decode || !cache_ok || self.device.compute_capability() < (8, 0) {
            return None;
        }
        decode_function_name(dtype, cache_dtype, self.params.head_size)
    }

    /// The decode kernel `name` (variant of `dtype`), its shared-memory limit raised and its
    /// shared-memory carve-out preferred, with the number of its CTAs the GPU runs at once.
    fn decode_function(
        &self,
        name: &str,
        dtype: DType,
        cache_dtype: DType,
    ) -> Result<(cudarc::driver::CudaFunction, usize)> {
        let d = self.params.head_size;
        let [a, b, c] = decode_variant(dtype, cache_dtype, d);
        let opts = [a.as_str(), b.as_str(), c.as_str()];
        let f = kernels::function(&self.device, &PAGED_DECODE, &opts, name)?;
        let smem = decode_smem_bytes(d, cache_dtype);
        let slots = *self.decode_slots[usize::from(cache_dtype.is_fp8())].get_or_init(|| {
            let sms = self.device.sm_count().max(1) as usize;
            let _ = f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            );
            let _ = f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            );
            let per_sm = f
                .occupancy_max_active_blocks_per_multiprocessor(DECODE_THREADS, smem as usize, None)
                .unwrap_or(1)
                .max(1) as usize;
            sms * per_sm
        });
        Ok((f, slots))
    }

    /// Queues the decode kernel over `plan` (items of one token and up to 16 heads; split
    /// tokens are merged inside it by their last CTA). Partials live in the metadata's
    /// scratch buffer, the arrival counters in its split counters.
    fn launch_decode(
        &self,
        plan: &CudaPlan,
        base: &AttnParams,
        md: &CudaAttentionMetadata,
        f: &cudarc::driver::CudaFunction,
        cache_dtype: DType,
    ) -> Result<()> {
        let items = match &plan.items_dev {
            Some(i) if !plan.work.items.is_empty() => i,
            _ => return Ok(()),
        };
        let p = &self.params;
        let (h, d) = (p.num_heads, p.head_size);
        let mut params = *base;
        params.items = items.device_ptr();
        let n_split = plan.work.n_part_tokens;
        if n_split > 0 {
            let planes = plan.work.max_splits * n_split * h;
            // part_out (16-byte aligned: planes * d * 4 is a multiple of 256 for d % 64 == 0,
            // of 16 otherwise), then part_lse.
            let out_bytes = (planes * d * 4).div_ceil(256) * 256;
            let ptr = md.scratch(out_bytes + planes * 4)?;
            params.part_out = ptr;
            params.part_lse = ptr + out_bytes as u64;
            params.n_part_tokens = i32_of("split tokens", n_split)?;
            params.split_counters = md.split_counters(n_split * h)?;
        }
        let cfg = LaunchConfig {
            grid_dim: (plan.work.items.len() as u32, 1, 1),
            block_dim: (DECODE_THREADS, 1, 1),
            shared_mem_bytes: decode_smem_bytes(d, cache_dtype),
        };
        kernels::launch(&self.device, f, cfg, &params, None)
    }

    /// Queues the tensor-core kernel over `plan` (items of up to 64 rows, never split).
    fn launch_mma(
        &self,
        plan: &CudaPlan,
        base: &AttnParams,
        name: &str,
        dtype: DType,
        shape: MmaShape,
    ) -> Result<()> {
        let items = match &plan.items_dev {
            Some(i) if !plan.work.items.is_empty() => i,
            _ => return Ok(()),
        };
        let mut params = *base;
        params.items = items.device_ptr();
        // Soft cap and ALiBi live in a separate build (the plain one is the hot path).
        let plain = self.params.soft_cap().is_none() && self.params.alibi_slopes.is_none();
        let variant = mma_variant(dtype, self.params.head_size, shape, plain);
        let mut opts: Vec<&str> = variant.iter().map(String::as_str).collect();
        opts.extend(CudaTuning::get().mma_subk_define());
        let f = kernels::function(&self.device, &PAGED_ATTENTION_MMA, &opts, name)?;
        let cfg = LaunchConfig {
            grid_dim: (plan.work.items.len() as u32, 1, 1),
            block_dim: (shape.threads(), 1, 1),
            shared_mem_bytes: mma_smem_bytes(self.params.head_size, shape.rows),
        };
        kernels::launch(&self.device, &f, cfg, &params, None)
    }

    /// Queues the attention kernel over `plan` (and the split combine, when the plan splits).
    /// Partials live in the metadata's scratch buffer (reused, and persistent for graph
    /// metadata, so a captured launch never allocates).
    fn launch_attention(
        &self,
        plan: &CudaPlan,
        base: &AttnParams,
        md: &CudaAttentionMetadata,
    ) -> Result<()> {
        let items = match &plan.items_dev {
            Some(i) if !plan.work.items.is_empty() => i,
            _ => return Ok(()),
        };
        let p = &self.params;
        let (h, d) = (p.num_heads, p.head_size);
        let mut params = *base;
        params.items = items.device_ptr();
        let n_split = plan.work.n_part_tokens;
        if n_split > 0 {
            let planes = plan.work.max_splits * n_split * h;
            // part_out (256-byte aligned), then part_lse.
            let out_bytes = (planes * d * 4).div_ceil(256) * 256;
            let ptr = md.scratch(out_bytes + planes * 4)?;
            params.part_out = ptr;
            params.part_lse = ptr + out_bytes as u64;
            params.n_part_tokens = i32_of("split tokens", n_split)?;
        }
        let name = attention_function_name(d)
            .ok_or_else(|| Error::config(format!("no CUDA attention kernel for head size {d}")))?;
        let variant = attention_variant(d);
        let f = kernels::function(&self.device, &PAGED_ATTENTION, &[&variant], name)?;
        let cfg = LaunchConfig {
            grid_dim: (plan.work.items.len() as u32, 1, 1),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: attention_smem_bytes(d),
        };
        kernels::launch(&self.device, &f, cfg, &params, None)?;
        if let Some(list) = &plan.groups_dev {
            let f = kernels::function(
                &self.device,
                &PAGED_ATTENTION,
                &[&variant],
                "combine_splits",
            )?;
            let cfg = LaunchConfig {
                grid_dim: (plan.work.groups.len() as u32, h as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            kernels::launch(&self.device, &f, cfg, &params, Some(list.device_ptr()))?;
        }
        Ok(())
    }
}

/// Queues `merge_attn_states` on `device` over raw buffers whose shapes the caller checked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_merge(
    device: &CudaDevice,
    o_p: u64,
    lse_p: u64,
    o_s: u64,
    lse_s: u64,
    out: u64,
    out_lse: u64,
    in_dtype: DType,
    out_dtype: DType,
    (t, h, d): (usize, usize, usize),
    prefill_tokens: usize,
) -> Result<()> {
    if t == 0 || h == 0 {
        return Ok(());
    }
    let params = MergeParams {
        o_p,
        o_s,
        lse_p,
        lse_s,
        out,
        out_lse,
        in_dtype: code(in_dtype)?,
        out_dtype: code(out_dtype)?,
        num_tokens: i32_of("num_tokens", t)?,
        num_heads: i32_of("num_heads", h)?,
        head_size: i32_of("head_size", d)?,
        prefill_tokens: i32_of("prefill_tokens_with_context", prefill_tokens.min(t))?,
    };
    let (name, grid_dim, threads) = if d % 8 == 0 {
        // One thread per 8 elements of a row (merge_states.cu says why).
        let threads = (t as u64 * h as u64 * (d / 8) as u64).div_ceil(MERGE_VEC_THREADS as u64);
        let ctas = u32::try_from(threads).map_err(|_| {
            Error::config(format!("merge of {t} tokens x {h} heads: too many CTAs"))
        })?;
        ("merge_attn_states_vec", (ctas, 1, 1), MERGE_VEC_THREADS)
    } else {
        let threads = (d.div_ceil(32) * 32).clamp(32, 128) as u32;
        ("merge_attn_states", (t as u32, h as u32, 1), threads)
    };
    let cfg = LaunchConfig {
        grid_dim,
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = kernels::function(device, &MERGE_STATES, &[], name)?;
    kernels::launch(device, &f, cfg, &params, None)
}

/// Threads per CTA of `merge_attn_states_vec`.
const MERGE_VEC_THREADS: u32 = 256;

/// `merge_attn_states` on CUDA tensors (the CUDA arm of [`crate::ops::merge_attn_states`],
/// which has checked shapes and dtypes): every tensor must live on the output's GPU.
#[allow(clippy::too_many_arguments)]
pub fn merge_attn_states(
    output: &mut Tensor,
    prefix_output: &Tensor,
    prefix_lse: &Tensor,
    suffix_output: &Tensor,
    suffix_lse: &Tensor,
    output_lse: Option<&mut Tensor>,
    prefill_tokens_with_context: Option<usize>,
) -> Result<()> {
    let device = match output.device() {
        Device::Cuda(d) => d.clone(),
        _ => return Err(not_here("output")),
    };
    let s = prefix_output.shape().to_vec();
    if s.len() != 3 {
        return Err(Error::shape(
            "prefix_output",
            &s,
            "[num_tokens, num_heads, head_size]",
        ));
    }
    let (t, h, d) = (s[0], s[1], s[2]);
    let o_p = tensor_ptr(&device, prefix_output, "prefix_output")?;
    let o_s = tensor_ptr(&device, suffix_output, "suffix_output")?;
    let l_p = tensor_ptr(&device, prefix_lse, "prefix_lse")?;
    let l_s = tensor_ptr(&device, suffix_lse, "suffix_lse")?;
    let out = tensor_ptr(&device, output, "output")?;
    let out_lse = match output_lse {
        Some(l) => tensor_ptr(&device, l, "output_lse")?,
        None => 0,
    };
    let dtype = prefix_output.dtype();
    launch_merge(
        &device,
        o_p,
        l_p,
        o_s,
        l_s,
        out,
        out_lse,
        dtype,
        output.dtype(),
        (t, h, d),
        prefill_tokens_with_context.unwrap_or(t),
    )
}

/// Threads per CTA of `reshape_and_cache` (`RC_THREADS` in the kernel, its launch bound).
const RESHAPE_THREADS: u32 = 256;
/// 8-element vectors per thread a `reshape_and_cache` chunk aims for (`RC_ITEMS_PER_THREAD`).
const RESHAPE_ITEMS_PER_THREAD: usize = 8;
/// Most CTAs of one `reshape_and_cache` launch (each then loops over several chunks).
const RESHAPE_MAX_GRID: usize = 1 << 20;

/// Tokens per chunk (one CTA's work) of `reshape_and_cache` for `units` 8-element vectors per
/// token: about `RESHAPE_ITEMS_PER_THREAD` vectors per thread, 1 to 256 tokens. Mirrors
/// `rc_tokens_per_chunk`.
fn reshape_tokens_per_cta(units: usize) -> usize {
    (RESHAPE_THREADS as usize * RESHAPE_ITEMS_PER_THREAD / units.max(1)).clamp(1, 256)
}

/// The CUDA kernels a band of query lengths can go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaKernel {
    /// The tensor-core decode kernel (`paged_decode.cu`), by function name.
    Decode(&'static str),
    /// The CUDA-core kernel (`paged_attention.cu`), split-KV with its combine.
    CudaCores,
    /// The tensor-core prefill kernel (`paged_attention_mma.cu`), by function name.
    Mma(&'static str),
}

/// The cascade partials of one call (`[T][H][D]` f32 outputs, `[H][T]` LSEs: prefix, then
/// suffix), allocated by the first pass that needs them. The launches are already queued on
/// the stream; nothing else is held.
#[derive(Debug, Default)]
pub struct CudaRecording {
    partials: Option<[CudaStorage; 4]>,
}

impl CudaAttentionImpl {
    /// The partial (out, lse) device addresses of a cascade `target`, allocated on first use.
    fn partial(&self, rec: &mut CudaRecording, target: Target, n: usize) -> Result<(u64, u64)> {
        let p = &self.params;
        let parts = match rec.partials.take() {
            Some(parts) => parts,
            None => {
                let rows = n.checked_mul(p.num_heads).ok_or_else(|| {
                    Error::overflow(
                        "cascade partials",
                        format!("{n} tokens x {} heads", p.num_heads),
                    )
                })?;
                let out_bytes = rows.checked_mul(p.head_size * 4).ok_or_else(|| {
                    Error::overflow("cascade partials", format!("{rows} rows x {}", p.head_size))
                })?;
                [
                    self.device.zeros_bytes(out_bytes)?,
                    self.device.zeros_bytes(out_bytes)?,
                    self.device.zeros_bytes(rows * 4)?,
                    self.device.zeros_bytes(rows * 4)?,
                ]
            }
        };
        let [o_p, o_s, l_p, l_s] = &parts;
        let ptrs = match target {
            Target::Suffix => (o_s.device_ptr(), l_s.device_ptr()),
            _ => (o_p.device_ptr(), l_p.device_ptr()),
        };
        rec.partials = Some(parts);
        Ok(ptrs)
    }

    /// The kernels' parameters for one pass: the batch, the key source, the target.
    fn pass_params(
        &self,
        rec: &mut CudaRecording,
        md: &CudaAttentionMetadata,
        io: &ForwardIo<'_>,
        spec: &PassSpec,
    ) -> Result<AttnParams> {
        let p = &self.params;
        let common = &md.common;
        let n = io.num_tokens;
        let arrays = md.arrays();
        let (out, lse, out_dtype) = match spec.target {
            Target::Output => (
                tensor_ptr(&self.device, io.output, "output")?,
                match io.output_lse.as_deref() {
                    Some(t) => tensor_ptr(&self.device, t, "output_lse")?,
                    None => 0,
                },
                io.dtype,
            ),
            t => {
                let (o, l) = self.partial(rec, t, n)?;
                (o, l, DType::F32)
            }
        };
        let mut params = AttnParams {
            q: tensor_ptr(&self.device, io.query, "query")?,
            block_table: tensor_ptr(&self.device, &arrays.block_table, "block_table")?,
            seq_lens: tensor_ptr(&self.device, &arrays.seq_lens, "seq_lens")?,
            query_start_loc: tensor_ptr(&self.device, &arrays.query_start_loc, "query_start_loc")?,
            alibi: self.alibi.as_ref().map_or(0, |a| a.device_ptr()),
            sinks: self.sinks.as_ref().map_or(0, |s| s.device_ptr()),
            out,
            lse,
            q_dtype: code(io.dtype)?,
            out_dtype: code(out_dtype)?,
            num_heads: i32_of("num_heads", p.num_heads)?,
            num_kv_heads: i32_of("num_kv_heads", p.num_kv_heads)?,
            head_size: i32_of("head_size", p.head_size)?,
            group: i32_of("group", p.num_queries_per_kv())?,
            block_size: i32_of("block_size", common.block_size())?,
            bt_stride: i32_of("max_blocks_per_req", common.max_blocks_per_req())?,
            num_tokens: i32_of("num_tokens", n)?,
            causal: i32::from(spec.causal),
            window: match p.sliding_window {
                Some(w) => i32_of("sliding_window", w)?,
                None => 0,
            },
            use_sinks: i32::from(self.sinks.is_some() && spec.sinks),
            scale: p.scale,
            soft_cap: p.soft_cap().unwrap_or(0.0),
            k_scale: 1.0,
            v_scale: 1.0,
            ..Default::default()
        };
        match io.keys {
            Keys::Dense { key, value } => {
                params.k_dense = tensor_ptr(&self.device, key, "key")?;
                params.v_dense = tensor_ptr(&self.device, value, "value")?;
                params.dense = 1;
                params.cache_dtype = params.q_dtype;
            }
            Keys::Cache(cache) => {
                params.cache = tensor_ptr(&self.device, cache.data(), "the KV cache")?;
                params.cache_dtype = code(cache.spec().storage_dtype())?;
                params.layout_hnd = i32::from(cache.layout() == KvLayout::Hnd);
                (params.k_scale, params.v_scale) = self.scales(io.layer);
            }
        }
        Ok(params)
    }

    /// A plan key of this layer for `job` (`rows` per item, `split` along the keys).
    fn plan_key(
        &self,
        job: &AttendJob<CudaKernel>,
        dense: bool,
        rows: usize,
        split: SplitRule,
    ) -> PlanKey {
        let p = &self.params;
        PlanKey {
            pass: job.spec.pass,
            dense,
            split,
            min_q: job.min_q,
            max_q: job.max_q,
            ..PlanKey::new(
                p.num_queries_per_kv(),
                p.num_kv_heads,
                job.spec.causal,
                p.sliding_window,
                rows,
            )
        }
    }
}

impl ForwardKernels for CudaAttentionImpl {
    type Metadata = CudaAttentionMetadata;
    type Kernel = CudaKernel;
    type Recording = CudaRecording;
    const BACKEND: &'static str = "CUDA";

    fn params(&self) -> &AttentionParams {
        &self.params
    }

    fn metadata<'m>(
        &self,
        metadata: &'m dyn AttentionMetadata,
    ) -> Result<&'m CudaAttentionMetadata> {
        let md = metadata.downcast::<CudaAttentionMetadata>("CudaAttentionImpl")?;
        if md.device != self.device {
            return Err(not_here("the metadata"));
        }
        md.check_current()?;
        if self.device.is_capturing() && !md.is_graph_capturable() {
            return Err(Error::Device {
                backend: "CUDA".into(),
                message: "a forward inside a CUDA graph capture needs metadata from \
                          build_for_graph_capture (persistent buffers, fixed work lists); this \
                          metadata came from build, whose arrays and work lists are per-step \
                          allocations"
                    .into(),
            });
        }
        Ok(md)
    }

    fn check_cache(&self, cache: &KvCache, _: &CudaAttentionMetadata) -> Result<()> {
        if cache.block_size() % kernels::KEYS_PER_CHUNK != 0 {
            return Err(Error::config(format!(
                "the CUDA kernels need a block size that is a multiple of {}, got {}",
                kernels::KEYS_PER_CHUNK,
                cache.block_size()
            )));
        }
        tensor_ptr(&self.device, cache.data(), "the KV cache").map(|_| ())
    }

    fn runs_cascade(&self) -> bool {
        true
    }

    /// Without cascade and with cache keys: query length 1 on the decode kernel (when it
    /// applies), up to [`MMA_MIN_QUERY_LEN`] on CUDA cores with split-KV, longer on the
    /// tensor-core prefill kernel (when it applies). Cascade passes and dense keys run on
    /// CUDA cores, unsplit.
    fn bands(
        &self,
        _: &CudaAttentionMetadata,
        io: &ForwardIo<'_>,
        spec: &PassSpec,
    ) -> Result<Vec<Band<CudaKernel>>> {
        let band = |min_q, kernel| Band { min_q, kernel };
        let cache = match io.keys {
            Keys::Cache(c) if spec.pass == Pass::Full => c,
            _ => return Ok(vec![band(0, CudaKernel::CudaCores)]),
        };
        let cache_dtype = cache.spec().storage_dtype();
        let mut bands = Vec::with_capacity(3);
        match self.decode_kernel(io.dtype, cache_dtype) {
            Some(name) => bands.extend([
                band(0, CudaKernel::Decode(name)),
                band(2, CudaKernel::CudaCores),
            ]),
            None => bands.push(band(0, CudaKernel::CudaCores)),
        }
        if let Some(name) = self.mma_kernel(io.dtype, cache_dtype) {
            bands.push(band(MMA_MIN_QUERY_LEN, CudaKernel::Mma(name)));
        }
        Ok(bands)
    }

    fn begin(&self, _: &CudaAttentionMetadata) -> Result<CudaRecording> {
        Ok(CudaRecording::default())
    }

    fn write_cache(
        &self,
        _: &mut CudaRecording,
        md: &CudaAttentionMetadata,
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        kv_cache: &mut KvCache,
    ) -> Result<()> {
        let p = &self.params;
        let n = md.common.slot_mapping_cpu().len();
        let dtype = kv_cache.spec().dtype;
        let k = tensor_ptr(&self.device, key, "key")?;
        let v = tensor_ptr(&self.device, value, "value")?;
        let cache = tensor_ptr(&self.device, kv_cache.data(), "the KV cache")?;
        if n == 0 {
            return Ok(());
        }
        let slots = tensor_ptr(&self.device, &md.arrays().slot_mapping, "slot_mapping")?;
        let (k_scale, v_scale) = self.scales(layer);
        let params = ReshapeParams {
            key: k,
            value: v,
            cache,
            slot_mapping: slots,
            in_dtype: code(dtype)?,
            cache_dtype: code(kv_cache.spec().storage_dtype())?,
            layout_hnd: i32::from(kv_cache.layout() == KvLayout::Hnd),
            num_tokens: i32_of("num_tokens", n)?,
            num_kv_heads: i32_of("num_kv_heads", p.num_kv_heads)?,
            head_size: i32_of("head_size", p.head_size)?,
            block_size: i32_of("block_size", kv_cache.block_size())?,
            k_scale,
            v_scale,
            pad_: 0,
        };
        if p.head_size % 8 != 0 {
            // The kernel moves 8-element vectors (16-byte loads of f16 / bf16).
            return Err(Error::config(format!(
                "the CUDA cache write needs a head size that is a multiple of 8, got {}",
                p.head_size
            )));
        }
        // Offsets within one block are 32-bit in the kernel.
        i32_of(
            "block_size * num_kv_heads * head_size",
            kv_cache.block_size() * p.num_kv_heads * p.head_size,
        )?;
        let f = kernels::function(&self.device, &RESHAPE_AND_CACHE, &[], "reshape_and_cache")?;
        // One chunk of tokens per CTA (the kernel's grid-stride loop covers any remainder).
        let chunks = n.div_ceil(reshape_tokens_per_cta(p.num_kv_heads * p.head_size / 8));
        let cfg = LaunchConfig {
            grid_dim: (chunks.min(RESHAPE_MAX_GRID) as u32, 1, 1),
            block_dim: (RESHAPE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        kernels::launch(&self.device, &f, cfg, &params, None)
    }

    fn attend(
        &self,
        rec: &mut CudaRecording,
        md: &CudaAttentionMetadata,
        io: &mut ForwardIo<'_>,
        job: &AttendJob<CudaKernel>,
    ) -> Result<()> {
        let base = self.pass_params(rec, md, io, &job.spec)?;
        let dense = io.keys.is_dense();
        match job.kernel {
            CudaKernel::Decode(name) => {
                let Keys::Cache(cache) = io.keys else {
                    return Err(Error::config("the CUDA decode kernel reads the KV cache"));
                };
                let cache_dtype = cache.spec().storage_dtype();
                let (f, slots) = self.decode_function(name, io.dtype, cache_dtype)?;
                let split = SplitRule::FillWaves {
                    slots,
                    fixed: CudaTuning::get().decode_splits,
                };
                let plan = md.plan(&self.plan_key(job, false, DECODE_ROWS_PER_ITEM, split))?;
                self.launch_decode(&plan, &base, md, &f, cache_dtype)
            }
            CudaKernel::CudaCores => {
                // Split-KV only for a full pass over the cache (the cascade passes and dense
                // keys are unsplit).
                let split = if job.spec.pass == Pass::Full && !dense {
                    SplitRule::TwoPerSm {
                        sm_count: self.device.sm_count() as usize,
                    }
                } else {
                    SplitRule::Never
                };
                let plan = md.plan(&self.plan_key(job, dense, ROWS_PER_ITEM, split))?;
                self.launch_attention(&plan, &base, md)
            }
            CudaKernel::Mma(name) => {
                let p = &self.params;
                let shape = mma_shape_for(
                    md.common.query_start_loc_cpu(),
                    job.min_q,
                    p.num_queries_per_kv(),
                    p.num_kv_heads,
                    self.device.sm_count() as usize,
                );
                let plan = md.plan(&self.plan_key(job, false, shape.rows, SplitRule::Never))?;
                self.launch_mma(&plan, &base, name, io.dtype, shape)
            }
        }
    }

    fn merge(
        &self,
        rec: &mut CudaRecording,
        _: &CudaAttentionMetadata,
        io: &mut ForwardIo<'_>,
    ) -> Result<()> {
        let p = &self.params;
        let n = io.num_tokens;
        let (o_p, l_p) = self.partial(rec, Target::Prefix, n)?;
        let (o_s, l_s) = self.partial(rec, Target::Suffix, n)?;
        let out = tensor_ptr(&self.device, io.output, "output")?;
        let out_lse = match io.output_lse.as_deref() {
            Some(t) => tensor_ptr(&self.device, t, "output_lse")?,
            None => 0,
        };
        launch_merge(
            &self.device,
            o_p,
            l_p,
            o_s,
            l_s,
            out,
            out_lse,
            DType::F32,
            io.dtype,
            (n, p.num_heads, p.head_size),
            n,
        )
    }

    fn finish(&self, _: CudaRecording, _: Option<&mut ForwardIo<'_>>) -> Result<()> {
        Ok(())
    }
}

impl AttentionImpl for CudaAttentionImpl {
    fn params(&self) -> &AttentionParams {
        &self.params
    }

    fn can_return_lse_for_decode(&self) -> bool {
        true
    }

    fn do_kv_cache_update(
        &self,
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
    ) -> Result<()> {
        forward::update_kv_cache(self, layer, key, value, kv_cache, metadata)
    }

    fn forward_with_lse(
        &self,
        layer: &AttentionLayer,
        query: &Tensor,
        key: Option<&Tensor>,
        value: Option<&Tensor>,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
        output_lse: Option<&mut Tensor>,
    ) -> Result<()> {
        forward::forward(
            self, layer, query, key, value, kv_cache, metadata, output, output_lse,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cuda::MMA_SHAPES;

    #[test]
    fn cta_shape_follows_the_prefill_size() {
        // Without POLYATTN_CUDA_MMA_ROWS / _WARPS (tests run with them unset).
        if CudaTuning::get().mma_shape.is_some() {
            eprintln!("skipped: a CTA shape is forced by the environment");
            return;
        }
        // Llama-3-8B heads (32 / 8): a 128-row CTA holds 32 tokens of one KV head's 4 heads.
        let (group, kv, sms) = (4, 8, 132);
        // 1 x 1k tokens: 32 tiles x 8 heads = 256 CTAs < 4 x 132.
        assert_eq!(
            mma_shape_for(&[0, 1024], 16, group, kv, sms),
            MMA_SHAPE_SMALL
        );
        // 1 x 4k: 1024 CTAs.
        assert_eq!(
            mma_shape_for(&[0, 4096], 16, group, kv, sms),
            MMA_SHAPE_LARGE
        );
        // Requests below min_q (decodes) do not count.
        let many_decodes: Vec<i32> = (0..=4096).collect();
        assert_eq!(
            mma_shape_for(&many_decodes, 16, group, kv, sms),
            MMA_SHAPE_SMALL
        );
        // The boundary: exactly 4 CTAs per SM.
        let tokens = (4 * sms / kv * 32) as i32;
        assert_eq!(
            mma_shape_for(&[0, tokens], 16, group, kv, sms),
            MMA_SHAPE_LARGE
        );
        assert_eq!(
            mma_shape_for(&[0, tokens - 32], 16, group, kv, sms),
            MMA_SHAPE_SMALL
        );
        for shape in [MMA_SHAPE_SMALL, MMA_SHAPE_LARGE] {
            assert!(MMA_SHAPES.contains(&shape));
        }
    }
}
