//! Captured decode steps, on every backend whose graph-capture level is
//! `UniformSingleTokenDecode` or above (CUDA graphs; the Vulkan backend's recorded command
//! buffers): a step captured once and replayed with updated persistent buffers equals an
//! eager step bit for bit, and what cannot be captured fails with a typed error that leaves
//! the device usable. Backends without graphs are skipped with their level.
//!
//! The capture goes through [`polyattn::Device::capture`], so the body is the same on every
//! runtime; only the runtime's own refusals differ in wording.

#[macro_use]
mod common;

use common::{ensure, fail, for_each_case, CaseInfo, Outcome};
use polyattn::reference;
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch, Rng, Tolerance};
use polyattn::{
    AttentionBackend, AttentionLayer, AttentionParams, BackendRef, BatchDescription, CacheDType,
    CommonAttentionMetadata, DType, DeviceGraph, KvCache, KvCacheSpec, SelectorConfig, Tensor,
};

fn params(h: usize, hkv: usize, d: usize, cache: CacheDType) -> AttentionParams {
    AttentionParams {
        kv_cache_dtype: cache,
        ..AttentionParams::new(h, d, hkv)
    }
}

/// The raw bits of a tensor's elements (fp8 bytes, or the f32 image of f16 / bf16 / f32
/// elements, which is injective), for exact comparisons.
fn bits(t: &Tensor) -> polyattn::Result<Vec<u32>> {
    Ok(if t.dtype().is_fp8() {
        t.to_u8_vec()?.into_iter().map(u32::from).collect()
    } else {
        t.to_f32_vec()?.into_iter().map(f32::to_bits).collect()
    })
}

fn random_tensor(
    device: &polyattn::Device,
    rng: &mut Rng,
    shape: &[usize],
    dtype: DType,
) -> polyattn::Result<Tensor> {
    let n: usize = shape.iter().product();
    Tensor::from_f32(device, &rng.normals(n), shape, dtype)
}

/// `steps` decode steps of one batch: request r has `base[r] + s` tokens at step s (its new
/// token at position `base[r] + s - 1`); a block enters a request's row at the step that first
/// writes into it. Block ids come shuffled from `1..num_blocks`; rows have two spare columns,
/// so the graph plan's longest context exceeds every request's. Returns the steps and the
/// cache's block count.
fn decode_steps(
    base: &[usize],
    bs: usize,
    steps: usize,
    seed: u64,
) -> (Vec<BatchDescription>, usize) {
    let mut rng = Rng::new(seed);
    let need: Vec<usize> = base.iter().map(|&s| (s + steps - 1).div_ceil(bs)).collect();
    let width = need.iter().copied().max().unwrap_or(0) + 2;
    let num_blocks = 1 + need.iter().sum::<usize>() + 3;
    let mut pool: Vec<i32> = (1..num_blocks as i32).collect();
    rng.shuffle(&mut pool);
    let rows: Vec<Vec<i32>> = need.iter().map(|&n| pool.drain(..n).collect()).collect();
    let descs = (0..steps)
        .map(|s| {
            let mut block_table = vec![0i32; base.len() * width];
            let mut slot_mapping = Vec::new();
            let mut seq_lens = Vec::new();
            for (r, row) in rows.iter().enumerate() {
                let seq = base[r] + s;
                let pos = seq - 1;
                block_table[r * width..][..seq.div_ceil(bs)]
                    .copy_from_slice(&row[..seq.div_ceil(bs)]);
                slot_mapping.push(row[pos / bs] as i64 * bs as i64 + (pos % bs) as i64);
                seq_lens.push(seq as i32);
            }
            BatchDescription {
                query_start_loc: (0..=base.len() as i32).collect(),
                seq_lens,
                block_table,
                max_blocks_per_req: width,
                slot_mapping,
                causal: true,
                block_size: bs,
                is_prefilling: None,
            }
        })
        .collect();
    (descs, num_blocks)
}

/// One case of [`graph_replayed_decode_equals_eager`].
struct GraphCase {
    label: &'static str,
    dtype: DType,
    cache: CacheDType,
    /// (query heads, KV heads, head size).
    shape: (usize, usize, usize),
    block_size: usize,
}

impl GraphCase {
    fn info(&self) -> CaseInfo {
        let (h, hkv, d) = self.shape;
        let p = params(h, hkv, d, self.cache);
        CaseInfo {
            label: self.label.into(),
            config: Some(SelectorConfig::for_layer(
                &p,
                self.dtype,
                Some(self.block_size as u32),
            )),
            cascade: false,
            graphs: true,
        }
    }
}

/// Three layers (plain; sinks; window + ALiBi + soft cap) over four decode steps of five
/// requests. Step 1 runs eagerly on graph metadata (the warm-up) and is captured; steps 2-4
/// write the persistent inputs, rebuild the graph metadata and replay. Each step is compared
/// with (a) an eager forward on graph metadata of a second builder and identical caches:
/// outputs and caches bit-identical (same kernels, same work lists, same inputs); (b) an
/// eager forward on plain metadata (`build`): caches bit-identical, outputs within the
/// dtype's tolerance (its split-KV plan differs, so the f32 summation order differs).
fn graph_case(b: &BackendRef, c: &GraphCase, seed: u64) -> Outcome {
    let be: &dyn AttentionBackend = b.as_ref();
    let device = be.device()?;
    let (h, hkv, d) = c.shape;
    let (dtype, bs) = (c.dtype, c.block_size);
    let (steps, num_blocks) = decode_steps(&[1500, 31, 700, 2100, 63], bs, 4, seed);
    let n = steps[0].seq_lens.len();
    let spec = KvCacheSpec {
        block_size: bs,
        num_kv_heads: hkv,
        head_size: d,
        dtype,
        cache_dtype: c.cache,
    };
    let mut rng = Rng::new(seed ^ 0x9e37);
    struct Layer {
        imp: Box<dyn polyattn::AttentionImpl>,
        layer: AttentionLayer,
        caches: [KvCache; 3], // graph, eager on graph metadata, eager on plain metadata
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
    }
    let mut layers = Vec::new();
    for l in 0..3 {
        let mut p = params(h, hkv, d, c.cache);
        match l {
            1 => p.sinks = Some((0..h).map(|i| 0.3 + (i % 5) as f32 * 0.4).collect()),
            2 => {
                p.sliding_window = Some(500);
                p.alibi_slopes = Some((0..h).map(|i| 0.5f32.powi(i as i32 % 8 + 1)).collect());
                p.logits_soft_cap = Some(4.0);
            }
            _ => {}
        }
        let layer = if c.cache.is_fp8() {
            AttentionLayer::new("graph.layer").with_scales(0.7, 1.3)?
        } else {
            AttentionLayer::new("graph.layer")
        };
        let mut kv = KvCache::new(be, spec, num_blocks)?;
        let shape = kv.data().shape().to_vec();
        *kv.data_mut() = random_tensor(&device, &mut rng, &shape, spec.storage_dtype())?;
        layers.push(Layer {
            imp: be.make_impl(p)?,
            layer,
            caches: [kv.clone(), kv.clone(), kv],
            q: Tensor::zeros(&device, &[n, h, d], dtype)?,
            k: Tensor::zeros(&device, &[n, hkv, d], dtype)?,
            v: Tensor::zeros(&device, &[n, hkv, d], dtype)?,
            out: Tensor::zeros(&device, &[n, h, d], dtype)?,
        });
    }
    let graph_builder = be.make_builder(&spec)?;
    let eager_builder = be.make_builder(&spec)?;
    let plain_builder = be.make_builder(&spec)?;
    ensure(
        graph_builder.graph_capture_support() == be.capabilities().graph_capture,
        || "the builder's graph level differs from the descriptor's".into(),
    )?;
    let mut graph: Option<DeviceGraph> = None;
    for (s, desc) in steps.iter().enumerate() {
        let common = CommonAttentionMetadata::new(&device, desc.clone())?;
        let inputs: Vec<[Tensor; 3]> = (0..layers.len())
            .map(|_| -> polyattn::Result<[Tensor; 3]> {
                Ok([
                    random_tensor(&device, &mut rng, &[n, h, d], dtype)?,
                    random_tensor(&device, &mut rng, &[n, hkv, d], dtype)?,
                    random_tensor(&device, &mut rng, &[n, hkv, d], dtype)?,
                ])
            })
            .collect::<polyattn::Result<_>>()?;
        // The graph side: this step's inputs into the captured tensors, then the metadata
        // update (writes into the persistent buffers), then the replay.
        for (ly, [q, k, v]) in layers.iter_mut().zip(&inputs) {
            ly.q.copy_from(q)?;
            ly.k.copy_from(k)?;
            ly.v.copy_from(v)?;
        }
        let md = graph_builder.build_for_graph_capture(&common)?;
        match &graph {
            None => {
                // Step 1 eagerly (warm-up: plans, uploads, compiles), then captured.
                let run = |layers: &mut Vec<Layer>| -> polyattn::Result<()> {
                    for ly in layers.iter_mut() {
                        let [c, _, _] = &mut ly.caches;
                        ly.imp.forward(
                            &ly.layer,
                            &ly.q,
                            Some(&ly.k),
                            Some(&ly.v),
                            c,
                            md.as_ref(),
                            &mut ly.out,
                        )?;
                    }
                    Ok(())
                };
                run(&mut layers)?;
                graph = Some(device.capture(|| run(&mut layers))?);
            }
            Some(g) => g.replay()?,
        }
        // The eager sides, on copies of the inputs.
        let exact_md = eager_builder.build_for_graph_capture(&common)?;
        let plain_md = plain_builder.build(0, &common, false)?;
        let mut outs = Vec::new();
        for (ly, [q, k, v]) in layers.iter_mut().zip(&inputs) {
            let [_, ce, cp] = &mut ly.caches;
            let mut oe = Tensor::zeros(&device, &[n, h, d], dtype)?;
            let mut op = Tensor::zeros(&device, &[n, h, d], dtype)?;
            ly.imp.forward(
                &ly.layer,
                q,
                Some(k),
                Some(v),
                ce,
                exact_md.as_ref(),
                &mut oe,
            )?;
            ly.imp.forward(
                &ly.layer,
                q,
                Some(k),
                Some(v),
                cp,
                plain_md.as_ref(),
                &mut op,
            )?;
            outs.push((oe, op));
        }
        device.synchronize()?;
        let tol = Tolerance::for_dtype(dtype);
        for (l, (ly, (oe, op))) in layers.iter().zip(&outs).enumerate() {
            let what = format!("{} step {} layer {l}", c.label, s + 1);
            let got = bits(&ly.out)?;
            ensure(got.iter().any(|&x| x != 0), || {
                format!("{what}: graph output is all zeros")
            })?;
            ensure(got == bits(oe)?, || {
                format!("{what}: graph output != eager output")
            })?;
            let [cg, ce, cp] = &ly.caches;
            let cache_bits = bits(cg.data())?;
            ensure(cache_bits == bits(ce.data())?, || {
                format!("{what}: graph KV cache != eager KV cache")
            })?;
            ensure(cache_bits == bits(cp.data())?, || {
                format!("{what}: graph KV cache != plain-metadata KV cache")
            })?;
            let want: Vec<f64> = op.to_f32_vec()?.into_iter().map(f64::from).collect();
            let cmp = reference::compare(&ly.out.to_f32_vec()?, &want, tol);
            ensure(cmp.pass, || {
                format!("{what}: graph vs plain-metadata eager output {cmp}")
            })?;
        }
    }
    report!(
        "  ok   {} {}: 4 steps x 3 layers, replays bit-identical to eager",
        b.name(),
        c.label
    );
    Ok(())
}

#[test]
fn graph_replayed_decode_equals_eager() {
    // bf16 and f16 run CUDA's tensor-core decode kernel (the wave-filling split plan) and the
    // WGSL family's split-KV decode kernel; the fp8 cache runs CUDA's CUDA-core kernel with its
    // own split rule and partial scratch; the 16:1 group takes the WGSL decode tile.
    let cases = [
        GraphCase {
            label: "bf16 d128 (16,4) bs16",
            dtype: DType::Bf16,
            cache: CacheDType::Auto,
            shape: (16, 4, 128),
            block_size: 16,
        },
        GraphCase {
            label: "f16 d64 (8,1) bs32",
            dtype: DType::F16,
            cache: CacheDType::Auto,
            shape: (8, 1, 64),
            block_size: 32,
        },
        GraphCase {
            label: "f16 fp8_e4m3 d128 (8,2) bs16",
            dtype: DType::F16,
            cache: CacheDType::Fp8E4m3,
            shape: (8, 2, 128),
            block_size: 16,
        },
        GraphCase {
            label: "f32 d64 (16,1) bs16",
            dtype: DType::F32,
            cache: CacheDType::Auto,
            shape: (16, 1, 64),
            block_size: 16,
        },
    ];
    let mut seed = 1000;
    for_each_case(
        "graph_replayed_decode_equals_eager",
        &cases,
        GraphCase::info,
        |b, c| {
            seed += 1;
            graph_case(b, c, seed)
        },
    );
}

/// One forward of `batch` (its layer, query, key, value and cache) with metadata `md`.
fn forward_batch(
    imp: &dyn polyattn::AttentionImpl,
    batch: &mut RandomBatch,
    md: &dyn polyattn::AttentionMetadata,
    out: &mut Tensor,
) -> polyattn::Result<()> {
    imp.forward(
        &batch.layer,
        &batch.query,
        Some(&batch.key),
        Some(&batch.value),
        &mut batch.kv_cache,
        md,
        out,
    )
}

/// What cannot be captured fails with a typed error, and the device stays usable: graph
/// metadata of a prefill batch, a forward on plain metadata inside a capture, the closure's
/// own error, an allocation inside a capture, a layer shape that has not run eagerly, stale
/// graph metadata; then an eager forward still matches the f64 reference.
fn rejects(b: &BackendRef) -> Outcome {
    let be: &dyn AttentionBackend = b.as_ref();
    let device = be.device()?;
    let name = b.name();
    let p = params(8, 2, 128, CacheDType::Auto);
    let case = CaseConfig::new(p.clone(), DType::Bf16, 16);
    let prefill = BatchSpec::new(&[(1, 300), (20, 100), (3, 40)]);
    let mut batch = RandomBatch::generate(be, &case, &prefill, 77)?;
    let imp = be.make_impl(p.clone())?;
    let builder = be.make_builder(&KvCacheSpec {
        block_size: 16,
        num_kv_heads: 2,
        head_size: 128,
        dtype: DType::Bf16,
        cache_dtype: CacheDType::Auto,
    })?;
    let common = CommonAttentionMetadata::new(&device, batch.desc.clone())?;
    let device_error = |r: polyattn::Result<DeviceGraph>, want: &str, what: &str| match r {
        Err(polyattn::Error::Device { message, .. }) if message.contains(want) => {
            report!("  ok   {name}: {what} refused: {message}");
            Ok(())
        }
        other => Err(fail(format!(
            "{what}: expected a device error naming {want:?}, got {other:?}"
        ))),
    };
    // 1. Graph metadata of a batch with prefills: a metadata error naming the level.
    match builder.build_for_graph_capture(&common) {
        Err(polyattn::Error::Metadata(m)) if m.contains("UniformSingleTokenDecode") => {
            report!("  ok   {name}: prefill graph metadata refused: {m}")
        }
        other => return Err(fail(format!("expected a metadata error, got {other:?}"))),
    }
    // 2. Capturing a forward on plain metadata: a device error, nothing captured.
    let md = builder.build(0, &common, false)?;
    let mut out = batch.empty_output()?;
    let r = device.capture(|| forward_batch(imp.as_ref(), &mut batch, md.as_ref(), &mut out));
    device_error(r, "build_for_graph_capture", "a plain-metadata forward")?;
    // 3. The closure's own error comes back as is.
    match device.capture(|| Err(polyattn::Error::Config("closure failed on purpose".into()))) {
        Err(polyattn::Error::Config(m)) if m.contains("on purpose") => {}
        other => return Err(fail(format!("expected the closure's error, got {other:?}"))),
    }
    // 4. Allocating (an upload or a fill) inside a capture is refused.
    let r = device.capture(|| Tensor::zeros(&device, &[16], DType::F32).map(|_| ()));
    device_error(r, "graph capture", "an allocation")?;
    // 5. Graph metadata, but a layer shape that has not run eagerly yet: refused.
    let decode = BatchSpec::new(&[(1, 300), (1, 1000), (1, 40)]);
    let mut dbatch = RandomBatch::generate(be, &case, &decode, 78)?;
    let dcommon = CommonAttentionMetadata::new(&device, dbatch.desc.clone())?;
    let gmd = builder.build_for_graph_capture(&dcommon)?;
    let mut dout = dbatch.empty_output()?;
    let r = device.capture(|| forward_batch(imp.as_ref(), &mut dbatch, gmd.as_ref(), &mut dout));
    // The plan (or, when no earlier test ran it, the kernel module) is missing.
    device_error(r, "graph capture", "a capture before the warm-up")?;
    // 6. Metadata of an older build is stale once a newer build rewrote the buffers.
    let gmd2 = builder.build_for_graph_capture(&dcommon)?;
    let stale = forward_batch(imp.as_ref(), &mut dbatch, gmd.as_ref(), &mut dout);
    ensure(
        matches!(&stale, Err(polyattn::Error::Metadata(m)) if m.contains("stale")),
        || format!("stale graph metadata: {stale:?}"),
    )?;
    drop(gmd2);
    // The device still works: a full forward checked against the reference.
    let spec = BatchSpec::new(&[(1, 300), (20, 100), (1, 2000)]);
    let mut batch = RandomBatch::generate(be, &case, &spec, 79)?;
    let want = reference::attention(&batch)?;
    let md = builder.build(
        0,
        &CommonAttentionMetadata::new(&device, batch.desc.clone())?,
        false,
    )?;
    let mut out = batch.empty_output()?;
    forward_batch(imp.as_ref(), &mut batch, md.as_ref(), &mut out)?;
    let cmp = reference::compare(
        &out.to_f32_vec()?,
        &want.out,
        Tolerance::for_dtype(DType::Bf16),
    );
    ensure(cmp.pass, || {
        format!("eager forward after failed captures: {cmp}")
    })
}

#[test]
fn graph_capture_rejects_what_it_cannot_capture() {
    let case = GraphCase {
        label: "bf16 d128 (8,2) bs16",
        dtype: DType::Bf16,
        cache: CacheDType::Auto,
        shape: (8, 2, 128),
        block_size: 16,
    };
    for_each_case(
        "graph_capture_rejects_what_it_cannot_capture",
        std::slice::from_ref(&case),
        GraphCase::info,
        |b, _| rejects(b),
    );
}

/// A device without graphs says so when asked to capture.
#[test]
fn devices_without_graphs_refuse_to_capture() {
    let cpu = polyattn::Device::cpu();
    assert!(!cpu.has_graphs());
    match cpu.capture(|| Ok(())) {
        Err(polyattn::Error::Config(m)) => assert!(m.contains("no graph capture"), "{m}"),
        other => panic!("expected a config error, got {other:?}"),
    }
}
