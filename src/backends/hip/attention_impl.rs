//! The HIP impl: the forward driver's kernels (`crate::forward`) queued on the device's
//! stream — `reshape_and_cache`, then the paged-attention kernels over the planner's work
//! lists by query length ([`HipKernel`]): prefills of at least [`MATRIX_MIN_QUERY_LEN`] tokens
//! on the matrix-core kernel where the device and the layer allow it
//! (`kernels-hip/paged_attention_matrix.hip`: MFMA on CDNA, WMMA on RDNA3), everything else on
//! the CUDA-core kernel, split-KV with `combine_splits` for a full pass over the cache, as the
//! CUDA backend's CUDA-core path. Cascade batches run as one full pass. Nothing waits for the
//! GPU; the caller synchronises (a download does).

use crate::attention::{AttentionLayer, AttentionParams};
use crate::backends::cuda_family::{self, cache_write, output_target, PassBatch};
use crate::device::{HipDevice, HipStorage, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::forward::{AttendJob, Band, ForwardIo, ForwardKernels, Keys, PassSpec, Target};
use crate::kernels::cuda::{
    amd_matrix_cores, attention_function_name, matrix_function_name, AttnParams, MatrixCores,
    MATRIX_ROWS,
};
use crate::kv_cache::KvCache;
use crate::metadata::AttentionMetadata;
use crate::plan::{Pass, SplitRule};

use super::kernels::{self, not_here, tensor_ptr, ROWS_PER_ITEM};
use super::metadata_builder::HipAttentionMetadata;

/// The HIP attention impl of one layer.
#[derive(Debug)]
pub struct HipAttentionImpl {
    params: AttentionParams,
    device: HipDevice,
    alibi: Option<HipStorage>,
    sinks: Option<HipStorage>,
}

impl HipAttentionImpl {
    /// Builds the impl on `device` (parameters already validated by the descriptor); uploads
    /// the ALiBi slopes and sinks once.
    pub fn new(params: AttentionParams, device: HipDevice) -> Result<Self> {
        let wave = kernels::wave(&device)?;
        if attention_function_name(params.head_size, wave).is_none() {
            return Err(Error::config(format!(
                "the HIP kernels have no attention kernel for head size {} on wave{wave}",
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
        Ok(HipAttentionImpl {
            params,
            device,
            alibi,
            sinks,
        })
    }

    /// The kernels' parameters for one pass: the batch, the key source, the output.
    fn pass_params(
        &self,
        md: &HipAttentionMetadata,
        io: &ForwardIo<'_>,
        spec: &PassSpec,
    ) -> Result<AttnParams> {
        if spec.target != Target::Output {
            // runs_cascade is false: the driver never asks for a cascade partial.
            return Err(Error::config(
                "the HIP backend runs cascade batches as one full pass; a partial target was \
                 requested",
            ));
        }
        let ptr = |t: &Tensor, what: &str| tensor_ptr(&self.device, t, what);
        let batch = PassBatch {
            common: &md.common,
            arrays: md.arrays(),
            alibi: self.alibi.as_ref().map_or(0, |a| a.device_ptr()),
            sinks: self.sinks.as_ref().map_or(0, |s| s.device_ptr()),
        };
        let target = output_target(ptr, io)?;
        cuda_family::pass_params(ptr, &self.params, &batch, io, spec, target)
    }
}

/// Requests with at least this many query tokens go to the matrix-core kernel where it
/// applies (as the CUDA backend's tensor-core prefill).
pub const MATRIX_MIN_QUERY_LEN: usize = 16;

/// The HIP kernels a band of query lengths can go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HipKernel {
    /// The CUDA-core kernel (`paged_attention.cu`), split-KV with its combine.
    CudaCores,
    /// The matrix-core prefill (`paged_attention_matrix.hip`) of the device's kind, by
    /// function name.
    Matrix(MatrixCores, &'static str),
}

impl HipAttentionImpl {
    /// The matrix-core prefill for this layer and batch, when the device has matrix cores
    /// and the layer fits the kernel: f16 / bf16 activations with a cache of the same dtype,
    /// head size 64, 96 or 128.
    fn matrix_kernel(&self, dtype: DType, cache_dtype: DType) -> Option<HipKernel> {
        if dtype != cache_dtype {
            return None;
        }
        let kind = amd_matrix_cores(self.device.arch())?;
        let name = matrix_function_name(dtype, self.params.head_size)?;
        Some(HipKernel::Matrix(kind, name))
    }
}

impl ForwardKernels for HipAttentionImpl {
    type Metadata = HipAttentionMetadata;
    type Kernel = HipKernel;
    type Recording = ();
    const BACKEND: &'static str = "HIP";

    fn params(&self) -> &AttentionParams {
        &self.params
    }

    fn metadata<'m>(
        &self,
        metadata: &'m dyn AttentionMetadata,
    ) -> Result<&'m HipAttentionMetadata> {
        let md = metadata.downcast::<HipAttentionMetadata>("HipAttentionImpl")?;
        if md.device != self.device {
            return Err(not_here("the metadata"));
        }
        Ok(md)
    }

    fn check_cache(&self, cache: &KvCache, _: &HipAttentionMetadata) -> Result<()> {
        if !cache.block_size().is_multiple_of(kernels::KEYS_PER_CHUNK) {
            return Err(Error::config(format!(
                "the HIP kernels need a block size that is a multiple of {}, got {}",
                kernels::KEYS_PER_CHUNK,
                cache.block_size()
            )));
        }
        tensor_ptr(&self.device, cache.data(), "the KV cache").map(|_| ())
    }

    /// False: a cascade batch is one full pass over the cache (the same result).
    fn runs_cascade(&self) -> bool {
        false
    }

    /// The CUDA-core kernel from query length 0; with cache keys in a full pass, queries of
    /// at least [`MATRIX_MIN_QUERY_LEN`] tokens on the matrix-core kernel where it applies.
    fn bands(
        &self,
        _: &HipAttentionMetadata,
        io: &ForwardIo<'_>,
        spec: &PassSpec,
    ) -> Result<Vec<Band<HipKernel>>> {
        let mut bands = vec![Band {
            min_q: 0,
            kernel: HipKernel::CudaCores,
        }];
        if let (Keys::Cache(cache), Pass::Full) = (io.keys, spec.pass) {
            if let Some(kernel) = self.matrix_kernel(io.dtype, cache.spec().storage_dtype()) {
                bands.push(Band {
                    min_q: MATRIX_MIN_QUERY_LEN,
                    kernel,
                });
            }
        }
        Ok(bands)
    }

    fn begin(&self, _: &HipAttentionMetadata) -> Result<()> {
        Ok(())
    }

    fn write_cache(
        &self,
        _: &mut (),
        md: &HipAttentionMetadata,
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
        _: &mut (),
        md: &HipAttentionMetadata,
        io: &mut ForwardIo<'_>,
        job: &AttendJob<HipKernel>,
    ) -> Result<()> {
        let base = self.pass_params(md, io, &job.spec)?;
        let dense = io.keys.is_dense();
        let p = &self.params;
        if let HipKernel::Matrix(kind, name) = job.kernel {
            let plan = md.plan(&job.plan_key(p, false, MATRIX_ROWS, SplitRule::Never))?;
            return kernels::launch_matrix(&self.device, p, &plan, &base, kind, name);
        }
        // Split-KV only for a full pass over the cache (dense keys are unsplit).
        let split = if job.spec.pass == Pass::Full && !dense {
            SplitRule::TwoPerSm {
                sm_count: usize::try_from(self.device.info().compute_units)
                    .unwrap_or(1)
                    .max(1),
            }
        } else {
            SplitRule::Never
        };
        let plan = md.plan(&job.plan_key(p, dense, ROWS_PER_ITEM, split))?;
        kernels::launch_attention(&self.device, p, &plan, &base, md)
    }

    fn merge(&self, _: &mut (), _: &HipAttentionMetadata, _: &mut ForwardIo<'_>) -> Result<()> {
        // runs_cascade is false: the driver never asks for a merge.
        Err(Error::config(
            "the HIP backend runs cascade batches as one full pass; it has no merge step",
        ))
    }

    fn finish(&self, _: (), _: Option<&mut ForwardIo<'_>>) -> Result<()> {
        Ok(())
    }
}
