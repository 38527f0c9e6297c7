//! The CI form of the fuzz suite (`polyattn::testing::fuzz`): a fixed set of seeds on every
//! available backend, small batches (`Profile::Ci`). Valid batches must match the f64
//! reference; invalid inputs must be typed errors that leave the cache unchanged; a panic is
//! a failure. Every failure names its seed and the `polyattn fuzz` line that reruns it.
//!
//! `POLYATTN_FUZZ_VERBOSE=1` prints every case with its time.
//!
//! The long form is `polyattn fuzz --seconds N` (run on GPUs under compute-sanitizer).

#[macro_use]
mod common;

use common::{ensure, fail, for_each_backend, Outcome};
use polyattn::testing::fuzz::{self, Profile, Tally, Verdict};
use polyattn::testing::Rng;
use polyattn::{AttentionType, CacheDType, DType};

/// Base seed of the CI run; case i uses `BASE + i`.
const BASE: u64 = 18_000;
/// Cases per backend.
const CASES: u64 = 40;

#[test]
fn fuzz_ci_seeds() {
    for_each_backend("fuzz", |backend| {
        let name = backend.name().to_string();
        let mut tally = Tally::default();
        let (mut valid, mut invalid) = (0, 0);
        let verbose = std::env::var_os("POLYATTN_FUZZ_VERBOSE").is_some();
        let start = std::time::Instant::now();
        for i in 0..CASES {
            let seed = fuzz::case_seed(BASE, i);
            let t0 = std::time::Instant::now();
            let r = fuzz::run_case(backend.as_ref(), seed, Profile::Ci);
            if verbose {
                report!("[fuzz] {name} {r} ({:.2} s)", t0.elapsed().as_secs_f64());
            }
            if r.verdict == Verdict::Pass {
                if r.label.starts_with("valid") {
                    valid += 1;
                } else if r.label.starts_with("invalid") {
                    invalid += 1;
                }
            }
            tally.add(&r);
        }
        report!(
            "[fuzz] {name}: {} passed ({valid} valid batches, {invalid} invalid inputs), {} failed, {} skipped ({:.1} s)",
            tally.passed,
            tally.failed,
            tally.skipped,
            start.elapsed().as_secs_f64()
        );
        if !tally.failures.is_empty() {
            let lines: Vec<String> = tally
                .failures
                .iter()
                .map(|f| {
                    format!(
                        "{f}\n    rerun: {}",
                        fuzz::reproduce_command(&name, f.seed, Profile::Ci)
                    )
                })
                .collect();
            return Err(fail(format!(
                "{} of {CASES} fuzz cases failed:\n{}",
                tally.failed,
                lines.join("\n")
            )));
        }
        // Skips are configurations the backend refuses; most cases must have run.
        ensure(
            tally.passed as u64 * 4 >= CASES * 3 && valid > 0 && invalid > 0,
            || {
                format!(
                    "only {} of {CASES} cases ran ({valid} valid, {invalid} invalid); the suite \
                 tests too little",
                    tally.passed
                )
            },
        )
    });
}

#[test]
fn a_case_is_a_function_of_its_seed() {
    for_each_backend("fuzz_determinism", |backend| -> Outcome {
        for seed in [BASE, BASE + 1, BASE + 7] {
            let a = fuzz::run_case(backend.as_ref(), seed, Profile::Ci);
            let b = fuzz::run_case(backend.as_ref(), seed, Profile::Ci);
            ensure(a.label == b.label, || {
                format!("seed {seed}: {:?} then {:?}", a.label, b.label)
            })?;
        }
        Ok(())
    });
}

#[test]
fn the_generator_covers_every_feature() {
    // Generation only (nothing runs): over many seeds every dtype, cache dtype and feature
    // the backend supports appears, in both profiles.
    for_each_backend("fuzz_coverage", |backend| -> Outcome {
        let b = backend.as_ref();
        let caps = b.capabilities().clone();
        for profile in [Profile::Ci, Profile::Long] {
            let limits = profile.limits();
            let mut rng = Rng::new(5);
            let mut cases = Vec::new();
            for _ in 0..600 {
                if let Ok(c) = fuzz::gen_valid(b, &mut rng, &limits) {
                    cases.push(c);
                }
            }
            let has = |what: &str, f: &dyn Fn(&fuzz::ValidCase) -> bool| -> Outcome {
                ensure(cases.iter().any(f), || {
                    format!("{profile}: no generated case has {what}")
                })
            };
            for dt in [DType::F32, DType::F16, DType::Bf16] {
                if caps.dtypes.contains(&dt) {
                    has(dt.as_str(), &|c| c.case.dtype == dt)?;
                }
            }
            for cd in CacheDType::ALL {
                if caps.kv_cache_dtypes.contains(&cd) {
                    has(cd.as_str(), &|c| c.case.params.kv_cache_dtype == cd)?;
                }
            }
            has("GQA", &|c| {
                let p = &c.case.params;
                p.num_heads > p.num_kv_heads && p.num_kv_heads > 1
            })?;
            has("MQA", &|c| {
                let p = &c.case.params;
                p.num_kv_heads == 1 && p.num_heads > 1
            })?;
            has("a decode", &|c| {
                c.spec.requests.iter().any(|r| r.0 == 1 && r.1 > 1)
            })?;
            has("a chunked prefill", &|c| {
                c.spec.requests.iter().any(|r| r.0 > 1 && r.1 > r.0)
            })?;
            has("a request with no new token", &|c| {
                c.spec.requests.iter().any(|r| r.0 == 0)
            })?;
            if caps.supports_sliding_window {
                has("a sliding window", &|c| {
                    c.case.params.sliding_window.is_some()
                })?;
            }
            if caps.supports_alibi {
                has("ALiBi", &|c| c.case.params.alibi_slopes.is_some())?;
            }
            if caps.supports_soft_cap {
                has("a soft cap", &|c| c.case.params.soft_cap().is_some())?;
            }
            if caps.supports_sink {
                has("sinks", &|c| c.case.params.sinks.is_some())?;
            }
            if caps.supports_non_causal {
                has("non-causal decoder attention", &|c| {
                    !c.case.causal && c.case.params.attn_type == AttentionType::Decoder
                })?;
            }
            if caps.attn_types.iter().any(|t| t.is_encoder()) {
                has("an encoder layer", &|c| {
                    c.case.params.attn_type.is_encoder()
                })?;
            }
            if caps.supports_cascade {
                has("cascade", &|c| c.case.common_prefix_len > 0)?;
            }
            has("an LSE", &|c| c.lse)?;
            has("padded rows", &|c| c.pad_rows > 0)?;
            has("a slot mapping padded with -1", &|c| c.pad_slot_mapping)?;
            has("-1 slots", &|c| !c.pad_slots.is_empty())?;
            for fill in fuzz::StaleFill::ALL {
                has(&format!("a stale cache ({})", fill.as_str()), &|c| {
                    c.stale == Some(fill)
                })?;
            }
        }
        Ok(())
    });
}
