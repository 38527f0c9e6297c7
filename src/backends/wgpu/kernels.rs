//! The wgpu backend's kernel glue: `merge_attn_states` for [`crate::ops::merge_attn_states`]
//! (one dispatch of the WGSL family's `merge_attn_states.wgsl` through the wgpu runtime), and
//! the runtime's buffer upload under the name the metadata builder uses.

use std::sync::{Mutex, OnceLock};

use crate::device::wgpu::{
    bind_group, dispatch, grid, pipeline, storage, whole, ParamBlock, Words,
};
use crate::device::{Tensor, WgpuDevice};
use crate::error::{Error, Result};
use crate::kernels::wgsl::{Bindings, MergeShader, ELEMENTWISE_WORKGROUP};

pub(crate) use crate::device::wgpu::upload_words;

/// `merge_attn_states` on wgpu tensors (shapes and dtypes already checked by
/// [`crate::ops::merge_attn_states`]): `[T, H, D]` outputs, `[H, T]` f32 LSEs.
#[allow(clippy::too_many_arguments)]
pub fn merge_attn_states(
    output: &mut Tensor,
    prefix_output: &Tensor,
    prefix_lse: &Tensor,
    suffix_output: &Tensor,
    suffix_lse: &Tensor,
    output_lse: Option<&mut Tensor>,
    prefill_tokens_with_context: Option<usize>,
) -> Result<()> {
    let dev = match output.device() {
        crate::Device::Wgpu(d) => d.clone(),
        _ => {
            return Err(Error::Device {
                backend: "wgpu".into(),
                message: "merge_attn_states: output is not a wgpu tensor".into(),
            })
        }
    };
    let s = prefix_output.shape();
    let (t, h, d) = (s[0], s[1], s[2]);
    if d % 4 != 0 {
        return Err(Error::shape(
            "prefix_output",
            s,
            "a head size that is a multiple of 4 (wgpu kernels load 4 elements at a time)",
        ));
    }
    let units = (t * h * (d / 4)) as u64;
    if units == 0 {
        return Ok(());
    }
    let dtype = prefix_output.dtype();
    let po = storage(&dev, prefix_output, "prefix_output")?
        .buffer()
        .clone();
    let pl = storage(&dev, prefix_lse, "prefix_lse")?.buffer().clone();
    let so = storage(&dev, suffix_output, "suffix_output")?
        .buffer()
        .clone();
    let sl = storage(&dev, suffix_lse, "suffix_lse")?.buffer().clone();
    let out = storage(&dev, output, "output")?.buffer().clone();
    let (ol, write_lse) = match output_lse {
        Some(l) => (storage(&dev, l, "output_lse")?.buffer().clone(), 1),
        None => (dev.dummy_buffer(0).clone(), 0),
    };
    let shader = MergeShader { dtype };
    let pipe = pipeline(
        &dev,
        &shader.key(),
        || shader.source(),
        Bindings::Merge,
        false,
    )?;
    // One parameter block per process (there is one wgpu device), reused by every call; the
    // lock spans write and submit so concurrent calls cannot see each other's parameters.
    static PARAMS: OnceLock<Mutex<(WgpuDevice, ParamBlock)>> = OnceLock::new();
    let mut guard = PARAMS
        .get_or_init(|| Mutex::new((dev.clone(), ParamBlock::new(&dev, 1))))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if guard.0 != dev {
        *guard = (dev.clone(), ParamBlock::new(&dev, 1));
    }
    let params = &guard.1;
    let words = Words::new()
        .u(t as u32)
        .u(h as u32)
        .u(d as u32)
        .u(prefill_tokens_with_context.map_or(u32::MAX, |n| n.min(u32::MAX as usize) as u32))
        .u(write_lse);
    params.write(&dev, &[words.w]);
    let group = bind_group(
        &dev,
        &pipe,
        vec![
            (0, params.binding(0)),
            (1, whole(&po)),
            (2, whole(&pl)),
            (3, whole(&so)),
            (4, whole(&sl)),
            (5, whole(&out)),
            (6, whole(&ol)),
        ],
    );
    let (x, z) = grid(&dev, units.div_ceil(ELEMENTWISE_WORKGROUP as u64))?;
    let mut enc = dev
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("polyattn merge_attn_states"),
        });
    dispatch(&mut enc, &pipe, &group, (x, 1, z));
    dev.queue().submit([enc.finish()]);
    Ok(())
}
