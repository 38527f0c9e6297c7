//! Requests: what a caller submits ([`SamplingParams`], a prompt) and what the runner reports
//! back per step ([`TokenOutput`], [`FinishReason`]).

use crate::error::{Error, Result};

/// A request's id, unique within one [`super::ModelRunner`].
pub type RequestId = u64;

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy (argmax, ties to the lowest id).
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches `top_p`
    /// (1.0 keeps all). Ignored when greedy.
    pub top_p: f32,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Token ids that end the request (the model's end-of-sequence tokens); the stop token
    /// is reported and then the request finishes.
    pub stop_token_ids: Vec<u32>,
    /// Seed of the request's own random stream (sampling is reproducible per request,
    /// whatever else is in the batch).
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            max_tokens: 32,
            stop_token_ids: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of up to `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams {
            max_tokens,
            ..Default::default()
        }
    }

    /// Checks the ranges (finite temperature >= 0, top_p in (0, 1]).
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::config(format!(
                "temperature must be finite and >= 0 (0 = greedy), got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::config(format!(
                "top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// Why a request stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// It produced one of its stop tokens.
    Stop,
    /// It reached `max_tokens`, or the model's context is full.
    Length,
}

/// One token a step produced for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOutput {
    /// The request.
    pub request: RequestId,
    /// The token.
    pub token: u32,
    /// Set on the request's last token.
    pub finished: Option<FinishReason>,
}
