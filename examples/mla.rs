//! One DeepSeek-V3-shaped MLA layer (16 heads: one GPU's share at tensor-parallel 8) as a
//! model drives it: the selector's MLA backend, `kv_b_proj` absorbed once, a 150-token prompt
//! through `forward_mha`, then four decode steps through `forward_mqa` with the absorbed
//! query and the `W_UV` up-projection. Every step also runs on `CPU_MLA`, and the example
//! fails unless both agree within the activation dtype's tolerance (the cross-device
//! consistency users rely on).
//!
//! Run: `cargo run --release --example mla` (`POLYATTN_BACKEND=wgpu_mla` forces a backend).

use polyattn::backend::{BackendRef, SelectorConfig};
use polyattn::metadata::{AttentionMetadataBuilder, BatchDescription, CommonAttentionMetadata};
use polyattn::mla::{absorb_kv_b_proj, AbsorbedWeights, MlaKvCache, MlaParams};
use polyattn::testing::{Rng, Tolerance};
use polyattn::{AttentionLayer, BlockPool, CacheDType, DType, Device, MlaAttentionImpl, Tensor};

const HEADS: usize = 16;
const BLOCK: usize = 32;
/// Longer than the builder's decode threshold (128 tokens), so the prompt is a prefill.
const PROMPT: usize = 150;
const DECODE_STEPS: usize = 4;

/// One backend's layer: its impl, metadata builder, latent cache and device.
struct Layer {
    name: String,
    device: Device,
    imp: Box<dyn MlaAttentionImpl>,
    builder: Box<dyn AttentionMetadataBuilder>,
    cache: MlaKvCache,
}

impl Layer {
    fn new(
        b: &BackendRef,
        p: &MlaParams,
        w: &AbsorbedWeights,
        dtype: DType,
    ) -> polyattn::Result<Self> {
        Ok(Layer {
            name: b.name().to_string(),
            device: b.device()?,
            imp: b.make_mla_impl(p.clone(), w.clone())?,
            builder: b.make_mla_builder(BLOCK)?,
            cache: MlaKvCache::for_backend(b.as_ref(), p, dtype, 8, BLOCK)?,
        })
    }

    /// One step of `new` tokens at positions `pos..pos + new` of the request owning
    /// `blocks`: the cache write, then the prefill (the prompt) or the decode; the output
    /// `[new, heads, v_head_dim]` on the host.
    fn step(
        &mut self,
        layer: &AttentionLayer,
        w: &AbsorbedWeights,
        blocks: &[i32],
        pos: usize,
        x: &Inputs,
        dtype: DType,
    ) -> polyattn::Result<Vec<f32>> {
        let p = &w.params;
        let new = x.tokens;
        let cpu = Device::cpu();
        let put = |v: &[f32], shape: &[usize]| {
            Tensor::from_f32(&cpu, v, shape, dtype)?.to_device(&self.device)
        };
        let desc = BatchDescription {
            query_start_loc: vec![0, new as i32],
            seq_lens: vec![(pos + new) as i32],
            block_table: blocks.to_vec(),
            max_blocks_per_req: blocks.len(),
            slot_mapping: (pos..pos + new)
                .map(|t| blocks[t / BLOCK] as i64 * BLOCK as i64 + (t % BLOCK) as i64)
                .collect(),
            causal: true,
            block_size: BLOCK,
            is_prefilling: None,
        };
        let md =
            self.builder
                .build(0, &CommonAttentionMetadata::new(&self.device, desc)?, false)?;
        let kv_c = put(&x.kv_c, &[new, p.kv_lora_rank])?;
        let k_pe = put(&x.k_pe, &[new, p.qk_rope_head_dim])?;
        self.imp
            .do_kv_cache_update(layer, &kv_c, &k_pe, &mut self.cache, md.as_ref())?;
        let n = p.num_heads;
        if new > 1 {
            let q = put(&x.q, &[new, n, p.qk_head_dim()])?;
            let mut out = put(&vec![0.0; new * n * p.v_head_dim], &[new, n, p.v_head_dim])?;
            self.imp
                .forward_mha(layer, &q, &kv_c, &k_pe, &self.cache, md.as_ref(), &mut out)?;
            return out.to_f32_vec();
        }
        let q_lat = put(&w.absorb_query(&x.q)?, &[new, n, p.latent_dim()])?;
        let mut o_lat = put(
            &vec![0.0; new * n * p.kv_lora_rank],
            &[new, n, p.kv_lora_rank],
        )?;
        self.imp
            .forward_mqa(layer, &q_lat, &self.cache, md.as_ref(), &mut o_lat, None)?;
        w.up_project(&o_lat.to_f32_vec()?)
    }
}

/// One step's new tokens: queries `[tokens, heads, qk_nope + rope]`, latents and rope keys.
struct Inputs {
    tokens: usize,
    q: Vec<f32>,
    kv_c: Vec<f32>,
    k_pe: Vec<f32>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dtype = DType::Bf16;
    let p = MlaParams::deepseek_v3(HEADS);
    let mut config = SelectorConfig::new(p.latent_dim(), dtype, CacheDType::Auto);
    config.use_mla = true;
    config.block_size = Some(BLOCK as u32);
    let backend = polyattn::selector::get_attn_backend(&config)?;
    let reference = polyattn::registry::global()
        .get("CPU_MLA")
        .ok_or("CPU_MLA is not registered")?;
    println!(
        "MLA backend: {} on {}",
        backend.name(),
        backend.device()?.description()
    );

    let mut rng = Rng::new(21);
    let scale = 1.0 / (p.kv_lora_rank as f32).sqrt();
    let kv_b_proj: Vec<f32> = rng
        .normals(p.num_heads * (p.qk_nope_head_dim + p.v_head_dim) * p.kv_lora_rank)
        .into_iter()
        .map(|x| x * scale)
        .collect();
    let w = absorb_kv_b_proj(&kv_b_proj, &p)?;
    let layer = AttentionLayer::new("layers.0.self_attn");
    let mut layers = vec![Layer::new(&backend, &p, &w, dtype)?];
    if backend.name() != reference.name() {
        layers.push(Layer::new(&reference, &p, &w, dtype)?);
    }
    let mut pool = BlockPool::new(8)?;
    let blocks = pool.allocate((PROMPT + DECODE_STEPS).div_ceil(BLOCK))?;
    let tol = Tolerance::for_dtype(dtype);
    let mut pos = 0;
    for step in 0..=DECODE_STEPS {
        let tokens = if step == 0 { PROMPT } else { 1 };
        let x = Inputs {
            tokens,
            q: rng.normals(tokens * p.num_heads * p.qk_head_dim()),
            kv_c: rng.normals(tokens * p.kv_lora_rank),
            k_pe: rng.normals(tokens * p.qk_rope_head_dim),
        };
        let outs = layers
            .iter_mut()
            .map(|l| l.step(&layer, &w, &blocks, pos, &x, dtype))
            .collect::<polyattn::Result<Vec<_>>>()?;
        let worst = match outs.get(1) {
            Some(r) => {
                let d = outs[0]
                    .iter()
                    .zip(r)
                    .map(|(&a, &b)| (a as f64 - b as f64).abs())
                    .fold(0.0, f64::max);
                format!("largest difference to CPU_MLA {d:.2e}")
            }
            None => "CPU_MLA is the reference itself".into(),
        };
        if let Some(r) = outs.get(1) {
            if let Some(i) = (0..r.len()).find(|&i| !tol.accepts(outs[0][i] as f64, r[i] as f64)) {
                return Err(format!(
                    "step {step}: {} and {} disagree at element {i}: {} vs {}",
                    layers[0].name, layers[1].name, outs[0][i], r[i]
                )
                .into());
            }
        }
        println!(
            "step {step}: {tokens:>3} token(s) at position {pos:>3} ({}), output {:?}, {worst}",
            if tokens > 1 {
                "forward_mha"
            } else {
                "forward_mqa"
            },
            [tokens, p.num_heads, p.v_head_dim],
        );
        pos += tokens;
    }
    Ok(())
}
