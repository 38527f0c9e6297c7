//! `reshape_and_cache`: writes each new token's keys and values into its cache slot.
//!
//! For token `t` with slot `s = slot_mapping[t]`: `s < 0` (PAD_SLOT_ID) writes nothing;
//! otherwise block `s / block_size`, offset `s % block_size`, and for every KV head the
//! `head_size` key and value elements are converted to the cache dtype (fp8: `x / scale`,
//! round to nearest, saturated). Tokens are processed in order, so a repeated slot keeps the
//! last write, as a sequential reference would. Bounds relied on: slots validated against
//! `num_blocks × block_size` by the metadata, `key` / `value` rows ≥ `slot_mapping.len()`.

use crate::device::CpuStorage;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;

use super::convert::{store, RowsView};

/// Writes `slot_mapping.len()` tokens of `key` / `value` (`[T][num_kv_heads][head_size]`).
pub fn reshape_and_cache(
    key: RowsView<'_>,
    value: RowsView<'_>,
    cache: &mut KvCache,
    slot_mapping: &[i64],
    k_scale: f32,
    v_scale: f32,
) -> Result<()> {
    let spec = *cache.spec();
    let (h, d, bs) = (spec.num_kv_heads, spec.head_size, spec.block_size);
    let dtype: DType = spec.storage_dtype();
    let (k_scale, v_scale) = if spec.cache_dtype.is_fp8() {
        (k_scale, v_scale)
    } else {
        (1.0, 1.0)
    };
    let mut row = vec![0.0f32; d];
    // Offsets first (immutable borrow), then the writes.
    let targets: Vec<(usize, usize, usize, usize)> = slot_mapping
        .iter()
        .enumerate()
        .filter(|(_, &s)| s >= 0)
        .flat_map(|(t, &s)| {
            let (b, o) = (s as usize / bs, s as usize % bs);
            (0..h).map(move |hh| (t, hh, b, o))
        })
        .map(|(t, hh, b, o)| (t, hh, cache.offset(b, 0, o, hh), cache.offset(b, 1, o, hh)))
        .collect();
    let storage: &mut CpuStorage = cache.data_mut().as_cpu_mut().ok_or_else(|| Error::Device {
        backend: "cpu".into(),
        message: "the CPU cache write was given a cache on another device".into(),
    })?;
    for (t, hh, ko, vo) in targets {
        let src = (t * h + hh) * d;
        key.load(src, &mut row, 1.0);
        store(storage, dtype, ko, &row, k_scale);
        value.load(src, &mut row, 1.0);
        store(storage, dtype, vo, &row, v_scale);
    }
    Ok(())
}
