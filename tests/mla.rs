//! MLA's latent-space decode (absorbed query, MQA over the cached `[kv_c | k_pe]` latents,
//! `W_UV` up-projection: the CPU backend's `mla_decode` and the weight helpers) and its
//! expanded prefill (`mla_prefill`, causal, with cached context) against the f64 reference
//! in its expanded form (every head's keys and values up-projected, ordinary
//! attention), at DeepSeek-V3 sizes: 16 and 128 heads, kv_lora_rank 512, rope 64, qk_nope
//! 128, v 128, block sizes 32 and 64, 16-bit and fp8 latents. Unused cache slots and the
//! null block hold NaN, so a kernel that read outside a request's blocks would fail.

use polyattn::attention::MlaAttentionImpl;
use polyattn::metadata::{BatchDescription, CommonAttentionMetadata};
use polyattn::mla::{absorb_kv_b_proj, reference, AbsorbedWeights, MlaKvCache, MlaParams};
use polyattn::rng::Rng;
use polyattn::{CacheDType, DType, Device, Tensor};

mod common;

use common::{fail, for_each_case, CaseInfo, Outcome};
use polyattn::backend::{BackendRef, SelectorConfig};
use polyattn::testing::Tolerance;
use polyattn::AttentionLayer;

struct Case {
    heads: usize,
    block_size: usize,
    dtype: DType,
    cache: CacheDType,
    seq_lens: Vec<usize>,
    /// New tokens per request: the builder sends the leading requests of one query length
    /// (up to 128) to `forward_mqa`, the rest to `forward_mha`.
    q_lens: Vec<usize>,
    /// Blocks of the cache at least (the requests' blocks are spread over all of them).
    min_blocks: usize,
}

impl Case {
    fn info(&self) -> CaseInfo {
        let mut config = SelectorConfig::new(576, self.dtype, self.cache);
        config.use_mla = true;
        config.block_size = Some(self.block_size as u32);
        CaseInfo {
            label: format!(
                "{} heads bs{} {}/{} seq_lens {:?} q_lens {:?}",
                self.heads, self.block_size, self.dtype, self.cache, self.seq_lens, self.q_lens
            ),
            config: Some(config),
            cascade: false,
            graphs: false,
        }
    }
}

/// One batch through the backend's public MLA API: the cache written by
/// `do_kv_cache_update` (first NaN everywhere, then every request's latents), the decodes by
/// `forward_mqa` (queries absorbed, output up-projected on the host), the prefills by
/// `forward_mha`; every output and the decodes' LSE against the f64 expanded reference.
fn run(b: &BackendRef, c: &Case, seed: u64) -> Outcome {
    run_with(b, c, seed, &|p, w| b.make_mla_impl(p, w))
}

/// The impl a body runs: the backend's own, or one made with an explicit tuning.
type MakeImpl<'a> =
    dyn Fn(MlaParams, AbsorbedWeights) -> polyattn::Result<Box<dyn MlaAttentionImpl>> + 'a;

/// [`run`] with the impl made by `make`.
fn run_with(b: &BackendRef, c: &Case, seed: u64, make: &MakeImpl<'_>) -> Outcome {
    let dev = b.device()?;
    let cpu = Device::cpu();
    let p = MlaParams {
        kv_cache_dtype: c.cache,
        ..MlaParams::deepseek_v3(c.heads)
    };
    let (l, r, dim) = (p.kv_lora_rank, p.qk_rope_head_dim, p.latent_dim());
    let (n, qk, v) = (p.num_heads, p.qk_head_dim(), p.v_head_dim);
    let mut rng = Rng::new(seed);
    let w = common::mla_kv_b_proj(&p, &mut rng);
    let weights = absorb_kv_b_proj(&w, &p)?;
    let imp = make(p.clone(), weights.clone())?;
    let builder = b.make_mla_builder(c.block_size)?;
    let mut layer = AttentionLayer::new("mla.test");
    layer.k_scale = 0.25;

    // Blocks: a shuffled pool from 1 (0 is the null block), one run per request.
    let bs = c.block_size;
    let per_req: Vec<usize> = c.seq_lens.iter().map(|s| s.div_ceil(bs)).collect();
    let width = *per_req.iter().max().unwrap();
    let num_blocks = (1 + per_req.iter().sum::<usize>() + 2).max(c.min_blocks);
    let mut pool: Vec<i32> = (1..num_blocks as i32).collect();
    rng.shuffle(&mut pool);
    let mut table = vec![0i32; c.seq_lens.len() * width];
    let mut next = 0;
    for (i, &nb) in per_req.iter().enumerate() {
        for k in 0..nb {
            table[i * width + k] = pool[next];
            next += 1;
        }
    }
    let mut cache = MlaKvCache::for_backend(b.as_ref(), &p, c.dtype, num_blocks, bs)?;
    let put = |x: &[f32], shape: &[usize], dtype: DType| -> polyattn::Result<Tensor> {
        Tensor::from_f32(&cpu, x, shape, dtype)?.to_device(&dev)
    };
    // A cache write of `slots` as one request that owns every block.
    let write =
        |cache: &mut MlaKvCache, kv_c: &Tensor, k_pe: &Tensor, slots: Vec<i64>| -> Outcome {
            let desc = common::whole_cache_batch(num_blocks, bs, slots);
            let md = builder.build(0, &CommonAttentionMetadata::new(&dev, desc)?, false)?;
            imp.do_kv_cache_update(&layer, kv_c, k_pe, cache, md.as_ref())?;
            Ok(())
        };
    // NaN in every slot, written in pieces of at most 8192 slots (inputs of a few MiB).
    let all = num_blocks * bs;
    for lo in (0..all).step_by(8192) {
        let n = (all - lo).min(8192);
        write(
            &mut cache,
            &put(&vec![f32::NAN; n * l], &[n, l], c.dtype)?,
            &put(&vec![f32::NAN; n * r], &[n, r], c.dtype)?,
            (lo as i64..(lo + n) as i64).collect(),
        )?;
    }
    let mut slots = Vec::new();
    for (i, &s) in c.seq_lens.iter().enumerate() {
        for t in 0..s {
            slots.push(table[i * width + t / bs] as i64 * bs as i64 + (t % bs) as i64);
        }
    }
    let total = slots.len();
    let kv_c = Tensor::from_f32(&cpu, &rng.normals(total * l), &[total, l], c.dtype)?;
    let k_pe = Tensor::from_f32(&cpu, &rng.normals(total * r), &[total, r], c.dtype)?;
    write(
        &mut cache,
        &kv_c.to_device(&dev)?,
        &k_pe.to_device(&dev)?,
        slots.clone(),
    )?;
    let (c_all, p_all) = (kv_c.to_f32_vec()?, k_pe.to_f32_vec()?);

    // The batch: the last q_lens[i] positions of request i are its new tokens.
    let total_q: usize = c.q_lens.iter().sum();
    let q = Tensor::from_f32(
        &cpu,
        &rng.normals(total_q * n * qk),
        &[total_q, n, qk],
        c.dtype,
    )?
    .to_f32_vec()?;
    let mut qsl = vec![0i32];
    let mut new_slots = Vec::new();
    let mut new_rows = Vec::new();
    let mut row0 = 0;
    for (i, (&s, &ql)) in c.seq_lens.iter().zip(&c.q_lens).enumerate() {
        qsl.push(qsl[i] + ql as i32);
        new_slots.extend_from_slice(&slots[row0 + s - ql..row0 + s]);
        new_rows.extend(row0 + s - ql..row0 + s);
        row0 += s;
    }
    let desc = BatchDescription {
        query_start_loc: qsl.clone(),
        seq_lens: c.seq_lens.iter().map(|&s| s as i32).collect(),
        block_table: table.clone(),
        max_blocks_per_req: width,
        slot_mapping: new_slots,
        causal: true,
        block_size: bs,
        is_prefilling: None,
    };
    let common = CommonAttentionMetadata::new(&dev, desc)?;
    let md = builder.build(0, &common, false)?;
    // The decode region: the leading requests of the first request's query length (≤ 128).
    let ql0 = c.q_lens[0];
    let decodes = if ql0 <= 128 {
        c.q_lens.iter().take_while(|&&x| x == ql0).count()
    } else {
        0
    };
    let dec_tokens: usize = c.q_lens[..decodes].iter().sum();
    let mut out = vec![0.0f32; total_q * n * v];
    let mut lse = vec![0.0f32; n * dec_tokens];
    if dec_tokens > 0 {
        let ql = weights.absorb_query(&q[..dec_tokens * n * qk])?;
        let q_lat = put(&ql, &[dec_tokens, n, dim], c.dtype)?;
        let mut o_lat = put(&vec![0.0; dec_tokens * n * l], &[dec_tokens, n, l], c.dtype)?;
        let mut lse_t = put(&vec![0.0; n * dec_tokens], &[n, dec_tokens], DType::F32)?;
        imp.forward_mqa(
            &layer,
            &q_lat,
            &cache,
            md.as_ref(),
            &mut o_lat,
            Some(&mut lse_t),
        )?;
        let up = weights.up_project(&o_lat.to_f32_vec()?)?;
        out[..up.len()].copy_from_slice(&up);
        lse = lse_t.to_f32_vec()?;
    }
    let pre_tokens = total_q - dec_tokens;
    if pre_tokens > 0 {
        let rows = &new_rows[dec_tokens..];
        let pick = |x: &[f32], wd: usize| -> Vec<f32> {
            rows.iter()
                .flat_map(|&t| x[t * wd..(t + 1) * wd].to_vec())
                .collect()
        };
        let q_pre = put(&q[dec_tokens * n * qk..], &[pre_tokens, n, qk], c.dtype)?;
        let c_new = put(&pick(&c_all, l), &[pre_tokens, l], c.dtype)?;
        let p_new = put(&pick(&p_all, r), &[pre_tokens, r], c.dtype)?;
        let mut o = put(&vec![0.0; pre_tokens * n * v], &[pre_tokens, n, v], c.dtype)?;
        imp.forward_mha(&layer, &q_pre, &c_new, &p_new, &cache, md.as_ref(), &mut o)?;
        out[dec_tokens * n * v..].copy_from_slice(&o.to_f32_vec()?);
    }

    // The expanded f64 reference over the latents as the cache holds them (the prefills'
    // new tokens from their own latents).
    let w64: Vec<f64> = w.iter().map(|&x| x as f64).collect();
    let tol = {
        let t = Tolerance::for_dtype(c.dtype);
        Tolerance {
            atol: t.atol.max(2e-4),
            rtol: t.rtol.max(2e-3),
        }
    };
    let mut q0 = 0;
    for (i, (&s, &ql)) in c.seq_lens.iter().zip(&c.q_lens).enumerate() {
        let decode = i < decodes;
        let cached = if decode { s } else { s - ql };
        let mut lat: Vec<f64> = cache
            .gather_f32(&table[i * width..(i + 1) * width], cached, layer.k_scale)?
            .into_iter()
            .map(f64::from)
            .collect();
        if !decode {
            for &t in &new_rows[q0..q0 + ql] {
                lat.extend(
                    c_all[t * l..(t + 1) * l]
                        .iter()
                        .chain(&p_all[t * r..(t + 1) * r])
                        .map(|&x| x as f64),
                );
            }
        }
        if lat.iter().any(|x| !x.is_finite()) {
            return Err(fail(format!("a NaN slot inside request {i}")));
        }
        let qi: Vec<f64> = q[q0 * n * qk..(q0 + ql) * n * qk]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let (want, want_lse) = reference::mla_attention(&p, &qi, &lat, &w64, ql, s);
        for j in 0..ql {
            for h in 0..n {
                for d in 0..v {
                    let got = out[((q0 + j) * n + h) * v + d] as f64;
                    let exp = want[(j * n + h) * v + d];
                    if !tol.accepts(got, exp) {
                        return Err(fail(format!(
                            "out[req {i} token {j}][head {h}][{d}] = {got}, reference {exp}"
                        )));
                    }
                }
                if decode {
                    let got = lse[h * dec_tokens + q0 + j] as f64;
                    let exp = want_lse[h * ql + j];
                    if !tol.accepts(got, exp) {
                        return Err(fail(format!(
                            "lse[head {h}][req {i} token {j}] = {got}, reference {exp}"
                        )));
                    }
                }
            }
        }
        q0 += ql;
    }
    Ok(())
}

fn case(
    heads: usize,
    block_size: usize,
    dtype: DType,
    cache: CacheDType,
    seq_lens: &[usize],
    q_lens: &[usize],
) -> Case {
    Case {
        heads,
        block_size,
        dtype,
        cache,
        seq_lens: seq_lens.to_vec(),
        q_lens: q_lens.to_vec(),
        min_blocks: 0,
    }
}

#[test]
fn latent_decode_equals_the_expanded_reference() {
    let cases = [
        case(
            16,
            64,
            DType::Bf16,
            CacheDType::Auto,
            &[1, 70, 129],
            &[1, 1, 1],
        ),
        case(16, 32, DType::F32, CacheDType::Fp8E4m3, &[33, 5], &[1, 1]),
        case(16, 64, DType::F16, CacheDType::Auto, &[3000, 700], &[2, 2]),
        case(
            128,
            64,
            DType::Bf16,
            CacheDType::Fp8E4m3,
            &[17, 64],
            &[1, 1],
        ),
        case(128, 32, DType::F16, CacheDType::Auto, &[40], &[1]),
        case(128, 64, DType::Bf16, CacheDType::Auto, &[600, 33], &[1, 1]),
    ];
    for_each_case("mla_decode", &cases, Case::info, |b, c| {
        run(b, c, 2100 + c.seq_lens[0] as u64)
    });
}

#[test]
fn expanded_prefill_equals_the_reference() {
    // Fresh prompts and chunked prefills over cached context (fp8 context dequantised, the
    // new tokens at the activation dtype); the first request of each batch is a decode of
    // its query length, the rest prefills.
    let cases = [
        case(16, 64, DType::Bf16, CacheDType::Auto, &[20, 90], &[20, 17]),
        case(16, 32, DType::F32, CacheDType::Fp8E4m3, &[45], &[9]),
        case(128, 64, DType::Bf16, CacheDType::Fp8E4m3, &[12, 3], &[4, 3]),
        case(
            16,
            64,
            DType::F16,
            CacheDType::Fp8E4m3,
            &[300, 500],
            &[150, 200],
        ),
        case(128, 32, DType::Bf16, CacheDType::Auto, &[200], &[130]),
    ];
    for_each_case("mla_prefill", &cases, Case::info, |b, c| {
        run(b, c, 2200 + c.seq_lens[0] as u64)
    });
}

/// WGPU_MLA's prefill in chunks of 16 positions (an explicit tuning, as
/// `POLYATTN_WGPU_MLA_PREFILL_CHUNK=16` sets): every chunk after the first continues the
/// rows' softmax state from the last, the path long contexts take, against the same
/// reference. Skips (and says so) where no wgpu adapter opens.
#[test]
fn wgpu_prefill_in_small_chunks_equals_the_reference() {
    use polyattn::backend::Availability;
    use polyattn::backends::wgpu::WgpuTuning;
    use polyattn::backends::wgpu_mla::WgpuMlaAttentionImpl;

    let b = polyattn::registry::global()
        .get("WGPU_MLA")
        .expect("WGPU_MLA is registered");
    if let Availability::Unavailable(why) = b.availability() {
        println!("SKIP wgpu_prefill_in_small_chunks_equals_the_reference: WGPU_MLA: {why}");
        return;
    }
    let make = |p: MlaParams, w: AbsorbedWeights| -> polyattn::Result<Box<dyn MlaAttentionImpl>> {
        let Device::Wgpu(dev) = b.device()? else {
            unreachable!("WGPU_MLA's device is a wgpu device")
        };
        let tuning = WgpuTuning {
            mla_prefill_chunk: Some(16),
            ..WgpuTuning::for_device(dev.wgsl_info())
        };
        Ok(Box::new(WgpuMlaAttentionImpl::with_tuning(
            p, &w, dev, tuning,
        )?))
    };
    let cases = [
        case(
            16,
            32,
            DType::Bf16,
            CacheDType::Fp8E4m3,
            &[70, 41],
            &[2, 25],
        ),
        case(16, 64, DType::F32, CacheDType::Auto, &[30, 100], &[1, 37]),
        case(16, 32, DType::F16, CacheDType::Auto, &[150], &[140]),
    ];
    for c in &cases {
        if let Err(e) = run_with(&b, c, 2300 + c.seq_lens[0] as u64, &make) {
            panic!("WGPU_MLA, chunks of 16, {}: {e}", c.info().label);
        }
    }
}

/// Through the public API, as a model would: the selector's MLA choice, its builder and impl,
/// the cache write, then `forward_mqa` on the decodes (first in the batch) and `forward_mha`
/// on the prefill, each against the reference; a standard layer on the MLA backend and MLA
/// on a standard one are typed errors with the reference's reasons.
#[test]
fn the_selected_mla_backend_runs_a_mixed_batch() {
    use polyattn::backend::SelectorConfig;
    use polyattn::{AttentionLayer, AttentionParams};

    let mut config = SelectorConfig::new(576, DType::Bf16, CacheDType::Auto);
    config.use_mla = true;
    config.block_size = Some(32);
    let backend = polyattn::selector::get_attn_backend(&config).expect("an MLA backend");
    assert!(backend.capabilities().is_mla, "{}", backend.name());
    for c in polyattn::registry::global().explain(&config) {
        let mla = polyattn::registry::global()
            .get(&c.name)
            .is_some_and(|b| b.capabilities().is_mla);
        let says = c
            .reasons
            .iter()
            .any(|r| r.to_string().contains("MLA not supported"));
        assert_eq!(says, !mla, "{}: {:?}", c.name, c.reasons);
    }
    let err = backend
        .make_impl(AttentionParams::new(16, 128, 16))
        .err()
        .expect("a standard layer on an MLA backend is an error");
    assert!(err.to_string().contains("non-MLA not supported"), "{err}");
    let standard = polyattn::registry::global().get("CPU").unwrap();
    let p = MlaParams::deepseek_v3(16);
    let w: Vec<f32> = Rng::new(7)
        .normals(p.num_heads * (p.qk_nope_head_dim + p.v_head_dim) * p.kv_lora_rank)
        .into_iter()
        .map(|x| x / (p.kv_lora_rank as f32).sqrt())
        .collect();
    let weights = absorb_kv_b_proj(&w, &p).unwrap();
    let err = standard
        .make_mla_impl(p.clone(), weights.clone())
        .err()
        .unwrap();
    assert!(err.to_string().contains("MLA not supported"), "{err}");

    // Two decodes (seq_lens 40, 70), then a chunked prefill (30 cached + 10 new tokens: its
    // query length differs from the decodes', so the uniform decode region ends before it).
    let bs = 32;
    let (l, r, dim) = (p.kv_lora_rank, p.qk_rope_head_dim, p.latent_dim());
    let cpu = Device::cpu();
    let mut cache = MlaKvCache::for_backend(backend.as_ref(), &p, DType::Bf16, 16, bs).unwrap();
    assert!(MlaKvCache::for_backend(backend.as_ref(), &p, DType::Bf16, 16, 24).is_err());
    let seq_lens = [40usize, 70, 40];
    let q_lens = [1usize, 1, 10];
    let width = 3;
    let table: Vec<i32> = vec![3, 4, 0, 5, 6, 7, 8, 9, 0];
    let slot = |i: usize, t: usize| table[i * width + t / bs] as i64 * bs as i64 + (t % bs) as i64;
    let mut rng = Rng::new(8);
    let total: usize = seq_lens.iter().sum();
    let c_all = rng.normals(total * l);
    let p_all = rng.normals(total * r);
    let mut slots = Vec::new();
    for (i, &s) in seq_lens.iter().enumerate() {
        slots.extend((0..s).map(|t| slot(i, t)));
    }
    let dev = backend.device().unwrap();
    let kv_c = Tensor::from_f32(&cpu, &c_all, &[total, l], DType::Bf16).unwrap();
    let k_pe = Tensor::from_f32(&cpu, &p_all, &[total, r], DType::Bf16).unwrap();
    let builder = backend.make_mla_builder(bs).unwrap();
    let imp = backend.make_mla_impl(p.clone(), weights.clone()).unwrap();
    let layer = AttentionLayer::new("mla.0");
    // The cache write, as one request that owns every block.
    let fill = BatchDescription {
        query_start_loc: vec![0, total as i32],
        seq_lens: vec![total as i32],
        block_table: (0..16).collect(),
        max_blocks_per_req: 16,
        slot_mapping: slots.clone(),
        causal: true,
        block_size: bs,
        is_prefilling: None,
    };
    let fill = builder
        .build(0, &CommonAttentionMetadata::new(&dev, fill).unwrap(), false)
        .unwrap();
    imp.do_kv_cache_update(
        &layer,
        &kv_c.to_device(&dev).unwrap(),
        &k_pe.to_device(&dev).unwrap(),
        &mut cache,
        fill.as_ref(),
    )
    .unwrap();
    let (c16, p16) = (kv_c.to_f32_vec().unwrap(), k_pe.to_f32_vec().unwrap());

    let desc = BatchDescription {
        query_start_loc: vec![0, 1, 2, 12],
        seq_lens: seq_lens.iter().map(|&s| s as i32).collect(),
        block_table: table.clone(),
        max_blocks_per_req: width,
        slot_mapping: vec![slot(0, 39), slot(1, 69)]
            .into_iter()
            .chain((30..40).map(|t| slot(2, t)))
            .collect(),
        causal: true,
        block_size: bs,
        is_prefilling: None,
    };
    let common = CommonAttentionMetadata::new(&dev, desc).unwrap();
    assert_eq!(builder.reorder_batch_threshold(), Some(128));
    let md = builder.build(0, &common, false).unwrap();
    let n = p.num_heads;
    let qk = p.qk_head_dim();
    // As the bf16 query tensor holds them.
    let q = Tensor::from_f32(&cpu, &rng.normals(12 * n * qk), &[12, n, qk], DType::Bf16)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let put = |x: &[f32], shape: &[usize], dtype: DType| {
        Tensor::from_f32(&cpu, x, shape, dtype)
            .and_then(|t| t.to_device(&dev))
            .unwrap()
    };

    // Decodes: absorbed queries through forward_mqa, up-projected.
    let ql = weights.absorb_query(&q[..2 * n * qk]).unwrap();
    let q_lat = put(&ql, &[2, n, dim], DType::Bf16);
    let mut o_lat = put(&vec![0.0; 2 * n * l], &[2, n, l], DType::Bf16);
    let mut lse = put(&vec![0.0; n * 2], &[n, 2], DType::F32);
    imp.forward_mqa(
        &layer,
        &q_lat,
        &cache,
        md.as_ref(),
        &mut o_lat,
        Some(&mut lse),
    )
    .unwrap();
    let dec = weights.up_project(&o_lat.to_f32_vec().unwrap()).unwrap();
    // Prefill: the expanded path over the new tokens' own latents.
    let q_pre = put(&q[2 * n * qk..], &[10, n, qk], DType::Bf16);
    let new: Vec<usize> = (110 + 30..110 + 40).collect();
    let pick = |v: &[f32], w: usize| -> Vec<f32> {
        new.iter()
            .flat_map(|&t| v[t * w..(t + 1) * w].to_vec())
            .collect()
    };
    let c_new = put(&pick(&c16, l), &[10, l], DType::Bf16);
    let p_new = put(&pick(&p16, r), &[10, r], DType::Bf16);
    let mut o_pre = put(
        &vec![0.0; 10 * n * p.v_head_dim],
        &[10, n, p.v_head_dim],
        DType::Bf16,
    );
    imp.forward_mha(
        &layer,
        &q_pre,
        &c_new,
        &p_new,
        &cache,
        md.as_ref(),
        &mut o_pre,
    )
    .unwrap();
    let pre = o_pre.to_f32_vec().unwrap();
    // Wrong shapes are typed errors.
    let mut bad = put(&vec![0.0; 2 * n * (l + 1)], &[2, n, l + 1], DType::Bf16);
    assert!(imp
        .forward_mqa(&layer, &q_lat, &cache, md.as_ref(), &mut bad, None)
        .is_err());

    let w64: Vec<f64> = w.iter().map(|&x| x as f64).collect();
    let tol = Tolerance::for_dtype(DType::Bf16);
    let v = p.v_head_dim;
    let mut start = 0;
    for (i, (&s, &ql)) in seq_lens.iter().zip(&q_lens).enumerate() {
        let lat: Vec<f64> = (0..s)
            .flat_map(|t| {
                let g = start + t;
                c16[g * l..(g + 1) * l]
                    .iter()
                    .chain(&p16[g * r..(g + 1) * r])
                    .map(|&x| x as f64)
                    .collect::<Vec<_>>()
            })
            .collect();
        let q0 = if i < 2 { i } else { 2 };
        let qi: Vec<f64> = q[q0 * n * qk..(q0 + ql) * n * qk]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let (want, _) = reference::mla_attention(&p, &qi, &lat, &w64, ql, s);
        let got: &[f32] = if i < 2 {
            &dec[i * n * v..(i + 1) * n * v]
        } else {
            &pre
        };
        for (k, (&g, &e)) in got.iter().zip(&want).enumerate() {
            assert!(
                tol.accepts(g as f64, e),
                "request {i} element {k}: {g} vs {e}"
            );
        }
        start += s;
    }
}

/// Bad input to every MLA backend's impl is a typed error, never a panic or a launch: wrong
/// query / output / LSE shapes and dtypes, a cache of another latent width, an fp8 cache
/// without a usable k_scale, a slot outside the cache, and inputs on another device.
#[test]
fn bad_input_is_a_typed_error_on_every_mla_backend() {
    let cases = [case(16, 32, DType::Bf16, CacheDType::Auto, &[40], &[1])];
    for_each_case("mla_bad_input", &cases, Case::info, |b, _| {
        let dev = b.device()?;
        let cpu = Device::cpu();
        let p = MlaParams::deepseek_v3(16);
        let (n, l, r, dim) = (16, 512, 64, 576);
        let w: Vec<f32> = Rng::new(3).normals(n * 256 * l);
        let weights = absorb_kv_b_proj(&w, &p)?;
        let imp = b.make_mla_impl(p.clone(), weights)?;
        let builder = b.make_mla_builder(32)?;
        let layer = AttentionLayer::new("mla.bad");
        let cache = MlaKvCache::for_backend(b.as_ref(), &p, DType::Bf16, 4, 32)?;
        let desc = |slot: i64| BatchDescription {
            query_start_loc: vec![0, 1],
            seq_lens: vec![40],
            block_table: vec![1, 2],
            max_blocks_per_req: 2,
            slot_mapping: vec![slot],
            causal: true,
            block_size: 32,
            is_prefilling: None,
        };
        let md = builder.build(0, &CommonAttentionMetadata::new(&dev, desc(40))?, false)?;
        let t = |shape: &[usize], dtype: DType| -> polyattn::Result<Tensor> {
            let len = shape.iter().product();
            Tensor::from_f32(&cpu, &Rng::new(4).normals(len), shape, dtype)?.to_device(&dev)
        };
        let mut errors: Vec<(&str, polyattn::Result<()>)> = Vec::new();
        let q = t(&[1, n, dim], DType::Bf16)?;
        let mut out = t(&[1, n, l], DType::Bf16)?;
        let mut f16_out = t(&[1, n, l], DType::F16)?;
        let mut bad_lse = t(&[1, n], DType::F32)?;
        let md = md.as_ref();
        errors.push((
            "q of the wrong width",
            imp.forward_mqa(
                &layer,
                &t(&[1, n, dim - 4], DType::Bf16)?,
                &cache,
                md,
                &mut out,
                None,
            ),
        ));
        errors.push((
            "an output of another dtype",
            imp.forward_mqa(&layer, &q, &cache, md, &mut f16_out, None),
        ));
        errors.push((
            "an LSE of [tokens, heads]",
            imp.forward_mqa(&layer, &q, &cache, md, &mut out, Some(&mut bad_lse)),
        ));
        let q_cpu = Tensor::from_f32(&cpu, &[0.5; 16 * 576], &[1, n, dim], DType::Bf16)?;
        if dev != cpu {
            errors.push((
                "a query on the host",
                imp.forward_mqa(&layer, &q_cpu, &cache, md, &mut out, None),
            ));
        }
        let narrow = MlaParams {
            kv_lora_rank: 256,
            ..p.clone()
        };
        if let Ok(other) = MlaKvCache::for_backend(b.as_ref(), &narrow, DType::Bf16, 4, 32) {
            errors.push((
                "a cache of 320-wide latents",
                imp.forward_mqa(&layer, &q, &other, md, &mut out, None),
            ));
        }
        let fp8 = MlaParams {
            kv_cache_dtype: CacheDType::Fp8E4m3,
            ..p.clone()
        };
        let mut fp8_cache = MlaKvCache::for_backend(b.as_ref(), &fp8, DType::Bf16, 4, 32)?;
        let mut zero_scale = AttentionLayer::new("mla.bad.scale");
        zero_scale.k_scale = 0.0;
        errors.push((
            "an fp8 cache with k_scale 0",
            imp.forward_mqa(&zero_scale, &q, &fp8_cache, md, &mut out, None),
        ));
        let kv_c = t(&[1, l], DType::Bf16)?;
        let k_pe = t(&[1, r], DType::Bf16)?;
        let far = builder.build(
            0,
            &CommonAttentionMetadata::new(&dev, desc(4 * 32 + 5))?,
            false,
        );
        if let Ok(far) = far {
            errors.push((
                "a slot past the cache",
                imp.do_kv_cache_update(&layer, &kv_c, &k_pe, &mut fp8_cache, far.as_ref()),
            ));
        }
        errors.push((
            "k_pe of the wrong width",
            imp.do_kv_cache_update(
                &layer,
                &kv_c,
                &t(&[1, r + 4], DType::Bf16)?,
                &mut fp8_cache,
                md,
            ),
        ));
        for (what, res) in errors {
            match res {
                Err(e) if !e.to_string().is_empty() => {}
                Err(_) => return Err(fail(format!("{what}: an error without a message"))),
                Ok(()) => return Err(fail(format!("{what} was accepted"))),
            }
        }
        Ok(())
    });
}

/// Latent caches past one storage binding: VULKAN_MLA stores them in chunks of whole blocks
/// (`VulkanDevice::max_chunk_bytes`) bound as one binding array, and the cache write, the
/// latent decode and the prefill's gather read and write across chunks (a cache of about
/// 2.5 chunks, NaN everywhere first, the requests' blocks shuffled over all of it, two
/// decodes and a prefill over cached context, against the f64 reference); WGPU_MLA refuses
/// such a cache with a typed error. Backends without a per-binding limit are skipped, and
/// so is a device whose chunk exceeds 4 GiB (the reference reads the whole cache back to
/// the host for each request).
#[test]
fn latent_caches_past_one_binding() {
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for b in polyattn::registry::global().backends() {
        if !b.capabilities().is_mla {
            continue;
        }
        let device = match b.device() {
            Ok(d) => d,
            Err(e) => {
                report.push(format!("skipped {} ({e})", b.name()));
                continue;
            }
        };
        let (chunk, chunked) = match &device {
            Device::Vulkan(d) => (d.max_chunk_bytes(), true),
            Device::Wgpu(d) => (d.max_binding_bytes(), false),
            _ => {
                report.push(format!("skipped {} (no per-binding limit)", b.name()));
                continue;
            }
        };
        if chunk > 4 << 30 {
            report.push(format!(
                "skipped {} (chunks of {chunk} bytes: too large a cache for this test's host \
                 buffers)",
                b.name()
            ));
            continue;
        }
        let mut c = case(
            16,
            64,
            DType::F32,
            CacheDType::Auto,
            &[300, 1000, 70],
            &[1, 1, 30],
        );
        let page = (c.block_size * 576 * 4) as u64;
        c.min_blocks = (chunk * 5 / 2).div_ceil(page) as usize;
        match (run(&b, &c, 4242), chunked) {
            (Ok(()), true) => report.push(format!("ok {}: {} blocks", b.name(), c.min_blocks)),
            // Refused for its binding, or for its buffer (a device whose largest buffer is
            // smaller than the 2.5 bindings: wgpu on the H200).
            (Err(e), false)
                if e.to_string().contains("storage binding")
                    || e.to_string().contains("largest buffer") =>
            {
                report.push(format!("ok {}: refused ({e})", b.name()))
            }
            (Ok(()), false) => failures.push(format!(
                "{}: a latent cache past one binding ran without binding arrays",
                b.name()
            )),
            (Err(e), _) => failures.push(format!("{}: {e}", b.name())),
        }
    }
    eprintln!("[latent caches past one binding] {}", report.join("; "));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
