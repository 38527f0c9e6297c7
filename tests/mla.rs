//! MLA's latent-space decode (absorbed query, MQA over the cached `[kv_c | k_pe]` latents,
//! `W_UV` up-projection: the CPU backend's `mla_decode` and the weight helpers) and its
//! expanded prefill (`mla_prefill`, causal, with cached context) against the f64 reference
//! in its expanded form (every head's keys and values up-projected, ordinary
//! attention), at DeepSeek-V3 sizes: 16 and 128 heads, kv_lora_rank 512, rope 64, qk_nope
//! 128, v 128, block sizes 32 and 64, 16-bit and fp8 latents. Unused cache slots and the
//! null block hold NaN, so a kernel that read outside a request's blocks would fail.

use polyattn::backends::cpu::kernels::mla_decode::mla_decode;
use polyattn::backends::cpu::kernels::mla_prefill::mla_prefill;
use polyattn::metadata::{BatchDescription, CommonAttentionMetadata};
use polyattn::mla::{absorb_kv_b_proj, concat_and_cache_mla, reference, MlaKvCache, MlaParams};
use polyattn::rng::Rng;
use polyattn::{CacheDType, DType, Device, Tensor};

struct Case {
    heads: usize,
    block_size: usize,
    dtype: DType,
    cache: CacheDType,
    seq_lens: Vec<usize>,
    /// New tokens per request: 1 runs the latent decode; more, the expanded prefill.
    q_lens: Vec<usize>,
}

fn run(c: &Case, seed: u64) {
    let label = format!(
        "{} heads bs{} {}/{} seq_lens {:?}",
        c.heads, c.block_size, c.dtype, c.cache, c.seq_lens
    );
    let cpu = Device::cpu();
    let p = MlaParams {
        kv_cache_dtype: c.cache,
        ..MlaParams::deepseek_v3(c.heads)
    };
    let (l, r, dim) = (p.kv_lora_rank, p.qk_rope_head_dim, p.latent_dim());
    let mut rng = Rng::new(seed);
    let w: Vec<f32> = rng
        .normals(p.num_heads * (p.qk_nope_head_dim + p.v_head_dim) * l)
        .into_iter()
        .map(|x| x / (l as f32).sqrt())
        .collect();
    let weights = absorb_kv_b_proj(&w, &p).unwrap();

    // Blocks: a shuffled pool from 1 (0 is the null block), one run per request.
    let bs = c.block_size;
    let per_req: Vec<usize> = c.seq_lens.iter().map(|s| s.div_ceil(bs)).collect();
    let width = *per_req.iter().max().unwrap();
    let num_blocks = 1 + per_req.iter().sum::<usize>() + 2;
    let mut pool: Vec<i32> = (1..num_blocks as i32).collect();
    rng.shuffle(&mut pool);
    let mut table = vec![0i32; c.seq_lens.len() * width];
    let mut next = 0;
    for (i, &n) in per_req.iter().enumerate() {
        for b in 0..n {
            table[i * width + b] = pool[next];
            next += 1;
        }
    }
    let k_scale = 0.25f32;
    let mut cache = MlaKvCache::new(&cpu, num_blocks, bs, dim, c.dtype, c.cache).unwrap();
    // Every slot first NaN, then each request's latents over it.
    let all: Vec<i64> = (0..(num_blocks * bs) as i64).collect();
    let nan = |n: usize, w: usize| {
        Tensor::from_f32(&cpu, &vec![f32::NAN; n * w], &[n, w], c.dtype).unwrap()
    };
    concat_and_cache_mla(
        &nan(all.len(), l),
        &nan(all.len(), r),
        &mut cache,
        &all,
        k_scale,
    )
    .unwrap();
    let mut slots = Vec::new();
    for (i, &s) in c.seq_lens.iter().enumerate() {
        for t in 0..s {
            slots.push(table[i * width + t / bs] as i64 * bs as i64 + (t % bs) as i64);
        }
    }
    let n = slots.len();
    let kv_c = Tensor::from_f32(&cpu, &rng.normals(n * l), &[n, l], c.dtype).unwrap();
    let k_pe = Tensor::from_f32(&cpu, &rng.normals(n * r), &[n, r], c.dtype).unwrap();
    concat_and_cache_mla(&kv_c, &k_pe, &mut cache, &slots, k_scale).unwrap();

    // The batch: the last q_lens[i] positions of request i are its new tokens.
    let qk = p.qk_head_dim();
    let total_q: usize = c.q_lens.iter().sum();
    let q = rng.normals(total_q * p.num_heads * qk);
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
        query_start_loc: qsl,
        seq_lens: c.seq_lens.iter().map(|&s| s as i32).collect(),
        block_table: table.clone(),
        max_blocks_per_req: width,
        slot_mapping: new_slots,
        causal: true,
        block_size: bs,
        is_prefilling: None,
    };
    let md = CommonAttentionMetadata::new(&cpu, desc).unwrap();
    // The new tokens' own latents, as the activation dtype holds them.
    let (c_all, p_all) = (kv_c.to_f32_vec().unwrap(), k_pe.to_f32_vec().unwrap());
    let new_latents: Vec<f32> = new_rows
        .iter()
        .flat_map(|&t| {
            c_all[t * l..(t + 1) * l]
                .iter()
                .chain(&p_all[t * r..(t + 1) * r])
        })
        .copied()
        .collect();
    let decode = c.q_lens.iter().all(|&x| x == 1);
    let (out, lse) = if decode {
        let ql = weights.absorb_query(&q).unwrap();
        let (latent_out, lse) = mla_decode(
            &ql,
            p.num_heads,
            l,
            p.scale,
            k_scale,
            &cache,
            &md,
            0..c.seq_lens.len(),
        )
        .unwrap();
        (weights.up_project(&latent_out).unwrap(), lse)
    } else {
        mla_prefill(
            &q,
            &new_latents,
            &weights,
            k_scale,
            &cache,
            &md,
            0..c.seq_lens.len(),
        )
        .unwrap()
    };
    // The expanded f64 reference over the latents as the cache holds them.
    let w64: Vec<f64> = w.iter().map(|&x| x as f64).collect();
    let tol = polyattn::testing::Tolerance {
        atol: 2e-4,
        rtol: 2e-3,
    };
    let v = p.v_head_dim;
    let mut q0 = 0;
    for (i, (&s, &ql)) in c.seq_lens.iter().zip(&c.q_lens).enumerate() {
        // Context from the cache (dequantised); the decode reads every position there, the
        // prefill its new tokens from their own latents.
        let cached = if decode { s } else { s - ql };
        let mut lat: Vec<f64> = cache
            .gather_f32(&table[i * width..(i + 1) * width], cached, k_scale)
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect();
        if !decode {
            lat.extend(
                new_latents[q0 * dim..(q0 + ql) * dim]
                    .iter()
                    .map(|&x| x as f64),
            );
        }
        assert!(
            lat.iter().all(|x| x.is_finite()),
            "{label}: a NaN slot inside request {i}"
        );
        let qi: Vec<f64> = q[q0 * p.num_heads * qk..(q0 + ql) * p.num_heads * qk]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let (want, want_lse) = reference::mla_attention(&p, &qi, &lat, &w64, ql, s);
        for j in 0..ql {
            for h in 0..p.num_heads {
                for d in 0..v {
                    let got = out[((q0 + j) * p.num_heads + h) * v + d] as f64;
                    let exp = want[(j * p.num_heads + h) * v + d];
                    assert!(
                        tol.accepts(got, exp),
                        "{label}: out[req {i} token {j}][head {h}][{d}] = {got}, reference {exp}"
                    );
                }
                let got = lse[h * total_q + q0 + j] as f64;
                let exp = want_lse[h * ql + j];
                assert!(
                    tol.accepts(got, exp),
                    "{label}: lse[head {h}][req {i} token {j}] = {got}, reference {exp}"
                );
            }
        }
        q0 += ql;
    }
    eprintln!("ok   {label}");
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
        case(
            128,
            64,
            DType::Bf16,
            CacheDType::Fp8E4m3,
            &[17, 64],
            &[1, 1],
        ),
        case(128, 32, DType::F16, CacheDType::Auto, &[40], &[1]),
    ];
    for (i, c) in cases.iter().enumerate() {
        run(c, 2100 + i as u64);
    }
}

#[test]
fn expanded_prefill_equals_the_reference() {
    // Fresh prompts and chunked prefills over cached context (fp8 context dequantised, the
    // new tokens at the activation dtype).
    let cases = [
        case(16, 64, DType::Bf16, CacheDType::Auto, &[20, 90], &[20, 17]),
        case(16, 32, DType::F32, CacheDType::Fp8E4m3, &[45], &[9]),
        case(128, 64, DType::Bf16, CacheDType::Fp8E4m3, &[12, 3], &[4, 3]),
    ];
    for (i, c) in cases.iter().enumerate() {
        run(c, 2200 + i as u64);
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
    let kv_c = Tensor::from_f32(&cpu, &c_all, &[total, l], DType::Bf16).unwrap();
    let k_pe = Tensor::from_f32(&cpu, &p_all, &[total, r], DType::Bf16).unwrap();
    concat_and_cache_mla(&kv_c, &k_pe, &mut cache, &slots, 1.0).unwrap();
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
    let common = CommonAttentionMetadata::new(&cpu, desc).unwrap();
    let builder = backend.make_mla_builder(bs).unwrap();
    assert_eq!(builder.reorder_batch_threshold(), Some(128));
    let md = builder.build(0, &common, false).unwrap();
    let imp = backend.make_mla_impl(p.clone(), weights.clone()).unwrap();
    let layer = AttentionLayer::new("mla.0");
    let n = p.num_heads;
    let qk = p.qk_head_dim();
    let q = rng.normals(12 * n * qk);

    // Decodes: absorbed queries through forward_mqa, up-projected.
    let ql = weights.absorb_query(&q[..2 * n * qk]).unwrap();
    let q_lat = Tensor::from_f32(&cpu, &ql, &[2, n, dim], DType::F32).unwrap();
    let mut o_lat = Tensor::zeros(&cpu, &[2, n, l], DType::F32).unwrap();
    let mut lse = Tensor::zeros(&cpu, &[n, 2], DType::F32).unwrap();
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
    let q_pre = Tensor::from_f32(&cpu, &q[2 * n * qk..], &[10, n, qk], DType::F32).unwrap();
    let new: Vec<usize> = (110 + 30..110 + 40).collect();
    let pick = |v: &[f32], w: usize| -> Vec<f32> {
        new.iter()
            .flat_map(|&t| v[t * w..(t + 1) * w].to_vec())
            .collect()
    };
    let c_new = Tensor::from_f32(&cpu, &pick(&c16, l), &[10, l], DType::F32).unwrap();
    let p_new = Tensor::from_f32(&cpu, &pick(&p16, r), &[10, r], DType::F32).unwrap();
    let mut o_pre = Tensor::zeros(&cpu, &[10, n, p.v_head_dim], DType::F32).unwrap();
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
    let mut bad = Tensor::zeros(&cpu, &[2, n, l + 1], DType::F32).unwrap();
    assert!(imp
        .forward_mqa(&layer, &q_lat, &cache, md.as_ref(), &mut bad, None)
        .is_err());

    let w64: Vec<f64> = w.iter().map(|&x| x as f64).collect();
    let tol = polyattn::testing::Tolerance {
        atol: 2e-4,
        rtol: 2e-3,
    };
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
