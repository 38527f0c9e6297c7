//! The CPU device: host memory, work spread over rayon's thread pool.

use half::{bf16, f16};

use crate::error::{Error, Result};

/// The host CPU as a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuDevice {
    threads: usize,
}

impl CpuDevice {
    /// The CPU with rayon's global pool (`RAYON_NUM_THREADS` sets its size).
    pub fn new() -> Self {
        CpuDevice {
            threads: rayon::current_num_threads(),
        }
    }

    /// Worker threads used by kernels.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// A one-line description.
    pub fn description(&self) -> String {
        format!("cpu: {} threads, {}", self.threads, std::env::consts::ARCH)
    }
}

impl Default for CpuDevice {
    fn default() -> Self {
        Self::new()
    }
}

/// Host storage of one tensor, typed by element.
///
/// The fp8 dtypes are stored as raw bytes (`U8`); the tensor's [`crate::DType`] says which
/// format they hold.
#[derive(Clone, Debug, PartialEq)]
pub enum CpuStorage {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    Bf16(Vec<bf16>),
    /// fp8 bytes (E4M3 or E5M2).
    U8(Vec<u8>),
    /// i32 elements.
    I32(Vec<i32>),
    /// i64 elements.
    I64(Vec<i64>),
}

impl CpuStorage {
    /// `n` zeros of `dtype`; an allocation the host cannot make is an [`Error::Device`]
    /// rather than an abort (`n` comes from a caller's shape).
    pub fn try_zeros(n: usize, dtype: crate::DType) -> Result<Self> {
        use crate::DType;
        fn zeros<T: Clone>(n: usize, zero: T, dtype: crate::DType) -> Result<Vec<T>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|e| Error::Device {
                backend: "CPU".into(),
                message: format!("allocating {n} elements of {dtype}: {e}"),
            })?;
            v.resize(n, zero);
            Ok(v)
        }
        Ok(match dtype {
            DType::F32 => CpuStorage::F32(zeros(n, 0.0, dtype)?),
            DType::F16 => CpuStorage::F16(zeros(n, f16::ZERO, dtype)?),
            DType::Bf16 => CpuStorage::Bf16(zeros(n, bf16::ZERO, dtype)?),
            DType::Fp8E4m3 | DType::Fp8E5m2 => CpuStorage::U8(zeros(n, 0, dtype)?),
            DType::I32 => CpuStorage::I32(zeros(n, 0, dtype)?),
            DType::I64 => CpuStorage::I64(zeros(n, 0, dtype)?),
        })
    }

    /// The raw bytes (little-endian element order), for uploads.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            CpuStorage::F32(v) => bytemuck::cast_slice(v),
            CpuStorage::F16(v) => bytemuck::cast_slice(v),
            CpuStorage::Bf16(v) => bytemuck::cast_slice(v),
            CpuStorage::U8(v) => v,
            CpuStorage::I32(v) => bytemuck::cast_slice(v),
            CpuStorage::I64(v) => bytemuck::cast_slice(v),
        }
    }

    /// Host storage of `dtype` from raw bytes (for downloads); `bytes.len()` must be a
    /// multiple of the element size.
    pub fn from_bytes(bytes: &[u8], dtype: crate::DType) -> Self {
        use crate::DType;
        fn cast<T: bytemuck::Pod>(b: &[u8]) -> Vec<T> {
            bytemuck::pod_collect_to_vec(b)
        }
        match dtype {
            DType::F32 => CpuStorage::F32(cast(bytes)),
            DType::F16 => CpuStorage::F16(cast(bytes)),
            DType::Bf16 => CpuStorage::Bf16(cast(bytes)),
            DType::Fp8E4m3 | DType::Fp8E5m2 => CpuStorage::U8(bytes.to_vec()),
            DType::I32 => CpuStorage::I32(cast(bytes)),
            DType::I64 => CpuStorage::I64(cast(bytes)),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::F16(v) => v.len(),
            CpuStorage::Bf16(v) => v.len(),
            CpuStorage::U8(v) => v.len(),
            CpuStorage::I32(v) => v.len(),
            CpuStorage::I64(v) => v.len(),
        }
    }

    /// True if it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
