//! The CUDA impl: the forward driver's kernels (`crate::forward`) queued on the device's
//! stream — `reshape_and_cache`, the paged-attention kernels over the planner's work lists,
//! `combine_splits` for the CUDA-core kernel's split tokens (the tensor-core decode kernel
//! merges its own splits) and `merge_attn_states` for cascade. A full pass over the cache
//! goes by query length ([`CudaKernel`]): decodes to the tensor-core decode kernel when the
//! layer allows it (`paged_decode.cu`; f32 layers to the CUDA-core decode kernel,
//! `paged_decode_cores.cu`), long queries to the tensor-core prefill kernel, the rest to the
//! CUDA-core kernel. Nothing waits for the GPU; the caller synchronises (a
//! download does).

use std::sync::OnceLock;

use cudarc::driver::sys::CUfunction_attribute;

use crate::attention::{AttentionLayer, AttentionParams};
use crate::backends::cuda_family::{self, cache_write, output_target, PassBatch, PassTarget};
use crate::device::{CudaDevice, CudaStorage, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::forward::{AttendJob, Band, ForwardIo, ForwardKernels, Keys, PassSpec, Target};
use crate::kernels::cuda::{MergeBuffers, MergeShape};
use crate::kv_cache::KvCache;
use crate::metadata::AttentionMetadata;

use super::kernels::{self, not_here, tensor_ptr};
use super::metadata_builder::CudaAttentionMetadata;
use super::tuning::{CudaTuning, MmaKernel};
use crate::kernels::cuda::{
    attention_function_name, decode_function_name, decode_smem_bytes, decode_variant,
    matrix_function_name, mma_function_name, wgmma_function_name, AttnParams,
    DECODE_CORES_HEAD_SIZE, DECODE_ROWS_PER_ITEM, DECODE_THREADS, MATRIX_ROWS, NVIDIA_WARP,
    PAGED_DECODE, ROWS_PER_ITEM, WGMMA_ROWS,
};
use crate::plan::{Pass, SplitRule};

/// Requests with at least this many query tokens go to the tensor-core kernel when it is on.
pub const MMA_MIN_QUERY_LEN: usize = 16;

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

impl CudaAttentionImpl {
    /// Builds the impl on `device` (parameters already validated by the descriptor); uploads
    /// the ALiBi slopes and sinks once.
    pub fn new(params: AttentionParams, device: CudaDevice) -> Result<Self> {
        if attention_function_name(params.head_size, NVIDIA_WARP).is_none() {
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

    /// The prefill kernel [`CudaTuning::mma`] picks for this layer ([`prefill_choice`]);
    /// `None` leaves the prefill band on CUDA cores.
    fn mma_kernel(&self, dtype: DType, cache_dtype: DType) -> Option<CudaKernel> {
        let cc = self.device.compute_capability();
        let d = self.params.head_size;
        prefill_choice(cc, dtype, cache_dtype, d, CudaTuning::get()).kernel
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

    /// Whether single-token decodes of this layer run on the CUDA-core decode kernel
    /// (`paged_decode_cores.cu`): f32 activations and an f32 cache at head size 64, without
    /// soft cap, ALiBi or sinks (the kernel has none of them), when the decode kernels are on
    /// ([`CudaTuning::decode`]).
    fn decode_cores_applies(&self, dtype: DType, cache_dtype: DType) -> bool {
        let p = &self.params;
        let t = CudaTuning::get();
        t.decode
            && dtype == DType::F32
            && cache_dtype == DType::F32
            && p.head_size == DECODE_CORES_HEAD_SIZE
            && p.alibi_slopes.is_none()
            && p.logits_soft_cap.is_none_or(|c| c == 0.0)
            && p.sinks.is_none()
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
}

/// The CUDA kernels a band of query lengths can go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaKernel {
    /// The tensor-core decode kernel (`paged_decode.cu`), by function name.
    Decode(&'static str),
    /// The CUDA-core decode kernel (`paged_decode_cores.cu`), split-KV with the CUDA-core
    /// kernel's combine.
    DecodeCores,
    /// The CUDA-core kernel (`paged_attention.cu`), split-KV with its combine.
    CudaCores,
    /// The tensor-core prefill kernel (`paged_attention_mma.cu`), by function name.
    Mma(&'static str),
    /// The Hopper prefill kernel (`paged_attention_wgmma_ws.cu`), by function name.
    Wgmma(&'static str),
    /// The HIP backend's matrix-core prefill with the WMMA product emulated
    /// ([`MmaKernel::AmdWmmaEmulated`]), by function name.
    AmdMatrixEmulated(&'static str),
}

/// Which kernel runs a layer's prefill band (queries of at least [`MMA_MIN_QUERY_LEN`]
/// tokens) on the CUDA backend, and the rule that picked it ([`prefill_choice`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillChoice {
    /// The tensor-core kernel, or `None` for the CUDA-core kernel.
    pub kernel: Option<CudaKernel>,
    /// Why.
    pub rule: PrefillRule,
}

/// The rules of [`prefill_choice`], in the order it applies them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillRule {
    /// The cache's dtype differs from the activations' (an fp8 cache): CUDA cores.
    CacheDtype,
    /// Compute capability below 8.0: CUDA cores.
    BelowSm80,
    /// `POLYATTN_CUDA_MMA=0`: CUDA cores.
    CudaCoresForced,
    /// No tensor-core variant for the dtype and head size: CUDA cores.
    NoTensorCoreVariant,
    /// Compute capability 9.0 with f16 / bf16 at head size 64 or 128: the Hopper kernel.
    Hopper,
    /// Compute capability 9.0 at another head size: the `mma.sync` kernel.
    HopperHeadSize,
    /// Another compute capability: the `mma.sync` kernel (the Hopper cubin is sm_90a).
    NotHopper,
    /// `POLYATTN_CUDA_MMA=1`: the `mma.sync` kernel.
    TensorCoresForced,
    /// `POLYATTN_CUDA_MMA=amd-wmma`: the HIP matrix-core kernel's emulated WMMA form.
    AmdEmulated,
}

impl std::fmt::Display for PrefillRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PrefillRule::CacheDtype => {
                "the KV cache's dtype differs from the activations' (fp8 caches): CUDA cores"
            }
            PrefillRule::BelowSm80 => "compute capability below 8.0: CUDA cores",
            PrefillRule::CudaCoresForced => "POLYATTN_CUDA_MMA=0: CUDA cores",
            PrefillRule::NoTensorCoreVariant => {
                "no tensor-core variant for this dtype and head size (f16 / bf16 at 64, 96 or \
                 128): CUDA cores"
            }
            PrefillRule::Hopper => {
                "compute capability 9.0, f16 / bf16 at head size 64 or 128: the Hopper wgmma \
                 kernel"
            }
            PrefillRule::HopperHeadSize => {
                "the Hopper kernel has head sizes 64 and 128 only: the mma.sync kernel"
            }
            PrefillRule::NotHopper => {
                "the Hopper kernel needs compute capability 9.0 (sm_90a): the mma.sync kernel"
            }
            PrefillRule::TensorCoresForced => "POLYATTN_CUDA_MMA=1: the mma.sync kernel",
            PrefillRule::AmdEmulated => {
                "POLYATTN_CUDA_MMA=amd-wmma: the HIP matrix-core kernel's emulated WMMA form"
            }
        })
    }
}

/// The prefill kernel `tuning` picks on a device of compute capability `cc` for activations
/// of `dtype`, a cache of `cache_dtype` and `head_size`, with its rule: the fallback from the
/// Hopper kernel to `mma.sync` and from there to CUDA cores, as `polyattn info` states it.
pub fn prefill_choice(
    cc: (u32, u32),
    dtype: DType,
    cache_dtype: DType,
    head_size: usize,
    tuning: &CudaTuning,
) -> PrefillChoice {
    let pick = |kernel, rule| PrefillChoice { kernel, rule };
    if dtype != cache_dtype {
        return pick(None, PrefillRule::CacheDtype);
    }
    if cc < (8, 0) {
        return pick(None, PrefillRule::BelowSm80);
    }
    let mma = mma_function_name(dtype, head_size).map(CudaKernel::Mma);
    let tensor_cores = |rule| match mma {
        Some(k) => pick(Some(k), rule),
        None => pick(None, PrefillRule::NoTensorCoreVariant),
    };
    match tuning.mma {
        MmaKernel::CudaCores => pick(None, PrefillRule::CudaCoresForced),
        MmaKernel::Auto if cc == (9, 0) => match wgmma_function_name(dtype, head_size) {
            Some(name) => pick(Some(CudaKernel::Wgmma(name)), PrefillRule::Hopper),
            None => tensor_cores(PrefillRule::HopperHeadSize),
        },
        MmaKernel::Auto => tensor_cores(PrefillRule::NotHopper),
        MmaKernel::TensorCores => tensor_cores(PrefillRule::TensorCoresForced),
        MmaKernel::AmdWmmaEmulated => match matrix_function_name(dtype, head_size) {
            Some(name) => pick(
                Some(CudaKernel::AmdMatrixEmulated(name)),
                PrefillRule::AmdEmulated,
            ),
            None => pick(None, PrefillRule::NoTensorCoreVariant),
        },
    }
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
        let ptr = |t: &Tensor, what: &str| tensor_ptr(&self.device, t, what);
        let target = match spec.target {
            Target::Output => output_target(ptr, io)?,
            t => {
                let (out, lse) = self.partial(rec, t, io.num_tokens)?;
                PassTarget {
                    out,
                    lse,
                    out_dtype: DType::F32,
                }
            }
        };
        let batch = PassBatch {
            common: &md.common,
            arrays: md.arrays(),
            alibi: self.alibi.as_ref().map_or(0, |a| a.device_ptr()),
            sinks: self.sinks.as_ref().map_or(0, |s| s.device_ptr()),
        };
        cuda_family::pass_params(ptr, &self.params, &batch, io, spec, target)
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
        if !cache.block_size().is_multiple_of(kernels::KEYS_PER_CHUNK) {
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
            None if self.decode_cores_applies(io.dtype, cache_dtype) => bands.extend([
                band(0, CudaKernel::DecodeCores),
                band(2, CudaKernel::CudaCores),
            ]),
            None => bands.push(band(0, CudaKernel::CudaCores)),
        }
        if let Some(kernel) = self.mma_kernel(io.dtype, cache_dtype) {
            bands.push(band(MMA_MIN_QUERY_LEN, kernel));
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
        let ptr = |t: &Tensor, what: &str| tensor_ptr(&self.device, t, what);
        let launch = cache_write(
            ptr,
            &self.params,
            &md.common,
            md.arrays(),
            layer,
            key,
            value,
            kv_cache,
        )?;
        let Some(launch) = launch else {
            return Ok(());
        };
        kernels::launch_reshape(&self.device, &launch)
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
                let plan =
                    md.plan(&job.plan_key(&self.params, false, DECODE_ROWS_PER_ITEM, split))?;
                kernels::launch_decode(
                    &self.device,
                    &self.params,
                    &plan,
                    &base,
                    md,
                    &f,
                    cache_dtype,
                )
            }
            CudaKernel::DecodeCores => {
                let split = SplitRule::TwoPerSm {
                    sm_count: self.device.sm_count() as usize,
                };
                let plan = md.plan(&job.plan_key(&self.params, false, ROWS_PER_ITEM, split))?;
                kernels::launch_decode_cores(&self.device, &self.params, &plan, &base, md)
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
                let plan = md.plan(&job.plan_key(&self.params, dense, ROWS_PER_ITEM, split))?;
                kernels::launch_attention(&self.device, &self.params, &plan, &base, md)
            }
            CudaKernel::Mma(name) => {
                let p = &self.params;
                let shape = kernels::mma_shape_for(
                    md.common.query_start_loc_cpu(),
                    job.min_q,
                    p.num_queries_per_kv(),
                    p.num_kv_heads,
                    self.device.sm_count() as usize,
                );
                let plan =
                    md.plan(&job.plan_key(&self.params, false, shape.rows, SplitRule::Never))?;
                kernels::launch_mma(
                    &self.device,
                    &self.params,
                    &plan,
                    &base,
                    name,
                    io.dtype,
                    shape,
                )
            }
            CudaKernel::Wgmma(name) => {
                let key = job.plan_key(&self.params, false, WGMMA_ROWS, SplitRule::Never);
                let plan = md.plan(&key)?;
                kernels::launch_wgmma(&self.device, &self.params, &plan, &base, name, io.dtype)
            }
            CudaKernel::AmdMatrixEmulated(name) => {
                let key = job.plan_key(&self.params, false, MATRIX_ROWS, SplitRule::Never);
                let plan = md.plan(&key)?;
                kernels::launch_amd_matrix(&self.device, &self.params, &plan, &base, name)
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
        let target = output_target(|t, what| tensor_ptr(&self.device, t, what), io)?;
        let buffers = MergeBuffers {
            prefix_out: o_p,
            prefix_lse: l_p,
            suffix_out: o_s,
            suffix_lse: l_s,
            out: target.out,
            out_lse: target.lse,
        };
        let shape = MergeShape {
            num_tokens: n,
            num_heads: p.num_heads,
            head_size: p.head_size,
            in_dtype: DType::F32,
            out_dtype: io.dtype,
            prefill_tokens: n,
        };
        kernels::launch_merge(&self.device, buffers, &shape)
    }

    fn finish(&self, _: CudaRecording, _: Option<&mut ForwardIo<'_>>) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(cc: (u32, u32), dtype: DType, cache: DType, d: usize, t: &CudaTuning) -> PrefillRule {
        prefill_choice(cc, dtype, cache, d, t).rule
    }

    #[test]
    fn the_prefill_kernel_falls_back_by_rule() {
        let auto = CudaTuning::default();
        let (bf, h) = (DType::Bf16, (9, 0));
        let hopper = prefill_choice(h, bf, bf, 128, &auto);
        assert_eq!(
            hopper.kernel,
            Some(CudaKernel::Wgmma("paged_attention_wgmma_ws_bf16_d128"))
        );
        assert_eq!(hopper.rule, PrefillRule::Hopper);
        assert_eq!(
            prefill_choice(h, DType::F16, DType::F16, 64, &auto).kernel,
            Some(CudaKernel::Wgmma("paged_attention_wgmma_ws_f16_d64"))
        );
        let d96 = prefill_choice(h, DType::F16, DType::F16, 96, &auto);
        assert_eq!(d96.rule, PrefillRule::HopperHeadSize);
        assert!(matches!(d96.kernel, Some(CudaKernel::Mma(_))));
        assert_eq!(rule((8, 9), bf, bf, 128, &auto), PrefillRule::NotHopper);
        assert_eq!(rule((10, 0), bf, bf, 128, &auto), PrefillRule::NotHopper);
        assert_eq!(
            rule(h, bf, DType::Fp8E4m3, 128, &auto),
            PrefillRule::CacheDtype
        );
        assert_eq!(rule((7, 5), bf, bf, 128, &auto), PrefillRule::BelowSm80);
        let f32s = prefill_choice(h, DType::F32, DType::F32, 128, &auto);
        assert_eq!(
            (f32s.kernel, f32s.rule),
            (None, PrefillRule::NoTensorCoreVariant)
        );
        assert_eq!(rule(h, bf, bf, 80, &auto), PrefillRule::NoTensorCoreVariant);
        let forced = |mma| CudaTuning { mma, ..auto };
        assert_eq!(
            rule(h, bf, bf, 128, &forced(MmaKernel::TensorCores)),
            PrefillRule::TensorCoresForced
        );
        let off = prefill_choice(h, bf, bf, 128, &forced(MmaKernel::CudaCores));
        assert_eq!((off.kernel, off.rule), (None, PrefillRule::CudaCoresForced));
        assert!(PrefillRule::HopperHeadSize
            .to_string()
            .contains("64 and 128"));
    }
}
