//! The wgpu runtime: one adapter, device and queue per process, storage buffers, the
//! per-device caches (compiled pipelines, placeholder bindings), and what running a WGSL
//! module takes — compiling it ([`pipeline`], with the SPIR-V patch of the cooperative-matrix
//! modules in [`coop_spirv`](crate::device::coop_spirv)), recording and dispatching it ([`ParamBlock`], [`bind_group`],
//! [`dispatch`], [`grid`]) and binding buffers ([`storage`], [`check_binding`],
//! [`upload_words`]). It runs the WGSL family's modules (`crate::kernels::wgsl`: a key, a
//! source and a [`Bindings`](crate::kernels::wgsl::Bindings) set) and knows nothing of the
//! backends that choose them.
//!
//! **Opening.** [`WgpuDevice::open`] enumerates the adapters of the backends that
//! `WGPU_BACKEND` allows (wgpu's own variable: `vulkan`, `metal`, `dx12`, `gl`; all by
//! default), ranks them (discrete, integrated, virtual, CPU; native APIs before GL) and takes
//! the first, unless `POLYATTN_DEVICE` (an index into that ranking, or a case-insensitive
//! substring of the adapter name) or `WGPU_ADAPTER_NAME` (a substring, as in wgpu's own
//! helpers) picks another. A name that matches nothing is an error, never a panic. The result,
//! success or failure, is cached for the life of the process.
//!
//! **Device features and limits.** It requests the adapter's own limits (wgpu's defaults cap
//! workgroup storage at 16 KiB; lavapipe offers 32 KiB, the H200 48 KiB) and, when offered,
//! `SHADER_F16`, `SUBGROUP` and `TIMESTAMP_QUERY`. The one experimental feature it asks for
//! is `EXPERIMENTAL_COOPERATIVE_MATRIX` (tensor cores from WGSL), and only where the adapter
//! offers the 16 × 16 × 16 f16 / f32 configuration the coop prefill form needs, with
//! subgroups and f16, unless `POLYATTN_WGPU_COOP=0`: wgpu marks it experimental (its
//! implementation may have bugs), so it can be turned off without rebuilding.
//!
//! **No window system.** polyattn computes and never presents, so on Linux its Vulkan
//! instance enables no window-system surface extension (`VK_KHR_wayland_surface`,
//! `VK_KHR_xlib_surface`, `VK_KHR_xcb_surface`); the other backends come from a second wgpu
//! instance. Why: Mesa's implicit `VK_LAYER_MESA_device_select` layer, seeing a surface
//! extension enabled, connects to the Wayland and X servers inside
//! `vkEnumeratePhysicalDevices` to find the GPU that drives the display, and on a headless
//! machine libwayland-client then prints "error: XDG_RUNTIME_DIR is invalid or not set in the
//! environment." once per enumeration call, although nothing failed.
//!
//! **GL fallback.** Without a Vulkan driver wgpu finds Mesa's OpenGL `llvmpipe` instead: it
//! works but has neither f16 nor subgroups. [`WgpuDevice::is_gl_fallback`] says so, and the
//! backend reports it; CI sets `WGPU_BACKEND=vulkan` so a broken install fails loudly.
//!
//! **Submissions.** Work is recorded into one pending command buffer and submitted in
//! batches ([`WgpuDevice::record`], [`WgpuDevice::flush`]): at most
//! [`MAX_PENDING_COMMANDS`] commands, or sooner when the host needs the queue's results (a
//! download, [`WgpuDevice::synchronize`]) or writes a buffer through the queue
//! ([`WgpuDevice::write_buffer`]: a queued write lands before the next submission's commands,
//! so the commands recorded before it are submitted first). Why: a model step is hundreds of
//! small dispatches, and one queue submission each cost more host time than the dispatches'
//! GPU time. One-off dispatches take their parameters from a ring of slots written together
//! with the batch that reads them, and so do the calls of objects with parameter blocks of
//! their own (an attention layer's), so a step's parameters cause no queued write. Code that submits to [`WgpuDevice::queue`] directly
//! must go through [`WgpuDevice::submit`] (or call [`WgpuDevice::flush`] first) to keep the
//! order.
//!
//! **Errors.** wgpu reports most errors asynchronously through an "uncaptured error" handler
//! whose default panics. polyattn installs its own, which records the message; the next
//! [`WgpuDevice::synchronize`] or download returns it as [`Error::Device`]. Buffer creation
//! is additionally checked up front against the adapter's limits and wrapped in an error
//! scope, so an oversized or failed allocation is an error where it happens.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use super::CpuStorage;
use crate::dtype::DType;
use crate::error::{Error, Result};

mod buffers;
mod dispatch;
mod pipeline;
mod runtime;

pub use crate::device::wgsl::{Words, PARAM_SLOT_BYTES, PARAM_WORDS};
pub use buffers::{check_binding, storage, upload_words};
pub use dispatch::{bind_group, dispatch, dispatch_all, grid, whole, ParamBlock};
pub use pipeline::{pipeline, pipeline_with, LoopBounding, PipelineTuning};

/// Environment variable choosing the adapter: an index into the ranked adapter list, or a
/// case-insensitive substring of the adapter name.
pub use crate::device::choice::DEVICE_ENV;

/// wgpu's variable naming an adapter by substring (honoured when `POLYATTN_DEVICE` is unset).
pub const ADAPTER_NAME_ENV: &str = "WGPU_ADAPTER_NAME";

/// Distinct placeholder buffers per device.
const DUMMY_BUFFERS: usize = 4;

/// Smallest buffer polyattn creates: a zero-sized binding is invalid in WebGPU.
const MIN_BUFFER_BYTES: u64 = 16;

fn device_error(message: impl Into<String>) -> Error {
    Error::Device {
        backend: "wgpu".into(),
        message: message.into(),
    }
}

/// The opened adapter and everything cached on it.
struct Inner {
    _instances: Vec<wgpu::Instance>,
    adapter: wgpu::Adapter,
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    features: wgpu::Features,
    limits: wgpu::Limits,
    /// Messages of errors wgpu raised outside any error scope, oldest first.
    errors: Arc<Mutex<Vec<String>>>,
    /// Compiled compute pipelines by specialisation key.
    pipelines: Mutex<HashMap<String, wgpu::ComputePipeline>>,
    /// Small storage buffers bound where a shader's optional inputs or outputs are unused
    /// (distinct ones, since one buffer may not be bound writable and read-only at once).
    dummies: Vec<wgpu::Buffer>,
    /// What the device offers the WGSL family (`device::wgsl`).
    wgsl_info: crate::device::wgsl::WgslDeviceInfo,
    /// The ring of parameter slots of one-off dispatches (`WgslRuntime::submit_one`).
    param_ring: OnceLock<ParamBlock>,
    /// Commands recorded and not yet submitted.
    pending: Mutex<Pending>,
}

/// Most commands (a call's compute pass, a copy) a pending command buffer holds before it is
/// submitted: few enough that the GPU starts on a step's work while the host records the
/// rest.
pub const MAX_PENDING_COMMANDS: usize = 32;

/// Parameter slots of the ring: one pending command buffer uses at most this many.
const RING_SLOTS: usize = 256;

/// What has been recorded for the queue and not submitted.
#[derive(Default)]
struct Pending {
    encoder: Option<wgpu::CommandEncoder>,
    /// Commands in `encoder`.
    commands: usize,
    /// The parameter slots `encoder`'s dispatches read: slot i of the ring holds `ring_slots[i]`
    /// once the batch is submitted.
    ring_slots: Vec<crate::device::wgsl::Slot>,
}

/// A wgpu adapter, device and queue (one per process, shared by every clone).
///
/// Equality is adapter identity: two handles are equal when they share the opened device.
#[derive(Clone)]
pub struct WgpuDevice {
    inner: Arc<Inner>,
}

impl PartialEq for WgpuDevice {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for WgpuDevice {}

impl fmt::Debug for WgpuDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuDevice")
            .field("adapter", &self.inner.info.name)
            .field("backend", &self.inner.info.backend)
            .finish()
    }
}

/// Rank of an adapter in automatic choice: lower is better.
fn adapter_rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let ty = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    };
    let api = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        wgpu::Backend::Gl => 1,
        _ => 2,
    };
    (ty, api)
}

/// Picks an adapter from the ranked list according to the environment.
fn choose_adapter(mut adapters: Vec<wgpu::Adapter>) -> Result<wgpu::Adapter> {
    if adapters.is_empty() {
        return Err(device_error(
            "no wgpu adapter found (install mesa-vulkan-drivers for lavapipe, or a GPU driver)",
        ));
    }
    adapters.sort_by_key(|a| adapter_rank(&a.get_info()));
    let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
    let chosen = |v: String, var: &str| -> Result<usize> {
        crate::device::choice::pick(&names, &v, var).map_err(device_error)
    };
    let index = match std::env::var(DEVICE_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
    {
        // An index into the ranking, or a name substring.
        Some(v) => chosen(v, DEVICE_ENV)?,
        // wgpu's own variable: a name substring only.
        None => match std::env::var(ADAPTER_NAME_ENV)
            .ok()
            .filter(|s| !s.trim().is_empty())
        {
            Some(v) => crate::device::choice::pick_name(&names, &v, ADAPTER_NAME_ENV)
                .map_err(device_error)?,
            None => 0,
        },
    };
    Ok(adapters.swap_remove(index))
}

/// Features polyattn uses when the adapter offers them.
fn wanted_features() -> wgpu::Features {
    wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY
}

/// Environment switch for cooperative matrices: `0` never requests them.
pub const COOP_ENV: &str = "POLYATTN_WGPU_COOP";

/// Whether to request `EXPERIMENTAL_COOPERATIVE_MATRIX`: a Vulkan adapter (the coop
/// shaders are handed over as SPIR-V, which only Vulkan takes through passthrough) offers it
/// with the configuration the coop form uses, f16 and subgroups, and `POLYATTN_WGPU_COOP`
/// is not `0`.
fn wants_coop(adapter: &wgpu::Adapter) -> bool {
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::PASSTHROUGH_SHADERS
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP;
    std::env::var(COOP_ENV).map_or(true, |v| v.trim() != "0")
        && adapter.get_info().backend == wgpu::Backend::Vulkan
        && adapter.features().contains(needed)
        && coop_supported(&adapter.cooperative_matrix_properties())
}

/// Whether an adapter offers the cooperative-matrix configuration the WGSL family's coop
/// form needs (`coop_mat16x16` of f16 in `paged_attention_coop.wgsl`): 16 × 16 × 16, f16 A /
/// B, f32 C (what NVIDIA's and AMD's Vulkan drivers offer for tensor cores / WMMA).
pub fn coop_supported(props: &[wgpu::CooperativeMatrixProperties]) -> bool {
    props.iter().any(|p| {
        p.m_size == 16
            && p.n_size == 16
            && p.k_size == 16
            && p.ab_type == wgpu::CooperativeScalarType::F16
            && p.cr_type == wgpu::CooperativeScalarType::F32
    })
}

/// Window-system surface extensions of Vulkan that polyattn, which never presents, does not
/// enable (see the module docs: "No window system").
#[cfg(target_os = "linux")]
const WINDOW_SYSTEM_EXTENSIONS: [&std::ffi::CStr; 3] = [
    c"VK_KHR_wayland_surface",
    c"VK_KHR_xlib_surface",
    c"VK_KHR_xcb_surface",
];

/// A wgpu instance of the Vulkan backend alone, created without the window-system surface
/// extensions; `None` when Vulkan cannot be initialised (no loader or driver), as wgpu's own
/// instance would skip it.
#[cfg(target_os = "linux")]
fn compute_only_vulkan_instance(desc: &wgpu::InstanceDescriptor) -> Option<wgpu::Instance> {
    use wgpu::hal;
    let hal_desc = hal::InstanceDescriptor {
        name: "polyattn",
        flags: desc.flags,
        memory_budget_thresholds: desc.memory_budget_thresholds,
        backend_options: desc.backend_options.clone(),
        telemetry: None,
        display: None,
    };
    let drop_window_system: Box<hal::vulkan::CreateInstanceCallback> = Box::new(|args| {
        args.extensions
            .retain(|e| !WINDOW_SYSTEM_EXTENSIONS.contains(e));
    });
    // SAFETY: the callback only takes the three window-system surface extensions out of the
    // list (wgpu-hal documents the list as add-only). wgpu-hal uses those extensions only to
    // create surfaces, and checks that each one was enabled before it does; polyattn never
    // creates a surface, and it does not hand this instance to anyone who could.
    let raw =
        unsafe { hal::vulkan::Instance::init_with_callback(&hal_desc, Some(drop_window_system)) };
    match raw {
        // SAFETY: `raw` is a Vulkan instance that wgpu-hal just created; wgpu owns it from
        // here on.
        Ok(raw) => Some(unsafe { wgpu::Instance::from_hal::<hal::api::Vulkan>(raw) }),
        Err(e) => {
            tracing::debug!("wgpu: no Vulkan instance: {e}");
            None
        }
    }
}

/// The wgpu instances to enumerate adapters from, with the backends each one serves: on
/// Linux a compute-only Vulkan instance and a second one for the other backends, elsewhere
/// wgpu's own instance.
fn instances(backends: wgpu::Backends) -> Vec<(wgpu::Instance, wgpu::Backends)> {
    let desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    let mut out = Vec::new();
    #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
    let mut rest = backends;
    #[cfg(target_os = "linux")]
    if backends.contains(wgpu::Backends::VULKAN) {
        rest.remove(wgpu::Backends::VULKAN);
        if let Some(vk) = compute_only_vulkan_instance(&desc) {
            out.push((vk, wgpu::Backends::VULKAN));
        }
    }
    if !rest.is_empty() {
        let desc = wgpu::InstanceDescriptor {
            backends: rest,
            ..desc
        };
        out.push((wgpu::Instance::new(desc), rest));
    }
    out
}

fn open_uncached() -> Result<WgpuDevice> {
    let backends = wgpu::Backends::all().with_env();
    let mut adapters = Vec::new();
    let mut instances_kept = Vec::new();
    for (instance, served) in instances(backends) {
        adapters.extend(pollster::block_on(instance.enumerate_adapters(served)));
        instances_kept.push(instance);
    }
    let instances = instances_kept;
    let adapter = choose_adapter(adapters)?;
    let info = adapter.get_info();
    let mut features =
        adapter.features() & wanted_features() & !wgpu::Features::all_experimental_mask();
    let coop = wants_coop(&adapter);
    if coop {
        // The coop shaders go to the driver as SPIR-V (see `coop_spirv`).
        features |=
            wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::PASSTHROUGH_SHADERS;
    }
    let limits = adapter.limits();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("polyattn"),
        required_features: features,
        required_limits: limits.clone(),
        // SAFETY: only cooperative matrices are requested among the experimental features
        // (`wants_coop`); wgpu's token acknowledges that its implementation may have bugs.
        // polyattn uses them in one kernel (paged_attention_coop.wgsl), checked against the
        // CPU reference by the shared test suite on the adapters that have them, and
        // `POLYATTN_WGPU_COOP=0` turns them off.
        experimental_features: if coop {
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        },
        ..Default::default()
    }))
    .map_err(|e| {
        device_error(format!(
            "cannot open {} ({:?}): {e}",
            info.name, info.backend
        ))
    })?;
    let errors: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = errors.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        tracing::error!("wgpu: {e}");
        sink.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e.to_string());
    }));
    let dummies = (0..DUMMY_BUFFERS)
        .map(|_| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("polyattn unused binding"),
                size: 256,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM,
                mapped_at_creation: false,
            })
        })
        .collect();
    let wgsl_info = crate::device::wgsl::WgslDeviceInfo {
        name: info.name.clone(),
        is_cpu: info.device_type == wgpu::DeviceType::Cpu,
        subgroups: features.contains(wgpu::Features::SUBGROUP),
        subgroup_sizes: (info.subgroup_min_size, info.subgroup_max_size),
        f16: features.contains(wgpu::Features::SHADER_F16),
        coop: features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
        // WGSL has no bfloat16, and wgpu's passthrough gets no bf16 features enabled.
        coop_bf16: false,
        max_workgroup_storage: limits.max_compute_workgroup_storage_size,
        max_invocations: limits.max_compute_invocations_per_workgroup,
        max_workgroup_size_x: limits.max_compute_workgroup_size_x,
        max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension,
        max_binding_bytes: limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size),
        binding_arrays: false,
        memory_bytes: u64::MAX,
        binding_array_any_index: false,
        chunk_bytes: limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size),
        max_chunks: 1,
    };
    Ok(WgpuDevice {
        inner: Arc::new(Inner {
            _instances: instances,
            adapter,
            device,
            queue,
            info,
            features,
            limits,
            errors,
            pipelines: Mutex::new(HashMap::new()),
            dummies,
            wgsl_info,
            param_ring: OnceLock::new(),
            pending: Mutex::new(Pending::default()),
        }),
    })
}

impl WgpuDevice {
    /// The process's wgpu device, opened on first use (see the module docs for how the
    /// adapter is chosen). A failure is cached too: every later call returns the same error.
    pub fn open() -> Result<WgpuDevice> {
        static DEVICE: OnceLock<std::result::Result<WgpuDevice, String>> = OnceLock::new();
        DEVICE
            .get_or_init(|| {
                // wgpu may panic inside a broken driver; report that as "unavailable".
                match std::panic::catch_unwind(open_uncached) {
                    Ok(Ok(d)) => Ok(d),
                    Ok(Err(e)) => Err(match e {
                        Error::Device { message, .. } => message,
                        other => other.to_string(),
                    }),
                    Err(_) => Err("wgpu panicked while opening an adapter".to_string()),
                }
            })
            .clone()
            .map_err(device_error)
    }

    /// The adapter's description (name, backend, device type, driver).
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.inner.info
    }

    /// The wgpu adapter.
    pub fn adapter(&self) -> &wgpu::Adapter {
        &self.inner.adapter
    }

    /// The wgpu device.
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }

    /// The queue every polyattn submission goes to. Commands recorded by polyattn may still
    /// be pending: submit through [`WgpuDevice::submit`] (or [`WgpuDevice::flush`] first) so
    /// that they run before yours.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.inner.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Submits `p`'s commands, after writing the one-off parameter slots they read.
    fn flush_pending(&self, p: &mut Pending) {
        if let Some(enc) = p.encoder.take() {
            if !p.ring_slots.is_empty() {
                self.inner.queue.write_buffer(
                    self.param_ring().buffer(),
                    0,
                    bytemuck::cast_slice(&p.ring_slots),
                );
                p.ring_slots.clear();
            }
            self.inner.queue.submit([enc.finish()]);
            p.commands = 0;
        }
    }

    /// Records one command (a dispatch or a copy) into the pending command buffer, which is
    /// submitted once it holds [`MAX_PENDING_COMMANDS`] or at the next [`WgpuDevice::flush`].
    pub fn record<R>(&self, f: impl FnOnce(&mut wgpu::CommandEncoder) -> R) -> R {
        let mut p = self.pending();
        self.record_locked(&mut p, f)
    }

    fn record_locked<R>(
        &self,
        p: &mut Pending,
        f: impl FnOnce(&mut wgpu::CommandEncoder) -> R,
    ) -> R {
        let enc = p.encoder.get_or_insert_with(|| {
            self.inner
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("polyattn"),
                })
        });
        let r = f(enc);
        p.commands += 1;
        if p.commands >= MAX_PENDING_COMMANDS {
            self.flush_pending(p);
        }
        r
    }

    /// Submits every command recorded so far (without waiting for them).
    pub fn flush(&self) {
        let mut p = self.pending();
        self.flush_pending(&mut p);
    }

    /// Submits `commands` after every command recorded before.
    pub fn submit(&self, commands: wgpu::CommandBuffer) {
        let mut p = self.pending();
        self.flush_pending(&mut p);
        self.inner.queue.submit([commands]);
    }

    /// Writes `data` into `buffer` at `offset` through the queue, after every command
    /// recorded before (which may read what it overwrites) and before every later one.
    pub fn write_buffer(&self, buffer: &wgpu::Buffer, offset: u64, data: &[u8]) {
        let mut p = self.pending();
        self.flush_pending(&mut p);
        self.inner.queue.write_buffer(buffer, offset, data);
    }

    /// The features the device was opened with.
    pub fn features(&self) -> wgpu::Features {
        self.inner.features
    }

    /// The limits the device was opened with (the adapter's own).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.inner.limits
    }

    /// True when the device has `SHADER_F16`.
    pub fn has_f16(&self) -> bool {
        self.inner.features.contains(wgpu::Features::SHADER_F16)
    }

    /// True when the device was opened with cooperative matrices of the configuration the
    /// coop prefill form needs (see the module docs).
    pub fn has_coop(&self) -> bool {
        self.inner
            .features
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    }

    /// True when the device has subgroup operations.
    pub fn has_subgroups(&self) -> bool {
        self.inner.features.contains(wgpu::Features::SUBGROUP)
    }

    /// True when wgpu fell back to an OpenGL adapter (no f16, no subgroups, slow).
    pub fn is_gl_fallback(&self) -> bool {
        self.inner.info.backend == wgpu::Backend::Gl
    }

    /// Largest buffer that can be bound to one storage binding, in bytes.
    pub fn max_binding_bytes(&self) -> u64 {
        self.inner
            .limits
            .max_storage_buffer_binding_size
            .min(self.inner.limits.max_buffer_size)
    }

    /// One-line description: adapter, backend, device type, features.
    pub fn description(&self) -> String {
        let i = &self.inner.info;
        let mut extras = Vec::new();
        if self.has_f16() {
            extras.push("f16".to_string());
        }
        if self.has_subgroups() {
            extras.push(format!(
                "subgroups {}..{}",
                i.subgroup_min_size, i.subgroup_max_size
            ));
        }
        extras.push(format!(
            "{} KiB shared, {} MiB per binding",
            self.inner.limits.max_compute_workgroup_storage_size / 1024,
            self.max_binding_bytes() >> 20
        ));
        let mut s = format!(
            "wgpu: {} ({:?}, {:?}; {})",
            i.name,
            i.backend,
            i.device_type,
            extras.join(", ")
        );
        if self.is_gl_fallback() {
            s.push_str(
                " [OpenGL adapter: no f16 feature, no subgroups, slow; for Vulkan install \
                 mesa-vulkan-drivers (lavapipe) or a GPU driver and set WGPU_BACKEND=vulkan]",
            );
        }
        s
    }

    /// Returns (and clears) the errors wgpu raised outside any error scope.
    fn take_errors(&self) -> Result<()> {
        let mut errs = self.inner.errors.lock().unwrap_or_else(|p| p.into_inner());
        if errs.is_empty() {
            return Ok(());
        }
        let msg = errs.join("; ");
        errs.clear();
        Err(device_error(msg))
    }

    /// Waits until all work submitted to the queue has finished; reports any error wgpu
    /// raised asynchronously since the last check.
    pub fn synchronize(&self) -> Result<()> {
        self.flush();
        self.inner
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| device_error(format!("waiting for the queue failed: {e}")))?;
        self.take_errors()
    }

    /// Creates a storage buffer of `bytes` (rounded up to a multiple of 4, at least 16),
    /// checked against the adapter's limits and inside an error scope.
    pub fn create_storage_buffer(
        &self,
        label: &str,
        bytes: u64,
        extra_usage: wgpu::BufferUsages,
        mapped_at_creation: bool,
    ) -> Result<wgpu::Buffer> {
        let size = bytes.div_ceil(4).saturating_mul(4).max(MIN_BUFFER_BYTES);
        let max = self.inner.limits.max_buffer_size;
        if size > max {
            return Err(device_error(format!(
                "{label}: a buffer of {bytes} bytes exceeds this adapter's largest buffer \
                 ({max} bytes on {})",
                self.inner.info.name
            )));
        }
        let scope = self
            .inner
            .device
            .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.inner.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST
                | extra_usage,
            mapped_at_creation,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(device_error(format!(
                "{label}: allocating {size} bytes failed: {e}"
            )));
        }
        Ok(buffer)
    }

    /// `len` zeros of `dtype` (wgpu zero-fills new buffers).
    pub fn zeros(&self, len: usize, dtype: DType) -> Result<WgpuStorage> {
        let bytes = (len as u64).saturating_mul(dtype.size_in_bytes() as u64);
        let buffer = self.create_storage_buffer(
            "polyattn tensor",
            bytes,
            wgpu::BufferUsages::empty(),
            false,
        )?;
        Ok(WgpuStorage {
            buffer,
            bytes,
            device: self.clone(),
        })
    }

    /// Uploads host storage (the elements of `dtype`, little-endian).
    pub fn upload(&self, host: &CpuStorage, dtype: DType) -> Result<WgpuStorage> {
        let data = host.as_bytes();
        let expected = host.len() * dtype.size_in_bytes();
        if data.len() != expected {
            return Err(Error::DType {
                what: "wgpu upload",
                got: format!("{} bytes of host storage", data.len()),
                expected: format!("{} elements of {dtype}", host.len()),
            });
        }
        let bytes = data.len() as u64;
        let buffer = self.create_storage_buffer(
            "polyattn tensor",
            bytes,
            wgpu::BufferUsages::empty(),
            true,
        )?;
        {
            let mut view = buffer.get_mapped_range_mut(..).map_err(|e| {
                device_error(format!("mapping a new buffer for upload failed: {e}"))
            })?;
            view.slice(..data.len()).copy_from_slice(data);
        }
        buffer.unmap();
        Ok(WgpuStorage {
            buffer,
            bytes,
            device: self.clone(),
        })
    }

    /// Downloads to host storage, waiting for the work queued before.
    pub fn download(&self, s: &WgpuStorage, dtype: DType) -> Result<CpuStorage> {
        let bytes = self.read_bytes(&s.buffer, 0, s.bytes)?;
        Ok(CpuStorage::from_bytes(&bytes, dtype))
    }

    /// Copies `bytes` bytes from `buffer` at `offset` into host memory (waits for the queue).
    pub fn read_bytes(&self, buffer: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>> {
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let padded = bytes.div_ceil(4) * 4;
        if !offset.is_multiple_of(4) || offset + padded > buffer.size() {
            return Err(device_error(format!(
                "read of {bytes} bytes at {offset} is outside a buffer of {} bytes",
                buffer.size()
            )));
        }
        let d = &self.inner.device;
        let staging = d.create_buffer(&wgpu::BufferDescriptor {
            label: Some("polyattn download"),
            size: padded,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.record(|enc| enc.copy_buffer_to_buffer(buffer, offset, &staging, 0, Some(padded)));
        self.flush();
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.synchronize()?;
        rx.recv()
            .map_err(|_| device_error("the download's map callback never ran"))?
            .map_err(|e| device_error(format!("mapping the download buffer failed: {e}")))?;
        let out = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| device_error(format!("reading the download buffer failed: {e}")))?;
            view[..bytes as usize].to_vec()
        };
        staging.unmap();
        Ok(out)
    }

    /// The compiled pipeline cached under `key`, or the one `make` builds (then cached).
    /// `make` runs outside the cache lock, so threads compiling different pipelines do not
    /// wait on each other.
    pub fn cached_pipeline(
        &self,
        key: &str,
        make: impl FnOnce(&wgpu::Device) -> Result<wgpu::ComputePipeline>,
    ) -> Result<wgpu::ComputePipeline> {
        let lock = || {
            self.inner
                .pipelines
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        };
        if let Some(p) = lock().get(key) {
            return Ok(p.clone());
        }
        let p = make(&self.inner.device)?;
        Ok(lock().entry(key.to_string()).or_insert(p).clone())
    }

    /// What the device offers the WGSL family's kernels.
    pub fn wgsl_info(&self) -> &crate::device::wgsl::WgslDeviceInfo {
        &self.inner.wgsl_info
    }

    /// The ring of parameter slots, made on first use.
    fn param_ring(&self) -> &ParamBlock {
        self.inner
            .param_ring
            .get_or_init(|| ParamBlock::new(self, RING_SLOTS))
    }

    /// Records a call's `dispatches` (one compute pass) with their parameter `slots` taken
    /// from the ring: slot `d.slot` of a dispatch is ring slot `base + d.slot`, written with
    /// the batch that reads it. `None` when the call has more slots than the ring.
    pub(crate) fn record_with_ring(
        &self,
        slots: &[crate::device::wgsl::Slot],
        dispatches: &[crate::device::wgsl::Dispatch<WgpuDevice>],
    ) -> Option<()> {
        if slots.len() > RING_SLOTS {
            return None;
        }
        let mut p = self.pending();
        if p.ring_slots.len() + slots.len() > RING_SLOTS {
            self.flush_pending(&mut p);
        }
        let base = p.ring_slots.len();
        p.ring_slots.extend_from_slice(slots);
        self.record_call_locked(&mut p, self.param_ring(), base, dispatches);
        Some(())
    }

    /// Records a call's `dispatches` in one compute pass, the parameters of dispatch `d` at
    /// slot `first_slot + d.slot` of `params`.
    pub(crate) fn record_call(
        &self,
        params: &ParamBlock,
        first_slot: usize,
        dispatches: &[crate::device::wgsl::Dispatch<WgpuDevice>],
    ) {
        let mut p = self.pending();
        self.record_call_locked(&mut p, params, first_slot, dispatches);
    }

    fn record_call_locked(
        &self,
        p: &mut Pending,
        params: &ParamBlock,
        first_slot: usize,
        dispatches: &[crate::device::wgsl::Dispatch<WgpuDevice>],
    ) {
        let groups: Vec<wgpu::BindGroup> = dispatches
            .iter()
            .map(|d| {
                let mut entries = vec![(0, params.binding(first_slot + d.slot))];
                entries.extend(d.buffers.iter().map(|(n, b)| (*n, b.as_entire_binding())));
                bind_group(self, &d.pipeline, entries)
            })
            .collect();
        self.record_locked(p, |enc| {
            dispatch_all(
                enc,
                dispatches
                    .iter()
                    .zip(&groups)
                    .map(|(d, g)| (&d.pipeline, g, d.groups)),
            )
        });
    }

    /// Number of pipelines compiled so far (for tests and reports).
    pub fn pipeline_count(&self) -> usize {
        self.inner
            .pipelines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// One of four distinct 256-byte buffers (`slot % 4`) to bind where a shader's optional
    /// input or output is unused; use a different slot for each binding of one dispatch.
    pub fn dummy_buffer(&self, slot: usize) -> &wgpu::Buffer {
        &self.inner.dummies[slot % DUMMY_BUFFERS]
    }
}

/// A tensor's elements in a wgpu storage buffer.
///
/// The buffer is at least 16 bytes and a multiple of 4 (WebGPU binding rules); `len_bytes`
/// is the logical size. `Clone` copies the buffer on the device.
pub struct WgpuStorage {
    buffer: wgpu::Buffer,
    bytes: u64,
    device: WgpuDevice,
}

impl WgpuStorage {
    /// The storage buffer.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Logical size in bytes (the buffer may be padded).
    pub fn len_bytes(&self) -> u64 {
        self.bytes
    }

    /// The device the buffer lives on.
    pub fn device(&self) -> &WgpuDevice {
        &self.device
    }
}

impl fmt::Debug for WgpuStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuStorage")
            .field("bytes", &self.bytes)
            .field("adapter", &self.device.inner.info.name)
            .finish()
    }
}

impl WgpuDevice {
    /// Queues a copy of `src` into `dst` (at least as large) on the queue.
    pub fn copy(&self, src: &WgpuStorage, dst: &mut WgpuStorage) -> Result<()> {
        if dst.bytes < src.bytes {
            return Err(Error::config(format!(
                "a copy of {} bytes into a buffer of {}",
                src.bytes, dst.bytes
            )));
        }
        // Buffers are padded to 4 bytes; the copy covers the padded source.
        let bytes = src.buffer.size().min(dst.buffer.size());
        self.record(|enc| enc.copy_buffer_to_buffer(&src.buffer, 0, &dst.buffer, 0, Some(bytes)));
        Ok(())
    }
}

impl Clone for WgpuStorage {
    /// A device-side copy. An allocation failure here cannot be returned (`Clone` is
    /// infallible): it is recorded and reported by the next synchronize or download.
    fn clone(&self) -> Self {
        let d = &self.device.inner.device;
        let buffer = d.create_buffer(&wgpu::BufferDescriptor {
            label: Some("polyattn tensor (clone)"),
            size: self.buffer.size(),
            usage: self.buffer.usage(),
            mapped_at_creation: false,
        });
        self.device.record(|enc| {
            enc.copy_buffer_to_buffer(&self.buffer, 0, &buffer, 0, Some(self.buffer.size()))
        });
        WgpuStorage {
            buffer,
            bytes: self.bytes,
            device: self.device.clone(),
        }
    }
}
