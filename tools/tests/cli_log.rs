//! The `polyattn` binary prints the library's `tracing` warnings on stderr (here: a WGPU
//! tuning variable that does not parse), and `POLYATTN_LOG=error` silences them. Needs a
//! wgpu adapter (lavapipe on CI); prints that it skipped without one.
//!
//! On a machine without a display (no `XDG_RUNTIME_DIR`, `WAYLAND_DISPLAY` or `DISPLAY`),
//! `polyattn info` prints no line containing "error" when nothing failed: opening the wgpu
//! adapter must not make a driver layer probe for a display server and complain.

use std::process::Command;

/// Runs `polyattn check` on the wgpu backend (f32, auto cache) with a malformed workgroup
/// knob; returns (stdout, stderr).
fn check_with_bad_knob(log: Option<&str>) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_polyattn"));
    cmd.args(["check", "--dtype", "f32", "--kv-dtype", "auto"])
        .env("POLYATTN_BACKEND", "wgpu")
        .env("POLYATTN_WGPU_PREFILL_WG", "7")
        .env_remove("POLYATTN_LOG");
    if let Some(level) = log {
        cmd.env("POLYATTN_LOG", level);
    }
    let out = cmd.output().expect("run polyattn");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn library_warnings_reach_stderr() {
    let (stdout, stderr) = check_with_bad_knob(None);
    if !stdout.lines().any(|l| l.starts_with("WGPU")) {
        eprintln!("[cli log] skipped: no wgpu adapter ran the check\n{stdout}\n{stderr}");
        return;
    }
    let warning = "POLYATTN_WGPU_PREFILL_WG=7 is not a power of two from 32 to 1024";
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("polyattn warn") && l.contains(warning)),
        "no warning on stderr:\n{stderr}"
    );
    let (_, quiet) = check_with_bad_knob(Some("error"));
    assert!(
        !quiet.contains(warning),
        "POLYATTN_LOG=error still warned:\n{quiet}"
    );
    eprintln!("[cli log] ran: the warning reached stderr, POLYATTN_LOG=error silenced it");
}

/// Runs `polyattn info` with the display variables removed and `WGPU_BACKEND` as given
/// (`None`: unset); returns (success, stdout, stderr).
fn headless_info(wgpu_backend: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_polyattn"));
    cmd.arg("info");
    for var in [
        "XDG_RUNTIME_DIR",
        "WAYLAND_DISPLAY",
        "WAYLAND_SOCKET",
        "DISPLAY",
        "POLYATTN_BACKEND",
        "POLYATTN_LOG",
        "WGPU_BACKEND",
    ] {
        cmd.env_remove(var);
    }
    if let Some(b) = wgpu_backend {
        cmd.env("WGPU_BACKEND", b);
    }
    let out = cmd.output().expect("run polyattn");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn info_on_a_headless_machine_prints_no_error_lines() {
    for backend in [None, Some("vulkan")] {
        let (ok, stdout, stderr) = headless_info(backend);
        assert!(
            ok,
            "info failed (WGPU_BACKEND={backend:?}):\n{stdout}\n{stderr}"
        );
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.to_ascii_lowercase().contains("error"))
            .collect();
        assert!(
            errors.is_empty(),
            "WGPU_BACKEND={backend:?}: false error lines on stderr:\n{}",
            errors.join("\n")
        );
        let wgpu = stdout
            .lines()
            .find(|l| l.contains("WGPU"))
            .unwrap_or("no WGPU line");
        eprintln!(
            "[cli log] headless info, WGPU_BACKEND={backend:?}: {}",
            wgpu.trim()
        );
    }
}
