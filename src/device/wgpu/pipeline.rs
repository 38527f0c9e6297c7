//! Pipeline compilation and caching: a WGSL module (a family's `key()` and `source()`) to a
//! compute pipeline on the device, compiled once per device and key (the device's cache), inside
//! an error scope so that a shader the driver rejects is an [`Error::Device`] naming the
//! specialisation, not a panic. Bind-group layouts are explicit, from the kernel's
//! [`Bindings`] (not derived from the shader), so every variant of a kernel has the same
//! bindings. Modules that use cooperative matrices go to the driver as SPIR-V through
//! [`coop_spirv`](crate::device::coop_spirv); every other module through wgpu's WGSL path.

use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::kernels::tuning_env::{self, Env};
use crate::kernels::wgsl::Bindings;

use super::WgpuDevice;
pub use crate::device::wgsl::LoopBounding;

/// The bind-group layout entries of `bindings`: the uniform parameter block at binding 0,
/// then the kernel's storage bindings.
fn layout_entries(bindings: Bindings) -> Vec<wgpu::BindGroupLayoutEntry> {
    let mut v = vec![wgpu::BindGroupLayoutEntry {
        binding: 0,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }];
    v.extend(
        bindings
            .storage()
            .iter()
            .map(|&(binding, read_only)| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            }),
    );
    v
}

/// The compiled pipeline of a specialisation (compiled on first use, then cached on the
/// device).
pub fn pipeline(
    dev: &WgpuDevice,
    key: &str,
    source: impl FnOnce() -> String,
    bindings: Bindings,
    needs_subgroups: bool,
) -> Result<wgpu::ComputePipeline> {
    pipeline_with(
        dev,
        key,
        source,
        bindings,
        needs_subgroups,
        LoopBounding::Forced,
    )
}

/// [`pipeline`], choosing the loop bounding. [`PipelineTuning::loop_bounding`]
/// (`POLYATTN_WGPU_LOOP_BOUNDING=1`) forces the counters everywhere;
/// [`PipelineTuning::log_pipelines`] prints the key of every pipeline compiled (to stderr).
pub fn pipeline_with(
    dev: &WgpuDevice,
    key: &str,
    source: impl FnOnce() -> String,
    bindings: Bindings,
    needs_subgroups: bool,
    loops: LoopBounding,
) -> Result<wgpu::ComputePipeline> {
    let knobs = PipelineTuning::get();
    let loops = if knobs.loop_bounding {
        LoopBounding::Forced
    } else {
        loops
    };
    if needs_subgroups && !dev.has_subgroups() {
        return Err(Error::Device {
            backend: "wgpu".into(),
            message: format!("{key} needs subgroup operations, which this adapter lacks"),
        });
    }
    dev.cached_pipeline(key, |device| {
        // `POLYATTN_WGPU_LOG_PIPELINES=1`: which specialisation a tuning knob actually
        // produced (a tile or blocking that does not fit falls back to another form), and
        // what its creation cost.
        let started = knobs.log_pipelines.then(std::time::Instant::now);
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let source = source();
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(key),
            source: wgpu::ShaderSource::Wgsl(source.as_str().into()),
        };
        let module = if source.contains("enable wgpu_cooperative_matrix;") {
            // Cooperative-matrix shaders: naga's SPIR-V with workgroup accesses marked
            // non-private (see `coop_spirv`), passed through.
            let words = crate::device::coop_spirv::compile(&source).map_err(|e| Error::Device {
                backend: "wgpu".into(),
                message: format!("compiling {key} failed: {e}"),
            })?;
            if !dev.features().contains(wgpu::Features::PASSTHROUGH_SHADERS) {
                return Err(Error::Device {
                    backend: "wgpu".into(),
                    message: format!("{key} needs PASSTHROUGH_SHADERS, which the device lacks"),
                });
            }
            // Passthrough modules state their workgroup size; the generated header has it.
            let wg = source
                .lines()
                .find_map(|l| l.strip_prefix("const WG: u32 = "))
                .and_then(|v| v.trim_end_matches(['u', ';']).parse::<u32>().ok())
                .ok_or_else(|| Error::Device {
                    backend: "wgpu".into(),
                    message: format!("{key}: no `const WG: u32` in the generated header"),
                })?;
            // SAFETY: the words are naga's validated translation of our WGSL (indices
            // clamped into their arrays), changed only by memory-operand flags; the
            // pipeline layout below is the shader's own bindings.
            unsafe {
                device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                    label: Some(key),
                    entry_points: std::borrow::Cow::Owned(vec![
                        wgpu::PassthroughShaderEntryPoint {
                            name: "main".into(),
                            workgroup_size: (wg, 1, 1),
                        },
                    ]),
                    spirv: Some(std::borrow::Cow::Owned(words)),
                    ..Default::default()
                })
            }
        } else {
            match loops {
                LoopBounding::Forced => device.create_shader_module(desc),
                // SAFETY: `LoopBounding::Off` is only passed for shaders whose loops all
                // terminate (see its docs); every other runtime check stays on.
                LoopBounding::Off => unsafe {
                    device.create_shader_module_trusted(
                        desc,
                        wgpu::ShaderRuntimeChecks {
                            force_loop_bounding: false,
                            ..wgpu::ShaderRuntimeChecks::checked()
                        },
                    )
                },
            }
        };
        let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(key),
            entries: &layout_entries(bindings),
        });
        let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(key),
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        });
        let p = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(key),
            layout: Some(&layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[],
                // Every shader writes workgroup memory before reading it.
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Device {
                backend: "wgpu".into(),
                message: format!("compiling {key} failed: {e}"),
            });
        }
        if let Some(t) = started {
            eprintln!(
                "polyattn wgpu: compiled pipeline `{key}` in {:.0} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(p)
    })
}

/// The runtime's knobs of pipeline compilation (every WGSL kernel, attention or not), read
/// once per process through the same parser as the family's
/// [`WgpuTuning`](crate::kernels::wgsl::WgpuTuning).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineTuning {
    /// Put naga's loop-bounding counters back into every kernel
    /// (`POLYATTN_WGPU_LOOP_BOUNDING=0|1`; default off: the kernels' loops are bounded by
    /// construction, and the counters cost registers and time on GPUs).
    pub loop_bounding: bool,
    /// Print the key of every pipeline compiled, and how long the driver took, to stderr
    /// (`POLYATTN_WGPU_LOG_PIPELINES=0|1`; default off): which specialisation a tuning knob
    /// actually produced (a tile or blocking that does not fit falls back to another form),
    /// and which specialisations dominate a test run's time on a CPU adapter.
    pub log_pipelines: bool,
}

impl PipelineTuning {
    /// The process's pipeline knobs, read on first use.
    pub fn get() -> &'static PipelineTuning {
        static T: OnceLock<PipelineTuning> = OnceLock::new();
        T.get_or_init(|| Self::from_lookup(&tuning_env::process_env))
    }

    /// The knobs with the variables read through `lookup`.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Self {
        let env = Env::new(lookup);
        PipelineTuning {
            loop_bounding: env.switch("POLYATTN_WGPU_LOOP_BOUNDING", false),
            log_pipelines: env.switch("POLYATTN_WGPU_LOG_PIPELINES", false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::tuning_env::table as lookup;

    #[test]
    fn pipeline_knobs_parse() {
        let p = PipelineTuning::from_lookup(&lookup(&[("POLYATTN_WGPU_LOG_PIPELINES", "1")]));
        assert!(p.log_pipelines && !p.loop_bounding);
    }
}
