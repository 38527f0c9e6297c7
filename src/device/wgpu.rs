//! The wgpu device. SKELETON: the wgpu backend work fills this file in.

use super::CpuStorage;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A wgpu device handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgpuDevice {
    _private: (),
}

/// A buffer on a WgpuDevice.
#[derive(Clone, Debug)]
pub struct WgpuStorage {
    _private: (),
}

fn not_built() -> Error {
    Error::Device {
        backend: "wgpu".into(),
        message: "the wgpu device layer is not built yet".into(),
    }
}

impl WgpuDevice {
    /// One-line description.
    pub fn description(&self) -> String {
        "wgpu (not built)".into()
    }
    /// Waits for queued work.
    pub fn synchronize(&self) -> Result<()> {
        Err(not_built())
    }
    /// `len` zeros of `dtype`.
    pub fn zeros(&self, _len: usize, _dtype: DType) -> Result<WgpuStorage> {
        Err(not_built())
    }
    /// Uploads host storage.
    pub fn upload(&self, _host: &CpuStorage, _dtype: DType) -> Result<WgpuStorage> {
        Err(not_built())
    }
    /// Downloads to host storage.
    pub fn download(&self, _s: &WgpuStorage, _dtype: DType) -> Result<CpuStorage> {
        Err(not_built())
    }
}
