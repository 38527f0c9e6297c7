//! Launching a compiled kernel: grid limits checked before the launch (a typed error, not a
//! driver failure that names no size), the dynamic shared-memory limit raised where a kernel
//! needs more than the default 48 KiB, the device's health checked (a sticky fault is
//! reported, not repeated), and one parameter block passed by value.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::error::{Error, Result};

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
