//! `polyattn fuzz`: the seeded fuzzer of `polyattn::testing::fuzz` for minutes (the long
//! form of `tests/fuzz.rs`): random valid batches against the f64 reference and random
//! invalid inputs that must be typed errors, on one backend or every available one.
//!
//! Case `i` of a run with `--seed S` uses seed `S + i`; a failing case prints the command
//! that reruns it alone (`--seed <case seed> --iterations 1`).

use std::time::{Duration, Instant};

use clap::Args;
use polyattn::selector::{self, BACKEND_ENV};
use polyattn::testing::fuzz::{self, Profile, Tally, Verdict};
use polyattn::{Error, Result};

/// Arguments of `polyattn fuzz`.
#[derive(Args, Debug)]
pub struct FuzzArgs {
    /// Only this backend (default: the one `POLYATTN_BACKEND` forces, else every available
    /// backend in turn, each for the whole budget).
    #[arg(long)]
    backend: Option<String>,
    /// Run for this many seconds per backend (the case in progress finishes).
    #[arg(long, conflicts_with = "iterations")]
    seconds: Option<f64>,
    /// Run this many cases per backend (default 500 when neither limit is given).
    #[arg(long)]
    iterations: Option<u64>,
    /// Base seed: case i uses seed + i.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Batch sizes: `long` (default) or `ci` (the small batches of tests/fuzz.rs).
    #[arg(long, default_value = "long", value_parser = parse_profile)]
    profile: Profile,
    /// Print a progress line every this many cases.
    #[arg(long, default_value_t = 50)]
    progress: u64,
    /// Print every case, not only failures.
    #[arg(long)]
    verbose: bool,
}

fn parse_profile(s: &str) -> std::result::Result<Profile, String> {
    s.parse().map_err(|e: Error| e.to_string())
}

/// When a backend's run stops.
enum Budget {
    Cases(u64),
    Time(Duration),
}

/// Runs the fuzzer; returns false when any case failed or nothing passed.
pub fn run(args: &FuzzArgs) -> Result<bool> {
    let list = super::run_on(
        args.backend
            .clone()
            .or_else(selector::forced_backend_from_env),
    )?;
    if list.is_empty() {
        println!("polyattn fuzz: no backend is available");
        return Ok(false);
    }
    let budget = match (args.seconds, args.iterations) {
        (Some(s), _) if s.is_finite() && s > 0.0 => Budget::Time(Duration::from_secs_f64(s)),
        (Some(s), _) => {
            return Err(Error::Config(format!(
                "--seconds {s} must be a positive number"
            )))
        }
        (None, Some(n)) => Budget::Cases(n),
        (None, None) => Budget::Cases(500),
    };
    println!(
        "polyattn fuzz: profile {}, base seed {}, {} per backend{}",
        args.profile,
        args.seed,
        match &budget {
            Budget::Cases(n) => format!("{n} cases"),
            Budget::Time(d) => format!("{:.0} s", d.as_secs_f64()),
        },
        if args.backend.is_none() && selector::forced_backend_from_env().is_some() {
            format!(" ({BACKEND_ENV} forces the backend)")
        } else {
            String::new()
        }
    );
    let progress = args.progress.max(1);
    let mut total = Tally::default();
    for b in &list {
        let name = b.name().to_string();
        println!("[{name}] {}", b.device()?.description());
        let start = Instant::now();
        let mut tally = Tally::default();
        let mut i = 0u64;
        loop {
            let done = match budget {
                Budget::Cases(n) => i >= n,
                Budget::Time(d) => start.elapsed() >= d,
            };
            if done {
                break;
            }
            let seed = fuzz::case_seed(args.seed, i);
            let report = fuzz::run_case(b.as_ref(), seed, args.profile);
            tally.add(&report);
            match &report.verdict {
                Verdict::Fail(_) => {
                    println!("[{name}] {report}");
                    println!(
                        "[{name}]   rerun: {}",
                        fuzz::reproduce_command(&name, seed, args.profile)
                    );
                }
                _ if args.verbose => println!("[{name}] {report}"),
                _ => {}
            }
            i += 1;
            if i.is_multiple_of(progress) {
                println!(
                    "[{name}] {i} cases: {} passed, {} failed, {} skipped ({:.1} s)",
                    tally.passed,
                    tally.failed,
                    tally.skipped,
                    start.elapsed().as_secs_f64()
                );
            }
        }
        println!(
            "[{name}] done: {} passed, {} failed, {} skipped in {:.1} s",
            tally.passed,
            tally.failed,
            tally.skipped,
            start.elapsed().as_secs_f64()
        );
        total.passed += tally.passed;
        total.failed += tally.failed;
        total.skipped += tally.skipped;
        total.failures.extend(tally.failures);
    }
    println!();
    if !total.failures.is_empty() {
        println!("failed seeds:");
        for f in &total.failures {
            println!("  {f}");
        }
    }
    println!(
        "{} passed, {} failed ({} skipped)",
        total.passed, total.failed, total.skipped
    );
    Ok(total.failed == 0 && total.passed > 0)
}
