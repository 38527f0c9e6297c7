//! The wgpu MLA backend's descriptor: the WGSL family's ([`WgslMlaBackend`]) on the wgpu
//! runtime, ranked 410 on a hardware adapter and 1110 on a software one.

use crate::backends::wgsl_family::WgslMlaBackend;
use crate::device::WgpuDevice;

/// The wgpu MLA backend descriptor (name `WGPU_MLA`; ranked beside `WGPU`: after the native
/// MLA backends on a hardware adapter, after `CPU_MLA` on a software one).
pub type WgpuMlaBackend = WgslMlaBackend<WgpuDevice>;
