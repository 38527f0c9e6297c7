//! The wgpu impl: the WGSL family's impl ([`WgslAttentionImpl`]) on the wgpu runtime. Per
//! layer it owns a uniform block of parameter slots, the layer constants (ALiBi slopes and
//! sinks) and a split-KV scratch buffer that grows to the largest batch seen, so a
//! steady-state call allocates no device memory: it writes 1.25 KiB of parameters (only when
//! they differ from the last call's), creates a few bind groups and submits one command
//! buffer without waiting. Host time matters: `polyattn bench` hides only ~85 µs of it (its
//! L2-flush clear on an H200) before it counts as kernel time.

use crate::backends::wgsl_family::{WgslAttentionImpl, WgslPlanKernels, WgslRecording};
use crate::device::WgpuDevice;

/// The wgpu attention impl of one layer.
pub type WgpuAttentionImpl = WgslAttentionImpl<WgpuDevice>;

/// The kernel forms of one wgpu plan.
pub type WgpuPlanKernels = WgslPlanKernels;

/// The dispatches of one wgpu call.
pub type WgpuRecording = WgslRecording<WgpuDevice>;
