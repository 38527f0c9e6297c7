//! Concurrency: the public types a serving engine shares between threads are `Send + Sync`
//! (checked at compile time), and forwards of different layers, each with its own cache, run
//! from several threads at once on every available backend and each matches the f64
//! reference.

#[macro_use]
mod common;

use std::sync::Barrier;

use common::{ensure, fail, for_each_backend, Outcome};
use polyattn::reference;
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch, Tolerance};
use polyattn::{
    Attention, AttentionLayer, AttentionMetadata, AttentionParams, BackendRef, CacheDType,
    CommonAttentionMetadata, DType, Device, KvCache, SelectorConfig, Tensor,
};

fn assert_send_sync<T: Send + Sync + ?Sized>() {}

#[test]
fn shared_types_are_send_and_sync() {
    assert_send_sync::<Attention>();
    assert_send_sync::<KvCache>();
    assert_send_sync::<Tensor>();
    assert_send_sync::<Device>();
    assert_send_sync::<BackendRef>();
    assert_send_sync::<CommonAttentionMetadata>();
    assert_send_sync::<Box<dyn AttentionMetadata>>();
    assert_send_sync::<RandomBatch>();
}

/// One layer: (heads, KV heads, head size, activation, cache, `(query_len, seq_len)` batch).
type Layer = (
    usize,
    usize,
    usize,
    DType,
    CacheDType,
    &'static [(usize, usize)],
);

/// One layer per thread.
const LAYERS: [Layer; 4] = [
    (
        8,
        2,
        64,
        DType::F32,
        CacheDType::Auto,
        &[(1, 40), (9, 9), (5, 21)],
    ),
    (
        4,
        4,
        32,
        DType::F16,
        CacheDType::Fp8E4m3,
        &[(1, 17), (1, 3), (12, 30)],
    ),
    (6, 1, 64, DType::Bf16, CacheDType::Auto, &[(3, 35), (1, 1)]),
    (8, 4, 64, DType::F32, CacheDType::F16, &[(1, 50), (6, 6)]),
];
/// Forwards per layer (each step writes the same keys again and must give the same result).
const STEPS: usize = 3;

/// Builds layer `i` on `backend`, runs its forwards and compares each with the reference.
fn run_layer(backend: &BackendRef, i: usize, start: &Barrier) -> Result<bool, String> {
    let (h, hkv, d, dtype, cache, reqs) = LAYERS[i];
    let params = AttentionParams {
        kv_cache_dtype: cache,
        ..AttentionParams::new(h, d, hkv)
    };
    let config = SelectorConfig::for_layer(&params, dtype, Some(16));
    let supported = backend.validate_configuration(&config).is_empty();
    // Every thread reaches the barrier, run or not, so none waits forever.
    let prepared = if supported {
        let case = CaseConfig::new(params.clone(), dtype, 16);
        Some(
            RandomBatch::generate(
                backend.as_ref(),
                &case,
                &BatchSpec::new(reqs),
                700 + i as u64,
            )
            .map_err(|e| e.to_string()),
        )
    } else {
        None
    };
    start.wait();
    let Some(batch) = prepared else {
        return Ok(false);
    };
    let mut batch = batch?;
    let mut go = || -> polyattn::Result<Option<String>> {
        let want = reference::attention(&batch)?;
        let layer = AttentionLayer::new(format!("model.layers.{i}.self_attn"))
            .with_scales(batch.layer.k_scale, batch.layer.v_scale)?;
        let attn = Attention::on_backend(layer, params.clone(), backend.clone())?;
        let builder = attn.make_builder(batch.kv_cache.spec())?;
        let device = backend.device()?;
        for step in 0..STEPS {
            let common = CommonAttentionMetadata::new(&device, batch.desc.clone())?;
            let md = builder.build(0, &common, false)?;
            let mut out = batch.empty_output()?;
            attn.forward(
                &batch.query,
                Some(&batch.key),
                Some(&batch.value),
                &mut batch.kv_cache,
                md.as_ref(),
                &mut out,
            )?;
            device.synchronize()?;
            let cmp =
                reference::compare(&out.to_f32_vec()?, &want.out, Tolerance::for_dtype(dtype));
            if !cmp.pass {
                return Ok(Some(format!(
                    "layer {i} ({dtype}/{cache} ({h},{hkv}) d{d}) step {step}: output {cmp}"
                )));
            }
        }
        Ok(None)
    };
    match go() {
        Ok(None) => Ok(true),
        Ok(Some(why)) => Err(why),
        Err(e) => Err(format!("layer {i}: {e}")),
    }
}

#[test]
fn layers_run_from_several_threads() {
    for_each_backend("concurrent_layers", |backend| -> Outcome {
        let start = Barrier::new(LAYERS.len());
        let results: Vec<Result<bool, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..LAYERS.len())
                .map(|i| {
                    let start = &start;
                    s.spawn(move || run_layer(backend, i, start))
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    h.join().unwrap_or_else(|p| {
                        Err(format!(
                            "layer {i}: thread panicked: {}",
                            polyattn::testing::fuzz::panic_message(&*p)
                        ))
                    })
                })
                .collect()
        });
        let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        if !errors.is_empty() {
            return Err(fail(
                errors
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
            ));
        }
        let ran = results.iter().filter(|r| matches!(r, Ok(true))).count();
        ensure(ran >= 2, || {
            format!("only {ran} layer(s) ran concurrently; the test needs at least 2")
        })
    });
}
