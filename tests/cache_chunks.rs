//! KV caches larger than one storage binding on the WGSL family. The native Vulkan runtime
//! stores such a cache in chunks of whole blocks and binds them as one binding array
//! (`VulkanDevice::max_chunk_bytes`: lavapipe's 128 MiB binding range, the H200's 4 GiB);
//! wgpu has no binding arrays and refuses the cache with a typed error.
//!
//! Each case builds a cache of about 2.5 chunks, every slot NaN, moves a random batch's
//! blocks into it spread over every chunk (the first block, the last, and between), runs
//! the forward (the cache write of the new tokens, decode and prefill attention) and
//! compares with the f64 reference; the slots a batch may not read stay NaN, so a read
//! from the wrong chunk or block shows. Debug builds run the Vulkan runtime under the
//! Khronos validation layer where it is installed (as on CI); any error it reports fails.
//! Backends outside the WGSL family have no per-binding limit and are skipped with that
//! reason.

#[macro_use]
mod common;

use polyattn::backend::Availability;
use polyattn::reference;
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch, Tolerance};
use polyattn::{
    AttentionParams, BackendRef, CacheDType, CommonAttentionMetadata, DType, Device, KvCache,
    KvCacheSpec, Tensor,
};

macro_rules! report {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// The bytes one chunk holds on `device`, or `None` where the device has no chunks.
fn chunk_bytes(device: &Device) -> Option<u64> {
    match device {
        Device::Vulkan(d) => Some(d.max_chunk_bytes()),
        Device::Wgpu(d) => Some(d.max_binding_bytes()),
        _ => None,
    }
}

/// The number of buffers a cache tensor is stored in (1 outside the Vulkan runtime).
fn stored_chunks(t: &Tensor) -> usize {
    match t.storage() {
        polyattn::device::Storage::Vulkan(s) => s.chunks().len(),
        _ => 1,
    }
}

/// Runs `batch` against a NaN-filled cache of `num_blocks` blocks with its blocks moved
/// to ids spread over the whole cache; returns the worst-error summary.
fn run_spread(
    b: &BackendRef,
    case: &CaseConfig,
    spec: &BatchSpec,
    num_blocks: usize,
    seed: u64,
) -> Result<String, Box<dyn std::error::Error>> {
    let be = b.as_ref();
    let device = be.device()?;
    let batch = RandomBatch::generate(be, case, spec, seed)?;
    let want = reference::attention(&batch)?;
    let p = &case.params;
    let kv_spec = KvCacheSpec {
        block_size: case.block_size,
        num_kv_heads: p.num_kv_heads,
        head_size: p.head_size,
        dtype: case.dtype,
        cache_dtype: p.kv_cache_dtype,
    };
    // Old block id -> new, the used blocks spaced evenly over 1..num_blocks.
    let small = batch.kv_cache.to_device(&Device::cpu())?;
    let used = small.num_blocks() - 1;
    let new_id = |old: usize| -> usize {
        if used <= 1 {
            num_blocks - 1
        } else {
            1 + (old - 1) * (num_blocks - 2) / (used - 1)
        }
    };
    // The big cache's bytes built once on the host (a GPU's chunks make it gigabytes): every
    // element NaN in the storage dtype, then the batch's blocks at their new ids.
    let mut kv_cache = KvCache::with_layout(&device, kv_spec, num_blocks, small.layout())?;
    let (shape, dtype) = (kv_cache.data().shape().to_vec(), kv_cache.data().dtype());
    let nan = Tensor::from_f32(&Device::cpu(), &[f32::NAN], &[1], dtype)?;
    let nan = nan.as_cpu().ok_or("host tensor")?.as_bytes().to_vec();
    let page = small.data().numel() / small.num_blocks();
    let src = small.data().as_cpu().ok_or("host cache")?.as_bytes();
    let elem = src.len() / small.data().numel();
    let mut bytes = nan.repeat(kv_cache.data().numel());
    for old in 1..small.num_blocks() {
        let (s0, d0) = (old * page * elem, new_id(old) * page * elem);
        bytes[d0..d0 + page * elem].copy_from_slice(&src[s0..s0 + page * elem]);
    }
    let storage = polyattn::device::CpuStorage::from_bytes(&bytes, dtype);
    drop(bytes);
    *kv_cache.data_mut() = Tensor::from_cpu_storage(&device, storage, &shape, dtype)?;
    let mut desc = batch.desc.clone();
    let bs = case.block_size as i64;
    for id in desc.block_table.iter_mut().filter(|id| **id > 0) {
        *id = new_id(*id as usize) as i32;
    }
    for s in desc.slot_mapping.iter_mut().filter(|s| **s >= 0) {
        *s = new_id((*s / bs) as usize) as i64 * bs + *s % bs;
    }
    let imp = be.make_impl(p.clone())?;
    let builder = be.make_builder(&kv_spec)?;
    let mut output = batch.empty_output()?;
    let common = CommonAttentionMetadata::new(&device, desc)?;
    let md = builder.build(0, &common, false)?;
    imp.forward(
        &batch.layer,
        &batch.query,
        Some(&batch.key),
        Some(&batch.value),
        &mut kv_cache,
        md.as_ref(),
        &mut output,
    )?;
    device.synchronize()?;
    if let Device::Vulkan(d) = &device {
        let errors = d.take_validation_errors();
        if !errors.is_empty() {
            return Err(format!("Vulkan validation errors: {}", errors.join("; ")).into());
        }
    }
    let got = output.to_f32_vec()?;
    let cmp = reference::compare(&got, &want.out, Tolerance::for_dtype(case.dtype));
    if !cmp.pass {
        return Err(format!("output {cmp}").into());
    }
    Ok(format!("{} buffers, {cmp}", stored_chunks(kv_cache.data())))
}

#[test]
fn caches_past_one_binding() {
    let cases: &[(&str, DType, CacheDType, usize, usize)] = &[
        ("f32 d64", DType::F32, CacheDType::Auto, 64, 16),
        ("bf16 d128", DType::Bf16, CacheDType::Auto, 128, 16),
        (
            "f16 cache fp8 d128",
            DType::F16,
            CacheDType::Fp8E4m3,
            128,
            32,
        ),
    ];
    let spec = BatchSpec::new(&[(1, 1), (1, 37), (1, 130), (7, 7), (9, 90), (1, 64)]);
    let mut failures = Vec::new();
    let mut ran = Vec::new();
    let mut skipped = Vec::new();
    for b in polyattn::registry::global().backends() {
        if b.capabilities().is_mla {
            continue;
        }
        if let Availability::Unavailable(why) = b.availability() {
            skipped.push(format!("{} (unavailable: {why})", b.name()));
            continue;
        }
        let device = match b.device() {
            Ok(d) => d,
            Err(e) => {
                skipped.push(format!("{} ({e})", b.name()));
                continue;
            }
        };
        let Some(chunk) = chunk_bytes(&device) else {
            skipped.push(format!("{} (no per-binding limit)", b.name()));
            continue;
        };
        let chunked = matches!(&device, Device::Vulkan(d) if d.max_chunk_bytes() > 0);
        for &(label, dtype, cache_dtype, d, bs) in cases {
            let params = AttentionParams {
                kv_cache_dtype: cache_dtype,
                ..AttentionParams::new(4, d, 2)
            };
            let case = CaseConfig::new(params, dtype, bs);
            let page = (2 * bs * 2 * d * cache_dtype_bytes(dtype, cache_dtype)) as u64;
            let num_blocks = (chunk * 5 / 2).div_ceil(page) as usize;
            let what = format!("{} {label} ({num_blocks} blocks)", b.name());
            match (run_spread(&b, &case, &spec, num_blocks, 7), chunked) {
                (Ok(summary), true) => ran.push(format!("{what}: {summary}")),
                // Refused for its binding, or for its buffer (a device whose largest buffer
                // is smaller than the 2.5 bindings: wgpu on the H200).
                (Err(e), false)
                    if e.to_string().contains("storage binding")
                        || e.to_string().contains("largest buffer") =>
                {
                    ran.push(format!("{what}: refused as expected ({e})"))
                }
                (Ok(_), false) => failures.push(format!(
                    "{what}: a cache past one binding ran on a device without binding arrays"
                )),
                (Err(e), _) => failures.push(format!("{what}: {e}")),
            }
        }
    }
    report!("[caches past one binding] skipped: {}", skipped.join(", "));
    for r in &ran {
        report!("  ok   {r}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn cache_dtype_bytes(act: DType, cache: CacheDType) -> usize {
    match cache {
        CacheDType::Auto => act.size_in_bytes(),
        CacheDType::F16 | CacheDType::Bf16 => 2,
        CacheDType::Fp8E4m3 | CacheDType::Fp8E5m2 => 1,
    }
}
