//! The model-facing attention layer object ([`Attention`]): one per model layer, identical on
//! every backend. It sits above the contracts: it asks the [`crate::selector`] for a backend
//! and holds that backend's impl.

use crate::attention::{AttentionImpl, AttentionLayer, AttentionParams};
use crate::backend::{AttentionBackend, BackendRef, SelectorConfig};
use crate::device::Tensor;
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::metadata::{AttentionMetadata, AttentionMetadataBuilder};

/// The model-facing attention layer: one per model layer, identical on every backend.
///
/// It owns the layer state and the backend's impl; model code builds the batch metadata once
/// per step with the backend's builder ([`Attention::backend`]) and calls [`Attention::forward`].
pub struct Attention {
    layer: AttentionLayer,
    backend: BackendRef,
    imp: Box<dyn AttentionImpl>,
}

impl Attention {
    /// Builds the layer on the backend the selector picks for it (honouring
    /// `POLYATTN_BACKEND`).
    pub fn new(
        layer: AttentionLayer,
        params: AttentionParams,
        dtype: crate::DType,
        block_size: Option<u32>,
    ) -> Result<Self> {
        params.validate()?;
        let config = SelectorConfig::for_layer(&params, dtype, block_size);
        let backend = crate::selector::get_attn_backend(&config)?;
        Self::on_backend(layer, params, backend)
    }

    /// Builds the layer on a given backend (no selection), after validating the
    /// configuration against it.
    pub fn on_backend(
        layer: AttentionLayer,
        params: AttentionParams,
        backend: BackendRef,
    ) -> Result<Self> {
        params.validate()?;
        let imp = backend.make_impl(params)?;
        Ok(Attention {
            layer,
            backend,
            imp,
        })
    }

    /// The backend it runs on.
    pub fn backend(&self) -> &dyn AttentionBackend {
        self.backend.as_ref()
    }

    /// A shared handle to its backend.
    pub fn backend_ref(&self) -> BackendRef {
        self.backend.clone()
    }

    /// The layer state.
    pub fn layer(&self) -> &AttentionLayer {
        &self.layer
    }

    /// The impl.
    pub fn imp(&self) -> &dyn AttentionImpl {
        self.imp.as_ref()
    }

    /// A metadata builder for this layer's KV-cache group.
    pub fn make_builder(
        &self,
        spec: &crate::kv_cache::KvCacheSpec,
    ) -> Result<Box<dyn AttentionMetadataBuilder>> {
        self.backend.make_builder(spec)
    }

    /// Runs the layer: writes `key` / `value` into the cache, attends, fills `output`.
    pub fn forward(
        &self,
        query: &Tensor,
        key: Option<&Tensor>,
        value: Option<&Tensor>,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
    ) -> Result<()> {
        self.imp
            .forward(&self.layer, query, key, value, kv_cache, metadata, output)
    }
}

impl std::fmt::Debug for Attention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attention")
            .field("layer", &self.layer)
            .field("backend", &self.backend.name())
            .field("params", self.imp.params())
            .finish()
    }
}
