//! Generates text with a Llama-family model whose attention runs through polyattn — the same
//! code on every backend; `POLYATTN_BACKEND` alone moves the whole model (and
//! `--tensor-parallel N` spreads its ranks over N CUDA GPUs where there are that many).
//!
//! ```text
//! cargo run --release --example generate -- [--model tiny|smollm2|PATH] [--max-tokens N]
//!     [--temperature T] [--top-p P] [--seed S] [--chat] [--backends all|NAME,…]
//!     [--tensor-parallel N [--rank-devices auto|one|each]] "prompt" ["prompt" …]
//! ```
//!
//! The generated text streams to stdout (several prompts run batched together; their texts
//! are printed one after the other, each as soon as it is ready); stderr reports the backend,
//! the device, and tokens/s for prefill and decode.
//!
//! Models: `tiny` (default) is embedded — glassllm's 4-layer toy (MIT), so the command works
//! offline on a fresh machine; `smollm2` is SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1
//! GGUF fetched by `scripts/fetch-smollm2.sh` into `models/` (or `$POLYATTN_SMOLLM2_GGUF`)
//! and checked against its sha256; a PATH to a `.gguf` file loads any Llama GGUF whose
//! tensors are F32 / F16 / Q8_0 / Q4_0 / Q4_1.
// The loader modules (gguf, bpe, npz) are small libraries with a complete API; the CLI uses
// part of it and the tests the rest. The byte-level BPE is Hugging Face `tokenizers` built
// from the GGUF's metadata (bpe.rs); the .npz archive is read with `zip` (npz.rs); the
// GGUF reader is the example's own (gguf.rs says why).
#![allow(dead_code)]

mod bpe;
mod compare;
mod gguf;
mod glass;
mod model;
mod npz;
mod smollm;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use polyattn::parallel::Transport;
use polyattn::runner::{ModelRunner, RunnerConfig, SamplingParams};
use polyattn::DType;

use crate::glass::GlassTokenizer;
use crate::model::{HostWeights, Llama, LlamaConfig, LoadOptions, Placement};

/// The embedded model's weights (glassllm 0.1.0 `en.npz`, MIT).
pub const EMBEDDED_WEIGHTS: &[u8] = include_bytes!("fixtures/en.npz");
/// The embedded model's tokenizer.
pub const EMBEDDED_TOKENIZER: &str = include_str!("fixtures/en.tokenizer.json");
/// The prompt used when none is given.
pub const DEFAULT_PROMPT: &str = "Once upon a time";

#[derive(Parser, Debug)]
#[command(
    about = "Generate text with a Llama-family model through polyattn, on the best local backend"
)]
struct Args {
    /// `tiny` (embedded), `smollm2` (fetched by scripts/fetch-smollm2.sh) or a .gguf path.
    #[arg(long, default_value = "tiny")]
    model: String,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Wrap each prompt in the model's chat template (SmolLM2-Instruct).
    #[arg(long)]
    chat: bool,
    /// Cap the context (default: the model's, at most 4096).
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Skip the warm-up request (the first step of a process compiles kernels: CUDA via
    /// NVRTC, wgpu pipelines; a 2-token request runs first so that tokens/s measure the
    /// steady state).
    #[arg(long)]
    no_warmup: bool,
    /// Append a JSON line with the tokens/s and the machine to this file (for
    /// benches/RESULTS.md: `polyattn bench --from … --generation FILE --results-md …`).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Run the prompts on several backends, one after the other, and print a table (tokens/s,
    /// and whether each backend's tokens equal the first one's): `all`, or names separated
    /// by commas (`CUDA,WGPU,CPU`).
    #[arg(long)]
    backends: Option<String>,
    /// Run every step eagerly: no decode step is captured as a graph (by default, on CUDA and
    /// the native Vulkan runtime, pure decode steps of up to 16 requests replay graphs).
    #[arg(long)]
    eager: bool,
    /// After the run, measure the device's streaming bandwidth and report the decode rate as
    /// a fraction of the weight-streaming limit (weights read once per step).
    #[arg(long)]
    roofline: bool,
    /// Split every layer's heads and MLP over N rank shards (tensor parallelism,
    /// `polyattn::parallel::heads`); `--rank-devices` says where they run.
    #[arg(long, default_value_t = 1)]
    tensor_parallel: usize,
    /// Where the tensor-parallel ranks run: `each` puts rank r on the r-th CUDA GPU from the
    /// chosen one, the partial outputs summed through NCCL (through the host without NCCL;
    /// where the backend is not CUDA or has fewer GPUs, the ranks share its device, each with
    /// its own residual stream, and sum through the host); `one` runs every shard on the one
    /// device with the partial outputs added in place; `auto` is `each` when the backend is
    /// CUDA with N GPUs and NCCL loads, else `one`.
    #[arg(long, value_enum, default_value_t = RankDevices::Auto)]
    rank_devices: RankDevices,
    /// The projections' dtype: `f32`, or `bf16` / `f16` (half the bytes a decode step reads;
    /// widened to f32 as they are read).
    #[arg(long, default_value = "f32", value_parser = parse_weight_dtype)]
    weights: DType,
    /// Write each layer's new keys and values through the attention layer's own cache write
    /// (a launch of its own), not in the Q/K/V projection (the default where the cache is
    /// f32 on the CPU, CUDA, Vulkan or wgpu)
    #[arg(long)]
    separate_cache_write: bool,
    /// Prompts (default: "Once upon a time").
    prompts: Vec<String>,
}

/// `--rank-devices`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RankDevices {
    /// `each` when the backend is CUDA with enough GPUs and NCCL loads, else `one`.
    Auto,
    /// Every shard on the one device.
    One,
    /// A device per rank where there are enough, else ranks of their own on one device.
    Each,
}

/// Where `--tensor-parallel N` runs its ranks (`--rank-devices`), for the backend the
/// selector picks for the model's attention: rank `r` on the GPU `r` places after the chosen
/// one where the backend is CUDA and that many GPUs exist (`auto`: and NCCL loads, since
/// without it the ranks' sums go through the host).
fn placement(args: &Args, config: &LlamaConfig) -> Result<Placement, String> {
    let n = args.tensor_parallel;
    if n <= 1 || args.rank_devices == RankDevices::One {
        return Ok(Placement::OneDevice);
    }
    // The shard count must fit the heads before anything is made per rank.
    polyattn::parallel::HeadSharding::new(config.num_heads, config.num_kv_heads, n)
        .map_err(|e| e.to_string())?;
    let params =
        polyattn::AttentionParams::new(config.num_heads, config.head_size, config.num_kv_heads);
    let selector =
        polyattn::backend::SelectorConfig::for_layer(&params, DType::F32, Some(model::BLOCK_SIZE));
    let first = polyattn::selector::get_attn_backend(&selector).map_err(|e| e.to_string())?;
    let first_gpu = match first.device() {
        Ok(polyattn::Device::Cuda(d)) => Some(d.ordinal()),
        _ => None,
    }
    .filter(|o| o + n <= polyattn::device::cuda::CudaDevice::count());
    let each = args.rank_devices == RankDevices::Each;
    let across = first_gpu.filter(|_| each || polyattn::device::cuda::nccl_status().is_ok());
    Ok(match across {
        Some(o) => Placement::PerRank(
            (o..o + n)
                .map(|k| {
                    std::sync::Arc::new(polyattn::backends::cuda::CudaBackend::with_ordinal(k))
                        as polyattn::BackendRef
                })
                .collect(),
        ),
        None if each => Placement::PerRank(vec![first; n]),
        None => Placement::OneDevice,
    })
}

/// The model's name with how its projections are stored and its ranks placed, if not the
/// defaults.
fn model_label(name: &str, weights: DType, sharding: Option<&str>) -> String {
    match (weights, sharding) {
        (DType::F32, None) => name.to_string(),
        (w, None) => format!("{name} [{w} projections]"),
        (w, Some(s)) => format!("{name} [{w} projections, {s}]"),
    }
}

/// A tokenizer of either example model.
pub enum Tokenizer {
    /// The embedded model's character BPE.
    Glass(GlassTokenizer),
    /// A GGUF's byte-level BPE (run by Hugging Face `tokenizers`).
    Bpe(Box<bpe::ByteLevelBpe>),
}

impl Tokenizer {
    /// Token ids of `text`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Tokenizer::Glass(t) => Ok(t.encode(text)),
            Tokenizer::Bpe(t) => t.encode(text).map_err(|e| e.to_string()),
        }
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        match self {
            Tokenizer::Glass(t) => Ok(t.decode(ids)),
            Tokenizer::Bpe(t) => t.decode(ids).map_err(|e| e.to_string()),
        }
    }

    /// Tokens that end generation.
    pub fn stop_ids(&self) -> Vec<u32> {
        match self {
            Tokenizer::Glass(_) => vec![glass::EOS],
            // The GGUF's end-of-sequence token, and <|endoftext|> which ends plain text.
            Tokenizer::Bpe(t) => {
                let mut ids: Vec<u32> = t.eos_id().into_iter().collect();
                ids.extend(t.token_to_id("<|endoftext|>"));
                ids.dedup();
                ids
            }
        }
    }
}

/// A loaded example model: configuration, host weights, tokenizer, a display name.
pub struct Loaded {
    /// Hyperparameters.
    pub config: LlamaConfig,
    /// Weights in host memory.
    pub weights: HostWeights,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Display name.
    pub name: String,
}

/// The embedded tiny model.
pub fn load_tiny() -> Result<Loaded, String> {
    let npz = npz::Npz::parse(EMBEDDED_WEIGHTS).map_err(|e| e.to_string())?;
    let (config, weights) = glass::load_weights(&npz)?;
    let tokenizer = Tokenizer::Glass(GlassTokenizer::from_json(EMBEDDED_TOKENIZER)?);
    Ok(Loaded {
        config,
        weights,
        tokenizer,
        name: "tiny (glassllm en, embedded)".into(),
    })
}

fn load(model: &str) -> Result<Loaded, String> {
    match model {
        "tiny" => load_tiny(),
        "smollm2" => {
            let path = smollm::default_path();
            if !path.exists() {
                return Err(format!(
                    "{} not found: run scripts/fetch-smollm2.sh (or set POLYATTN_SMOLLM2_GGUF)",
                    path.display()
                ));
            }
            let mut loaded = smollm::load_verified(&path)?;
            loaded.name = "SmolLM2-135M-Instruct (Q4_1 GGUF, run in f32)".into();
            Ok(loaded)
        }
        path if path.ends_with(".gguf") => smollm::load_gguf(std::path::Path::new(path)),
        other => Err(format!(
            "unknown model '{other}': use tiny, smollm2 or a path to a .gguf file"
        )),
    }
}

/// `--weights`: f32, f16 or bf16.
fn parse_weight_dtype(s: &str) -> Result<DType, String> {
    match s {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::Bf16),
        other => Err(format!("weights '{other}': use f32, f16 or bf16")),
    }
}

/// The runner's sizes for `prompts` prompts of up to `max_len` tokens each.
fn runner_config(args: &Args, max_len: usize, prompts: usize) -> RunnerConfig {
    let mut config = RunnerConfig {
        max_model_len: Some(max_len),
        kv_cache_tokens: (max_len * prompts.min(16)).max(256),
        ..Default::default()
    };
    if args.eager {
        config.graph_capture_sizes.clear();
    }
    config
}

fn run(args: Args) -> Result<(), String> {
    let loaded = load(&args.model)?;
    let prompts = if args.prompts.is_empty() {
        vec![DEFAULT_PROMPT.to_string()]
    } else {
        args.prompts.clone()
    };
    let mut config = loaded.config.clone();
    config.max_model_len = config.max_model_len.min(4096);
    if let Some(spec) = &args.backends {
        if args.tensor_parallel != 1 || args.weights != DType::F32 {
            return Err(
                "--backends runs the unsharded f32 model; drop --tensor-parallel / --weights"
                    .into(),
            );
        }
        return run_comparison(&args, spec, loaded, config, &prompts);
    }
    let options = LoadOptions {
        tensor_parallel: args.tensor_parallel,
        placement: placement(&args, &config)?,
        weight_dtype: args.weights,
        separate_cache_write: args.separate_cache_write,
    };
    let model = Llama::load_with(config.clone(), loaded.weights, None, options)
        .map_err(|e| e.to_string())?;
    let sharding = match (args.tensor_parallel, model.rank_transport()) {
        (1, _) => None,
        (n, None) => Some(format!("{n} tensor-parallel shards on this one device")),
        (n, Some(t)) => Some(format!(
            "{n} tensor-parallel ranks, each with its own residual stream, summed through {t}"
        )),
    };
    if args.roofline && matches!(model.rank_transport(), Some(Transport::Nccl)) {
        return Err(
            "--roofline measures one device's bandwidth; with ranks on several GPUs use \
             --rank-devices one"
                .into(),
        );
    }
    let backend = polyattn::runner::CausalLm::backend(&model);
    let device = model.device().description();
    let max_len = args.max_model_len.unwrap_or(config.max_model_len);
    let runner_config = runner_config(&args, max_len, prompts.len());
    let mut runner = ModelRunner::new(model, runner_config).map_err(|e| e.to_string())?;
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        max_tokens: args.max_tokens,
        stop_token_ids: loaded.tokenizer.stop_ids(),
        seed: args.seed,
    };
    if !args.no_warmup {
        // Prefills of 2 and 24 tokens (either side of the GPUs' GEMV width: both forms of
        // the linear layers), then decode steps: every kernel the run needs is compiled (and
        // cached) before the clock starts.
        let warm = loaded.tokenizer.encode("Hello world")?;
        let first = warm.first().copied().unwrap_or(0);
        runner
            .generate(&[vec![first; 24]], &SamplingParams::greedy(2))
            .map_err(|e| format!("warm-up: {e}"))?;
        let warm = vec![first; 2];
        runner
            .generate(&[warm], &SamplingParams::greedy(3))
            .map_err(|e| format!("warm-up: {e}"))?;
        runner.reset_stats();
    }
    let texts: Vec<String> = prompts
        .iter()
        .map(|p| {
            if args.chat {
                chat_wrap(&loaded.tokenizer, p)
            } else {
                p.clone()
            }
        })
        .collect();
    let mut ids = Vec::new();
    let mut prompt_tokens = 0;
    for (i, text) in texts.iter().enumerate() {
        let tokens = loaded.tokenizer.encode(text)?;
        prompt_tokens += tokens.len();
        let id = runner
            .add_request(tokens, params.clone())
            .map_err(|e| format!("prompt {}: {e}", i + 1))?;
        ids.push(id);
    }

    // Stream: request `current` prints as it goes; later ones buffer until it is done.
    let mut generated: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut printed: Vec<usize> = vec![0; prompts.len()]; // bytes of decoded text printed
    let mut done = vec![false; prompts.len()];
    let mut current = 0;
    let out = std::io::stdout();
    let mut out = out.lock();
    let show = |out: &mut std::io::StdoutLock, s: &str| {
        let _ = out.write_all(s.as_bytes());
        let _ = out.flush();
    };
    show(&mut out, &prompts[0]);
    let mut total_generated = 0;
    while runner.has_unfinished() {
        for t in runner.step().map_err(|e| e.to_string())? {
            let i = ids
                .iter()
                .position(|&id| id == t.request)
                .expect("our request");
            if !loaded.tokenizer.stop_ids().contains(&t.token) {
                generated[i].push(t.token);
            }
            total_generated += 1;
            done[i] = t.finished.is_some();
        }
        while current < prompts.len() {
            // Decode everything so far and print what is new (byte-level BPE may hold back
            // a partial character until its last byte arrives).
            let text = loaded.tokenizer.decode(&generated[current])?;
            let stable = if done[current] {
                text.len()
            } else {
                text.trim_end_matches('\u{FFFD}').len()
            };
            if stable > printed[current] {
                show(&mut out, &text[printed[current]..stable]);
                printed[current] = stable;
            }
            if !done[current] {
                break;
            }
            show(&mut out, "\n");
            current += 1;
            if current < prompts.len() {
                show(&mut out, &format!("\n{}", prompts[current]));
            }
        }
    }
    let stats = runner.stats();
    let per_step = |d: std::time::Duration| {
        (stats.decode_steps > 0).then(|| d.as_secs_f64() * 1e6 / stats.decode_steps as f64)
    };
    let weight_bytes = runner.model().weight_bytes();
    let stream_gbps = if args.roofline {
        let cfg = polyattn::probe::ProbeConfig {
            trials: 3,
            fma_seconds: 0.05,
            ..Default::default()
        };
        let peaks = polyattn_tools::bench::peaks::measure(runner.device(), DType::F32, &cfg)
            .map_err(|e| format!("measuring the device's bandwidth: {e}"))?;
        Some(peaks.read_gbps.unwrap_or(peaks.mem_gbps))
    } else {
        None
    };
    if let Some(path) = &args.json {
        let mut machine = polyattn_tools::bench::machine::Machine::collect(
            backend.device_kind() != polyattn::DeviceKind::Cpu,
        );
        machine.finish();
        let record = polyattn_tools::bench::generation::GenerationRecord {
            model: model_label(&loaded.name, args.weights, sharding.as_deref()),
            backend: backend.name().to_string(),
            device: device.clone(),
            prompts: prompts.len(),
            prompt_tokens,
            generated_tokens: total_generated,
            max_tokens: args.max_tokens,
            steps: stats.steps,
            prefill_tokens_per_s: stats.prefill_tokens_per_s(),
            decode_tokens_per_s: stats.decode_tokens_per_s(),
            graphs: runner.uses_graphs(),
            weight_bytes: Some(weight_bytes as u64),
            stream_gbps,
            decode_step_us: per_step(stats.decode_time),
            decode_wait_us: per_step(stats.decode_wait),
            machine,
        };
        record.append_to(path).map_err(|e| e.to_string())?;
    }
    eprintln!(
        "\n[polyattn] backend {} on {device}; model {}",
        backend.name(),
        model_label(&loaded.name, args.weights, sharding.as_deref()),
    );
    eprintln!(
        "[polyattn] {} prompt(s): {prompt_tokens} prompt tokens, {total_generated} generated in {} steps; \
         prefill {:.1} tok/s, decode {:.1} tok/s ({}){}",
        prompts.len(),
        stats.steps,
        stats.prefill_tokens_per_s(),
        stats.decode_tokens_per_s(),
        if runner.uses_graphs() {
            format!(
                "{} of {} steps replayed graphs, {} graphs captured",
                stats.graph_steps,
                stats.steps,
                runner.graphs_captured()
            )
        } else {
            "eager steps".to_string()
        },
        if stats.preemptions > 0 {
            format!(", {} preemptions", stats.preemptions)
        } else {
            String::new()
        }
    );
    if let (Some(step), Some(wait)) = (per_step(stats.decode_time), per_step(stats.decode_wait)) {
        eprintln!(
            "[polyattn] a decode step: {step:.1} µs, of which {wait:.1} µs waiting for the \
             device and {:.1} µs of host work (scheduling, metadata, uploads, launches)",
            step - wait
        );
    }
    if let Some(gbps) = stream_gbps {
        let limit = prompts.len() as f64 * gbps * 1e9 / weight_bytes.max(1) as f64;
        eprintln!(
            "[polyattn] weight-streaming limit: {:.1} MB of weights per step at {gbps:.1} GB/s \
             = {limit:.1} tok/s for {} prompt(s); decode at {:.2}× of it",
            weight_bytes as f64 / 1e6,
            prompts.len(),
            stats.decode_tokens_per_s() / limit.max(1e-9)
        );
    }
    Ok(())
}

/// `--backends`: the prompts on each backend, then the table and the first backend's text.
fn run_comparison(
    args: &Args,
    spec: &str,
    mut loaded: Loaded,
    config: LlamaConfig,
    prompts: &[String],
) -> Result<(), String> {
    let backends = compare::backends(spec)?;
    if backends.is_empty() {
        return Err(format!("--backends {spec} names no backend"));
    }
    let max_len = args.max_model_len.unwrap_or(config.max_model_len);
    loaded.config = config;
    let runner = runner_config(args, max_len, prompts.len());
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        max_tokens: args.max_tokens,
        stop_token_ids: Vec::new(), // every backend generates the same count: comparable
        seed: args.seed,
    };
    let ids = prompts
        .iter()
        .map(|p| {
            let text = if args.chat {
                chat_wrap(&loaded.tokenizer, p)
            } else {
                p.clone()
            };
            loaded.tokenizer.encode(&text)
        })
        .collect::<Result<Vec<_>, _>>()?;
    eprintln!(
        "[polyattn] model {}; {} prompt(s), {} tokens each, on {} backend(s)",
        loaded.name,
        prompts.len(),
        args.max_tokens,
        backends.len()
    );
    let rows = compare::compare(&loaded, &backends, &ids, &params, &runner, !args.no_warmup);
    if let Some((name, run)) = rows
        .iter()
        .find_map(|r| r.outcome.as_ref().ok().map(|run| (&r.backend, run)))
    {
        for (p, tokens) in prompts.iter().zip(&run.tokens) {
            println!("[{name}] {p}{}", loaded.tokenizer.decode(tokens)?);
        }
    }
    println!("\n{}", compare::table(&rows));
    if rows.iter().all(|r| r.outcome.is_err()) {
        return Err("no backend ran".into());
    }
    Ok(())
}

fn chat_wrap(tok: &Tokenizer, prompt: &str) -> String {
    match tok {
        Tokenizer::Bpe(_) => bpe::chat_prompt(prompt),
        Tokenizer::Glass(_) => prompt.to_string(),
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod graph_tests;
#[cfg(test)]
mod tests;
