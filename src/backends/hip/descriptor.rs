//! The HIP backend's descriptor.

use std::sync::OnceLock;

use crate::attention::{AttentionImpl, AttentionParams};
use crate::backend::{
    AttentionBackend, AttentionType, Availability, BackendCapabilities, BlockSize,
    GraphCaptureSupport, HeadSizes, KvLayout,
};
use crate::device::{Device, DeviceKind, HipDevice};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::kernels::cuda::{amd_wave, ATTENTION_MAX_HEAD_SIZE, KEYS_PER_CHUNK};
use crate::kv_cache::KvCacheSpec;
use crate::metadata::AttentionMetadataBuilder;

use super::{HipAttentionImpl, HipMetadataBuilder};

// The block-size rule below is the kernels' key chunk.
const _: () = assert!(KEYS_PER_CHUNK == 16);

/// The HIP backend descriptor (name `HIP`, priority 200: right after CUDA).
///
/// Available when `libamdhip64` loads, AMD GPU 0 is found and opens
/// ([`crate::device::hip::probe`], [`HipDevice::new`]), and its target is one the CUDA
/// family's portable kernels know: the wavefront width the family derives from the target
/// ([`amd_wave`]) must be the one the device reports. The probe runs once per descriptor and
/// never panics.
#[derive(Debug)]
pub struct HipBackend {
    caps: BackendCapabilities,
    ordinal: usize,
    device: OnceLock<std::result::Result<HipDevice, String>>,
}

impl HipBackend {
    /// The descriptor for AMD GPU 0. Touches no runtime until asked.
    pub fn new() -> Self {
        Self::with_ordinal(0)
    }

    /// The descriptor for AMD GPU `ordinal`.
    pub fn with_ordinal(ordinal: usize) -> Self {
        HipBackend {
            caps: BackendCapabilities {
                // Any multiple of 8 up to ATTENTION_MAX_HEAD_SIZE: the kernel buckets the
                // head size by ceil(D / wavefront) at compile time and masks the tail lanes;
                // the cache write moves 8-element vectors.
                head_sizes: HeadSizes::Range {
                    min: 8,
                    max: ATTENTION_MAX_HEAD_SIZE,
                    multiple: 8,
                },
                dtypes: vec![DType::F32, DType::F16, DType::Bf16],
                // As the CUDA backend's CUDA-core path: every cache dtype. The portable
                // kernels convert fp8 (e4m3 / e5m2) in software on every AMD target (no
                // hardware fp8 conversion is assumed), bit-identical to `crate::fp8`.
                kv_cache_dtypes: CacheDType::ALL.to_vec(),
                // Key chunks of 16 positions never cross a block.
                block_sizes: vec![BlockSize::MultipleOf(16)],
                // Cross-attention needs encoder sequence lengths the metadata does not carry.
                attn_types: vec![
                    AttentionType::Decoder,
                    AttentionType::Encoder,
                    AttentionType::EncoderOnly,
                ],
                supports_sink: true,
                supports_non_causal: true,
                supports_alibi: true,
                supports_sliding_window: true,
                supports_soft_cap: true,
                // Cascade batches run as one full pass (the driver's fallback, same result).
                supports_cascade: true,
                is_mla: false,
                min_capability: None,
                graph_capture: GraphCaptureSupport::Never,
                // A head's tokens adjacent: a 16-key chunk of one head is one contiguous read.
                kv_layout: KvLayout::Hnd,
            },
            ordinal,
            device: OnceLock::new(),
        }
    }

    fn probe(&self) -> std::result::Result<HipDevice, String> {
        self.device
            .get_or_init(|| {
                let info = crate::device::hip::probe(self.ordinal)?;
                let Some(family_wave) = amd_wave(&info.arch) else {
                    return Err(format!(
                        "AMD GPU {} ({}): target {} is not one the kernel family knows (not \
                         gfx<id>)",
                        self.ordinal, info.name, info.arch
                    ));
                };
                if usize::try_from(info.wavefront_size).ok() != Some(family_wave) {
                    return Err(format!(
                        "AMD GPU {} ({}, {}) has wavefront size {}, but the kernel family \
                         builds wave{family_wave} for that target",
                        self.ordinal, info.name, info.arch, info.wavefront_size
                    ));
                }
                HipDevice::new(self.ordinal).map_err(|e| e.to_string())
            })
            .clone()
    }

    /// The opened device, or why it is not available.
    pub fn hip_device(&self) -> Result<HipDevice> {
        self.probe().map_err(|message| Error::Device {
            backend: "HIP".into(),
            message,
        })
    }
}

impl Default for HipBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl AttentionBackend for HipBackend {
    fn name(&self) -> &str {
        "HIP"
    }

    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Hip
    }

    fn priority(&self) -> u32 {
        200
    }

    fn availability(&self) -> Availability {
        match self.probe() {
            Ok(d) => Availability::Available(d.description()),
            Err(why) => Availability::Unavailable(why),
        }
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn device(&self) -> Result<Device> {
        Ok(Device::Hip(self.hip_device()?))
    }

    fn make_impl(&self, params: AttentionParams) -> Result<Box<dyn AttentionImpl>> {
        self.check_layer(&params)?;
        Ok(Box::new(HipAttentionImpl::new(params, self.hip_device()?)?))
    }

    fn make_builder(&self, spec: &KvCacheSpec) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.check_cache_spec(spec)?;
        Ok(Box::new(HipMetadataBuilder::new(*spec, self.hip_device()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SelectorConfig;

    #[test]
    fn capabilities_are_the_cuda_core_paths() {
        let b = HipBackend::new();
        let mut ok = SelectorConfig::new(128, DType::Bf16, CacheDType::Fp8E4m3);
        ok.block_size = Some(32);
        assert!(b.validate_configuration(&ok).is_empty());
        let mut bad = SelectorConfig::new(20, DType::F16, CacheDType::Auto);
        bad.block_size = Some(8);
        assert_eq!(b.validate_configuration(&bad).len(), 2);
        let big = SelectorConfig::new(ATTENTION_MAX_HEAD_SIZE + 8, DType::F32, CacheDType::Auto);
        assert!(!b.validate_configuration(&big).is_empty());
        assert_eq!(b.capabilities().graph_capture, GraphCaptureSupport::Never);
    }

    #[test]
    fn without_an_amd_gpu_it_is_unavailable_with_the_reason() {
        let b = HipBackend::new();
        let Availability::Unavailable(why) = b.availability() else {
            eprintln!("skipped: an AMD GPU is here");
            return;
        };
        assert!(!why.is_empty());
        match b.device() {
            Err(Error::Device { backend, message }) => {
                assert_eq!(backend, "HIP");
                assert_eq!(message, why);
            }
            other => panic!("expected a device error, got {other:?}"),
        }
    }
}
