//! The HIP MLA backend's kernel glue: what the family's MLA impl
//! ([`crate::backends::cuda_family_mla`]) needs of the HIP runtime — allocations, tensor
//! addresses, hiprtc modules (compiled for the device's target, cached per module) and
//! launches sized by the device's wavefront, and the decode form (always the portable one:
//! the tensor-core form is NVIDIA's).

use crate::backends::cuda_family_mla::{LaunchShape, MlaRuntime};
use crate::backends::hip::kernels::{function, tensor_ptr};
use crate::device::{HipDevice, HipStorage, Tensor};
use crate::error::{Error, Result};
use crate::kernels::cuda::{KernelSource, MlaDecodeForm};

impl MlaRuntime for HipDevice {
    type Buffer = HipStorage;
    const BACKEND: &'static str = "HIP_MLA";

    fn alloc(&self, bytes: usize) -> Result<HipStorage> {
        self.zeros_bytes(bytes)
    }

    fn upload_f32(&self, data: &[f32]) -> Result<HipStorage> {
        self.upload_pod(data)
    }

    fn write_i32(&self, buf: &mut HipStorage, offset: usize, data: &[i32]) -> Result<()> {
        if !offset.is_multiple_of(4) {
            return Err(Error::config(format!(
                "HIP_MLA: an i32 write at byte offset {offset} is not 4-byte aligned"
            )));
        }
        self.write_pod(buf, offset / 4, data)
    }

    fn buffer_ptr(buf: &HipStorage) -> u64 {
        buf.device_ptr()
    }

    fn buffer_len(buf: &HipStorage) -> usize {
        buf.len_bytes()
    }

    fn ptr(&self, t: &Tensor, what: &str) -> Result<u64> {
        tensor_ptr(self, t, what)
    }

    fn wave(&self) -> usize {
        self.wavefront_size() as usize
    }

    fn units(&self) -> usize {
        self.info().compute_units as usize
    }

    fn shared_per_unit(&self) -> usize {
        self.info().max_shared_memory_per_block
    }

    fn decode_form(&self, _rows: usize) -> MlaDecodeForm {
        MlaDecodeForm::Portable
    }

    fn prefill_chunk(&self) -> Option<usize> {
        None
    }

    fn launch<P: bytemuck::Pod>(
        &self,
        source: &KernelSource,
        defines: &[String],
        name: &str,
        shape: LaunchShape,
        params: &P,
    ) -> Result<()> {
        let f = function(self, source, defines, name)?;
        HipDevice::launch(
            self,
            &f,
            shape.grid,
            (shape.threads, 1, 1),
            shape.smem,
            params,
        )
    }
}
