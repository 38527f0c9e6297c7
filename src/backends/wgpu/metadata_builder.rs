//! The wgpu backend's metadata builder, and the work plan its kernels run.
//!
//! `build` runs once per step: it validates the cascade request, resolves the block table
//! and slot mapping to device buffers (removing duplicate slots so that the last write wins,
//! as in a sequential reference), and returns [`WgpuAttentionMetadata`]. The work items
//! depend on the layer too (the GQA group size decides how many query rows a token has), so
//! the first layer that runs a step builds them ([`WgpuAttentionMetadata::plan`]) and every
//! later layer with the same shape reuses them: one small upload per step, not per layer.
//!
//! **Plan.** Requests whose rows (query tokens × group) fit one decode tile become decode
//! items over their whole key range, split into several partial items (flash-decoding) when
//! the batch alone would not fill the device ([`WgpuTuning`]); the partials are merged by a
//! combine pass. Decode items of at most [`PlanKey::fast_decode_rows`] rows go to their own
//! list, run by the split-KV decode kernel (`paged_decode.wgsl`) when the layer can use it;
//! both decode lists share the partial slots and the combine pass. Other requests are cut
//! into prefill tiles of up to `prefill_rows` rows with no split. Cascade batches (a shared prefix) run the same plan: the prefix is part of every
//! request's own key range, and since the builder checks that the prefix lies inside every
//! request's cached context, every query sees all of it under the causal mask too — the
//! result equals vLLM's prefix pass + suffix pass + merge, sinks counted once.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::backend::GraphCaptureSupport;
use crate::device::{Storage, Tensor, WgpuDevice};
use crate::error::{Error, Result};
use crate::kv_cache::KvCacheSpec;
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CommonAttentionMetadata, DecodePrefillSplit,
    PAD_SLOT_ID,
};

use super::kernels::upload_words;
use super::shaders::TILED2_DEFAULT_BLOCK;

/// u32 words per work item (see `shaders/paged_attention.wgsl`).
pub const ITEM_WORDS: usize = 8;
/// Partial-slot value of an item that writes the output directly.
pub const DIRECT_SLOT: u32 = 0x7fff_ffff;
/// Item flag: this item adds the sink logit to its rows.
pub const SINK_FLAG: u32 = 1 << 31;

/// How the planner trades split-KV parallelism against merge work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgpuTuning {
    /// Fewest keys one split-KV partial covers.
    pub split_min_keys: u32,
    /// Workgroups a decode dispatch aims for: (request, KV head) pairs are multiplied by
    /// splits up to this.
    pub target_workgroups: u32,
    /// Most splits per request.
    pub max_splits: u32,
    /// Use the subgroup softmax (only when the adapter has subgroups).
    pub subgroups: bool,
    /// Run long queries with the larger prefill tile (GPUs). When false, every item uses the
    /// decode tile: one pipeline per dtype pairing instead of two, which is what CPU adapters
    /// want (lavapipe spends 0.2–0.5 s compiling each pipeline and gains nothing from wider
    /// tiles).
    pub prefill_tiles: bool,
    /// Unroll the per-thread loops of the attention and decode kernels (loops marked
    /// `// @unroll`, see `shaders::unroll`): what GPU drivers need to keep per-thread score
    /// and accumulator arrays in registers. CPU adapters run the loops as written: LLVM
    /// (lavapipe) compiles the unrolled modules several times slower and runs them no faster.
    pub unrolled: bool,
    /// The kernel form of the prefill items (`POLYATTN_WGPU_PREFILL`).
    pub prefill_kernel: PrefillKernel,
    /// Threads per workgroup of the tiled2 prefill form (`POLYATTN_WGPU_PREFILL_WG`: a power
    /// of two from 32 to 1024 that the adapter allows; default [`PREFILL_TILED2_WORKGROUP`]). 64 gives each thread
    /// 4 × 4 blocks in both phases of a 32 × 32 tile at head size 128 (twice the FMAs per
    /// shared-memory load of 128 threads' 2 × 4) at half the warps per workgroup.
    pub prefill_workgroup: u32,
    /// Prefill tile shape (query rows BM, keys BN) instead of the first candidate that fits
    /// the adapter's workgroup memory (GPUs: [`GPU_PREFILL_TILE`] by default;
    /// `POLYATTN_WGPU_PREFILL_TILE=BMxBN`, e.g. `64x32`: BM 1–128, BN 8, 16, 32 or 64). Used with `prefill_tiles` when it fits the adapter (see
    /// `WgpuAttentionImpl::with_tuning`), for both prefill forms.
    pub prefill_tile: Option<(u32, u32)>,
    /// Keys per chunk (BN) of the tiled2h form only (`POLYATTN_WGPU_PREFILL_KEYS_H`: 8, 16,
    /// 32, 48 or 64), its query rows staying those of the prefill tile (the work plan depends on
    /// them). Why a separate count: tiled2h's f16 tiles take half the workgroup memory, so
    /// it can run larger chunks than the f32 forms whose memory bounds the prefill tile.
    /// Used where that tile fits the adapter; `None`: the prefill tile's BN. GPUs default
    /// to [`GPU_PREFILL_KEYS_H`].
    pub prefill_keys_h: Option<u32>,
    /// Query rows per tile (BM) of the tiled2h form only (`POLYATTN_WGPU_PREFILL_ROWS_H`:
    /// 1–128), like [`WgpuTuning::prefill_keys_h`]: its f16 tiles fit more rows than the
    /// f32 forms' prefill tile. The work plan of an f16 batch takes the rows of the form
    /// that runs it. `None`: the prefill tile's BM.
    pub prefill_rows_h: Option<u32>,
    /// Per-thread register block of the tiled2 forms, `(keys, cols)`: at least `keys` keys
    /// per thread in phase A (4, 8 or 16) and `cols` vec4 output columns per thread in
    /// phase C (1, 2, 4 or 8); see `shaders::Tiled2::block`
    /// (`POLYATTN_WGPU_PREFILL_BLOCK=KxC`, e.g. `8x2`; default
    /// [`crate::backends::wgpu::shaders::TILED2_DEFAULT_BLOCK`]).
    pub prefill_block: (u32, u32),
    /// Threads per workgroup of the tiled2h form only (`POLYATTN_WGPU_PREFILL_WG_H`, as
    /// [`WgpuTuning::prefill_workgroup`]; `None`: that one). GPUs default to
    /// [`GPU_PREFILL_WG_H`].
    pub prefill_workgroup_h: Option<u32>,
    /// Per-thread register block of the tiled2h form only (`POLYATTN_WGPU_PREFILL_BLOCK_H`,
    /// as [`WgpuTuning::prefill_block`]; `None`: that one). GPUs default to
    /// [`GPU_PREFILL_BLOCK_H`].
    pub prefill_block_h: Option<(u32, u32)>,
    /// Run the tiled2 forms pipelined where their double buffers fit the adapter
    /// (`shaders::Tiled2::pipelined`; `POLYATTN_WGPU_PREFILL_PIPELINED=0` / `1`).
    pub prefill_pipelined: bool,
    /// Give f16 layers with an f16 cache the cooperative-matrix form
    /// (`shaders::Tiled2::coop`, tensor cores) where the device has it
    /// (`WgpuDevice::has_coop`) and the tiled2h kernel is asked for; otherwise tiled2h
    /// (`POLYATTN_WGPU_PREFILL_COOP=0` / `1`, default on).
    pub prefill_coop: bool,
    /// Subgroups per 16-row tile of the cooperative-matrix form
    /// (`POLYATTN_WGPU_COOP_SPLIT`: 1, 2 or 4; see `shaders::coop_split_fits`). `None`: the
    /// most that fit the shape (4 at 64 rows × 64 keys: 512 threads). Why more than one: a
    /// subgroup that owns all of a tile's output matrices needs 255 registers, which leaves
    /// two 4-subgroup workgroups per SM; split four ways it needs 126 and the SM runs 16
    /// subgroups (H200, P2 f16 at 32k tokens: 57.9 TFLOP/s against 26.5).
    pub prefill_coop_split: Option<u32>,
}

/// Parses a tiled2 register block `KxC` (K 4, 8 or 16 keys; C 1, 2, 4 or 8 vec4 columns).
pub fn parse_block(s: &str) -> Option<(u32, u32)> {
    let (k, c) = s
        .trim()
        .to_ascii_lowercase()
        .split_once('x')
        .and_then(|(k, c)| Some((k.trim().parse::<u32>().ok()?, c.trim().parse::<u32>().ok()?)))?;
    ([4, 8, 16].contains(&k) && [1, 2, 4, 8].contains(&c)).then_some((k, c))
}

/// Parses a tile shape `BMxBN` (BM 1–128, BN 8, 16, 32 or 64).
pub fn parse_tile(s: &str) -> Option<(u32, u32)> {
    let (m, n) = s
        .trim()
        .to_ascii_lowercase()
        .split_once('x')
        .and_then(|(m, n)| Some((m.trim().parse::<u32>().ok()?, n.trim().parse::<u32>().ok()?)))?;
    ((1..=128).contains(&m) && [8, 16, 32, 64].contains(&n)).then_some((m, n))
}

/// The prefill tile GPUs ask for (where it fits; CPU adapters take the first candidate that
/// fits, see `shaders::choose_tile`): 64 query rows x 16 keys. On the H200 through Vulkan the
/// tiled2 form ran P2 (d128) at 12.9 / 13.8 TFLOP/s (4k / 16k) with it against 12.0 / 12.5
/// with 64 x 32 and 32 x 32 (2026-11-30).
pub const GPU_PREFILL_TILE: (u32, u32) = (64, 16);

/// Keys per chunk GPUs give the tiled2h (f16) prefill form by default. On the H200 through
/// Vulkan (2026-11-30, P2 in f16, 4k / 16k tokens, 64-row tiles) with 512 threads and 4 x 1
/// blocks ([`GPU_PREFILL_WG_H`], [`GPU_PREFILL_BLOCK_H`]) it ran 23.9 / 25.9 TFLOP/s with
/// 64 keys against 19.5 / 20.9 with 32: per-chunk costs (barriers, α rescale, the f16
/// partial flush) spread over more keys.
pub const GPU_PREFILL_KEYS_H: u32 = 64;

/// Threads per workgroup GPUs give the tiled2h form by default (with [`GPU_PREFILL_KEYS_H`]
/// keys per chunk and [`GPU_PREFILL_BLOCK_H`]). On the H200 through Vulkan (2026-11-30, P2
/// in f16, 4k / 16k tokens, 64-row tiles, 64-key chunks): 512 threads with 4 x 1 blocks
/// 23.9 / 25.9 TFLOP/s, 4 x 4 blocks 23.0 / 24.9; 256 threads 21.9 / 23.8; 1024 threads
/// 21.5 / 23.2; the earlier default (128 threads, 32-key chunks) 15.7 / 17.2.
pub const GPU_PREFILL_WG_H: u32 = 512;

/// Per-thread register block GPUs give the tiled2h form by default: ≥ 4 keys per thread in
/// phase A, one vec4 output column per thread in phase C (at 512 threads, 64 rows and head
/// size 128: 2 x 4 scores and 4 x 1 outputs per thread). See [`GPU_PREFILL_WG_H`].
pub const GPU_PREFILL_BLOCK_H: (u32, u32) = (4, 1);

/// Default threads per workgroup of the tiled2 prefill form.
pub const PREFILL_TILED2_WORKGROUP: u32 = 128;

/// Which form of `paged_attention.wgsl` runs the prefill items (the decode tiles always use
/// the tiled form). Chosen by `POLYATTN_WGPU_PREFILL=tiled|tiled2|tiled2h` (default
/// `tiled2h`, which is tiled2 except for f16 layers with an f16 cache on `SHADER_F16`
/// adapters: on the H200 through Vulkan tiled2 ran P2 at 9.5–13.9 TFLOP/s with 128 threads
/// against the tiled form's 4.8–6.0, and tiled2h ran P2 in f16 at 10.8–17.5 against
/// tiled2's 9.7–10.4 with the same 128 threads, 17.1–26.7 with its GPU defaults
/// ([`GPU_PREFILL_WG_H`]), 2026-11-30).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PrefillKernel {
    /// Phases A (scores), B (softmax, one subgroup or thread per row), C (P·V), with the
    /// chunk's K and V loaded between them: 5 barriers per chunk, 128 threads. Also what
    /// runs a layer the tiled2 form cannot (its workgroup memory does not fit the adapter).
    Tiled,
    /// The tiled2 form ([`crate::backends::wgpu::shaders::Tiled2`]): the next chunk's K and
    /// V loads in flight during the current chunk's phases, softmax fused into phase A,
    /// 4 barriers per chunk, unrolled inner steps, [`WgpuTuning::prefill_workgroup`]
    /// threads. Layers it cannot run (a tile or blocking that does not fit the adapter)
    /// fall back to `Tiled`. `POLYATTN_WGPU_PREFILL=tiled2` keeps f16 layers on it too.
    Tiled2,
    /// The tiled2 form computing in f16 ([`crate::backends::wgpu::shaders::Tiled2::half`]):
    /// Q, K, V and P tiles in workgroup memory as f16, Q·K^T and P·V with `vec4<f16>` FMAs
    /// into f16 partial sums flushed into f32; softmax statistics and output accumulators
    /// in f32. Only for f16 activations with an f16 cache on adapters with `SHADER_F16`;
    /// anything else (and layers it cannot run) falls back to `Tiled2`, then `Tiled`.
    /// The default: it passed the shared suite on lavapipe and on the H200 (Vulkan), where
    /// it ran P2 in f16 1.6x faster than tiled2 (2026-11-30).
    #[default]
    Tiled2H,
}

impl PrefillKernel {
    /// Parses `tiled` / `tiled2` / `tiled2h` (case-insensitive, surrounding blanks
    /// ignored).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tiled" => Some(PrefillKernel::Tiled),
            "tiled2" => Some(PrefillKernel::Tiled2),
            "tiled2h" => Some(PrefillKernel::Tiled2H),
            _ => None,
        }
    }

    /// True for the forms built on tiled2 (`Tiled2`, `Tiled2H`).
    pub fn is_tiled2(self) -> bool {
        matches!(self, PrefillKernel::Tiled2 | PrefillKernel::Tiled2H)
    }
}

impl WgpuTuning {
    /// Defaults for the device: GPUs aim for ~4k decode workgroups (many waves of a large
    /// GPU, so the last, partly filled wave costs little) with partials of ≥ 128 keys (a
    /// batch of one 4k-token request still gets 32 splits × the KV heads, not fewer
    /// workgroups than an H200 has SMs) and up to 128 splits, and use both tile shapes; CPU
    /// adapters (lavapipe) split little, but still exercise the split path on sequences
    /// longer than 32 keys, and use one tile shape. The GPU defaults before 2026-12 were
    /// 256 keys, 1024 workgroups and 64 splits (`POLYATTN_WGPU_SPLIT_MIN_KEYS=256
    /// POLYATTN_WGPU_TARGET_WORKGROUPS=1024 POLYATTN_WGPU_MAX_SPLITS=64` restores them).
    ///
    /// For tuning runs each field can be overridden from the environment:
    /// `POLYATTN_WGPU_SPLIT_MIN_KEYS`, `POLYATTN_WGPU_TARGET_WORKGROUPS`,
    /// `POLYATTN_WGPU_MAX_SPLITS` (integers), `POLYATTN_WGPU_SUBGROUPS`,
    /// `POLYATTN_WGPU_PREFILL_TILES` and `POLYATTN_WGPU_UNROLL` (`0` / `1`),
    /// `POLYATTN_WGPU_PREFILL` (`tiled` / `tiled2` / `tiled2h`, see [`PrefillKernel`]) and
    /// `POLYATTN_WGPU_PREFILL_WG` (tiled2's threads per workgroup: 32 to 1024, where the
    /// adapter allows), `POLYATTN_WGPU_PREFILL_TILE` (`BMxBN`),
    /// `POLYATTN_WGPU_PREFILL_KEYS_H`, `POLYATTN_WGPU_PREFILL_ROWS_H` and
    /// `POLYATTN_WGPU_PREFILL_BLOCK` (`KxC`), `POLYATTN_WGPU_PREFILL_PIPELINED` and
    /// `POLYATTN_WGPU_PREFILL_COOP` (`0` / `1`), `POLYATTN_WGPU_COOP_SPLIT` (1, 2, 4). A value that does not parse (or is out of
    /// range) is ignored with a warning.
    pub fn for_device(dev: &WgpuDevice) -> Self {
        let cpu = dev.adapter_info().device_type == wgpu::DeviceType::Cpu;
        Self::defaults(cpu, dev.has_subgroups()).with_env()
    }

    /// The defaults of [`WgpuTuning::for_device`] before the environment overrides, for a
    /// CPU adapter or a GPU.
    pub fn defaults(cpu: bool, subgroups: bool) -> Self {
        WgpuTuning {
            split_min_keys: if cpu { 32 } else { 128 },
            target_workgroups: if cpu { 16 } else { 4096 },
            max_splits: if cpu { 8 } else { 128 },
            subgroups,
            prefill_tiles: !cpu,
            unrolled: !cpu,
            prefill_kernel: PrefillKernel::Tiled2H,
            prefill_workgroup: PREFILL_TILED2_WORKGROUP,
            prefill_tile: (!cpu).then_some(GPU_PREFILL_TILE),
            prefill_keys_h: (!cpu).then_some(GPU_PREFILL_KEYS_H),
            prefill_rows_h: None,
            prefill_block: TILED2_DEFAULT_BLOCK,
            prefill_workgroup_h: (!cpu).then_some(GPU_PREFILL_WG_H),
            prefill_block_h: (!cpu).then_some(GPU_PREFILL_BLOCK_H),
            prefill_pipelined: false,
            prefill_coop: true,
            prefill_coop_split: None,
        }
    }

    fn with_env(self) -> Self {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> T {
            match std::env::var(name) {
                Ok(v) => v.trim().parse().unwrap_or_else(|_| {
                    tracing::warn!("{name}={v} does not parse; using the default");
                    default
                }),
                Err(_) => default,
            }
        }
        let flag = |name: &str, default: bool| var::<u8>(name, default as u8) != 0;
        // A value `parse` rejects is ignored with a warning saying what was `expected`.
        fn parsed<T>(
            name: &str,
            expected: &str,
            default: T,
            parse: impl Fn(&str) -> Option<T>,
        ) -> T {
            match std::env::var(name) {
                Ok(v) => parse(v.trim()).unwrap_or_else(|| {
                    tracing::warn!("{name}={v} is not {expected}; using the default");
                    default
                }),
                Err(_) => default,
            }
        }
        let workgroup = |v: &str| {
            let n = v.parse::<u32>().ok()?;
            (n.is_power_of_two() && (32..=1024).contains(&n)).then_some(n)
        };
        WgpuTuning {
            split_min_keys: var("POLYATTN_WGPU_SPLIT_MIN_KEYS", self.split_min_keys).max(1),
            target_workgroups: var("POLYATTN_WGPU_TARGET_WORKGROUPS", self.target_workgroups),
            max_splits: var("POLYATTN_WGPU_MAX_SPLITS", self.max_splits).max(1),
            subgroups: flag("POLYATTN_WGPU_SUBGROUPS", self.subgroups),
            prefill_tiles: flag("POLYATTN_WGPU_PREFILL_TILES", self.prefill_tiles),
            unrolled: flag("POLYATTN_WGPU_UNROLL", self.unrolled),
            prefill_kernel: parsed(
                "POLYATTN_WGPU_PREFILL",
                "tiled, tiled2 or tiled2h",
                self.prefill_kernel,
                PrefillKernel::parse,
            ),
            prefill_workgroup: parsed(
                "POLYATTN_WGPU_PREFILL_WG",
                "a power of two from 32 to 1024",
                self.prefill_workgroup,
                workgroup,
            ),
            prefill_tile: parsed(
                "POLYATTN_WGPU_PREFILL_TILE",
                "BMxBN (BM 1-128, BN 8/16/32/64)",
                self.prefill_tile,
                |v| parse_tile(v).map(Some),
            ),
            prefill_keys_h: parsed(
                "POLYATTN_WGPU_PREFILL_KEYS_H",
                "8, 16, 32, 48 or 64",
                self.prefill_keys_h,
                |v| {
                    let n = v.parse::<u32>().ok()?;
                    [8, 16, 32, 48, 64].contains(&n).then_some(Some(n))
                },
            ),
            prefill_rows_h: parsed(
                "POLYATTN_WGPU_PREFILL_ROWS_H",
                "1-128",
                self.prefill_rows_h,
                |v| {
                    let n = v.parse::<u32>().ok()?;
                    (1..=128).contains(&n).then_some(Some(n))
                },
            ),
            prefill_pipelined: flag("POLYATTN_WGPU_PREFILL_PIPELINED", self.prefill_pipelined),
            prefill_coop: flag("POLYATTN_WGPU_PREFILL_COOP", self.prefill_coop),
            prefill_coop_split: parsed(
                "POLYATTN_WGPU_COOP_SPLIT",
                "1, 2 or 4",
                self.prefill_coop_split,
                |v| {
                    let n = v.parse::<u32>().ok()?;
                    [1, 2, 4].contains(&n).then_some(Some(n))
                },
            ),
            prefill_workgroup_h: parsed(
                "POLYATTN_WGPU_PREFILL_WG_H",
                "a power of two from 32 to 1024",
                self.prefill_workgroup_h,
                |v| workgroup(v).map(Some),
            ),
            prefill_block_h: parsed(
                "POLYATTN_WGPU_PREFILL_BLOCK_H",
                "KxC (K 4/8/16, C 1/2/4/8)",
                self.prefill_block_h,
                |v| parse_block(v).map(Some),
            ),
            prefill_block: parsed(
                "POLYATTN_WGPU_PREFILL_BLOCK",
                "KxC (K 4/8/16, C 1/2/4/8)",
                self.prefill_block,
                parse_block,
            ),
        }
    }

    /// Splits for a request with `keys` visible keys in a batch of `requests` decode
    /// requests over `kv_heads` KV heads.
    pub fn splits(&self, keys: u32, requests: u32, kv_heads: u32) -> u32 {
        let by_len = keys.div_ceil(self.split_min_keys.max(1)).max(1);
        let by_occupancy = self
            .target_workgroups
            .div_ceil(requests.saturating_mul(kv_heads).max(1))
            .max(1);
        by_len.min(by_occupancy).min(self.max_splits).max(1)
    }
}

/// What a plan depends on besides the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlanKey {
    /// Query heads per KV head.
    pub group: u32,
    /// KV heads.
    pub num_kv_heads: u32,
    /// Rows of a decode tile.
    pub decode_rows: u32,
    /// Rows of a prefill tile.
    pub prefill_rows: u32,
    /// Decode items of at most this many rows go to the split-KV decode kernel
    /// (`paged_decode.wgsl`); 0 when it cannot run this layer.
    pub fast_decode_rows: u32,
    /// Keys come from dense K/V inputs (encoder attention), not the cache.
    pub dense: bool,
    /// Sliding window.
    pub window: Option<u32>,
    /// Split policy.
    pub tuning: WgpuTuning,
}

/// A list of work items (or combine groups) on the device.
#[derive(Clone, Debug)]
pub struct WorkList {
    /// The u32 words.
    pub buffer: wgpu::Buffer,
    /// Number of entries.
    pub count: u32,
}

/// The work of one step for one layer shape.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Decode items for the split-KV decode kernel (rows ≤ `PlanKey::fast_decode_rows`).
    pub decode_fast: Option<WorkList>,
    /// Most rows of an item in `decode_fast`.
    pub fast_rows: u32,
    /// Items for the decode tile shape.
    pub decode: Option<WorkList>,
    /// Items for the prefill tile shape.
    pub prefill: Option<WorkList>,
    /// Combine groups: first token, tokens, first partial slot, splits.
    pub combine: Option<WorkList>,
    /// Partial slots the decode items write.
    pub partial_slots: u32,
}

/// Shared-prefix (cascade) request, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CascadePlan {
    /// Tokens of the shared prefix (a multiple of the block size).
    pub prefix_len: usize,
}

/// What the wgpu kernels consume for one batch.
#[derive(Debug)]
pub struct WgpuAttentionMetadata {
    /// The validated common metadata.
    pub common: CommonAttentionMetadata,
    /// The decode / prefill split (informational: one pass handles both).
    pub split: DecodePrefillSplit,
    /// The cascade request, when `common_prefix_len > 0`.
    pub cascade: Option<CascadePlan>,
    pub(crate) device: WgpuDevice,
    pub(crate) block_table: wgpu::Buffer,
    pub(crate) slots: wgpu::Buffer,
    plans: Mutex<HashMap<PlanKey, Arc<Plan>>>,
}

impl AttentionMetadata for WgpuAttentionMetadata {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl WgpuAttentionMetadata {
    /// The plan for `key`, built on first use and shared by every later layer.
    pub fn plan(&self, key: PlanKey) -> Result<Arc<Plan>> {
        let lock = || self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = lock().get(&key) {
            return Ok(p.clone());
        }
        let plan = Arc::new(build_plan(&self.device, &self.common, &key)?);
        Ok(lock().entry(key).or_insert(plan).clone())
    }
}

/// The host side of a plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanWords {
    /// Decode items for the split-KV decode kernel.
    pub decode_fast: Vec<u32>,
    /// Decode items for the decode tile of paged_attention.wgsl.
    pub decode: Vec<u32>,
    /// Prefill items.
    pub prefill: Vec<u32>,
    /// Combine groups (first token, tokens, first partial slot, splits).
    pub groups: Vec<u32>,
    /// Partial slots the decode items write.
    pub slots: u32,
}

/// The host side of a plan: item words, combine-group words, partial slots.
pub fn plan_words(common: &CommonAttentionMetadata, key: &PlanKey) -> PlanWords {
    let qsl = common.query_start_loc_cpu();
    let seq_lens = common.seq_lens_cpu();
    let width = common.max_blocks_per_req() as u32;
    let g = key.group;
    let (mut fast, mut dec, mut pre, mut groups) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut slots = 0u32;
    let is_decode = |q: u32| !key.dense && q > 0 && q * g <= key.decode_rows;
    let n_dec = (0..common.num_reqs())
        .filter(|&r| is_decode(common.query_len(r) as u32))
        .count() as u32;
    for r in 0..common.num_reqs() {
        let q = common.query_len(r) as u32;
        if q == 0 {
            continue;
        }
        let tok = qsl[r] as u32;
        let s = seq_lens[r] as u32;
        let rows = q * g;
        if is_decode(q) {
            let dec = if rows <= key.fast_decode_rows {
                &mut fast
            } else {
                &mut dec
            };
            let ctx = s - q;
            let lo = key.window.map_or(0, |w| (ctx + 1).saturating_sub(w));
            let keys = s - lo;
            let splits = key.tuning.splits(keys, n_dec, key.num_kv_heads);
            if splits <= 1 {
                dec.extend([
                    tok,
                    0,
                    rows,
                    ctx,
                    0,
                    s,
                    r as u32 * width,
                    DIRECT_SLOT | SINK_FLAG,
                ]);
            } else {
                let chunk = keys.div_ceil(splits).div_ceil(16) * 16;
                let n = keys.div_ceil(chunk);
                for i in 0..n {
                    let a = lo + i * chunk;
                    let b = (a + chunk).min(s);
                    let flag = if i == 0 { SINK_FLAG } else { 0 };
                    dec.extend([
                        tok,
                        0,
                        rows,
                        ctx,
                        a,
                        b,
                        r as u32 * width,
                        (slots + i) | flag,
                    ]);
                }
                groups.extend([tok, q, slots, n]);
                slots += n;
            }
        } else {
            let (ctx, hi, kv_row) = if key.dense {
                (0, q, tok)
            } else {
                (s - q, s, r as u32 * width)
            };
            let mut row = 0;
            while row < rows {
                let n = key.prefill_rows.min(rows - row);
                pre.extend([tok, row, n, ctx, 0, hi, kv_row, DIRECT_SLOT | SINK_FLAG]);
                row += n;
            }
        }
    }
    PlanWords {
        decode_fast: fast,
        decode: dec,
        prefill: pre,
        groups,
        slots,
    }
}

fn build_plan(dev: &WgpuDevice, common: &CommonAttentionMetadata, key: &PlanKey) -> Result<Plan> {
    let w = plan_words(common, key);
    let fast_rows = w
        .decode_fast
        .chunks(ITEM_WORDS)
        .map(|c| c[2])
        .max()
        .unwrap_or(0);
    let list = |label: &str, words: Vec<u32>, stride: usize| -> Result<Option<WorkList>> {
        if words.is_empty() {
            return Ok(None);
        }
        Ok(Some(WorkList {
            buffer: upload_words(dev, label, &words)?,
            count: (words.len() / stride) as u32,
        }))
    };
    Ok(Plan {
        decode_fast: list("polyattn split-KV decode items", w.decode_fast, ITEM_WORDS)?,
        fast_rows,
        decode: list("polyattn decode items", w.decode, ITEM_WORDS)?,
        prefill: list("polyattn prefill items", w.prefill, ITEM_WORDS)?,
        combine: list("polyattn combine groups", w.groups, 4)?,
        partial_slots: w.slots,
    })
}

/// Builds [`WgpuAttentionMetadata`].
#[derive(Clone, Debug)]
pub struct WgpuMetadataBuilder {
    spec: KvCacheSpec,
    device: WgpuDevice,
}

impl WgpuMetadataBuilder {
    /// A builder for one KV-cache group on `device`.
    pub fn new(device: WgpuDevice, spec: KvCacheSpec) -> Self {
        WgpuMetadataBuilder { spec, device }
    }

    /// The device buffer of a metadata tensor, or a fresh upload of its host copy when the
    /// metadata was built on another device.
    fn resolve(&self, t: &Tensor, host: &[u32], label: &str) -> Result<wgpu::Buffer> {
        match t.storage() {
            Storage::Wgpu(s) if s.device() == &self.device => Ok(s.buffer().clone()),
            _ => upload_words(&self.device, label, host),
        }
    }
}

impl AttentionMetadataBuilder for WgpuMetadataBuilder {
    fn graph_capture_support(&self) -> GraphCaptureSupport {
        GraphCaptureSupport::Never
    }

    fn build(
        &self,
        common_prefix_len: usize,
        common: &CommonAttentionMetadata,
        _fast_build: bool,
    ) -> Result<Box<dyn AttentionMetadata>> {
        if common.block_size() != self.spec.block_size {
            return Err(Error::metadata(format!(
                "batch block size {} differs from the KV-cache group's {}",
                common.block_size(),
                self.spec.block_size
            )));
        }
        let cascade = common
            .cascade_prefix_blocks(common_prefix_len)?
            .map(|_| CascadePlan {
                prefix_len: common_prefix_len,
            });
        let dm = common.device();
        let bt_host: Vec<u32> = common.block_table_cpu().iter().map(|&b| b as u32).collect();
        let block_table = self.resolve(&dm.block_table, &bt_host, "polyattn block table")?;
        // Duplicate slots: keep the last write (a sequential reference's result).
        let slots_cpu = common.slot_mapping_cpu();
        let mut seen = HashSet::new();
        let mut dedup: Option<Vec<i64>> = None;
        for (t, &s) in slots_cpu.iter().enumerate().rev() {
            if s != PAD_SLOT_ID && !seen.insert(s) {
                dedup.get_or_insert_with(|| slots_cpu.to_vec())[t] = PAD_SLOT_ID;
            }
        }
        let slot_words = |v: &[i64]| -> Vec<u32> {
            v.iter()
                .flat_map(|&s| [s as u64 as u32, (s as u64 >> 32) as u32])
                .collect()
        };
        let slots = match dedup {
            Some(v) => upload_words(&self.device, "polyattn slots", &slot_words(&v))?,
            None => self.resolve(&dm.slot_mapping, &slot_words(slots_cpu), "polyattn slots")?,
        };
        Ok(Box::new(WgpuAttentionMetadata {
            split: common.split_decodes_and_prefills(1, false, true),
            common: common.clone(),
            cascade,
            device: self.device.clone(),
            block_table,
            slots,
            plans: Mutex::new(HashMap::new()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::metadata::BatchDescription;

    fn tuning() -> WgpuTuning {
        WgpuTuning {
            split_min_keys: 32,
            target_workgroups: 16,
            max_splits: 8,
            subgroups: false,
            prefill_tiles: true,
            unrolled: false,
            prefill_kernel: PrefillKernel::Tiled,
            prefill_workgroup: PREFILL_TILED2_WORKGROUP,
            prefill_tile: None,
            prefill_keys_h: None,
            prefill_rows_h: None,
            prefill_block: TILED2_DEFAULT_BLOCK,
            prefill_workgroup_h: None,
            prefill_block_h: None,
            prefill_pipelined: false,
            prefill_coop: true,
            prefill_coop_split: None,
        }
    }

    #[test]
    fn prefill_kernel_names_parse() {
        assert_eq!(parse_tile(" 64X16 "), Some((64, 16)));
        assert_eq!(parse_tile("32x32"), Some((32, 32)));
        for bad in ["0x32", "256x32", "32x12", "32", "axb", "32x"] {
            assert_eq!(parse_tile(bad), None, "{bad}");
        }
        assert_eq!(
            PrefillKernel::parse(" Tiled2 "),
            Some(PrefillKernel::Tiled2)
        );
        assert_eq!(PrefillKernel::parse("tiled"), Some(PrefillKernel::Tiled));
        assert_eq!(
            PrefillKernel::parse("TILED2H"),
            Some(PrefillKernel::Tiled2H)
        );
        assert!(PrefillKernel::Tiled2H.is_tiled2() && !PrefillKernel::Tiled.is_tiled2());
        assert_eq!(PrefillKernel::parse("tiled3"), None);
        // The default is tiled2h (tiled2 for every layer but f16 with an f16 cache), the
        // same in `Default` and in the device defaults; GPUs give it 32-key chunks.
        assert_eq!(PrefillKernel::default(), PrefillKernel::Tiled2H);
        let (gpu, cpu) = (
            WgpuTuning::defaults(false, true),
            WgpuTuning::defaults(true, true),
        );
        assert_eq!(gpu.prefill_kernel, PrefillKernel::default());
        assert_eq!(cpu.prefill_kernel, PrefillKernel::default());
        assert_eq!(gpu.prefill_keys_h, Some(GPU_PREFILL_KEYS_H));
        assert_eq!(cpu.prefill_keys_h, None);
    }

    #[test]
    fn plan_splits_long_decodes_and_tiles_prefills() {
        // A decode over 100 keys, a 40-token prefill over 50, block size 16.
        let desc = BatchDescription {
            query_start_loc: vec![0, 1, 41],
            seq_lens: vec![100, 50],
            block_table: (1..=14).collect(),
            max_blocks_per_req: 7,
            slot_mapping: (0..41).map(|i| 16 * 20 + i).collect(),
            causal: true,
            block_size: 16,
            is_prefilling: None,
        };
        let common = CommonAttentionMetadata::new(&Device::cpu(), desc).unwrap();
        let key = PlanKey {
            group: 2,
            num_kv_heads: 2,
            decode_rows: 16,
            prefill_rows: 32,
            fast_decode_rows: 0,
            dense: false,
            window: None,
            tuning: tuning(),
        };
        let PlanWords {
            decode_fast,
            decode: dec,
            prefill: pre,
            groups,
            slots,
        } = plan_words(&common, &key);
        assert!(decode_fast.is_empty());
        // 100 keys, 1 request × 2 heads: min(ceil(100/32)=4, ceil(16/2)=8) = 4 splits of 32.
        assert_eq!(dec.len() / ITEM_WORDS, 4);
        assert_eq!(slots, 4);
        assert_eq!(groups, vec![0, 1, 0, 4]);
        assert_eq!(&dec[..8], &[0, 0, 2, 99, 0, 32, 0, SINK_FLAG]);
        assert_eq!(&dec[24..32], &[0, 0, 2, 99, 96, 100, 0, 3]);
        // 40 tokens × 2 rows = 80 rows: tiles of 32, 32, 16.
        let rows: Vec<u32> = pre.chunks(8).map(|c| c[2]).collect();
        assert_eq!(rows, vec![32, 32, 16]);
        assert_eq!(
            &pre[..8],
            &[1, 0, 32, 10, 0, 50, 7, DIRECT_SLOT | SINK_FLAG]
        );
    }

    /// The GPU defaults on the decode rows of the H200 benchmark (8 KV heads): workgroups =
    /// requests × 8 × splits, keys per split = sequence / splits.
    #[test]
    fn gpu_defaults_fill_a_large_gpu() {
        let t = WgpuTuning::defaults(false, true);
        // D1.b1s4k: 32 splits of 128 keys, 256 workgroups (was 16 × 256, 128 workgroups).
        assert_eq!(t.splits(4096, 1, 8), 32);
        // D1.b8s4k: 32 × 128, 2048 workgroups.
        assert_eq!(t.splits(4096, 8, 8), 32);
        // D1.b16s16k: 32 × 512, 4096 workgroups; D1.b64s4k: 8 × 512, 4096 workgroups.
        assert_eq!(t.splits(16384, 16, 8), 32);
        assert_eq!(t.splits(4096, 64, 8), 8);
        // D4.b1s32k: 128 × 256, 1024 workgroups; D1.b256s4k: 2 × 2048.
        assert_eq!(t.splits(32768, 1, 8), 128);
        assert_eq!(t.splits(4096, 256, 8), 2);
    }

    #[test]
    fn split_count_respects_every_bound() {
        let t = tuning();
        assert_eq!(t.splits(10, 1, 1), 1);
        assert_eq!(t.splits(1000, 1, 1), 8);
        assert_eq!(t.splits(1000, 8, 2), 1);
    }
}
