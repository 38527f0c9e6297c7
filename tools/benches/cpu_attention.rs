//! The benchmark entry point of `cargo bench`: the same arguments and code as
//! `polyattn bench` (`polyattn_tools::bench`), with `--backend cpu --shapes C` as defaults.
//!
//! ```text
//! cargo bench --bench cpu_attention                                   # C set on the CPU
//! cargo bench --bench cpu_attention -- --shapes C.D1.s4k --json bench-out/cpu.json
//! ```

use std::process::ExitCode;

use clap::Parser;
use polyattn_tools::bench::{run, BenchArgs};

/// `cpu_attention`: polyattn's benchmark harness (see `polyattn bench --help`).
#[derive(Parser, Debug)]
#[command(name = "cpu_attention")]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; the defaults differ from `polyattn bench` (backend).
    let mut argv: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    if !argv
        .iter()
        .any(|a| a == "--backend" || a.starts_with("--backend="))
    {
        argv.extend(["--backend".to_string(), "cpu".to_string()]);
    }
    let cli = Cli::parse_from(argv);
    match run(&cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
