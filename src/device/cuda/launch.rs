//! Launching a compiled kernel: grid limits checked before the launch (a typed error, not a
//! driver failure that names no size), the dynamic shared-memory limit raised where a kernel
//! needs more than the default 48 KiB, the device's health checked (a sticky fault is
//! reported, not repeated), and one parameter block passed by value.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::error::{Error, Result};
use crate::kernels::cuda::CudaTuning;

use super::{device_error, CudaDevice};

/// A parameter block as a kernel argument: the bytes of `P`, passed by value.
#[repr(transparent)]
struct ByValue<P>(P);

// SAFETY: `DeviceRepr` values are handed to the driver as their bytes. A `Pod` value has no
// padding and any bit pattern is valid, so its bytes are all there is to it; that they match
// the kernel's parameter struct is `launch`'s contract with its callers.
unsafe impl<P: bytemuck::Pod> DeviceRepr for ByValue<P> {}

/// Launches `f` on the device's stream with one by-value parameter block (and optionally a
/// second pointer argument), raising the dynamic shared-memory limit first when needed.
/// `params` is passed as its bytes: it must mirror the kernel's parameter struct (the
/// family's blocks assert their sizes against the C++ side).
pub(crate) fn launch<P: bytemuck::Pod>(
    device: &CudaDevice,
    f: &CudaFunction,
    cfg: LaunchConfig,
    params: &P,
    extra_ptr: Option<u64>,
) -> Result<()> {
    launch_with(device, f, cfg, params, extra_ptr, false)
}

/// [`launch`] as a programmatic dependent of the kernel before it on the stream, where the
/// device has dependent launches (sm_90+) and [`CudaTuning::dependent_launch`] allows: the
/// kernel may start launching while that one runs. `f` must open with common.cuh's
/// `PA_DEPENDENT_PROLOGUE()`, which waits for it before anything is read.
pub(crate) fn launch_dependent<P: bytemuck::Pod>(
    device: &CudaDevice,
    f: &CudaFunction,
    cfg: LaunchConfig,
    params: &P,
    extra_ptr: Option<u64>,
) -> Result<()> {
    let dependent = CudaTuning::get().dependent_launch && device.compute_capability().0 >= 9;
    launch_with(device, f, cfg, params, extra_ptr, dependent)
}

fn launch_with<P: bytemuck::Pod>(
    device: &CudaDevice,
    f: &CudaFunction,
    cfg: LaunchConfig,
    params: &P,
    extra_ptr: Option<u64>,
    dependent: bool,
) -> Result<()> {
    if cfg.grid_dim.0 == 0 || cfg.grid_dim.1 == 0 || cfg.grid_dim.2 == 0 {
        return Ok(());
    }
    // The driver's grid limits (x < 2^31, y and z ≤ 65535, 1024 threads a block): a grid
    // past them is a typed error here, not a launch failure that names no size.
    let (gx, gy, gz) = cfg.grid_dim;
    let (bx, by, bz) = cfg.block_dim;
    if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 || bx * by * bz > 1024 {
        return Err(Error::config(format!(
            "a CUDA launch of grid {:?} × block {:?} exceeds the device's limits (grid x < 2^31, \
             y and z ≤ 65535, 1024 threads a block): the batch is too large for one launch",
            cfg.grid_dim, cfg.block_dim
        )));
    }
    device.bind()?;
    if cfg.shared_mem_bytes > 48 * 1024 {
        if cfg.shared_mem_bytes > device.max_shared_memory_per_block() {
            return Err(device_error(format!(
                "kernel needs {} bytes of shared memory; the device allows {}",
                cfg.shared_mem_bytes,
                device.max_shared_memory_per_block()
            )));
        }
        // SAFETY: `f` is a live function of this device's context.
        unsafe {
            cudarc::driver::result::function::set_function_attribute(
                f.cu_function(),
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                cfg.shared_mem_bytes as i32,
            )
        }
        .map_err(|e| device_error(format!("raising the shared-memory limit: {e}")))?;
    }
    device.check_healthy()?;
    let stream = device.stream();
    if dependent {
        return launch_ex(device, f, cfg, params, extra_ptr);
    }
    let block = ByValue(*params);
    let mut b = stream.launch_builder(f);
    b.arg(&block);
    if let Some(p) = extra_ptr.as_ref() {
        b.arg(p);
    }
    // SAFETY: the parameter blocks mirror the kernels' structs (sizes asserted on both
    // sides); every pointer in them belongs to a live buffer of this device sized as the
    // kernel's header requires (checked by the impl before the launch); work is stream-ordered.
    unsafe { b.launch(cfg) }
        .map(|_| ())
        .map_err(|e| device.driver_error("kernel launch", e))
}

/// `cuLaunchKernelEx` with the programmatic-stream-serialization attribute (cudarc's launch
/// builder sets no attributes).
fn launch_ex<P: bytemuck::Pod>(
    device: &CudaDevice,
    f: &CudaFunction,
    cfg: LaunchConfig,
    params: &P,
    extra_ptr: Option<u64>,
) -> Result<()> {
    use cudarc::driver::sys;
    let mut block = *params;
    let mut extra = extra_ptr.unwrap_or(0);
    let mut args: Vec<*mut std::ffi::c_void> = vec![(&mut block as *mut P).cast()];
    if extra_ptr.is_some() {
        args.push((&mut extra as *mut u64).cast());
    }
    // SAFETY: a zeroed attribute is a valid bit pattern (the value is a plain C union); the
    // id and the union member it selects are set right after.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: device.stream().cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: as for `launch`: the parameter blocks mirror the kernels' structs and every
    // pointer in them belongs to a live buffer of this device; `args` points at locals that
    // outlive the call (the driver copies the arguments before it returns); the kernel opens
    // with the dependent prologue, so it reads nothing before the kernel it follows is done.
    let r = unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(device.driver_error("kernel launch", cudarc::driver::DriverError(e))),
    }
}
