//! The native Vulkan runtime (`ash`): one physical device, a compute queue, device-local
//! buffers through `gpu-allocator`, compute pipelines from the WGSL family's modules
//! translated to SPIR-V by naga, and dispatches recorded into command buffers that run ahead
//! of the host.
//! It knows nothing of the backends that will choose its kernels.
//!
//! **Loading.** The Vulkan loader (`libvulkan.so.1`, `vulkan-1.dll`) is opened at run time
//! (ash's `loaded` feature): building needs no Vulkan SDK, and a machine without a loader or
//! a device gets "unavailable: `<reason>`" from [`VulkanDevice::open`], never a panic.
//!
//! **Device choice.** Physical devices with a compute queue are ranked discrete, integrated,
//! virtual, other, CPU (so a GPU comes before a software implementation such as lavapipe),
//! then by enumeration order; the first is opened, unless `POLYATTN_DEVICE` (the variable the
//! wgpu runtime reads too: an index into that ranking, or a case-insensitive substring of a
//! device name) names another. A value that matches nothing is an error listing the devices.
//!
//! **Validation.** [`VulkanOptions::validation`] enables the Khronos validation layer
//! (`VK_LAYER_KHRONOS_validation`, Debian's `vulkan-validationlayers`) with a
//! `VK_EXT_debug_utils` messenger that counts and records every error the layer reports
//! ([`VulkanDevice::validation_errors`]); the tests fail on any. Opening with validation on a
//! machine without the layer is an error that says so.
//!
//! **Memory.** Buffers are device-local ([`buffer`]); uploads and downloads go through a
//! host-visible staging buffer and a copy on the queue, so the same code is right on a
//! discrete GPU (whose device-local memory the host cannot map) and on lavapipe.
//!
//! **Work.** Submissions go to one compute queue in order (`queue.rs`): the WGSL family's
//! dispatches (a layer's forward, a model op, a graph replay) return once the queue has them,
//! holding what they bind until they finish, with at most 16 pending; uploads, fills and
//! copies wait for their own submission, downloads for theirs (so a download sees every
//! earlier dispatch), and [`VulkanStorage`]'s `synchronize` waits for all.
//! [`VulkanDevice::dispatch`] and [`VulkanDevice::run`] record dispatches with their
//! descriptor sets (the module's bindings, reflected from naga's IR: uniform or storage
//! buffers of group 0) and wait for them. [`VulkanDevice::record`] records several
//! dispatches once (barriers between them) into a [`Recording`] that
//! [`VulkanDevice::submit`] re-submits; where the compute queue has timestamps, a recording
//! brackets its dispatches with two and [`VulkanDevice::submit_timed`] returns the device
//! time between them (the benchmark's ceilings). Captured graphs of the WGSL family's
//! submissions are [`VulkanDevice::capture`]'s ([`VulkanGraph`]).
//!
//! **Beyond WGSL.** Where the device offers them, `VK_KHR_cooperative_matrix` (f16) and
//! `VK_KHR_shader_bfloat16` (bf16) are enabled for the coop prefill form, whose SPIR-V is
//! patched after naga (`device/coop_spirv.rs`).
//!
//! **Pipeline cache.** The driver's compiled pipelines persist across runs in
//! `<cache dir>/vulkan/<vendor>-<device>-<pipeline cache UUID>.pipelines` (the kernel cache
//! directory of the other runtimes: `POLYATTN_CACHE_DIR`, else the XDG cache), loaded when the
//! device opens and saved when it closes; a driver update changes the UUID, so a stale file
//! is never used.

pub mod buffer;
mod features;
mod graph;
pub mod pipeline;
mod queue;
mod runtime;
mod storage;

use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock};

use ash::vk;
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};

use features::ShaderFeatures;
pub(crate) use queue::QueueState;

use crate::error::{Error, Result};

pub use buffer::VulkanBuffer;
pub use graph::VulkanGraph;
pub use runtime::VulkanParams;
pub use storage::VulkanStorage;

use crate::device::wgsl::WgslDeviceInfo;
pub use pipeline::{BindingKind, ComputePipeline, ModuleBinding, Recording, Step};

/// How [`VulkanDevice::open`] opens the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VulkanOptions {
    /// Enable the Khronos validation layer and record its errors.
    pub validation: bool,
    /// Record a dispatch's buffers with `VK_KHR_push_descriptor` where the device offers it
    /// (the process device does); off, every dispatch allocates and writes a descriptor set.
    pub push_descriptors: bool,
    /// Require one subgroup size of every pipeline where the device can (the process device
    /// does; `features::preferred_subgroup_size` says which): kernels then plan for exactly
    /// that size. Off, the driver picks a size within the device's range per pipeline.
    pub subgroup_size_control: bool,
}

/// What the validation messenger collected.
#[derive(Debug, Default)]
struct Messages {
    errors: Vec<String>,
}

/// An opened Vulkan device with one compute queue. Cheap to clone (shared handles).
#[derive(Clone)]
pub struct VulkanDevice {
    inner: Arc<Inner>,
    /// What the WGSL family's users keep per device (compiled pipelines, placeholders, the
    /// one-off parameter slot): apart from `inner`, so that what it caches, which holds
    /// `inner`, forms no cycle with it.
    caches: Arc<runtime::Caches>,
}

impl PartialEq for VulkanDevice {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for VulkanDevice {}

impl std::fmt::Debug for VulkanDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanDevice")
            .field("name", &self.inner.name)
            .field("kind", &self.inner.kind)
            .finish()
    }
}

pub(crate) struct Inner {
    // Field order is drop order: the allocator and every device object go before the device,
    // the device before the instance, the instance before the loader.
    pub(crate) allocator: Mutex<Option<Allocator>>,
    pub(crate) queue: Mutex<QueueState>,
    pub(crate) pool: vk::CommandPool,
    /// The driver's compiled pipelines, loaded from and saved to `cache_file`.
    pub(crate) pipeline_cache: vk::PipelineCache,
    cache_file: Option<std::path::PathBuf>,
    pub(crate) device: ash::Device,
    pub(crate) limits: vk::PhysicalDeviceLimits,
    /// `VK_KHR_push_descriptor` and its `maxPushDescriptors`, where enabled.
    pub(crate) push: Option<(ash::khr::push_descriptor::Device, u32)>,
    /// The subgroup size pipelines require where `subgroupSizeControl` is enabled, with the
    /// most invocations a workgroup may have at that size.
    pub(crate) required_subgroup_size: Option<(u32, u32)>,
    /// The device's own range of subgroup sizes (before any is required).
    pub(crate) device_subgroup_sizes: (u32, u32),
    /// What the device offers the WGSL family's kernels.
    pub(crate) wgsl: WgslDeviceInfo,
    /// Valid bits of the compute queue's timestamps (0: no timestamps there).
    pub(crate) timestamp_bits: u32,
    name: String,
    kind: vk::PhysicalDeviceType,
    messenger: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    messages: Box<Mutex<Messages>>,
    instance: ash::Instance,
    _entry: ash::Entry,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: every object below was created from these handles and is destroyed once,
        // after the device is idle; the allocator frees its memory blocks before the device
        // goes.
        unsafe {
            let _ = self.device.device_wait_idle();
            if let Ok(mut a) = self.allocator.lock() {
                a.take();
            }
            if let Some(path) = &self.cache_file {
                if let Ok(data) = self.device.get_pipeline_cache_data(self.pipeline_cache) {
                    save_cache(path, &data);
                }
            }
            if let Ok(mut q) = self.queue.lock() {
                q.destroy(&self.device);
            }
            self.device
                .destroy_pipeline_cache(self.pipeline_cache, None);
            self.device.destroy_command_pool(self.pool, None);
            self.device.destroy_device(None);
            if let Some((utils, m)) = self.messenger.take() {
                utils.destroy_debug_utils_messenger(m, None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// Whether the loader finds the Khronos validation layer.
fn validation_layer_installed() -> bool {
    // SAFETY: loading the loader runs its initialisers (see `VulkanDevice::open`); the
    // query is plain.
    unsafe { ash::Entry::load() }
        .ok()
        .and_then(|e| unsafe { e.enumerate_instance_layer_properties() }.ok())
        .is_some_and(|layers| {
            layers
                .iter()
                .any(|l| l.layer_name_as_c_str().ok() == Some(VALIDATION_LAYER))
        })
}

/// The variable naming the device (shared with the wgpu runtime).
pub use crate::device::choice::DEVICE_ENV;

/// The validation layer's messages: errors are recorded, the rest ignored.
unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) && !user.is_null() {
        // SAFETY: `user` is the `Mutex<Messages>` boxed in `Inner`, which outlives the
        // messenger; `data` and its message are valid for the call (the loader's contract).
        let messages = &*(user as *const Mutex<Messages>);
        let text = if data.is_null() || (*data).p_message.is_null() {
            "(no message)".to_string()
        } else {
            CStr::from_ptr((*data).p_message)
                .to_string_lossy()
                .into_owned()
        };
        if let Ok(mut m) = messages.lock() {
            m.errors.push(text);
        }
    }
    vk::FALSE
}

/// Writes `data` to `path` through a temporary file and a rename, so that a reader never
/// sees half a cache; failures only cost the next run its compiled pipelines.
fn save_cache(path: &std::path::Path, data: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, data).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn vk_error(what: &str, e: vk::Result) -> Error {
    Error::Device {
        backend: "VULKAN".into(),
        message: format!("{what}: {e}"),
    }
}

/// Rank of a device type: lower is preferred.
fn type_rank(t: vk::PhysicalDeviceType) -> u32 {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => 0,
        vk::PhysicalDeviceType::INTEGRATED_GPU => 1,
        vk::PhysicalDeviceType::VIRTUAL_GPU => 2,
        vk::PhysicalDeviceType::CPU => 4,
        _ => 3,
    }
}

/// Storage-buffer descriptors the kernels leave to one binding array: the device's per-stage,
/// per-set and per-stage-resource limits, less 12 for a kernel's other bindings (the WGSL
/// family's kernels bind at most 9 others).
fn max_chunks(limits: &vk::PhysicalDeviceLimits) -> u32 {
    limits
        .max_per_stage_descriptor_storage_buffers
        .min(limits.max_descriptor_set_storage_buffers)
        .min(limits.max_per_stage_resources)
        .saturating_sub(12)
        .max(1)
}

impl VulkanDevice {
    /// Opens the preferred device (see the module docs), or says why none opens.
    pub fn open(options: VulkanOptions) -> Result<Self> {
        let unavailable = |m: String| Error::Device {
            backend: "VULKAN".into(),
            message: m,
        };
        // SAFETY: loading the loader runs its initialisers; it is the documented way to use
        // a system Vulkan loader.
        let entry = unsafe { ash::Entry::load() }
            .map_err(|e| unavailable(format!("no Vulkan loader: {e}")))?;
        let mut layers = Vec::new();
        let mut extensions = Vec::new();
        if options.validation {
            // SAFETY: a plain query of the loader.
            let available = unsafe { entry.enumerate_instance_layer_properties() }
                .map_err(|e| vk_error("vkEnumerateInstanceLayerProperties", e))?;
            let found = available
                .iter()
                .any(|l| l.layer_name_as_c_str().ok() == Some(VALIDATION_LAYER));
            if !found {
                return Err(unavailable(
                    "validation asked for, but VK_LAYER_KHRONOS_validation is not installed \
                     (Debian: apt-get install vulkan-validationlayers)"
                        .into(),
                ));
            }
            layers.push(VALIDATION_LAYER.as_ptr());
            extensions.push(ash::ext::debug_utils::NAME.as_ptr());
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"polyattn")
            .api_version(vk::API_VERSION_1_3);
        let info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&extensions);
        // SAFETY: the create info and the strings it points to live across the call.
        let instance = unsafe { entry.create_instance(&info, None) }
            .map_err(|e| unavailable(format!("vkCreateInstance: {e}")))?;
        let messages = Box::new(Mutex::new(Messages::default()));
        let messenger = if options.validation {
            let utils = ash::ext::debug_utils::Instance::new(&entry, &instance);
            let info = vk::DebugUtilsMessengerCreateInfoEXT::default()
                .message_severity(
                    vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                        | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
                )
                .message_type(
                    vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                        | vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                        | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
                )
                .pfn_user_callback(Some(on_message))
                .user_data(&*messages as *const Mutex<Messages> as *mut c_void);
            // SAFETY: the user data (boxed, owned by `Inner`) outlives the messenger, which
            // `Inner::drop` destroys before the instance.
            match unsafe { utils.create_debug_utils_messenger(&info, None) } {
                Ok(m) => Some((utils, m)),
                Err(e) => {
                    // SAFETY: nothing else was created from the instance yet.
                    unsafe { instance.destroy_instance(None) };
                    return Err(vk_error("vkCreateDebugUtilsMessengerEXT", e));
                }
            }
        } else {
            None
        };
        let destroy = |instance: &ash::Instance,
                       messenger: &Option<(
            ash::ext::debug_utils::Instance,
            vk::DebugUtilsMessengerEXT,
        )>| {
            // SAFETY: called on the error paths below, before anything else owns them.
            unsafe {
                if let Some((u, m)) = messenger {
                    u.destroy_debug_utils_messenger(*m, None);
                }
                instance.destroy_instance(None);
            }
        };
        let chosen = match Self::choose(&instance) {
            Ok(c) => c,
            Err(e) => {
                destroy(&instance, &messenger);
                return Err(e);
            }
        };
        let (physical, family, timestamp_bits, props) = chosen;
        // SAFETY: `physical` comes from this instance.
        let caps = unsafe { ShaderFeatures::query(&entry, &instance, physical, &props) };
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&priorities)];
        let mut enable11 = vk::PhysicalDeviceVulkan11Features::default()
            .storage_buffer16_bit_access(caps.f16)
            .uniform_and_storage_buffer16_bit_access(caps.f16);
        let mut enable12 = vk::PhysicalDeviceVulkan12Features::default()
            .shader_float16(caps.f16)
            .shader_storage_buffer_array_non_uniform_indexing(caps.array_any_index)
            .vulkan_memory_model(caps.coop)
            .vulkan_memory_model_device_scope(caps.coop);
        let required_subgroup_size = caps
            .required_subgroup_size
            .filter(|_| options.subgroup_size_control);
        let mut enable13 = vk::PhysicalDeviceVulkan13Features::default()
            .subgroup_size_control(required_subgroup_size.is_some());
        let mut enable_coop =
            vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
        let mut enable_bf16 = features::Bfloat16Features::default();
        enable_bf16.shader_bfloat16_type = vk::TRUE;
        enable_bf16.shader_bfloat16_cooperative_matrix = vk::TRUE;
        let mut device_extensions = Vec::new();
        if caps.coop {
            device_extensions.push(features::COOP_EXTENSION.as_ptr());
        }
        if caps.coop_bf16 {
            device_extensions.push(features::BF16_EXTENSION.as_ptr());
        }
        let push = options.push_descriptors && caps.max_push_descriptors > 0;
        if push {
            device_extensions.push(features::PUSH_EXTENSION.as_ptr());
        }
        let mut info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&device_extensions);
        let enable10 = vk::PhysicalDeviceFeatures::default()
            .shader_storage_buffer_array_dynamic_indexing(caps.array_any_index);
        info = info.enabled_features(&enable10);
        if caps.api >= vk::API_VERSION_1_2 {
            info = info.push_next(&mut enable11).push_next(&mut enable12);
        }
        if required_subgroup_size.is_some() {
            info = info.push_next(&mut enable13);
        }
        if caps.coop {
            info = info.push_next(&mut enable_coop);
        }
        if caps.coop_bf16 {
            info = info.push_next(&mut enable_bf16);
        }
        // SAFETY: `physical` comes from this instance; the create info lives across the call.
        let device = match unsafe { instance.create_device(physical, &info, None) } {
            Ok(d) => d,
            Err(e) => {
                destroy(&instance, &messenger);
                return Err(vk_error("vkCreateDevice", e));
            }
        };
        // SAFETY: queue 0 of a family the device was created with.
        let queue = unsafe { device.get_device_queue(family, 0) };
        let pool_info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: a valid device and create info.
        let pool = match unsafe { device.create_command_pool(&pool_info, None) } {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: nothing else was created from the device.
                unsafe { device.destroy_device(None) };
                destroy(&instance, &messenger);
                return Err(vk_error("vkCreateCommandPool", e));
            }
        };
        let cache_file = crate::device::disk_cache::cache_dir().map(|d| {
            let uuid: String = props
                .pipeline_cache_uuid
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            d.join("vulkan").join(format!(
                "{:04x}-{:04x}-{uuid}.pipelines",
                props.vendor_id, props.device_id
            ))
        });
        let initial = cache_file
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .unwrap_or_default();
        // The driver checks the data's header (vendor, device, cache UUID) and starts empty
        // when it is not its own.
        let cache_info = vk::PipelineCacheCreateInfo::default().initial_data(&initial);
        // SAFETY: a valid device and create info; the cache is destroyed in `Inner::drop`.
        let pipeline_cache = match unsafe { device.create_pipeline_cache(&cache_info, None) }
            .or_else(|_| {
                // SAFETY: as above, without initial data.
                unsafe {
                    device.create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None)
                }
            }) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: only the pool was created from the device.
                unsafe {
                    device.destroy_command_pool(pool, None);
                    device.destroy_device(None);
                }
                destroy(&instance, &messenger);
                return Err(vk_error("vkCreatePipelineCache", e));
            }
        };
        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: instance.clone(),
            device: device.clone(),
            physical_device: physical,
            debug_settings: Default::default(),
            buffer_device_address: false,
            allocation_sizes: Default::default(),
        });
        let allocator = match allocator {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: only the pool and the cache were created from the device.
                unsafe {
                    device.destroy_pipeline_cache(pipeline_cache, None);
                    device.destroy_command_pool(pool, None);
                    device.destroy_device(None);
                }
                destroy(&instance, &messenger);
                return Err(unavailable(format!("gpu-allocator: {e}")));
            }
        };
        let name = props
            .device_name_as_c_str()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "(unnamed)".into());
        // The largest device-local heap: no tensor can be larger.
        // SAFETY: a plain query of a physical device of this instance.
        let memory = unsafe { instance.get_physical_device_memory_properties(physical) };
        let memory_bytes = memory.memory_heaps[..memory.memory_heap_count as usize]
            .iter()
            .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .max()
            .unwrap_or(u64::MAX);
        // Where the size varies, every pipeline runs at the required one, and no workgroup is
        // larger than that size allows (`VulkanDevice::required_size_for`).
        let (min, max) = caps.subgroup_sizes;
        let (subgroup_sizes, max_invocations) = match required_subgroup_size {
            Some((n, most)) if min < max => (
                (n, n),
                props.limits.max_compute_work_group_invocations.min(most),
            ),
            _ => (
                caps.subgroup_sizes,
                props.limits.max_compute_work_group_invocations,
            ),
        };
        let wgsl = WgslDeviceInfo {
            name: name.clone(),
            is_cpu: props.device_type == vk::PhysicalDeviceType::CPU,
            subgroups: caps.subgroups,
            subgroup_sizes,
            f16: caps.f16,
            coop: caps.coop,
            coop_bf16: caps.coop_bf16,
            max_workgroup_storage: props.limits.max_compute_shared_memory_size,
            max_invocations,
            max_workgroup_size_x: props.limits.max_compute_work_group_size[0],
            max_workgroups_per_dim: props.limits.max_compute_work_group_count[0]
                .min(props.limits.max_compute_work_group_count[2]),
            max_binding_bytes: u64::from(props.limits.max_storage_buffer_range),
            binding_arrays: true,
            binding_array_any_index: caps.array_any_index,
            memory_bytes,
            chunk_bytes: u64::from(props.limits.max_storage_buffer_range).min(caps.max_allocation)
                & !255,
            max_chunks: max_chunks(&props.limits),
        };
        let push = push.then(|| {
            (
                ash::khr::push_descriptor::Device::new(&instance, &device),
                caps.max_push_descriptors,
            )
        });
        let inner = Arc::new(Inner {
            allocator: Mutex::new(Some(allocator)),
            queue: Mutex::new(QueueState::new(queue)),
            pool,
            pipeline_cache,
            cache_file,
            device,
            limits: props.limits,
            push,
            required_subgroup_size,
            device_subgroup_sizes: caps.subgroup_sizes,
            timestamp_bits,
            name,
            kind: props.device_type,
            messenger,
            messages,
            instance,
            _entry: entry,
            wgsl,
        });
        let caches = runtime::Caches::new();
        Ok(VulkanDevice { inner, caches })
    }

    /// The physical device to open, with its compute queue family and properties: the
    /// ranking's first (see the module docs), or the one `POLYATTN_DEVICE` names.
    fn choose(
        instance: &ash::Instance,
    ) -> Result<(vk::PhysicalDevice, u32, u32, vk::PhysicalDeviceProperties)> {
        // SAFETY: plain queries of a live instance.
        let devices = unsafe { instance.enumerate_physical_devices() }
            .map_err(|e| vk_error("vkEnumeratePhysicalDevices", e))?;
        let mut ranked = Vec::new();
        for (i, &pd) in devices.iter().enumerate() {
            // SAFETY: `pd` comes from this instance.
            let props = unsafe { instance.get_physical_device_properties(pd) };
            // SAFETY: as above.
            let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
            let Some(family) = families
                .iter()
                .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
            else {
                continue;
            };
            let bits = families[family].timestamp_valid_bits;
            ranked.push((
                type_rank(props.device_type),
                i,
                pd,
                (family as u32, bits),
                props,
            ));
        }
        if ranked.is_empty() {
            return Err(Error::Device {
                backend: "VULKAN".into(),
                message: format!(
                    "none of the {} Vulkan devices has a compute queue",
                    devices.len()
                ),
            });
        }
        ranked.sort_by_key(|r| (r.0, r.1));
        let index = match std::env::var(DEVICE_ENV)
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            Some(v) => {
                let names: Vec<String> = ranked
                    .iter()
                    .map(|r| {
                        r.4.device_name_as_c_str()
                            .map(|s| s.to_string_lossy().into_owned())
                            .unwrap_or_default()
                    })
                    .collect();
                crate::device::choice::pick(&names, &v, DEVICE_ENV).map_err(|m| Error::Device {
                    backend: "VULKAN".into(),
                    message: m,
                })?
            }
            None => 0,
        };
        let (_, _, pd, (family, bits), props) = ranked.swap_remove(index);
        Ok((pd, family, bits, props))
    }

    /// The device's name as the driver gives it.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Whether the device is a CPU implementation (lavapipe, SwiftShader).
    pub fn is_cpu(&self) -> bool {
        self.inner.kind == vk::PhysicalDeviceType::CPU
    }

    /// Whether the compute queue writes timestamps ([`VulkanDevice::submit_timed`] times).
    pub fn has_timestamps(&self) -> bool {
        self.inner.timestamp_bits > 0
    }

    /// The errors the validation layer reported so far (empty without validation).
    pub fn validation_errors(&self) -> Vec<String> {
        self.inner
            .messages
            .lock()
            .map(|m| m.errors.clone())
            .unwrap_or_default()
    }

    /// Whether the validation layer is on (its errors recorded).
    pub fn validation_enabled(&self) -> bool {
        self.inner.messenger.is_some()
    }

    /// The errors the validation layer reported since the last call, cleared.
    pub fn take_validation_errors(&self) -> Vec<String> {
        self.inner
            .messages
            .lock()
            .map(|mut m| std::mem::take(&mut m.errors))
            .unwrap_or_default()
    }

    /// The process's Vulkan device, opened on first use (see the module docs for which); a
    /// failure is cached too. In builds with debug assertions the Khronos validation layer is
    /// on where it is installed (as wgpu turns its validation on in debug builds), so every
    /// debug test run on a machine with the layer checks every submission.
    pub fn global() -> Result<VulkanDevice> {
        static DEVICE: OnceLock<std::result::Result<VulkanDevice, String>> = OnceLock::new();
        DEVICE
            .get_or_init(|| {
                let validation = cfg!(debug_assertions) && validation_layer_installed();
                VulkanDevice::open(VulkanOptions {
                    validation,
                    push_descriptors: true,
                    subgroup_size_control: true,
                })
                .map_err(|e| match e {
                    Error::Device { message, .. } => message,
                    e => e.to_string(),
                })
            })
            .clone()
            .map_err(|message| Error::Device {
                backend: "VULKAN".into(),
                message,
            })
    }

    /// Saves the driver's pipeline cache to its file (see the module docs); failures only
    /// cost a later run its compiled pipelines.
    pub(crate) fn save_pipeline_cache(&self) {
        if let Some(path) = &self.inner.cache_file {
            // SAFETY: a live cache of this device.
            if let Ok(data) = unsafe {
                self.raw()
                    .get_pipeline_cache_data(self.inner.pipeline_cache)
            } {
                save_cache(path, &data);
            }
        }
    }

    /// The largest storage-buffer range one binding may cover.
    pub fn max_storage_range(&self) -> u64 {
        u64::from(self.inner.limits.max_storage_buffer_range)
    }

    /// Whether kernels index arrays of storage buffers by any value (Vulkan's non-uniform
    /// indexing), rather than through a `switch` of constant indices: how a kernel picks the
    /// chunk of a tensor stored in several buffers ([`VulkanStorage`]).
    pub fn indexes_buffer_arrays(&self) -> bool {
        self.inner.wgsl.binding_array_any_index
    }

    /// The largest buffer a tensor is stored in: one binding's range and one allocation, at
    /// most, rounded down to 256 bytes. A larger tensor is stored in chunks of this size or
    /// less where the device binds arrays of storage buffers ([`VulkanStorage`]).
    pub fn max_chunk_bytes(&self) -> u64 {
        self.inner.wgsl.chunk_bytes
    }

    pub(crate) fn raw(&self) -> &ash::Device {
        &self.inner.device
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// The queue and its submissions, locked; an error inside a capture
    /// ([`VulkanDevice::capture`]), where nothing may be submitted.
    pub(crate) fn lock_queue(&self) -> Result<std::sync::MutexGuard<'_, QueueState>> {
        if self.is_capturing() {
            return Err(self.capture_error("a submission (upload, download, fill or dispatch)"));
        }
        self.queue_lock()
    }

    /// The queue lock, without the capture check (waits need none).
    pub(crate) fn queue_lock(&self) -> Result<std::sync::MutexGuard<'_, QueueState>> {
        self.inner
            .queue
            .lock()
            .map_err(|_| vk_error("the queue lock", vk::Result::ERROR_UNKNOWN))
    }

    /// Records `record` into a command buffer, submits it on the compute queue and waits for
    /// it (and so for every earlier submission) to finish.
    pub(crate) fn submit_and_wait(&self, record: impl FnOnce(vk::CommandBuffer)) -> Result<()> {
        let serial = self.submit_async(queue::Keep::default(), record)?;
        self.wait_for(serial)
    }

    /// Records `record` into a command buffer and submits it without waiting, with `keep`
    /// alive until it finishes; returns its serial (see [`queue`]).
    pub(crate) fn submit_async(
        &self,
        keep: queue::Keep,
        record: impl FnOnce(vk::CommandBuffer),
    ) -> Result<u64> {
        let mut q = self.lock_queue()?;
        let slot = self.begin_slot(&mut q)?;
        record(slot.cmd);
        self.launch(&mut q, slot, keep)
    }

    /// Makes the writes of earlier submissions visible to the commands recorded after this
    /// into `cmd`, and orders those commands after them: the barrier's first scope is every
    /// command submitted to the queue before it.
    pub(crate) fn after_earlier_submissions(&self, cmd: vk::CommandBuffer) {
        let barrier = vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE);
        // SAFETY: `cmd` is recording (the callers' contract).
        unsafe {
            self.inner.device.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::DependencyFlags::empty(),
                &[barrier],
                &[],
                &[],
            );
        }
    }

    /// Submits a command buffer recorded by [`VulkanDevice::record`] without waiting;
    /// returns its serial. The caller makes sure `cmd` is not pending.
    pub(crate) fn submit_recorded(&self, cmd: vk::CommandBuffer) -> Result<u64> {
        let mut q = self.lock_queue()?;
        self.launch_recorded(&mut q, cmd, queue::Keep::default())
    }

    pub(crate) fn inner_arc(&self) -> &Arc<Inner> {
        &self.inner
    }
}
