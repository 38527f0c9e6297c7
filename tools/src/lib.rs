//! # polyattn-tools
//!
//! The tools around the [`polyattn`] library, kept out of it so that a crate depending on
//! `polyattn` compiles no command-line parser, progress bar or chart code:
//!
//! - the `polyattn` binary: `info` (what runs here and why), `check` (one random batch on
//!   every backend against the f64 reference), `fuzz` (seeded random valid and invalid
//!   batches) and `bench`;
//! - [`bench`](mod@bench), the benchmark harness behind `polyattn bench` and `cargo bench`: the shape
//!   table, the CPU's ceilings, the timing loop, reports, JSON, the roofline chart and
//!   `benches/RESULTS.md`. The device probes it uses (GPU ceilings and timers) are the
//!   library's ([`polyattn::probe`] and each GPU backend's `probes`);
//! - the `generate` example (`cargo run --release --example generate`): a Llama-family model
//!   generating text through polyattn on any backend.

pub mod bench;
