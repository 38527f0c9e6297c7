//! [`WgpuTuning`]: every environment knob of the WGSL kernel family, parsed by one
//! [`WgpuTuning::from_env`] over per-adapter-kind defaults, and [`PrefillForm`], the prefill
//! kernel forms by what they are (docs/TUNING.md lists the knobs with the other families').
//! The defaults depend on two facts about the adapter (a CPU adapter or a GPU, subgroups or
//! not), which the caller passes in as booleans: the family names no runtime type.

use std::sync::OnceLock;

use super::attention::{DECODE_KEYS_PER_STEP, DECODE_MAX_ROWS, DECODE_WORKGROUP};
use super::tiles::TILED2_DEFAULT_BLOCK;

use crate::kernels::tuning_env::{self, Env};
use crate::plan::SplitRule;

/// The prefill tile GPUs ask for (where it fits; CPU adapters take the first candidate that
/// fits, see [`choose_tile`](super::choose_tile)): 64 query rows × 16 keys, the fastest tile of the
/// fused-softmax form on large GPUs (benches/RESULTS.md).
pub const GPU_PREFILL_TILE: (u32, u32) = (64, 16);

/// Keys per chunk GPUs give the f16 forms by default: per-chunk costs (barriers, α rescale,
/// the f16 partial flush) spread over more keys than the 32 of smaller chunks.
pub const GPU_PREFILL_KEYS_H: u32 = 64;

/// Threads per workgroup GPUs give the fused-softmax f16 form by default (with
/// [`GPU_PREFILL_KEYS_H`] keys per chunk and [`GPU_PREFILL_BLOCK_H`]): the fastest of 128 to
/// 1024 threads on large GPUs.
pub const GPU_PREFILL_WG_H: u32 = 512;

/// Per-thread register block GPUs give the fused-softmax f16 form by default: ≥ 4 keys per
/// thread in phase A, one vec4 output column per thread in phase C (at 512 threads, 64 rows
/// and head size 128: 2 × 4 scores and 4 × 1 outputs per thread).
pub const GPU_PREFILL_BLOCK_H: (u32, u32) = (4, 1);

/// Default threads per workgroup of the fused-softmax prefill form.
pub const PREFILL_TILED2_WORKGROUP: u32 = 128;

/// Most rows of one decode-kernel item on CPU adapters ([`WgpuTuning::decode_rows`]).
pub const CPU_DECODE_ROWS: u32 = 2;

/// The form of `paged_attention.wgsl` that runs prefill items (decode tiles always take the
/// three-phase form). Each form falls back to the next simpler one for a layer it cannot
/// run: cooperative matrix → fused softmax f16 → fused softmax → three phase.
/// `POLYATTN_WGPU_PREFILL=three-phase|fused-softmax|fused-softmax-f16|cooperative-matrix`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PrefillForm {
    /// Phases A (scores), B (softmax, one subgroup or thread per row), C (P·V), with the
    /// chunk's K and V loaded between them: 5 barriers per chunk, 128 threads.
    ThreePhase,
    /// The next chunk's K and V loads in flight during the current chunk's phases, the
    /// softmax fused into phase A (row max / sum reduced over subgroup lanes), 4 barriers per
    /// chunk, unrolled inner steps, [`WgpuTuning::prefill_workgroup`] threads
    /// ([`Tiled2`](super::Tiled2)).
    FusedSoftmax,
    /// [`PrefillForm::FusedSoftmax`] computing in f16: Q, K, V and P tiles in workgroup
    /// memory as f16, Q·Kᵀ and P·V with `vec4<f16>` FMAs into f16 partial sums flushed into
    /// f32; softmax statistics and output accumulators in f32. Only for f16 activations with
    /// an f16 cache on adapters with `SHADER_F16`; other layers run `FusedSoftmax`.
    FusedSoftmaxF16,
    /// Both matrix products on tensor cores through wgpu's cooperative matrices
    /// (`paged_attention_coop.wgsl`; [`Tiled2::coop`](super::Tiled2::coop)), the
    /// softmax in f32, for f16 layers with an f16 cache where the device has 16 × 16 × 16
    /// f16 / f32 cooperative matrices (the wgpu runtime's `WgpuDevice::has_coop`); other layers run
    /// `FusedSoftmaxF16` (then `FusedSoftmax`). The default.
    #[default]
    CooperativeMatrix,
}

impl PrefillForm {
    /// Parses a form's name (`three-phase`, `fused-softmax`, `fused-softmax-f16`,
    /// `cooperative-matrix`; case-insensitive, `_` for `-` accepted), and the older names
    /// `tiled`, `tiled2` and `tiled2h` (with a warning: tiled2h is the cooperative-matrix
    /// form's fallback chain).
    pub fn parse(s: &str) -> Option<Self> {
        let v = s.trim().to_ascii_lowercase().replace('_', "-");
        let old = match v.as_str() {
            "tiled" => Some(PrefillForm::ThreePhase),
            "tiled2" => Some(PrefillForm::FusedSoftmax),
            "tiled2h" => Some(PrefillForm::CooperativeMatrix),
            _ => None,
        };
        if let Some(f) = old {
            tracing::warn!(
                "POLYATTN_WGPU_PREFILL={v} is an old name; running {}",
                f.name()
            );
            return Some(f);
        }
        match v.as_str() {
            "three-phase" => Some(PrefillForm::ThreePhase),
            "fused-softmax" => Some(PrefillForm::FusedSoftmax),
            "fused-softmax-f16" => Some(PrefillForm::FusedSoftmaxF16),
            "cooperative-matrix" => Some(PrefillForm::CooperativeMatrix),
            _ => None,
        }
    }

    /// The form's name, as [`PrefillForm::parse`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            PrefillForm::ThreePhase => "three-phase",
            PrefillForm::FusedSoftmax => "fused-softmax",
            PrefillForm::FusedSoftmaxF16 => "fused-softmax-f16",
            PrefillForm::CooperativeMatrix => "cooperative-matrix",
        }
    }

    /// True for every form built on the fused-softmax kernel (all but `ThreePhase`).
    pub fn is_fused(self) -> bool {
        self != PrefillForm::ThreePhase
    }

    /// True where f16 layers may compute in f16 (`FusedSoftmaxF16`, `CooperativeMatrix`).
    pub fn allows_f16(self) -> bool {
        matches!(
            self,
            PrefillForm::FusedSoftmaxF16 | PrefillForm::CooperativeMatrix
        )
    }
}

/// Parses a fused-softmax register block `KxC` (K 4, 8 or 16 keys; C 1, 2, 4 or 8 vec4
/// columns).
pub fn parse_block(s: &str) -> Option<(u32, u32)> {
    let (k, c) = parse_pair(s)?;
    ([4, 8, 16].contains(&k) && [1, 2, 4, 8].contains(&c)).then_some((k, c))
}

/// Parses a tile shape `BMxBN` (BM 1–128, BN 8, 16, 32 or 64).
pub fn parse_tile(s: &str) -> Option<(u32, u32)> {
    let (m, n) = parse_pair(s)?;
    ((1..=128).contains(&m) && [8, 16, 32, 64].contains(&n)).then_some((m, n))
}

fn parse_pair(s: &str) -> Option<(u32, u32)> {
    let s = s.trim().to_ascii_lowercase();
    let (a, b) = s.split_once('x')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// A power of two from 32 to 1024 (threads per workgroup).
fn parse_workgroup(v: &str) -> Option<u32> {
    let n = v.parse::<u32>().ok()?;
    (n.is_power_of_two() && (32..=1024).contains(&n)).then_some(n)
}

/// The knobs of the WGSL kernel family: the split-KV plan, the decode kernel and the
/// prefill forms. [`WgpuTuning::for_adapter`] is what a layer runs with: the adapter kind's
/// defaults ([`WgpuTuning::defaults`]) with the environment applied
/// ([`WgpuTuning::from_env`]). Each field names its variable; a value that does not parse
/// keeps the default with a warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgpuTuning {
    /// Fewest keys one split-KV partial covers (`POLYATTN_WGPU_SPLIT_MIN_KEYS`, ≥ 1;
    /// default 128 on GPUs, 32 on CPU adapters).
    pub split_min_keys: u32,
    /// Workgroups a decode dispatch aims for: (request, KV head) pairs are multiplied by
    /// splits up to this (`POLYATTN_WGPU_TARGET_WORKGROUPS`; default 4096 on GPUs — many
    /// waves of a large GPU, so the last, partly filled one costs little — 16 on CPU
    /// adapters).
    pub target_workgroups: u32,
    /// Most splits per request (`POLYATTN_WGPU_MAX_SPLITS`, ≥ 1; default 128 on GPUs, 8 on
    /// CPU adapters).
    pub max_splits: u32,
    /// Use the subgroup softmax where the adapter has subgroups
    /// (`POLYATTN_WGPU_SUBGROUPS=0|1`; default on where available).
    pub subgroups: bool,
    /// Run long queries with the larger prefill tile (`POLYATTN_WGPU_PREFILL_TILES=0|1`;
    /// default on GPUs). Off, every item uses the decode tile: one pipeline per dtype
    /// pairing instead of two, which is what CPU adapters want (lavapipe spends 0.2–0.5 s
    /// compiling each pipeline and gains nothing from wider tiles).
    pub prefill_tiles: bool,
    /// Unroll the per-thread loops of the attention and decode kernels (loops marked
    /// `// @unroll`, see [`unroll`](super::unroll); `POLYATTN_WGPU_UNROLL=0|1`; default on GPUs):
    /// what GPU drivers need to keep per-thread score and accumulator arrays in registers.
    /// CPU adapters run the loops as written: LLVM (lavapipe) compiles the unrolled modules
    /// several times slower and runs them no faster.
    pub unrolled: bool,
    /// The prefill form (`POLYATTN_WGPU_PREFILL`, see [`PrefillForm`]; default
    /// `cooperative-matrix`, which falls back layer by layer).
    pub prefill_form: PrefillForm,
    /// Threads per workgroup of the fused-softmax form (`POLYATTN_WGPU_PREFILL_WG`: a power
    /// of two from 32 to 1024 that the adapter allows; default
    /// [`PREFILL_TILED2_WORKGROUP`]).
    pub prefill_workgroup: u32,
    /// Prefill tile (query rows BM, keys BN) instead of the first candidate that fits the
    /// adapter's workgroup memory (`POLYATTN_WGPU_PREFILL_TILE=BMxBN`: BM 1–128, BN 8, 16,
    /// 32 or 64; GPUs default to [`GPU_PREFILL_TILE`]). Used with `prefill_tiles` where it
    /// fits the adapter (see `WgpuAttentionImpl::with_tuning`), for the f32 forms.
    pub prefill_tile: Option<(u32, u32)>,
    /// Keys per chunk of the f16 forms only (`POLYATTN_WGPU_PREFILL_KEYS_H`: 8, 16, 32, 48
    /// or 64; the cooperative-matrix form takes multiples of 16), their query rows staying
    /// the prefill tile's unless [`WgpuTuning::prefill_rows_h`] is set. Why a separate count:
    /// f16 tiles take half the workgroup memory, so they fit larger chunks than the f32
    /// forms. `None`: the prefill tile's BN. GPUs default to [`GPU_PREFILL_KEYS_H`].
    pub prefill_keys_h: Option<u32>,
    /// Query rows per tile of the f16 forms only (`POLYATTN_WGPU_PREFILL_ROWS_H`: 1–128),
    /// like [`WgpuTuning::prefill_keys_h`]. The work plan of an f16 batch takes the rows of
    /// the form that runs it. `None`: the prefill tile's BM.
    pub prefill_rows_h: Option<u32>,
    /// Per-thread register block of the fused-softmax forms, `(keys, cols)`: at least
    /// `keys` keys per thread in phase A (4, 8 or 16) and `cols` vec4 output columns per
    /// thread in phase C (1, 2, 4 or 8); see [`Tiled2::block`](super::Tiled2::block)
    /// (`POLYATTN_WGPU_PREFILL_BLOCK=KxC`; default [`TILED2_DEFAULT_BLOCK`]).
    pub prefill_block: (u32, u32),
    /// Threads per workgroup of the fused-softmax f16 form only
    /// (`POLYATTN_WGPU_PREFILL_WG_H`, as [`WgpuTuning::prefill_workgroup`]; `None`: that
    /// one). GPUs default to [`GPU_PREFILL_WG_H`].
    pub prefill_workgroup_h: Option<u32>,
    /// Per-thread register block of the fused-softmax f16 form only
    /// (`POLYATTN_WGPU_PREFILL_BLOCK_H`, as [`WgpuTuning::prefill_block`]; `None`: that
    /// one). GPUs default to [`GPU_PREFILL_BLOCK_H`].
    pub prefill_block_h: Option<(u32, u32)>,
    /// Subgroups per 16-row tile of the cooperative-matrix form
    /// (`POLYATTN_WGPU_COOP_SPLIT`: 1, 2 or 4; see [`coop_split_fits`](super::coop_split_fits)). `None`: the
    /// most that fit the shape (4 at 64 rows × 64 keys: 512 threads). Why more than one: a
    /// subgroup that owns all of a tile's output matrices needs about twice the registers,
    /// which halves the subgroups an SM runs.
    pub prefill_coop_split: Option<u32>,
    /// Run decode items of at most [`WgpuTuning::decode_rows`] rows on the split-KV decode
    /// kernel (`paged_decode.wgsl`) where the adapter has subgroups and the layer fits it
    /// (`POLYATTN_WGPU_DECODE_KERNEL=0|1`; default on); off, they take the decode tile of
    /// `paged_attention.wgsl`.
    pub decode_kernel: bool,
    /// Most query rows (tokens × heads of one KV head) of one decode-kernel item
    /// (`POLYATTN_WGPU_DECODE_ROWS`: 1 to [`DECODE_MAX_ROWS`];
    /// default that on GPUs, where a GQA group's heads share every key load, and 2 on CPU
    /// adapters). Why 2 on a CPU: lavapipe runs the rows of an item one after another anyway,
    /// and its LLVM compile of the kernel grows with the rows (`ROWS` sizes every per-thread
    /// array): about 1–3 s with 1 or 2 rows against 10–15 s with 8 at head sizes 64–128,
    /// which was most of a cold test run. Two rows still run every multi-row path of the
    /// kernel; a wider GQA group decodes there in chunks of its heads (see the wgpu metadata
    /// builder), and longer items take the decode tile of `paged_attention.wgsl`.
    pub decode_rows: u32,
    /// Keys per key group per step of the decode kernel (`POLYATTN_WGPU_DECODE_KEYS`: 1–16;
    /// default [`DECODE_KEYS_PER_STEP`]).
    pub decode_keys_per_step: u32,
    /// Threads per workgroup of the decode kernel (`POLYATTN_WGPU_DECODE_WG`: a power of two
    /// from 32 to 1024, a multiple of the subgroup size; default [`DECODE_WORKGROUP`]).
    pub decode_workgroup: u32,
    /// Key positions per chunk of `WGPU_MLA`'s prefill (`forward_mha`; each chunk's latents
    /// are gathered and expanded, then attended, the softmax state carried to the next
    /// chunk): `POLYATTN_WGPU_MLA_PREFILL_CHUNK`, a positive multiple of 16. `None`: the most
    /// whose workspace fits 256 MiB and one storage binding.
    pub mla_prefill_chunk: Option<u32>,
}

impl WgpuTuning {
    /// The tuning a layer runs with on a CPU adapter (`cpu`) or a GPU, with or without
    /// subgroups: [`WgpuTuning::defaults`] with the environment applied
    /// ([`WgpuTuning::from_env`]; read once per process and adapter kind). The wgpu backend's
    /// `WgpuTuning::for_device` asks it for the device's kind.
    pub fn for_adapter(cpu: bool, subgroups: bool) -> Self {
        static TUNINGS: [[OnceLock<WgpuTuning>; 2]; 2] = [
            [OnceLock::new(), OnceLock::new()],
            [OnceLock::new(), OnceLock::new()],
        ];
        *TUNINGS[usize::from(cpu)][usize::from(subgroups)]
            .get_or_init(|| Self::from_env(cpu, subgroups))
    }

    /// The defaults for a CPU adapter (`cpu`) or a GPU, before the environment: GPUs split
    /// decodes into many partials (≥ 128 keys each, ~4096 workgroups, ≤ 128 splits) and use
    /// both tile shapes and unrolled loops; CPU adapters (lavapipe) split little, but still
    /// exercise the split path on sequences longer than 32 keys, and use one tile shape.
    pub fn defaults(cpu: bool, subgroups: bool) -> Self {
        WgpuTuning {
            split_min_keys: if cpu { 32 } else { 128 },
            target_workgroups: if cpu { 16 } else { 4096 },
            max_splits: if cpu { 8 } else { 128 },
            subgroups,
            prefill_tiles: !cpu,
            unrolled: !cpu,
            prefill_form: PrefillForm::default(),
            prefill_workgroup: PREFILL_TILED2_WORKGROUP,
            prefill_tile: (!cpu).then_some(GPU_PREFILL_TILE),
            prefill_keys_h: (!cpu).then_some(GPU_PREFILL_KEYS_H),
            prefill_rows_h: None,
            prefill_block: TILED2_DEFAULT_BLOCK,
            prefill_workgroup_h: (!cpu).then_some(GPU_PREFILL_WG_H),
            prefill_block_h: (!cpu).then_some(GPU_PREFILL_BLOCK_H),
            prefill_coop_split: None,
            decode_kernel: true,
            decode_rows: if cpu {
                CPU_DECODE_ROWS
            } else {
                DECODE_MAX_ROWS
            },
            decode_keys_per_step: DECODE_KEYS_PER_STEP,
            decode_workgroup: DECODE_WORKGROUP,
            mla_prefill_chunk: None,
        }
    }

    /// [`WgpuTuning::defaults`] with every variable that is set applied; a value that does
    /// not parse (or is out of range) keeps its default and is warned about (`tracing`).
    pub fn from_env(cpu: bool, subgroups: bool) -> Self {
        Self::from_lookup(Self::defaults(cpu, subgroups), &tuning_env::process_env)
    }

    /// `d` with the variables read through `lookup` applied.
    pub fn from_lookup(d: WgpuTuning, lookup: &dyn Fn(&str) -> Option<String>) -> Self {
        let env = Env::new(lookup);
        let count = |name: &str, default: u32| env.int_in(name, 1..=u32::MAX, default);
        let wg = "a power of two from 32 to 1024";
        let block = "KxC (K 4/8/16, C 1/2/4/8)";
        let show = |v: Option<u32>| v.map_or("the tile's".to_string(), |n| n.to_string());
        let show2 = |v: Option<(u32, u32)>| {
            v.map_or("the f32 form's".to_string(), |(a, b)| format!("{a}x{b}"))
        };
        WgpuTuning {
            split_min_keys: count("POLYATTN_WGPU_SPLIT_MIN_KEYS", d.split_min_keys),
            target_workgroups: count("POLYATTN_WGPU_TARGET_WORKGROUPS", d.target_workgroups),
            max_splits: count("POLYATTN_WGPU_MAX_SPLITS", d.max_splits),
            subgroups: env.switch("POLYATTN_WGPU_SUBGROUPS", d.subgroups),
            prefill_tiles: env.switch("POLYATTN_WGPU_PREFILL_TILES", d.prefill_tiles),
            unrolled: env.switch("POLYATTN_WGPU_UNROLL", d.unrolled),
            prefill_form: env.get(
                "POLYATTN_WGPU_PREFILL",
                "three-phase, fused-softmax, fused-softmax-f16 or cooperative-matrix",
                d.prefill_form,
                d.prefill_form.name(),
                PrefillForm::parse,
            ),
            prefill_workgroup: env.get(
                "POLYATTN_WGPU_PREFILL_WG",
                wg,
                d.prefill_workgroup,
                d.prefill_workgroup,
                parse_workgroup,
            ),
            prefill_tile: env.get(
                "POLYATTN_WGPU_PREFILL_TILE",
                "BMxBN (BM 1-128, BN 8/16/32/64)",
                d.prefill_tile,
                d.prefill_tile
                    .map_or("the first that fits".to_string(), |(m, n)| {
                        format!("{m}x{n}")
                    }),
                |v| parse_tile(v).map(Some),
            ),
            prefill_keys_h: env.get(
                "POLYATTN_WGPU_PREFILL_KEYS_H",
                "8, 16, 32, 48 or 64",
                d.prefill_keys_h,
                show(d.prefill_keys_h),
                |v| {
                    let n = v.parse::<u32>().ok()?;
                    [8, 16, 32, 48, 64].contains(&n).then_some(Some(n))
                },
            ),
            prefill_rows_h: env.get(
                "POLYATTN_WGPU_PREFILL_ROWS_H",
                "1-128",
                d.prefill_rows_h,
                show(d.prefill_rows_h),
                |v| {
                    let n = v.parse::<u32>().ok()?;
                    (1..=128).contains(&n).then_some(Some(n))
                },
            ),
            prefill_block: env.get(
                "POLYATTN_WGPU_PREFILL_BLOCK",
                block,
                d.prefill_block,
                format!("{}x{}", d.prefill_block.0, d.prefill_block.1),
                parse_block,
            ),
            prefill_workgroup_h: env.get(
                "POLYATTN_WGPU_PREFILL_WG_H",
                wg,
                d.prefill_workgroup_h,
                d.prefill_workgroup_h
                    .map_or("the f32 form's".to_string(), |n| n.to_string()),
                |v| parse_workgroup(v).map(Some),
            ),
            prefill_block_h: env.get(
                "POLYATTN_WGPU_PREFILL_BLOCK_H",
                block,
                d.prefill_block_h,
                show2(d.prefill_block_h),
                |v| parse_block(v).map(Some),
            ),
            prefill_coop_split: env
                .one_of("POLYATTN_WGPU_COOP_SPLIT", &[1, 2, 4], "the most that fit")
                .or(d.prefill_coop_split),
            decode_kernel: env.switch("POLYATTN_WGPU_DECODE_KERNEL", d.decode_kernel),
            decode_rows: env.int_in(
                "POLYATTN_WGPU_DECODE_ROWS",
                1..=DECODE_MAX_ROWS,
                d.decode_rows,
            ),
            decode_keys_per_step: env.int_in(
                "POLYATTN_WGPU_DECODE_KEYS",
                1..=16,
                d.decode_keys_per_step,
            ),
            decode_workgroup: env.get(
                "POLYATTN_WGPU_DECODE_WG",
                wg,
                d.decode_workgroup,
                d.decode_workgroup,
                parse_workgroup,
            ),
            mla_prefill_chunk: env.get(
                "POLYATTN_WGPU_MLA_PREFILL_CHUNK",
                "a positive multiple of 16",
                d.mla_prefill_chunk,
                "the workspace's",
                |v| {
                    let n = v.parse::<u32>().ok()?;
                    (n > 0 && n % 16 == 0).then_some(Some(n))
                },
            ),
        }
    }

    /// The planner's split rule for a batch of `requests` decode requests
    /// ([`SplitRule::PerRequest`] with this tuning's bounds).
    pub fn split_rule(&self, requests: usize) -> SplitRule {
        SplitRule::PerRequest {
            min_keys: self.split_min_keys as usize,
            target: self.target_workgroups as usize,
            max_splits: self.max_splits as usize,
            requests,
        }
    }

    /// Splits for a request with `keys` visible keys in a batch of `requests` decode
    /// requests over `kv_heads` KV heads (before the planner aligns them).
    pub fn splits(&self, keys: u32, requests: u32, kv_heads: u32) -> u32 {
        let rule = self.split_rule(requests as usize);
        let want = rule.want(0, kv_heads as usize, |_| 0);
        rule.count(keys as usize, want) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::tuning_env::table as lookup;

    #[test]
    fn prefill_form_names_parse() {
        assert_eq!(parse_tile(" 64X16 "), Some((64, 16)));
        assert_eq!(parse_tile("32x32"), Some((32, 32)));
        for bad in ["0x32", "256x32", "32x12", "32", "axb", "32x"] {
            assert_eq!(parse_tile(bad), None, "{bad}");
        }
        assert_eq!(parse_block("8x2"), Some((8, 2)));
        assert_eq!(parse_block("3x2"), None);
        for f in [
            PrefillForm::ThreePhase,
            PrefillForm::FusedSoftmax,
            PrefillForm::FusedSoftmaxF16,
            PrefillForm::CooperativeMatrix,
        ] {
            assert_eq!(PrefillForm::parse(f.name()), Some(f));
            assert_eq!(
                PrefillForm::parse(&f.name().to_uppercase().replace('-', "_")),
                Some(f)
            );
        }
        // The older names map to the forms that ran under them.
        assert_eq!(
            PrefillForm::parse(" Tiled2 "),
            Some(PrefillForm::FusedSoftmax)
        );
        assert_eq!(PrefillForm::parse("tiled"), Some(PrefillForm::ThreePhase));
        assert_eq!(
            PrefillForm::parse("TILED2H"),
            Some(PrefillForm::CooperativeMatrix)
        );
        assert_eq!(PrefillForm::parse("tiled3"), None);
        assert!(PrefillForm::CooperativeMatrix.is_fused() && !PrefillForm::ThreePhase.is_fused());
        assert!(
            PrefillForm::FusedSoftmaxF16.allows_f16() && !PrefillForm::FusedSoftmax.allows_f16()
        );
        // The default is the cooperative-matrix form (with its fallbacks), the same in
        // `Default` and in the device defaults; GPUs give the f16 forms 64-key chunks.
        assert_eq!(PrefillForm::default(), PrefillForm::CooperativeMatrix);
        let (gpu, cpu) = (
            WgpuTuning::defaults(false, true),
            WgpuTuning::defaults(true, true),
        );
        assert_eq!(gpu.prefill_form, PrefillForm::default());
        assert_eq!(cpu.prefill_form, PrefillForm::default());
        assert_eq!(gpu.prefill_keys_h, Some(GPU_PREFILL_KEYS_H));
        assert_eq!(cpu.prefill_keys_h, None);
    }

    #[test]
    fn environment_overrides_and_rejects() {
        let d = WgpuTuning::defaults(false, true);
        assert_eq!(WgpuTuning::from_lookup(d, &lookup(&[])), d);
        let t = WgpuTuning::from_lookup(
            d,
            &lookup(&[
                ("POLYATTN_WGPU_SPLIT_MIN_KEYS", "256"),
                ("POLYATTN_WGPU_MAX_SPLITS", "0"),
                ("POLYATTN_WGPU_UNROLL", "0"),
                ("POLYATTN_WGPU_PREFILL", "fused-softmax"),
                ("POLYATTN_WGPU_PREFILL_WG", "7"),
                ("POLYATTN_WGPU_PREFILL_TILE", "32x32"),
                ("POLYATTN_WGPU_PREFILL_BLOCK_H", "8x2"),
                ("POLYATTN_WGPU_COOP_SPLIT", "2"),
                ("POLYATTN_WGPU_DECODE_KERNEL", "0"),
                ("POLYATTN_WGPU_DECODE_KEYS", "17"),
                ("POLYATTN_WGPU_DECODE_WG", "256"),
            ]),
        );
        let want = WgpuTuning {
            split_min_keys: 256,
            unrolled: false,
            prefill_form: PrefillForm::FusedSoftmax,
            prefill_tile: Some((32, 32)),
            prefill_block_h: Some((8, 2)),
            prefill_coop_split: Some(2),
            decode_kernel: false,
            decode_workgroup: 256,
            // Rejected: 0 splits, 7 threads, 17 keys per step keep their defaults.
            ..d
        };
        assert_eq!(t, want);
        // Decode-kernel rows: 1 to DECODE_MAX_ROWS; 9 keeps the default.
        let four = WgpuTuning::from_lookup(d, &lookup(&[("POLYATTN_WGPU_DECODE_ROWS", "4")]));
        assert_eq!(four.decode_rows, 4);
        let nine = WgpuTuning::from_lookup(d, &lookup(&[("POLYATTN_WGPU_DECODE_ROWS", "9")]));
        assert_eq!(nine.decode_rows, d.decode_rows);
        assert_eq!(
            WgpuTuning::defaults(true, true).decode_rows,
            CPU_DECODE_ROWS
        );
        assert_eq!(d.decode_rows, DECODE_MAX_ROWS);
    }
}
