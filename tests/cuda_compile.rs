//! CI check for the CUDA kernels without a GPU: every `kernels-cuda/` source is compiled with
//! NVRTC for sm_80 and sm_90 with `--ptxas-options=-v`; the test fails on a compile error or on
//! any function that spills registers to local memory, and prints each function's registers,
//! stack and spills.
//!
//! NVRTC is loaded at run time. When it is absent the test prints that it skipped and why, and
//! passes. To run it here: `python3 -m pip install --no-deps --target /opt/cu13
//! nvidia-cuda-nvrtc==13.0.88` and `LD_LIBRARY_PATH=/opt/cu13/nvidia/cu13/lib cargo test
//! --test cuda_compile -- --nocapture` (the variable must be set before the process starts).

#[macro_use]
mod common;

use polyattn::device::cuda::{compile, nvrtc_status, parse_ptxas_report, PtxasReport};
use polyattn::kernels::cuda;

const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

#[test]
fn every_cuda_kernel_compiles_for_sm80_and_sm90_without_spills() {
    let version = match nvrtc_status() {
        Ok(v) => v,
        Err(why) => {
            report!("SKIP cuda_compile: NVRTC is not available: {why}");
            return;
        }
    };
    report!("NVRTC {}.{}", version.0, version.1);
    // One thread per architecture: NVRTC compiles different programs concurrently, and the
    // two architectures take most of this suite's time on a 2-core machine.
    let failures: Vec<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = ARCHS
            .iter()
            .map(|&arch| scope.spawn(move || check_arch(arch)))
            .collect();
        runs.into_iter()
            .flat_map(|r| r.join().expect("a compile thread panicked"))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "CUDA kernel checks failed:\n{}",
        failures.join("\n")
    );
}

/// Compiles every source for `arch`; the failures (compile errors, missing reports, spills).
fn check_arch(arch: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for k in cuda::ALL_SOURCES {
        let out = match compile(&k, arch, &["--ptxas-options=-v"]) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{} {arch}: compile error: {e}", k.name));
                continue;
            }
        };
        let reports = parse_ptxas_report(&out.log);
        for f in k.functions {
            if !reports.iter().any(|r| &r.function == f) {
                failures.push(format!("{} {arch}: no ptxas report for {f}", k.name));
            }
        }
        for PtxasReport {
            function,
            registers,
            stack_bytes,
            spill_stores,
            spill_loads,
        } in &reports
        {
            report!(
                "{arch} {:<20} {function:<24} {registers:>3} registers, {stack_bytes:>4} B stack, \
                 {spill_stores} B spill stores, {spill_loads} B spill loads",
                k.name
            );
            if *spill_stores > 0 || *spill_loads > 0 {
                failures.push(format!(
                    "{} {arch}: {function} spills ({spill_stores} B stores, {spill_loads} B loads)",
                    k.name
                ));
            }
        }
        if out.image.is_empty() {
            failures.push(format!("{} {arch}: empty cubin", k.name));
        }
    }
    failures
}

/// The Hopper sources compile for sm_90a without spills, and their SASS holds the warpgroup
/// tensor-core instructions (`HGMMA`) where a `cuobjdump` is on the PATH (a kernel whose
/// products compiled to anything else would be on a slower path); without one the test says
/// that the SASS check skipped. (`cuobjdump` comes with the CUDA toolkit, or from PyPI's
/// `nvidia-cuda-cuobjdump` wheel.)
#[test]
fn hopper_kernels_compile_for_sm90a_with_wgmma() {
    if let Err(why) = nvrtc_status() {
        report!("SKIP cuda_compile hopper: NVRTC is not available: {why}");
        return;
    }
    let mut failures = Vec::new();
    let mut images = Vec::new();
    for k in cuda::HOPPER_SOURCES {
        match compile(&k, cuda::HOPPER_ARCH, &["--ptxas-options=-v"]) {
            Ok(out) => {
                let reports = parse_ptxas_report(&out.log);
                for f in k.functions {
                    if !reports.iter().any(|r| &r.function == f) {
                        failures.push(format!("{}: no ptxas report for {f}", k.name));
                    }
                }
                for r in &reports {
                    report!(
                        "{} {:<20} {:<32} {:>3} registers, {:>4} B stack, {} B spill stores, {} B \
                         spill loads",
                        cuda::HOPPER_ARCH,
                        k.name,
                        r.function,
                        r.registers,
                        r.stack_bytes,
                        r.spill_stores,
                        r.spill_loads
                    );
                    if r.spill_stores > 0 || r.spill_loads > 0 {
                        failures.push(format!("{}: {} spills", k.name, r.function));
                    }
                }
                images.push((k.name.to_string(), out.image));
            }
            Err(e) => failures.push(format!("{}: {e}", k.name)),
        }
    }
    // The run-time variants: each selects its one entry point, spills nothing, and is not
    // serialised.
    for dtype in [polyattn::DType::F16, polyattn::DType::Bf16] {
        for head_size in [64, 128] {
            for plain in [true, false] {
                let variant = cuda::wgmma_variant(dtype, head_size, plain);
                let defines: Vec<&str> = variant.iter().map(String::as_str).collect();
                let name = cuda::wgmma_function_name(dtype, head_size).expect("variant");
                let opts = [&["--ptxas-options=-v"], defines.as_slice()].concat();
                let out = match compile(&cuda::PAGED_ATTENTION_WGMMA_WS, cuda::HOPPER_ARCH, &opts) {
                    Ok(out) => out,
                    Err(e) => {
                        failures.push(format!("{defines:?}: {e}"));
                        continue;
                    }
                };
                // ptxas serialises wgmma it cannot prove safe to overlap (e.g. an A fragment
                // written after wgmma.fence) and says so: a slow path. It also says when it
                // ignores setmaxnreg (C7508): the consumers would then compute in the launch's
                // 168 registers.
                if out.log.contains("serialized") || out.log.contains("C7508") {
                    failures.push(format!(
                        "{defines:?}: ptxas serialised wgmma or ignored setmaxnreg:\n{}",
                        out.log
                    ));
                }
                let reports = parse_ptxas_report(&out.log);
                let got: Vec<&str> = reports.iter().map(|r| r.function.as_str()).collect();
                if got != [name] {
                    failures.push(format!("{defines:?}: got {got:?}, want {name}"));
                }
                for r in &reports {
                    report!(
                        "{defines:?}: {} registers, {} B stack",
                        r.registers,
                        r.stack_bytes
                    );
                    if r.spill_stores + r.spill_loads > 0 {
                        failures.push(format!("{defines:?}: {} spills", r.function));
                    }
                    // The consumers take the registers the producer gives back (setmaxnreg):
                    // the CTA must start with the 168 a thread its launch bounds allow, or
                    // they wait forever.
                    if r.registers != 168 {
                        failures.push(format!("{defines:?}: {} registers, not 168", r.registers));
                    }
                }
                // One run-time build goes through the SASS check too.
                if dtype == polyattn::DType::Bf16 && head_size == 128 && plain {
                    images.push(("run-time bf16 d128".to_string(), out.image));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let Some(tool) = cuobjdump() else {
        report!("SKIP the SASS check: no cuobjdump on the PATH");
        return;
    };
    for (name, image) in images {
        let sass = sass_of(&tool, &name.replace(' ', "-"), &image);
        let hgmma = sass.matches("HGMMA").count();
        report!("{name}: {hgmma} HGMMA instructions in the SASS");
        assert!(hgmma > 0, "{name}: no HGMMA in the SASS");
    }
}

/// The variants the backend compiles at run time (one head-size bucket or one tensor-core
/// variant per module) select exactly the entry points they are loaded for, without spills
/// on sm_90 (this covers the tensor-core kernel's 64-row build, which the whole-file check
/// does not compile).
#[test]
fn run_time_variants_select_their_entry_points() {
    if let Err(why) = nvrtc_status() {
        report!("SKIP cuda_compile variants: NVRTC is not available: {why}");
        return;
    }
    let mut failures = Vec::new();
    let mut check = |k: &cuda::KernelSource, defines: &[&str], want: &[&str]| match compile(
        k,
        "sm_90",
        &[&["--ptxas-options=-v"], defines].concat(),
    ) {
        Ok(out) => {
            let reports = parse_ptxas_report(&out.log);
            for r in reports
                .iter()
                .filter(|r| r.spill_stores > 0 || r.spill_loads > 0)
            {
                failures.push(format!(
                    "{} {defines:?}: {} spills ({} B stores, {} B loads)",
                    k.name, r.function, r.spill_stores, r.spill_loads
                ));
            }
            let mut got: Vec<String> = reports.into_iter().map(|r| r.function).collect();
            got.sort();
            let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
            want.sort();
            if got != want {
                failures.push(format!(
                    "{} {defines:?}: got {got:?}, want {want:?}",
                    k.name
                ));
            }
        }
        Err(e) => failures.push(format!("{} {defines:?}: {e}", k.name)),
    };
    for head_size in [8, 64, 128, 256] {
        let variant = cuda::attention_variant(head_size, cuda::NVIDIA_WARP);
        let name = cuda::attention_function_name(head_size, cuda::NVIDIA_WARP).expect("bucket");
        check(
            &cuda::PAGED_ATTENTION,
            &[variant.as_str()],
            &[name, "combine_splits"],
        );
    }
    use polyattn::DType::{Bf16, Fp8E4m3, Fp8E5m2, F16};
    for (dtype, cache, head_size) in [
        (F16, F16, 64),
        (Bf16, Bf16, 96),
        (Bf16, Bf16, 128),
        (Bf16, Fp8E4m3, 128),
        (F16, Fp8E5m2, 96),
    ] {
        let [a, b, c] = cuda::decode_variant(dtype, cache, head_size);
        let name = cuda::decode_function_name(dtype, cache, head_size).expect("variant");
        check(
            &cuda::PAGED_DECODE,
            &[a.as_str(), b.as_str(), c.as_str()],
            &[name],
        );
    }
    for (dtype, head_size) in [(polyattn::DType::F16, 64), (polyattn::DType::Bf16, 128)] {
        for shape in cuda::MMA_SHAPES {
            for plain in [true, false] {
                let variant = cuda::mma_variant(dtype, head_size, shape, plain);
                let defines: Vec<&str> = variant.iter().map(String::as_str).collect();
                let name = cuda::mma_function_name(dtype, head_size).expect("variant");
                check(&cuda::PAGED_ATTENTION_MMA, &defines, &[name]);
            }
        }
    }
    // The CUDA-core decode kernel, each head-slot variant built alone.
    for n in cuda::DECODE_CORES_HEADS {
        let (_, define, name) = cuda::decode_cores_variant(n).expect("a variant");
        check(
            &cuda::PAGED_DECODE_CORES,
            &[define.as_str()],
            &[name.as_str()],
        );
    }
    // The linear layers with f16 and bf16 weights (every entry point, widened loads).
    for dtype in [polyattn::DType::F16, polyattn::DType::Bf16] {
        let defines = cuda::linear_weight_options(dtype).expect("a 16-bit weight type");
        check(&cuda::MODEL_LINEAR, defines, cuda::MODEL_LINEAR.functions);
    }
    // The HIP family's matrix-core prefill in the form the CUDA backend runs it (WMMA layout,
    // product emulated by shuffles: `POLYATTN_CUDA_MMA=amd-wmma`).
    let variant = cuda::matrix_variant(cuda::MatrixCores::Wmma);
    check(
        &cuda::PAGED_ATTENTION_MATRIX,
        &[variant.as_str()],
        cuda::PAGED_ATTENTION_MATRIX.functions,
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A `cuobjdump` on the PATH that runs.
fn cuobjdump() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("cuobjdump"))
        .find(|p| {
            std::process::Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// The SASS of a cubin, through `tool` (written to a temporary file first).
fn sass_of(tool: &std::path::Path, name: &str, image: &[u8]) -> String {
    let path = std::env::temp_dir().join(format!("polyattn-{name}-{}.cubin", std::process::id()));
    std::fs::write(&path, image).expect("write the cubin");
    let out = std::process::Command::new(tool)
        .arg("--dump-sass")
        .arg(&path)
        .output()
        .expect("run cuobjdump");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "cuobjdump failed on {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
