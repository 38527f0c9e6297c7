//! Which specialisation of each WGSL kernel a layer runs on a device ([`LayerShaders`]:
//! tile shapes, decode kernel, prefill form, from the device's [`WgslDeviceInfo`] alone), the
//! cache strides the kernels take, and `merge_attn_states` for
//! [`crate::ops::merge_attn_states`] (one dispatch of the family's `merge_attn_states.wgsl`).

use crate::device::wgsl::{Dispatch, LoopBounding, WgslDeviceInfo, WgslRuntime, Words};
use crate::device::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::wgsl::{
    self as shaders, attention_shared_bytes, choose_tile, tiled2_shared_bytes, AttentionBlocking,
    AttentionShader, Bindings, DecodeShader, MergeShader, TileKind, Tiled2, COOP_KEYS, COOP_ROWS,
    ELEMENTWISE_WORKGROUP,
};
use crate::kv_cache::KvCache;

use super::attention_impl::MAX_HEAD_SIZE;
use super::tuning::{PrefillForm, WgpuTuning};

/// `merge_attn_states` on tensors of `dev` (shapes and dtypes already checked by
/// [`crate::ops::merge_attn_states`]): `[T, H, D]` outputs, `[H, T]` f32 LSEs.
#[allow(clippy::too_many_arguments)]
pub fn merge_attn_states<R: WgslRuntime>(
    dev: &R,
    output: &mut Tensor,
    prefix_output: &Tensor,
    prefix_lse: &Tensor,
    suffix_output: &Tensor,
    suffix_lse: &Tensor,
    output_lse: Option<&mut Tensor>,
    prefill_tokens_with_context: Option<usize>,
) -> Result<()> {
    let s = prefix_output.shape();
    let (t, h, d) = (s[0], s[1], s[2]);
    if d % 4 != 0 {
        return Err(Error::shape(
            "prefix_output",
            s,
            "a head size that is a multiple of 4 (the WGSL kernels load 4 elements at a time)",
        ));
    }
    let units = (t * h * (d / 4)) as u64;
    if units == 0 {
        return Ok(());
    }
    let dtype = prefix_output.dtype();
    let po = dev.tensor_buffer(prefix_output, "prefix_output")?;
    let pl = dev.tensor_buffer(prefix_lse, "prefix_lse")?;
    let so = dev.tensor_buffer(suffix_output, "suffix_output")?;
    let sl = dev.tensor_buffer(suffix_lse, "suffix_lse")?;
    let out = dev.tensor_buffer(output, "output")?;
    let (ol, write_lse) = match output_lse {
        Some(l) => (dev.tensor_buffer(l, "output_lse")?, 1),
        None => (dev.placeholder(0)?, 0),
    };
    let shader = MergeShader { dtype };
    let pipeline = dev.pipeline(
        &shader.key(),
        &|| shader.source(),
        Bindings::Merge,
        false,
        LoopBounding::Forced,
    )?;
    let words = Words::new()
        .u(t as u32)
        .u(h as u32)
        .u(d as u32)
        .u(prefill_tokens_with_context.map_or(u32::MAX, |n| n.min(u32::MAX as usize) as u32))
        .u(write_lse);
    let (x, z) = dev
        .info()
        .grid(units.div_ceil(ELEMENTWISE_WORKGROUP as u64))?;
    dev.submit_one(
        words.w,
        Dispatch {
            pipeline,
            slot: 0,
            buffers: vec![(1, po), (2, pl), (3, so), (4, sl), (5, out), (6, ol)],
            groups: (x, 1, z),
        },
    )
}

/// How one layer's kernels are specialised on one adapter: its tile shapes, its tuning, and
/// which form of each kernel runs here.
#[derive(Clone, Debug)]
pub struct LayerShaders {
    info: WgslDeviceInfo,
    head_size: usize,
    /// Rows × keys of a decode tile.
    pub(crate) decode_tile: (u32, u32),
    /// Rows × keys of a prefill tile.
    pub(crate) prefill_tile: (u32, u32),
    /// The tuning, its subgroup use limited to what the adapter has.
    pub(crate) tuning: WgpuTuning,
}

impl LayerShaders {
    /// The shapes for `head_size` on `dev` under `tuning` (a requested prefill tile that does
    /// not fit is warned about and replaced by the default).
    pub fn new(info: WgslDeviceInfo, head_size: usize, tuning: WgpuTuning) -> Result<Self> {
        let (decode_tile, mut prefill_tile) = tiles_for(&info, head_size)?;
        if let (true, Some((m, n))) = (tuning.prefill_tiles, tuning.prefill_tile) {
            if prefill_tile_fits(&info, head_size, (m, n)) {
                prefill_tile = (m, n);
            } else {
                tracing::warn!(
                    "WGSL: prefill tile {m}x{n} does not fit head size {} here; using {}x{}",
                    head_size,
                    prefill_tile.0,
                    prefill_tile.1
                );
            }
        }
        if !tuning.prefill_tiles {
            prefill_tile = decode_tile;
        }
        let tuning = WgpuTuning {
            subgroups: tuning.subgroups && info.subgroups,
            ..tuning
        };
        Ok(LayerShaders {
            info,
            head_size,
            decode_tile,
            prefill_tile,
            tuning,
        })
    }

    /// The split-KV decode kernel for items of up to `rows` rows reading `cache` with
    /// queries of `q_dtype`, or `None` when it cannot run them: the tuning does not use
    /// subgroups (or the adapter has none), the head size or an element stride of the cache
    /// is not a whole number of granules ([`DecodeShader::granule`]), the cache buffer is
    /// not (`cache_bytes`: the size of its buffer), or the kernel's
    /// workgroup memory does not fit (see [`DecodeShader::choose`]).
    pub fn decode_shader(
        &self,
        rows: u32,
        q_dtype: DType,
        cache: &KvCache,
        cache_bytes: u64,
    ) -> Option<DecodeShader> {
        let cfg = &self.tuning;
        if !cfg.decode_kernel || !self.tuning.subgroups || !self.info.subgroups {
            return None;
        }
        let kv_dtype = cache.spec().storage_dtype();
        let g = DecodeShader::granule(kv_dtype);
        if cache_strides(cache).iter().any(|&s| s % g != 0) {
            return None;
        }
        if !cache_bytes.is_multiple_of(DecodeShader::granule_bytes(kv_dtype) as u64) {
            return None;
        }
        DecodeShader::choose(
            self.head_size as u32,
            rows,
            q_dtype,
            kv_dtype,
            self.info.subgroup_sizes,
            self.info.max_workgroup_storage,
            cfg.decode_keys_per_step,
            cfg.decode_workgroup,
        )
        .map(|s| DecodeShader {
            unrolled: self.tuning.unrolled,
            ..s
        })
    }

    /// The `paged_attention.wgsl` specialisation that runs the decode tiles (`prefill`
    /// false) or the prefill tiles of this layer, for queries of `q_dtype` and keys of
    /// `kv_dtype` (`paged`: from the cache). Prefill tiles take the tuning's
    /// [`PrefillForm`] where it can run here (`runs_here`), else the next simpler one:
    /// cooperative matrix (f16 activations and cache, a device with cooperative matrices),
    /// fused softmax f16 (f16 activations and cache, `SHADER_F16`), fused softmax, three
    /// phase. Decode tiles always take the three-phase form.
    pub fn tile_shader(
        &self,
        prefill: bool,
        q_dtype: DType,
        kv_dtype: DType,
        paged: bool,
    ) -> AttentionShader {
        let tile = if prefill {
            self.prefill_tile
        } else {
            self.decode_tile
        };
        let tiled = AttentionShader {
            head_size: self.head_size as u32,
            block_m: tile.0,
            block_n: tile.1,
            q_dtype,
            kv_dtype,
            paged,
            subgroups: self.tuning.subgroups,
            unrolled: self.tuning.unrolled,
            tiled2: None,
        };
        let form = self.tuning.prefill_form;
        if !prefill || !form.is_fused() {
            return tiled;
        }
        let max_key_lanes = if self.tuning.subgroups {
            self.info.subgroup_sizes.0.max(1)
        } else {
            1
        };
        let t2 = AttentionShader {
            tiled2: Some(Tiled2 {
                workgroup: self.tuning.prefill_workgroup,
                max_key_lanes,
                half: false,
                block: self.tuning.prefill_block,
                coop: false,
            }),
            ..tiled
        };
        let pick = |s: AttentionShader| -> Option<AttentionShader> {
            Some(s).filter(|s| self.runs_here(s))
        };
        if form.allows_f16() {
            let t2h = AttentionShader {
                tiled2: t2.tiled2.map(|t| Tiled2 {
                    half: true,
                    workgroup: self.tuning.prefill_workgroup_h.unwrap_or(t.workgroup),
                    block: self.tuning.prefill_block_h.unwrap_or(t.block),
                    ..t
                }),
                ..t2
            };
            let f16_inputs = q_dtype == DType::F16 && kv_dtype == DType::F16;
            let bf16_coop =
                q_dtype == DType::Bf16 && kv_dtype == DType::Bf16 && self.info.coop_bf16;
            if (f16_inputs || bf16_coop) && form == PrefillForm::CooperativeMatrix {
                if let Some(s) = self.coop_shader(paged, q_dtype) {
                    return s;
                }
            }
            if f16_inputs && self.info.f16 {
                // Its own rows and keys per chunk where that runs here, else the tile's.
                let own = (self.tuning.prefill_keys_h.is_some()
                    || self.tuning.prefill_rows_h.is_some())
                .then(|| AttentionShader {
                    block_m: self.tuning.prefill_rows_h.unwrap_or(t2h.block_m),
                    block_n: self.tuning.prefill_keys_h.unwrap_or(t2h.block_n),
                    ..t2h
                });
                if let Some(s) = own.and_then(pick).or_else(|| pick(t2h)) {
                    return s;
                }
            }
            tracing::debug!(
                "WGSL: {} needs f16 shaders (device: {}), f16 activations and an f16 cache, \
                 and a tile that fits; using the tiled2 form",
                t2h.key(),
                self.info.f16
            );
        }
        pick(t2).unwrap_or_else(|| {
            tracing::debug!("WGSL: {} cannot run here; using the tiled form", t2.key());
            tiled
        })
    }

    /// The cooperative-matrix prefill form ([`Tiled2::coop`]) for a `dtype` layer with a
    /// same-dtype cache (f16; bf16 where [`WgslDeviceInfo::coop_bf16`]), where the device
    /// has cooperative matrices ([`WgslDeviceInfo::coop`]), every
    /// subgroup has 32 lanes (one 16-row tile per subgroup) and the head size is a multiple
    /// of 16 up to 128 (its output tiles stay in registers): 64 rows × 64 keys, or the
    /// tiled2h knobs' rows / keys when they are multiples of 16, else 64 × 32 where the
    /// workgroup memory is short. `None`: the tiled2h form takes the layer.
    fn coop_shader(&self, paged: bool, dtype: DType) -> Option<AttentionShader> {
        let d = self.head_size as u32;
        let usable = self.info.coop
            && self.tuning.subgroups
            && self.info.subgroup_sizes == (32, 32)
            && d.is_multiple_of(16)
            && d <= 128;
        if !usable {
            return None;
        }
        let want = (
            self.tuning.prefill_rows_h.unwrap_or(COOP_ROWS),
            self.tuning.prefill_keys_h.unwrap_or(COOP_KEYS),
        );
        [want, (COOP_ROWS, COOP_KEYS), (COOP_ROWS, COOP_KEYS / 2)]
            .into_iter()
            .filter(|&(m, n)| m % 16 == 0 && n % 16 == 0 && m > 0 && n > 0)
            .map(|(m, n)| {
                let split = shaders::coop_split(d, m, n, self.tuning.prefill_coop_split);
                shaders::coop_shader_typed(d, m, n, split, paged, dtype)
            })
            .find(|s| self.runs_here(s))
    }

    /// Whether a tiled2-form specialisation can run on this device: a register blocking
    /// exists, its workgroup fits the adapter's invocation limits and its workgroup memory
    /// the adapter's.
    fn runs_here(&self, s: &AttentionShader) -> bool {
        s.blocking().is_some()
            && s.workgroup() <= self.info.max_invocations
            && s.workgroup() <= self.info.max_workgroup_size_x
            && s.shared_bytes() <= self.info.max_workgroup_storage
    }
}

/// Element strides of the cache: block, K→V, token, head.
pub(crate) fn cache_strides(cache: &KvCache) -> [u32; 4] {
    let o0 = cache.offset(0, 0, 0, 0);
    [
        (cache.offset(1, 0, 0, 0) - o0) as u32,
        (cache.offset(0, 1, 0, 0) - o0) as u32,
        cache.token_stride() as u32,
        (cache.offset(0, 0, 0, 1) - o0) as u32,
    ]
}

/// The tile shapes for `head_size` on a device, or why there are none.
pub fn tiles_for(info: &WgslDeviceInfo, head_size: usize) -> Result<((u32, u32), (u32, u32))> {
    if head_size == 0 || !head_size.is_multiple_of(4) || head_size > MAX_HEAD_SIZE {
        return Err(Error::config(format!(
            "WGSL: head size {head_size} must be a positive multiple of 4 up to {MAX_HEAD_SIZE}"
        )));
    }
    let limit = info.max_workgroup_storage;
    let d = head_size as u32;
    match (
        choose_tile(d, limit, TileKind::Decode),
        choose_tile(d, limit, TileKind::Prefill),
    ) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(Error::config(format!(
            "WGSL: head size {head_size} needs more workgroup memory than this device's {limit} \
             bytes"
        ))),
    }
}

/// Whether a requested prefill tile ([`WgpuTuning::prefill_tile`]) can replace the default
/// one for `head_size` on a device: both prefill forms' workgroup memory fits the device's and
/// the tiled form's register blocks stay register-sized (≤ 32 scores and 32 vec4
/// accumulators per thread). False for head sizes the backend rejects (not a positive
/// multiple of 4 up to [`MAX_HEAD_SIZE`]) and empty tiles.
pub fn prefill_tile_fits(info: &WgslDeviceInfo, head_size: usize, (m, n): (u32, u32)) -> bool {
    if head_size == 0
        || !head_size.is_multiple_of(4)
        || head_size > MAX_HEAD_SIZE
        || m == 0
        || n == 0
    {
        return false;
    }
    let d = head_size as u32;
    let limit = info.max_workgroup_storage;
    let b = AttentionBlocking::new(d / 4, n);
    attention_shared_bytes(d, m, n) <= limit
        && tiled2_shared_bytes(d, m, n) <= limit
        && m.div_ceil(b.score_row_groups) * b.keys_per_thread <= 32
        && m.div_ceil(b.out_row_groups) * b.cols_per_thread <= 32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200-like device (32-lane subgroups, f16, 48 KiB of workgroup memory) with or
    /// without f16 / bf16 cooperative matrices.
    fn device(coop: bool, coop_bf16: bool) -> WgslDeviceInfo {
        WgslDeviceInfo {
            name: "test GPU".into(),
            is_cpu: false,
            subgroups: true,
            subgroup_sizes: (32, 32),
            f16: true,
            coop,
            coop_bf16,
            max_workgroup_storage: 48 << 10,
            max_invocations: 1024,
            max_workgroup_size_x: 1024,
            max_workgroups_per_dim: 65535,
            max_binding_bytes: u64::from(u32::MAX),
            binding_arrays: false,
            memory_bytes: u64::MAX,
            binding_array_any_index: false,
            chunk_bytes: u64::from(u32::MAX),
            max_chunks: 1,
        }
    }

    fn prefill_is_coop(info: WgslDeviceInfo, dtype: DType) -> bool {
        let tuning = WgpuTuning::for_device(&info);
        let shaders = LayerShaders::new(info, 128, tuning).expect("shapes");
        let s = shaders.tile_shader(true, dtype, dtype, true);
        s.tiled2.is_some_and(|t| t.coop)
    }

    /// The coop form takes f16 layers on devices with f16 cooperative matrices, and bf16
    /// layers only where bf16 ones exist too (its module is retyped to bfloat16 then).
    #[test]
    fn the_coop_form_needs_the_layers_matrix_type() {
        assert!(prefill_is_coop(device(true, false), DType::F16));
        assert!(!prefill_is_coop(device(true, false), DType::Bf16));
        assert!(prefill_is_coop(device(true, true), DType::Bf16));
        assert!(!prefill_is_coop(device(false, false), DType::F16));
        let tuning = WgpuTuning::for_device(&device(true, true));
        let s = LayerShaders::new(device(true, true), 128, tuning)
            .expect("shapes")
            .tile_shader(true, DType::Bf16, DType::Bf16, true);
        assert!(s.source().contains(crate::kernels::wgsl::BF16_TILES_MARKER));
    }
}
