//! The MLA impl both backends of the CUDA kernel family share (`CUDA_MLA` on NVIDIA's
//! runtime, `HIP_MLA` on AMD's): `forward_mqa` queues the latent decode over the batch's
//! decodes (requests `0..num_decodes`, one query length) with split-KV and the combine,
//! `forward_mha` the expanded prefill chunk by chunk, `do_kv_cache_update` the latent write.
//! Every tensor's shape, dtype and device is checked before anything is queued; nothing
//! waits for the GPU (a download does).
//!
//! Why one impl: the kernels are one family (`kernels-cuda/`), so the launches, the
//! workspace layout and the split rule are the same on both runtimes; a runtime says only how
//! it allocates, resolves tensors, launches, and which decode form it runs ([`MlaRuntime`]).
//! The CUDA side's test runs (the portable decode included, `POLYATTN_CUDA_MLA_DECODE`)
//! therefore exercise the code the HIP side runs.

use std::fmt::Debug;
use std::sync::Mutex;

use crate::attention::{AttentionLayer, MlaAttentionImpl};
use crate::backend::{BackendCapabilities, BlockSize, DeviceCapability, HeadSizes};
use crate::backends::mla_batch::{MlaBatchMetadata, MlaPrefillChunks};
use crate::device::Tensor;
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::kernels::cuda::{
    check_mla_block_size, code, mla_num_splits, KernelSource, LinearParams, MlaCacheParams,
    MlaCombineParams, MlaDecodeForm, MlaDecodeParams, MlaGatherParams, MlaPrefillParams, MLA_CACHE,
    MLA_CACHE_THREADS, MLA_DECODE, MLA_KEYS, MLA_LATENT_DIM, MLA_PREFILL, MLA_PREFILL_MAX_DIM,
    MLA_ROW_WARPS, MLA_VALUE_DIM, MODEL_LINEAR,
};
use crate::metadata::AttentionMetadata;
use crate::mla::{AbsorbedWeights, MlaKvCache, MlaParams};

/// The prefill's expanded workspace per chunk (latents, `kv_b_proj` output): chunks are
/// sized to stay within it.
pub const PREFILL_WORKSPACE_BYTES: usize = 256 << 20;

/// What both CUDA-family MLA backends take (their kernels are the same), from devices of
/// `min_capability` on (NVIDIA's compute capability; `None` on AMD).
pub(crate) fn cuda_family_mla_capabilities(
    min_capability: Option<DeviceCapability>,
) -> BackendCapabilities {
    BackendCapabilities::mla(
        // The kernels are built for DeepSeek's 512 + 64 latent (FlashMLA's 576).
        HeadSizes::List(vec![MLA_LATENT_DIM]),
        vec![DType::F16, DType::Bf16],
        vec![
            CacheDType::Auto,
            CacheDType::F16,
            CacheDType::Bf16,
            CacheDType::Fp8E4m3,
        ],
        // FlashInfer-MLA's sizes (FlashMLA's 64 among them): the decode reads chunks of 32
        // keys that never cross a block.
        vec![BlockSize::Exact(32), BlockSize::Exact(64)],
        min_capability,
    )
}

/// Tile of `model_linear_tiled` (64 x 64 outputs per CTA of 256 threads).
const LINEAR_TILE: usize = 64;

/// What the family's MLA impl needs of a GPU runtime. Implemented by the CUDA and HIP
/// devices (`backends::cuda_mla::kernels`, `backends::hip_mla::kernels`).
pub trait MlaRuntime: Clone + Debug + Send + Sync + 'static {
    /// A device allocation.
    type Buffer: Debug + Send + Sync;
    /// The backend's name, for errors.
    const BACKEND: &'static str;
    /// A zeroed buffer of `bytes` bytes.
    fn alloc(&self, bytes: usize) -> Result<Self::Buffer>;
    /// A buffer holding `data`.
    fn upload_f32(&self, data: &[f32]) -> Result<Self::Buffer>;
    /// Copies `data` into `buf` at byte offset `offset` (ordered on the device's stream).
    fn write_i32(&self, buf: &mut Self::Buffer, offset: usize, data: &[i32]) -> Result<()>;
    /// The device address of `buf`.
    fn buffer_ptr(buf: &Self::Buffer) -> u64;
    /// The size of `buf` in bytes.
    fn buffer_len(buf: &Self::Buffer) -> usize;
    /// The device address of `t`; an error naming `what` when `t` is not on this device.
    fn ptr(&self, t: &Tensor, what: &str) -> Result<u64>;
    /// Threads per warp / wavefront.
    fn wave(&self) -> usize;
    /// SMs / compute units.
    fn units(&self) -> usize;
    /// Usable shared memory (LDS) per SM / compute unit, as the split rule counts CTAs.
    fn shared_per_unit(&self) -> usize;
    /// The decode form for requests of `rows` rows (`q_len * heads`).
    fn decode_form(&self, rows: usize) -> MlaDecodeForm;
    /// The prefill chunk the runtime's tuning asks for, if any.
    fn prefill_chunk(&self) -> Option<usize>;
    /// Queues entry point `name` of `source` (built with `defines`) in `shape`, with the
    /// parameter block `params`.
    fn launch<P: bytemuck::Pod>(
        &self,
        source: &KernelSource,
        defines: &[String],
        name: &str,
        shape: LaunchShape,
        params: &P,
    ) -> Result<()>;
}

/// Where a launch runs: the grid, threads per CTA and bytes of dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchShape {
    /// CTAs along x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per CTA (one dimension).
    pub threads: u32,
    /// Dynamic shared memory per CTA.
    pub smem: u32,
}

fn shape(grid: (u32, u32, u32), threads: u32, smem: u32) -> LaunchShape {
    LaunchShape {
        grid,
        threads,
        smem,
    }
}

/// The family's MLA impl of one layer on runtime `R`.
#[derive(Debug)]
pub struct CudaFamilyMlaImpl<R: MlaRuntime> {
    params: MlaParams,
    rt: R,
    /// `kv_b_proj` `[N * (P + V)][Lkv]` f32, the prefill's expansion.
    kv_b_proj: R::Buffer,
    /// Split partials, prefill workspace: grown on demand, reused by later calls (the stream
    /// orders every use).
    scratch: Mutex<Option<R::Buffer>>,
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds the kernels' i32 range")))
}

fn u32_of(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::config(format!("{what} = {v} exceeds a launch dimension")))
}

/// CTAs of a grid-stride launch over `units` items, 256 threads each (at most 8192 CTAs).
fn stride_ctas(units: usize) -> u32 {
    units.div_ceil(MLA_CACHE_THREADS as usize).clamp(1, 8192) as u32
}

impl<R: MlaRuntime> CudaFamilyMlaImpl<R> {
    /// The impl on `rt` for `params` (checked by the descriptor); uploads `kv_b_proj`.
    pub fn new(params: MlaParams, weights: &AbsorbedWeights, rt: R) -> Result<Self> {
        if params.latent_dim() != MLA_LATENT_DIM || params.kv_lora_rank != MLA_VALUE_DIM {
            return Err(Error::config(format!(
                "{}'s kernels are built for kv_lora_rank {MLA_VALUE_DIM} + rope {}; got \
                 {} + {}",
                R::BACKEND,
                MLA_LATENT_DIM - MLA_VALUE_DIM,
                params.kv_lora_rank,
                params.qk_rope_head_dim
            )));
        }
        if params.qk_head_dim() > MLA_PREFILL_MAX_DIM || params.v_head_dim > MLA_PREFILL_MAX_DIM {
            return Err(Error::config(format!(
                "{}'s prefill takes qk_nope + rope and v_head_dim up to \
                 {MLA_PREFILL_MAX_DIM}; got {} and {}",
                R::BACKEND,
                params.qk_head_dim(),
                params.v_head_dim
            )));
        }
        let kv_b_proj = rt.upload_f32(&weights.kv_b_proj())?;
        Ok(CudaFamilyMlaImpl {
            params,
            rt,
            kv_b_proj,
            scratch: Mutex::new(None),
        })
    }

    fn device_error(message: impl Into<String>) -> Error {
        Error::Device {
            backend: R::BACKEND.into(),
            message: message.into(),
        }
    }

    /// The buffer in `slot`, replaced by a larger one when it holds fewer than `bytes`.
    fn grown<'a>(
        &self,
        slot: &'a mut Option<R::Buffer>,
        bytes: usize,
    ) -> Result<&'a mut R::Buffer> {
        if slot.as_ref().is_none_or(|b| R::buffer_len(b) < bytes) {
            *slot = Some(self.rt.alloc(bytes.max(256))?);
        }
        slot.as_mut()
            .ok_or_else(|| Self::device_error("the scratch buffer was not allocated"))
    }

    /// A device buffer of at least `bytes` (contents undefined), reused across calls.
    fn scratch(&self, bytes: usize) -> Result<u64> {
        let mut s = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        Ok(R::buffer_ptr(self.grown(&mut s, bytes)?))
    }

    /// The activation dtype (f16 or bf16) and the cache (on this GPU, of that dtype or
    /// E4M3) checked, their shapes being `MlaParams::check_*`'s; whether the cache is fp8.
    fn check_cache(&self, cache: &MlaKvCache, act: DType) -> Result<bool> {
        if !matches!(act, DType::F16 | DType::Bf16) {
            return Err(Error::DType {
                what: "MLA activations",
                got: act.to_string(),
                expected: "f16 or bf16".into(),
            });
        }
        if self.rt.ptr(cache.data(), "latent cache").is_err() {
            return Err(Self::device_error(
                "the latent cache is not on this backend's GPU",
            ));
        }
        let fp8 = cache.cache_dtype().is_fp8();
        let want = if fp8 { DType::Fp8E4m3 } else { act };
        if cache.storage_dtype() != want {
            return Err(Error::DType {
                what: "MLA latent cache",
                got: cache.storage_dtype().to_string(),
                expected: format!("{act} (the activations') or fp8_e4m3"),
            });
        }
        Ok(fp8)
    }

    /// Checks that every tensor of `ts` lives on this GPU.
    fn on_gpu(&self, ts: &[(&Tensor, &str)]) -> Result<()> {
        ts.iter()
            .try_for_each(|(t, what)| self.rt.ptr(t, what).map(|_| ()))
    }

    /// Queues `y [t][n] = x [t][k] · w [n][k]^T` (f32) with the tiled GEMM of `model_linear.cu`.
    fn launch_linear(&self, params: &LinearParams) -> Result<()> {
        let (t, n) = (params.t as usize, params.n as usize);
        let gy = t.div_ceil(LINEAR_TILE);
        if gy > 65535 {
            return Err(Error::config(format!(
                "the MLA prefill chunk of {t} rows exceeds the GEMM's grid"
            )));
        }
        let grid = (u32_of("GEMM tiles", n.div_ceil(LINEAR_TILE))?, gy as u32, 1);
        self.rt.launch(
            &MODEL_LINEAR,
            &[],
            "model_linear_tiled",
            shape(grid, 256, 0),
            params,
        )
    }

    /// Threads of the kernels with one warp / wavefront per row.
    fn row_threads(&self) -> Result<u32> {
        u32_of("row-kernel threads", MLA_ROW_WARPS * self.rt.wave())
    }
}

impl<R: MlaRuntime> MlaAttentionImpl for CudaFamilyMlaImpl<R> {
    fn do_kv_cache_update(
        &self,
        layer: &AttentionLayer,
        kv_c: &Tensor,
        k_pe: &Tensor,
        kv_cache: &mut MlaKvCache,
        metadata: &dyn AttentionMetadata,
    ) -> Result<()> {
        let md = metadata.downcast::<MlaBatchMetadata>(R::BACKEND)?;
        let act = kv_c.dtype();
        let p = &self.params;
        let slots = md.common.slot_mapping_cpu();
        let t = slots.len();
        p.check_cache_update(t, kv_c, k_pe, kv_cache)?;
        self.check_cache(kv_cache, act)?;
        self.on_gpu(&[(kv_c, "kv_c"), (k_pe, "k_pe")])?;
        let capacity = kv_cache.num_blocks() as u64 * kv_cache.block_size() as u64;
        if let Some(&s) = slots.iter().find(|&&s| s >= 0 && s as u64 >= capacity) {
            return Err(Error::metadata(format!(
                "concat_and_cache_mla: slot {s} is outside the cache's {capacity} slots"
            )));
        }
        if t == 0 {
            return Ok(());
        }
        let params = MlaCacheParams {
            kv_c: self.rt.ptr(kv_c, "kv_c")?,
            k_pe: self.rt.ptr(k_pe, "k_pe")?,
            cache: self.rt.ptr(kv_cache.data(), "latent cache")?,
            slot_mapping: self.rt.ptr(&md.arrays().slot_mapping, "slot_mapping")?,
            scale: kv_cache.dequant_scale(layer.k_scale)?,
            num_tokens: i32_of("tokens", t)?,
            kv_lora_rank: i32_of("kv_lora_rank", p.kv_lora_rank)?,
            rope_dim: i32_of("rope", p.qk_rope_head_dim)?,
            act_dtype: code(act)?,
            cache_dtype: code(kv_cache.storage_dtype())?,
            block_size: i32_of("block size", kv_cache.block_size())?,
            pad: 0,
        };
        let grid = (stride_ctas(t * p.latent_dim()), 1, 1);
        self.rt.launch(
            &MLA_CACHE,
            &[],
            "concat_and_cache_mla",
            shape(grid, MLA_CACHE_THREADS, 0),
            &params,
        )
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
        let md = metadata.downcast::<MlaBatchMetadata>(R::BACKEND)?;
        let p = &self.params;
        let b = md.split.num_decode_tokens;
        let act = q.dtype();
        p.check_mqa(b, q, kv_cache, output, lse.as_deref())?;
        let fp8 = self.check_cache(kv_cache, act)?;
        self.on_gpu(&[(q, "q"), (output, "output")])?;
        let lse_ptr = match lse.as_deref() {
            Some(l) => self.rt.ptr(l, "lse")?,
            None => 0,
        };
        check_mla_block_size(kv_cache.block_size())?;
        let decodes = md.split.num_decodes;
        if decodes == 0 {
            return Ok(());
        }
        let q_len = md.common.query_len(0);
        let rows = q_len * p.num_heads;
        let form = self.rt.decode_form(rows);
        let tiles = rows.div_ceil(form.rows());
        let max_seq = md.common.seq_lens_cpu()[..decodes]
            .iter()
            .map(|&s| s as usize)
            .max()
            .unwrap_or(0);
        let splits = mla_num_splits(
            tiles * decodes,
            form.resident(fp8, self.rt.shared_per_unit()),
            self.rt.units(),
            max_seq,
        );
        let k_scale = kv_cache.dequant_scale(layer.k_scale)?;
        let arrays = md.arrays();
        let out_ptr = self.rt.ptr(output, "output")?;
        let mut params = MlaDecodeParams {
            q: self.rt.ptr(q, "q")?,
            cache: self.rt.ptr(kv_cache.data(), "latent cache")?,
            out: out_ptr,
            lse: lse_ptr,
            part_out: 0,
            part_lse: 0,
            query_start_loc: self.rt.ptr(&arrays.query_start_loc, "query_start_loc")?,
            seq_lens: self.rt.ptr(&arrays.seq_lens, "seq_lens")?,
            block_table: self.rt.ptr(&arrays.block_table, "block_table")?,
            scale: p.scale * k_scale,
            v_scale: k_scale,
            num_heads: i32_of("heads", p.num_heads)?,
            num_tokens: i32_of("decode tokens", b)?,
            block_size: i32_of("block size", kv_cache.block_size())?,
            bt_stride: i32_of("block-table width", md.common.max_blocks_per_req())?,
            num_splits: splits as i32,
            pad: 0,
        };
        let total_rows = b * p.num_heads;
        if splits > 1 {
            let out_bytes = splits
                .checked_mul(total_rows)
                .and_then(|x| x.checked_mul(MLA_VALUE_DIM * 4))
                .ok_or_else(|| {
                    Error::overflow("MLA split partials", format!("{splits} x {total_rows}"))
                })?;
            let out_bytes = out_bytes.div_ceil(256) * 256;
            let base = self.scratch(out_bytes + splits * total_rows * 4)?;
            params.part_out = base;
            params.part_lse = base + out_bytes as u64;
        }
        let grid = (
            u32_of("row tiles", tiles)?,
            u32_of("decode requests", decodes)?,
            splits as u32,
        );
        let bf16 = act == DType::Bf16;
        self.rt.launch(
            &form.source(),
            &form.defines(bf16, fp8),
            &form.function_name(bf16, fp8),
            shape(grid, form.threads(), form.smem_bytes(fp8)),
            &params,
        )?;
        if splits > 1 {
            let combine = MlaCombineParams {
                part_out: params.part_out,
                part_lse: params.part_lse,
                out: out_ptr,
                lse: lse_ptr,
                num_heads: params.num_heads,
                num_tokens: params.num_tokens,
                num_splits: splits as i32,
                out_dtype: code(act)?,
            };
            let ctas = u32_of("MLA combine CTAs", total_rows.div_ceil(MLA_ROW_WARPS))?;
            self.rt.launch(
                &MLA_DECODE,
                &[],
                "mla_combine",
                shape((ctas, 1, 1), self.row_threads()?, 0),
                &combine,
            )?;
        }
        Ok(())
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
        let md = metadata.downcast::<MlaBatchMetadata>(R::BACKEND)?;
        let p = &self.params;
        let t = md.split.num_prefill_tokens;
        let act = q.dtype();
        let (l, r) = (p.kv_lora_rank, p.qk_rope_head_dim);
        p.check_mha(t, q, kv_c_normed, k_pe, kv_cache, output)?;
        self.check_cache(kv_cache, act)?;
        self.on_gpu(&[
            (q, "q"),
            (kv_c_normed, "kv_c_normed"),
            (k_pe, "k_pe"),
            (output, "output"),
        ])?;
        let first = md.split.num_decodes;
        let reqs = md.common.num_reqs();
        let n = reqs - first;
        if n == 0 || t == 0 {
            return Ok(());
        }
        let k_scale = kv_cache.dequant_scale(layer.k_scale)?;
        let max_rows = (first..reqs)
            .map(|i| md.common.query_len(i) * p.num_heads)
            .max()
            .unwrap_or(0);
        // Chunk positions so that one chunk's workspace (f32 latents and kv_b_proj output of
        // every prefill request) stays within PREFILL_WORKSPACE_BYTES.
        let kvw = p.num_heads * (p.qk_nope_head_dim + p.v_head_dim);
        let per_row = (l + r + kvw) * 4;
        let plan = MlaPrefillChunks::new(md, self.rt.prefill_chunk(), MLA_KEYS, |_| {
            Ok(PREFILL_WORKSPACE_BYTES / per_row / n / MLA_KEYS * MLA_KEYS)
        })?;
        let (chunk, chunks) = (plan.chunk, plan.chunks);
        let rows_cap = n * chunk;
        // Workspace: starts, kvc, pe, kvx, then (several chunks) the running state.
        let state_rows = t * p.num_heads;
        let align = |x: usize| x.div_ceil(256) * 256;
        let sizes = [
            align((n + 1) * 4),
            align(rows_cap * l * 4),
            align(rows_cap * r * 4),
            align(rows_cap * kvw * 4),
            align(state_rows * p.v_head_dim * 4),
            align(state_rows * 2 * 4),
        ];
        let total = sizes
            .iter()
            .try_fold(0usize, |a, &s| a.checked_add(s))
            .ok_or_else(|| Error::overflow("MLA prefill workspace", format!("{sizes:?}")))?;
        let mut slot = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let scratch_buf = self.grown(&mut slot, total)?;
        let base = R::buffer_ptr(scratch_buf);
        let mut offs = [0u64; 6];
        let mut o = base;
        for (k, s) in sizes.iter().enumerate() {
            offs[k] = o;
            o += *s as u64;
        }
        let arrays = md.arrays();
        let qsl_ptr = self.rt.ptr(&arrays.query_start_loc, "query_start_loc")?;
        let seq_ptr = self.rt.ptr(&arrays.seq_lens, "seq_lens")?;
        let q_base = md.common.query_start_loc_cpu()[first];
        let requests = u32_of("MLA prefill requests", n)?;
        for c in 0..chunks {
            let lo = plan.lo(c);
            let starts = plan.starts(c)?;
            let rows = starts[n] as usize;
            self.rt
                .write_i32(scratch_buf, (offs[0] - base) as usize, &starts)?;
            let gather = MlaGatherParams {
                kv_c: self.rt.ptr(kv_c_normed, "kv_c_normed")?,
                k_pe: self.rt.ptr(k_pe, "k_pe")?,
                cache: self.rt.ptr(kv_cache.data(), "latent cache")?,
                kvc: offs[1],
                pe: offs[2],
                query_start_loc: qsl_ptr,
                seq_lens: seq_ptr,
                block_table: self.rt.ptr(&arrays.block_table, "block_table")?,
                starts: offs[0],
                k_scale,
                first_req: i32_of("first prefill", first)?,
                q_base,
                chunk_lo: i32_of("chunk start", lo)?,
                chunk: i32_of("chunk", chunk)?,
                kv_lora_rank: l as i32,
                rope_dim: r as i32,
                act_dtype: code(act)?,
                cache_dtype: code(kv_cache.storage_dtype())?,
                block_size: i32_of("block size", kv_cache.block_size())?,
                bt_stride: i32_of("block-table width", md.common.max_blocks_per_req())?,
                pad: 0,
            };
            self.rt.launch(
                &MLA_CACHE,
                &[],
                "mla_gather_latents",
                shape(
                    (stride_ctas(chunk * (l + r)), requests, 1),
                    MLA_CACHE_THREADS,
                    0,
                ),
                &gather,
            )?;
            let linear = LinearParams::product(
                offs[1],
                R::buffer_ptr(&self.kv_b_proj),
                offs[3],
                i32_of("chunk rows", rows)?,
                l as i32,
                i32_of("kv_b_proj outputs", kvw)?,
                true,
                false,
            );
            self.launch_linear(&linear)?;
            let attn = MlaPrefillParams {
                q: self.rt.ptr(q, "q")?,
                kvx: offs[3],
                pe: offs[2],
                acc: offs[4],
                ml: offs[5],
                out: self.rt.ptr(output, "output")?,
                query_start_loc: qsl_ptr,
                seq_lens: seq_ptr,
                starts: offs[0],
                scale: p.scale,
                num_heads: p.num_heads as i32,
                first_req: first as i32,
                q_base,
                chunk_lo: lo as i32,
                chunk: chunk as i32,
                qk_nope: p.qk_nope_head_dim as i32,
                rope_dim: r as i32,
                v_dim: p.v_head_dim as i32,
                act_dtype: code(act)?,
                first: (c == 0) as i32,
                last: (c + 1 == chunks) as i32,
            };
            let ctas = u32_of("MLA prefill CTAs", max_rows.div_ceil(MLA_ROW_WARPS))?;
            self.rt.launch(
                &MLA_PREFILL,
                &[],
                "mla_prefill_attention",
                shape((ctas, requests, 1), self.row_threads()?, 0),
                &attn,
            )?;
        }
        Ok(())
    }
}
