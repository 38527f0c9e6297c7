//! What the WGSL family's descriptors declare and check alike, whichever runtime opens the
//! device: the capabilities (the kernels unpack 16-bit and fp8 elements from u32 words, so
//! they hold on every device), the device-dependent vetoes (a tile of the head size must fit
//! the workgroup memory, a KV cache one storage binding) and the KV-cache shape.

use crate::backend::{
    AttentionType, BackendCapabilities, BlockSize, GraphCaptureSupport, HeadSizes, KvLayout,
    Reason, SelectorConfig,
};
use crate::device::wgsl::WgslDeviceInfo;
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};

use super::{tiles_for, MAX_HEAD_SIZE};

/// The family's capabilities, with the runtime's graph-capture level.
pub fn wgsl_capabilities(graph_capture: GraphCaptureSupport) -> BackendCapabilities {
    BackendCapabilities {
        // The kernels load 4 elements at a time; tiles hold D/4 columns.
        head_sizes: HeadSizes::Range {
            min: 4,
            max: MAX_HEAD_SIZE,
            multiple: 4,
        },
        dtypes: vec![DType::F32, DType::F16, DType::Bf16],
        kv_cache_dtypes: CacheDType::ALL.to_vec(),
        // The kernels walk keys one by one through the block table: any block size.
        block_sizes: vec![BlockSize::MultipleOf(1)],
        attn_types: vec![
            AttentionType::Decoder,
            AttentionType::Encoder,
            AttentionType::EncoderOnly,
        ],
        supports_sink: true,
        supports_non_causal: true,
        supports_alibi: true,
        supports_sliding_window: true,
        supports_soft_cap: true,
        supports_cascade: true,
        is_mla: false,
        min_capability: None,
        graph_capture,
        // A head's tokens adjacent: a tile's keys are contiguous per block.
        kv_layout: KvLayout::Hnd,
    }
}

/// The device-dependent vetoes: a KV cache of the configuration's size (when given) must fit
/// one storage binding, and a tile of the head size the workgroup memory.
pub fn wgsl_combination_veto(
    info: &WgslDeviceInfo,
    caps: &BackendCapabilities,
    config: &SelectorConfig,
) -> Option<Reason> {
    if let Some(bytes) = config.kv_cache_bytes {
        if let Err(e) = info.check_binding(bytes, "the KV cache") {
            return Some(Reason::new("KV cache too large", e.to_string()));
        }
    }
    if !caps.head_sizes.contains(config.head_size) {
        return None; // already reported by the capability check
    }
    tiles_for(info, config.head_size)
        .err()
        .map(|e| Reason::new("head_size not supported", e.to_string()))
}

/// The KV-cache shape `[num_blocks, 2, block_size, num_kv_heads, head_size]`, checked to fit
/// one storage binding of `info`'s device where the element size is known (`info`: `None`
/// when no device opens, and the shape is all there is to say).
#[allow(clippy::too_many_arguments)]
pub fn wgsl_kv_cache_shape(
    backend: &str,
    caps: &BackendCapabilities,
    info: Option<&WgslDeviceInfo>,
    num_blocks: usize,
    block_size: usize,
    num_kv_heads: usize,
    head_size: usize,
    cache_dtype: CacheDType,
) -> Result<[usize; 5]> {
    if block_size == 0 || !caps.head_sizes.contains(head_size) {
        return Err(Error::config(format!(
            "{backend}: block size {block_size} / head size {head_size} not supported \
             (head sizes: {})",
            caps.head_sizes
        )));
    }
    let elem = match cache_dtype {
        CacheDType::Auto => None,
        CacheDType::F16 | CacheDType::Bf16 => Some(2),
        CacheDType::Fp8E4m3 | CacheDType::Fp8E5m2 => Some(1),
    };
    if let (Some(elem), Some(info)) = (elem, info) {
        let bytes = [2, block_size, num_kv_heads, head_size, elem]
            .iter()
            .try_fold(num_blocks as u64, |acc, &x| acc.checked_mul(x as u64))
            .ok_or_else(|| {
                Error::overflow(
                    "KV cache",
                    format!(
                        "{num_blocks} blocks × 2 × {block_size} × {num_kv_heads} × \
                         {head_size} × {elem} bytes"
                    ),
                )
            })?;
        info.check_binding(bytes, "the KV cache")?;
    }
    Ok([num_blocks, 2, block_size, num_kv_heads, head_size])
}
