//! Compiling HIP C++ at run time with hiprtc, for one AMD target, to a code object
//! (`hipModuleLoadData` takes it), with no GPU needed.
//!
//! Where hiprtc is: ROCm ≥ 6 ships it as `libhiprtc.so.6` / `.so.7` (tried as
//! `libhiprtc.so`, `.so.7`, `.so.6`, by bare name and under `$ROCM_PATH/lib` and
//! `/opt/rocm/lib`); ROCm 5 has no such library, its eleven `hiprtc*` functions are inside
//! `libamdhip64.so.5`, which is used when no `libhiprtc` loads.
//!
//! Which targets it knows: hiprtc **aborts the process** (`munmap_chunk(): invalid pointer`,
//! seen with ROCm 5.2) when `--offload-arch=` names a processor its LLVM does not know, or a
//! target feature the processor lacks (`gfx1030:xnack+`). So [`compile`] checks the target
//! against the list of the library's ROCm major version ([`knows_arch`]) before hiprtc sees
//! it, and refuses options that name a target themselves. The version comes from the
//! library's file name (`libhiprtc.so.6.2.60200`) or from `hipRuntimeGetVersion`:
//! `hiprtcVersion` is no use, every ROCm returns a fixed 9.0 from it (clr's
//! `hiprtc/hiprtc.cpp`: "TODO add actual version").
//!
//! Compiles are serialised (one at a time per process): hiprtc's thread safety is not
//! documented for ROCm 5, and a compile takes well under a second.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};

use super::{base_arch, device_error, library, RocmVersion};
use crate::error::{Error, Result};

/// `hiprtcResult` (a C enum); `HIPRTC_SUCCESS` is 0.
type HiprtcResult = c_int;
const HIPRTC_SUCCESS: HiprtcResult = 0;

/// `hiprtcProgram`: an opaque `struct _hiprtcProgram*`.
type HiprtcProgram = *mut c_void;

library::bindings! {
    /// The hiprtc functions `compile` uses. Signatures from `hip/hiprtc.h` (ROCm 5.2, as
    /// installed by Debian's `libamdhip64-dev`; unchanged in ROCm/HIP `rocm-6.2.2`).
    struct HiprtcApi {
        /// `const char* hiprtcGetErrorString(hiprtcResult result)`.
        fn hiprtcGetErrorString(HiprtcResult) -> *const c_char;
        /// `hiprtcResult hiprtcCreateProgram(hiprtcProgram* prog, const char* src,
        /// const char* name, int numHeaders, const char** headers, const char** includeNames)`.
        fn hiprtcCreateProgram(
            *mut HiprtcProgram,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> HiprtcResult;
        /// `hiprtcResult hiprtcCompileProgram(hiprtcProgram prog, int numOptions,
        /// const char** options)`.
        fn hiprtcCompileProgram(HiprtcProgram, c_int, *const *const c_char) -> HiprtcResult;
        /// `hiprtcResult hiprtcGetProgramLogSize(hiprtcProgram prog, size_t* logSizeRet)`.
        fn hiprtcGetProgramLogSize(HiprtcProgram, *mut usize) -> HiprtcResult;
        /// `hiprtcResult hiprtcGetProgramLog(hiprtcProgram prog, char* log)`.
        fn hiprtcGetProgramLog(HiprtcProgram, *mut c_char) -> HiprtcResult;
        /// `hiprtcResult hiprtcGetCodeSize(hiprtcProgram prog, size_t* codeSizeRet)`.
        fn hiprtcGetCodeSize(HiprtcProgram, *mut usize) -> HiprtcResult;
        /// `hiprtcResult hiprtcGetCode(hiprtcProgram prog, char* code)`.
        fn hiprtcGetCode(HiprtcProgram, *mut c_char) -> HiprtcResult;
        /// `hiprtcResult hiprtcDestroyProgram(hiprtcProgram* prog)`.
        fn hiprtcDestroyProgram(*mut HiprtcProgram) -> HiprtcResult;
    }
}

impl HiprtcApi {
    /// Every function `compile` calls, or the sentence naming the first one missing.
    fn require_all(&self) -> std::result::Result<(), String> {
        self.hiprtcGetErrorString()?;
        self.hiprtcCreateProgram()?;
        self.hiprtcCompileProgram()?;
        self.hiprtcGetProgramLogSize()?;
        self.hiprtcGetProgramLog()?;
        self.hiprtcGetCodeSize()?;
        self.hiprtcGetCode()?;
        self.hiprtcDestroyProgram()?;
        Ok(())
    }

    /// `HIPRTC_ERROR_COMPILATION` for 6: the enum's name, from hiprtc itself.
    fn error_string(&self, r: HiprtcResult) -> String {
        let Ok(f) = self.hiprtcGetErrorString() else {
            return format!("hiprtcResult {r}");
        };
        // SAFETY: takes an integer; returns a pointer to a static string or null.
        let p = unsafe { f(r) };
        if p.is_null() {
            return format!("hiprtcResult {r}");
        }
        // SAFETY: non-null, NUL-terminated, static in the library.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// hiprtc as loaded: its functions, its ROCm version, and where it came from.
struct Hiprtc {
    api: HiprtcApi,
    version: RocmVersion,
    /// "libhiprtc.so.6", or "libamdhip64.so: ROCm 5 keeps hiprtc inside the HIP runtime".
    origin: String,
}

/// hiprtc, loaded once. `Err` is the sentence to report.
fn loaded() -> std::result::Result<&'static Hiprtc, String> {
    static RTC: OnceLock<std::result::Result<Hiprtc, String>> = OnceLock::new();
    RTC.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> std::result::Result<Hiprtc, String> {
    if let Ok(lib) = library::hiprtc() {
        let api = HiprtcApi::resolve(lib);
        api.require_all()?;
        let version = separate_library_version(lib)?;
        return Ok(Hiprtc {
            api,
            version,
            origin: lib.name(),
        });
    }
    let not_found = format!(
        "hiprtc not found: no {}, and {}",
        library::searched(library::HIPRTC),
        "no libamdhip64 either (ROCm 5 keeps hiprtc inside it): no ROCm on this machine, or \
         it is not on the loader path"
    );
    let hip = library::amdhip64().map_err(|_| not_found)?;
    let api = HiprtcApi::resolve(hip);
    if api.hiprtcCreateProgram().is_err() {
        return Err(format!(
            "hiprtc not found: no {}, and {} does not contain it (only ROCm 5's does)",
            library::searched(library::HIPRTC),
            api.library().name()
        ));
    }
    api.require_all()?;
    let version = super::runtime_status()?;
    Ok(Hiprtc {
        origin: format!(
            "{}: ROCm 5 keeps hiprtc inside the HIP runtime",
            api.library().name()
        ),
        api,
        version,
    })
}

/// `(major, minor)` from a file name `libhiprtc.so.6.2.60200` (`minor` `None` for
/// `libhiprtc.so.6`); `None` for an unversioned name.
fn so_version(file_name: &str, stem: &str) -> Option<(u32, Option<u32>)> {
    let rest = file_name.strip_prefix(stem)?.strip_prefix('.')?;
    let mut parts = rest.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok());
    Some((major, minor))
}

/// The ROCm version of a separate `libhiprtc`: from its real file name, else from the name it
/// was opened by, with the HIP runtime's version filling in what the name lacks (when it is
/// the same major version).
fn separate_library_version(lib: &library::Library) -> std::result::Result<RocmVersion, String> {
    const STEM: &str = "libhiprtc.so";
    let opened = lib.name();
    let opened_file = std::path::Path::new(&opened)
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or("")
        .to_string();
    let from_name = lib
        .real_file_name()
        .and_then(|f| so_version(&f, STEM))
        .or_else(|| so_version(&opened_file, STEM));
    let runtime = super::runtime_status().ok();
    match (from_name, runtime) {
        (Some((major, _)), Some(rt)) if rt.major == major => Ok(rt),
        (Some((major, minor)), _) => Ok(RocmVersion {
            major,
            minor: minor.unwrap_or(0),
            patch: 0,
        }),
        (None, Some(rt)) => Ok(rt),
        (None, None) => Err(format!(
            "cannot tell which ROCm {opened} belongs to (its file name carries no version and \
             libamdhip64 is not there), so not which targets it can compile for"
        )),
    }
}

/// Whether hiprtc can be loaded here (probed once; needs no GPU; never panics). `Ok` is its
/// ROCm version and where it was found ("5.2.21153 (libamdhip64.so: ROCm 5 keeps hiprtc
/// inside the HIP runtime)"); `Err` says why not.
pub fn hiprtc_status() -> std::result::Result<String, String> {
    let rtc = loaded()?;
    let v = rtc.version;
    let version = if v.patch == 0 {
        format!("{}.{}", v.major, v.minor)
    } else {
        format!("{}.{}.{}", v.major, v.minor, v.patch)
    };
    Ok(format!("{version} ({})", rtc.origin))
}

/// The ROCm version of the hiprtc [`compile`] uses: what [`knows_arch`] wants. `Err` says
/// why there is no hiprtc.
pub fn hiprtc_version() -> std::result::Result<RocmVersion, String> {
    loaded().map(|r| r.version)
}

/// Processors whose LLVM, device libraries and hiprtc every ROCm 5.x release has. Checked on
/// Debian's ROCm 5.2 (hiprtc in `libamdhip64.so.5`): each compiles. Not gfx940, which ROCm 5.2's
/// hiprtc aborts on (it came with ROCm 5.3), nor gfx941 / gfx942 / gfx11xx (ROCm 5.7 only).
const ROCM5: &[&str] = &[
    "gfx803", "gfx900", "gfx906", "gfx908", "gfx90a", "gfx1010", "gfx1011", "gfx1012", "gfx1030",
    "gfx1031", "gfx1032", "gfx1034", "gfx1035",
];

/// What ROCm 6.x adds to [`ROCM5`] (MI300, RDNA 3 and 3.5).
const ROCM6_ADDS: &[&str] = &[
    "gfx940", "gfx941", "gfx942", "gfx1100", "gfx1101", "gfx1102", "gfx1150", "gfx1151",
];

/// What ROCm 7.x adds (MI350, RDNA 4) ...
const ROCM7_ADDS: &[&str] = &["gfx950", "gfx1200", "gfx1201"];

/// ... and drops: LLVM removed the pre-production gfx940 / gfx941 in February 2025
/// (llvm-project #126762 and its stack; gfx942 is what MI300 reports).
const ROCM7_DROPS: &[&str] = &["gfx940", "gfx941"];

/// Processors with the `xnack` target feature (LLVM's AMDGPUUsage processor table), among
/// those known above. Checked on ROCm 5.2: `gfx803:xnack+` and `gfx1030:xnack+` abort hiprtc.
const XNACK: &[&str] = &[
    "gfx900", "gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950", "gfx1010",
    "gfx1011", "gfx1012",
];

/// Processors with the `sramecc` target feature. Checked on ROCm 5.2: `gfx900:sramecc+`
/// aborts hiprtc.
const SRAMECC: &[&str] = &[
    "gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950",
];

/// The processors (`gfx90a`, without target features) hiprtc of ROCm `rocm_major` compiles
/// for, as far as polyattn knows; empty before ROCm 5. A ROCm newer than 7 gets ROCm 7's
/// list.
pub fn known_archs(rocm_major: u32) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    if rocm_major >= 5 {
        out.extend(ROCM5);
    }
    if rocm_major >= 6 {
        out.extend(ROCM6_ADDS);
    }
    if rocm_major >= 7 {
        out.extend(ROCM7_ADDS);
        out.retain(|a| !ROCM7_DROPS.contains(a));
    }
    out
}

/// Whether hiprtc of ROCm `rocm_major` knows the target `arch`: a processor of
/// [`known_archs`] with, optionally, target features it has (`gfx90a:sramecc+:xnack-`; each
/// of `xnack` / `sramecc` at most once, with `+` or `-`). Pure; an unknown target is one that
/// hiprtc would abort the process on, or may.
pub fn knows_arch(rocm_major: u32, arch: &str) -> bool {
    target_problem(rocm_major, arch).is_none()
}

/// Why ROCm `major` does not know `arch`, or `None` when it does.
fn target_problem(major: u32, arch: &str) -> Option<String> {
    let processor = base_arch(arch);
    let known = known_archs(major);
    if !known.contains(&processor) {
        return Some(if known.is_empty() {
            "polyattn knows the targets of ROCm 5 and later only".to_string()
        } else {
            format!(
                "its hiprtc compiles for {} (hiprtc would abort the process on another target)",
                known.join(", ")
            )
        });
    }
    let mut seen: Vec<&str> = Vec::new();
    for feature in arch.split(':').skip(1) {
        let name = feature
            .strip_suffix('+')
            .or_else(|| feature.strip_suffix('-'));
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return Some(format!(
                "target feature {feature:?} is not a name followed by + or -"
            ));
        };
        let has = match name {
            "xnack" => XNACK.contains(&processor),
            "sramecc" => SRAMECC.contains(&processor),
            _ => {
                return Some(format!(
                    "{name} is not a target feature (xnack and sramecc are)"
                ))
            }
        };
        if !has {
            return Some(format!(
                "{processor} has no {name} target feature (hiprtc would abort the process on it)"
            ));
        }
        if seen.contains(&name) {
            return Some(format!("target feature {name} is given twice"));
        }
        seen.push(name);
    }
    None
}

/// The sentence "ROCm 5.2 does not know gfx942: …" when hiprtc of `version` must not be
/// given `arch`; `None` when it may.
pub(crate) fn arch_problem(version: RocmVersion, arch: &str) -> Option<String> {
    target_problem(version.major, arch)
        .map(|why| format!("ROCm {version} does not know {arch}: {why}"))
}

/// Whether a compiler option names a target, which only [`compile`]'s `arch` may do (it is
/// checked; an option is not, and `--offload-arch=` with an unknown target aborts hiprtc).
fn names_a_target(option: &str) -> bool {
    const TARGET_OPTIONS: &[&str] = &[
        "--offload-arch",
        "-offload-arch",
        "--gpu-architecture",
        "-gpu-architecture",
        "--cuda-gpu-arch",
        "-mcpu",
        "-march",
        "--amdgpu-target",
        "-amdgpu-target",
    ];
    let o = option.trim_start();
    TARGET_OPTIONS.iter().any(|p| o.starts_with(p))
}

/// What one hiprtc compile produced.
#[derive(Clone, Debug)]
pub struct CodeObject {
    /// The code object: an AMDGPU ELF (what ROCm 5.2's hiprtc returns) or a clang offload
    /// bundle; `hipModuleLoadData` takes either.
    pub code: Vec<u8>,
    /// hiprtc's program log (warnings; empty when there are none).
    pub log: String,
}

impl CodeObject {
    /// Whether the code is an ELF file (`\x7fELF`).
    pub fn is_elf(&self) -> bool {
        self.code.starts_with(b"\x7fELF")
    }

    /// Whether the code is a clang offload bundle (`__CLANG_OFFLOAD_BUNDLE__`).
    pub fn is_offload_bundle(&self) -> bool {
        self.code.starts_with(b"__CLANG_OFFLOAD_BUNDLE__")
    }
}

/// Destroys the program when dropped.
struct Program<'a> {
    api: &'a HiprtcApi,
    prog: HiprtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        if let Ok(destroy) = self.api.hiprtcDestroyProgram() {
            // SAFETY: `prog` was created by hiprtcCreateProgram and is destroyed once, here.
            unsafe { destroy(&mut self.prog) };
        }
    }
}

impl Program<'_> {
    /// The program log ("" when there is none, or it cannot be read).
    fn log(&self) -> String {
        let (Ok(size_of), Ok(get)) = (
            self.api.hiprtcGetProgramLogSize(),
            self.api.hiprtcGetProgramLog(),
        ) else {
            return String::new();
        };
        let mut size = 0usize;
        // SAFETY: live program; out-pointer to a local.
        if unsafe { size_of(self.prog, &mut size) } != HIPRTC_SUCCESS || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: the buffer has the size hiprtc asked for.
        if unsafe { get(self.prog, buf.as_mut_ptr().cast::<c_char>()) } != HIPRTC_SUCCESS {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).trim_end().to_string()
    }

    /// The compiled code object.
    fn code(&self) -> std::result::Result<Vec<u8>, String> {
        let size_of = self.api.hiprtcGetCodeSize()?;
        let get = self.api.hiprtcGetCode()?;
        let mut size = 0usize;
        // SAFETY: live, compiled program; out-pointer to a local.
        let r = unsafe { size_of(self.prog, &mut size) };
        if r != HIPRTC_SUCCESS {
            return Err(format!("hiprtcGetCodeSize: {}", self.api.error_string(r)));
        }
        let mut code = vec![0u8; size];
        // SAFETY: the buffer has the size hiprtc reported.
        let r = unsafe { get(self.prog, code.as_mut_ptr().cast::<c_char>()) };
        if r != HIPRTC_SUCCESS {
            return Err(format!("hiprtcGetCode: {}", self.api.error_string(r)));
        }
        Ok(code)
    }
}

/// Compiles HIP C++ `source` with hiprtc for the target `arch` (a full target ID as the GPU
/// reports it, `gfx90a:sramecc+:xnack-`, or a bare processor, `gfx1030`), with
/// `--offload-arch=<arch> -O3` and then `options` (a later `-O` wins). Kernels to be looked up
/// by name should be `extern "C"`.
///
/// Errors ([`Error::Device`], never an abort): no hiprtc here; a target this ROCm does not know
/// ("ROCm 5.2 does not know gfx942: …", returned before hiprtc is called, see
/// [`knows_arch`]); a compile error, carrying hiprtc's log. An option that names a target
/// itself is an [`Error::Config`].
pub fn compile(
    source: &str,
    program_name: &str,
    arch: &str,
    options: &[String],
) -> Result<CodeObject> {
    let rtc = loaded().map_err(|why| device_error(format!("hiprtc unavailable: {why}")))?;
    if let Some(problem) = arch_problem(rtc.version, arch) {
        return Err(device_error(problem));
    }
    if let Some(o) = options.iter().find(|o| names_a_target(o)) {
        return Err(Error::config(format!(
            "hiprtc option {o:?} names a target: pass the target as `arch` instead, where it \
             is checked against what ROCm {} knows",
            rtc.version
        )));
    }
    let src = CString::new(source)
        .map_err(|_| device_error(format!("{program_name}: the source contains a NUL byte")))?;
    let name = CString::new(program_name)
        .map_err(|_| device_error("the program name contains a NUL byte"))?;
    let mut all = vec![format!("--offload-arch={arch}"), "-O3".to_string()];
    all.extend(options.iter().cloned());
    let c_options = all
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| Error::config(format!("a hiprtc option contains a NUL byte: {all:?}")))?;
    let pointers: Vec<*const c_char> = c_options.iter().map(|c| c.as_ptr()).collect();
    let count = c_int::try_from(pointers.len())
        .map_err(|_| Error::config(format!("{} hiprtc options", pointers.len())))?;

    let api = &rtc.api;
    let create = api.hiprtcCreateProgram().map_err(device_error)?;
    let compile_program = api.hiprtcCompileProgram().map_err(device_error)?;

    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());

    let mut prog: HiprtcProgram = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings that outlive the call; no headers (count 0, null arrays).
    let r = unsafe {
        create(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != HIPRTC_SUCCESS || prog.is_null() {
        return Err(device_error(format!(
            "hiprtcCreateProgram({program_name}): {}",
            api.error_string(r)
        )));
    }
    let program = Program { api, prog };
    // SAFETY: live program; `count` pointers to NUL-terminated options that outlive the call.
    // The target was checked above, so hiprtc does not abort on it.
    let r = unsafe { compile_program(program.prog, count, pointers.as_ptr()) };
    let log = program.log();
    if r != HIPRTC_SUCCESS {
        return Err(device_error(format!(
            "hiprtc failed to compile {program_name} for {arch} ({}); options {all:?}; \
             log:\n{log}",
            api.error_string(r)
        )));
    }
    let code = program.code().map_err(device_error)?;
    if code.is_empty() {
        return Err(device_error(format!(
            "hiprtc compiled {program_name} for {arch} but returned no code; log:\n{log}"
        )));
    }
    Ok(CodeObject { code, log })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_arch_per_rocm_version() {
        // (target, ROCm 5, ROCm 6, ROCm 7)
        let table: &[(&str, bool, bool, bool)] = &[
            ("gfx90a", true, true, true),
            ("gfx90a:sramecc+:xnack-", true, true, true),
            ("gfx90a:xnack-:sramecc+", true, true, true),
            ("gfx908:sramecc-", true, true, true),
            ("gfx906:sramecc-:xnack+", true, true, true),
            ("gfx900:xnack+", true, true, true),
            ("gfx1010:xnack-", true, true, true),
            ("gfx803", true, true, true),
            ("gfx1030", true, true, true),
            ("gfx1035", true, true, true),
            ("gfx940", false, true, false),
            ("gfx941", false, true, false),
            ("gfx942", false, true, true),
            ("gfx942:sramecc+:xnack-", false, true, true),
            ("gfx1100", false, true, true),
            ("gfx1101", false, true, true),
            ("gfx1102", false, true, true),
            ("gfx1150", false, true, true),
            ("gfx1151", false, true, true),
            ("gfx950", false, false, true),
            ("gfx1200", false, false, true),
            ("gfx1201", false, false, true),
            // Features the processor lacks, malformed or repeated features, non-targets.
            ("gfx1030:xnack+", false, false, false),
            ("gfx803:xnack+", false, false, false),
            ("gfx900:sramecc+", false, false, false),
            ("gfx1100:sramecc+", false, false, false),
            ("gfx90a:", false, false, false),
            ("gfx90a:sramecc", false, false, false),
            ("gfx90a:foo+", false, false, false),
            ("gfx90a:xnack+:xnack-", false, false, false),
            ("gfx90a:+", false, false, false),
            ("", false, false, false),
            ("sm_90", false, false, false),
            ("GFX90A", false, false, false),
            ("gfx9999", false, false, false),
        ];
        for &(arch, r5, r6, r7) in table {
            assert_eq!(knows_arch(5, arch), r5, "ROCm 5, {arch:?}");
            assert_eq!(knows_arch(6, arch), r6, "ROCm 6, {arch:?}");
            assert_eq!(knows_arch(7, arch), r7, "ROCm 7, {arch:?}");
            assert_eq!(
                knows_arch(8, arch),
                r7,
                "ROCm 8 gets ROCm 7's list, {arch:?}"
            );
            assert!(!knows_arch(4, arch), "ROCm 4, {arch:?}");
        }
    }

    #[test]
    fn problems_are_sentences() {
        let v52 = RocmVersion {
            major: 5,
            minor: 2,
            patch: 21153,
        };
        let p = arch_problem(v52, "gfx942").unwrap();
        assert!(p.starts_with("ROCm 5.2 does not know gfx942: "), "{p}");
        assert!(p.contains("gfx90a"), "{p}");
        let p = arch_problem(v52, "gfx1030:xnack+").unwrap();
        assert!(p.contains("gfx1030 has no xnack target feature"), "{p}");
        assert!(arch_problem(v52, "gfx90a:sramecc+:xnack-").is_none());
    }

    #[test]
    fn versions_from_file_names() {
        assert_eq!(
            so_version("libhiprtc.so.6.2.60200", "libhiprtc.so"),
            Some((6, Some(2)))
        );
        assert_eq!(
            so_version("libhiprtc.so.7", "libhiprtc.so"),
            Some((7, None))
        );
        assert_eq!(so_version("libhiprtc.so", "libhiprtc.so"), None);
        assert_eq!(so_version("libhiprtc-builtins.so.6", "libhiprtc.so"), None);
    }

    #[test]
    fn target_options_are_recognised() {
        for o in [
            "--offload-arch=gfx942",
            "-offload-arch=gfx942",
            "--gpu-architecture=gfx942",
            "--cuda-gpu-arch=gfx942",
            "-mcpu=gfx942",
            "-march=gfx942",
            " --offload-arch=gfx942",
        ] {
            assert!(names_a_target(o), "{o}");
        }
        for o in [
            "-O3",
            "-DPA_WAVE=64",
            "-std=c++17",
            "-ffast-math",
            "-mwavefrontsize64",
        ] {
            assert!(!names_a_target(o), "{o}");
        }
    }

    const DOUBLE: &str = r#"extern "C" __global__ void k(float* p) { p[threadIdx.x] *= 2.0f; }"#;

    /// hiprtc's version, or `None` after printing SKIP and the reason.
    fn hiprtc_or_skip(test: &str) -> Option<RocmVersion> {
        match hiprtc_status() {
            Ok(s) => {
                eprintln!("{test}: hiprtc {s}");
                hiprtc_version().ok()
            }
            Err(why) => {
                eprintln!("SKIP {test}: {why}");
                None
            }
        }
    }

    #[test]
    fn compiles_a_kernel_to_a_code_object() {
        let Some(_) = hiprtc_or_skip("compiles_a_kernel_to_a_code_object") else {
            return;
        };
        for arch in ["gfx90a", "gfx90a:sramecc+:xnack-", "gfx1030"] {
            let obj = compile(DOUBLE, "double.hip", arch, &[]).unwrap();
            assert!(
                obj.is_elf() || obj.is_offload_bundle(),
                "{arch}: {} bytes, starting {:?}",
                obj.code.len(),
                &obj.code[..obj.code.len().min(8)]
            );
            eprintln!(
                "{arch}: {} bytes ({})",
                obj.code.len(),
                if obj.is_elf() {
                    "ELF"
                } else {
                    "offload bundle"
                }
            );
        }
    }

    #[test]
    fn unknown_targets_are_refused_before_hiprtc_sees_them() {
        let Some(version) = hiprtc_or_skip("unknown_targets_are_refused_before_hiprtc_sees_them")
        else {
            return;
        };
        let mut unknown = vec!["gfx9999", "gfx1030:xnack+", "gfx90a:foo+"];
        if version.major == 5 {
            unknown.extend(["gfx942", "gfx940", "gfx1100", "gfx1200"]);
        }
        for arch in unknown {
            let e = compile(DOUBLE, "double.hip", arch, &[]).unwrap_err();
            let m = e.to_string();
            assert!(matches!(e, Error::Device { .. }), "{m}");
            assert!(m.contains(&format!("does not know {arch}")), "{m}");
            eprintln!("{arch}: {m}");
        }
        let e = compile(
            DOUBLE,
            "double.hip",
            "gfx90a",
            &["--offload-arch=gfx942".to_string()],
        )
        .unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
    }

    #[test]
    fn compile_errors_carry_the_log() {
        let Some(_) = hiprtc_or_skip("compile_errors_carry_the_log") else {
            return;
        };
        let bad = r#"extern "C" __global__ void k(float* p) { p[0] = undeclared_name; }"#;
        let m = compile(bad, "bad.hip", "gfx90a", &[])
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("hiprtc failed to compile bad.hip for gfx90a"),
            "{m}"
        );
        assert!(m.contains("undeclared_name"), "the log is missing: {m}");
    }

    /// What hiprtc accepts without any include (it pre-includes its own HIP runtime header):
    /// the constructs the kernels use must compile; the others are reported.
    #[test]
    fn reports_what_hiprtc_accepts() {
        let Some(_) = hiprtc_or_skip("reports_what_hiprtc_accepts") else {
            return;
        };
        let needed: &[(&str, &str)] = &[
            (
                "__AMDGCN_WAVEFRONT_SIZE",
                r#"static_assert(__AMDGCN_WAVEFRONT_SIZE == 64, "gfx90a is wave64");
                   extern "C" __global__ void k(int* p) { p[0] = __AMDGCN_WAVEFRONT_SIZE; }"#,
            ),
            (
                "warpSize",
                r#"extern "C" __global__ void k(int* p) { p[0] = warpSize; }"#,
            ),
            (
                "__shfl_xor",
                r#"extern "C" __global__ void k(float* p) {
                       p[threadIdx.x] = __shfl_xor(p[threadIdx.x], 1); }"#,
            ),
            (
                "uint4 / make_uint4",
                r#"extern "C" __global__ void k(uint4* p) {
                       p[threadIdx.x] = make_uint4(1u, 2u, 3u, 4u); }"#,
            ),
            (
                "expf",
                r#"extern "C" __global__ void k(float* p) { p[threadIdx.x] = expf(p[threadIdx.x]); }"#,
            ),
            (
                "__int_as_float",
                r#"extern "C" __global__ void k(float* p, const int* q) {
                       p[threadIdx.x] = __int_as_float(q[threadIdx.x]); }"#,
            ),
            (
                "__launch_bounds__",
                r#"extern "C" __global__ void __launch_bounds__(256) k(float* p) {
                       p[threadIdx.x] *= 2.0f; }"#,
            ),
            (
                "extern __shared__ float s[]",
                r#"extern "C" __global__ void k(float* p) {
                       extern __shared__ float s[];
                       s[threadIdx.x] = p[threadIdx.x]; __syncthreads();
                       p[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x]; }"#,
            ),
            (
                "uint32_t / uint64_t / size_t without an include",
                r#"extern "C" __global__ void k(uint32_t* a, uint64_t* b, size_t* c) {
                       a[0] = 1; b[0] = 2; c[0] = 3; }"#,
            ),
            (
                "#include <hip/hip_runtime.h>",
                "#include <hip/hip_runtime.h>\n\
                 extern \"C\" __global__ void k(float* p) { p[threadIdx.x] *= 2.0f; }",
            ),
        ];
        let others: &[(&str, &str)] = &[
            (
                "int8_t / uint16_t without an include",
                r#"extern "C" __global__ void k(int8_t* a, uint16_t* b) { a[0] = 1; b[0] = 2; }"#,
            ),
            (
                "#include <stdint.h>",
                "#include <stdint.h>\n\
                 extern \"C\" __global__ void k(uint32_t* p) { p[0] = UINT32_MAX; }",
            ),
            (
                "INFINITY / FLT_MAX / INT_MAX",
                r#"extern "C" __global__ void k(float* p) { p[0] = INFINITY + FLT_MAX + INT_MAX; }"#,
            ),
            (
                "__shfl_xor_sync",
                r#"extern "C" __global__ void k(float* p) {
                       p[threadIdx.x] = __shfl_xor_sync(~0ull, p[threadIdx.x], 1); }"#,
            ),
            (
                "#include <hip/hip_fp16.h>",
                "#include <hip/hip_fp16.h>\n\
                 extern \"C\" __global__ void k(__half* p) { p[0] = __float2half(1.0f); }",
            ),
            (
                "__half without an include",
                r#"extern "C" __global__ void k(__half* p) {
                       p[0] = __float2half(__half2float(p[0]) * 2.0f); }"#,
            ),
            (
                "__HIP_PLATFORM_AMD__ defined",
                "#ifndef __HIP_PLATFORM_AMD__\n#error \"__HIP_PLATFORM_AMD__ undefined\"\n#endif\n\
                 extern \"C\" __global__ void k(int* p) { p[0] = 1; }",
            ),
            (
                "__HIPCC_RTC__ defined",
                "#ifndef __HIPCC_RTC__\n#error \"__HIPCC_RTC__ undefined\"\n#endif\n\
                 extern \"C\" __global__ void k(int* p) { p[0] = 1; }",
            ),
        ];
        let mut failed = Vec::new();
        for (group, cases) in [("needed", needed), ("other", others)] {
            for (what, src) in cases {
                match compile(src, "probe.hip", "gfx90a", &[]) {
                    Ok(_) => eprintln!("hiprtc gfx90a [{group}] OK    {what}"),
                    Err(e) => {
                        let m = e.to_string();
                        let first = m
                            .lines()
                            .find(|l| l.contains("error:"))
                            .unwrap_or(&m)
                            .to_string();
                        eprintln!("hiprtc gfx90a [{group}] FAILS {what}: {first}");
                        if group == "needed" {
                            failed.push(format!("{what}: {m}"));
                        }
                    }
                }
            }
        }
        // The wavefront follows the target: 32 on RDNA.
        let wave32 = r#"static_assert(__AMDGCN_WAVEFRONT_SIZE == 32, "gfx1030 is wave32");
                        extern "C" __global__ void k(int* p) { p[0] = warpSize; }"#;
        if let Err(e) = compile(wave32, "wave32.hip", "gfx1030", &[]) {
            failed.push(format!("wave32 on gfx1030: {e}"));
        }
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }
}
