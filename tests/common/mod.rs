//! Test support shared by the integration tests: run one test body on every available
//! backend, skip what a backend cannot run (with the reason), and say so.
//!
//! Every body is written once. [`for_each_backend`] runs it once per available backend;
//! [`for_each_case`] runs it for every case of a grid on every available backend that accepts
//! the case's configuration. Both print a line such as
//!
//! ```text
//! [paged_decode] ran on: CPU (12 cases); skipped: CUDA (backend unavailable: libcuda.so not found)
//! ```
//!
//! and fail when the body ran nowhere, so a test can never pass by skipping everything.
//! Failures are collected (errors and panics alike) and reported together at the end, each
//! with its backend and case label.
//!
//! Known gaps of a backend go in [`FAILURE_CASES`], in the style of wgpu's `FailureCase`:
//! a backend name, an optional body, a predicate on the case, and the reason it is skipped.

#![allow(dead_code)]

/// `println!` that a passing test cannot swallow: it writes to the stderr handle, which
/// libtest does not capture, so skips and coverage lines show in a plain `cargo test`.
#[macro_export]
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use polyattn::{registry, Availability, BackendRef, SelectorConfig};

/// What a body returns: `Err` (or a panic) marks the case as failed.
pub type Outcome = Result<(), Box<dyn std::error::Error>>;

/// What the harness knows about one case when deciding whether a backend should run it.
#[derive(Clone, Debug)]
pub struct CaseInfo {
    /// A short human label, printed on failure ("f16/fp8_e4m3 hd80 bs32 (8,2) mixed").
    pub label: String,
    /// The configuration the case needs; the backend must accept it
    /// (`validate_configuration` empty), else the case is skipped with those reasons.
    pub config: Option<SelectorConfig>,
    /// The case builds cascade metadata (`common_prefix_len > 0`).
    pub cascade: bool,
    /// The case captures graphs: it runs only where the backend's graph-capture level is
    /// `UniformSingleTokenDecode` or above.
    pub graphs: bool,
}

impl CaseInfo {
    /// A case with no configuration requirements.
    pub fn plain(label: impl Into<String>) -> Self {
        CaseInfo {
            label: label.into(),
            config: None,
            cascade: false,
            graphs: false,
        }
    }
}

/// A case a backend is known not to handle, skipped with its reason (after wgpu's
/// `FailureCase`). Fields left at their defaults match everything.
#[derive(Clone, Copy, Debug)]
pub struct FailureCase {
    /// Backend name (case-insensitive); `"*"` matches every backend.
    pub backend: &'static str,
    /// Test body name (a trailing `*` matches a prefix); `None` matches every body.
    pub body: Option<&'static str>,
    /// Predicate on the case; `None` matches every case.
    pub when: Option<fn(&CaseInfo) -> bool>,
    /// Why it is skipped (printed).
    pub reason: &'static str,
}

impl FailureCase {
    /// Every case of every body on `backend`.
    pub const fn backend(backend: &'static str, reason: &'static str) -> Self {
        FailureCase {
            backend,
            body: None,
            when: None,
            reason,
        }
    }

    /// Only in `body`.
    pub const fn body(mut self, body: &'static str) -> Self {
        self.body = Some(body);
        self
    }

    /// Only for cases where `when` holds.
    pub const fn when(mut self, when: fn(&CaseInfo) -> bool) -> Self {
        self.when = Some(when);
        self
    }

    /// Whether it covers `backend` running `case` of `body`.
    pub fn matches(&self, backend: &str, body: &str, case: &CaseInfo) -> bool {
        (self.backend == "*" || self.backend.eq_ignore_ascii_case(backend))
            && self.body.is_none_or(|b| match b.strip_suffix('*') {
                Some(prefix) => body.starts_with(prefix),
                None => b == body,
            })
            && self.when.is_none_or(|f| f(case))
    }
}

/// Known backend gaps, skipped with their reasons. The CPU backend runs every case. A GPU backend that cannot run something yet gets an entry here, e.g.
/// `FailureCase::backend("WGPU", "no f16 storage on lavapipe").when(|c| c.label.contains("f16"))`.
pub const FAILURE_CASES: &[FailureCase] = &[];

/// The first entry of `table` that covers the case, with its reason.
pub fn expected_failure(
    table: &[FailureCase],
    backend: &str,
    body: &str,
    case: &CaseInfo,
) -> Option<&'static str> {
    table
        .iter()
        .find(|f| f.matches(backend, body, case))
        .map(|f| f.reason)
}

#[derive(Default)]
struct Tally {
    unavailable: Option<String>,
    ran: usize,
    skipped: BTreeMap<String, usize>,
}

/// What one body did on each backend.
pub struct Coverage {
    body: String,
    table: &'static [FailureCase],
    backends: Vec<(BackendRef, Tally)>,
    failures: Vec<String>,
}

impl Coverage {
    /// Every registered backend of the global registry, with its availability.
    pub fn new(body: &str) -> Self {
        Self::with_table(body, FAILURE_CASES)
    }

    /// Same, with a given failure table.
    pub fn with_table(body: &str, table: &'static [FailureCase]) -> Self {
        let backends = registry::global()
            .backends()
            .into_iter()
            .map(|b| {
                let tally = Tally {
                    unavailable: match b.availability() {
                        Availability::Available(_) => None,
                        Availability::Unavailable(why) => Some(why),
                    },
                    ..Tally::default()
                };
                (b, tally)
            })
            .collect();
        Coverage {
            body: body.to_string(),
            table,
            backends,
            failures: Vec::new(),
        }
    }

    /// Runs `f` on `backend` for `case` unless the backend rejects the case's configuration
    /// or the failure table skips it. Errors and panics are recorded, not propagated.
    fn run_one(&mut self, idx: usize, case: &CaseInfo, f: impl FnOnce(&BackendRef) -> Outcome) {
        let (backend, tally) = &mut self.backends[idx];
        if tally.unavailable.is_some() {
            return;
        }
        let name = backend.name().to_string();
        // An MLA backend refuses standard attention by design: one reason, not the list of
        // every standard feature it lacks.
        if backend.capabilities().is_mla && !case.config.as_ref().is_some_and(|c| c.use_mla) {
            *tally
                .skipped
                .entry("an MLA backend: the body runs standard attention".into())
                .or_default() += 1;
            return;
        }
        let mut why: Vec<String> = Vec::new();
        if let Some(config) = &case.config {
            why.extend(
                backend
                    .validate_configuration(config)
                    .iter()
                    .map(|r| r.to_string()),
            );
        }
        if case.cascade && !backend.capabilities().supports_cascade {
            why.push("cascade attention not supported".into());
        }
        if case.graphs
            && backend.capabilities().graph_capture
                < polyattn::GraphCaptureSupport::UniformSingleTokenDecode
        {
            why.push(format!(
                "graph capture level {:?}: no captured graphs",
                backend.capabilities().graph_capture
            ));
        }
        if let Some(r) = expected_failure(self.table, &name, &self.body, case) {
            why.push(format!("known failure: {r}"));
        }
        if !why.is_empty() {
            *tally.skipped.entry(why.join("; ")).or_default() += 1;
            return;
        }
        tally.ran += 1;
        let backend = backend.clone();
        let result = catch_unwind(AssertUnwindSafe(|| f(&backend)));
        let validation = vulkan_validation_errors(&backend);
        let msg = match result {
            Ok(Ok(())) if validation.is_empty() => return,
            Ok(Ok(())) => format!(
                "the Vulkan validation layer reported {} error{}: {}",
                validation.len(),
                plural(validation.len()),
                validation.join(" | ")
            ),
            Ok(Err(e)) => e.to_string(),
            Err(panic) => format!(
                "panicked: {}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("<non-string panic>")
            ),
        };
        self.failures
            .push(format!("[{}] {name} / {}: {msg}", self.body, case.label));
    }

    /// The summary line: where the body ran and what it skipped, with reasons.
    pub fn summary(&self) -> String {
        let ran: Vec<String> = self
            .backends
            .iter()
            .filter(|(_, t)| t.ran > 0)
            .map(|(b, t)| format!("{} ({} case{})", b.name(), t.ran, plural(t.ran)))
            .collect();
        let mut skipped: Vec<String> = Vec::new();
        for (b, t) in &self.backends {
            if let Some(why) = &t.unavailable {
                skipped.push(format!("{} (backend unavailable: {why})", b.name()));
            }
            for (why, n) in &t.skipped {
                skipped.push(format!("{} {n} case{} ({why})", b.name(), plural(*n)));
            }
        }
        format!(
            "[{}] ran on: {}; skipped: {}",
            self.body,
            if ran.is_empty() {
                "nothing".to_string()
            } else {
                ran.join(", ")
            },
            if skipped.is_empty() {
                "none".to_string()
            } else {
                skipped.join(", ")
            }
        )
    }

    /// Number of (backend, case) runs.
    pub fn runs(&self) -> usize {
        self.backends.iter().map(|(_, t)| t.ran).sum()
    }

    /// Prints the summary; panics if anything failed or nothing ran.
    pub fn finish(self) {
        let summary = self.summary();
        // Straight to the stderr handle, not `println!`: libtest captures the print macros of
        // passing tests, and the coverage line must show in a plain `cargo test` run.
        report!("{summary}");
        if !self.failures.is_empty() {
            panic!(
                "{summary}\n{} failure{}:\n{}",
                self.failures.len(),
                plural(self.failures.len()),
                self.failures.join("\n")
            );
        }
        assert!(
            self.runs() > 0,
            "{summary}\nthis body ran on no backend: a test that runs nowhere proves nothing"
        );
    }
}

/// The errors the Khronos validation layer reported on `backend`'s Vulkan device since the
/// last call (cleared); empty for other devices, and where validation is off. Tests run in
/// parallel on the one process device, so an error is charged to the case that collects it
/// first — a failure either way.
fn vulkan_validation_errors(backend: &BackendRef) -> Vec<String> {
    match backend.device() {
        Ok(polyattn::Device::Vulkan(d)) => d.take_validation_errors(),
        _ => Vec::new(),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Runs `body` once on every available backend (minus [`FAILURE_CASES`]).
pub fn for_each_backend(body: &str, mut f: impl FnMut(&BackendRef) -> Outcome) {
    let mut cov = Coverage::new(body);
    let case = CaseInfo::plain(body);
    for i in 0..cov.backends.len() {
        cov.run_one(i, &case, &mut f);
    }
    cov.finish();
}

/// Runs `f` for every case on every available backend that accepts it.
pub fn for_each_case<C>(
    body: &str,
    cases: &[C],
    describe: impl Fn(&C) -> CaseInfo,
    f: impl FnMut(&BackendRef, &C) -> Outcome,
) {
    for_each_case_with_table(body, FAILURE_CASES, cases, describe, f)
}

/// [`for_each_case`] with a given failure table (for testing the harness itself).
pub fn for_each_case_with_table<C>(
    body: &str,
    table: &'static [FailureCase],
    cases: &[C],
    describe: impl Fn(&C) -> CaseInfo,
    mut f: impl FnMut(&BackendRef, &C) -> Outcome,
) {
    let mut cov = Coverage::with_table(body, table);
    for i in 0..cov.backends.len() {
        for c in cases {
            let info = describe(c);
            cov.run_one(i, &info, |b| f(b, c));
        }
    }
    cov.finish();
}

/// An error for a failed check, with context.
pub fn fail(msg: impl Into<String>) -> Box<dyn std::error::Error> {
    msg.into().into()
}

/// `Err(fail(..))` unless `cond`.
pub fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Outcome {
    if cond {
        Ok(())
    } else {
        Err(fail(msg()))
    }
}

/// A batch of one request that owns every block of a cache of `num_blocks` blocks of
/// `block_size` tokens and writes `slots` (a cache write at chosen slots, through the public
/// API).
pub fn whole_cache_batch(
    num_blocks: usize,
    block_size: usize,
    slots: Vec<i64>,
) -> polyattn::BatchDescription {
    polyattn::BatchDescription {
        query_start_loc: vec![0, slots.len() as i32],
        seq_lens: vec![slots.len() as i32],
        block_table: (0..num_blocks as i32).collect(),
        max_blocks_per_req: num_blocks,
        slot_mapping: slots,
        causal: true,
        block_size,
        is_prefilling: None,
    }
}

/// A random `kv_b_proj` weight `[N·(qk_nope + v), kv_lora_rank]` for an MLA layer of `p`,
/// scaled by `1/sqrt(kv_lora_rank)` (so attention scores stay O(1)).
pub fn mla_kv_b_proj(p: &polyattn::mla::MlaParams, rng: &mut polyattn::rng::Rng) -> Vec<f32> {
    let l = p.kv_lora_rank;
    rng.normals(p.num_heads * (p.qk_nope_head_dim + p.v_head_dim) * l)
        .into_iter()
        .map(|x| x / (l as f32).sqrt())
        .collect()
}
