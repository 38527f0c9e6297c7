//! Glue between the impl and the shaders: pipeline compilation and caching, bind-group
//! layouts, uniform parameter blocks, dispatch geometry, buffer checks, and the
//! `merge_attn_states` op.
//!
//! Pipelines are compiled once per device and specialisation (the device's cache, keyed by
//! the shader's `key()`), inside an error scope so that a shader the driver rejects is an
//! [`Error::Device`] naming the specialisation, not a panic. Bind-group layouts are explicit
//! (not derived from the shader), so every variant of a kernel has the same bindings.

use std::sync::{Mutex, OnceLock};

use crate::device::{Storage, Tensor, WgpuDevice, WgpuStorage};
use crate::error::{Error, Result};

use crate::kernels::wgsl::{Bindings, MergeShader, ELEMENTWISE_WORKGROUP};

/// Bytes of one uniform parameter slot (WebGPU's largest uniform offset alignment).
pub const PARAM_SLOT_BYTES: u64 = 256;
/// u32 words in one parameter slot.
pub const PARAM_WORDS: usize = 64;

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

/// Whether naga adds its loop-bounding counters to a shader's loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopBounding {
    /// wgpu's default: every loop also counts down a 64-bit budget and breaks when it runs
    /// out. It guards against infinite loops, and its extra exit keeps drivers from fully
    /// unrolling short constant loops (so register arrays indexed by them spill).
    Forced,
    /// No counters, for shaders whose every loop has a bound that strictly advances (a
    /// constant, or a u32 counter stepping towards a bound it cannot overflow past);
    /// bounds checks on memory accesses stay on.
    Off,
}

/// [`pipeline`], choosing the loop bounding. [`PipelineTuning::loop_bounding`]
/// (`POLYATTN_WGPU_LOOP_BOUNDING=1`) forces the counters everywhere;
/// [`PipelineTuning::log_pipelines`] prints the key of every pipeline compiled (to stderr).
///
/// [`PipelineTuning::loop_bounding`]: super::tuning::PipelineTuning::loop_bounding
/// [`PipelineTuning::log_pipelines`]: super::tuning::PipelineTuning::log_pipelines
pub fn pipeline_with(
    dev: &WgpuDevice,
    key: &str,
    source: impl FnOnce() -> String,
    bindings: Bindings,
    needs_subgroups: bool,
    loops: LoopBounding,
) -> Result<wgpu::ComputePipeline> {
    let knobs = super::tuning::PipelineTuning::get();
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
        // Which specialisation a tuning knob actually produced (a tile or blocking that
        // does not fit falls back to another form): `POLYATTN_WGPU_LOG_PIPELINES=1`.
        if knobs.log_pipelines {
            eprintln!("polyattn wgpu: compiling pipeline `{key}`");
        }
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let source = source();
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(key),
            source: wgpu::ShaderSource::Wgsl(source.as_str().into()),
        };
        let module = if source.contains("enable wgpu_cooperative_matrix;") {
            // Cooperative-matrix shaders: naga's SPIR-V with workgroup accesses marked
            // non-private (see `coop_spirv`), passed through.
            let words = super::coop_spirv::compile(&source).map_err(|e| Error::Device {
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
        Ok(p)
    })
}

/// Workgroups `(x, z)` for `groups` flat workgroups: x ≤ the per-dimension limit, z the
/// overflow (shaders recover the flat index as `z·nx + x` and skip indices ≥ `groups`).
pub fn grid(dev: &WgpuDevice, groups: u64) -> Result<(u32, u32)> {
    let max = dev.limits().max_compute_workgroups_per_dimension.max(1) as u64;
    let x = groups.clamp(1, max);
    let z = groups.div_ceil(x).max(1);
    if z > max {
        return Err(Error::config(format!(
            "{groups} workgroups exceed this adapter's dispatch limit ({max}²)"
        )));
    }
    Ok((x as u32, z as u32))
}

/// The wgpu storage of `t`, checked to live on `dev` and to fit one storage binding.
pub fn storage<'a>(dev: &WgpuDevice, t: &'a Tensor, what: &'static str) -> Result<&'a WgpuStorage> {
    let s = match t.storage() {
        Storage::Wgpu(s) => s,
        _ => {
            return Err(Error::Device {
                backend: "wgpu".into(),
                message: format!(
                    "{what} lives on {}, not on the wgpu device; create it with the backend's \
                     device or move it with Tensor::to_device",
                    t.device().kind().as_str()
                ),
            })
        }
    };
    if s.device() != dev {
        return Err(Error::Device {
            backend: "wgpu".into(),
            message: format!("{what} lives on another wgpu device"),
        });
    }
    check_binding(dev, s.buffer().size(), what)?;
    Ok(s)
}

/// Errors when a buffer of `bytes` cannot be bound as one storage binding.
pub fn check_binding(dev: &WgpuDevice, bytes: u64, what: &str) -> Result<()> {
    let max = dev.max_binding_bytes();
    if bytes > max {
        return Err(Error::config(format!(
            "{what} is {bytes} bytes, more than this adapter's largest storage binding \
             ({max} bytes on {}); use a smaller KV cache (fewer blocks) or batch",
            dev.adapter_info().name
        )));
    }
    Ok(())
}

/// A uniform buffer of parameter slots, written once per call with one `write_buffer`.
#[derive(Debug)]
pub struct ParamBlock {
    buffer: wgpu::Buffer,
    slots: usize,
    /// What the buffer holds once every queued write is applied (`None`: unknown).
    written: Mutex<Option<Vec<[u32; PARAM_WORDS]>>>,
}

impl ParamBlock {
    /// A block of `slots` slots.
    pub fn new(dev: &WgpuDevice, slots: usize) -> Self {
        let buffer = dev.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("polyattn params"),
            size: PARAM_SLOT_BYTES * slots as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        ParamBlock {
            buffer,
            slots,
            written: Mutex::new(None),
        }
    }

    /// Queues the slots' contents (applied before the next submission).
    pub fn write(&self, dev: &WgpuDevice, slots: &[[u32; PARAM_WORDS]]) {
        debug_assert!(slots.len() <= self.slots);
        let bytes: Vec<u8> = slots
            .iter()
            .flat_map(|s| bytemuck::cast_slice::<u32, u8>(s).iter().copied())
            .collect();
        dev.queue().write_buffer(&self.buffer, 0, &bytes);
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        let all = w.get_or_insert_with(|| vec![[0; PARAM_WORDS]; self.slots]);
        if all.len() == self.slots {
            all[..slots.len()].copy_from_slice(slots);
        }
    }

    /// [`ParamBlock::write`], skipped when the buffer already holds `slots` (a steady-state
    /// call repeats the last call's parameters: no staging copy, no extra command buffer in
    /// the submission). Only the first write of a block is never skipped, since a new
    /// buffer's contents are not tracked.
    pub fn write_if_changed(&self, dev: &WgpuDevice, slots: &[[u32; PARAM_WORDS]]) {
        {
            let w = self.written.lock().unwrap_or_else(|p| p.into_inner());
            if w.as_ref().is_some_and(|all| all.starts_with(slots)) {
                return;
            }
        }
        self.write(dev, slots);
    }

    /// The binding of slot `i`.
    pub fn binding(&self, i: usize) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: PARAM_SLOT_BYTES * i as u64,
            size: wgpu::BufferSize::new(PARAM_SLOT_BYTES),
        })
    }
}

/// Builds a parameter slot from words (f32 values go in as their bits).
#[derive(Clone, Copy, Debug)]
pub struct Words {
    /// The slot.
    pub w: [u32; PARAM_WORDS],
    n: usize,
}

impl Words {
    /// An empty slot.
    pub fn new() -> Self {
        Words {
            w: [0; PARAM_WORDS],
            n: 0,
        }
    }

    /// Appends a u32.
    pub fn u(mut self, v: u32) -> Self {
        self.w[self.n] = v;
        self.n += 1;
        self
    }

    /// Appends an f32.
    pub fn f(self, v: f32) -> Self {
        self.u(v.to_bits())
    }
}

impl Default for Words {
    fn default() -> Self {
        Self::new()
    }
}

/// A whole buffer as a binding.
pub fn whole(buffer: &wgpu::Buffer) -> wgpu::BindingResource<'_> {
    buffer.as_entire_binding()
}

/// Creates the bind group of `pipeline` from `(binding, resource)` pairs.
pub fn bind_group(
    dev: &WgpuDevice,
    pipeline: &wgpu::ComputePipeline,
    entries: Vec<(u32, wgpu::BindingResource<'_>)>,
) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry<'_>> = entries
        .into_iter()
        .map(|(binding, resource)| wgpu::BindGroupEntry { binding, resource })
        .collect();
    dev.device().create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    })
}

/// Records dispatches, in order, in one compute pass (wgpu synchronises each dispatch with
/// the ones before it that wrote what it reads, as across passes).
pub fn dispatch_all<'a>(
    enc: &mut wgpu::CommandEncoder,
    passes: impl IntoIterator<
        Item = (
            &'a wgpu::ComputePipeline,
            &'a wgpu::BindGroup,
            (u32, u32, u32),
        ),
    >,
) {
    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: None,
        timestamp_writes: None,
    });
    for (pipeline, group, (x, y, z)) in passes {
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(x, y, z);
    }
}

/// Records one dispatch in its own compute pass.
pub fn dispatch(
    enc: &mut wgpu::CommandEncoder,
    pipeline: &wgpu::ComputePipeline,
    group: &wgpu::BindGroup,
    (x, y, z): (u32, u32, u32),
) {
    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: None,
        timestamp_writes: None,
    });
    pass.set_pipeline(pipeline);
    pass.set_bind_group(0, group, &[]);
    pass.dispatch_workgroups(x, y, z);
}

/// A storage buffer holding `words`.
pub fn upload_words(dev: &WgpuDevice, label: &str, words: &[u32]) -> Result<wgpu::Buffer> {
    let bytes: &[u8] = bytemuck::cast_slice(words);
    let buffer = dev.create_storage_buffer(
        label,
        bytes.len() as u64,
        wgpu::BufferUsages::empty(),
        !bytes.is_empty(),
    )?;
    if !bytes.is_empty() {
        {
            let mut view = buffer.get_mapped_range_mut(..).map_err(|e| Error::Device {
                backend: "wgpu".into(),
                message: format!("mapping {label} failed: {e}"),
            })?;
            view.slice(..bytes.len()).copy_from_slice(bytes);
        }
        buffer.unmap();
    }
    Ok(buffer)
}

/// `merge_attn_states` on wgpu tensors (shapes and dtypes already checked by
/// [`crate::ops::merge_attn_states`]): `[T, H, D]` outputs, `[H, T]` f32 LSEs.
#[allow(clippy::too_many_arguments)]
pub fn merge_attn_states(
    output: &mut Tensor,
    prefix_output: &Tensor,
    prefix_lse: &Tensor,
    suffix_output: &Tensor,
    suffix_lse: &Tensor,
    output_lse: Option<&mut Tensor>,
    prefill_tokens_with_context: Option<usize>,
) -> Result<()> {
    let dev = match output.device() {
        crate::Device::Wgpu(d) => d.clone(),
        _ => {
            return Err(Error::Device {
                backend: "wgpu".into(),
                message: "merge_attn_states: output is not a wgpu tensor".into(),
            })
        }
    };
    let s = prefix_output.shape();
    let (t, h, d) = (s[0], s[1], s[2]);
    if d % 4 != 0 {
        return Err(Error::shape(
            "prefix_output",
            s,
            "a head size that is a multiple of 4 (wgpu kernels load 4 elements at a time)",
        ));
    }
    let units = (t * h * (d / 4)) as u64;
    if units == 0 {
        return Ok(());
    }
    let dtype = prefix_output.dtype();
    let po = storage(&dev, prefix_output, "prefix_output")?
        .buffer()
        .clone();
    let pl = storage(&dev, prefix_lse, "prefix_lse")?.buffer().clone();
    let so = storage(&dev, suffix_output, "suffix_output")?
        .buffer()
        .clone();
    let sl = storage(&dev, suffix_lse, "suffix_lse")?.buffer().clone();
    let out = storage(&dev, output, "output")?.buffer().clone();
    let (ol, write_lse) = match output_lse {
        Some(l) => (storage(&dev, l, "output_lse")?.buffer().clone(), 1),
        None => (dev.dummy_buffer(0).clone(), 0),
    };
    let shader = MergeShader { dtype };
    let pipe = pipeline(
        &dev,
        &shader.key(),
        || shader.source(),
        Bindings::Merge,
        false,
    )?;
    // One parameter block per process (there is one wgpu device), reused by every call; the
    // lock spans write and submit so concurrent calls cannot see each other's parameters.
    static PARAMS: OnceLock<Mutex<(WgpuDevice, ParamBlock)>> = OnceLock::new();
    let mut guard = PARAMS
        .get_or_init(|| Mutex::new((dev.clone(), ParamBlock::new(&dev, 1))))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if guard.0 != dev {
        *guard = (dev.clone(), ParamBlock::new(&dev, 1));
    }
    let params = &guard.1;
    let words = Words::new()
        .u(t as u32)
        .u(h as u32)
        .u(d as u32)
        .u(prefill_tokens_with_context.map_or(u32::MAX, |n| n.min(u32::MAX as usize) as u32))
        .u(write_lse);
    params.write(&dev, &[words.w]);
    let group = bind_group(
        &dev,
        &pipe,
        vec![
            (0, params.binding(0)),
            (1, whole(&po)),
            (2, whole(&pl)),
            (3, whole(&so)),
            (4, whole(&sl)),
            (5, whole(&out)),
            (6, whole(&ol)),
        ],
    );
    let (x, z) = grid(&dev, units.div_ceil(ELEMENTWISE_WORKGROUP as u64))?;
    let mut enc = dev
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("polyattn merge_attn_states"),
        });
    dispatch(&mut enc, &pipe, &group, (x, 1, z));
    dev.queue().submit([enc.finish()]);
    Ok(())
}
