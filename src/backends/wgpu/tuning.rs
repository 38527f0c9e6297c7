//! The tuning a wgpu layer runs with: the WGSL family's knobs ([`WgpuTuning`],
//! `crate::kernels::wgsl::tuning`) for the kind of adapter the device opened.

pub use crate::kernels::wgsl::tuning::*;

use crate::device::WgpuDevice;

impl WgpuTuning {
    /// The tuning a layer on `dev` runs with: [`WgpuTuning::for_adapter`] for the device's
    /// adapter kind (a CPU adapter or a GPU, with or without subgroups).
    pub fn for_device(dev: &WgpuDevice) -> Self {
        let cpu = dev.adapter_info().device_type == wgpu::DeviceType::Cpu;
        Self::for_adapter(cpu, dev.has_subgroups())
    }
}
