//! The wgpu backend's metadata builder: the WGSL family's ([`WgslMetadataBuilder`]: device
//! copies of the block table and slot mapping, the work plan built by the first layer of a
//! step and shared by the rest) on wgpu buffers.

use crate::backends::wgsl_family::{self, WgslAttentionMetadata, WgslMetadataBuilder};
use crate::device::WgpuDevice;

/// What the wgpu kernels consume for one batch.
pub type WgpuAttentionMetadata = WgslAttentionMetadata<WgpuDevice>;

/// Builds [`WgpuAttentionMetadata`].
pub type WgpuMetadataBuilder = WgslMetadataBuilder<WgpuDevice>;

/// The work of one step for one layer shape, in wgpu buffers.
pub type Plan = wgsl_family::Plan<WgpuDevice>;

/// A list of work items on the wgpu device.
pub type WorkList = wgsl_family::WorkList<WgpuDevice>;
