//! The smallest complete use of polyattn: one attention layer, a paged KV cache, a prefill
//! step for two prompts and then two decode steps with both requests in one batch.
//!
//! Run: `cargo run --release --example quickstart` (add `POLYATTN_BACKEND=cpu` to force a
//! backend). The same code runs on every backend: only the selector's choice changes.

use polyattn::testing::Rng;
use polyattn::{
    Attention, AttentionLayer, AttentionParams, BatchDescription, BlockPool, CacheDType,
    CommonAttentionMetadata, DType, KvCache, KvCacheSpec, Tensor,
};

const HEADS: usize = 8;
const KV_HEADS: usize = 2;
const HEAD_SIZE: usize = 64;
const BLOCK: usize = 16;

/// One running request: its blocks and how many tokens the cache holds.
struct Request {
    blocks: Vec<i32>,
    cached: usize,
}

fn main() -> polyattn::Result<()> {
    let dtype = DType::F32;
    let params = AttentionParams::new(HEADS, HEAD_SIZE, KV_HEADS);
    let attn = Attention::new(
        AttentionLayer::new("layers.0.attn"),
        params,
        dtype,
        Some(BLOCK as u32),
    )?;
    let backend = attn.backend();
    let device = backend.device()?;
    println!("backend: {} on {}", backend.name(), device.description());

    let spec = KvCacheSpec {
        block_size: BLOCK,
        num_kv_heads: KV_HEADS,
        head_size: HEAD_SIZE,
        dtype,
        cache_dtype: CacheDType::Auto,
    };
    let num_blocks = 64;
    let mut cache = KvCache::new(backend, spec, num_blocks)?;
    let mut pool = BlockPool::new(num_blocks)?;
    let builder = attn.make_builder(&spec)?;
    let mut rng = Rng::new(42);

    // Two prompts of 21 and 5 tokens, then two decode steps.
    let mut reqs: Vec<Request> = Vec::new();
    let steps: [Vec<usize>; 3] = [vec![21, 5], vec![1, 1], vec![1, 1]];
    for (step, new_tokens) in steps.iter().enumerate() {
        // Allocate blocks for the new tokens and describe the batch.
        let mut desc = BatchDescription {
            query_start_loc: vec![0],
            causal: true,
            block_size: BLOCK,
            ..Default::default()
        };
        let width = 8;
        for (i, &n) in new_tokens.iter().enumerate() {
            if reqs.len() <= i {
                reqs.push(Request {
                    blocks: Vec::new(),
                    cached: 0,
                });
            }
            let r = &mut reqs[i];
            let total = r.cached + n;
            let need = total.div_ceil(BLOCK) - r.blocks.len();
            r.blocks.extend(pool.allocate(need)?);
            for pos in r.cached..total {
                let block = r.blocks[pos / BLOCK] as i64;
                desc.slot_mapping
                    .push(block * BLOCK as i64 + (pos % BLOCK) as i64);
            }
            let mut row = r.blocks.clone();
            row.resize(width, 0);
            desc.block_table.extend(row);
            desc.seq_lens.push(total as i32);
            desc.query_start_loc
                .push(desc.query_start_loc.last().unwrap() + n as i32);
            r.cached = total;
        }
        desc.max_blocks_per_req = width;
        let tokens: usize = new_tokens.iter().sum();

        // Once per step: validate the batch and build the backend's metadata.
        let common = CommonAttentionMetadata::new(&device, desc)?;
        let metadata = builder.build(0, &common, false)?;

        // Per layer: Q/K/V would come from the model's projections.
        let q = Tensor::from_f32(
            &device,
            &rng.normals(tokens * HEADS * HEAD_SIZE),
            &[tokens, HEADS, HEAD_SIZE],
            dtype,
        )?;
        let k = Tensor::from_f32(
            &device,
            &rng.normals(tokens * KV_HEADS * HEAD_SIZE),
            &[tokens, KV_HEADS, HEAD_SIZE],
            dtype,
        )?;
        let v = Tensor::from_f32(
            &device,
            &rng.normals(tokens * KV_HEADS * HEAD_SIZE),
            &[tokens, KV_HEADS, HEAD_SIZE],
            dtype,
        )?;
        let mut out = Tensor::zeros(&device, &[tokens, HEADS, HEAD_SIZE], dtype)?;
        attn.forward(
            &q,
            Some(&k),
            Some(&v),
            &mut cache,
            metadata.as_ref(),
            &mut out,
        )?;

        let o = out.to_f32_vec()?;
        println!(
            "step {step}: {tokens} tokens ({} requests), output[0][0][..4] = {:?}",
            new_tokens.len(),
            &o[..4]
        );
    }
    println!("free blocks left: {}", pool.num_free());
    Ok(())
}
