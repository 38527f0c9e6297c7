//! A Llama-family decoder written once against polyattn: token embedding; per layer the Q/K/V
//! projections as one linear layer with the attention RMSNorm before it and the split with
//! RoPE after it → paged attention through [`polyattn::Attention`] → the output projection
//! added into the residual stream → gate and up as one linear layer with the MLP's RMSNorm
//! before it and SwiGLU after it → the down projection added into the residual stream; a
//! final RMSNorm and the output head (tied to the embedding or separate), one layer again.
//! Four launches per layer besides attention's own ([`compute::linear_fused`]).
//!
//! With `tensor_parallel` N > 1 ([`Llama::load_with`]) each layer runs as N rank shards on
//! the one device, as N GPUs would run it (`polyattn::parallel::heads`): a shard owns whole
//! GQA groups (its rows of W_q / W_k / W_v, its own attention layer and KV cache, its columns
//! of W_o) and a slice of the MLP (its rows of gate / up, its columns of down); every shard's
//! output projection and down projection add into the residual stream, which is the
//! all-reduce of the multi-GPU form done in place.
//!
//! Every operation runs on the attention backend's device through [`polyattn::compute`], so
//! the model moves with `POLYATTN_BACKEND` and nothing else. Weights and activations are f32 by
//! default: both example models are small, and f32 makes greedy decoding agree across
//! backends; [`LoadOptions::weight_dtype`] stores the projections in f16 or bf16 instead.
//!
//! One body ([`Llama::run`]) writes every activation into a [`Scratch`] through the
//! operations' `_into` forms. `forward` gives it a fresh scratch; `forward_into` keeps one
//! per token count, so after its first call for a count it allocates nothing on the device
//! and the runner can capture it as a graph ([`CausalLm::capturable`]).

use std::collections::HashMap;
use std::sync::Mutex;

use std::ops::Range;

use polyattn::compute::{self, InputNorm, LinearOutput, Rope, RopeStyle};
use polyattn::parallel::HeadSharding;
use polyattn::runner::{CausalLm, ModelConfig, StepBatch};
use polyattn::{
    Attention, AttentionLayer, AttentionParams, BackendRef, DType, Device, KvCache, Tensor,
};

/// Hyperparameters of a Llama-family model.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden (model) width.
    pub hidden: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA when fewer than query heads).
    pub num_kv_heads: usize,
    /// Head size.
    pub head_size: usize,
    /// Longest sequence the model was built for.
    pub max_model_len: usize,
    /// RoPE base θ.
    pub rope_base: f32,
    /// RoPE pairing.
    pub rope_style: RopeStyle,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
}

/// One layer's weights in host memory; matrices `[out, in]`, row-major.
#[derive(Clone, Debug)]
pub struct HostLayer {
    /// RMSNorm before attention `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// `[heads * head_size, hidden]`.
    pub wq: Vec<f32>,
    /// `[kv_heads * head_size, hidden]`.
    pub wk: Vec<f32>,
    /// `[kv_heads * head_size, hidden]`.
    pub wv: Vec<f32>,
    /// `[hidden, heads * head_size]`.
    pub wo: Vec<f32>,
    /// RMSNorm before the MLP `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// `[intermediate, hidden]`.
    pub w_gate: Vec<f32>,
    /// `[intermediate, hidden]`.
    pub w_up: Vec<f32>,
    /// `[hidden, intermediate]`.
    pub w_down: Vec<f32>,
}

/// All weights in host memory, as a loader produces them.
#[derive(Clone, Debug)]
pub struct HostWeights {
    /// `[vocab, hidden]`.
    pub embedding: Vec<f32>,
    /// Per layer.
    pub layers: Vec<HostLayer>,
    /// `[hidden]`.
    pub final_norm: Vec<f32>,
    /// `[vocab, hidden]`, or `None` when tied to the embedding.
    pub lm_head: Option<Vec<f32>>,
}

/// How [`Llama::load_with`] lays the model out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Rank shards per layer on the one device (1: unsharded).
    pub tensor_parallel: usize,
    /// The projections' and the output head's dtype: f32, or f16 / bf16 (half the bytes a
    /// decode step streams; the CPU widens them as it reads). Norms and the embedding stay
    /// f32.
    pub weight_dtype: DType,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            tensor_parallel: 1,
            weight_dtype: DType::F32,
        }
    }
}

/// One layer on the device: its norms and its rank shards (one without tensor parallelism).
struct Layer {
    attn_norm: Tensor,
    ffn_norm: Tensor,
    shards: Vec<LayerShard>,
}

/// One rank's part of a layer. The projections that read the same input are fused into one
/// weight each (fewer, larger launches; every output feature is computed as before).
struct LayerShard {
    attn: Attention,
    /// The shard's rows of W_q, W_k, W_v stacked: `[(heads + 2·kv_heads)·d, hidden]`.
    wqkv: Tensor,
    /// The shard's columns of W_o: `[hidden, heads·d]`.
    wo: Tensor,
    /// The shard's rows of W_gate and W_up stacked: `[2·mlp, hidden]`.
    w_gate_up: Tensor,
    /// The shard's columns of W_down: `[hidden, mlp]`.
    w_down: Tensor,
}

/// One step's activations for `t` tokens and `r` logits rows.
struct Scratch {
    /// The residual stream `[t, hidden]`.
    x: Tensor,
    /// Per rank shard.
    shards: Vec<ShardScratch>,
    /// The rows whose logits are wanted `[r, hidden]`.
    last: Tensor,
}

/// One rank shard's activations.
struct ShardScratch {
    /// The rotated queries and keys and the values `[t, heads | kv_heads, d]`.
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// Attention output `[t, heads, d]` (viewed `[t, heads · d]` for the output projection).
    o: Tensor,
    /// The MLP's activation `[t, mlp]`.
    act: Tensor,
}

impl Scratch {
    fn new(m: &Llama, t: usize, r: usize) -> polyattn::Result<Self> {
        let z = |shape: &[usize]| Tensor::zeros(&m.device, shape, DType::F32);
        let (h, d) = (m.config.hidden, m.config.head_size);
        let shards = m
            .sharding
            .shards()
            .iter()
            .zip(&m.mlp_slices)
            .map(|(sh, mlp)| {
                Ok(ShardScratch {
                    q: z(&[t, sh.num_heads(), d])?,
                    k: z(&[t, sh.num_kv_heads(), d])?,
                    v: z(&[t, sh.num_kv_heads(), d])?,
                    o: z(&[t, sh.num_heads(), d])?,
                    act: z(&[t, mlp.len()])?,
                })
            })
            .collect::<polyattn::Result<Vec<_>>>()?;
        Ok(Scratch {
            x: z(&[t, h])?,
            shards,
            last: z(&[r, h])?,
        })
    }
}

/// Rows `rows` of a row-major matrix with `cols` columns.
fn rows_of(m: &[f32], cols: usize, rows: Range<usize>) -> &[f32] {
    &m[rows.start * cols..rows.end * cols]
}

/// Columns `keep` of a row-major matrix with `cols` columns, as a row-major matrix.
fn columns_of(m: &[f32], cols: usize, keep: Range<usize>) -> Vec<f32> {
    m.chunks_exact(cols)
        .flat_map(|row| row[keep.clone()].iter().copied())
        .collect()
}

/// The model on one backend's device.
pub struct Llama {
    config: LlamaConfig,
    backend: BackendRef,
    device: Device,
    embedding: Tensor,
    layers: Vec<Layer>,
    /// How each layer's heads are split over the rank shards.
    sharding: HeadSharding,
    /// Each rank shard's slice of the MLP's intermediate features.
    mlp_slices: Vec<Range<usize>>,
    final_norm: Tensor,
    lm_head: Option<Tensor>,
    /// `forward_into`'s activations per (tokens, logits rows), kept so that a captured step
    /// finds them where it recorded them.
    scratch: Mutex<HashMap<(usize, usize), Scratch>>,
}

impl Llama {
    /// Uploads `weights` to the device of the backend the selector picks for the model's
    /// attention (`POLYATTN_BACKEND` forces one), or of `backend` when given.
    pub fn load(
        config: LlamaConfig,
        weights: HostWeights,
        backend: Option<BackendRef>,
    ) -> polyattn::Result<Self> {
        Self::load_with(config, weights, backend, LoadOptions::default())
    }

    /// [`Llama::load`] with `options`: each layer split into rank shards on the one device
    /// (module docs), the projection weights stored in f16 or bf16.
    pub fn load_with(
        config: LlamaConfig,
        weights: HostWeights,
        backend: Option<BackendRef>,
        options: LoadOptions,
    ) -> polyattn::Result<Self> {
        let LoadOptions {
            tensor_parallel,
            weight_dtype,
        } = options;
        let c = &config;
        if weights.layers.len() != c.num_layers {
            return Err(polyattn::Error::Config(format!(
                "{} layers of weights for a {}-layer model",
                weights.layers.len(),
                c.num_layers
            )));
        }
        let sharding = HeadSharding::new(c.num_heads, c.num_kv_heads, tensor_parallel)?;
        if tensor_parallel > c.intermediate {
            return Err(polyattn::Error::Config(format!(
                "{tensor_parallel} ranks for {} MLP features",
                c.intermediate
            )));
        }
        let mlp_slices: Vec<Range<usize>> = (0..tensor_parallel)
            .map(|r| {
                r * c.intermediate / tensor_parallel..(r + 1) * c.intermediate / tensor_parallel
            })
            .collect();
        let params = AttentionParams::new(c.num_heads, c.head_size, c.num_kv_heads);
        let block_size = 16;
        let shard_params = |r: usize| sharding.params_for(&params, r);
        let first = match backend {
            Some(b) => Attention::on_backend(
                AttentionLayer::new("layers.0.attn.rank0"),
                shard_params(0)?,
                b,
            )?,
            None => Attention::new(
                AttentionLayer::new("layers.0.attn.rank0"),
                shard_params(0)?,
                DType::F32,
                Some(block_size),
            )?,
        };
        let backend = first.backend_ref();
        let device = backend.device()?;
        if !matches!(weight_dtype, DType::F32 | DType::F16 | DType::Bf16) {
            return Err(polyattn::Error::Config(format!(
                "weights in {weight_dtype}: the model stores f32, f16 or bf16 weights"
            )));
        }
        let up = |data: &[f32], shape: &[usize]| Tensor::from_f32(&device, data, shape, DType::F32);
        // The projections (and the output head): what a decode step streams.
        let proj =
            |data: &[f32], shape: &[usize]| Tensor::from_f32(&device, data, shape, weight_dtype);
        let (h, q, kv, i, d) = (
            c.hidden,
            c.num_heads * c.head_size,
            c.num_kv_heads * c.head_size,
            c.intermediate,
            c.head_size,
        );
        let mut first = Some(first);
        let mut layers = Vec::with_capacity(c.num_layers);
        for (l, w) in weights.layers.iter().enumerate() {
            let sizes = [
                ("wq", w.wq.len(), q * h),
                ("wk", w.wk.len(), kv * h),
                ("wv", w.wv.len(), kv * h),
                ("wo", w.wo.len(), h * q),
                ("w_gate", w.w_gate.len(), i * h),
                ("w_up", w.w_up.len(), i * h),
                ("w_down", w.w_down.len(), h * i),
            ];
            if let Some((name, got, want)) = sizes.iter().find(|(_, got, want)| got != want) {
                return Err(polyattn::Error::Config(format!(
                    "layer {l}: {name} has {got} elements, the config needs {want}"
                )));
            }
            let mut shards = Vec::with_capacity(tensor_parallel);
            for (r, sh) in sharding.shards().iter().enumerate() {
                let attn = match first.take() {
                    Some(a) => a,
                    None => Attention::on_backend(
                        AttentionLayer::new(format!("layers.{l}.attn.rank{r}")),
                        shard_params(r)?,
                        backend.clone(),
                    )?,
                };
                let (qh, kvh) = (sh.q_heads.clone(), sh.kv_heads.clone());
                let (qr, kvr) = (qh.start * d..qh.end * d, kvh.start * d..kvh.end * d);
                let mlp = mlp_slices[r].clone();
                let wqkv = [
                    rows_of(&w.wq, h, qr.clone()),
                    rows_of(&w.wk, h, kvr.clone()),
                    rows_of(&w.wv, h, kvr.clone()),
                ]
                .concat();
                let w_gate_up = [
                    rows_of(&w.w_gate, h, mlp.clone()),
                    rows_of(&w.w_up, h, mlp.clone()),
                ]
                .concat();
                shards.push(LayerShard {
                    attn,
                    wqkv: proj(&wqkv, &[qr.len() + 2 * kvr.len(), h])?,
                    wo: proj(&columns_of(&w.wo, q, qr.clone()), &[h, qr.len()])?,
                    w_gate_up: proj(&w_gate_up, &[2 * mlp.len(), h])?,
                    w_down: proj(&columns_of(&w.w_down, i, mlp.clone()), &[h, mlp.len()])?,
                });
            }
            layers.push(Layer {
                attn_norm: up(&w.attn_norm, &[h])?,
                ffn_norm: up(&w.ffn_norm, &[h])?,
                shards,
            });
        }
        Ok(Llama {
            embedding: up(&weights.embedding, &[c.vocab_size, h])?,
            final_norm: up(&weights.final_norm, &[h])?,
            // A tied head gets its own 16-bit copy: the embedding's gather reads f32.
            lm_head: match (&weights.lm_head, weight_dtype) {
                (Some(w), _) => Some(proj(w, &[c.vocab_size, h])?),
                (None, DType::F32) => None,
                (None, _) => Some(proj(&weights.embedding, &[c.vocab_size, h])?),
            },
            layers,
            sharding,
            mlp_slices,
            backend,
            device,
            config,
            scratch: Mutex::new(HashMap::new()),
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// Bytes of every weight a decode step reads (each layer's, the final norm, the output
    /// head; of the embedding only the rows of the step's tokens, counted as none unless it
    /// is the tied head).
    pub fn weight_bytes(&self) -> usize {
        let layer: usize = self
            .layers
            .iter()
            .map(|l| {
                let shards: usize = l
                    .shards
                    .iter()
                    .flat_map(|s| [&s.wqkv, &s.wo, &s.w_gate_up, &s.w_down])
                    .map(|t| t.size_in_bytes())
                    .sum();
                shards + l.attn_norm.size_in_bytes() + l.ffn_norm.size_in_bytes()
            })
            .sum();
        layer
            + self.final_norm.size_in_bytes()
            + self
                .lm_head
                .as_ref()
                .unwrap_or(&self.embedding)
                .size_in_bytes()
    }

    /// The device holding the weights.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl CausalLm for Llama {
    fn config(&self) -> ModelConfig {
        // One cache per layer and rank shard, layer after layer.
        let per_layer: Vec<usize> = self
            .sharding
            .shards()
            .iter()
            .map(|s| s.num_kv_heads())
            .collect();
        ModelConfig {
            kv_cache_heads: per_layer.repeat(self.config.num_layers),
            head_size: self.config.head_size,
            vocab_size: self.config.vocab_size,
            max_model_len: self.config.max_model_len,
            dtype: DType::F32,
        }
    }

    fn backend(&self) -> BackendRef {
        self.backend.clone()
    }

    fn forward(
        &self,
        batch: &StepBatch<'_>,
        kv_caches: &mut [KvCache],
    ) -> polyattn::Result<Tensor> {
        let (t, r) = (batch.input_ids.numel(), batch.logits_indices.numel());
        let mut scratch = Scratch::new(self, t, r)?;
        let mut logits = Tensor::zeros(&self.device, &[r, self.config.vocab_size], DType::F32)?;
        self.run(batch, kv_caches, &mut scratch, &mut logits)?;
        Ok(logits)
    }

    fn capturable(&self) -> bool {
        true
    }

    fn forward_into(
        &self,
        batch: &StepBatch<'_>,
        kv_caches: &mut [KvCache],
        logits: &mut Tensor,
    ) -> polyattn::Result<()> {
        let key = (batch.input_ids.numel(), batch.logits_indices.numel());
        let mut map = self.scratch.lock().map_err(|_| {
            polyattn::Error::Config("a step panicked while holding the scratch".into())
        })?;
        let scratch = match map.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Scratch::new(self, key.0, key.1)?)
            }
        };
        self.run(batch, kv_caches, scratch, logits)
    }
}

impl Llama {
    /// The decoder over `batch`, every activation in `s`, the logits into `logits`: device
    /// work only (no allocation, upload or download).
    fn run(
        &self,
        batch: &StepBatch<'_>,
        kv_caches: &mut [KvCache],
        s: &mut Scratch,
        logits: &mut Tensor,
    ) -> polyattn::Result<()> {
        let c = &self.config;
        let t = batch.input_ids.numel();
        let rope = Rope {
            base: c.rope_base,
            style: c.rope_style,
        };
        let d = c.head_size;
        compute::embedding_into(&self.embedding, batch.input_ids, &mut s.x)?;
        let norm = |weight| {
            Some(InputNorm {
                weight,
                eps: c.rms_eps,
            })
        };
        let n = self.sharding.world_size();
        if kv_caches.len() != self.layers.len() * n {
            return Err(polyattn::Error::Config(format!(
                "{} KV caches for {} layers of {n} rank shards",
                kv_caches.len(),
                self.layers.len()
            )));
        }
        for (layer, caches) in self.layers.iter().zip(kv_caches.chunks_exact_mut(n)) {
            // Every shard's attention reads the residual stream before any shard adds to it.
            for ((sh, ss), cache) in layer.shards.iter().zip(&mut s.shards).zip(caches) {
                compute::linear_fused(
                    &s.x,
                    norm(&layer.attn_norm),
                    &sh.wqkv,
                    LinearOutput::RopeSplitQkv {
                        positions: batch.positions,
                        rope,
                        q: &mut ss.q,
                        k: &mut ss.k,
                        v: &mut ss.v,
                    },
                )?;
                sh.attn.forward(
                    &ss.q,
                    Some(&ss.k),
                    Some(&ss.v),
                    cache,
                    batch.attn_metadata,
                    &mut ss.o,
                )?;
            }
            // Each shard's output projection adds into the residual stream (the all-reduce).
            for (sh, ss) in layer.shards.iter().zip(&mut s.shards) {
                let heads = ss.o.shape()[1];
                ss.o.reshape_in_place(&[t, heads * d])?;
                compute::linear_accumulate(&ss.o, &sh.wo, &mut s.x)?;
                ss.o.reshape_in_place(&[t, heads, d])?;
            }
            for (sh, ss) in layer.shards.iter().zip(&mut s.shards) {
                compute::linear_fused(
                    &s.x,
                    norm(&layer.ffn_norm),
                    &sh.w_gate_up,
                    LinearOutput::SwiGlu(&mut ss.act),
                )?;
            }
            for (sh, ss) in layer.shards.iter().zip(&mut s.shards) {
                compute::linear_accumulate(&ss.act, &sh.w_down, &mut s.x)?;
            }
        }
        compute::gather_rows_into(&s.x, batch.logits_indices, &mut s.last)?;
        compute::linear_fused(
            &s.last,
            norm(&self.final_norm),
            self.lm_head.as_ref().unwrap_or(&self.embedding),
            LinearOutput::Store(logits),
        )
    }
}
