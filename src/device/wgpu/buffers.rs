//! Buffers as kernels bind them: a tensor's storage checked to live on the device and to fit
//! one storage binding ([`storage`], [`check_binding`]: a larger buffer is an error naming
//! it, never a partial result), and small storage buffers filled from words
//! ([`upload_words`]).

use crate::device::{Storage, Tensor};
use crate::error::{Error, Result};

use super::{WgpuDevice, WgpuStorage};

/// The wgpu storage of `t`, checked to live on `dev` and to fit one storage binding.
pub fn storage<'a>(dev: &WgpuDevice, t: &'a Tensor, what: &'static str) -> Result<&'a WgpuStorage> {
    let s = match t.storage() {
        Storage::Wgpu(s) => s,
        _ => {
            return Err(Error::Device {
                backend: "wgpu".into(),
                message: format!(
                    "{what} lives on {}, not on the wgpu device; create it with the backend's \
                     device or move it with Tensor::to_device",
                    t.device().kind().as_str()
                ),
            })
        }
    };
    if s.device() != dev {
        return Err(Error::Device {
            backend: "wgpu".into(),
            message: format!("{what} lives on another wgpu device"),
        });
    }
    check_binding(dev, s.buffer().size(), what)?;
    Ok(s)
}

/// Errors when a buffer of `bytes` cannot be bound as one storage binding.
pub fn check_binding(dev: &WgpuDevice, bytes: u64, what: &str) -> Result<()> {
    dev.wgsl_info().check_binding(bytes, what)
}

/// A storage buffer holding `words`.
pub fn upload_words(dev: &WgpuDevice, label: &str, words: &[u32]) -> Result<wgpu::Buffer> {
    let bytes: &[u8] = bytemuck::cast_slice(words);
    let buffer = dev.create_storage_buffer(
        label,
        bytes.len() as u64,
        wgpu::BufferUsages::empty(),
        !bytes.is_empty(),
    )?;
    if !bytes.is_empty() {
        {
            let mut view = buffer.get_mapped_range_mut(..).map_err(|e| Error::Device {
                backend: "wgpu".into(),
                message: format!("mapping {label} failed: {e}"),
            })?;
            view.slice(..bytes.len()).copy_from_slice(bytes);
        }
        buffer.unmap();
    }
    Ok(buffer)
}
