//! The CUDA MLA backend's kernel glue: what the family's MLA impl
//! ([`crate::backends::cuda_family_mla`]) needs of the CUDA runtime — allocations, tensor addresses, NVRTC modules and launches, the decode form
//! ([`CudaTuning::mla_decode`]: the tensor-core kernel, or the portable one the HIP backend
//! runs) and the prefill chunk the tuning asks for.

use cudarc::driver::LaunchConfig;

use crate::backends::cuda_family_mla::{LaunchShape, MlaRuntime};
use crate::device::cuda::{function, launch};
use crate::device::{CudaDevice, CudaStorage, Tensor};
use crate::error::Result;
use crate::kernels::cuda::{
    CudaTuning, KernelSource, MlaDecodeForm, MlaDecodeKernel, MlaDecodeShape, NVIDIA_SHARED_PER_SM,
};

pub(crate) use crate::backends::cuda::kernels::tensor_ptr;

impl MlaRuntime for CudaDevice {
    type Buffer = CudaStorage;
    const BACKEND: &'static str = "CUDA_MLA";

    fn alloc(&self, bytes: usize) -> Result<CudaStorage> {
        self.zeros_bytes(bytes)
    }

    fn upload_f32(&self, data: &[f32]) -> Result<CudaStorage> {
        self.upload_pod(data)
    }

    fn write_i32(&self, buf: &mut CudaStorage, offset: usize, data: &[i32]) -> Result<()> {
        self.write_pod(buf, offset, data)
    }

    fn buffer_ptr(buf: &CudaStorage) -> u64 {
        buf.device_ptr()
    }

    fn buffer_len(buf: &CudaStorage) -> usize {
        buf.len_bytes()
    }

    fn ptr(&self, t: &Tensor, what: &str) -> Result<u64> {
        tensor_ptr(self, t, what)
    }

    fn wave(&self) -> usize {
        32
    }

    fn units(&self) -> usize {
        self.sm_count() as usize
    }

    fn shared_per_unit(&self) -> usize {
        NVIDIA_SHARED_PER_SM
    }

    fn decode_form(&self, rows: usize) -> MlaDecodeForm {
        match CudaTuning::get().mla_decode {
            MlaDecodeKernel::TensorCores => {
                MlaDecodeForm::TensorCores(MlaDecodeShape::for_rows(rows))
            }
            MlaDecodeKernel::Portable => MlaDecodeForm::Portable,
        }
    }

    fn prefill_chunk(&self) -> Option<usize> {
        CudaTuning::get().mla_prefill_chunk
    }

    fn launch<P: bytemuck::Pod>(
        &self,
        source: &KernelSource,
        defines: &[String],
        name: &str,
        shape: LaunchShape,
        params: &P,
    ) -> Result<()> {
        let defines: Vec<&str> = defines.iter().map(String::as_str).collect();
        let f = function(self, source, &defines, name)?;
        let cfg = LaunchConfig {
            grid_dim: shape.grid,
            block_dim: (shape.threads, 1, 1),
            shared_mem_bytes: shape.smem,
        };
        launch(self, &f, cfg, params, None)
    }
}
