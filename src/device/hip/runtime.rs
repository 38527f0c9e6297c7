//! The HIP runtime functions the device side calls (streams, memory, modules, launches),
//! resolved once in `libamdhip64` into a table of plain function pointers, every one required:
//! a runtime that lacks one is reported when a device is opened, not halfway through a step.
//!
//! Signatures from `hip/hip_runtime_api.h` of the ROCm/HIP tags `rocm-5.2.3` and
//! `rocm-6.2.2` (and its newest `develop`), which agree on every one of them. The handles
//! (`hipStream_t`, `hipModule_t`, `hipFunction_t`) are opaque pointers, and `hipDeviceptr_t`
//! is `void*` (`hip/driver_types.h`).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use super::{library, HipError};

/// `hipStream_t`: `struct ihipStream_t*`.
pub(super) type StreamHandle = *mut c_void;
/// `hipModule_t`: `struct ihipModule_t*`.
pub(super) type ModuleHandle = *mut c_void;
/// `hipFunction_t`: `struct ihipModuleSymbol_t*`.
pub(super) type FunctionHandle = *mut c_void;

/// `hipStreamNonBlocking` (`#define hipStreamNonBlocking 0x01`, the same in ROCm 5.2.3 and
/// 6.2.2): the stream does not synchronise with the null stream, so work other libraries
/// queue there does not serialise with ours.
pub(super) const STREAM_NON_BLOCKING: c_uint = 0x01;

/// `HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`, the first member (0) of `hipFunction_attribute`
/// (`hip/driver_types.h`, ROCm 5.2.3 and 6.2.2): the kernel's launch bounds.
pub(super) const FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 0;
/// `HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES` (1): the kernel's static shared memory (LDS).
pub(super) const FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: c_int = 1;

library::bindings! {
    /// The HIP runtime functions of the device side, with their C declarations.
    struct RuntimeApi {
        /// `const char* hipGetErrorString(hipError_t hipError)`.
        fn hipGetErrorString(HipError) -> *const c_char;
        /// `hipError_t hipSetDevice(int deviceId)`.
        fn hipSetDevice(c_int) -> HipError;
        /// `hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int flags)`.
        fn hipStreamCreateWithFlags(*mut StreamHandle, c_uint) -> HipError;
        /// `hipError_t hipStreamDestroy(hipStream_t stream)`.
        fn hipStreamDestroy(StreamHandle) -> HipError;
        /// `hipError_t hipStreamSynchronize(hipStream_t stream)`.
        fn hipStreamSynchronize(StreamHandle) -> HipError;
        /// `hipError_t hipMalloc(void** ptr, size_t size)`.
        fn hipMalloc(*mut *mut c_void, usize) -> HipError;
        /// `hipError_t hipFree(void* ptr)`.
        fn hipFree(*mut c_void) -> HipError;
        /// `hipError_t hipMemsetAsync(void* dst, int value, size_t sizeBytes,
        /// hipStream_t stream)`.
        fn hipMemsetAsync(*mut c_void, c_int, usize, StreamHandle) -> HipError;
        /// `hipError_t hipMemcpyHtoDAsync(hipDeviceptr_t dst, void* src, size_t sizeBytes,
        /// hipStream_t stream)` (the source is not written, though not declared `const`).
        fn hipMemcpyHtoDAsync(*mut c_void, *mut c_void, usize, StreamHandle) -> HipError;
        /// `hipError_t hipMemcpyDtoHAsync(void* dst, hipDeviceptr_t src, size_t sizeBytes,
        /// hipStream_t stream)`.
        fn hipMemcpyDtoHAsync(*mut c_void, *mut c_void, usize, StreamHandle) -> HipError;
        /// `hipError_t hipMemcpyDtoDAsync(hipDeviceptr_t dst, hipDeviceptr_t src,
        /// size_t sizeBytes, hipStream_t stream)`.
        fn hipMemcpyDtoDAsync(*mut c_void, *mut c_void, usize, StreamHandle) -> HipError;
        /// `hipError_t hipModuleLoadData(hipModule_t* module, const void* image)`.
        fn hipModuleLoadData(*mut ModuleHandle, *const c_void) -> HipError;
        /// `hipError_t hipModuleUnload(hipModule_t module)`.
        fn hipModuleUnload(ModuleHandle) -> HipError;
        /// `hipError_t hipModuleGetFunction(hipFunction_t* function, hipModule_t module,
        /// const char* kname)`.
        fn hipModuleGetFunction(*mut FunctionHandle, ModuleHandle, *const c_char) -> HipError;
        /// `hipError_t hipFuncGetAttribute(int* value, hipFunction_attribute attrib,
        /// hipFunction_t hfunc)`.
        fn hipFuncGetAttribute(*mut c_int, c_int, FunctionHandle) -> HipError;
        /// `hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gridDimX,
        /// unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX,
        /// unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes,
        /// hipStream_t stream, void** kernelParams, void** extra)`.
        fn hipModuleLaunchKernel(
            FunctionHandle,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            StreamHandle,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> HipError;
    }
}

/// A C function pointer of the table.
type Fn1<A, R> = unsafe extern "C" fn(A) -> R;
type Fn2<A, B, R> = unsafe extern "C" fn(A, B) -> R;
type Fn3<A, B, C, R> = unsafe extern "C" fn(A, B, C) -> R;
type Fn4<A, B, C, D, R> = unsafe extern "C" fn(A, B, C, D) -> R;
/// `hipModuleLaunchKernel`'s type.
type LaunchFn = unsafe extern "C" fn(
    FunctionHandle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    StreamHandle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> HipError;

/// Every function the device side calls, resolved (see [`RuntimeApi`] for the declarations).
pub(super) struct Runtime {
    pub(super) get_error_string: Fn1<HipError, *const c_char>,
    pub(super) set_device: Fn1<c_int, HipError>,
    pub(super) stream_create_with_flags: Fn2<*mut StreamHandle, c_uint, HipError>,
    pub(super) stream_destroy: Fn1<StreamHandle, HipError>,
    pub(super) stream_synchronize: Fn1<StreamHandle, HipError>,
    pub(super) malloc: Fn2<*mut *mut c_void, usize, HipError>,
    pub(super) free: Fn1<*mut c_void, HipError>,
    pub(super) memset_async: Fn4<*mut c_void, c_int, usize, StreamHandle, HipError>,
    pub(super) memcpy_htod_async: Fn4<*mut c_void, *mut c_void, usize, StreamHandle, HipError>,
    pub(super) memcpy_dtoh_async: Fn4<*mut c_void, *mut c_void, usize, StreamHandle, HipError>,
    pub(super) memcpy_dtod_async: Fn4<*mut c_void, *mut c_void, usize, StreamHandle, HipError>,
    pub(super) module_load_data: Fn2<*mut ModuleHandle, *const c_void, HipError>,
    pub(super) module_unload: Fn1<ModuleHandle, HipError>,
    pub(super) module_get_function: Fn3<*mut FunctionHandle, ModuleHandle, *const c_char, HipError>,
    pub(super) func_get_attribute: Fn3<*mut c_int, c_int, FunctionHandle, HipError>,
    pub(super) module_launch_kernel: LaunchFn,
}

impl Runtime {
    /// Resolves every function, or names the first one `libamdhip64` lacks.
    fn load() -> std::result::Result<Runtime, String> {
        let api = RuntimeApi::resolve(library::amdhip64()?);
        Ok(Runtime {
            get_error_string: api.hipGetErrorString()?,
            set_device: api.hipSetDevice()?,
            stream_create_with_flags: api.hipStreamCreateWithFlags()?,
            stream_destroy: api.hipStreamDestroy()?,
            stream_synchronize: api.hipStreamSynchronize()?,
            malloc: api.hipMalloc()?,
            free: api.hipFree()?,
            memset_async: api.hipMemsetAsync()?,
            memcpy_htod_async: api.hipMemcpyHtoDAsync()?,
            memcpy_dtoh_async: api.hipMemcpyDtoHAsync()?,
            memcpy_dtod_async: api.hipMemcpyDtoDAsync()?,
            module_load_data: api.hipModuleLoadData()?,
            module_unload: api.hipModuleUnload()?,
            module_get_function: api.hipModuleGetFunction()?,
            func_get_attribute: api.hipFuncGetAttribute()?,
            module_launch_kernel: api.hipModuleLaunchKernel()?,
        })
    }

    /// "hipErrorOutOfMemory (out of memory)": the enum's name and the runtime's sentence.
    pub(super) fn describe(&self, code: HipError) -> String {
        let name = match super::api() {
            Ok(api) => api.error_name(code),
            Err(_) => format!("hipError {code}"),
        };
        // SAFETY: takes an integer; returns a pointer to a static string or null.
        let p = unsafe { (self.get_error_string)(code) };
        if p.is_null() {
            return name;
        }
        // SAFETY: non-null, NUL-terminated, static in the runtime.
        let text = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        if text.is_empty() || text == name {
            name
        } else {
            format!("{name} ({text})")
        }
    }
}

/// The device-side runtime table, resolved once. `Err` is the sentence to report.
pub(super) fn runtime() -> std::result::Result<&'static Runtime, String> {
    static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(Runtime::load)
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where libamdhip64 loads, every device-side symbol is in it (ROCm 5.2 here), and error
    /// codes read as their names.
    #[test]
    fn every_device_symbol_resolves() {
        if let Err(why) = library::amdhip64() {
            eprintln!("SKIP every_device_symbol_resolves: {why}");
            return;
        }
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(why) => panic!("libamdhip64 loads but lacks a device function: {why}"),
        };
        let m = rt.describe(2);
        assert!(m.starts_with("hipErrorOutOfMemory"), "{m}");
        let m = rt.describe(700);
        assert!(m.starts_with("hipErrorIllegalAddress"), "{m}");
        eprintln!("hipError 2: {}; 100: {}", rt.describe(2), rt.describe(100));
    }
}
