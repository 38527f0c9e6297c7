//! The example's end-to-end checks, run by `cargo test` (the example has `test = true`):
//! the embedded model against its own NumPy implementation, batching / chunking / preemption
//! not changing greedy output, greedy tokens identical on every available backend, SmolLM2
//! when its weights are present, and the errors users hit.

use polyattn::backend::Availability;
use polyattn::runner::{ModelRunner, RunnerConfig, SamplingParams};
use polyattn::BackendRef;

use crate::model::{Llama, LoadOptions, Placement};
use crate::{load_tiny, smollm, Loaded};

/// Prints to stderr unbuffered (libtest captures print! of passing tests; coverage and SKIP
/// lines must show in a plain `cargo test`).
macro_rules! report {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

fn cpu() -> BackendRef {
    polyattn::registry::global()
        .get("CPU")
        .expect("the CPU backend is always registered")
}

struct Reference {
    prompts: Vec<Vec<u32>>,
    greedy: Vec<Vec<u32>>,
}

fn glass_reference() -> Reference {
    let v: serde_json::Value =
        serde_json::from_str(include_str!("testdata/glass_reference.json")).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let cases = v["cases"].as_array().unwrap();
    Reference {
        prompts: cases.iter().map(|c| ids(&c["prompt_ids"])).collect(),
        greedy: cases.iter().map(|c| ids(&c["greedy_ids"])).collect(),
    }
}

fn generate(
    loaded: &Loaded,
    backend: Option<BackendRef>,
    prompts: &[Vec<u32>],
    tokens: usize,
    runner: RunnerConfig,
) -> polyattn::Result<(Vec<Vec<u32>>, String)> {
    generate_sharded(
        loaded,
        backend,
        prompts,
        tokens,
        runner,
        LoadOptions::default(),
    )
}

/// [`generate`] with the model laid out by `options` (rank shards and where they run).
fn generate_sharded(
    loaded: &Loaded,
    backend: Option<BackendRef>,
    prompts: &[Vec<u32>],
    tokens: usize,
    runner: RunnerConfig,
    options: LoadOptions,
) -> polyattn::Result<(Vec<Vec<u32>>, String)> {
    let model = Llama::load_with(
        loaded.config.clone(),
        loaded.weights.clone(),
        backend,
        options,
    )?;
    let mut runner = ModelRunner::new(model, runner)?;
    let name = polyattn::runner::CausalLm::backend(runner.model())
        .name()
        .to_string();
    // No stop tokens: always exactly `tokens` tokens, so runs compare position by position.
    let out = runner.generate(prompts, &SamplingParams::greedy(tokens))?;
    Ok((out, name))
}

#[test]
fn tiny_model_matches_its_numpy_implementation() {
    let tiny = load_tiny().unwrap();
    let r = glass_reference();
    let (got, _) = generate(&tiny, Some(cpu()), &r.prompts, 32, RunnerConfig::default()).unwrap();
    for (i, (g, w)) in got.iter().zip(&r.greedy).enumerate() {
        assert_eq!(
            g, w,
            "prompt {i}: polyattn CPU vs glassllm (NumPy, float32)"
        );
    }
}

#[test]
fn batching_chunking_and_preemption_do_not_change_greedy_tokens() {
    let tiny = load_tiny().unwrap();
    let r = glass_reference();
    let alone: Vec<Vec<u32>> = r
        .prompts
        .iter()
        .map(|p| {
            generate(
                &tiny,
                Some(cpu()),
                std::slice::from_ref(p),
                32,
                RunnerConfig::default(),
            )
            .unwrap()
            .0
            .remove(0)
        })
        .collect();
    // Chunked prefill: 5 tokens per step, so prompts arrive in pieces next to decodes.
    let chunked = RunnerConfig {
        max_num_batched_tokens: 5,
        ..Default::default()
    };
    // A cache of 6 blocks of 16 tokens for 4 requests growing to ~40 tokens each: requests
    // are preempted and recomputed.
    let tight = RunnerConfig {
        kv_cache_tokens: 96,
        ..Default::default()
    };
    for (what, cfg) in [("chunked prefill", chunked), ("preemption", tight)] {
        let model = Llama::load(tiny.config.clone(), tiny.weights.clone(), Some(cpu())).unwrap();
        let mut runner = ModelRunner::new(model, cfg).unwrap();
        let got = runner
            .generate(&r.prompts, &SamplingParams::greedy(32))
            .unwrap();
        assert_eq!(got, alone, "{what} changed the greedy tokens");
        if what == "preemption" {
            assert!(
                runner.stats().preemptions > 0,
                "the tight cache never preempted"
            );
        }
    }
    assert_eq!(alone, r.greedy);
}

#[test]
fn prompts_arriving_mid_run_join_the_running_batch() {
    // Request 0 decodes alone for 5 steps; then two prompts arrive and their prefills run in
    // the same steps as request 0's decodes (continuous batching). Every request's greedy
    // tokens must equal those it gets when it runs alone.
    let tiny = load_tiny().unwrap();
    let r = glass_reference();
    let model = Llama::load(tiny.config.clone(), tiny.weights.clone(), Some(cpu())).unwrap();
    let mut runner = ModelRunner::new(model, RunnerConfig::default()).unwrap();
    let params = SamplingParams::greedy(32);
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); 3];
    let mut ids = vec![runner
        .add_request(r.prompts[0].clone(), params.clone())
        .unwrap()];
    let mut mixed_steps = 0;
    let mut step = 0;
    while runner.has_unfinished() {
        if step == 5 {
            for p in &r.prompts[1..3] {
                ids.push(runner.add_request(p.clone(), params.clone()).unwrap());
            }
        }
        let before = runner.stats();
        for t in runner.step().unwrap() {
            let i = ids.iter().position(|&id| id == t.request).unwrap();
            out[i].push(t.token);
        }
        let after = runner.stats();
        if after.prefill_tokens > before.prefill_tokens
            && after.decode_tokens > before.decode_tokens
        {
            mixed_steps += 1;
        }
        step += 1;
    }
    assert!(mixed_steps > 0, "no step mixed a prefill with decodes");
    assert_eq!(out, r.greedy[..3].to_vec());
}

/// Runs `check` on every available backend the model can run on (`except` left out), then
/// prints `[what] <done>: the labels `check` returned; skipped: …` and fails with every
/// backend's error. `check` returns the labels of what it verified.
fn on_every_backend(
    what: &str,
    done: &str,
    except: &[&str],
    mut check: impl FnMut(&BackendRef) -> Result<Vec<String>, String>,
) {
    let mut ran = Vec::new();
    let mut skipped = Vec::new();
    let mut failures = Vec::new();
    for b in polyattn::registry::global().backends() {
        // The model has no MLA layer.
        if except.contains(&b.name()) || b.capabilities().is_mla {
            continue;
        }
        if let Availability::Unavailable(why) = b.availability() {
            skipped.push(format!("{} ({why})", b.name()));
            continue;
        }
        match check(&b) {
            Ok(labels) => ran.extend(labels),
            Err(e) => failures.push(format!("{}: {e}", b.name())),
        }
    }
    if ran.is_empty() && failures.is_empty() {
        report!("SKIP [{what}]: no backend it needs is available here");
    }
    report!(
        "[{what}] {done}: {}; skipped: {}",
        ran.join(", "),
        if skipped.is_empty() {
            "none".to_string()
        } else {
            skipped.join(", ")
        }
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Greedy tokens of `prompts` on every available backend equal the CPU's. Prints which
/// backends ran and which were skipped, and why.
fn identical_on_every_backend(what: &str, loaded: &Loaded, prompts: &[Vec<u32>], tokens: usize) {
    let (want, _) = generate(
        loaded,
        Some(cpu()),
        prompts,
        tokens,
        RunnerConfig::default(),
    )
    .unwrap();
    report!("[{what}] the CPU's tokens are the reference");
    on_every_backend(what, "identical greedy tokens on", &["CPU"], |b| {
        let (got, _) = generate(
            loaded,
            Some(b.clone()),
            prompts,
            tokens,
            RunnerConfig::default(),
        )
        .map_err(|e| e.to_string())?;
        if got == want {
            Ok(vec![b.name().to_string()])
        } else {
            Err(format!(
                "greedy tokens differ from the CPU's\n  cpu: {want:?}\n  got: {got:?}"
            ))
        }
    });
}

#[test]
fn tiny_model_greedy_tokens_are_identical_on_every_backend() {
    let tiny = load_tiny().unwrap();
    identical_on_every_backend("tiny, 32 tokens", &tiny, &glass_reference().prompts, 32);
}

/// The keys and values written by the Q/K/V projection (the default where the cache takes
/// it, `compute::fuses_cache_write`) and by the attention layer's own write give the same
/// greedy tokens on every available backend, through the default runner (decode steps
/// replayed as graphs where the backend captures them, so the replayed steps read each
/// step's slot mapping from the arrays the runner rewrites in place).
#[test]
fn tiny_model_cache_written_by_the_projection_gives_the_same_tokens() {
    let tiny = load_tiny().unwrap();
    let prompts = glass_reference().prompts;
    on_every_backend(
        "tiny, cache written by the Q/K/V projection or by attention, 24 tokens",
        "identical greedy tokens on",
        &[],
        |b| {
            let run = |separate_cache_write| {
                let options = LoadOptions {
                    separate_cache_write,
                    ..LoadOptions::default()
                };
                generate_sharded(
                    &tiny,
                    Some(b.clone()),
                    &prompts,
                    24,
                    RunnerConfig::default(),
                    options,
                )
                .map(|r| r.0)
                .map_err(|e| format!("separate cache write {separate_cache_write}: {e}"))
            };
            let (fused, separate) = (run(false)?, run(true)?);
            if fused != separate {
                return Err(format!(
                    "greedy tokens differ\n  attention's write: {separate:?}\n  the \
                     projection's:     {fused:?}"
                ));
            }
            Ok(vec![b.name().to_string()])
        },
    );
}

/// Greedy tokens of the model split into 2, 3 and 4 tensor-parallel shards (those its heads
/// allow) equal the unsharded model's, on every available backend, in both placements: every
/// shard on the one device (partial projections summed into the residual stream in place),
/// and every rank with its own residual stream, KV caches and metadata, summed by a
/// `RankGroup` (here the ranks share the backend's device, so the group sums through the
/// host; the same code runs one rank per GPU over NCCL).
fn sharded_equals_unsharded(what: &str, loaded: &Loaded, prompts: &[Vec<u32>], tokens: usize) {
    let c = &loaded.config;
    let sizes: Vec<usize> = (2..=4)
        .filter(|&n| polyattn::parallel::HeadSharding::new(c.num_heads, c.num_kv_heads, n).is_ok())
        .collect();
    assert!(
        !sizes.is_empty(),
        "{what}: no shard count in 2..=4 fits {} / {} heads",
        c.num_heads,
        c.num_kv_heads
    );
    on_every_backend(what, "sharded tokens equal unsharded on", &[], |b| {
        let run = |n, per_rank: bool| {
            let (backend, placement) = match per_rank {
                false => (Some(b.clone()), Placement::OneDevice),
                true => (None, Placement::PerRank(vec![b.clone(); n])),
            };
            let options = LoadOptions {
                tensor_parallel: n,
                placement,
                ..LoadOptions::default()
            };
            generate_sharded(
                loaded,
                backend,
                prompts,
                tokens,
                RunnerConfig::default(),
                options,
            )
            .map(|r| r.0)
            .map_err(|e| format!("{n} shard(s), per rank {per_rank}: {e}"))
        };
        let want = run(1, false)?;
        let mut done = Vec::new();
        for &n in &sizes {
            for per_rank in [false, true] {
                let got = run(n, per_rank)?;
                if got != want {
                    return Err(format!(
                        "{n} shards (per rank: {per_rank}): greedy tokens differ\n  \
                         unsharded: {want:?}\n  sharded:   {got:?}"
                    ));
                }
            }
            done.push(format!("{} ×{n}", b.name()));
        }
        Ok(done)
    });
}

/// Ranks on different backends' devices (the first on the CPU, the others on each available
/// GPU backend in turn) give the unsharded model's greedy tokens: every rank builds its own
/// metadata, holds its own caches, and the group sums across device kinds through the host.
#[test]
fn tiny_model_ranks_on_different_devices_give_the_unsharded_tokens() {
    let tiny = load_tiny().unwrap();
    let prompts = glass_reference().prompts;
    let (want, _) = generate(&tiny, Some(cpu()), &prompts, 16, RunnerConfig::default()).unwrap();
    on_every_backend(
        "tiny, ranks on CPU and another device, 16 tokens",
        "ranks on cpu + device give the unsharded tokens on",
        &["CPU"],
        |b| {
            let options = LoadOptions {
                tensor_parallel: 2,
                placement: Placement::PerRank(vec![cpu(), b.clone()]),
                ..LoadOptions::default()
            };
            let model = Llama::load_with(tiny.config.clone(), tiny.weights.clone(), None, options)
                .map_err(|e| e.to_string())?;
            match model.rank_transport() {
                Some(polyattn::parallel::Transport::Host { .. }) => {}
                other => return Err(format!("expected host sums, the group uses {other:?}")),
            }
            let mut runner =
                ModelRunner::new(model, RunnerConfig::default()).map_err(|e| e.to_string())?;
            let got = runner
                .generate(&prompts, &SamplingParams::greedy(16))
                .map_err(|e| e.to_string())?;
            if got != want {
                return Err(format!(
                    "greedy tokens differ\n  unsharded: {want:?}\n  cpu + {}: {got:?}",
                    b.name()
                ));
            }
            Ok(vec![format!("CPU + {}", b.name())])
        },
    );
}

#[test]
fn tiny_model_tensor_parallel_shards_give_the_unsharded_tokens() {
    let tiny = load_tiny().unwrap();
    sharded_equals_unsharded(
        "tiny tensor-parallel, 24 tokens",
        &tiny,
        &glass_reference().prompts,
        24,
    );
    // A placement that names the wrong number of ranks, or a backend beside one, is an error.
    let options = |n, ranks| LoadOptions {
        tensor_parallel: n,
        placement: Placement::PerRank(vec![cpu(); ranks]),
        ..LoadOptions::default()
    };
    let load = |backend, options| {
        Llama::load_with(tiny.config.clone(), tiny.weights.clone(), backend, options)
            .err()
            .map(|e| e.to_string())
    };
    let e = load(None, options(2, 3)).expect("3 backends for 2 ranks accepted");
    assert!(e.contains("3 rank backends for 2 ranks"), "{e}");
    let e = load(Some(cpu()), options(2, 2)).expect("a backend and rank backends accepted");
    assert!(e.contains("not both"), "{e}");
    // Shard counts the heads cannot take are errors, not panics.
    for n in [0, 64] {
        let options = LoadOptions {
            tensor_parallel: n,
            ..LoadOptions::default()
        };
        let e = Llama::load_with(
            tiny.config.clone(),
            tiny.weights.clone(),
            Some(cpu()),
            options,
        )
        .err()
        .unwrap_or_else(|| panic!("{n} shards accepted"));
        assert!(e.to_string().contains("head sharding"), "{e}");
    }
}

fn smollm2_or_skip(test: &str) -> Option<Loaded> {
    let path = smollm::default_path();
    if !path.exists() {
        report!(
            "SKIP {test}: {} not found (run scripts/fetch-smollm2.sh, or set POLYATTN_SMOLLM2_GGUF)",
            path.display()
        );
        return None;
    }
    Some(smollm::load_verified(&path).unwrap())
}

#[test]
fn smollm2_says_paris_on_every_backend() {
    let Some(model) = smollm2_or_skip("smollm2_says_paris_on_every_backend") else {
        return;
    };
    let prompt = model.tokenizer.encode("The capital of France is").unwrap();
    let (out, _) = generate(
        &model,
        Some(cpu()),
        std::slice::from_ref(&prompt),
        8,
        RunnerConfig::default(),
    )
    .unwrap();
    let text = model.tokenizer.decode(&out[0]).unwrap();
    assert!(text.starts_with(" Paris"), "CPU continued with {text:?}");
    let prompts = vec![
        prompt,
        model.tokenizer.encode("def fibonacci(n):").unwrap(),
        model
            .tokenizer
            .encode(&crate::bpe::chat_prompt("What is 2+2?"))
            .unwrap(),
    ];
    identical_on_every_backend("smollm2, 32 tokens", &model, &prompts, 32);
}

#[test]
fn smollm2_tensor_parallel_shards_give_the_unsharded_tokens() {
    let Some(model) = smollm2_or_skip("smollm2_tensor_parallel_shards_give_the_unsharded_tokens")
    else {
        return;
    };
    let prompts = vec![
        model.tokenizer.encode("The capital of France is").unwrap(),
        model.tokenizer.encode("def fibonacci(n):").unwrap(),
    ];
    sharded_equals_unsharded("smollm2 tensor-parallel, 32 tokens", &model, &prompts, 32);
}

#[test]
fn bad_inputs_are_clear_errors() {
    let tiny = load_tiny().unwrap();
    let model = Llama::load(tiny.config.clone(), tiny.weights.clone(), Some(cpu())).unwrap();
    let mut runner = ModelRunner::new(model, RunnerConfig::default()).unwrap();
    let long = tiny.tokenizer.encode(&"the cat sat. ".repeat(60)).unwrap();
    let e = runner
        .add_request(long, SamplingParams::greedy(4))
        .unwrap_err()
        .to_string();
    assert!(e.contains("the context holds 128"), "{e}");
    assert!(runner
        .add_request(vec![], SamplingParams::greedy(4))
        .is_err());
    let e = runner
        .add_request(vec![5000], SamplingParams::greedy(4))
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
    let bad = SamplingParams {
        top_p: 0.0,
        ..SamplingParams::greedy(4)
    };
    assert!(runner.add_request(vec![5], bad).is_err());
    assert!(
        !runner.has_unfinished(),
        "a rejected request must not be queued"
    );

    // Missing, corrupted and substituted weight files.
    let dir = std::env::temp_dir().join(format!("polyattn-generate-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.gguf");
    let e = smollm::load_gguf(&missing).err().unwrap();
    assert!(e.contains("missing.gguf"), "{e}");
    let corrupt = dir.join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let e = smollm::load_gguf(&corrupt).err().unwrap();
    assert!(e.contains("corrupt.gguf"), "{e}");
    let e = smollm::load_verified(&corrupt).err().unwrap();
    assert!(e.contains("sha256"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
    let e = crate::glass::GlassTokenizer::from_json("{}").unwrap_err();
    assert!(e.contains("alphabet"), "{e}");
}
