//! A seeded fuzzer for one backend: random valid batches checked against the f64 reference,
//! and random invalid inputs that must be refused with a typed [`Error`].
//!
//! # What it generates
//!
//! Every case is drawn from one seed ([`run_case`]). About six cases in ten are **valid**:
//! a mixed batch of decodes, prefills, chunked prefills with cached context and requests with
//! no new token, in any activation dtype and KV-cache dtype the backend lists, with GQA / MQA
//! head layouts, head and block sizes the backend accepts, and random layer features —
//! sliding window, ALiBi, soft cap (with logits large enough for it to bite), sinks,
//! non-causal decoder attention, encoder layers, cascade over a shared prefix, query / key /
//! value / output tensors longer than the batch, a slot mapping padded with −1 to that length,
//! −1 slots for tokens whose keys are already cached, an LSE output, and cache slots the batch
//! may not read filled with NaN, ±inf, huge or garbage values (a reused block). The output
//! (and LSE) must match [`crate::reference::attention`] within [`Tolerance::for_dtype`],
//! padding rows must stay untouched, and the forward may change only the cache slots in the
//! batch's slot mapping.
//!
//! The rest are **invalid**: a small valid batch with one thing broken — a tensor of the
//! wrong shape, rank or dtype (query, key, value, output, LSE), metadata with out-of-range
//! block ids or slots, `seq_len < query_len`, a non-monotonic `query_start_loc`, mismatched
//! lengths, a cache of the wrong heads / head size / dtype / block size / block count, shapes
//! and block counts whose sizes overflow `usize`, bad layer parameters (NaN scale, window 0,
//! slopes or sinks of the wrong length, ...). The call must return `Err` — not `Ok`, not a
//! panic — and an error from `forward` must leave every cache byte unchanged. An
//! [`Error::Device`] counts as a failure except for the overflow cases: a refused shape
//! must be caught before it reaches a device.
//!
//! A panic anywhere is caught and reported as a failure of that seed.
//!
//! # The seed rule
//!
//! A case depends only on its seed, the [`Profile`] and the backend's capabilities: a run
//! with base seed `S` runs seeds `S, S + 1, S + 2, …` ([`case_seed`]). To reproduce a
//! failure, run that one seed on that backend:
//!
//! ```text
//! polyattn fuzz --backend WGPU --profile ci --seed 1234 --iterations 1
//! ```
//!
//! ([`reproduce_command`] prints exactly this line for a failing case.)

use std::collections::BTreeSet;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::str::FromStr;

use half::{bf16, f16};

use crate::attention::{AttentionLayer, AttentionParams};
use crate::backend::{AttentionBackend, AttentionType, SelectorConfig};
use crate::device::{CpuStorage, Tensor};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::kv_cache::{KvCache, KvCacheSpec};
use crate::metadata::{BatchDescription, CommonAttentionMetadata, PAD_SLOT_ID};
use crate::reference;

use super::{BatchSpec, CaseConfig, RandomBatch, Rng, Tolerance};

/// How large the generated batches are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// Small batches and few head sizes: the CI form, quick on a software rasteriser.
    Ci,
    /// Larger batches, every head and block size: the long form (`polyattn fuzz`).
    Long,
}

impl Profile {
    /// The size limits of this profile.
    pub fn limits(self) -> Limits {
        match self {
            Profile::Ci => Limits {
                max_reqs: 3,
                max_query: 12,
                max_context: 40,
                max_kv_heads: 2,
                max_group: 4,
                head_sizes: &[32, 64, 128],
                block_sizes: &[4, 8, 16, 32],
                invalid_per_mille: 450,
            },
            Profile::Long => Limits {
                max_reqs: 6,
                max_query: 160,
                max_context: 800,
                max_kv_heads: 4,
                max_group: 4,
                head_sizes: &[
                    4, 8, 16, 24, 32, 40, 48, 64, 72, 80, 96, 112, 128, 136, 160, 192, 256,
                ],
                block_sizes: &[1, 2, 4, 8, 16, 32, 48, 64, 128],
                invalid_per_mille: 400,
            },
        }
    }

    /// The name `--profile` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Ci => "ci",
            Profile::Long => "long",
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Profile {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "ci" => Ok(Profile::Ci),
            "long" => Ok(Profile::Long),
            _ => Err(Error::config(format!(
                "unknown fuzz profile '{s}'; valid: ci, long"
            ))),
        }
    }
}

/// Size limits of the generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Requests per batch.
    pub max_reqs: usize,
    /// New tokens per request.
    pub max_query: usize,
    /// Cached tokens per request (before a shared prefix is added).
    pub max_context: usize,
    /// KV heads.
    pub max_kv_heads: usize,
    /// Query heads per KV head.
    pub max_group: usize,
    /// Head sizes to draw from (those the backend accepts).
    pub head_sizes: &'static [usize],
    /// Block sizes to draw from (those the backend accepts).
    pub block_sizes: &'static [usize],
    /// Share of invalid cases, per thousand.
    pub invalid_per_mille: usize,
}

/// What happened to one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Valid: matched the reference; invalid: refused with a typed error, cache unchanged.
    Pass,
    /// What went wrong.
    Fail(String),
    /// The backend cannot run the drawn configuration (its reasons).
    Skip(String),
}

/// One case's seed, description and verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaseReport {
    /// The seed the case was drawn from.
    pub seed: u64,
    /// What was generated ("valid f16/fp8_e4m3 hd64 bs16 (8,2) ..." or "invalid ...").
    pub label: String,
    /// The outcome.
    pub verdict: Verdict,
}

impl fmt::Display for CaseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.verdict {
            Verdict::Pass => write!(f, "seed {}: pass: {}", self.seed, self.label),
            Verdict::Skip(why) => write!(f, "seed {}: skip: {}: {why}", self.seed, self.label),
            Verdict::Fail(why) => write!(f, "seed {}: FAIL: {}: {why}", self.seed, self.label),
        }
    }
}

/// The seed of case `i` of a run with base seed `base`.
pub fn case_seed(base: u64, i: u64) -> u64 {
    base.wrapping_add(i)
}

/// The command line that reruns one case.
pub fn reproduce_command(backend: &str, seed: u64, profile: Profile) -> String {
    format!("polyattn fuzz --backend {backend} --profile {profile} --seed {seed} --iterations 1")
}

/// Counts of a run and its failures.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Cases that passed.
    pub passed: usize,
    /// Cases that failed.
    pub failed: usize,
    /// Cases the backend could not run.
    pub skipped: usize,
    /// Every failed case.
    pub failures: Vec<CaseReport>,
}

impl Tally {
    /// Adds one case.
    pub fn add(&mut self, r: &CaseReport) {
        match r.verdict {
            Verdict::Pass => self.passed += 1,
            Verdict::Skip(_) => self.skipped += 1,
            Verdict::Fail(_) => {
                self.failed += 1;
                self.failures.push(r.clone());
            }
        }
    }

    /// Cases seen.
    pub fn total(&self) -> usize {
        self.passed + self.failed + self.skipped
    }
}

/// Runs the case of `seed` on `backend`. Never panics: a panic inside is a [`Verdict::Fail`].
pub fn run_case(backend: &dyn AttentionBackend, seed: u64, profile: Profile) -> CaseReport {
    let mut label = String::from("(not generated)");
    let result = catch_unwind(AssertUnwindSafe(|| {
        run_case_inner(backend, seed, profile, &mut label)
    }));
    let verdict = match result {
        Ok(v) => v,
        Err(panic) => Verdict::Fail(format!("panicked: {}", panic_message(&*panic))),
    };
    CaseReport {
        seed,
        label,
        verdict,
    }
}

/// The text of a caught panic.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "<non-string panic>".into())
}

fn run_case_inner(
    backend: &dyn AttentionBackend,
    seed: u64,
    profile: Profile,
    label: &mut String,
) -> Verdict {
    let limits = profile.limits();
    let mut rng = Rng::new(seed);
    if rng.below(1000) < limits.invalid_per_mille {
        run_invalid(backend, &mut rng, &limits, label)
    } else {
        match gen_valid(backend, &mut rng, &limits) {
            Ok(case) => {
                *label = case.label();
                match run_valid(backend, &case) {
                    Ok(v) => v,
                    Err(e) => Verdict::Fail(format!("error on a valid batch: {e}")),
                }
            }
            Err(skip) => {
                *label = "valid (no configuration)".into();
                Verdict::Skip(skip)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared helpers

fn pick<T: Copy>(rng: &mut Rng, v: &[T]) -> T {
    v[rng.below(v.len())]
}

fn chance(rng: &mut Rng, per_mille: usize) -> bool {
    rng.below(1000) < per_mille
}

fn supported_head_sizes(b: &dyn AttentionBackend, limits: &Limits) -> Vec<usize> {
    let caps = b.capabilities();
    limits
        .head_sizes
        .iter()
        .copied()
        .filter(|&h| caps.head_sizes.contains(h))
        .collect()
}

fn supported_block_sizes(b: &dyn AttentionBackend, limits: &Limits) -> Vec<usize> {
    let caps = b.capabilities();
    limits
        .block_sizes
        .iter()
        .copied()
        .filter(|&bs| caps.block_sizes.iter().any(|r| r.accepts(bs as u32)))
        .collect()
}

fn activation_dtypes(b: &dyn AttentionBackend) -> Vec<DType> {
    b.capabilities()
        .dtypes
        .iter()
        .copied()
        .filter(|d| d.is_activation())
        .collect()
}

/// The selector configuration a case needs.
fn selector_config(case: &CaseConfig) -> SelectorConfig {
    let p = &case.params;
    let mut c = SelectorConfig::for_layer(p, case.dtype, Some(case.block_size as u32));
    c.use_non_causal = !case.causal && p.attn_type == AttentionType::Decoder;
    c
}

fn reasons_text(b: &dyn AttentionBackend, config: &SelectorConfig) -> Option<String> {
    let r = b.validate_configuration(config);
    if r.is_empty() {
        None
    } else {
        Some(
            r.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        )
    }
}

/// The cache slots that hold each request's cached context (`seq_len − query_len` tokens):
/// what a batch may read before it writes its own tokens.
pub fn context_slots(desc: &BatchDescription) -> BTreeSet<usize> {
    let mut keep = BTreeSet::new();
    let w = desc.max_blocks_per_req;
    let bs = desc.block_size;
    for r in 0..desc.seq_lens.len() {
        let q = (desc.query_start_loc[r + 1] - desc.query_start_loc[r]).max(0) as usize;
        let ctx = (desc.seq_lens[r].max(0) as usize).saturating_sub(q);
        for pos in 0..ctx {
            let block = desc.block_table[r * w + pos / bs] as usize;
            keep.insert(block * bs + pos % bs);
        }
    }
    keep
}

/// The slots a batch writes: its slot mapping without the −1 entries.
pub fn written_slots(desc: &BatchDescription) -> BTreeSet<usize> {
    desc.slot_mapping
        .iter()
        .filter(|&&s| s >= 0)
        .map(|&s| s as usize)
        .collect()
}

/// What a reused cache block may still hold in the slots a batch must not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleFill {
    /// NaN everywhere.
    Nan,
    /// +inf (an fp8 format without infinities gets its NaN).
    PosInf,
    /// −inf.
    NegInf,
    /// The largest finite value of the storage dtype.
    Huge,
    /// Random bit patterns (NaN and inf among them).
    Garbage,
}

impl StaleFill {
    /// Every fill.
    pub const ALL: [StaleFill; 5] = [
        StaleFill::Nan,
        StaleFill::PosInf,
        StaleFill::NegInf,
        StaleFill::Huge,
        StaleFill::Garbage,
    ];

    /// Short name for labels.
    pub fn as_str(self) -> &'static str {
        match self {
            StaleFill::Nan => "nan",
            StaleFill::PosInf => "+inf",
            StaleFill::NegInf => "-inf",
            StaleFill::Huge => "huge",
            StaleFill::Garbage => "garbage",
        }
    }

    fn f32_value(self, rng: &mut Rng) -> f32 {
        match self {
            StaleFill::Nan => f32::NAN,
            StaleFill::PosInf => f32::INFINITY,
            StaleFill::NegInf => f32::NEG_INFINITY,
            StaleFill::Huge => f32::MAX,
            StaleFill::Garbage => f32::from_bits(rng.next_u64() as u32),
        }
    }
}

/// Fills every element of every cache slot not in `keep` (keys and values, all heads) with
/// `fill`, through the public API: download, rewrite, upload in place.
pub fn fill_cache_outside(
    cache: &mut KvCache,
    keep: &BTreeSet<usize>,
    fill: StaleFill,
    seed: u64,
) -> Result<()> {
    let mut rng = Rng::new(seed);
    let spec = *cache.spec();
    let (bs, h, d) = (spec.block_size, spec.num_kv_heads, spec.head_size);
    let dtype = cache.data().dtype();
    let mut host = cache.data().to_host()?;
    for block in 0..cache.num_blocks() {
        for token in 0..bs {
            if keep.contains(&(block * bs + token)) {
                continue;
            }
            for kv in 0..2 {
                for head in 0..h {
                    let o = cache.offset(block, kv, token, head);
                    for i in o..o + d {
                        write_stale(&mut host, dtype, i, fill, &mut rng);
                    }
                }
            }
        }
    }
    let device = cache.data().device().clone();
    let shape = cache.data().shape().to_vec();
    *cache.data_mut() = Tensor::from_cpu_storage(&device, host, &shape, dtype)?;
    Ok(())
}

fn write_stale(host: &mut CpuStorage, dtype: DType, i: usize, fill: StaleFill, rng: &mut Rng) {
    match host {
        CpuStorage::F32(v) => v[i] = fill.f32_value(rng),
        CpuStorage::F16(v) => {
            v[i] = match fill {
                StaleFill::Huge => f16::MAX,
                StaleFill::Garbage => f16::from_bits(rng.next_u64() as u16),
                other => f16::from_f32(other.f32_value(rng)),
            }
        }
        CpuStorage::Bf16(v) => {
            v[i] = match fill {
                StaleFill::Huge => bf16::MAX,
                StaleFill::Garbage => bf16::from_bits(rng.next_u64() as u16),
                other => bf16::from_f32(other.f32_value(rng)),
            }
        }
        CpuStorage::U8(v) => {
            let e4m3 = dtype == DType::Fp8E4m3;
            v[i] = match (fill, e4m3) {
                (StaleFill::Nan, true) | (StaleFill::PosInf, true) => 0x7f,
                (StaleFill::NegInf, true) => 0xff,
                (StaleFill::Huge, true) => 0x7e,
                (StaleFill::Nan, false) => 0x7e,
                (StaleFill::PosInf, false) => 0x7c,
                (StaleFill::NegInf, false) => 0xfc,
                (StaleFill::Huge, false) => 0x7b,
                (StaleFill::Garbage, _) => rng.next_u64() as u8,
            }
        }
        CpuStorage::I32(_) | CpuStorage::I64(_) => {}
    }
}

/// The raw bits of every cache element, for byte-exact comparisons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheSnapshot {
    bits: Vec<u32>,
}

impl CacheSnapshot {
    /// Downloads the cache (waits for pending work).
    pub fn take(cache: &KvCache) -> Result<Self> {
        let bits = match cache.data().to_host()? {
            CpuStorage::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            CpuStorage::F16(v) => v.iter().map(|x| x.to_bits() as u32).collect(),
            CpuStorage::Bf16(v) => v.iter().map(|x| x.to_bits() as u32).collect(),
            CpuStorage::U8(v) => v.iter().map(|&x| x as u32).collect(),
            CpuStorage::I32(v) => v.iter().map(|&x| x as u32).collect(),
            CpuStorage::I64(v) => v.iter().map(|&x| x as u32).collect(),
        };
        Ok(CacheSnapshot { bits })
    }

    /// The slots (`block * block_size + token`) whose bytes differ between `self` and
    /// `after`, keys or values, any head. Both must be snapshots of `cache`'s layout.
    pub fn changed_slots(&self, after: &CacheSnapshot, cache: &KvCache) -> Result<Vec<usize>> {
        if self.bits.len() != after.bits.len() {
            return Err(Error::config(format!(
                "cache snapshots of {} and {} elements",
                self.bits.len(),
                after.bits.len()
            )));
        }
        let spec = cache.spec();
        let (bs, h, d) = (spec.block_size, spec.num_kv_heads, spec.head_size);
        let mut changed = Vec::new();
        for block in 0..cache.num_blocks() {
            for token in 0..bs {
                let differs = (0..2).any(|kv| {
                    (0..h).any(|head| {
                        let o = cache.offset(block, kv, token, head);
                        self.bits[o..o + d] != after.bits[o..o + d]
                    })
                });
                if differs {
                    changed.push(block * bs + token);
                }
            }
        }
        Ok(changed)
    }
}

/// Checks that only `allowed` slots changed between `before` and the cache now.
pub fn check_only_slots_changed(
    before: &CacheSnapshot,
    cache: &KvCache,
    allowed: &BTreeSet<usize>,
) -> Result<std::result::Result<(), String>> {
    let after = CacheSnapshot::take(cache)?;
    let changed = before.changed_slots(&after, cache)?;
    let stray: Vec<usize> = changed
        .iter()
        .copied()
        .filter(|s| !allowed.contains(s))
        .collect();
    if stray.is_empty() {
        Ok(Ok(()))
    } else {
        let bs = cache.block_size();
        let shown: Vec<String> = stray
            .iter()
            .take(8)
            .map(|s| format!("{s} (block {}, token {})", s / bs, s % bs))
            .collect();
        Ok(Err(format!(
            "{} cache slot(s) outside the slot mapping changed: {}{}",
            stray.len(),
            shown.join(", "),
            if stray.len() > 8 { ", ..." } else { "" }
        )))
    }
}

// ---------------------------------------------------------------------------------------------
// Valid cases

/// A generated valid case: the batch's shape and everything done to it around the forward.
#[derive(Clone, Debug)]
pub struct ValidCase {
    /// Layer, dtype, block size, causality, cascade prefix.
    pub case: CaseConfig,
    /// `(query_len, seq_len)` per request.
    pub spec: BatchSpec,
    /// Seed of the batch's random tensors.
    pub batch_seed: u64,
    /// Request and check the LSE.
    pub lse: bool,
    /// Extra rows in query / key / value / output (graph padding).
    pub pad_rows: usize,
    /// The slot mapping padded with −1 to the padded row count.
    pub pad_slot_mapping: bool,
    /// Tokens whose keys are written by an earlier update, then hidden behind −1 slots.
    pub pad_slots: Vec<usize>,
    /// What the slots the batch may not read hold.
    pub stale: Option<StaleFill>,
}

impl ValidCase {
    /// A one-line description.
    pub fn label(&self) -> String {
        let p = &self.case.params;
        let mut s = format!(
            "valid {}/{} hd{} bs{} ({},{}) {} reqs {:?}",
            self.case.dtype,
            p.kv_cache_dtype,
            p.head_size,
            self.case.block_size,
            p.num_heads,
            p.num_kv_heads,
            p.attn_type,
            self.spec.requests
        );
        s.push_str(&format!(" scale {:.3}", p.scale));
        if let Some(w) = p.sliding_window {
            s.push_str(&format!(" +window {w}"));
        }
        if p.alibi_slopes.is_some() {
            s.push_str(" +alibi");
        }
        if let Some(c) = p.soft_cap() {
            s.push_str(&format!(" +soft_cap {c}"));
        }
        if p.sinks.is_some() {
            s.push_str(" +sinks");
        }
        if !self.case.causal && !p.attn_type.is_encoder() {
            s.push_str(" +non-causal");
        }
        if self.case.common_prefix_len > 0 {
            s.push_str(&format!(" +cascade {}", self.case.common_prefix_len));
        }
        if self.lse {
            s.push_str(" +lse");
        }
        if self.pad_rows > 0 {
            s.push_str(&format!(" +pad_rows {}", self.pad_rows));
        }
        if self.pad_slot_mapping {
            s.push_str(" +slot_mapping padded with -1");
        }
        if !self.pad_slots.is_empty() {
            s.push_str(&format!(" +-1 slots {:?}", self.pad_slots));
        }
        if let Some(f) = self.stale {
            s.push_str(&format!(" +stale cache {}", f.as_str()));
        }
        s
    }
}

/// Draws a valid case the backend accepts, or says why none was found.
pub fn gen_valid(
    b: &dyn AttentionBackend,
    rng: &mut Rng,
    limits: &Limits,
) -> std::result::Result<ValidCase, String> {
    let caps = b.capabilities().clone();
    let dtypes = activation_dtypes(b);
    let heads = supported_head_sizes(b, limits);
    let blocks = supported_block_sizes(b, limits);
    if dtypes.is_empty() || heads.is_empty() || blocks.is_empty() || caps.kv_cache_dtypes.is_empty()
    {
        return Err(format!(
            "no activation dtype / head size / block size of the generator is supported \
             (head sizes {}, dtypes {:?})",
            caps.head_sizes, caps.dtypes
        ));
    }
    let dtype = pick(rng, &dtypes);
    let kv_cache_dtype = pick(rng, &caps.kv_cache_dtypes);
    let block_size = pick(rng, &blocks);
    let hkv = 1 + rng.below(limits.max_kv_heads);
    let group = 1 + rng.below(limits.max_group);
    let h = hkv * group;
    let mut last_reason = String::new();
    // A head size the adapter may still refuse (workgroup memory): try a few.
    for _ in 0..4 {
        let d = pick(rng, &heads);
        let mut params = AttentionParams::new(h, d, hkv);
        params.kv_cache_dtype = kv_cache_dtype;
        let encoder = (caps.attn_types.contains(&AttentionType::EncoderOnly)
            || caps.attn_types.contains(&AttentionType::Encoder))
            && chance(rng, 100);
        if encoder {
            params.attn_type = if caps.attn_types.contains(&AttentionType::EncoderOnly)
                && (chance(rng, 500) || !caps.attn_types.contains(&AttentionType::Encoder))
            {
                AttentionType::EncoderOnly
            } else {
                AttentionType::Encoder
            };
        }
        let causal = encoder || !(caps.supports_non_causal && chance(rng, 150));
        let mut scale_mult = pick(rng, &[1.0f32, 1.0, 1.0, 0.5, 2.0, 3.0]);
        if caps.supports_soft_cap && chance(rng, 150) {
            let cap = pick(rng, &[10.0f32, 20.0, 50.0]);
            params.logits_soft_cap = Some(cap);
            // Logits of the cap's order, so that the cap changes the result.
            scale_mult = cap * 0.8;
        }
        params.scale = scale_mult / (d as f32).sqrt();
        if caps.supports_alibi && chance(rng, 150) {
            params.alibi_slopes = Some(
                (0..h)
                    .map(|_| 2f32.powi(-(1 + rng.below(8) as i32)))
                    .collect(),
            );
        }
        if caps.supports_sink && chance(rng, 200) {
            params.sinks = Some((0..h).map(|_| 15.0 * rng.uniform() as f32).collect());
        }
        let cascade = caps.supports_cascade
            && !encoder
            && causal
            && params.alibi_slopes.is_none()
            && chance(rng, 150);
        let prefix = if cascade {
            (1 + rng.below(2)) * block_size
        } else {
            0
        };

        // Requests.
        let n_reqs = 1 + rng.below(limits.max_reqs);
        let mut requests = Vec::with_capacity(n_reqs);
        for _ in 0..n_reqs {
            let ctx = rng.below(limits.max_context + 1);
            let q = 1 + rng.below(limits.max_query);
            let (q, s) = if encoder {
                (q, q)
            } else {
                match rng.below(10) {
                    0..=3 => (1, ctx + 1),
                    4..=5 => (q, q),
                    6..=8 => (q, ctx + q),
                    _ => (0, ctx),
                }
            };
            if cascade {
                requests.push((q, s + prefix));
            } else {
                requests.push((q, s));
            }
        }
        if requests.iter().all(|r| r.0 == 0) {
            requests[0].0 = 1;
            requests[0].1 += 1;
        }
        let max_seq = requests.iter().map(|r| r.1).max().unwrap_or(1).max(1);
        if caps.supports_sliding_window && !cascade && chance(rng, 200) {
            params.sliding_window = Some(1 + rng.below(max_seq));
        }
        let mut case = CaseConfig::new(params, dtype, block_size);
        case.causal = causal;
        case.common_prefix_len = prefix;
        let config = selector_config(&case);
        if let Some(why) = reasons_text(b, &config) {
            last_reason = why;
            continue;
        }
        let spec = BatchSpec::new(&requests);
        let n = spec.num_tokens();
        let pad_rows = if chance(rng, 250) {
            1 + rng.below(4)
        } else {
            0
        };
        let pad_slot_mapping = pad_rows > 0 && chance(rng, 300);
        let pad_slots = if !encoder && chance(rng, 200) {
            let mut v: Vec<usize> = (0..1 + rng.below(3)).map(|_| rng.below(n)).collect();
            v.sort_unstable();
            v.dedup();
            v
        } else {
            Vec::new()
        };
        let stale = if !encoder && chance(rng, 300) {
            Some(pick(rng, &StaleFill::ALL))
        } else {
            None
        };
        return Ok(ValidCase {
            case,
            spec,
            batch_seed: rng.next_u64(),
            lse: chance(rng, 400),
            pad_rows,
            pad_slot_mapping,
            pad_slots,
            stale,
        });
    }
    Err(last_reason)
}

/// Output rows a backend must not write are preset to this.
const SENTINEL: f32 = 7.5;

/// Runs a valid case: `Ok(Pass)` or `Ok(Fail(..))` for a wrong result, `Err` for an error
/// the backend returned.
pub fn run_valid(b: &dyn AttentionBackend, c: &ValidCase) -> Result<Verdict> {
    let mut batch = RandomBatch::generate(b, &c.case, &c.spec, c.batch_seed)?;
    let want = reference::attention(&batch)?;
    let p = &c.case.params;
    let dtype = c.case.dtype;
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_size);
    let n = c.spec.num_tokens();
    let rows = n + c.pad_rows;
    let device = b.device()?;
    let imp = b.make_impl(p.clone())?;
    let builder = b.make_builder(batch.kv_cache.spec())?;

    if let Some(fill) = c.stale {
        let keep = context_slots(&batch.desc);
        fill_cache_outside(&mut batch.kv_cache, &keep, fill, c.batch_seed ^ 0xdead)?;
    }

    let mut rng = Rng::new(c.batch_seed ^ 0x5eed);
    let mut q = batch.host_query.clone();
    q.extend(rng.normals(c.pad_rows * h * d));
    let mut k = batch.key.to_f32_vec()?;
    let mut v = batch.value.to_f32_vec()?;
    k.extend(rng.normals(c.pad_rows * hkv * d).iter().map(|x| x * 9.0));
    v.extend(rng.normals(c.pad_rows * hkv * d).iter().map(|x| x * 9.0));
    let mut desc = batch.desc.clone();
    if !c.pad_slots.is_empty() {
        // An earlier update wrote these tokens; now they hide behind −1 and their inputs
        // are corrupted, so a write would show in the output.
        let common = CommonAttentionMetadata::new(&device, batch.desc.clone())?;
        let md = builder.build(0, &common, false)?;
        imp.do_kv_cache_update(
            &batch.layer,
            &batch.key,
            &batch.value,
            &mut batch.kv_cache,
            md.as_ref(),
        )?;
        for &t in &c.pad_slots {
            desc.slot_mapping[t] = PAD_SLOT_ID;
            for x in &mut k[t * hkv * d..(t + 1) * hkv * d] {
                *x = -3.0 * *x + 5.0;
            }
            for x in &mut v[t * hkv * d..(t + 1) * hkv * d] {
                *x = -3.0 * *x + 5.0;
            }
        }
    }
    if c.pad_slot_mapping {
        desc.slot_mapping.resize(rows, PAD_SLOT_ID);
    }

    let query = Tensor::from_f32(&device, &q, &[rows, h, d], dtype)?;
    let key = Tensor::from_f32(&device, &k, &[rows, hkv, d], dtype)?;
    let value = Tensor::from_f32(&device, &v, &[rows, hkv, d], dtype)?;
    let mut output =
        Tensor::from_f32(&device, &vec![SENTINEL; rows * h * d], &[rows, h, d], dtype)?;
    let mut lse = if c.lse {
        Some(Tensor::from_f32(
            &device,
            &vec![SENTINEL; h * n],
            &[h, n],
            DType::F32,
        )?)
    } else {
        None
    };

    let common = CommonAttentionMetadata::new(&device, desc.clone())?;
    let md = builder.build(c.case.common_prefix_len, &common, false)?;
    let before = CacheSnapshot::take(&batch.kv_cache)?;
    imp.forward_with_lse(
        &batch.layer,
        &query,
        Some(&key),
        Some(&value),
        &mut batch.kv_cache,
        md.as_ref(),
        &mut output,
        lse.as_mut(),
    )?;
    device.synchronize()?;

    let got = output.to_f32_vec()?;
    if let Some(i) = got[..n * h * d].iter().position(|x| !x.is_finite()) {
        return Ok(Verdict::Fail(format!(
            "output[{i}] (token {}, head {}, dim {}) = {} is not finite",
            i / (h * d),
            i / d % h,
            i % d,
            got[i]
        )));
    }
    let tol = Tolerance::for_dtype(dtype);
    let cmp = reference::compare(&got[..n * h * d], &want.out, tol);
    if !cmp.pass {
        let at = cmp
            .worst_index
            .map(|i| {
                format!(
                    " (token {}, head {}, dim {})",
                    i / (h * d),
                    i / d % h,
                    i % d
                )
            })
            .unwrap_or_default();
        return Ok(Verdict::Fail(format!("output {cmp}{at}")));
    }
    if let Some(i) = got[n * h * d..].iter().position(|&x| x != SENTINEL) {
        return Ok(Verdict::Fail(format!(
            "padding row {} of the output was written ({})",
            n + i / (h * d),
            got[n * h * d + i]
        )));
    }
    if let Some(l) = &lse {
        let cmp = reference::compare(&l.to_f32_vec()?, &want.lse, tol);
        if !cmp.pass {
            return Ok(Verdict::Fail(format!("LSE {cmp}")));
        }
    }
    if !p.attn_type.is_encoder() {
        if let Err(why) = check_only_slots_changed(&before, &batch.kv_cache, &written_slots(&desc))?
        {
            return Ok(Verdict::Fail(why));
        }
    }
    Ok(Verdict::Pass)
}

// ---------------------------------------------------------------------------------------------
// Invalid cases

/// Everything one forward takes, with one thing broken by a mutation.
struct Pipe {
    params: AttentionParams,
    layer: AttentionLayer,
    builder_spec: KvCacheSpec,
    desc: BatchDescription,
    prefix: usize,
    query: Tensor,
    key: Option<Tensor>,
    value: Option<Tensor>,
    output: Tensor,
    lse: Option<Tensor>,
    cache: KvCache,
}

/// How an invalid case ended.
enum Refusal {
    /// Refused with this error.
    Refused(Error),
    /// Everything was accepted.
    Accepted,
    /// `forward` failed but changed the cache.
    CacheChanged(String),
}

impl Pipe {
    /// Builds the impl, builder and metadata, then runs the forward; the first error ends it.
    fn execute(&mut self, b: &dyn AttentionBackend) -> Result<Refusal> {
        let device = b.device()?;
        let imp = match b.make_impl(self.params.clone()) {
            Ok(i) => i,
            Err(e) => return Ok(Refusal::Refused(e)),
        };
        let builder = match b.make_builder(&self.builder_spec) {
            Ok(x) => x,
            Err(e) => return Ok(Refusal::Refused(e)),
        };
        let common = match CommonAttentionMetadata::new(&device, self.desc.clone()) {
            Ok(x) => x,
            Err(e) => return Ok(Refusal::Refused(e)),
        };
        let md = match builder.build(self.prefix, &common, false) {
            Ok(x) => x,
            Err(e) => return Ok(Refusal::Refused(e)),
        };
        let before = CacheSnapshot::take(&self.cache)?;
        let r = imp.forward_with_lse(
            &self.layer,
            &self.query,
            self.key.as_ref(),
            self.value.as_ref(),
            &mut self.cache,
            md.as_ref(),
            &mut self.output,
            self.lse.as_mut(),
        );
        device.synchronize()?;
        match r {
            Ok(()) => Ok(Refusal::Accepted),
            Err(e) => {
                let after = CacheSnapshot::take(&self.cache)?;
                if after != before {
                    let changed = before.changed_slots(&after, &self.cache)?;
                    return Ok(Refusal::CacheChanged(format!(
                        "forward returned `{e}` but changed {} cache slot(s) (first: {:?})",
                        changed.len(),
                        changed.iter().take(4).collect::<Vec<_>>()
                    )));
                }
                Ok(Refusal::Refused(e))
            }
        }
    }
}

/// What an invalid case breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// A size that overflows: refused before any device sees it (a device error is fine).
    Overflow,
    /// Anything else: refused on the host.
    Host,
}

fn run_invalid(
    b: &dyn AttentionBackend,
    rng: &mut Rng,
    limits: &Limits,
    label: &mut String,
) -> Verdict {
    let base = match gen_invalid_base(b, rng, limits) {
        Ok(x) => x,
        Err(why) => {
            *label = "invalid (no base configuration)".into();
            return Verdict::Skip(why);
        }
    };
    *label = "invalid (setting up)".into();
    let (what, class, outcome) = match mutate_and_run(b, rng, base, label) {
        Ok(x) => x,
        Err(e) => {
            return Verdict::Fail(format!("setting up the invalid case failed: {e}"));
        }
    };
    *label = format!("invalid: {what}");
    match outcome {
        Refusal::Accepted => Verdict::Fail("accepted (expected a typed error)".into()),
        Refusal::CacheChanged(why) => Verdict::Fail(why),
        Refusal::Refused(Error::Device { backend, message }) if class == Class::Host => {
            Verdict::Fail(format!(
                "refused only by the device ({backend}: {message}); expected a host-side check"
            ))
        }
        Refusal::Refused(_) => Verdict::Pass,
    }
}

/// A valid small batch to break: its case and generated tensors.
struct Base {
    case: CaseConfig,
    batch: RandomBatch,
    heads: Vec<usize>,
    blocks: Vec<usize>,
}

fn gen_invalid_base(
    b: &dyn AttentionBackend,
    rng: &mut Rng,
    limits: &Limits,
) -> std::result::Result<Base, String> {
    let caps = b.capabilities().clone();
    let dtypes = activation_dtypes(b);
    let heads = supported_head_sizes(b, limits);
    let blocks = supported_block_sizes(b, limits);
    if dtypes.is_empty() || heads.is_empty() || blocks.is_empty() || caps.kv_cache_dtypes.is_empty()
    {
        return Err("no dtype / head size / block size of the generator is supported".into());
    }
    let mut why = String::new();
    for _ in 0..4 {
        let d = pick(rng, &heads);
        let hkv = 1 + rng.below(limits.max_kv_heads);
        let h = hkv * (1 + rng.below(limits.max_group));
        let mut params = AttentionParams::new(h, d, hkv);
        params.kv_cache_dtype = pick(rng, &caps.kv_cache_dtypes);
        let case = CaseConfig::new(params, pick(rng, &dtypes), pick(rng, &blocks));
        if let Some(r) = reasons_text(b, &selector_config(&case)) {
            why = r;
            continue;
        }
        let bs = case.block_size;
        // Two or three requests, the first with context and more than one token.
        let mut requests = vec![(2 + rng.below(3), 2 + rng.below(3) + bs + rng.below(bs))];
        for _ in 0..1 + rng.below(2) {
            let q = 1 + rng.below(4);
            requests.push((q, q + rng.below(2 * bs)));
        }
        let spec = BatchSpec::new(&requests);
        let batch = RandomBatch::generate(b, &case, &spec, rng.next_u64())
            .map_err(|e| format!("base batch: {e}"))?;
        return Ok(Base {
            case,
            batch,
            heads,
            blocks,
        });
    }
    Err(why)
}

/// Number of mutation kinds in [`mutate_and_run`].
const MUTATIONS: usize = 44;

/// A wrapped element count (and byte count) that a buggy size check would allocate: small
/// enough that accepting it never allocates much.
fn wraps_small(dims: &[usize], elem: usize) -> bool {
    let checked = dims.iter().try_fold(1usize, |a, &x| a.checked_mul(x));
    let wrapped = dims.iter().fold(1usize, |a, &x| a.wrapping_mul(x));
    checked.is_none() && wrapped.wrapping_mul(elem) <= 1 << 26
}

/// A constructor call that must fail (run after the label is set, so a panic names it).
type Construct<'a> = Box<dyn FnOnce() -> Result<()> + 'a>;

fn mutate_and_run(
    b: &dyn AttentionBackend,
    rng: &mut Rng,
    base: Base,
    label: &mut String,
) -> Result<(String, Class, Refusal)> {
    let device = b.device()?;
    let Base {
        case,
        batch,
        heads,
        blocks,
    } = base;
    let p = case.params.clone();
    let dtype = case.dtype;
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_size);
    let bs = case.block_size;
    let n = batch.spec.num_tokens();
    let n_reqs = batch.spec.requests.len();
    let spec = *batch.kv_cache.spec();
    let num_blocks = batch.kv_cache.num_blocks();
    let zeros = |shape: &[usize], dt: DType| Tensor::zeros(&device, shape, dt);
    let other_act = |dt: DType| -> DType {
        match dt {
            DType::F32 => DType::F16,
            DType::F16 => DType::Bf16,
            _ => DType::F32,
        }
    };
    let mut pipe = Pipe {
        params: p.clone(),
        layer: batch.layer.clone(),
        builder_spec: spec,
        desc: batch.desc.clone(),
        prefix: 0,
        query: batch.query.clone(),
        key: Some(batch.key.clone()),
        value: Some(batch.value.clone()),
        output: batch.empty_output()?,
        lse: None,
        cache: batch.kv_cache.clone(),
    };
    let tag = format!("{dtype}/{} hd{d} bs{bs} ({h},{hkv}) n{n}", p.kv_cache_dtype);
    let kind = rng.below(MUTATIONS);
    let r = rng.below(n_reqs);
    let w = pipe.desc.max_blocks_per_req;
    let mut class = Class::Host;

    // Mutations checked at construction (the pipe never runs): overflowing sizes and
    // layer scales.
    let dev = &device;
    let constructed: Option<(String, Construct)> = match kind {
        0 => {
            let dims = [1usize << 62, 1, 32];
            Some((
                format!("Tensor::from_f32 with shape {dims:?} and an empty slice"),
                Box::new(move || Tensor::from_f32(dev, &[], &dims, dtype).map(|_| ())),
            ))
        }
        1 => {
            let dims = [(1usize << 63) | 1, 2, h, d];
            Some((
                format!("Tensor::zeros with shape {dims:?} (element count wraps)"),
                Box::new(move || zeros(&dims, dtype).map(|_| ())),
            ))
        }
        2 => {
            let dims = [1usize << 62];
            Some((
                format!("Tensor::zeros of {dims:?} f32 (byte count overflows)"),
                Box::new(move || zeros(&dims, DType::F32).map(|_| ())),
            ))
        }
        3 | 4 => {
            // A block count whose cache size wraps around usize to a small number (a buggy
            // check would allocate that): 2^62 always does for an even head size.
            let wanted = if kind == 3 {
                1usize << 62
            } else {
                (1usize << 60) + rng.below(3)
            };
            let blocks_n = if wraps_small(&[wanted, 2, bs, hkv, d], 4) {
                wanted
            } else {
                1usize << 62
            };
            Some((
                format!("KvCache::new with {blocks_n} blocks"),
                Box::new(move || KvCache::new(b, spec, blocks_n).map(|_| ())),
            ))
        }
        5 => {
            let dims = [1usize << 33, 1usize << 31, 1];
            Some((
                format!("Tensor::from_i32 with shape {dims:?} and an empty slice"),
                Box::new(move || Tensor::from_i32(dev, &[], &dims).map(|_| ())),
            ))
        }
        6 => {
            let s = pick(rng, &[f32::NAN, 0.0, -1.0, f32::INFINITY]);
            Some((
                format!("AttentionLayer k_scale {s}"),
                Box::new(move || AttentionLayer::new("fuzz").with_scales(s, 1.0).map(|_| ())),
            ))
        }
        _ => None,
    };
    if let Some((what, construct)) = constructed {
        *label = format!("invalid: {what} [{tag}]");
        let res = construct();
        let class = if kind <= 5 {
            Class::Overflow
        } else {
            Class::Host
        };
        let outcome = match res {
            Ok(()) => Refusal::Accepted,
            Err(e) => Refusal::Refused(e),
        };
        return Ok((format!("{what} [{tag}]"), class, outcome));
    }

    let what: String = match kind {
        // Metadata.
        7 => {
            let i = rng.below((batch.desc.seq_lens[r].max(1) as usize).div_ceil(bs));
            let v = (num_blocks + rng.below(5)) as i32;
            pipe.desc.block_table[r * w + i] = v;
            format!("block_table[{r}][{i}] = {v} with {num_blocks} blocks")
        }
        8 => {
            let i = rng.below((batch.desc.seq_lens[r].max(1) as usize).div_ceil(bs));
            let v = -1 - rng.below(100) as i32;
            pipe.desc.block_table[r * w + i] = v;
            format!("block_table[{r}][{i}] = {v}")
        }
        9 => {
            let t = rng.below(n);
            let v = (num_blocks * bs + rng.below(3 * bs)) as i64;
            pipe.desc.slot_mapping[t] = v;
            format!("slot_mapping[{t}] = {v} beyond {num_blocks} blocks of {bs}")
        }
        10 => {
            let t = rng.below(n);
            let v = -2 - rng.below(1000) as i64;
            pipe.desc.slot_mapping[t] = v;
            format!("slot_mapping[{t}] = {v}")
        }
        11 => {
            let q = batch.spec.requests[0].0;
            let v = rng.below(q) as i32;
            pipe.desc.seq_lens[0] = v;
            format!("seq_lens[0] = {v} < query_len {q}")
        }
        12 => {
            let v = -1 - rng.below(50) as i32;
            pipe.desc.seq_lens[r] = v;
            format!("seq_lens[{r}] = {v}")
        }
        13 => {
            let i = 1 + rng.below(n_reqs - 1).min(n_reqs - 2);
            let v = pipe.desc.query_start_loc[i + 1] + 1 + rng.below(3) as i32;
            pipe.desc.query_start_loc[i] = v;
            format!("query_start_loc[{i}] = {v} (non-monotonic)")
        }
        14 => {
            pipe.desc.query_start_loc[0] = 1;
            "query_start_loc[0] = 1".into()
        }
        15 => {
            pipe.desc.query_start_loc.clear();
            "empty query_start_loc".into()
        }
        16 => {
            pipe.desc.seq_lens.push(1 + rng.below(8) as i32);
            "seq_lens longer than the request count".into()
        }
        17 => {
            pipe.desc.seq_lens.pop();
            "seq_lens shorter than the request count".into()
        }
        18 => {
            pipe.desc.slot_mapping.pop();
            "slot_mapping shorter than the token count".into()
        }
        19 => {
            pipe.desc.block_table.pop();
            "block_table one entry short".into()
        }
        20 => {
            pipe.desc.block_table.push(1);
            "block_table one entry long".into()
        }
        21 => {
            pipe.desc.block_size = 0;
            "block_size 0".into()
        }
        22 => {
            let v = (w * bs + 1 + rng.below(bs)) as i32;
            pipe.desc.seq_lens[r] = v;
            format!("seq_lens[{r}] = {v} needs more than the {w} blocks of a block-table row")
        }
        23 => {
            let v = pick(rng, &[i32::MAX, i32::MAX - 1, (i32::MAX / bs as i32) + 1]);
            pipe.desc.block_table[r * w] = v;
            format!("block_table[{r}][0] = {v} (block × block_size near or past i32)")
        }
        24 => {
            let v = usize::MAX / 2 + 1 + rng.below(8);
            pipe.desc.max_blocks_per_req = v;
            class = Class::Overflow;
            format!("max_blocks_per_req = {v} (num_reqs × width overflows)")
        }
        25 => {
            pipe.desc.is_prefilling = Some(vec![true; n_reqs + 1]);
            "is_prefilling longer than the request count".into()
        }
        26 => {
            // In range for the metadata alone, beyond the cache.
            let v = (num_blocks + rng.below(4)) as i32;
            pipe.desc.block_table[r * w] = v;
            let t = rng.below(n);
            let slot = (v as usize * bs + rng.below(bs)) as i64;
            if chance(rng, 500) {
                pipe.desc.slot_mapping[t] = slot;
                format!("block_table[{r}][0] = {v} and slot_mapping[{t}] = {slot} beyond the cache's {num_blocks} blocks")
            } else {
                format!("block_table[{r}][0] = {v} beyond the cache's {num_blocks} blocks")
            }
        }
        // Tensors.
        27 => {
            pipe.query = zeros(&[n, h + 1, d], dtype)?;
            pipe.output = zeros(&[n, h + 1, d], dtype)?;
            format!("query and output with {} heads instead of {h}", h + 1)
        }
        28 => {
            pipe.query = zeros(&[n, h, d + 4], dtype)?;
            pipe.output = zeros(&[n, h, d + 4], dtype)?;
            format!("query and output of head size {} instead of {d}", d + 4)
        }
        29 => {
            pipe.query = zeros(&[n - 1, h, d], dtype)?;
            pipe.output = zeros(&[n - 1, h, d], dtype)?;
            format!("query of {} rows for {n} tokens", n - 1)
        }
        30 => {
            pipe.query = zeros(&[n, h * d], dtype)?;
            pipe.output = zeros(&[n, h * d], dtype)?;
            "rank-2 query and output".into()
        }
        31 => {
            let dt = pick(rng, &[DType::I32, DType::I64, DType::Fp8E4m3]);
            pipe.query = zeros(&[n, h, d], dt)?;
            pipe.output = zeros(&[n, h, d], dt)?;
            format!("{dt} query and output")
        }
        32 => {
            let dt = other_act(dtype);
            pipe.output = zeros(&[n, h, d], dt)?;
            format!("{dt} output for a {dtype} query")
        }
        33 => {
            pipe.output = zeros(&[n + 1 + rng.below(3), h, d], dtype)?;
            "output with more rows than the query".into()
        }
        34 => {
            // The transposed shape is a wrong one only when the two sizes differ.
            let transposed = if n != h { [n, h] } else { [h + 2, n] };
            let shape = pick(rng, &[transposed, [h, n + 1], [h + 1, n]]);
            pipe.lse = Some(zeros(&shape, DType::F32)?);
            format!("LSE of shape {shape:?} (expected [{h}, {n}])")
        }
        35 => {
            let dt = pick(rng, &[DType::F16, DType::Bf16, DType::I32]);
            pipe.lse = Some(zeros(&[h, n], dt)?);
            format!("{dt} LSE")
        }
        36 => {
            let shape = pick(rng, &[[n, hkv + 1, d], [n, hkv, d + 4], [n - 1, hkv, d]]);
            let t = zeros(&shape, dtype)?;
            if chance(rng, 500) {
                pipe.key = Some(t);
                format!("key of shape {shape:?} (expected [{n}, {hkv}, {d}])")
            } else {
                pipe.value = Some(t);
                format!("value of shape {shape:?} (expected [{n}, {hkv}, {d}])")
            }
        }
        37 => {
            let dt = other_act(dtype);
            let k = batch.key.to_f32_vec()?;
            let v = batch.value.to_f32_vec()?;
            pipe.key = Some(Tensor::from_f32(&device, &k, &[n, hkv, d], dt)?);
            pipe.value = Some(Tensor::from_f32(&device, &v, &[n, hkv, d], dt)?);
            format!("{dt} key and value for a {dtype} query")
        }
        38 => {
            if chance(rng, 500) {
                pipe.value = None;
                "key without value".into()
            } else {
                pipe.key = None;
                "value without key".into()
            }
        }
        // Caches.
        39 => {
            let other = match rng.below(3) {
                0 => KvCacheSpec {
                    num_kv_heads: hkv * 2,
                    ..spec
                },
                1 => KvCacheSpec {
                    head_size: heads.iter().copied().find(|&x| x != d).unwrap_or(d + 8),
                    ..spec
                },
                _ => KvCacheSpec {
                    block_size: blocks.iter().copied().find(|&x| x != bs).unwrap_or(bs * 2),
                    ..spec
                },
            };
            pipe.cache = match KvCache::new(b, other, num_blocks) {
                Ok(c) => c,
                Err(e) => {
                    return Ok((
                        format!("cache {other:?} [{tag}]"),
                        class,
                        Refusal::Refused(e),
                    ))
                }
            };
            format!(
                "cache of {} heads × {} with blocks of {} for a layer of {hkv} × {d}, blocks of {bs}",
                other.num_kv_heads, other.head_size, other.block_size
            )
        }
        40 => {
            let storage = spec.storage_dtype();
            let other = CacheDType::ALL
                .iter()
                .copied()
                .filter(|c| c.storage_dtype(dtype) != storage)
                .collect::<Vec<_>>();
            let c = pick(rng, &other);
            let other_spec = KvCacheSpec {
                cache_dtype: c,
                ..spec
            };
            pipe.cache = KvCache::new(b, other_spec, num_blocks)?;
            format!(
                "cache of {} for kv_cache_dtype {} with {dtype} activations",
                other_spec.storage_dtype(),
                p.kv_cache_dtype
            )
        }
        41 => {
            // Fewer blocks than the highest block id the batch uses.
            let top = (0..n_reqs)
                .flat_map(|q| {
                    let used = (batch.desc.seq_lens[q].max(0) as usize).div_ceil(bs);
                    batch.desc.block_table[q * w..q * w + used].to_vec()
                })
                .max()
                .unwrap_or(1)
                .max(1) as usize;
            let nb = 1 + rng.below(top);
            pipe.cache = KvCache::new(b, spec, nb)?;
            format!("cache of {nb} blocks for a batch that uses block {top}")
        }
        // Parameters and builder.
        42 => {
            let (what, params) = match rng.below(9) {
                0 => {
                    let s = pick(rng, &[f32::NAN, f32::INFINITY, 0.0, -0.5]);
                    (
                        format!("scale {s}"),
                        AttentionParams {
                            scale: s,
                            ..p.clone()
                        },
                    )
                }
                1 => (
                    "sliding window 0".to_string(),
                    AttentionParams {
                        sliding_window: Some(0),
                        ..p.clone()
                    },
                ),
                2 => {
                    let len = pick(rng, &[h - 1, h + 1, 2 * h]);
                    (
                        format!("{len} ALiBi slopes for {h} heads"),
                        AttentionParams {
                            alibi_slopes: Some(vec![0.25; len]),
                            ..p.clone()
                        },
                    )
                }
                3 => {
                    let len = pick(rng, &[h - 1, h + 1, 0]);
                    (
                        format!("{len} sinks for {h} heads"),
                        AttentionParams {
                            sinks: Some(vec![1.0; len]),
                            ..p.clone()
                        },
                    )
                }
                4 => (
                    format!("{h} heads over {} KV heads", h + 1),
                    AttentionParams {
                        num_kv_heads: h + 1,
                        ..p.clone()
                    },
                ),
                5 => (
                    "0 KV heads".to_string(),
                    AttentionParams {
                        num_kv_heads: 0,
                        ..p.clone()
                    },
                ),
                6 => {
                    let c = pick(rng, &[-1.0f32, f32::NAN, f32::INFINITY]);
                    (
                        format!("soft cap {c}"),
                        AttentionParams {
                            logits_soft_cap: Some(c),
                            ..p.clone()
                        },
                    )
                }
                7 => (
                    "head size 0".to_string(),
                    AttentionParams {
                        head_size: 0,
                        ..p.clone()
                    },
                ),
                _ => {
                    let bad = [3usize, 7, 1000, 4097]
                        .into_iter()
                        .find(|&x| !b.capabilities().head_sizes.contains(x))
                        .unwrap_or(0);
                    (
                        format!("unsupported head size {bad}"),
                        AttentionParams {
                            head_size: bad,
                            ..p.clone()
                        },
                    )
                }
            };
            pipe.params = params;
            what
        }
        _ => match rng.below(3) {
            0 => {
                let other = blocks.iter().copied().find(|&x| x != bs).unwrap_or(bs * 2);
                pipe.builder_spec = KvCacheSpec {
                    block_size: other,
                    ..spec
                };
                format!("metadata of block size {bs} for a builder of {other}")
            }
            1 if b.capabilities().supports_cascade && bs > 1 => {
                let v = bs / 2 + bs * rng.below(2);
                pipe.prefix = v;
                format!("cascade prefix {v}, not a multiple of the block size {bs}")
            }
            _ if b.capabilities().supports_cascade => {
                let min_ctx = batch
                    .spec
                    .requests
                    .iter()
                    .map(|&(q, s)| s - q)
                    .min()
                    .unwrap_or(0);
                let v = (min_ctx / bs + 1) * bs;
                pipe.prefix = v;
                format!("cascade prefix {v} beyond the smallest context {min_ctx}")
            }
            _ => {
                pipe.desc.slot_mapping[0] = -7;
                "slot_mapping[0] = -7".into()
            }
        },
    };
    *label = format!("invalid: {what} [{tag}]");
    let outcome = pipe.execute(b)?;
    Ok((format!("{what} [{tag}]"), class, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;

    #[test]
    fn profiles_parse_and_seeds_are_sequential() {
        assert_eq!("CI".parse::<Profile>().unwrap(), Profile::Ci);
        assert_eq!("long".parse::<Profile>().unwrap(), Profile::Long);
        assert!("short".parse::<Profile>().is_err());
        assert_eq!(case_seed(u64::MAX, 2), 1);
        assert!(reproduce_command("CPU", 7, Profile::Ci).contains("--seed 7 --iterations 1"));
    }

    #[test]
    fn wrapping_sizes_are_detected() {
        assert!(wraps_small(&[1 << 62, 1, 32], 4));
        assert!(!wraps_small(&[4, 4], 4));
        // Wraps, but to a size that would really be allocated.
        assert!(!wraps_small(&[(1 << 63) | 1, 1 << 30], 4));
    }

    #[test]
    fn stale_fill_keeps_context_slots() {
        let spec = KvCacheSpec {
            block_size: 4,
            num_kv_heads: 2,
            head_size: 8,
            dtype: DType::F16,
            cache_dtype: CacheDType::Auto,
        };
        let dev = Device::cpu();
        let mut cache = KvCache::with_layout(&dev, spec, 3, crate::backend::KvLayout::Hnd).unwrap();
        let before = CacheSnapshot::take(&cache).unwrap();
        let keep: BTreeSet<usize> = [4, 5, 9].into_iter().collect();
        fill_cache_outside(&mut cache, &keep, StaleFill::Nan, 1).unwrap();
        let after = CacheSnapshot::take(&cache).unwrap();
        let changed = before.changed_slots(&after, &cache).unwrap();
        let want: Vec<usize> = (0..12).filter(|s| !keep.contains(s)).collect();
        assert_eq!(changed, want);
        assert!(cache
            .data()
            .to_f32_vec()
            .unwrap()
            .iter()
            .any(|x| x.is_nan()));
    }
}
