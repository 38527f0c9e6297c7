//! CUDA-only checks at lengths the shared suite (tests/attention_correctness.rs, small shapes
//! on every backend) does not reach: split-KV decode (flash-decoding plus the combine kernel,
//! which only kicks in past ~512 keys), long causal prefill and chunked prefill (many key
//! tiles; with `POLYATTN_CUDA_MMA=1` the tensor-core kernel), cascade over a long shared
//! prefix, each with sinks / window / ALiBi / soft cap / fp8 variants, against the f64
//! reference.
//!
//! The decode-kernel test (`decode_kernel_matches_reference`) covers the tensor-core decode
//! kernel (paged_decode.cu) across head sizes, GQA groups (including groups above its 16 rows),
//! block sizes, NHD and HND caches, batches that mix it with the other kernels, and split and
//! unsplit decodes; with `POLYATTN_CUDA_DECODE=0` the same cases check the fallback.
//!
//! The graph tests (`graph_*`) capture decode steps into CUDA graphs and replay them with
//! updated persistent buffers, comparing every replay bit for bit with eager forwards.
//!
//! Without a usable CUDA device (no driver, no GPU, no NVRTC) every test prints SKIP with the
//! reason and passes; on the H200 they run (see the CUDA backend's test plan).

#[macro_use]
mod common;

use polyattn::device::Storage;
use polyattn::reference;
use polyattn::registry;
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch, Rng, Tolerance};
use polyattn::{
    AttentionBackend, AttentionLayer, AttentionParams, BackendRef, BatchDescription, CacheDType,
    CommonAttentionMetadata, DType, KvCache, KvCacheSpec, KvLayout, Tensor,
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
/// minutes under it): only batches the tensor-core prefill kernel takes, its plain and its
/// soft cap / ALiBi build, chunked and fresh requests, a window, sinks, d64 / d96 / d128.
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
    let cases = [
        ("f16 d128 (8,2) alibi", alibi, DType::F16, 16),
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

// ---------------------------------------------------------------------------------------
// CUDA graphs: capture and replay of decode steps (GraphCaptureSupport::UniformSingleTokenDecode).

/// The raw bits of a tensor's elements (fp8 bytes, or the f32 image of f16 / bf16 / f32
/// elements, which is injective), for exact comparisons.
fn bits(t: &Tensor) -> polyattn::Result<Vec<u32>> {
    Ok(if t.dtype().is_fp8() {
        t.to_u8_vec()?.into_iter().map(u32::from).collect()
    } else {
        t.to_f32_vec()?.into_iter().map(f32::to_bits).collect()
    })
}

/// Queues a device copy of `src` into `dst` (same shape), as a runner fills its persistent
/// input buffers.
fn fill(dst: &mut Tensor, src: &Tensor) -> polyattn::Result<()> {
    let dev = match dst.device() {
        polyattn::Device::Cuda(d) => d.clone(),
        _ => unreachable!("CUDA tensors only"),
    };
    match (dst.storage_mut(), src.storage()) {
        (Storage::Cuda(d), Storage::Cuda(s)) => dev.copy(s, d),
        _ => unreachable!("CUDA tensors only"),
    }
}

fn random_tensor(
    device: &polyattn::Device,
    rng: &mut Rng,
    shape: &[usize],
    dtype: DType,
) -> polyattn::Result<Tensor> {
    let n: usize = shape.iter().product();
    Tensor::from_f32(device, &rng.normals(n), shape, dtype)
}

/// `steps` decode steps of one batch: request r has `base[r] + s` tokens at step s (its new
/// token at position `base[r] + s - 1`); a block enters a request's row at the step that first
/// writes into it. Block ids come shuffled from `1..num_blocks`; rows have two spare columns,
/// so the graph plan's longest context exceeds every request's. Returns the steps and the
/// cache's block count.
fn decode_steps(
    base: &[usize],
    bs: usize,
    steps: usize,
    seed: u64,
) -> (Vec<BatchDescription>, usize) {
    let mut rng = Rng::new(seed);
    let need: Vec<usize> = base.iter().map(|&s| (s + steps - 1).div_ceil(bs)).collect();
    let width = need.iter().copied().max().unwrap_or(0) + 2;
    let num_blocks = 1 + need.iter().sum::<usize>() + 3;
    let mut pool: Vec<i32> = (1..num_blocks as i32).collect();
    rng.shuffle(&mut pool);
    let rows: Vec<Vec<i32>> = need.iter().map(|&n| pool.drain(..n).collect()).collect();
    let descs = (0..steps)
        .map(|s| {
            let mut block_table = vec![0i32; base.len() * width];
            let mut slot_mapping = Vec::new();
            let mut seq_lens = Vec::new();
            for (r, row) in rows.iter().enumerate() {
                let seq = base[r] + s;
                let pos = seq - 1;
                block_table[r * width..][..seq.div_ceil(bs)]
                    .copy_from_slice(&row[..seq.div_ceil(bs)]);
                slot_mapping.push(row[pos / bs] as i64 * bs as i64 + (pos % bs) as i64);
                seq_lens.push(seq as i32);
            }
            BatchDescription {
                query_start_loc: (0..=base.len() as i32).collect(),
                seq_lens,
                block_table,
                max_blocks_per_req: width,
                slot_mapping,
                causal: true,
                block_size: bs,
                is_prefilling: None,
            }
        })
        .collect();
    (descs, num_blocks)
}

/// One configuration of [`graph_replayed_decode_equals_eager`]: three layers (plain; sinks;
/// window + ALiBi + soft cap) over four decode steps of five requests. Step 1 runs eagerly
/// on graph metadata (the warm-up) and is captured; steps 2-4 write the persistent inputs,
/// rebuild the graph metadata and replay. Each step is compared with (a) an eager forward on
/// graph metadata of a second builder and identical caches: outputs and caches bit-identical
/// (same kernels, same work lists, same inputs); (b) an eager forward on plain metadata
/// (`build`): caches bit-identical, outputs within the dtype's tolerance (its split-KV
/// plan differs, so the f32 summation order differs).
fn graph_case(
    b: &BackendRef,
    label: &str,
    dtype: DType,
    cache: CacheDType,
    (h, hkv, d): (usize, usize, usize),
    bs: usize,
    seed: u64,
) -> polyattn::Result<()> {
    let be: &dyn AttentionBackend = b.as_ref();
    let device = be.device()?;
    let cuda = match &device {
        polyattn::Device::Cuda(c) => c.clone(),
        _ => unreachable!("the CUDA backend's device"),
    };
    let (steps, num_blocks) = decode_steps(&[1500, 31, 700, 2100, 63], bs, 4, seed);
    let n = steps[0].seq_lens.len();
    let spec = KvCacheSpec {
        block_size: bs,
        num_kv_heads: hkv,
        head_size: d,
        dtype,
        cache_dtype: cache,
    };
    let mut rng = Rng::new(seed ^ 0x9e37);
    struct Layer {
        imp: Box<dyn polyattn::AttentionImpl>,
        layer: AttentionLayer,
        caches: [KvCache; 3], // graph, eager on graph metadata, eager on plain metadata
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
    }
    let mut layers = Vec::new();
    for l in 0..3 {
        let mut p = params(h, hkv, d, cache);
        match l {
            1 => p.sinks = Some((0..h).map(|i| 0.3 + (i % 5) as f32 * 0.4).collect()),
            2 => {
                p.sliding_window = Some(500);
                p.alibi_slopes = Some((0..h).map(|i| 0.5f32.powi(i as i32 % 8 + 1)).collect());
                p.logits_soft_cap = Some(4.0);
            }
            _ => {}
        }
        let layer = if cache.is_fp8() {
            AttentionLayer::new("graph.layer").with_scales(0.7, 1.3)?
        } else {
            AttentionLayer::new("graph.layer")
        };
        let mut kv = KvCache::new(be, spec, num_blocks)?;
        let shape = kv.data().shape().to_vec();
        *kv.data_mut() = random_tensor(&device, &mut rng, &shape, spec.storage_dtype())?;
        layers.push(Layer {
            imp: be.make_impl(p)?,
            layer,
            caches: [kv.clone(), kv.clone(), kv],
            q: Tensor::zeros(&device, &[n, h, d], dtype)?,
            k: Tensor::zeros(&device, &[n, hkv, d], dtype)?,
            v: Tensor::zeros(&device, &[n, hkv, d], dtype)?,
            out: Tensor::zeros(&device, &[n, h, d], dtype)?,
        });
    }
    let graph_builder = be.make_builder(&spec)?;
    let eager_builder = be.make_builder(&spec)?;
    let plain_builder = be.make_builder(&spec)?;
    assert_eq!(
        graph_builder.graph_capture_support(),
        polyattn::GraphCaptureSupport::UniformSingleTokenDecode
    );
    let mut graph: Option<polyattn::device::CudaGraph> = None;
    for (s, desc) in steps.iter().enumerate() {
        let common = CommonAttentionMetadata::new(&device, desc.clone())?;
        let inputs: Vec<[Tensor; 3]> = (0..layers.len())
            .map(|_| -> polyattn::Result<[Tensor; 3]> {
                Ok([
                    random_tensor(&device, &mut rng, &[n, h, d], dtype)?,
                    random_tensor(&device, &mut rng, &[n, hkv, d], dtype)?,
                    random_tensor(&device, &mut rng, &[n, hkv, d], dtype)?,
                ])
            })
            .collect::<polyattn::Result<_>>()?;
        // The graph side: this step's inputs into the captured tensors, then the metadata
        // update (asynchronous uploads into the persistent buffers), then the replay.
        for (ly, [q, k, v]) in layers.iter_mut().zip(&inputs) {
            fill(&mut ly.q, q)?;
            fill(&mut ly.k, k)?;
            fill(&mut ly.v, v)?;
        }
        let md = graph_builder.build_for_graph_capture(&common)?;
        match &graph {
            None => {
                // Step 1 eagerly (warm-up: plans, uploads, compiles), then captured.
                let run = |layers: &mut Vec<Layer>| -> polyattn::Result<()> {
                    for ly in layers.iter_mut() {
                        let [c, _, _] = &mut ly.caches;
                        ly.imp.forward(
                            &ly.layer,
                            &ly.q,
                            Some(&ly.k),
                            Some(&ly.v),
                            c,
                            md.as_ref(),
                            &mut ly.out,
                        )?;
                    }
                    Ok(())
                };
                run(&mut layers)?;
                graph = Some(cuda.capture(|| run(&mut layers))?);
            }
            Some(g) => g.replay()?,
        }
        // The eager sides, on copies of the inputs.
        let exact_md = eager_builder.build_for_graph_capture(&common)?;
        let plain_md = plain_builder.build(0, &common, false)?;
        let mut outs = Vec::new();
        for (ly, [q, k, v]) in layers.iter_mut().zip(&inputs) {
            let [_, ce, cp] = &mut ly.caches;
            let mut oe = Tensor::zeros(&device, &[n, h, d], dtype)?;
            let mut op = Tensor::zeros(&device, &[n, h, d], dtype)?;
            ly.imp.forward(
                &ly.layer,
                q,
                Some(k),
                Some(v),
                ce,
                exact_md.as_ref(),
                &mut oe,
            )?;
            ly.imp.forward(
                &ly.layer,
                q,
                Some(k),
                Some(v),
                cp,
                plain_md.as_ref(),
                &mut op,
            )?;
            outs.push((oe, op));
        }
        device.synchronize()?;
        let tol = Tolerance::for_dtype(dtype);
        for (l, (ly, (oe, op))) in layers.iter().zip(&outs).enumerate() {
            let what = format!("{label} step {} layer {l}", s + 1);
            let got = bits(&ly.out)?;
            assert!(
                got.iter().any(|&x| x != 0),
                "{what}: graph output is all zeros"
            );
            assert!(got == bits(oe)?, "{what}: graph output != eager output");
            let [cg, ce, cp] = &ly.caches;
            let cache_bits = bits(cg.data())?;
            assert!(
                cache_bits == bits(ce.data())?,
                "{what}: graph KV cache != eager KV cache"
            );
            assert!(
                cache_bits == bits(cp.data())?,
                "{what}: graph KV cache != plain-metadata KV cache"
            );
            let want: Vec<f64> = op.to_f32_vec()?.into_iter().map(f64::from).collect();
            let c = reference::compare(&ly.out.to_f32_vec()?, &want, tol);
            assert!(c.pass, "{what}: graph vs plain-metadata eager output {c}");
        }
    }
    report!("  ok   {label}: 4 steps x 3 layers, replays bit-identical to eager");
    Ok(())
}

#[test]
fn graph_replayed_decode_equals_eager() {
    let Some(b) = cuda("graph_replayed_decode_equals_eager") else {
        return;
    };
    // bf16 and f16 run the tensor-core decode kernel (the wave-filling split plan); the fp8
    // cache runs the CUDA-core kernel with its own split rule and partial scratch.
    let cases = [
        (
            "bf16 d128 (32,8) bs16",
            DType::Bf16,
            CacheDType::Auto,
            (32, 8, 128),
            16,
        ),
        (
            "f16 d64 (8,1) bs32",
            DType::F16,
            CacheDType::Auto,
            (8, 1, 64),
            32,
        ),
        (
            "f16 fp8_e4m3 d128 (8,2) bs16",
            DType::F16,
            CacheDType::Fp8E4m3,
            (8, 2, 128),
            16,
        ),
    ];
    for (i, (label, dtype, cache, shape, bs)) in cases.into_iter().enumerate() {
        if let Err(e) = graph_case(&b, label, dtype, cache, shape, bs, 1000 + i as u64) {
            panic!("{label}: error {e}");
        }
    }
}

/// What cannot be captured fails with a typed error, and the device stays usable.
#[test]
fn graph_capture_rejects_non_decode_batches() {
    let Some(b) = cuda("graph_capture_rejects_non_decode_batches") else {
        return;
    };
    let result = (|| -> polyattn::Result<()> {
        let be: &dyn AttentionBackend = b.as_ref();
        let device = be.device()?;
        let cuda = match &device {
            polyattn::Device::Cuda(c) => c.clone(),
            _ => unreachable!("the CUDA backend's device"),
        };
        let p = params(8, 2, 128, CacheDType::Auto);
        let case = CaseConfig::new(p.clone(), DType::Bf16, 16);
        let prefill = BatchSpec::new(&[(1, 300), (20, 100), (3, 40)]);
        let mut batch = RandomBatch::generate(be, &case, &prefill, 77)?;
        let imp = be.make_impl(p.clone())?;
        let builder = be.make_builder(&KvCacheSpec {
            block_size: 16,
            num_kv_heads: 2,
            head_size: 128,
            dtype: DType::Bf16,
            cache_dtype: CacheDType::Auto,
        })?;
        let common = CommonAttentionMetadata::new(&device, batch.desc.clone())?;
        // 1. Graph metadata of a batch with prefills: a metadata error naming the level.
        match builder.build_for_graph_capture(&common) {
            Err(polyattn::Error::Metadata(m)) => {
                assert!(m.contains("UniformSingleTokenDecode"), "{m}");
                report!("  ok   prefill graph metadata refused: {m}");
            }
            other => panic!("expected a metadata error, got {other:?}"),
        }
        // 2. Capturing a forward on plain metadata: a device error, nothing captured.
        let md = builder.build(0, &common, false)?;
        let mut out = batch.empty_output()?;
        let r = cuda.capture(|| {
            imp.forward(
                &batch.layer,
                &batch.query,
                Some(&batch.key),
                Some(&batch.value),
                &mut batch.kv_cache,
                md.as_ref(),
                &mut out,
            )
        });
        match r {
            Err(polyattn::Error::Device { message, .. }) => {
                assert!(message.contains("build_for_graph_capture"), "{message}");
                report!("  ok   capture of a plain-metadata forward refused: {message}");
            }
            other => panic!("expected a device error, got {other:?}"),
        }
        // 3. The closure's own error comes back as is.
        match cuda.capture(|| Err(polyattn::Error::Config("closure failed on purpose".into()))) {
            Err(polyattn::Error::Config(m)) => assert!(m.contains("on purpose")),
            other => panic!("expected the closure's error, got {other:?}"),
        }
        // 4. Allocating inside a capture is refused by the crate ...
        match cuda.capture(|| Tensor::zeros(&device, &[16], DType::F32).map(|_| ())) {
            Err(polyattn::Error::Device { message, .. }) => {
                assert!(message.contains("inside a CUDA graph capture"), "{message}")
            }
            other => panic!("expected a device error, got {other:?}"),
        }
        // ... a synchronisation is refused by the driver (the closure passes its error on) ...
        let r = cuda.capture(|| {
            cuda.stream()
                .synchronize()
                .map_err(|e| polyattn::Error::Device {
                    backend: "test".into(),
                    message: format!("synchronize inside the capture: {e}"),
                })
        });
        match r {
            Err(polyattn::Error::Device { message, .. }) => {
                report!("  ok   synchronize inside a capture refused: {message}")
            }
            other => panic!("expected a device error, got {other:?}"),
        }
        // ... and, when the closure ignores that error, the driver has invalidated the capture.
        match cuda.capture(|| {
            let _ = cuda.stream().synchronize();
            Ok(())
        }) {
            Err(polyattn::Error::Device { message, .. }) => {
                report!("  ok   driver-invalidated capture: {message}")
            }
            other => panic!("expected a device error, got {other:?}"),
        }
        // 5. Graph metadata, but a layer shape that has not run eagerly yet: refused.
        let decode = BatchSpec::new(&[(1, 300), (1, 1000), (1, 40)]);
        let mut dbatch = RandomBatch::generate(be, &case, &decode, 78)?;
        let dcommon = CommonAttentionMetadata::new(&device, dbatch.desc.clone())?;
        let gmd = builder.build_for_graph_capture(&dcommon)?;
        let mut dout = dbatch.empty_output()?;
        let r = cuda.capture(|| {
            imp.forward(
                &dbatch.layer,
                &dbatch.query,
                Some(&dbatch.key),
                Some(&dbatch.value),
                &mut dbatch.kv_cache,
                gmd.as_ref(),
                &mut dout,
            )
        });
        match r {
            Err(polyattn::Error::Device { message, .. }) => {
                // The plan (or, when no earlier test ran it, the kernel module) is missing.
                assert!(message.contains("inside a CUDA graph capture"), "{message}");
                report!("  ok   capture before warm-up refused: {message}");
            }
            other => panic!("expected a device error, got {other:?}"),
        }
        // 6. Metadata of an older build is stale once a newer build rewrote the buffers.
        let gmd2 = builder.build_for_graph_capture(&dcommon)?;
        let stale = imp.forward(
            &dbatch.layer,
            &dbatch.query,
            Some(&dbatch.key),
            Some(&dbatch.value),
            &mut dbatch.kv_cache,
            gmd.as_ref(),
            &mut dout,
        );
        assert!(
            matches!(&stale, Err(polyattn::Error::Metadata(m)) if m.contains("stale")),
            "{stale:?}"
        );
        drop(gmd2);
        Ok(())
    })();
    if let Err(e) = result {
        panic!("error {e}");
    }
    // The device and its stream still work: a full forward checked against the reference.
    let case = CaseConfig::new(params(8, 2, 128, CacheDType::Auto), DType::Bf16, 16);
    check(
        &b,
        "eager forward after failed captures",
        &case,
        &BatchSpec::new(&[(1, 300), (20, 100), (1, 2000)]),
        79,
    );
}
