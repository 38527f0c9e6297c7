//! The CUDA runtime: one driver context per GPU ordinal, opened once and cached, with one
//! stream that every operation of polyattn on that GPU runs on (uploads, kernels, downloads),
//! so stream order is the only synchronisation needed; and what running a kernel of the CUDA
//! family takes — compiling it with NVRTC for the device's architecture ([`compile`], the
//! module cache and the on-disk cubin cache) and launching it with its parameter block. It
//! takes the family's plain types (`crate::kernels::cuda`: a `KernelSource`, the `-D` options
//! of a variant, a `#[repr(C)]` block) and knows nothing of the backends that choose them.
//!
//! The driver (`libcuda`) is loaded at run time through cudarc's `dynamic-loading`; nothing
//! CUDA is needed to build. cudarc panics when a library is missing, so
//! [`CudaDevice::driver_status`] probes with `is_culib_present()` first and every entry point
//! goes through it: a machine without CUDA gets an [`Error::Device`] with the reason, never a
//! panic.
//!
//! cudarc's per-buffer event tracking is switched off for polyattn's contexts: all work runs on
//! the device's single stream, and buffers are freed stream-ordered (`cuMemFreeAsync`) or after
//! a stream synchronisation, so a buffer is never freed while a queued kernel still uses it.
//!
//! CUDA graphs ([`CudaDevice::capture`], [`CudaGraph::replay`]): the work a closure queues is
//! recorded instead of run, and replayed later with one launch (vLLM's full CUDA graphs for
//! decode steps). While a thread captures, [`CudaDevice::stream`] returns, *on that thread
//! only*, a private capture stream of the device: other threads that share the device keep
//! queueing real work on the main stream, which never leaks into the graph (a capture of the
//! shared stream would swallow their kernels and fail their synchronisations). Replays run on
//! the main stream, ordered with everything else.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{self as cu, CUdevice_attribute};
use cudarc::driver::{CudaContext, CudaModule, CudaSlice, CudaStream, DevicePtr, DriverError};

use super::CpuStorage;
use crate::dtype::DType;
use crate::error::{Error, Result};

mod launch;
mod nccl;
mod nvrtc;

pub(crate) use launch::{launch, launch_dependent};
pub use nccl::{nccl_status, NcclComms};
pub use nvrtc::{
    arch_for, base_options, compile, nvrtc_status, parse_ptxas_report, CompileOutput, PtxasReport,
};
pub(crate) use nvrtc::{function, function_for};

fn device_error(message: impl Into<String>) -> Error {
    Error::Device {
        backend: "cuda".into(),
        message: message.into(),
    }
}

fn driver_error(what: &str, e: DriverError) -> Error {
    device_error(format!("{what}: {e}"))
}

/// Whether a driver error leaves the context unusable: after a kernel faults (an illegal
/// address, a trap, a hardware exception) every later call on that context fails with the
/// same code, whatever it is.
fn is_sticky(e: &DriverError) -> bool {
    use cu::cudaError_enum as E;
    matches!(
        e.0,
        E::CUDA_ERROR_ILLEGAL_ADDRESS
            | E::CUDA_ERROR_LAUNCH_FAILED
            | E::CUDA_ERROR_LAUNCH_TIMEOUT
            | E::CUDA_ERROR_ASSERT
            | E::CUDA_ERROR_HARDWARE_STACK_ERROR
            | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | E::CUDA_ERROR_MISALIGNED_ADDRESS
            | E::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | E::CUDA_ERROR_INVALID_PC
            | E::CUDA_ERROR_ECC_UNCORRECTABLE
    )
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

thread_local! {
    /// The ordinal of the device this thread is capturing a graph on, if any.
    static CAPTURING: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Everything opened once per GPU ordinal.
struct CudaInner {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The stream captures record on (created on the first capture); see the module docs.
    capture_stream: OnceLock<Arc<CudaStream>>,
    /// Held for the length of a capture: one capture at a time per device.
    capture_lock: Mutex<()>,
    name: String,
    capability: (u32, u32),
    driver_version: i32,
    sm_count: u32,
    max_smem_optin: u32,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
    /// The first sticky fault seen on this context, with what was running: every later call
    /// reports it instead of the driver's repeat of the code on some unrelated operation.
    fault: OnceLock<String>,
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

    /// The number of CUDA GPUs the driver sees (0 without a driver), counted without opening
    /// a context on any.
    pub fn count() -> usize {
        if driver_status().is_err() {
            return 0;
        }
        std::panic::catch_unwind(CudaContext::device_count)
            .ok()
            .and_then(|c| c.ok())
            .map_or(0, |c| usize::try_from(c).unwrap_or(0))
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
            capture_stream: OnceLock::new(),
            capture_lock: Mutex::new(()),
            name,
            capability: (major.max(0) as u32, minor.max(0) as u32),
            driver_version,
            sm_count: sm_count.max(1) as u32,
            max_smem_optin: max_smem_optin.max(0) as u32,
            modules: Mutex::new(HashMap::new()),
            fault: OnceLock::new(),
        })
    }

    /// A driver error of an operation on this device; a sticky one is recorded as the
    /// device's fault (see [`CudaDevice::fault`]).
    pub(crate) fn driver_error(&self, what: &str, e: DriverError) -> Error {
        let message = format!("{what}: {e}");
        if is_sticky(&e) {
            self.inner.fault.get_or_init(|| message.clone());
        }
        device_error(message)
    }

    /// The fault that made this device's context unusable, if one happened: a kernel's
    /// illegal address, trap or hardware exception, named with the operation that reported
    /// it. The context cannot recover; the process must be restarted to use the GPU again.
    pub fn fault(&self) -> Option<&str> {
        self.inner.fault.get().map(String::as_str)
    }

    /// `Ok` unless the device has faulted: then the one error every later call returns,
    /// naming the original fault.
    pub(crate) fn check_healthy(&self) -> Result<()> {
        match self.fault() {
            None => Ok(()),
            Some(f) => Err(device_error(format!(
                "CUDA device {} is unusable after an earlier fault ({f}); the driver keeps the \
                 context in error, so every later call fails: restart the process",
                self.inner.ordinal
            ))),
        }
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

    /// The stream all of polyattn's work on this device runs on: the device's main stream,
    /// except on a thread that is inside [`CudaDevice::capture`], which gets the capture
    /// stream (so that the work it queues is recorded into the graph).
    pub fn stream(&self) -> &Arc<CudaStream> {
        if self.is_capturing() {
            if let Some(s) = self.inner.capture_stream.get() {
                return s;
            }
        }
        &self.inner.stream
    }

    /// Whether the calling thread is inside [`CudaDevice::capture`] on this device. Work that
    /// cannot be part of a graph (allocations, host copies, synchronisations, first-time
    /// kernel compilation) checks it and fails with [`Error::Device`] instead.
    pub fn is_capturing(&self) -> bool {
        CAPTURING.with(|c| c.get()) == Some(self.inner.ordinal)
    }

    /// The error for `what`, attempted inside a graph capture.
    pub(crate) fn capture_error(&self, what: &str) -> Error {
        device_error(format!(
            "{what} inside a CUDA graph capture: a captured region may only queue kernels and \
             device-to-device copies on buffers that already exist; allocate, upload and \
             compile before capture (run the step once eagerly first)"
        ))
    }

    /// Records the work `f` queues on this device's stream into a CUDA graph, instantiated
    /// and ready to [`CudaGraph::replay`]; nothing runs during the capture.
    ///
    /// Inside `f`, [`CudaDevice::stream`] (on this thread) is a private capture stream in
    /// thread-local capture mode, so other threads using the device are not affected. What
    /// `f` may do: queue kernels, memsets and device-to-device copies on buffers that exist
    /// before the capture. What fails: allocating, uploading, downloading or synchronising
    /// (checked by this crate, or refused by the driver) and a nested capture. Captures of
    /// one device from several threads are serialised (a second one waits).
    ///
    /// Errors ([`Error::Device`] unless `f` returned its own): when `f` fails (its error is
    /// returned), when the driver invalidated the capture, or when instantiation fails. In
    /// every case, and also when `f` panics, the capture is ended and its partial graph
    /// destroyed, so the device and its streams stay usable.
    ///
    /// The graph holds the *device addresses* `f`'s kernels used, not the buffers: every
    /// buffer they touch (inputs, outputs, KV caches, metadata) must stay alive, and keep its
    /// address, for as long as the graph is replayed. A replay reads their contents at replay
    /// time, which is how a later step feeds new inputs: write the same buffers, then replay.
    pub fn capture(&self, f: impl FnOnce() -> Result<()>) -> Result<CudaGraph> {
        if self.is_capturing() {
            return Err(device_error(
                "CudaDevice::capture called inside a capture of the same device (nested captures \
                 are not supported)",
            ));
        }
        // One capture at a time per device (they share the capture stream): a second thread
        // waits for the first capture to end.
        let _lock = self
            .inner
            .capture_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let stream = match self.inner.capture_stream.get() {
            Some(s) => s.clone(),
            None => {
                let s = self
                    .inner
                    .ctx
                    .new_stream()
                    .map_err(|e| self.driver_error("creating the capture stream", e))?;
                self.inner.capture_stream.get_or_init(|| s).clone()
            }
        };
        make_current(&self.inner.ctx)?;
        // SAFETY: the capture stream is live (owned by the device); thread-local mode only
        // restricts this thread's own calls while it captures.
        unsafe {
            cudarc::driver::result::stream::begin_capture(
                stream.cu_stream(),
                cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| self.driver_error("cuStreamBeginCapture", e))?;
        let guard = CaptureGuard {
            ctx: self.inner.ctx.clone(),
            stream,
            active: true,
        };
        CAPTURING.with(|c| c.set(Some(self.inner.ordinal)));
        let result = f();
        // Ended whatever `f` returned; a graph made here is destroyed on drop if unused.
        let ended = guard.end().map(|(graph, exec)| CudaGraph {
            graph,
            exec,
            device: self.clone(),
        });
        let graph = match (result, ended) {
            (Err(e), _) => return Err(e),
            (Ok(()), Err(e)) => {
                return Err(self.driver_error(
                    "CUDA graph capture failed (the driver invalidated it: something in the \
                     captured region cannot be captured)",
                    e,
                ))
            }
            (Ok(()), Ok(g)) => g,
        };
        // Pre-upload the executable to the device, ordered on the main stream, so the first
        // replay does not pay for it.
        make_current(&self.inner.ctx)?;
        // SAFETY: the executable graph is live (owned by `graph`) and the stream is the
        // device's main stream, which lives as long as the device.
        unsafe { cudarc::driver::result::graph::upload(graph.exec, self.inner.stream.cu_stream()) }
            .map_err(|e| self.driver_error("cuGraphUpload", e))?;
        Ok(graph)
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

    /// Waits until all work queued on the device's stream has finished. An error inside a
    /// graph capture.
    pub fn synchronize(&self) -> Result<()> {
        self.check_healthy()?;
        if self.is_capturing() {
            return Err(self.capture_error("stream synchronize"));
        }
        self.inner
            .stream
            .synchronize()
            .map_err(|e| self.driver_error("stream synchronize", e))
    }

    /// `len` zeros of `dtype`. An error inside a graph capture (a graph must not allocate).
    pub fn zeros(&self, len: usize, dtype: DType) -> Result<CudaStorage> {
        self.check_healthy()?;
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| Error::overflow("CUDA buffer", format!("{len} elements of {dtype}")))?;
        if self.is_capturing() {
            return Err(self.capture_error(&format!("allocating {bytes} bytes")));
        }
        let buf = self
            .inner
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| self.driver_error(&format!("allocating {bytes} bytes"), e))?;
        Ok(CudaStorage { buf, bytes })
    }

    /// Uploads host storage (its elements must be of `dtype`). An error inside a graph
    /// capture.
    pub fn upload(&self, host: &CpuStorage, _dtype: DType) -> Result<CudaStorage> {
        let src = host.as_bytes();
        let mut s = self.zeros_bytes(src.len())?;
        if !src.is_empty() {
            self.inner
                .stream
                .memcpy_htod(src, &mut s.buf.slice_mut(..src.len()))
                .map_err(|e| self.driver_error("host-to-device copy", e))?;
        }
        Ok(s)
    }

    /// Downloads to host storage of `dtype` (waits for the work queued before it). An error
    /// inside a graph capture.
    pub fn download(&self, s: &CudaStorage, dtype: DType) -> Result<CpuStorage> {
        self.check_healthy()?;
        if self.is_capturing() {
            return Err(self.capture_error("a device-to-host copy"));
        }
        let mut host = vec![0u8; s.bytes];
        if s.bytes > 0 {
            self.inner
                .stream
                .memcpy_dtoh(&s.buf.slice(..s.bytes), &mut host)
                .map_err(|e| self.driver_error("device-to-host copy", e))?;
            self.synchronize()?;
        }
        Ok(CpuStorage::from_bytes(&host, dtype))
    }

    /// Queues a zero fill of `s` on the device's stream (capturable).
    pub fn fill_zeros(&self, s: &mut CudaStorage) -> Result<()> {
        self.stream()
            .memset_zeros(&mut s.buf)
            .map_err(|e| self.driver_error("memset", e))
    }

    /// Queues a device-to-device copy of `src` into `dst` (`dst` at least as large;
    /// capturable).
    pub fn copy(&self, src: &CudaStorage, dst: &mut CudaStorage) -> Result<()> {
        if dst.bytes < src.bytes {
            return Err(device_error(format!(
                "copy of {} bytes into a buffer of {}",
                src.bytes, dst.bytes
            )));
        }
        self.stream()
            .memcpy_dtod(&src.buf, &mut dst.buf)
            .map_err(|e| self.driver_error("device-to-device copy", e))
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

    /// Queues a copy of `data` into `dst` at byte `offset`, on the device's stream: ordered
    /// after the work already queued (a replay reading `dst` included), and `data` may be
    /// reused as soon as this returns (the driver stages pageable host memory before the call
    /// returns). Writes through a shared reference because it is the device memory, not the
    /// handle, that changes, exactly as a kernel writing `dst` would. An error inside a graph
    /// capture: updates of persistent buffers happen between replays, outside the graph.
    pub(crate) fn write_pod<T: bytemuck::Pod>(
        &self,
        dst: &CudaStorage,
        offset: usize,
        data: &[T],
    ) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        if self.is_capturing() {
            return Err(self.capture_error("a host-to-device copy"));
        }
        if offset
            .checked_add(bytes.len())
            .is_none_or(|end| end > dst.bytes)
        {
            return Err(device_error(format!(
                "writing {} bytes at offset {offset} into a buffer of {}",
                bytes.len(),
                dst.bytes
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        make_current(&self.inner.ctx)?;
        // SAFETY: `dst` is a live allocation of this context with at least `offset +
        // bytes.len()` bytes (checked above); the copy is queued on the device's main stream,
        // which orders it with every other use of `dst`; the source is host memory that the
        // driver reads (stages) before returning.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                dst.device_ptr() + offset as u64,
                bytes,
                self.inner.stream.cu_stream(),
            )
        }
        .map_err(|e| self.driver_error("host-to-device copy", e))
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
        if self.is_capturing() {
            return Err(
                self.capture_error(&format!("loading kernel module {key} for the first time"))
            );
        }
        let mut image = build()?;
        if image.last() != Some(&0) {
            image.push(0); // a PTX image must be NUL-terminated; a cubin ignores the extra byte
        }
        let module = self
            .inner
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(image))
            .map_err(|e| self.driver_error(&format!("loading module {key}"), e))?;
        modules.insert(key.to_string(), module.clone());
        Ok(module)
    }
}

/// Makes the context current on this thread. Unlike cudarc's `bind_to_thread`, it does not
/// first return (and clear) an error recorded by an earlier drop, which must never stop a
/// capture from ending or a graph from being destroyed.
impl CudaDevice {
    /// Makes this device's context current on the calling thread, if it is not already: the
    /// raw driver calls (function attributes, `cuLaunchKernelEx`) act on the current context,
    /// and one thread may drive several devices (one rank per GPU).
    pub(crate) fn bind(&self) -> Result<()> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(|e| driver_error("binding the CUDA context", e))
    }
}

fn make_current(ctx: &CudaContext) -> Result<()> {
    // SAFETY: `cu_ctx` is the live context owned by `ctx`.
    unsafe { cudarc::driver::result::ctx::set_current(ctx.cu_ctx()) }
        .map_err(|e| driver_error("binding the CUDA context", e))
}

/// Ends a capture: [`CaptureGuard::end`] normally, or on drop when the closure panicked, so
/// the capture stream never stays in capture mode.
struct CaptureGuard {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    active: bool,
}

impl CaptureGuard {
    /// Ends the capture and instantiates what it recorded: `(graph, executable)`, both owned
    /// by the caller.
    fn end(mut self) -> std::result::Result<(cu::CUgraph, cu::CUgraphExec), DriverError> {
        self.active = false;
        CAPTURING.with(|c| c.set(None));
        // SAFETY: `cu_ctx` is live; the stream is live and capturing (begun by `capture`). The
        // graph returned by the driver is destroyed here unless handed to the caller.
        unsafe {
            cudarc::driver::result::ctx::set_current(self.ctx.cu_ctx())?;
            let graph = cudarc::driver::result::stream::end_capture(self.stream.cu_stream())?;
            if graph.is_null() {
                return Err(DriverError(
                    cu::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                ));
            }
            match cudarc::driver::result::graph::instantiate(graph, cu::CUgraphInstantiate_flags(0))
            {
                Ok(exec) => Ok((graph, exec)),
                Err(e) => {
                    let _ = cudarc::driver::result::graph::destroy(graph);
                    Err(e)
                }
            }
        }
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        CAPTURING.with(|c| c.set(None));
        // SAFETY: as in `end`; the graph, if any, is destroyed once, here.
        unsafe {
            if cudarc::driver::result::ctx::set_current(self.ctx.cu_ctx()).is_err() {
                return;
            }
            if let Ok(g) = cudarc::driver::result::stream::end_capture(self.stream.cu_stream()) {
                if !g.is_null() {
                    let _ = cudarc::driver::result::graph::destroy(g);
                }
            }
        }
    }
}

/// An instantiated CUDA graph made by [`CudaDevice::capture`]: the recorded work, replayable
/// with one launch on the device's main stream. Destroyed on drop (a replay still running
/// then finishes first; the driver frees it afterwards).
///
/// What a replay assumes: every buffer the captured kernels used is still alive at the same
/// address (the graph stores addresses, not buffers), and the launch parameters baked into
/// the graph (grid sizes, scalar arguments such as token counts) still describe the inputs.
/// Only buffer *contents* may change between replays.
pub struct CudaGraph {
    graph: cu::CUgraph,
    exec: cu::CUgraphExec,
    device: CudaDevice,
}

// SAFETY: the handles are owned by this value alone and used through `replay` (one driver
// call, made with the context bound on the calling thread) and `Drop` (exclusive). Raw driver
// handles are valid on any thread of the process. Not `Sync`: CUDA graph objects are not
// internally synchronised, so one graph must not be used from two threads at once.
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// Queues one replay on the device's main stream (ordered after everything queued
    /// before, e.g. the uploads of this step's inputs; asynchronous like a kernel launch).
    /// An error inside a capture.
    pub fn replay(&self) -> Result<()> {
        if self.device.is_capturing() {
            return Err(self.device.capture_error("replaying a CUDA graph"));
        }
        let inner = &self.device.inner;
        make_current(&inner.ctx)?;
        // SAFETY: the executable graph is owned by `self` and live; the stream is the device's
        // main stream. The caller keeps the captured buffers alive (type docs).
        self.device.check_healthy()?;
        unsafe { cudarc::driver::result::graph::launch(self.exec, inner.stream.cu_stream()) }
            .map_err(|e| self.device.driver_error("cuGraphLaunch", e))
    }

    /// The device the graph was captured on.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: both handles are owned by `self` and destroyed once; the driver defers the
        // executable's release until replays in flight have finished.
        unsafe {
            let _ = cudarc::driver::result::ctx::set_current(self.device.inner.ctx.cu_ctx());
            let _ = cudarc::driver::result::graph::exec_destroy(self.exec);
            let _ = cudarc::driver::result::graph::destroy(self.graph);
        }
    }
}

impl fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaGraph")
            .field("device", &self.device.inner.ordinal)
            .finish()
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

    /// A device copy of this buffer. An error inside a graph capture (it allocates).
    pub fn try_clone(&self) -> Result<Self> {
        if CAPTURING.with(|c| c.get()).is_some() {
            return Err(device_error(
                "cloning a CUDA buffer inside a CUDA graph capture (it allocates); clone before \
                 the capture",
            ));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel that stores to address 0: the illegal-address fault, written in PTX so the
    /// driver's JIT builds it without NVRTC.
    const FAULTING_PTX: &str = "
.version 7.0
.target sm_50
.address_size 64
.visible .entry polyattn_fault()
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    mov.u64 %rd1, 0;
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
";

    /// Set in the child process that faults (a fault poisons the context of the whole
    /// process, so it must not happen inside the test binary's shared process).
    const CHILD: &str = "CUDA_FAULT_TEST_CHILD";

    #[test]
    fn after_a_fault_every_call_names_the_original_fault() {
        if std::env::var_os(CHILD).is_some() {
            fault_then_check();
            return;
        }
        if let Err(why) = CudaDevice::driver_status()
            .and_then(|_| CudaDevice::new(0).map(|_| ()).map_err(|e| e.to_string()))
        {
            eprintln!(
                "SKIP after_a_fault_every_call_names_the_original_fault: no CUDA device ({why})"
            );
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "device::cuda::tests::after_a_fault_every_call_names_the_original_fault",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "child failed:\n{text}");
        assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
    }

    fn fault_then_check() {
        let dev = CudaDevice::new(0).unwrap();
        assert!(dev.fault().is_none());
        let module = dev
            .inner
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(FAULTING_PTX))
            .unwrap();
        let f = module.load_function("polyattn_fault").unwrap();
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel takes no argument; that it faults is the point of the test.
        let launched = unsafe { dev.stream().launch_builder(&f).launch(cfg) };
        if let Err(e) = launched {
            let _ = dev.driver_error("kernel launch", e);
        }
        let first = dev.synchronize().unwrap_err().to_string();
        let fault = dev.fault().expect("the fault is recorded").to_string();
        assert!(fault.contains("ILLEGAL_ADDRESS"), "{fault}");
        assert!(first.contains("ILLEGAL_ADDRESS"), "{first}");
        // Every later call, whatever it is, names the original fault.
        let later = [
            dev.zeros(16, DType::F32).map(|_| ()).unwrap_err(),
            dev.synchronize().unwrap_err(),
            dev.upload(&CpuStorage::F32(vec![1.0; 4]), DType::F32)
                .map(|_| ())
                .unwrap_err(),
        ];
        for e in later {
            let m = e.to_string();
            assert!(m.contains("earlier fault") && m.contains(&fault), "{m}");
        }
    }
}
