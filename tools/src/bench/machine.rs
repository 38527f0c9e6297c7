//! What machine a result came from: CPU model and threads, memory, OS, date, and for GPU runs
//! the card, driver and clocks (`nvidia-smi`), so that every JSON file and RESULTS.md row
//! says where and when it was measured.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A GPU as `nvidia-smi` (or the Python reference's torch) reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuInfo {
    /// Card name ("NVIDIA H200").
    pub name: String,
    /// Driver version.
    pub driver: String,
    /// Clocks, power and temperature before the run.
    pub clocks_before: String,
    /// The same after the run.
    pub clocks_after: String,
}

/// The machine a benchmark ran on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Machine {
    /// UTC date and time, ISO 8601.
    pub date: String,
    /// Host name.
    pub hostname: String,
    /// OS and architecture.
    pub os: String,
    /// Kernel release.
    pub kernel: String,
    /// CPU model (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// Logical CPUs available to the process.
    pub logical_cpus: usize,
    /// Worker threads the kernels used (rayon's pool).
    pub threads: usize,
    /// CPU clock as `/proc/cpuinfo` reports it (MHz), when it does.
    pub cpu_mhz: Option<f64>,
    /// Total memory, GB.
    pub mem_total_gb: f64,
    /// The GPU, for GPU runs.
    pub gpu: Option<GpuInfo>,
    /// polyattn's version and, when known, its git commit.
    pub software: String,
    /// Anything else a generator records (torch / CUDA / cuDNN versions).
    pub extra: BTreeMap<String, String>,
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn cpuinfo_field(cpuinfo: &str, key: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// The commit the binary was built from (build.rs), else the one the working directory is on.
fn git_commit() -> Option<String> {
    let built = env!("POLYATTN_BUILD_COMMIT");
    if !built.is_empty() {
        return Some(built.to_string());
    }
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// One `nvidia-smi` query line (name, driver, clocks, power, temperature), if it exists.
pub fn nvidia_smi() -> Option<(String, String, String)> {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu",
            "--format=csv,noheader",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()?
        .to_string();
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() < 7 {
        return None;
    }
    let clocks = format!(
        "sm {}, mem {}, max sm {}, {}, {} C",
        f[2], f[3], f[4], f[5], f[6]
    );
    Some((f[0].to_string(), f[1].to_string(), clocks))
}

impl Machine {
    /// Collects the host's description; `gpu` asks `nvidia-smi` for the card and clocks.
    pub fn collect(gpu: bool) -> Self {
        let cpuinfo = read("/proc/cpuinfo").unwrap_or_default();
        let meminfo = read("/proc/meminfo").unwrap_or_default();
        let mem_kb: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let version = env!("CARGO_PKG_VERSION");
        Machine {
            date: utc_now(),
            hostname: read("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            kernel: read("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            cpu_model: cpuinfo_field(&cpuinfo, "model name")
                .or_else(|| cpuinfo_field(&cpuinfo, "Model"))
                .unwrap_or_else(|| "unknown".into()),
            logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            threads: rayon::current_num_threads(),
            cpu_mhz: cpuinfo_field(&cpuinfo, "cpu MHz").and_then(|v| v.parse().ok()),
            mem_total_gb: mem_kb * 1024.0 / 1e9,
            gpu: if gpu {
                nvidia_smi().map(|(name, driver, clocks)| GpuInfo {
                    name,
                    driver,
                    clocks_before: clocks,
                    clocks_after: String::new(),
                })
            } else {
                None
            },
            software: match git_commit() {
                Some(c) => format!("polyattn {version} ({c})"),
                None => format!("polyattn {version}"),
            },
            extra: BTreeMap::new(),
        }
    }

    /// Records the GPU clocks after the run.
    pub fn finish(&mut self) {
        if let Some(g) = &mut self.gpu {
            if let Some((_, _, clocks)) = nvidia_smi() {
                g.clocks_after = clocks;
            }
        }
    }

    /// One line: CPU or GPU, threads, clocks, date.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} ({} logical CPUs, {} threads{}), {:.0} GB, {}",
            self.cpu_model,
            self.logical_cpus,
            self.threads,
            self.cpu_mhz
                .map_or(String::new(), |m| format!(", {m:.0} MHz")),
            self.mem_total_gb,
            self.os
        );
        if let Some(g) = &self.gpu {
            s.push_str(&format!(
                "; {} driver {} ({})",
                g.name, g.driver, g.clocks_before
            ));
        }
        s.push_str(&format!("; {}", self.date));
        s
    }
}

/// Now, UTC, `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian, H. Hinnant's
/// days-to-civil algorithm).
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_format() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_796_036_645), "2026-11-30T11:04:05Z");
    }

    #[test]
    fn cpuinfo_fields_parse() {
        let c = "processor\t: 0\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2445.406\n";
        assert_eq!(cpuinfo_field(c, "model name").as_deref(), Some("AMD EPYC"));
        assert_eq!(cpuinfo_field(c, "cpu MHz").as_deref(), Some("2445.406"));
        assert_eq!(cpuinfo_field(c, "flags"), None);
    }
}
