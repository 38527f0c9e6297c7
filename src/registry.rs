//! The backend registry: every built-in backend by name, and run-time registration for
//! plugins (vLLM's `AttentionBackendEnum` + `register_backend`).
//!
//! [`BuiltinBackend`] is a closed enum of the backends this crate ships, and lists only those
//! that exist. The [`Registry`] holds descriptors as trait objects, so a plugin can add a new
//! backend or replace a built-in one by registering a descriptor with the same name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::backend::{BackendRef, SelectorConfig};
use crate::backends::cpu::CpuBackend;
use crate::backends::cpu_mla::CpuMlaBackend;
use crate::backends::cuda::CudaBackend;
use crate::backends::cuda_mla::CudaMlaBackend;
use crate::backends::hip::HipBackend;
use crate::backends::hip_mla::HipMlaBackend;
use crate::backends::vulkan::VulkanBackend;
use crate::backends::vulkan_mla::VulkanMlaBackend;
use crate::backends::wgpu::WgpuBackend;
use crate::backends::wgpu_mla::WgpuMlaBackend;

/// The backends shipped with polyattn. GPU backends join this enum as they land.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BuiltinBackend {
    /// Multithreaded CPU kernels in Rust ([`crate::backends::cpu`]).
    Cpu,
    /// MLA (latent cache) on the CPU ([`crate::backends::cpu_mla`]).
    CpuMla,
    /// NVIDIA GPUs through CUDA and NVRTC ([`crate::backends::cuda`]).
    Cuda,
    /// MLA (latent cache) on NVIDIA GPUs ([`crate::backends::cuda_mla`]).
    CudaMla,
    /// AMD GPUs through HIP and hiprtc ([`crate::backends::hip`]).
    Hip,
    /// MLA (latent cache) on AMD GPUs ([`crate::backends::hip_mla`]).
    HipMla,
    /// The WGSL family as SPIR-V on the native Vulkan runtime ([`crate::backends::vulkan`]).
    Vulkan,
    /// MLA (latent cache) in the WGSL family on the native Vulkan runtime
    /// ([`crate::backends::vulkan_mla`]).
    VulkanMla,
    /// WGSL through wgpu: Vulkan, Metal, DX12, GL ([`crate::backends::wgpu`]).
    Wgpu,
    /// MLA (latent cache) in WGSL through wgpu ([`crate::backends::wgpu_mla`]).
    WgpuMla,
}

impl BuiltinBackend {
    /// Every built-in backend.
    pub const ALL: [BuiltinBackend; 10] = [
        BuiltinBackend::Cpu,
        BuiltinBackend::CpuMla,
        BuiltinBackend::Cuda,
        BuiltinBackend::CudaMla,
        BuiltinBackend::Hip,
        BuiltinBackend::HipMla,
        BuiltinBackend::Vulkan,
        BuiltinBackend::VulkanMla,
        BuiltinBackend::Wgpu,
        BuiltinBackend::WgpuMla,
    ];

    /// Its registered name.
    pub const fn name(self) -> &'static str {
        match self {
            BuiltinBackend::Cpu => "CPU",
            BuiltinBackend::CpuMla => "CPU_MLA",
            BuiltinBackend::Cuda => "CUDA",
            BuiltinBackend::CudaMla => "CUDA_MLA",
            BuiltinBackend::Hip => "HIP",
            BuiltinBackend::HipMla => "HIP_MLA",
            BuiltinBackend::Vulkan => "VULKAN",
            BuiltinBackend::VulkanMla => "VULKAN_MLA",
            BuiltinBackend::Wgpu => "WGPU",
            BuiltinBackend::WgpuMla => "WGPU_MLA",
        }
    }

    /// A fresh descriptor.
    pub fn create(self) -> BackendRef {
        match self {
            BuiltinBackend::Cpu => Arc::new(CpuBackend::new()),
            BuiltinBackend::CpuMla => Arc::new(CpuMlaBackend::new()),
            BuiltinBackend::Cuda => Arc::new(CudaBackend::new()),
            BuiltinBackend::CudaMla => Arc::new(CudaMlaBackend::new()),
            BuiltinBackend::Hip => Arc::new(HipBackend::new()),
            BuiltinBackend::HipMla => Arc::new(HipMlaBackend::new()),
            BuiltinBackend::Vulkan => Arc::new(VulkanBackend::new()),
            BuiltinBackend::VulkanMla => Arc::new(VulkanMlaBackend::new()),
            BuiltinBackend::Wgpu => Arc::new(WgpuBackend::new()),
            BuiltinBackend::WgpuMla => Arc::new(WgpuMlaBackend::new()),
        }
    }
}

/// A set of backend descriptors keyed by case-insensitive name, with the selector's cache.
pub struct Registry {
    backends: RwLock<Vec<BackendRef>>,
    /// `(forced name, config) → chosen backend name`; cleared on every registration.
    pub(crate) cache: Mutex<HashMap<(Option<String>, SelectorConfig), String>>,
}

impl Registry {
    /// A registry holding every built-in backend.
    pub fn with_builtins() -> Self {
        Registry {
            backends: RwLock::new(BuiltinBackend::ALL.iter().map(|b| b.create()).collect()),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// An empty registry (for tests and embedders that want full control).
    pub fn empty() -> Self {
        Registry {
            backends: RwLock::new(Vec::new()),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Adds `backend`, replacing any backend of the same name (case-insensitive). Returns the
    /// one it replaced. Clears the selection cache.
    pub fn register(&self, backend: BackendRef) -> Option<BackendRef> {
        let mut list = self.backends.write().unwrap_or_else(|e| e.into_inner());
        let replaced = list
            .iter()
            .position(|b| b.name().eq_ignore_ascii_case(backend.name()))
            .map(|i| list.remove(i));
        list.push(backend);
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clear();
        replaced
    }

    /// The backend called `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<BackendRef> {
        self.backends
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|b| b.name().eq_ignore_ascii_case(name))
            .cloned()
    }

    /// Every backend, best-ranked first (lowest priority value; ties by name).
    pub fn backends(&self) -> Vec<BackendRef> {
        let mut v = self
            .backends
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        v.sort_by(|a, b| {
            a.priority()
                .cmp(&b.priority())
                .then_with(|| a.name().cmp(b.name()))
        });
        v
    }

    /// Every registered name, in ranking order.
    pub fn names(&self) -> Vec<String> {
        self.backends()
            .iter()
            .map(|b| b.name().to_string())
            .collect()
    }
}

/// The process-wide registry the selector uses.
pub fn global() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::with_builtins)
}

/// Registers `backend` in the global registry (vLLM's `register_backend`), replacing a backend
/// of the same name. Returns the replaced descriptor.
pub fn register_backend(backend: BackendRef) -> Option<BackendRef> {
    global().register(backend)
}
