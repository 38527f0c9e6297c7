//! The WGSL family's MLA impl, on either runtime ([`WgslRuntime`]): `forward_mqa` records the latent decode over the batch's decodes
//! (requests `0..num_decodes`, one query length) with split-KV and the combine,
//! `forward_mha` the expanded prefill chunk by chunk, `do_kv_cache_update` the latent write;
//! each call is one submission. Every tensor's shape, dtype and device is checked and every
//! workspace size computed with checked arithmetic before anything is recorded; nothing
//! waits for the GPU (a download does).

use std::sync::Mutex;

use crate::attention::{AttentionLayer, MlaAttentionImpl};
use crate::device::wgsl::{WgslRuntime, Words};
use crate::device::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::wgsl::{
    CacheChunks, MlaDecodeShader, MlaPrefillShader, MlaShader, MLA_ELEMENTWISE_WORKGROUP, MLA_ROWS,
};

use crate::metadata::AttentionMetadata;
use crate::mla::{AbsorbedWeights, MlaKvCache, MlaParams};

use crate::backends::mla_batch::{MlaBatchMetadata, MlaPrefillChunks};

use super::mla_recording::MlaRecording;
use super::{WgpuTuning, WgslBackendRuntime};

/// The prefill's expanded workspace per chunk (f32 latents and `kv_b_proj` output of every
/// prefill request): chunks are sized to stay within it and within one storage binding.
pub const PREFILL_WORKSPACE_BYTES: u64 = 256 << 20;

/// Most split partials one decode row is cut into.
const MAX_DECODE_SPLITS: usize = 64;

/// Workspace buffers, grown on demand and reused by later calls (the queue orders every use).
#[derive(Debug)]
struct Scratch<R: WgslRuntime> {
    /// Decode split partial outputs.
    partials: Option<R::Buffer>,
    /// Decode split partial LSEs.
    partial_lses: Option<R::Buffer>,
    /// Prefill latent rows (kv_c region, then rope region).
    latents: Option<R::Buffer>,
    /// Prefill `kv_b_proj` output.
    expanded: Option<R::Buffer>,
    /// Prefill softmax state (accumulators, then (m, l) rows).
    state: Option<R::Buffer>,
}

impl<R: WgslRuntime> Default for Scratch<R> {
    fn default() -> Self {
        Scratch {
            partials: None,
            partial_lses: None,
            latents: None,
            expanded: None,
            state: None,
        }
    }
}

/// The WGSL family's MLA impl of one layer on runtime `R`.
#[derive(Debug)]
pub struct WgslMlaAttentionImpl<R: WgslBackendRuntime> {
    params: MlaParams,
    dev: R,
    tuning: WgpuTuning,
    /// `kv_b_proj` `[N * (P + V)][Lkv]` f32, the prefill's expansion.
    kv_b_proj: R::Buffer,
    scratch: Mutex<Scratch<R>>,
}

/// `x` as u32, or an error naming `what`.
fn u32_of(what: &'static str, x: usize) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::overflow(what, format!("{x} does not fit u32")))
}

/// Product of `factors` as a byte count, or an overflow error naming `what`.
fn bytes_of(what: &'static str, factors: &[usize]) -> Result<u64> {
    factors
        .iter()
        .try_fold(1u64, |a, &x| a.checked_mul(x as u64))
        .ok_or_else(|| Error::overflow(what, format!("{factors:?}")))
}

/// The latent cache as the kernels that read or write it bind it.
struct LatentChunks<R: WgslRuntime> {
    /// One buffer, or the chunks in order.
    buffers: Vec<R::Buffer>,
    /// How the kernels bind them.
    form: CacheChunks,
    /// Blocks per chunk (all of them for one buffer).
    blocks_per_chunk: u32,
    /// Elements per block (`block_size · latent_dim`).
    block_stride: u32,
}

/// The buffer in `slot`, replaced by a larger one when it holds fewer than `bytes`; checked
/// to fit one storage binding.
fn grown<R: WgslRuntime>(
    dev: &R,
    slot: &mut Option<R::Buffer>,
    bytes: u64,
    what: &str,
) -> Result<R::Buffer> {
    dev.info().check_binding(bytes, what)?;
    match slot {
        Some(b) if R::buffer_bytes(b) >= bytes => Ok(b.clone()),
        _ => {
            let b = dev.scratch(what, bytes)?;
            *slot = Some(b.clone());
            Ok(b)
        }
    }
}

impl<R: WgslBackendRuntime> WgslMlaAttentionImpl<R> {
    /// The impl on `dev` for `params` (checked by the descriptor) with the tuning of the
    /// device's adapter kind; uploads `kv_b_proj`.
    pub fn new(params: MlaParams, weights: &AbsorbedWeights, dev: R) -> Result<Self> {
        let tuning = WgpuTuning::for_device(dev.info());
        Self::with_tuning(params, weights, dev, tuning)
    }

    /// [`WgslMlaAttentionImpl::new`] with an explicit tuning (its
    /// [`WgpuTuning::mla_prefill_chunk`] and split bounds).
    pub fn with_tuning(
        params: MlaParams,
        weights: &AbsorbedWeights,
        dev: R,
        tuning: WgpuTuning,
    ) -> Result<Self> {
        let backend = R::MLA_BACKEND;
        let sizes = [
            ("kv_lora_rank", params.kv_lora_rank),
            ("qk_rope_head_dim", params.qk_rope_head_dim),
            ("qk_nope_head_dim", params.qk_nope_head_dim),
            ("v_head_dim", params.v_head_dim),
        ];
        if let Some((what, v)) = sizes.iter().find(|(_, v)| v % 4 != 0) {
            return Err(Error::config(format!(
                "{backend}: {what} must be a multiple of 4 (the kernels load 4 elements at a \
                 time), got {v}"
            )));
        }
        let limit = dev.info().max_workgroup_storage;
        let (p, r, v) = (
            u32_of("qk_nope_head_dim", params.qk_nope_head_dim)?,
            u32_of("qk_rope_head_dim", params.qk_rope_head_dim)?,
            u32_of("v_head_dim", params.v_head_dim)?,
        );
        if MlaPrefillShader::keys_for(p, r, v, limit).is_none() {
            return Err(Error::config(format!(
                "{backend}: the prefill of qk {} / v {v} needs more workgroup memory than \
                 this device's {limit} bytes",
                p + r
            )));
        }
        let kv_b_proj = weights.kv_b_proj();
        let words: Vec<u32> = kv_b_proj.iter().map(|x| x.to_bits()).collect();
        let kv_b_proj = dev.upload_words("MLA kv_b_proj", &words)?;
        dev.info()
            .check_binding(R::buffer_bytes(&kv_b_proj), "MLA kv_b_proj")?;
        Ok(WgslMlaAttentionImpl {
            params,
            dev,
            tuning,
            kv_b_proj,
            scratch: Mutex::new(Scratch::default()),
        })
    }

    /// The tuning the layer runs with.
    pub fn tuning(&self) -> WgpuTuning {
        self.tuning
    }

    /// The cache checked against the activation dtype and the device (its shape against
    /// the layer by `MlaParams::check_*`).
    fn check_cache(&self, cache: &MlaKvCache, act: DType) -> Result<()> {
        if cache.data().device() != &self.dev.device() {
            return Err(Error::Device {
                backend: R::MLA_BACKEND.into(),
                message: "the latent cache is not on this backend's device".into(),
            });
        }
        let want = if cache.cache_dtype().is_fp8() {
            DType::Fp8E4m3
        } else {
            act
        };
        if cache.storage_dtype() != want {
            return Err(Error::DType {
                what: "MLA latent cache",
                got: cache.storage_dtype().to_string(),
                expected: format!("{act} (the activations') or fp8_e4m3"),
            });
        }
        self.cache_chunks(cache)?;
        Ok(())
    }

    /// The latent cache as the kernels bind it: one buffer, or its chunks (a tensor larger
    /// than one binding on the Vulkan runtime), with the blocks each chunk holds.
    fn cache_chunks(&self, cache: &MlaKvCache) -> Result<LatentChunks<R>> {
        super::attention_impl::check_slots(cache.num_blocks(), cache.block_size())?;
        let block_elems = bytes_of("MLA cache block", &[cache.block_size(), cache.latent_dim()])?;
        let page = block_elems
            .checked_mul(cache.storage_dtype().size_in_bytes() as u64)
            .ok_or_else(|| Error::overflow("MLA cache block", format!("{block_elems} elements")))?;
        let (buffers, blocks_per_chunk) =
            self.dev.tensor_chunks(cache.data(), page, "latent cache")?;
        Ok(LatentChunks {
            form: CacheChunks {
                count: buffers.len() as u32,
                any_index: self.dev.info().binding_array_any_index,
            },
            buffers,
            blocks_per_chunk,
            block_stride: u32::try_from(block_elems).map_err(|_| {
                Error::overflow("MLA cache block", format!("{block_elems} elements"))
            })?,
        })
    }

    /// The buffer of `t`, which must live on this device and fit one binding.
    fn buf(&self, t: &Tensor, what: &'static str) -> Result<R::Buffer> {
        self.dev.tensor_buffer(t, what)
    }

    fn recording(&self) -> MlaRecording<R> {
        MlaRecording::new(&self.dev, R::MLA_BACKEND)
    }

    /// Splits of the decode's keys: enough workgroups for the tuning's target, each split at
    /// least `split_min_keys` keys, at most `max_splits` (and [`MAX_DECODE_SPLITS`]).
    fn decode_splits(&self, groups: usize, max_seq: usize) -> usize {
        let t = &self.tuning;
        let want = (t.target_workgroups as usize).div_ceil(groups.max(1));
        let by_keys = max_seq / (t.split_min_keys as usize).max(1);
        want.min(by_keys)
            .min(t.max_splits as usize)
            .clamp(1, MAX_DECODE_SPLITS)
    }
}

impl<R: WgslBackendRuntime> MlaAttentionImpl for WgslMlaAttentionImpl<R> {
    fn do_kv_cache_update(
        &self,
        layer: &AttentionLayer,
        kv_c: &Tensor,
        k_pe: &Tensor,
        kv_cache: &mut MlaKvCache,
        metadata: &dyn AttentionMetadata,
    ) -> Result<()> {
        let md = metadata.downcast::<MlaBatchMetadata>("WgslMlaAttentionImpl")?;
        let act = kv_c.dtype();
        self.check_cache(kv_cache, act)?;
        let p = &self.params;
        let slots = md.common.slot_mapping_cpu();
        let t = slots.len();
        p.check_cache_update(t, kv_c, k_pe, kv_cache)?;
        let kv_c_buf = self.buf(kv_c, "kv_c")?;
        let k_pe_buf = self.buf(k_pe, "k_pe")?;
        let capacity = kv_cache.num_blocks() as u64 * kv_cache.block_size() as u64;
        if let Some(&s) = slots.iter().find(|&&s| s >= 0 && s as u64 >= capacity) {
            return Err(Error::metadata(format!(
                "concat_and_cache_mla: slot {s} is outside the cache's {capacity} slots"
            )));
        }
        if t == 0 {
            return Ok(());
        }
        let d4 = p.latent_dim() / 4;
        let groups =
            bytes_of("MLA cache write", &[t, d4])?.div_ceil(MLA_ELEMENTWISE_WORKGROUP as u64);
        let (x, z) = self.dev.info().grid(groups)?;
        let cache = self.cache_chunks(kv_cache)?;
        let words = Words::new()
            .u(u32_of("tokens", t)?)
            .u((p.kv_lora_rank / 4) as u32)
            .u((p.qk_rope_head_dim / 4) as u32)
            .f(kv_cache.dequant_scale(layer.k_scale)?)
            .u(u32_of("block size", kv_cache.block_size())?)
            .u(cache.block_stride)
            .u(cache.blocks_per_chunk);
        let mut rec = self.recording();
        let mut buffers = vec![
            (1, kv_c_buf),
            (2, k_pe_buf),
            (3, self.buf(&md.arrays().slot_mapping, "slot_mapping")?),
        ];
        buffers.extend(cache.buffers.iter().map(|b| (4, b.clone())));
        rec.mla_with(
            MlaShader::CacheWrite {
                act_dtype: act,
                cache_dtype: kv_cache.storage_dtype(),
            },
            cache.form,
            words,
            buffers,
            (x, 1, z),
        )?;
        rec.submit()
    }

    fn forward_mqa(
        &self,
        layer: &AttentionLayer,
        q: &Tensor,
        kv_cache: &MlaKvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
        lse: Option<&mut Tensor>,
    ) -> Result<()> {
        let md = metadata.downcast::<MlaBatchMetadata>("WgslMlaAttentionImpl")?;
        let p = &self.params;
        let b = md.split.num_decode_tokens;
        let act = q.dtype();
        let (n, l) = (p.num_heads, p.kv_lora_rank);
        p.check_mqa(b, q, kv_cache, output, lse.as_deref())?;
        self.check_cache(kv_cache, act)?;
        let cache = self.cache_chunks(kv_cache)?;
        let q_buf = self.buf(q, "q")?;
        let out_buf = self.buf(output, "output")?;
        let lse_buf = match lse.as_deref() {
            Some(t) => Some(self.buf(t, "lse")?),
            None => None,
        };
        let bs = kv_cache.block_size();
        let limit = self.dev.info().max_workgroup_storage;
        let dim = p.latent_dim() as u32;
        let keys =
            MlaDecodeShader::keys_for(dim, u32_of("block size", bs)?, limit).ok_or_else(|| {
                Error::config(format!(
                    "{}: no decode step of a {dim}-wide latent divides block size {bs} \
                     and fits this device's {limit} bytes of workgroup memory",
                    R::MLA_BACKEND
                ))
            })?;
        let decodes = md.split.num_decodes;
        if decodes == 0 || b == 0 {
            return Ok(());
        }
        let q_len = md.common.query_len(0);
        let rows = q_len * n;
        let tiles = rows.div_ceil(MLA_ROWS as usize);
        let max_seq = md.common.seq_lens_cpu()[..decodes]
            .iter()
            .map(|&s| s as usize)
            .max()
            .unwrap_or(0);
        let splits = self.decode_splits(tiles * decodes, max_seq);
        let k_scale = kv_cache.dequant_scale(layer.k_scale)?;
        let total_rows = b * n;
        let words = Words::new()
            .u(u32_of("heads", n)?)
            .u(u32_of("decode tokens", b)?)
            .u(u32_of("block size", bs)?)
            .u(u32_of("block-table width", md.common.max_blocks_per_req())?)
            .u(splits as u32)
            .u(u32_of("query length", q_len)?)
            .f(p.scale * k_scale)
            .f(k_scale)
            .u(lse_buf.is_some() as u32)
            .u(cache.block_stride)
            .u(cache.blocks_per_chunk);
        let arrays = md.arrays();
        let grid = (
            u32_of("row tiles", tiles)?,
            u32_of("decode requests", decodes)?,
            splits as u32,
        );
        let shader = |split| {
            MlaShader::Decode(MlaDecodeShader {
                latent_dim: dim,
                kv_lora_rank: l as u32,
                keys,
                q_dtype: act,
                cache_dtype: kv_cache.storage_dtype(),
                split,
            })
        };
        let mut inputs = vec![(1, q_buf)];
        inputs.extend(cache.buffers.iter().map(|b| (2, b.clone())));
        inputs.extend([
            (3, self.buf(&arrays.block_table, "block_table")?),
            (4, self.buf(&arrays.seq_lens, "seq_lens")?),
        ]);
        let lse_or_dummy = match &lse_buf {
            Some(b) => b.clone(),
            None => self.dev.placeholder(0)?,
        };
        let mut rec = self.recording();
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if splits == 1 {
            let mut buffers = inputs;
            buffers.extend([(5, out_buf), (6, lse_or_dummy)]);
            rec.mla_with(shader(false), cache.form, words, buffers, grid)?;
        } else {
            let out_bytes = bytes_of("MLA split partials", &[splits, total_rows, l, 4])?;
            let lse_bytes = bytes_of("MLA split LSEs", &[splits, total_rows, 4])?;
            let part = grown(
                &self.dev,
                &mut scratch.partials,
                out_bytes,
                "MLA split partials",
            )?;
            let part_lse = grown(
                &self.dev,
                &mut scratch.partial_lses,
                lse_bytes,
                "MLA split LSEs",
            )?;
            let mut buffers = inputs;
            buffers.extend([(5, part.clone()), (6, part_lse.clone())]);
            rec.mla_with(shader(true), cache.form, words, buffers, grid)?;
            let groups = bytes_of("MLA combine", &[total_rows, l / 4])?
                .div_ceil(MLA_ELEMENTWISE_WORKGROUP as u64);
            let (x, z) = self.dev.info().grid(groups)?;
            rec.mla(
                MlaShader::Combine {
                    kv_lora_rank: l as u32,
                    out_dtype: act,
                },
                Words::new()
                    .u(b as u32)
                    .u(n as u32)
                    .u(splits as u32)
                    .u(lse_buf.is_some() as u32),
                vec![(1, part), (2, part_lse), (3, out_buf), (4, lse_or_dummy)],
                (x, 1, z),
            )?;
        }
        rec.submit()
    }

    fn forward_mha(
        &self,
        layer: &AttentionLayer,
        q: &Tensor,
        kv_c_normed: &Tensor,
        k_pe: &Tensor,
        kv_cache: &MlaKvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
    ) -> Result<()> {
        let md = metadata.downcast::<MlaBatchMetadata>("WgslMlaAttentionImpl")?;
        let p = &self.params;
        let t = md.split.num_prefill_tokens;
        let act = q.dtype();
        let (l, r, nh) = (p.kv_lora_rank, p.qk_rope_head_dim, p.num_heads);
        p.check_mha(t, q, kv_c_normed, k_pe, kv_cache, output)?;
        self.check_cache(kv_cache, act)?;
        let q_buf = self.buf(q, "q")?;
        let kv_c_buf = self.buf(kv_c_normed, "kv_c_normed")?;
        let k_pe_buf = self.buf(k_pe, "k_pe")?;
        let out_buf = self.buf(output, "output")?;
        let first = md.split.num_decodes;
        let reqs = md.common.num_reqs();
        let n = reqs - first;
        if n == 0 || t == 0 {
            return Ok(());
        }
        let k_scale = kv_cache.dequant_scale(layer.k_scale)?;
        let qsl = md.common.query_start_loc_cpu();
        let max_q = (first..reqs)
            .map(|i| md.common.query_len(i))
            .max()
            .unwrap_or(0);

        // Chunks: the expanded rows of every prefill request (f32 latents and kv_b_proj
        // output) within the workspace and one storage binding.
        let kvw = nh * (p.qk_nope_head_dim + p.v_head_dim);
        let lat_row = bytes_of("MLA latent row", &[l + r, 4])?;
        let kvx_row = bytes_of("MLA expanded row", &[kvw, 4])?;
        let budget = PREFILL_WORKSPACE_BYTES.min(self.dev.info().max_binding_bytes);
        let fit = |_| match budget / kvx_row.max(lat_row) / n as u64 / 16 * 16 {
            0 => Err(Error::config(format!(
                "{}: {n} prefill requests of {nh} heads need more than one storage binding \
                 ({budget} bytes) for 16 expanded positions each; prefill fewer requests per \
                 batch",
                R::MLA_BACKEND
            ))),
            f => Ok(f as usize),
        };
        let plan_chunks = MlaPrefillChunks::new(
            md,
            self.tuning.mla_prefill_chunk.map(|c| c as usize),
            16,
            fit,
        )?;
        let (chunk, chunks) = (plan_chunks.chunk, plan_chunks.chunks);

        // The plan: per prefill request (q_start, q_len, seq_len, batch request), then per
        // chunk the n + 1 row starts.
        let q_base = qsl[first];
        let mut plan: Vec<i32> = Vec::with_capacity(4 * n + chunks * (n + 1));
        for (k, &s) in plan_chunks.seq_lens.iter().enumerate() {
            let i = first + k;
            plan.extend([
                qsl[i] - q_base,
                md.common.query_len(i) as i32,
                s as i32,
                i as i32,
            ]);
        }
        let mut rows_cap = 0usize;
        for c in 0..chunks {
            let starts = plan_chunks.starts(c)?;
            rows_cap = rows_cap.max(starts[n] as usize);
            plan.extend(starts);
        }
        let plan_words: Vec<u32> = plan.iter().map(|&x| x as u32).collect();
        let plan_buf = self.dev.upload_words("MLA prefill plan", &plan_words)?;

        let state_rows = t * nh;
        let kvc_bytes = bytes_of("MLA prefill latents", &[rows_cap, l, 4])?;
        let lat_bytes = bytes_of("MLA prefill latents", &[rows_cap, l + r, 4])?;
        let kvx_bytes = bytes_of("MLA prefill expansion", &[rows_cap, kvw, 4])?;
        let acc_bytes = bytes_of("MLA prefill state", &[state_rows, p.v_head_dim, 4])?;
        let state_bytes = bytes_of("MLA prefill state", &[state_rows, 16])?
            .checked_add(acc_bytes)
            .ok_or_else(|| Error::overflow("MLA prefill state", format!("{state_rows} rows")))?;
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let lat = grown(
            &self.dev,
            &mut scratch.latents,
            lat_bytes,
            "MLA prefill latents",
        )?;
        let kvx = grown(
            &self.dev,
            &mut scratch.expanded,
            kvx_bytes,
            "MLA prefill expansion",
        )?;
        let state = grown(
            &self.dev,
            &mut scratch.state,
            state_bytes,
            "MLA prefill state",
        )?;
        let pe_off = u32_of("MLA rope region", (kvc_bytes / 16) as usize)?;
        let ml_off = u32_of("MLA softmax-state region", (acc_bytes / 16) as usize)?;
        let limit = self.dev.info().max_workgroup_storage;
        let (pn, rr, vd) = (p.qk_nope_head_dim as u32, r as u32, p.v_head_dim as u32);
        let keys = MlaPrefillShader::keys_for(pn, rr, vd, limit).ok_or_else(|| {
            Error::config(format!("{}: the prefill step does not fit", R::MLA_BACKEND))
        })?;
        let prefill = MlaShader::Prefill(MlaPrefillShader {
            qk_nope: pn,
            rope: rr,
            v_dim: vd,
            keys,
            dtype: act,
        });
        let gather = MlaShader::Gather {
            act_dtype: act,
            cache_dtype: kv_cache.storage_dtype(),
        };
        let arrays = md.arrays();
        let cache = self.cache_chunks(kv_cache)?;
        let bt_buf = self.buf(&arrays.block_table, "block_table")?;
        let max_groups = self.dev.info().max_workgroups_per_dim as u64;
        let mut rec = self.recording();
        for c in 0..chunks {
            let lo = plan_chunks.lo(c);
            let starts_off = 4 * n + c * (n + 1);
            let rows = plan[starts_off + n] as usize;
            // Gather: request i's rows over the workgroups of grid row i.
            let per_req = (chunk * (l + r) / 4).div_ceil(MLA_ELEMENTWISE_WORKGROUP as usize);
            let gx = (per_req as u64).clamp(1, max_groups) as u32;
            let mut buffers = vec![(1, kv_c_buf.clone()), (2, k_pe_buf.clone())];
            buffers.extend(cache.buffers.iter().map(|b| (3, b.clone())));
            buffers.extend([(4, bt_buf.clone()), (5, plan_buf.clone()), (6, lat.clone())]);
            rec.mla_with(
                gather,
                cache.form,
                Words::new()
                    .u(u32_of("chunk start", lo)?)
                    .u(u32_of("plan offset", starts_off)?)
                    .u(u32_of("block size", kv_cache.block_size())?)
                    .u(u32_of("block-table width", md.common.max_blocks_per_req())?)
                    .u((l / 4) as u32)
                    .u((r / 4) as u32)
                    .u(pe_off)
                    .f(k_scale)
                    .u(cache.block_stride)
                    .u(cache.blocks_per_chunk),
                buffers,
                (gx, u32_of("prefill requests", n)?, 1),
            )?;
            rec.linear(
                &lat,
                &self.kv_b_proj,
                &kvx,
                (
                    u32_of("chunk rows", rows.max(1))?,
                    l as u32,
                    u32_of("kv_b_proj outputs", kvw)?,
                ),
            )?;
            rec.mla(
                prefill,
                Words::new()
                    .u(nh as u32)
                    .u(lo as u32)
                    .u(chunk as u32)
                    .u(starts_off as u32)
                    .u(pe_off)
                    .u(ml_off)
                    .f(p.scale)
                    .u((c == 0) as u32)
                    .u((c + 1 == chunks) as u32),
                vec![
                    (1, q_buf.clone()),
                    (2, kvx.clone()),
                    (3, lat.clone()),
                    (4, plan_buf.clone()),
                    (5, state.clone()),
                    (6, out_buf.clone()),
                ],
                (
                    u32_of("token tiles", max_q.div_ceil(MLA_ROWS as usize))?,
                    u32_of("heads", nh)?,
                    u32_of("prefill requests", n)?,
                ),
            )?;
        }
        rec.submit()
    }
}
