//! Results: the row and file format (JSON, shared with `benches/reference_sdpa.py`), the
//! readable table, the comparison with a reference run, and `benches/RESULTS.md`.
//!
//! JSON schema `polyattn-bench/1`: `{schema, generator, command, machine, peaks[], rows[]}`;
//! a row carries the case (id, group, family, shape), where it ran (backend, device, dtypes),
//! the work (FLOPs, bytes per §8), the timing (µs median, p10, p90, min, max, repetitions,
//! input sets, timer) and the roofline (TFLOP/s, GB/s, bound, fraction of the bounding
//! measured ceiling, and the ceilings used). Skipped rows keep the case and say why.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use polyattn::error::{Error, Result};

use super::config_error;

use super::formulas::Bound;
use super::machine::Machine;
use polyattn::probe::Peaks;

/// The schema tag of every file.
pub const SCHEMA: &str = "polyattn-bench/1";

/// Whether a row ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Timed.
    Ok,
    /// Not run here (backend cannot run it, too large, not applicable); `note` says why.
    Skipped,
    /// Started and failed; `note` has the error.
    Error,
}

/// One benchmark row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Case id.
    pub id: String,
    /// Group id.
    pub group: String,
    /// Family (`prefill`, `decode`, `kv_write`, `merge`, `mla`).
    pub family: String,
    /// Shape, in words.
    pub shape: String,
    /// Backend name (`CPU`, `cpu-naive`, `torch-flash`, `torch-cudnn`, …).
    pub backend: String,
    /// Device description.
    pub device: String,
    /// Activation dtype.
    pub dtype: String,
    /// KV-cache dtype (vLLM's string).
    pub kv_dtype: String,
    /// Ran, skipped or failed.
    pub status: Status,
    /// Why skipped, the error, or a remark on the method.
    #[serde(default)]
    pub note: Option<String>,
    /// FLOPs (§8).
    pub flops: f64,
    /// Bytes (§8, decimal).
    pub bytes: f64,
    /// Timed repetitions.
    #[serde(default)]
    pub reps: usize,
    /// Input sets rotated through.
    #[serde(default)]
    pub sets: usize,
    /// How time was measured.
    #[serde(default)]
    pub timer: Option<String>,
    /// Median time, µs.
    #[serde(default)]
    pub us_median: Option<f64>,
    /// 10th percentile, µs.
    #[serde(default)]
    pub us_p10: Option<f64>,
    /// 90th percentile, µs.
    #[serde(default)]
    pub us_p90: Option<f64>,
    /// Fastest, µs.
    #[serde(default)]
    pub us_min: Option<f64>,
    /// Slowest, µs.
    #[serde(default)]
    pub us_max: Option<f64>,
    /// TFLOP/s at the median.
    #[serde(default)]
    pub tflops: Option<f64>,
    /// GB/s at the median (decimal).
    #[serde(default)]
    pub gbps: Option<f64>,
    /// Which measured ceiling bounds it.
    #[serde(default)]
    pub bound: Option<Bound>,
    /// Fraction of that ceiling reached: `max(F/P, B/BW) / t`.
    #[serde(default)]
    pub fraction: Option<f64>,
    /// The compute ceiling used, TFLOP/s.
    #[serde(default)]
    pub peak_tflops: Option<f64>,
    /// The bandwidth ceiling used, GB/s.
    #[serde(default)]
    pub peak_gbps: Option<f64>,
}

impl Row {
    /// FLOP per byte.
    pub fn intensity(&self) -> f64 {
        if self.bytes > 0.0 {
            self.flops / self.bytes
        } else {
            0.0
        }
    }

    /// True when it was timed.
    pub fn is_ok(&self) -> bool {
        self.status == Status::Ok && self.us_median.is_some()
    }
}

/// One benchmark run: where, with which ceilings, and its rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchFile {
    /// [`SCHEMA`].
    pub schema: String,
    /// What wrote it (`polyattn bench 0.1.0`, `benches/reference_sdpa.py`).
    pub generator: String,
    /// The command line.
    #[serde(default)]
    pub command: String,
    /// The machine.
    pub machine: Machine,
    /// Ceilings measured in the run, one per device (and dtype).
    pub peaks: Vec<Peaks>,
    /// The rows.
    pub rows: Vec<Row>,
}

impl BenchFile {
    /// Writes pretty JSON, atomically: the whole document goes to a temporary file beside
    /// `path`, which is then renamed over it, so `path` always holds a complete file (the
    /// previous one or this one) even when the process is stopped while writing.
    pub fn save(&self, path: &Path) -> Result<()> {
        let s =
            serde_json::to_string_pretty(self).map_err(|e| config_error(format!("JSON: {e}")))?;
        write_file_atomic(path, &(s + "\n"))
    }

    /// Reads a file written by `polyattn bench --json` or the Python reference.
    pub fn load(path: &Path) -> Result<Self> {
        let s = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
        let f: BenchFile = serde_json::from_str(&s).map_err(|e| {
            config_error(format!(
                "{}: not a benchmark result file: {e}",
                path.display()
            ))
        })?;
        if f.schema != SCHEMA {
            return Err(config_error(format!(
                "{}: schema '{}', expected '{SCHEMA}'",
                path.display(),
                f.schema
            )));
        }
        Ok(f)
    }
}

fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes `text` to `path`, creating its parent folders.
pub fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    }
    std::fs::write(path, text).map_err(|e| io_err(path, e))
}

/// Writes `text` to a temporary file in the folder of `path` (created when missing), then
/// renames it over `path`: readers see the old content or the new, never a partial file.
pub fn write_file_atomic(path: &Path, text: &str) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| config_error(format!("{}: not a file name", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    write_file(&tmp, text)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_err(path, e)
    })
}

/// `1234.5`, `12.3`, `0.0213`: three or four significant digits without exponent.
pub fn sig(x: f64) -> String {
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1000.0 {
        format!("{x:.0}")
    } else if a >= 100.0 {
        format!("{x:.1}")
    } else if a >= 10.0 {
        format!("{x:.2}")
    } else if a >= 1.0 {
        format!("{x:.3}")
    } else {
        let digits = (-a.log10().floor()) as usize + 2;
        format!("{x:.digits$}")
    }
}

fn opt(x: Option<f64>) -> String {
    x.map_or_else(|| "–".into(), sig)
}

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "–".into(), |f| format!("{:.1}%", 100.0 * f))
}

fn spread(r: &Row) -> String {
    match (r.us_p10, r.us_p90) {
        (Some(a), Some(b)) => format!("{}–{}", sig(a), sig(b)),
        _ => "–".into(),
    }
}

/// Column headers and cells of a row, shared by the terminal table and Markdown.
fn cells(r: &Row) -> [String; 10] {
    [
        r.id.clone(),
        r.backend.clone(),
        format!("{}/{}", r.dtype, r.kv_dtype),
        opt(r.us_median),
        spread(r),
        opt(r.tflops),
        opt(r.gbps),
        r.bound.map_or("–", |b| b.as_str()).to_string(),
        pct(r.fraction),
        if r.is_ok() {
            r.note.clone().unwrap_or_default()
        } else {
            format!(
                "{}: {}",
                match r.status {
                    Status::Error => "error",
                    _ => "skipped",
                },
                r.note.clone().unwrap_or_default()
            )
        },
    ]
}

const HEADERS: [&str; 10] = [
    "id",
    "backend",
    "dtype/kv",
    "µs median",
    "p10–p90 µs",
    "TFLOP/s",
    "GB/s",
    "bound",
    "of ceiling",
    "note",
];

/// The ceilings of a run, one line per device.
pub fn peaks_lines(peaks: &[Peaks]) -> Vec<String> {
    peaks
        .iter()
        .map(|p| {
            format!(
                "{}: compute {} TFLOP/s ({}); bandwidth {} GB/s ({}){}; ridge {} FLOP/B",
                p.device,
                sig(p.compute_tflops),
                p.compute_method,
                sig(p.mem_gbps),
                p.mem_method,
                p.read_gbps.map_or(String::new(), |r| format!(
                    "; streaming read {} GB/s",
                    sig(r)
                )),
                sig(p.ridge())
            )
        })
        .collect()
}

/// One table line: text columns left-aligned, numeric ones (3..=8) right-aligned, padded to
/// `w` (a cell wider than its column pushes the rest right).
fn table_line(c: &[String], w: &[usize; 10]) -> String {
    let mut s = String::new();
    for (i, x) in c.iter().enumerate() {
        let pad = w[i].saturating_sub(x.chars().count());
        if (3..=8).contains(&i) {
            s.push_str(&" ".repeat(pad));
            s.push_str(x);
        } else {
            s.push_str(x);
            if i < 9 {
                s.push_str(&" ".repeat(pad));
            }
        }
        if i < 9 {
            s.push_str("  ");
        }
    }
    s.trim_end().to_string()
}

/// The readable table: peaks first, then one line per row.
pub fn table(file: &BenchFile) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "machine: {}", file.machine.summary());
    for l in peaks_lines(&file.peaks) {
        let _ = writeln!(out, "ceilings: {l}");
    }
    let rows: Vec<[String; 10]> = file.rows.iter().map(cells).collect();
    let mut w = HEADERS.map(|h| h.chars().count());
    for r in &rows {
        for (i, c) in r.iter().enumerate().take(9) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let _ = writeln!(out, "{}", table_line(&HEADERS.map(String::from), &w));
    for r in &rows {
        let _ = writeln!(out, "{}", table_line(r, &w));
    }
    out
}

/// Column widths of the table printed row by row while a run goes on (the rows are not
/// known yet): wide enough for the usual ids, backends and numbers.
const STREAM_WIDTHS: [usize; 10] = [24, 9, 17, 9, 15, 8, 8, 7, 10, 0];

/// The header of the table printed row by row ([`stream_line`] gives each row).
pub fn stream_header() -> String {
    table_line(&HEADERS.map(String::from), &STREAM_WIDTHS)
}

/// One row of the table printed row by row, in the columns of [`stream_header`].
pub fn stream_line(r: &Row) -> String {
    table_line(&cells(r), &STREAM_WIDTHS)
}

/// Our rows against reference rows (PyTorch SDPA on the same card): per case, our median and
/// each reference's, with the ratio `t_ref / t_ours` (above 1: we are faster). Rows match by
/// case id, preferring the same dtype and KV dtype; a reference in other dtypes still
/// matches, flagged `*` (SDPA has no fp8 KV, so our fp8 rows compare with its bf16 ones).
pub fn compare(ours: &[Row], refs: &[Row]) -> String {
    let ref_backends: Vec<String> = {
        let mut v: Vec<String> = refs
            .iter()
            .filter(|r| r.is_ok())
            .map(|r| r.backend.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let mut out = String::new();
    if ref_backends.is_empty() {
        let _ = writeln!(out, "compare: the reference files have no timed rows");
        return out;
    }
    let _ = writeln!(
        out,
        "ratio = t_ref / t_ours (above 1: ours is faster); * = reference in another dtype or KV dtype"
    );
    let mut header = format!(
        "{:<22} {:<10} {:<14} {:>12}",
        "id", "backend", "dtype/kv", "ours µs"
    );
    for b in &ref_backends {
        let _ = write!(header, " {:>14} {:>7}", format!("{b} µs"), "ratio");
    }
    let _ = writeln!(out, "{header}");
    for r in ours.iter().filter(|r| r.is_ok()) {
        let t = r.us_median.unwrap_or(0.0);
        let mut line = format!(
            "{:<22} {:<10} {:<14} {:>12}",
            r.id,
            r.backend,
            format!("{}/{}", r.dtype, r.kv_dtype),
            sig(t)
        );
        let mut any = false;
        for b in &ref_backends {
            let cands: Vec<&Row> = refs
                .iter()
                .filter(|x| x.is_ok() && &x.backend == b && x.id == r.id)
                .collect();
            let best = cands
                .iter()
                .find(|x| x.dtype == r.dtype && x.kv_dtype == r.kv_dtype)
                .or_else(|| cands.iter().find(|x| x.dtype == r.dtype))
                .or_else(|| cands.first());
            match best {
                Some(x) => {
                    any = true;
                    let tr = x.us_median.unwrap_or(0.0);
                    let flag = if x.dtype != r.dtype || x.kv_dtype != r.kv_dtype {
                        "*"
                    } else {
                        ""
                    };
                    let _ = write!(
                        line,
                        " {:>14} {:>7}",
                        format!("{}{flag}", sig(tr)),
                        format!("{:.2}×", tr / t)
                    );
                }
                None => {
                    let _ = write!(line, " {:>14} {:>7}", "–", "–");
                }
            }
        }
        if any {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// The rows of the latest file per backend: for each backend, the file with the newest date
/// that has timed rows of it.
pub fn latest_per_backend(files: &[BenchFile]) -> Vec<(String, &BenchFile)> {
    let mut latest: BTreeMap<String, &BenchFile> = BTreeMap::new();
    for f in files {
        for r in f.rows.iter().filter(|r| r.is_ok()) {
            let e = latest.entry(r.backend.clone()).or_insert(f);
            if f.machine.date > e.machine.date {
                *e = f;
            }
        }
    }
    latest.into_iter().collect()
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// `benches/RESULTS.md`: per backend, the latest numbers with the machine (card or CPU,
/// driver, clocks, date) and the ceilings measured in that run; generated, never typed.
///
/// `ratios`, when given, is the output of [`compare`] for the files given with `--compare`.
pub fn results_md(
    files: &[BenchFile],
    sources: &[String],
    command: &str,
    chart: Option<&str>,
    ratios: Option<&str>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Benchmark results\n");
    let _ = writeln!(
        out,
        "Generated by `{command}` from {}. Do not edit by hand: rerun the command on new JSON \
         files (`polyattn bench --json FILE`, `benches/reference_sdpa.py --out FILE`).\n",
        sources
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        out,
        "Method: `perf-anchors.md` §8–§10. FLOPs and bytes per §8 (decimal GB); median of timed \
         repetitions after warm-up, inputs random and rotated; *of ceiling* = `max(F/P, B/BW) / t` \
         against the compute peak P and copy bandwidth BW measured in the same run on the same \
         device; *bound* names the larger floor. A read-dominated kernel can pass 100%: the \
         copy probe counts read + write, and reads alone stream a few percent faster \
         (perf-anchors §1: H200 copy 4.3 TB/s, best decode 4.5 TB/s). On CUDA the compute \
         peak P is the CUDA-core f32 FMA loop (polyattn has no GEMM to probe tensor cores \
         with), so tensor-core prefill rows pass 100%; the tensor-core ceiling is the bf16 \
         matmul that `benches/reference_sdpa.py` measures in the same session (torch sections \
         below).\n"
    );
    if let Some(c) = chart {
        let _ = writeln!(out, "![roofline]({c})\n");
    }
    for (backend, f) in latest_per_backend(files) {
        let m = &f.machine;
        let _ = writeln!(out, "## {backend}\n");
        let device = f
            .rows
            .iter()
            .find(|r| r.backend == backend && r.is_ok())
            .map(|r| r.device.clone())
            .unwrap_or_default();
        let _ = writeln!(out, "- device: {}", md_escape(&device));
        if let Some(g) = &m.gpu {
            let _ = writeln!(out, "- card: {}, driver {}", g.name, g.driver);
            let _ = writeln!(out, "- clocks before: {}", g.clocks_before);
            if !g.clocks_after.is_empty() {
                let _ = writeln!(out, "- clocks after: {}", g.clocks_after);
            }
        }
        let _ = writeln!(
            out,
            "- host: {} ({} logical CPUs, {} threads{}), {:.0} GB, {}, kernel {}",
            m.cpu_model,
            m.logical_cpus,
            m.threads,
            m.cpu_mhz.map_or(String::new(), |x| format!(", {x:.0} MHz")),
            m.mem_total_gb,
            m.os,
            m.kernel
        );
        let _ = writeln!(out, "- date: {}", m.date);
        let _ = writeln!(out, "- software: {}", m.software);
        for (k, v) in &m.extra {
            let _ = writeln!(out, "- {k}: {v}");
        }
        for l in peaks_lines(&f.peaks) {
            let _ = writeln!(out, "- ceilings: {}", md_escape(&l));
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "| {} |", HEADERS.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(HEADERS.len()));
        let mut not_run: BTreeMap<String, usize> = BTreeMap::new();
        for r in f.rows.iter().filter(|r| r.backend == backend) {
            if r.is_ok() {
                let c = cells(r).map(|x| md_escape(&x));
                let _ = writeln!(out, "| {} |", c.join(" | "));
            } else {
                *not_run
                    .entry(r.note.clone().unwrap_or_default())
                    .or_default() += 1;
            }
        }
        let _ = writeln!(out);
        for (why, n) in &not_run {
            let _ = writeln!(out, "- not run ({n} rows): {}", md_escape(why));
        }
        if !not_run.is_empty() {
            let _ = writeln!(out);
        }
    }
    if let Some(r) = ratios {
        let _ = writeln!(out, "## Ratios to the reference (`--compare`)\n");
        let _ = writeln!(out, "```text\n{r}```");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, backend: &str, us: f64) -> Row {
        Row {
            id: id.into(),
            group: "C".into(),
            family: "decode".into(),
            shape: "B=1".into(),
            backend: backend.into(),
            device: "dev | x".into(),
            dtype: "f32".into(),
            kv_dtype: "auto".into(),
            status: Status::Ok,
            note: None,
            flops: 1e9,
            bytes: 1e8,
            reps: 5,
            sets: 2,
            timer: None,
            us_median: Some(us),
            us_p10: Some(us * 0.9),
            us_p90: Some(us * 1.1),
            us_min: Some(us * 0.8),
            us_max: Some(us * 1.2),
            tflops: Some(1e9 / us / 1e6),
            gbps: Some(1e8 / us / 1e3),
            bound: Some(Bound::Memory),
            fraction: Some(0.5),
            peak_tflops: Some(1.0),
            peak_gbps: Some(10.0),
        }
    }

    fn file(rows: Vec<Row>, date: &str) -> BenchFile {
        BenchFile {
            schema: SCHEMA.into(),
            generator: "test".into(),
            command: String::new(),
            machine: Machine {
                date: date.into(),
                ..Default::default()
            },
            peaks: vec![],
            rows,
        }
    }

    #[test]
    fn numbers_format_without_exponents() {
        assert_eq!(sig(1234.56), "1235");
        assert_eq!(sig(12.345), "12.35");
        assert_eq!(sig(0.021345), "0.0213");
        assert_eq!(sig(0.0), "0");
    }

    #[test]
    fn json_round_trips_and_tables_render() {
        let f = file(vec![row("C.D1.s4k", "CPU", 2000.0)], "2026-01-01T00:00:00Z");
        let s = serde_json::to_string(&f).unwrap();
        let g: BenchFile = serde_json::from_str(&s).unwrap();
        assert_eq!(f, g);
        let t = table(&f);
        assert!(t.contains("C.D1.s4k") && t.contains("50.0%"), "{t}");
        let md = results_md(
            &[f],
            &["a.json".into()],
            "polyattn bench",
            Some("r.svg"),
            None,
        );
        assert!(
            md.contains("## CPU") && md.contains("dev \\| x") && md.contains("![roofline](r.svg)"),
            "{md}"
        );
    }

    #[test]
    fn compare_prints_ratios_and_latest_wins() {
        let ours = vec![row("D1.b1s4k", "CUDA", 10.0), row("X", "CUDA", 1.0)];
        let refs = vec![row("D1.b1s4k", "torch-cudnn", 20.0)];
        let c = compare(&ours, &refs);
        assert!(c.contains("2.00×") && !c.contains("\nX "), "{c}");
        let old = file(vec![row("a", "CPU", 1.0)], "2026-01-01T00:00:00Z");
        let new = file(vec![row("b", "CPU", 1.0)], "2026-02-01T00:00:00Z");
        let files = [new, old];
        let l = latest_per_backend(&files);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].1.rows[0].id, "b");
    }
}
