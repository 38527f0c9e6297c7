//! wgpu-specific checks the shared bodies do not make: the device opens on the adapter CI
//! asks for, the cache write is bit-exact with `src/fp8.rs` and `half` on awkward values,
//! every code path of the attention kernel (split-KV partials and combine, one pass, subgroup
//! and serial softmax, the tiled / tiled2 / tiled2h (f16) prefill forms, subgroup widths
//! 4 / 8 / 16 on lavapipe, unusual head sizes) matches the f64 reference, pipelines are
//! compiled once, and a cache larger than one storage binding is a typed error.
//!
//! Every test skips (saying why) when no wgpu adapter opens, except
//! `vulkan_adapter_when_asked`, which fails when `WGPU_BACKEND=vulkan` (as in CI) yet no
//! Vulkan adapter opens: a broken lavapipe install must not pass as a GL fallback.

#[macro_use]
mod common;

use half::{bf16, f16};
use polyattn::backends::wgpu::{
    prefill_tile_fits, PrefillForm, WgpuAttentionImpl, WgpuBackend, WgpuMetadataBuilder,
    WgpuTuning, PREFILL_TILED2_WORKGROUP,
};
use polyattn::device::wgpu::{bind_group, dispatch, pipeline, upload_words, whole, ParamBlock};
use polyattn::device::WgpuDevice;
use polyattn::kernels::wgsl::{
    coop_shared_bytes, coop_split, tiled2_shared_bytes, tiled2h_shared_bytes, AttentionShader,
    COOP_KEYS, COOP_ROWS,
};
use polyattn::reference;
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch, Rng, Tolerance};
use polyattn::{
    fp8, AttentionBackend, AttentionImpl, AttentionLayer, AttentionMetadataBuilder,
    AttentionParams, BatchDescription, CacheDType, CommonAttentionMetadata, DType, Device, KvCache,
    KvCacheSpec, KvLayout, Tensor,
};

/// The device, or `None` (after saying why) when no adapter opens here.
fn device(test: &str) -> Option<WgpuDevice> {
    match WgpuDevice::open() {
        Ok(d) => Some(d),
        Err(e) => {
            report!("[{test}] skipped: {e}");
            None
        }
    }
}

#[test]
fn vulkan_adapter_when_asked() {
    let wants_vulkan = std::env::var("WGPU_BACKEND")
        .map(|v| v.eq_ignore_ascii_case("vulkan") || v.eq_ignore_ascii_case("vk"))
        .unwrap_or(false);
    match WgpuDevice::open() {
        Ok(d) => {
            report!("[wgpu device] {}", d.description());
            if wants_vulkan {
                assert_eq!(d.adapter_info().backend, wgpu::Backend::Vulkan);
            }
            let avail = WgpuBackend::new().availability();
            assert!(avail.is_available(), "{avail:?}");
        }
        Err(e) => {
            assert!(
                !wants_vulkan,
                "WGPU_BACKEND=vulkan but no Vulkan adapter opened: {e} \
                 (install mesa-vulkan-drivers for lavapipe)"
            );
            report!("[wgpu device] none: {e}");
        }
    }
}

/// f32 activations whose cache conversions are easy to get wrong: ties (for fp8 with a
/// power-of-two scale, for f16 and bf16), values around the subnormal and saturation
/// boundaries, ±0, ±inf, NaN, and random bit patterns.
fn awkward_values(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut v = Vec::new();
    for t in [&fp8::E4M3_TABLE, &fp8::E5M2_TABLE] {
        for i in 0..255usize {
            let (a, b) = (t[i], t[i + 1]);
            if a.is_finite() && b.is_finite() && a < b {
                let mid = (a + b) / 2.0;
                // Scale 0.5 below: stored x / 0.5 = mid exactly, a tie in fp8.
                v.extend([mid * 0.5, -mid * 0.5, a * 0.5, b * 0.5]);
            }
        }
    }
    // f16 and bf16 ties and neighbours.
    for bits in [0x3c00u16, 0x0001, 0x03ff, 0x7bff, 0x0400, 0x3555] {
        let a = f16::from_bits(bits).to_f32();
        let b = f16::from_bits(bits + 1).to_f32();
        v.extend([(a + b) / 2.0, -(a + b) / 2.0]);
    }
    for bits in [0x3f80u16, 0x0001, 0x7f7f, 0x3eaa] {
        let a = bf16::from_bits(bits).to_f32();
        let b = bf16::from_bits(bits + 1).to_f32();
        v.extend([(a + b) / 2.0, -(a + b) / 2.0]);
    }
    v.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e30,
        -1e30,
        448.0 * 0.5,
        464.0 * 0.5,
        480.0 * 0.5,
        57344.0 * 0.5,
        61440.0 * 0.5,
        f32::MIN_POSITIVE,
        1e-40,
        65520.0,
        65519.0,
    ]);
    while v.len() < n {
        let x = f32::from_bits(rng.next_u64() as u32);
        v.push(if x.is_finite() { x % 1e6 } else { x });
    }
    v
}

/// What the CPU writes for one element.
fn expected_bits(cache: CacheDType, x: f32, scale: f32) -> u32 {
    match cache {
        CacheDType::Fp8E4m3 => fp8::encode_e4m3(x / scale) as u32,
        CacheDType::Fp8E5m2 => fp8::encode_e5m2(x / scale) as u32,
        CacheDType::F16 => f16::from_f32(x).to_bits() as u32,
        CacheDType::Bf16 => bf16::from_f32(x).to_bits() as u32,
        CacheDType::Auto => x.to_bits(),
    }
}

fn cache_bits(cache: &KvCache) -> polyattn::Result<Vec<u32>> {
    let host = cache.data().to_host()?;
    Ok(match host {
        polyattn::device::CpuStorage::U8(v) => v.iter().map(|&b| b as u32).collect(),
        polyattn::device::CpuStorage::F16(v) => v.iter().map(|b| b.to_bits() as u32).collect(),
        polyattn::device::CpuStorage::Bf16(v) => v.iter().map(|b| b.to_bits() as u32).collect(),
        polyattn::device::CpuStorage::F32(v) => v.iter().map(|b| b.to_bits()).collect(),
        _ => Vec::new(),
    })
}

#[test]
fn cache_writes_are_bit_exact() {
    let Some(dev) = device("cache_writes_are_bit_exact") else {
        return;
    };
    let device = Device::Wgpu(dev.clone());
    let (hkv, d, bs) = (2usize, 32usize, 16usize);
    let mut rng = Rng::new(7);
    let values = awkward_values(&mut rng, 4096);
    let tokens = values.len().div_ceil(2 * hkv * d);
    let mut k = values.clone();
    k.resize(tokens * hkv * d, 1.0);
    let mut v: Vec<f32> = k.iter().rev().copied().collect();
    v.rotate_left(5);
    let num_blocks = tokens.div_ceil(bs) + 2;
    // Slots in reverse order, one padded (−1) and one written twice (the last write wins).
    let mut slots: Vec<i64> = (0..tokens as i64).rev().map(|t| t + bs as i64).collect();
    slots[3] = -1;
    slots[10] = slots[4];
    let width = num_blocks;
    let desc = BatchDescription {
        query_start_loc: vec![0, tokens as i32],
        seq_lens: vec![tokens as i32 + bs as i32],
        block_table: (0..width as i32).collect(),
        max_blocks_per_req: width,
        slot_mapping: slots.clone(),
        causal: true,
        block_size: bs,
        is_prefilling: None,
    };
    for cache_dtype in [
        CacheDType::Fp8E4m3,
        CacheDType::Fp8E5m2,
        CacheDType::F16,
        CacheDType::Bf16,
        CacheDType::Auto,
    ] {
        for (scale, layout) in [(0.5f32, KvLayout::Hnd), (0.05, KvLayout::Nhd)] {
            let spec = KvCacheSpec {
                block_size: bs,
                num_kv_heads: hkv,
                head_size: d,
                dtype: DType::F32,
                cache_dtype,
            };
            let mut params = AttentionParams::new(hkv, d, hkv);
            params.kv_cache_dtype = cache_dtype;
            let imp = WgpuAttentionImpl::new(dev.clone(), params).unwrap();
            let builder = WgpuMetadataBuilder::new(dev.clone(), spec);
            let mut cache = KvCache::with_layout(&device, spec, num_blocks, layout).unwrap();
            let key = Tensor::from_f32(&device, &k, &[tokens, hkv, d], DType::F32).unwrap();
            let value = Tensor::from_f32(&device, &v, &[tokens, hkv, d], DType::F32).unwrap();
            let common = CommonAttentionMetadata::new(&device, desc.clone()).unwrap();
            let md = builder.build(0, &common, false).unwrap();
            let layer = AttentionLayer::new("l").with_scales(scale, scale).unwrap();
            imp.do_kv_cache_update(&layer, &key, &value, &mut cache, md.as_ref())
                .unwrap();
            let got = cache_bits(&cache).unwrap();
            let mut mismatches = Vec::new();
            for (t, &slot) in slots.iter().enumerate() {
                if slot < 0 || slots[t + 1..].contains(&slot) {
                    continue;
                }
                let (b, o) = (slot as usize / bs, slot as usize % bs);
                for h in 0..hkv {
                    for (kv, src) in [(0, &k), (1, &v)] {
                        let base = cache.offset(b, kv, o, h);
                        for i in 0..d {
                            let x = src[(t * hkv + h) * d + i];
                            let want = expected_bits(cache_dtype, x, scale);
                            if got[base + i] != want {
                                mismatches.push(format!(
                                    "x = {x:e} ({:#010x}): got {:#x}, want {want:#x}",
                                    x.to_bits(),
                                    got[base + i]
                                ));
                            }
                        }
                    }
                }
            }
            assert!(
                mismatches.is_empty(),
                "{cache_dtype} scale {scale} {layout:?}: {} mismatches, first: {:?}",
                mismatches.len(),
                &mismatches[..mismatches.len().min(8)]
            );
        }
    }
}

/// Runs one batch through the impl built with `tuning` and compares with the reference.
fn check_batch(
    dev: &WgpuDevice,
    case: &CaseConfig,
    spec: &BatchSpec,
    tuning: WgpuTuning,
    seed: u64,
) -> Result<(), String> {
    let backend = WgpuBackend::new();
    let mut batch = RandomBatch::generate(&backend, case, spec, seed).map_err(|e| e.to_string())?;
    let want = reference::attention(&batch).map_err(|e| e.to_string())?;
    let p = &case.params;
    let imp = WgpuAttentionImpl::with_tuning(dev.clone(), p.clone(), tuning)
        .map_err(|e| e.to_string())?;
    // A tuning that asks for the tiled2 prefill form must get it where its workgroup memory
    // fits the adapter (d100 f32 at 64 x 32 needs 48.5 KiB: the H200's Vulkan allows 48,
    // lavapipe more), and the tiled form otherwise. One that asks for tiled2h gets it for
    // f16 activations with an f16 cache on adapters with SHADER_F16 where it fits, and
    // falls back to tiled2 (then tiled) otherwise.
    let kv_dtype = batch.kv_cache.spec().storage_dtype();
    let prefill = imp.shaders().tile_shader(true, case.dtype, kv_dtype, true);
    let limit = dev.limits().max_compute_workgroup_storage_size;
    let (d, bm, bn) = (p.head_size as u32, prefill.block_m, prefill.block_n);
    let t2_fits = tiled2_shared_bytes(d, bm, bn) <= limit;
    let t2h = tuning.prefill_form.allows_f16()
        && dev.has_f16()
        && case.dtype == DType::F16
        && kv_dtype == DType::F16
        && tiled2h_shared_bytes(d, bm, bn) <= limit;
    let t2 = !t2h && tuning.prefill_form.is_fused() && t2_fits;
    // The coop form where the tuning asks for it and the device has cooperative matrices
    // with 32-lane subgroups, for f16 layers with an f16 cache at head sizes that are
    // multiples of 16 up to 128; its own checks end here.
    let info = dev.adapter_info();
    let want_coop = tuning.prefill_form == PrefillForm::CooperativeMatrix
        && tuning.subgroups
        && dev.has_coop()
        && (info.subgroup_min_size, info.subgroup_max_size) == (32, 32)
        && case.dtype == DType::F16
        && kv_dtype == DType::F16
        && d % 16 == 0
        && d <= 128;
    let got_coop = prefill.tiled2.is_some_and(|t| t.coop);
    if want_coop != got_coop {
        return Err(format!("prefill kernel {} for {:?}", prefill.key(), tuning));
    }
    let got_t2h = prefill.tiled2.is_some_and(|t| t.half && !t.coop);
    let got_t2 = prefill.tiled2.is_some_and(|t| !t.half);
    if !got_coop && (t2h, t2) != (got_t2h, got_t2) {
        return Err(format!("prefill kernel {} for {:?}", prefill.key(), tuning));
    }
    // tiled2h's own chunk length (prefill_keys_h) replaces the tile's BN wherever it fits.
    let own_n = tuning
        .prefill_keys_h
        .filter(|&n| got_t2h && tiled2h_shared_bytes(d, bm, n) <= limit);
    // Its own rows per tile (prefill_rows_h) likewise replace the tile's BM.
    let own_m = tuning
        .prefill_rows_h
        .filter(|&m| got_t2h && tiled2h_shared_bytes(d, m, bn) <= limit);
    if own_n.is_some_and(|n| n != bn) || own_m.is_some_and(|m| m != bm) {
        return Err(format!("prefill kernel {} for {:?}", prefill.key(), tuning));
    }
    // The coop form takes tiled2h's rows / keys knobs where they are multiples of 16 (and
    // fit), else its 64 x 64; the tile knobs are tiled2's.
    if got_coop {
        let ask = (
            tuning.prefill_rows_h.unwrap_or(COOP_ROWS),
            tuning.prefill_keys_h.unwrap_or(COOP_KEYS),
        );
        let want = if ask.0.is_multiple_of(16)
            && ask.1.is_multiple_of(16)
            && coop_shared_bytes(d, ask.0, ask.1) <= limit
        {
            ask
        } else {
            (COOP_ROWS, COOP_KEYS)
        };
        if (bm, bn) != want {
            return Err(format!("prefill kernel {} for {:?}", prefill.key(), tuning));
        }
        // Subgroups per 16-row tile: the one asked for where it fits, else the most that fit.
        let split = coop_split(d, bm, bn, tuning.prefill_coop_split);
        if prefill.workgroup() != 2 * bm * split {
            return Err(format!(
                "prefill kernel {} for {:?}: want {split} subgroups per row tile",
                prefill.key(),
                tuning
            ));
        }
    } else if let (true, Some(t)) = (tuning.prefill_tiles, tuning.prefill_tile) {
        // Used wherever it fits (elsewhere the default tile runs, with a warning).
        let want = (own_m.unwrap_or(t.0), own_n.unwrap_or(t.1));
        if prefill_tile_fits(dev.wgsl_info(), p.head_size, t) && (bm, bn) != want {
            return Err(format!("prefill kernel {} for {:?}", prefill.key(), tuning));
        }
    }
    let kv_spec = KvCacheSpec {
        block_size: case.block_size,
        num_kv_heads: p.num_kv_heads,
        head_size: p.head_size,
        dtype: case.dtype,
        cache_dtype: p.kv_cache_dtype,
    };
    let builder = WgpuMetadataBuilder::new(dev.clone(), kv_spec);
    let device = Device::Wgpu(dev.clone());
    let common =
        CommonAttentionMetadata::new(&device, batch.desc.clone()).map_err(|e| e.to_string())?;
    let md = builder
        .build(case.common_prefix_len, &common, false)
        .map_err(|e| e.to_string())?;
    let n = spec.num_tokens();
    let mut out = batch.empty_output().map_err(|e| e.to_string())?;
    let mut lse =
        Tensor::zeros(&device, &[p.num_heads, n], DType::F32).map_err(|e| e.to_string())?;
    let (key, value) = (batch.key.clone(), batch.value.clone());
    imp.forward_with_lse(
        &batch.layer,
        &batch.query,
        Some(&key),
        Some(&value),
        &mut batch.kv_cache,
        md.as_ref(),
        &mut out,
        Some(&mut lse),
    )
    .map_err(|e| e.to_string())?;
    let got = out.to_f32_vec().map_err(|e| e.to_string())?;
    let tol = Tolerance::for_dtype(case.dtype);
    let cmp = reference::compare(&got, &want.out, tol);
    if !cmp.pass {
        return Err(format!("output {cmp}"));
    }
    let got = lse.to_f32_vec().map_err(|e| e.to_string())?;
    let cmp = reference::compare(&got, &want.lse, tol);
    if !cmp.pass {
        return Err(format!("lse {cmp}"));
    }
    Ok(())
}

fn tunings(dev: &WgpuDevice) -> Vec<(&'static str, WgpuTuning)> {
    let base = WgpuTuning::for_device(dev.wgsl_info());
    let mut v = vec![
        (
            "one pass, one tile shape",
            WgpuTuning {
                max_splits: 1,
                subgroups: false,
                prefill_tiles: false,
                ..base
            },
        ),
        (
            "split-KV (serial softmax), GPU tiles, unrolled",
            WgpuTuning {
                split_min_keys: 8,
                target_workgroups: 4096,
                max_splits: 64,
                subgroups: false,
                prefill_tiles: true,
                unrolled: true,
                prefill_form: PrefillForm::ThreePhase,
                prefill_workgroup: PREFILL_TILED2_WORKGROUP,
                prefill_tile: None,
                prefill_keys_h: None,
                prefill_rows_h: None,
                prefill_block: polyattn::kernels::wgsl::TILED2_DEFAULT_BLOCK,
                prefill_workgroup_h: None,
                prefill_block_h: None,
                prefill_coop_split: None,
                ..base
            },
        ),
    ];
    // The tiled2 prefill form: without subgroups (one lane per row group) and with them,
    // loops and unrolled, 128 and 64 threads.
    let t2 = |t: WgpuTuning, workgroup: u32| WgpuTuning {
        prefill_form: PrefillForm::FusedSoftmax,
        prefill_workgroup: workgroup,
        ..t
    };
    // One pass, prefill tiles, no subgroups, loops.
    let serial = WgpuTuning {
        max_splits: 1,
        subgroups: false,
        prefill_tiles: true,
        unrolled: false,
        ..base
    };
    v.push(("tiled2 prefill (serial), 64 threads", t2(serial, 64)));
    // The tiled2h (f16) prefill form: serial with loops, and with subgroups unrolled in the
    // GPU's 64 x 16 tile (f16 layers; every other layer falls back to tiled2).
    // (The tiled2h-only thread count and block of the GPU defaults cleared, so `workgroup`
    // and `prefill_block` apply.)
    // (The fused-softmax f16 form without cooperative matrices: these exercise tiled2h
    // where the coop form would run.)
    let t2h = |t: WgpuTuning, workgroup: u32| WgpuTuning {
        prefill_form: PrefillForm::FusedSoftmaxF16,
        prefill_workgroup_h: None,
        prefill_block_h: None,
        prefill_coop_split: None,
        ..t2(t, workgroup)
    };
    let serial_h = t2h(serial, 128);
    v.push(("tiled2h prefill (serial), 128 threads", serial_h));
    v.push((
        "tiled2h prefill (serial), 64-key chunks, 128 threads",
        WgpuTuning {
            prefill_keys_h: Some(64),
            ..serial_h
        },
    ));
    // Other per-thread register blocks (POLYATTN_WGPU_PREFILL_BLOCK): 8 keys x 2 columns
    // at 256 threads, 16 keys x 8 columns at 64.
    v.push((
        "tiled2h prefill (serial), 8x2 blocks, 256 threads",
        WgpuTuning {
            prefill_block: (8, 2),
            ..t2h(serial, 256)
        },
    ));
    // Its own rows per tile (POLYATTN_WGPU_PREFILL_ROWS_H; 48 rows: not a power of two, the
    // plan takes them from the form), 4 x 1 blocks, 512 threads.
    v.push((
        "tiled2h prefill (serial), 48-row tiles, 4x1 blocks, 512 threads",
        WgpuTuning {
            prefill_rows_h: Some(48),
            prefill_block: (4, 1),
            ..t2h(serial, 512)
        },
    ));
    if dev.has_subgroups() {
        v.push((
            "tiled2h prefill (subgroups), 64-key chunks, 16x8 blocks, 64 threads",
            WgpuTuning {
                subgroups: true,
                prefill_keys_h: Some(64),
                prefill_block: (16, 8),
                ..t2h(serial, 64)
            },
        ));
        // Split-KV decodes and the GPU's 64 x 16 prefill tile, unrolled with subgroups.
        let gpu_like = WgpuTuning {
            split_min_keys: 8,
            target_workgroups: 4096,
            max_splits: 64,
            subgroups: true,
            prefill_tiles: true,
            unrolled: true,
            prefill_tile: Some((64, 16)),
            ..base
        };
        v.push((
            "tiled2h prefill (subgroups), split-KV, unrolled, 64x16 tiles, 64 threads",
            t2h(gpu_like, 64),
        ));
        v.push((
            "tiled2 prefill (subgroups), split-KV, unrolled, 64x16 tiles",
            t2(gpu_like, 128),
        ));
        // The cooperative-matrix form (f16 layers, adapters with cooperative matrices):
        // its default 64 x 64 (4 subgroups per row tile), split-KV partials, one subgroup per
        // row tile, and 48-row tiles with 32-key chunks (2 per row tile).
        if dev.has_coop() {
            let coop = WgpuTuning {
                prefill_form: PrefillForm::CooperativeMatrix,
                prefill_rows_h: None,
                prefill_keys_h: None,
                ..t2h(gpu_like, 128)
            };
            v.push(("coop prefill (tensor cores), split-KV, 64x64", coop));
            v.push((
                "coop prefill (tensor cores), one subgroup per row tile, 64x64",
                WgpuTuning {
                    prefill_coop_split: Some(1),
                    ..coop
                },
            ));
            v.push((
                "coop prefill (tensor cores), one pass, 48-row tiles, 32-key chunks",
                WgpuTuning {
                    max_splits: 1,
                    prefill_rows_h: Some(48),
                    prefill_keys_h: Some(32),
                    ..coop
                },
            ));
        } else {
            report!(
                "[coop prefill] skipped: {} has no cooperative matrices (16x16x16 f16 / f32)",
                dev.description()
            );
        }
        v.push((
            "tiled2 prefill (subgroups), decode tiles, 64 threads",
            t2(
                WgpuTuning {
                    max_splits: 1,
                    subgroups: true,
                    prefill_tiles: false,
                    unrolled: false,
                    ..base
                },
                64,
            ),
        ));
        v.push((
            "split-KV (subgroup softmax)",
            WgpuTuning {
                split_min_keys: 8,
                target_workgroups: 4096,
                max_splits: 64,
                subgroups: true,
                prefill_tiles: false,
                unrolled: false,
                prefill_form: PrefillForm::ThreePhase,
                prefill_workgroup: PREFILL_TILED2_WORKGROUP,
                prefill_tile: None,
                prefill_keys_h: None,
                prefill_rows_h: None,
                prefill_block: polyattn::kernels::wgsl::TILED2_DEFAULT_BLOCK,
                prefill_workgroup_h: None,
                prefill_block_h: None,
                prefill_coop_split: None,
                ..base
            },
        ));
        v.push((
            "one pass (subgroup softmax), GPU tiles, unrolled",
            WgpuTuning {
                max_splits: 1,
                subgroups: true,
                prefill_tiles: true,
                unrolled: true,
                ..base
            },
        ));
    }
    v
}

/// Layers and batches that reach every path: decodes that split, GQA groups that do not
/// fit a decode tile (MQA 16:1), sinks (counted once across splits), windows that start a
/// split mid-sequence, soft cap and ALiBi, cascade, fp8 caches; with subgroups, decodes of
/// up to 8 rows take the split-KV decode kernel (fp8 granules of 16, a block size that is
/// not a power of two).
fn path_cases() -> Vec<(String, CaseConfig, BatchSpec)> {
    let mut out = Vec::new();
    let mixed = BatchSpec::new(&[(1, 75), (3, 40), (1, 1), (20, 53), (2, 2)]);
    let mut p = AttentionParams::new(8, 64, 2);
    p.sinks = Some((0..8).map(|i| i as f32 * 0.3 - 1.0).collect());
    out.push((
        "gqa 4:1, sinks, f32".into(),
        CaseConfig::new(p.clone(), DType::F32, 16),
        mixed.clone(),
    ));
    let mut w = AttentionParams::new(8, 64, 2);
    w.sliding_window = Some(21);
    w.logits_soft_cap = Some(5.0);
    out.push((
        "window 21, soft cap, bf16".into(),
        CaseConfig::new(w, DType::Bf16, 16),
        mixed.clone(),
    ));
    let mut a = AttentionParams::new(16, 32, 1);
    a.alibi_slopes = Some((0..16).map(|i| 0.5f32.powi(i / 2 + 1)).collect());
    a.kv_cache_dtype = CacheDType::Fp8E4m3;
    out.push((
        "mqa 16:1 (no decode tile), alibi, fp8 e4m3, f16".into(),
        CaseConfig::new(a, DType::F16, 8),
        mixed,
    ));
    let mut e = AttentionParams::new(8, 48, 2);
    e.alibi_slopes = Some((0..8).map(|i| 0.5f32.powi(i / 2 + 1)).collect());
    e.kv_cache_dtype = CacheDType::Fp8E5m2;
    out.push((
        "gqa 4:1, alibi, fp8 e5m2, bf16, block 12 (split-KV decode kernel)".into(),
        CaseConfig::new(e, DType::Bf16, 12),
        BatchSpec::new(&[(1, 75), (2, 40), (1, 1), (9, 30), (1, 200)]),
    ));
    let mut h = AttentionParams::new(8, 64, 2);
    h.logits_soft_cap = Some(8.0);
    h.sinks = Some((0..8).map(|i| i as f32 * 0.2 - 0.5).collect());
    out.push((
        "gqa 4:1, soft cap, sinks, f16 with an f16 cache (tiled2h)".into(),
        CaseConfig::new(h, DType::F16, 16),
        BatchSpec::new(&[(1, 75), (40, 150), (1, 1), (70, 70), (2, 2)]),
    ));
    let mut c = CaseConfig::new(AttentionParams::new(4, 32, 4), DType::F32, 16);
    c.common_prefix_len = 32;
    let mut cs = c.params.clone();
    cs.sinks = Some(vec![0.5, -0.5, 1.0, 0.0]);
    c.params = cs;
    out.push((
        "cascade 32, sinks, mha".into(),
        c,
        BatchSpec::new(&[(1, 70), (5, 45), (1, 33)]),
    ));
    out
}

#[test]
fn every_kernel_path_matches_the_reference() {
    let Some(dev) = device("every_kernel_path_matches_the_reference") else {
        return;
    };
    let mut failures = Vec::new();
    let mut runs = 0;
    for (label, case, spec) in path_cases() {
        for (path, tuning) in tunings(&dev) {
            runs += 1;
            if let Err(e) = check_batch(&dev, &case, &spec, tuning, 11) {
                failures.push(format!("{label} / {path}: {e}"));
            }
        }
    }
    report!("[wgpu paths] {runs} runs on {}", dev.description());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// With subgroups, short decodes run on the split-KV decode kernel (`paged_decode.wgsl`):
/// its specialisation is chosen for the layer (lanes per key within the subgroup size) and
/// compiled by a run, and the run matches the reference.
#[test]
fn split_kv_decode_kernel_is_used() {
    let Some(dev) = device("split_kv_decode_kernel_is_used") else {
        return;
    };
    if !dev.has_subgroups() {
        report!(
            "[split-KV decode] skipped: no subgroups on {}",
            dev.description()
        );
        return;
    }
    let failures = check_decode_kernel(&dev, DecodeScope::Full);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// How much of `check_decode_kernel` a run covers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DecodeScope {
    /// Every layer shape and every tuning.
    Full,
    /// What a kernel knob can change (the child runs of `decode_kernel_switches`): the
    /// bf16 d128, fp8 d64 and windowed f32 layers, split and in one unrolled pass (the
    /// many-splits run tests the combine, which the knobs do not touch). Why not all: each
    /// child compiles its own decode specialisations, which on a CPU adapter (lavapipe's
    /// LLVM) is most of the test's time, and the other layers exercise no code the knobs
    /// touch.
    Knobs,
}

/// The body of `split_kv_decode_kernel_is_used` (and of its child runs with other kernel
/// switches): failures, one line each.
fn check_decode_kernel(dev: &WgpuDevice, scope: DecodeScope) -> Vec<String> {
    let tuning = WgpuTuning {
        split_min_keys: 16,
        target_workgroups: 64,
        max_splits: 8,
        subgroups: true,
        prefill_tiles: false,
        unrolled: false,
        prefill_form: PrefillForm::ThreePhase,
        prefill_workgroup: PREFILL_TILED2_WORKGROUP,
        prefill_tile: None,
        prefill_keys_h: None,
        prefill_rows_h: None,
        prefill_block: polyattn::kernels::wgsl::TILED2_DEFAULT_BLOCK,
        prefill_workgroup_h: None,
        prefill_block_h: None,
        prefill_coop_split: None,
        // The decode kernel's knobs (and the rest) as the environment sets them.
        ..WgpuTuning::for_device(dev.wgsl_info())
    };
    // Many splits: the 300-key decode in 38 partials of 8 keys, more than one batched pass
    // of the combine's split lanes (4 lanes × 4 partials at head size 128).
    let many = WgpuTuning {
        split_min_keys: 8,
        target_workgroups: 4096,
        max_splits: 64,
        ..tuning
    };
    // One pass, in the GPU form (unrolled): the 300-key decode in one item, so most of its
    // steps take the kernel's unmasked short form (a step is 64 keys at 8 lanes a key, 128
    // at 4).
    let one = WgpuTuning {
        max_splits: 1,
        unrolled: true,
        ..tuning
    };
    let mut failures = Vec::new();
    // The last layer has a window shorter than its 2-token decode's context: its steps
    // start masked (the first query sees one key fewer) and end unmasked.
    let layers = [
        (DType::Bf16, CacheDType::Auto, 128, None),
        (DType::F16, CacheDType::Fp8E4m3, 64, None),
        (DType::Bf16, CacheDType::Fp8E5m2, 128, None),
        (DType::F32, CacheDType::Auto, 32, None),
        (DType::F32, CacheDType::Auto, 64, Some(230)),
    ];
    let knob_layers = [0, 1, 4];
    for (i, (dtype, cache, d, window)) in layers.into_iter().enumerate() {
        if scope == DecodeScope::Knobs && !knob_layers.contains(&i) {
            continue;
        }
        let mut p = AttentionParams::new(8, d, 2);
        p.kv_cache_dtype = cache;
        p.sinks = Some((0..8).map(|i| i as f32 * 0.2 - 0.5).collect());
        p.sliding_window = window;
        let case = CaseConfig::new(p.clone(), dtype, 16);
        let spec = match window {
            None => BatchSpec::new(&[(1, 300), (1, 17), (2, 64)]),
            Some(_) => BatchSpec::new(&[(2, 600), (1, 17)]),
        };
        let batch = RandomBatch::generate(&WgpuBackend::new(), &case, &spec, 3).unwrap();
        let imp = WgpuAttentionImpl::with_tuning(dev.clone(), p, tuning).unwrap();
        let Some(shader) = imp.shaders().decode_shader(
            tuning.decode_rows,
            dtype,
            &batch.kv_cache,
            batch.kv_cache.data().size_in_bytes() as u64,
        ) else {
            failures.push(format!("{dtype}/{cache} d{d}: no decode kernel"));
            continue;
        };
        let lanes = dev.adapter_info().subgroup_min_size;
        assert!(shader.lanes_per_key <= lanes.max(1), "{shader:?}");
        let runs = [("", tuning), (", 38 splits", many), (", one pass", one)];
        for (k, &(label, t)) in runs.iter().enumerate() {
            // The knobs change the steps (keys per step, workgroup size), not the combine.
            if scope == DecodeScope::Knobs && k == 1 {
                continue;
            }
            if let Err(e) = check_batch(dev, &case, &spec, t, 3) {
                failures.push(format!(
                    "{dtype}/{cache} d{d} window {window:?}{label}: {e}"
                ));
            }
        }
        let compiled = dev
            .cached_pipeline(&shader.key(), |_| {
                Err(polyattn::Error::Config("not compiled".into()))
            })
            .is_ok();
        if !compiled {
            failures.push(format!("{}: not compiled by the run", shader.key()));
        }
    }
    failures
}

/// The split-KV decode kernel's environment knobs (docs/TUNING.md) keep it correct: child
/// processes run `check_decode_kernel` with odd keys per step (`POLYATTN_WGPU_DECODE_KEYS`)
/// and with 256-thread workgroups (`POLYATTN_WGPU_DECODE_WG`).
#[test]
fn decode_kernel_switches() {
    if std::env::var_os("POLYATTN_WGPU_DECODE_CHILD").is_some() {
        return;
    }
    let Some(dev) = device("decode_kernel_switches") else {
        return;
    };
    if !dev.has_subgroups() {
        report!("[decode switches] skipped: no subgroups");
        return;
    }
    let exe = std::env::current_exe().expect("test binary");
    let runs: [&[(&str, &str)]; 2] = [
        &[("POLYATTN_WGPU_DECODE_KEYS", "3")],
        &[("POLYATTN_WGPU_DECODE_WG", "256")],
    ];
    for vars in runs {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args([
            "--exact",
            "decode_switch_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("POLYATTN_WGPU_DECODE_CHILD", "1");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run the test binary");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{vars:?}:\n{text}");
        assert!(text.contains("[decode child] ok"), "{vars:?}:\n{text}");
    }
}

/// The child of `decode_kernel_switches` (does nothing in a normal run).
#[test]
fn decode_switch_child() {
    if std::env::var_os("POLYATTN_WGPU_DECODE_CHILD").is_none() {
        return;
    }
    let dev = WgpuDevice::open().expect("device in child");
    let failures = check_decode_kernel(&dev, DecodeScope::Knobs);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    report!("[decode child] ok");
}

/// The kernels' fp8 decoding (`e4m3x4_to_f32` / `e5m2x4_to_f32` of common.wgsl, branch-free)
/// is bit for bit `src/fp8.rs` on all 256 codes (NaN codes: a NaN of the code's sign).
#[test]
fn fp8_decoding_is_exact() {
    let Some(dev) = device("fp8_decoding_is_exact") else {
        return;
    };
    let common = include_str!("../shaders/common.wgsl");
    for (name, f, table) in [
        ("e4m3", "e4m3x4_to_f32", &fp8::E4M3_TABLE),
        ("e5m2", "e5m2x4_to_f32", &fp8::E5M2_TABLE),
    ] {
        let src = format!(
            "{common}\n\
             @group(0) @binding(0) var<uniform> unused: vec4<u32>;\n\
             @group(0) @binding(1) var<storage, read> src: array<u32>;\n\
             @group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;\n\
             @compute @workgroup_size(64)\n\
             fn main(@builtin(global_invocation_id) id: vec3<u32>) {{\n\
             \x20   dst[id.x] = {f}(src[id.x]);\n}}\n"
        );
        let pipe = pipeline(
            &dev,
            &format!("test fp8 decode {name}"),
            || src,
            polyattn::kernels::wgsl::Bindings::Probe,
            false,
        )
        .unwrap();
        let codes: Vec<u32> = (0..64u32)
            .map(|w| (0..4).map(|b| (4 * w + b) << (8 * b)).sum())
            .collect();
        let src_buf = upload_words(&dev, "fp8 codes", &codes).unwrap();
        let dst = dev
            .create_storage_buffer("fp8 decoded", 1024, wgpu::BufferUsages::empty(), false)
            .unwrap();
        let params = ParamBlock::new(&dev, 1);
        let group = bind_group(
            &dev,
            &pipe,
            vec![
                (0, params.binding(0)),
                (1, whole(&src_buf)),
                (2, whole(&dst)),
            ],
        );
        let mut enc = dev
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        dispatch(&mut enc, &pipe, &group, (1, 1, 1));
        dev.submit(enc.finish());
        let bytes = dev.read_bytes(&dst, 0, 1024).unwrap();
        for (code, want) in table.iter().enumerate() {
            let got = f32::from_le_bytes(bytes[4 * code..4 * code + 4].try_into().unwrap());
            let same = if want.is_nan() {
                got.is_nan() && got.is_sign_negative() == (code >= 128)
            } else {
                got.to_bits() == want.to_bits()
            };
            assert!(same, "{name} code {code:#04x}: got {got:e}, want {want:e}");
        }
    }
}

#[test]
fn unusual_head_sizes() {
    let Some(dev) = device("unusual_head_sizes") else {
        return;
    };
    let mut failures = Vec::new();
    // On a CPU adapter each head size takes every other tuning, alternating between head
    // sizes, so every tuning still meets two or three of them. Why: lavapipe compiles each
    // (head size, tuning) pair anew at its first dispatch, and the whole grid was a third of
    // this file's cold run. GPUs take the whole grid.
    let cpu = dev.adapter_info().device_type == wgpu::DeviceType::Cpu;
    let mut runs = 0;
    for (i, (d, dtype)) in [
        (4, DType::F32),
        (12, DType::F16),
        (36, DType::Bf16),
        (100, DType::F32),
        (512, DType::Bf16),
    ]
    .into_iter()
    .enumerate()
    {
        let case = CaseConfig::new(AttentionParams::new(6, d, 2), dtype, 4);
        let spec = BatchSpec::new(&[(1, 13), (6, 9), (2, 2)]);
        for (j, (path, tuning)) in tunings(&dev).into_iter().enumerate() {
            if cpu && (i + j) % 2 == 1 {
                continue;
            }
            runs += 1;
            if let Err(e) = check_batch(&dev, &case, &spec, tuning, d as u64) {
                failures.push(format!("head size {d} {dtype} / {path}: {e}"));
            }
        }
    }
    let grid = if cpu {
        "alternate tunings"
    } else {
        "every tuning"
    };
    report!(
        "[unusual head sizes] {runs} runs ({grid}) on {}",
        dev.description()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Re-runs the subgroup paths in child processes with lavapipe's SIMD width forced to 4 and
/// 16 lanes (`LP_NATIVE_VECTOR_WIDTH` = 128 / 512; the default is 8): kernels must not
/// assume a subgroup size. The children run the kernels unrolled, as GPUs do. Only on lavapipe; 16 lanes needs AVX-512 and is skipped without.
#[test]
fn subgroup_widths_on_lavapipe() {
    if std::env::var_os("POLYATTN_WGPU_CHILD").is_some() {
        return;
    }
    let Some(dev) = device("subgroup_widths_on_lavapipe") else {
        return;
    };
    if !dev.adapter_info().name.contains("llvmpipe") || !dev.has_subgroups() {
        report!("[subgroup widths] skipped: not lavapipe with subgroups");
        return;
    }
    let exe = std::env::current_exe().expect("test binary");
    let avx512 = std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.contains("avx512f"))
        .unwrap_or(false);
    for (width, lanes) in [("128", 4u32), ("512", 16)] {
        if lanes == 16 && !avx512 {
            report!("[subgroup widths] 16 lanes skipped: no AVX-512 on this host");
            continue;
        }
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "subgroup_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("POLYATTN_WGPU_CHILD", lanes.to_string())
            // The GPU form of the kernels (unrolled loops), which lavapipe otherwise skips.
            .env("POLYATTN_WGPU_UNROLL", "1")
            .env("LP_NATIVE_VECTOR_WIDTH", width)
            .output()
            .expect("run the test binary");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{lanes} lanes:\n{text}");
        assert!(
            text.contains(&format!("subgroup size {lanes}")),
            "child did not run at {lanes} lanes:\n{text}"
        );
    }
}

/// The child of `subgroup_widths_on_lavapipe` (does nothing in a normal run).
#[test]
fn subgroup_child() {
    let Some(lanes) = std::env::var("POLYATTN_WGPU_CHILD").ok() else {
        return;
    };
    let dev = WgpuDevice::open().expect("device in child");
    let size = dev.adapter_info().subgroup_min_size;
    report!("subgroup size {size} (asked for {lanes})");
    let mut failures = Vec::new();
    // The bf16 case (windowed, soft cap: masked steps and the modifier code) and the f16 one,
    // which runs the tiled2h form. Why not more: each child compiles its own unrolled
    // specialisations, and the subgroup width touches only the lane math these share.
    let cases = path_cases()
        .into_iter()
        .enumerate()
        .filter(|(i, (label, _, _))| *i == 1 || label.contains("(tiled2h)"))
        .map(|(_, c)| c);
    for (label, case, spec) in cases {
        for (path, tuning) in tunings(&dev).into_iter().filter(|(_, t)| t.subgroups) {
            if let Err(e) = check_batch(&dev, &case, &spec, tuning, 5) {
                failures.push(format!("{label} / {path}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn pipelines_are_compiled_once() {
    let Some(dev) = device("pipelines_are_compiled_once") else {
        return;
    };
    let shader = AttentionShader {
        head_size: 20,
        block_m: 8,
        block_n: 8,
        q_dtype: DType::Bf16,
        kv_dtype: DType::Fp8E5m2,
        paged: true,
        subgroups: false,
        unrolled: false,
        tiled2: None,
    };
    let compiles = std::sync::atomic::AtomicUsize::new(0);
    let get = || {
        pipeline(
            &dev,
            &shader.key(),
            || {
                compiles.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                shader.source()
            },
            polyattn::kernels::wgsl::Bindings::Attention,
            false,
        )
        .unwrap()
    };
    let (a, b) = (get(), get());
    assert_eq!(a, b, "the second request must return the cached pipeline");
    assert_eq!(compiles.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[test]
fn a_cache_larger_than_one_binding_is_a_typed_error() {
    let Some(dev) = device("a_cache_larger_than_one_binding_is_a_typed_error") else {
        return;
    };
    let backend = WgpuBackend::new();
    let per_block = 2 * 16 * 8 * 128; // bytes of an fp8 block
    let blocks = (dev.max_binding_bytes() / per_block as u64 + 1) as usize;
    let err = backend
        .kv_cache_shape(blocks, 16, 8, 128, CacheDType::Fp8E4m3)
        .unwrap_err();
    assert!(
        matches!(err, polyattn::Error::Config(_)) && err.to_string().contains("storage binding"),
        "{err}"
    );
    assert!(backend
        .kv_cache_shape(blocks - 1, 16, 8, 128, CacheDType::Fp8E4m3)
        .is_ok());
}

/// Production-sized batches on a real GPU (skipped on CPU adapters, where they would take
/// minutes): the default tuning splits long decodes (≥ 256 keys per partial), the prefill
/// tile differs from the decode tile, and the subgroup size is the GPU's own.
#[test]
fn gpu_scale_batches() {
    let Some(dev) = device("gpu_scale_batches") else {
        return;
    };
    if dev.adapter_info().device_type == wgpu::DeviceType::Cpu {
        report!(
            "[gpu scale] skipped: {} is a CPU adapter",
            dev.adapter_info().name
        );
        return;
    }
    let tuning = WgpuTuning::for_device(dev.wgsl_info());
    let mut failures = Vec::new();
    let llama = |dtype, cache| {
        let mut p = AttentionParams::new(32, 128, 8);
        p.kv_cache_dtype = cache;
        CaseConfig::new(p, dtype, 16)
    };
    let cases = [
        (
            "decode 4 x 8k, bf16",
            llama(DType::Bf16, CacheDType::Auto),
            BatchSpec::new(&[(1, 8192), (1, 8000), (1, 3000), (1, 257)]),
        ),
        (
            "decode 2 x 16k, fp8 e4m3 cache",
            llama(DType::Bf16, CacheDType::Fp8E4m3),
            BatchSpec::new(&[(1, 16384), (1, 9001)]),
        ),
        (
            "chunked prefill 512 after 2k, f16",
            llama(DType::F16, CacheDType::Auto),
            BatchSpec::new(&[(512, 2560), (1, 4000), (77, 77)]),
        ),
        (
            "prefill 1k, f32, head 64",
            CaseConfig::new(AttentionParams::new(16, 64, 4), DType::F32, 32),
            BatchSpec::new(&[(1024, 1024)]),
        ),
    ];
    for (label, case, spec) in cases {
        let t = std::time::Instant::now();
        if let Err(e) = check_batch(&dev, &case, &spec, tuning, 99) {
            failures.push(format!("{label}: {e}"));
        }
        report!("[gpu scale] {label}: {:.1} s", t.elapsed().as_secs_f64());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
