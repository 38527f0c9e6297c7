//! Isolation on every available backend: a forward (or KV-cache update) that returns an error
//! leaves every cache byte unchanged, and a successful one changes exactly the slots of the
//! batch's slot mapping (−1 entries excluded) and nothing else.
//!
//! The cache is read back through the public API (`KvCache::data().to_host()`) and compared
//! bit for bit ([`CacheSnapshot`]). Every slot outside the batch's context is first filled
//! with NaN or garbage (`fill_cache_outside`), so that a write of any value to a slot shows,
//! and so that the slots the batch writes all change.

#[macro_use]
mod common;

use std::any::Any;
use std::collections::BTreeSet;

use common::{ensure, fail, for_each_backend, Outcome};
use polyattn::testing::fuzz::{
    check_only_slots_changed, context_slots, fill_cache_outside, written_slots, CacheSnapshot,
    StaleFill,
};
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch};
use polyattn::{
    AttentionBackend, AttentionMetadata, AttentionParams, CacheDType, CommonAttentionMetadata,
    DType, KvCache, KvCacheSpec, SelectorConfig, Tensor, PAD_SLOT_ID,
};

/// The layouts and dtypes every test runs: (activation, cache, heads, KV heads).
const CASES: [(DType, CacheDType, usize, usize); 3] = [
    (DType::F32, CacheDType::Auto, 8, 2),
    (DType::F16, CacheDType::Fp8E4m3, 4, 4),
    (DType::Bf16, CacheDType::F16, 6, 1),
];
const HEAD_SIZE: usize = 64;
const BLOCK_SIZE: usize = 16;

/// A batch of a decode, a chunked prefill and a prefill, its context in the cache and every
/// other slot filled with `fill`; `None` when the backend does not take the configuration.
fn batch_for(
    b: &dyn AttentionBackend,
    (dtype, cache, h, hkv): (DType, CacheDType, usize, usize),
    fill: StaleFill,
    seed: u64,
) -> Result<Option<RandomBatch>, Box<dyn std::error::Error>> {
    let params = AttentionParams {
        kv_cache_dtype: cache,
        ..AttentionParams::new(h, HEAD_SIZE, hkv)
    };
    let config = SelectorConfig::for_layer(&params, dtype, Some(BLOCK_SIZE as u32));
    if !b.validate_configuration(&config).is_empty() {
        return Ok(None);
    }
    let case = CaseConfig::new(params, dtype, BLOCK_SIZE);
    let spec = BatchSpec::new(&[(1, 2 * BLOCK_SIZE + 3), (5, BLOCK_SIZE + 9), (7, 7)]);
    let mut batch = RandomBatch::generate(b, &case, &spec, seed)?;
    let keep = context_slots(&batch.desc);
    fill_cache_outside(&mut batch.kv_cache, &keep, fill, seed)?;
    Ok(Some(batch))
}

/// Metadata that no backend's builder produced.
#[derive(Debug)]
struct ForeignMetadata;

impl AttentionMetadata for ForeignMetadata {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Runs `call` on `cache`; it must fail and leave the cache bit-identical.
fn expect_error_and_no_change(
    what: &str,
    cache: &mut KvCache,
    call: impl FnOnce(&mut KvCache) -> polyattn::Result<()>,
) -> Outcome {
    let before = CacheSnapshot::take(cache)?;
    let r = call(cache);
    cache.data().device().synchronize()?;
    let after = CacheSnapshot::take(cache)?;
    match r {
        Ok(()) => return Err(fail(format!("{what}: accepted (expected an error)"))),
        Err(e) => {
            if after != before {
                let changed = before.changed_slots(&after, cache)?;
                return Err(fail(format!(
                    "{what}: returned `{e}` but changed {} cache slot(s), first {:?}",
                    changed.len(),
                    changed.iter().take(6).collect::<Vec<_>>()
                )));
            }
        }
    }
    Ok(())
}

#[test]
fn a_failed_call_leaves_every_cache_byte_unchanged() {
    for_each_backend("isolation_on_error", |backend| {
        let b = backend.as_ref();
        let dev = b.device()?;
        let mut ran = 0;
        for (i, &c) in CASES.iter().enumerate() {
            let Some(batch) = batch_for(b, c, StaleFill::Garbage, 300 + i as u64)? else {
                continue;
            };
            ran += 1;
            let (dtype, _, h, hkv) = c;
            let d = HEAD_SIZE;
            let n = batch.spec.num_tokens();
            let p = batch.case.params.clone();
            let imp = b.make_impl(p.clone())?;
            let builder = b.make_builder(batch.kv_cache.spec())?;
            let common = CommonAttentionMetadata::new(&dev, batch.desc.clone())?;
            let md = builder.build(0, &common, false)?;
            let md = md.as_ref();
            let layer = &batch.layer;
            let (q, k, v) = (&batch.query, &batch.key, &batch.value);
            let zeros = |shape: &[usize], dt: DType| Tensor::zeros(&dev, shape, dt);
            let other = if dtype == DType::F32 {
                DType::F16
            } else {
                DType::F32
            };
            let mut cache = batch.kv_cache.clone();
            let label = |s: &str| format!("{dtype}/{} {s}", p.kv_cache_dtype);

            // Errors a backend might only find after writing the new keys and values.
            let mut out = batch.empty_output()?;
            let mut lse = zeros(&[n, h], DType::F32)?;
            expect_error_and_no_change(&label("LSE of shape [T, H]"), &mut cache, |c| {
                imp.forward_with_lse(layer, q, Some(k), Some(v), c, md, &mut out, Some(&mut lse))
            })?;
            let mut lse = zeros(&[h, n], DType::F16)?;
            expect_error_and_no_change(&label("f16 LSE"), &mut cache, |c| {
                imp.forward_with_lse(layer, q, Some(k), Some(v), c, md, &mut out, Some(&mut lse))
            })?;
            let mut bad_out = zeros(&[n, h, d], other)?;
            expect_error_and_no_change(&label("output of another dtype"), &mut cache, |c| {
                imp.forward(layer, q, Some(k), Some(v), c, md, &mut bad_out)
            })?;
            let mut bad_out = zeros(&[n, h, d + 8], dtype)?;
            expect_error_and_no_change(&label("output of another shape"), &mut cache, |c| {
                imp.forward(layer, q, Some(k), Some(v), c, md, &mut bad_out)
            })?;
            let short_q = zeros(&[n - 1, h, d], dtype)?;
            let mut short_out = zeros(&[n - 1, h, d], dtype)?;
            expect_error_and_no_change(&label("query shorter than the batch"), &mut cache, |c| {
                imp.forward(layer, &short_q, Some(k), Some(v), c, md, &mut short_out)
            })?;
            let bad_v = zeros(&[n, hkv, d + 8], dtype)?;
            expect_error_and_no_change(&label("value of another shape"), &mut cache, |c| {
                imp.forward(layer, q, Some(k), Some(&bad_v), c, md, &mut out)
            })?;
            let k_other = Tensor::from_f32(&dev, &k.to_f32_vec()?, &[n, hkv, d], other)?;
            let v_other = Tensor::from_f32(&dev, &v.to_f32_vec()?, &[n, hkv, d], other)?;
            expect_error_and_no_change(
                &label(&format!("{other} key and value for a {dtype} query")),
                &mut cache,
                |c| imp.forward(layer, q, Some(&k_other), Some(&v_other), c, md, &mut out),
            )?;
            expect_error_and_no_change(&label("key without value"), &mut cache, |c| {
                imp.forward(layer, q, Some(k), None, c, md, &mut out)
            })?;
            expect_error_and_no_change(&label("foreign metadata"), &mut cache, |c| {
                imp.forward(layer, q, Some(k), Some(v), c, &ForeignMetadata, &mut out)
            })?;
            expect_error_and_no_change(
                &label("do_kv_cache_update with a value of another shape"),
                &mut cache,
                |c| imp.do_kv_cache_update(layer, k, &bad_v, c, md),
            )?;
            expect_error_and_no_change(
                &label("do_kv_cache_update with foreign metadata"),
                &mut cache,
                |c| imp.do_kv_cache_update(layer, k, v, c, &ForeignMetadata),
            )?;
            // A layer whose KV heads differ from the cache's.
            let wide = AttentionParams {
                num_heads: 2 * h,
                num_kv_heads: 2 * hkv,
                ..p.clone()
            };
            let wide_imp = b.make_impl(wide)?;
            let wq = zeros(&[n, 2 * h, d], dtype)?;
            let wk = zeros(&[n, 2 * hkv, d], dtype)?;
            let mut wout = zeros(&[n, 2 * h, d], dtype)?;
            expect_error_and_no_change(
                &label("a layer of twice the cache's KV heads"),
                &mut cache,
                |c| wide_imp.forward(layer, &wq, Some(&wk), Some(&wk), c, md, &mut wout),
            )?;
            // A cache too small for the batch's block ids: that cache must stay as it was.
            let spec = *batch.kv_cache.spec();
            let mut small = KvCache::new(b, spec, 2)?;
            let everything = BTreeSet::new();
            fill_cache_outside(&mut small, &everything, StaleFill::Garbage, 9)?;
            expect_error_and_no_change(&label("a cache of 2 blocks"), &mut small, |c| {
                imp.forward(layer, q, Some(k), Some(v), c, md, &mut out)
            })?;
            // The batch's own cache, after all that, still works and is unchanged so far.
            let before = CacheSnapshot::take(&batch.kv_cache)?;
            ensure(before == CacheSnapshot::take(&cache)?, || {
                label("the cache changed across the failed calls")
            })?;
        }
        ensure(ran > 0, || "no case ran on this backend".into())
    });
}

#[test]
fn a_successful_call_changes_exactly_the_batch_slots() {
    for_each_backend("isolation_on_success", |backend| {
        let b = backend.as_ref();
        let dev = b.device()?;
        let mut ran = 0;
        for (i, &c) in CASES.iter().enumerate() {
            for (j, fill) in [StaleFill::Nan, StaleFill::Garbage].into_iter().enumerate() {
                let seed = 400 + 10 * i as u64 + j as u64;
                let Some(mut batch) = batch_for(b, c, fill, seed)? else {
                    continue;
                };
                ran += 1;
                let (dtype, _, h, hkv) = c;
                let d = HEAD_SIZE;
                let n = batch.spec.num_tokens();
                let imp = b.make_impl(batch.case.params.clone())?;
                let builder = b.make_builder(batch.kv_cache.spec())?;
                let label = format!("{dtype}/{} fill {}", c.1, fill.as_str());

                // Some tokens hidden behind −1, the slot mapping padded with −1, padded rows.
                let mut desc = batch.desc.clone();
                desc.slot_mapping[0] = PAD_SLOT_ID;
                desc.slot_mapping[n - 2] = PAD_SLOT_ID;
                let pad = 3;
                desc.slot_mapping.resize(n + pad, PAD_SLOT_ID);
                let rows = n + pad;
                let grow = |t: &Tensor, heads: usize| -> polyattn::Result<Tensor> {
                    let mut x = t.to_f32_vec()?;
                    x.extend((0..pad * heads * d).map(|i| (i % 7) as f32 - 3.0));
                    Tensor::from_f32(&dev, &x, &[rows, heads, d], dtype)
                };
                let (q, k, v) = (
                    grow(&batch.query, h)?,
                    grow(&batch.key, hkv)?,
                    grow(&batch.value, hkv)?,
                );
                let mut out = Tensor::zeros(&dev, &[rows, h, d], dtype)?;
                let common = CommonAttentionMetadata::new(&dev, desc.clone())?;
                let md = builder.build(0, &common, false)?;
                let written = written_slots(&desc);

                // The update alone.
                let mut cache = batch.kv_cache.clone();
                let before = CacheSnapshot::take(&cache)?;
                imp.do_kv_cache_update(&batch.layer, &k, &v, &mut cache, md.as_ref())?;
                check_exact(&label, "do_kv_cache_update", &before, &cache, &written)?;

                // A whole forward.
                let before = CacheSnapshot::take(&batch.kv_cache)?;
                imp.forward(
                    &batch.layer,
                    &q,
                    Some(&k),
                    Some(&v),
                    &mut batch.kv_cache,
                    md.as_ref(),
                    &mut out,
                )?;
                dev.synchronize()?;
                check_exact(&label, "forward", &before, &batch.kv_cache, &written)?;
            }
        }
        ensure(ran > 0, || "no case ran on this backend".into())
    });
}

/// The changed slots must be exactly `written`: nothing else, and every one of them (each
/// held a stale value the new key cannot equal bit for bit).
fn check_exact(
    label: &str,
    what: &str,
    before: &CacheSnapshot,
    cache: &KvCache,
    written: &BTreeSet<usize>,
) -> Outcome {
    if let Err(why) = check_only_slots_changed(before, cache, written)? {
        return Err(fail(format!("{label}: {what}: {why}")));
    }
    let after = CacheSnapshot::take(cache)?;
    let changed: BTreeSet<usize> = before.changed_slots(&after, cache)?.into_iter().collect();
    let missing: Vec<usize> = written.difference(&changed).copied().collect();
    ensure(missing.is_empty(), || {
        format!("{label}: {what}: slots {missing:?} of the slot mapping were not written")
    })
}

#[test]
fn snapshots_see_a_single_changed_byte() {
    // The comparison itself: a one-element change is found, in the right slot.
    let b = polyattn::backends::cpu::CpuBackend::new();
    let spec = KvCacheSpec {
        block_size: 16,
        num_kv_heads: 2,
        head_size: 32,
        dtype: DType::F16,
        cache_dtype: CacheDType::Fp8E5m2,
    };
    let mut cache = KvCache::new(&b, spec, 3).unwrap();
    let before = CacheSnapshot::take(&cache).unwrap();
    let keep: BTreeSet<usize> = (0..48).filter(|&s| s != 37).collect();
    fill_cache_outside(&mut cache, &keep, StaleFill::Huge, 1).unwrap();
    let after = CacheSnapshot::take(&cache).unwrap();
    assert_eq!(before.changed_slots(&after, &cache).unwrap(), vec![37]);
    let allowed: BTreeSet<usize> = [36].into_iter().collect();
    let err = check_only_slots_changed(&before, &cache, &allowed)
        .unwrap()
        .unwrap_err();
    assert!(err.contains("37 (block 2, token 5)"), "{err}");
}
