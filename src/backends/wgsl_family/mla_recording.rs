//! The WGSL family's MLA dispatches of one call (on either runtime): the MLA kernels and the
//! `kv_b_proj` GEMM, submitted in order as one submission, each dispatch with its own slot of
//! one parameter block.

use crate::device::wgsl::{Dispatch, LoopBounding, Slot, WgslRuntime, Words};
use crate::error::{Error, Result};
use crate::kernels::wgsl::{Bindings, CacheChunks, MlaShader, ModelShader};

/// Dispatches recorded for one call, submitted together by [`MlaRecording::submit`].
pub(crate) struct MlaRecording<R: WgslRuntime> {
    dev: R,
    backend: &'static str,
    slots: Vec<Slot>,
    dispatches: Vec<Dispatch<R>>,
}

impl<R: WgslRuntime> MlaRecording<R> {
    /// An empty recording on `dev` (`backend` names it in errors).
    pub(crate) fn new(dev: &R, backend: &'static str) -> Self {
        MlaRecording {
            dev: dev.clone(),
            backend,
            slots: Vec::new(),
            dispatches: Vec::new(),
        }
    }

    /// Checks a grid against the device's per-dimension limit.
    fn check_grid(&self, grid: (u32, u32, u32), what: &str) -> Result<()> {
        let max = self.dev.info().max_workgroups_per_dim;
        if grid.0 > max || grid.1 > max || grid.2 > max {
            return Err(Error::config(format!(
                "{}: the {what} needs {grid:?} workgroups, more than this device's dispatch \
                 limit ({max} per dimension)",
                self.backend
            )));
        }
        Ok(())
    }

    fn push(
        &mut self,
        pipeline: R::Pipeline,
        words: Slot,
        buffers: Vec<(u32, R::Buffer)>,
        groups: (u32, u32, u32),
    ) {
        self.dispatches.push(Dispatch {
            pipeline,
            slot: self.slots.len(),
            buffers,
            groups,
        });
        self.slots.push(words);
    }

    /// Records `shader` over `grid` with parameters `words`, binding `buffers` (binding
    /// number, whole buffer) besides the parameters.
    pub(crate) fn mla(
        &mut self,
        shader: MlaShader,
        words: Words,
        buffers: Vec<(u32, R::Buffer)>,
        grid: (u32, u32, u32),
    ) -> Result<()> {
        self.mla_with(shader, CacheChunks::ONE, words, buffers, grid)
    }

    /// [`MlaRecording::mla`] for a kernel that binds the latent cache as `chunks` says (its
    /// buffers among `buffers`: one, or the chunks in order).
    pub(crate) fn mla_with(
        &mut self,
        shader: MlaShader,
        chunks: CacheChunks,
        words: Words,
        buffers: Vec<(u32, R::Buffer)>,
        grid: (u32, u32, u32),
    ) -> Result<()> {
        self.check_grid(grid, &shader.key())?;
        // Every loop of the MLA kernels steps a u32 towards a bound it cannot pass over.
        let pipeline = self.dev.pipeline(
            &shader.key_for(chunks),
            &|| shader.source_for(chunks),
            shader.bindings(),
            false,
            LoopBounding::Off,
        )?;
        self.push(pipeline, words.w, buffers, grid);
        Ok(())
    }

    /// Records `y [t][n] = x [t][k] · w [n][k]^T` (f32, k a multiple of 4) with the model
    /// operations' tiled GEMM.
    pub(crate) fn linear(
        &mut self,
        x: &R::Buffer,
        w: &R::Buffer,
        y: &R::Buffer,
        (t, k, n): (u32, u32, u32),
    ) -> Result<()> {
        let shader = ModelShader::LinearTiled { vec4: true };
        let tile = crate::kernels::wgsl::LINEAR_TILE;
        let grid = (n.div_ceil(tile), t.div_ceil(tile), 1);
        self.check_grid(grid, "kv_b_proj GEMM")?;
        let pipeline = self.dev.pipeline(
            &shader.key(),
            &|| shader.source(),
            Bindings::Model,
            false,
            LoopBounding::Forced,
        )?;
        self.push(
            pipeline,
            Words::new().u(t).u(n).u(k / 4).w,
            vec![(1, x.clone()), (2, w.clone()), (3, y.clone())],
            grid,
        );
        Ok(())
    }

    /// Writes every dispatch's parameters into a block of their own and submits the
    /// dispatches in order.
    /// Inside a capture it refuses: MLA metadata has no graph mode (its level is `Never`), so
    /// a captured MLA call would replay one step's metadata forever.
    pub(crate) fn submit(self) -> Result<()> {
        if self.dev.is_capturing() {
            return Err(crate::error::Error::Device {
                backend: self.backend.into(),
                message: "an MLA call inside a graph capture: MLA metadata has no graph mode \
                          (GraphCaptureSupport::Never); run MLA layers eagerly"
                    .into(),
            });
        }
        if self.dispatches.is_empty() {
            return Ok(());
        }
        let params = self.dev.params(self.slots.len())?;
        self.dev.submit(&params, &self.slots, &self.dispatches)
    }
}
