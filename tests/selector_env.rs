//! `POLYATTN_BACKEND` through the global selector (`selector::get_attn_backend`) and the
//! model-facing `Attention::new`. One test in its own file: it sets a process-wide variable
//! and registers a plugin in the global registry, so nothing else may run beside it.

use std::sync::Arc;

use polyattn::backends::cpu::CpuBackend;
use polyattn::selector::{self, BACKEND_ENV};
use polyattn::{
    registry, Attention, AttentionBackend, AttentionImpl, AttentionLayer, AttentionMetadataBuilder,
    AttentionParams, Availability, BackendCapabilities, CacheDType, DType, Device, DeviceKind,
    Error, KvCacheSpec, SelectorConfig,
};

/// The CPU kernels registered as a plugin that outranks every built-in backend.
struct EnvPlugin(CpuBackend);

impl AttentionBackend for EnvPlugin {
    fn name(&self) -> &str {
        "ENVPLUGIN"
    }
    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Other
    }
    fn priority(&self) -> u32 {
        1
    }
    fn availability(&self) -> Availability {
        Availability::Available("test plugin".into())
    }
    fn capabilities(&self) -> &BackendCapabilities {
        self.0.capabilities()
    }
    fn device(&self) -> polyattn::Result<Device> {
        self.0.device()
    }
    fn make_impl(&self, params: AttentionParams) -> polyattn::Result<Box<dyn AttentionImpl>> {
        self.0.make_impl(params)
    }
    fn make_builder(
        &self,
        spec: &KvCacheSpec,
    ) -> polyattn::Result<Box<dyn AttentionMetadataBuilder>> {
        self.0.make_builder(spec)
    }
}

fn name_of(r: polyattn::Result<polyattn::BackendRef>) -> Result<String, String> {
    r.map(|b| b.name().to_string())
        .map_err(|e| format!("{e:?}"))
}

#[test]
fn polyattn_backend_env_forces_and_fails_loudly() {
    let config = SelectorConfig::new(128, DType::F32, CacheDType::Auto);

    // Unset and "auto" (any case) mean automatic selection.
    std::env::remove_var(BACKEND_ENV);
    assert_eq!(selector::forced_backend_from_env(), None);
    let auto = name_of(selector::get_attn_backend(&config)).expect("some backend runs it");
    for v in ["auto", "AUTO", "Auto", "", "  "] {
        std::env::set_var(BACKEND_ENV, v);
        assert_eq!(selector::forced_backend_from_env(), None, "{v:?}");
        assert_eq!(
            name_of(selector::get_attn_backend(&config)),
            Ok(auto.clone())
        );
    }

    // A valid forced backend, any case, surrounding spaces trimmed.
    for v in ["cpu", "CPU", " Cpu "] {
        std::env::set_var(BACKEND_ENV, v);
        assert_eq!(
            name_of(selector::get_attn_backend(&config)),
            Ok("CPU".to_string()),
            "{v:?}"
        );
    }
    // The model-facing layer honours it too.
    std::env::set_var(BACKEND_ENV, "cpu");
    let attn = Attention::new(
        AttentionLayer::new("l0"),
        AttentionParams::new(4, 128, 4),
        DType::F32,
        Some(16),
    )
    .expect("layer on the forced CPU backend");
    assert_eq!(attn.backend().name(), "CPU");

    // Unknown: an error listing the valid names.
    std::env::set_var(BACKEND_ENV, "nosuch");
    match selector::get_attn_backend(&config) {
        Err(Error::UnknownBackend { name, valid }) => {
            assert_eq!(name, "nosuch");
            assert!(valid.iter().any(|v| v == "CPU"), "{valid:?}");
        }
        other => panic!("expected UnknownBackend, got {:?}", name_of(other)),
    }
    assert!(Attention::new(
        AttentionLayer::new("l0"),
        AttentionParams::new(4, 128, 4),
        DType::F32,
        None
    )
    .is_err());

    // Forced but invalid for the configuration: an error with the reasons, no fallback.
    std::env::set_var(BACKEND_ENV, "cpu");
    let head20 = SelectorConfig::new(20, DType::F32, CacheDType::Auto);
    match selector::get_attn_backend(&head20) {
        Err(Error::ForcedBackendInvalid { name, reasons, .. }) => {
            assert_eq!(name, "CPU");
            assert!(reasons.iter().any(|r| r.code == "head_size not supported"));
        }
        other => panic!("expected ForcedBackendInvalid, got {:?}", name_of(other)),
    }

    // A plugin registered globally: it wins automatic selection, can be forced by name, and
    // forcing the built-in still works.
    assert!(registry::register_backend(Arc::new(EnvPlugin(CpuBackend::new()))).is_none());
    std::env::set_var(BACKEND_ENV, "auto");
    assert_eq!(
        name_of(selector::get_attn_backend(&config)),
        Ok("ENVPLUGIN".to_string())
    );
    std::env::set_var(BACKEND_ENV, "envplugin");
    assert_eq!(
        name_of(selector::get_attn_backend(&config)),
        Ok("ENVPLUGIN".to_string())
    );
    std::env::set_var(BACKEND_ENV, "cpu");
    assert_eq!(
        name_of(selector::get_attn_backend(&config)),
        Ok("CPU".to_string())
    );
    let why = selector::explain(&config);
    assert_eq!(why[0].name, "ENVPLUGIN");
    assert!(why.iter().any(|c| c.name == "CPU" && c.is_usable()));
    std::env::remove_var(BACKEND_ENV);
}
