//! Random paged batches, as vLLM's backend tests build them: random normal Q/K/V (never
//! zeros), block 0 reserved as the null block, physical blocks randomly permuted, the context
//! of every request already in the cache, and a slot mapping for the new tokens.
//!
//! Alongside the device tensors the batch keeps host copies of every key and value *as the
//! cache stores them* (rounded to the activation dtype, then to the cache dtype, fp8 through
//! `x / scale` and back), so a reference computed from them differs from a correct kernel
//! only by arithmetic order and output rounding, fp8 caches included.

use half::{bf16, f16};

use crate::attention::{AttentionLayer, AttentionParams};
use crate::backend::AttentionBackend;
use crate::backends::cpu::kernels::convert::store;
use crate::device::{Device, Tensor};
use crate::dtype::{CacheDType, DType};
use crate::error::{Error, Result};
use crate::fp8;
use crate::kv_cache::{KvCache, KvCacheSpec};
use crate::metadata::BatchDescription;

use crate::rng::Rng;

/// Query and KV lengths of each request: vLLM's `BatchSpec`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSpec {
    /// `(query_len, seq_len)` per request; `seq_len − query_len` tokens are already cached.
    pub requests: Vec<(usize, usize)>,
}

impl BatchSpec {
    /// From `(query_len, seq_len)` pairs.
    pub fn new(requests: &[(usize, usize)]) -> Self {
        BatchSpec {
            requests: requests.to_vec(),
        }
    }

    /// Total new tokens.
    pub fn num_tokens(&self) -> usize {
        self.requests.iter().map(|r| r.0).sum()
    }
}

/// Everything that defines one test case besides the batch shape.
#[derive(Clone, Debug)]
pub struct CaseConfig {
    /// Layer parameters.
    pub params: AttentionParams,
    /// Activation dtype.
    pub dtype: DType,
    /// Tokens per block.
    pub block_size: usize,
    /// Causal attention (decoder).
    pub causal: bool,
    /// Shared prefix (cascade) length in tokens; 0 for none.
    pub common_prefix_len: usize,
    /// fp8 key / value scales (ignored for unquantised caches).
    pub kv_scales: (f32, f32),
}

impl CaseConfig {
    /// A causal decoder case.
    pub fn new(params: AttentionParams, dtype: DType, block_size: usize) -> Self {
        CaseConfig {
            params,
            dtype,
            block_size,
            causal: true,
            common_prefix_len: 0,
            kv_scales: (0.05, 0.04),
        }
    }
}

/// A generated batch: device tensors, a filled cache, metadata, and host copies.
#[derive(Clone, Debug)]
pub struct RandomBatch {
    /// The case.
    pub case: CaseConfig,
    /// The batch shape.
    pub spec: BatchSpec,
    /// Layer state (scales).
    pub layer: AttentionLayer,
    /// `[T, num_heads, head_size]`.
    pub query: Tensor,
    /// `[T, num_kv_heads, head_size]` new keys.
    pub key: Tensor,
    /// `[T, num_kv_heads, head_size]` new values.
    pub value: Tensor,
    /// The cache with every request's context already written (new tokens not yet).
    pub kv_cache: KvCache,
    /// The metadata, ready for [`crate::CommonAttentionMetadata::new`].
    pub desc: BatchDescription,
    /// Queries as the device holds them, `[T][H][D]` f32.
    pub host_query: Vec<f32>,
    /// Per request, all `seq_len` keys as the cache holds them, `[seq_len][Hkv][D]`.
    pub host_keys: Vec<Vec<f32>>,
    /// Per request, all `seq_len` values as the cache holds them.
    pub host_values: Vec<Vec<f32>>,
}

/// `x` as stored in `dtype` (f32 unchanged).
pub fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::Bf16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// `x` (already in the activation dtype) as the cache stores it, dequantised.
pub fn round_to_cache(cache: CacheDType, act: DType, x: f32, scale: f32) -> f32 {
    match cache {
        CacheDType::Fp8E4m3 => fp8::E4M3_TABLE[fp8::encode_e4m3(x / scale) as usize] * scale,
        CacheDType::Fp8E5m2 => fp8::E5M2_TABLE[fp8::encode_e5m2(x / scale) as usize] * scale,
        other => round_to(other.storage_dtype(act), x),
    }
}

impl RandomBatch {
    /// Generates a batch for `backend` (its KV layout and device) from `seed`.
    pub fn generate(
        backend: &dyn AttentionBackend,
        case: &CaseConfig,
        spec: &BatchSpec,
        seed: u64,
    ) -> Result<Self> {
        let device = backend.device()?;
        let p = &case.params;
        let bs = case.block_size;
        let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_size);
        let mut rng = Rng::new(seed);
        if p.attn_type.is_encoder() && spec.requests.iter().any(|&(q, s)| q != s) {
            return Err(Error::config(
                "encoder batches have no cached context: query_len == seq_len",
            ));
        }
        if let Some(&(q, s)) = spec.requests.iter().find(|&&(q, s)| q > s) {
            return Err(Error::config(format!("query_len {q} > seq_len {s}")));
        }

        // Blocks: the shared prefix first, then each request's own, from a shuffled pool.
        let prefix_blocks = case.common_prefix_len / bs;
        let blocks_per_req: Vec<usize> = spec.requests.iter().map(|r| r.1.div_ceil(bs)).collect();
        let own: usize = blocks_per_req
            .iter()
            .map(|&n| n.saturating_sub(prefix_blocks))
            .sum();
        let num_blocks = 1 + prefix_blocks + own + 2;
        let mut pool: Vec<i32> = (1..num_blocks as i32).collect();
        rng.shuffle(&mut pool);
        let shared: Vec<i32> = pool.drain(..prefix_blocks).collect();
        let width = blocks_per_req.iter().copied().max().unwrap_or(0) + 1;
        let mut block_table = vec![0i32; spec.requests.len() * width];
        for (r, &n) in blocks_per_req.iter().enumerate() {
            let row = &mut block_table[r * width..(r + 1) * width];
            for (j, slot) in row.iter_mut().enumerate().take(n) {
                *slot = if j < prefix_blocks {
                    shared[j]
                } else {
                    pool.pop().expect("pool sized above")
                };
            }
        }

        let cache_dtype = p.kv_cache_dtype;
        let (k_scale, v_scale) = if cache_dtype.is_fp8() {
            case.kv_scales
        } else {
            (1.0, 1.0)
        };
        let layer = AttentionLayer::new("test.layer").with_scales(k_scale, v_scale)?;
        let kv_spec = KvCacheSpec {
            block_size: bs,
            num_kv_heads: hkv,
            head_size: d,
            dtype: case.dtype,
            cache_dtype,
        };
        // Built in host memory with the backend's layout, moved to its device at the end.
        backend.kv_cache_shape(num_blocks, bs, hkv, d, cache_dtype)?;
        let layout = backend.capabilities().kv_layout;
        let mut kv_cache = KvCache::with_layout(&Device::cpu(), kv_spec, num_blocks, layout)?;
        let storage_dtype = kv_spec.storage_dtype();

        // Keys and values of every position; the shared prefix is identical across requests.
        let mut prefix_k: Vec<f32> = Vec::new();
        let mut prefix_v: Vec<f32> = Vec::new();
        let mut host_keys = Vec::new();
        let mut host_values = Vec::new();
        let n_tok = spec.num_tokens();
        let mut new_k = Vec::with_capacity(n_tok * hkv * d);
        let mut new_v = Vec::with_capacity(n_tok * hkv * d);
        let mut slot_mapping = Vec::with_capacity(n_tok);
        let mut query_start_loc = vec![0i32];
        let mut seq_lens = Vec::new();
        for (r, &(q_len, s_len)) in spec.requests.iter().enumerate() {
            let ctx = s_len - q_len;
            let row = &block_table[r * width..(r + 1) * width];
            let mut ks = Vec::with_capacity(s_len * hkv * d);
            let mut vs = Vec::with_capacity(s_len * hkv * d);
            for pos in 0..s_len {
                let (k_raw, v_raw) =
                    if pos < case.common_prefix_len && !prefix_k.is_empty() && r > 0 {
                        let o = pos * hkv * d;
                        (
                            prefix_k[o..o + hkv * d].to_vec(),
                            prefix_v[o..o + hkv * d].to_vec(),
                        )
                    } else {
                        let k: Vec<f32> = rng
                            .normals(hkv * d)
                            .into_iter()
                            .map(|x| round_to(case.dtype, x))
                            .collect();
                        let v: Vec<f32> = rng
                            .normals(hkv * d)
                            .into_iter()
                            .map(|x| round_to(case.dtype, x))
                            .collect();
                        (k, v)
                    };
                if r == 0 && pos < case.common_prefix_len {
                    prefix_k.extend_from_slice(&k_raw);
                    prefix_v.extend_from_slice(&v_raw);
                }
                let slot = row[pos / bs] as i64 * bs as i64 + (pos % bs) as i64;
                if pos < ctx {
                    // Context: written straight into the cache, as a previous step would have.
                    let block = row[pos / bs] as usize;
                    for head in 0..hkv {
                        let src = head * d..(head + 1) * d;
                        let (ko, vo) = (
                            kv_cache.offset(block, 0, pos % bs, head),
                            kv_cache.offset(block, 1, pos % bs, head),
                        );
                        let st = kv_cache.data_mut().as_cpu_mut().expect("host cache");
                        store(st, storage_dtype, ko, &k_raw[src.clone()], k_scale);
                        store(st, storage_dtype, vo, &v_raw[src], v_scale);
                    }
                } else {
                    new_k.extend_from_slice(&k_raw);
                    new_v.extend_from_slice(&v_raw);
                    slot_mapping.push(slot);
                }
                ks.extend(
                    k_raw
                        .iter()
                        .map(|&x| round_to_cache(cache_dtype, case.dtype, x, k_scale)),
                );
                vs.extend(
                    v_raw
                        .iter()
                        .map(|&x| round_to_cache(cache_dtype, case.dtype, x, v_scale)),
                );
            }
            host_keys.push(ks);
            host_values.push(vs);
            query_start_loc.push(query_start_loc.last().unwrap() + q_len as i32);
            seq_lens.push(s_len as i32);
        }
        let host_query: Vec<f32> = rng
            .normals(n_tok * h * d)
            .into_iter()
            .map(|x| round_to(case.dtype, x))
            .collect();
        let query = Tensor::from_f32(&device, &host_query, &[n_tok, h, d], case.dtype)?;
        let key = Tensor::from_f32(&device, &new_k, &[n_tok, hkv, d], case.dtype)?;
        let value = Tensor::from_f32(&device, &new_v, &[n_tok, hkv, d], case.dtype)?;
        let desc = BatchDescription {
            query_start_loc,
            seq_lens,
            block_table,
            max_blocks_per_req: width,
            slot_mapping,
            causal: case.causal,
            block_size: bs,
            is_prefilling: None,
        };
        let kv_cache = kv_cache.to_device(&device)?;
        Ok(RandomBatch {
            case: case.clone(),
            spec: spec.clone(),
            layer,
            query,
            key,
            value,
            kv_cache,
            desc,
            host_query,
            host_keys,
            host_values,
        })
    }

    /// A zero-filled output tensor of the query's shape and dtype.
    pub fn empty_output(&self) -> Result<Tensor> {
        Tensor::zeros(self.query.device(), self.query.shape(), self.case.dtype)
    }

    /// The device the batch lives on.
    pub fn device(&self) -> &Device {
        self.query.device()
    }
}
