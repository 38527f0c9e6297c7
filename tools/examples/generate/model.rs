//! A Llama-family decoder written once against polyattn: token embedding, per layer RMSNorm →
//! Q/K/V projections → RoPE → paged attention through [`polyattn::Attention`] → output
//! projection → residual, RMSNorm → SwiGLU MLP → residual; a final RMSNorm and the output
//! head (tied to the embedding or separate).
//!
//! Every operation runs on the attention backend's device through [`polyattn::compute`], so
//! the model moves with `POLYATTN_BACKEND` and nothing else. Weights and activations are f32:
//! both example models are small, and f32 makes greedy decoding agree across backends.

use polyattn::compute::{self, Rope, RopeStyle};
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

struct Layer {
    attn: Attention,
    attn_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    ffn_norm: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
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
            layers.push(Layer {
                attn,
                attn_norm: up(&w.attn_norm, &[h])?,
                wq: up(&w.wq, &[q, h])?,
                wk: up(&w.wk, &[kv, h])?,
                wv: up(&w.wv, &[kv, h])?,
                wo: up(&w.wo, &[h, q])?,
                ffn_norm: up(&w.ffn_norm, &[h])?,
                w_gate: up(&w.w_gate, &[i, h])?,
                w_up: up(&w.w_up, &[i, h])?,
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
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
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
        let c = &self.config;
        let t = batch.input_ids.numel();
        let rope = Rope {
            base: c.rope_base,
            style: c.rope_style,
        };
        let (nh, nkv, d) = (c.num_heads, c.num_kv_heads, c.head_size);
        let mut x = compute::embedding(&self.embedding, batch.input_ids)?;
        for (layer, cache) in self.layers.iter().zip(kv_caches.iter_mut()) {
            let h = compute::rms_norm(&x, &layer.attn_norm, c.rms_eps)?;
            let mut q = compute::linear(&h, &layer.wq)?.reshape(&[t, nh, d])?;
            let mut k = compute::linear(&h, &layer.wk)?.reshape(&[t, nkv, d])?;
            let v = compute::linear(&h, &layer.wv)?.reshape(&[t, nkv, d])?;
            compute::rope(&mut q, batch.positions, rope)?;
            compute::rope(&mut k, batch.positions, rope)?;
            let mut o = Tensor::zeros(&self.device, &[t, nh, d], DType::F32)?;
            layer
                .attn
                .forward(&q, Some(&k), Some(&v), cache, batch.attn_metadata, &mut o)?;
            let o = compute::linear(&o.reshape(&[t, nh * d])?, &layer.wo)?;
            compute::add_assign(&mut x, &o)?;
            let h = compute::rms_norm(&x, &layer.ffn_norm, c.rms_eps)?;
            let gate = compute::linear(&h, &layer.w_gate)?;
            let up = compute::linear(&h, &layer.w_up)?;
            let down = compute::linear(&compute::silu_mul(&gate, &up)?, &layer.w_down)?;
            compute::add_assign(&mut x, &down)?;
        }
        let last = compute::gather_rows(&x, batch.logits_indices)?;
        let h = compute::rms_norm(&last, &self.final_norm, c.rms_eps)?;
        compute::linear(&h, self.lm_head.as_ref().unwrap_or(&self.embedding))
    }
}
