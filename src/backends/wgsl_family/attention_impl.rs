//! The WGSL family's impl, on either runtime ([`WgslRuntime`]: wgpu, native Vulkan): checks
//! the arguments once, then records the dispatches of one call — the cache write
//! (reshape_and_cache), the decode-tile and prefill-tile attention dispatches, and the
//! split-KV combine — and submits them as one submission.
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
use crate::device::wgsl::{Dispatch, LoopBounding, Slot, WgslRuntime, Words, PARAM_WORDS};
use crate::device::Tensor;
use crate::error::{Error, Result};
use crate::forward::{AttendJob, Band, ForwardIo, ForwardKernels, Keys, PassSpec, Target};
use crate::kv_cache::KvCache;
use crate::metadata::AttentionMetadata;

use super::layer_shaders::{cache_strides, LayerShaders};
use super::metadata_builder::{PlanKey, WgslAttentionMetadata};
use super::tuning::WgpuTuning;
use crate::kernels::wgsl::{
    Bindings, CacheChunks, CombineShader, ReshapeShader, ELEMENTWISE_WORKGROUP,
};

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
const _: () = assert!(MAX_HEAD_SIZE <= 4 * crate::kernels::wgsl::COMBINE_WORKGROUP as usize);

/// Buffers reused across calls.
#[derive(Debug)]
struct State<R: WgslRuntime> {
    params: R::Params,
    scratch: Option<R::Buffer>,
}

/// The WGSL family's attention impl of one layer on runtime `R`.
#[derive(Debug)]
pub struct WgslAttentionImpl<R: WgslRuntime> {
    params: AttentionParams,
    dev: R,
    shaders: LayerShaders,
    /// `[alibi slopes H][sinks H]` f32.
    layer_consts: R::Buffer,
    state: Mutex<State<R>>,
}

impl<R: WgslRuntime> WgslAttentionImpl<R> {
    /// Builds the impl on `dev` (parameters already validated by the descriptor).
    pub fn new(dev: R, params: AttentionParams) -> Result<Self> {
        let tuning = WgpuTuning::for_device(dev.info());
        Self::with_tuning(dev, params, tuning)
    }

    /// Builds the impl with an explicit split policy (tests and benchmarks).
    pub fn with_tuning(dev: R, params: AttentionParams, tuning: WgpuTuning) -> Result<Self> {
        let shaders = LayerShaders::new(dev.info().clone(), params.head_size, tuning)?;
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
        let layer_consts = dev.upload_words("polyattn layer constants", &consts)?;
        Ok(WgslAttentionImpl {
            state: Mutex::new(State {
                params: dev.params(SLOTS)?,
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

    /// The cache write's dispatch (parameters into `slots[SLOT_RESHAPE]`).
    fn record_reshape(
        &self,
        slots: &mut [Slot; SLOTS],
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        cache: &KvCache,
        md: &WgslAttentionMetadata<R>,
    ) -> Result<Option<Dispatch<R>>> {
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
        let (cache_bufs, chunk_blocks) = cache_chunks(&self.dev, cache)?;
        let chunks = chunk_form(&self.dev, cache_bufs.len());
        let pipeline = self.dev.pipeline(
            &shader.key_for(chunks),
            &|| shader.source_for(chunks),
            Bindings::Reshape,
            false,
            LoopBounding::Forced,
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
            .u(chunk_blocks)
            .w;
        let dev = &self.dev;
        let (x, z) = dev
            .info()
            .grid(units.div_ceil(ELEMENTWISE_WORKGROUP as u64))?;
        Ok(Some(Dispatch {
            pipeline,
            slot: SLOT_RESHAPE,
            buffers: [
                (1, dev.tensor_buffer(key, "key")?),
                (2, dev.tensor_buffer(value, "value")?),
                (3, md.slots.clone()),
            ]
            .into_iter()
            .chain(cache_bufs.into_iter().map(|b| (4, b)))
            .collect(),
            groups: (x, 1, z),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<R>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The dispatches of one call, submitted together by `finish`.
#[derive(Debug)]
pub struct WgslRecording<R: WgslRuntime> {
    slots: [Slot; SLOTS],
    /// Parameter slots to write: 1 for a cache write alone, all for a forward.
    used_slots: usize,
    dispatches: Vec<Dispatch<R>>,
}

/// The kernel forms of one WGSL plan (the split-KV decode kernel, the decode and prefill
/// tiles, the combine): the plan sorts the items among them, so every query length is one
/// band.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgslPlanKernels;

impl<R: WgslRuntime> ForwardKernels for WgslAttentionImpl<R> {
    type Metadata = WgslAttentionMetadata<R>;
    type Kernel = WgslPlanKernels;
    type Recording = WgslRecording<R>;
    const BACKEND: &'static str = R::NAME;

    fn params(&self) -> &AttentionParams {
        &self.params
    }

    fn metadata<'m>(
        &self,
        metadata: &'m dyn AttentionMetadata,
    ) -> Result<&'m WgslAttentionMetadata<R>> {
        let md = metadata.downcast::<WgslAttentionMetadata<R>>("WgslAttentionImpl")?;
        md.check_current()?;
        if self.dev.is_capturing() && !md.is_graph_capturable() {
            return Err(Error::Device {
                backend: R::NAME.into(),
                message: format!(
                    "a forward inside a {} graph capture needs metadata from \
                     build_for_graph_capture (persistent buffers, fixed work lists); this \
                     metadata came from build, whose arrays and work lists are per-step \
                     uploads",
                    R::NAME
                ),
            });
        }
        Ok(md)
    }

    fn check_cache(&self, cache: &KvCache, _: &WgslAttentionMetadata<R>) -> Result<()> {
        cache_chunks(&self.dev, cache).map(|_| ())
    }

    /// The WGSL family has no cascade passes yet: a cascade batch runs as one full pass.
    fn runs_cascade(&self) -> bool {
        false
    }

    fn bands(
        &self,
        _: &WgslAttentionMetadata<R>,
        _: &ForwardIo<'_>,
        _: &PassSpec,
    ) -> Result<Vec<Band<WgslPlanKernels>>> {
        Ok(vec![Band {
            min_q: 0,
            kernel: WgslPlanKernels,
        }])
    }

    fn begin(&self, _: &WgslAttentionMetadata<R>) -> Result<WgslRecording<R>> {
        Ok(WgslRecording {
            slots: [[0u32; PARAM_WORDS]; SLOTS],
            used_slots: 0,
            dispatches: Vec::new(),
        })
    }

    fn write_cache(
        &self,
        rec: &mut WgslRecording<R>,
        md: &WgslAttentionMetadata<R>,
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        cache: &mut KvCache,
    ) -> Result<()> {
        let pass = self.record_reshape(&mut rec.slots, layer, key, value, cache, md)?;
        rec.dispatches.extend(pass);
        rec.used_slots = rec.used_slots.max(SLOT_RESHAPE + 1);
        Ok(())
    }

    fn attend(
        &self,
        rec: &mut WgslRecording<R>,
        md: &WgslAttentionMetadata<R>,
        io: &mut ForwardIo<'_>,
        job: &AttendJob<WgslPlanKernels>,
    ) -> Result<()> {
        if job.spec.pass != crate::plan::Pass::Full || job.spec.target != Target::Output {
            return Err(Error::config("the WGSL kernels run no cascade passes"));
        }
        let p = &self.params;
        let common = &md.common;
        let dev = &self.dev;
        let n = io.num_tokens;
        let dtype = io.dtype;
        let encoder_attn = io.keys.is_dense();
        let q_buf = dev.tensor_buffer(io.query, "query")?;
        let out_buf = dev.tensor_buffer(io.output, "output")?;
        let lse_buf = match io.output_lse.as_deref() {
            Some(t) => Some(dev.tensor_buffer(t, "output_lse")?),
            None => None,
        };
        // Key source: dense inputs for encoder attention, else the cache (one buffer or its
        // chunks, bound at binding 2) and its block table.
        let (k_bufs, v_buf, kv_dtype, cache, chunk_blocks) = match io.keys {
            Keys::Dense { key, value } => (
                vec![dev.tensor_buffer(key, "key")?],
                dev.tensor_buffer(value, "value")?,
                dtype,
                None,
                0,
            ),
            Keys::Cache(cache) => {
                let (bufs, chunk_blocks) = cache_chunks(dev, cache)?;
                (
                    bufs,
                    md.block_table.clone(),
                    cache.spec().storage_dtype(),
                    Some(cache),
                    chunk_blocks,
                )
            }
        };
        let chunks = chunk_form(dev, k_bufs.len());
        // Each chunk holds whole blocks, so the granule checks hold for all when they hold
        // for the first.
        let cache_bytes = R::buffer_bytes(&k_bufs[0]);
        let slots = &mut rec.slots;
        let passes = &mut rec.dispatches;
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
                .decode_shader(fast_decode_rows, dtype, c, cache_bytes)
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
            dev.info()
                .check_binding(scratch_bytes, "split-KV scratch")?;
            if state
                .scratch
                .as_ref()
                .is_none_or(|b| R::buffer_bytes(b) < scratch_bytes)
            {
                state.scratch = Some(dev.scratch("polyattn split-KV scratch", scratch_bytes)?);
            }
        }
        let scratch = match (&state.scratch, scratch_bytes > 0) {
            (Some(b), true) => b.clone(),
            _ => dev.placeholder(1)?,
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
                .u(chunk_blocks)
                .w
        };
        let lse_binding = match &lse_buf {
            Some(b) => b.clone(),
            None => dev.placeholder(0)?,
        };
        drop(state);
        // Both attention kernels (tiled and split-KV decode) bind the same buffers; only the
        // parameter slot and the work list differ.
        let attention_buffers = |items: &R::Buffer| {
            let mut b = vec![(1, q_buf.clone())];
            b.extend(k_bufs.iter().map(|k| (2, k.clone())));
            b.extend([
                (3, v_buf.clone()),
                (4, items.clone()),
                (5, self.layer_consts.clone()),
                (6, lse_binding.clone()),
                (7, scratch.clone()),
                (8, out_buf.clone()),
            ]);
            b
        };
        for (list, slot) in [(&plan.decode, SLOT_DECODE), (&plan.prefill, SLOT_PREFILL)] {
            let Some(list) = list else { continue };
            let shader = if slot == SLOT_PREFILL {
                prefill_shader
            } else {
                self.shaders
                    .tile_shader(false, dtype, kv_dtype, !encoder_attn)
            };
            let pipeline = dev.pipeline(
                &shader.key_for(chunks),
                &|| shader.source_for(chunks),
                Bindings::Attention,
                shader.subgroups,
                LoopBounding::Off,
            )?;
            slots[slot] = attn_words(list.count, flags);
            let (x, z) = dev.info().grid(list.count as u64)?;
            passes.push(Dispatch {
                pipeline,
                slot,
                buffers: attention_buffers(&list.buffer),
                groups: (x, 1, z),
            });
        }
        if let Some(list) = &plan.decode_fast {
            let shader = cache
                .and_then(|c| {
                    self.shaders
                        .decode_shader(plan.fast_rows, dtype, c, cache_bytes)
                })
                .ok_or_else(|| {
                    Error::config("WGSL: the split-KV decode kernel cannot run this plan")
                })?;
            let pipeline = dev.pipeline(
                &shader.key_for(chunks),
                &|| shader.source_for(chunks),
                Bindings::Attention,
                true,
                LoopBounding::Off,
            )?;
            slots[SLOT_DECODE_FAST] = attn_words(list.count, flags);
            let (x, z) = dev.info().grid(list.count as u64)?;
            passes.push(Dispatch {
                pipeline,
                slot: SLOT_DECODE_FAST,
                buffers: attention_buffers(&list.buffer),
                groups: (x, 1, z),
            });
        }
        if let Some(list) = &plan.combine {
            let shader = CombineShader { out_dtype: dtype };
            let pipeline = dev.pipeline(
                &shader.key(),
                &|| shader.source(),
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
            let (x, z) = dev.info().grid(list.count as u64)?;
            passes.push(Dispatch {
                pipeline,
                slot: SLOT_COMBINE,
                buffers: vec![
                    (1, scratch.clone()),
                    (2, list.buffer.clone()),
                    (3, out_buf.clone()),
                    (4, lse_binding.clone()),
                ],
                groups: (x, p.num_heads as u32, z),
            });
        }
        Ok(())
    }

    fn merge(
        &self,
        _: &mut WgslRecording<R>,
        _: &WgslAttentionMetadata<R>,
        _: &mut ForwardIo<'_>,
    ) -> Result<()> {
        Err(Error::config("the WGSL kernels run no cascade passes"))
    }

    fn finish(&self, rec: WgslRecording<R>, _: Option<&mut ForwardIo<'_>>) -> Result<()> {
        // The parameters are written and the work submitted under one lock, so two calls on
        // this layer cannot interleave their parameter writes and submissions.
        let state = self.lock();
        self.dev
            .submit(&state.params, &rec.slots[..rec.used_slots], &rec.dispatches)
    }
}

/// The cache's buffers as the kernels bind them (one, or its chunks: a tensor larger than
/// one binding on the Vulkan runtime) and the blocks each chunk holds.
/// A cache of more than `u32::MAX` slots is refused: the cache write reads a slot as a u32.
fn cache_chunks<R: WgslRuntime>(dev: &R, cache: &KvCache) -> Result<(Vec<R::Buffer>, u32)> {
    check_slots(cache.num_blocks(), cache.block_size())?;
    let page = cache.spec().page_size_bytes()? as u64;
    dev.tensor_chunks(cache.data(), page, "kv_cache")
}

/// Errors for a cache of more than `u32::MAX` slots (the WGSL kernels address a slot as a
/// u32).
pub(crate) fn check_slots(num_blocks: usize, block_size: usize) -> Result<()> {
    if num_blocks
        .checked_mul(block_size)
        .is_none_or(|s| s > u32::MAX as usize)
    {
        return Err(Error::config(format!(
            "a cache of {num_blocks} blocks of {block_size} tokens has more than {} slots, \
             the most the WGSL kernels address",
            u32::MAX
        )));
    }
    Ok(())
}

/// How the kernels bind a cache of `buffers` buffers on `dev`.
fn chunk_form<R: WgslRuntime>(dev: &R, buffers: usize) -> CacheChunks {
    CacheChunks {
        count: buffers as u32,
        any_index: dev.info().binding_array_any_index,
    }
}
