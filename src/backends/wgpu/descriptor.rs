//! The wgpu backend's descriptor.

use crate::attention::{AttentionImpl, AttentionParams};
use crate::backend::{
    AttentionBackend, AttentionType, Availability, BackendCapabilities, BlockSize,
    GraphCaptureSupport, HeadSizes, KvLayout, Reason, SelectorConfig,
};
use crate::device::{Device, DeviceKind, WgpuDevice};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::kv_cache::KvCacheSpec;
use crate::metadata::AttentionMetadataBuilder;

use super::attention_impl::MAX_HEAD_SIZE;
use super::kernels::tiles_for;
use super::{WgpuAttentionImpl, WgpuMetadataBuilder};
use crate::device::wgpu::check_binding;

/// The wgpu backend descriptor (name `WGPU`, priority 400: after CUDA, HIP and Vulkan, before
/// the CPU).
///
/// What it declares holds on every adapter: 16-bit and fp8 elements are packed into u32
/// words and converted with integer arithmetic, so f16 and bf16 need no adapter feature.
/// What depends on the adapter is checked once it is open: the head size must leave a tile
/// that fits the adapter's workgroup memory, and a KV cache must fit one storage binding
/// (lavapipe 128 MiB, the H200 2 GiB; larger caches are an error, not split).
#[derive(Debug)]
pub struct WgpuBackend {
    caps: BackendCapabilities,
}

impl WgpuBackend {
    /// The descriptor (touches no device).
    pub fn new() -> Self {
        WgpuBackend {
            caps: BackendCapabilities {
                // The kernels load 4 elements at a time; tiles hold D/4 columns.
                head_sizes: HeadSizes::Range {
                    min: 4,
                    max: MAX_HEAD_SIZE,
                    multiple: 4,
                },
                dtypes: vec![DType::F32, DType::F16, DType::Bf16],
                kv_cache_dtypes: CacheDType::ALL.to_vec(),
                // The kernels walk keys one by one through the block table: any block size.
                block_sizes: vec![BlockSize::MultipleOf(1)],
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
                supports_cascade: true,
                is_mla: false,
                min_capability: None,
                // wgpu has no re-submittable command buffers.
                graph_capture: GraphCaptureSupport::Never,
                // A head's tokens adjacent: a tile's keys are contiguous per block.
                kv_layout: KvLayout::Hnd,
            },
        }
    }
}

/// `hardware` on a GPU adapter, `software` on a CPU implementation (lavapipe, llvmpipe,
/// WARP), which emulates a GPU on the cores the CPU backends use natively (the wgpu backends'
/// rule).
pub(crate) fn adapter_priority(hardware: u32, software: u32) -> u32 {
    match WgpuDevice::open() {
        Ok(d) if d.adapter_info().device_type == wgpu::DeviceType::Cpu => software,
        _ => hardware,
    }
}

/// Whether the wgpu device opens (its description), or why not.
pub(crate) fn adapter_availability() -> Availability {
    match WgpuDevice::open() {
        Ok(d) => Availability::Available(d.description()),
        Err(Error::Device { message, .. }) => Availability::Unavailable(message),
        Err(e) => Availability::Unavailable(e.to_string()),
    }
}

impl Default for WgpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl AttentionBackend for WgpuBackend {
    fn name(&self) -> &str {
        "WGPU"
    }

    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Wgpu
    }

    /// 400 for a hardware adapter: after the native paths, before the CPU. A software
    /// adapter (lavapipe, llvmpipe, WARP: `DeviceType::Cpu`) emulates a GPU on the same
    /// cores the CPU backend uses natively, so it ranks after the CPU backend (1100); it
    /// stays selectable by `POLYATTN_BACKEND=wgpu`.
    fn priority(&self) -> u32 {
        adapter_priority(400, 1100)
    }

    fn availability(&self) -> Availability {
        adapter_availability()
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn device(&self) -> Result<Device> {
        Ok(Device::Wgpu(WgpuDevice::open()?))
    }

    /// Adapter-dependent checks: a tile of this head size must fit the workgroup memory, and
    /// a KV cache of the configuration's size (when given) one storage binding.
    fn supports_combination(&self, config: &SelectorConfig) -> Option<Reason> {
        let dev = WgpuDevice::open().ok()?;
        if let Some(bytes) = config.kv_cache_bytes {
            if let Err(e) = check_binding(&dev, bytes, "the KV cache") {
                return Some(Reason::new("KV cache too large", e.to_string()));
            }
        }
        if !self.caps.head_sizes.contains(config.head_size) {
            return None; // already reported by the capability check
        }
        tiles_for(&dev, config.head_size)
            .err()
            .map(|e| Reason::new("head_size not supported", e.to_string()))
    }

    /// The cache must fit one storage binding of the adapter.
    fn check_kv_cache(&self, spec: &KvCacheSpec, num_blocks: usize) -> Result<()> {
        let bytes = spec.cache_bytes(num_blocks)?;
        check_binding(&WgpuDevice::open()?, bytes, "the KV cache")
    }

    fn kv_cache_shape(
        &self,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_size: usize,
        cache_dtype: CacheDType,
    ) -> Result<[usize; 5]> {
        if block_size == 0 || !self.caps.head_sizes.contains(head_size) {
            return Err(Error::config(format!(
                "WGPU: block size {block_size} / head size {head_size} not supported \
                 (head sizes: {})",
                self.caps.head_sizes
            )));
        }
        // Known element size: the cache must fit one storage binding.
        let elem = match cache_dtype {
            CacheDType::Auto => None,
            CacheDType::F16 | CacheDType::Bf16 => Some(2),
            CacheDType::Fp8E4m3 | CacheDType::Fp8E5m2 => Some(1),
        };
        if let (Some(elem), Ok(dev)) = (elem, WgpuDevice::open()) {
            let bytes = [2, block_size, num_kv_heads, head_size, elem]
                .iter()
                .try_fold(num_blocks as u64, |acc, &x| acc.checked_mul(x as u64))
                .ok_or_else(|| {
                    Error::overflow(
                        "KV cache",
                        format!(
                            "{num_blocks} blocks × 2 × {block_size} × {num_kv_heads} × \
                             {head_size} × {elem} bytes"
                        ),
                    )
                })?;
            check_binding(&dev, bytes, "the KV cache")?;
        }
        Ok([num_blocks, 2, block_size, num_kv_heads, head_size])
    }

    fn make_impl(&self, params: AttentionParams) -> Result<Box<dyn AttentionImpl>> {
        self.check_layer(&params)?;
        Ok(Box::new(WgpuAttentionImpl::new(
            WgpuDevice::open()?,
            params,
        )?))
    }

    fn make_builder(&self, spec: &KvCacheSpec) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.check_cache_spec(spec)?;
        Ok(Box::new(WgpuMetadataBuilder::new(
            WgpuDevice::open()?,
            *spec,
        )))
    }
}
