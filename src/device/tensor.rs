//! [`Tensor`]: a typed, shaped buffer on a [`Device`].

use half::{bf16, f16};

use super::{CpuStorage, CudaStorage, Device, HipStorage, VulkanStorage, WgpuStorage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fp8;

/// Where a tensor's elements live. One variant per device family, like [`Device`].
///
/// Cloning GPU storage copies the buffer on its device (as cloning a `Vec` copies it), so a
/// cloned tensor never aliases the original.
#[derive(Clone, Debug)]
pub enum Storage {
    /// Host memory.
    Cpu(CpuStorage),
    /// CUDA device memory.
    Cuda(CudaStorage),
    /// HIP device memory.
    Hip(HipStorage),
    /// A Vulkan storage buffer.
    Vulkan(VulkanStorage),
    /// A wgpu storage buffer.
    Wgpu(WgpuStorage),
}

/// A dense, row-major buffer with a shape and a dtype, on one device.
///
/// `Clone` copies the elements (on the device for GPU tensors).
///
/// Tensors are plain buffers: polyattn does no autograd and no lazy ops. Kernels read and
/// write them through their backend's storage; model code creates them with
/// [`Tensor::from_f32`] / [`Tensor::zeros`] and reads results with [`Tensor::to_f32_vec`].
#[derive(Clone, Debug)]
pub struct Tensor {
    storage: Storage,
    shape: Vec<usize>,
    dtype: DType,
    device: Device,
}

/// The element count of `shape`, unchecked: only for shapes that [`checked_numel`] accepted.
fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The element count of `shape`, or [`Error::Overflow`] when the product wraps around
/// `usize` or the bytes of that many `dtype` elements exceed `isize::MAX` (the most any
/// allocation can hold). Every tensor's shape passes this check when it is built, so
/// [`Tensor::numel`] and [`Tensor::size_in_bytes`] cannot overflow afterwards.
pub fn checked_numel(what: &'static str, shape: &[usize], dtype: DType) -> Result<usize> {
    let n = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::overflow(what, format!("the element count of shape {shape:?}")))?;
    match n.checked_mul(dtype.size_in_bytes()) {
        Some(bytes) if bytes <= isize::MAX as usize => Ok(n),
        _ => Err(Error::overflow(
            what,
            format!("{n} elements of {dtype} (shape {shape:?}) exceed the addressable bytes"),
        )),
    }
}

impl Tensor {
    /// A tensor of zeros.
    pub fn zeros(device: &Device, shape: &[usize], dtype: DType) -> Result<Self> {
        let n = checked_numel("zeros", shape, dtype)?;
        let storage = match device {
            Device::Cpu(_) => Storage::Cpu(CpuStorage::try_zeros(n, dtype)?),
            Device::Cuda(d) => Storage::Cuda(d.zeros(n, dtype)?),
            Device::Hip(d) => Storage::Hip(d.zeros(n, dtype)?),
            Device::Vulkan(d) => {
                Storage::Vulkan(d.tensor_zeros(n, dtype, shape.first().copied().unwrap_or(1))?)
            }
            Device::Wgpu(d) => Storage::Wgpu(d.zeros(n, dtype)?),
        };
        Ok(Tensor {
            storage,
            shape: shape.to_vec(),
            dtype,
            device: device.clone(),
        })
    }

    /// Uploads `data` converted to `dtype` (rounding to nearest; fp8 saturates, scale 1).
    pub fn from_f32(device: &Device, data: &[f32], shape: &[usize], dtype: DType) -> Result<Self> {
        let n = checked_numel("from_f32", shape, dtype)?;
        if data.len() != n {
            return Err(Error::shape(
                "from_f32 data",
                &[data.len()],
                format!("{n} elements for shape {shape:?}"),
            ));
        }
        let cpu = match dtype {
            DType::F32 => CpuStorage::F32(data.to_vec()),
            DType::F16 => CpuStorage::F16(data.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::Bf16 => CpuStorage::Bf16(data.iter().map(|&x| bf16::from_f32(x)).collect()),
            DType::Fp8E4m3 | DType::Fp8E5m2 => {
                CpuStorage::U8(data.iter().map(|&x| fp8::encode(dtype, x)).collect())
            }
            DType::I32 | DType::I64 => {
                return Err(Error::DType {
                    what: "from_f32",
                    got: dtype.to_string(),
                    expected: "a float dtype (use from_i32 / from_i64 for integers)".into(),
                })
            }
        };
        Self::from_cpu_storage(device, cpu, shape, dtype)
    }

    /// Uploads i32 data.
    pub fn from_i32(device: &Device, data: &[i32], shape: &[usize]) -> Result<Self> {
        if data.len() != checked_numel("from_i32", shape, DType::I32)? {
            return Err(Error::shape(
                "from_i32 data",
                &[data.len()],
                format!("{shape:?}"),
            ));
        }
        Self::from_cpu_storage(device, CpuStorage::I32(data.to_vec()), shape, DType::I32)
    }

    /// Uploads i64 data.
    pub fn from_i64(device: &Device, data: &[i64], shape: &[usize]) -> Result<Self> {
        if data.len() != checked_numel("from_i64", shape, DType::I64)? {
            return Err(Error::shape(
                "from_i64 data",
                &[data.len()],
                format!("{shape:?}"),
            ));
        }
        Self::from_cpu_storage(device, CpuStorage::I64(data.to_vec()), shape, DType::I64)
    }

    /// Wraps host storage as a tensor on `device`, uploading it to GPU devices.
    pub fn from_cpu_storage(
        device: &Device,
        cpu: CpuStorage,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Self> {
        if cpu.len() != checked_numel("host storage", shape, dtype)? {
            return Err(Error::shape(
                "host storage",
                &[cpu.len()],
                format!("{shape:?}"),
            ));
        }
        let storage = match device {
            Device::Cpu(_) => Storage::Cpu(cpu),
            Device::Cuda(d) => Storage::Cuda(d.upload(&cpu, dtype)?),
            Device::Hip(d) => Storage::Hip(d.upload(&cpu, dtype)?),
            Device::Vulkan(d) => Storage::Vulkan(d.tensor_upload(
                &cpu,
                dtype,
                shape.first().copied().unwrap_or(1),
            )?),
            Device::Wgpu(d) => Storage::Wgpu(d.upload(&cpu, dtype)?),
        };
        Ok(Tensor {
            storage,
            shape: shape.to_vec(),
            dtype,
            device: device.clone(),
        })
    }

    /// The elements in host memory (a download for GPU tensors; waits for pending work).
    pub fn to_host(&self) -> Result<CpuStorage> {
        match (&self.storage, &self.device) {
            (Storage::Cpu(c), _) => Ok(c.clone()),
            (Storage::Cuda(s), Device::Cuda(d)) => d.download(s, self.dtype),
            (Storage::Hip(s), Device::Hip(d)) => d.download(s, self.dtype),
            (Storage::Vulkan(s), Device::Vulkan(d)) => d.tensor_download(s, self.dtype),
            (Storage::Wgpu(s), Device::Wgpu(d)) => d.download(s, self.dtype),
            _ => Err(Error::Device {
                backend: self.device.kind().as_str().into(),
                message: "tensor storage does not belong to its device".into(),
            }),
        }
    }

    /// Overwrites this i32 tensor's elements with `data` (one per element), in place: the
    /// buffer stays where it is, so a captured graph that reads it sees the new values on
    /// its next replay. Ordered after the work already submitted to the device. An error
    /// inside a graph capture (writes from the host happen between replays).
    pub fn write_i32(&mut self, data: &[i32]) -> Result<()> {
        self.write_pod("write_i32", DType::I32, data)
    }

    /// [`Tensor::write_i32`] for an f32 tensor.
    pub fn write_f32(&mut self, data: &[f32]) -> Result<()> {
        self.write_pod("write_f32", DType::F32, data)
    }

    /// [`Tensor::write_i32`] for an i64 tensor (a slot mapping).
    pub fn write_i64(&mut self, data: &[i64]) -> Result<()> {
        self.write_pod("write_i64", DType::I64, data)
    }

    fn write_pod<T: bytemuck::Pod + Copy>(
        &mut self,
        what: &'static str,
        dtype: DType,
        data: &[T],
    ) -> Result<()> {
        self.expect_dtype(what, dtype)?;
        if data.len() != self.numel() {
            return Err(Error::shape(
                what,
                &[data.len()],
                format!("{} elements ({:?})", self.numel(), self.shape),
            ));
        }
        match (&mut self.storage, &self.device) {
            (Storage::Cpu(CpuStorage::I32(v)), _) => {
                v.copy_from_slice(bytemuck::cast_slice(data));
                Ok(())
            }
            (Storage::Cpu(CpuStorage::F32(v)), _) => {
                v.copy_from_slice(bytemuck::cast_slice(data));
                Ok(())
            }
            (Storage::Cpu(CpuStorage::I64(v)), _) => {
                v.copy_from_slice(bytemuck::cast_slice(data));
                Ok(())
            }
            (Storage::Cuda(s), Device::Cuda(dev)) => dev.write_pod(s, 0, data),
            (Storage::Hip(s), Device::Hip(dev)) => dev.write_pod(s, 0, data),
            (Storage::Vulkan(s), Device::Vulkan(dev)) => {
                dev.tensor_write(s, bytemuck::cast_slice(data))
            }
            (Storage::Wgpu(s), Device::Wgpu(dev)) => {
                if !data.is_empty() {
                    dev.write_buffer(s.buffer(), 0, bytemuck::cast_slice(data));
                }
                Ok(())
            }
            _ => Err(Error::Device {
                backend: self.device.kind().as_str().into(),
                message: "tensor storage does not belong to its device".into(),
            }),
        }
    }

    /// Overwrites this tensor's elements with `src`'s, a copy on the device (ordered after
    /// the device's earlier work): how a step's inputs go into the tensors a captured graph
    /// reads ([`Device::capture`]). Errors unless both tensors live on the same device and
    /// have the same shape and dtype.
    pub fn copy_from(&mut self, src: &Tensor) -> Result<()> {
        if self.shape != src.shape || self.dtype != src.dtype {
            return Err(Error::config(format!(
                "copy_from: a {:?} {} tensor into a {:?} {} tensor (shape and dtype must match)",
                src.shape, src.dtype, self.shape, self.dtype
            )));
        }
        if self.device != src.device {
            return Err(Error::config(format!(
                "copy_from: the source lives on {}, the destination on {}; move it with \
                 Tensor::to_device first",
                src.device.kind().as_str(),
                self.device.kind().as_str()
            )));
        }
        match (&mut self.storage, &src.storage, &self.device) {
            (Storage::Cpu(d), Storage::Cpu(s), _) => {
                d.clone_from(s);
                Ok(())
            }
            (Storage::Cuda(d), Storage::Cuda(s), Device::Cuda(dev)) => dev.copy(s, d),
            (Storage::Hip(d), Storage::Hip(s), Device::Hip(dev)) => dev.copy(s, d),
            (Storage::Vulkan(d), Storage::Vulkan(s), Device::Vulkan(dev)) => dev.tensor_copy(s, d),
            (Storage::Wgpu(d), Storage::Wgpu(s), Device::Wgpu(dev)) => dev.copy(s, d),
            _ => Err(Error::Device {
                backend: self.device.kind().as_str().into(),
                message: "tensor storage does not belong to its device".into(),
            }),
        }
    }

    /// A copy of this tensor on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        Self::from_cpu_storage(device, self.to_host()?, &self.shape, self.dtype)
    }

    /// Downloads the elements converted to f32 (fp8 bytes decoded with scale 1).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        Ok(match self.to_host()? {
            CpuStorage::F32(v) => v,
            CpuStorage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            CpuStorage::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
            CpuStorage::U8(v) => {
                let t = fp8::table(self.dtype).ok_or_else(|| Error::DType {
                    what: "byte tensor",
                    got: self.dtype.to_string(),
                    expected: "fp8_e4m3 or fp8_e5m2 (the dtypes stored as bytes)".into(),
                })?;
                v.iter().map(|&b| t[b as usize]).collect()
            }
            CpuStorage::I32(v) => v.iter().map(|&x| x as f32).collect(),
            CpuStorage::I64(v) => v.iter().map(|&x| x as f32).collect(),
        })
    }

    /// Downloads the raw fp8 bytes of an fp8 tensor.
    pub fn to_u8_vec(&self) -> Result<Vec<u8>> {
        match self.to_host()? {
            CpuStorage::U8(v) => Ok(v),
            _ => Err(Error::DType {
                what: "to_u8_vec",
                got: self.dtype.to_string(),
                expected: "fp8_e4m3 or fp8_e5m2".into(),
            }),
        }
    }

    /// Downloads an i32 tensor.
    pub fn to_i32_vec(&self) -> Result<Vec<i32>> {
        match self.to_host()? {
            CpuStorage::I32(v) => Ok(v),
            _ => Err(Error::DType {
                what: "to_i32_vec",
                got: self.dtype.to_string(),
                expected: "i32".into(),
            }),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The same elements viewed with another shape of the same element count (no copy).
    pub fn reshape(mut self, shape: &[usize]) -> Result<Tensor> {
        self.reshape_in_place(shape)?;
        Ok(self)
    }

    /// [`Tensor::reshape`] of a tensor the caller keeps (a persistent buffer seen with
    /// another shape by the next operation: e.g. a projection's `[T, heads · d]` output as
    /// attention's `[T, heads, d]` query).
    pub fn reshape_in_place(&mut self, shape: &[usize]) -> Result<()> {
        let n = checked_numel("reshape", shape, self.dtype)?;
        if n != self.numel() {
            return Err(Error::shape(
                "reshape",
                &self.shape,
                format!("{n} elements to view as {shape:?}"),
            ));
        }
        self.shape = shape.to_vec();
        Ok(())
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device it lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Size in bytes.
    pub fn size_in_bytes(&self) -> usize {
        self.numel() * self.dtype.size_in_bytes()
    }

    /// The backing storage (for backends and kernels).
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The backing storage, mutable (for kernels writing outputs).
    pub fn storage_mut(&mut self) -> &mut Storage {
        &mut self.storage
    }

    /// The host storage, if the tensor lives on the CPU.
    pub fn as_cpu(&self) -> Option<&CpuStorage> {
        match &self.storage {
            Storage::Cpu(c) => Some(c),
            _ => None,
        }
    }

    /// The host storage, mutable, if the tensor lives on the CPU.
    pub fn as_cpu_mut(&mut self) -> Option<&mut CpuStorage> {
        match &mut self.storage {
            Storage::Cpu(c) => Some(c),
            _ => None,
        }
    }

    /// Checks the shape against `expected`, naming `what` in the error.
    pub fn expect_shape(&self, what: &'static str, expected: &[usize]) -> Result<()> {
        if self.shape != expected {
            return Err(Error::shape(what, &self.shape, format!("{expected:?}")));
        }
        Ok(())
    }

    /// Checks the dtype, naming `what` in the error.
    pub fn expect_dtype(&self, what: &'static str, expected: DType) -> Result<()> {
        if self.dtype != expected {
            return Err(Error::DType {
                what,
                got: self.dtype.to_string(),
                expected: expected.to_string(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_per_dtype() {
        let dev = Device::cpu();
        let data = [1.0f32, -2.5, 0.125, 3.0];
        for dt in [
            DType::F32,
            DType::F16,
            DType::Bf16,
            DType::Fp8E4m3,
            DType::Fp8E5m2,
        ] {
            let t = Tensor::from_f32(&dev, &data, &[2, 2], dt).unwrap();
            assert_eq!(t.to_f32_vec().unwrap(), data, "{dt}");
            assert_eq!(t.size_in_bytes(), 4 * dt.size_in_bytes());
        }
    }

    #[test]
    fn shapes_whose_size_overflows_are_errors() {
        let dev = Device::cpu();
        // 2^62 · 32 wraps to 0 in a u64 product: an empty slice must not pass for it.
        let huge = [1usize << 62, 1, 32];
        for err in [
            Tensor::from_f32(&dev, &[], &huge, DType::F32).unwrap_err(),
            Tensor::from_i32(&dev, &[], &huge).unwrap_err(),
            Tensor::from_i64(&dev, &[], &huge).unwrap_err(),
            Tensor::zeros(&dev, &huge, DType::F16).unwrap_err(),
            // No wrap in the count, but more bytes than an allocation can hold.
            Tensor::zeros(&dev, &[1usize << 62], DType::F32).unwrap_err(),
            Tensor::from_f32(&dev, &[1.0; 4], &[2, 2], DType::F32)
                .unwrap()
                .reshape(&huge)
                .unwrap_err(),
        ] {
            assert!(matches!(err, Error::Overflow { .. }), "{err}");
            assert!(err.to_string().contains("overflows"), "{err}");
        }
    }

    #[test]
    fn an_allocation_the_host_cannot_make_is_an_error() {
        // 2^50 f32 zeros pass the size check (4 PiB ≤ isize::MAX) but no machine has them.
        let err = Tensor::zeros(&Device::cpu(), &[1 << 50], DType::F32).unwrap_err();
        assert!(err.to_string().contains("allocat"), "{err}");
    }

    #[test]
    fn wrong_length_is_an_error() {
        let err = Tensor::from_f32(&Device::cpu(), &[1.0; 3], &[2, 2], DType::F32).unwrap_err();
        assert!(err.to_string().contains("4 elements"), "{err}");
    }
}
