//! The wgpu MLA backend's kernel glue: a `Recording` of the family's MLA kernels and the
//! `kv_b_proj` GEMM, dispatched in order in one compute pass of one command buffer, each
//! dispatch with its own slot of one uniform parameter block.

use crate::device::wgpu::{
    bind_group, dispatch_all, pipeline_with, whole, LoopBounding, ParamBlock, Words, PARAM_WORDS,
};
use crate::device::WgpuDevice;
use crate::error::{Error, Result};
use crate::kernels::wgsl::{Bindings, MlaShader, ModelShader};

/// One recorded dispatch.
struct Dispatch {
    pipeline: wgpu::ComputePipeline,
    params: [u32; PARAM_WORDS],
    buffers: Vec<(u32, wgpu::Buffer)>,
    grid: (u32, u32, u32),
}

/// Dispatches recorded for one call, submitted together by [`Recording::submit`].
pub(crate) struct Recording {
    dev: WgpuDevice,
    dispatches: Vec<Dispatch>,
}

impl Recording {
    /// An empty recording on `dev`.
    pub(crate) fn new(dev: &WgpuDevice) -> Self {
        Recording {
            dev: dev.clone(),
            dispatches: Vec::new(),
        }
    }

    /// Checks a grid against the adapter's per-dimension limit.
    fn check_grid(&self, grid: (u32, u32, u32), what: &str) -> Result<()> {
        let max = self.dev.limits().max_compute_workgroups_per_dimension;
        if grid.0 > max || grid.1 > max || grid.2 > max {
            return Err(Error::config(format!(
                "WGPU_MLA: the {what} needs {grid:?} workgroups, more than this adapter's \
                 dispatch limit ({max} per dimension)"
            )));
        }
        Ok(())
    }

    /// Records `shader` over `grid` with parameters `words`, binding `buffers` (binding
    /// number, whole buffer) besides the parameters.
    pub(crate) fn mla(
        &mut self,
        shader: MlaShader,
        words: Words,
        buffers: Vec<(u32, wgpu::Buffer)>,
        grid: (u32, u32, u32),
    ) -> Result<()> {
        self.check_grid(grid, &shader.key())?;
        // Every loop of the MLA kernels steps a u32 towards a bound it cannot pass over.
        let pipeline = pipeline_with(
            &self.dev,
            &shader.key(),
            || shader.source(),
            shader.bindings(),
            false,
            LoopBounding::Off,
        )?;
        self.dispatches.push(Dispatch {
            pipeline,
            params: words.w,
            buffers,
            grid,
        });
        Ok(())
    }

    /// Records `y [t][n] = x [t][k] · w [n][k]^T` (f32, k a multiple of 4) with the model
    /// operations' tiled GEMM.
    pub(crate) fn linear(
        &mut self,
        x: &wgpu::Buffer,
        w: &wgpu::Buffer,
        y: &wgpu::Buffer,
        (t, k, n): (u32, u32, u32),
    ) -> Result<()> {
        let shader = ModelShader::LinearTiled { vec4: true };
        let tile = crate::kernels::wgsl::LINEAR_TILE;
        let grid = (n.div_ceil(tile), t.div_ceil(tile), 1);
        self.check_grid(grid, "kv_b_proj GEMM")?;
        let pipeline = pipeline_with(
            &self.dev,
            &shader.key(),
            || shader.source(),
            Bindings::Model,
            false,
            LoopBounding::Forced,
        )?;
        self.dispatches.push(Dispatch {
            pipeline,
            params: Words::new().u(t).u(n).u(k / 4).w,
            buffers: vec![(1, x.clone()), (2, w.clone()), (3, y.clone())],
            grid,
        });
        Ok(())
    }

    /// Writes every dispatch's parameters, records the dispatches in order in one compute
    /// pass and submits it.
    pub(crate) fn submit(self) {
        if self.dispatches.is_empty() {
            return;
        }
        let dev = &self.dev;
        let params = ParamBlock::new(dev, self.dispatches.len());
        let slots: Vec<[u32; PARAM_WORDS]> = self.dispatches.iter().map(|d| d.params).collect();
        params.write(dev, &slots);
        let groups: Vec<wgpu::BindGroup> = self
            .dispatches
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut entries = vec![(0, params.binding(i))];
                entries.extend(d.buffers.iter().map(|(b, buf)| (*b, whole(buf))));
                bind_group(dev, &d.pipeline, entries)
            })
            .collect();
        let mut enc = dev
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("polyattn WGPU_MLA"),
            });
        dispatch_all(
            &mut enc,
            self.dispatches
                .iter()
                .zip(&groups)
                .map(|(d, g)| (&d.pipeline, g, d.grid)),
        );
        dev.queue().submit([enc.finish()]);
    }
}
