//! The CUDA device: one driver context per GPU ordinal, opened once and cached, with one
//! stream that every operation of polyattn on that GPU runs on (uploads, kernels, downloads),
//! so stream order is the only synchronisation needed.
//!
//! The driver (`libcuda`) is loaded at run time through cudarc's `dynamic-loading`; nothing
//! CUDA is needed to build. cudarc panics when a library is missing, so [`driver_status`] probes
//! with `is_culib_present()` first and every entry point goes through it: a machine without
//! CUDA gets an [`Error::Device`] with the reason, never a panic.
//!
//! cudarc's per-buffer event tracking is switched off for polyattn's contexts: all work runs on
//! the device's single stream, and buffers are freed stream-ordered (`cuMemFreeAsync`) or after
//! a stream synchronisation, so a buffer is never freed while a queued kernel still uses it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaModule, CudaSlice, CudaStream, DevicePtr, DriverError};

use super::CpuStorage;
use crate::dtype::DType;
use crate::error::{Error, Result};

fn device_error(message: impl Into<String>) -> Error {
    Error::Device {
        backend: "cuda".into(),
        message: message.into(),
    }
}

fn driver_error(what: &str, e: DriverError) -> Error {
    device_error(format!("{what}: {e}"))
}

fn driver_status() -> std::result::Result<i32, String> {
    static STATUS: OnceLock<std::result::Result<i32, String>> = OnceLock::new();
    STATUS
        .get_or_init(|| {
            // SAFETY: only tries to dlopen the library names; no symbol is called.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                return Err(
                    "libcuda.so not found (no NVIDIA driver on this machine, or it is \
                            not on the loader path)"
                        .into(),
                );
            }
            let probe = std::panic::catch_unwind(|| {
                let mut v: std::ffi::c_int = 0;
                // SAFETY: the library is present; cuInit and cuDriverGetVersion take plain
                // integers / an out-pointer to a local.
                unsafe {
                    let init = cudarc::driver::sys::cuInit(0);
                    if init != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
                        return Err(format!("cuInit failed: {init:?}"));
                    }
                    let r = cudarc::driver::sys::cuDriverGetVersion(&mut v);
                    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
                        return Err(format!("cuDriverGetVersion failed: {r:?}"));
                    }
                }
                Ok(v)
            });
            probe.unwrap_or_else(|_| Err("the CUDA driver library could not be used".into()))
        })
        .clone()
}

/// Everything opened once per GPU ordinal.
struct CudaInner {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    capability: (u32, u32),
    driver_version: i32,
    sm_count: u32,
    max_smem_optin: u32,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
}

/// A CUDA GPU: its driver context (opened once per ordinal and shared) and the stream that
/// all of polyattn's work on it runs on. Equal when the ordinals are equal.
#[derive(Clone)]
pub struct CudaDevice {
    inner: Arc<CudaInner>,
}

impl PartialEq for CudaDevice {
    fn eq(&self, other: &Self) -> bool {
        self.inner.ordinal == other.inner.ordinal
    }
}

impl Eq for CudaDevice {}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.inner.ordinal)
            .field("name", &self.inner.name)
            .field("capability", &self.inner.capability)
            .finish()
    }
}

impl CudaDevice {
    /// Whether the CUDA driver library can be loaded and initialised here (probed once;
    /// never panics). `Ok(version)` carries the driver's CUDA version as
    /// `major * 1000 + minor * 10` (13000 for CUDA 13.0); `Err` says why not.
    pub fn driver_status() -> std::result::Result<i32, String> {
        driver_status()
    }

    /// Opens GPU `ordinal` (or returns the already open one). Errors when the driver is
    /// missing, the ordinal does not exist, or the context cannot be created.
    pub fn new(ordinal: usize) -> Result<Self> {
        static OPEN: OnceLock<Mutex<HashMap<usize, Arc<CudaInner>>>> = OnceLock::new();
        let driver_version = driver_status().map_err(device_error)?;
        let map = OPEN.get_or_init(|| Mutex::new(HashMap::new()));
        let mut open = map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(inner) = open.get(&ordinal) {
            return Ok(CudaDevice {
                inner: inner.clone(),
            });
        }
        let inner = std::panic::catch_unwind(|| Self::open(ordinal, driver_version))
            .unwrap_or_else(|_| {
                Err(device_error(format!(
                    "opening CUDA device {ordinal} panicked inside the driver bindings \
                     (a driver older than CUDA 13.0 may lack a symbol)"
                )))
            })?;
        let inner = Arc::new(inner);
        open.insert(ordinal, inner.clone());
        Ok(CudaDevice { inner })
    }

    fn open(ordinal: usize, driver_version: i32) -> Result<CudaInner> {
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| driver_error(&format!("cannot open CUDA device {ordinal}"), e))?;
        // SAFETY: called before any buffer of this context exists; polyattn runs everything on
        // one stream per device (module docs), so cudarc's cross-stream events are not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_error("cannot create a CUDA stream", e))?;
        let name = ctx.name().map_err(|e| driver_error("cuDeviceGetName", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_error("compute capability", e))?;
        let sm_count = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| driver_error("multiprocessor count", e))?;
        let max_smem_optin = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|e| driver_error("shared memory per block", e))?;
        Ok(CudaInner {
            ordinal,
            ctx,
            stream,
            name,
            capability: (major.max(0) as u32, minor.max(0) as u32),
            driver_version,
            sm_count: sm_count.max(1) as u32,
            max_smem_optin: max_smem_optin.max(0) as u32,
            modules: Mutex::new(HashMap::new()),
        })
    }

    /// The GPU ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The GPU's name ("NVIDIA H200").
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Compute capability `(major, minor)`, e.g. `(9, 0)` for Hopper.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.inner.capability
    }

    /// The driver's CUDA version, `major * 1000 + minor * 10`.
    pub fn driver_version(&self) -> i32 {
        self.inner.driver_version
    }

    /// Streaming multiprocessors (for work-list sizing).
    pub fn sm_count(&self) -> u32 {
        self.inner.sm_count
    }

    /// The most dynamic shared memory one block may opt in to, in bytes.
    pub fn max_shared_memory_per_block(&self) -> u32 {
        self.inner.max_smem_optin
    }

    /// The driver context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// The stream all of polyattn's work on this device runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// A one-line description: name, compute capability, driver version.
    pub fn description(&self) -> String {
        let (ma, mi) = self.inner.capability;
        let dv = self.inner.driver_version;
        format!(
            "cuda:{} {} (sm_{ma}{mi}, {} SMs, driver CUDA {}.{})",
            self.inner.ordinal,
            self.inner.name,
            self.inner.sm_count,
            dv / 1000,
            (dv % 1000) / 10
        )
    }

    /// Waits until all work queued on the device's stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .stream
            .synchronize()
            .map_err(|e| driver_error("stream synchronize", e))
    }

    /// `len` zeros of `dtype`.
    pub fn zeros(&self, len: usize, dtype: DType) -> Result<CudaStorage> {
        let bytes = len * dtype.size_in_bytes();
        let buf = self
            .inner
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| driver_error(&format!("allocating {bytes} bytes"), e))?;
        Ok(CudaStorage { buf, bytes })
    }

    /// Uploads host storage (its elements must be of `dtype`).
    pub fn upload(&self, host: &CpuStorage, _dtype: DType) -> Result<CudaStorage> {
        let src = host.as_bytes();
        let mut s = self.zeros_bytes(src.len())?;
        if !src.is_empty() {
            self.inner
                .stream
                .memcpy_htod(src, &mut s.buf.slice_mut(..src.len()))
                .map_err(|e| driver_error("host-to-device copy", e))?;
        }
        Ok(s)
    }

    /// Downloads to host storage of `dtype` (waits for the work queued before it).
    pub fn download(&self, s: &CudaStorage, dtype: DType) -> Result<CpuStorage> {
        let mut host = vec![0u8; s.bytes];
        if s.bytes > 0 {
            self.inner
                .stream
                .memcpy_dtoh(&s.buf.slice(..s.bytes), &mut host)
                .map_err(|e| driver_error("device-to-host copy", e))?;
            self.synchronize()?;
        }
        Ok(CpuStorage::from_bytes(&host, dtype))
    }

    /// Queues a zero fill of `s` on the device's stream.
    pub fn fill_zeros(&self, s: &mut CudaStorage) -> Result<()> {
        self.inner
            .stream
            .memset_zeros(&mut s.buf)
            .map_err(|e| driver_error("memset", e))
    }

    /// Queues a device-to-device copy of `src` into `dst` (`dst` at least as large).
    pub fn copy(&self, src: &CudaStorage, dst: &mut CudaStorage) -> Result<()> {
        if dst.bytes < src.bytes {
            return Err(device_error(format!(
                "copy of {} bytes into a buffer of {}",
                src.bytes, dst.bytes
            )));
        }
        self.inner
            .stream
            .memcpy_dtod(&src.buf, &mut dst.buf)
            .map_err(|e| driver_error("device-to-device copy", e))
    }

    /// An uninitialised-looking (zeroed) buffer of `bytes` bytes.
    pub(crate) fn zeros_bytes(&self, bytes: usize) -> Result<CudaStorage> {
        self.zeros(bytes, DType::Fp8E4m3)
    }

    /// Uploads plain-old-data values into a new buffer (for kernel metadata).
    pub(crate) fn upload_pod<T: bytemuck::Pod>(&self, data: &[T]) -> Result<CudaStorage> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.upload(&CpuStorage::U8(bytes.to_vec()), DType::Fp8E4m3)
    }

    /// The module cached under `key`, or the one `build` produces (a cubin or PTX image),
    /// loaded into this device's context and cached for the life of the process.
    pub fn module(
        &self,
        key: &str,
        build: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<Arc<CudaModule>> {
        let mut modules = self.inner.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modules.get(key) {
            return Ok(m.clone());
        }
        let mut image = build()?;
        if image.last() != Some(&0) {
            image.push(0); // a PTX image must be NUL-terminated; a cubin ignores the extra byte
        }
        let module = self
            .inner
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(image))
            .map_err(|e| driver_error(&format!("loading module {key}"), e))?;
        modules.insert(key.to_string(), module.clone());
        Ok(module)
    }
}

/// A buffer on a [`CudaDevice`]: raw bytes whose element type is the owning tensor's dtype.
///
/// `Clone` allocates a new buffer and queues a device-to-device copy on the device's stream
/// (cloning never aliases). Like `Vec::clone` on allocation failure, a failed clone (device out
/// of memory) panics; use [`CudaStorage::try_clone`] to get the error instead.
pub struct CudaStorage {
    buf: CudaSlice<u8>,
    bytes: usize,
}

impl CudaStorage {
    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// A device copy of this buffer.
    pub fn try_clone(&self) -> Result<Self> {
        let buf = self
            .buf
            .try_clone()
            .map_err(|e| driver_error("device-to-device copy", e))?;
        Ok(CudaStorage {
            buf,
            bytes: self.bytes,
        })
    }

    /// The raw device address, for kernel arguments. Valid while `self` lives; work that uses
    /// it must be queued on the device's stream (frees are ordered after it).
    pub fn device_ptr(&self) -> u64 {
        let (ptr, _sync) = self.buf.device_ptr(self.buf.stream());
        ptr
    }
}

impl Clone for CudaStorage {
    fn clone(&self) -> Self {
        match self.try_clone() {
            Ok(s) => s,
            Err(e) => panic!("CudaStorage::clone failed: {e}"),
        }
    }
}

impl fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaStorage")
            .field("bytes", &self.bytes)
            .finish()
    }
}
