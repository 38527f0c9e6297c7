//! Recording work: uniform parameter blocks ([`ParamBlock`], filled from [`Words`]), bind
//! groups, compute passes, and dispatch geometry ([`grid`]: flat workgroup counts spread over
//! x and z past the adapter's per-dimension limit).

use std::sync::Mutex;

use crate::error::Result;

use super::WgpuDevice;
use crate::device::wgsl::{PARAM_SLOT_BYTES, PARAM_WORDS};

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
        dev.write_buffer(&self.buffer, 0, &bytes);
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

    /// The uniform buffer.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
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

/// Workgroups `(x, z)` for `groups` flat workgroups: x ≤ the per-dimension limit, z the
/// overflow (shaders recover the flat index as `z·nx + x` and skip indices ≥ `groups`).
pub fn grid(dev: &WgpuDevice, groups: u64) -> Result<(u32, u32)> {
    dev.wgsl_info().grid(groups)
}
