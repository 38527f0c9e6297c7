//! `polyattn`: what runs here (`info`), is it right (`check`, `fuzz`), how fast (`bench`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

/// polyattn: one attention layer, native kernels on every GPU API and the CPU.
#[derive(Parser, Debug)]
#[command(name = "polyattn", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every backend: available or why not; which one a configuration selects and why.
    Info(cli::info::InfoArgs),
    /// One random batch on every available backend, checked against the f64 reference.
    Check(cli::check::CheckArgs),
    /// Seeded random valid batches against the reference and invalid inputs that must be
    /// typed errors, for a number of cases or seconds; exits non-zero on any failure.
    Fuzz(cli::fuzz::FuzzArgs),
    /// Benchmarks on the perf-anchor shapes, with fractions of the ceilings measured in the
    /// same run (`--json`, an SVG roofline, `--compare` with the PyTorch reference).
    Bench(Box<polyattn_tools::bench::BenchArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::log::init();
    let result = match &cli.command {
        Command::Info(a) => cli::info::run(a),
        Command::Check(a) => cli::check::run(a),
        Command::Fuzz(a) => cli::fuzz::run(a),
        Command::Bench(a) => polyattn_tools::bench::run(a).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
