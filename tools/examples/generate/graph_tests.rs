//! Captured decode steps of the whole model, on every backend whose decode steps can be
//! graphs (CUDA; the native Vulkan runtime, which CI runs on lavapipe): a replayed step's
//! logits and KV caches are bit-identical to the same step run eagerly, and the runner's
//! greedy tokens with graphs equal those without. Backends without graphs are skipped with
//! their level.

use polyattn::backend::{Availability, GraphCaptureSupport};
use polyattn::runner::{CausalLm, ModelRunner, RunnerConfig, SamplingParams, StepBatch};
use polyattn::{
    AttentionBackend, BackendRef, BatchDescription, CacheDType, CommonAttentionMetadata, DType,
    Device, KvCache, KvCacheSpec, Tensor,
};

use crate::load_tiny;
use crate::model::Llama;

macro_rules! report {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// The backends a graph test runs on; the others are reported with why not.
fn graph_backends(test: &str) -> Vec<BackendRef> {
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
        let level = b.capabilities().graph_capture;
        if level < GraphCaptureSupport::UniformSingleTokenDecode {
            skipped.push(format!("{} (graph capture {level:?})", b.name()));
            continue;
        }
        ran.push(b);
    }
    report!(
        "[{test}] runs on: {}; skipped: {}",
        if ran.is_empty() {
            "none".to_string()
        } else {
            ran.iter()
                .map(|b| b.name().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        },
        skipped.join(", ")
    );
    ran
}

fn bits(t: &Tensor) -> polyattn::Result<Vec<u32>> {
    Ok(t.to_f32_vec()?.into_iter().map(f32::to_bits).collect())
}

/// Three requests (prompts of 5, 17 and 33 tokens, prefilled eagerly) decode 4 steps padded
/// to a batch of 4. Step 1 runs eagerly on graph metadata and is captured; steps 2-4 write the
/// inputs, rebuild the metadata and replay. Each step is also run eagerly (`forward`, fresh
/// activations) on a second builder's graph metadata and a copy of the caches: logits and
/// caches must be bit-identical (the same kernels on the same inputs).
fn replay_equals_eager(b: &BackendRef) -> polyattn::Result<()> {
    let tiny = load_tiny().map_err(polyattn::Error::Config)?;
    let model = Llama::load(tiny.config.clone(), tiny.weights.clone(), Some(b.clone()))?;
    let device: Device = model.device().clone();
    let cfg = CausalLm::config(&model);
    let be: &dyn AttentionBackend = b.as_ref();
    let bs = 16;
    let spec = KvCacheSpec {
        block_size: bs,
        num_kv_heads: cfg.kv_cache_heads[0],
        head_size: cfg.head_size,
        dtype: DType::F32,
        cache_dtype: CacheDType::Auto,
    };
    let width = cfg.max_model_len.div_ceil(bs);
    let prompts = [5usize, 17, 33];
    let (n, size) = (prompts.len(), 4usize);
    // Request r owns blocks 1 + r·width .. (1 + r)·width.
    let blocks: Vec<Vec<i32>> = (0..n)
        .map(|r| (0..width).map(|i| (1 + r * width + i) as i32).collect())
        .collect();
    let num_blocks = 1 + n * width;
    let slot = |r: usize, pos: usize| blocks[r][pos / bs] as i64 * bs as i64 + (pos % bs) as i64;
    let mut caches: Vec<KvCache> = cfg
        .kv_cache_heads
        .iter()
        .map(|&num_kv_heads| {
            KvCache::new(
                be,
                KvCacheSpec {
                    num_kv_heads,
                    ..spec
                },
                num_blocks,
            )
        })
        .collect::<polyattn::Result<_>>()?;

    // Prefill eagerly on plain metadata.
    let mut tokens: Vec<Vec<i32>> = prompts
        .iter()
        .enumerate()
        .map(|(r, &len)| {
            (0..len)
                .map(|i| ((r * 31 + i * 7) % 60 + 3) as i32)
                .collect()
        })
        .collect();
    let mut desc = BatchDescription {
        query_start_loc: vec![0],
        causal: true,
        block_size: bs,
        max_blocks_per_req: width,
        ..Default::default()
    };
    let (mut ids, mut pos, mut last) = (Vec::new(), Vec::new(), Vec::new());
    for (r, t) in tokens.iter().enumerate() {
        for (i, &tok) in t.iter().enumerate() {
            ids.push(tok);
            pos.push(i as i32);
            desc.slot_mapping.push(slot(r, i));
        }
        desc.block_table.extend(&blocks[r]);
        desc.seq_lens.push(t.len() as i32);
        desc.query_start_loc.push(ids.len() as i32);
        last.push(ids.len() as i32 - 1);
    }
    let common = CommonAttentionMetadata::new(&device, desc)?;
    let builder = be.make_builder(&spec)?;
    let md = builder.build(0, &common, false)?;
    let logits = model.forward(
        &StepBatch {
            input_ids: &Tensor::from_i32(&device, &ids, &[ids.len()])?,
            positions: &Tensor::from_i32(&device, &pos, &[pos.len()])?,
            logits_indices: &Tensor::from_i32(&device, &last, &[n])?,
            attn_metadata: md.as_ref(),
            common: &common,
        },
        &mut caches,
    )?;
    let v = cfg.vocab_size;
    let first = logits.to_f32_vec()?;
    for (r, t) in tokens.iter_mut().enumerate() {
        t.push(polyattn::runner::argmax(&first[r * v..(r + 1) * v]) as i32);
    }
    let mut eager_caches = caches.clone();

    // Decode: graph side and eager side.
    let graph_builder = be.make_builder(&spec)?;
    let eager_builder = be.make_builder(&spec)?;
    let mut g_ids = Tensor::zeros(&device, &[size], DType::I32)?;
    let mut g_pos = Tensor::zeros(&device, &[size], DType::I32)?;
    let rows = Tensor::from_i32(&device, &(0..size as i32).collect::<Vec<_>>(), &[size])?;
    let mut g_logits = Tensor::zeros(&device, &[size, v], DType::F32)?;
    let mut graph = None;
    // The batch's device arrays stay in place across steps, as the runner keeps them: the
    // captured step reads the slot mapping (the Q/K/V projection writes the cache).
    let mut arrays = None;
    for step in 0..4 {
        let mut desc = BatchDescription {
            query_start_loc: (0..=size as i32).collect(),
            causal: true,
            block_size: bs,
            max_blocks_per_req: width,
            block_table: vec![0; size * width],
            ..Default::default()
        };
        let (mut ids, mut pos) = (vec![0i32; size], vec![0i32; size]);
        for (r, t) in tokens.iter().enumerate() {
            let p = t.len() - 1;
            desc.block_table[r * width..][..width].copy_from_slice(&blocks[r]);
            desc.slot_mapping.push(slot(r, p));
            desc.seq_lens.push(p as i32 + 1);
            ids[r] = t[p];
            pos[r] = p as i32;
        }
        desc.slot_mapping.resize(size, -1);
        desc.seq_lens.resize(size, 1);
        let common = match arrays.take() {
            Some(a) => CommonAttentionMetadata::new_in(&device, desc, a)?,
            None => CommonAttentionMetadata::new(&device, desc)?,
        };
        let md = graph_builder.build_for_graph_capture(&common)?;
        g_ids.write_i32(&ids)?;
        g_pos.write_i32(&pos)?;
        match &graph {
            Some(g) => polyattn::DeviceGraph::replay(g)?,
            None => {
                let mut run = || {
                    model.forward_into(
                        &StepBatch {
                            input_ids: &g_ids,
                            positions: &g_pos,
                            logits_indices: &rows,
                            attn_metadata: md.as_ref(),
                            common: &common,
                        },
                        &mut caches,
                        &mut g_logits,
                    )
                };
                run()?;
                graph = Some(device.capture(run)?);
            }
        }
        // The eager side from its own arrays: a rewrite of the graph's that did not reach the
        // device would make the two differ.
        let eager_common = CommonAttentionMetadata::new(&device, common.description().clone())?;
        let emd = eager_builder.build_for_graph_capture(&eager_common)?;
        let e_logits = model.forward(
            &StepBatch {
                input_ids: &Tensor::from_i32(&device, &ids, &[size])?,
                positions: &Tensor::from_i32(&device, &pos, &[size])?,
                logits_indices: &rows,
                attn_metadata: emd.as_ref(),
                common: &eager_common,
            },
            &mut eager_caches,
        )?;
        let got = bits(&g_logits)?;
        if got != bits(&e_logits)? {
            return Err(polyattn::Error::Config(format!(
                "step {}: replayed logits differ from the eager step's",
                step + 1
            )));
        }
        for (l, (cg, ce)) in caches.iter().zip(&eager_caches).enumerate() {
            if bits(cg.data())? != bits(ce.data())? {
                return Err(polyattn::Error::Config(format!(
                    "step {}: layer {l}'s KV cache differs from the eager step's",
                    step + 1
                )));
            }
        }
        let logits = g_logits.to_f32_vec()?;
        for (r, t) in tokens.iter_mut().enumerate() {
            t.push(polyattn::runner::argmax(&logits[r * v..(r + 1) * v]) as i32);
        }
        drop((md, emd));
        arrays = Some(common.into_device_arrays().ok_or_else(|| {
            polyattn::Error::Config("the batch's arrays are still shared after the step".into())
        })?);
    }
    no_validation_errors(&device)
}

/// On the Vulkan runtime with the Khronos validation layer (debug builds where it is
/// installed, as on CI): any message it reported is a failure.
fn no_validation_errors(device: &Device) -> polyattn::Result<()> {
    if let Device::Vulkan(d) = device {
        let errors = d.take_validation_errors();
        if !errors.is_empty() {
            return Err(polyattn::Error::Config(format!(
                "Vulkan validation errors: {}",
                errors.join("; ")
            )));
        }
    }
    Ok(())
}

#[test]
fn replayed_decode_steps_equal_eager_steps() {
    let mut failures = Vec::new();
    for b in graph_backends("replayed decode steps") {
        match replay_equals_eager(&b) {
            Ok(()) => report!(
                "  ok   {}: 4 replayed steps bit-identical to eager",
                b.name()
            ),
            Err(e) => failures.push(format!("{}: {e}", b.name())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The runner with graphs (default capture sizes) and without: equal tokens, greedy and
/// sampled (temperature 0.8, top-p 0.9: the draws are taken on the device from bit-identical
/// logits, so they match too), and the graph runs really replayed (most decode steps are
/// graph steps). The sampled tokens differ from the greedy ones, so the draws did happen.
#[test]
fn runner_graphs_keep_tokens() {
    let tiny = load_tiny().unwrap();
    let prompts: Vec<Vec<u32>> = ["Once upon a time", "The cat", "A small dog ran to the"]
        .iter()
        .map(|p| tiny.tokenizer.encode(p).unwrap())
        .collect();
    let sampled = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: 11,
        ..SamplingParams::greedy(24)
    };
    let mut failures = Vec::new();
    for b in graph_backends("runner graphs") {
        let run = |sizes: Vec<usize>,
                   params: &SamplingParams|
         -> polyattn::Result<(Vec<Vec<u32>>, usize, usize, usize)> {
            let model = Llama::load(tiny.config.clone(), tiny.weights.clone(), Some(b.clone()))?;
            let mut runner = ModelRunner::new(
                model,
                RunnerConfig {
                    graph_capture_sizes: sizes,
                    ..Default::default()
                },
            )?;
            let out = runner.generate(&prompts, params)?;
            no_validation_errors(runner.device())?;
            let s = runner.stats();
            Ok((out, s.graph_steps, s.steps, runner.graphs_captured()))
        };
        let mut greedy_tokens = None;
        for (what, params) in [
            ("greedy", SamplingParams::greedy(24)),
            ("sampled", sampled.clone()),
        ] {
            match (
                run(RunnerConfig::default().graph_capture_sizes, &params),
                run(Vec::new(), &params),
            ) {
                (Ok((g, graph_steps, steps, captures)), Ok((e, 0, _, _))) => {
                    if g != e {
                        failures.push(format!(
                            "{} {what}: graph tokens {g:?} != eager {e:?}",
                            b.name()
                        ));
                    } else if graph_steps * 2 < steps {
                        failures.push(format!(
                            "{} {what}: only {graph_steps} of {steps} steps replayed graphs",
                            b.name()
                        ));
                    } else if captures * 4 > graph_steps {
                        // One capture per batch size and width: a step that captures again
                        // means the batch's arrays could not be kept in place.
                        failures.push(format!(
                            "{} {what}: {captures} captures for {graph_steps} graph steps",
                            b.name()
                        ));
                    } else if greedy_tokens.as_ref() == Some(&g) {
                        failures.push(format!(
                            "{} {what}: the sampled tokens equal the greedy ones",
                            b.name()
                        ));
                    } else {
                        report!(
                            "  ok   {} {what}: {graph_steps} of {steps} steps were graphs, \
                             tokens equal",
                            b.name()
                        );
                        greedy_tokens.get_or_insert(g);
                    }
                }
                (Ok(_), Ok((_, n, _, _))) => failures.push(format!(
                    "{} {what}: {n} graph steps with no sizes",
                    b.name()
                )),
                (Err(e), _) | (_, Err(e)) => failures.push(format!("{} {what}: {e}", b.name())),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
