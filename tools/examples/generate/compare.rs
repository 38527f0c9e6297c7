//! `generate --backends all` (or a list of names): the same prompts on every backend, one
//! after the other, then a table — backend, device, prefill and decode tokens/s, and whether
//! each backend's tokens equal the first one's. The mission in one command: identical model
//! code on every device of the machine.

use polyattn::backend::Availability;
use polyattn::runner::{CausalLm, ModelRunner, RunnerConfig, SamplingParams};
use polyattn::BackendRef;

use crate::model::Llama;
use crate::Loaded;

/// One backend's run.
#[derive(Debug)]
pub struct Comparison {
    /// The backend's name.
    pub backend: String,
    /// What ran: the device and the speeds, or why the backend did not run.
    pub outcome: Result<Run, String>,
}

/// A backend's tokens and speed.
#[derive(Debug)]
pub struct Run {
    /// The device, as the runtime describes it.
    pub device: String,
    /// Generated tokens per prompt.
    pub tokens: Vec<Vec<u32>>,
    /// Prompt tokens per second of prefill steps.
    pub prefill_tokens_per_s: f64,
    /// Generated tokens per second of decode steps.
    pub decode_tokens_per_s: f64,
    /// Whether decode steps replayed captured graphs.
    pub graphs: bool,
}

/// The backends `spec` names: `all` (every registered backend that is not an MLA one,
/// ranked as the selector ranks them; unavailable ones are reported, not run) or a comma-
/// separated list of names, in that order.
pub fn backends(spec: &str) -> Result<Vec<BackendRef>, String> {
    let registry = polyattn::registry::global();
    if spec.trim().eq_ignore_ascii_case("all") {
        let mut all: Vec<BackendRef> = registry
            .backends()
            .into_iter()
            .filter(|b| !b.capabilities().is_mla)
            .collect();
        all.sort_by_key(|b| b.priority());
        return Ok(all);
    }
    spec.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            registry.get(n).ok_or_else(|| {
                let names: Vec<String> = registry
                    .backends()
                    .iter()
                    .map(|b| b.name().to_string())
                    .collect();
                format!("unknown backend '{n}' (registered: {})", names.join(", "))
            })
        })
        .collect()
}

/// Runs `prompts` with `params` on each of `backends`, a warm-up request first unless
/// `warmup` is false (so tokens/s measure the steady state, not kernel compilation).
pub fn compare(
    loaded: &Loaded,
    backends: &[BackendRef],
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    runner: &RunnerConfig,
    warmup: bool,
) -> Vec<Comparison> {
    backends
        .iter()
        .map(|b| Comparison {
            backend: b.name().to_string(),
            outcome: run_one(loaded, b, prompts, params, runner, warmup),
        })
        .collect()
}

fn run_one(
    loaded: &Loaded,
    backend: &BackendRef,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    runner: &RunnerConfig,
    warmup: bool,
) -> Result<Run, String> {
    if let Availability::Unavailable(why) = backend.availability() {
        return Err(format!("unavailable: {why}"));
    }
    let model = Llama::load(
        loaded.config.clone(),
        loaded.weights.clone(),
        Some(backend.clone()),
    )
    .map_err(|e| e.to_string())?;
    let device = model.device().description();
    let mut runner = ModelRunner::new(model, runner.clone()).map_err(|e| e.to_string())?;
    if warmup {
        let first = prompts
            .first()
            .and_then(|p| p.first())
            .copied()
            .unwrap_or(0);
        runner
            .generate(&[vec![first; 2]], &SamplingParams::greedy(3))
            .map_err(|e| format!("warm-up: {e}"))?;
        runner.reset_stats();
    }
    let tokens = runner
        .generate(prompts, params)
        .map_err(|e| e.to_string())?;
    debug_assert_eq!(CausalLm::backend(runner.model()).name(), backend.name());
    let stats = runner.stats();
    Ok(Run {
        device,
        tokens,
        prefill_tokens_per_s: stats.prefill_tokens_per_s(),
        decode_tokens_per_s: stats.decode_tokens_per_s(),
        graphs: runner.uses_graphs(),
    })
}

/// The first position where `a` and `b` differ: (prompt, token), or `None` when equal.
fn first_difference(a: &[Vec<u32>], b: &[Vec<u32>]) -> Option<(usize, usize)> {
    for (p, (x, y)) in a.iter().zip(b).enumerate() {
        if let Some(t) = x.iter().zip(y).position(|(u, v)| u != v) {
            return Some((p, t));
        }
        if x.len() != y.len() {
            return Some((p, x.len().min(y.len())));
        }
    }
    (a.len() != b.len()).then_some((a.len().min(b.len()), 0))
}

/// The comparison as a plain-text table; tokens are compared with the first backend that ran.
pub fn table(rows: &[Comparison]) -> String {
    let first = rows.iter().find_map(|r| {
        r.outcome
            .as_ref()
            .ok()
            .map(|run| (r.backend.as_str(), &run.tokens))
    });
    let mut lines = vec![format!(
        "{:<10} {:>14} {:>14} {:>7}  {:<28} {}",
        "backend", "prefill tok/s", "decode tok/s", "steps", "tokens", "device"
    )];
    for r in rows {
        match &r.outcome {
            Ok(run) => {
                let same = match first {
                    Some((name, _)) if name == r.backend => "(the reference)".to_string(),
                    Some((name, want)) => match first_difference(want, &run.tokens) {
                        None => format!("equal to {name}'s"),
                        Some((p, t)) => format!("differ: prompt {}, token {t}", p + 1),
                    },
                    None => String::new(),
                };
                lines.push(format!(
                    "{:<10} {:>14.1} {:>14.1} {:>7}  {:<28} {}",
                    r.backend,
                    run.prefill_tokens_per_s,
                    run.decode_tokens_per_s,
                    if run.graphs { "graphs" } else { "eager" },
                    same,
                    run.device
                ));
            }
            Err(why) => lines.push(format!(
                "{:<10} {:>14} {:>14} {:>7}  {why}",
                r.backend, "-", "-", "-"
            )),
        }
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_are_located() {
        let a = vec![vec![1, 2, 3], vec![4, 5]];
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(
            first_difference(&a, &[vec![1, 2, 3], vec![4, 6]]),
            Some((1, 1))
        );
        assert_eq!(first_difference(&a, &[vec![1, 2]]), Some((0, 2)));
    }

    #[test]
    fn the_embedded_model_compares_on_every_available_backend() {
        let tiny = crate::load_tiny().unwrap();
        let all = backends("all").unwrap();
        assert!(all.iter().any(|b| b.name() == "CPU"));
        assert!(all.iter().all(|b| !b.capabilities().is_mla));
        let prompts = vec![tiny.tokenizer.encode("Once upon a time").unwrap()];
        let rows = compare(
            &tiny,
            &all,
            &prompts,
            &SamplingParams::greedy(12),
            &RunnerConfig::default(),
            false,
        );
        assert_eq!(rows.len(), all.len());
        let text = table(&rows);
        eprintln!("{text}");
        let ran: Vec<&Comparison> = rows.iter().filter(|r| r.outcome.is_ok()).collect();
        assert!(ran.iter().any(|r| r.backend == "CPU"), "{text}");
        // Greedy tokens are the same on every backend that ran (as the identity test says).
        for r in &ran {
            assert_eq!(r.outcome.as_ref().unwrap().tokens[0].len(), 12);
            assert!(!text.contains("differ:"), "{text}");
            assert!(text.contains(&r.backend));
        }
        // Unavailable backends are in the table with their reason.
        for r in rows.iter().filter(|r| r.outcome.is_err()) {
            assert!(
                text.contains(r.outcome.as_ref().unwrap_err().as_str()),
                "{text}"
            );
        }
        assert!(backends("CPU, cpu").unwrap().len() == 2);
        match backends("no-such") {
            Err(e) => assert!(e.contains("unknown backend 'no-such'"), "{e}"),
            Ok(_) => panic!("an unknown name must be an error"),
        }
    }
}
