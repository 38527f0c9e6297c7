//! Compiling the CUDA family with NVRTC: a [`KernelSource`] and the `-D` options of a
//! variant to a cubin for the device's own architecture (`sm_XY`; no PTX JIT, so the
//! driver's PTX ISA version never matters), cached in memory per device (the device's module
//! cache) and on disk.
//!
//! Disk cache: `$POLYATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/polyattn`, else
//! `$HOME/.cache/polyattn`; one file per (source, arch, options, NVRTC version), named by an
//! FNV-1a hash of all four. Best effort: any I/O error just means a recompile.
//!
//! NVRTC (`libnvrtc.so`) is loaded at run time; cudarc panics when it is missing, so
//! [`nvrtc_status`] probes with `is_culib_present()` first and every compile goes through it.

use std::ffi::CString;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaFunction, CudaModule};

use crate::device::disk_cache::{cache_dir, fnv1a};
use crate::error::Result;
use crate::kernels::cuda::{full_source, KernelSource};

use super::{device_error, CudaDevice};

/// Whether NVRTC can be loaded here (probed once; never panics). `Ok((major, minor))` is its
/// version; `Err` says why not.
pub fn nvrtc_status() -> std::result::Result<(i32, i32), String> {
    static STATUS: OnceLock<std::result::Result<(i32, i32), String>> = OnceLock::new();
    STATUS
        .get_or_init(|| {
            // SAFETY: only tries to dlopen the library names; no symbol is called.
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Err(
                    "libnvrtc.so not found (install the CUDA toolkit's NVRTC, e.g. \
                            the nvidia-cuda-nvrtc wheel, and put its lib folder on \
                            LD_LIBRARY_PATH before the process starts)"
                        .into(),
                );
            }
            std::panic::catch_unwind(|| {
                let (mut major, mut minor) = (0, 0);
                // SAFETY: the library is present; out-pointers to locals.
                let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
                if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                    return Err(format!("nvrtcVersion failed: {r:?}"));
                }
                Ok((major, minor))
            })
            .unwrap_or_else(|_| Err("libnvrtc.so could not be used".into()))
        })
        .clone()
}

/// `--gpu-architecture` value for a compute capability: `sm_90` for `(9, 0)`.
pub fn arch_for(capability: (u32, u32)) -> String {
    format!("sm_{}{}", capability.0, capability.1)
}

/// The options every compile uses, for `arch` (`sm_90`).
pub fn base_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--generate-line-info".into(),
    ]
}

/// What one NVRTC compile produced.
#[derive(Clone, Debug)]
pub struct CompileOutput {
    /// The cubin (for `sm_XY` targets) or PTX (for `compute_XY` targets).
    pub image: Vec<u8>,
    /// NVRTC's program log (warnings; with `--ptxas-options=-v`, the ptxas report).
    pub log: String,
}

fn log_of(prog: cudarc::nvrtc::sys::nvrtcProgram) -> String {
    // SAFETY: `prog` is a live program.
    match unsafe { cudarc::nvrtc::result::get_program_log(prog) } {
        Ok(chars) => {
            let bytes: Vec<u8> = chars
                .iter()
                .map(|&c| c as u8)
                .take_while(|&b| b != 0)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Err(e) => format!("(no log: {e:?})"),
    }
}

/// Compiles `k` with NVRTC for `arch` (`sm_80`, `sm_90`, ...; a `compute_XY` target yields
/// PTX), with `extra` options after the base ones. Errors carry NVRTC's log.
pub fn compile(k: &KernelSource, arch: &str, extra: &[&str]) -> Result<CompileOutput> {
    nvrtc_status().map_err(device_error)?;
    let src = CString::new(full_source(k))
        .map_err(|_| device_error(format!("{}: source contains a NUL byte", k.name)))?;
    let name = CString::new(format!("{}.cu", k.name))
        .map_err(|_| device_error("kernel name contains a NUL byte"))?;
    let mut options = base_options(arch);
    options.extend(extra.iter().map(|s| s.to_string()));
    let prog = cudarc::nvrtc::result::create_program(&src, Some(&name))
        .map_err(|e| device_error(format!("nvrtcCreateProgram({}): {e:?}", k.name)))?;
    let result = (|| {
        // SAFETY: `prog` was just created and is destroyed below, after its last use.
        let compiled = unsafe { cudarc::nvrtc::result::compile_program(prog, &options) };
        let log = log_of(prog);
        if let Err(e) = compiled {
            return Err(device_error(format!(
                "NVRTC failed to compile {} for {arch} ({e:?}); options {options:?}; log:\n{log}",
                k.name
            )));
        }
        let cubin = arch.starts_with("sm_");
        let mut size = 0usize;
        // SAFETY: out-pointer to a local; `prog` compiled successfully.
        let r = unsafe {
            if cubin {
                cudarc::nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size)
            } else {
                cudarc::nvrtc::sys::nvrtcGetPTXSize(prog, &mut size)
            }
        };
        if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(device_error(format!(
                "{}: getting the image size: {r:?}",
                k.name
            )));
        }
        let mut image = vec![0u8; size];
        // SAFETY: `image` has the size NVRTC reported.
        let r = unsafe {
            if cubin {
                cudarc::nvrtc::sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast())
            } else {
                cudarc::nvrtc::sys::nvrtcGetPTX(prog, image.as_mut_ptr().cast())
            }
        };
        if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(device_error(format!(
                "{}: getting the image: {r:?}",
                k.name
            )));
        }
        Ok(CompileOutput { image, log })
    })();
    // SAFETY: created above, not used after this.
    let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
    result
}

/// One function's line of a ptxas `-v` report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtxasReport {
    /// Entry point.
    pub function: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of stack frame.
    pub stack_bytes: u32,
    /// Bytes spilled to local memory (stores).
    pub spill_stores: u32,
    /// Bytes reloaded from spills.
    pub spill_loads: u32,
}

fn number_before(line: &str, unit: &str) -> Option<u32> {
    let at = line.find(unit)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

/// Parses the ptxas `-v` lines of an NVRTC log into one report per function.
pub fn parse_ptxas_report(log: &str) -> Vec<PtxasReport> {
    let mut out: Vec<PtxasReport> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            out.push(PtxasReport {
                function: rest.trim().to_string(),
                ..Default::default()
            });
        } else if let Some(r) = out.last_mut() {
            if line.contains("bytes spill stores") {
                r.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                r.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                r.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used") && line.contains("registers") {
                r.registers = number_before(line, "registers").unwrap_or(0);
            }
        }
    }
    out
}

/// Compiles `k` for `arch` with `defines` (`-DNAME=VALUE` options selecting a variant),
/// through the on-disk cache.
fn compile_cached(k: &KernelSource, arch: &str, defines: &[&str]) -> Result<Vec<u8>> {
    let (major, minor) = nvrtc_status().map_err(device_error)?;
    let src = full_source(k);
    let mut options = base_options(arch);
    options.extend(defines.iter().map(|d| d.to_string()));
    let options = options.join(" ");
    let version = format!("nvrtc {major}.{minor}");
    let hash = fnv1a(&[
        src.as_bytes(),
        arch.as_bytes(),
        options.as_bytes(),
        version.as_bytes(),
    ]);
    let path = cache_dir().map(|d| d.join(format!("{}-{arch}-{hash:016x}.cubin", k.name)));
    if let Some(p) = &path {
        if let Ok(bytes) = std::fs::read(p) {
            // A cubin is an ELF file; anything else (a truncated write) is recompiled.
            if bytes.len() > 64 && bytes.starts_with(b"\x7fELF") {
                return Ok(bytes);
            }
        }
    }
    let out = compile(k, arch, defines)?;
    if let Some(p) = &path {
        if let Some(dir) = p.parent() {
            if std::fs::create_dir_all(dir).is_ok() {
                let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                if std::fs::write(&tmp, &out.image).is_ok() && std::fs::rename(&tmp, p).is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
            }
        }
    }
    Ok(out.image)
}

/// The module of `k` (the variant selected by `defines`) on `device`, compiled for `arch`
/// on first use.
fn module_for(
    device: &CudaDevice,
    k: &KernelSource,
    arch: &str,
    defines: &[&str],
) -> Result<Arc<CudaModule>> {
    let key = format!("{}:{arch}:{}", k.name, defines.join(" "));
    device.module(&key, || compile_cached(k, arch, defines))
}

/// Entry point `name` of `k`'s variant `defines` on `device`, compiled for the device's
/// architecture (`sm_XY`).
pub(crate) fn function(
    device: &CudaDevice,
    k: &KernelSource,
    defines: &[&str],
    name: &str,
) -> Result<CudaFunction> {
    function_for(
        device,
        k,
        &arch_for(device.compute_capability()),
        defines,
        name,
    )
}

/// [`function`] compiled for `arch` instead: an arch-specific target such as `sm_90a`,
/// whose instructions (wgmma) the plain `sm_90` target lacks. The caller checks that the
/// device runs it (an `sm_90a` cubin loads on compute capability 9.0 only).
pub(crate) fn function_for(
    device: &CudaDevice,
    k: &KernelSource,
    arch: &str,
    defines: &[&str],
    name: &str,
) -> Result<CudaFunction> {
    module_for(device, k, arch, defines)?
        .load_function(name)
        .map_err(|e| device_error(format!("{}: no function {name}: {e}", k.name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_report_parses() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
                   ptxas info    : Function properties for k\n\
                   \x20   8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
                   ptxas info    : Used 40 registers, used 1 barriers, 560 bytes cmem[0]\n";
        let r = parse_ptxas_report(log);
        assert_eq!(
            r,
            vec![PtxasReport {
                function: "k".into(),
                registers: 40,
                stack_bytes: 8,
                spill_stores: 4,
                spill_loads: 4
            }]
        );
    }
}
