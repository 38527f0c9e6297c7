//! The HIP runtime for AMD GPUs: finding ROCm at run time, probing a GPU ([`probe`]: its
//! name, full target ID, wavefront size, compute units, shared memory), and compiling HIP C++
//! with hiprtc ([`hiprtc`]). Nothing ROCm is needed to build: `libamdhip64` and hiprtc are
//! opened with `dlopen` when first used, through thin bindings of our own (over
//! `libloading`), because ROCm 5 keeps hiprtc inside `libamdhip64` (there is no
//! `libhiprtc.so` before ROCm 6), which the Rust ROCm crates do not look for.
//!
//! Every entry point reports a missing library, a missing symbol, a missing GPU or an
//! architecture this ROCm cannot compile for as a sentence (the probes) or an
//! [`Error::Device`] (the compiler): never a panic, and never a call that would abort the
//! process (hiprtc aborts on a target its LLVM does not know, so [`hiprtc::compile`] checks
//! the target against the ROCm version first, [`hiprtc::knows_arch`]).
//!
//! The device side: [`HipDevice`] opens a GPU once per ordinal with one non-blocking stream
//! that all of polyattn's work on it runs on, and records a sticky fault; [`HipStorage`] is
//! its memory (uploads, downloads, zero fills, device-to-device copies); its modules are
//! loaded from code objects and cached by key ([`HipDevice::function`]), the code objects
//! themselves on disk ([`compile_cached`]); [`HipDevice::launch`] checks a launch and passes
//! the arguments by value in their C layout ([`KernArgs`]). The functions it calls are
//! resolved once and all required (`runtime`), so a runtime that lacks one is reported when a
//! device is opened.
//!
//! Two things of HIP's ABI change between ROCm versions and are handled per major version:
//! - `hipDeviceProp_t` grew from 792 bytes (ROCm 5, `hipGetDeviceProperties`, the layout
//!   ROCm 6 renamed `hipDeviceProp_tR0000`) to 1472 bytes (ROCm 6 and 7,
//!   `hipGetDevicePropertiesR0600`), and `gcnArchName` moved from offset 396 to 1160; the
//!   struct is read into an oversized zeroed buffer, so a larger struct cannot overrun it.
//! - `hipDeviceAttribute_t`: the three attributes read here have the same numbers in every
//!   header from ROCm 5.0 to 7.x (checked, see `attribute_ids`), but they are looked up per
//!   version so that a renumbering is one table row.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;

use crate::error::Error;

mod buffer;
mod device;
mod launch;
mod library;
mod module;
mod runtime;
mod tensor_io;

pub mod hiprtc;

pub use crate::device::disk_cache::cache_dir;
pub use buffer::HipStorage;
pub use device::HipDevice;
pub use launch::{KernArgs, MAX_THREADS_PER_BLOCK};
pub use module::{compile_cached, HipFunction};

/// The error every HIP entry point returns (`backend: "hip"`).
fn device_error(message: impl Into<String>) -> Error {
    Error::Device {
        backend: "hip".into(),
        message: message.into(),
    }
}

/// `hipError_t` (a C enum: `int` on Linux); `hipSuccess` is 0.
type HipError = c_int;
const HIP_SUCCESS: HipError = 0;

library::bindings! {
    /// The HIP runtime functions the probe uses. Signatures from `hip/hip_runtime_api.h`
    /// (ROCm 5.2.3 and 6.2.2, ROCm/HIP tags `rocm-5.2.3` / `rocm-6.2.2`; unchanged in ROCm 7's
    /// `projects/hip` of ROCm/rocm-systems).
    struct HipApi {
        /// `hipError_t hipRuntimeGetVersion(int* runtimeVersion)`.
        fn hipRuntimeGetVersion(*mut c_int) -> HipError;
        /// `hipError_t hipGetDeviceCount(int* count)`.
        fn hipGetDeviceCount(*mut c_int) -> HipError;
        /// `hipError_t hipGetDeviceProperties(hipDeviceProp_t* prop, int deviceId)`: the
        /// ROCm 5 layout (ROCm 6's `hipDeviceProp_tR0000`).
        fn hipGetDeviceProperties(*mut c_void, c_int) -> HipError;
        /// `hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600* prop, int deviceId)`
        /// (ROCm ≥ 6; symbol version `hip_6.0`).
        fn hipGetDevicePropertiesR0600(*mut c_void, c_int) -> HipError;
        /// `hipError_t hipDeviceGetAttribute(int* pi, hipDeviceAttribute_t attr, int deviceId)`.
        fn hipDeviceGetAttribute(*mut c_int, c_int, c_int) -> HipError;
        /// `const char* hipGetErrorName(hipError_t hip_error)`.
        fn hipGetErrorName(HipError) -> *const c_char;
    }
}

/// The HIP runtime's function table, resolved once in `libamdhip64`.
fn api() -> std::result::Result<&'static HipApi, String> {
    static API: std::sync::OnceLock<std::result::Result<HipApi, String>> =
        std::sync::OnceLock::new();
    API.get_or_init(|| library::amdhip64().map(HipApi::resolve))
        .as_ref()
        .map_err(Clone::clone)
}

impl HipApi {
    /// `hipErrorNoDevice` for 100: the enum's name, from the runtime itself.
    fn error_name(&self, e: HipError) -> String {
        let Ok(f) = self.hipGetErrorName() else {
            return format!("hipError {e}");
        };
        // SAFETY: takes an integer; returns a pointer to a static string or null.
        let p = unsafe { f(e) };
        if p.is_null() {
            return format!("hipError {e}");
        }
        // SAFETY: non-null, NUL-terminated, static in the runtime.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// `Ok` for `hipSuccess`, else "`what`: `hipErrorX`".
    fn check(&self, what: &str, code: HipError) -> std::result::Result<(), String> {
        if code == HIP_SUCCESS {
            Ok(())
        } else {
            Err(format!("{what}: {}", self.error_name(code)))
        }
    }
}

/// A ROCm (HIP runtime) version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RocmVersion {
    /// 5 for ROCm 5.2.
    pub major: u32,
    /// 2 for ROCm 5.2.
    pub minor: u32,
    /// HIP's patch (build) number, 21153 for Debian's 5.2.21153; 0 where unknown.
    pub patch: u32,
}

impl RocmVersion {
    /// Decodes `HIP_VERSION` as `hipRuntimeGetVersion` returns it:
    /// `major * 10_000_000 + minor * 100_000 + patch` (`hip/hip_version.h`), so 50221153 is
    /// 5.2.21153. `None` for a negative value.
    pub fn from_hip_version(v: i32) -> Option<Self> {
        let v = u32::try_from(v).ok()?;
        Some(RocmVersion {
            major: v / 10_000_000,
            minor: (v / 100_000) % 100,
            patch: v % 100_000,
        })
    }
}

impl fmt::Display for RocmVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What [`probe`] found on one AMD GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HipDeviceInfo {
    /// The HIP device ordinal.
    pub ordinal: usize,
    /// The marketing name (`AMD Instinct MI250X`).
    pub name: String,
    /// The full target ID, `gcnArchName`, with its target features
    /// (`gfx90a:sramecc+:xnack-`): what hiprtc's `--offload-arch=` wants for this GPU.
    pub arch: String,
    /// Threads per wavefront: 64 on CDNA (gfx9), 32 on RDNA (gfx10+).
    pub wavefront_size: u32,
    /// Compute units (`hipDeviceAttributeMultiprocessorCount`; on RDNA in WGP mode, half the
    /// CUs: one per workgroup processor).
    pub compute_units: u32,
    /// Maximum shared memory (LDS) per block, in bytes.
    pub max_shared_memory_per_block: usize,
    /// The HIP runtime's ROCm version.
    pub runtime_version: RocmVersion,
}

impl HipDeviceInfo {
    /// The processor without its target features: `gfx90a` for `gfx90a:sramecc+:xnack-`.
    pub fn base_arch(&self) -> &str {
        base_arch(&self.arch)
    }
}

/// The processor of a target ID: the part before the first ':'.
pub(crate) fn base_arch(arch: &str) -> &str {
    arch.split(':').next().unwrap_or(arch)
}

/// Whether the HIP runtime (`libamdhip64`) can be loaded here, and its ROCm version (probed
/// once; needs no GPU; never panics). `Err` says why not, as a sentence.
pub fn runtime_status() -> std::result::Result<RocmVersion, String> {
    static STATUS: std::sync::OnceLock<std::result::Result<RocmVersion, String>> =
        std::sync::OnceLock::new();
    STATUS
        .get_or_init(|| {
            let api = api()?;
            let mut v: c_int = 0;
            let f = api.hipRuntimeGetVersion()?;
            // SAFETY: out-pointer to a local.
            api.check("hipRuntimeGetVersion", unsafe { f(&mut v) })?;
            let version = RocmVersion::from_hip_version(v)
                .ok_or_else(|| format!("hipRuntimeGetVersion returned {v}, not a version"))?;
            if version.major < 5 {
                return Err(format!(
                    "ROCm {version} is too old: polyattn's HIP bindings follow the headers of \
                     ROCm 5.0 and later"
                ));
            }
            Ok(version)
        })
        .clone()
}

/// How many AMD GPUs the HIP runtime sees. `Err` is the reason there are none usable:
/// "no AMD GPU (hipGetDeviceCount: hipErrorNoDevice)" on a machine without one.
pub fn device_count() -> std::result::Result<usize, String> {
    runtime_status()?;
    let api = api()?;
    let f = api.hipGetDeviceCount()?;
    let mut n: c_int = 0;
    // SAFETY: out-pointer to a local.
    let code = unsafe { f(&mut n) };
    if code != HIP_SUCCESS {
        return Err(format!(
            "no AMD GPU (hipGetDeviceCount: {})",
            api.error_name(code)
        ));
    }
    match usize::try_from(n) {
        Ok(0) | Err(_) => Err("no AMD GPU (hipGetDeviceCount found 0 devices)".into()),
        Ok(n) => Ok(n),
    }
}

/// The `hipDeviceAttribute_t` numbers the probe reads, for one ROCm major version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AttributeIds {
    /// `hipDeviceAttributeWarpSize`.
    warp_size: c_int,
    /// `hipDeviceAttributeMultiprocessorCount`.
    multiprocessor_count: c_int,
    /// `hipDeviceAttributeMaxSharedMemoryPerBlock`.
    max_shared_memory_per_block: c_int,
}

/// The attribute numbers for ROCm `major`. Counted from the `hipDeviceAttribute_t` of
/// `hip/hip_runtime_api.h` (compiled and printed against the ROCm/HIP tags `rocm-5.0.0`,
/// `rocm-5.2.3`, `rocm-5.7.1`, `rocm-6.0.0`, `rocm-6.2.2`, and counted by hand in ROCm 7's
/// `projects/hip/include/hip/hip_runtime_api.h` of ROCm/rocm-systems): the same in all of
/// them. ROCm 6 renamed five attributes `hipDeviceAttributeUnused1..5` and appended new ones
/// after `hipDeviceAttributeWarpSize`, and ROCm 7 added an alias (`PciDomainId`) that takes
/// no number, so nothing at or before these three moved.
fn attribute_ids(major: u32) -> AttributeIds {
    ATTRIBUTE_IDS
        .iter()
        .rev()
        .find(|(first, _)| *first <= major)
        .map_or(ATTRIBUTE_IDS[0].1, |&(_, ids)| ids)
}

/// (first ROCm major version, its numbers): a row per renumbering. One row: ROCm 5.x, 6.x
/// and 7.x agree (see [`attribute_ids`]).
const ATTRIBUTE_IDS: &[(u32, AttributeIds)] = &[(
    5,
    AttributeIds {
        warp_size: 87,
        multiprocessor_count: 63,
        max_shared_memory_per_block: 74,
    },
)];

/// Where `gcnArchName` (a `char[256]`) sits in the `hipDeviceProp_t` of ROCm `major`, and the
/// properties function that fills that layout. Offsets from `offsetof` compiled against the
/// ROCm/HIP headers: 396 in the 792-byte struct of tags `rocm-5.0.0` … `rocm-5.7.1`
/// (`hipGetDeviceProperties`), 1160 in the 1472-byte `hipDeviceProp_tR0600` of `rocm-6.0.0` …
/// `rocm-6.2.2` (`hipGetDevicePropertiesR0600`), whose member list ROCm 7's header keeps
/// unchanged. `name` (`char[256]`) is at offset 0 in both.
fn arch_name_offset(major: u32) -> usize {
    if major >= 6 {
        1160
    } else {
        396
    }
}

/// Bytes handed to `hipGetDeviceProperties*`: much larger than any layout (1472 bytes in
/// ROCm 7), 8-byte aligned (the struct holds `size_t`s and pointers), and zeroed.
#[repr(C, align(8))]
struct PropsBuffer([u8; 8192]);

/// A NUL-terminated string of at most `len` bytes at `at` in `bytes`.
fn c_string_at(bytes: &[u8], at: usize, len: usize) -> String {
    let field = &bytes[at.min(bytes.len())..(at + len).min(bytes.len())];
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Probes AMD GPU `ordinal`: its name, full target ID, wavefront size, compute units, shared
/// memory per block and the runtime's ROCm version (never panics). `Err` is the reason it
/// cannot be used, as a sentence: "libamdhip64 not found (…)", "no AMD GPU
/// (hipGetDeviceCount: hipErrorNoDevice)", "AMD GPU 3 does not exist (2 found)", or
/// "ROCm 5.2 does not know gfx1200 (…)" when its hiprtc could not compile for the GPU.
///
/// The target ID comes from `hipDeviceProp_t::gcnArchName`, read at the offset of the
/// runtime's major version: it is the only documented, portable source of the full ID with
/// its xnack / sramecc features (`hipDeviceGetAttribute` has no string attributes, and the
/// KFD topology in sysfs is Linux-only and gives a number without the features).
pub fn probe(ordinal: usize) -> std::result::Result<HipDeviceInfo, String> {
    let version = runtime_status()?;
    let count = device_count()?;
    if ordinal >= count {
        return Err(format!("AMD GPU {ordinal} does not exist ({count} found)"));
    }
    let api = api()?;
    let dev = c_int::try_from(ordinal).map_err(|_| format!("AMD GPU {ordinal} does not exist"))?;

    let mut props = Box::new(PropsBuffer([0u8; 8192]));
    let (get_props, what) = if version.major >= 6 {
        (
            api.hipGetDevicePropertiesR0600()?,
            "hipGetDevicePropertiesR0600",
        )
    } else {
        (api.hipGetDeviceProperties()?, "hipGetDeviceProperties")
    };
    // SAFETY: the buffer is larger than this version's struct and suitably aligned.
    api.check(what, unsafe {
        get_props(props.0.as_mut_ptr().cast::<c_void>(), dev)
    })?;
    let name = c_string_at(&props.0, 0, 256);
    let arch = c_string_at(&props.0, arch_name_offset(version.major), 256);
    if !arch.starts_with("gfx") {
        return Err(format!(
            "{what} of ROCm {version} gave no gfx target for AMD GPU {ordinal} (read {arch:?}): \
             an hipDeviceProp_t layout polyattn does not know"
        ));
    }

    let ids = attribute_ids(version.major);
    let get_attr = api.hipDeviceGetAttribute()?;
    let attr = |id: c_int, label: &str| -> std::result::Result<c_int, String> {
        let mut v: c_int = 0;
        // SAFETY: out-pointer to a local; the attribute number is from this version's header.
        api.check(&format!("hipDeviceGetAttribute({label})"), unsafe {
            get_attr(&mut v, id, dev)
        })?;
        Ok(v)
    };
    let non_negative = |v: c_int, label: &str| {
        u32::try_from(v).map_err(|_| format!("hipDeviceGetAttribute({label}) returned {v}"))
    };
    let wavefront_size = non_negative(attr(ids.warp_size, "WarpSize")?, "WarpSize")?;
    let compute_units = non_negative(
        attr(ids.multiprocessor_count, "MultiprocessorCount")?,
        "MultiprocessorCount",
    )?;
    let smem = non_negative(
        attr(ids.max_shared_memory_per_block, "MaxSharedMemoryPerBlock")?,
        "MaxSharedMemoryPerBlock",
    )?;

    if let Some(problem) = hiprtc::arch_problem(version, &arch) {
        return Err(format!("{problem} ({name}, AMD GPU {ordinal})"));
    }
    Ok(HipDeviceInfo {
        ordinal,
        name,
        arch,
        wavefront_size,
        compute_units,
        max_shared_memory_per_block: smem as usize,
        runtime_version: version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hip_version_decodes() {
        assert_eq!(
            RocmVersion::from_hip_version(50221153),
            Some(RocmVersion {
                major: 5,
                minor: 2,
                patch: 21153
            })
        );
        let v = RocmVersion::from_hip_version(60241134).unwrap();
        assert_eq!((v.major, v.minor, v.patch), (6, 2, 41134));
        assert_eq!(v.to_string(), "6.2");
        assert_eq!(RocmVersion::from_hip_version(-1), None);
    }

    #[test]
    fn layouts_per_major_version() {
        assert_eq!(arch_name_offset(5), 396);
        assert_eq!(arch_name_offset(6), 1160);
        assert_eq!(arch_name_offset(7), 1160);
        for major in [5, 6, 7] {
            let ids = attribute_ids(major);
            assert_eq!(
                (
                    ids.warp_size,
                    ids.multiprocessor_count,
                    ids.max_shared_memory_per_block
                ),
                (87, 63, 74)
            );
        }
        assert!(std::mem::size_of::<PropsBuffer>() >= 4 * 1472);
        assert_eq!(std::mem::align_of::<PropsBuffer>(), 8);
    }

    #[test]
    fn strings_are_read_up_to_the_nul() {
        let mut b = vec![0u8; 600];
        b[396..396 + 22].copy_from_slice(b"gfx90a:sramecc+:xnack-");
        assert_eq!(c_string_at(&b, 396, 256), "gfx90a:sramecc+:xnack-");
        assert_eq!(c_string_at(&b, 0, 256), "");
        // A field without NUL stops at its length, and one past the end reads as empty.
        let full = vec![b'x'; 300];
        assert_eq!(c_string_at(&full, 0, 256).len(), 256);
        assert_eq!(c_string_at(&full, 400, 256), "");
        assert_eq!(base_arch("gfx90a:sramecc+:xnack-"), "gfx90a");
        assert_eq!(base_arch("gfx1030"), "gfx1030");
    }

    /// Prints what the probe sees; a failure must be a one-line sentence naming the reason.
    #[test]
    fn probe_reports_a_device_or_a_reason() {
        match runtime_status() {
            Ok(v) => eprintln!("HIP runtime: ROCm {v} ({v:?})"),
            Err(why) => eprintln!("HIP runtime unavailable: {why}"),
        }
        match probe(0) {
            Ok(info) => {
                eprintln!("HIP device 0: {info:?}");
                assert!(info.arch.starts_with("gfx"), "{info:?}");
                assert!(matches!(info.wavefront_size, 32 | 64), "{info:?}");
                assert!(info.compute_units > 0, "{info:?}");
            }
            Err(why) => {
                eprintln!("HIP device 0 unavailable: {why}");
                assert!(!why.trim().is_empty());
                assert!(!why.contains('\n'), "{why}");
                assert!(
                    ["libamdhip64", "AMD GPU", "ROCm", "hip"]
                        .iter()
                        .any(|w| why.contains(w)),
                    "the reason names nothing: {why}"
                );
            }
        }
        // Past the last device: an error, never a panic.
        assert!(probe(usize::MAX).is_err());
    }
}
