//! The wgpu MLA impl: the WGSL family's ([`WgslMlaAttentionImpl`]) on the wgpu runtime. Each
//! call is one command buffer, submitted without waiting (a download waits).

use crate::backends::wgsl_family::WgslMlaAttentionImpl;
use crate::device::WgpuDevice;

/// The wgpu MLA impl of one layer.
pub type WgpuMlaAttentionImpl = WgslMlaAttentionImpl<WgpuDevice>;
