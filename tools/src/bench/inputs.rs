//! Lean benchmark inputs: random normal data (never zeros) written straight into the storage
//! dtype, a cache filled whole, metadata built once, outside the timed region.
//!
//! `testing::RandomBatch` keeps f64-reference host copies of every key and value; at
//! benchmark sizes (gigabytes of KV) that costs more than the benchmark, so this builder only
//! makes what the kernels read. Data is generated on the host in parallel (one seeded
//! generator per 64 Ki-element chunk, so it is the same on every machine and thread count) and
//! uploaded once with [`Tensor::from_cpu_storage`] — a move on the CPU. GPU backends with
//! huge caches may prefer a device-side random fill; the upload is the portable default.

use half::{bf16, f16};
use rayon::prelude::*;

use polyattn::attention::{AttentionImpl, AttentionLayer, AttentionParams, MlaAttentionImpl};
use polyattn::backend::{AttentionBackend, KvLayout};
use polyattn::device::{CpuStorage, Device, Tensor};
use polyattn::dtype::{CacheDType, DType};
use polyattn::error::Result;
use polyattn::fp8;
use polyattn::kv_cache::{KvCache, KvCacheSpec};
use polyattn::metadata::{AttentionMetadata, BatchDescription, CommonAttentionMetadata};
use polyattn::mla::{absorb_kv_b_proj, MlaKvCache, MlaParams};
use polyattn::testing::Rng;

use super::formulas::Request;
use super::shapes::Case;

const CHUNK: usize = 1 << 16;

/// `n` standard normals stored as `dtype` (fp8: encoded with scale 1; N(0,1) is far inside
/// both fp8 ranges).
pub fn random_storage(n: usize, dtype: DType, seed: u64) -> CpuStorage {
    fn fill<T: Send + Copy + Default>(
        n: usize,
        seed: u64,
        conv: impl Fn(f32) -> T + Sync,
    ) -> Vec<T> {
        let mut v = vec![T::default(); n];
        v.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
            let mut rng = Rng::new(seed ^ (c as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
            out.iter_mut().for_each(|x| *x = conv(rng.normal()));
        });
        v
    }
    match dtype {
        DType::F32 => CpuStorage::F32(fill(n, seed, |x| x)),
        DType::F16 => CpuStorage::F16(fill(n, seed, f16::from_f32)),
        DType::Bf16 => CpuStorage::Bf16(fill(n, seed, bf16::from_f32)),
        DType::Fp8E4m3 | DType::Fp8E5m2 => CpuStorage::U8(fill(n, seed, |x| fp8::encode(dtype, x))),
        DType::I32 => CpuStorage::I32(fill(n, seed, |x| (x * 1000.0) as i32)),
        DType::I64 => CpuStorage::I64(fill(n, seed, |x| (x * 1000.0) as i64)),
    }
}

/// A random tensor of `shape` and `dtype` on `device`.
pub fn random_tensor(device: &Device, shape: &[usize], dtype: DType, seed: u64) -> Result<Tensor> {
    let n = shape.iter().product();
    Tensor::from_cpu_storage(device, random_storage(n, dtype, seed), shape, dtype)
}

/// Bytes one input set of `case` occupies (cache, activations, metadata), for the memory
/// guard.
pub fn set_bytes(case: &Case, dtype: DType, kv: CacheDType) -> f64 {
    let s_act = dtype.size_in_bytes() as f64;
    let s_kv = kv.storage_dtype(dtype).size_in_bytes() as f64;
    let (hq, hkv, d, dv) = (
        case.num_heads as f64,
        case.num_kv_heads as f64,
        case.head_size as f64,
        case.head_size_v as f64,
    );
    let t = case.num_tokens() as f64;
    if case.family.is_attention() {
        let blocks = num_blocks(&case.requests, case.block_size) as f64;
        let cache = blocks * case.block_size as f64 * hkv * (d + dv) * s_kv;
        // Query + output, plus the CPU kernels' f32 scratch for the output.
        cache + t * hq * (d + dv) * s_act + t * hq * dv * 4.0
    } else if case.family == super::shapes::Family::KvWrite {
        let blocks = kv_write_blocks(case.tokens, case.block_size) as f64;
        blocks * case.block_size as f64 * hkv * (d + dv) * s_kv + t * hkv * (d + dv) * s_act
    } else {
        // Merge: three states and three LSEs, plus the CPU kernel's f32 copies.
        3.0 * t * hq * dv * (s_act + 4.0) + 3.0 * t * hq * 4.0
    }
}

/// Blocks an attention batch needs: one per `block_size` tokens of every request, the null
/// block, and a spare.
pub fn num_blocks(reqs: &[Request], block_size: usize) -> usize {
    1 + reqs
        .iter()
        .map(|r| r.sk.div_ceil(block_size))
        .sum::<usize>()
        + 1
}

/// Blocks of a KV-write case: twice what `T` tokens fill (slots are spread over the cache),
/// the null block, at least 8.
pub fn kv_write_blocks(tokens: usize, block_size: usize) -> usize {
    1 + (2 * tokens.div_ceil(block_size)).max(8)
}

/// The metadata of an attention batch with randomly permuted blocks; new tokens are the last
/// `Sq` positions of each request.
pub fn attention_description(
    reqs: &[Request],
    block_size: usize,
    causal: bool,
    seed: u64,
) -> BatchDescription {
    let mut rng = Rng::new(seed ^ 0xb10c);
    let nb = num_blocks(reqs, block_size);
    let mut pool: Vec<i32> = (1..nb as i32).collect();
    rng.shuffle(&mut pool);
    let width = reqs
        .iter()
        .map(|r| r.sk.div_ceil(block_size))
        .max()
        .unwrap_or(0)
        .max(1);
    let mut desc = BatchDescription {
        query_start_loc: vec![0],
        seq_lens: Vec::with_capacity(reqs.len()),
        block_table: vec![0; reqs.len() * width],
        max_blocks_per_req: width,
        slot_mapping: Vec::new(),
        causal,
        block_size,
        is_prefilling: None,
    };
    for (i, r) in reqs.iter().enumerate() {
        let row = &mut desc.block_table[i * width..(i + 1) * width];
        for slot in row.iter_mut().take(r.sk.div_ceil(block_size)) {
            *slot = pool.pop().expect("pool sized for every request");
        }
        for pos in r.sk - r.sq..r.sk {
            let b = row[pos / block_size] as i64;
            desc.slot_mapping
                .push(b * block_size as i64 + (pos % block_size) as i64);
        }
        let last = *desc.query_start_loc.last().unwrap_or(&0);
        desc.query_start_loc.push(last + r.sq as i32);
        desc.seq_lens.push(r.sk as i32);
    }
    desc
}

/// The layer's impl parameters for an attention case.
pub fn params(case: &Case, kv: CacheDType) -> AttentionParams {
    let mut p = AttentionParams::new(case.num_heads, case.head_size, case.num_kv_heads);
    p.kv_cache_dtype = kv;
    p
}

/// One input set of a prefill / decode row: what `forward` reads and writes.
pub struct AttentionSet {
    /// `[T, Hq, D]`.
    pub query: Tensor,
    /// The cache, every block filled with random keys and values.
    pub cache: KvCache,
    /// Built once by the backend's builder.
    pub metadata: Box<dyn AttentionMetadata>,
    /// `[T, Hq, D]`.
    pub output: Tensor,
}

/// Builds one attention input set for `backend`.
pub fn attention_set(
    backend: &dyn AttentionBackend,
    case: &Case,
    dtype: DType,
    kv: CacheDType,
    seed: u64,
) -> Result<AttentionSet> {
    build_attention_set(backend, case, dtype, kv, seed, false)
}

/// [`attention_set`] with metadata from the builder's `build_for_graph_capture` (a forward on
/// it can be captured; single-token decode rows on backends with graphs).
pub fn graph_attention_set(
    backend: &dyn AttentionBackend,
    case: &Case,
    dtype: DType,
    kv: CacheDType,
    seed: u64,
) -> Result<AttentionSet> {
    build_attention_set(backend, case, dtype, kv, seed, true)
}

fn build_attention_set(
    backend: &dyn AttentionBackend,
    case: &Case,
    dtype: DType,
    kv: CacheDType,
    seed: u64,
    graph: bool,
) -> Result<AttentionSet> {
    let device = backend.device()?;
    let spec = cache_spec(case, dtype, kv);
    let desc = attention_description(&case.requests, case.block_size, case.causal, seed);
    let mut cache = KvCache::new(backend, spec, num_blocks(&case.requests, case.block_size))?;
    fill_cache(&device, &mut cache, seed ^ 0xcac4e)?;
    let common = CommonAttentionMetadata::new(&device, desc)?;
    let builder = backend.make_builder(&spec)?;
    let metadata = if graph {
        builder.build_for_graph_capture(&common)?
    } else {
        builder.build(0, &common, false)?
    };
    let t = case.num_tokens();
    let shape = [t, case.num_heads, case.head_size];
    Ok(AttentionSet {
        query: random_tensor(&device, &shape, dtype, seed ^ 0x9)?,
        output: Tensor::zeros(&device, &shape, dtype)?,
        cache,
        metadata,
    })
}

/// The KV-cache spec of an attention case's layer in `dtype` / `kv`.
pub fn cache_spec(case: &Case, dtype: DType, kv: CacheDType) -> KvCacheSpec {
    KvCacheSpec {
        block_size: case.block_size,
        num_kv_heads: case.num_kv_heads,
        head_size: case.head_size,
        dtype,
        cache_dtype: kv,
    }
}

/// Replaces a cache's contents with random normals in its storage dtype.
pub fn fill_cache(device: &Device, cache: &mut KvCache, seed: u64) -> Result<()> {
    let dtype = cache.spec().storage_dtype();
    let shape = cache.data().shape().to_vec();
    *cache.data_mut() = random_tensor(device, &shape, dtype, seed)?;
    Ok(())
}

/// One input set of an MLA decode row.
pub struct MlaSet {
    /// `[T, N, head_size]` absorbed queries.
    pub query: Tensor,
    /// `[T, N, head_size_v]` latent-space outputs.
    pub output: Tensor,
    /// The latent cache (random contents).
    pub cache: MlaKvCache,
    /// The batch's metadata from the backend's MLA builder.
    pub metadata: Box<dyn AttentionMetadata>,
}

/// The MLA sizes of a row: DeepSeek-V3's with the row's heads, latent `head_size_v` +
/// rope `head_size - head_size_v`, and cache dtype `kv`.
pub fn mla_params(case: &Case, kv: CacheDType) -> MlaParams {
    MlaParams {
        kv_lora_rank: case.head_size_v,
        qk_rope_head_dim: case.head_size - case.head_size_v,
        kv_cache_dtype: kv,
        ..MlaParams::deepseek_v3(case.num_heads)
    }
}

/// The MLA impl of a row, with random `kv_b_proj` (the decode does not read it).
pub fn make_mla_impl(
    backend: &dyn AttentionBackend,
    case: &Case,
    kv: CacheDType,
) -> Result<(Box<dyn MlaAttentionImpl>, AttentionLayer)> {
    let p = mla_params(case, kv);
    let n = p.num_heads * (p.qk_nope_head_dim + p.v_head_dim) * p.kv_lora_rank;
    let w = Rng::new(0x3b1a).normals(n);
    let weights = absorb_kv_b_proj(&w, &p)?;
    Ok((
        backend.make_mla_impl(p, weights)?,
        AttentionLayer::new("bench"),
    ))
}

/// Builds one MLA decode input set: the row's requests over a random latent cache.
pub fn mla_set(
    backend: &dyn AttentionBackend,
    case: &Case,
    dtype: DType,
    kv: CacheDType,
    seed: u64,
) -> Result<MlaSet> {
    let device = backend.device()?;
    let p = mla_params(case, kv);
    let desc = attention_description(&case.requests, case.block_size, true, seed);
    let nb = num_blocks(&case.requests, case.block_size);
    let mut cache = MlaKvCache::for_backend(backend, &p, dtype, nb, case.block_size)?;
    let shape = cache.data().shape().to_vec();
    *cache.data_mut() = random_tensor(&device, &shape, cache.storage_dtype(), seed ^ 0xcac4e)?;
    let common = CommonAttentionMetadata::new(&device, desc)?;
    let metadata = backend
        .make_mla_builder(case.block_size)?
        .build(0, &common, false)?;
    let t = case.num_tokens();
    Ok(MlaSet {
        query: random_tensor(
            &device,
            &[t, p.num_heads, case.head_size],
            dtype,
            seed ^ 0x9,
        )?,
        output: Tensor::zeros(&device, &[t, p.num_heads, case.head_size_v], dtype)?,
        cache,
        metadata,
    })
}

/// One input set of a KV-write row.
pub struct KvWriteSet {
    /// `[T, Hkv, D]` new keys.
    pub key: Tensor,
    /// `[T, Hkv, D]` new values.
    pub value: Tensor,
    /// The cache written (random contents).
    pub cache: KvCache,
    /// One request of `T` tokens whose slots are `T` random distinct cache slots.
    pub metadata: Box<dyn AttentionMetadata>,
}

/// Builds one KV-write input set: `T` tokens to random distinct slots of a cache twice that
/// size, in the case's layout.
pub fn kv_write_set(
    backend: &dyn AttentionBackend,
    case: &Case,
    dtype: DType,
    kv: CacheDType,
    seed: u64,
) -> Result<KvWriteSet> {
    let device = backend.device()?;
    let bs = case.block_size;
    let t = case.tokens;
    let spec = KvCacheSpec {
        block_size: bs,
        num_kv_heads: case.num_kv_heads,
        head_size: case.head_size,
        dtype,
        cache_dtype: kv,
    };
    let nb = kv_write_blocks(t, bs);
    let layout = case.layout.unwrap_or(backend.capabilities().kv_layout);
    // The backend checks the block and head sizes; the layout is the case's.
    backend.kv_cache_shape(nb, bs, case.num_kv_heads, case.head_size, kv)?;
    let mut cache = KvCache::with_layout(&device, spec, nb, layout)?;
    fill_cache(&device, &mut cache, seed ^ 0xcac4e)?;
    let mut rng = Rng::new(seed ^ 0x5107);
    let mut slots: Vec<i64> = (bs as i64..(nb * bs) as i64).collect();
    rng.shuffle(&mut slots);
    slots.truncate(t);
    let width = t.div_ceil(bs).max(1);
    let desc = BatchDescription {
        query_start_loc: vec![0, t as i32],
        seq_lens: vec![t as i32],
        block_table: (1..=width as i32).collect(),
        max_blocks_per_req: width,
        slot_mapping: slots,
        causal: true,
        block_size: bs,
        is_prefilling: None,
    };
    let common = CommonAttentionMetadata::new(&device, desc)?;
    let metadata = backend.make_builder(&spec)?.build(0, &common, false)?;
    let shape = [t, case.num_kv_heads, case.head_size];
    Ok(KvWriteSet {
        key: random_tensor(&device, &shape, dtype, seed ^ 0x4b)?,
        value: random_tensor(&device, &shape, dtype, seed ^ 0x56)?,
        cache,
        metadata,
    })
}

/// One input set of a merge row.
pub struct MergeSet {
    /// `[T, H, D]`.
    pub prefix_output: Tensor,
    /// `[H, T]` f32.
    pub prefix_lse: Tensor,
    /// `[T, H, D]`.
    pub suffix_output: Tensor,
    /// `[H, T]` f32.
    pub suffix_lse: Tensor,
    /// `[T, H, D]`.
    pub output: Tensor,
    /// `[H, T]` f32.
    pub output_lse: Tensor,
}

/// Builds one merge input set on `device`.
pub fn merge_set(device: &Device, case: &Case, dtype: DType, seed: u64) -> Result<MergeSet> {
    let (t, h, d) = (case.tokens, case.num_heads, case.head_size_v);
    Ok(MergeSet {
        prefix_output: random_tensor(device, &[t, h, d], dtype, seed ^ 1)?,
        prefix_lse: random_tensor(device, &[h, t], DType::F32, seed ^ 2)?,
        suffix_output: random_tensor(device, &[t, h, d], dtype, seed ^ 3)?,
        suffix_lse: random_tensor(device, &[h, t], DType::F32, seed ^ 4)?,
        output: Tensor::zeros(device, &[t, h, d], dtype)?,
        output_lse: Tensor::zeros(device, &[h, t], DType::F32)?,
    })
}

/// The impl and layer state of an attention or KV-write row.
pub fn make_impl(
    backend: &dyn AttentionBackend,
    case: &Case,
    kv: CacheDType,
) -> Result<(Box<dyn AttentionImpl>, AttentionLayer)> {
    Ok((
        backend.make_impl(params(case, kv))?,
        AttentionLayer::new("bench"),
    ))
}

/// The cache layout a KV-write case writes.
pub fn layout_name(layout: KvLayout) -> &'static str {
    match layout {
        KvLayout::Nhd => "NHD",
        KvLayout::Hnd => "HND",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polyattn::metadata::CommonAttentionMetadata;

    #[test]
    fn random_data_is_seeded_and_nonzero() {
        let a = random_storage(3 * CHUNK + 5, DType::F32, 7);
        assert_eq!(a, random_storage(3 * CHUNK + 5, DType::F32, 7));
        match a {
            CpuStorage::F32(v) => {
                assert_eq!(v.len(), 3 * CHUNK + 5);
                assert!(v.iter().all(|&x| x != 0.0 && x.is_finite()));
            }
            _ => unreachable!(),
        }
    }

    #[test]
    fn descriptions_validate() {
        let reqs = [Request { sq: 3, sk: 40 }, Request { sq: 1, sk: 17 }];
        let d = attention_description(&reqs, 16, true, 1);
        assert_eq!(d.slot_mapping.len(), 4);
        CommonAttentionMetadata::new(&Device::cpu(), d).unwrap();
    }
}
