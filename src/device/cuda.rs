//! The CUDA (cudarc, driver API) device. SKELETON: the cuda backend work fills this file in.

use super::CpuStorage;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A CUDA (cudarc, driver API) device handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaDevice {
    _private: (),
}

/// A buffer on a CudaDevice.
#[derive(Clone, Debug)]
pub struct CudaStorage {
    _private: (),
}

fn not_built() -> Error {
    Error::Device {
        backend: "cuda".into(),
        message: "the cuda device layer is not built yet".into(),
    }
}

impl CudaDevice {
    /// One-line description.
    pub fn description(&self) -> String {
        "cuda (not built)".into()
    }
    /// Waits for queued work.
    pub fn synchronize(&self) -> Result<()> {
        Err(not_built())
    }
    /// `len` zeros of `dtype`.
    pub fn zeros(&self, _len: usize, _dtype: DType) -> Result<CudaStorage> {
        Err(not_built())
    }
    /// Uploads host storage.
    pub fn upload(&self, _host: &CpuStorage, _dtype: DType) -> Result<CudaStorage> {
        Err(not_built())
    }
    /// Downloads to host storage.
    pub fn download(&self, _s: &CudaStorage, _dtype: DType) -> Result<CpuStorage> {
        Err(not_built())
    }
}
