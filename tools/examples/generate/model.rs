//! A Llama-family decoder written once against polyattn: token embedding; per layer the Q/K/V
//! projections as one linear layer with the attention RMSNorm before it and the split with
//! RoPE after it → paged attention through [`polyattn::Attention`] → the output projection
//! added into the residual stream → gate and up as one linear layer with the MLP's RMSNorm
//! before it and SwiGLU after it → the down projection added into the residual stream; a
//! final RMSNorm and the output head (tied to the embedding or separate), one layer again.
//! Four launches per layer besides attention's own ([`compute::linear_fused`]).
//!
//! Every operation runs on the attention backend's device through [`polyattn::compute`], so
//! the model moves with `POLYATTN_BACKEND` and nothing else. Weights and activations are f32:
//! both example models are small, and f32 makes greedy decoding agree across backends.
//!
//! One body ([`Llama::run`]) writes every activation into a [`Scratch`] through the
//! operations' `_into` forms. `forward` gives it a fresh scratch; `forward_into` keeps one
//! per token count, so after its first call for a count it allocates nothing on the device
//! and the runner can capture it as a graph ([`CausalLm::capturable`]).

use std::collections::HashMap;
use std::sync::Mutex;

use polyattn::compute::{self, InputNorm, LinearOutput, Rope, RopeStyle};
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

/// One layer on the device. The projections that read the same input are fused into one
/// weight each (fewer, larger launches; every output feature is computed as before).
struct Layer {
    attn: Attention,
    attn_norm: Tensor,
    /// W_q, W_k, W_v stacked: `[(heads + 2·kv_heads)·d, hidden]`.
    wqkv: Tensor,
    wo: Tensor,
    ffn_norm: Tensor,
    /// W_gate and W_up stacked: `[2·intermediate, hidden]`.
    w_gate_up: Tensor,
    w_down: Tensor,
}

/// One step's activations for `t` tokens and `r` logits rows.
struct Scratch {
    /// The residual stream `[t, hidden]`.
    x: Tensor,
    /// The rotated queries and keys and the values `[t, heads | kv_heads, d]`.
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// Attention output `[t, heads, d]` (viewed `[t, heads · d]` for the output projection).
    o: Tensor,
    /// The MLP's activation `[t, intermediate]`.
    act: Tensor,
    /// The rows whose logits are wanted `[r, hidden]`.
    last: Tensor,
}

impl Scratch {
    fn new(c: &LlamaConfig, device: &Device, t: usize, r: usize) -> polyattn::Result<Self> {
        let z = |shape: &[usize]| Tensor::zeros(device, shape, DType::F32);
        let (h, d) = (c.hidden, c.head_size);
        Ok(Scratch {
            x: z(&[t, h])?,
            q: z(&[t, c.num_heads, d])?,
            k: z(&[t, c.num_kv_heads, d])?,
            v: z(&[t, c.num_kv_heads, d])?,
            o: z(&[t, c.num_heads, d])?,
            act: z(&[t, c.intermediate])?,
            last: z(&[r, h])?,
        })
    }
}

/// The model on one backend's device.
pub struct Llama {
    config: LlamaConfig,
    backend: BackendRef,
    device: Device,
    embedding: Tensor,
    layers: Vec<Layer>,
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
        let c = &config;
        if weights.layers.len() != c.num_layers {
            return Err(polyattn::Error::Config(format!(
                "{} layers of weights for a {}-layer model",
                weights.layers.len(),
                c.num_layers
            )));
        }
        let params = AttentionParams::new(c.num_heads, c.head_size, c.num_kv_heads);
        let block_size = 16;
        let first = match backend {
            Some(b) => {
                Attention::on_backend(AttentionLayer::new("layers.0.attn"), params.clone(), b)?
            }
            None => Attention::new(
                AttentionLayer::new("layers.0.attn"),
                params.clone(),
                DType::F32,
                Some(block_size),
            )?,
        };
        let backend = first.backend_ref();
        let device = backend.device()?;
        let up = |data: &[f32], shape: &[usize]| Tensor::from_f32(&device, data, shape, DType::F32);
        let (h, q, kv, i) = (
            c.hidden,
            c.num_heads * c.head_size,
            c.num_kv_heads * c.head_size,
            c.intermediate,
        );
        let mut first = Some(first);
        let mut layers = Vec::with_capacity(c.num_layers);
        for (l, w) in weights.layers.iter().enumerate() {
            let attn = match first.take() {
                Some(a) => a,
                None => Attention::on_backend(
                    AttentionLayer::new(format!("layers.{l}.attn")),
                    params.clone(),
                    backend.clone(),
                )?,
            };
            let sizes = [
                ("wq", w.wq.len(), q * h),
                ("wk", w.wk.len(), kv * h),
                ("wv", w.wv.len(), kv * h),
                ("w_gate", w.w_gate.len(), i * h),
                ("w_up", w.w_up.len(), i * h),
            ];
            if let Some((name, got, want)) = sizes.iter().find(|(_, got, want)| got != want) {
                return Err(polyattn::Error::Config(format!(
                    "layer {l}: {name} has {got} elements, the config needs {want}"
                )));
            }
            let wqkv = [w.wq.as_slice(), &w.wk, &w.wv].concat();
            let w_gate_up = [w.w_gate.as_slice(), &w.w_up].concat();
            layers.push(Layer {
                attn,
                attn_norm: up(&w.attn_norm, &[h])?,
                wqkv: up(&wqkv, &[q + 2 * kv, h])?,
                wo: up(&w.wo, &[h, q])?,
                ffn_norm: up(&w.ffn_norm, &[h])?,
                w_gate_up: up(&w_gate_up, &[2 * i, h])?,
                w_down: up(&w.w_down, &[h, i])?,
            });
        }
        Ok(Llama {
            embedding: up(&weights.embedding, &[c.vocab_size, h])?,
            final_norm: up(&weights.final_norm, &[h])?,
            lm_head: match &weights.lm_head {
                Some(w) => Some(up(w, &[c.vocab_size, h])?),
                None => None,
            },
            layers,
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
                [
                    &l.attn_norm,
                    &l.wqkv,
                    &l.wo,
                    &l.ffn_norm,
                    &l.w_gate_up,
                    &l.w_down,
                ]
                .iter()
                .map(|t| t.size_in_bytes())
                .sum::<usize>()
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
        ModelConfig {
            num_layers: self.config.num_layers,
            num_kv_heads: self.config.num_kv_heads,
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
        let mut scratch = Scratch::new(&self.config, &self.device, t, r)?;
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
                e.insert(Scratch::new(&self.config, &self.device, key.0, key.1)?)
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
        let (nh, d) = (c.num_heads, c.head_size);
        compute::embedding_into(&self.embedding, batch.input_ids, &mut s.x)?;
        let norm = |weight| {
            Some(InputNorm {
                weight,
                eps: c.rms_eps,
            })
        };
        for (layer, cache) in self.layers.iter().zip(kv_caches.iter_mut()) {
            compute::linear_fused(
                &s.x,
                norm(&layer.attn_norm),
                &layer.wqkv,
                LinearOutput::RopeSplitQkv {
                    positions: batch.positions,
                    rope,
                    q: &mut s.q,
                    k: &mut s.k,
                    v: &mut s.v,
                },
            )?;
            layer.attn.forward(
                &s.q,
                Some(&s.k),
                Some(&s.v),
                cache,
                batch.attn_metadata,
                &mut s.o,
            )?;
            // The output projection adds into the residual stream.
            s.o.reshape_in_place(&[t, nh * d])?;
            compute::linear_accumulate(&s.o, &layer.wo, &mut s.x)?;
            s.o.reshape_in_place(&[t, nh, d])?;
            compute::linear_fused(
                &s.x,
                norm(&layer.ffn_norm),
                &layer.w_gate_up,
                LinearOutput::SwiGlu(&mut s.act),
            )?;
            compute::linear_accumulate(&s.act, &layer.w_down, &mut s.x)?;
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
