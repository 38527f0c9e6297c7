//! [`ModelRunner`]: owns the KV caches and the scheduler, and runs a [`CausalLm`] step by step.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::decode_graphs::{DecodeGraphs, DecodeRow};
use super::request::{FinishReason, RequestId, SamplingParams, TokenOutput};
use super::sampler::sampling_row;
use super::scheduler::{Scheduler, Sequence};
use crate::backend::{BackendRef, GraphCaptureSupport};
use crate::compute::{self, SamplingRow};
use crate::device::{Device, Tensor};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::kv_cache::{BlockPool, KvCache, KvCacheSpec};
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, BatchDescription, CommonAttentionMetadata,
};

/// What the runner needs to know about a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// KV heads of each KV cache the model reads, in the order `forward` receives the caches:
    /// one cache per decoder layer, or one per layer and rank when the model splits its heads
    /// over ranks (`crate::parallel::heads`; on one device or on each rank's,
    /// [`CausalLm::cache_backend`]), whose head counts may differ.
    pub kv_cache_heads: Vec<usize>,
    /// Head size.
    pub head_size: usize,
    /// Vocabulary size (rows of the logits).
    pub vocab_size: usize,
    /// Longest sequence (prompt + generated) the model accepts.
    pub max_model_len: usize,
    /// Activation dtype of the attention layers (the KV cache stores it).
    pub dtype: DType,
}

/// One step's inputs, on the device of the model's [`CausalLm::backend`].
pub struct StepBatch<'a> {
    /// `[num_tokens]` i32 token ids, request after request.
    pub input_ids: &'a Tensor,
    /// `[num_tokens]` i32 positions.
    pub positions: &'a Tensor,
    /// `[num_logits]` i32: rows whose logits the runner samples (each request's last new
    /// token, for requests that reached the end of their known tokens).
    pub logits_indices: &'a Tensor,
    /// The metadata of the model's backend, built once for the step: every layer on that
    /// backend uses it (ranks on other devices build theirs from `common`).
    pub attn_metadata: &'a dyn AttentionMetadata,
    /// The validated batch (host and device copies of the arrays). A model may read its
    /// device arrays inside a captured step (the Q/K/V projection that writes the KV cache
    /// reads the slot mapping), so for graph steps the runner keeps them in place, rewritten
    /// every step ([`CommonAttentionMetadata::new_in`]); code that replays a model's graph
    /// itself does the same.
    pub common: &'a CommonAttentionMetadata,
}

/// A decoder-only language model the runner can drive.
pub trait CausalLm {
    /// Shapes the runner allocates for.
    fn config(&self) -> ModelConfig;

    /// The attention backend of the model's first rank: its device holds the step's inputs,
    /// the metadata the runner builds and the logits (every layer's, unless the model places
    /// ranks on several devices: [`CausalLm::cache_backend`]).
    fn backend(&self) -> BackendRef;

    /// The backend whose device holds KV cache `cache` (an index into
    /// [`ModelConfig::kv_cache_heads`]). The default is [`CausalLm::backend`]; a model whose
    /// tensor-parallel ranks run on several devices (`crate::parallel::RankGroup`) names each
    /// rank's, and builds its ranks' metadata from [`StepBatch::common`] itself.
    fn cache_backend(&self, cache: usize) -> BackendRef {
        let _ = cache;
        self.backend()
    }

    /// Runs all layers for the batch and returns f32 logits `[num_logits, vocab_size]` for the
    /// rows in `batch.logits_indices`. `kv_caches[i]` is the cache of entry `i` of
    /// [`ModelConfig::kv_cache_heads`].
    fn forward(&self, batch: &StepBatch<'_>, kv_caches: &mut [KvCache]) -> Result<Tensor>;

    /// Whether [`CausalLm::forward_into`] may be captured as a graph: once it has run for a
    /// token count, later calls for that count only queue device work on buffers that
    /// already exist (no allocation, upload, download or synchronisation), and it reads the
    /// batch only through `input_ids`, `positions`, `logits_indices` and `attn_metadata`
    /// (not `common`'s per-step arrays). The runner then captures pure decode steps where
    /// the backend's graph level allows ([`RunnerConfig::graph_capture_sizes`]).
    fn capturable(&self) -> bool {
        false
    }

    /// [`CausalLm::forward`] with the logits written into `logits [num_logits, vocab_size]`.
    /// The default runs `forward` and copies; a [`CausalLm::capturable`] model keeps its
    /// activations in buffers of its own per token count, made on the first call.
    fn forward_into(
        &self,
        batch: &StepBatch<'_>,
        kv_caches: &mut [KvCache],
        logits: &mut Tensor,
    ) -> Result<()> {
        let out = self.forward(batch, kv_caches)?;
        logits.copy_from(&out)
    }
}

/// Sizes of the runner's cache and batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Tokens per cache block.
    pub block_size: usize,
    /// Tokens the KV cache holds over all requests (rounded up to whole blocks; the null block
    /// is extra).
    pub kv_cache_tokens: usize,
    /// Requests running at once.
    pub max_num_seqs: usize,
    /// Tokens per step (decodes plus prompt chunks).
    pub max_num_batched_tokens: usize,
    /// Longest sequence allowed; `None`: the model's own.
    pub max_model_len: Option<usize>,
    /// Batch sizes whose pure decode steps (one new token per request) run as captured
    /// graphs (vLLM's `cudagraph_capture_sizes`): a decode step of `n` requests runs padded
    /// to the smallest size ≥ `n`, captured on its first use and replayed after. Used where
    /// the model is [`CausalLm::capturable`] and the backend's graph-capture level is
    /// `UniformSingleTokenDecode` or above (CUDA; the native Vulkan runtime); other steps,
    /// and every step elsewhere, run eagerly. Empty: every step eager.
    pub graph_capture_sizes: Vec<usize>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            block_size: 16,
            kv_cache_tokens: 16384,
            max_num_seqs: 16,
            max_num_batched_tokens: 512,
            max_model_len: None,
            graph_capture_sizes: vec![1, 2, 4, 8, 16],
        }
    }
}

/// Counters and timings since the runner started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunnerStats {
    /// Steps run.
    pub steps: usize,
    /// Prompt tokens computed (recomputed ones after a preemption included).
    pub prefill_tokens: usize,
    /// Decode tokens computed.
    pub decode_tokens: usize,
    /// Wall time of steps that computed prompt tokens.
    pub prefill_time: Duration,
    /// Wall time of steps that computed only decode tokens.
    pub decode_time: Duration,
    /// Steps that computed only decode tokens.
    pub decode_steps: usize,
    /// Requests preempted for lack of cache blocks.
    pub preemptions: usize,
    /// Decode steps that replayed (or first ran and captured) a graph.
    pub graph_steps: usize,
    /// Of `decode_time`, the time spent waiting for the device to finish the step's work
    /// (the synchronisation before the step's outputs are read). The rest is host work:
    /// scheduling, metadata, uploads and launches. A step whose wait is small is bound by
    /// the host; one whose wait is most of it, by the device.
    pub decode_wait: Duration,
}

impl RunnerStats {
    /// Prompt tokens per second over the steps that had some.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prefill_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    /// Decode tokens per second over pure-decode steps (tokens of all requests together).
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Runs a [`CausalLm`] over many requests with continuous batching and a paged KV cache.
pub struct ModelRunner<M: CausalLm> {
    model: M,
    config: ModelConfig,
    runner: RunnerConfig,
    max_model_len: usize,
    device: Device,
    caches: Vec<KvCache>,
    builder: Box<dyn AttentionMetadataBuilder>,
    /// `Some` where decode steps run as graphs (see [`RunnerConfig::graph_capture_sizes`]).
    graphs: Option<DecodeGraphs>,
    /// Logits of eager pure-decode steps by request count, for a capturable model's
    /// [`CausalLm::forward_into`] (which keeps its activations per token count too): a steady
    /// eager decode reuses the model's buffers instead of allocating them every step.
    decode_logits: std::collections::HashMap<usize, Tensor>,
    scheduler: Scheduler,
    next_id: RequestId,
    stats: RunnerStats,
}

impl<M: CausalLm> ModelRunner<M> {
    /// Allocates the model's KV caches (one per entry of `kv_cache_heads`, each on its
    /// [`CausalLm::cache_backend`]) and an empty scheduler.
    pub fn new(model: M, runner: RunnerConfig) -> Result<Self> {
        let config = model.config();
        let backend = model.backend();
        let device = backend.device()?;
        if runner.block_size == 0 || runner.max_num_seqs == 0 || runner.max_num_batched_tokens == 0
        {
            return Err(Error::config(format!(
                "runner sizes must be > 0: block_size {}, max_num_seqs {}, max_num_batched_tokens {}",
                runner.block_size, runner.max_num_seqs, runner.max_num_batched_tokens
            )));
        }
        let max_model_len = match runner.max_model_len {
            Some(n) if n == 0 || n > config.max_model_len => {
                return Err(Error::config(format!(
                    "max_model_len {n} must be in 1..={} (the model's context)",
                    config.max_model_len
                )))
            }
            Some(n) => n,
            None => config.max_model_len,
        };
        let Some(&first_heads) = config.kv_cache_heads.first() else {
            return Err(Error::config(
                "the model reads no KV cache (kv_cache_heads is empty)",
            ));
        };
        let spec = KvCacheSpec {
            block_size: runner.block_size,
            num_kv_heads: first_heads,
            head_size: config.head_size,
            dtype: config.dtype,
            cache_dtype: CacheDType::Auto,
        };
        let num_blocks = runner.kv_cache_tokens.div_ceil(runner.block_size) + 1;
        if (num_blocks - 1) * runner.block_size < max_model_len.min(runner.kv_cache_tokens.max(1)) {
            return Err(Error::config(
                "the KV cache holds no complete block".to_string(),
            ));
        }
        let caches = config
            .kv_cache_heads
            .iter()
            .enumerate()
            .map(|(i, &num_kv_heads)| {
                let spec = KvCacheSpec {
                    num_kv_heads,
                    ..spec
                };
                KvCache::new(model.cache_backend(i).as_ref(), spec, num_blocks)
            })
            .collect::<Result<Vec<_>>>()?;
        let builder = backend.make_builder(&spec)?;
        let graphs = (!runner.graph_capture_sizes.is_empty()
            && model.capturable()
            && device.has_graphs()
            && builder.graph_capture_support() >= GraphCaptureSupport::UniformSingleTokenDecode)
            .then(|| {
                DecodeGraphs::new(
                    runner.graph_capture_sizes.clone(),
                    max_model_len,
                    runner.block_size,
                    config.vocab_size,
                )
            });
        let scheduler = Scheduler {
            waiting: VecDeque::new(),
            running: Vec::new(),
            pool: BlockPool::new(num_blocks)?,
            block_size: runner.block_size,
            max_num_seqs: runner.max_num_seqs,
            max_num_batched_tokens: runner.max_num_batched_tokens,
            preemptions: 0,
        };
        Ok(ModelRunner {
            model,
            config,
            runner,
            max_model_len,
            device,
            caches,
            builder,
            graphs,
            decode_logits: std::collections::HashMap::new(),
            scheduler,
            next_id: 0,
            stats: RunnerStats::default(),
        })
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The device of the model's first rank: the step's inputs, the metadata and the logits.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The longest sequence a request may reach.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Whether pure decode steps run as captured graphs on this runner's model and backend.
    pub fn uses_graphs(&self) -> bool {
        self.graphs.is_some()
    }

    /// Decode graphs captured so far (one per padded batch size and block-table width).
    pub fn graphs_captured(&self) -> usize {
        self.graphs.as_ref().map_or(0, DecodeGraphs::captured)
    }

    /// Counters and timings so far.
    pub fn stats(&self) -> RunnerStats {
        RunnerStats {
            preemptions: self.scheduler.preemptions,
            ..self.stats.clone()
        }
    }

    /// Zeroes the counters and timings (e.g. after a warm-up request).
    pub fn reset_stats(&mut self) {
        self.stats = RunnerStats::default();
        self.scheduler.preemptions = 0;
    }

    /// Queues a request. Errors: an empty prompt, a token id outside the vocabulary, a prompt
    /// that does not leave room for one generated token in the context, a prompt the whole KV
    /// cache cannot hold, bad sampling parameters.
    pub fn add_request(&mut self, prompt: Vec<u32>, params: SamplingParams) -> Result<RequestId> {
        params.validate()?;
        if prompt.is_empty() {
            return Err(Error::config(
                "the prompt is empty: give at least one token",
            ));
        }
        if let Some((i, &t)) = prompt
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= self.config.vocab_size)
        {
            return Err(Error::config(format!(
                "prompt token {t} at position {i} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        if prompt.len() >= self.max_model_len {
            return Err(Error::config(format!(
                "the prompt has {} tokens; the context holds {} (prompt plus at least one \
                 generated token must fit)",
                prompt.len(),
                self.max_model_len
            )));
        }
        let cache_tokens = (self.scheduler.pool.num_blocks() - 1) * self.runner.block_size;
        if prompt.len() + 1 > cache_tokens {
            return Err(Error::config(format!(
                "the prompt has {} tokens; the KV cache holds {cache_tokens}",
                prompt.len()
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.scheduler
            .waiting
            .push_back(Sequence::new(id, prompt, params));
        Ok(id)
    }

    /// Whether any request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.scheduler.waiting.is_empty() || !self.scheduler.running.is_empty()
    }

    /// Runs one step and returns the tokens it produced (at most one per request).
    ///
    /// On the CPU the step runs on a thread of rayon's pool: every operation splits its work
    /// over that pool, and one started from a pool thread takes its own share at once, where
    /// one started from elsewhere hands itself over and waits (a thread wake-up per
    /// operation, hundreds per step).
    pub fn step(&mut self) -> Result<Vec<TokenOutput>>
    where
        M: Send,
    {
        if matches!(self.device, Device::Cpu(_)) && rayon::current_thread_index().is_none() {
            return rayon::scope(|_| self.step_here());
        }
        self.step_here()
    }

    fn step_here(&mut self) -> Result<Vec<TokenOutput>> {
        let started = Instant::now();
        let plan = self.scheduler.schedule()?;
        if plan.is_empty() {
            if self.has_unfinished() {
                return Err(Error::config(
                    "no request could be scheduled: the KV cache is too small for the waiting \
                     prompts",
                ));
            }
            return Ok(Vec::new());
        }
        let bs = self.runner.block_size;
        let (mut prefill_tokens, mut decode_tokens) = (0, 0);
        let mut sampled: Vec<usize> = Vec::new(); // plan entries that sample
        for (k, s) in plan.iter().enumerate() {
            let seq = &self.scheduler.running[s.index];
            let start = seq.num_computed;
            if start + s.num_tokens == seq.tokens.len() {
                sampled.push(k);
            }
            // A request whose prompt is fully computed adds one decode token per step.
            if s.num_tokens == 1 && start >= 1 && seq.generated > 0 && start + 1 == seq.tokens.len()
            {
                decode_tokens += 1;
            } else {
                prefill_tokens += s.num_tokens;
            }
        }
        // Each sampled request's row (its draw taken from its own stream now, in plan order);
        // None when every one is greedy, so the step runs the plain argmax.
        let rows: Vec<SamplingRow> = sampled
            .iter()
            .map(|&k| {
                let seq = &mut self.scheduler.running[plan[k].index];
                sampling_row(&seq.params, &mut seq.rng)
            })
            .collect();
        let sampling = Some(rows.as_slice()).filter(|r| r.iter().any(|r| r.temperature > 0.0));
        // A graph step: one new token per request, every request sampled.
        let graph_size = self
            .graphs
            .as_ref()
            .filter(|_| sampled.len() == plan.len() && plan.iter().all(|s| s.num_tokens == 1))
            .and_then(|g| g.size_for(plan.len()));
        let mut wait = Duration::ZERO;
        let output = match (graph_size, self.graphs.as_mut()) {
            (Some(size), Some(graphs)) => {
                let decode_rows: Vec<DecodeRow<'_>> = plan
                    .iter()
                    .map(|s| {
                        let seq = &self.scheduler.running[s.index];
                        let pos = seq.num_computed;
                        DecodeRow {
                            token: seq.tokens[pos] as i32,
                            position: pos as i32,
                            slot: seq.blocks[pos / bs] as i64 * bs as i64 + (pos % bs) as i64,
                            blocks: &seq.blocks,
                        }
                    })
                    .collect();
                self.stats.graph_steps += 1;
                Some(graphs.run(
                    size,
                    &decode_rows,
                    sampling,
                    &self.model,
                    &mut self.caches,
                    self.builder.as_ref(),
                    &self.device,
                    &mut wait,
                )?)
            }
            _ => self.eager_step(&plan, sampled.len(), sampling, &mut wait)?,
        };
        if output.is_none() {
            // Nothing was read back: the step's work may still be running.
            let synced = Instant::now();
            self.device.synchronize()?;
            wait += synced.elapsed();
        }

        // Advance every scheduled request; sample for those at the end of their tokens.
        for s in &plan {
            self.scheduler.running[s.index].num_computed += s.num_tokens;
        }
        let mut outputs = Vec::with_capacity(sampled.len());
        let mut finished = Vec::new();
        for (row, &k) in sampled.iter().enumerate() {
            let index = plan[k].index;
            let seq = &mut self.scheduler.running[index];
            let token = match output.as_ref().and_then(|t| t.get(row)) {
                Some(&t) => t as u32,
                None => {
                    return Err(Error::config(
                        "the step sampled a request but produced no token for it",
                    ))
                }
            };
            seq.tokens.push(token);
            seq.generated += 1;
            let reason = if seq.params.stop_token_ids.contains(&token) {
                Some(FinishReason::Stop)
            } else if seq.generated >= seq.params.max_tokens
                || seq.tokens.len() >= self.max_model_len
            {
                Some(FinishReason::Length)
            } else {
                None
            };
            if reason.is_some() {
                finished.push(index);
            }
            outputs.push(TokenOutput {
                request: seq.id,
                token,
                finished: reason,
            });
        }
        self.scheduler.finish(finished)?;

        let elapsed = started.elapsed();
        self.stats.steps += 1;
        self.stats.prefill_tokens += prefill_tokens;
        self.stats.decode_tokens += decode_tokens;
        if prefill_tokens > 0 {
            self.stats.prefill_time += elapsed;
        } else {
            self.stats.decode_time += elapsed;
            self.stats.decode_steps += 1;
            self.stats.decode_wait += wait;
        }
        Ok(outputs)
    }

    /// Runs the step's batch through [`CausalLm::forward`] and chooses the tokens of the
    /// `sampled` rows on the device: the argmax, or [`compute::sample`] with `sampling`'s
    /// rows. `wait` gains the time spent waiting for the device before the download.
    fn eager_step(
        &mut self,
        plan: &[super::scheduler::Scheduled],
        sampled: usize,
        sampling: Option<&[SamplingRow]>,
        wait: &mut Duration,
    ) -> Result<Option<Vec<i32>>> {
        let bs = self.runner.block_size;
        let width = plan
            .iter()
            .map(|s| self.scheduler.running[s.index].blocks.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let mut desc = BatchDescription {
            query_start_loc: vec![0],
            causal: true,
            block_size: bs,
            max_blocks_per_req: width,
            ..Default::default()
        };
        let mut ids: Vec<i32> = Vec::new();
        let mut positions: Vec<i32> = Vec::new();
        let mut logits_rows: Vec<i32> = Vec::new();
        for s in plan {
            let seq = &self.scheduler.running[s.index];
            let start = seq.num_computed;
            let end = start + s.num_tokens;
            for pos in start..end {
                ids.push(seq.tokens[pos] as i32);
                positions.push(pos as i32);
                let block = seq.blocks[pos / bs] as i64;
                desc.slot_mapping
                    .push(block * bs as i64 + (pos % bs) as i64);
            }
            let mut row = seq.blocks.clone();
            row.resize(width, 0);
            desc.block_table.extend(row);
            desc.seq_lens.push(end as i32);
            let q_end = desc.query_start_loc.last().copied().unwrap_or(0) + s.num_tokens as i32;
            desc.query_start_loc.push(q_end);
            if end == seq.tokens.len() {
                logits_rows.push(q_end - 1);
            }
        }
        let n = ids.len();
        let common = CommonAttentionMetadata::new(&self.device, desc)?;
        let attn_metadata = self.builder.build(0, &common, false)?;
        let input_ids = Tensor::from_i32(&self.device, &ids, &[n])?;
        let positions = Tensor::from_i32(&self.device, &positions, &[n])?;
        let logits_indices = Tensor::from_i32(&self.device, &logits_rows, &[logits_rows.len()])?;
        let batch = StepBatch {
            input_ids: &input_ids,
            positions: &positions,
            logits_indices: &logits_indices,
            attn_metadata: attn_metadata.as_ref(),
            common: &common,
        };
        // A pure decode step of a capturable model reuses its buffers (their count is bounded
        // by max_num_seqs); prompt chunks of every length allocate theirs.
        let v = self.config.vocab_size;
        let decode_only = sampled == plan.len() && plan.iter().all(|s| s.num_tokens == 1);
        let owned;
        let logits: &Tensor = if decode_only && self.model.capturable() {
            let out = match self.decode_logits.entry(sampled) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(Tensor::zeros(&self.device, &[sampled, v], DType::F32)?)
                }
            };
            self.model.forward_into(&batch, &mut self.caches, out)?;
            out
        } else {
            owned = self.model.forward(&batch, &mut self.caches)?;
            &owned
        };
        // Only prompt chunks that do not finish their prompt: the model still runs (it fills
        // the cache) but nothing is sampled.
        if sampled == 0 {
            return Ok(None);
        }
        if logits.shape() != [sampled, v] {
            return Err(Error::config(format!(
                "the model returned logits of shape {:?}, expected [{sampled}, {v}]",
                logits.shape()
            )));
        }
        let tokens = match sampling {
            None => compute::argmax(logits)?,
            Some(rows) => compute::sample(logits, &SamplingRow::tensor(&self.device, rows)?)?,
        };
        let synced = Instant::now();
        self.device.synchronize()?;
        *wait += synced.elapsed();
        Ok(Some(tokens.to_i32_vec()?))
    }

    /// Runs `prompts` to completion with the same sampling parameters and returns each
    /// request's generated tokens (stop token included), in prompt order.
    pub fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> Result<Vec<Vec<u32>>>
    where
        M: Send,
    {
        let ids = prompts
            .iter()
            .map(|p| self.add_request(p.clone(), params.clone()))
            .collect::<Result<Vec<_>>>()?;
        let mut out = vec![Vec::new(); prompts.len()];
        while self.has_unfinished() {
            for t in self.step()? {
                if let Some(i) = ids.iter().position(|&id| id == t.request) {
                    out[i].push(t.token);
                }
            }
        }
        Ok(out)
    }
}
