//! [`HipDevice`]: one AMD GPU, opened once per ordinal and shared, with one non-blocking
//! stream that every operation of polyattn on that GPU runs on (uploads, kernels, downloads),
//! so stream order is the only synchronisation needed; and the record of a sticky fault.
//!
//! HIP has no context object to bind: the current device is per thread (`hipSetDevice`), so
//! every call here first makes the device current on the calling thread, as the CUDA runtime
//! binds its context.

use std::collections::HashMap;
use std::ffi::c_int;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use super::module::HipModule;
use super::runtime::{runtime, Runtime, StreamHandle, STREAM_NON_BLOCKING};
use super::{device_error, probe, HipDeviceInfo, HipError, HIP_SUCCESS};
use crate::error::Result;

/// `hipError_t` values that mean the device is unusable after a kernel fault (numbers from
/// `hip/hip_runtime_api.h`, the same in the ROCm/HIP tags `rocm-5.2.3` and `rocm-6.2.2`).
mod code {
    use super::HipError;
    /// `hipErrorECCNotCorrectable`.
    pub(super) const ECC_NOT_CORRECTABLE: HipError = 214;
    /// `hipErrorIllegalAddress`.
    pub(super) const ILLEGAL_ADDRESS: HipError = 700;
    /// `hipErrorLaunchTimeOut`.
    pub(super) const LAUNCH_TIME_OUT: HipError = 702;
    /// `hipErrorAssert`.
    pub(super) const ASSERT: HipError = 710;
    /// `hipErrorLaunchFailure`.
    pub(super) const LAUNCH_FAILURE: HipError = 719;
}

/// Where an error code came from: a launch call reports argument problems with codes that
/// elsewhere mean a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// `hipModuleLaunchKernel` itself.
    Launch,
    /// Any other call (synchronisations and copies, which report a kernel's fault).
    Other,
}

/// Whether `code`, returned by a call of `origin`, means the device is unusable: a kernel's
/// illegal address, assert, timeout or uncorrectable ECC error. `hipErrorLaunchFailure`
/// counts only from a synchronisation or copy: `hipModuleLaunchKernel` itself returns it for
/// a block larger than the kernel's launch bounds (ROCm/hipamd `rocm-5.2.3` and ROCm/clr
/// `rocm-6.2.2`, `hip_module.cpp`), which is the caller's mistake, not a fault.
pub(super) fn is_sticky(code: HipError, origin: Origin) -> bool {
    match code {
        code::ILLEGAL_ADDRESS
        | code::ASSERT
        | code::LAUNCH_TIME_OUT
        | code::ECC_NOT_CORRECTABLE => true,
        code::LAUNCH_FAILURE => origin == Origin::Other,
        _ => false,
    }
}

/// The device's stream handle. HIP handles are process-wide: any thread may pass one to the
/// runtime, which locks its own state (a stream's queue for each command it adds, a function
/// for the length of a launch), and the handle is only ever passed to it, never dereferenced
/// here, so it may move between and be shared by threads.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stream(pub(super) StreamHandle);

// SAFETY: see the type's docs: a handle that only the (thread-safe) runtime dereferences.
unsafe impl Send for Stream {}
// SAFETY: as for `Send`.
unsafe impl Sync for Stream {}

/// Everything opened once per GPU ordinal.
pub(super) struct HipInner {
    pub(super) info: HipDeviceInfo,
    /// The ordinal as the runtime takes it.
    pub(super) dev: c_int,
    pub(super) stream: Stream,
    pub(super) rt: &'static Runtime,
    /// Loaded modules by the caller's key, for the life of the device.
    pub(super) modules: Mutex<HashMap<String, Arc<HipModule>>>,
    /// The first sticky fault seen on this device, with what was running: every later call
    /// reports it instead of the runtime's repeat of the code on some unrelated operation.
    pub(super) fault: OnceLock<String>,
}

impl Drop for HipInner {
    fn drop(&mut self) {
        // Devices live in a process-wide table, so this runs only if that table is ever
        // cleared; the modules (fields) are unloaded after it, which needs no stream.
        // SAFETY: the stream was created on this device and is destroyed once, here.
        unsafe {
            if (self.rt.set_device)(self.dev) == HIP_SUCCESS {
                let _ = (self.rt.stream_destroy)(self.stream.0);
            }
        }
    }
}

/// An AMD GPU through the HIP runtime: its probed description and the non-blocking stream
/// all of polyattn's work on it runs on. Opened once per ordinal and shared (cloning is an
/// `Arc` clone); equal when the ordinals are equal.
#[derive(Clone)]
pub struct HipDevice {
    pub(super) inner: Arc<HipInner>,
}

impl PartialEq for HipDevice {
    fn eq(&self, other: &Self) -> bool {
        self.inner.info.ordinal == other.inner.info.ordinal
    }
}

impl Eq for HipDevice {}

impl fmt::Debug for HipDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipDevice")
            .field("ordinal", &self.inner.info.ordinal)
            .field("name", &self.inner.info.name)
            .field("arch", &self.inner.info.arch)
            .finish()
    }
}

/// "AMD Instinct MI250X (gfx90a:sramecc+:xnack-, wave64, 110 CUs, ROCm 6.2)": the name is
/// given "AMD " unless it starts with it already.
pub(super) fn describe(info: &HipDeviceInfo) -> String {
    let name = if info.name.starts_with("AMD ") {
        info.name.clone()
    } else {
        format!("AMD {}", info.name)
    };
    format!(
        "{name} ({}, wave{}, {} CUs, ROCm {})",
        info.arch, info.wavefront_size, info.compute_units, info.runtime_version
    )
}

impl HipDevice {
    /// Opens AMD GPU `ordinal` (or returns the already open one): probes it ([`probe`]),
    /// makes it current and creates its non-blocking stream. Errors
    /// ([`crate::error::Error::Device`], never a panic) when ROCm is missing, there is no AMD
    /// GPU ("no AMD GPU (hipGetDeviceCount: hipErrorNoDevice)"), the ordinal does not exist,
    /// its ROCm cannot compile for it, or the stream cannot be created.
    pub fn new(ordinal: usize) -> Result<Self> {
        static OPEN: OnceLock<Mutex<HashMap<usize, Arc<HipInner>>>> = OnceLock::new();
        let map = OPEN.get_or_init(|| Mutex::new(HashMap::new()));
        let mut open = map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(inner) = open.get(&ordinal) {
            return Ok(HipDevice {
                inner: inner.clone(),
            });
        }
        let info = probe(ordinal)
            .map_err(|why| device_error(format!("cannot open AMD GPU {ordinal}: {why}")))?;
        let rt = runtime()
            .map_err(|why| device_error(format!("cannot open AMD GPU {ordinal}: {why}")))?;
        let dev = c_int::try_from(ordinal)
            .map_err(|_| device_error(format!("AMD GPU {ordinal} does not exist")))?;
        let fail = |what: &str, code: HipError| {
            device_error(format!(
                "cannot open AMD GPU {ordinal} ({}): {what}: {}",
                info.name,
                rt.describe(code)
            ))
        };
        // SAFETY: an ordinal the probe found.
        let code = unsafe { (rt.set_device)(dev) };
        if code != HIP_SUCCESS {
            return Err(fail("hipSetDevice", code));
        }
        let mut stream: StreamHandle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the flag is hipStreamNonBlocking.
        let code = unsafe { (rt.stream_create_with_flags)(&mut stream, STREAM_NON_BLOCKING) };
        if code != HIP_SUCCESS || stream.is_null() {
            return Err(fail("hipStreamCreateWithFlags(hipStreamNonBlocking)", code));
        }
        let inner = Arc::new(HipInner {
            info,
            dev,
            stream: Stream(stream),
            rt,
            modules: Mutex::new(HashMap::new()),
            fault: OnceLock::new(),
        });
        open.insert(ordinal, inner.clone());
        Ok(HipDevice { inner })
    }

    /// What [`probe`] found: name, full target ID, wavefront size, compute units, shared
    /// memory per block, ROCm version.
    pub fn info(&self) -> &HipDeviceInfo {
        &self.inner.info
    }

    /// The HIP device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.info.ordinal
    }

    /// The GPU's name ("AMD Instinct MI250X").
    pub fn name(&self) -> &str {
        &self.inner.info.name
    }

    /// The full target ID with its features (`gfx90a:sramecc+:xnack-`): what code for this
    /// GPU is compiled for ([`crate::device::hip::compile_cached`]'s `arch`).
    pub fn arch(&self) -> &str {
        &self.inner.info.arch
    }

    /// Threads per wavefront: 64 on CDNA, 32 on RDNA.
    pub fn wavefront_size(&self) -> u32 {
        self.inner.info.wavefront_size
    }

    /// A one-line description: `AMD <name> (<arch>, wave<N>, <CUs> CUs, ROCm x.y)`, e.g.
    /// "AMD Instinct MI250X (gfx90a:sramecc+:xnack-, wave64, 110 CUs, ROCm 6.2)".
    pub fn description(&self) -> String {
        describe(&self.inner.info)
    }

    /// The fault that made this device unusable, if one was reported: a kernel's illegal
    /// address, assert, timeout or uncorrectable ECC error, named with the operation that
    /// reported it. Every later call returns one error naming it; the process must be
    /// restarted to use the GPU again. (A GPU page fault usually never gets here: ROCm's HSA runtime aborts the
    /// process from its fault handler, "Memory access fault by GPU node-N", ROCm/hcc#1150,
    /// ROCm/hip#2097.)
    pub fn fault(&self) -> Option<&str> {
        self.inner.fault.get().map(String::as_str)
    }

    /// `Ok` unless the device has faulted: then the one error every later call returns,
    /// naming the original fault.
    pub(super) fn check_healthy(&self) -> Result<()> {
        match self.fault() {
            None => Ok(()),
            Some(f) => Err(device_error(format!(
                "AMD GPU {} is unusable after an earlier fault ({f}); polyattn stops using a \
                 device after a kernel fault (its memory and queues can no longer be trusted): \
                 restart the process",
                self.ordinal()
            ))),
        }
    }

    /// The runtime table.
    pub(super) fn rt(&self) -> &'static Runtime {
        self.inner.rt
    }

    /// The device's stream.
    pub(super) fn stream(&self) -> StreamHandle {
        self.inner.stream.0
    }

    /// `Ok` for `hipSuccess`; else the error "`what` on AMD GPU n: hipErrorX (sentence)",
    /// recorded as the device's fault when sticky (see [`is_sticky`]).
    pub(super) fn check(&self, what: &str, code: HipError, origin: Origin) -> Result<()> {
        if code == HIP_SUCCESS {
            return Ok(());
        }
        let message = format!(
            "{what} on AMD GPU {}: {}",
            self.ordinal(),
            self.rt().describe(code)
        );
        if is_sticky(code, origin) {
            self.inner.fault.get_or_init(|| message.clone());
        }
        Err(device_error(message))
    }

    /// Makes the device current on the calling thread (HIP's current device is per thread)
    /// after checking that it has not faulted.
    pub(super) fn bind(&self) -> Result<()> {
        self.check_healthy()?;
        // SAFETY: an ordinal the probe found.
        let code = unsafe { (self.rt().set_device)(self.inner.dev) };
        self.check("hipSetDevice", code, Origin::Other)
    }

    /// Makes the device current without the health check, for the frees and unloads of
    /// `Drop`, which must run whatever happened before. `false` when that failed.
    pub(super) fn bind_for_release(&self) -> bool {
        // SAFETY: an ordinal the probe found.
        unsafe { (self.rt().set_device)(self.inner.dev) == HIP_SUCCESS }
    }

    /// Waits until all work queued on the device's stream has finished; a kernel's fault
    /// surfaces here (and is recorded, see [`HipDevice::fault`]).
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the device's live stream.
        let code = unsafe { (self.rt().stream_synchronize)(self.stream()) };
        self.check("hipStreamSynchronize", code, Origin::Other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::hip::RocmVersion;
    use crate::error::Error;

    fn mi250x() -> HipDeviceInfo {
        HipDeviceInfo {
            ordinal: 0,
            name: "AMD Instinct MI250X".into(),
            arch: "gfx90a:sramecc+:xnack-".into(),
            wavefront_size: 64,
            compute_units: 110,
            max_shared_memory_per_block: 65536,
            runtime_version: RocmVersion {
                major: 6,
                minor: 2,
                patch: 41134,
            },
        }
    }

    #[test]
    fn descriptions_name_the_target_and_wavefront() {
        assert_eq!(
            describe(&mi250x()),
            "AMD Instinct MI250X (gfx90a:sramecc+:xnack-, wave64, 110 CUs, ROCm 6.2)"
        );
        let rdna = HipDeviceInfo {
            name: "Radeon RX 6900 XT".into(),
            arch: "gfx1030".into(),
            wavefront_size: 32,
            compute_units: 40,
            ..mi250x()
        };
        assert_eq!(
            describe(&rdna),
            "AMD Radeon RX 6900 XT (gfx1030, wave32, 40 CUs, ROCm 6.2)"
        );
    }

    /// The handles may be shared by the threads of a server (a backend holds them in `Arc`s).
    #[test]
    fn handles_are_send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<HipDevice>();
        both::<crate::device::hip::HipStorage>();
        both::<crate::device::hip::HipFunction>();
        both::<crate::device::hip::KernArgs>();
    }

    #[test]
    fn faults_are_sticky_but_argument_errors_are_not() {
        for c in [700, 710, 702, 214] {
            assert!(is_sticky(c, Origin::Other), "{c}");
            assert!(is_sticky(c, Origin::Launch), "{c}");
        }
        // hipErrorLaunchFailure: a fault from a synchronisation, a launch-bounds violation
        // from the launch call.
        assert!(is_sticky(719, Origin::Other));
        assert!(!is_sticky(719, Origin::Launch));
        // Out of memory, invalid value, not found, no device: ordinary errors.
        for c in [1, 2, 98, 100, 101, 500] {
            assert!(!is_sticky(c, Origin::Other), "{c}");
        }
    }

    /// On a machine without an AMD GPU (this CI), opening one is a typed error naming the
    /// reason, never a panic; where ROCm is missing too, the reason says so.
    #[test]
    fn new_reports_a_missing_gpu_as_an_error() {
        let libs = crate::device::hip::library::amdhip64().map(|_| ());
        match HipDevice::new(0) {
            Ok(dev) => {
                eprintln!("HIP device 0: {} ({dev:?})", dev.description());
                assert_eq!(dev, HipDevice::new(0).unwrap());
                dev.synchronize().unwrap();
                assert!(dev.fault().is_none());
            }
            Err(e) => {
                let m = e.to_string();
                match &libs {
                    Err(why) => eprintln!("SKIP (no libamdhip64: {why}); HipDevice::new(0): {m}"),
                    Ok(()) => eprintln!("HipDevice::new(0): {m}"),
                }
                assert!(
                    matches!(&e, Error::Device { backend, .. } if backend == "hip"),
                    "{e:?}"
                );
                assert!(m.contains("cannot open AMD GPU 0"), "{m}");
                assert!(!m.contains('\n'), "{m}");
                if libs.is_ok() && crate::device::hip::device_count().is_err() {
                    assert!(m.contains("no AMD GPU"), "{m}");
                }
            }
        }
        // An ordinal past any device: an error, never a panic.
        assert!(HipDevice::new(usize::MAX).is_err());
    }
}
