//! A Llama-family decoder written once against polyattn: token embedding; per layer the Q/K/V
//! projections as one linear layer with the attention RMSNorm before it and the split with
//! RoPE after it → paged attention through [`polyattn::Attention`] → the output projection
//! added into the residual stream → gate and up as one linear layer with the MLP's RMSNorm
//! before it and SwiGLU after it → the down projection added into the residual stream; a
//! final RMSNorm and the output head (tied to the embedding or separate), one layer again.
//! Four launches per layer besides attention's own ([`compute::linear_fused`]). Where the
//! cache takes it ([`compute::fuses_cache_write`]: f32 storage on the CPU, CUDA or the WGSL
//! family's runtimes), the Q/K/V projection writes the new keys and values straight into the
//! layer's KV cache and attention runs with none to write, so the cache write is no launch of
//! its own ([`LoadOptions::separate_cache_write`] keeps the attention layer's write).
//!
//! With `tensor_parallel` N > 1 ([`Llama::load_with`]) each layer runs as N rank shards
//! (`polyattn::parallel::heads`): a shard owns whole GQA groups (its rows of W_q / W_k / W_v,
//! its own attention layer and KV cache, its columns of W_o) and a slice of the MLP (its rows
//! of gate / up, its columns of down). [`Placement`] says where the shards run: all on one
//! device, where every shard's output and down projections add into the one residual stream
//! (the all-reduce done in place), or each rank on a device of its own with its own copy of
//! the residual stream, where the first rank adds its partial output into its copy, the others
//! write theirs, and a [`RankGroup`] sums the copies (NCCL between CUDA GPUs) — twice per
//! layer, as Megatron-style tensor parallelism does. One host thread drives every rank: the
//! launches are asynchronous on GPUs, NCCL's grouped calls keep the ranks together, and a rank
//! whose operation fails ends the step before any rank has issued the next collective, so no
//! rank is left waiting in one.
//!
//! Every operation runs on the attention backend's device through [`polyattn::compute`], so
//! the model moves with `POLYATTN_BACKEND` and nothing else (ranks placed per device run on
//! their own backends' devices). Weights and activations are f32 by
//! default: both example models are small, and f32 makes greedy decoding agree across
//! backends; [`LoadOptions::weight_dtype`] stores the projections in f16 or bf16 instead.
//!
//! One body ([`Llama::run`]) writes every activation into a [`Scratch`] through the
//! operations' `_into` forms. `forward` gives it a fresh scratch; `forward_into` keeps one
//! per token count, so after its first call for a count it allocates nothing on the device
//! and the runner can capture it as a graph ([`CausalLm::capturable`]).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;

use polyattn::compute::{self, InputNorm, LinearOutput, Rope, RopeStyle};
use polyattn::metadata::{AttentionMetadata, AttentionMetadataBuilder, CommonAttentionMetadata};
use polyattn::parallel::{HeadSharding, RankGroup, Transport};
use polyattn::runner::{CausalLm, ModelConfig, StepBatch};
use polyattn::{
    Attention, AttentionLayer, AttentionParams, BackendRef, DType, Device, KvCache, KvCacheSpec,
    Tensor,
};

/// The block size the attention backend is chosen for (the runner's default).
pub const BLOCK_SIZE: u32 = 16;

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

/// Where a tensor-parallel model's rank shards run (module docs).
#[derive(Clone, Default)]
pub enum Placement {
    /// Every shard on the one device, their partial outputs added into one residual stream.
    #[default]
    OneDevice,
    /// Rank `r` on `backends[r]`'s device (one backend per rank), with its own copies of the
    /// embedding, the norms and the residual stream, the partial outputs summed by a
    /// [`RankGroup`]. Ranks may share a device: the same code then runs with host sums.
    PerRank(Vec<BackendRef>),
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::OneDevice => f.write_str("OneDevice"),
            Placement::PerRank(b) => {
                let names: Vec<&str> = b.iter().map(|b| b.name()).collect();
                write!(f, "PerRank({names:?})")
            }
        }
    }
}

/// How [`Llama::load_with`] lays the model out.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Rank shards per layer (1: unsharded).
    pub tensor_parallel: usize,
    /// Where the shards run.
    pub placement: Placement,
    /// The projections' and the output head's dtype: f32, or f16 / bf16 (half the bytes a
    /// decode step streams; the CPU widens them as it reads). Norms and the embedding stay
    /// f32.
    pub weight_dtype: DType,
    /// Write each layer's keys and values through the attention layer (a launch of its
    /// own) even where the Q/K/V projection could write them into the cache itself.
    pub separate_cache_write: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            tensor_parallel: 1,
            placement: Placement::OneDevice,
            weight_dtype: DType::F32,
            separate_cache_write: false,
        }
    }
}

/// One layer: its norms (on the first rank's device) and its rank shards (one without tensor
/// parallelism), each on its rank's device.
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
    /// The residual stream `[t, hidden]` (the first rank's copy when ranks have devices of
    /// their own).
    x: Tensor,
    /// The other ranks' copies of the residual stream, with [`Placement::PerRank`].
    rank_x: Vec<Tensor>,
    /// Per rank shard, on its rank's device.
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
            .enumerate()
            .map(|(rank, (sh, mlp))| {
                let device = m.rank_device(rank);
                let z = |shape: &[usize]| Tensor::zeros(device, shape, DType::F32);
                Ok(ShardScratch {
                    q: z(&[t, sh.num_heads(), d])?,
                    k: z(&[t, sh.num_kv_heads(), d])?,
                    v: z(&[t, sh.num_kv_heads(), d])?,
                    o: z(&[t, sh.num_heads(), d])?,
                    act: z(&[t, mlp.len()])?,
                })
            })
            .collect::<polyattn::Result<Vec<_>>>()?;
        let rank_x = match &m.ranks {
            Some(ranks) => ranks
                .others
                .iter()
                .map(|o| Tensor::zeros(&o.device, &[t, h], DType::F32))
                .collect::<polyattn::Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        Ok(Scratch {
            x: z(&[t, h])?,
            rank_x,
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

/// The ranks of a [`Placement::PerRank`] model past the first (which holds the model's own
/// embedding, norms and output head), and the group that sums the partial outputs.
struct Ranks {
    group: Mutex<RankGroup>,
    /// Ranks 1.. in order.
    others: Vec<PeerRank>,
}

/// A rank past the first: its device, its copies of what every rank reads, and its metadata
/// builder (made for its caches' spec on the first step).
struct PeerRank {
    backend: BackendRef,
    device: Device,
    embedding: Tensor,
    /// Per layer: the attention norm and the MLP norm.
    norms: Vec<(Tensor, Tensor)>,
    builder: Mutex<Option<(KvCacheSpec, Box<dyn AttentionMetadataBuilder>)>>,
}

/// One step's inputs on a rank past the first.
struct RankInputs {
    input_ids: Tensor,
    positions: Tensor,
    metadata: Box<dyn AttentionMetadata>,
}

/// The model on one backend's device, or on one device per rank ([`Placement::PerRank`]).
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
    /// With [`Placement::PerRank`]: the ranks past the first and the group summing them.
    ranks: Option<Ranks>,
    /// The Q/K/V projection writes the keys and values into the cache where it can.
    fuse_cache_write: bool,
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

    /// [`Llama::load`] with `options`: each layer split into rank shards, on the one device or
    /// one device per rank (module docs), the projection weights stored in f16 or bf16. With
    /// [`Placement::PerRank`] the ranks' backends come from the placement and `backend` must
    /// be `None`.
    pub fn load_with(
        config: LlamaConfig,
        weights: HostWeights,
        backend: Option<BackendRef>,
        options: LoadOptions,
    ) -> polyattn::Result<Self> {
        let LoadOptions {
            tensor_parallel,
            placement,
            weight_dtype,
            separate_cache_write,
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
        let rank_backends = match placement {
            Placement::OneDevice => None,
            Placement::PerRank(b) if b.len() != tensor_parallel => {
                return Err(polyattn::Error::Config(format!(
                    "{} rank backends for {tensor_parallel} ranks",
                    b.len()
                )))
            }
            Placement::PerRank(_) if backend.is_some() => {
                return Err(polyattn::Error::Config(
                    "give one backend, or one per rank in Placement::PerRank, not both".into(),
                ))
            }
            Placement::PerRank(b) => Some(b),
        };
        let backend = backend.or_else(|| rank_backends.as_ref().map(|b| b[0].clone()));
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
                Some(BLOCK_SIZE),
            )?,
        };
        let backend = first.backend_ref();
        let device = backend.device()?;
        let rank_backend = |r: usize| match &rank_backends {
            Some(b) => b[r].clone(),
            None => backend.clone(),
        };
        let rank_devices = (0..tensor_parallel)
            .map(|r| rank_backend(r).device())
            .collect::<polyattn::Result<Vec<Device>>>()?;
        if !matches!(weight_dtype, DType::F32 | DType::F16 | DType::Bf16) {
            return Err(polyattn::Error::Config(format!(
                "weights in {weight_dtype}: the model stores f32, f16 or bf16 weights"
            )));
        }
        let up = |data: &[f32], shape: &[usize]| Tensor::from_f32(&device, data, shape, DType::F32);
        // The projections (and the output head): what a decode step streams.
        let proj_on = |device: &Device, data: &[f32], shape: &[usize]| {
            Tensor::from_f32(device, data, shape, weight_dtype)
        };
        let proj = |data: &[f32], shape: &[usize]| proj_on(&device, data, shape);
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
                        rank_backend(r),
                    )?,
                };
                let proj = |data: &[f32], shape: &[usize]| proj_on(&rank_devices[r], data, shape);
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
        let ranks = match &rank_backends {
            None => None,
            Some(b) => Some(Ranks {
                group: Mutex::new(RankGroup::new(rank_devices.clone())?),
                others: (1..tensor_parallel)
                    .map(|r| PeerRank::load(b[r].clone(), &rank_devices[r], c, &weights))
                    .collect::<polyattn::Result<Vec<_>>>()?,
            }),
        };
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
            ranks,
            backend,
            device,
            config,
            fuse_cache_write: !separate_cache_write,
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

    /// The device holding the weights (the first rank's with [`Placement::PerRank`]).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// How the ranks' partial outputs are summed with [`Placement::PerRank`] (`None` for
    /// one device).
    pub fn rank_transport(&self) -> Option<Transport> {
        let ranks = self.ranks.as_ref()?;
        let group = ranks.group.lock().ok()?;
        Some(group.transport().clone())
    }

    /// Rank `r`'s device.
    fn rank_device(&self, r: usize) -> &Device {
        match &self.ranks {
            Some(ranks) if r > 0 => &ranks.others[r - 1].device,
            _ => &self.device,
        }
    }
}

impl PeerRank {
    /// The rank's copies of the embedding and the norms on `device`.
    fn load(
        backend: BackendRef,
        device: &Device,
        c: &LlamaConfig,
        weights: &HostWeights,
    ) -> polyattn::Result<Self> {
        let up = |data: &[f32], shape: &[usize]| Tensor::from_f32(device, data, shape, DType::F32);
        let norms = weights
            .layers
            .iter()
            .map(|w| {
                Ok((
                    up(&w.attn_norm, &[c.hidden])?,
                    up(&w.ffn_norm, &[c.hidden])?,
                ))
            })
            .collect::<polyattn::Result<Vec<_>>>()?;
        Ok(PeerRank {
            embedding: up(&weights.embedding, &[c.vocab_size, c.hidden])?,
            norms,
            backend,
            device: device.clone(),
            builder: Mutex::new(None),
        })
    }

    /// The step's inputs on this rank's device: the token ids and positions copied, the
    /// metadata built by this rank's backend from the runner's batch (its arrays uploaded
    /// from the host copies, not read back from the first rank's device).
    fn inputs(&self, batch: &StepBatch<'_>, spec: KvCacheSpec) -> polyattn::Result<RankInputs> {
        let mut builder = self.builder.lock().map_err(|_| {
            polyattn::Error::Config("a step panicked while holding a rank's builder".into())
        })?;
        let builder = match &mut *builder {
            Some((made_for, b)) if *made_for == spec => b,
            slot => &mut slot.insert((spec, self.backend.make_builder(&spec)?)).1,
        };
        let common =
            CommonAttentionMetadata::new(&self.device, batch.common.description().clone())?;
        Ok(RankInputs {
            input_ids: batch.input_ids.to_device(&self.device)?,
            positions: batch.positions.to_device(&self.device)?,
            metadata: builder.build(0, &common, false)?,
        })
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

    fn cache_backend(&self, cache: usize) -> BackendRef {
        // Caches run layer after layer, rank after rank within a layer.
        let rank = cache % self.sharding.world_size();
        match &self.ranks {
            Some(ranks) if rank > 0 => ranks.others[rank - 1].backend.clone(),
            _ => self.backend.clone(),
        }
    }

    fn forward(
        &self,
        batch: &StepBatch<'_>,
        kv_caches: &mut [KvCache],
    ) -> polyattn::Result<Tensor> {
        let (t, r) = (batch.input_ids.numel(), batch.logits_indices.numel());
        let mut logits = Tensor::zeros(&self.device, &[r, self.config.vocab_size], DType::F32)?;
        if self.ranks.is_some() {
            // Not captured, so the runner calls `forward` every step: keep the activations
            // of every rank per token count rather than allocating them on every device.
            self.forward_into(batch, kv_caches, &mut logits)?;
        } else {
            let mut scratch = Scratch::new(self, t, r)?;
            self.run(batch, kv_caches, &mut scratch, &mut logits)?;
        }
        Ok(logits)
    }

    fn capturable(&self) -> bool {
        // Ranks on devices of their own take copies of the step's inputs every step.
        self.ranks.is_none()
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
    /// The decoder over `batch`, every activation in `s`, the logits into `logits`. On one
    /// device it is device work only (no allocation, upload or download); ranks on devices
    /// of their own take copies of the step's inputs first ([`Llama::run_ranks`]).
    fn run(
        &self,
        batch: &StepBatch<'_>,
        kv_caches: &mut [KvCache],
        s: &mut Scratch,
        logits: &mut Tensor,
    ) -> polyattn::Result<()> {
        let n = self.sharding.world_size();
        if kv_caches.len() != self.layers.len() * n {
            return Err(polyattn::Error::Config(format!(
                "{} KV caches for {} layers of {n} rank shards",
                kv_caches.len(),
                self.layers.len()
            )));
        }
        if let Some(ranks) = &self.ranks {
            return self.run_ranks(ranks, batch, kv_caches, s, logits);
        }
        let ctx = self.step_context();
        compute::embedding_into(&self.embedding, batch.input_ids, &mut s.x)?;
        for (layer, caches) in self.layers.iter().zip(kv_caches.chunks_exact_mut(n)) {
            // Every shard's attention reads the residual stream before any shard adds to it.
            for ((sh, ss), cache) in layer.shards.iter().zip(&mut s.shards).zip(caches) {
                let norm = ctx.norm(&layer.attn_norm);
                let fused = self.fuse_cache_write.then_some(batch.common);
                sh.attend(
                    &s.x,
                    norm,
                    batch.positions,
                    ctx.rope,
                    (cache, batch.attn_metadata, fused),
                    ss,
                )?;
            }
            // Each shard's output projection adds into the residual stream (the all-reduce).
            for (sh, ss) in layer.shards.iter().zip(&mut s.shards) {
                sh.project_heads(ss, &mut s.x, true)?;
            }
            for (sh, ss) in layer.shards.iter().zip(&mut s.shards) {
                sh.gate_up(&s.x, ctx.norm(&layer.ffn_norm), ss)?;
            }
            for (sh, ss) in layer.shards.iter().zip(&mut s.shards) {
                sh.down(ss, &mut s.x, true)?;
            }
        }
        self.head(batch, s, logits)
    }

    /// What every layer reads besides its weights.
    fn step_context(&self) -> StepContext {
        StepContext {
            rope: Rope {
                base: self.config.rope_base,
                style: self.config.rope_style,
            },
            eps: self.config.rms_eps,
        }
    }

    /// The final norm and the output head over the rows of `s.x` the runner samples.
    fn head(
        &self,
        batch: &StepBatch<'_>,
        s: &mut Scratch,
        logits: &mut Tensor,
    ) -> polyattn::Result<()> {
        compute::gather_rows_into(&s.x, batch.logits_indices, &mut s.last)?;
        let norm = InputNorm {
            weight: &self.final_norm,
            eps: self.config.rms_eps,
        };
        compute::linear_fused(
            &s.last,
            Some(norm),
            self.lm_head.as_ref().unwrap_or(&self.embedding),
            LinearOutput::Store(logits),
        )
    }

    /// [`Llama::run`] with each rank on its own device ([`Placement::PerRank`]): every rank
    /// keeps a copy of the residual stream; after each row-parallel projection (the output
    /// projection, the down projection) the first rank holds residual + its part, the others
    /// their parts, and the group's all-reduce leaves the new residual on every rank. The
    /// first rank computes the logits.
    fn run_ranks(
        &self,
        ranks: &Ranks,
        batch: &StepBatch<'_>,
        kv_caches: &mut [KvCache],
        s: &mut Scratch,
        logits: &mut Tensor,
    ) -> polyattn::Result<()> {
        let ctx = self.step_context();
        let n = self.sharding.world_size();
        // The other ranks' inputs, their metadata built for the spec of their first cache
        // (every layer's cache of a rank has the same spec).
        let others = ranks
            .others
            .iter()
            .enumerate()
            .map(|(i, o)| o.inputs(batch, *kv_caches[i + 1].spec()))
            .collect::<polyattn::Result<Vec<_>>>()?;
        let positions: Vec<&Tensor> = std::iter::once(batch.positions)
            .chain(others.iter().map(|i| &i.positions))
            .collect();
        let metadata: Vec<&dyn AttentionMetadata> = std::iter::once(batch.attn_metadata)
            .chain(others.iter().map(|i| i.metadata.as_ref()))
            .collect();
        let mut group = ranks.group.lock().map_err(|_| {
            polyattn::Error::Config("a step panicked while holding the rank group".into())
        })?;
        let mut xs: Vec<&mut Tensor> = std::iter::once(&mut s.x)
            .chain(s.rank_x.iter_mut())
            .collect();
        compute::embedding_into(&self.embedding, batch.input_ids, xs[0])?;
        for ((o, i), x) in ranks.others.iter().zip(&others).zip(&mut xs[1..]) {
            compute::embedding_into(&o.embedding, &i.input_ids, x)?;
        }
        for (l, (layer, caches)) in self
            .layers
            .iter()
            .zip(kv_caches.chunks_exact_mut(n))
            .enumerate()
        {
            let norms = |r: usize| match r {
                0 => (&layer.attn_norm, &layer.ffn_norm),
                _ => {
                    let (a, f) = &ranks.others[r - 1].norms[l];
                    (a, f)
                }
            };
            let shards = layer.shards.iter().zip(&mut s.shards).zip(caches);
            for (r, ((sh, ss), cache)) in shards.enumerate() {
                let norm = ctx.norm(norms(r).0);
                // Each rank's batch arrays live on its own device: its cache is written
                // through its attention layer.
                sh.attend(
                    xs[r],
                    norm,
                    positions[r],
                    ctx.rope,
                    (cache, metadata[r], None),
                    ss,
                )?;
                // Rank 0 adds its part to its residual copy, the others store theirs: the
                // sum over ranks is residual + every part.
                sh.project_heads(ss, xs[r], r == 0)?;
            }
            group.all_reduce_sum(&mut xs)?;
            for (r, (sh, ss)) in layer.shards.iter().zip(&mut s.shards).enumerate() {
                sh.gate_up(xs[r], ctx.norm(norms(r).1), ss)?;
                sh.down(ss, xs[r], r == 0)?;
            }
            group.all_reduce_sum(&mut xs)?;
        }
        drop(xs);
        self.head(batch, s, logits)
    }
}

/// What every layer reads besides its weights.
#[derive(Clone, Copy)]
struct StepContext {
    rope: Rope,
    eps: f32,
}

impl StepContext {
    /// The RMSNorm with `weight` before a projection.
    fn norm(self, weight: &Tensor) -> Option<InputNorm<'_>> {
        Some(InputNorm {
            weight,
            eps: self.eps,
        })
    }
}

impl LayerShard {
    /// The shard's attention over the residual stream `x`: the normed Q/K/V projection,
    /// split and rotated into `ss.q / k / v`, then attention into `ss.o`. With the step's
    /// batch (`fused`) and a cache that takes it, the projection writes the keys and values
    /// into the cache itself and attention reads them from there.
    fn attend(
        &self,
        x: &Tensor,
        norm: Option<InputNorm<'_>>,
        positions: &Tensor,
        rope: Rope,
        (cache, metadata, fused): (
            &mut KvCache,
            &dyn AttentionMetadata,
            Option<&CommonAttentionMetadata>,
        ),
        ss: &mut ShardScratch,
    ) -> polyattn::Result<()> {
        if let Some(batch) = fused.filter(|_| compute::fuses_cache_write(cache)) {
            compute::linear_fused(
                x,
                norm,
                &self.wqkv,
                LinearOutput::RopeSplitQkvCache {
                    positions,
                    rope,
                    q: &mut ss.q,
                    cache,
                    batch,
                },
            )?;
            return self
                .attn
                .forward(&ss.q, None, None, cache, metadata, &mut ss.o);
        }
        compute::linear_fused(
            x,
            norm,
            &self.wqkv,
            LinearOutput::RopeSplitQkv {
                positions,
                rope,
                q: &mut ss.q,
                k: &mut ss.k,
                v: &mut ss.v,
            },
        )?;
        self.attn
            .forward(&ss.q, Some(&ss.k), Some(&ss.v), cache, metadata, &mut ss.o)
    }

    /// The shard's output projection of its heads' attention into `out`: added to it
    /// (`add`), or stored.
    fn project_heads(
        &self,
        ss: &mut ShardScratch,
        out: &mut Tensor,
        add: bool,
    ) -> polyattn::Result<()> {
        let (t, heads, d) = (ss.o.shape()[0], ss.o.shape()[1], ss.o.shape()[2]);
        ss.o.reshape_in_place(&[t, heads * d])?;
        let done = project(&ss.o, &self.wo, out, add);
        ss.o.reshape_in_place(&[t, heads, d])?;
        done
    }

    /// The shard's gate and up projections of the normed `x`, SwiGLU into `ss.act`.
    fn gate_up(
        &self,
        x: &Tensor,
        norm: Option<InputNorm<'_>>,
        ss: &mut ShardScratch,
    ) -> polyattn::Result<()> {
        compute::linear_fused(x, norm, &self.w_gate_up, LinearOutput::SwiGlu(&mut ss.act))
    }

    /// The shard's down projection of `ss.act` into `out`: added (`add`), or stored.
    fn down(&self, ss: &ShardScratch, out: &mut Tensor, add: bool) -> polyattn::Result<()> {
        project(&ss.act, &self.w_down, out, add)
    }
}

/// `out += x · wᵀ` (`add`) or `out = x · wᵀ`.
fn project(x: &Tensor, w: &Tensor, out: &mut Tensor, add: bool) -> polyattn::Result<()> {
    if add {
        compute::linear_accumulate(x, w, out)
    } else {
        compute::linear_fused(x, None, w, LinearOutput::Store(out))
    }
}
