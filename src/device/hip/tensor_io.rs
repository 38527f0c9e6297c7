//! What [`crate::device::Tensor`] asks of every device, on an AMD GPU: typed zeros, uploads
//! and downloads of host storage (the bytes of [`HipStorage`] carry no dtype; the tensor
//! keeps it).

use super::{HipDevice, HipStorage};
use crate::device::CpuStorage;
use crate::dtype::DType;
use crate::error::{Error, Result};

impl HipDevice {
    /// `len` zeros of `dtype`.
    pub fn zeros(&self, len: usize, dtype: DType) -> Result<HipStorage> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| Error::overflow("HIP buffer", format!("{len} elements of {dtype}")))?;
        self.zeros_bytes(bytes)
    }

    /// Uploads host storage (its elements must be of `dtype`).
    pub fn upload(&self, host: &CpuStorage, _dtype: DType) -> Result<HipStorage> {
        self.upload_bytes(host.as_bytes())
    }

    /// Downloads to host storage of `dtype` (waits for the work queued before it).
    pub fn download(&self, s: &HipStorage, dtype: DType) -> Result<CpuStorage> {
        Ok(CpuStorage::from_bytes(&self.download_bytes(s)?, dtype))
    }
}

/// A device copy, as `Vec`'s clone copies (the same contract as `CudaStorage`'s `Clone`,
/// which `Storage: Clone` needs); [`HipStorage::try_clone`] returns the error instead.
impl Clone for HipStorage {
    fn clone(&self) -> Self {
        match self.try_clone() {
            Ok(s) => s,
            Err(e) => panic!("HipStorage::clone failed: {e}"),
        }
    }
}
