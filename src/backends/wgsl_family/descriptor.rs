//! The WGSL family's descriptor ([`WgslBackend`], one per runtime through
//! [`WgslBackendRuntime`]) and what it declares and checks, whichever runtime opens the
//! device: the capabilities (the kernels unpack 16-bit and fp8 elements from u32 words, so
//! they hold on every device), the device-dependent vetoes (a tile of the head size must fit
//! the workgroup memory, a KV cache one storage binding — or device memory where the runtime
//! stores larger caches in chunks) and the KV-cache shape.

use std::marker::PhantomData;

use crate::attention::{AttentionImpl, AttentionParams};
use crate::backend::{
    AttentionBackend, AttentionType, Availability, BackendCapabilities, BlockSize,
    GraphCaptureSupport, HeadSizes, KvLayout, Reason, SelectorConfig,
};
use crate::device::wgsl::{WgslDeviceInfo, WgslRuntime};
use crate::device::{Device, DeviceKind};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::kv_cache::KvCacheSpec;
use crate::metadata::AttentionMetadataBuilder;

use super::{tiles_for, WgslAttentionImpl, WgslMetadataBuilder, MAX_HEAD_SIZE};

/// The family's capabilities, with the runtime's graph-capture level.
pub fn wgsl_capabilities(graph_capture: GraphCaptureSupport) -> BackendCapabilities {
    BackendCapabilities {
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
        graph_capture,
        // A head's tokens adjacent: a tile's keys are contiguous per block.
        kv_layout: KvLayout::Hnd,
    }
}

/// The device-dependent vetoes: a KV cache of the configuration's size (when given) must fit
/// one storage binding — or, where the device binds arrays of buffers and stores a larger
/// cache in chunks of whole blocks, its memory ([`WgslDeviceInfo::check_cache`]) — and a
/// tile of the head size the workgroup memory.
pub fn wgsl_combination_veto(
    info: &WgslDeviceInfo,
    caps: &BackendCapabilities,
    config: &SelectorConfig,
) -> Option<Reason> {
    // The block size may be unknown here: a block is checked against a binding at allocation.
    if let Some(bytes) = config.kv_cache_bytes {
        if let Err(e) = info.check_cache(bytes, 0) {
            return Some(Reason::new("KV cache too large", e.to_string()));
        }
    }
    if !caps.head_sizes.contains(config.head_size) {
        return None; // already reported by the capability check
    }
    tiles_for(info, config.head_size)
        .err()
        .map(|e| Reason::new("head_size not supported", e.to_string()))
}

/// The KV-cache shape `[num_blocks, 2, block_size, num_kv_heads, head_size]`, checked to fit
/// one storage binding of `info`'s device where the element size is known (`info`: `None`
/// when no device opens, and the shape is all there is to say).
#[allow(clippy::too_many_arguments)]
pub fn wgsl_kv_cache_shape(
    backend: &str,
    caps: &BackendCapabilities,
    info: Option<&WgslDeviceInfo>,
    num_blocks: usize,
    block_size: usize,
    num_kv_heads: usize,
    head_size: usize,
    cache_dtype: CacheDType,
) -> Result<[usize; 5]> {
    if block_size == 0 || !caps.head_sizes.contains(head_size) {
        return Err(Error::config(format!(
            "{backend}: block size {block_size} / head size {head_size} not supported \
             (head sizes: {})",
            caps.head_sizes
        )));
    }
    let elem = match cache_dtype {
        CacheDType::Auto => None,
        CacheDType::F16 | CacheDType::Bf16 => Some(2),
        CacheDType::Fp8E4m3 | CacheDType::Fp8E5m2 => Some(1),
    };
    if let (Some(elem), Some(info)) = (elem, info) {
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
        info.check_cache(bytes, bytes / num_blocks.max(1) as u64)?;
    }
    Ok([num_blocks, 2, block_size, num_kv_heads, head_size])
}

/// What a WGSL-family descriptor knows of its runtime: its name, its device family, its
/// ranks, and how to open the process's device.
pub trait WgslBackendRuntime: WgslRuntime {
    /// The backend's registered name.
    const BACKEND: &'static str;
    /// The name of its MLA backend.
    const MLA_BACKEND: &'static str;
    /// The device family the selector ranks.
    const KIND: DeviceKind;
    /// Priority on a GPU, and on a CPU implementation (lavapipe, llvmpipe, WARP), which
    /// emulates a GPU on the cores the CPU backend uses natively and so ranks after it.
    const PRIORITY: (u32, u32);
    /// The process's device of this runtime (opened once; a failure is cached too).
    fn open() -> Result<Self>;

    /// [`WgslBackendRuntime::PRIORITY`] for the device here, `offset` places later (the MLA
    /// backend's rank is its standard backend's plus 10).
    fn rank(offset: u32) -> u32 {
        match Self::open() {
            Ok(d) if d.info().is_cpu => Self::PRIORITY.1 + offset,
            _ => Self::PRIORITY.0 + offset,
        }
    }

    /// Whether the device opens (its description), or why not.
    fn availability() -> Availability {
        match Self::open() {
            Ok(d) => Availability::Available(d.device().description()),
            Err(Error::Device { message, .. }) => Availability::Unavailable(message),
            Err(e) => Availability::Unavailable(e.to_string()),
        }
    }
}

/// The descriptor of the WGSL family on runtime `R` (`WGPU`, `VULKAN`).
///
/// What it declares holds on every device: 16-bit and fp8 elements are packed into u32 words
/// and converted with integer arithmetic, so f16 and bf16 need no device feature. What
/// depends on the device is checked once it is open: the head size must leave a tile that
/// fits the workgroup memory, and a KV cache must fit one storage binding (larger caches are
/// an error, not split).
#[derive(Debug)]
pub struct WgslBackend<R: WgslBackendRuntime> {
    caps: BackendCapabilities,
    runtime: PhantomData<R>,
}

impl<R: WgslBackendRuntime> WgslBackend<R> {
    /// The descriptor (touches no device).
    pub fn new() -> Self {
        WgslBackend {
            // A runtime that captures submissions (Vulkan) replays uniform decode steps from
            // graph-mode metadata; wgpu records every call anew.
            caps: wgsl_capabilities(super::metadata_builder::graph_capture_level::<R>()),
            runtime: PhantomData,
        }
    }
}

impl<R: WgslBackendRuntime> Default for WgslBackend<R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R: WgslBackendRuntime> AttentionBackend for WgslBackend<R> {
    fn name(&self) -> &str {
        R::BACKEND
    }

    fn device_kind(&self) -> DeviceKind {
        R::KIND
    }

    /// [`WgslBackendRuntime::PRIORITY`]: the GPU rank, or the CPU implementation's.
    fn priority(&self) -> u32 {
        R::rank(0)
    }

    fn availability(&self) -> Availability {
        R::availability()
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn device(&self) -> Result<Device> {
        Ok(R::open()?.device())
    }

    /// Device-dependent checks: a tile of this head size must fit the workgroup memory, and
    /// a KV cache of the configuration's size (when given) one storage binding.
    fn supports_combination(&self, config: &SelectorConfig) -> Option<Reason> {
        let dev = R::open().ok()?;
        wgsl_combination_veto(dev.info(), &self.caps, config)
    }

    /// The cache must fit one storage binding of the device, or be stored in chunks of whole
    /// blocks where the device binds arrays of buffers ([`WgslDeviceInfo::check_cache`]).
    fn check_kv_cache(&self, spec: &KvCacheSpec, num_blocks: usize) -> Result<()> {
        super::attention_impl::check_slots(num_blocks, spec.block_size)?;
        let bytes = spec.cache_bytes(num_blocks)?;
        R::open()?
            .info()
            .check_cache(bytes, spec.page_size_bytes()? as u64)
    }

    fn kv_cache_shape(
        &self,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_size: usize,
        cache_dtype: CacheDType,
    ) -> Result<[usize; 5]> {
        let dev = R::open().ok();
        wgsl_kv_cache_shape(
            R::BACKEND,
            &self.caps,
            dev.as_ref().map(|d| d.info()),
            num_blocks,
            block_size,
            num_kv_heads,
            head_size,
            cache_dtype,
        )
    }

    fn make_impl(&self, params: AttentionParams) -> Result<Box<dyn AttentionImpl>> {
        self.check_layer(&params)?;
        Ok(Box::new(WgslAttentionImpl::new(R::open()?, params)?))
    }

    fn make_builder(&self, spec: &KvCacheSpec) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.check_cache_spec(spec)?;
        Ok(Box::new(WgslMetadataBuilder::new(R::open()?, *spec)))
    }
}
