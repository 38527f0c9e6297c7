//! How the WGSL family's modules become SPIR-V when a runtime translates them itself (the
//! wgpu runtime's cooperative-matrix modules, every module of the native Vulkan runtime): naga's
//! writer with every index clamped into its array (`BoundsCheckPolicy::Restrict`: no access
//! can leave its buffer or workgroup array, the guarantee wgpu's own translation gives), so
//! that both runtimes run the same bounds rules; and no zeroing of workgroup memory, which
//! wgpu's pipelines skip too (`zero_initialize_workgroup_memory: false`): every kernel of the
//! family writes its workgroup memory before reading it. Why it matters: naga's zeroing
//! polyfill (a loop over every workgroup array and a barrier at the top of each kernel) made
//! lavapipe compile the family's kernels about ten times slower.

use naga::back::spv;
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};

/// naga's SPIR-V options for the family's modules: SPIR-V 1.3, restricting bounds checks, no
/// workgroup-memory zeroing.
pub(crate) fn spirv_options() -> spv::Options<'static> {
    spv::Options {
        lang_version: (1, 3),
        bounds_check_policies: BoundsCheckPolicies {
            index: BoundsCheckPolicy::Restrict,
            buffer: BoundsCheckPolicy::Restrict,
            image_load: BoundsCheckPolicy::Restrict,
            binding_array: BoundsCheckPolicy::Restrict,
        },
        // Compute modules have no shader I/O, so the `StorageInputOutput16` capability (which
        // NVIDIA's Vulkan driver does not offer) is never needed.
        use_storage_input_output_16: false,
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
        ..Default::default()
    }
}
