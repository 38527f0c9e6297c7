//! The CUDA impl: checks the arguments once on the host (shapes, dtypes, devices, cache spec),
//! then queues the kernels on the device's stream: `reshape_and_cache`, the paged-attention
//! kernel over the step's work list, `combine_splits` for its split tokens (the tensor-core
//! decode kernel merges its own splits), and for cascade
//! a prefix pass, a suffix pass and `merge_attn_states`. Without cascade a batch is cut by
//! query length: decodes (query length 1) go to the tensor-core decode kernel when the layer
//! allows it (`paged_decode.cu`), long queries to the tensor-core prefill kernel, the rest to
//! the CUDA-core kernel. Nothing waits for the GPU; the caller synchronises (a download does).

use std::sync::OnceLock;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::LaunchConfig;

use crate::attention::{AttentionImpl, AttentionLayer, AttentionParams};
use crate::backend::{AttentionType, KvLayout};
use crate::device::{CudaDevice, CudaStorage, Device, Storage, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
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

    fn check_kv_input(
        &self,
        what: &'static str,
        t: &Tensor,
        rows: usize,
        dtype: DType,
    ) -> Result<u64> {
        self.params.check_kv_input(what, t, rows, dtype)?;
        tensor_ptr(&self.device, t, what)
    }

    fn check_cache(
        &self,
        cache: &KvCache,
        dtype: DType,
        md: &CudaAttentionMetadata,
    ) -> Result<u64> {
        self.params.check_kv_cache(cache, dtype, &md.common)?;
        if cache.block_size() % kernels::KEYS_PER_CHUNK != 0 {
            return Err(Error::config(format!(
                "the CUDA kernels need a block size that is a multiple of {}, got {}",
                kernels::KEYS_PER_CHUNK,
                cache.block_size()
            )));
        }
        tensor_ptr(&self.device, cache.data(), "the KV cache")
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
        let md = self.metadata(metadata)?;
        let p = &self.params;
        let n = md.common.slot_mapping_cpu().len();
        let dtype = p.check_kv_update(key, value, n, kv_cache)?;
        let k = tensor_ptr(&self.device, key, "key")?;
        let v = tensor_ptr(&self.device, value, "value")?;
        let cache = self.check_cache(kv_cache, dtype, md)?;
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
        let p = &self.params;
        let md = self.metadata(metadata)?;
        let common = &md.common;
        let n = common.num_actual_tokens();
        let dtype = p.check_query_output(query, output, output_lse.as_deref(), n)?;
        let lse_ptr = match output_lse {
            Some(t) => tensor_ptr(&self.device, t, "output_lse")?,
            None => 0,
        };
        let encoder = p.attn_type.is_encoder();
        if p.attn_type == AttentionType::EncoderDecoder {
            return Err(Error::config(
                "the CUDA backend does not implement encoder_decoder attention",
            ));
        }
        if md.cascade.is_some()
            && (p.alibi_slopes.is_some() || p.sliding_window.is_some() || encoder)
        {
            return Err(Error::config(
                "cascade attention (common_prefix_len > 0) cannot be combined with ALiBi, a sliding \
                 window or encoder attention; build the metadata with common_prefix_len = 0",
            ));
        }
        let q_ptr = tensor_ptr(&self.device, query, "query")?;
        let out_ptr = tensor_ptr(&self.device, output, "output")?;
        let arrays = md.arrays();
        let window = match p.sliding_window {
            Some(w) => i32_of("sliding_window", w)?,
            None => 0,
        };
        let causal = common.causal() && !encoder;
        let mut base = AttnParams {
            q: q_ptr,
            block_table: tensor_ptr(&self.device, &arrays.block_table, "block_table")?,
            seq_lens: tensor_ptr(&self.device, &arrays.seq_lens, "seq_lens")?,
            query_start_loc: tensor_ptr(&self.device, &arrays.query_start_loc, "query_start_loc")?,
            alibi: self.alibi.as_ref().map_or(0, |a| a.device_ptr()),
            sinks: self.sinks.as_ref().map_or(0, |s| s.device_ptr()),
            out: out_ptr,
            lse: lse_ptr,
            q_dtype: code(dtype)?,
            out_dtype: code(dtype)?,
            num_heads: i32_of("num_heads", p.num_heads)?,
            num_kv_heads: i32_of("num_kv_heads", p.num_kv_heads)?,
            head_size: i32_of("head_size", p.head_size)?,
            group: i32_of("group", p.num_queries_per_kv())?,
            block_size: i32_of("block_size", common.block_size())?,
            bt_stride: i32_of("max_blocks_per_req", common.max_blocks_per_req())?,
            num_tokens: i32_of("num_tokens", n)?,
            causal: i32::from(causal),
            window,
            use_sinks: i32::from(self.sinks.is_some()),
            scale: p.scale,
            soft_cap: p.soft_cap().unwrap_or(0.0),
            k_scale: 1.0,
            v_scale: 1.0,
            ..Default::default()
        };
        let key_for = |pass: Pass, causal: bool, dense: bool, split: SplitRule| PlanKey {
            pass,
            dense,
            split,
            ..PlanKey::new(
                p.num_queries_per_kv(),
                p.num_kv_heads,
                causal,
                p.sliding_window,
                ROWS_PER_ITEM,
            )
        };
        let two_per_sm = SplitRule::TwoPerSm {
            sm_count: self.device.sm_count() as usize,
        };

        if encoder {
            // Encoder self-attention reads K/V straight from the inputs, never the cache.
            let (k, v) = match (key, value) {
                (Some(k), Some(v)) => (k, v),
                _ => {
                    return Err(Error::config(
                        "encoder attention needs key and value tensors",
                    ))
                }
            };
            base.k_dense = self.check_kv_input("key", k, n, dtype)?;
            base.v_dense = self.check_kv_input("value", v, n, dtype)?;
            base.dense = 1;
            base.cache_dtype = base.q_dtype;
            let plan = md.plan(&key_for(Pass::Full, false, true, SplitRule::Never))?;
            return self.launch_attention(&plan, &base, md);
        }

        if let (Some(k), Some(v)) = (key, value) {
            self.do_kv_cache_update(layer, k, v, kv_cache, metadata)?;
        } else if key.is_some() != value.is_some() {
            return Err(Error::config("key and value must be given together"));
        }
        base.cache = self.check_cache(kv_cache, dtype, md)?;
        base.cache_dtype = code(kv_cache.spec().storage_dtype())?;
        base.layout_hnd = i32::from(kv_cache.layout() == KvLayout::Hnd);
        let (k_scale, v_scale) = self.scales(layer);
        base.k_scale = k_scale;
        base.v_scale = v_scale;
        if n == 0 {
            return Ok(());
        }

        match &md.cascade {
            None => {
                // The batch's requests by query length: [1, 2) on the decode kernel (when it
                // applies), [decode_end, mma_start) on CUDA cores with split-KV, [mma_start, ∞)
                // on the tensor-core prefill kernel (when it applies). The plans partition the
                // requests.
                let cache_dtype = kv_cache.spec().storage_dtype();
                let decode = self.decode_kernel(dtype, cache_dtype);
                let mma = self.mma_kernel(dtype, cache_dtype);
                let decode_end = if decode.is_some() { 2 } else { 0 };
                let mma_start = if mma.is_some() {
                    MMA_MIN_QUERY_LEN
                } else {
                    usize::MAX
                };
                if let Some(name) = decode {
                    let (f, slots) = self.decode_function(name, dtype, cache_dtype)?;
                    let key = PlanKey {
                        max_q: decode_end,
                        rows: DECODE_ROWS_PER_ITEM,
                        split: SplitRule::FillWaves {
                            slots,
                            fixed: CudaTuning::get().decode_splits,
                        },
                        ..key_for(Pass::Full, causal, false, SplitRule::Never)
                    };
                    let plan = md.plan(&key)?;
                    self.launch_decode(&plan, &base, md, &f, cache_dtype)?;
                }
                let short = PlanKey {
                    min_q: decode_end,
                    max_q: mma_start,
                    ..key_for(Pass::Full, causal, false, two_per_sm)
                };
                let plan = md.plan(&short)?;
                self.launch_attention(&plan, &base, md)?;
                if let Some(name) = mma {
                    let shape = mma_shape_for(
                        md.common.query_start_loc_cpu(),
                        mma_start,
                        p.num_heads / p.num_kv_heads,
                        p.num_kv_heads,
                        self.device.sm_count() as usize,
                    );
                    let long = PlanKey {
                        min_q: mma_start,
                        rows: shape.rows,
                        ..key_for(Pass::Full, causal, false, SplitRule::Never)
                    };
                    let plan = md.plan(&long)?;
                    self.launch_mma(&plan, &base, name, dtype, shape)?;
                }
                Ok(())
            }
            Some(cascade) => {
                let (h, d) = (p.num_heads, p.head_size);
                let o_p = self.device.zeros_bytes(n * h * d * 4)?;
                let o_s = self.device.zeros_bytes(n * h * d * 4)?;
                let l_p = self.device.zeros_bytes(n * h * 4)?;
                let l_s = self.device.zeros_bytes(n * h * 4)?;
                // Prefix: every token against the shared blocks, no mask, with sinks.
                let mut prefix = base;
                prefix.out = o_p.device_ptr();
                prefix.lse = l_p.device_ptr();
                prefix.out_dtype = code(DType::F32)?;
                prefix.causal = 0;
                let plan = md.plan(&key_for(
                    Pass::Prefix(cascade.prefix_len),
                    false,
                    false,
                    SplitRule::Never,
                ))?;
                self.launch_attention(&plan, &prefix, md)?;
                // Suffix: each request's own keys after the prefix, causal, no sinks.
                let mut suffix = base;
                suffix.out = o_s.device_ptr();
                suffix.lse = l_s.device_ptr();
                suffix.out_dtype = code(DType::F32)?;
                suffix.use_sinks = 0;
                let plan = md.plan(&key_for(
                    Pass::Suffix(cascade.prefix_len),
                    causal,
                    false,
                    SplitRule::Never,
                ))?;
                self.launch_attention(&plan, &suffix, md)?;
                launch_merge(
                    &self.device,
                    o_p.device_ptr(),
                    l_p.device_ptr(),
                    o_s.device_ptr(),
                    l_s.device_ptr(),
                    out_ptr,
                    lse_ptr,
                    DType::F32,
                    dtype,
                    (n, h, d),
                    n,
                )
            }
        }
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
