//! Model-generation results: one [`GenerationRecord`] per run of the `generate` example
//! (`--json FILE` appends it as one JSON line), and the RESULTS.md section that tabulates
//! them (`polyattn bench … --generation FILE`).

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::machine::Machine;
use polyattn::error::{Error, Result};

/// Tokens per second of one `generate` run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerationRecord {
    /// Model name (from the weights).
    pub model: String,
    /// Backend that ran it.
    pub backend: String,
    /// Its device, described.
    pub device: String,
    /// Prompts run together (batched by the runner).
    pub prompts: usize,
    /// Prompt tokens over all prompts.
    pub prompt_tokens: usize,
    /// Tokens generated over all prompts.
    pub generated_tokens: usize,
    /// `--max-tokens`.
    pub max_tokens: usize,
    /// Runner steps.
    pub steps: usize,
    /// Prompt tokens per second over the steps that had some.
    pub prefill_tokens_per_s: f64,
    /// Decode tokens per second (all requests together) over pure-decode steps.
    pub decode_tokens_per_s: f64,
    /// Whether pure-decode steps replayed captured graphs (records without the field ran
    /// every step eagerly).
    #[serde(default)]
    pub graphs: bool,
    /// Bytes of weights one decode step reads (`--roofline`).
    #[serde(default)]
    pub weight_bytes: Option<u64>,
    /// The device's measured streaming bandwidth, GB/s (`--roofline`: the CPU's parallel
    /// read, a GPU's device copy).
    #[serde(default)]
    pub stream_gbps: Option<f64>,
    /// Mean wall time of a pure-decode step, µs (records without it did not report it).
    #[serde(default)]
    pub decode_step_us: Option<f64>,
    /// Of it, the mean time spent waiting for the device, µs (the rest is host work:
    /// scheduling, metadata, uploads, launches).
    #[serde(default)]
    pub decode_wait_us: Option<f64>,
    /// The machine.
    pub machine: Machine,
}

impl GenerationRecord {
    /// Decode tokens/s if every step only streamed the weights once at the measured
    /// bandwidth, with all the run's prompts in every step: `prompts · GB/s / weight bytes`.
    pub fn stream_limit(&self) -> Option<f64> {
        match (self.weight_bytes, self.stream_gbps) {
            (Some(b), Some(g)) if b > 0 => Some(self.prompts as f64 * g * 1e9 / b as f64),
            _ => None,
        }
    }

    /// Appends the record to `path` as one JSON line.
    pub fn append_to(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        let line = serde_json::to_string(self).map_err(|e| Error::Config(e.to_string()))?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        writeln!(f, "{line}").map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    /// Reads every record of a JSON-lines file.
    pub fn read_all(path: &Path) -> Result<Vec<Self>> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map_err(|e| Error::Config(format!("{}:{}: {e}", path.display(), i + 1)))
            })
            .collect()
    }
}

/// The "Model generation" section of RESULTS.md.
pub fn section(records: &[GenerationRecord], sources: &[String]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## Model generation (tokens/s)\n");
    let _ = writeln!(
        out,
        "`cargo run --release --example generate -- --model M --max-tokens N --json FILE \
         PROMPT…` through the model runner (continuous batching, f32 weights and activations, \
         every operation on the backend's device), from {}. *prefill*: prompt tokens per \
         second over the steps that computed prompt tokens; *decode*: generated tokens per \
         second over pure-decode steps, all requests of the batch together; *decode steps*: \
         replayed graphs (captured once per padded batch size) or eager launches. Wall \
         clock, including the per-step host work (scheduling, metadata, sampling, the \
         download of the logits, or of the token ids when every request is greedy: the \
         argmax runs on the device). *weight-streaming limit* (`--roofline`): the decode \
         rate if each step only read the weights once at the bandwidth measured right after \
         the run (the CPU's parallel read, a GPU's device copy), all prompts in every step, \
         and the measured decode rate as a fraction of it. *decode step*: the mean wall time \
         of a pure-decode step and, after the slash, the part spent waiting for the device \
         (the rest is host work: scheduling, metadata, uploads, launches).\n",
        sources
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        out,
        "| model | backend | device | prompts | prompt tok | generated | prefill tok/s | decode tok/s | decode steps | decode step µs / device wait | weight-streaming limit | machine | date |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in records {
        let m = &r.machine;
        let machine = match &m.gpu {
            Some(g) => {
                // Clocks after the run: before it the card idles at its lowest clocks.
                let clocks = if g.clocks_after.is_empty() {
                    &g.clocks_before
                } else {
                    &g.clocks_after
                };
                format!("{} (driver {}; {clocks})", g.name, g.driver)
            }
            None => format!("{} ({} threads)", m.cpu_model, m.threads),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {} |",
            r.model,
            r.backend,
            r.device.replace('|', "/"),
            r.prompts,
            r.prompt_tokens,
            r.generated_tokens,
            r.prefill_tokens_per_s,
            r.decode_tokens_per_s,
            if r.graphs { "graphs" } else { "eager" },
            match (r.decode_step_us, r.decode_wait_us) {
                (Some(step), Some(wait)) => format!("{step:.0} / {wait:.0}"),
                _ => "-".into(),
            },
            r.stream_limit()
                .map(|l| format!("{l:.0} tok/s ({:.2}×)", r.decode_tokens_per_s / l.max(1e-9)))
                .unwrap_or_else(|| "-".into()),
            machine.replace('|', "/"),
            m.date
        );
    }
    out
}
