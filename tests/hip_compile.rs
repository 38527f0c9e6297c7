//! CI check for the CUDA family on AMD without a GPU: every module an AMD device can request
//! (`kernels::cuda::amd_variants`: the cache write, the merge, each attention bucket, the
//! matrix-core prefill where the target has matrix cores) is
//! compiled for gfx90a, gfx942, gfx1030 and gfx1100, always with an explicit target:
//!
//! - Debian's `hipcc` (ROCm 5.2, with ROCm's headers and math library) for the targets it
//!   knows (gfx90a, gfx1030);
//! - `clang++-19` (or newer) with `-x hip -nogpuinc -nogpulib -DPA_NO_GPU_HEADERS` for those it
//!   does not (gfx942, gfx1100; `portability.cuh` supplies what ROCm's headers would).
//!
//! Each compile appends `static_assert(PA_WAVE == <the target's wavefront>)`, and the code
//! object's metadata must give every kernel that `.wavefront_size`, so the lane math is
//! checked to follow the target. The test fails on a compile error, on a missing entry point,
//! or on a kernel that uses scratch memory (`ScratchSize` or VGPR spills in the compiler's
//! resource-usage remarks; for hiprtc, whose log has no remarks, `.private_segment_fixed_size`
//! and `.vgpr_spill_count` in the metadata); SGPR spills, which go to VGPR lanes and not to
//! memory, are reported. The matrix-core prefill is also compiled to assembly, which must use
//! the target's MFMA or WMMA instruction in its f16 and bf16 forms.
//!
//! The same variants also go through hiprtc, as a device compiles them at run time, for the
//! targets the local ROCm knows (ROCm 5.2's hiprtc runs without a GPU; it is inside
//! `libamdhip64.so.5`): the code object must be an ELF (or offload bundle) that names every
//! entry point.
//!
//! A machine without the compilers prints SKIP and the reason; `.ci/run` installs them
//! (`apt-get install hipcc libamdhip64-dev rocm-device-libs clang-19`) and sets
//! `POLYATTN_REQUIRE_HIP_COMPILERS=1`, under which a missing compiler fails the test.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use polyattn::device::hip::hiprtc;
use polyattn::kernels::cuda::{
    amd_matrix_cores, amd_variants, full_source, AmdTarget, AmdVariant, MatrixCores, AMD_TARGETS,
    PAGED_ATTENTION_MATRIX,
};

/// Targets Debian's hipcc (ROCm 5.2, clang 15) compiles; the rest go to a newer clang.
const HIPCC_TARGETS: [&str; 2] = ["gfx90a", "gfx1030"];

/// The compilers found on this machine, or why one is missing.
struct Compilers {
    hipcc: Result<PathBuf, String>,
    clang: Result<PathBuf, String>,
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn find_compilers() -> Compilers {
    let hipcc = on_path("hipcc").ok_or_else(|| {
        "hipcc is not on PATH (apt-get install hipcc libamdhip64-dev rocm-device-libs)".to_string()
    });
    let clang = (19..=24)
        .rev()
        .find_map(|v| on_path(&format!("clang++-{v}")))
        .ok_or_else(|| "no clang++-19 or newer on PATH (apt-get install clang-19)".to_string());
    Compilers { hipcc, clang }
}

/// One kernel's line of the compiler's `-Rpass-analysis=kernel-resource-usage` remarks.
#[derive(Debug, Default, Clone, PartialEq)]
struct ResourceUsage {
    function: String,
    sgprs: u32,
    vgprs: u32,
    scratch_bytes: u32,
    sgpr_spills: u32,
    vgpr_spills: u32,
    occupancy: u32,
}

/// Parses clang's resource-usage remarks (`remark: Function Name: k`, then `SGPRs: n`,
/// `VGPRs: n`, `ScratchSize [bytes/lane]: n`, `Occupancy [waves/SIMD]: n`, `SGPRs Spill: n`,
/// `VGPRs Spill: n`, each on its own line).
fn parse_resource_usage(log: &str) -> Vec<ResourceUsage> {
    let mut out: Vec<ResourceUsage> = Vec::new();
    for line in log.lines() {
        let Some((_, rest)) = line.split_once("remark: ") else {
            continue;
        };
        let rest = rest.split(" [-Rpass").next().unwrap_or(rest).trim();
        let Some((key, value)) = rest.split_once(": ") else {
            continue;
        };
        if key == "Function Name" {
            out.push(ResourceUsage {
                function: value.trim().to_string(),
                ..Default::default()
            });
            continue;
        }
        let (Some(cur), Ok(n)) = (out.last_mut(), value.trim().parse::<u32>()) else {
            continue;
        };
        match key {
            "SGPRs" => cur.sgprs = n,
            "VGPRs" => cur.vgprs = n,
            "ScratchSize [bytes/lane]" => cur.scratch_bytes = n,
            "Occupancy [waves/SIMD]" => cur.occupancy = n,
            "SGPRs Spill" => cur.sgpr_spills = n,
            "VGPRs Spill" => cur.vgpr_spills = n,
            _ => {}
        }
    }
    out
}

/// Compiles one variant for one target; the compiler's output (remarks included) and the
/// code object, or the failure.
fn compile(
    compiler: &Path,
    hipcc: bool,
    target: &AmdTarget,
    v: &AmdVariant,
    dir: &Path,
    assembly: bool,
) -> Result<(String, Vec<u8>), String> {
    let kind = if assembly { "s" } else { "o" };
    let tag = format!(
        "{}-{}-{}-{kind}",
        v.source.name,
        v.defines.join("_"),
        target.arch
    );
    let src = dir.join(format!("{tag}.hip"));
    let mut text = full_source(&v.source);
    text.push_str(&format!(
        "\nstatic_assert(PA_WAVE == {w}, \"{arch} runs {w}-wide wavefronts\");\n\
         static_assert(PA_AMD == 1, \"compiled as AMD code\");\n",
        w = target.wave,
        arch = target.arch
    ));
    std::fs::write(&src, text).map_err(|e| format!("write {}: {e}", src.display()))?;
    let out_file = dir.join(format!("{tag}.o"));
    let mut cmd = Command::new(compiler);
    cmd.arg("-std=c++17").arg("-O3");
    if hipcc {
        // hipcc adds ROCm's include paths and device libraries; --genco builds device code only.
        cmd.args(["-include", "hip/hip_runtime.h"]);
        if assembly {
            cmd.args(["--cuda-device-only", "-S"]);
        } else {
            cmd.arg("--genco");
        }
    } else {
        cmd.args([
            "-x",
            "hip",
            "--cuda-device-only",
            "--no-gpu-bundle-output",
            "-nogpuinc",
            "-nogpulib",
            "-DPA_NO_GPU_HEADERS",
            if assembly { "-S" } else { "-c" },
        ]);
    }
    cmd.arg(format!("--offload-arch={}", target.arch))
        .arg("-Rpass-analysis=kernel-resource-usage")
        .args(&v.defines)
        .arg(&src)
        .arg("-o")
        .arg(&out_file);
    let out = cmd
        .output()
        .map_err(|e| format!("run {}: {e}", compiler.display()))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("error"))
            .take(8)
            .collect();
        return Err(format!("{tag}: compile failed:\n{}", errors.join("\n")));
    }
    match std::fs::read(&out_file) {
        Ok(code) if !code.is_empty() => Ok((log, code)),
        _ => Err(format!("{tag}: no code object written")),
    }
}

/// The failures of one target's variants (compile errors, missing kernels, scratch use).
fn check_target(compiler: &Path, hipcc: bool, target: &AmdTarget, dir: &Path) -> Vec<String> {
    let mut failures = Vec::new();
    let tool = if hipcc { "hipcc" } else { "clang" };
    for v in amd_variants(target.arch) {
        if let Some(kind) = (v.source.name == PAGED_ATTENTION_MATRIX.name)
            .then(|| amd_matrix_cores(target.arch))
            .flatten()
        {
            failures.extend(check_matrix_instructions(
                compiler, hipcc, target, &v, dir, kind,
            ));
        }
        let (log, code) = match compile(compiler, hipcc, target, &v, dir, false) {
            Ok(out) => out,
            Err(e) => {
                failures.push(format!("{} ({tool}): {e}", target.arch));
                continue;
            }
        };
        let waves = metadata_values(&code, ".wavefront_size");
        if waves.len() != v.functions.len() || waves.iter().any(|&w| w != target.wave as u64) {
            failures.push(format!(
                "{} ({tool}) {} {:?}: kernel wavefronts {waves:?}, want {} kernels of {}",
                target.arch,
                v.source.name,
                v.defines,
                v.functions.len(),
                target.wave
            ));
        }
        let usage = parse_resource_usage(&log);
        for f in &v.functions {
            if !usage.iter().any(|u| u.function == *f) {
                failures.push(format!(
                    "{} ({tool}) {} {:?}: no kernel {f} in the resource report",
                    target.arch, v.source.name, v.defines
                ));
            }
        }
        for u in &usage {
            report!(
                "{:<7} {tool:<5} {:<18} {:<16} {:<22} {:>3} SGPRs {:>3} VGPRs, occupancy {}, \
                 scratch {} B, spills: {} SGPR (to VGPR lanes), {} VGPR",
                target.arch,
                v.source.name,
                v.defines.join(" "),
                u.function,
                u.sgprs,
                u.vgprs,
                u.occupancy,
                u.scratch_bytes,
                u.sgpr_spills,
                u.vgpr_spills
            );
            if u.scratch_bytes > 0 || u.vgpr_spills > 0 {
                failures.push(format!(
                    "{} ({tool}) {}: {} uses scratch ({} B per lane, {} VGPR spills)",
                    target.arch, v.source.name, u.function, u.scratch_bytes, u.vgpr_spills
                ));
            }
        }
    }
    failures
}

/// The matrix-core prefill's assembly must use the target's matrix instruction in both its
/// f16 and bf16 forms: a kernel that compiled to scalar FMAs would pass every other check.
fn check_matrix_instructions(
    compiler: &Path,
    hipcc: bool,
    target: &AmdTarget,
    v: &AmdVariant,
    dir: &Path,
    kind: MatrixCores,
) -> Vec<String> {
    let (_, asm) = match compile(compiler, hipcc, target, v, dir, true) {
        Ok(out) => out,
        Err(e) => return vec![format!("{} assembly: {e}", target.arch)],
    };
    let asm = String::from_utf8_lossy(&asm);
    // The f16 and the bf16 instruction, each under every name the assembler gives it (gfx940
    // and later spell MFMA `v_mfma_f32_16x16x16_f16` / `_bf16`).
    let wanted: [&[&str]; 2] = match kind {
        MatrixCores::Mfma => [
            &["v_mfma_f32_16x16x16f16", "v_mfma_f32_16x16x16_f16"],
            &["v_mfma_f32_16x16x16bf16_1k", "v_mfma_f32_16x16x16_bf16"],
        ],
        MatrixCores::Wmma => [&["v_wmma_f32_16x16x16_f16"], &["v_wmma_f32_16x16x16_bf16"]],
    };
    let mut failures = Vec::new();
    for names in wanted {
        let n: usize = names.iter().map(|w| asm.matches(w).count()).sum();
        let w = names.join(" / ");
        report!("{:<7} {} uses {w} {n} times", target.arch, v.source.name);
        if n < v.functions.len() {
            failures.push(format!(
                "{} {}: {n} uses of {w} in {} kernels (each of the f16 / bf16 kernels \
                 has at least one)",
                target.arch,
                v.source.name,
                v.functions.len()
            ));
        }
    }
    failures
}

#[test]
fn every_amd_variant_compiles_for_cdna_and_rdna_without_scratch() {
    let required = std::env::var("POLYATTN_REQUIRE_HIP_COMPILERS").is_ok_and(|v| v == "1");
    let compilers = find_compilers();
    let dir = std::env::temp_dir().join(format!("polyattn-hip-compile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let mut jobs: Vec<(PathBuf, bool, AmdTarget)> = Vec::new();
    let mut missing = Vec::new();
    for t in AMD_TARGETS {
        let hipcc = HIPCC_TARGETS.contains(&t.arch);
        match if hipcc {
            &compilers.hipcc
        } else {
            &compilers.clang
        } {
            Ok(p) => jobs.push((p.clone(), hipcc, t)),
            Err(why) => missing.push(format!("{}: {why}", t.arch)),
        }
    }
    for m in &missing {
        report!("SKIP hip_compile {m}");
    }
    assert!(
        !required || missing.is_empty(),
        "POLYATTN_REQUIRE_HIP_COMPILERS=1 but compilers are missing: {missing:?}"
    );
    // Two threads: the 2-core CI machine runs two compiles at once.
    let failures: Vec<String> = std::thread::scope(|scope| {
        let halves: Vec<_> = [0, 1]
            .into_iter()
            .map(|half| {
                let (jobs, dir) = (&jobs, &dir);
                scope.spawn(move || {
                    jobs.iter()
                        .skip(half)
                        .step_by(2)
                        .flat_map(|(c, hipcc, t)| check_target(c, *hipcc, t, dir))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        halves
            .into_iter()
            .flat_map(|h| h.join().expect("a compile thread panicked"))
            .collect()
    });
    let _ = std::fs::remove_dir_all(&dir);
    report!(
        "hip_compile: {} of {} targets compiled ({} skipped)",
        jobs.len(),
        AMD_TARGETS.len(),
        missing.len()
    );
    assert!(
        failures.is_empty(),
        "AMD kernel checks failed:\n{}",
        failures.join("\n")
    );
}

/// The unsigned values of metadata key `key` (e.g. `.wavefront_size`) of every kernel in an
/// AMDGPU code object: the ELF's `NT_AMDGPU_METADATA` note is MessagePack, where each
/// kernel's map holds the key as a fixstr followed by its value (a positive fixint or a
/// `uint 8/16/32/64`).
fn metadata_values(code: &[u8], key: &str) -> Vec<u64> {
    let mut pattern = vec![0xa0 | key.len() as u8];
    pattern.extend_from_slice(key.as_bytes());
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = code[i..]
        .windows(pattern.len())
        .position(|w| w == pattern.as_slice())
    {
        let v = i + at + pattern.len();
        let be = |n: usize| {
            code.get(v + 1..v + 1 + n)
                .map(|b| b.iter().fold(0u64, |acc, &x| acc << 8 | u64::from(x)))
        };
        let value = match code.get(v) {
            Some(&b) if b < 0x80 => Some(u64::from(b)),
            Some(0xcc) => be(1),
            Some(0xcd) => be(2),
            Some(0xce) => be(4),
            Some(0xcf) => be(8),
            _ => None,
        };
        out.extend(value);
        i = v;
    }
    out
}

/// Whether `needle` occurs in `haystack` (entry-point names in a code object's symbol table).
fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn every_amd_variant_compiles_through_hiprtc() {
    let required = std::env::var("POLYATTN_REQUIRE_HIP_COMPILERS").is_ok_and(|v| v == "1");
    let version = match hiprtc::hiprtc_version() {
        Ok(v) => v,
        Err(why) => {
            report!("SKIP hip_compile hiprtc: {why}");
            assert!(
                !required,
                "POLYATTN_REQUIRE_HIP_COMPILERS=1 but hiprtc: {why}"
            );
            return;
        }
    };
    let mut failures = Vec::new();
    let mut compiled = Vec::new();
    for t in AMD_TARGETS {
        if !hiprtc::knows_arch(version.major, t.arch) {
            report!(
                "hiprtc (ROCm {version}) does not know {}: left to clang",
                t.arch
            );
            continue;
        }
        for v in amd_variants(t.arch) {
            let mut src = full_source(&v.source);
            src.push_str(&format!(
                "\nstatic_assert(PA_WAVE == {}, \"wavefront\");\n",
                t.wave
            ));
            let tag = format!("{} {} {:?}", t.arch, v.source.name, v.defines);
            let out = match hiprtc::compile(&src, v.source.name, t.arch, &v.defines) {
                Ok(o) => o,
                Err(e) => {
                    failures.push(format!("{tag}: {e}"));
                    continue;
                }
            };
            if !out.is_elf() && !out.is_offload_bundle() {
                failures.push(format!(
                    "{tag}: the code object is neither an ELF nor a bundle"
                ));
            }
            for f in &v.functions {
                if !contains(&out.code, f) {
                    failures.push(format!("{tag}: no entry point {f} in the code object"));
                }
            }
            // hiprtc's log carries no resource remarks: the code object's metadata does.
            let waves = metadata_values(&out.code, ".wavefront_size");
            let scratch = metadata_values(&out.code, ".private_segment_fixed_size");
            let vgpr_spills = metadata_values(&out.code, ".vgpr_spill_count");
            let sgpr_spills = metadata_values(&out.code, ".sgpr_spill_count");
            if waves.len() != v.functions.len() || waves.iter().any(|&w| w != t.wave as u64) {
                failures.push(format!(
                    "{tag}: kernel wavefronts {waves:?}, want {} kernels of {}",
                    v.functions.len(),
                    t.wave
                ));
            }
            if scratch.iter().chain(&vgpr_spills).any(|&n| n > 0) {
                failures.push(format!(
                    "{tag}: scratch {scratch:?} B per lane, VGPR spills {vgpr_spills:?}"
                ));
            }
            report!(
                "hiprtc {tag}: {} B, wavefronts {waves:?}, scratch {scratch:?}, spills: SGPR \
                 {sgpr_spills:?} (to VGPR lanes), VGPR {vgpr_spills:?}",
                out.code.len()
            );
        }
        compiled.push(t.arch);
    }
    report!("hiprtc (ROCm {version}) compiled every variant for {compiled:?}");
    assert!(!compiled.is_empty(), "hiprtc knows none of the targets");
    assert!(
        failures.is_empty(),
        "hiprtc checks failed:\n{}",
        failures.join("\n")
    );
}

#[test]
fn resource_usage_remarks_parse() {
    let log = "k.hip:1:1: remark: Function Name: paged_attention_dpl1 [-Rpass-analysis=kernel-resource-usage]\n\
               k.hip:1:1: remark:     SGPRs: 104 [-Rpass-analysis=kernel-resource-usage]\n\
               k.hip:1:1: remark:     VGPRs: 103 [-Rpass-analysis=kernel-resource-usage]\n\
               k.hip:1:1: remark:     ScratchSize [bytes/lane]: 16 [-Rpass-analysis=kernel-resource-usage]\n\
               k.hip:1:1: remark:     Occupancy [waves/SIMD]: 4 [-Rpass-analysis=kernel-resource-usage]\n\
               k.hip:1:1: remark:     SGPRs Spill: 34 [-Rpass-analysis=kernel-resource-usage]\n\
               k.hip:1:1: remark:     VGPRs Spill: 2 [-Rpass-analysis=kernel-resource-usage]\n\
               k.hip:9:1: remark: Function Name: combine_splits [-Rpass-analysis=kernel-resource-usage]\n";
    let u = parse_resource_usage(log);
    assert_eq!(u.len(), 2);
    assert_eq!(
        u[0],
        ResourceUsage {
            function: "paged_attention_dpl1".into(),
            sgprs: 104,
            vgprs: 103,
            scratch_bytes: 16,
            sgpr_spills: 34,
            vgpr_spills: 2,
            occupancy: 4,
        }
    );
    assert_eq!(u[1].function, "combine_splits");
    assert_eq!(u[1].scratch_bytes, 0);
}
