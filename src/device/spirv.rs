//! How the WGSL family's modules become SPIR-V when a runtime translates them itself (the
//! wgpu runtime's cooperative-matrix modules, every module of the native Vulkan runtime): naga's
//! writer with every index clamped into its array (`BoundsCheckPolicy::Restrict`: no access
//! can leave its buffer or workgroup array, the guarantee wgpu's own translation gives), so
//! that both runtimes run the same bounds rules.

use naga::back::spv;
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};

/// naga's SPIR-V options for the family's modules: SPIR-V 1.3, restricting bounds checks.
pub(crate) fn spirv_options() -> spv::Options<'static> {
    spv::Options {
        lang_version: (1, 3),
        bounds_check_policies: BoundsCheckPolicies {
            index: BoundsCheckPolicy::Restrict,
            buffer: BoundsCheckPolicy::Restrict,
            image_load: BoundsCheckPolicy::Restrict,
            binding_array: BoundsCheckPolicy::Restrict,
        },
        ..Default::default()
    }
}
