//! Decode context parallelism in its one-device form (`polyattn::parallel::dcp`) on every
//! available backend: a decode batch's KV cache sharded over 2, 3 and 4 rank caches, each
//! rank attending over its shard, the partial results combined by LSE, against the f64
//! reference of the unsharded batch (output and LSE, per-dtype tolerances).
//!
//! Every rank's cache holds NaN / ±inf everywhere except the keys it owns, so a rank that
//! reads another rank's keys, or a combine that reads a rank's placeholder rows (requests too
//! short to reach that rank), fails the comparison. The batches mix long requests with ones
//! that leave ranks empty (1 token, one block, one block and a token). Each rank must write
//! exactly the new tokens it owns.

#[macro_use]
mod common;

use std::collections::BTreeSet;

use common::{ensure, fail, for_each_backend, for_each_case, CaseInfo, Outcome};
use polyattn::parallel::dcp::{self, DcpDecodeBatch};
use polyattn::reference;
use polyattn::testing::fuzz::{fill_cache_outside, CacheSnapshot, StaleFill};
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch, Tolerance};
use polyattn::{
    AttentionImpl, AttentionLayer, AttentionMetadata, AttentionParams, BackendRef,
    BatchDescription, CacheDType, CommonAttentionMetadata, DType, Device, KvCache, KvCacheSpec,
    SelectorConfig, Tensor,
};

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    cache: CacheDType,
    heads: (usize, usize, usize),
    block_size: usize,
    world_size: usize,
    seq_lens: Vec<usize>,
    soft_cap: Option<f32>,
    fill: StaleFill,
    seed: u64,
}

impl Case {
    fn params(&self) -> AttentionParams {
        let (h, hkv, d) = self.heads;
        AttentionParams {
            kv_cache_dtype: self.cache,
            logits_soft_cap: self.soft_cap,
            ..AttentionParams::new(h, d, hkv)
        }
    }

    fn info(&self) -> CaseInfo {
        let (h, hkv, d) = self.heads;
        CaseInfo {
            label: format!(
                "{}/{} ({h},{hkv}) d{d} bs{} N{} seqs {:?} cap {:?} poison {} (seed {})",
                self.dtype,
                self.cache,
                self.block_size,
                self.world_size,
                self.seq_lens,
                self.soft_cap,
                self.fill.as_str(),
                self.seed
            ),
            config: Some(SelectorConfig::for_layer(
                &self.params(),
                self.dtype,
                Some(self.block_size as u32),
            )),
            cascade: false,
            graphs: false,
        }
    }
}

/// Sequence lengths for `n` ranks of `bs`-token blocks, longest first: two requests that
/// reach every rank (one ending mid-block on a middle rank), then ones that leave ranks empty.
fn seq_lens(n: usize, bs: usize) -> Vec<usize> {
    vec![
        3 * n * bs + bs / 2 + 1,
        n * bs + bs + 3,
        (n - 1) * bs + 1,
        bs + 1,
        bs,
        3,
        1,
    ]
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut seed = 11u64;
    let heads = [(4, 4, 64), (8, 2, 128), (6, 1, 80)];
    for (i, dtype) in [DType::F32, DType::F16, DType::Bf16]
        .into_iter()
        .enumerate()
    {
        for n in [2, 3, 4] {
            let bs = if (i + n) % 2 == 0 { 16 } else { 32 };
            out.push(Case {
                dtype,
                cache: CacheDType::Auto,
                heads: heads[(i + n) % 3],
                block_size: bs,
                world_size: n,
                seq_lens: seq_lens(n, bs),
                soft_cap: None,
                fill: StaleFill::ALL[(i + n) % StaleFill::ALL.len()],
                seed,
            });
            seed += 1;
        }
    }
    // A soft cap, an fp8 cache, one rank (the combine not needed), and a batch whose requests
    // all sit on rank 0.
    let base = out[4].clone();
    out.push(Case {
        soft_cap: Some(8.0),
        seed: 101,
        ..base.clone()
    });
    out.push(Case {
        cache: CacheDType::Fp8E4m3,
        dtype: DType::Bf16,
        seed: 102,
        ..base.clone()
    });
    out.push(Case {
        world_size: 1,
        seed: 103,
        ..base.clone()
    });
    out.push(Case {
        seq_lens: vec![base.block_size, 7, 1],
        seed: 104,
        ..base
    });
    out
}

/// The batch, generated once as one cache holds it.
fn generate(backend: &BackendRef, c: &Case) -> polyattn::Result<RandomBatch> {
    let case = CaseConfig::new(c.params(), c.dtype, c.block_size);
    let spec = BatchSpec::new(&c.seq_lens.iter().map(|&s| (1, s)).collect::<Vec<_>>());
    RandomBatch::generate(backend.as_ref(), &case, &spec, c.seed)
}

/// The slots of `cache` that rank `rank` owns for the batch's context (keys it must read).
fn owned_slots(dcp: &DcpDecodeBatch, rank: usize, seq_lens: &[usize]) -> BTreeSet<usize> {
    let desc = dcp.rank_description(rank).expect("rank");
    let (bs, w) = (desc.block_size, desc.max_blocks_per_req);
    let mut keep = BTreeSet::new();
    for (i, &s) in seq_lens.iter().enumerate().take(dcp.holding(rank)) {
        let local = dcp.layout().local_len(s, rank);
        for pos in 0..local {
            keep.insert(desc.block_table[i * w + pos / bs] as usize * bs + pos % bs);
        }
    }
    keep
}

/// Each rank's cache: the batch's cache with everything the rank does not own poisoned.
fn rank_caches(
    batch: &RandomBatch,
    dcp: &DcpDecodeBatch,
    c: &Case,
) -> polyattn::Result<Vec<KvCache>> {
    let device = batch.device().clone();
    (0..c.world_size)
        .map(|r| {
            let mut cache = batch.kv_cache.to_device(&Device::cpu())?;
            let keep = owned_slots(dcp, r, &c.seq_lens);
            fill_cache_outside(&mut cache, &keep, c.fill, c.seed ^ r as u64)?;
            cache.to_device(&device)
        })
        .collect()
}

fn kv_spec(c: &Case) -> KvCacheSpec {
    let (_, hkv, d) = c.heads;
    KvCacheSpec {
        block_size: c.block_size,
        num_kv_heads: hkv,
        head_size: d,
        dtype: c.dtype,
        cache_dtype: c.cache,
    }
}

/// Runs the case's batch sharded with `imp` and returns (output, LSE) as f32.
fn run_sharded(
    backend: &BackendRef,
    c: &Case,
    batch: &RandomBatch,
    imp: &dyn AttentionImpl,
) -> Result<(Vec<f32>, Vec<f32>), Box<dyn std::error::Error>> {
    let b = backend.as_ref();
    let device = b.device()?;
    let dcp = DcpDecodeBatch::from_unsharded(&batch.desc, c.world_size)?;
    let mut caches = rank_caches(batch, &dcp, c)?;
    let before = caches
        .iter()
        .map(CacheSnapshot::take)
        .collect::<polyattn::Result<Vec<_>>>()?;
    let builder = b.make_builder(&kv_spec(c))?;
    let md = dcp.build(&device, builder.as_ref())?;
    let (h, _, d) = c.heads;
    let t = c.seq_lens.len();
    let mut output = Tensor::from_f32(&device, &vec![7.5; t * h * d], &[t, h, d], c.dtype)?;
    let mut lse = Tensor::from_f32(&device, &vec![7.5; h * t], &[h, t], DType::F32)?;
    dcp::forward_decode(
        imp,
        &batch.layer,
        &batch.query,
        Some(&batch.key),
        Some(&batch.value),
        &mut caches,
        &md,
        &mut output,
        Some(&mut lse),
    )?;
    device.synchronize()?;
    // Each rank wrote exactly the new tokens it owns: request i's token sits at position
    // seq_len − 1, whose block (hence rank, and slot as one pool numbers them) the unsharded
    // description names.
    for (r, cache) in caches.iter().enumerate() {
        let after = CacheSnapshot::take(cache)?;
        let changed: BTreeSet<usize> = before[r]
            .changed_slots(&after, cache)?
            .into_iter()
            .collect();
        let owned: BTreeSet<usize> = c
            .seq_lens
            .iter()
            .zip(&batch.desc.slot_mapping)
            .filter(|(&s, _)| (s - 1) / c.block_size % c.world_size == r)
            .map(|(_, &slot)| slot as usize)
            .collect();
        ensure(changed == owned, || {
            format!("rank {r} changed cache slots {changed:?}, owns new-token slots {owned:?}")
        })?;
    }
    Ok((output.to_f32_vec()?, lse.to_f32_vec()?))
}

fn compare(got: &(Vec<f32>, Vec<f32>), want: &reference::ReferenceOutput, dtype: DType) -> Outcome {
    if let Some(i) = got.0.iter().position(|x| !x.is_finite()) {
        return Err(fail(format!("output[{i}] = {} is not finite", got.0[i])));
    }
    let tol = Tolerance::for_dtype(dtype);
    let cmp = reference::compare(&got.0, &want.out, tol);
    ensure(cmp.pass, || format!("output {cmp}"))?;
    let cmp = reference::compare(&got.1, &want.lse, tol);
    ensure(cmp.pass, || format!("LSE {cmp}"))
}

fn run_case(backend: &BackendRef, c: &Case) -> Outcome {
    let batch = generate(backend, c)?;
    let want = reference::attention(&batch)?;
    let imp = backend.make_impl(c.params())?;
    let got = run_sharded(backend, c, &batch, imp.as_ref())?;
    compare(&got, &want, c.dtype)
}

#[test]
fn sharded_decode_matches_reference() {
    for_each_case("dcp_sharded_decode", &cases(), Case::info, run_case);
}

/// An impl that reports its LSE in base 2 (as FlashInfer does), or claims base e while
/// returning base 2 (`honest: false`): the combine must use the base the impl declares.
struct Base2 {
    inner: Box<dyn AttentionImpl>,
    honest: bool,
}

impl AttentionImpl for Base2 {
    fn params(&self) -> &AttentionParams {
        self.inner.params()
    }

    fn can_return_lse_for_decode(&self) -> bool {
        true
    }

    fn lse_base_on_e(&self) -> bool {
        !self.honest
    }

    fn supports_dcp(&self) -> bool {
        true
    }

    fn do_kv_cache_update(
        &self,
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
    ) -> polyattn::Result<()> {
        self.inner
            .do_kv_cache_update(layer, key, value, kv_cache, metadata)
    }

    fn forward_with_lse(
        &self,
        layer: &AttentionLayer,
        query: &Tensor,
        key: Option<&Tensor>,
        value: Option<&Tensor>,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
        output_lse: Option<&mut Tensor>,
    ) -> polyattn::Result<()> {
        let Some(lse) = output_lse else {
            return self
                .inner
                .forward_with_lse(layer, query, key, value, kv_cache, metadata, output, None);
        };
        self.inner.forward_with_lse(
            layer,
            query,
            key,
            value,
            kv_cache,
            metadata,
            output,
            Some(&mut *lse),
        )?;
        let v: Vec<f32> = lse
            .to_f32_vec()?
            .into_iter()
            .map(|x| x / std::f32::consts::LN_2)
            .collect();
        let shape = lse.shape().to_vec();
        *lse = Tensor::from_f32(lse.device(), &v, &shape, DType::F32)?;
        Ok(())
    }
}

#[test]
fn the_combine_reads_the_lse_base_the_impl_declares() {
    for_each_backend("dcp_lse_base", |backend| {
        let c = Case {
            dtype: DType::F32,
            seed: 7,
            ..cases()[1].clone()
        };
        let batch = generate(backend, &c)?;
        let want = reference::attention(&batch)?;
        let honest = Base2 {
            inner: backend.make_impl(c.params())?,
            honest: true,
        };
        let got = run_sharded(backend, &c, &batch, &honest)?;
        compare(&got, &want, c.dtype)?;
        // The same LSEs under the wrong declared base skew the combine: the check bites.
        let lying = Base2 {
            inner: backend.make_impl(c.params())?,
            honest: false,
        };
        let got = run_sharded(backend, &c, &batch, &lying)?;
        let cmp = reference::compare(&got.0, &want.out, Tolerance::for_dtype(c.dtype));
        ensure(!cmp.pass, || {
            "a base-2 LSE read as natural log still matched: the case cannot detect a wrong base"
                .into()
        })
    });
}

#[test]
fn layers_a_shard_cannot_serve_are_refused() {
    for_each_backend("dcp_refusals", |backend| {
        let c = cases()[0].clone();
        let batch = generate(backend, &c)?;
        let b = backend.as_ref();
        let device = b.device()?;
        let dcp = DcpDecodeBatch::from_unsharded(&batch.desc, c.world_size)?;
        let builder = b.make_builder(&kv_spec(&c))?;
        let md = dcp.build(&device, builder.as_ref())?;
        let mut caches = rank_caches(&batch, &dcp, &c)?;
        let mut output = Tensor::zeros(&device, batch.query.shape(), c.dtype)?;
        let (h, _, _) = c.heads;
        let features: [(&str, AttentionParams); 3] = [
            (
                "sliding window",
                AttentionParams {
                    sliding_window: Some(8),
                    ..c.params()
                },
            ),
            (
                "ALiBi",
                AttentionParams {
                    alibi_slopes: Some(vec![0.5; h]),
                    ..c.params()
                },
            ),
            (
                "sinks",
                AttentionParams {
                    sinks: Some(vec![0.5; h]),
                    ..c.params()
                },
            ),
        ];
        // The batch's decode forward with `imp` over `caches`.
        let forward = |imp: &dyn AttentionImpl, caches: &mut [KvCache], output: &mut Tensor| {
            dcp::forward_decode(
                imp,
                &batch.layer,
                &batch.query,
                Some(&batch.key),
                Some(&batch.value),
                caches,
                &md,
                output,
                None,
            )
        };
        let mut checked = 0;
        for (what, p) in features {
            let Ok(imp) = b.make_impl(p) else {
                continue;
            };
            checked += 1;
            let r = forward(imp.as_ref(), &mut caches, &mut output);
            let e = r.err().ok_or_else(|| fail(format!("{what}: accepted")))?;
            ensure(e.to_string().contains(what), || {
                format!("{what}: error does not name it: {e}")
            })?;
        }
        ensure(checked > 0, || {
            "the backend builds none of the refused layers: nothing was checked".into()
        })?;
        // Wrong number of rank caches.
        let imp = b.make_impl(c.params())?;
        let r = forward(imp.as_ref(), &mut caches[..1], &mut output);
        ensure(r.is_err(), || "one cache for two ranks accepted".into())
    });
}

/// An MLA layer's decode (DeepSeek-V3 sizes, 16 heads: kv_lora_rank 512, rope 64) with its latent cache
/// sharded over 2 and 3 ranks, on every MLA backend: each rank's cache holds NaN except the
/// latents it owns, each rank writes the new latents it owns, and the combined latent output,
/// up-projected, and its LSE must equal the f64 expanded reference of the unsharded request.
#[test]
fn mla_sharded_decode_matches_reference() {
    use polyattn::mla::{absorb_kv_b_proj, reference as mla_ref, MlaKvCache, MlaParams};
    use polyattn::rng::Rng;

    let cases: [(usize, usize, usize, DType); 2] =
        [(16, 32, 2, DType::F32), (16, 64, 3, DType::Bf16)];
    let info = |&(heads, bs, world, dtype): &(usize, usize, usize, DType)| {
        let mut config = SelectorConfig::new(576, dtype, CacheDType::Auto);
        config.use_mla = true;
        config.block_size = Some(bs as u32);
        CaseInfo {
            label: format!("MLA {heads} heads bs{bs} {dtype} N{world}"),
            config: Some(config),
            cascade: false,
            graphs: false,
        }
    };
    for_each_case(
        "dcp_mla_decode",
        &cases,
        info,
        |b, &(heads, bs, world, dtype)| {
            let dev = b.device()?;
            let cpu = Device::cpu();
            let p = MlaParams::deepseek_v3(heads);
            let (l, r, dim) = (p.kv_lora_rank, p.qk_rope_head_dim, p.latent_dim());
            let (n, qk, v) = (p.num_heads, p.qk_head_dim(), p.v_head_dim);
            let mut rng = Rng::new((heads * 31 + bs * 7 + world) as u64);
            let w = common::mla_kv_b_proj(&p, &mut rng);
            let weights = absorb_kv_b_proj(&w, &p)?;
            let imp = b.make_mla_impl(p.clone(), weights.clone())?;
            let builder = b.make_mla_builder(bs)?;
            let layer = AttentionLayer::new("mla.dcp");
            // Longest first; the last two leave ranks empty.
            let seq_lens = [3 * world * bs + 5, world * bs + 1, bs + 2, 1];
            let per_req: Vec<usize> = seq_lens.iter().map(|s| s.div_ceil(bs)).collect();
            let width = *per_req.iter().max().expect("requests");
            let num_blocks = 1 + per_req.iter().sum::<usize>();
            let mut pool: Vec<i32> = (1..num_blocks as i32).collect();
            rng.shuffle(&mut pool);
            let mut table = vec![0i32; seq_lens.len() * width];
            let mut next = pool.into_iter();
            for (i, &nb) in per_req.iter().enumerate() {
                for k in 0..nb {
                    table[i * width + k] = next.next().expect("pool sized above");
                }
            }
            let slot = |i: usize, pos: usize| {
                table[i * width + pos / bs] as i64 * bs as i64 + (pos % bs) as i64
            };
            // Every position's latent, as the cache stores it.
            let rounded = |x: Vec<f32>, shape: &[usize]| -> polyattn::Result<Vec<f32>> {
                Tensor::from_f32(&cpu, &x, shape, dtype)?.to_f32_vec()
            };
            let lat: Vec<Vec<f32>> = seq_lens
                .iter()
                .map(|&s| rounded(rng.normals(s * dim), &[s, dim]))
                .collect::<polyattn::Result<_>>()?;
            // Latent rows of `rows` (request, position) as kv_c / k_pe tensors on the device.
            let latents = |rows: &[(usize, usize)]| -> polyattn::Result<(Tensor, Tensor)> {
                let (mut c, mut pe) = (Vec::new(), Vec::new());
                for &(i, pos) in rows {
                    let row = &lat[i][pos * dim..(pos + 1) * dim];
                    c.extend_from_slice(&row[..l]);
                    pe.extend_from_slice(&row[l..]);
                }
                let t = rows.len();
                Ok((
                    Tensor::from_f32(&dev, &c, &[t, l], dtype)?,
                    Tensor::from_f32(&dev, &pe, &[t, r], dtype)?,
                ))
            };
            // A cache write of `slots` as one request owning every block.
            let write =
                |cache: &mut MlaKvCache, kv: (Tensor, Tensor), slots: Vec<i64>| -> Outcome {
                    let desc = common::whole_cache_batch(num_blocks, bs, slots);
                    let md = builder.build(0, &CommonAttentionMetadata::new(&dev, desc)?, false)?;
                    imp.do_kv_cache_update(&layer, &kv.0, &kv.1, cache, md.as_ref())?;
                    Ok(())
                };
            let dcp_layout = polyattn::parallel::DcpLayout::new(world, bs)?;
            let mut caches = Vec::new();
            for rank in 0..world {
                let mut cache = MlaKvCache::for_backend(b.as_ref(), &p, dtype, num_blocks, bs)?;
                let all = num_blocks * bs;
                let nan = (
                    Tensor::from_f32(&dev, &vec![f32::NAN; all * l], &[all, l], dtype)?,
                    Tensor::from_f32(&dev, &vec![f32::NAN; all * r], &[all, r], dtype)?,
                );
                write(&mut cache, nan, (0..all as i64).collect())?;
                // The context positions this rank owns.
                let rows: Vec<(usize, usize)> = seq_lens
                    .iter()
                    .enumerate()
                    .flat_map(|(i, &s)| (0..s - 1).map(move |pos| (i, pos)))
                    .filter(|&(_, pos)| dcp_layout.owner(pos).0 == rank)
                    .collect();
                if !rows.is_empty() {
                    let slots = rows.iter().map(|&(i, pos)| slot(i, pos)).collect();
                    write(&mut cache, latents(&rows)?, slots)?;
                }
                caches.push(cache);
            }
            // The decode batch: each request's last position is its new token.
            let desc = BatchDescription {
                query_start_loc: (0..=seq_lens.len() as i32).collect(),
                seq_lens: seq_lens.iter().map(|&s| s as i32).collect(),
                block_table: table.clone(),
                max_blocks_per_req: width,
                slot_mapping: seq_lens
                    .iter()
                    .enumerate()
                    .map(|(i, &s)| slot(i, s - 1))
                    .collect(),
                causal: true,
                block_size: bs,
                is_prefilling: None,
            };
            let batch = DcpDecodeBatch::from_unsharded(&desc, world)?;
            let md = batch.build(&dev, builder.as_ref())?;
            let bsz = seq_lens.len();
            let q: Vec<f32> = rounded(rng.normals(bsz * n * qk), &[bsz, n, qk])?;
            let q_lat = Tensor::from_f32(&dev, &weights.absorb_query(&q)?, &[bsz, n, dim], dtype)?;
            let new_rows: Vec<(usize, usize)> = seq_lens
                .iter()
                .enumerate()
                .map(|(i, &s)| (i, s - 1))
                .collect();
            let new = latents(&new_rows)?;
            let mut out = Tensor::from_f32(&dev, &vec![7.5; bsz * n * l], &[bsz, n, l], dtype)?;
            let mut lse = Tensor::from_f32(&dev, &vec![7.5; n * bsz], &[n, bsz], DType::F32)?;
            dcp::forward_mqa_decode(
                imp.as_ref(),
                &layer,
                Some((&new.0, &new.1)),
                &q_lat,
                &mut caches,
                &md,
                &mut out,
                Some(&mut lse),
            )?;
            let got = weights.up_project(&out.to_f32_vec()?)?;
            let got_lse = lse.to_f32_vec()?;
            let w64: Vec<f64> = w.iter().map(|&x| x as f64).collect();
            let t = Tolerance::for_dtype(dtype);
            let tol = Tolerance {
                atol: t.atol.max(2e-4),
                rtol: t.rtol.max(2e-3),
            };
            for (i, &s) in seq_lens.iter().enumerate() {
                let latents: Vec<f64> = lat[i].iter().map(|&x| x as f64).collect();
                let qi: Vec<f64> = q[i * n * qk..(i + 1) * n * qk]
                    .iter()
                    .map(|&x| x as f64)
                    .collect();
                let (want, want_lse) = mla_ref::mla_attention(&p, &qi, &latents, &w64, 1, s);
                for h in 0..n {
                    for d in 0..v {
                        let (g, e) = (got[(i * n + h) * v + d] as f64, want[h * v + d]);
                        ensure(tol.accepts(g, e), || {
                            format!("out[req {i}][head {h}][{d}] = {g}, reference {e}")
                        })?;
                    }
                    let (g, e) = (got_lse[h * bsz + i] as f64, want_lse[h]);
                    ensure(tol.accepts(g, e), || {
                        format!("lse[head {h}][req {i}] = {g}, reference {e}")
                    })?;
                }
            }
            Ok(())
        },
    );
}
