//! What the WGSL family's SPIR-V may use on a physical device, read from its properties and
//! features before the device is created (the features found are then enabled):
//!
//! * subgroups: Vulkan 1.1's subgroup operations in compute shaders, with every operation
//!   class naga's subgroup built-ins translate to (basic, vote, arithmetic, ballot, shuffle,
//!   relative shuffle) — what wgpu's `SUBGROUP` feature asks of a Vulkan device;
//! * the subgroup sizes a compute dispatch may run with (Vulkan 1.3's subgroup-size-control
//!   range, else the one size of the device), and the one size pipelines require where the
//!   device lets a compute stage require it (`subgroupSizeControl`, then enabled; which size:
//!   [`preferred_subgroup_size`]), with the largest workgroup that size allows
//!   (`maxComputeWorkgroupSubgroups` of them). WGSL cannot ask for a subgroup size, and a
//!   kernel that knows its subgroup's size exactly can give each key group a whole subgroup
//!   (on a device whose compiler may pick 8, 16 or 32 lanes the family's decode kernel
//!   otherwise has to plan for 8);
//! * f16: `shaderFloat16` with 16-bit storage-buffer and uniform access (naga declares both
//!   access capabilities for every module that has an f16 type);
//! * cooperative matrices: `VK_KHR_cooperative_matrix` offering the 16 × 16 × 16 f16 × f16 →
//!   f32 configuration in subgroup scope (the family's coop prefill form), with Vulkan 1.2's
//!   memory model at device scope (naga writes a module that uses cooperative matrices under
//!   `MemoryModel Vulkan`), f16 and subgroups; `POLYATTN_WGPU_COOP=0` turns them off here as
//!   on the wgpu runtime;
//! * bf16 cooperative matrices: the same with `VK_KHR_shader_bfloat16` (the bfloat16 type and
//!   its cooperative matrices) and the 16 × 16 × 16 bf16 × bf16 → f32 configuration, for the
//!   coop form over bf16 (ash predates the extension: its feature struct is declared here);
//! * binding arrays of storage buffers indexed by any value (`shaderStorageBufferArrayDynamicIndexing`
//!   and Vulkan 1.2's `shaderStorageBufferArrayNonUniformIndexing`): a tensor larger than one
//!   buffer (a KV cache past one binding) is bound as an array of its chunks on every Vulkan
//!   device, indexed directly where these are offered and through a `switch` of constant
//!   indices (core Vulkan) where not;
//! * the largest single allocation (Vulkan 1.1's `maxMemoryAllocationSize`), which bounds a
//!   chunk;
//! * `VK_KHR_push_descriptor` and its `maxPushDescriptors`: a dispatch's buffers recorded
//!   into its command buffer, with no descriptor set to allocate and update.

use ash::vk;

/// The shader features of one physical device (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ShaderFeatures {
    /// The Vulkan version polyattn uses it at: the device's, at most the instance's 1.3.
    pub api: u32,
    pub subgroups: bool,
    pub subgroup_sizes: (u32, u32),
    /// The subgroup size pipelines can require and the most invocations a workgroup may
    /// then have (`subgroupSizeControl`, which is then enabled), or `None` where the device
    /// cannot require one (see the module docs).
    pub required_subgroup_size: Option<(u32, u32)>,
    pub f16: bool,
    /// The coop form's cooperative matrices (see the module docs); the extension and
    /// features are enabled with the device when set.
    pub coop: bool,
    /// bf16 cooperative matrices as well (implies `coop`); `VK_KHR_shader_bfloat16` is
    /// enabled with the device when set.
    pub coop_bf16: bool,
    /// Storage-buffer binding arrays indexed by non-uniform values; the features are enabled
    /// with the device when set.
    pub array_any_index: bool,
    /// The largest single allocation in bytes (`maxMemoryAllocationSize`; `u64::MAX` before
    /// Vulkan 1.1).
    pub max_allocation: u64,
    /// Descriptors one push may set (`maxPushDescriptors`); 0 without
    /// `VK_KHR_push_descriptor`.
    pub max_push_descriptors: u32,
}

/// `VK_KHR_push_descriptor`.
pub(crate) const PUSH_EXTENSION: &std::ffi::CStr = ash::khr::push_descriptor::NAME;

/// `VK_KHR_shader_bfloat16`.
pub(crate) const BF16_EXTENSION: &std::ffi::CStr = c"VK_KHR_shader_bfloat16";

/// `VkPhysicalDeviceShaderBfloat16FeaturesKHR` (not in ash 0.38, which predates it).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bfloat16Features {
    s_type: vk::StructureType,
    p_next: *mut std::ffi::c_void,
    pub shader_bfloat16_type: vk::Bool32,
    pub shader_bfloat16_dot_product: vk::Bool32,
    pub shader_bfloat16_cooperative_matrix: vk::Bool32,
}

impl Default for Bfloat16Features {
    fn default() -> Self {
        Bfloat16Features {
            // VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR.
            s_type: vk::StructureType::from_raw(1_000_141_000),
            p_next: std::ptr::null_mut(),
            shader_bfloat16_type: vk::FALSE,
            shader_bfloat16_dot_product: vk::FALSE,
            shader_bfloat16_cooperative_matrix: vk::FALSE,
        }
    }
}

// SAFETY: the struct has the layout Vulkan defines for it (sType and pNext first), and the
// specification lets it extend both structures.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for Bfloat16Features {}
// SAFETY: as above.
unsafe impl vk::ExtendsDeviceCreateInfo for Bfloat16Features {}

/// `VK_COMPONENT_TYPE_BFLOAT16_KHR`.
const COMPONENT_BF16: vk::ComponentTypeKHR = vk::ComponentTypeKHR::from_raw(1_000_141_000);

/// The extension of the coop form's cooperative matrices.
pub(crate) const COOP_EXTENSION: &std::ffi::CStr = ash::khr::cooperative_matrix::NAME;

impl ShaderFeatures {
    /// Reads the features of `physical`.
    ///
    /// # Safety
    /// `physical` must come from `instance` (of `entry`), created for Vulkan 1.3.
    pub(crate) unsafe fn query(
        entry: &ash::Entry,
        instance: &ash::Instance,
        physical: vk::PhysicalDevice,
        props: &vk::PhysicalDeviceProperties,
    ) -> ShaderFeatures {
        let api = props.api_version.min(vk::API_VERSION_1_3);
        if api < vk::API_VERSION_1_1 {
            return ShaderFeatures {
                api,
                subgroups: false,
                subgroup_sizes: (1, 1),
                required_subgroup_size: None,
                f16: false,
                coop: false,
                coop_bf16: false,
                array_any_index: false,
                max_allocation: u64::MAX,
                max_push_descriptors: 0,
            };
        }
        let mut sub = vk::PhysicalDeviceSubgroupProperties::default();
        let mut size_control = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
        let mut maintenance3 = vk::PhysicalDeviceMaintenance3Properties::default();
        let mut props2 = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut sub)
            .push_next(&mut maintenance3);
        if api >= vk::API_VERSION_1_3 {
            props2 = props2.push_next(&mut size_control);
        }
        instance.get_physical_device_properties2(physical, &mut props2);
        let needed = vk::SubgroupFeatureFlags::BASIC
            | vk::SubgroupFeatureFlags::VOTE
            | vk::SubgroupFeatureFlags::ARITHMETIC
            | vk::SubgroupFeatureFlags::BALLOT
            | vk::SubgroupFeatureFlags::SHUFFLE
            | vk::SubgroupFeatureFlags::SHUFFLE_RELATIVE;
        let subgroups = sub.supported_stages.contains(vk::ShaderStageFlags::COMPUTE)
            && sub.supported_operations.contains(needed);
        let subgroup_sizes = if api >= vk::API_VERSION_1_3 && size_control.min_subgroup_size > 0 {
            (
                size_control.min_subgroup_size,
                size_control.max_subgroup_size,
            )
        } else {
            (sub.subgroup_size, sub.subgroup_size)
        };
        let extensions = instance
            .enumerate_device_extension_properties(physical)
            .unwrap_or_default();
        let has = |name: &std::ffi::CStr| {
            extensions
                .iter()
                .any(|e| e.extension_name_as_c_str().ok() == Some(name))
        };
        let max_push_descriptors = if has(PUSH_EXTENSION) {
            let mut push = vk::PhysicalDevicePushDescriptorPropertiesKHR::default();
            let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut push);
            instance.get_physical_device_properties2(physical, &mut props2);
            push.max_push_descriptors
        } else {
            0
        };
        let has_coop_extension = has(COOP_EXTENSION);
        let has_bf16_extension = has_coop_extension && has(BF16_EXTENSION);
        let mut size_control_feature = false;
        let (f16, memory_model, coop_feature, bf16_feature, array_any_index) =
            if api >= vk::API_VERSION_1_2 {
                let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
                let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
                let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
                let mut fcoop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
                let mut fbf16 = Bfloat16Features::default();
                let mut features = vk::PhysicalDeviceFeatures2::default()
                    .push_next(&mut f11)
                    .push_next(&mut f12);
                if api >= vk::API_VERSION_1_3 {
                    features = features.push_next(&mut f13);
                }
                if has_coop_extension {
                    features = features.push_next(&mut fcoop);
                }
                if has_bf16_extension {
                    features = features.push_next(&mut fbf16);
                }
                instance.get_physical_device_features2(physical, &mut features);
                let dynamic_indexing = features
                    .features
                    .shader_storage_buffer_array_dynamic_indexing
                    == vk::TRUE;
                size_control_feature = f13.subgroup_size_control == vk::TRUE;
                (
                    f12.shader_float16 == vk::TRUE
                        && f11.storage_buffer16_bit_access == vk::TRUE
                        && f11.uniform_and_storage_buffer16_bit_access == vk::TRUE,
                    f12.vulkan_memory_model == vk::TRUE
                        && f12.vulkan_memory_model_device_scope == vk::TRUE,
                    fcoop.cooperative_matrix == vk::TRUE,
                    fbf16.shader_bfloat16_type == vk::TRUE
                        && fbf16.shader_bfloat16_cooperative_matrix == vk::TRUE,
                    dynamic_indexing
                        && f12.shader_storage_buffer_array_non_uniform_indexing == vk::TRUE,
                )
            } else {
                (false, false, false, false, false)
            };
        let wanted = std::env::var(crate::device::wgpu::COOP_ENV).map_or(true, |v| v.trim() != "0");
        let coop = wanted
            && has_coop_extension
            && coop_feature
            && memory_model
            && f16
            && subgroups
            && coop_configuration(entry, instance, physical, vk::ComponentTypeKHR::FLOAT16);
        let coop_bf16 = coop
            && has_bf16_extension
            && bf16_feature
            && coop_configuration(entry, instance, physical, COMPONENT_BF16);
        let stage_controls = size_control
            .required_subgroup_size_stages
            .contains(vk::ShaderStageFlags::COMPUTE);
        let required_subgroup_size = (subgroups && size_control_feature && stage_controls)
            .then(|| preferred_subgroup_size(subgroup_sizes))
            .flatten()
            .map(|size| {
                let most =
                    u64::from(size_control.max_compute_workgroup_subgroups) * u64::from(size);
                (size, most.min(u64::from(u32::MAX)) as u32)
            });
        ShaderFeatures {
            api,
            subgroups,
            subgroup_sizes,
            required_subgroup_size,
            f16,
            coop,
            coop_bf16,
            array_any_index,
            max_allocation: maintenance3.max_memory_allocation_size,
            max_push_descriptors,
        }
    }
}

/// The subgroup size to require of pipelines on a device whose compute subgroups may have
/// `min..=max` lanes: the largest power of two in the range up to 32 (the width the family's
/// kernels are planned for: an NVIDIA warp, AMD's wave32, Intel's widest SIMD), else the
/// smallest (a device of 64 lanes only). `None` for a range without a power of two (no
/// device reports one).
pub(crate) fn preferred_subgroup_size((min, max): (u32, u32)) -> Option<u32> {
    if min == 0 || min > max {
        return None;
    }
    let fits = |s: &u32| (min..=max).contains(s);
    let up_to_32 = (0..=5).rev().map(|e| 1u32 << e).find(fits);
    up_to_32.or_else(|| (6..=10).map(|e| 1u32 << e).find(fits))
}

/// Whether `physical` offers the coop form's configuration for inputs of `ab`: 16 × 16 × 16,
/// `ab` A / B, f32 C and result, subgroup scope.
///
/// # Safety
/// `physical` must come from `instance` (of `entry`), which offers `VK_KHR_cooperative_matrix`.
unsafe fn coop_configuration(
    entry: &ash::Entry,
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    ab: vk::ComponentTypeKHR,
) -> bool {
    let coop = ash::khr::cooperative_matrix::Instance::new(entry, instance);
    coop.get_physical_device_cooperative_matrix_properties(physical)
        .unwrap_or_default()
        .iter()
        .any(|p| {
            p.m_size == 16
                && p.n_size == 16
                && p.k_size == 16
                && p.a_type == ab
                && p.b_type == ab
                && p.c_type == vk::ComponentTypeKHR::FLOAT32
                && p.result_type == vk::ComponentTypeKHR::FLOAT32
                && p.scope == vk::ScopeKHR::SUBGROUP
        })
}

#[cfg(test)]
mod tests {
    use super::preferred_subgroup_size;

    #[test]
    fn the_required_size_is_the_widest_up_to_32() {
        // NVIDIA, lavapipe, Intel (SIMD8..32), AMD RDNA (wave32 / wave64), AMD CDNA, Arm.
        assert_eq!(preferred_subgroup_size((32, 32)), Some(32));
        assert_eq!(preferred_subgroup_size((8, 8)), Some(8));
        assert_eq!(preferred_subgroup_size((8, 32)), Some(32));
        assert_eq!(preferred_subgroup_size((32, 64)), Some(32));
        assert_eq!(preferred_subgroup_size((64, 64)), Some(64));
        assert_eq!(preferred_subgroup_size((4, 16)), Some(16));
        assert_eq!(preferred_subgroup_size((0, 32)), None);
        assert_eq!(preferred_subgroup_size((33, 63)), None);
    }
}
