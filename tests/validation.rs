//! Bad input is a typed error on every available backend, never a panic and never an
//! out-of-bounds access: metadata validation (`Error::Metadata`), impl argument checks
//! (`Error::Shape`, `Error::DType`, `Error::MetadataMismatch`, ...), and unsupported
//! configurations with vLLM's reason strings. (A panic inside a body is caught by the harness
//! and reported as a failure.)

#[macro_use]
mod common;

use std::any::Any;

use common::{ensure, fail, for_each_backend, Outcome};
use polyattn::backend::HeadSizes;
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch};
use polyattn::{
    AttentionBackend, AttentionMetadata, AttentionParams, AttentionType, BackendRef,
    BatchDescription, BlockSize, CacheDType, CommonAttentionMetadata, DType, Error, KvCache,
    KvCacheSpec, SelectorConfig, Tensor,
};

/// A valid two-request batch (a decode with 5 tokens of context and a 3-token prefill),
/// block size 4, 6 blocks.
fn desc() -> BatchDescription {
    BatchDescription {
        query_start_loc: vec![0, 1, 4],
        seq_lens: vec![6, 3],
        block_table: vec![1, 2, 3, 0],
        max_blocks_per_req: 2,
        slot_mapping: vec![2 * 4 + 1, 3 * 4, 3 * 4 + 1, 3 * 4 + 2],
        causal: true,
        block_size: 4,
        is_prefilling: None,
    }
}

/// A change that breaks one metadata invariant.
type Mutation = Box<dyn Fn(&mut BatchDescription)>;

/// Turns on one layer feature in a configuration.
type SetFlag = fn(&mut SelectorConfig);

fn expect_metadata_error(
    b: &dyn AttentionBackend,
    what: &str,
    d: BatchDescription,
    needle: &str,
) -> Outcome {
    match CommonAttentionMetadata::new(&b.device()?, d) {
        Err(e @ (Error::Metadata(_) | Error::Overflow { .. })) => {
            let m = e.to_string();
            ensure(m.contains(needle), || {
                format!("{what}: message {m:?} does not mention {needle:?}")
            })
        }
        Err(other) => Err(fail(format!(
            "{what}: expected Error::Metadata or Error::Overflow, got {other:?}"
        ))),
        Ok(_) => Err(fail(format!("{what}: accepted"))),
    }
}

#[test]
fn metadata_errors_are_typed() {
    for_each_backend("metadata_validation", |backend| {
        let b = backend.as_ref();
        CommonAttentionMetadata::new(&b.device()?, desc())?;
        let cases: Vec<(&str, Mutation, &str)> = vec![
            (
                "negative block id",
                Box::new(|d| d.block_table[2] = -3),
                "block_table[1][0] = -3",
            ),
            (
                "slot below -1",
                Box::new(|d| d.slot_mapping[0] = -2),
                "slot_mapping[0] = -2",
            ),
            (
                "query longer than its sequence",
                Box::new(|d| d.seq_lens[1] = 2),
                "query length 3 exceeds its sequence length 2",
            ),
            (
                "non-monotonic query_start_loc",
                Box::new(|d| {
                    d.query_start_loc = vec![0, 3, 1];
                    d.slot_mapping.truncate(1);
                }),
                "monotonic",
            ),
            (
                "block table too narrow",
                Box::new(|d| d.seq_lens[0] = 9),
                "needs 3 blocks",
            ),
            (
                "query_start_loc not starting at 0",
                Box::new(|d| d.query_start_loc[0] = 1),
                "must start at 0",
            ),
            (
                "empty query_start_loc",
                Box::new(|d| d.query_start_loc.clear()),
                "query_start_loc is empty",
            ),
            (
                "seq_lens count",
                Box::new(|d| d.seq_lens.push(1)),
                "seq_lens has 3 entries for 2 requests",
            ),
            (
                "slot_mapping length",
                Box::new(|d| {
                    d.slot_mapping.pop();
                }),
                "slot_mapping has 3 entries for 4 tokens",
            ),
            (
                "block_table length",
                Box::new(|d| {
                    d.block_table.pop();
                }),
                "block_table has 3 entries",
            ),
            (
                "block size 0",
                Box::new(|d| d.block_size = 0),
                "block_size is 0",
            ),
            (
                "negative seq_len",
                Box::new(|d| d.seq_lens[0] = -1),
                "seq_lens[0] = -1 is negative",
            ),
            (
                "padding past the batch's tokens that is not -1",
                Box::new(|d| d.slot_mapping.extend([-1, 5])),
                "slot_mapping[5] = 5 is past the batch's 4 tokens",
            ),
            (
                "num_reqs × max_blocks_per_req overflows",
                Box::new(|d| d.max_blocks_per_req = usize::MAX / 2 + 1),
                "overflow",
            ),
            (
                "is_prefilling length",
                Box::new(|d| d.is_prefilling = Some(vec![true])),
                "is_prefilling has 1 entries for 2 requests",
            ),
        ];
        for (what, mutate, needle) in cases {
            let mut d = desc();
            mutate(&mut d);
            expect_metadata_error(b, what, d, needle)?;
        }
        Ok(())
    });
}

/// A layer, a valid random batch and its metadata on one backend.
struct Setup {
    batch: RandomBatch,
    params: AttentionParams,
    md: Box<dyn AttentionMetadata>,
    imp: Box<dyn polyattn::AttentionImpl>,
    n: usize,
}

fn setup(b: &dyn AttentionBackend, dtype: DType) -> Result<Setup, Box<dyn std::error::Error>> {
    setup_with_cache(b, dtype, CacheDType::Auto)
}

fn setup_with_cache(
    b: &dyn AttentionBackend,
    dtype: DType,
    cache_dtype: CacheDType,
) -> Result<Setup, Box<dyn std::error::Error>> {
    let params = AttentionParams {
        kv_cache_dtype: cache_dtype,
        ..AttentionParams::new(8, 64, 2)
    };
    let case = CaseConfig::new(params.clone(), dtype, 16);
    let spec = BatchSpec::new(&[(1, 20), (5, 5), (3, 19)]);
    let batch = RandomBatch::generate(b, &case, &spec, 11)?;
    let builder = b.make_builder(&KvCacheSpec {
        block_size: 16,
        num_kv_heads: 2,
        head_size: 64,
        dtype,
        cache_dtype,
    })?;
    let common = CommonAttentionMetadata::new(&b.device()?, batch.desc.clone())?;
    let md = builder.build(0, &common, false)?;
    let imp = b.make_impl(params.clone())?;
    let n = spec.num_tokens();
    Ok(Setup {
        batch,
        params,
        md,
        imp,
        n,
    })
}

/// Metadata that no backend's builder produced.
#[derive(Debug)]
struct ForeignMetadata;

impl AttentionMetadata for ForeignMetadata {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn expect_err(what: &str, r: polyattn::Result<()>, ok: impl Fn(&Error) -> bool) -> Outcome {
    match r {
        Err(e) if ok(&e) => Ok(()),
        Err(e) => Err(fail(format!("{what}: wrong error variant: {e:?}"))),
        Ok(()) => Err(fail(format!("{what}: accepted"))),
    }
}

fn is_shape(e: &Error) -> bool {
    matches!(e, Error::Shape { .. })
}

fn is_dtype(e: &Error) -> bool {
    matches!(e, Error::DType { .. })
}

/// A key or value whose dtype is not the layer's activation dtype is an error that names the
/// key or value, whatever the cache stores (an `auto` cache of the activation dtype, or an
/// explicit f16 / fp8 cache that would otherwise convert anything silently).
#[test]
fn keys_and_values_must_have_the_activation_dtype() {
    for_each_backend("kv_input_dtypes", |backend| {
        let b = backend.as_ref();
        let dev = b.device()?;
        for cache_dtype in [CacheDType::Auto, CacheDType::F16, CacheDType::Fp8E4m3] {
            let config = SelectorConfig::new(64, DType::F32, cache_dtype);
            if !b.validate_configuration(&config).is_empty() {
                continue;
            }
            let s = setup_with_cache(b, DType::F32, cache_dtype)?;
            let (n, hkv, d) = (s.n, 2, 64);
            let layer = &s.batch.layer;
            let md = s.md.as_ref();
            let (q, k, v) = (&s.batch.query, &s.batch.key, &s.batch.value);
            for (what, other) in [("key", DType::F16), ("value", DType::Bf16)] {
                let mut cache = s.batch.kv_cache.clone();
                let before = cache.data().to_f32_vec()?;
                let mut out = s.batch.empty_output()?;
                let wrong = Tensor::from_f32(&dev, &vec![0.5; n * hkv * d], &[n, hkv, d], other)?;
                let (kk, vv) = if what == "key" {
                    (&wrong, v)
                } else {
                    (k, &wrong)
                };
                let r = s
                    .imp
                    .forward(layer, q, Some(kk), Some(vv), &mut cache, md, &mut out);
                let label = format!("{cache_dtype} cache, {other} {what}");
                match r {
                    Err(Error::DType { what: w, .. }) if w == what => {}
                    Err(e) => {
                        return Err(fail(format!(
                            "{label}: expected a {what} dtype error, got {e}"
                        )))
                    }
                    Ok(()) => return Err(fail(format!("{label}: accepted"))),
                }
                let r = s.imp.do_kv_cache_update(layer, kk, vv, &mut cache, md);
                ensure(
                    matches!(&r, Err(Error::DType { what: w, .. }) if *w == what),
                    || format!("{label}: do_kv_cache_update gave {r:?}"),
                )?;
                // Nothing was written by the rejected calls.
                let after = cache.data().to_f32_vec()?;
                ensure(
                    before
                        .iter()
                        .zip(&after)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    || format!("{label}: a rejected call changed the cache"),
                )?;
            }
        }
        Ok(())
    });
}

#[test]
fn impl_argument_errors_are_typed() {
    for_each_backend("impl_arguments", |backend| {
        let b = backend.as_ref();
        let dev = b.device()?;
        let s = setup(b, DType::F32)?;
        let (n, h, hkv, d) = (s.n, 8, 2, 64);
        let layer = &s.batch.layer;
        let md = s.md.as_ref();
        let mut cache = s.batch.kv_cache.clone();
        let zeros = |shape: &[usize], dt: DType| Tensor::zeros(&dev, shape, dt);
        let (q, k, v) = (&s.batch.query, &s.batch.key, &s.batch.value);
        let mut out = s.batch.empty_output()?;

        // The valid call works (so the errors below are about the one thing changed).
        s.imp
            .forward(layer, q, Some(k), Some(v), &mut cache, md, &mut out)?;

        let bad_q = zeros(&[n, h + 1, d], DType::F32)?;
        let mut out2 = zeros(&[n, h + 1, d], DType::F32)?;
        let r = s
            .imp
            .forward(layer, &bad_q, Some(k), Some(v), &mut cache, md, &mut out2);
        expect_err("query with a wrong head count", r, is_shape)?;

        let short_q = zeros(&[n - 1, h, d], DType::F32)?;
        let mut out3 = zeros(&[n - 1, h, d], DType::F32)?;
        let r = s
            .imp
            .forward(layer, &short_q, Some(k), Some(v), &mut cache, md, &mut out3);
        expect_err("query shorter than the batch", r, is_shape)?;

        let mut wrong_out = zeros(&[n, h, d + 8], DType::F32)?;
        let r = s
            .imp
            .forward(layer, q, Some(k), Some(v), &mut cache, md, &mut wrong_out);
        expect_err("output shape mismatch", r, is_shape)?;

        let mut f16_out = zeros(&[n, h, d], DType::F16)?;
        let r = s
            .imp
            .forward(layer, q, Some(k), Some(v), &mut cache, md, &mut f16_out);
        expect_err("output dtype differs from the query's", r, is_dtype)?;

        let int_q = zeros(&[n, h, d], DType::I32)?;
        let r = s
            .imp
            .forward(layer, &int_q, Some(k), Some(v), &mut cache, md, &mut out);
        expect_err("integer query", r, is_dtype)?;

        // f16 activations against the f32 cache this batch built.
        let q16 = zeros(&[n, h, d], DType::F16)?;
        let (k16, v16) = (
            zeros(&[n, hkv, d], DType::F16)?,
            zeros(&[n, hkv, d], DType::F16)?,
        );
        let r = s.imp.forward(
            layer,
            &q16,
            Some(&k16),
            Some(&v16),
            &mut cache,
            md,
            &mut f16_out,
        );
        expect_err("f16 activations with an f32 cache", r, is_dtype)?;

        let bad_k = zeros(&[n, hkv + 1, d], DType::F32)?;
        let r = s
            .imp
            .forward(layer, q, Some(&bad_k), Some(v), &mut cache, md, &mut out);
        expect_err("key with a wrong head count", r, is_shape)?;

        let r = s
            .imp
            .forward(layer, q, Some(k), None, &mut cache, md, &mut out);
        expect_err("key without value", r, |e| matches!(e, Error::Config(_)))?;

        let mut lse_wrong = zeros(&[n, h], DType::F32)?;
        let r = s.imp.forward_with_lse(
            layer,
            q,
            Some(k),
            Some(v),
            &mut cache,
            md,
            &mut out,
            Some(&mut lse_wrong),
        );
        expect_err("LSE of shape [T, H] instead of [H, T]", r, is_shape)?;
        let mut lse_f16 = zeros(&[h, n], DType::F16)?;
        let r = s.imp.forward_with_lse(
            layer,
            q,
            Some(k),
            Some(v),
            &mut cache,
            md,
            &mut out,
            Some(&mut lse_f16),
        );
        expect_err("f16 LSE", r, is_dtype)?;

        // A cache built for another head count.
        let spec = *s.batch.kv_cache.spec();
        let mut other_cache = KvCache::new(
            b,
            KvCacheSpec {
                num_kv_heads: hkv * 2,
                ..spec
            },
            s.batch.kv_cache.num_blocks(),
        )?;
        let r = s
            .imp
            .forward(layer, q, Some(k), Some(v), &mut other_cache, md, &mut out);
        expect_err("KV cache with a different head count", r, |e| {
            matches!(e, Error::Config(_) | Error::Shape { .. })
        })?;
        // A cache with fewer blocks than the metadata was validated for.
        let mut small_cache = KvCache::new(b, spec, 2)?;
        let r = s
            .imp
            .forward(layer, q, Some(k), Some(v), &mut small_cache, md, &mut out);
        expect_err("KV cache smaller than the batch's num_blocks", r, |e| {
            matches!(e, Error::Config(_) | Error::Metadata(_))
        })?;

        // Metadata from another builder.
        let r = s.imp.forward(
            layer,
            q,
            Some(k),
            Some(v),
            &mut cache,
            &ForeignMetadata,
            &mut out,
        );
        expect_err("foreign metadata in forward", r, |e| {
            matches!(e, Error::MetadataMismatch { .. })
        })?;
        let r = s
            .imp
            .do_kv_cache_update(layer, k, v, &mut cache, &ForeignMetadata);
        expect_err("foreign metadata in do_kv_cache_update", r, |e| {
            matches!(e, Error::MetadataMismatch { .. })
        })?;
        let r = s.imp.do_kv_cache_update(layer, &bad_k, v, &mut cache, md);
        expect_err("do_kv_cache_update with a wrong key shape", r, is_shape)?;
        ensure(s.params == *s.imp.params(), || "impl params differ".into())
    });
}

#[test]
fn bad_layer_parameters_are_config_errors() {
    for_each_backend("layer_parameters", |backend| {
        let b = backend.as_ref();
        let cases = [
            (
                "num_heads not a multiple of num_kv_heads",
                AttentionParams::new(6, 64, 4),
            ),
            (
                "alibi slopes per KV head",
                AttentionParams {
                    alibi_slopes: Some(vec![0.5; 2]),
                    ..AttentionParams::new(8, 64, 2)
                },
            ),
            (
                "sinks per KV head",
                AttentionParams {
                    sinks: Some(vec![0.5; 2]),
                    ..AttentionParams::new(8, 64, 2)
                },
            ),
            (
                "window 0",
                AttentionParams {
                    sliding_window: Some(0),
                    ..AttentionParams::new(8, 64, 2)
                },
            ),
            (
                "negative soft cap",
                AttentionParams {
                    logits_soft_cap: Some(-1.0),
                    ..AttentionParams::new(8, 64, 2)
                },
            ),
            (
                "zero scale",
                AttentionParams {
                    scale: 0.0,
                    ..AttentionParams::new(8, 64, 2)
                },
            ),
        ];
        for (what, p) in cases {
            match b.make_impl(p) {
                Err(Error::Config(_)) => {}
                Err(e) => return Err(fail(format!("{what}: expected Error::Config, got {e:?}"))),
                Ok(_) => return Err(fail(format!("{what}: accepted"))),
            }
        }
        Ok(())
    });
}

/// A head size the backend accepts.
fn supported_head_size(hs: &HeadSizes) -> usize {
    match hs {
        HeadSizes::Any => 64,
        HeadSizes::List(l) => l[0],
        HeadSizes::Range { min, .. } => *min,
    }
}

/// A block size the backend accepts.
fn supported_block_size(bs: &[BlockSize]) -> u32 {
    match bs[0] {
        BlockSize::Exact(b) | BlockSize::MultipleOf(b) => b,
    }
}

fn reason_codes(b: &dyn AttentionBackend, c: &SelectorConfig) -> Vec<String> {
    b.validate_configuration(c)
        .into_iter()
        .map(|r| r.code)
        .collect()
}

#[test]
fn unsupported_configurations_give_vllm_reasons() {
    for_each_backend("validate_configuration", |backend: &BackendRef| {
        let b = backend.as_ref();
        let caps = b.capabilities().clone();
        let hd = supported_head_size(&caps.head_sizes);
        let bs = supported_block_size(&caps.block_sizes);
        let dtype = caps.dtypes[0];
        let mut good = SelectorConfig::new(hd, dtype, caps.kv_cache_dtypes[0]);
        good.block_size = Some(bs);
        good.attn_type = caps.attn_types[0];
        good.use_mla = caps.is_mla;
        let none = reason_codes(b, &good);
        ensure(none.is_empty(), || {
            format!("a supported config was rejected: {none:?}")
        })?;

        let mut checked = 0;
        let mut check = |what: &str, c: SelectorConfig, code: &str| -> Outcome {
            let codes = reason_codes(b, &c);
            checked += 1;
            ensure(codes.iter().any(|r| r == code), || {
                format!("{what}: reasons {codes:?} lack {code:?}")
            })
        };
        if let Some(bad) = [20, 7, 3, 1000, 4096]
            .into_iter()
            .find(|&h| !caps.head_sizes.contains(h))
        {
            check(
                "head size",
                SelectorConfig {
                    head_size: bad,
                    ..good.clone()
                },
                "head_size not supported",
            )?;
            // The impl refuses it too, with the same reason.
            let p = AttentionParams::new(4, bad, 4);
            match b.make_impl(p) {
                Err(Error::Unsupported { reasons, .. })
                    if reasons.iter().any(|r| r.code == "head_size not supported") => {}
                Err(Error::Config(_)) => {}
                other => {
                    return Err(fail(format!(
                        "make_impl with head size {bad}: {:?}",
                        other.map(|_| ())
                    )))
                }
            }
        }
        if let Some(bad) = [8u32, 7, 3, 1, 12]
            .into_iter()
            .find(|&x| !caps.block_sizes.iter().any(|r| r.accepts(x)))
        {
            check(
                "block size",
                SelectorConfig {
                    block_size: Some(bad),
                    ..good.clone()
                },
                "block_size not supported",
            )?;
            let spec = KvCacheSpec {
                block_size: bad as usize,
                num_kv_heads: 2,
                head_size: hd,
                dtype,
                cache_dtype: CacheDType::Auto,
            };
            ensure(
                matches!(KvCache::new(b, spec, 4), Err(Error::Config(_))),
                || format!("KvCache::new with block size {bad} must be a config error"),
            )?;
            ensure(b.make_builder(&spec).is_err(), || {
                format!("make_builder with block size {bad} must fail")
            })?;
        }
        if let Some(&bad) = [DType::F32, DType::F16, DType::Bf16]
            .iter()
            .find(|d| !caps.dtypes.contains(d))
        {
            check(
                "dtype",
                SelectorConfig {
                    dtype: bad,
                    ..good.clone()
                },
                "dtype not supported",
            )?;
        }
        if let Some(&bad) = CacheDType::ALL
            .iter()
            .find(|c| !caps.kv_cache_dtypes.contains(c))
        {
            check(
                "kv cache dtype",
                SelectorConfig {
                    kv_cache_dtype: bad,
                    ..good.clone()
                },
                "kv_cache_dtype not supported",
            )?;
        }
        check(
            "MLA mismatch",
            SelectorConfig {
                use_mla: !caps.is_mla,
                ..good.clone()
            },
            if caps.is_mla {
                "non-MLA not supported"
            } else {
                "MLA not supported"
            },
        )?;
        for ty in [
            AttentionType::Decoder,
            AttentionType::Encoder,
            AttentionType::EncoderOnly,
            AttentionType::EncoderDecoder,
        ] {
            if !caps.attn_types.contains(&ty) {
                check(
                    "attention type",
                    SelectorConfig {
                        attn_type: ty,
                        ..good.clone()
                    },
                    &format!("attention type {ty} not supported"),
                )?;
            }
        }
        let flags: [(bool, SetFlag, &str); 5] = [
            (
                caps.supports_sink,
                |c| c.has_sink = true,
                "attention sinks not supported",
            ),
            (
                caps.supports_non_causal,
                |c| c.use_non_causal = true,
                "non-causal attention not supported",
            ),
            (
                caps.supports_alibi,
                |c| c.use_alibi = true,
                "ALiBi not supported",
            ),
            (
                caps.supports_sliding_window,
                |c| c.use_sliding_window = true,
                "sliding window not supported",
            ),
            (
                caps.supports_soft_cap,
                |c| c.use_soft_cap = true,
                "logits soft cap not supported",
            ),
        ];
        for (supported, set, code) in flags {
            let mut c = good.clone();
            set(&mut c);
            if supported {
                let codes = reason_codes(b, &c);
                ensure(codes.is_empty(), || {
                    format!("{code}: supported, yet {codes:?}")
                })?;
            } else {
                check("feature flag", c, code)?;
            }
        }
        // Several problems at once: every reason, in vLLM's order.
        if let (Some(bad_h), Some(bad_b)) = (
            [20, 7, 3]
                .into_iter()
                .find(|&h| !caps.head_sizes.contains(h)),
            [8u32, 7, 3]
                .into_iter()
                .find(|&x| !caps.block_sizes.iter().any(|r| r.accepts(x))),
        ) {
            let c = SelectorConfig {
                head_size: bad_h,
                block_size: Some(bad_b),
                use_mla: !caps.is_mla,
                ..good.clone()
            };
            let codes = reason_codes(b, &c);
            let pos = |s: &str| codes.iter().position(|r| r.contains(s));
            ensure(
                matches!((pos("head_size"), pos("block_size"), pos("MLA")), (Some(a), Some(bb), Some(m)) if a < bb && bb < m),
                || format!("reasons out of vLLM's order: {codes:?}"),
            )?;
        }
        ensure(checked >= 2, || {
            format!("only {checked} rejection checks applied; the body tests too little")
        })
    });
}

#[test]
fn cascade_requests_outside_the_rules_are_metadata_errors() {
    for_each_backend("cascade_validation", |backend| {
        let b = backend.as_ref();
        if !b.capabilities().supports_cascade {
            return Ok(());
        }
        let s = setup(b, DType::F32)?;
        let builder = b.make_builder(s.batch.kv_cache.spec())?;
        let common = CommonAttentionMetadata::new(&b.device()?, s.batch.desc.clone())?;
        // Not a multiple of the block size.
        let r = builder.build(5, &common, false).map(|_| ());
        expect_err("common_prefix_len 5 with blocks of 16", r, |e| {
            matches!(e, Error::Metadata(_))
        })?;
        // Longer than the smallest context (request 1 has none).
        let r = builder.build(16, &common, false).map(|_| ());
        expect_err("common_prefix_len beyond the smallest context", r, |e| {
            matches!(e, Error::Metadata(_))
        })?;
        // A batch built for a different block size.
        let other = b.make_builder(&KvCacheSpec {
            block_size: 32,
            ..*s.batch.kv_cache.spec()
        })?;
        let r = other.build(0, &common, false).map(|_| ());
        expect_err(
            "metadata of block size 16 for a block-size-32 builder",
            r,
            |e| matches!(e, Error::Metadata(_)),
        )?;
        ensure(s.n == 9, || "setup batch changed".into())
    });
}

#[test]
fn cascade_with_alibi_or_window_is_refused() {
    for_each_backend("cascade_feature_checks", |backend| {
        let b = backend.as_ref();
        if !b.capabilities().supports_cascade {
            return Ok(());
        }
        for (what, p) in [
            (
                "ALiBi",
                AttentionParams {
                    alibi_slopes: Some(vec![0.25; 4]),
                    ..AttentionParams::new(4, 64, 4)
                },
            ),
            (
                "sliding window",
                AttentionParams {
                    sliding_window: Some(8),
                    ..AttentionParams::new(4, 64, 4)
                },
            ),
        ] {
            let mut case = CaseConfig::new(p.clone(), DType::F32, 16);
            case.common_prefix_len = 16;
            let spec = BatchSpec::new(&[(1, 20), (2, 30)]);
            let mut batch = RandomBatch::generate(b, &case, &spec, 3)?;
            let builder = b.make_builder(batch.kv_cache.spec())?;
            let common = CommonAttentionMetadata::new(&b.device()?, batch.desc.clone())?;
            let md = builder.build(16, &common, false)?;
            let imp = b.make_impl(p)?;
            let mut out = batch.empty_output()?;
            let r = imp.forward(
                &batch.layer,
                &batch.query,
                Some(&batch.key),
                Some(&batch.value),
                &mut batch.kv_cache,
                md.as_ref(),
                &mut out,
            );
            expect_err(&format!("cascade with {what}"), r, |e| {
                matches!(e, Error::Config(_) | Error::Metadata(_))
            })?;
        }
        Ok(())
    });
}

/// A KV cache larger than the device can hold is refused before anything is allocated: about
/// 256 TiB (i32::MAX blocks of 128 KiB) is more than any device or host address space. Where
/// a backend knows its limit from the configuration (wgpu: one storage binding; the Vulkan
/// runtime: its device memory, caches past one binding being stored in chunks), the selector
/// refuses it up front with "KV cache too large".
#[test]
fn caches_larger_than_the_device_are_refused_up_front() {
    for_each_backend("kv_cache_size", |backend| {
        let b = backend.as_ref();
        let spec = KvCacheSpec {
            block_size: 16,
            num_kv_heads: 8,
            head_size: 128,
            dtype: DType::F32,
            cache_dtype: CacheDType::Auto,
        };
        let blocks = i32::MAX as usize;
        let bytes = spec.cache_bytes(blocks)?;
        ensure(bytes > 1 << 47, || {
            format!("{bytes} bytes is not beyond every device")
        })?;
        match KvCache::new(b, spec, blocks) {
            Ok(_) => return Err(fail(format!("a {bytes}-byte cache was allocated"))),
            Err(Error::Config(_) | Error::Device { .. } | Error::Overflow { .. }) => {}
            Err(e) => return Err(fail(format!("unexpected error kind: {e:?}"))),
        }
        if b.name() == "WGPU" || b.name() == "VULKAN" {
            let config =
                SelectorConfig::new(128, DType::F32, CacheDType::Auto).with_kv_cache_bytes(bytes);
            let reasons = b.validate_configuration(&config);
            ensure(
                reasons.iter().any(|r| r.code == "KV cache too large"),
                || format!("{} accepted a {bytes}-byte cache: {reasons:?}", b.name()),
            )?;
        }
        Ok(())
    });
}
