//! The registry and the selector, on fresh registries (no environment, no global state):
//! forced backends (valid, unknown, invalid), automatic selection with every rejection
//! explained, plugins that add or replace backends, unavailable backends, case-insensitive
//! names, and the selection cache being cleared on registration.

use std::sync::Arc;

use polyattn::backends::cpu::CpuBackend;
use polyattn::registry::{BuiltinBackend, Registry};
use polyattn::{
    AttentionBackend, AttentionImpl, AttentionMetadataBuilder, AttentionParams, Availability,
    BackendCapabilities, BackendRef, CacheDType, DType, Device, DeviceKind, Error, KvCacheSpec,
    SelectorConfig,
};

/// A plugin backend: the CPU kernels under another name, priority and availability, with
/// optionally narrower capabilities.
struct Plugin {
    name: &'static str,
    priority: u32,
    availability: Availability,
    caps: BackendCapabilities,
    inner: CpuBackend,
}

impl Plugin {
    fn new(name: &'static str, priority: u32) -> Self {
        let inner = CpuBackend::new();
        Plugin {
            name,
            priority,
            availability: Availability::Available("test plugin".into()),
            caps: inner.capabilities().clone(),
            inner,
        }
    }

    fn unavailable(mut self, why: &str) -> Self {
        self.availability = Availability::Unavailable(why.into());
        self
    }

    fn only_head_sizes(mut self, sizes: &[usize]) -> Self {
        self.caps.head_sizes = polyattn::HeadSizes::List(sizes.to_vec());
        self
    }

    fn arc(self) -> BackendRef {
        Arc::new(self)
    }
}

impl AttentionBackend for Plugin {
    fn name(&self) -> &str {
        self.name
    }
    fn device_kind(&self) -> DeviceKind {
        DeviceKind::Other
    }
    fn priority(&self) -> u32 {
        self.priority
    }
    fn availability(&self) -> Availability {
        self.availability.clone()
    }
    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }
    fn device(&self) -> polyattn::Result<Device> {
        self.inner.device()
    }
    fn make_impl(&self, params: AttentionParams) -> polyattn::Result<Box<dyn AttentionImpl>> {
        self.inner.make_impl(params)
    }
    fn make_builder(
        &self,
        spec: &KvCacheSpec,
    ) -> polyattn::Result<Box<dyn AttentionMetadataBuilder>> {
        self.inner.make_builder(spec)
    }
}

/// A registry holding only the CPU backend: automatic selection on it does not depend on
/// which GPU backends this machine has.
fn cpu_only() -> Registry {
    let r = Registry::empty();
    r.register(BuiltinBackend::Cpu.create());
    r
}

fn llama() -> SelectorConfig {
    let mut c = SelectorConfig::new(128, DType::Bf16, CacheDType::Auto);
    c.block_size = Some(16);
    c
}

/// A configuration no built-in backend supports (head size 20 is not a multiple of 8).
fn head20() -> SelectorConfig {
    SelectorConfig::new(20, DType::F32, CacheDType::Auto)
}

#[test]
fn forced_valid_backend_is_used() {
    let r = Registry::with_builtins();
    for name in ["cpu", "CPU", "Cpu", "cPu"] {
        let b = r.select(&llama(), Some(name)).expect("CPU is valid");
        assert_eq!(b.name(), "CPU", "forced {name}");
    }
    assert!(r.get("cpu").is_some() && r.get("CpU").is_some());
}

#[test]
fn forced_unknown_backend_lists_valid_names() {
    let r = Registry::with_builtins();
    match r.select(&llama(), Some("nosuch")) {
        Err(Error::UnknownBackend { name, valid }) => {
            assert_eq!(name, "nosuch");
            assert_eq!(valid, r.names());
            assert!(valid.iter().any(|v| v == "CPU"), "{valid:?}");
            let msg = Error::UnknownBackend { name, valid }.to_string();
            assert!(msg.contains("nosuch") && msg.contains("CPU"), "{msg}");
        }
        other => panic!(
            "expected UnknownBackend, got {:?}",
            other.map(|b| b.name().to_string())
        ),
    }
}

#[test]
fn forced_invalid_backend_is_an_error_with_reasons() {
    let r = Registry::with_builtins();
    match r.select(&head20(), Some("cpu")) {
        Err(Error::ForcedBackendInvalid {
            name,
            reasons,
            valid,
        }) => {
            assert_eq!(name, "CPU");
            assert!(
                reasons.iter().any(|x| x.code == "head_size not supported"),
                "{reasons:?}"
            );
            assert!(valid.iter().any(|v| v == "CPU"));
        }
        other => panic!(
            "expected ForcedBackendInvalid, got {:?}",
            other.map(|b| b.name().to_string())
        ),
    }
    // No silent fallback even when another backend could run it.
    let r = cpu_only();
    r.register(Plugin::new("ANYHEAD", 2000).only_head_sizes(&[20]).arc());
    assert!(r.select(&head20(), None).is_ok());
    assert!(matches!(
        r.select(&head20(), Some("cpu")),
        Err(Error::ForcedBackendInvalid { .. })
    ));
}

#[test]
fn nothing_fits_lists_every_backend_with_reasons() {
    let r = cpu_only();
    r.register(Plugin::new("NARROW", 500).only_head_sizes(&[64]).arc());
    r.register(
        Plugin::new("GHOST", 1)
            .unavailable("libghost.so not found")
            .arc(),
    );
    match r.select(&head20(), None) {
        Err(Error::NoValidBackend { config, rejected }) => {
            assert!(config.contains("head_size=20"), "{config}");
            let names: Vec<&str> = rejected.iter().map(|(n, _)| n.as_str()).collect();
            // Every backend, in ranking order.
            assert_eq!(
                names,
                r.names().iter().map(String::as_str).collect::<Vec<_>>()
            );
            for (name, reasons) in &rejected {
                assert!(!reasons.is_empty(), "{name} rejected without a reason");
            }
            let ghost = &rejected.iter().find(|(n, _)| n == "GHOST").unwrap().1;
            assert!(
                ghost
                    .iter()
                    .any(|x| x.code == "backend unavailable" && x.detail.contains("libghost.so")),
                "{ghost:?}"
            );
            let cpu = &rejected.iter().find(|(n, _)| n == "CPU").unwrap().1;
            assert!(cpu.iter().any(|x| x.code == "head_size not supported"));
            let msg = Error::NoValidBackend {
                config: config.clone(),
                rejected: rejected.clone(),
            }
            .to_string();
            assert!(
                msg.contains("GHOST") && msg.contains("NARROW") && msg.contains("CPU"),
                "{msg}"
            );
        }
        other => panic!(
            "expected NoValidBackend, got {:?}",
            other.map(|b| b.name().to_string())
        ),
    }
}

#[test]
fn plugin_with_better_priority_is_selected() {
    let r = cpu_only();
    assert_eq!(r.select(&llama(), None).unwrap().name(), "CPU");
    assert!(r.register(Plugin::new("FASTPLUGIN", 50).arc()).is_none());
    // The cache from the first selection was cleared by the registration.
    assert_eq!(r.select(&llama(), None).unwrap().name(), "FASTPLUGIN");
    assert_eq!(r.names()[0], "FASTPLUGIN");
    // A configuration the plugin cannot run falls through to the CPU.
    r.register(Plugin::new("FASTPLUGIN", 50).only_head_sizes(&[64]).arc());
    assert_eq!(r.select(&llama(), None).unwrap().name(), "CPU");
    let mut c64 = llama();
    c64.head_size = 64;
    assert_eq!(r.select(&c64, None).unwrap().name(), "FASTPLUGIN");
}

#[test]
fn plugin_with_the_same_name_replaces_the_builtin() {
    let r = Registry::with_builtins();
    let before = r.names().len();
    let replaced = r
        .register(Plugin::new("cpu", 1000).only_head_sizes(&[128]).arc())
        .expect("the built-in CPU backend is replaced");
    assert_eq!(replaced.name(), "CPU");
    assert_eq!(r.names().len(), before);
    let now = r.get("CPU").unwrap();
    assert_eq!(now.name(), "cpu");
    assert_eq!(now.device_kind(), DeviceKind::Other);
    // The replacement's capabilities are the ones used.
    assert!(r.select(&llama(), Some("CPU")).is_ok());
    let mut c64 = llama();
    c64.head_size = 64;
    assert!(matches!(
        r.select(&c64, Some("CPU")),
        Err(Error::ForcedBackendInvalid { .. })
    ));
}

#[test]
fn unavailable_backend_is_skipped_with_its_reason() {
    let r = cpu_only();
    r.register(Plugin::new("GHOST", 1).unavailable("no driver").arc());
    assert_eq!(r.select(&llama(), None).unwrap().name(), "CPU");
    let why = r.explain(&llama());
    let ghost = why.iter().find(|c| c.name == "GHOST").unwrap();
    assert!(!ghost.is_usable());
    assert_eq!(
        ghost.availability,
        Availability::Unavailable("no driver".into())
    );
    assert!(
        ghost.reasons.is_empty(),
        "the config itself is fine: {:?}",
        ghost.reasons
    );
    assert!(why.iter().find(|c| c.name == "CPU").unwrap().is_usable());
    // Forcing it is an error naming the reason.
    match r.select(&llama(), Some("ghost")) {
        Err(Error::ForcedBackendInvalid { reasons, .. }) => {
            assert!(reasons
                .iter()
                .any(|x| x.code == "backend unavailable" && x.detail == "no driver"));
        }
        other => panic!(
            "expected ForcedBackendInvalid, got {:?}",
            other.map(|b| b.name().to_string())
        ),
    }
}

#[test]
fn explain_ranks_and_reasons() {
    let r = cpu_only();
    r.register(Plugin::new("A_PLUGIN", 1000).arc());
    let why = r.explain(&head20());
    let names: Vec<&str> = why.iter().map(|c| c.name.as_str()).collect();
    // Equal priority: ties broken by name.
    assert_eq!(names, ["A_PLUGIN", "CPU"]);
    assert!(why.iter().all(|c| !c.is_usable() && !c.reasons.is_empty()));
}

#[test]
fn cache_is_per_configuration_and_forced_name() {
    let r = cpu_only();
    r.register(Plugin::new("FIRST", 10).only_head_sizes(&[64]).arc());
    let mut c64 = llama();
    c64.head_size = 64;
    assert_eq!(r.select(&c64, None).unwrap().name(), "FIRST");
    assert_eq!(r.select(&llama(), None).unwrap().name(), "CPU");
    assert_eq!(r.select(&c64, Some("cpu")).unwrap().name(), "CPU");
    // Cached answers stay right.
    assert_eq!(r.select(&c64, None).unwrap().name(), "FIRST");
    assert_eq!(r.select(&c64, Some("CPU")).unwrap().name(), "CPU");
    // Registration clears the cache: a better backend wins at once.
    r.register(Plugin::new("BEST", 5).arc());
    assert_eq!(r.select(&c64, None).unwrap().name(), "BEST");
    assert_eq!(r.select(&llama(), None).unwrap().name(), "BEST");
}

#[test]
fn empty_registry_has_no_valid_backend() {
    let r = Registry::empty();
    assert!(matches!(
        r.select(&llama(), None),
        Err(Error::NoValidBackend { rejected, .. }) if rejected.is_empty()
    ));
    assert!(matches!(
        r.select(&llama(), Some("cpu")),
        Err(Error::UnknownBackend { valid, .. }) if valid.is_empty()
    ));
}

/// Forcing the unavailable backend `name` is `ForcedBackendInvalid` with its unavailability
/// `reason` among the reasons.
fn forcing_says_unavailable(r: &Registry, config: &SelectorConfig, name: &str, reason: &str) {
    match r.select(config, Some(name)) {
        Err(Error::ForcedBackendInvalid { reasons, .. }) => {
            assert!(reasons
                .iter()
                .any(|x| x.code == "backend unavailable" && x.detail == reason));
        }
        other => panic!(
            "expected ForcedBackendInvalid, got {:?}",
            other.map(|b| b.name().to_string())
        ),
    }
}

#[test]
fn default_ranking_puts_hip_right_after_cuda() {
    let r = Registry::with_builtins();
    let why = r.explain(&llama());
    // Among the standard backends (the MLA ones rank beside their device's, for MLA layers).
    let names: Vec<&str> = why
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| !n.ends_with("_MLA"))
        .collect();
    let at = |n: &str| {
        names
            .iter()
            .position(|x| *x == n)
            .unwrap_or_else(|| panic!("{n} is not ranked: {names:?}"))
    };
    assert_eq!(at("HIP"), at("CUDA") + 1, "{names:?}");
    assert!(at("HIP") < at("WGPU") && at("HIP") < at("CPU"), "{names:?}");
    if let Some(v) = names.iter().position(|x| x.eq_ignore_ascii_case("VULKAN")) {
        assert!(at("HIP") < v, "{names:?}");
    }
    let hip = why.iter().find(|c| c.name == "HIP").unwrap();
    assert_eq!(hip.priority, 200);
    assert_eq!(BuiltinBackend::Hip.name(), "HIP");
    assert_eq!(BuiltinBackend::Hip.create().device_kind(), DeviceKind::Hip);
    match &hip.availability {
        // Without an AMD GPU (this repository's machines): the reason names the cause.
        Availability::Unavailable(reason) => {
            assert!(
                reason.contains("no AMD GPU")
                    || reason.contains("libamdhip64")
                    || reason.contains("AMD GPU 0"),
                "{reason}"
            );
            assert!(!hip.is_usable());
            assert!(r.select(&llama(), None).unwrap().name() != "HIP");
            forcing_says_unavailable(&r, &llama(), "hip", reason);
        }
        Availability::Available(dev) => eprintln!("an AMD GPU is here: {dev}"),
    }
}

#[test]
fn mla_ranking_follows_the_standard_one() {
    let r = Registry::with_builtins();
    let mut deepseek = SelectorConfig::new(576, DType::Bf16, CacheDType::Auto);
    deepseek.use_mla = true;
    deepseek.block_size = Some(64);
    let why = r.explain(&deepseek);
    let prio = |n: &str| {
        why.iter()
            .find(|c| c.name == n)
            .unwrap_or_else(|| panic!("{n} is not ranked"))
            .priority
    };
    // Native paths first (CUDA, then HIP), then wgpu (after the CPU on a software adapter).
    assert_eq!(prio("CUDA_MLA"), 110);
    assert_eq!(prio("HIP_MLA"), 210);
    assert!(prio("HIP_MLA") < prio("WGPU_MLA") && prio("HIP_MLA") < prio("CPU_MLA"));
    assert_eq!(BuiltinBackend::HipMla.name(), "HIP_MLA");
    assert_eq!(
        BuiltinBackend::HipMla.create().device_kind(),
        DeviceKind::Hip
    );
    let hip = why.iter().find(|c| c.name == "HIP").unwrap();
    let hip_mla = why.iter().find(|c| c.name == "HIP_MLA").unwrap();
    // One probe: HIP_MLA is available exactly when HIP is, for the same reason.
    assert_eq!(hip_mla.availability, hip.availability);
    if let Availability::Unavailable(reason) = &hip_mla.availability {
        assert!(!hip_mla.is_usable());
        forcing_says_unavailable(&r, &deepseek, "hip_mla", reason);
    }
}

/// VULKAN ranks between HIP and WGPU on a GPU, and after the CPU backend (before wgpu's
/// software adapter) on a CPU implementation such as lavapipe; forcing it picks it wherever
/// it is available; an MLA layer never goes to it (it declares no MLA) but to VULKAN_MLA,
/// ranked ten places after it.
#[test]
fn vulkan_ranks_between_hip_and_wgpu() {
    let r = Registry::with_builtins();
    let why = r.explain(&llama());
    let find = |n: &str| {
        why.iter()
            .find(|c| c.name == n)
            .unwrap_or_else(|| panic!("{n} is not ranked"))
    };
    let vk = find("VULKAN");
    assert_eq!(BuiltinBackend::Vulkan.name(), "VULKAN");
    assert_eq!(
        BuiltinBackend::Vulkan.create().device_kind(),
        DeviceKind::Vulkan
    );
    assert!(vk.priority == 300 || vk.priority == 1050, "{}", vk.priority);
    assert!(find("HIP").priority < vk.priority);
    match &vk.availability {
        Availability::Available(dev) => {
            let software = dev.contains("CPU implementation");
            assert_eq!(vk.priority, if software { 1050 } else { 300 }, "{dev}");
            if software {
                assert!(find("CPU").priority < vk.priority, "{dev}");
            } else {
                assert!(vk.priority < find("WGPU").priority, "{dev}");
            }
            let forced = r.select(&llama(), Some("vulkan")).unwrap();
            assert_eq!(forced.name(), "VULKAN");
        }
        Availability::Unavailable(reason) => {
            assert!(!vk.is_usable());
            forcing_says_unavailable(&r, &llama(), "vulkan", reason);
        }
    }
    let mut deepseek = SelectorConfig::new(576, DType::Bf16, CacheDType::Auto);
    deepseek.use_mla = true;
    deepseek.block_size = Some(64);
    let mla = r.explain(&deepseek);
    let rank = |n: &str| mla.iter().find(|c| c.name == n).unwrap().priority;
    assert_eq!(rank("VULKAN_MLA"), vk.priority + 10);
    assert!(rank("HIP_MLA") < rank("VULKAN_MLA"));
    if vk.priority == 300 {
        assert!(rank("VULKAN_MLA") < rank("WGPU_MLA"));
    }
    let vk_mla = mla.iter().find(|c| c.name == "VULKAN").unwrap();
    assert!(!vk_mla.is_usable());
    if vk_mla.availability.is_available() {
        assert!(
            vk_mla
                .reasons
                .iter()
                .any(|r| r.to_string().contains("MLA not supported")),
            "{:?}",
            vk_mla.reasons
        );
    }
}
