//! The compute abstraction every backend implements: a device handle, typed buffers with a
//! shape ([`Tensor`]), upload / download and synchronisation; and the GPU runtimes
//! ([`cuda`], [`wgpu`]), which compile, cache and launch the kernel families of
//! [`crate::kernels`].
//!
//! [`Device`] is a closed enum, as in candle: the set of device families is fixed by the crate,
//! and each GPU backend adds its variant (CUDA, HIP, Vulkan, wgpu) next to the CPU one. Callers
//! only use `Device` and `Tensor` methods, so a new variant changes no caller. Backends reach
//! their own storage through [`Tensor::storage`] / [`Tensor::storage_mut`].

pub mod choice;
pub mod coop_spirv;
mod cpu;
pub mod cuda;
mod disk_cache;
mod graph;
pub mod hip;
mod library;
mod spirv;
mod tensor;
pub mod vulkan;
pub mod wgpu;
pub mod wgsl;

pub use cpu::{CpuDevice, CpuStorage};
pub use cuda::{CudaDevice, CudaGraph, CudaStorage};
pub use graph::DeviceGraph;
pub use hip::{HipDevice, HipStorage};
pub use tensor::{Storage, Tensor};
pub use vulkan::{VulkanDevice, VulkanGraph, VulkanStorage};
pub use wgpu::{WgpuDevice, WgpuStorage};

use crate::error::Result;

/// A compute device that holds tensors and runs kernels.
///
/// Every variant offers the same five operations to [`Tensor`]: `zeros`, `upload`,
/// `download`, `synchronize` and `description`; a new device family adds a variant and those.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    /// The host CPU (multithreaded with rayon).
    Cpu(CpuDevice),
    /// An NVIDIA GPU through the CUDA driver API (cudarc).
    Cuda(CudaDevice),
    /// An AMD GPU through the HIP runtime (ROCm, loaded at run time).
    Hip(HipDevice),
    /// A Vulkan device (a GPU, or lavapipe) through the native Vulkan runtime.
    Vulkan(VulkanDevice),
    /// A GPU (or lavapipe) through wgpu.
    Wgpu(WgpuDevice),
}

/// The device family, without a handle: what the selector ranks and reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum DeviceKind {
    /// NVIDIA through CUDA (PTX via NVRTC).
    Cuda,
    /// AMD through HIP.
    Hip,
    /// Any Vulkan device through SPIR-V (Intel XPU among them).
    Vulkan,
    /// WGSL through wgpu (Metal, DX12, Vulkan, GL).
    Wgpu,
    /// The host CPU.
    Cpu,
    /// A device brought by a plugin backend.
    Other,
}

impl DeviceKind {
    /// Lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cuda => "cuda",
            DeviceKind::Hip => "hip",
            DeviceKind::Vulkan => "vulkan",
            DeviceKind::Wgpu => "wgpu",
            DeviceKind::Cpu => "cpu",
            DeviceKind::Other => "other",
        }
    }
}

impl Device {
    /// The host CPU device.
    pub fn cpu() -> Self {
        Device::Cpu(CpuDevice::new())
    }

    /// The device family.
    pub fn kind(&self) -> DeviceKind {
        match self {
            Device::Cpu(_) => DeviceKind::Cpu,
            Device::Cuda(_) => DeviceKind::Cuda,
            Device::Hip(_) => DeviceKind::Hip,
            Device::Vulkan(_) => DeviceKind::Vulkan,
            Device::Wgpu(_) => DeviceKind::Wgpu,
        }
    }

    /// A one-line description ("cpu: 2 threads, x86_64").
    pub fn description(&self) -> String {
        match self {
            Device::Cpu(c) => c.description(),
            Device::Cuda(d) => d.description(),
            Device::Hip(d) => d.description(),
            Device::Vulkan(d) => d.description(),
            Device::Wgpu(d) => d.description(),
        }
    }

    /// Waits until all work queued on the device has finished. A no-op on the CPU, where
    /// every call returns when its work is done.
    pub fn synchronize(&self) -> Result<()> {
        match self {
            Device::Cpu(_) => Ok(()),
            Device::Cuda(d) => d.synchronize(),
            Device::Hip(d) => d.synchronize(),
            Device::Vulkan(d) => d.synchronize(),
            Device::Wgpu(d) => d.synchronize(),
        }
    }
}
