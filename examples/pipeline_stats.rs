//! What the Vulkan driver made of the WGSL prefill kernels: registers per thread, spills,
//! workgroup memory, as the driver reports them through `VK_KHR_pipeline_executable_properties`
//! (NVIDIA's driver does; Mesa's lavapipe does not).
//!
//! Why: the WGPU prefill forms are tuned through knobs (rows and keys per tile, threads, the
//! per-thread register block), and whether a shape runs one or two workgroups per SM is
//! decided by its register count, which neither wgpu nor naga can tell. This builds the same
//! `paged_attention.wgsl` specialisations the backend would (`wgsl::AttentionShader`),
//! translates them with naga to SPIR-V and compiles each on the first Vulkan device that
//! offers the extension, printing the driver's statistics.
//!
//! ```text
//! cargo run --release --example pipeline_stats                  # the built-in list
//! cargo run --release --example pipeline_stats -- 64x64:512:4x1 96x32:256:4x4 coop:64x64:4
//! ```
//! A spec is `ROWSxKEYS:THREADS:KxC` for the fused-softmax f16 form (tiled2h) at head size
//! 128 with subgroups of 32, paged f16 cache, unrolled; a leading `f32:` asks for the f32
//! fused-softmax form (tiled2), `coop:ROWSxKEYS[:SPLIT]` for the cooperative-matrix form.

use std::ffi::{c_char, CStr};

use ash::vk;
use naga::back::spv;
use naga::valid::{Capabilities, ValidationFlags, Validator};
use polyattn::device::coop_spirv;
use polyattn::kernels::wgsl::{self, AttentionShader, Tiled2};
use polyattn::DType;

/// One specialisation to compile, from a spec string (see the module docs).
fn parse_spec(spec: &str) -> Option<AttentionShader> {
    if let Some(rest) = spec.strip_prefix("coop:") {
        // coop:ROWSxKEYS[:SPLIT]
        let (shape, split) = rest.split_once(':').unwrap_or((rest, "1"));
        let (m, n) = shape.split_once('x')?;
        let (m, n, q) = (m.parse().ok()?, n.parse().ok()?, split.parse().ok()?);
        return Some(wgsl::coop_shader_split(128, m, n, q, true));
    }
    let (f32_form, rest) = match spec.strip_prefix("f32:") {
        Some(r) => (true, r),
        None => (false, spec),
    };
    let mut parts = rest.split(':');
    let (m, n) = parts.next()?.split_once('x')?;
    let wg: u32 = parts.next()?.parse().ok()?;
    let (k, c) = parts.next().unwrap_or("4x4").split_once('x')?;
    let dtype = if f32_form { DType::F32 } else { DType::F16 };
    Some(AttentionShader {
        head_size: 128,
        block_m: m.parse().ok()?,
        block_n: n.parse().ok()?,
        q_dtype: dtype,
        kv_dtype: dtype,
        paged: true,
        subgroups: true,
        unrolled: true,
        tiled2: Some(Tiled2 {
            workgroup: wg,
            max_key_lanes: 32,
            half: !f32_form,
            block: (k.parse().ok()?, c.parse().ok()?),
            coop: false,
        }),
    })
}

/// The f16 shapes the tuning sweeps time (benches/RESULTS.md), so their register counts can
/// be read beside the times: the GPU default first.
const DEFAULT_SPECS: &[&str] = &[
    "64x64:512:4x1",
    "64x64:512:4x4",
    "64x64:256:4x4",
    "64x64:1024:4x1",
    "64x32:128:4x4",
    "64x32:512:4x1",
    "32x32:128:4x4",
    "f32:64x16:128:4x4",
    "coop:64x64:4",
];

/// SPIR-V for a WGSL module, with the capabilities the backend asks for.
fn spirv(source: &str) -> Result<Vec<u32>, String> {
    if source.contains("enable wgpu_cooperative_matrix;") {
        // The backend's own translation (workgroup accesses marked non-private).
        return coop_spirv::compile(source);
    }
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let mut caps = Capabilities::SUBGROUP;
    if source.lines().any(|l| l == "enable f16;") {
        caps |= Capabilities::SHADER_FLOAT16;
    }
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    let opts = spv::Options {
        lang_version: (1, 3),
        ..Default::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    spv::write_vec(&module, &info, &opts, Some(&pipeline)).map_err(|e| e.to_string())
}

/// (group, binding, is_uniform) of every resource the module declares.
fn bindings(source: &str) -> Result<Vec<(u32, u32, bool)>, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let mut out = Vec::new();
    for (_, var) in module.global_variables.iter() {
        if let Some(rb) = &var.binding {
            let uniform = matches!(var.space, naga::AddressSpace::Uniform);
            out.push((rb.group, rb.binding, uniform));
        }
    }
    Ok(out)
}

struct Vulkan {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    exec: ash::khr::pipeline_executable_properties::Device,
    name: String,
}

impl Vulkan {
    fn open() -> Result<Self, String> {
        // SAFETY: loads the system's Vulkan loader; every call below follows the spec's valid
        // usage (handles created here, destroyed in Drop).
        unsafe {
            let entry = ash::Entry::load().map_err(|e| format!("no Vulkan loader: {e}"))?;
            let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
            let instance = entry
                .create_instance(
                    &vk::InstanceCreateInfo::default().application_info(&app),
                    None,
                )
                .map_err(|e| format!("vkCreateInstance: {e}"))?;
            let ext = ash::khr::pipeline_executable_properties::NAME;
            let mut chosen = None;
            for pd in instance
                .enumerate_physical_devices()
                .map_err(|e| e.to_string())?
            {
                let props = instance.get_physical_device_properties(pd);
                let name = CStr::from_ptr(props.device_name.as_ptr())
                    .to_string_lossy()
                    .into_owned();
                let exts = instance
                    .enumerate_device_extension_properties(pd)
                    .map_err(|e| e.to_string())?;
                let has = exts
                    .iter()
                    .any(|e| CStr::from_ptr(e.extension_name.as_ptr()) == ext);
                if !has {
                    eprintln!("{name}: no {}", ext.to_string_lossy());
                    continue;
                }
                let qf = instance
                    .get_physical_device_queue_family_properties(pd)
                    .iter()
                    .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE));
                if let Some(qf) = qf {
                    chosen = Some((pd, qf as u32, name));
                    break;
                }
            }
            let Some((pd, qf, name)) = chosen else {
                instance.destroy_instance(None);
                return Err(format!("no Vulkan device offers {}", ext.to_string_lossy()));
            };
            let prio = [1.0f32];
            let queues = [vk::DeviceQueueCreateInfo::default()
                .queue_family_index(qf)
                .queue_priorities(&prio)];
            // Cooperative matrices (and the Vulkan memory model their SPIR-V declares) where
            // offered, so `coop:` specs compile too.
            let coop_ext = ash::khr::cooperative_matrix::NAME;
            let has_coop = instance
                .enumerate_device_extension_properties(pd)
                .map_err(|e| e.to_string())?
                .iter()
                .any(|e| CStr::from_ptr(e.extension_name.as_ptr()) == coop_ext);
            let mut ext_names: Vec<*const c_char> = vec![ext.as_ptr()];
            if has_coop {
                ext_names.push(coop_ext.as_ptr());
            }
            let mut f_coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default()
                .cooperative_matrix(has_coop);
            let mut f_exec = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
                .pipeline_executable_info(true);
            let mut f11 = vk::PhysicalDeviceVulkan11Features::default()
                .storage_buffer16_bit_access(true)
                .uniform_and_storage_buffer16_bit_access(true);
            let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
                .shader_float16(true)
                .vulkan_memory_model(has_coop);
            let info = vk::DeviceCreateInfo::default()
                .queue_create_infos(&queues)
                .enabled_extension_names(&ext_names)
                .push_next(&mut f_exec)
                .push_next(&mut f11)
                .push_next(&mut f12)
                .push_next(&mut f_coop);
            let device = match instance.create_device(pd, &info, None) {
                Ok(d) => d,
                Err(e) => {
                    instance.destroy_instance(None);
                    return Err(format!("vkCreateDevice on {name}: {e}"));
                }
            };
            let exec = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
            Ok(Vulkan {
                _entry: entry,
                instance,
                device,
                exec,
                name,
            })
        }
    }

    /// The driver's statistics for one compute module: (name, value) pairs.
    fn stats(
        &self,
        words: &[u32],
        binds: &[(u32, u32, bool)],
    ) -> Result<Vec<(String, String)>, String> {
        // SAFETY: see `open`; every handle created here is destroyed before returning.
        unsafe {
            let d = &self.device;
            let module = d
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(words), None)
                .map_err(|e| format!("vkCreateShaderModule: {e}"))?;
            let groups = binds.iter().map(|b| b.0 + 1).max().unwrap_or(0);
            let mut layouts = Vec::new();
            for g in 0..groups {
                let entries: Vec<_> = binds
                    .iter()
                    .filter(|b| b.0 == g)
                    .map(|&(_, b, uniform)| {
                        vk::DescriptorSetLayoutBinding::default()
                            .binding(b)
                            .descriptor_type(if uniform {
                                vk::DescriptorType::UNIFORM_BUFFER
                            } else {
                                vk::DescriptorType::STORAGE_BUFFER
                            })
                            .descriptor_count(1)
                            .stage_flags(vk::ShaderStageFlags::COMPUTE)
                    })
                    .collect();
                layouts.push(
                    d.create_descriptor_set_layout(
                        &vk::DescriptorSetLayoutCreateInfo::default().bindings(&entries),
                        None,
                    )
                    .map_err(|e| e.to_string())?,
                );
            }
            let layout = d
                .create_pipeline_layout(
                    &vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts),
                    None,
                )
                .map_err(|e| e.to_string())?;
            let entry = c"main";
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(entry);
            let info = vk::ComputePipelineCreateInfo::default()
                .flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR)
                .stage(stage)
                .layout(layout);
            let made = d.create_compute_pipelines(vk::PipelineCache::null(), &[info], None);
            let result = match made {
                Ok(p) => {
                    let pipe = p[0];
                    let mut out = Vec::new();
                    let execs = self
                        .exec
                        .get_pipeline_executable_properties(
                            &vk::PipelineInfoKHR::default().pipeline(pipe),
                        )
                        .map_err(|e| e.to_string())?;
                    for i in 0..execs.len() as u32 {
                        let stats = self
                            .exec
                            .get_pipeline_executable_statistics(
                                &vk::PipelineExecutableInfoKHR::default()
                                    .pipeline(pipe)
                                    .executable_index(i),
                            )
                            .map_err(|e| e.to_string())?;
                        for s in stats {
                            let name = CStr::from_ptr(s.name.as_ptr()).to_string_lossy();
                            let v = match s.format {
                                vk::PipelineExecutableStatisticFormatKHR::BOOL32 => {
                                    (s.value.b32 != 0).to_string()
                                }
                                vk::PipelineExecutableStatisticFormatKHR::INT64 => {
                                    s.value.i64.to_string()
                                }
                                vk::PipelineExecutableStatisticFormatKHR::UINT64 => {
                                    s.value.u64.to_string()
                                }
                                _ => format!("{:.3}", s.value.f64),
                            };
                            out.push((name.into_owned(), v));
                        }
                    }
                    d.destroy_pipeline(pipe, None);
                    Ok(out)
                }
                Err((_, e)) => Err(format!("vkCreateComputePipelines: {e}")),
            };
            d.destroy_pipeline_layout(layout, None);
            for l in layouts {
                d.destroy_descriptor_set_layout(l, None);
            }
            d.destroy_shader_module(module, None);
            result
        }
    }
}

impl Drop for Vulkan {
    fn drop(&mut self) {
        // SAFETY: no other handle of this device or instance is alive.
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let specs: Vec<String> = if args.is_empty() {
        DEFAULT_SPECS.iter().map(|s| s.to_string()).collect()
    } else {
        args
    };
    let vk = match Vulkan::open() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("pipeline_stats: skipped: {e}");
            return;
        }
    };
    println!("device: {}", vk.name);
    for spec in &specs {
        let Some(shader) = parse_spec(spec) else {
            eprintln!("{spec}: not ROWSxKEYS:THREADS:KxC[p]");
            continue;
        };
        let key = shader.key();
        if shader.blocking().is_none() {
            println!("{spec}: {key}: no register blocking for this shape");
            continue;
        }
        let bytes = shader.shared_bytes();
        let source = shader.source();
        let line = spirv(&source)
            .and_then(|w| Ok((w, bindings(&source)?)))
            .and_then(|(w, b)| vk.stats(&w, &b));
        match line {
            Ok(stats) => {
                let s: Vec<String> = stats.iter().map(|(n, v)| format!("{n}={v}")).collect();
                println!(
                    "{spec}: {key} ({bytes} B workgroup memory): {}",
                    s.join(", ")
                );
            }
            Err(e) => println!("{spec}: {key}: {e}"),
        }
    }
}
