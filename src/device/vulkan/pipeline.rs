//! Compute pipelines from WGSL and their dispatch: naga parses and validates a module of the
//! WGSL family, its group-0 bindings are reflected from the IR ([`ModuleBinding`]: uniform or
//! storage buffer, read-only or not, one buffer or a binding array of them — how a tensor
//! stored in chunks is bound), naga writes SPIR-V (with the same restricting bounds
//! checks as the wgpu runtime), and [`ComputePipeline`] holds the shader module, descriptor
//! set layout, pipeline layout and pipeline. [`VulkanDevice::dispatch`] binds buffers to those
//! bindings and runs one dispatch; [`VulkanDevice::record`] records several ([`Step`]s) once
//! into a [`Recording`] that [`VulkanDevice::submit`] re-submits.

use ash::vk;
use naga::back::spv;
use naga::valid::{Capabilities, ValidationFlags, Validator};

use std::sync::Arc;
use std::time::Duration;

use crate::device::wgsl::{LoopBounding, WgslDeviceInfo};
use crate::error::{Error, Result};

use super::queue::Keep;
use super::{vk_error, Inner, VulkanBuffer, VulkanDevice};

/// What a binding of a module is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingKind {
    /// `var<uniform>`.
    Uniform,
    /// `var<storage, read>` or `var<storage, read_write>`.
    Storage {
        /// Whether the shader may write it.
        writable: bool,
    },
}

/// One buffer binding of a module's group 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleBinding {
    /// Its `@binding` number.
    pub binding: u32,
    /// Uniform or storage.
    pub kind: BindingKind,
    /// Buffers it binds: 1, or the length of a `binding_array` (given as that many
    /// consecutive entries with this number).
    pub count: u32,
}

fn compile_error(key: &str, message: String) -> Error {
    Error::Device {
        backend: "VULKAN".into(),
        message: format!("module {key}: {message}"),
    }
}

/// SPIR-V words, the group-0 buffer bindings and the workgroup's invocations of WGSL
/// module `source` (entry point `main`), validated with what `device` offers (subgroup
/// operations, f16) and written with or without naga's loop-bounding counters.
pub fn translate(
    key: &str,
    source: &str,
    device: &WgslDeviceInfo,
    loops: LoopBounding,
) -> Result<(Vec<u32>, Vec<ModuleBinding>, u32)> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| compile_error(key, e.emit_to_string(source)))?;
    let mut caps = Capabilities::empty();
    if device.subgroups {
        caps |= Capabilities::SUBGROUP | Capabilities::SUBGROUP_BARRIER;
    }
    if device.f16 {
        caps |= Capabilities::SHADER_FLOAT16;
    }
    // The coop prefill form: only where the device enabled cooperative matrices (the layer
    // picks the form only then), with the workgroup accesses patched as on wgpu.
    let coop = source.contains("enable wgpu_cooperative_matrix;");
    let bf16 = source.contains(crate::kernels::wgsl::BF16_TILES_MARKER);
    if coop {
        if !device.coop || (bf16 && !device.coop_bf16) {
            return Err(compile_error(
                key,
                format!(
                    "the module uses {}cooperative matrices, which this device does not offer",
                    if bf16 { "bf16 " } else { "" }
                ),
            ));
        }
        caps |= Capabilities::COOPERATIVE_MATRIX;
    }
    // A tensor stored in chunks, bound as a binding array (indexed by constants through a
    // `switch`, or directly where the device takes non-uniform indices).
    if source.contains("enable wgpu_binding_array;") {
        caps |= Capabilities::STORAGE_BUFFER_BINDING_ARRAY;
        if device.binding_array_any_index {
            caps |= Capabilities::STORAGE_BUFFER_BINDING_ARRAY_NON_UNIFORM_INDEXING;
        }
    }
    let mut validator = Validator::new(ValidationFlags::all(), caps);
    if device.subgroups {
        validator
            .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all());
    }
    let info = validator
        .validate(&module)
        .map_err(|e| compile_error(key, e.emit_to_string(source)))?;
    let mut bindings = Vec::new();
    for (_, var) in module.global_variables.iter() {
        let Some(rb) = &var.binding else { continue };
        if rb.group != 0 {
            return Err(compile_error(
                key,
                format!(
                    "binding {} is in group {}: only group 0 is bound",
                    rb.binding, rb.group
                ),
            ));
        }
        let kind = match var.space {
            naga::AddressSpace::Uniform => BindingKind::Uniform,
            naga::AddressSpace::Storage { access } => BindingKind::Storage {
                writable: access.contains(naga::StorageAccess::STORE),
            },
            other => {
                return Err(compile_error(
                    key,
                    format!(
                        "binding {} is a {other:?}: only buffers are bound",
                        rb.binding
                    ),
                ))
            }
        };
        let count = match module.types[var.ty].inner {
            naga::TypeInner::BindingArray {
                size: naga::ArraySize::Constant(n),
                ..
            } => n.get(),
            naga::TypeInner::BindingArray { .. } => {
                return Err(compile_error(
                    key,
                    format!(
                        "binding {} is a binding array without a constant length",
                        rb.binding
                    ),
                ))
            }
            _ => 1,
        };
        bindings.push(ModuleBinding {
            binding: rb.binding,
            kind,
            count,
        });
    }
    bindings.sort_by_key(|b| b.binding);
    let options = spv::Options {
        force_loop_bounding: loops == LoopBounding::Forced,
        ..crate::device::spirv::spirv_options()
    };
    let mut words = spv::write_vec(&module, &info, &options, None)
        .map_err(|e| compile_error(key, format!("SPIR-V: {e}")))?;
    if coop {
        crate::device::coop_spirv::non_private_workgroup_accesses(&mut words)
            .map_err(|e| compile_error(key, e))?;
        if bf16 {
            crate::device::coop_spirv::retype_f16_as_bf16(&mut words)
                .map_err(|e| compile_error(key, e))?;
        }
    }
    let invocations = module
        .entry_points
        .iter()
        .find(|e| e.name == "main")
        .map_or(1, |e| {
            e.workgroup_size
                .iter()
                .fold(1u32, |n, &d| n.saturating_mul(d))
        });
    Ok((words, bindings, invocations))
}

/// A compute pipeline of one module, destroyed when dropped.
pub struct ComputePipeline {
    device: Arc<Inner>,
    key: String,
    bindings: Vec<ModuleBinding>,
    shader: vk::ShaderModule,
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
    /// Its buffers are pushed into the command buffer (`VK_KHR_push_descriptor`) rather
    /// than bound as an allocated descriptor set.
    push: bool,
}

impl std::fmt::Debug for ComputePipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputePipeline")
            .field("key", &self.key)
            .field("bindings", &self.bindings)
            .finish()
    }
}

impl Drop for ComputePipeline {
    fn drop(&mut self) {
        let d = &self.device.device;
        // SAFETY: created on this device; a pending submission that runs the pipeline keeps
        // it alive (`queue::Keep`) or was waited on, so none uses it now.
        unsafe {
            d.destroy_pipeline(self.pipeline, None);
            d.destroy_pipeline_layout(self.layout, None);
            d.destroy_descriptor_set_layout(self.set_layout, None);
            d.destroy_shader_module(self.shader, None);
        }
    }
}

impl ComputePipeline {
    /// The module's group-0 bindings.
    pub fn bindings(&self) -> &[ModuleBinding] {
        &self.bindings
    }

    /// Whether its dispatches push their buffers (`VK_KHR_push_descriptor`: no descriptor
    /// set is allocated or written per dispatch); false where the device has no push
    /// descriptors or the module binds more than one push may set.
    pub fn pushes_descriptors(&self) -> bool {
        self.push
    }
}

/// How a step's buffers reach its pipeline.
pub(crate) enum Bind {
    /// An allocated and written descriptor set.
    Set(vk::DescriptorSet),
    /// Descriptors pushed into the command buffer before the dispatch: per binding its
    /// number, type and buffers.
    Push(Vec<(u32, vk::DescriptorType, Vec<vk::DescriptorBufferInfo>)>),
}

fn descriptor_type(kind: BindingKind) -> vk::DescriptorType {
    match kind {
        BindingKind::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
        BindingKind::Storage { .. } => vk::DescriptorType::STORAGE_BUFFER,
    }
}

impl VulkanDevice {
    /// The subgroup size a pipeline of a workgroup of `invocations` requires: the device's
    /// (where it can require one) when the workgroup fits the subgroups that size allows.
    /// On a device whose subgroup size varies the kernels plan for the required size and
    /// keep their workgroups within that bound (`WgslDeviceInfo::max_invocations`), so a
    /// larger one is an error; on a device of one size it runs at that size unrequired.
    fn required_size_for(&self, key: &str, invocations: u32) -> Result<Option<u32>> {
        let Some((size, most)) = self.inner().required_subgroup_size else {
            return Ok(None);
        };
        if invocations <= most {
            return Ok(Some(size));
        }
        let (min, max) = self.inner().device_subgroup_sizes;
        if min == max {
            return Ok(None);
        }
        Err(compile_error(
            key,
            format!(
                "a workgroup of {invocations} invocations: at the required subgroup size \
                 {size} this device takes at most {most}"
            ),
        ))
    }

    /// The pipeline of WGSL module `source` (named `key` in errors).
    pub fn pipeline(&self, key: &str, source: &str) -> Result<ComputePipeline> {
        self.pipeline_with(key, source, LoopBounding::Forced)
    }

    /// [`VulkanDevice::pipeline`] with the loop bounding chosen.
    pub fn pipeline_with(
        &self,
        key: &str,
        source: &str,
        loops: LoopBounding,
    ) -> Result<ComputePipeline> {
        let (words, bindings, invocations) = translate(key, source, &self.inner().wgsl, loops)?;
        let required_size = self.required_size_for(key, invocations)?;
        let descriptors: u32 = bindings.iter().map(|b| b.count).sum();
        let push = self
            .inner()
            .push
            .as_ref()
            .is_some_and(|(_, max)| descriptors <= *max);
        let d = self.raw();
        let entries: Vec<_> = bindings
            .iter()
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b.binding)
                    .descriptor_type(descriptor_type(b.kind))
                    .descriptor_count(b.count)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        // SAFETY: valid create infos; on any failure the objects made so far are destroyed
        // before returning.
        unsafe {
            let shader = d
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
                .map_err(|e| vk_error("vkCreateShaderModule", e))?;
            let flags = if push {
                vk::DescriptorSetLayoutCreateFlags::PUSH_DESCRIPTOR_KHR
            } else {
                vk::DescriptorSetLayoutCreateFlags::empty()
            };
            let set_layout = match d.create_descriptor_set_layout(
                &vk::DescriptorSetLayoutCreateInfo::default()
                    .flags(flags)
                    .bindings(&entries),
                None,
            ) {
                Ok(l) => l,
                Err(e) => {
                    d.destroy_shader_module(shader, None);
                    return Err(vk_error("vkCreateDescriptorSetLayout", e));
                }
            };
            let set_layouts = [set_layout];
            let layout = match d.create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts),
                None,
            ) {
                Ok(l) => l,
                Err(e) => {
                    d.destroy_descriptor_set_layout(set_layout, None);
                    d.destroy_shader_module(shader, None);
                    return Err(vk_error("vkCreatePipelineLayout", e));
                }
            };
            // Every pipeline at the device's required size, where it has one: the kernels were
            // chosen for exactly that size (`WgslDeviceInfo::subgroup_sizes`).
            let mut size = vk::PipelineShaderStageRequiredSubgroupSizeCreateInfo::default()
                .required_subgroup_size(required_size.unwrap_or(0));
            let mut stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(shader)
                .name(c"main");
            if required_size.is_some() {
                stage = stage.push_next(&mut size);
            }
            let info = vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(layout);
            let pipeline =
                match d.create_compute_pipelines(self.inner().pipeline_cache, &[info], None) {
                    Ok(p) => p[0],
                    Err((_, e)) => {
                        d.destroy_pipeline_layout(layout, None);
                        d.destroy_descriptor_set_layout(set_layout, None);
                        d.destroy_shader_module(shader, None);
                        return Err(vk_error(&format!("vkCreateComputePipelines ({key})"), e));
                    }
                };
            Ok(ComputePipeline {
                device: self.inner_arc().clone(),
                key: key.to_string(),
                bindings,
                shader,
                set_layout,
                layout,
                pipeline,
                push,
            })
        }
    }

    /// How `buffers`, given as (binding, buffer), reach `pipeline`'s bindings: every binding
    /// of the module exactly once (a binding array: as many consecutive entries as its
    /// length, its elements in order), each buffer within the device's limit for its kind.
    /// Pushed into the command buffer where the pipeline pushes descriptors; otherwise a
    /// descriptor set from `shared` where that pool has room, else from a pool of its own
    /// (returned, for the caller to destroy once no submission uses the set).
    fn bind(
        &self,
        pipeline: &ComputePipeline,
        buffers: &[(u32, &VulkanBuffer)],
        shared: Option<vk::DescriptorPool>,
    ) -> Result<(Option<vk::DescriptorPool>, Bind)> {
        let mut infos = Vec::with_capacity(pipeline.bindings.len());
        for b in &pipeline.bindings {
            let given: Vec<&VulkanBuffer> = buffers
                .iter()
                .filter(|(n, _)| *n == b.binding)
                .map(|(_, buf)| *buf)
                .collect();
            if given.len() != b.count as usize {
                return Err(Error::config(format!(
                    "{}: binding {} must be given exactly {} buffer{}, got {}",
                    pipeline.key,
                    b.binding,
                    b.count,
                    if b.count == 1 { "" } else { "s" },
                    given.len()
                )));
            }
            let limit = match b.kind {
                BindingKind::Uniform => u64::from(self.inner().limits.max_uniform_buffer_range),
                BindingKind::Storage { .. } => self.max_storage_range(),
            };
            let mut element_infos = Vec::with_capacity(given.len());
            for buf in given {
                if buf.len_bytes() > limit {
                    return Err(Error::config(format!(
                        "{}: a {}-byte buffer at binding {} exceeds the device's {limit}-byte \
                         range",
                        pipeline.key,
                        buf.len_bytes(),
                        b.binding
                    )));
                }
                element_infos.push(
                    vk::DescriptorBufferInfo::default()
                        .buffer(buf.raw())
                        .offset(0)
                        .range(vk::WHOLE_SIZE),
                );
            }
            infos.push((b, element_infos));
        }
        if let Some((n, _)) = buffers
            .iter()
            .find(|(n, _)| !pipeline.bindings.iter().any(|b| b.binding == *n))
        {
            return Err(Error::config(format!(
                "{}: the module has no binding {n}",
                pipeline.key
            )));
        }
        if pipeline.push {
            let pushed = infos
                .into_iter()
                .map(|(b, i)| (b.binding, descriptor_type(b.kind), i))
                .collect();
            return Ok((None, Bind::Push(pushed)));
        }
        let d = self.raw();
        let count = |uniform: bool| -> u32 {
            pipeline
                .bindings
                .iter()
                .filter(|b| (b.kind == BindingKind::Uniform) == uniform)
                .map(|b| b.count)
                .sum()
        };
        let (uniforms, storages) = (count(true), count(false));
        let mut sizes = Vec::new();
        if uniforms > 0 {
            sizes.push(vk::DescriptorPoolSize {
                ty: vk::DescriptorType::UNIFORM_BUFFER,
                descriptor_count: uniforms,
            });
        }
        if storages > 0 {
            sizes.push(vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: storages,
            });
        }
        let layouts = [pipeline.set_layout];
        let writes = |set: vk::DescriptorSet| {
            let writes: Vec<_> = infos
                .iter()
                .map(|(b, info)| {
                    vk::WriteDescriptorSet::default()
                        .dst_set(set)
                        .dst_binding(b.binding)
                        .descriptor_type(descriptor_type(b.kind))
                        .buffer_info(info)
                })
                .collect();
            // SAFETY: the set was just allocated; the buffers outlive its uses (the callers'
            // contract).
            unsafe { d.update_descriptor_sets(&writes, &[]) };
        };
        if let Some(pool) = shared {
            // SAFETY: a valid allocate info; a full pool is an error, not undefined behaviour.
            if let Ok(sets) = unsafe {
                d.allocate_descriptor_sets(
                    &vk::DescriptorSetAllocateInfo::default()
                        .descriptor_pool(pool)
                        .set_layouts(&layouts),
                )
            } {
                writes(sets[0]);
                return Ok((None, Bind::Set(sets[0])));
            }
        }
        // SAFETY: valid create infos; the caller destroys the pool once no submission that
        // uses the set is pending.
        unsafe {
            let pool = d
                .create_descriptor_pool(
                    &vk::DescriptorPoolCreateInfo::default()
                        .max_sets(1)
                        .pool_sizes(&sizes),
                    None,
                )
                .map_err(|e| vk_error("vkCreateDescriptorPool", e))?;
            let set = match d.allocate_descriptor_sets(
                &vk::DescriptorSetAllocateInfo::default()
                    .descriptor_pool(pool)
                    .set_layouts(&layouts),
            ) {
                Ok(s) => s[0],
                Err(e) => {
                    d.destroy_descriptor_pool(pool, None);
                    return Err(vk_error("vkAllocateDescriptorSets", e));
                }
            };
            writes(set);
            Ok((Some(pool), Bind::Set(set)))
        }
    }

    /// Records `steps` into `cmd`, each dispatch's writes visible to the next one's reads.
    fn record_steps(&self, cmd: vk::CommandBuffer, steps: &[(&Step<'_>, &Bind)]) {
        let d = self.raw();
        for (k, (step, set)) in steps.iter().enumerate() {
            // SAFETY: `cmd` is recording; the pipeline, its layout and the set are live for as
            // long as any submission of `cmd` (the callers' contract).
            unsafe {
                if k > 0 {
                    let barrier = vk::MemoryBarrier::default()
                        .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                        .dst_access_mask(
                            vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE,
                        );
                    d.cmd_pipeline_barrier(
                        cmd,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::DependencyFlags::empty(),
                        &[barrier],
                        &[],
                        &[],
                    );
                }
                d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, step.pipeline.pipeline);
                match set {
                    Bind::Set(set) => d.cmd_bind_descriptor_sets(
                        cmd,
                        vk::PipelineBindPoint::COMPUTE,
                        step.pipeline.layout,
                        0,
                        &[*set],
                        &[],
                    ),
                    Bind::Push(bindings) => {
                        if let Some((push, _)) = &self.inner().push {
                            let writes: Vec<_> = bindings
                                .iter()
                                .map(|(n, ty, infos)| {
                                    vk::WriteDescriptorSet::default()
                                        .dst_binding(*n)
                                        .descriptor_type(*ty)
                                        .buffer_info(infos)
                                })
                                .collect();
                            push.cmd_push_descriptor_set(
                                cmd,
                                vk::PipelineBindPoint::COMPUTE,
                                step.pipeline.layout,
                                0,
                                &writes,
                            );
                        }
                    }
                }
                let (x, y, z) = step.groups;
                d.cmd_dispatch(cmd, x, y, z);
            }
        }
    }

    /// Runs `pipeline` once on `groups` workgroups with `buffers` bound as (binding, buffer)
    /// (the checks of [`Step`]). Waits for the dispatch to finish.
    pub fn dispatch(
        &self,
        pipeline: &ComputePipeline,
        buffers: &[(u32, &VulkanBuffer)],
        groups: (u32, u32, u32),
    ) -> Result<()> {
        self.run(&[Step {
            pipeline,
            buffers: buffers.to_vec(),
            groups,
        }])
    }

    /// Runs `steps` in order in one submission (each dispatch's writes visible to the next
    /// one's reads) and waits for them; every step is checked as [`VulkanDevice::dispatch`]
    /// checks.
    pub fn run(&self, steps: &[Step<'_>]) -> Result<()> {
        let serial = self.run_kept(steps, Keep::default())?;
        self.wait_for(serial)
    }

    /// [`VulkanDevice::run`] without waiting: `keep` (which must hold every buffer and
    /// pipeline the steps bind, or the caller waits before they go) lives until the
    /// submission finishes; returns its serial.
    pub(crate) fn run_kept(&self, steps: &[Step<'_>], mut keep: Keep) -> Result<u64> {
        let mut q = self.lock_queue()?;
        let slot = self.begin_slot(&mut q)?;
        let mut pairs = Vec::with_capacity(steps.len());
        for step in steps {
            match self.bind(step.pipeline, &step.buffers, Some(slot.sets)) {
                Ok((pool, bind)) => {
                    keep.pools.extend(pool);
                    pairs.push((step, bind));
                }
                Err(e) => {
                    self.abandon(&mut q, slot, keep);
                    return Err(e);
                }
            }
        }
        let pairs: Vec<_> = pairs.iter().map(|(s, b)| (*s, b)).collect();
        self.record_steps(slot.cmd, &pairs);
        self.launch(&mut q, slot, keep)
    }

    /// Records `steps` once into a command buffer that [`VulkanDevice::submit`] runs any
    /// number of times: Vulkan's counterpart of a captured graph. The recording binds the
    /// buffers themselves (not their contents), so a later write into a bound buffer is what
    /// the next submission reads. Every step is checked as [`VulkanDevice::dispatch`] checks.
    pub fn record<'a>(&self, steps: &[Step<'a>]) -> Result<Recording<'a>> {
        self.record_with(steps, true)
    }

    /// [`VulkanDevice::record`], with the two timestamps only when `timestamps` (a graph's
    /// replays are not timed by them, and the query reset and writes cost each replay).
    pub(crate) fn record_with<'a>(
        &self,
        steps: &[Step<'a>],
        timestamps: bool,
    ) -> Result<Recording<'a>> {
        let mut pools = Vec::with_capacity(steps.len());
        let mut sets = Vec::with_capacity(steps.len());
        let free = |pools: &[vk::DescriptorPool]| {
            // SAFETY: nothing was submitted with these pools' sets.
            unsafe {
                for &p in pools {
                    self.raw().destroy_descriptor_pool(p, None);
                }
            }
        };
        for step in steps {
            match self.bind(step.pipeline, &step.buffers, None) {
                Ok((pool, bind)) => {
                    pools.extend(pool);
                    sets.push(bind);
                }
                Err(e) => {
                    free(&pools);
                    return Err(e);
                }
            }
        }
        let d = self.raw();
        // Two timestamps around the dispatches, where the compute queue has them.
        let queries = if timestamps && self.inner().timestamp_bits > 0 {
            let info = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(2);
            // SAFETY: a valid create info; the pool is destroyed by `Recording::drop`.
            match unsafe { d.create_query_pool(&info, None) } {
                Ok(q) => Some(q),
                Err(e) => {
                    free(&pools);
                    return Err(vk_error("vkCreateQueryPool", e));
                }
            }
        } else {
            None
        };
        let free = |pools: &[vk::DescriptorPool]| {
            free(pools);
            if let Some(q) = queries {
                // SAFETY: nothing was submitted with the query pool.
                unsafe { d.destroy_query_pool(q, None) };
            }
        };
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.inner().pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        let _queue = self
            .inner()
            .queue
            .lock()
            .map_err(|_| vk_error("the queue lock", vk::Result::ERROR_UNKNOWN))?;
        // SAFETY: the command pool is used under the queue lock only; the command buffer is
        // freed by `Recording::drop`.
        let cmd = unsafe {
            let cmd = match d.allocate_command_buffers(&alloc) {
                Ok(c) => c[0],
                Err(e) => {
                    free(&pools);
                    return Err(vk_error("vkAllocateCommandBuffers", e));
                }
            };
            let begin = vk::CommandBufferBeginInfo::default();
            if let Err(e) = d.begin_command_buffer(cmd, &begin) {
                d.free_command_buffers(self.inner().pool, &[cmd]);
                free(&pools);
                return Err(vk_error("vkBeginCommandBuffer", e));
            }
            self.after_earlier_submissions(cmd);
            if let Some(q) = queries {
                d.cmd_reset_query_pool(cmd, q, 0, 2);
                d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, q, 0);
            }
            let pairs: Vec<_> = steps.iter().zip(sets.iter()).collect();
            self.record_steps(cmd, &pairs);
            if let Some(q) = queries {
                d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, q, 1);
            }
            if let Err(e) = d.end_command_buffer(cmd) {
                d.free_command_buffers(self.inner().pool, &[cmd]);
                free(&pools);
                return Err(vk_error("vkEndCommandBuffer", e));
            }
            cmd
        };
        Ok(Recording {
            recorded: Recorded {
                device: self.clone(),
                cmd,
                pools,
                queries,
                last: std::sync::atomic::AtomicU64::new(0),
            },
            _borrows: std::marker::PhantomData,
        })
    }

    /// Submits `recording`, waits for it, and returns the device time its dispatches took
    /// (between its two timestamps); `None` when the compute queue has no timestamps.
    pub fn submit_timed(&self, recording: &Recording<'_>) -> Result<Option<Duration>> {
        self.submit(recording)?;
        let Some(q) = recording.recorded.queries else {
            return Ok(None);
        };
        let mut ticks = [0u64; 2];
        // SAFETY: both queries were written by the submission just waited on.
        unsafe {
            self.raw().get_query_pool_results(
                q,
                0,
                &mut ticks,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        }
        .map_err(|e| vk_error("vkGetQueryPoolResults", e))?;
        let delta = ticks[1].wrapping_sub(ticks[0]);
        Ok(Some(Duration::from_secs_f64(self.tick_seconds(delta))))
    }

    /// Submits `recording` and waits for it to finish.
    pub fn submit(&self, recording: &Recording<'_>) -> Result<()> {
        if !Arc::ptr_eq(self.inner_arc(), recording.recorded.device.inner_arc()) {
            return Err(Error::config(
                "a recording was submitted to a device it was not recorded on",
            ));
        }
        let serial = recording.recorded.submit()?;
        self.wait_for(serial)
    }
}

/// One dispatch of a [`Recording`]: `pipeline` on `groups` workgroups with `buffers` bound as
/// (binding, buffer).
#[derive(Clone, Debug)]
pub struct Step<'a> {
    /// The module's pipeline.
    pub pipeline: &'a ComputePipeline,
    /// Every binding of the module, once.
    pub buffers: Vec<(u32, &'a VulkanBuffer)>,
    /// Workgroups along x, y, z.
    pub groups: (u32, u32, u32),
}

impl<'a> Step<'a> {
    /// A step binding those of `buffers` that `pipeline`'s module declares: a kernel family's
    /// binding set may list a buffer a specialisation does not use (the copy probe has no
    /// parameters), and naga's reflection lists only what the module declares.
    pub fn declared(
        pipeline: &'a ComputePipeline,
        buffers: impl IntoIterator<Item = (u32, &'a VulkanBuffer)>,
        groups: (u32, u32, u32),
    ) -> Self {
        let buffers = buffers
            .into_iter()
            .filter(|(n, _)| pipeline.bindings.iter().any(|b| b.binding == *n))
            .collect();
        Step {
            pipeline,
            buffers,
            groups,
        }
    }
}

/// Dispatches recorded once ([`VulkanDevice::record`]) and submitted many times
/// ([`VulkanDevice::submit`]). It borrows the pipelines and buffers it binds, so none can be
/// freed while it exists.
pub struct Recording<'a> {
    recorded: Recorded,
    _borrows: std::marker::PhantomData<&'a ()>,
}

impl Recording<'_> {
    /// The command buffer and what it owns, without the borrows: for an owner that keeps
    /// what the recording binds alive itself ([`super::VulkanGraph`]).
    pub(crate) fn into_recorded(self) -> Recorded {
        self.recorded
    }
}

impl std::fmt::Debug for Recording<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recording")
            .field("steps", &self.recorded.pools.len())
            .finish()
    }
}

/// A recorded command buffer with its descriptor pools and timestamp queries, freed when
/// dropped (after its last submission finishes). Whoever holds it keeps the pipelines and
/// buffers it binds alive.
pub(crate) struct Recorded {
    device: VulkanDevice,
    cmd: vk::CommandBuffer,
    pools: Vec<vk::DescriptorPool>,
    /// Two timestamps around the dispatches, where the queue has them.
    queries: Option<vk::QueryPool>,
    /// The serial of its last submission (0: never submitted).
    last: std::sync::atomic::AtomicU64,
}

impl Recorded {
    /// No command buffer: a graph of no dispatch.
    pub(crate) fn empty(device: &VulkanDevice) -> Recorded {
        Recorded {
            device: device.clone(),
            cmd: vk::CommandBuffer::null(),
            pools: Vec::new(),
            queries: None,
            last: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Submits the command buffer without waiting, once its previous submission has
    /// finished (a command buffer recorded without simultaneous use may be pending once);
    /// returns the serial. Nothing to submit when empty (the last serial comes back).
    pub(crate) fn submit(&self) -> Result<u64> {
        use std::sync::atomic::Ordering;
        let previous = self.last.load(Ordering::SeqCst);
        if self.cmd == vk::CommandBuffer::null() {
            return Ok(previous);
        }
        self.device.wait_for(previous)?;
        let serial = self.device.submit_recorded(self.cmd)?;
        self.last.store(serial, Ordering::SeqCst);
        Ok(serial)
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        // Its last submission must finish before its objects go; if waiting fails (a lost
        // device), the whole device is waited on.
        let last = self.last.load(std::sync::atomic::Ordering::SeqCst);
        if self.device.wait_for(last).is_err() {
            // SAFETY: a plain wait on the device.
            let _ = unsafe { self.device.raw().device_wait_idle() };
        }
        // SAFETY: the command buffer's submissions have finished, so neither it nor its
        // descriptor sets are in use; the pool is freed under the queue lock like every
        // other use of it.
        unsafe {
            if self.cmd != vk::CommandBuffer::null() {
                if let Ok(_q) = self.device.inner().queue.lock() {
                    self.device
                        .raw()
                        .free_command_buffers(self.device.inner().pool, &[self.cmd]);
                }
            }
            for &p in &self.pools {
                self.device.raw().destroy_descriptor_pool(p, None);
            }
            if let Some(q) = self.queries {
                self.device.raw().destroy_query_pool(q, None);
            }
        }
    }
}

impl VulkanDevice {
    /// Starts a timed region on the device's clock: submits, without waiting, a command
    /// buffer that fills `clear` with zeros (when given: it evicts the caches, and keeps the
    /// device busy while the host submits the region) and then writes the first timestamp,
    /// once every earlier command has finished. False when the compute queue has no
    /// timestamps. [`VulkanDevice::timestamp_elapsed`] ends the region.
    pub fn timestamp_start(&self, clear: Option<&Arc<VulkanBuffer>>) -> Result<bool> {
        if self.inner().timestamp_bits == 0 {
            return Ok(false);
        }
        let d = self.raw();
        let pool = self.stamp_pool()?;
        let keep = Keep {
            buffers: clear.into_iter().cloned().collect(),
            ..Keep::default()
        };
        self.submit_async(keep, |cmd| {
            // SAFETY: `cmd` is recording; `clear` is kept until the submission finishes.
            unsafe {
                if let Some(b) = clear {
                    d.cmd_fill_buffer(cmd, b.raw(), 0, b.len_bytes(), 0);
                }
                d.cmd_reset_query_pool(cmd, pool, 0, 2);
                d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, pool, 0);
            }
        })?;
        Ok(true)
    }

    /// Ends the region [`VulkanDevice::timestamp_start`] began: writes the second timestamp
    /// once everything submitted since has finished, waits, and returns the seconds between
    /// the two; `None` when the compute queue has no timestamps.
    pub fn timestamp_elapsed(&self) -> Result<Option<f64>> {
        if self.inner().timestamp_bits == 0 {
            return Ok(None);
        }
        let d = self.raw();
        let pool = self.stamp_pool()?;
        self.submit_and_wait(|cmd| {
            // SAFETY: `cmd` is recording.
            unsafe { d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, pool, 1) };
        })?;
        let mut ticks = [0u64; 2];
        // SAFETY: both queries were written by submissions that have finished.
        unsafe {
            d.get_query_pool_results(
                pool,
                0,
                &mut ticks,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        }
        .map_err(|e| vk_error("vkGetQueryPoolResults", e))?;
        Ok(Some(self.tick_seconds(ticks[1].wrapping_sub(ticks[0]))))
    }

    /// The queue's two-query timestamp pool, made on first use.
    fn stamp_pool(&self) -> Result<vk::QueryPool> {
        let mut q = self.lock_queue()?;
        if q.stamps == vk::QueryPool::null() {
            let info = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(2);
            // SAFETY: a valid create info; the pool is destroyed with the queue state.
            q.stamps = unsafe { self.raw().create_query_pool(&info, None) }
                .map_err(|e| vk_error("vkCreateQueryPool", e))?;
        }
        Ok(q.stamps)
    }

    /// `ticks` of the compute queue's timestamp clock in seconds (its valid bits only).
    fn tick_seconds(&self, ticks: u64) -> f64 {
        let bits = self.inner().timestamp_bits;
        let mask = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        (ticks & mask) as f64 * f64::from(self.inner().limits.timestamp_period) * 1e-9
    }
}
