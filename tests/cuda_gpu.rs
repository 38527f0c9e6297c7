//! CUDA-only checks at lengths the shared suite (tests/attention_correctness.rs, small shapes
//! on every backend) does not reach: split-KV decode (flash-decoding plus the combine kernel,
//! which only kicks in past ~512 keys), long causal prefill and chunked prefill (many key
//! tiles, on the tensor-core prefill kernels: wgmma on sm_90, mma.sync elsewhere or with
//! `POLYATTN_CUDA_MMA=1`), cascade over a long shared prefix, each with sinks / window /
//! ALiBi / soft cap / fp8 variants, against the f64 reference.
//!
//! The decode-kernel test (`decode_kernel_matches_reference`) covers the tensor-core decode
//! kernel (paged_decode.cu) across head sizes, GQA groups (including groups above its 16 rows),
//! block sizes, NHD and HND caches, batches that mix it with the other kernels, and split and
//! unsplit decodes; with `POLYATTN_CUDA_DECODE=0` the same cases check the fallback.
//!
//! The graph tests (capture and replay of decode steps) are shared with the Vulkan backend:
//! tests/graph_replay.rs.
//!
//! Without a usable CUDA device (no driver, no GPU, no NVRTC) every test prints SKIP with the
//! reason and passes; on the H200 they run (see the CUDA backend's test plan).

#[macro_use]
mod common;

use polyattn::reference;
use polyattn::registry;
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch, Tolerance};
use polyattn::{
    AttentionBackend, AttentionParams, BackendRef, CacheDType, CommonAttentionMetadata, DType,
    KvCache, KvCacheSpec, KvLayout, Tensor,
};

fn cuda(test: &str) -> Option<BackendRef> {
    let b = registry::global().get("CUDA")?;
    match b.availability() {
        polyattn::Availability::Available(d) => {
            report!("[{test}] running on {d}");
            Some(b)
        }
        polyattn::Availability::Unavailable(why) => {
            report!("SKIP [{test}]: CUDA backend unavailable: {why}");
            None
        }
    }
}

/// The same cache contents in the other layout (NHD <-> HND), on the cache's device.
fn relayout(cache: &KvCache) -> polyattn::Result<KvCache> {
    let spec = *cache.spec();
    let to = match cache.layout() {
        KvLayout::Hnd => KvLayout::Nhd,
        KvLayout::Nhd => KvLayout::Hnd,
    };
    let host = polyattn::Device::cpu();
    let mut out = KvCache::with_layout(&host, spec, cache.num_blocks(), to)?;
    let vals = cache.data().to_f32_vec()?;
    let mut new = vec![0f32; vals.len()];
    let d = spec.head_size;
    for block in 0..cache.num_blocks() {
        for kv in 0..2 {
            for tok in 0..spec.block_size {
                for head in 0..spec.num_kv_heads {
                    let (a, b) = (
                        cache.offset(block, kv, tok, head),
                        out.offset(block, kv, tok, head),
                    );
                    new[b..b + d].copy_from_slice(&vals[a..a + d]);
                }
            }
        }
    }
    let shape = out.data().shape().to_vec();
    *out.data_mut() = Tensor::from_f32(&host, &new, &shape, spec.storage_dtype())?;
    out.to_device(cache.data().device())
}

/// Runs one batch on CUDA and compares output and LSE with the reference.
fn check(b: &BackendRef, label: &str, case: &CaseConfig, spec: &BatchSpec, seed: u64) {
    check_layout(b, label, case, spec, seed, false)
}

/// [`check`], optionally with the cache converted to the other layout (NHD) first.
fn check_layout(
    b: &BackendRef,
    label: &str,
    case: &CaseConfig,
    spec: &BatchSpec,
    seed: u64,
    other_layout: bool,
) {
    let result = (|| -> polyattn::Result<Result<(), String>> {
        let be: &dyn AttentionBackend = b.as_ref();
        let mut batch = RandomBatch::generate(be, case, spec, seed)?;
        if other_layout {
            batch.kv_cache = relayout(&batch.kv_cache)?;
        }
        let want = reference::attention(&batch)?;
        let p = &case.params;
        let imp = be.make_impl(p.clone())?;
        let builder = be.make_builder(&KvCacheSpec {
            block_size: case.block_size,
            num_kv_heads: p.num_kv_heads,
            head_size: p.head_size,
            dtype: case.dtype,
            cache_dtype: p.kv_cache_dtype,
        })?;
        let device = be.device()?;
        let n = spec.num_tokens();
        let common = CommonAttentionMetadata::new(&device, batch.desc.clone())?;
        let md = builder.build(case.common_prefix_len, &common, false)?;
        let mut out = batch.empty_output()?;
        let mut lse = Tensor::zeros(&device, &[p.num_heads, n], DType::F32)?;
        imp.forward_with_lse(
            &batch.layer,
            &batch.query,
            Some(&batch.key),
            Some(&batch.value),
            &mut batch.kv_cache,
            md.as_ref(),
            &mut out,
            Some(&mut lse),
        )?;
        device.synchronize()?;
        let tol = Tolerance::for_dtype(case.dtype);
        let got = out.to_f32_vec()?;
        let c = reference::compare(&got, &want.out, tol);
        if !c.pass {
            return Ok(Err(format!("output {c}")));
        }
        let c = reference::compare(&lse.to_f32_vec()?, &want.lse, tol);
        if !c.pass {
            return Ok(Err(format!("LSE {c}")));
        }
        Ok(Ok(()))
    })();
    match result {
        Ok(Ok(())) => report!("  ok   {label}"),
        Ok(Err(e)) => panic!("{label}: {e}"),
        Err(e) => panic!("{label}: error {e}"),
    }
}

fn params(h: usize, hkv: usize, d: usize, cache: CacheDType) -> AttentionParams {
    AttentionParams {
        kv_cache_dtype: cache,
        ..AttentionParams::new(h, d, hkv)
    }
}

#[test]
fn split_kv_decode_matches_reference() {
    let Some(b) = cuda("split_kv_decode") else {
        return;
    };
    let spec = BatchSpec::new(&[(1, 3000), (1, 1500), (1, 700), (1, 17)]);
    let mut seed = 1;
    for (dtype, cache) in [
        (DType::F32, CacheDType::Auto),
        (DType::Bf16, CacheDType::Auto),
        (DType::F16, CacheDType::Fp8E4m3),
        (DType::Bf16, CacheDType::Fp8E5m2),
    ] {
        for variant in ["plain", "sinks", "window", "alibi+softcap"] {
            let mut p = params(8, 2, 128, cache);
            match variant {
                "sinks" => p.sinks = Some((0..8).map(|i| 0.5 + i as f32 * 0.3).collect()),
                "window" => p.sliding_window = Some(1000),
                "alibi+softcap" => {
                    p.alibi_slopes = Some((0..8).map(|i| 0.5f32.powi(i + 1)).collect());
                    p.logits_soft_cap = Some(5.0);
                }
                _ => {}
            }
            let case = CaseConfig::new(p, dtype, 16);
            seed += 1;
            check(
                &b,
                &format!("decode {dtype}/{cache} {variant}"),
                &case,
                &spec,
                seed,
            );
        }
    }
}

/// The CUDA-core decode kernel (`paged_decode_cores.cu`: f32 activations and cache, head size
/// 64): every head-slot variant, full and partly used (GQA groups of 3, 5, 8, 12 and 16
/// heads, MQA with 32 in two items of 16), contexts long enough for the planner to split
/// them, with and without a sliding window (1000 keys: still split, from an unaligned
/// start), both cache layouts; the batch generator fills the slots no request may read with
/// NaN. With `POLYATTN_CUDA_DECODE=0` the same cases run on `paged_attention.cu`.
#[test]
fn decode_cores_matches_reference() {
    let Some(b) = cuda("decode_cores") else {
        return;
    };
    let t = polyattn::backends::cuda::CudaTuning::get();
    if !t.decode {
        report!("[decode_cores] POLYATTN_CUDA_DECODE=0: these cases run on paged_attention.cu");
    }
    let spec = BatchSpec::new(&[(1, 3000), (1, 700), (1, 33), (1, 1)]);
    let mut seed = 500;
    for (h, hkv) in [(9, 3), (15, 3), (16, 2), (24, 2), (32, 2), (32, 1)] {
        for window in [None, Some(1000)] {
            for other_layout in [false, true] {
                let mut p = params(h, hkv, 64, CacheDType::Auto);
                p.sliding_window = window;
                let case = CaseConfig::new(p, DType::F32, 16);
                seed += 1;
                check_layout(
                    &b,
                    &format!("f32 decode {h}/{hkv} heads, window {window:?}, other layout {other_layout}"),
                    &case,
                    &spec,
                    seed,
                    other_layout,
                );
            }
        }
    }
}

#[test]
fn long_prefill_matches_reference() {
    let Some(b) = cuda("long_prefill") else {
        return;
    };
    let spec = BatchSpec::new(&[(300, 300), (130, 1000), (1, 500), (40, 40)]);
    let mut seed = 100;
    for (dtype, d, (h, hkv)) in [
        (DType::F16, 128, (8, 2)),
        (DType::Bf16, 64, (4, 4)),
        (DType::Bf16, 96, (6, 1)),
        (DType::F32, 128, (4, 1)),
        (DType::Bf16, 256, (4, 2)),
    ] {
        for variant in ["plain", "sinks", "window", "alibi", "softcap", "fp8"] {
            let cache = if variant == "fp8" {
                CacheDType::Fp8E4m3
            } else {
                CacheDType::Auto
            };
            let mut p = params(h, hkv, d, cache);
            match variant {
                "sinks" => p.sinks = Some((0..h).map(|i| 1.0 - i as f32 * 0.2).collect()),
                "window" => p.sliding_window = Some(77),
                "alibi" => {
                    p.alibi_slopes = Some((0..h).map(|i| 0.5f32.powi(i as i32 + 2)).collect())
                }
                "softcap" => p.logits_soft_cap = Some(3.0),
                _ => {}
            }
            let case = CaseConfig::new(p, dtype, if d == 96 { 32 } else { 16 });
            seed += 1;
            check(
                &b,
                &format!("prefill {dtype} d{d} ({h},{hkv}) {variant}"),
                &case,
                &spec,
                seed,
            );
        }
    }
}

/// A prefill large enough that the per-batch CTA-shape rule picks the 128-row form of the
/// tensor-core kernel (two m16 tiles per warp; >= 4 CTAs per SM of a 132-SM H200: 2 requests
/// x ceil(1100 / 32 tokens per CTA) x 8 KV heads = 560), so the default test run covers it as well as
/// the 64-row form the smaller batches above get. Chunked (context before the queries) and a
/// fresh request; plain, window and sinks.
#[test]
fn large_prefill_matches_reference() {
    let Some(b) = cuda("large_prefill") else {
        return;
    };
    let spec = BatchSpec::new(&[(1100, 1100), (1100, 1300)]);
    for (i, variant) in ["plain", "window", "sinks"].into_iter().enumerate() {
        let mut p = params(32, 8, 128, CacheDType::Auto);
        match variant {
            "window" => p.sliding_window = Some(300),
            "sinks" => p.sinks = Some((0..32).map(|i| 0.3 + i as f32 * 0.05).collect()),
            _ => {}
        }
        let case = CaseConfig::new(p, DType::Bf16, 16);
        check(
            &b,
            &format!("large prefill bf16 d128 (32,8) {variant}"),
            &case,
            &spec,
            300 + i as u64,
        );
    }
}

#[test]
fn long_cascade_matches_reference() {
    let Some(b) = cuda("long_cascade") else {
        return;
    };
    let spec = BatchSpec::new(&[(1, 1100), (20, 1060), (1, 1040), (3, 1027)]);
    for (dtype, sinks) in [(DType::F32, false), (DType::Bf16, true)] {
        let mut p = params(8, 2, 128, CacheDType::Auto);
        if sinks {
            p.sinks = Some(vec![0.7; 8]);
        }
        let mut case = CaseConfig::new(p, dtype, 16);
        case.common_prefix_len = 1024;
        check(
            &b,
            &format!("cascade {dtype} sinks={sinks}"),
            &case,
            &spec,
            7,
        );
    }
}

#[test]
fn decode_kernel_matches_reference() {
    let Some(b) = cuda("decode_kernel") else {
        return;
    };
    // Split (long) and unsplit (short) decodes, a decode of one key, and a batch mixing
    // decodes with short and long prefills (the three kernels partition it).
    let long = BatchSpec::new(&[(1, 5000), (1, 1), (1, 37), (1, 1300)]);
    let mixed = BatchSpec::new(&[(1, 300), (20, 500), (1, 1000), (3, 40), (1, 17)]);
    let many: Vec<(usize, usize)> = (0..40).map(|i| (1, 100 + 23 * i)).collect();
    let many = BatchSpec::new(&many);
    let mut seed = 500;
    for (dtype, d, (h, hkv), bs) in [
        (DType::Bf16, 128, (32, 8), 16),
        (DType::F16, 128, (8, 1), 32),
        (DType::Bf16, 64, (4, 4), 16),
        (DType::F16, 96, (6, 1), 32),
        (DType::Bf16, 128, (40, 2), 64),
        (DType::Bf16, 64, (16, 1), 16),
    ] {
        for variant in ["plain", "sinks", "window", "alibi+softcap", "nhd"] {
            let mut p = params(h, hkv, d, CacheDType::Auto);
            match variant {
                "sinks" => p.sinks = Some((0..h).map(|i| 0.3 + (i % 7) as f32 * 0.4).collect()),
                "window" => p.sliding_window = Some(700),
                "alibi+softcap" => {
                    p.alibi_slopes = Some((0..h).map(|i| 0.5f32.powi(i as i32 % 8 + 1)).collect());
                    p.logits_soft_cap = Some(4.0);
                }
                _ => {}
            }
            let case = CaseConfig::new(p, dtype, bs);
            for (name, spec) in [("long", &long), ("mixed", &mixed), ("many", &many)] {
                if name == "many" && variant != "plain" && variant != "nhd" {
                    continue;
                }
                seed += 1;
                check_layout(
                    &b,
                    &format!("decode {dtype} d{d} ({h},{hkv}) bs{bs} {variant} {name}"),
                    &case,
                    spec,
                    seed,
                    variant == "nhd",
                );
            }
        }
    }
}

/// fp8 caches (E4M3 / E5M2, with the non-unit k / v scales of the shared cases) against the
/// reference: on the tensor-core decode kernel by default, on the CUDA-core split-KV kernel
/// with `POLYATTN_CUDA_DECODE=0` (benches/h200.sh runs both).
#[test]
fn fp8_decode_matches_reference() {
    let Some(b) = cuda("fp8_decode") else {
        return;
    };
    let long = BatchSpec::new(&[(1, 3000), (1, 1), (1, 37), (1, 900)]);
    let mixed = BatchSpec::new(&[(1, 300), (20, 500), (1, 1000), (3, 40), (1, 17)]);
    let mut seed = 700;
    for (dtype, cache, d, (h, hkv), bs) in [
        (DType::Bf16, CacheDType::Fp8E4m3, 128, (32, 8), 16),
        (DType::F16, CacheDType::Fp8E4m3, 128, (8, 1), 32),
        (DType::F16, CacheDType::Fp8E5m2, 96, (6, 1), 32),
        (DType::Bf16, CacheDType::Fp8E5m2, 64, (16, 1), 16),
    ] {
        for variant in ["plain", "sinks+alibi", "nhd"] {
            let mut p = params(h, hkv, d, cache);
            if variant == "sinks+alibi" {
                p.sinks = Some((0..h).map(|i| 0.3 + (i % 7) as f32 * 0.4).collect());
                p.alibi_slopes = Some((0..h).map(|i| 0.5f32.powi(i as i32 % 8 + 1)).collect());
            }
            let case = CaseConfig::new(p, dtype, bs);
            for (name, spec) in [("long", &long), ("mixed", &mixed)] {
                seed += 1;
                check_layout(
                    &b,
                    &format!("fp8 decode {dtype} {cache} d{d} ({h},{hkv}) bs{bs} {variant} {name}"),
                    &case,
                    spec,
                    seed,
                    variant == "nhd",
                );
            }
        }
    }
}

/// A few decode-kernel cases (split with sinks and the combine, head chunks on an NHD cache,
/// many unsplit decodes with a window), small enough for compute-sanitizer's racecheck.
#[test]
fn decode_kernel_sanitizer_set() {
    let Some(b) = cuda("decode_kernel_sanitizer_set") else {
        return;
    };
    let long = BatchSpec::new(&[(1, 2100), (1, 1), (1, 300)]);
    let mixed = BatchSpec::new(&[(1, 300), (20, 100), (1, 700), (3, 40)]);
    let many: Vec<(usize, usize)> = (0..12).map(|i| (1, 50 + 41 * i)).collect();
    let many = BatchSpec::new(&many);
    let mut p = params(32, 8, 128, CacheDType::Auto);
    p.sinks = Some((0..32).map(|i| 0.2 * (i % 5) as f32).collect());
    let case = CaseConfig::new(p, DType::Bf16, 16);
    check(
        &b,
        "sanitizer bf16 d128 (32,8) sinks long",
        &case,
        &long,
        900,
    );
    let case = CaseConfig::new(params(40, 2, 128, CacheDType::Auto), DType::F16, 64);
    check_layout(
        &b,
        "sanitizer f16 d128 (40,2) nhd mixed",
        &case,
        &mixed,
        901,
        true,
    );
    let mut p = params(8, 1, 64, CacheDType::Auto);
    p.sliding_window = Some(200);
    let case = CaseConfig::new(p, DType::Bf16, 32);
    check(
        &b,
        "sanitizer bf16 d64 (8,1) window many",
        &case,
        &many,
        902,
    );
}

/// A small prefill set for compute-sanitizer (racecheck is slow: long_prefill's 30 cases take
/// minutes under it): only batches the tensor-core prefill kernels take, their plain and their
/// soft cap / ALiBi builds, chunked and fresh requests, a window, sinks, GQA groups of 1 to 8,
/// blocks of 16 to 64, d64 / d96 / d128 (on sm_90 d64 and d128 run on the wgmma kernel, d96 on
/// the mma.sync one; `POLYATTN_CUDA_MMA=1` puts all on mma.sync).
/// h200.sh runs it with each CTA shape forced (POLYATTN_CUDA_MMA_ROWS / _WARPS).
#[test]
fn prefill_kernel_sanitizer_set() {
    let Some(b) = cuda("prefill_kernel_sanitizer_set") else {
        return;
    };
    let spec = BatchSpec::new(&[(130, 400), (40, 40), (70, 70)]);
    let mut alibi = params(8, 2, 128, CacheDType::Auto);
    alibi.alibi_slopes = Some((0..8).map(|i| 0.5f32.powi(i + 2)).collect());
    let mut window = params(4, 4, 64, CacheDType::Auto);
    window.sliding_window = Some(50);
    let mut sinks = params(6, 1, 96, CacheDType::Auto);
    sinks.sinks = Some((0..6).map(|i| 0.5 - i as f32 * 0.1).collect());
    let mut capped = params(16, 2, 128, CacheDType::Auto);
    capped.logits_soft_cap = Some(4.0);
    capped.sinks = Some((0..16).map(|i| 0.3 - i as f32 * 0.05).collect());
    let cases = [
        ("f16 d128 (8,2) alibi", alibi, DType::F16, 16),
        (
            "f16 d128 (16,2) soft cap + sinks, blocks of 64",
            capped,
            DType::F16,
            64,
        ),
        (
            "bf16 d128 (8,2) plain",
            params(8, 2, 128, CacheDType::Auto),
            DType::Bf16,
            16,
        ),
        ("bf16 d64 (4,4) window", window, DType::Bf16, 16),
        ("bf16 d96 (6,1) sinks", sinks, DType::Bf16, 32),
    ];
    for (i, (label, p, dtype, block)) in cases.into_iter().enumerate() {
        let case = CaseConfig::new(p, dtype, block);
        let label = format!("sanitizer prefill {label}");
        check(&b, &label, &case, &spec, 910 + i as u64);
    }
}
