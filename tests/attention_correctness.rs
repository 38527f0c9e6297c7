//! Attention on every available backend against the f64 reference (`polyattn::reference`),
//! on seeded random batches, with per-dtype tolerances.
//!
//! Each test is one body run on every backend (see `common`). The grid (dtype × KV-cache dtype
//! × head size × block size × head layout × batch kind) is sampled with the seeded RNG so that
//! every value of every axis appears several times; the feature tests (sliding window, ALiBi,
//! soft cap, sinks, non-causal, encoder, LSE, cascade, padding, skipped slots) each check that
//! the feature changes the reference by a clear margin, so they cannot pass by ignoring it.

#[macro_use]
mod common;

use common::{ensure, fail, for_each_case, CaseInfo, FailureCase, Outcome};
use polyattn::reference::{self, ReferenceOutput};
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch, Rng, Tolerance};
use polyattn::{
    AttentionBackend, AttentionParams, AttentionType, BackendRef, CacheDType,
    CommonAttentionMetadata, DType, KvCacheSpec, SelectorConfig, Tensor, PAD_SLOT_ID,
};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];
const HEAD_SIZES: [usize; 5] = [32, 64, 80, 128, 256];
const BLOCK_SIZES: [usize; 3] = [16, 32, 64];
const HEADS: [(usize, usize); 3] = [(4, 4), (8, 2), (6, 1)];

/// The batch shapes of vLLM's backend tests, scaled to the block size: seq_len 1 and
/// lengths that are not multiples of the block size in every kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Decode,
    Prefill,
    Chunked,
    Mixed,
    /// Requests with no new tokens between the others (a padded batch).
    Empty,
}

const KINDS: [Kind; 4] = [Kind::Decode, Kind::Prefill, Kind::Chunked, Kind::Mixed];

impl Kind {
    fn spec(self, bs: usize) -> BatchSpec {
        BatchSpec::new(&match self {
            Kind::Decode => vec![(1, 1), (1, bs + 3), (1, 2 * bs), (1, 3 * bs - 5)],
            Kind::Prefill => vec![(1, 1), (7, 7), (bs + 5, bs + 5)],
            Kind::Chunked => vec![(9, 2 * bs + 9), (bs / 2 + 3, bs + bs / 2 + 3)],
            Kind::Mixed => vec![(1, 2 * bs + 1), (5, 5), (1, 1), (11, bs + 11)],
            Kind::Empty => vec![(0, 0), (1, bs + 2), (0, bs + 5), (4, 4), (0, 0)],
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Decode => "decode",
            Kind::Prefill => "prefill",
            Kind::Chunked => "chunked",
            Kind::Mixed => "mixed",
            Kind::Empty => "with empty requests",
        }
    }
}

/// One test case: a layer, a batch, and what to check beyond the output.
#[derive(Clone, Debug)]
struct Case {
    label: String,
    case: CaseConfig,
    spec: BatchSpec,
    seed: u64,
    /// Also request and check the LSE.
    lse: bool,
    /// Extra rows in query / key / value / output beyond the batch (graph padding).
    pad_rows: usize,
    /// Tokens whose slot is set to −1 after their K/V were written by an earlier update;
    /// their key / value rows are then corrupted, so a write would show in the output.
    pad_slots: Vec<usize>,
    /// Added to every request's seq_len in the metadata (encoder layers must ignore
    /// seq_lens: their keys are the request's own query rows, as in vLLM's FA encoder path).
    extra_seq_len: usize,
    /// A variant of the layer whose reference must differ from this one's by at least
    /// `min_effect` (max abs over the outputs): proof that the feature under test bites.
    contrast: Option<(AttentionParams, bool)>,
}

impl Case {
    fn new(label: impl Into<String>, case: CaseConfig, spec: BatchSpec, seed: u64) -> Self {
        Case {
            label: label.into(),
            case,
            spec,
            seed,
            lse: false,
            pad_rows: 0,
            pad_slots: Vec::new(),
            extra_seq_len: 0,
            contrast: None,
        }
    }

    fn info(&self) -> CaseInfo {
        let p = &self.case.params;
        let mut config =
            SelectorConfig::for_layer(p, self.case.dtype, Some(self.case.block_size as u32));
        config.use_non_causal = !self.case.causal && p.attn_type == AttentionType::Decoder;
        CaseInfo {
            label: format!("{} (seed {})", self.label, self.seed),
            config: Some(config),
            cascade: self.case.common_prefix_len > 0,
            graphs: false,
        }
    }

    fn with_lse(mut self) -> Self {
        self.lse = true;
        self
    }

    /// Checks that the feature changes the result: `other` params (and causality) must give a
    /// reference output at least `MIN_EFFECT` away from this case's.
    fn contrast(mut self, other: AttentionParams, causal: bool) -> Self {
        self.contrast = Some((other, causal));
        self
    }
}

/// Smallest max-abs difference a feature must make to the reference output.
const MIN_EFFECT: f64 = 0.05;

fn params(h: usize, hkv: usize, d: usize, cache: CacheDType) -> AttentionParams {
    AttentionParams {
        kv_cache_dtype: cache,
        ..AttentionParams::new(h, d, hkv)
    }
}

/// vLLM's ALiBi slopes for `n` heads (power-of-two case and the interleaved rest).
fn alibi_slopes(n: usize) -> Vec<f32> {
    let closest = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let base = 2f64.powf(-(2f64.powf(-((closest as f64).log2() - 3.0))));
    let mut s: Vec<f32> = (1..=closest).map(|i| base.powi(i as i32) as f32).collect();
    if closest != n {
        let extra = 2f64.powf(-(2f64.powf(-((2.0 * closest as f64).log2() - 3.0))));
        let rest = n - closest;
        s.extend((0..rest).map(|i| extra.powi((1 + 2 * i) as i32) as f32));
    }
    s
}

fn output_tolerance(dtype: DType) -> Tolerance {
    Tolerance::for_dtype(dtype)
}

/// The LSE is an f32 tensor, but a backend may compute the logits from reduced-precision
/// operands; it gets the activation dtype's tolerance (f32 for f32).
fn lse_tolerance(dtype: DType) -> Tolerance {
    Tolerance::for_dtype(dtype)
}

fn upload(
    b: &dyn AttentionBackend,
    data: &[f32],
    shape: &[usize],
    dtype: DType,
) -> polyattn::Result<Tensor> {
    Tensor::from_f32(&b.device()?, data, shape, dtype)
}

/// Runs one case on one backend and compares with the reference.
fn run_case(backend: &BackendRef, c: &Case) -> Outcome {
    let b = backend.as_ref();
    let mut batch = RandomBatch::generate(b, &c.case, &c.spec, c.seed)?;
    let want = reference::attention(&batch)?;
    if let Some((other, causal)) = &c.contrast {
        let mut alt = batch.clone();
        alt.case.params = other.clone();
        alt.desc.causal = *causal;
        let alt_ref = reference::attention(&alt)?;
        let effect = max_abs_diff(&want.out, &alt_ref.out);
        ensure(effect >= MIN_EFFECT, || {
            format!("the feature under test barely changes the reference (max abs {effect:.3e}); the case cannot fail")
        })?;
    }

    for s in &mut batch.desc.seq_lens {
        *s += c.extra_seq_len as i32;
    }
    let p = &c.case.params;
    let dtype = c.case.dtype;
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_size);
    let n = c.spec.num_tokens();
    let rows = n + c.pad_rows;
    let imp = b.make_impl(p.clone())?;
    let kv_spec = KvCacheSpec {
        block_size: c.case.block_size,
        num_kv_heads: hkv,
        head_size: d,
        dtype,
        cache_dtype: p.kv_cache_dtype,
    };
    let builder = b.make_builder(&kv_spec)?;
    let device = b.device()?;

    // Inputs, padded with random rows that must be ignored.
    let mut rng = Rng::new(c.seed ^ 0x5eed);
    let mut q = batch.host_query.clone();
    q.extend(rng.normals(c.pad_rows * h * d));
    let mut k = batch.key.to_f32_vec()?;
    let mut v = batch.value.to_f32_vec()?;
    k.extend(rng.normals(c.pad_rows * hkv * d).iter().map(|x| x * 9.0));
    v.extend(rng.normals(c.pad_rows * hkv * d).iter().map(|x| x * 9.0));

    if !c.pad_slots.is_empty() {
        // Write every token's K/V first (as another step would have), then hide some tokens
        // behind −1 slots and corrupt their inputs.
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
            batch.desc.slot_mapping[t] = PAD_SLOT_ID;
            for x in &mut k[t * hkv * d..(t + 1) * hkv * d] {
                *x = -3.0 * *x + 5.0;
            }
            for x in &mut v[t * hkv * d..(t + 1) * hkv * d] {
                *x = -3.0 * *x + 5.0;
            }
        }
    }

    let query = upload(b, &q, &[rows, h, d], dtype)?;
    let key = upload(b, &k, &[rows, hkv, d], dtype)?;
    let value = upload(b, &v, &[rows, hkv, d], dtype)?;
    const SENTINEL: f32 = 7.5;
    let mut output = upload(b, &vec![SENTINEL; rows * h * d], &[rows, h, d], dtype)?;
    let mut lse_t = if c.lse {
        Some(upload(b, &vec![SENTINEL; h * n], &[h, n], DType::F32)?)
    } else {
        None
    };

    let common = CommonAttentionMetadata::new(&device, batch.desc.clone())?;
    let md = builder.build(c.case.common_prefix_len, &common, false)?;
    imp.forward_with_lse(
        &batch.layer,
        &query,
        Some(&key),
        Some(&value),
        &mut batch.kv_cache,
        md.as_ref(),
        &mut output,
        lse_t.as_mut(),
    )?;
    device.synchronize()?;

    let got = output.to_f32_vec()?;
    check_output(&got[..n * h * d], &want, dtype)?;
    if let Some(i) = got[n * h * d..].iter().position(|&x| x != SENTINEL) {
        return Err(fail(format!(
            "padding row {} of the output was written ({}); rows past num_actual_tokens must stay untouched",
            n + i / (h * d),
            got[n * h * d + i]
        )));
    }
    if let Some(l) = &lse_t {
        let got = l.to_f32_vec()?;
        let cmp = reference::compare(&got, &want.lse, lse_tolerance(dtype));
        ensure(cmp.pass, || format!("LSE {cmp}"))?;
    }
    Ok(())
}

fn check_output(got: &[f32], want: &ReferenceOutput, dtype: DType) -> Outcome {
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        return Err(fail(format!("output[{i}] = {} is not finite", got[i])));
    }
    let cmp = reference::compare(got, &want.out, output_tolerance(dtype));
    ensure(cmp.pass, || {
        let (h, d) = (want.num_heads, want.head_size);
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
        format!("output {cmp}{at}")
    })
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn run(body: &str, cases: &[Case]) {
    for_each_case(body, cases, Case::info, run_case);
}

/// Yields `n` items cycling through shuffled copies of `values`: every value appears
/// `n / values.len()` times or more, in seeded random combinations with the other axes.
fn cycle_shuffled<T: Copy>(values: &[T], n: usize, rng: &mut Rng) -> Vec<T> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let mut v = values.to_vec();
        rng.shuffle(&mut v);
        out.extend(v);
    }
    out.truncate(n);
    out
}

/// The sampled base grid: every (dtype, KV-cache dtype) pair twice, with head size, block
/// size, head layout and batch kind cycled through shuffled orders.
fn grid_cases() -> Vec<Case> {
    let mut rng = Rng::new(20_250_101);
    let pairs: Vec<(DType, CacheDType)> = DTYPES
        .iter()
        .flat_map(|&dt| CacheDType::ALL.iter().map(move |&c| (dt, c)))
        .collect();
    let n = 2 * pairs.len();
    let heads = cycle_shuffled(&HEAD_SIZES, n, &mut rng);
    let blocks = cycle_shuffled(&BLOCK_SIZES, n, &mut rng);
    let layouts = cycle_shuffled(&HEADS, n, &mut rng);
    let kinds = cycle_shuffled(&KINDS, n, &mut rng);
    (0..n)
        .map(|i| {
            let (dt, cache) = pairs[i % pairs.len()];
            let (hd, bs, (h, hkv), kind) = (heads[i], blocks[i], layouts[i], kinds[i]);
            let label = format!("{dt}/{cache} hd{hd} bs{bs} ({h},{hkv}) {}", kind.name());
            Case::new(
                label,
                CaseConfig::new(params(h, hkv, hd, cache), dt, bs),
                kind.spec(bs),
                1000 + i as u64,
            )
        })
        .collect()
}

#[test]
fn grid_matches_reference() {
    let cases = grid_cases();
    // The sample covers every value of every axis.
    for kind in KINDS {
        assert!(cases.iter().any(|c| c.label.ends_with(kind.name())));
    }
    for hd in HEAD_SIZES {
        assert!(cases.iter().any(|c| c.case.params.head_size == hd));
    }
    for bs in BLOCK_SIZES {
        assert!(cases.iter().any(|c| c.case.block_size == bs));
    }
    run("grid", &cases);
}

#[test]
fn every_batch_kind_in_every_dtype() {
    // A dense slice of the grid: each batch kind in each dtype, auto cache, GQA.
    let mut cases = Vec::new();
    for (i, dt) in DTYPES.into_iter().enumerate() {
        for (j, kind) in KINDS.into_iter().enumerate() {
            cases.push(Case::new(
                format!("{dt} {} hd64 bs16 (8,2)", kind.name()),
                CaseConfig::new(params(8, 2, 64, CacheDType::Auto), dt, 16),
                kind.spec(16),
                2000 + (i * 10 + j) as u64,
            ));
        }
    }
    run("batch_kinds", &cases);
}

#[test]
fn sliding_window() {
    let mut cases = Vec::new();
    for (i, (dt, kind, w, bs)) in [
        (DType::F32, Kind::Decode, 7, 16),
        (DType::Bf16, Kind::Prefill, 5, 16),
        (DType::F16, Kind::Chunked, 20, 32),
        (DType::F32, Kind::Mixed, 16, 16),
        (DType::F32, Kind::Chunked, 1, 16),
    ]
    .into_iter()
    .enumerate()
    {
        let base = params(8, 2, 64, CacheDType::Auto);
        let p = AttentionParams {
            sliding_window: Some(w),
            ..base.clone()
        };
        cases.push(
            Case::new(
                format!("{dt} {} window {w} bs{bs}", kind.name()),
                CaseConfig::new(p, dt, bs),
                kind.spec(bs),
                3000 + i as u64,
            )
            .with_lse()
            .contrast(base, true),
        );
    }
    run("sliding_window", &cases);
}

#[test]
fn alibi() {
    let mut cases = Vec::new();
    for (i, (dt, kind, (h, hkv))) in [
        (DType::F32, Kind::Mixed, (8, 2)),
        (DType::Bf16, Kind::Chunked, (6, 1)),
        (DType::F16, Kind::Decode, (4, 4)),
    ]
    .into_iter()
    .enumerate()
    {
        let base = params(h, hkv, 64, CacheDType::Auto);
        let p = AttentionParams {
            alibi_slopes: Some(alibi_slopes(h)),
            ..base.clone()
        };
        cases.push(
            Case::new(
                format!("{dt} {} ({h},{hkv}) alibi", kind.name()),
                CaseConfig::new(p, dt, 16),
                kind.spec(16),
                4000 + i as u64,
            )
            .with_lse()
            .contrast(base.clone(), true),
        );
    }
    // Non-causal: the bias is symmetric, −slope·|p − j| (FlashAttention's form).
    let base = params(8, 2, 64, CacheDType::Auto);
    let p = AttentionParams {
        alibi_slopes: Some(alibi_slopes(8)),
        ..base.clone()
    };
    let mut cc = CaseConfig::new(p, DType::F32, 16);
    cc.causal = false;
    cases.push(
        Case::new(
            "f32 chunked (8,2) alibi non-causal",
            cc,
            Kind::Chunked.spec(16),
            4100,
        )
        .with_lse()
        .contrast(base, true),
    );
    run("alibi", &cases);
}

#[test]
fn soft_cap() {
    // Logits of standard deviation ~40 (scale 40/√D instead of 1/√D), so a cap of 50 bites.
    let mut cases = Vec::new();
    for (i, (dt, kind, cache)) in [
        (DType::F32, Kind::Mixed, CacheDType::Auto),
        (DType::Bf16, Kind::Chunked, CacheDType::Auto),
        (DType::F16, Kind::Prefill, CacheDType::Fp8E4m3),
    ]
    .into_iter()
    .enumerate()
    {
        let d = 64;
        let base = AttentionParams {
            scale: 40.0 / (d as f32).sqrt(),
            ..params(8, 2, d, cache)
        };
        let p = AttentionParams {
            logits_soft_cap: Some(50.0),
            ..base.clone()
        };
        cases.push(
            Case::new(
                format!("{dt}/{cache} {} soft cap 50", kind.name()),
                CaseConfig::new(p, dt, 16),
                kind.spec(16),
                5000 + i as u64,
            )
            .with_lse()
            .contrast(base, true),
        );
    }
    run("soft_cap", &cases);
}

#[test]
fn sinks() {
    // Sinks ~ 15·U(0,1) as in vLLM; logits of std ~4 so that sinks and keys both matter.
    let mut cases = Vec::new();
    let mut rng = Rng::new(6);
    for (i, (dt, kind, (h, hkv))) in [
        (DType::F32, Kind::Mixed, (8, 2)),
        (DType::Bf16, Kind::Decode, (6, 1)),
        (DType::F16, Kind::Chunked, (4, 4)),
    ]
    .into_iter()
    .enumerate()
    {
        let d = 64;
        let base = AttentionParams {
            scale: 4.0 / (d as f32).sqrt(),
            ..params(h, hkv, d, CacheDType::Auto)
        };
        let p = AttentionParams {
            sinks: Some((0..h).map(|_| 15.0 * rng.uniform() as f32).collect()),
            ..base.clone()
        };
        cases.push(
            Case::new(
                format!("{dt} {} ({h},{hkv}) sinks", kind.name()),
                CaseConfig::new(p, dt, 16),
                kind.spec(16),
                6000 + i as u64,
            )
            .with_lse()
            .contrast(base, true),
        );
    }
    run("sinks", &cases);
}

#[test]
fn non_causal_decoder() {
    // Metadata causal = false on a decoder layer: queries see the keys after them too.
    let mut cases = Vec::new();
    for (i, (dt, kind, window)) in [
        (DType::F32, Kind::Chunked, None),
        (DType::Bf16, Kind::Mixed, None),
        (DType::F32, Kind::Prefill, Some(6)),
    ]
    .into_iter()
    .enumerate()
    {
        let p = AttentionParams {
            sliding_window: window,
            ..params(8, 2, 64, CacheDType::Auto)
        };
        let mut cc = CaseConfig::new(p.clone(), dt, 16);
        cc.causal = false;
        cases.push(
            Case::new(
                format!("{dt} {} non-causal window {window:?}", kind.name()),
                cc,
                kind.spec(16),
                7000 + i as u64,
            )
            .with_lse()
            .contrast(p, true),
        );
    }
    run("non_causal_decoder", &cases);
}

#[test]
fn encoder_attention() {
    // Encoder-only (and encoder) layers: bidirectional, K/V straight from the inputs, every
    // request's query_len == seq_len; one sequence longer than the CPU kernel's 64-row chunk.
    // With `extra` > 0 the metadata's seq_lens exceed the query lengths: encoder attention
    // must ignore them (vLLM's FA encoder path uses cu_seqlens_q for queries and keys alike).
    let spec = BatchSpec::new(&[(1, 1), (13, 13), (70, 70)]);
    let mut cases = Vec::new();
    let enc_only = AttentionType::EncoderOnly;
    for (i, (dt, ty, window, cache, extra)) in [
        (DType::F32, enc_only, None, CacheDType::Auto, 0),
        (DType::Bf16, enc_only, Some(4), CacheDType::Auto, 0),
        (
            DType::F16,
            AttentionType::Encoder,
            None,
            CacheDType::Auto,
            0,
        ),
        // The cache dtype must not matter: encoder K/V never go through the cache.
        (DType::F32, enc_only, None, CacheDType::Fp8E4m3, 0),
        (DType::F32, enc_only, Some(4), CacheDType::Auto, 5),
        (
            DType::F32,
            AttentionType::Encoder,
            Some(9),
            CacheDType::Auto,
            11,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let p = AttentionParams {
            attn_type: ty,
            sliding_window: window,
            ..params(6, 1, 32, cache)
        };
        let causal = AttentionParams {
            attn_type: AttentionType::Decoder,
            sliding_window: window,
            ..params(6, 1, 32, CacheDType::Auto)
        };
        let mut c = Case::new(
            format!("{dt}/{cache} {ty} window {window:?} seq_lens +{extra}"),
            CaseConfig::new(p, dt, 16),
            spec.clone(),
            8000 + i as u64,
        )
        .with_lse()
        .contrast(causal, true);
        c.extra_seq_len = extra;
        cases.push(c);
    }
    run("encoder", &cases);
}

#[test]
fn lse_across_the_grid() {
    // The LSE next to the output, on a sample of the grid, decode batches included. A backend
    // whose impl cannot return the LSE for decodes (can_return_lse_for_decode() == false)
    // needs a FailureCase entry for this body.
    let cases: Vec<Case> = grid_cases()
        .into_iter()
        .step_by(3)
        .map(|mut c| {
            c.label.push_str(" +lse");
            c.seed += 500;
            c.with_lse()
        })
        .collect();
    run("lse", &cases);
}

#[test]
fn cascade_matches_plain_attention() {
    // A shared prefix of whole blocks, ≤ every request's context, checked against the plain
    // (non-cascade) reference.
    let mut cases = Vec::new();
    for (i, (dt, bs, prefix_blocks, (h, hkv), sinks, cap)) in [
        (DType::F32, 16, 2, (8, 2), false, false),
        (DType::Bf16, 32, 1, (4, 4), false, false),
        (DType::F16, 16, 1, (6, 1), true, false),
        (DType::F32, 16, 2, (8, 2), true, true),
    ]
    .into_iter()
    .enumerate()
    {
        let prefix = prefix_blocks * bs;
        let mut rng = Rng::new(90 + i as u64);
        let p = AttentionParams {
            sinks: sinks.then(|| (0..h).map(|_| 15.0 * rng.uniform() as f32).collect()),
            logits_soft_cap: cap.then_some(50.0),
            scale: if cap { 40.0 / 8.0 } else { 1.0 / 8.0 },
            ..params(h, hkv, 64, CacheDType::Auto)
        };
        let mut cc = CaseConfig::new(p, dt, bs);
        cc.common_prefix_len = prefix;
        let spec = BatchSpec::new(&[
            (1, prefix + 9),
            (5, prefix + bs + 2),
            (1, prefix + 1),
            (bs + 3, prefix + bs + 3),
        ]);
        let label = format!(
            "{dt} bs{bs} prefix {prefix} ({h},{hkv}){}{}",
            if sinks { " sinks" } else { "" },
            if cap { " soft cap" } else { "" }
        );
        cases.push(Case::new(label, cc, spec, 9000 + i as u64).with_lse());
    }
    run("cascade", &cases);
}

#[test]
fn padded_tensors_and_skipped_slots() {
    // Query / key / value / output longer than the batch (graph padding): only the first
    // num_actual_tokens rows are read and written. And −1 slots: those tokens' K/V are not
    // written, so corrupting their inputs changes nothing.
    let mut cases = Vec::new();
    for (i, (dt, cache, kind, pad_rows, pad_slots)) in [
        (DType::F32, CacheDType::Auto, Kind::Mixed, 5, vec![]),
        (DType::Bf16, CacheDType::Fp8E4m3, Kind::Decode, 3, vec![]),
        (
            DType::F32,
            CacheDType::Auto,
            Kind::Chunked,
            0,
            vec![0, 4, 9],
        ),
        (
            DType::F16,
            CacheDType::Fp8E5m2,
            Kind::Mixed,
            4,
            vec![1, 3, 7],
        ),
        (DType::F32, CacheDType::Auto, Kind::Empty, 2, vec![2]),
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = Case::new(
            format!(
                "{dt}/{cache} {} pad_rows {pad_rows} -1 slots {pad_slots:?}",
                kind.name()
            ),
            CaseConfig::new(params(8, 2, 64, cache), dt, 16),
            kind.spec(16),
            10_000 + i as u64,
        )
        .with_lse();
        c.pad_rows = pad_rows;
        c.pad_slots = pad_slots;
        cases.push(c);
    }
    run("padding", &cases);
}

#[test]
fn failure_table_skips_with_its_reason() {
    // The FailureCase mechanism itself: a matching entry skips, a non-matching one does not.
    let case = CaseInfo::plain("f16 decode");
    let table = [
        FailureCase::backend("cpu", "not yet").when(|c| c.label.contains("f16")),
        FailureCase::backend("*", "never").body("other_body"),
    ];
    assert_eq!(
        common::expected_failure(&table, "CPU", "grid", &case),
        Some("not yet")
    );
    assert_eq!(
        common::expected_failure(&table, "CPU", "grid", &CaseInfo::plain("f32 decode")),
        None
    );
    assert_eq!(
        common::expected_failure(&table, "CUDA", "other_body", &case),
        Some("never")
    );
    assert_eq!(
        common::expected_failure(&table, "CUDA", "grid", &case),
        None
    );
}

#[test]
#[should_panic(expected = "ran on no backend")]
fn a_body_that_runs_nowhere_fails() {
    // Every case skipped on every backend: the harness must fail, not pass.
    static EVERYTHING: [FailureCase; 1] = [FailureCase::backend("*", "skip everything")];
    let cases = grid_cases();
    common::for_each_case_with_table(
        "runs_nowhere",
        &EVERYTHING,
        &cases[..2],
        Case::info,
        |_, _| -> Outcome { unreachable!("every case must be skipped") },
    );
}
