//! Kernels must be immune to whatever the KV cache holds outside the slots a batch may read.
//!
//! A serving engine reuses cache blocks, so a slot the current batch may not read (the null
//! block, the tail of a request's last block, blocks of other requests, slots past
//! `seq_len`) holds anything: NaN, ±inf, huge values. Each case here fills every slot of the
//! cache with a poison pattern, writes the batch's real context on top (the cache state a
//! previous step would have left), runs a random mixed batch and compares with the f64
//! reference computed from the real keys and values only. Outputs must be finite and within
//! the per-dtype tolerance of `tests/attention_correctness.rs`.
//!
//! The second test drives logits to |s| ≈ 30 (large head sizes, scaled queries, a soft cap
//! case) in f16 and bf16: reduced-precision partial sums of Q·Kᵀ lose absolute precision as
//! the logits grow, which the softmax turns into output error.

#[macro_use]
mod common;

use common::{ensure, fail, for_each_case, CaseInfo, Outcome};
use half::{bf16, f16};
use polyattn::device::CpuStorage;
use polyattn::reference::{self, ReferenceOutput};
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch, Rng, Tolerance};
use polyattn::{
    AttentionParams, BackendRef, CacheDType, CommonAttentionMetadata, DType, Device, KvCache,
    KvCacheSpec, SelectorConfig, Tensor,
};

/// What the slots outside the batch's context hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Poison {
    Nan,
    PosInf,
    NegInf,
    /// The largest finite magnitude of the storage dtype (f16 6e4, bf16 / f32 3e38, fp8 max).
    Huge,
    /// +inf in block 0 (the null block), token 0 only; the rest of the cache is zero.
    NullSlotInf,
    /// No poison: the cache as the batch generator leaves it (zeros outside the context).
    Clean,
}

const POISONS: [Poison; 4] = [Poison::Nan, Poison::PosInf, Poison::NegInf, Poison::Huge];

impl Poison {
    fn name(self) -> &'static str {
        match self {
            Poison::Nan => "NaN",
            Poison::PosInf => "+inf",
            Poison::NegInf => "-inf",
            Poison::Huge => "huge",
            Poison::NullSlotInf => "+inf at block 0 token 0",
            Poison::Clean => "no",
        }
    }

    /// The value written (as f32; converted to the storage dtype by [`fill`]).
    fn value(self, storage: DType) -> f32 {
        match self {
            Poison::Nan => f32::NAN,
            Poison::PosInf | Poison::NullSlotInf => f32::INFINITY,
            Poison::NegInf => f32::NEG_INFINITY,
            Poison::Clean => 0.0,
            Poison::Huge => match storage {
                DType::F16 => 6.0e4,
                _ => 3.0e38,
            },
        }
    }
}

/// Writes `x` raw (no scale, no saturation) into element `i` of host cache storage. fp8
/// E4M3 has no infinities: ±inf become its NaN bytes; Huge is its largest finite byte.
fn poke(st: &mut CpuStorage, storage: DType, i: usize, x: f32) {
    match st {
        CpuStorage::F32(v) => v[i] = x,
        CpuStorage::F16(v) => v[i] = f16::from_f32(x),
        CpuStorage::Bf16(v) => v[i] = bf16::from_f32(x),
        CpuStorage::U8(v) => {
            let sign = if x.is_sign_negative() { 0x80 } else { 0 };
            v[i] = sign
                | match (storage, x.is_finite(), x.is_nan()) {
                    (_, _, true) => 0x7f,
                    (DType::Fp8E4m3, false, _) => 0x7f,
                    (DType::Fp8E4m3, true, _) => 0x7e,
                    (_, false, _) => 0x7c,
                    (_, true, _) => 0x7b,
                };
        }
        CpuStorage::I32(_) | CpuStorage::I64(_) => unreachable!("float cache"),
    }
}

/// The batch's cache with `poison` in every slot that does not hold a request's visible
/// context: the null block, unused blocks, the tails of last blocks, context keys outside
/// every query's sliding window, and the new tokens' slots (which the forward's cache update
/// overwrites with their real keys and values).
fn poison_cache(batch: &RandomBatch, poison: Poison, device: &Device) -> polyattn::Result<KvCache> {
    let mut host = batch.kv_cache.to_device(&Device::cpu())?;
    let spec = *host.spec();
    let (bs, hkv, d) = (spec.block_size, spec.num_kv_heads, spec.head_size);
    let storage = spec.storage_dtype();
    let mut context = vec![false; host.num_blocks() * bs];
    let width = batch.desc.max_blocks_per_req;
    for (r, &(q_len, s_len)) in batch.spec.requests.iter().enumerate() {
        let row = &batch.desc.block_table[r * width..(r + 1) * width];
        let ctx = s_len - q_len;
        // A context key no query of the request can see (out of its sliding window) may sit
        // in a freed block: it is poisoned too.
        let window = batch.case.params.sliding_window;
        for pos in (0..ctx).filter(|&j| window.is_none_or(|w| ctx - j < w)) {
            context[row[pos / bs] as usize * bs + pos % bs] = true;
        }
    }
    let x = poison.value(storage);
    for block in 0..host.num_blocks() {
        for token in 0..bs {
            let slot = block * bs + token;
            let hit = match poison {
                Poison::NullSlotInf => slot == 0,
                Poison::Clean => false,
                _ => !context[slot],
            };
            if !hit {
                continue;
            }
            for kv in 0..2 {
                for head in 0..hkv {
                    let o = host.offset(block, kv, token, head);
                    let st = host.data_mut().as_cpu_mut().expect("host cache");
                    for i in o..o + d {
                        poke(st, storage, i, x);
                    }
                }
            }
        }
    }
    host.to_device(device)
}

/// One case: a layer, a batch, the poison.
#[derive(Clone, Debug)]
struct Case {
    label: String,
    case: CaseConfig,
    spec: BatchSpec,
    seed: u64,
    poison: Poison,
    /// Scale applied to the random queries (large logits); 1 keeps them as generated.
    query_scale: f32,
}

impl Case {
    fn info(&self) -> CaseInfo {
        let p = &self.case.params;
        CaseInfo {
            label: format!("{} (seed {})", self.label, self.seed),
            config: Some(SelectorConfig::for_layer(
                p,
                self.case.dtype,
                Some(self.case.block_size as u32),
            )),
            cascade: self.case.common_prefix_len > 0,
            graphs: false,
        }
    }
}

fn params(h: usize, hkv: usize, d: usize, cache: CacheDType) -> AttentionParams {
    AttentionParams {
        kv_cache_dtype: cache,
        ..AttentionParams::new(h, d, hkv)
    }
}

/// vLLM's ALiBi slopes for a power-of-two head count (the tests below use 2, 4, 8 or 16
/// slopes; other counts take the next power of two's first `n`).
fn alibi_slopes(n: usize) -> Vec<f32> {
    let closest = n.next_power_of_two();
    let base = 2f64.powf(-(2f64.powf(-((closest as f64).log2() - 3.0))));
    (1..=n).map(|i| base.powi(i as i32) as f32).collect()
}

/// Runs one case on one backend: poisoned cache, forward, compare.
fn run_case(backend: &BackendRef, c: &Case) -> Outcome {
    let b = backend.as_ref();
    let mut batch = RandomBatch::generate(b, &c.case, &c.spec, c.seed)?;
    let device = b.device()?;
    if c.query_scale != 1.0 {
        let dt = c.case.dtype;
        for x in &mut batch.host_query {
            *x = polyattn::testing::round_to(dt, *x * c.query_scale);
        }
        batch.query = Tensor::from_f32(&device, &batch.host_query, batch.query.shape(), dt)?;
    }
    let want = reference::attention(&batch)?;
    batch.kv_cache = poison_cache(&batch, c.poison, &device)?;

    let p = &c.case.params;
    let dtype = c.case.dtype;
    let kv_spec = KvCacheSpec {
        block_size: c.case.block_size,
        num_kv_heads: p.num_kv_heads,
        head_size: p.head_size,
        dtype,
        cache_dtype: p.kv_cache_dtype,
    };
    let imp = b.make_impl(p.clone())?;
    let builder = b.make_builder(&kv_spec)?;
    let mut output = batch.empty_output()?;
    let common = CommonAttentionMetadata::new(&device, batch.desc.clone())?;
    let md = builder.build(c.case.common_prefix_len, &common, false)?;
    imp.forward(
        &batch.layer,
        &batch.query,
        Some(&batch.key),
        Some(&batch.value),
        &mut batch.kv_cache,
        md.as_ref(),
        &mut output,
    )?;
    device.synchronize()?;
    check_output(&output.to_f32_vec()?, &want, dtype)
}

fn check_output(got: &[f32], want: &ReferenceOutput, dtype: DType) -> Outcome {
    let (h, d) = (want.num_heads, want.head_size);
    let at = |i: usize| format!("token {}, head {}, dim {}", i / (h * d), i / d % h, i % d);
    let bad = got.iter().filter(|x| !x.is_finite()).count();
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        return Err(fail(format!(
            "{bad} of {} outputs not finite; first output[{i}] ({}) = {}",
            got.len(),
            at(i),
            got[i]
        )));
    }
    let cmp = reference::compare(got, &want.out, Tolerance::for_dtype(dtype));
    ensure(cmp.pass, || {
        let w = cmp
            .worst_index
            .map(|i| format!(" ({})", at(i)))
            .unwrap_or_default();
        format!("output {cmp}{w}")
    })
}

/// Batch shapes: decodes, short prefills, chunked prefills with cached context, mixed.
fn batch_shape(kind: usize, bs: usize) -> (&'static str, BatchSpec) {
    match kind % 4 {
        0 => (
            "decode",
            BatchSpec::new(&[(1, 1), (1, bs + 3), (1, 2 * bs), (1, 3 * bs - 5)]),
        ),
        1 => (
            "mixed",
            BatchSpec::new(&[(1, 2 * bs + 1), (5, 5), (1, 1), (11, bs + 11)]),
        ),
        2 => (
            "chunked",
            BatchSpec::new(&[(9, 2 * bs + 9), (bs / 2 + 3, bs + bs / 2 + 3)]),
        ),
        _ => (
            "1+8 chunk beside a prefill",
            BatchSpec::new(&[(1, bs + 7), (8, bs + 13), (17, 17)]),
        ),
    }
}

/// The poisoned-cache grid: every poison with every (activation, cache) pair of the sample,
/// head sizes, block sizes, head layouts, batch kinds and features cycled through.
fn stale_cases() -> Vec<Case> {
    let pairs = [
        (DType::F32, CacheDType::Auto),
        (DType::F16, CacheDType::Auto),
        (DType::Bf16, CacheDType::Auto),
        (DType::F16, CacheDType::Fp8E4m3),
        (DType::Bf16, CacheDType::Fp8E4m3),
        (DType::F32, CacheDType::F16),
        (DType::F32, CacheDType::Bf16),
        (DType::F16, CacheDType::F16),
    ];
    let heads = [(8, 2), (14, 2), (4, 4), (6, 1)];
    let head_sizes = [64, 112, 128];
    let blocks = [16, 64];
    let mut rng = Rng::new(0x57a1e);
    let mut cases = Vec::new();
    for (i, &(dt, cache)) in pairs.iter().enumerate() {
        for (j, &poison) in POISONS.iter().enumerate() {
            let n = i * POISONS.len() + j;
            let (h, hkv) = heads[(i + j) % heads.len()];
            let d = head_sizes[(i + 2 * j) % head_sizes.len()];
            let bs = blocks[(i + j) % blocks.len()];
            let (kind, spec) = batch_shape(i + 3 * j, bs);
            let mut p = params(h, hkv, d, cache);
            let mut feats = Vec::new();
            // One feature per case, cycling; ALiBi + sinks together as in the issue.
            let mut prefix = 0;
            match n % 6 {
                0 => {
                    p.alibi_slopes = Some(alibi_slopes(h));
                    p.sinks = Some((0..h).map(|_| 15.0 * rng.uniform() as f32).collect());
                    feats.push("alibi+sinks");
                }
                1 => {
                    p.sliding_window = Some(bs / 2 + 3);
                    feats.push("window");
                }
                2 => {
                    p.scale = 20.0 / (d as f32).sqrt();
                    p.logits_soft_cap = Some(30.0);
                    feats.push("soft cap");
                }
                3 if kind != "1+8 chunk beside a prefill" => {
                    prefix = bs;
                    feats.push("cascade");
                }
                4 => {
                    p.sinks = Some((0..h).map(|_| 5.0 * rng.uniform() as f32).collect());
                    feats.push("sinks");
                }
                _ => {}
            }
            let mut cc = CaseConfig::new(p, dt, bs);
            let spec = if prefix > 0 {
                // Every request's context covers the shared prefix.
                cc.common_prefix_len = prefix;
                BatchSpec::new(&[(1, prefix + 9), (5, prefix + bs + 2), (1, prefix + 1)])
            } else {
                spec
            };
            cases.push(Case {
                label: format!(
                    "{} poison, {dt}/{cache} hd{d} bs{bs} ({h},{hkv}) {kind} {}",
                    poison.name(),
                    feats.join(" ")
                ),
                case: cc,
                spec,
                seed: 18_000 + n as u64,
                poison,
                query_scale: 1.0,
            });
        }
    }
    // The case from the issue: one decode of seq_len 21 whose blocks are not block 0, with
    // +inf at block 0 token 0 (what masked key lanes of a partial last block point at).
    cases.push(Case {
        label: "issue case: f32 hd32 bs16 (1,1) decode seq_len 21".into(),
        case: CaseConfig::new(params(1, 1, 32, CacheDType::Auto), DType::F32, 16),
        spec: BatchSpec::new(&[(1, 21)]),
        seed: 18_500,
        poison: Poison::NullSlotInf,
        query_scale: 1.0,
    });
    cases
}

#[test]
fn stale_cache_contents_never_reach_the_output() {
    let cases = stale_cases();
    for poison in POISONS {
        assert!(cases.iter().any(|c| c.poison == poison));
    }
    for_each_case("stale_cache", &cases, Case::info, run_case);
}

/// Large logits in f16 / bf16: queries scaled so that |s| reaches ~30.
fn large_logit_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let shapes: [(usize, Option<f32>, f32); 3] =
        [(136, None, 6.0), (256, None, 5.0), (256, Some(10.0), 5.0)];
    for (i, &(d, cap, qs)) in shapes.iter().enumerate() {
        for (j, (dt, cache)) in [
            (DType::F16, CacheDType::Auto),
            (DType::Bf16, CacheDType::Auto),
        ]
        .into_iter()
        .enumerate()
        {
            let mut p = params(4, 2, d, cache);
            p.logits_soft_cap = cap;
            let cap_label = cap.map(|c| format!(" soft cap {c}")).unwrap_or_default();
            cases.push(Case {
                label: format!("{dt} hd{d} |logit| ~30{cap_label} prefill 200"),
                case: CaseConfig::new(p, dt, 16),
                spec: BatchSpec::new(&[(120, 200), (1, 75)]),
                seed: 18_700 + (i * 2 + j) as u64,
                poison: Poison::Clean,
                query_scale: qs,
            });
        }
    }
    cases
}

#[test]
fn large_logits_keep_reduced_precision_prefill_in_tolerance() {
    let cases = large_logit_cases();
    // The cases must reach the logit range they claim (without a cap).
    for c in cases
        .iter()
        .filter(|c| c.case.params.logits_soft_cap.is_none())
    {
        let b = polyattn::backends::cpu::CpuBackend::default();
        let mut batch = RandomBatch::generate(&b, &c.case, &c.spec, c.seed).expect("batch");
        let d = c.case.params.head_size;
        for x in &mut batch.host_query {
            *x *= c.query_scale;
        }
        let max_logit = max_abs_logit(&batch, d);
        assert!(
            (20.0..60.0).contains(&max_logit),
            "{}: max |logit| {max_logit:.1}, expected ~30",
            c.label
        );
    }
    for_each_case("large_logits", &cases, Case::info, run_case);
}

/// Largest |q·k|·scale over the first request's queries and keys (head 0 / KV head 0).
fn max_abs_logit(batch: &RandomBatch, d: usize) -> f64 {
    let p = &batch.case.params;
    let (h, hkv) = (p.num_heads, p.num_kv_heads);
    let (q_len, s_len) = batch.spec.requests[0];
    let mut m = 0.0f64;
    for t in 0..q_len {
        let q = &batch.host_query[t * h * d..t * h * d + d];
        for j in 0..s_len {
            let k = &batch.host_keys[0][j * hkv * d..j * hkv * d + d];
            let s: f64 = q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
            m = m.max((s * p.scale as f64).abs());
        }
    }
    m
}
