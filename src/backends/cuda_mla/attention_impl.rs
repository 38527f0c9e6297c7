//! The CUDA MLA impl: `forward_mqa` queues the latent decode over the batch's decodes
//! (requests `0..num_decodes`, one query length) with split-KV and the combine,
//! `forward_mha` the expanded prefill chunk by chunk, `do_kv_cache_update` the latent write.
//! Every tensor's shape, dtype and device is checked before anything is queued; nothing
//! waits for the GPU (a download does).

use std::sync::Mutex;

use crate::attention::{AttentionLayer, MlaAttentionImpl};
use crate::device::{CudaDevice, CudaStorage, Device, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::cuda::{
    check_mla_block_size, code, mla_num_splits, CudaTuning, LinearParams, MlaCacheParams,
    MlaCombineParams, MlaDecodeForm, MlaDecodeKernel, MlaDecodeParams, MlaDecodeShape,
    MlaGatherParams, MlaPrefillParams, MLA_KEYS, MLA_LATENT_DIM, MLA_PREFILL_MAX_DIM,
    MLA_VALUE_DIM, NVIDIA_SHARED_PER_SM,
};
use crate::metadata::AttentionMetadata;
use crate::mla::{AbsorbedWeights, MlaKvCache, MlaParams};

use crate::backends::mla_batch::MlaPrefillChunks;

use super::kernels::{self, i32_of, tensor_ptr};
use super::CudaMlaMetadata;

/// The prefill's expanded workspace per chunk (latents, `kv_b_proj` output): chunks are
/// sized to stay within it.
pub const PREFILL_WORKSPACE_BYTES: usize = 256 << 20;

/// The CUDA MLA impl of one layer.
#[derive(Debug)]
pub struct CudaMlaAttentionImpl {
    params: MlaParams,
    device: CudaDevice,
    /// `kv_b_proj` `[N * (P + V)][Lkv]` f32, the prefill's expansion.
    kv_b_proj: CudaStorage,
    /// Split partials, prefill workspace: grown on demand, reused by later calls (the stream
    /// orders every use).
    scratch: Mutex<Option<CudaStorage>>,
}

/// The buffer in `slot`, replaced by a larger one when it holds fewer than `bytes`.
fn grown<'a>(
    device: &CudaDevice,
    slot: &'a mut Option<CudaStorage>,
    bytes: usize,
) -> Result<&'a CudaStorage> {
    if slot.as_ref().is_none_or(|b| b.len_bytes() < bytes) {
        *slot = Some(device.zeros_bytes(bytes.max(256))?);
    }
    slot.as_ref()
        .ok_or_else(|| device_error("the scratch buffer was not allocated"))
}

fn device_error(message: impl Into<String>) -> Error {
    Error::Device {
        backend: "CUDA_MLA".into(),
        message: message.into(),
    }
}

impl CudaMlaAttentionImpl {
    /// The impl on `device` for `params` (checked by the descriptor); uploads `kv_b_proj`.
    pub fn new(params: MlaParams, weights: &AbsorbedWeights, device: CudaDevice) -> Result<Self> {
        if params.latent_dim() != MLA_LATENT_DIM || params.kv_lora_rank != MLA_VALUE_DIM {
            return Err(Error::config(format!(
                "CUDA_MLA's kernels are built for kv_lora_rank {MLA_VALUE_DIM} + rope {}; got \
                 {} + {}",
                MLA_LATENT_DIM - MLA_VALUE_DIM,
                params.kv_lora_rank,
                params.qk_rope_head_dim
            )));
        }
        if params.qk_head_dim() > MLA_PREFILL_MAX_DIM || params.v_head_dim > MLA_PREFILL_MAX_DIM {
            return Err(Error::config(format!(
                "CUDA_MLA's prefill takes qk_nope + rope and v_head_dim up to \
                 {MLA_PREFILL_MAX_DIM}; got {} and {}",
                params.qk_head_dim(),
                params.v_head_dim
            )));
        }
        let kv_b_proj = device.upload_pod(&weights.kv_b_proj())?;
        Ok(CudaMlaAttentionImpl {
            params,
            device,
            kv_b_proj,
            scratch: Mutex::new(None),
        })
    }

    /// A device buffer of at least `bytes` (contents undefined), reused across calls.
    fn scratch(&self, bytes: usize) -> Result<u64> {
        let mut s = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        Ok(grown(&self.device, &mut s, bytes)?.device_ptr())
    }

    /// The activation dtype (f16 or bf16) and the cache (on this GPU, of that dtype or
    /// E4M3) checked, their shapes being `MlaParams::check_*`'s; whether the cache is fp8.
    fn check_cache(&self, cache: &MlaKvCache, act: DType) -> Result<bool> {
        if !matches!(act, DType::F16 | DType::Bf16) {
            return Err(Error::DType {
                what: "CUDA_MLA activations",
                got: act.to_string(),
                expected: "f16 or bf16".into(),
            });
        }
        if cache.data().device() != &Device::Cuda(self.device.clone()) {
            return Err(device_error(
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
            .try_for_each(|(t, what)| tensor_ptr(&self.device, t, what).map(|_| ()))
    }
}

impl MlaAttentionImpl for CudaMlaAttentionImpl {
    fn do_kv_cache_update(
        &self,
        layer: &AttentionLayer,
        kv_c: &Tensor,
        k_pe: &Tensor,
        kv_cache: &mut MlaKvCache,
        metadata: &dyn AttentionMetadata,
    ) -> Result<()> {
        let md = metadata.downcast::<CudaMlaMetadata>("CudaMlaAttentionImpl")?;
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
            kv_c: tensor_ptr(&self.device, kv_c, "kv_c")?,
            k_pe: tensor_ptr(&self.device, k_pe, "k_pe")?,
            cache: tensor_ptr(&self.device, kv_cache.data(), "latent cache")?,
            slot_mapping: tensor_ptr(&self.device, &md.arrays().slot_mapping, "slot_mapping")?,
            scale: kv_cache.dequant_scale(layer.k_scale)?,
            num_tokens: i32_of("tokens", t)?,
            kv_lora_rank: i32_of("kv_lora_rank", p.kv_lora_rank)?,
            rope_dim: i32_of("rope", p.qk_rope_head_dim)?,
            act_dtype: code(act)?,
            cache_dtype: code(kv_cache.storage_dtype())?,
            block_size: i32_of("block size", kv_cache.block_size())?,
            pad: 0,
        };
        kernels::launch_cache_write(&self.device, t * p.latent_dim(), &params)
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
        let md = metadata.downcast::<CudaMlaMetadata>("CudaMlaAttentionImpl")?;
        let p = &self.params;
        let b = md.split.num_decode_tokens;
        let act = q.dtype();
        p.check_mqa(b, q, kv_cache, output, lse.as_deref())?;
        let fp8 = self.check_cache(kv_cache, act)?;
        self.on_gpu(&[(q, "q"), (output, "output")])?;
        let lse_ptr = match lse.as_deref() {
            Some(l) => tensor_ptr(&self.device, l, "lse")?,
            None => 0,
        };
        check_mla_block_size(kv_cache.block_size())?;
        let decodes = md.split.num_decodes;
        if decodes == 0 {
            return Ok(());
        }
        let q_len = md.common.query_len(0);
        let rows = q_len * p.num_heads;
        let form = match CudaTuning::get().mla_decode {
            MlaDecodeKernel::TensorCores => {
                MlaDecodeForm::TensorCores(MlaDecodeShape::for_rows(rows))
            }
            MlaDecodeKernel::Portable => MlaDecodeForm::Portable,
        };
        let tiles = rows.div_ceil(form.rows());
        let max_seq = md.common.seq_lens_cpu()[..decodes]
            .iter()
            .map(|&s| s as usize)
            .max()
            .unwrap_or(0);
        let splits = mla_num_splits(
            tiles * decodes,
            form.resident(fp8, NVIDIA_SHARED_PER_SM),
            self.device.sm_count() as usize,
            max_seq,
        );
        let k_scale = kv_cache.dequant_scale(layer.k_scale)?;
        let arrays = md.arrays();
        let out_ptr = tensor_ptr(&self.device, output, "output")?;
        let mut params = MlaDecodeParams {
            q: tensor_ptr(&self.device, q, "q")?,
            cache: tensor_ptr(&self.device, kv_cache.data(), "latent cache")?,
            out: out_ptr,
            lse: lse_ptr,
            part_out: 0,
            part_lse: 0,
            query_start_loc: tensor_ptr(&self.device, &arrays.query_start_loc, "query_start_loc")?,
            seq_lens: tensor_ptr(&self.device, &arrays.seq_lens, "seq_lens")?,
            block_table: tensor_ptr(&self.device, &arrays.block_table, "block_table")?,
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
            i32_of("row tiles", tiles)? as u32,
            i32_of("decode requests", decodes)? as u32,
            splits as u32,
        );
        let bf16 = act == DType::Bf16;
        kernels::launch_decode(&self.device, form, bf16, fp8, grid, &params)?;
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
            kernels::launch_combine(&self.device, total_rows, &combine)?;
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
        let md = metadata.downcast::<CudaMlaMetadata>("CudaMlaAttentionImpl")?;
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
        let plan =
            MlaPrefillChunks::new(md, CudaTuning::get().mla_prefill_chunk, MLA_KEYS, |_| {
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
        let scratch_buf = grown(&self.device, &mut slot, total)?;
        let base = scratch_buf.device_ptr();
        let mut offs = [0u64; 6];
        let mut o = base;
        for (k, s) in sizes.iter().enumerate() {
            offs[k] = o;
            o += *s as u64;
        }
        let arrays = md.arrays();
        let qsl_ptr = tensor_ptr(&self.device, &arrays.query_start_loc, "query_start_loc")?;
        let seq_ptr = tensor_ptr(&self.device, &arrays.seq_lens, "seq_lens")?;
        let q_base = md.common.query_start_loc_cpu()[first];
        for c in 0..chunks {
            let lo = plan.lo(c);
            let starts = plan.starts(c)?;
            let rows = starts[n] as usize;
            self.device
                .write_pod(scratch_buf, (offs[0] - base) as usize, &starts)?;
            let gather = MlaGatherParams {
                kv_c: tensor_ptr(&self.device, kv_c_normed, "kv_c_normed")?,
                k_pe: tensor_ptr(&self.device, k_pe, "k_pe")?,
                cache: tensor_ptr(&self.device, kv_cache.data(), "latent cache")?,
                kvc: offs[1],
                pe: offs[2],
                query_start_loc: qsl_ptr,
                seq_lens: seq_ptr,
                block_table: tensor_ptr(&self.device, &arrays.block_table, "block_table")?,
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
            kernels::launch_gather(&self.device, n, chunk, l + r, &gather)?;
            let linear = LinearParams {
                x: offs[1],
                w: self.kv_b_proj.device_ptr(),
                y: offs[3],
                t: i32_of("chunk rows", rows)?,
                k: l as i32,
                n: i32_of("kv_b_proj outputs", kvw)?,
                vec4: 1,
            };
            kernels::launch_linear(&self.device, &linear)?;
            let attn = MlaPrefillParams {
                q: tensor_ptr(&self.device, q, "q")?,
                kvx: offs[3],
                pe: offs[2],
                acc: offs[4],
                ml: offs[5],
                out: tensor_ptr(&self.device, output, "output")?,
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
            kernels::launch_prefill(&self.device, n, max_rows, &attn)?;
        }
        Ok(())
    }
}
