//! [`MlaKvCache`]: the latent KV cache, `[num_blocks, block_size, kv_lora_rank + rope]`, one
//! latent per token (`[kv_c | k_pe]`; MLA has one shared "KV head"), and the write of new
//! tokens into it, [`concat_and_cache_mla`] (vLLM's kernel of that name).

use crate::device::{CpuStorage, Device, Tensor};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::fp8;

/// The latent KV cache of one MLA layer.
#[derive(Clone, Debug)]
pub struct MlaKvCache {
    data: Tensor,
    num_blocks: usize,
    block_size: usize,
    latent_dim: usize,
    dtype: DType,
    cache_dtype: CacheDType,
}

impl MlaKvCache {
    /// A zeroed cache of `num_blocks` blocks of `block_size` latents of `latent_dim` elements
    /// on `device`, for a layer of activation dtype `dtype`, stored as `cache_dtype` (`Auto`:
    /// the activation dtype; fp8: one byte per element, the layer's scale applied on write).
    pub fn new(
        device: &Device,
        num_blocks: usize,
        block_size: usize,
        latent_dim: usize,
        dtype: DType,
        cache_dtype: CacheDType,
    ) -> Result<Self> {
        if block_size == 0 || latent_dim == 0 {
            return Err(Error::config(format!(
                "an MLA cache needs a positive block_size and latent_dim, got {block_size} and \
                 {latent_dim}"
            )));
        }
        if num_blocks == 0 || num_blocks > i32::MAX as usize {
            return Err(Error::config(format!(
                "an MLA cache needs 1..={} blocks (block ids are i32), got {num_blocks}",
                i32::MAX
            )));
        }
        if !dtype.is_activation() {
            return Err(Error::DType {
                what: "MLA cache activation dtype",
                got: dtype.to_string(),
                expected: "f32, f16 or bf16".into(),
            });
        }
        let storage = cache_dtype.storage_dtype(dtype);
        let data = Tensor::zeros(device, &[num_blocks, block_size, latent_dim], storage)?;
        Ok(MlaKvCache {
            data,
            num_blocks,
            block_size,
            latent_dim,
            dtype,
            cache_dtype,
        })
    }

    /// The factor of every cached value for a layer whose k scale is `k_scale`: `k_scale`
    /// for an fp8 cache (which must then be finite and positive), else 1. Every MLA impl
    /// takes its scale from here, so a bad scale is the same typed error everywhere.
    pub fn dequant_scale(&self, k_scale: f32) -> Result<f32> {
        if !self.cache_dtype.is_fp8() {
            return Ok(1.0);
        }
        if !(k_scale.is_finite() && k_scale > 0.0) {
            return Err(Error::config(format!(
                "an fp8 latent cache needs a finite positive k_scale, got {k_scale}"
            )));
        }
        Ok(k_scale)
    }

    /// `[num_blocks, block_size, latent_dim]`.
    pub fn shape(&self) -> [usize; 3] {
        [self.num_blocks, self.block_size, self.latent_dim]
    }

    /// Blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Latents per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Elements of one latent (`kv_lora_rank + qk_rope_head_dim`).
    pub fn latent_dim(&self) -> usize {
        self.latent_dim
    }

    /// The layer's activation dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The cache dtype as configured.
    pub fn cache_dtype(&self) -> CacheDType {
        self.cache_dtype
    }

    /// The element type stored.
    pub fn storage_dtype(&self) -> DType {
        self.cache_dtype.storage_dtype(self.dtype)
    }

    /// The cache tensor.
    pub fn data(&self) -> &Tensor {
        &self.data
    }

    /// The cache tensor, to replace its contents (with a tensor of the same shape, dtype and
    /// device: the kernels rely on them).
    pub fn data_mut(&mut self) -> &mut Tensor {
        &mut self.data
    }

    /// Element offset of latent `tok` of block `block`.
    pub fn offset(&self, block: usize, tok: usize) -> usize {
        (block * self.block_size + tok) * self.latent_dim
    }

    /// Every latent of a request whose first `len` tokens live in `blocks` (its block-table
    /// row), as f32 (fp8 multiplied by `scale`): `[len][latent_dim]`. A host copy; for
    /// references and tests.
    pub fn gather_f32(&self, blocks: &[i32], len: usize, scale: f32) -> Result<Vec<f32>> {
        let all = self.data.to_f32_vec()?;
        let scale = if self.cache_dtype.is_fp8() {
            scale
        } else {
            1.0
        };
        let mut out = Vec::with_capacity(len * self.latent_dim);
        for t in 0..len {
            let b = *blocks.get(t / self.block_size).ok_or_else(|| {
                Error::metadata(format!(
                    "MLA gather: {len} tokens need more than {} blocks",
                    blocks.len()
                ))
            })?;
            let b = usize::try_from(b)
                .ok()
                .filter(|&b| b < self.num_blocks)
                .ok_or_else(|| Error::metadata(format!("MLA gather: block {b} out of range")))?;
            let o = self.offset(b, t % self.block_size);
            out.extend(all[o..o + self.latent_dim].iter().map(|&x| x * scale));
        }
        Ok(out)
    }
}

/// Writes new tokens' latents into `cache` (vLLM's `concat_and_cache_mla`): token `t`'s
/// `kv_c[t]` (`[T, kv_lora_rank]`) goes to dims `[0, kv_lora_rank)` of slot
/// `slot_mapping[t]` and `k_pe[t]` (`[T, rope]`) to the rest; a negative slot (padding)
/// writes nothing; fp8 caches store `x / scale`, saturated. CPU tensors; shapes, dtypes and
/// slots are checked first, and nothing is written when a check fails.
pub fn concat_and_cache_mla(
    kv_c: &Tensor,
    k_pe: &Tensor,
    cache: &mut MlaKvCache,
    slot_mapping: &[i64],
    scale: f32,
) -> Result<()> {
    let t = slot_mapping.len();
    let (&[kt, l], &[pt, r]) = (kv_c.shape(), k_pe.shape()) else {
        return Err(Error::shape(
            "kv_c / k_pe",
            kv_c.shape(),
            "[T, kv_lora_rank] and [T, rope]",
        ));
    };
    if kt < t || pt < t {
        return Err(Error::config(format!(
            "concat_and_cache_mla: {t} slots but {kt} kv_c and {pt} k_pe rows"
        )));
    }
    if l + r != cache.latent_dim {
        return Err(Error::config(format!(
            "concat_and_cache_mla: kv_c ({l}) + k_pe ({r}) = {} dims, the cache holds {}",
            l + r,
            cache.latent_dim
        )));
    }
    kv_c.expect_dtype("kv_c", cache.dtype)?;
    k_pe.expect_dtype("k_pe", cache.dtype)?;
    let scale = if cache.cache_dtype.is_fp8() {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::config(format!(
                "concat_and_cache_mla: an fp8 cache needs a finite positive scale, got {scale}"
            )));
        }
        scale
    } else {
        1.0
    };
    let capacity = cache.num_blocks * cache.block_size;
    if let Some(&s) = slot_mapping
        .iter()
        .find(|&&s| s >= 0 && s as u64 >= capacity as u64)
    {
        return Err(Error::metadata(format!(
            "concat_and_cache_mla: slot {s} is outside the cache's {capacity} slots"
        )));
    }
    let (c, p) = (kv_c.to_f32_vec()?, k_pe.to_f32_vec()?);
    let dtype = cache.storage_dtype();
    let (bs, dim) = (cache.block_size, cache.latent_dim);
    let Some(storage) = cache.data.as_cpu_mut() else {
        return Err(Error::Device {
            backend: "MLA".into(),
            message: "concat_and_cache_mla runs on CPU caches; this cache is on a GPU".into(),
        });
    };
    let mut row = vec![0.0f32; dim];
    for (i, &s) in slot_mapping.iter().enumerate() {
        if s < 0 {
            continue;
        }
        let s = s as usize;
        row[..l].copy_from_slice(&c[i * l..][..l]);
        row[l..].copy_from_slice(&p[i * r..][..r]);
        let o = (s / bs * bs + s % bs) * dim;
        write_row(storage, dtype, o, &row, scale);
    }
    Ok(())
}

fn write_row(storage: &mut CpuStorage, dtype: DType, offset: usize, src: &[f32], scale: f32) {
    let n = src.len();
    match storage {
        CpuStorage::F32(v) => v[offset..offset + n].copy_from_slice(src),
        CpuStorage::F16(v) => {
            for (d, &x) in v[offset..offset + n].iter_mut().zip(src) {
                *d = half::f16::from_f32(x);
            }
        }
        CpuStorage::Bf16(v) => {
            for (d, &x) in v[offset..offset + n].iter_mut().zip(src) {
                *d = half::bf16::from_f32(x);
            }
        }
        CpuStorage::U8(v) => {
            for (d, &x) in v[offset..offset + n].iter_mut().zip(src) {
                *d = fp8::encode(dtype, x / scale);
            }
        }
        // The cache is created with a float storage dtype.
        CpuStorage::I32(_) | CpuStorage::I64(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latents_land_in_their_slots_and_padding_is_skipped() {
        let cpu = Device::cpu();
        let mut cache = MlaKvCache::new(&cpu, 3, 4, 5, DType::F32, CacheDType::Auto).unwrap();
        let kv_c = Tensor::from_f32(
            &cpu,
            &(0..9).map(|x| x as f32).collect::<Vec<_>>(),
            &[3, 3],
            DType::F32,
        )
        .unwrap();
        let k_pe =
            Tensor::from_f32(&cpu, &[-1., -2., -3., -4., -5., -6.], &[3, 2], DType::F32).unwrap();
        concat_and_cache_mla(&kv_c, &k_pe, &mut cache, &[9, -1, 0], 1.0).unwrap();
        let all = cache.data().to_f32_vec().unwrap();
        assert_eq!(&all[45..50], &[0., 1., 2., -1., -2.]);
        assert_eq!(&all[0..5], &[6., 7., 8., -5., -6.]);
        assert!(all[5..45].iter().all(|&x| x == 0.0));
        // Block 2, token 1 = slot 9.
        assert_eq!(
            cache.gather_f32(&[0, 2, 2], 10, 1.0).unwrap()[45..50],
            all[45..50]
        );
        // Out-of-range slot, wrong width: typed errors, nothing written.
        assert!(concat_and_cache_mla(&kv_c, &k_pe, &mut cache, &[12, 0, 0], 1.0).is_err());
        let narrow = Tensor::from_f32(&cpu, &[0.0; 3], &[3, 1], DType::F32).unwrap();
        assert!(concat_and_cache_mla(&kv_c, &narrow, &mut cache, &[1, 2, 3], 1.0).is_err());
        assert_eq!(cache.data().to_f32_vec().unwrap(), all);
    }

    #[test]
    fn fp8_latents_are_divided_by_the_scale() {
        let cpu = Device::cpu();
        let mut cache = MlaKvCache::new(&cpu, 1, 2, 2, DType::Bf16, CacheDType::Fp8E4m3).unwrap();
        let kv_c = Tensor::from_f32(&cpu, &[3.0], &[1, 1], DType::Bf16).unwrap();
        let k_pe = Tensor::from_f32(&cpu, &[-1000.0], &[1, 1], DType::Bf16).unwrap();
        concat_and_cache_mla(&kv_c, &k_pe, &mut cache, &[1], 0.5).unwrap();
        let bytes = cache.data().to_u8_vec().unwrap();
        assert_eq!(bytes[2], fp8::encode_e4m3(6.0));
        // Saturated at the largest finite E4M3 value.
        assert_eq!(bytes[3], fp8::encode_e4m3(-448.0));
        assert!(concat_and_cache_mla(&kv_c, &k_pe, &mut cache, &[1], 0.0).is_err());
        let got = cache.gather_f32(&[0], 2, 0.5).unwrap();
        assert_eq!(got[2], 3.0);
    }
}
