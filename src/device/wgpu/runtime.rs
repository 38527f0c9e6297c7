//! The wgpu runtime as a [`WgslRuntime`]: every call's parameter slots go to the device's
//! ring, written with the batch that reads them (a call with more slots than the ring uses
//! its own [`ParamBlock`], written through the queue when changed), one bind group per
//! dispatch, every dispatch of a call in one compute pass, recorded into the device's pending
//! command buffer (submitted in batches; a later download or synchronize submits and
//! waits).

use crate::device::wgsl::{Dispatch, LoopBounding, Slot, WgslDeviceInfo, WgslRuntime};
use crate::device::{Device, Tensor};
use crate::error::{Error, Result};
use crate::kernels::wgsl::Bindings;

use super::WgpuDevice;
use super::{pipeline_with, storage, upload_words, ParamBlock};

impl WgslRuntime for WgpuDevice {
    type Buffer = wgpu::Buffer;
    type Pipeline = wgpu::ComputePipeline;
    type Params = ParamBlock;

    const NAME: &'static str = "wgpu";
    const CAPTURES: bool = false;

    fn info(&self) -> &WgslDeviceInfo {
        self.wgsl_info()
    }

    fn is_capturing(&self) -> bool {
        false
    }

    fn device(&self) -> Device {
        Device::Wgpu(self.clone())
    }

    fn pipeline(
        &self,
        key: &str,
        source: &dyn Fn() -> String,
        bindings: Bindings,
        subgroups: bool,
        loops: LoopBounding,
    ) -> Result<wgpu::ComputePipeline> {
        pipeline_with(self, key, source, bindings, subgroups, loops)
    }

    fn tensor_buffer(&self, t: &Tensor, what: &'static str) -> Result<wgpu::Buffer> {
        Ok(storage(self, t, what)?.buffer().clone())
    }

    fn buffer_bytes(buffer: &wgpu::Buffer) -> u64 {
        buffer.size()
    }

    fn upload_words(&self, label: &str, words: &[u32]) -> Result<wgpu::Buffer> {
        upload_words(self, label, words)
    }

    fn write_words(&self, buffer: &wgpu::Buffer, words: &[u32]) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(words);
        if bytes.len() as u64 > buffer.size() {
            return Err(Error::config(format!(
                "a write of {} bytes does not fit a {}-byte buffer",
                bytes.len(),
                buffer.size()
            )));
        }
        self.write_buffer(buffer, 0, bytes);
        Ok(())
    }

    fn scratch(&self, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
        self.create_storage_buffer(label, bytes, wgpu::BufferUsages::empty(), false)
    }

    fn placeholder(&self, slot: usize) -> Result<wgpu::Buffer> {
        Ok(self.dummy_buffer(slot).clone())
    }

    fn params(&self, slots: usize) -> Result<ParamBlock> {
        Ok(ParamBlock::new(self, slots))
    }

    fn submit(
        &self,
        params: &ParamBlock,
        slots: &[Slot],
        dispatches: &[Dispatch<Self>],
    ) -> Result<()> {
        if dispatches.is_empty() {
            return Ok(());
        }
        // The call's parameters go to the ring with the batch that reads them: writing the
        // caller's block through the queue would submit the batch recorded so far first.
        if self.record_with_ring(slots, dispatches).is_none() {
            params.write_if_changed(self, slots);
            self.record_call(params, 0, dispatches);
        }
        Ok(())
    }

    fn submit_one(&self, words: Slot, dispatch: Dispatch<Self>) -> Result<()> {
        let one = Dispatch {
            slot: 0,
            ..dispatch
        };
        match self.record_with_ring(&[words], std::slice::from_ref(&one)) {
            Some(()) => Ok(()),
            None => Err(Error::config("a one-off dispatch found no parameter slot")),
        }
    }
}
