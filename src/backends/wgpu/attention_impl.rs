//! The wgpu impl: checks the arguments once, then records one command buffer per call —
//! one compute pass of the cache write (reshape_and_cache), the decode-tile and prefill-tile
//! attention dispatches, and the split-KV combine — and submits it without waiting.
//!
//! Per layer it owns a uniform block of parameter slots, the layer constants (ALiBi slopes
//! and sinks) and a scratch buffer for split-KV partials that grows to the largest batch
//! seen; per step the work items come from the metadata's plan (built by the first layer).
//! So a steady-state call allocates no device memory: it writes 1.25 KiB of parameters (only
//! when they differ from the last call's), creates a few bind groups and submits. Host time
//! matters: `polyattn bench` hides only ~85 µs of it (its L2-flush clear on an H200) before
//! it counts as kernel time.

use std::sync::Mutex;

use crate::attention::{AttentionLayer, AttentionParams};
use crate::device::{Tensor, WgpuDevice};
use crate::error::{Error, Result};
use crate::forward::{AttendJob, Band, ForwardIo, ForwardKernels, Keys, PassSpec, Target};
use crate::kv_cache::KvCache;
use crate::metadata::AttentionMetadata;

use super::kernels::{cache_strides, LayerShaders};
use super::metadata_builder::{PlanKey, WgpuAttentionMetadata};
use super::tuning::WgpuTuning;
use crate::device::wgpu::{
    bind_group, check_binding, dispatch_all, grid, pipeline, pipeline_with, storage, upload_words,
    whole, LoopBounding, ParamBlock, Words, PARAM_WORDS,
};
use crate::kernels::wgsl::{Bindings, CombineShader, ReshapeShader, ELEMENTWISE_WORKGROUP};

/// Attention flags (see `shaders/paged_attention.wgsl`).
const CAUSAL: u32 = 1;
const WINDOW: u32 = 2;
const SOFT_CAP: u32 = 4;
const ALIBI: u32 = 8;
const SINKS: u32 = 16;
const WRITE_LSE: u32 = 32;

/// Parameter slots: reshape, decode attention, prefill attention, combine, split-KV decode.
const SLOT_RESHAPE: usize = 0;
const SLOT_DECODE: usize = 1;
const SLOT_PREFILL: usize = 2;
const SLOT_COMBINE: usize = 3;
const SLOT_DECODE_FAST: usize = 4;
const SLOTS: usize = 5;

/// Largest head size the kernels take (one vec4 column per thread of a 128-thread group).
pub const MAX_HEAD_SIZE: usize = 512;
const _: () = assert!(MAX_HEAD_SIZE <= 4 * super::shaders::COMBINE_WORKGROUP as usize);

/// One recorded dispatch: pipeline, bind group, workgroups.
type Pass = (wgpu::ComputePipeline, wgpu::BindGroup, (u32, u32, u32));

/// Buffers reused across calls.
#[derive(Debug)]
struct State {
    params: ParamBlock,
    scratch: Option<wgpu::Buffer>,
}

/// The wgpu attention impl of one layer.
#[derive(Debug)]
pub struct WgpuAttentionImpl {
    params: AttentionParams,
    dev: WgpuDevice,
    shaders: LayerShaders,
    /// `[alibi slopes H][sinks H]` f32.
    layer_consts: wgpu::Buffer,
    state: Mutex<State>,
}

impl WgpuAttentionImpl {
    /// Builds the impl on `dev` (parameters already validated by the descriptor).
    pub fn new(dev: WgpuDevice, params: AttentionParams) -> Result<Self> {
        let tuning = WgpuTuning::for_device(&dev);
        Self::with_tuning(dev, params, tuning)
    }

    /// Builds the impl with an explicit split policy (tests and benchmarks).
    pub fn with_tuning(
        dev: WgpuDevice,
        params: AttentionParams,
        tuning: WgpuTuning,
    ) -> Result<Self> {
        let shaders = LayerShaders::new(dev.clone(), params.head_size, tuning)?;
        let h = params.num_heads;
        let mut consts = vec![0u32; 2 * h];
        if let Some(a) = &params.alibi_slopes {
            for (d, s) in consts[..h].iter_mut().zip(a) {
                *d = s.to_bits();
            }
        }
        if let Some(s) = &params.sinks {
            for (d, v) in consts[h..].iter_mut().zip(s) {
                *d = v.to_bits();
            }
        }
        let layer_consts = upload_words(&dev, "polyattn layer constants", &consts)?;
        Ok(WgpuAttentionImpl {
            state: Mutex::new(State {
                params: ParamBlock::new(&dev, SLOTS),
                scratch: None,
            }),
            params,
            dev,
            shaders,
            layer_consts,
        })
    }

    /// Which specialisation of each kernel this layer runs on its adapter.
    pub fn shaders(&self) -> &LayerShaders {
        &self.shaders
    }

    /// The split policy in use.
    pub fn tuning(&self) -> WgpuTuning {
        self.shaders.tuning
    }

    /// The (k, v) scales the kernels apply: the layer's for fp8 caches, 1 otherwise.
    fn kv_scales(&self, layer: &AttentionLayer) -> (f32, f32) {
        if self.params.kv_cache_dtype.is_fp8() {
            (layer.k_scale, layer.v_scale)
        } else {
            (1.0, 1.0)
        }
    }

    /// Records the cache write (parameters into `slots[SLOT_RESHAPE]`).
    #[allow(clippy::too_many_arguments)]
    fn record_reshape(
        &self,
        slots: &mut [[u32; PARAM_WORDS]; SLOTS],
        params: &ParamBlock,
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        cache: &KvCache,
        md: &WgpuAttentionMetadata,
    ) -> Result<Option<Pass>> {
        let p = &self.params;
        let n = md.common.slot_mapping_cpu().len();
        let units = (n * p.num_kv_heads * p.head_size / 4) as u64;
        if units == 0 {
            return Ok(None);
        }
        let shader = ReshapeShader {
            act_dtype: key.dtype(),
            cache_dtype: cache.spec().storage_dtype(),
        };
        let pipe = pipeline(
            &self.dev,
            &shader.key(),
            || shader.source(),
            Bindings::Reshape,
            false,
        )?;
        let [bstride, kvstride, tstride, hstride] = cache_strides(cache);
        let (ks, vs) = self.kv_scales(layer);
        slots[SLOT_RESHAPE] = Words::new()
            .u(n as u32)
            .u(p.num_kv_heads as u32)
            .u(cache.block_size() as u32)
            .u(bstride)
            .u(kvstride)
            .u(tstride)
            .u(hstride)
            .u(p.head_size as u32)
            .f(ks)
            .f(vs)
            .w;
        let group = bind_group(
            &self.dev,
            &pipe,
            vec![
                (0, params.binding(SLOT_RESHAPE)),
                (1, whole(storage(&self.dev, key, "key")?.buffer())),
                (2, whole(storage(&self.dev, value, "value")?.buffer())),
                (3, whole(&md.slots)),
                (
                    4,
                    whole(storage(&self.dev, cache.data(), "kv_cache")?.buffer()),
                ),
            ],
        );
        let (x, z) = grid(&self.dev, units.div_ceil(ELEMENTWISE_WORKGROUP as u64))?;
        Ok(Some((pipe, group, (x, 1, z))))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The dispatches of one call, recorded into one command buffer and submitted by `finish`.
#[derive(Debug)]
pub struct WgpuRecording {
    enc: wgpu::CommandEncoder,
    slots: [[u32; PARAM_WORDS]; SLOTS],
    /// Parameter slots to write: 1 for a cache write alone, all for a forward.
    used_slots: usize,
    passes: Vec<Pass>,
}

/// The kernel forms of one wgpu plan (the split-KV decode kernel, the decode and prefill
/// tiles, the combine): the plan sorts the items among them, so every query length is one
/// band.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgpuPlanKernels;

impl ForwardKernels for WgpuAttentionImpl {
    type Metadata = WgpuAttentionMetadata;
    type Kernel = WgpuPlanKernels;
    type Recording = WgpuRecording;
    const BACKEND: &'static str = "wgpu";

    fn params(&self) -> &AttentionParams {
        &self.params
    }

    fn metadata<'m>(
        &self,
        metadata: &'m dyn AttentionMetadata,
    ) -> Result<&'m WgpuAttentionMetadata> {
        metadata.downcast::<WgpuAttentionMetadata>("WgpuAttentionImpl")
    }

    fn check_cache(&self, cache: &KvCache, _: &WgpuAttentionMetadata) -> Result<()> {
        storage(&self.dev, cache.data(), "kv_cache").map(|_| ())
    }

    /// The WGSL family has no cascade passes yet: a cascade batch runs as one full pass.
    fn runs_cascade(&self) -> bool {
        false
    }

    fn bands(
        &self,
        _: &WgpuAttentionMetadata,
        _: &ForwardIo<'_>,
        _: &PassSpec,
    ) -> Result<Vec<Band<WgpuPlanKernels>>> {
        Ok(vec![Band {
            min_q: 0,
            kernel: WgpuPlanKernels,
        }])
    }

    fn begin(&self, _: &WgpuAttentionMetadata) -> Result<WgpuRecording> {
        let enc = self
            .dev
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("polyattn attention"),
            });
        Ok(WgpuRecording {
            enc,
            slots: [[0u32; PARAM_WORDS]; SLOTS],
            used_slots: 0,
            passes: Vec::new(),
        })
    }

    fn write_cache(
        &self,
        rec: &mut WgpuRecording,
        md: &WgpuAttentionMetadata,
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        cache: &mut KvCache,
    ) -> Result<()> {
        let state = self.lock();
        let pass =
            self.record_reshape(&mut rec.slots, &state.params, layer, key, value, cache, md)?;
        rec.passes.extend(pass);
        rec.used_slots = rec.used_slots.max(SLOT_RESHAPE + 1);
        Ok(())
    }

    fn attend(
        &self,
        rec: &mut WgpuRecording,
        md: &WgpuAttentionMetadata,
        io: &mut ForwardIo<'_>,
        job: &AttendJob<WgpuPlanKernels>,
    ) -> Result<()> {
        if job.spec.pass != crate::plan::Pass::Full || job.spec.target != Target::Output {
            return Err(Error::config("the wgpu kernels run no cascade passes"));
        }
        let p = &self.params;
        let common = &md.common;
        let dev = &self.dev;
        let n = io.num_tokens;
        let dtype = io.dtype;
        let encoder_attn = io.keys.is_dense();
        let q_buf = storage(dev, io.query, "query")?.buffer().clone();
        let out_buf = storage(dev, io.output, "output")?.buffer().clone();
        let lse_buf = match io.output_lse.as_deref() {
            Some(t) => Some(storage(dev, t, "output_lse")?.buffer().clone()),
            None => None,
        };
        // Key source: dense inputs for encoder attention, else the cache and its block table.
        let (k_buf, v_buf, kv_dtype, cache) = match io.keys {
            Keys::Dense { key, value } => (
                storage(dev, key, "key")?.buffer().clone(),
                storage(dev, value, "value")?.buffer().clone(),
                dtype,
                None,
            ),
            Keys::Cache(cache) => (
                storage(dev, cache.data(), "kv_cache")?.buffer().clone(),
                md.block_table.clone(),
                cache.spec().storage_dtype(),
                Some(cache),
            ),
        };
        let slots = &mut rec.slots;
        let passes = &mut rec.passes;
        rec.used_slots = SLOTS;

        let g = p.num_queries_per_kv() as u32;
        let window = p.sliding_window.map(|w| w.min(1 << 30) as u32);
        let fast_decode_rows = self
            .shaders
            .tuning
            .decode_rows
            .min(self.shaders.decode_tile.0);
        let fast_decode_rows = if cache.is_some_and(|c| {
            self.shaders
                .decode_shader(fast_decode_rows, dtype, c)
                .is_some()
        }) {
            fast_decode_rows
        } else {
            0
        };
        let prefill_shader = self
            .shaders
            .tile_shader(true, dtype, kv_dtype, !encoder_attn);
        let plan = md.plan(PlanKey {
            group: g,
            num_kv_heads: p.num_kv_heads as u32,
            decode_rows: self.shaders.decode_tile.0,
            // The rows of the form that runs the prefill items (tiled2h may have its own).
            prefill_rows: prefill_shader.block_m,
            fast_decode_rows,
            dense: encoder_attn,
            window,
            tuning: self.shaders.tuning,
        })?;

        let mut state = self.lock();

        // Split-KV scratch: partial rows [split][partial token][query head] of D4 vec4, then
        // one (m, l) vec4 per row.
        let d4 = (p.head_size / 4) as u64;
        let partial_rows = plan.max_splits as u64 * plan.n_part_tokens as u64 * p.num_heads as u64;
        let scratch_bytes = partial_rows * (d4 + 1) * 16;
        if scratch_bytes > 0 {
            check_binding(dev, scratch_bytes, "split-KV scratch")?;
            if state
                .scratch
                .as_ref()
                .is_none_or(|b| b.size() < scratch_bytes)
            {
                state.scratch = Some(dev.create_storage_buffer(
                    "polyattn split-KV scratch",
                    scratch_bytes,
                    wgpu::BufferUsages::empty(),
                    false,
                )?);
            }
        }
        let scratch = match (&state.scratch, scratch_bytes > 0) {
            (Some(b), true) => b.clone(),
            _ => dev.dummy_buffer(1).clone(),
        };
        let ml_offset = (partial_rows * d4) as u32;

        let mut flags = 0;
        if job.spec.causal {
            flags |= CAUSAL;
        }
        if window.is_some() {
            flags |= WINDOW;
        }
        if p.soft_cap().is_some() {
            flags |= SOFT_CAP;
        }
        if p.alibi_slopes.is_some() {
            flags |= ALIBI;
        }
        if p.sinks.is_some() && job.spec.sinks {
            flags |= SINKS;
        }
        if lse_buf.is_some() {
            flags |= WRITE_LSE;
        }
        // Dense K/V are addressed by row; the strides and scales are the cache's.
        let ([bstride, kvstride, tstride, hstride], (ks, vs)) = match cache {
            Some(c) => (cache_strides(c), self.kv_scales(io.layer)),
            None => ([0; 4], (1.0, 1.0)),
        };
        let bs = common.block_size() as u32;
        // The WGSL kernels address the block table by request (0: dense K/V).
        let bt_width = if encoder_attn {
            0
        } else {
            common.max_blocks_per_req() as u32
        };
        let block_shift = if bs.is_power_of_two() {
            bs.trailing_zeros()
        } else {
            u32::MAX
        };
        let attn_words = |num_items: u32, flags: u32| {
            Words::new()
                .u(n as u32)
                .u(p.num_heads as u32)
                .u(p.num_kv_heads as u32)
                .u(g)
                .u(bs)
                .u(bstride)
                .u(kvstride)
                .u(tstride)
                .u(hstride)
                .u(num_items)
                .u(flags)
                .u(window.unwrap_or(0))
                .f(p.scale)
                .f(p.soft_cap().unwrap_or(1.0))
                .f(ks)
                .f(vs)
                .u(ml_offset)
                .u(plan.n_part_tokens)
                .u(block_shift)
                .u(bt_width)
                .w
        };
        let lse_binding = lse_buf
            .clone()
            .unwrap_or_else(|| dev.dummy_buffer(0).clone());
        // Both attention kernels (tiled and split-KV decode) bind the same buffers; only the
        // parameter slot and the work list differ.
        let attention_group = |pipe: &wgpu::ComputePipeline, slot: usize, items: &wgpu::Buffer| {
            bind_group(
                dev,
                pipe,
                vec![
                    (0, state.params.binding(slot)),
                    (1, whole(&q_buf)),
                    (2, whole(&k_buf)),
                    (3, whole(&v_buf)),
                    (4, whole(items)),
                    (5, whole(&self.layer_consts)),
                    (6, whole(&lse_binding)),
                    (7, whole(&scratch)),
                    (8, whole(&out_buf)),
                ],
            )
        };
        for (list, slot) in [(&plan.decode, SLOT_DECODE), (&plan.prefill, SLOT_PREFILL)] {
            let Some(list) = list else { continue };
            let shader = if slot == SLOT_PREFILL {
                prefill_shader
            } else {
                self.shaders
                    .tile_shader(false, dtype, kv_dtype, !encoder_attn)
            };
            let pipe = pipeline_with(
                dev,
                &shader.key(),
                || shader.source(),
                Bindings::Attention,
                shader.subgroups,
                LoopBounding::Off,
            )?;
            slots[slot] = attn_words(list.count, flags);
            let group = attention_group(&pipe, slot, &list.buffer);
            let (x, z) = grid(dev, list.count as u64)?;
            passes.push((pipe, group, (x, 1, z)));
        }
        if let Some(list) = &plan.decode_fast {
            let shader = cache
                .and_then(|c| self.shaders.decode_shader(plan.fast_rows, dtype, c))
                .ok_or_else(|| {
                    Error::config("wgpu: the split-KV decode kernel cannot run this plan")
                })?;
            let pipe = pipeline_with(
                dev,
                &shader.key(),
                || shader.source(),
                Bindings::Attention,
                true,
                LoopBounding::Off,
            )?;
            slots[SLOT_DECODE_FAST] = attn_words(list.count, flags);
            let group = attention_group(&pipe, SLOT_DECODE_FAST, &list.buffer);
            let (x, z) = grid(dev, list.count as u64)?;
            passes.push((pipe, group, (x, 1, z)));
        }
        if let Some(list) = &plan.combine {
            let shader = CombineShader { out_dtype: dtype };
            let pipe = pipeline_with(
                dev,
                &shader.key(),
                || shader.source(),
                Bindings::Combine,
                false,
                LoopBounding::Off,
            )?;
            slots[SLOT_COMBINE] = Words::new()
                .u(n as u32)
                .u(p.num_heads as u32)
                .u(p.num_kv_heads as u32)
                .u(g)
                .u(list.count)
                .u(ml_offset)
                .u(lse_buf.is_some() as u32)
                .u(p.head_size as u32)
                .u(plan.n_part_tokens)
                .w;
            let group = bind_group(
                dev,
                &pipe,
                vec![
                    (0, state.params.binding(SLOT_COMBINE)),
                    (1, whole(&scratch)),
                    (2, whole(&list.buffer)),
                    (3, whole(&out_buf)),
                    (4, whole(&lse_binding)),
                ],
            );
            let (x, z) = grid(dev, list.count as u64)?;
            passes.push((pipe, group, (x, p.num_heads as u32, z)));
        }
        Ok(())
    }

    fn merge(
        &self,
        _: &mut WgpuRecording,
        _: &WgpuAttentionMetadata,
        _: &mut ForwardIo<'_>,
    ) -> Result<()> {
        Err(Error::config("the wgpu kernels run no cascade passes"))
    }

    fn finish(&self, rec: WgpuRecording, _: Option<&mut ForwardIo<'_>>) -> Result<()> {
        if rec.passes.is_empty() {
            return Ok(());
        }
        let WgpuRecording {
            mut enc,
            slots,
            used_slots,
            passes,
        } = rec;
        // The parameters are written and the work submitted under one lock, so two calls on
        // this layer cannot interleave their parameter writes and submissions.
        let state = self.lock();
        state
            .params
            .write_if_changed(&self.dev, &slots[..used_slots]);
        dispatch_all(
            &mut enc,
            passes
                .iter()
                .map(|(pipe, group, dims)| (pipe, group, *dims)),
        );
        self.dev.queue().submit([enc.finish()]);
        Ok(())
    }
}
