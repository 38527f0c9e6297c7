//! The model runner (the counterpart of vLLM's GPU model runner): requests with prompts, a
//! block allocator over the paged KV cache, continuous batching, and one step at a time
//! through a model that uses polyattn's [`crate::Attention`] layers.
//!
//! Per step, [`ModelRunner::step`]:
//! 1. the scheduler picks the tokens (running decodes first, then prompt chunks up to the
//!    token budget) and grows each request's block list;
//! 2. the batch is described once ([`crate::BatchDescription`]), validated once into
//!    [`crate::CommonAttentionMetadata`], and the backend's builder is called once;
//! 3. the model's [`CausalLm::forward`] runs every layer with that metadata and returns the
//!    logits of the requests that reached the end of their known tokens;
//! 4. the runner samples (greedy or temperature / top-p), appends, and finishes requests on a
//!    stop token, `max_tokens` or a full context, freeing their blocks.
//!
//! The model is written once against [`crate::compute`] and [`crate::Attention`]; the
//! backend (and with it the device) is the selector's choice, so `POLYATTN_BACKEND` alone
//! moves the whole model.

mod decode_graphs;
mod model_runner;
mod request;
mod sampler;
mod scheduler;

pub use model_runner::{CausalLm, ModelConfig, ModelRunner, RunnerConfig, RunnerStats, StepBatch};
pub use request::{FinishReason, RequestId, SamplingParams, TokenOutput};
pub use sampler::{argmax, sample, sampling_row};
