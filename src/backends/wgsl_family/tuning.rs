//! The tuning a WGSL-family layer runs with: the family's knobs ([`WgpuTuning`],
//! `crate::kernels::wgsl::tuning`) for the kind of device the runtime opened.

pub use crate::kernels::wgsl::tuning::*;

use crate::device::wgsl::WgslDeviceInfo;

impl WgpuTuning {
    /// The tuning a layer on a device runs with: [`WgpuTuning::for_adapter`] for its kind (a
    /// CPU implementation or a GPU, with or without subgroups).
    pub fn for_device(info: &WgslDeviceInfo) -> Self {
        Self::for_adapter(info.is_cpu, info.subgroups)
    }
}
