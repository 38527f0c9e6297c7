//! `polyattn bench`: the shape table of `perf-anchors.md` §10 on any backend the selector can
//! give, with the two ceilings measured in the same run, the roofline fraction of every row,
//! a readable table, JSON, an SVG roofline, the comparison with the PyTorch reference on the
//! same card, and `benches/RESULTS.md` generated from JSON.
//!
//! ```text
//! polyattn bench --backend cpu --shapes C --json bench-out/cpu.json
//! polyattn bench --shapes P2,D1 --dtype bf16 --json cuda.json --compare torch.json
//! polyattn bench --from cpu.json --from cuda.json --from torch.json \
//!     --results-md benches/RESULTS.md --svg benches/roofline.svg
//! ```
//!
//! What is timed: prefill and decode rows time `AttentionImpl::forward` with no new keys or
//! values (the cache already holds them), so the region is attention only; K rows time
//! `do_kv_cache_update`; G rows `ops::merge_attn_states`. Metadata is built once per input set,
//! outside the timed region, and the repetitions rotate through several input sets (at least
//! two, more until they span 256 MB) so that caches do not flatter the result. On the CPU the C
//! set also runs the naive GEMM-softmax reference (`cpu-naive`, f32 rows up to
//! `--naive-max-gflop`), the floor to beat (§7). Slow rows stop after three repetitions once
//! `--cap` seconds were spent timing them, so the C set takes a few minutes on 2 cores.
//!
//! Rows are printed on stdout as each finishes, and the `--json` file is rewritten whole
//! (atomically) after each one, so a run stopped part-way keeps every finished row
//! ([`sink`]); `--quiet` silences only the progress bar on stderr.
//!
//! Modules: [`shapes`] (the table), [`formulas`] (§8), [`timing`], [`peaks`], [`inputs`],
//! [`naive`], [`report`], [`sink`], [`chart`], [`machine`]. The device probes (GPU ceilings,
//! region timers) are the library's: [`polyattn::probe`]. The progress bar is `indicatif`'s.

pub mod chart;
pub mod dcp;
pub mod formulas;
pub mod generation;
pub mod inputs;
pub mod machine;
pub mod naive;
pub mod peaks;
pub mod report;
pub mod shapes;
pub mod sink;
pub mod timing;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use polyattn::backend::{AttentionBackend, BackendRef, SelectorConfig};
use polyattn::device::{Device, DeviceKind};
use polyattn::dtype::{CacheDType, DType};
use polyattn::error::{Error, Result};
use polyattn::registry;
use polyattn::selector;

use formulas::roofline;
use machine::Machine;
use polyattn::probe::{Peaks, ProbeConfig};
use report::{BenchFile, Row, Status, SCHEMA};
use shapes::{Case, Family};
use timing::{Samples, TimingConfig};

/// Arguments of `polyattn bench` (also parsed by `benches/cpu_attention.rs`).
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct BenchArgs {
    /// Backends to run, comma-separated: registry names (`cpu`), `auto` (the selector's choice
    /// per case, honouring POLYATTN_BACKEND) or `all` (every available backend).
    #[arg(long, default_value = "auto")]
    pub backend: String,

    /// Shapes, comma-separated: groups of perf-anchors §10 (P1–P5, D1–D5, M, K, G, C), DCP
    /// (decode context parallelism), case ids (`--list` prints them) or `all` (every group
    /// but C and DCP).
    #[arg(long, default_value = "C")]
    pub shapes: String,

    /// Activation dtypes (f32, f16, bf16), comma-separated; default: each case's own (bf16 for
    /// the GPU groups, f32 for C).
    #[arg(long, value_delimiter = ',', value_parser = parse_dtype)]
    pub dtype: Vec<DType>,

    /// KV-cache dtypes (auto, f16, bf16, fp8_e4m3, fp8_e5m2), comma-separated; default: each
    /// case's own (auto; D1 adds fp8_e4m3, C adds f16).
    #[arg(long = "kv-dtype", value_delimiter = ',', value_parser = parse_kv_dtype)]
    pub kv_dtype: Vec<CacheDType>,

    /// Writes this run's results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Writes the roofline chart here (SVG).
    #[arg(long, default_value = "bench-out/roofline.svg")]
    pub svg: PathBuf,

    /// Writes no chart.
    #[arg(long)]
    pub no_svg: bool,

    /// Reads results from these JSON files instead of running (repeatable): to print, compare,
    /// chart or write RESULTS.md from earlier runs.
    #[arg(long)]
    pub from: Vec<PathBuf>,

    /// Prints our ratio to each reference in these JSON files (benches/reference_sdpa.py).
    #[arg(long)]
    pub compare: Vec<PathBuf>,

    /// Writes RESULTS.md (latest numbers per backend, with machine and ceilings) from this
    /// run's or the --from files' results, plus the --compare files.
    #[arg(long)]
    pub results_md: Option<PathBuf>,

    /// Adds the "Model generation" section to RESULTS.md from these JSON-lines files (written
    /// by `cargo run --example generate -- --json FILE`; repeatable).
    #[arg(long)]
    pub generation: Vec<PathBuf>,

    /// Appends these hand-written Markdown files to RESULTS.md, in order (runs that are not
    /// benchmark rows: sanitizer and fuzzer runs on a GPU, with their card and date; repeatable).
    #[arg(long)]
    pub notes: Vec<PathBuf>,

    /// Prints the selected cases and exits.
    #[arg(long)]
    pub list: bool,

    /// Writes the selected cases (shape, default dtypes, FLOP and element counts) as JSON and
    /// exits: the table benches/reference_sdpa.py reads.
    #[arg(long)]
    pub dump_shapes: Option<PathBuf>,

    /// Warm-up calls per row (a call longer than --budget ends the warm-up).
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,

    /// Seconds the warm-up of a GPU row lasts at least (more calls than --warmup when
    /// needed). Why: a GPU left idle while a row's inputs are prepared drops to idle clocks,
    /// and without a CUDA context in the process (WGPU-only runs on the H200, 2026-11-30)
    /// the driver did not raise them again within a 0.3 s timing budget: rows ran 5x slower.
    #[arg(long, default_value_t = 1.0)]
    pub gpu_warmup_secs: f64,

    /// Timed repetitions at least, per row.
    #[arg(long, default_value_t = 5)]
    pub min_reps: usize,

    /// Timed repetitions at most, per row.
    #[arg(long, default_value_t = 1000)]
    pub max_reps: usize,

    /// Seconds of timed repetitions per row (after --min-reps).
    #[arg(long, default_value_t = 1.0)]
    pub budget: f64,

    /// Seconds after which a slow row stops repeating (once it has 3 repetitions).
    #[arg(long, default_value_t = 20.0)]
    pub cap: f64,

    /// Input sets to rotate through (default: at least 2, more until they span 256 MB, at
    /// most 8).
    #[arg(long)]
    pub sets: Option<usize>,

    /// Skips rows whose input sets need more than this many GB (default: half the memory
    /// available now, for the CPU).
    #[arg(long)]
    pub max_gb: Option<f64>,

    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Skips the naive GEMM-softmax CPU reference rows of the C set.
    #[arg(long)]
    pub no_naive: bool,

    /// Runs the naive reference only on rows of at most this many GFLOP (it is slow).
    #[arg(long, default_value_t = 40.0)]
    pub naive_max_gflop: f64,

    /// Trials of each ceiling probe (best kept).
    #[arg(long, default_value_t = 5)]
    pub probe_trials: usize,

    /// No progress bar on stderr (rows are still printed on stdout as they finish).
    #[arg(long)]
    pub quiet: bool,

    /// Single-token decode rows on backends with graphs (graph-capture level
    /// `UniformSingleTokenDecode` or above: CUDA, VULKAN) time the replay of a captured
    /// forward instead of the forward call: the step a runner that captures its decode steps
    /// pays. Their timer text says so.
    #[arg(long)]
    pub graphs: bool,
}

/// An [`Error::Config`] with `msg`: a bad argument, a malformed input file.
pub(crate) fn config_error(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}

fn parse_dtype(s: &str) -> std::result::Result<DType, String> {
    s.parse::<DType>().map_err(|e| e.to_string())
}

fn parse_kv_dtype(s: &str) -> std::result::Result<CacheDType, String> {
    s.parse::<CacheDType>().map_err(|e| e.to_string())
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            backend: "auto".into(),
            shapes: "C".into(),
            dtype: Vec::new(),
            kv_dtype: Vec::new(),
            json: None,
            svg: PathBuf::from("bench-out/roofline.svg"),
            no_svg: false,
            from: Vec::new(),
            compare: Vec::new(),
            results_md: None,
            generation: Vec::new(),
            notes: Vec::new(),
            list: false,
            dump_shapes: None,
            warmup: 3,
            gpu_warmup_secs: 1.0,
            min_reps: 5,
            max_reps: 1000,
            budget: 1.0,
            cap: 20.0,
            sets: None,
            max_gb: None,
            seed: 0,
            no_naive: false,
            naive_max_gflop: 40.0,
            probe_trials: 5,
            quiet: false,
            graphs: false,
        }
    }
}

/// Runs `polyattn bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    if args.list || args.dump_shapes.is_some() {
        let cases = shapes::select(&args.shapes)?;
        if let Some(path) = &args.dump_shapes {
            let recs: Vec<shapes::CaseRecord> =
                cases.iter().map(shapes::CaseRecord::from).collect();
            let text = serde_json::to_string_pretty(&recs)
                .map_err(|e| config_error(format!("JSON: {e}")))?;
            report::write_file(path, &(text + "\n"))?;
            eprintln!("wrote {} cases to {}", recs.len(), path.display());
        }
        if args.list {
            for c in &cases {
                let t = c.traffic();
                let dt: Vec<String> = c.dtypes.iter().map(|(a, k)| format!("{a}/{k}")).collect();
                println!(
                    "{:<24} {:<8} {:<58} {:>9.3} GFLOP {:>9.1} MB(bf16)  {}",
                    c.id,
                    c.family.as_str(),
                    c.describe(),
                    t.flops / 1e9,
                    t.bytes(2, 2) / 1e6,
                    dt.join(",")
                );
            }
        }
        return Ok(());
    }

    let mut files: Vec<BenchFile> = Vec::new();
    let mut sources: Vec<String> = Vec::new();
    if args.from.is_empty() {
        // Prints each row as it finishes and keeps the --json file current.
        let file = run_benchmarks(args)?;
        if let Some(path) = &args.json {
            eprintln!("wrote {}", path.display());
            sources.push(path.display().to_string());
        } else {
            sources.push("this run".into());
        }
        files.push(file);
    } else {
        for p in &args.from {
            let f = BenchFile::load(p)?;
            print!("{}", report::table(&f));
            files.push(f);
            sources.push(p.display().to_string());
        }
    }

    let mut refs: Vec<BenchFile> = Vec::new();
    for p in &args.compare {
        refs.push(BenchFile::load(p)?);
        sources.push(p.display().to_string());
    }
    let ratios = (!refs.is_empty()).then(|| {
        let ours: Vec<Row> = files.iter().flat_map(|f| f.rows.iter().cloned()).collect();
        let theirs: Vec<Row> = refs.iter().flat_map(|f| f.rows.iter().cloned()).collect();
        report::compare(&ours, &theirs)
    });
    if let Some(r) = &ratios {
        println!();
        print!("{r}");
    }

    let all: Vec<&BenchFile> = files.iter().chain(refs.iter()).collect();
    if !args.no_svg {
        // RESULTS.md shows the latest run per backend; the chart then shows the same rows.
        let (peaks, rows): (Vec<Peaks>, Vec<Row>) = if args.results_md.is_some() {
            let owned: Vec<BenchFile> = all.iter().map(|f| (*f).clone()).collect();
            let latest = report::latest_per_backend(&owned);
            let mut peaks: Vec<Peaks> = Vec::new();
            let mut rows: Vec<Row> = Vec::new();
            for (b, f) in latest {
                rows.extend(f.rows.iter().filter(|r| r.backend == b).cloned());
                peaks.extend(f.peaks.iter().cloned());
            }
            (peaks, rows)
        } else {
            (
                all.iter().flat_map(|f| f.peaks.iter().cloned()).collect(),
                all.iter().flat_map(|f| f.rows.iter().cloned()).collect(),
            )
        };
        let mut unique: Vec<Peaks> = Vec::new();
        for p in peaks {
            if !unique.contains(&p) {
                unique.push(p);
            }
        }
        let svg = chart::roofline_svg(
            &unique,
            &rows,
            "polyattn roofline (measured ceilings, perf-anchors §8)",
        )?;
        report::write_file(&args.svg, &svg)?;
        eprintln!("wrote {}", args.svg.display());
    }
    if let Some(md_path) = &args.results_md {
        let owned: Vec<BenchFile> = all.iter().map(|f| (*f).clone()).collect();
        let chart_rel = (!args.no_svg).then(|| relative_to(&args.svg, md_path));
        let cmd = command_line();
        let mut md = report::results_md(
            &owned,
            &sources,
            &cmd,
            chart_rel.as_deref(),
            ratios.as_deref(),
        );
        if !args.generation.is_empty() {
            let mut records = Vec::new();
            for p in &args.generation {
                records.extend(generation::GenerationRecord::read_all(p)?);
            }
            let names: Vec<String> = args
                .generation
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            md.push('\n');
            md.push_str(&generation::section(&records, &names));
        }
        for p in &args.notes {
            let text = std::fs::read_to_string(p).map_err(|source| Error::Io {
                path: p.display().to_string(),
                source,
            })?;
            md.push('\n');
            md.push_str(text.trim_end());
            md.push('\n');
        }
        report::write_file(md_path, &md)?;
        eprintln!("wrote {}", md_path.display());
    }
    Ok(())
}

/// `svg` as a link from the folder of `md`: a path relative to that folder when both are
/// relative, else `svg` as given.
fn relative_to(svg: &std::path::Path, md: &std::path::Path) -> String {
    use std::path::Component;
    let md_dir = md.parent().unwrap_or(std::path::Path::new(""));
    if let Ok(p) = svg.strip_prefix(md_dir) {
        return p.display().to_string();
    }
    let plain = |p: &std::path::Path| {
        p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    };
    if plain(svg) && plain(md_dir) {
        let up = md_dir
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .count();
        return format!("{}{}", "../".repeat(up), svg.display());
    }
    svg.display().to_string()
}

/// Appends to a timed row's note the kernel switches of its backend that were set for the
/// run (`POLYATTN_CUDA_*` for `CUDA` rows, `POLYATTN_WGPU_*` for `WGPU` rows, …). Why: tuning
/// runs set these variables, and a row measured with a non-default kernel must say so in
/// RESULTS.md instead of passing for the default.
fn label_kernel_switches(row: &mut report::Row, vars: impl Iterator<Item = (String, String)>) {
    if row.status != report::Status::Ok {
        return;
    }
    let prefix = format!("POLYATTN_{}_", row.backend.to_ascii_uppercase());
    let mut set: Vec<String> = vars
        .filter(|(k, _)| k.starts_with(&prefix) && k != "POLYATTN_CUDA_DEVICE")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if set.is_empty() {
        return;
    }
    set.sort();
    let with = format!("with {}", set.join(" "));
    row.note = Some(match row.note.take() {
        Some(n) => format!("{n}; {with}"),
        None => with,
    });
}

/// The command line, with the program's folder dropped and a `cargo bench` binary
/// (`cpu_attention-<hash>`) named as cargo runs it.
fn command_line() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        let name = std::path::Path::new(first.as_str())
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        *first = match name.rsplit_once('-') {
            Some((bench, hash))
                if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                format!("cargo bench --bench {bench} --")
            }
            _ => name,
        };
    }
    args.retain(|a| a != "--bench");
    args.join(" ")
}

/// Which backends a row runs on.
enum BackendChoice {
    /// The selector's choice per case.
    Auto,
    /// These, each validated per case.
    Named(Vec<BackendRef>),
}

fn resolve_backends(spec: &str) -> Result<BackendChoice> {
    let reg = registry::global();
    let names: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if names.is_empty() || names.iter().any(|n| n.eq_ignore_ascii_case("auto")) {
        return Ok(BackendChoice::Auto);
    }
    if names.iter().any(|n| n.eq_ignore_ascii_case("all")) {
        let v: Vec<BackendRef> = reg
            .backends()
            .into_iter()
            .filter(|b| b.availability().is_available())
            .collect();
        return Ok(BackendChoice::Named(v));
    }
    let mut v = Vec::new();
    for n in names {
        let b = reg.get(n).ok_or_else(|| Error::UnknownBackend {
            name: n.to_string(),
            valid: reg.names(),
        })?;
        v.push(b);
    }
    Ok(BackendChoice::Named(v))
}

fn selector_config(case: &Case, dtype: DType, kv: CacheDType) -> SelectorConfig {
    let mut c = SelectorConfig::new(case.head_size, dtype, kv);
    c.block_size = Some(case.block_size as u32);
    c.use_mla = case.family == Family::Mla;
    c.use_non_causal = case.family.is_attention() && !case.causal;
    c
}

/// The backends one row runs on, or why none.
fn backends_for(
    choice: &BackendChoice,
    case: &Case,
    dtype: DType,
    kv: CacheDType,
) -> Vec<std::result::Result<BackendRef, (String, String)>> {
    let config = selector_config(case, dtype, kv);
    match choice {
        BackendChoice::Auto => {
            if case.family == Family::Merge {
                // Merging needs a device, not a kernel configuration: the best available one.
                let forced = selector::forced_backend_from_env();
                let reg = registry::global();
                let b = match forced {
                    Some(n) => reg.get(&n),
                    None => reg
                        .backends()
                        .into_iter()
                        .find(|b| b.availability().is_available()),
                };
                return vec![
                    b.ok_or_else(|| ("auto".to_string(), "no available backend".to_string()))
                ];
            }
            vec![selector::get_attn_backend(&config)
                .map_err(|e| ("auto".to_string(), e.to_string()))]
        }
        BackendChoice::Named(list) => list
            .iter()
            .map(|b| {
                if let polyattn::backend::Availability::Unavailable(why) = b.availability() {
                    return Err((b.name().to_string(), format!("backend unavailable: {why}")));
                }
                if case.family != Family::Merge {
                    let reasons = b.validate_configuration(&config);
                    if !reasons.is_empty() {
                        let r: Vec<String> = reasons.iter().map(|r| r.to_string()).collect();
                        return Err((b.name().to_string(), r.join("; ")));
                    }
                }
                Ok(b.clone())
            })
            .collect(),
    }
}

/// Memory the machine has available now, bytes (Linux), for the default guard.
fn mem_available() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: f64 = s
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024.0)
}

/// Progress on stderr: indicatif's bar on a terminal; elsewhere (a log file, a pipe), where
/// indicatif draws nothing, one line per step.
struct Progress {
    bar: ProgressBar,
    quiet: bool,
}

impl Progress {
    fn new(total: usize, quiet: bool) -> Self {
        let target = if quiet {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        let bar = ProgressBar::with_draw_target(Some(total as u64), target);
        if let Ok(style) = ProgressStyle::with_template("[{bar:28}] {pos}/{len} {elapsed} {msg}") {
            bar.set_style(style.progress_chars("#>."));
        }
        Progress { bar, quiet }
    }

    fn show(&self, what: &str) {
        if self.quiet {
            return;
        }
        if self.bar.is_hidden() {
            let el = self.bar.elapsed().as_secs();
            eprintln!(
                "[{}/{} {:02}:{:02}] {what}",
                self.bar.position(),
                self.bar.length().unwrap_or(0),
                el / 60,
                el % 60
            );
        } else {
            self.bar.set_message(what.to_string());
        }
    }

    fn step(&mut self) {
        self.bar.inc(1);
    }

    /// Runs `f` (which prints a row on stdout, or a warning) with the bar cleared from the
    /// terminal, and draws it again after.
    fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    fn finish(&self) {
        self.bar.finish();
    }
}

/// One unit of work: a case in one dtype pair on one backend (or why not).
struct Job {
    case: Case,
    dtype: DType,
    kv: CacheDType,
    backend: std::result::Result<BackendRef, (String, String)>,
    naive: bool,
}

fn plan(args: &BenchArgs, cases: &[Case], choice: &BackendChoice) -> Vec<Job> {
    let mut jobs = Vec::new();
    for case in cases {
        let pairs: Vec<(DType, CacheDType)> = if args.dtype.is_empty() && args.kv_dtype.is_empty() {
            case.dtypes.clone()
        } else {
            let acts: Vec<DType> = if args.dtype.is_empty() {
                let mut v: Vec<DType> = case.dtypes.iter().map(|p| p.0).collect();
                v.dedup();
                v
            } else {
                args.dtype.clone()
            };
            let kvs: Vec<CacheDType> = if args.kv_dtype.is_empty() {
                let mut v: Vec<CacheDType> = case.dtypes.iter().map(|p| p.1).collect();
                v.dedup();
                v
            } else {
                args.kv_dtype.clone()
            };
            acts.iter()
                .flat_map(|&a| kvs.iter().map(move |&k| (a, k)))
                .collect()
        };
        for (dtype, kv) in pairs {
            for b in backends_for(choice, case, dtype, kv) {
                let naive = !args.no_naive
                    && case.group == "C"
                    && dtype == DType::F32
                    && kv == CacheDType::Auto
                    && case.traffic().flops <= args.naive_max_gflop * 1e9
                    && matches!(&b, Ok(b) if b.device_kind() == DeviceKind::Cpu);
                jobs.push(Job {
                    case: case.clone(),
                    dtype,
                    kv,
                    backend: b,
                    naive,
                });
            }
        }
    }
    jobs
}

fn blank_row(case: &Case, backend: &str, device: &str, dtype: DType, kv: CacheDType) -> Row {
    let t = case.traffic();
    let bytes = t.bytes(
        dtype.size_in_bytes(),
        kv.storage_dtype(dtype).size_in_bytes(),
    );
    Row {
        id: case.id.clone(),
        group: case.group.to_string(),
        family: case.family.as_str().to_string(),
        shape: case.describe(),
        backend: backend.to_string(),
        device: device.to_string(),
        dtype: dtype.as_str().to_string(),
        kv_dtype: kv.as_str().to_string(),
        status: Status::Skipped,
        note: None,
        flops: t.flops,
        bytes,
        reps: 0,
        sets: 0,
        timer: None,
        us_median: None,
        us_p10: None,
        us_p90: None,
        us_min: None,
        us_max: None,
        tflops: None,
        gbps: None,
        bound: None,
        fraction: None,
        peak_tflops: None,
        peak_gbps: None,
    }
}

fn fill_timing(row: &mut Row, s: &Samples, peaks: Option<&Peaks>) {
    let med = s.median();
    row.status = Status::Ok;
    row.reps = s.len();
    row.us_median = Some(med * 1e6);
    row.us_p10 = Some(s.quantile(0.1) * 1e6);
    row.us_p90 = Some(s.quantile(0.9) * 1e6);
    row.us_min = Some(s.min() * 1e6);
    row.us_max = Some(s.max() * 1e6);
    let (pt, pb) = peaks.map_or((0.0, 0.0), |p| (p.compute_tflops, p.mem_gbps));
    let p = roofline(row.flops, row.bytes, med, pt, pb);
    row.tflops = Some(p.tflops);
    row.gbps = Some(p.gbps);
    if peaks.is_some() {
        row.bound = Some(p.bound);
        row.fraction = Some(p.fraction);
        row.peak_tflops = Some(pt);
        row.peak_gbps = Some(pb);
    }
}

/// How many input sets to rotate: `--sets`, else ≥ 2 and enough to span 256 MB, ≤ 8.
fn num_sets(args: &BenchArgs, set_bytes: f64) -> usize {
    args.sets.unwrap_or_else(|| {
        let want = (256e6 / set_bytes.max(1.0)).ceil() as usize;
        want.clamp(2, 8)
    })
}

fn run_benchmarks(args: &BenchArgs) -> Result<BenchFile> {
    if !(args.budget.is_finite() && args.budget >= 0.0) {
        return Err(config_error(format!(
            "--budget {} must be ≥ 0 seconds",
            args.budget
        )));
    }
    let cases = shapes::select(&args.shapes)?;
    let choice = resolve_backends(&args.backend)?;
    let jobs = plan(args, &cases, &choice);
    let timing_cfg = TimingConfig {
        warmup: args.warmup,
        warmup_time: Duration::ZERO,
        min_reps: args.min_reps,
        max_reps: args.max_reps,
        budget: Duration::from_secs_f64(args.budget),
        cap: Duration::from_secs_f64(args.cap),
    };
    let any_gpu = jobs
        .iter()
        .any(|j| matches!(&j.backend, Ok(b) if b.device_kind() != DeviceKind::Cpu));
    let mut progress = Progress::new(
        jobs.iter().map(|j| 1 + usize::from(j.naive)).sum(),
        args.quiet,
    );
    let mut sink = sink::ResultSink::new(
        std::io::stdout(),
        args.json.clone(),
        BenchFile {
            schema: SCHEMA.into(),
            generator: format!("polyattn bench {}", env!("CARGO_PKG_VERSION")),
            command: command_line(),
            machine: Machine::collect(any_gpu),
            peaks: Vec::new(),
            rows: Vec::new(),
        },
    )?;
    let mut peaks_by_device: BTreeMap<String, Option<Peaks>> = BTreeMap::new();
    let max_bytes = args
        .max_gb
        .map(|g| g * 1e9)
        .or_else(|| mem_available().map(|m| m / 2.0));

    for job in &jobs {
        let label = format!("{} {}/{}", job.case.id, job.dtype, job.kv);
        let backend = match &job.backend {
            Ok(b) => b.clone(),
            Err((name, why)) => {
                let mut r = blank_row(&job.case, name, "", job.dtype, job.kv);
                r.note = Some(why.clone());
                emit(&mut sink, &progress, r)?;
                progress.step();
                continue;
            }
        };
        let device = match backend.device() {
            Ok(d) => d,
            Err(e) => {
                let mut r = blank_row(&job.case, backend.name(), "", job.dtype, job.kv);
                r.status = Status::Error;
                r.note = Some(e.to_string());
                emit(&mut sink, &progress, r)?;
                progress.step();
                continue;
            }
        };
        let desc = device.description();
        // Ceilings once per device, right before its first row.
        if !peaks_by_device.contains_key(&desc) {
            progress.show(&format!("measuring the ceilings of {desc}"));
            let cfg = ProbeConfig {
                trials: args.probe_trials,
                ..ProbeConfig::default()
            };
            let p = match peaks::measure(&device, job.dtype, &cfg) {
                Ok(p) => {
                    progress.suspend(|| sink.ceilings(p.clone()))?;
                    Some(p)
                }
                Err(e) => {
                    progress.suspend(|| eprintln!("warning: no ceilings for {desc}: {e}"));
                    None
                }
            };
            peaks_by_device.insert(desc.clone(), p);
        }
        let peaks = peaks_by_device.get(&desc).cloned().flatten();

        let set_bytes = inputs::set_bytes(&job.case, job.dtype, job.kv);
        let sets = num_sets(args, set_bytes);
        let mut row = blank_row(&job.case, backend.name(), &desc, job.dtype, job.kv);
        if let Some(max) = max_bytes {
            let need = set_bytes * sets.min(2) as f64;
            if need > max {
                row.note = Some(format!(
                    "needs {:.1} GB for {} input sets, limit {:.1} GB (--max-gb)",
                    need / 1e9,
                    sets.min(2),
                    max / 1e9
                ));
                emit(&mut sink, &progress, row)?;
                progress.step();
                if job.naive {
                    progress.step();
                }
                continue;
            }
        }
        // Fewer sets when more would not fit.
        let sets = match max_bytes {
            Some(max) => sets.min((max / set_bytes.max(1.0)).floor() as usize).max(2),
            None => sets,
        };
        progress.show(&format!("{label} on {}", backend.name()));
        let row_cfg = TimingConfig {
            warmup_time: match &device {
                Device::Cpu(_) => Duration::ZERO,
                _ => Duration::from_secs_f64(args.gpu_warmup_secs.max(0.0)),
            },
            ..timing_cfg
        };
        let result = time_job(
            backend.as_ref(),
            &device,
            job,
            sets,
            args.seed,
            &row_cfg,
            args.graphs,
        );
        match result {
            Ok((samples, timer, devices)) => {
                // A row that ran on several devices (DCP across GPUs) is held to their
                // combined ceilings.
                let ceilings = peaks.as_ref().map(|p| Peaks {
                    compute_tflops: p.compute_tflops * devices as f64,
                    mem_gbps: p.mem_gbps * devices as f64,
                    ..p.clone()
                });
                fill_timing(&mut row, &samples, ceilings.as_ref());
                if devices > 1 {
                    row.note = Some(format!(
                        "ran on {devices} devices: ceilings are {devices}× one device's"
                    ));
                }
                row.sets = sets;
                row.timer = Some(timer);
            }
            Err(e) => {
                row.status = Status::Error;
                row.note = Some(e.to_string());
            }
        }
        emit(&mut sink, &progress, row)?;
        progress.step();

        if job.naive {
            progress.show(&format!("{label} naive reference"));
            let mut r = blank_row(&job.case, "cpu-naive", &desc, job.dtype, job.kv);
            let mut batches: Vec<naive::NaiveBatch> = (0..2)
                .map(|i| {
                    naive::NaiveBatch::new(
                        &job.case.requests,
                        job.case.num_heads,
                        job.case.num_kv_heads,
                        job.case.head_size,
                        job.case.causal,
                        args.seed ^ ((i as u64 + 1) * 0x1000),
                    )
                })
                .collect();
            let mut timer = timing::timer_for(&device);
            let s = timing::measure(timer.as_mut(), &timing_cfg, |i| {
                let n = batches.len();
                batches[i % n].run();
                Ok(())
            })?;
            if batches.iter().any(|b| b.outputs().any(|x| !x.is_finite())) {
                r.status = Status::Error;
                r.note = Some("non-finite output".into());
            } else {
                fill_timing(&mut r, &s, peaks.as_ref());
                r.sets = batches.len();
                r.timer = Some(timer.method().to_string());
                r.note = Some("naive matmul→softmax→matmul, full score rows".into());
            }
            emit(&mut sink, &progress, r)?;
            progress.step();
        }
    }
    progress.show("done");
    progress.finish();
    sink.finish(|f| f.machine.finish())
}

/// Hands a finished row to the sink (printed, saved), with the kernel switches of its backend
/// noted.
fn emit<W: std::io::Write>(
    sink: &mut sink::ResultSink<W>,
    progress: &Progress,
    mut row: Row,
) -> Result<()> {
    label_kernel_switches(&mut row, std::env::vars());
    progress.suspend(|| sink.row(row))
}

/// Whether a row runs as graph replays: `--graphs`, a single-token decode row, and a backend
/// whose graphs capture it.
fn replays_graph(backend: &dyn AttentionBackend, device: &Device, case: &Case) -> bool {
    case.family == Family::Decode
        && case.requests.iter().all(|r| r.sq == 1)
        && device.has_graphs()
        && backend.capabilities().graph_capture
            >= polyattn::GraphCaptureSupport::UniformSingleTokenDecode
}

/// Builds the input sets of one row, times it, and checks the output is finite: the samples,
/// how they were timed, and how many devices ran the row.
fn time_job(
    backend: &dyn AttentionBackend,
    device: &Device,
    job: &Job,
    sets: usize,
    seed: u64,
    cfg: &TimingConfig,
    graphs: bool,
) -> Result<(Samples, String, usize)> {
    let case = &job.case;
    let mut timer = timing::timer_for(device);
    let seed_of = |i: usize| seed ^ ((i as u64 + 1) * 0x9e37_79b9);
    let samples = match case.family {
        Family::Decode if case.ranks > 0 => {
            return dcp::time(backend, device, case, (job.dtype, job.kv), sets, seed, cfg);
        }
        Family::Decode if graphs && replays_graph(backend, device, case) => {
            let (imp, layer) = inputs::make_impl(backend, case, job.kv)?;
            let mut v = (0..sets)
                .map(|i| inputs::graph_attention_set(backend, case, job.dtype, job.kv, seed_of(i)))
                .collect::<Result<Vec<_>>>()?;
            // One eager forward per set (it plans, uploads and compiles), then its capture.
            let mut replays = Vec::with_capacity(v.len());
            for set in v.iter_mut() {
                forward_set(imp.as_ref(), &layer, set)?;
                replays.push(device.capture(|| forward_set(imp.as_ref(), &layer, set))?);
            }
            let s = timing::measure(timer.as_mut(), cfg, |i| replays[i % replays.len()].replay())?;
            check_finite(&v[0].output)?;
            return Ok((
                s,
                format!(
                    "{}; each repetition replays a captured graph of the forward",
                    timer.method()
                ),
                1,
            ));
        }
        Family::Prefill | Family::Decode => {
            let (imp, layer) = inputs::make_impl(backend, case, job.kv)?;
            let mut v = (0..sets)
                .map(|i| inputs::attention_set(backend, case, job.dtype, job.kv, seed_of(i)))
                .collect::<Result<Vec<_>>>()?;
            let s = timing::measure(timer.as_mut(), cfg, |i| {
                let n = v.len();
                forward_set(imp.as_ref(), &layer, &mut v[i % n])
            })?;
            check_finite(&v[0].output)?;
            s
        }
        Family::KvWrite => {
            let (imp, layer) = inputs::make_impl(backend, case, job.kv)?;
            let mut v = (0..sets)
                .map(|i| inputs::kv_write_set(backend, case, job.dtype, job.kv, seed_of(i)))
                .collect::<Result<Vec<_>>>()?;
            timing::measure(timer.as_mut(), cfg, |i| {
                let n = v.len();
                let set = &mut v[i % n];
                imp.do_kv_cache_update(
                    &layer,
                    &set.key,
                    &set.value,
                    &mut set.cache,
                    set.metadata.as_ref(),
                )
            })?
        }
        Family::Merge => {
            let mut v = (0..sets)
                .map(|i| inputs::merge_set(device, case, job.dtype, seed_of(i)))
                .collect::<Result<Vec<_>>>()?;
            let s = timing::measure(timer.as_mut(), cfg, |i| {
                let n = v.len();
                let m = &mut v[i % n];
                polyattn::ops::merge_attn_states(
                    &mut m.output,
                    &m.prefix_output,
                    &m.prefix_lse,
                    &m.suffix_output,
                    &m.suffix_lse,
                    Some(&mut m.output_lse),
                    None,
                )
            })?;
            check_finite(&v[0].output)?;
            s
        }
        Family::Mla => {
            let (imp, layer) = inputs::make_mla_impl(backend, case, job.kv)?;
            let mut v = (0..sets)
                .map(|i| inputs::mla_set(backend, case, job.dtype, job.kv, seed_of(i)))
                .collect::<Result<Vec<_>>>()?;
            let s = timing::measure(timer.as_mut(), cfg, |i| {
                let n = v.len();
                let set = &mut v[i % n];
                imp.forward_mqa(
                    &layer,
                    &set.query,
                    &set.cache,
                    set.metadata.as_ref(),
                    &mut set.output,
                    None,
                )
            })?;
            check_finite(&v[0].output)?;
            s
        }
    };
    Ok((samples, timer.method().to_string(), 1))
}

/// One forward of an attention row over input set `set` (its queries, cache and metadata).
fn forward_set(
    imp: &dyn polyattn::AttentionImpl,
    layer: &polyattn::AttentionLayer,
    set: &mut inputs::AttentionSet,
) -> Result<()> {
    imp.forward(
        layer,
        &set.query,
        None,
        None,
        &mut set.cache,
        set.metadata.as_ref(),
        &mut set.output,
    )
}

/// A benchmark of a kernel that writes NaNs (or nothing) measures nothing.
fn check_finite(t: &polyattn::device::Tensor) -> Result<()> {
    let v = t.to_f32_vec()?;
    if v.iter().any(|x| !x.is_finite()) {
        return Err(config_error("the kernel wrote non-finite outputs"));
    }
    if !v.is_empty() && v.iter().all(|&x| x == 0.0) {
        return Err(config_error("the kernel left its output all zeros"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(backend: &str, status: &str, note: Option<&str>) -> report::Row {
        let mut v = serde_json::json!({
            "id": "P2.b1s1k.p16", "group": "P2", "family": "prefill", "shape": "s",
            "backend": backend, "device": "d", "dtype": "bf16", "kv_dtype": "auto",
            "status": status, "flops": 1.0, "bytes": 1.0,
        });
        if let Some(n) = note {
            v["note"] = n.into();
        }
        serde_json::from_value(v).expect("row")
    }

    fn vars(v: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn rows_name_the_kernel_switches_of_their_backend() {
        let env = [
            ("POLYATTN_WGPU_UNROLL", "0"),
            ("POLYATTN_CUDA_MMA", "0"),
            ("POLYATTN_CUDA_DECODE_SPLITS", "4"),
            ("POLYATTN_CUDA_DEVICE", "0"),
            ("PATH", "/bin"),
        ];
        let mut cuda = row("CUDA", "ok", None);
        label_kernel_switches(&mut cuda, vars(&env));
        assert_eq!(
            cuda.note.as_deref(),
            Some("with POLYATTN_CUDA_DECODE_SPLITS=4 POLYATTN_CUDA_MMA=0")
        );
        let mut wgpu = row("WGPU", "ok", Some("split-KV"));
        label_kernel_switches(&mut wgpu, vars(&env));
        assert_eq!(
            wgpu.note.as_deref(),
            Some("split-KV; with POLYATTN_WGPU_UNROLL=0")
        );
        // Other backends, untimed rows and runs without switches keep their notes.
        let mut cpu = row("CPU", "ok", None);
        label_kernel_switches(&mut cpu, vars(&env));
        assert_eq!(cpu.note, None);
        let mut skipped = row("CUDA", "skipped", Some("too large"));
        label_kernel_switches(&mut skipped, vars(&env));
        assert_eq!(skipped.note.as_deref(), Some("too large"));
        let mut plain = row("CUDA", "ok", None);
        label_kernel_switches(&mut plain, vars(&[("PATH", "/bin")]));
        assert_eq!(plain.note, None);
    }
}
