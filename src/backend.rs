//! The backend descriptor: what a backend is, what it supports, and how to build its parts.
//!
//! This is vLLM's `AttentionBackend` (v0.25.1, `vllm/v1/attention/backend.py`). In vLLM the
//! descriptor is a class with class methods; here it is a trait object, because plugins add
//! backends at run time (see [`crate::registry`]). What a backend supports is plain data,
//! [`BackendCapabilities`], and [`AttentionBackend::validate_configuration`] derives vLLM's
//! reason strings from it, so every backend answers "why not?" the same way.

use std::fmt;
use std::sync::Arc;

pub use crate::capability::{
    AttentionType, BlockSize, DeviceCapability, GraphCaptureSupport, HeadSizes, KvLayout, Reason,
};

use crate::attention::{AttentionImpl, AttentionParams, MlaAttentionImpl};
use crate::device::{Device, DeviceKind};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::kv_cache::{KvCache, KvCacheSpec};
use crate::metadata::AttentionMetadataBuilder;
use crate::mla::{AbsorbedWeights, MlaKvCache, MlaParams};

/// Everything a backend supports, as plain data. [`AttentionBackend::validate_configuration`]
/// checks a [`SelectorConfig`] against it.
#[derive(Clone, Debug)]
pub struct BackendCapabilities {
    /// Accepted head sizes.
    pub head_sizes: HeadSizes,
    /// Accepted activation dtypes.
    pub dtypes: Vec<DType>,
    /// Accepted KV-cache dtypes.
    pub kv_cache_dtypes: Vec<CacheDType>,
    /// Accepted kernel block sizes; a block size is accepted if any entry accepts it.
    pub block_sizes: Vec<BlockSize>,
    /// Accepted attention types.
    pub attn_types: Vec<AttentionType>,
    /// Attention sinks (per-head sink logits).
    pub supports_sink: bool,
    /// Non-causal attention inside the paged decoder path.
    pub supports_non_causal: bool,
    /// ALiBi biases.
    pub supports_alibi: bool,
    /// Sliding-window attention.
    pub supports_sliding_window: bool,
    /// Logit soft capping.
    pub supports_soft_cap: bool,
    /// Cascade attention over a common prefix.
    pub supports_cascade: bool,
    /// An MLA backend (latent cache) rather than standard attention.
    pub is_mla: bool,
    /// Smallest device capability it runs on (`None`: any).
    pub min_capability: Option<DeviceCapability>,
    /// Graph-capture level.
    pub graph_capture: GraphCaptureSupport,
    /// KV-cache memory order.
    pub kv_layout: KvLayout,
}

impl BackendCapabilities {
    /// An MLA backend's capabilities (vLLM's MLA backends: decoder self-attention on a
    /// latent cache, no sinks, ALiBi, sliding window, soft cap or cascade, no graph capture):
    /// only what differs between them is given.
    pub fn mla(
        head_sizes: HeadSizes,
        dtypes: Vec<DType>,
        kv_cache_dtypes: Vec<CacheDType>,
        block_sizes: Vec<BlockSize>,
        min_capability: Option<DeviceCapability>,
    ) -> Self {
        BackendCapabilities {
            head_sizes,
            dtypes,
            kv_cache_dtypes,
            block_sizes,
            attn_types: vec![AttentionType::Decoder],
            supports_sink: false,
            supports_non_causal: false,
            supports_alibi: false,
            supports_sliding_window: false,
            supports_soft_cap: false,
            supports_cascade: false,
            is_mla: true,
            min_capability,
            graph_capture: GraphCaptureSupport::Never,
            kv_layout: KvLayout::Nhd,
        }
    }
}

/// What the selector asks a backend: vLLM's `AttentionSelectorConfig` plus the layer features
/// polyattn checks up front (ALiBi, sliding window, soft cap). Hashable: the selector caches
/// its answer per configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct SelectorConfig {
    /// Head size.
    pub head_size: usize,
    /// Activation dtype.
    pub dtype: DType,
    /// KV-cache dtype.
    pub kv_cache_dtype: CacheDType,
    /// Kernel block size; `None` lets the backend choose (never disqualifies).
    pub block_size: Option<u32>,
    /// MLA layer.
    pub use_mla: bool,
    /// The layer has attention sinks.
    pub has_sink: bool,
    /// Attention type.
    pub attn_type: AttentionType,
    /// The layer runs non-causal batches in the paged decoder path (vLLM's
    /// `use_non_causal`, e.g. a DFlash drafter); causality itself is per batch
    /// (`BatchDescription::causal`), and a non-causal batch on a backend without
    /// `supports_non_causal` is an error at forward time.
    pub use_non_causal: bool,
    /// The layer uses ALiBi.
    pub use_alibi: bool,
    /// The layer uses a sliding window.
    pub use_sliding_window: bool,
    /// The layer uses a logit soft cap.
    pub use_soft_cap: bool,
    /// Bytes of the largest KV cache (one layer's) the caller will allocate, when known: a
    /// backend that cannot hold a cache that large (a wgpu adapter's largest storage binding)
    /// is rejected up front with "KV cache too large" instead of failing at allocation.
    pub kv_cache_bytes: Option<u64>,
}

impl SelectorConfig {
    /// A decoder configuration with everything optional turned off.
    pub fn new(head_size: usize, dtype: DType, kv_cache_dtype: CacheDType) -> Self {
        SelectorConfig {
            head_size,
            dtype,
            kv_cache_dtype,
            block_size: None,
            use_mla: false,
            has_sink: false,
            attn_type: AttentionType::Decoder,
            use_non_causal: false,
            use_alibi: false,
            use_sliding_window: false,
            use_soft_cap: false,
            kv_cache_bytes: None,
        }
    }

    /// The configuration a layer with these parameters needs, declared causal with no cache
    /// size: set [`Self::use_non_causal`] (or [`Self::with_non_causal`]) for a layer that runs
    /// non-causal decoder batches and [`Self::kv_cache_bytes`] when the cache size is known.
    pub fn for_layer(params: &AttentionParams, dtype: DType, block_size: Option<u32>) -> Self {
        SelectorConfig {
            head_size: params.head_size,
            dtype,
            kv_cache_dtype: params.kv_cache_dtype,
            block_size,
            use_mla: false,
            has_sink: params.sinks.is_some(),
            attn_type: params.attn_type,
            use_non_causal: false,
            use_alibi: params.alibi_slopes.is_some(),
            use_sliding_window: params.sliding_window.is_some(),
            use_soft_cap: params.logits_soft_cap.is_some_and(|c| c > 0.0),
            kv_cache_bytes: None,
        }
    }

    /// The same configuration for a layer that runs non-causal decoder batches.
    pub fn with_non_causal(mut self, on: bool) -> Self {
        self.use_non_causal = on;
        self
    }

    /// The same configuration with the size of the largest KV cache it will allocate.
    pub fn with_kv_cache_bytes(mut self, bytes: u64) -> Self {
        self.kv_cache_bytes = Some(bytes);
        self
    }
}

impl fmt::Display for SelectorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "head_size={} dtype={} kv_cache_dtype={} block_size={} attn_type={}",
            self.head_size,
            self.dtype,
            self.kv_cache_dtype,
            self.block_size
                .map_or_else(|| "auto".to_string(), |b| b.to_string()),
            self.attn_type
        )?;
        for (on, name) in [
            (self.use_mla, "mla"),
            (self.has_sink, "sinks"),
            (self.use_non_causal, "non_causal"),
            (self.use_alibi, "alibi"),
            (self.use_sliding_window, "sliding_window"),
            (self.use_soft_cap, "soft_cap"),
        ] {
            if on {
                write!(f, " +{name}")?;
            }
        }
        if let Some(b) = self.kv_cache_bytes {
            write!(f, " kv_cache_bytes={b}")?;
        }
        Ok(())
    }
}

/// Whether a backend can be used on this machine at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// Its driver and compiler were found; the string describes the device.
    Available(String),
    /// It cannot run here, and why ("libcuda.so not found").
    Unavailable(String),
}

impl Availability {
    /// True when available.
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available(_))
    }
}

/// A backend descriptor (vLLM's `AttentionBackend`).
///
/// Implemented once per device family in `src/backends/<name>/descriptor.rs`, and by plugins.
/// Descriptors are cheap to create and must not touch a device until [`Self::availability`]
/// or [`Self::device`] is called.
pub trait AttentionBackend: Send + Sync {
    /// The name users force it with (`POLYATTN_BACKEND=<name>`, case-insensitive).
    fn name(&self) -> &str;

    /// The device family it runs on.
    fn device_kind(&self) -> DeviceKind;

    /// Rank in automatic selection: lower is tried first. Built-ins use CUDA 100, HIP 200,
    /// Vulkan 300, wgpu 400, CPU 1000, leaving room for backends in between.
    fn priority(&self) -> u32;

    /// Whether its driver / runtime compiler is present. Must never panic.
    fn availability(&self) -> Availability;

    /// What it supports.
    fn capabilities(&self) -> &BackendCapabilities;

    /// Opens (or returns the already open) device its kernels run on.
    fn device(&self) -> Result<Device>;

    /// Builds the impl for one layer (vLLM's `get_impl_cls()(...)`).
    fn make_impl(&self, params: AttentionParams) -> Result<Box<dyn AttentionImpl>>;

    /// Builds the metadata builder for one KV-cache group (vLLM's `get_builder_cls()(...)`).
    fn make_builder(&self, spec: &KvCacheSpec) -> Result<Box<dyn AttentionMetadataBuilder>>;

    /// Checks a standard layer before its impl is built: the parameters themselves, then
    /// every reason this backend rejects the layer's configuration (the activation dtype is
    /// only known per call; f32 stands in for it) as [`Error::Unsupported`].
    fn check_layer(&self, params: &AttentionParams) -> Result<()> {
        params.validate()?;
        let config = SelectorConfig::for_layer(params, DType::F32, None);
        let reasons = self.validate_configuration(&config);
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(Error::Unsupported {
                backend: self.name().into(),
                reasons,
            })
        }
    }

    /// Checks a cache spec before a metadata builder is made for it
    /// ([`Self::kv_cache_shape`] of one block).
    fn check_cache_spec(&self, spec: &KvCacheSpec) -> Result<()> {
        self.kv_cache_shape(
            1,
            spec.block_size,
            spec.num_kv_heads,
            spec.head_size,
            spec.cache_dtype,
        )
        .map(|_| ())
    }

    /// Checks an MLA layer before an MLA impl is made for it: valid sizes, weights made for
    /// them, the latent width (`kv_lora_rank + rope`) among the head sizes and the cache
    /// dtype among the cache dtypes, with the reference's reason strings.
    fn check_mla_layer(&self, params: &MlaParams, weights: &AbsorbedWeights) -> Result<()> {
        params.validate()?;
        if weights.params != *params {
            return Err(Error::config(
                "make_mla_impl: the absorbed weights were made for other MLA sizes",
            ));
        }
        let caps = self.capabilities();
        let mut reasons = Vec::new();
        if !caps.head_sizes.contains(params.latent_dim()) {
            reasons.push(Reason::new(
                "head_size not supported",
                format!(
                    "got {} (kv_lora_rank + qk_rope_head_dim); supported: {}",
                    params.latent_dim(),
                    caps.head_sizes
                ),
            ));
        }
        if !caps.kv_cache_dtypes.contains(&params.kv_cache_dtype) {
            reasons.push(Reason::new(
                "kv_cache_dtype not supported",
                format!("got {}", params.kv_cache_dtype),
            ));
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(Error::Unsupported {
                backend: self.name().into(),
                reasons,
            })
        }
    }

    /// The latent cache shape `[num_blocks, block_size, head_size]` after checking the block
    /// size and head size against the capabilities (what an MLA backend's
    /// [`Self::mla_kv_cache_shape`] checks).
    fn checked_mla_cache_shape(
        &self,
        num_blocks: usize,
        block_size: usize,
        head_size: usize,
    ) -> Result<[usize; 3]> {
        let caps = self.capabilities();
        if !u32::try_from(block_size).is_ok_and(|bs| caps.block_sizes.iter().any(|b| b.accepts(bs)))
        {
            let sizes: Vec<String> = caps.block_sizes.iter().map(|b| format!("{b:?}")).collect();
            return Err(Error::config(format!(
                "{}: block size {block_size} is not supported (supported: {})",
                self.name(),
                sizes.join(", ")
            )));
        }
        if !caps.head_sizes.contains(head_size) {
            return Err(Error::config(format!(
                "{}: head size {head_size} is not supported (supported: {})",
                self.name(),
                caps.head_sizes
            )));
        }
        Ok([num_blocks, block_size, head_size])
    }

    /// Builds the MLA impl of one layer from its sizes and absorbed `kv_b_proj`; only MLA
    /// backends (`is_mla`) have one: the default is the typed error "MLA not supported".
    fn make_mla_impl(
        &self,
        _params: MlaParams,
        _weights: AbsorbedWeights,
    ) -> Result<Box<dyn MlaAttentionImpl>> {
        Err(Error::Unsupported {
            backend: self.name().into(),
            reasons: vec![Reason::new("MLA not supported", "")],
        })
    }

    /// The metadata builder of an MLA backend for latent caches of `block_size` tokens per
    /// block; the default is the typed error "MLA not supported".
    fn make_mla_builder(&self, _block_size: usize) -> Result<Box<dyn AttentionMetadataBuilder>> {
        Err(Error::Unsupported {
            backend: self.name().into(),
            reasons: vec![Reason::new("MLA not supported", "")],
        })
    }

    /// The latent cache's shape `[num_blocks, block_size, head_size]` on an MLA backend, or
    /// why it cannot hold it. The default: [`AttentionBackend::checked_mla_cache_shape`]
    /// (the capabilities' block and head sizes) on a backend whose capabilities say
    /// `is_mla`, else the typed error "MLA not supported".
    fn mla_kv_cache_shape(
        &self,
        num_blocks: usize,
        block_size: usize,
        head_size: usize,
    ) -> Result<[usize; 3]> {
        if self.capabilities().is_mla {
            return self.checked_mla_cache_shape(num_blocks, block_size, head_size);
        }
        Err(Error::Unsupported {
            backend: self.name().into(),
            reasons: vec![Reason::new("MLA not supported", "")],
        })
    }

    /// Cross-feature veto (vLLM's `supports_combination`): a reason, or `None` if fine.
    fn supports_combination(&self, _config: &SelectorConfig) -> Option<Reason> {
        None
    }

    /// The device capability of this backend's device, when it has one.
    fn device_capability(&self) -> Option<DeviceCapability> {
        None
    }

    /// The logical KV-cache shape `(num_blocks, 2, block_size, num_kv_heads, head_size)`.
    /// Errors when the block size or head size is not supported.
    fn kv_cache_shape(
        &self,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_size: usize,
        _cache_dtype: CacheDType,
    ) -> Result<[usize; 5]> {
        let caps = self.capabilities();
        if !caps
            .block_sizes
            .iter()
            .any(|b| b.accepts(block_size as u32))
        {
            return Err(Error::config(format!(
                "{}: block size {block_size} is not supported (supported: {})",
                self.name(),
                describe_block_sizes(&caps.block_sizes)
            )));
        }
        if !caps.head_sizes.contains(head_size) {
            return Err(Error::config(format!(
                "{}: head size {head_size} is not supported (supported: {})",
                self.name(),
                caps.head_sizes
            )));
        }
        Ok([num_blocks, 2, block_size, num_kv_heads, head_size])
    }

    /// Checks that a cache of `num_blocks` blocks of `spec` can live on this backend's device
    /// (beyond [`Self::kv_cache_shape`]'s block and head sizes): a wgpu adapter must hold it
    /// in one storage binding. `KvCache::new` calls it before allocating.
    fn check_kv_cache(&self, _spec: &KvCacheSpec, _num_blocks: usize) -> Result<()> {
        Ok(())
    }

    /// Physical order of the logical KV-cache shape (vLLM's `get_kv_cache_stride_order`).
    fn kv_cache_stride_order(&self) -> [usize; 5] {
        self.capabilities().kv_layout.stride_order()
    }

    /// vLLM's `get_preferred_block_size(default)`: `default` if supported, else the smallest
    /// declared size.
    fn preferred_block_size(&self, default: u32) -> u32 {
        let caps = self.capabilities();
        if caps.block_sizes.iter().any(|b| b.accepts(default)) {
            return default;
        }
        caps.block_sizes
            .iter()
            .map(|b| match b {
                BlockSize::Exact(s) | BlockSize::MultipleOf(s) => *s,
            })
            .min()
            .unwrap_or(default)
    }

    /// Every reason this backend cannot run `config`, in vLLM's order; empty means valid.
    fn validate_configuration(&self, config: &SelectorConfig) -> Vec<Reason> {
        validate_against(self.capabilities(), self.device_capability(), config)
            .into_iter()
            .chain(self.supports_combination(config))
            .collect()
    }
}

/// Renders a block-size list for messages.
pub fn describe_block_sizes(sizes: &[BlockSize]) -> String {
    sizes
        .iter()
        .map(|b| b.describe())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The capability checks of vLLM's `validate_configuration`, in its order, plus polyattn's
/// layer-feature checks (ALiBi, sliding window, soft cap) at the end.
pub fn validate_against(
    caps: &BackendCapabilities,
    device_cap: Option<DeviceCapability>,
    c: &SelectorConfig,
) -> Vec<Reason> {
    let mut r = Vec::new();
    if !caps.head_sizes.contains(c.head_size) {
        r.push(Reason::new(
            "head_size not supported",
            format!("got {}; supported: {}", c.head_size, caps.head_sizes),
        ));
    }
    if !caps.dtypes.contains(&c.dtype) {
        r.push(Reason::new(
            "dtype not supported",
            format!("got {}; supported: {}", c.dtype, list(&caps.dtypes)),
        ));
    }
    if !caps.kv_cache_dtypes.contains(&c.kv_cache_dtype) {
        r.push(Reason::new(
            "kv_cache_dtype not supported",
            format!(
                "got {}; supported: {}",
                c.kv_cache_dtype,
                list(&caps.kv_cache_dtypes)
            ),
        ));
    }
    if let Some(bs) = c.block_size {
        if !caps.block_sizes.iter().any(|b| b.accepts(bs)) {
            r.push(Reason::new(
                "block_size not supported",
                format!(
                    "got {bs}; supported: {}",
                    describe_block_sizes(&caps.block_sizes)
                ),
            ));
        }
    }
    if c.use_mla && !caps.is_mla {
        r.push(Reason::new("MLA not supported", ""));
    }
    if !c.use_mla && caps.is_mla {
        r.push(Reason::new("non-MLA not supported", ""));
    }
    if c.has_sink && !caps.supports_sink {
        r.push(Reason::new("attention sinks not supported", ""));
    }
    if let (Some(min), Some(have)) = (caps.min_capability, device_cap) {
        if have < min {
            r.push(Reason::new(
                "compute capability not supported",
                format!(
                    "device is {}.{}, needs {}.{}",
                    have.major, have.minor, min.major, min.minor
                ),
            ));
        }
    }
    if !caps.attn_types.contains(&c.attn_type) {
        r.push(Reason::new(
            format!("attention type {} not supported", c.attn_type),
            format!("supported: {}", list(&caps.attn_types)),
        ));
    }
    if c.use_non_causal && !caps.supports_non_causal {
        r.push(Reason::new("non-causal attention not supported", ""));
    }
    if c.use_alibi && !caps.supports_alibi {
        r.push(Reason::new("ALiBi not supported", ""));
    }
    if c.use_sliding_window && !caps.supports_sliding_window {
        r.push(Reason::new("sliding window not supported", ""));
    }
    if c.use_soft_cap && !caps.supports_soft_cap {
        r.push(Reason::new("logits soft cap not supported", ""));
    }
    r
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl MlaKvCache {
    /// Allocates a zeroed latent cache for an MLA layer of `params` with activation dtype
    /// `dtype` on `backend`'s device, after the backend accepts its shape
    /// ([`AttentionBackend::mla_kv_cache_shape`]).
    pub fn for_backend(
        backend: &dyn AttentionBackend,
        params: &MlaParams,
        dtype: DType,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self> {
        params.validate()?;
        backend.mla_kv_cache_shape(num_blocks, block_size, params.latent_dim())?;
        MlaKvCache::new(
            &backend.device()?,
            num_blocks,
            block_size,
            params.latent_dim(),
            dtype,
            params.kv_cache_dtype,
        )
    }
}

impl KvCache {
    /// Allocates a zeroed cache with the layout and shape rules of `backend`.
    pub fn new(
        backend: &dyn AttentionBackend,
        spec: KvCacheSpec,
        num_blocks: usize,
    ) -> Result<Self> {
        backend.kv_cache_shape(
            num_blocks,
            spec.block_size,
            spec.num_kv_heads,
            spec.head_size,
            spec.cache_dtype,
        )?;
        backend.check_kv_cache(&spec, num_blocks)?;
        let device = backend.device()?;
        Self::with_layout(&device, spec, num_blocks, backend.capabilities().kv_layout)
    }
}

/// A shared handle to a backend descriptor.
pub type BackendRef = Arc<dyn AttentionBackend>;

/// The standard-layer methods of an MLA backend's [`AttentionBackend`] impl (`make_impl`,
/// `make_builder`, `kv_cache_shape`), each the typed error [`non_mla_error`]. Invoked inside
/// the `impl AttentionBackend for …` block.
#[macro_export]
macro_rules! mla_backend_rejects_standard_layers {
    () => {
        /// Always the typed error "non-MLA not supported".
        fn make_impl(
            &self,
            _params: $crate::AttentionParams,
        ) -> $crate::Result<Box<dyn $crate::AttentionImpl>> {
            Err($crate::backend::non_mla_error(self.name()))
        }

        /// Always the typed error "non-MLA not supported" (the latent cache is
        /// [`MlaKvCache`](crate::mla::MlaKvCache)).
        fn make_builder(
            &self,
            _spec: &$crate::KvCacheSpec,
        ) -> $crate::Result<Box<dyn $crate::metadata::AttentionMetadataBuilder>> {
            Err($crate::backend::non_mla_error(self.name()))
        }

        /// Always "non-MLA not supported" (see `mla_kv_cache_shape`).
        fn kv_cache_shape(
            &self,
            _num_blocks: usize,
            _block_size: usize,
            _num_kv_heads: usize,
            _head_size: usize,
            _cache_dtype: $crate::CacheDType,
        ) -> $crate::Result<[usize; 5]> {
            Err($crate::backend::non_mla_error(self.name()))
        }
    };
}

/// The typed error "non-MLA not supported" an MLA backend gives a standard layer, builder or
/// cache shape: it runs `forward_mqa` / `forward_mha` on a latent cache instead.
pub fn non_mla_error(backend: &str) -> Error {
    Error::Unsupported {
        backend: backend.into(),
        reasons: vec![Reason::new(
            "non-MLA not supported",
            "an MLA backend runs forward_mqa / forward_mha on a latent cache (make_mla_impl)",
        )],
    }
}
