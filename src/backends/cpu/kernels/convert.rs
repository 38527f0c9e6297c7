//! Element conversion between storage types and the f32 the kernels compute in.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::device::CpuStorage;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fp8;

/// A read-only view of float storage that loads rows as f32.
#[derive(Clone, Copy, Debug)]
pub enum RowsView<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// f16 elements.
    F16(&'a [f16]),
    /// bf16 elements.
    Bf16(&'a [bf16]),
    /// fp8 bytes with their decode table.
    Fp8(&'a [u8], &'static [f32; 256]),
}

impl<'a> RowsView<'a> {
    /// Views `storage` holding elements of `dtype`.
    pub fn new(storage: &'a CpuStorage, dtype: DType) -> Result<Self> {
        if let (CpuStorage::U8(v), Some(table)) = (storage, fp8::table(dtype)) {
            return Ok(RowsView::Fp8(v, table));
        }
        Ok(match (storage, dtype) {
            (CpuStorage::F32(v), DType::F32) => RowsView::F32(v),
            (CpuStorage::F16(v), DType::F16) => RowsView::F16(v),
            (CpuStorage::Bf16(v), DType::Bf16) => RowsView::Bf16(v),
            _ => {
                return Err(Error::DType {
                    what: "cpu kernel input",
                    got: dtype.to_string(),
                    expected: "f32, f16, bf16 or fp8 float storage".into(),
                })
            }
        })
    }

    /// Loads `dst.len()` elements starting at `offset`, multiplied by `scale` (the fp8
    /// dequantisation scale; pass 1.0 otherwise).
    #[inline]
    pub fn load(&self, offset: usize, dst: &mut [f32], scale: f32) {
        let n = dst.len();
        match self {
            RowsView::F32(v) => dst.copy_from_slice(&v[offset..offset + n]),
            RowsView::F16(v) => v[offset..offset + n].convert_to_f32_slice(dst),
            RowsView::Bf16(v) => v[offset..offset + n].convert_to_f32_slice(dst),
            RowsView::Fp8(v, t) => {
                for (d, &b) in dst.iter_mut().zip(&v[offset..offset + n]) {
                    *d = t[b as usize] * scale;
                }
            }
        }
    }
}

/// Writes f32 values into float storage of `dtype` at `offset`; fp8 stores `x / scale`
/// saturated.
#[inline]
pub fn store(storage: &mut CpuStorage, dtype: DType, offset: usize, src: &[f32], scale: f32) {
    let n = src.len();
    match storage {
        CpuStorage::F32(v) => v[offset..offset + n].copy_from_slice(src),
        CpuStorage::F16(v) => v[offset..offset + n].convert_from_f32_slice(src),
        CpuStorage::Bf16(v) => v[offset..offset + n].convert_from_f32_slice(src),
        CpuStorage::U8(v) => {
            for (d, &x) in v[offset..offset + n].iter_mut().zip(src) {
                *d = fp8::encode(dtype, x / scale);
            }
        }
        CpuStorage::I32(_) | CpuStorage::I64(_) => unreachable!("store into integer storage"),
    }
}
